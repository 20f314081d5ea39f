"""The workloads (a)-(j) of issue 6, each run on every system in turn.

Each workload returns ``Row``s: one measured value per system, compared
against lazyvault's value for the same workload (ratio = lazyvault / system:
below 1 lazyvault is faster for times, smaller for memory). Every read
touches the bytes it claims to read, and results are checked equal across
systems, so no system is timed returning a handle.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from data import big_array, key_of, many_arrays, matches, meta_of, small_objects
from systems import System, touch

HERE = Path(__file__).resolve().parent


@dataclass
class Row:
    workload: str  # "a".."j"
    case: str  # what was measured, e.g. "write 10,000 objects"
    system: str
    value: float | None  # seconds, bytes or bytes/s (see unit)
    unit: str = "s"
    cache: str = "warm"
    extra: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""


@dataclass
class Context:
    """What every workload gets: the systems (class per name), the data
    directory, the sizes and the repeat counts."""

    systems: dict[str, type[System]]
    data: Path
    sizes: list[int]
    big_gib: float
    many: int
    repeat: int
    cold: bool
    budget: float  # seconds: a write estimated to take longer is skipped
    log: Callable[[str], None] = print
    # issue 15's workloads (k) and (l) (columnar.py): their systems and sizes
    columnar: dict[str, type] = field(default_factory=dict)
    scan_n: int = 1_000_000
    small_n: int = 100_000
    scan_cache: Path | None = None  # where lazyvault's (k) store is kept between runs
    written: dict[tuple[str, str], float] = field(default_factory=dict)

    def root(self, system: str, dataset: str) -> Path:
        return self.data / dataset / system.replace(" ", "_").replace("+", "_").replace(".", "")

    def instance(self, system: str, dataset: str) -> System:
        return self.systems[system](self.root(system, dataset))

    def order(self, turn: int) -> list[str]:
        """The systems, rotated by ``turn`` so no system always runs first."""
        names = list(self.systems)
        k = turn % len(names)
        return names[k:] + names[:k]


def drop_cache(root: Path) -> None:
    """Evicts ``root``'s files from the page cache: ``posix_fadvise(DONTNEED)``
    on each (the files are clean: every write ended durable)."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def reopen_cold(s: System) -> None:
    """Before a cold run on an open system: close it (dropping whatever it
    cached in memory), evict its files, open it again."""
    s.close()
    drop_cache(s.root)
    s.open()


def timed(
    fn: Callable[[], Any],
    repeat: int,
    before: Callable[[], None] | None = None,
    cap: float = 30.0,
) -> float:
    """Median seconds of ``repeat`` calls of ``fn`` (``before`` untimed),
    stopping early once the calls took ``cap`` seconds in all (a slow system
    is timed fewer times, never less than once)."""
    times: list[float] = []
    while len(times) < repeat and sum(times) < cap:
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def caches(ctx: Context) -> list[str]:
    return ["warm", "cold"] if ctx.cold else ["warm"]


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


# -- (a) writes -------------------------------------------------------------


def _write(
    ctx: Context,
    system: str,
    dataset: str,
    objects: Callable[[], Any],
    n: int,
    prev: tuple[str, int] | None,
) -> Row:
    case = f"write {n:,} objects" if dataset.startswith("small") else f"write {dataset}"
    if prev is not None:
        before = ctx.written.get((system, prev[0]))
        if before is None:
            return Row("a", case, system, None, skipped=f"skipped: {prev[0]} was skipped")
        estimate = before * n / prev[1]
        if estimate > ctx.budget:
            return Row(
                "a",
                case,
                system,
                None,
                skipped=f"skipped: estimated {estimate:.0f} s > budget {ctx.budget:.0f} s",
            )
    why = ctx.systems[system].cannot.get(dataset)
    if why:
        return Row("a", case, system, None, skipped=f"skipped: {why}")
    sysm = ctx.instance(system, dataset)
    ctx.log(f"  {case}: {system}")
    t0 = time.perf_counter()
    sysm.write(objects())
    seconds = time.perf_counter() - t0
    ctx.written[(system, dataset)] = seconds
    return Row("a", case, system, seconds)


def write_small(ctx: Context) -> list[Row]:
    """(a) N objects of 1 KiB metadata and one 4 KiB array, made durable."""
    rows = []
    prev = None
    for turn, n in enumerate(ctx.sizes):
        for system in ctx.order(turn):
            rows.append(_write(ctx, system, f"small-{n}", lambda n=n: small_objects(n), n, prev))
        prev = (f"small-{n}", n)
    return rows


