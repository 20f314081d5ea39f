"""Readers beside a writer (issue 11 targets): what a reader (mode "r": the
newest checkpoint mapped plus the committed journal after it, no lock, no
sled) costs against the sled-based writer, on stores of 10k, 100k and 1M
records, all measured side by side in one run.

    .venv/bin/python benches/readers.py              # 10k, 100k, 1M records
    .venv/bin/python benches/readers.py --quick      # 10k and 100k, printed only
    .venv/bin/python benches/readers.py --help       # every option

Targets (issue 11), each measured in fresh processes (``python -c``-like
children of this script; interpreter start and imports are never timed),
warm page cache (the checkpoint runs, journal and index are read before):

1. mode "r" open + ``len()`` + one ``store[key]``: at most 20 ms at 1M
   records, and flat in the store's size (medians of ``--repeat`` processes);
2. a reader's anonymous private memory after that: at most 32 MiB for 1M
   records (the increase across the three calls, from
   ``/proc/self/smaps_rollup`` ``Anonymous``; the absolute value is shown);
3. the first query after opening no slower than 2x the same query later;
4. ``find``/``count`` in a reader no slower than in the writer (a mode "a"
   handle after writing one record and flushing);
5. ``close()`` after changing one record: at most 50 ms (median of
   ``--close-rounds``), and the write amplification of the checkpoint runs
   over ``--wa-rounds`` rounds of "update 1-10 random records, close".

The old, sled-based figures are measured in the same run where they exist:
the writer role (taken with ``begin_write()``, which opens sled and changes
nothing) + ``len`` + ``store[key]``, and the
writer's first and later queries.

Stores are built once under ``--data`` (default /tmp/lv-readers-bench) and
reused while they hold the expected number of records. The run changes
records of them (targets 4 and 5), never their number. Results go into
benches/RESULTS.md between ``<!-- readers:begin -->`` and
``<!-- readers:end -->``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import random
import select
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import lazyvault as lv

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))

import host  # noqa: E402  (benches/peers/host.py: one description of the machine)

RESULTS = HERE / "RESULTS.md"
BEGIN, END = "<!-- readers:begin -->", "<!-- readers:end -->"
TITLE = "## Readers beside a writer (issue 11 targets)"

QUERY = "temperature > 250 and material == 'Si'"
MATERIALS = ("Si", "Ge", "GaAs", "Cu", "Al")
# A key no store holds: deleting it takes the writer role (opens sled) and
# changes nothing (for builds without Store.begin_write).
ABSENT = "\uffff-absent-key"
# Disk per record: a payload file of its own (one 4 KiB block and its
# directory entry), plus journal, run and sled entries (measured: ~6.1 KB).
BYTES_PER_RECORD = 7 * 1024
MIB = 2**20

LIMIT_OPEN = 0.020
LIMIT_FLAT = 1.5
LIMIT_ANON = 32 * MIB
LIMIT_FIRST = 2.0
LIMIT_CLOSE = 0.050


# -- the records ----------------------------------------------------------


def key_of(i: int) -> str:
    return f"run-{i:07d}"


def make_object(i: int, rng: random.Random, positions: np.ndarray) -> dict[str, Any]:
    """Five metadata fields (one nested) and one small array."""
    return {
        "temperature": round(rng.uniform(0.0, 400.0), 3),
        "material": MATERIALS[rng.randrange(len(MATERIALS))],
        "step": i,
        "params": {"lr": 10.0 ** -rng.randint(1, 5)},
        "tag": f"batch-{i // 1000}",
        "positions": positions,
    }


def objects(n: int, seed: int = 0):
    rng = random.Random(seed)
    g = np.random.default_rng(seed)
    for i in range(n):
        yield key_of(i), make_object(i, rng, g.random(8, dtype=np.float32))


# -- measurements inside a child process ----------------------------------


def memory() -> dict[str, int]:
    """Fields of /proc/self/smaps_rollup, in bytes."""
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        out[name] = int(value.split()[0]) * 1024
    return out


def child_build(spec: dict) -> dict:
    t0 = time.perf_counter()
    store = lv.Store.open(spec["path"], "a")
    store.update(objects(spec["n"]), progress=False)
    t1 = time.perf_counter()
    store.close()
    t2 = time.perf_counter()
    return {"update": t1 - t0, "close": t2 - t1}


def take_writer_role(store: lv.Store) -> None:
    """Opens sled and takes the lock, changing nothing: ``begin_write()``
    where the build has it, else deleting a key that is not there."""
    if hasattr(store, "begin_write"):
        store.begin_write()
    else:
        assert store._core.delete(ABSENT) is False
    assert store.is_writer


def child_open(spec: dict) -> dict:
    """Open + len + one record, timed alone; memory before and after."""
    path, kind, key = spec["path"], spec["kind"], spec["key"]
    before = memory()
    role = None
    if kind == "core":  # the Rust core alone, no Python wrapper
        t0 = time.perf_counter()
        core = lv._lazyvault.StoreCore(path, "r")
        n = len(core)
        got = core.get_full(key)
        t1 = time.perf_counter()
        assert got is not None
        after = memory()
        core.close()
    else:
        t0 = time.perf_counter()
        store = lv.Store.open(path, "r" if kind == "reader" else "a")
        if kind == "writer":
            take_writer_role(store)
            role = time.perf_counter() - t0
        n = len(store)
        rec = store[key]
        t1 = time.perf_counter()
        assert rec.key == key
        after = memory()
        t2 = time.perf_counter()
        store.close()  # the writer: nothing to commit, checkpoint or remove
        closing = time.perf_counter() - t2
    return {
        "seconds": t1 - t0,
        "role": role,
        "close": closing if kind == "writer" else None,
        "len": n,
        "before": before,
        "after": after,
    }


def child_query(spec: dict) -> dict:
    """The first query after opening, then each query again ``later`` times."""
    path, role, first, n = spec["path"], spec["role"], spec["first"], spec["n"]
    rng = random.Random(spec["seed"])
    store = lv.Store.open(path, "r" if role == "reader" else "a")
    if role == "writer":
        i = rng.randrange(n)
        store[key_of(i)] = make_object(i, rng, np.zeros(8, np.float32))
        store.flush()
        assert store.is_writer
    ops = {"count": lambda: store.count(QUERY), "find": lambda: len(store.find(QUERY))}
    answers = {}
    t0 = time.perf_counter()
    answers[first] = ops[first]()
    first_s = time.perf_counter() - t0
    later: dict[str, list[float]] = {"count": [], "find": []}
    for _ in range(spec["later"]):
        for op in (first, *(o for o in ops if o != first)):
            t0 = time.perf_counter()
            answers[op] = ops[op]()
            later[op].append(time.perf_counter() - t0)
    store.close()
    return {"first": first, "first_s": first_s, "later": later, "answers": answers}


def child_close(spec: dict) -> dict:
    """Rounds of: open "a", overwrite one random record, time close() (with
    ``split``: time flush(), then close() after it)."""
    path, n = spec["path"], spec["n"]
    rng = random.Random(spec["seed"])
    rounds = []
    for _ in range(spec["rounds"]):
        store = lv.Store.open(path, "a")
        i = rng.randrange(n)
        store[key_of(i)] = make_object(i, rng, np.zeros(8, np.float32))
        t0 = time.perf_counter()
        if spec["split"]:
            store.flush()
            t1 = time.perf_counter()
            store.close()
            rounds.append((t1 - t0, time.perf_counter() - t1))
        else:
            store.close()
            rounds.append(time.perf_counter() - t0)
    return {"rounds": rounds}


class FanotifyWatcher:
    """Sees every file the writer finishes in a directory with fanotify
    (``FAN_CLOSE_WRITE``; needs ``CAP_SYS_ADMIN``): each event comes with
    a descriptor of the file opened by the kernel, so a run's final size is
    known (``fstat``) even when a merge later in the same checkpoint has
    already removed it. Nothing can be missed."""

    method = "fanotify"
    FAN_CLOEXEC, FAN_NONBLOCK, FAN_MARK_ADD = 0x1, 0x2, 0x1
    FAN_CLOSE_WRITE, FAN_EVENT_ON_CHILD = 0x8, 0x08000000
    AT_FDCWD = -100

    def __init__(self, directory: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fanotify_mark.argtypes = [
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint64,
            ctypes.c_int,
            ctypes.c_char_p,
        ]
        flags = os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC
        self.fd = libc.fanotify_init(self.FAN_CLOEXEC | self.FAN_NONBLOCK, flags)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init")
        mask = self.FAN_CLOSE_WRITE | self.FAN_EVENT_ON_CHILD
        if libc.fanotify_mark(self.fd, self.FAN_MARK_ADD, mask, self.AT_FDCWD, bytes(directory)):
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, f"fanotify_mark {directory}")
        self.ckpt_bytes = self.ckpts = 0
        self.missed: list[str] = []

    def collect(self) -> list[tuple[str, int]]:
        """The runs finished since the last call, with their sizes. (No
        file is finished twice; inode numbers of removed runs are reused.)"""
        out = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return out
            at = 0
            while at < len(buf):
                length, _, _, _, _, fd, _ = struct.unpack_from("<IBBHQii", buf, at)
                at += length
                if fd < 0:
                    self.missed.append("(queue overflow)")
                    continue
                try:
                    name = os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)")
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
                name = os.path.basename(name).removesuffix(".tmp")
                if name.endswith(".run"):
                    out.append((name, st.st_size))
                elif name.endswith(".ckpt"):
                    self.ckpt_bytes += st.st_size
                    self.ckpts += 1

    def stop(self) -> None:
        self.collect()
        os.close(self.fd)


class InotifyWatcher:
    """The same with inotify, for when fanotify is not allowed: a run's
    temporary file is opened as soon as it is created (a thread waits for
    the events), so its final size is known even when it is removed later;
    a run removed before the thread could open it is counted as missed."""

    method = "inotify"
    IN_MOVED_TO, IN_CREATE = 0x80, 0x100

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = self.IN_CREATE | self.IN_MOVED_TO
        if libc.inotify_add_watch(self.fd, os.fsencode(directory), mask) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory}")
        self.runs: dict[str, int] = {}  # final name -> open fd
        self.ckpt_bytes = 0
        self.ckpts = 0
        self.missed: list[str] = []
        self.wake_r, self.wake_w = os.pipe()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _open(self, name: str) -> int | None:
        with contextlib.suppress(FileNotFoundError):
            return os.open(self.dir / name, os.O_RDONLY | os.O_CLOEXEC)
        return None

    def _drain(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            at = 0
            while at < len(buf):
                _, mask, _, length = struct.unpack_from("<iIII", buf, at)
                name = buf[at + 16 : at + 16 + length].rstrip(b"\0").decode()
                at += 16 + length
                final = name.removesuffix(".tmp")
                if final.endswith(".run") and final not in self.runs:
                    fd = self._open(name)
                    if fd is None and name != final:
                        fd = self._open(final)
                    if fd is None:
                        self.missed.append(final)
                    else:
                        self.runs[final] = fd
                elif name.endswith(".ckpt") and mask & self.IN_MOVED_TO:
                    with contextlib.suppress(FileNotFoundError):
                        self.ckpt_bytes += (self.dir / name).stat().st_size
                        self.ckpts += 1

    def _loop(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd, self.wake_r], [], [])
            self._drain()
            if self.wake_r in ready:
                cmd = os.read(self.wake_r, 1)
                self._drain()
                self.done.set()
                if cmd == b"q":
                    return

    def collect(self) -> list[tuple[str, int]]:
        """The runs created since the last call, with their sizes."""
        self.done.clear()
        os.write(self.wake_w, b"c")
        self.done.wait()
        out = []
        for name, fd in self.runs.items():
            out.append((name, os.fstat(fd).st_size))
            os.close(fd)
        self.runs.clear()
        return out

    def stop(self) -> None:
        self.done.clear()
        os.write(self.wake_w, b"q")
        self.done.wait()
        self.thread.join()
        for fd in (self.fd, self.wake_r, self.wake_w):
            os.close(fd)


def watcher_for(directory: Path) -> FanotifyWatcher | InotifyWatcher:
    try:
        return FanotifyWatcher(directory)
    except OSError:
        return InotifyWatcher(directory)


def run_files(path: Path) -> list[int]:
    """Sizes of the runs of the newest checkpoint, newest first."""
    core = lv._lazyvault.StoreCore(str(path), "r")
    core.close()
    ckpts = sorted((path / "checkpoints").glob("*.ckpt"))
    raw = ckpts[-1].read_bytes()
    length = int.from_bytes(raw[8:12], "little")
    return [r["bytes"] for r in json.loads(raw[12 : 12 + length])["runs"]]


def child_wa(spec: dict) -> dict:
    """Rounds of: open "a", overwrite 1-10 random records, close; the bytes
    of checkpoint runs created against the bytes of the changed records."""
    path, n = Path(spec["path"]), spec["n"]
    rng = random.Random(spec["seed"])
    runs_before = run_files(path)
    watcher = watcher_for(path / "checkpoints")
    record_bytes = run_bytes = runs_created = 0
    closes = []
    try:
        for _ in range(spec["rounds"]):
            store = lv.Store.open(path, "a")
            for i in rng.sample(range(n), rng.randint(1, 10)):
                store[key_of(i)] = make_object(i, rng, np.zeros(8, np.float32))
                record_bytes += len(store._core.get(key_of(i)))
            t0 = time.perf_counter()
            store.close()
            closes.append(time.perf_counter() - t0)
            created = watcher.collect()
            runs_created += len(created)
            run_bytes += sum(size for _, size in created)
    finally:
        watcher.stop()
    return {
        "record_bytes": record_bytes,
        "run_bytes": run_bytes,
        "runs_created": runs_created,
        "ckpt_bytes": watcher.ckpt_bytes,
        "ckpts": watcher.ckpts,
        "missed": watcher.missed,
        "method": watcher.method,
        "runs_before": runs_before,
        "runs_after": run_files(path),
        "closes": closes,
        "rounds": spec["rounds"],
    }


CHILDREN = {
    "build": child_build,
    "open": child_open,
    "query": child_query,
    "close": child_close,
    "wa": child_wa,
}


def child(task: str, spec_json: str) -> None:
    print(json.dumps(CHILDREN[task](json.loads(spec_json))))


# -- the parent -----------------------------------------------------------


def run_child(task: str, **spec: Any) -> dict:
    """Runs one measurement in a fresh Python process (same interpreter and
    environment: ``PYTHONPATH`` picks the same lazyvault)."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", task, json.dumps(spec)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {task} {spec} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def store_len(path: Path) -> int | None:
    try:
        core = lv._lazyvault.StoreCore(str(path), "r")
    except Exception:
        return None
    try:
        return len(core)
    finally:
        core.close()


