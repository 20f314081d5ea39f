"""lazyvault against its peers: every workload of issue 6 (a-j) on every
system, and issue 15's metadata scans and small records (k, l) against
DuckDB over Parquet, polars, SQLite and Lance, on the same data, in one
session, alternating systems; prints the ratio tables and writes them into
benches/RESULTS.md (a-j and k-l into sections of their own).

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
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import columnar  # noqa: E402
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
    p.add_argument(
        "--scan-n",
        type=int,
        default=1_000_000,
        help="records of the metadata scan (k) (default 1,000,000)",
    )
    p.add_argument(
        "--small-n",
        type=int,
        default=100_000,
        help="small records (64 float64 each) of (l) (default 100,000)",
    )
    p.add_argument(
        "--scan-cache",
        type=Path,
        help="keep lazyvault's (k) store here between runs (rebuilt when the lazyvault build "
        "changes); default: built in the run's data directory and removed",
    )
    p.add_argument(
        "--save-baseline",
        action="store_true",
        help=f"store lazyvault's (k)/(l) numbers of this run as the baseline of issue 15's "
        f"targets ({columnar.BASELINE.name})",
    )
    p.add_argument(
        "--workloads", default="abcdefghijkl", help="which of a..l to run, e.g. 'acd' or 'kl'"
    )
    names = ", ".join(repr(n) for n in dict.fromkeys(c.name for c in (*systems.ALL, *columnar.ALL)))
    p.add_argument("--systems", nargs="+", help=f"only these systems, among: {names}")
    p.add_argument("--cold", action="store_true", help="also run the reads with a cold page cache")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes: N 200/1000, 64 MiB, 500 arrays, scan 20,000, small 2,000, repeat 3",
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
        args.scan_n, args.small_n = 20_000, 2_000
    check_args(p, args)

    chosen: dict[str, type[systems.System]] = {}
    chosen_columnar: dict[str, type[columnar.Columnar]] = {}
    every = (*systems.ALL, *columnar.ALL)
    known = {c.name for c in every} | {c.__name__ for c in every}
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
    for ccls in columnar.ALL:
        if args.systems and ccls.name not in args.systems and ccls.__name__ not in args.systems:
            continue
        why = ccls.missing()
        if why:
            skipped[ccls.name] = why
        else:
            chosen_columnar[ccls.name] = ccls
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
        columnar=chosen_columnar,
        scan_n=args.scan_n,
        small_n=args.small_n,
        scan_cache=args.scan_cache,
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
        old = [r for r in rows if r.workload in "abcdefghij"]
        new = [r for r in rows if r.workload in "kl"]
        if old:
            print(report.targets(old, ctx))
            body = (
                "### Targets (issue 6)\n\n"
                + report.targets(old, ctx)
                + "\n\n"
                + report.markdown(old, machine_limits, ctx)
            )
            if not args.no_results:
                write_results(args.results, header + "\n" + body)
        if new:
            print(columnar.targets(new, ctx, machine_limits))
            body = (
                "### Targets (issue 15)\n\n"
                + columnar.targets(new, ctx, machine_limits)
                + "\n\n"
                + report.markdown(new, machine_limits, ctx)
            )
            if not args.no_results:
                write_results(args.results, header + "\n" + body, ISSUE15)
        if args.save_baseline:
            base = columnar.baseline_of(new, ctx, lazyvault_commit())
            columnar.BASELINE.write_text(json.dumps(base, indent=1) + "\n")
            print(f"baseline written to {columnar.BASELINE}")
        if not args.no_results:
            print(f"written to {args.results}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses, before any work, what the run could not do."""
    if any(n < 1 for n in args.sizes):
        p.error("--sizes must be positive object counts")
    if args.scan_n < 1 or args.small_n < 1:
        p.error("--scan-n and --small-n must be positive record counts")
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
    unknown = wanted - set(workloads.ALL) - set(columnar.ALL_WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown workloads: {''.join(sorted(unknown))} (choose from a..l)")
    fns = []
    if wanted & set("abcfj"):
        fns.append(workloads.write_small)
    if wanted & set("adeghi"):
        fns.append(workloads.write_big)
    for w in "bcdefgihj":  # (h) changes the big object, so it runs after (i)
        if w in wanted:
            fns += [f for f in workloads.ALL[w] if f not in fns]
    for w in "kl":
        if w in wanted:
            fns += columnar.ALL_WORKLOADS[w]
    return fns


def versions() -> list[str]:
    out = [f"Python {platform.python_version()}"]
    for pkg in (
        "lazyvault",
        "numpy",
        "joblib",
        "safetensors",
        "h5py",
        "zarr",
        "pyarrow",
        "duckdb",
        "polars",
        "pylance",
    ):
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


PEERS = ("peers", "lazyvault against its peers (`benches/peers`)")
ISSUE15 = ("issue15", "Metadata scans and small records (issue 15, `benches/peers` k and l)")


def write_results(path: Path, section: str, which: tuple[str, str] = PEERS) -> None:
    """Replaces one of the harness's sections of ``path`` (between its
    markers), keeping everything else."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    begin, end = f"<!-- {which[0]}:begin -->", f"<!-- {which[0]}:end -->"
    block = f"{begin}\n## {which[1]}\n\n{section}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def lazyvault_commit() -> str:
    """The commit of the lazyvault sources imported (their git checkout), or "?"."""
    import lazyvault

    out = subprocess.run(
        ["git", "-C", str(Path(lazyvault.__file__).parent), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


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
