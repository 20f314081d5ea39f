"""lazyvault against its peers: every workload of issue 6 on every system,
on the same data, in one session, alternating systems; prints the ratio
tables and writes them into benches/RESULTS.md.

    ./dev bench                              # installs the peers, full sizes
    ./dev bench --quick --no-results         # a small smoke run, printed only
    .venv/bin/python benches/peers --help    # once set up: every option

Systems whose package is missing are skipped and listed with the reason.
Ratios are lazyvault / system (time or memory; for throughput the inverse),
so below 1 lazyvault wins. ``--cold`` adds cold-cache runs of the reads: the
system's files are evicted with ``posix_fadvise(DONTNEED)`` before each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import host  # noqa: E402
import limits  # noqa: E402
import report  # noqa: E402
import systems  # noqa: E402
import workloads  # noqa: E402

RESULTS = HERE.parent / "RESULTS.md"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1_000, 10_000, 100_000],
        help="object counts N for (a), (b), (c), (j)",
    )
    p.add_argument(
        "--big-gib", type=float, default=1.0, help="size of the big array (d, e, g, h, i)"
    )
    p.add_argument("--many", type=int, default=10_000, help="arrays in one object (f)")
    p.add_argument("--repeat", type=int, default=5, help="timed repetitions (medians)")
    p.add_argument(
        "--budget", type=float, default=600.0, help="skip a write estimated to take longer (s)"
    )
    p.add_argument("--workloads", default="abcdefghij", help="which of a..j to run, e.g. 'acd'")
    names = ", ".join(repr(c.name) for c in systems.ALL)
    p.add_argument("--systems", nargs="+", help=f"only these systems, among: {names}")
    p.add_argument("--cold", action="store_true", help="also run the reads with a cold page cache")
    p.add_argument(
        "--quick", action="store_true", help="small sizes: N 200/1000, 64 MiB, 500 arrays, repeat 3"
    )
    p.add_argument(
        "--data",
        type=Path,
        help="directory for the stores (default: a temporary one under benches/)",
    )
    p.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    p.add_argument(
        "--no-results", action="store_true", help="print only; do not write the results file"
    )
    p.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="the markdown file to update (default benches/RESULTS.md)",
    )
    p.add_argument(
        "--limits-mib", type=int, default=512, help="file size for the physical limits (MiB)"
    )
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child)
        return
    if args.quick:
        args.sizes, args.big_gib, args.many, args.repeat, args.limits_mib = (
            [200, 1_000],
            1 / 16,
            500,
            3,
            64,
        )
    check_args(p, args)

    chosen: dict[str, type[systems.System]] = {}
    known = {c.name for c in systems.ALL} | {c.__name__ for c in systems.ALL}
    unknown = sorted(set(args.systems or ()) - known)
    if unknown:
        p.error(f"unknown systems: {', '.join(map(repr, unknown))} (choose among: {names})")
    skipped: dict[str, str] = {}
    for cls in systems.ALL:
        if args.systems and cls.name not in args.systems and cls.__name__ not in args.systems:
            continue
        why = cls.missing()
        if why:
            skipped[cls.name] = why
        else:
            chosen[cls.name] = cls
    if "lazyvault" not in chosen:
        p.error("lazyvault must be among the systems (ratios are against it)")
    for name, why in skipped.items():
        print(f"skipping {name}: {why}")

    # a directory of its own, inside --data: only it is removed afterwards
    parent = args.data or HERE.parent
    parent.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix=".peers-data-", dir=parent))
    ctx = workloads.Context(
        systems=chosen,
        data=base,
        sizes=sorted(args.sizes),
        big_gib=args.big_gib,
        many=args.many,
        repeat=args.repeat,
        cold=args.cold,
        budget=args.budget,
    )
    started = time.time()
    load_before = os.getloadavg()
    rows: list[workloads.Row] = []
    try:
        print("measuring the machine's limits")
        machine_limits = limits.measure(base, args.limits_mib)
        for line in limits.describe(machine_limits):
            print(line)
        for fn in plan(args.workloads):
            print(f"({fn.__name__})")
            t0 = time.perf_counter()
            new = fn(ctx)
            print(f"({fn.__name__}: {time.perf_counter() - t0:.0f} s)")
            rows += new
            print(report.table(new, machine_limits, ctx), flush=True)
        # the results before the clean-up (removing 10^6 files takes minutes)
        header = describe_run(ctx, skipped, started, load_before, machine_limits)
        body = (
            "### Targets (issue 6)\n\n"
            + report.targets(rows, ctx)
            + "\n\n"
            + report.markdown(rows, machine_limits, ctx)
        )
        print(report.targets(rows, ctx))
        if not args.no_results:
            write_results(args.results, header + "\n" + body)
            print(f"written to {args.results}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses, before any work, what the run could not do."""
    if any(n < 1 for n in args.sizes):
        p.error("--sizes must be positive object counts")
    args.sizes = sorted(set(args.sizes))
    for name in ("repeat", "many", "limits_mib"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.big_gib * 2**30 >= 8192 * 4:
        p.error("--big-gib must hold at least one 32 KiB row (>= 0.00003)")
    if args.data is not None and args.data.exists() and not args.data.is_dir():
        p.error(f"--data {args.data}: not a directory")
    try:
        plan(args.workloads)
    except SystemExit as e:
        p.error(str(e))


def plan(which: str) -> list:
    """The workload functions to run, in order, with the writes the chosen
    reads need (their rows are reported too)."""
    wanted = set(which)
    unknown = wanted - set(workloads.ALL)
    if unknown:
        raise SystemExit(f"unknown workloads: {''.join(sorted(unknown))} (choose from a..j)")
    fns = []
    if wanted & set("abcfj"):
        fns.append(workloads.write_small)
    if wanted & set("adeghi"):
        fns.append(workloads.write_big)
    for w in "bcdefgihj":  # (h) changes the big object, so it runs after (i)
        if w in wanted:
            fns += [f for f in workloads.ALL[w] if f not in fns]
    return fns


def versions() -> list[str]:
    out = [f"Python {platform.python_version()}"]
    for pkg in ("lazyvault", "numpy", "joblib", "safetensors", "h5py", "zarr"):
        try:
            out.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} (not installed)")
    import sqlite3

    out.append(f"SQLite {sqlite3.sqlite_version}")
    return out