def write_big(ctx: Context) -> list[Row]:
    """(a) one object holding a ``big_gib`` GiB float32 array and a small one."""
    big = big_array(ctx.big_gib)
    labels = np.arange(1024, dtype=np.int64)
    rows = []
    for system in ctx.order(0):
        objs = [("big", {"kind": "big", "rows": big.shape[0]}, {"data": big, "labels": labels})]
        row = _write(ctx, system, "big", lambda objs=objs: objs, 1, None)
        row.case = f"write {big.nbytes / 2**30:g} GiB array"
        row.extra["bytes"] = big.nbytes
        rows.append(row)
    return rows


def write_many(ctx: Context) -> list[Row]:
    """(f) one object of ``many`` arrays of 4 KiB."""
    arrays = many_arrays(ctx.many)
    rows = []
    for system in ctx.order(1):
        objs = [("many", {"kind": "many"}, arrays)]
        row = _write(ctx, system, "many", lambda objs=objs: objs, 1, None)
        row.workload, row.case = "f", f"write one object of {ctx.many:,} arrays of 4 KiB"
        rows.append(row)
    return rows


def _available(ctx: Context, system: str, dataset: str) -> bool:
    return (system, dataset) in ctx.written


# -- (b) open + one record's metadata -----------------------------------------


def open_one(ctx: Context) -> list[Row]:
    n = max(ctx.sizes)
    dataset, key = f"small-{n}", key_of(n // 2)
    rows = []
    for cache in caches(ctx):
        for system in ctx.order(2):
            case = f"open + metadata of one of {n:,} objects"
            if not _available(ctx, system, dataset):
                rows.append(
                    Row("b", case, system, None, cache=cache, skipped="no data (write skipped)")
                )
                continue
            s = ctx.instance(system, dataset)

            def once(s: System = s) -> None:
                s.open()
                try:
                    assert s.meta(key) == meta_of(n // 2)
                finally:
                    s.close()

            before = (lambda s=s: drop_cache(s.root)) if cache == "cold" else None
            repeat = ctx.repeat * 4 if cache == "warm" else ctx.repeat
            rows.append(Row("b", case, system, timed(once, repeat, before), cache=cache))
    return rows


# -- (c) metadata scan ----------------------------------------------------------


def scan(ctx: Context) -> list[Row]:
    rows = []
    for turn, n in enumerate(ctx.sizes):
        dataset = f"small-{n}"
        expected = [key_of(i) for i in range(n) if matches(meta_of(i))]
        for cache in caches(ctx):
            for system in ctx.order(turn):
                case = f"scan {n:,} objects"
                if not _available(ctx, system, dataset):
                    rows.append(
                        Row("c", case, system, None, cache=cache, skipped="no data (write skipped)")
                    )
                    continue
                s = ctx.instance(system, dataset)
                s.open()
                try:
                    assert s.scan() == expected, system
                    before = (lambda s=s: reopen_cold(s)) if cache == "cold" else None
                    r0 = _rchar()
                    seconds = timed(s.scan, ctx.repeat, before)
                    read = (_rchar() - r0) / ctx.repeat
                finally:
                    s.close()
                extra = {"read() bytes": read, "files opened": files_opened(s, "scan")}
                rows.append(Row("c", case, system, seconds, cache=cache, extra=extra))
    return rows


def files_opened(s: System, what: str) -> int | None:
    """Files under the system's root opened by ``open(); <what>; close()``,
    counted with strace in a child process (None without strace)."""
    import shutil

    if shutil.which("strace") is None:
        return None
    out = s.root.parent / f".strace-{os.getpid()}"
    cmd = ["strace", "-f", "-qq", "-e", "trace=open,openat", "-o", str(out)]
    cmd += [sys.executable, str(HERE), "--child", what, type(s).__name__, str(s.root)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    text = out.read_text()
    out.unlink()
    root = str(s.root)
    return sum(1 for line in text.splitlines() if root in line and "= -1" not in line)


# -- (d) first access, full touch; (e) row slices --------------------------------------


def first_access(ctx: Context) -> list[Row]:
    """(d) first element of the big array and of a 4 KiB one (the cost must
    not depend on the size), then every byte of the big array."""
    small = f"small-{max(ctx.sizes)}"
    cases = [
        ("big", "big", f"first element of the {ctx.big_gib:g} GiB array"),
        (small, key_of(0), "first element of a 4 KiB array"),
    ]
    rows = []
    for cache in caches(ctx):
        for system in ctx.order(3):
            for dataset, key, case in cases:
                if not _available(ctx, system, dataset):
                    rows.append(Row("d", case, system, None, cache=cache, skipped="no data"))
                    continue
                s = ctx.instance(system, dataset)
                s.open()
                try:
                    before = (lambda s=s: reopen_cold(s)) if cache == "cold" else None

                    def first(s: System = s, key: str = key) -> None:
                        assert float(np.asarray(s.array(key, "data")[0:1]).ravel()[0]) == 0.0

                    seconds = timed(first, ctx.repeat * 4, before)
                    rows.append(Row("d", case, system, seconds, cache=cache))
                    if dataset != "big":
                        continue
                    expected = touch(big_array_ref(ctx))

                    def full(s: System = s, expected: float = expected) -> None:
                        assert touch(s.array("big", "data")) == expected

                    case_full = f"touch every byte of the {ctx.big_gib:g} GiB array (.sum())"
                    seconds = timed(full, ctx.repeat, before)
                    rows.append(Row("d", case_full, system, seconds, cache=cache))
                finally:
                    s.close()
    return rows


_BIG: dict[float, np.ndarray] = {}


def big_array_ref(ctx: Context) -> np.ndarray:
    if ctx.big_gib not in _BIG:
        _BIG.clear()
        _BIG[ctx.big_gib] = big_array(ctx.big_gib)
    return _BIG[ctx.big_gib]


def row_slices(ctx: Context) -> list[Row]:
    rows = []
    nrows = big_array_ref(ctx).shape[0]
    picks = np.random.default_rng(6).integers(0, nrows, 1000)
    for cache in caches(ctx):
        for system in ctx.order(4):
            case = "1,000 random rows (32 KiB each), summed"
            if not _available(ctx, system, "big"):
                rows.append(Row("e", case, system, None, cache=cache, skipped="no data"))
                continue
            s = ctx.instance(system, "big")
            s.open()
            try:

                def slices(s: System = s) -> None:
                    a = s.array("big", "data")
                    for i in picks:
                        assert float(np.asarray(a[i : i + 1]).sum()) == 8192.0 * i

                before = (lambda s=s: reopen_cold(s)) if cache == "cold" else None
                rows.append(Row("e", case, system, timed(slices, ctx.repeat, before), cache=cache))
            finally:
                s.close()
    return rows


# -- (f) many small arrays --------------------------------------------------------


def read_many(ctx: Context) -> list[Row]:
    rows = []
    for system in ctx.order(5):
        case = f"read all {ctx.many:,} arrays of one object"
        if not _available(ctx, system, "many"):
            rows.append(Row("f", case, system, None, skipped="no data"))
            continue
        s = ctx.instance(system, "many")
        s.open()
        try:

            def read_all(s: System = s) -> None:
                names = s.array_names("many")
                assert len(names) == ctx.many
                arrays = s.arrays("many")
                for k, name in enumerate(sorted(names)):
                    assert touch(arrays[name]) == 1024.0 * k

            rows.append(Row("f", case, system, timed(read_all, ctx.repeat)))
        finally:
            s.close()
    return rows


def hold_all(ctx: Context) -> list[Row]:
    """(f) every array of the largest small-N store alive at once, in a child
    limited to ``ulimit -n 256``: time, open fds and memory maps."""
    n = max(ctx.sizes)
    dataset = f"small-{n}"
    rows = []
    for system in ctx.order(6):
        case = f"hold all {n:,} arrays (ulimit -n 256)"
        if not _available(ctx, system, dataset):
            rows.append(Row("f", case, system, None, skipped="no data"))
            continue
        s = ctx.instance(system, dataset)
        report = _child(["hold", type(s).__name__, str(s.root), str(n)])
        if "error" in report:
            rows.append(Row("f", case, system, None, skipped="failed: " + report["error"]))
        else:
            extra = {"fds": report["fds"], "maps": report["maps"]}
            rows.append(Row("f", case, system, report["seconds"], extra=extra))
    return rows


def _child(args: list[str], stdin: str | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, str(HERE), "--child", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1][:200]}
    return json.loads(out.stdout)


# -- (g) eight readers ---------------------------------------------------------------


def readers(ctx: Context, count: int = 8) -> list[Row]:
    rows = []
    for system in ctx.order(7):
        case = f"{count} reader processes touch the same array"
        if not _available(ctx, system, "big"):
            rows.append(Row("g", case, system, None, unit="B/s", skipped="no data"))
            continue
        s = ctx.instance(system, "big")
        s.open()
        hand = s.handoff("big")
        procs = [
            subprocess.Popen(
                [sys.executable, str(HERE), "--child", "read", type(s).__name__, str(s.root)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(count)
        ]
        for p in procs:  # each says "ready" once imported and opened
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write((base64.b64encode(hand).decode() if hand else "-") + "\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = []
        for p in procs:
            out, _ = p.communicate()
            reports.append(json.loads(out))
        s.close()
        wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        total = sum(r["bytes"] for r in reports)
        pss = statistics.median(r["pss"] for r in reports)
        rows.append(Row("g", case, system, total / wall, unit="B/s", extra={"PSS per reader": pss}))
    return rows


# -- (h) replace one array -----------------------------------------------------------


def replace_one(ctx: Context) -> list[Row]:
    rows = []
    new = np.arange(1024, dtype=np.int64) * 2
    for system in ctx.order(8):
        case = "replace the 8 KiB array of the big object"
        if not _available(ctx, system, "big"):
            rows.append(Row("h", case, system, None, skipped="no data"))
            continue
        s = ctx.instance(system, "big")
        s.open()
        try:
            seconds = timed(
                lambda s=s: s.replace_array("big", "labels", new), max(ctx.repeat // 2, 1)
            )
            assert np.array_equal(np.asarray(s.array("big", "labels")[:]), new)
        except (NotImplementedError, OSError, ValueError, RuntimeError) as e:
            why = f"failed: {type(e).__name__}: {e}"[:160]
            rows.append(Row("h", case, system, None, skipped=why))
            continue
        finally:
            s.close()
        rows.append(Row("h", case, system, seconds))
    return rows


# -- (i) pickle protocol 5 ------------------------------------------------------------


def pickle5(ctx: Context) -> list[Row]:
    rows = []
    for system in ctx.order(9):
        case = "pickle protocol 5 of the big object: extra memory"
        if not _available(ctx, system, "big"):
            rows.append(Row("i", case, system, None, unit="B", skipped="no data"))
            continue
        s = ctx.instance(system, "big")
        s.open()
        try:
            tracemalloc.start()
            t0 = time.perf_counter()
            try:
                buffers: list[pickle.PickleBuffer] = []
                data = pickle.dumps(s.picklable("big"), protocol=5, buffer_callback=buffers.append)
            except Exception as e:
                rows.append(
                    Row(
                        "i",
                        case,
                        system,
                        None,
                        unit="B",
                        skipped=f"cannot pickle: {type(e).__name__}: {e}"[:120],
                    )
                )
                continue
            finally:
                seconds = time.perf_counter() - t0
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            extra = {
                "seconds": seconds,
                "in-band bytes": len(data),
                "out-of-band buffers": len(buffers),
            }
            rows.append(Row("i", case, system, peak, unit="B", extra=extra))
            del data, buffers
        finally:
            s.close()
    return rows


# -- (j) repr -----------------------------------------------------------------------


def show(ctx: Context) -> list[Row]:
    n = max(ctx.sizes)
    count = min(n, 10_000)
    keys = [key_of(i) for i in range(count)]
    rows = []
    for system in ctx.order(10):
        case = f"repr of {count:,} objects"
        if not _available(ctx, system, f"small-{n}"):
            rows.append(Row("j", case, system, None, skipped="no data"))
            continue
        s = ctx.instance(system, f"small-{n}")
        s.open()
        try:
            rows.append(
                Row(
                    "j",
                    case,
                    system,
                    timed(lambda s=s: [s.show(k) for k in keys], max(ctx.repeat // 2, 1)),
                )
            )
        finally:
            s.close()
    return rows


ALL: dict[str, list[Callable[[Context], list[Row]]]] = {
    "a": [write_small, write_big],
    "b": [open_one],
    "c": [scan],
    "d": [first_access],
    "e": [row_slices],
    "f": [write_many, read_many, hold_all],
    "g": [readers],
    "h": [replace_one],
    "i": [pickle5],
    "j": [show],
}