built_now: set[int] = set()


def ensure_store(data: Path, n: int, rebuild: bool) -> dict | None:
    """Builds the store of ``n`` records unless one is there; returns what
    its build measured (kept beside it in ``store-<n>.json``), if known."""
    path = data / f"store-{n}"
    info = data / f"store-{n}.json"
    if store_len(path) == n and not rebuild:
        return json.loads(info.read_text()) if info.exists() else None
    if path.exists():
        why = "rebuilding (--rebuild)" if rebuild else f"not a store of {n:,} records, rebuilding"
        print(f"  {path}: {why}", flush=True)
        shutil.rmtree(path)
    info.unlink(missing_ok=True)
    print(f"  building {path} ({n:,} records)...", flush=True)
    t0 = time.perf_counter()
    got = run_child("build", path=str(path), n=n)
    got["total"] = time.perf_counter() - t0
    got["date"] = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    built_now.add(n)
    assert store_len(path) == n, "the built store does not hold every record"
    # The writer's first session after the bulk load: its index position is
    # in the one big journal segment the load wrote.
    warm(path)
    roles = [run_child("open", path=str(path), kind="writer", key=key_of(0)) for _ in range(3)]
    got["role_after_build"] = med([g["role"] for g in roles])
    got["open_after_build"] = med([g["seconds"] for g in roles])
    info.write_text(json.dumps(got, indent=1) + "\n")
    print(
        f"  built in {got['total']:.0f} s (close {got['close']:.1f} s); writer role right "
        f"after: {ms(got['role_after_build'])}",
        flush=True,
    )
    return got