def describe_run(ctx, skipped, started, load_before, machine_limits) -> str:
    lines = [
        f"Run {datetime.fromtimestamp(started, UTC):%Y-%m-%d %H:%M} UTC, "
        f"{time.time() - started:.0f} s.",
        f"Machine: {host.describe_machine(ctx.data)}.",
        f"Load average {load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.",
        "Versions: " + ", ".join(versions()) + ".",
        "",
        "Rerun:",
        "",
        f"    ./dev bench {shlex.join(sys.argv[1:])}".rstrip(),
        "",
        "Physical limits measured in the same run:",
        "",
        *limits.describe(machine_limits),
        "",
    ]
    if skipped:
        lines += [
            "Skipped systems: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()) + ".",
            "",
        ]
    return "\n".join(lines)


BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"


def write_results(path: Path, section: str) -> None:
    """Replaces the harness's section of ``path`` (between the markers),
    keeping everything else."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{BEGIN}\n## lazyvault against its peers (`benches/peers`)\n\n{section}\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def child(argv: list[str]) -> None:
    """Work done in a separate process (strace counts, ulimit, readers)."""
    what, cls_name, root = argv[0], argv[1], Path(argv[2])
    cls = next(c for c in systems.ALL if c.__name__ == cls_name)
    s = cls(root)
    if what == "scan":
        s.open()
        s.scan()
        s.close()
    elif what == "hold":
        import resource

        from data import key_of

        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        n = int(argv[3])
        s.open()
        t0 = time.perf_counter()
        held = [s.array(key_of(i), "data") for i in range(n)]
        for i, a in enumerate(held):
            assert systems.touch(a) == 1024.0 * i
        seconds = time.perf_counter() - t0
        fds = len(os.listdir("/proc/self/fd"))
        maps = len(Path("/proc/self/maps").read_text().splitlines())
        print(json.dumps({"seconds": seconds, "fds": fds, "maps": maps}))
    elif what == "read":
        import base64
        import pickle

        import numpy as np

        hand = sys.stdin.readline().strip()
        if hand != "-":  # a record passed by reference: no store to open
            a = pickle.loads(base64.b64decode(hand)).open().data
        else:
            s.open()
            a = s.array("big", "data")
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.time()
        held = np.asarray(a[:])  # a view of the map, or a copy: kept for PSS
        held.sum()
        end = time.time()
        pss = (
            int(
                re.search(
                    r"^Pss:\s+(\d+) kB", Path("/proc/self/smaps_rollup").read_text(), re.M
                ).group(1)
            )
            * 1024
        )
        print(json.dumps({"start": start, "end": end, "bytes": held.nbytes, "pss": pss}))
    else:
        raise SystemExit(f"unknown child task {what}")


if __name__ == "__main__":
    main()