def warm(path: Path) -> int:
    """Reads the index, journal and checkpoint files into the page cache."""
    buf = bytearray(1 << 20)
    total = 0
    for sub in ("checkpoints", "journal", "index"):
        for dirpath, _, files in os.walk(path / sub):
            for f in files:
                with contextlib.suppress(FileNotFoundError), open(Path(dirpath, f), "rb") as fh:
                    while n := fh.readinto(buf):
                        total += n
    return total


def du(path: Path) -> dict[str, int]:
    out = {}
    for sub in ("checkpoints", "journal", "index"):
        out[sub] = sum(
            os.path.getsize(Path(d, f))
            for d, _, files in os.walk(path / sub)
            for f in files
            if Path(d, f).exists()
        )
    return out


def fsync_latency(directory: Path, rounds: int = 20) -> float:
    """Median time to overwrite 4 KiB of a file and fsync it: the cost of
    one durability barrier on this disk now (close() makes several)."""
    probe = directory / ".fsync-probe"
    times = []
    with open(probe, "wb") as f:
        for _ in range(rounds):
            f.seek(0)
            f.write(os.urandom(4096))
            f.flush()
            t0 = time.perf_counter()
            os.fsync(f.fileno())
            times.append(time.perf_counter() - t0)
    probe.unlink()
    return med(times)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def measure(path: Path, n: int, args: argparse.Namespace) -> dict:
    rng = random.Random(n)
    r: dict[str, Any] = {"n": n, "files": du(path), "runs": run_files(path)}
    # One writer session first, as every later one finds the store: the
    # writer's index position then lies in a small journal segment (right
    # after a bulk load it lies in the one the load wrote; see the build).
    run_child("close", path=str(path), n=n, rounds=1, seed=0, split=False)
    # Each writer session that writes starts a journal segment; readers list
    # them all at open (gc() compacts them into one).
    r["segments"] = len(list((path / "journal").glob("*.log")))
    r["warmed"] = warm(path)
    # 1, 2: open + len + get, reader / writer role (sled) / core, alternating
    opens: dict[str, list[dict]] = {"reader": [], "writer": [], "core": []}
    for rep in range(args.repeat + 1):
        for kind in opens:
            got = run_child("open", path=str(path), kind=kind, key=key_of(rng.randrange(n)))
            assert got["len"] == n
            if rep:  # the first round warms up
                opens[kind].append(got)
    r["open"] = {
        kind: {
            "seconds": med([g["seconds"] for g in runs]),
            "all": [g["seconds"] for g in runs],
            "role": med([g["role"] for g in runs]) if kind == "writer" else None,
            "close": med([g["close"] for g in runs]) if kind == "writer" else None,
            "anon_delta": med([g["after"]["Anonymous"] - g["before"]["Anonymous"] for g in runs]),
            "anon_after": med([g["after"]["Anonymous"] for g in runs]),
            "dirty_delta": med(
                [g["after"]["Private_Dirty"] - g["before"]["Private_Dirty"] for g in runs]
            ),
            "rss_delta": med([g["after"]["Rss"] - g["before"]["Rss"] for g in runs]),
        }
        for kind, runs in opens.items()
    }
    print(f"  open: {fmt_open(r['open'])}", flush=True)
    # 3, 4: first query vs later, reader vs writer
    queries: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.query_repeat):
        for first in ("count", "find"):
            for role in ("reader", "writer"):
                got = run_child(
                    "query",
                    path=str(path),
                    role=role,
                    first=first,
                    n=n,
                    later=args.query_later,
                    seed=rng.randrange(2**32),
                )
                queries.setdefault((role, first), []).append(got)
    r["query"] = {}
    for role in ("reader", "writer"):
        for op in ("count", "find"):
            runs = queries[(role, op)]
            later = [
                t for key in ("count", "find") for g in queries[(role, key)] for t in g["later"][op]
            ]
            r["query"][f"{role} {op}"] = {
                "first": med([g["first_s"] for g in runs]),
                "later": med(later),
                "answer": runs[-1]["answers"][op],
            }
    for k, v in r["query"].items():
        print(f"  {k}: first {ms(v['first'])}, later {ms(v['later'])} ({v['answer']:,})")
    # 5: close after one change; flush/close split; write amplification
    fsync_before = fsync_latency(path.parent)
    got = run_child("close", path=str(path), n=n, rounds=args.close_rounds, seed=1, split=False)
    r["close"] = {"median": med(got["rounds"]), "max": max(got["rounds"]), "all": got["rounds"]}
    got = run_child(
        "close", path=str(path), n=n, rounds=max(args.close_rounds // 2, 3), seed=2, split=True
    )
    r["close"]["flush"] = med([f for f, _ in got["rounds"]])
    r["close"]["after_flush"] = med([c for _, c in got["rounds"]])
    r["close"]["fsync"] = med([fsync_before, fsync_latency(path.parent)])
    print(
        f"  close: {ms(r['close']['median'])} (flush {ms(r['close']['flush'])}, "
        f"then close {ms(r['close']['after_flush'])}; one fsync {ms(r['close']['fsync'])})",
        flush=True,
    )
    got = run_child("wa", path=str(path), n=n, rounds=args.wa_rounds, seed=3)
    got["wa"] = got["run_bytes"] / got["record_bytes"]
    closes = got.pop("closes")
    got["close_median"], got["close_max"] = med(closes), max(closes)
    r["wa"] = got
    print(
        f"  write amplification {got['wa']:.1f} ({got['run_bytes']:,} run bytes / "
        f"{got['record_bytes']:,} record bytes, {got['runs_created']} runs created, "
        f"missed {len(got['missed'])}); runs {len(got['runs_before'])} -> "
        f"{len(got['runs_after'])}; close() median {ms(got['close_median'])}, "
        f"max {ms(got['close_max'])}",
        flush=True,
    )
    return r


# -- report ---------------------------------------------------------------


def ms(s: float) -> str:
    if s >= 10:
        return f"{s:,.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 0.01:
        return f"{s * 1e3:.0f} ms"
    return f"{s * 1e3:.1f} ms"


def mib(b: float) -> str:
    if abs(b) < MIB:
        return f"{b / 1024:.0f} KiB"
    return f"{b / MIB:.1f} MiB"


def fmt_open(o: dict) -> str:
    return ", ".join(
        f"{k} {ms(v['seconds'])} (anon +{mib(v['anon_delta'])} = {mib(v['anon_after'])})"
        for k, v in o.items()
    )


def yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def targets(res: dict[int, dict], builds: dict[int, dict | None]) -> list[list[str]]:
    """Rows: target, measured, limit, met?, old (sled), new / old."""
    small, big = min(res), max(res)
    b, s = res[big], res[small]
    rows = []
    ro, wo = b["open"]["reader"], b["open"]["writer"]
    old = f"{ms(wo['seconds'])} (writer role: sled)"
    if builds.get(big):
        old += f"; {ms(builds[big]['open_after_build'])} right after the bulk load"
    rows.append(
        [
            f'1. mode "r" open + len + get, {big:,} records',
            ms(ro["seconds"]),
            ms(LIMIT_OPEN),
            yes(ro["seconds"] <= LIMIT_OPEN),
            old,
            f"{ro['seconds'] / wo['seconds']:.4f}",
        ]
    )
    flat = ro["seconds"] / s["open"]["reader"]["seconds"]
    ws = wo["seconds"] / s["open"]["writer"]["seconds"]
    sizes = " / ".join(ms(res[n]["open"]["reader"]["seconds"]) for n in sorted(res))
    rows.append(
        [
            f"1. flat in size: {big:,} / {small:,} records",
            f"{flat:.2f}x ({sizes})",
            f"<= {LIMIT_FLAT}x (our reading of 'flat')",
            yes(flat <= LIMIT_FLAT),
            f"{ws:.1f}x",
            "",
        ]
    )
    rows.append(
        [
            f"2. reader anonymous memory after 1., {big:,} records: increase (absolute)",
            f"+{mib(ro['anon_delta'])} ({mib(ro['anon_after'])})",
            mib(LIMIT_ANON),
            yes(ro["anon_delta"] <= LIMIT_ANON),
            f"+{mib(wo['anon_delta'])} ({mib(wo['anon_after'])})",
            f"{ro['anon_delta'] / max(wo['anon_delta'], 1):.3f}",
        ]
    )
    q = b["query"]
    for op in ("count", "find"):
        rq, wq = q[f"reader {op}"], q[f"writer {op}"]
        ratio = rq["first"] / rq["later"]
        rows.append(
            [
                f"3. reader first `{op}` / later, {big:,} records",
                f"{ratio:.2f} ({ms(rq['first'])} / {ms(rq['later'])})",
                f"<= {LIMIT_FIRST}",
                yes(ratio <= LIMIT_FIRST),
                f"{wq['first'] / wq['later']:.2f} ({ms(wq['first'])} / {ms(wq['later'])})",
                "",
            ]
        )
    for op in ("count", "find"):
        rq, wq = q[f"reader {op}"], q[f"writer {op}"]
        ratio = rq["later"] / wq["later"]
        first = rq["first"] / wq["first"]
        rows.append(
            [
                f"4. `{op}` reader / writer, {big:,} records (later; first)",
                f"{ratio:.2f}; {first:.2f} ({ms(rq['later'])} vs {ms(wq['later'])}; "
                f"{ms(rq['first'])} vs {ms(wq['first'])})",
                "<= 1",
                yes(ratio <= 1 and first <= 1),
                "(the writer is the old path)",
                "",
            ]
        )
    c = b["close"]
    rows.append(
        [
            f"5. close() after changing 1 record, {big:,} records",
            f"{ms(c['median'])}, max {ms(c['max'])} (split: flush {ms(c['flush'])} + close "
            f"{ms(c['after_flush'])}; "
            f"a writer closing with nothing to write: {ms(wo['close'])}; one 4 KiB write + "
            f"fsync on this disk meanwhile: {ms(c['fsync'])})",
            ms(LIMIT_CLOSE),
            yes(c["median"] <= LIMIT_CLOSE),
            "",
            "",
        ]
    )
    w = b["wa"]
    rows.append(
        [
            f"5. run bytes / changed record bytes, {w['rounds']} rounds of 1-10 updates"
            f" + close, {big:,} records",
            f"{w['wa']:.1f} ({w['run_bytes'] / MIB:.1f} MiB in {w['runs_created']} runs / "
            f"{w['record_bytes'] / 1024:.0f} KiB; {w['method']}, {len(w['missed'])} missed; "
            f"besides, {w['ckpts']} `.ckpt` files of {w['ckpt_bytes'] / 1024:.0f} KiB; "
            f"close() in these rounds: median {ms(w['close_median'])}, max "
            f"{ms(w['close_max'])})",
            "(report)",
            "",
            "",
            "",
        ]
    )
    return rows


def per_size(res: dict[int, dict]) -> list[list[str]]:
    rows = []
    for n in sorted(res):
        r = res[n]
        o, q, c, w = r["open"], r["query"], r["close"], r["wa"]
        rows.append(
            [
                f"{n:,}",
                f"{ms(o['reader']['seconds'])} ({r['segments']:,} segments)",
                ms(o["core"]["seconds"]),
                f"{ms(o['writer']['seconds'])} (role {ms(o['writer']['role'])}, "
                f"close {ms(o['writer']['close'])})",
                f"+{mib(o['reader']['anon_delta'])} / {mib(o['reader']['anon_after'])}",
                f"+{mib(o['writer']['anon_delta'])} / {mib(o['writer']['anon_after'])}",
                *(
                    f"{ms(q[k]['first'])} / {ms(q[k]['later'])}"
                    for k in ("reader count", "writer count", "reader find", "writer find")
                ),
                f"{ms(c['median'])} (fsync {ms(c['fsync'])})",
                f"{w['wa']:.1f}",
                f"{len(w['runs_after'])}, {sum(w['runs_after']) / MIB:.0f} MiB",
            ]
        )
    return rows


PER_SIZE_HEAD = [
    "records",
    'open+len+get "r" (journal segments)',
    "same, Rust core alone",
    "writer role (sled) open+len+get; its close",
    "anon. reader: increase / after",
    "anon. writer: increase / after",
    "count reader: first / later",
    "count writer: first / later",
    "find reader: first / later",
    "find writer: first / later",
    "close() after 1 change (one fsync)",
    "write ampl.",
    "runs after (count, size)",
]
TARGET_HEAD = ["target", "measured", "limit", "met?", "old (sled writer)", "new / old"]


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*row) for row in [head, *rows])


def machine(data: Path) -> str:
    return f"{host.describe_machine(data)} ({data})"


def source_version() -> str:
    """lazyvault's version, where it was imported from, and the commit of
    the working tree this script is in (read only)."""
    here = HERE.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        status = ["status", "--porcelain", "--untracked-files=no", "--", ".", ":!benches"]
        dirty = subprocess.run(
            ["git", "-C", str(here), *status],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changed = " (with uncommitted changes outside benches/)" if dirty else ""
        commit = f"the working tree was at commit {head}{changed} when the run started"
    except (OSError, subprocess.CalledProcessError):
        commit = "commit unknown"
    core = Path(lv._lazyvault.__file__)
    installed = datetime.fromtimestamp(core.stat().st_ctime, UTC)
    return (
        f"lazyvault {lv.__version__} ({commit}; imported from {core.parent}, "
        f"installed there {installed:%Y-%m-%d %H:%M} UTC)"
    )


def rerun_command() -> str:
    path = os.environ.get("PYTHONPATH")
    env = f"PYTHONPATH={shlex.quote(path)} " if path else ""
    return f"{env}.venv/bin/python benches/readers.py {shlex.join(sys.argv[1:])}".rstrip()


def section(res, builds, notes, started, load, args) -> str:
    big = max(res)
    w = res[big]["wa"]
    lines = [
        TITLE,
        "",
        f"`benches/readers.py`, run {datetime.fromtimestamp(started, UTC):%Y-%m-%d %H:%M} UTC, "
        f"{time.time() - started:.0f} s"
        + (
            f" (building the stores of {', '.join(f'{n:,}' for n in sorted(built_now))} records"
            " included)."
            if built_now
            else " (stores built by an earlier run)."
        ),
        f"Machine: {machine(args.data)}.",
        f"Load average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.",
        f"Versions: Python {platform.python_version()}, numpy {np.__version__}, {args.source}.",
        "",
        "Rerun (stores are built once under `--data` and reused; `--rebuild` builds them",
        "again, `--quick` measures 10k and 100k records only):",
        "",
        f"    {rerun_command()}",
        "",
        "Every figure comes from fresh processes (children of the script; interpreter",
        "start and imports not timed) with a warm page cache (the store's checkpoint",
        "runs, journal and sled index are read first). Records: five metadata fields",
        "(one nested) and an 8-element float32 array (a payload file of its own).",
        "",
        f"- Open + len + get: medians of {args.repeat} processes each, reader (mode"
        ' "r"), writer and',
        "  Rust core alone (`StoreCore`, `len`, `get_full`) alternating. The writer is",
        '  the old, sled-based path: mode "a" + `begin_write()` (opens sled, takes the',
        "  lock, writes nothing). One writer session with one change runs first, so",
        "  that its index position lies in a small journal segment, as for every",
        "  session but the first after a bulk load (that one is measured at the build).",
        "- Memory: `Anonymous` of `/proc/self/smaps_rollup`; the target's figure is",
        "  the increase across open + len + get, the absolute value is beside it.",
        f"- Queries (`{QUERY}`): the first in a process, and the median of",
        f"  {args.query_later} later calls of each, in {args.query_repeat} processes per"
        " (role, query first).",
        '  The writer is a mode "a" handle after writing one record and `flush()`.',
        f'- close(): median of {args.close_rounds} rounds of open "a", overwrite one'
        " random record,",
        f"  close(); the flush / close split from {max(args.close_rounds // 2, 3)} more rounds.",
        "- Write amplification: bytes of checkpoint runs created (every new `.run`,",
        f"  merges included, seen with {w['method']}) per byte of changed record JSON, over",
        f'  {args.wa_rounds} rounds of open "a", overwrite 1-10 random records, close().',
        "",
        "Stores:",
        "",
    ]
    for n in sorted(res):
        b = builds.get(n)
        files = res[n]["files"]
        if b:
            where = (
                f"built {b['date']} in {b['total']:.0f} s (close {b['close']:.1f} s); the "
                f"writer role right after the bulk load took {ms(b['role_after_build'])}"
            )
        else:
            where = "built by an earlier run (no build record)"
        lines.append(
            f"- {n:,} records: {where}; checkpoints {files['checkpoints'] / MIB:.0f} MiB"
            f" ({len(res[n]['runs'])} runs), journal {files['journal'] / MIB:.0f} MiB in "
            f"{res[n]['segments']:,} segments (one per writer session since the last gc()), "
            f"sled index {files['index'] / MIB:.0f} MiB."
        )
    lines += [*(f"- {note}" for note in notes), ""]
    lines += [
        f"### Targets at {big:,} records",
        "",
        markdown_table(TARGET_HEAD, targets(res, builds)),
        "",
        "### By store size",
        "",
        markdown_table(PER_SIZE_HEAD, per_size(res)),
        "",
    ]
    return "\n".join(lines)


def write_results(path: Path, text: str) -> None:
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + block + rest.split(END, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="record counts"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="10k and 100k records only, printed only (unless --results is given)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=Path("/tmp/lv-readers-bench"),
        help="where the stores are built and kept (default /tmp/lv-readers-bench)",
    )
    p.add_argument("--repeat", type=int, default=9, help="processes per open + len + get median")
    p.add_argument("--query-repeat", type=int, default=3, help="processes per query case")
    p.add_argument("--query-later", type=int, default=3, help="later calls of each query")
    p.add_argument("--close-rounds", type=int, default=20, help="rounds of change + close()")
    p.add_argument("--wa-rounds", type=int, default=200, help="rounds for write amplification")
    p.add_argument("--rebuild", action="store_true", help="build the stores again")
    p.add_argument("--no-results", action="store_true", help="print only")
    p.add_argument(
        "--results", type=Path, help="markdown file to update (default benches/RESULTS.md)"
    )
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.quick:
        args.sizes = [10_000, 100_000]
        args.no_results = args.no_results or args.results is None
    args.results = args.results or RESULTS
    args.sizes = sorted(set(args.sizes))
    if any(n < 100 for n in args.sizes):
        p.error("--sizes: at least 100 records")
    started, load = time.time(), os.getloadavg()
    args.data.mkdir(parents=True, exist_ok=True)
    notes = []
    sizes = []
    for n in args.sizes:
        path = args.data / f"store-{n}"
        if store_len(path) != n:
            free = shutil.disk_usage(args.data).free
            need = n * BYTES_PER_RECORD + 2 * 2**30
            if need > free:
                room = max(free - 2 * 2**30, 0) // BYTES_PER_RECORD
                fit = 10 ** (len(str(room)) - 1) if room else 0
                note = (
                    f"{n:,} records need about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB "
                    f"free in {args.data}: measured {fit:,} records instead"
                )
                print(note)
                notes.append(note)
                n = fit
        if n >= 100 and n not in sizes:
            sizes.append(n)
    print(f"machine: {machine(args.data)}; load {load[0]:.1f}")
    args.source = source_version()  # before the run: the wheel is built from it
    print(args.source)
    builds = {n: ensure_store(args.data, n, args.rebuild) for n in sizes}
    res = {}
    for n in sizes:
        print(f"{n:,} records", flush=True)
        res[n] = measure(args.data / f"store-{n}", n, args)
    print()
    print(text_table(TARGET_HEAD, targets(res, builds)))
    print()
    print(text_table(PER_SIZE_HEAD, per_size(res)))
    if not args.no_results:
        write_results(args.results, section(res, builds, notes, started, load, args))
        print(f"\nwritten to {args.results}")


if __name__ == "__main__":
    main()
