"""Readers beside one writer, with real processes: snapshots that never tear
while a writer puts, overwrites, deletes, flushes and collects garbage; a
writer killed with SIGKILL and another taking over; readers on a read-only
mount and without write permission; the writer role taken at the first
write; pickled stores in spawn workers; a reader whose payload was removed.

This file is also the script its child processes run: ``python
test_readers.py ROLE ARGS`` (see ``main`` at the end).
"""

from __future__ import annotations

import errno
import gc
import hashlib
import json
import multiprocessing
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv

from conftest import payload_location

HERE = Path(__file__).resolve()

# -- the content of records: everything follows from "seq" -------------------------


def array_for(seq: int) -> np.ndarray:
    """Array "a" of the record numbered ``seq``: its length and values follow
    from seq alone (8 bytes, read into memory, up to 96 KiB, memory-mapped)."""
    n = 1 + (seq * 7919) % 12_000
    return np.arange(n, dtype=np.int64) * 3 + seq


def value_for(seq: int, gen: int = 0) -> dict[str, Any]:
    a = array_for(seq)
    return {"seq": seq, "sum": int(a.sum()), "gen": gen, "a": a, "b": np.full(3, seq, np.int32)}


def check_record(rec: lv.Record) -> int:
    """The record's seq after checking that its metadata and both arrays
    belong to that seq (a torn record fails)."""
    seq = rec.seq
    a, b = rec.a, rec.b
    want = array_for(seq)
    if a.shape != want.shape or not np.array_equal(a, want):
        raise AssertionError(f"{rec.key!r}: array a is not that of seq {seq}")
    if int(a.sum()) != rec.sum:
        raise AssertionError(f"{rec.key!r}: metadata sum {rec.sum} != array sum {int(a.sum())}")
    if b.tolist() != [seq] * 3:
        raise AssertionError(f"{rec.key!r}: array b {b.tolist()} is not that of seq {seq}")
    return seq


def snapshot_state(store: lv.Store) -> tuple[int, dict[str, int]]:
    """(version, {key: seq}) of the store's snapshot after checking every
    record (metadata against arrays, every payload loads) and that the
    snapshot did not move meanwhile."""
    version = store.version
    keys = list(store)
    state = {key: check_record(store[key]) for key in keys}
    if len(store) != len(keys) or store.count("seq >= 0") != len(keys):
        raise AssertionError(f"len/count disagree with the {len(keys)} keys")
    if sorted(store.keys("seq >= 0")) != keys:
        raise AssertionError("find disagrees with the keys")
    if store.version != version:
        raise AssertionError(f"the snapshot moved by itself: {version} -> {store.version}")
    return version, state


def state_digest(state: dict[str, int]) -> str:
    return hashlib.sha256(json.dumps(sorted(state.items())).encode()).hexdigest()


def array_digest(array: np.ndarray) -> str:
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def listing(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and directory under ``root``: (size, mtime_ns, sha256 of
    the content, "" for a directory)."""
    out = {}
    for path in sorted([root, *root.rglob("*")]):
        st = path.lstat()
        content = "" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns, content)
    return out


def describe(e: BaseException) -> dict[str, Any]:
    return {
        "type": type(e).__name__,
        "types": [c.__name__ for c in type(e).__mro__],
        "msg": str(e),
        "pid": getattr(e, "pid", None),
        "errno": getattr(e, "errno", None),
    }


# -- the child processes' side ------------------------------------------------------
#
# Each child answers every command line on stdin with one JSON line on its
# stdout (anything else it prints goes to stderr), so the test orders steps
# by waiting for answers: no sleep is a synchronisation.

_OUT = sys.stdout


def reply(obj: Any) -> None:
    _OUT.write(json.dumps(obj, default=str) + "\n")
    _OUT.flush()


def stdin_ready(timeout: float | None) -> bool:
    return bool(select.select([sys.stdin], [], [], timeout)[0])


def reader_main(path: str) -> None:
    """Loops refresh() and a full check of the snapshot; answers "status",
    "hold" (stop looping, check the snapshot as it is), "check" (the same,
    again), "refresh", "loop", "stop" (every version seen, with the digest
    of its state, and every failure)."""
    store = lv.Store.open(path, "r")
    seen: dict[int, str] = {}
    failures: list[str] = []
    last = store.version
    iterations = 0
    looping = False

    def check(refresh: bool) -> dict[str, Any]:
        nonlocal last
        if refresh:
            version = store.refresh()
            if version != store.version:
                failures.append(f"refresh() returned {version}, version is {store.version}")
        version, state = snapshot_state(store)
        if version < last:
            failures.append(f"the version went down: {last} -> {version}")
        last = version
        digest = state_digest(state)
        if seen.setdefault(version, digest) != digest:
            failures.append(f"version {version} showed two different states")
        return {"version": version, "digest": digest, "records": len(state)}

    reply({"version": store.version})
    while True:
        if looping and not stdin_ready(0):
            try:
                check(refresh=True)
            except Exception:
                failures.append(traceback.format_exc())
            iterations += 1
            continue
        command = sys.stdin.readline().strip()
        if not command:
            return  # the test is gone
        try:
            if command == "status":
                reply({"iterations": iterations, "versions": len(seen), "last": last})
            elif command == "hold":
                looping = False
                reply(check(refresh=False))
            elif command == "check":
                reply(check(refresh=False))
            elif command == "refresh":
                reply(check(refresh=True))
            elif command == "loop":
                looping = True
                reply({"looping": True})
            elif command == "stop":
                store.close()
                reply({"seen": seen, "failures": failures[:20], "iterations": iterations})
                return
            else:
                reply({"error": f"unknown command {command!r}"})
        except Exception:
            reply({"error": traceback.format_exc()})


MIN_ROUNDS = 40  # the writer stops only after this many flushes (and 5 gc())
GC_EVERY = 8


class _Writer:
    """Random puts (new keys and overwrites) and deletes, a flush after each
    round, a gc() every GC_EVERY rounds; every commit goes to the commit log
    as {"version", "state", "tag"} once it is made."""

    def __init__(self, path: str, log: str, seed: int, first_seq: int) -> None:
        self.rng = random.Random(seed)
        self.store = lv.Store.open(path, retention=0)
        assert self.store.retention == 0
        self.log = open(log, "a")  # lives as long as the process
        self.seq = first_seq
        self.state: dict[str, int] = {}

    def write_log(self, entry: dict[str, Any]) -> None:
        self.log.write(json.dumps(entry) + "\n")
        self.log.flush()

    def commit(self, tag: str) -> None:
        self.write_log({"version": self.store.version, "state": self.state, "tag": tag})

    def next_key(self) -> str:
        if self.rng.random() < 0.5 or len(self.state) < 8:
            return f"k{self.seq:07d}"
        return self.rng.choice(sorted(self.state))

    def put(self, key: str, gen: int) -> None:
        self.store[key] = value_for(self.seq, gen)
        self.state[key] = self.seq
        self.seq += 1

    def round(self, gen: int) -> None:
        for _ in range(self.rng.randint(1, 6)):
            if self.rng.random() < 0.2 and len(self.state) >= 8:
                key = self.rng.choice(sorted(self.state))
                del self.store[key]
                del self.state[key]
            else:
                self.put(self.next_key(), gen)
        self.store.flush()
        self.commit("flush")
        if gen % GC_EVERY == 0:
            self.store.gc()
            self.commit("gc")


def writer_main(path: str, log: str, seed: str, first_seq: str) -> None:
    """Writes rounds from "go" until "stop" (and at least MIN_ROUNDS), then
    puts records without ever flushing again, the intent of each logged
    before it, answering after 20 of them: the test kills it there."""
    w = _Writer(path, log, int(seed), int(first_seq))
    w.state = {key: w.store[key].seq for key in w.store}
    reply({"ready": w.store.version})
    assert sys.stdin.readline().strip() == "go"
    rounds = 0
    while rounds < MIN_ROUNDS or not stdin_ready(0):
        rounds += 1
        w.round(rounds)
    assert sys.stdin.readline().strip() == "stop"
    version = w.store.version
    n = 0
    while True:  # until SIGKILL
        key = w.next_key()
        w.write_log({"intent": [key, w.seq]})
        w.put(key, -1)
        n += 1
        if n == 20:
            reply({"version": version, "rounds": rounds})


def takeover_main(path: str, log: str, seed: str, first_seq: str) -> None:
    """The next writer: its first write takes the role (after a crash, with
    the recovery commit); logs the state it found, writes and closes."""
    w = _Writer(path, log, int(seed), int(first_seq))
    w.put("takeover", 0)
    assert w.store.is_writer
    with lv.Store.open(path, "r") as probe:
        version, found = snapshot_state(probe)
    w.write_log({"version": version, "state": found, "tag": "recovery"})
    w.state = {**found, "takeover": w.state["takeover"]}
    for gen in range(1, 13):
        w.round(gen)
    w.store.close()
    with lv.Store.open(path, "r") as probe:
        version, state = snapshot_state(probe)
    if state != w.state:
        raise AssertionError("the closed store is not what the writer wrote")
    # close() may commit nothing more: then the same version again
    w.write_log({"version": version, "state": state, "tag": "close"})
    reply({"final": version})


def client_main() -> None:
    """Runs the Python code of each command (a JSON string) in one
    namespace; answers {"value": the value of an expression, or None} or
    {"error": describe(exception)}."""
    namespace: dict[str, Any] = {"lv": lv, "np": np, "os": os, "time": time}
    namespace.update(value_for=value_for, check_record=check_record, state_digest=state_digest)
    namespace.update(snapshot_state=snapshot_state, array_digest=array_digest)
    for line in sys.stdin:
        code = json.loads(line)
        try:
            try:
                compiled = compile(code, "<command>", "eval")
            except SyntaxError:
                exec(compile(code, "<command>", "exec"), namespace)
                value = None
            else:
                value = eval(compiled, namespace)
            reply({"value": value})
        except Exception as e:
            reply({"error": describe(e), "traceback": traceback.format_exc()})


def read_everything_main(path: str) -> None:
    """Opens the store in mode "r", then in the default mode, and reads
    everything: every record and array, find, count, len, verify, refresh;
    in the default mode tries a write. Prints one JSON document."""
    out: dict[str, Any] = {}
    for mode in ("r", None):
        store = lv.Store.open(path) if mode is None else lv.Store.open(path, mode)
        got: dict[str, Any] = {"mode": store.mode, "version": store.version, "len": len(store)}
        got["records"] = {
            key: {
                "meta": store[key].meta,
                "arrays": {n: array_digest(store[key].array(n)) for n in store[key].arrays},
            }
            for key in store
        }
        got["find"] = store.find("seq >= 5").keys()
        got["count"] = store.count("seq >= 5")
        got["verify"] = store.verify()
        got["refresh"] = store.refresh()
        got["is_writer"] = store.is_writer
        if mode is None:
            try:
                store["new"] = value_for(999)
                got["write"] = None
            except Exception as e:
                got["write"] = describe(e)
            got["after_write"] = {"keys": sorted(store), "is_writer": store.is_writer}
        store.close()
        out[mode or "default"] = got
    reply(out)


def main(role: str, *args: str) -> None:
    sys.stdout = sys.stderr  # stdout carries the answers only
    roles: dict[str, Callable[..., None]] = {
        "reader": reader_main,
        "writer": writer_main,
        "takeover": takeover_main,
        "client": client_main,
        "read-everything": read_everything_main,
    }
    roles[role](*args)


# -- the test's side ----------------------------------------------------------------


class Child:
    """A child process running ``main(role, *args)`` of this file."""

    def __init__(
        self, tmp_path: Path, name: str, role: str, *args: Any, prefix: tuple[str, ...] = ()
    ) -> None:
        self.name = name
        self.err_path = tmp_path / f"{name}.stderr"
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, str(HERE), role, *map(str, args)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.err_path.read_text()[-3000:]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 30) -> Any:
        """The child's next answer, or a test failure (never a hang)."""
        assert self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            self.kill()
            pytest.fail(f"{self.name} answered nothing for {timeout} s:\n{self.stderr()}")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            pytest.fail(f"{self.name} exited ({self.proc.returncode}):\n{self.stderr()}")
        got = json.loads(line)
        if isinstance(got, dict) and isinstance(got.get("error"), str):
            pytest.fail(f"{self.name} failed:\n{got['error']}")
        return got

    def ask(self, line: str, timeout: float = 30) -> Any:
        self.send(line)
        return self.answer(timeout)

    def run(self, code: str, timeout: float = 30) -> Any:
        """A client's value of ``code``; a test failure if it raised."""
        got = self.ask(json.dumps(code), timeout)
        if "error" in got:
            pytest.fail(f"{self.name}: {code!r} raised:\n{got['traceback']}")
        return got["value"]

    def error(self, code: str, timeout: float = 30) -> dict[str, Any]:
        """What ``code`` raised in a client; a test failure if it did not."""
        got = self.ask(json.dumps(code), timeout)
        if "error" not in got:
            pytest.fail(f"{self.name}: {code!r} did not raise (gave {got['value']!r})")
        return got["error"]

    def finish(self, timeout: float = 30) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """Starts children; kills those still running at the end of the test."""
    children: list[Child] = []

    def start(name: str, role: str, *args: Any, prefix: tuple[str, ...] = ()) -> Child:
        child = Child(tmp_path, name, role, *args, prefix=prefix)
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()
        if child.proc.stdin is not None:
            child.proc.stdin.close()
        if child.proc.stdout is not None:
            child.proc.stdout.close()


def fill(path: Path, n: int = 12) -> dict[str, int]:
    """A closed store (so with a checkpoint) of n records; returns {key: seq}."""
    state = {f"k{i:07d}": i for i in range(n)}
    with lv.Store.open(path) as store:
        store.update({key: value_for(seq) for key, seq in state.items()})
    return state


def expected_reads(state: dict[str, int]) -> dict[str, Any]:
    """What read_everything_main reports of the records of ``state``."""
    out = {}
    for key, seq in state.items():
        value = value_for(seq)
        out[key] = {
            "meta": {k: value[k] for k in ("seq", "sum", "gen")},
            "arrays": {n: array_digest(value[n]) for n in ("a", "b")},
        }
    return out


# -- 1. a writer, readers, SIGKILL, a new writer ------------------------------------


def test_readers_see_only_commits_while_a_writer_writes_is_killed_and_replaced(
    tmp_path: Path, spawn: Callable[..., Child]
) -> None:
    path, log = tmp_path / "s.lv", tmp_path / "commits.jsonl"
    initial = fill(path, n=30)
    with lv.Store.open(path, "r") as probe:
        v0, state0 = snapshot_state(probe)
    assert state0 == initial
    log.write_text(json.dumps({"version": v0, "state": state0, "tag": "fill"}) + "\n")

    writer = spawn("writer", "writer", path, log, 1234, 1000)
    assert writer.answer() == {"ready": v0}
    readers = [spawn(f"reader{i}", "reader", path) for i in range(3)]
    for reader in readers:
        assert reader.answer() == {"version": v0}
        assert reader.ask("loop") == {"looping": True}
    writer.send("go")
    # phase 1: until every reader has checked several versions (bounded poll)
    deadline = time.monotonic() + 30
    while True:
        statuses = [reader.ask("status") for reader in readers]
        if all(s["versions"] >= 10 for s in statuses):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"readers saw too few versions in 30 s: {statuses}")
        time.sleep(0.1)
    stopped = writer.ask("stop", timeout=60)  # after 20 unflushed puts
    v_last = stopped["version"]
    assert stopped["rounds"] >= MIN_ROUNDS

    # SIGKILL in the loop of puts; readers keep their snapshot
    held = [reader.ask("hold") for reader in readers]
    writer.proc.send_signal(signal.SIGKILL)
    assert writer.proc.wait(timeout=30) == -signal.SIGKILL
    for reader, snapshot in zip(readers, held, strict=True):
        assert reader.ask("check") == snapshot  # same version and records, every payload loads
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    commits = [e for e in entries if "version" in e]
    intents = [e["intent"] for e in entries if "intent" in e]
    assert len(intents) >= 20
    state_at = {e["version"]: e["state"] for e in commits}
    assert commits[-1]["version"] == v_last
    # refresh() after the kill: the last commit, not one unflushed put
    for reader in readers:
        got = reader.ask("refresh")
        assert got["version"] == v_last
        assert got["digest"] == state_digest(state_at[v_last])
        assert reader.ask("loop") == {"looping": True}

    # a new writer process takes over, writes, closes; the readers see it
    takeover = spawn("takeover", "takeover", path, log, 5678, 1_000_000)
    final = takeover.answer(timeout=60)["final"]
    assert takeover.finish() == 0
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    commits = [e for e in entries if "version" in e]
    state_at = {e["version"]: e["state"] for e in commits}
    for reader in readers:
        got = reader.ask("refresh")
        assert got["version"] == final and got["digest"] == state_digest(state_at[final])
    results = [reader.ask("stop", timeout=60) for reader in readers]
    for reader in readers:
        assert reader.proc.wait(timeout=30) == 0, reader.stderr()

    # the log: every commit once, in order (close() may repeat the last one)
    versions = [e["version"] for e in commits]
    assert versions[-1] == final
    if versions[-1] == versions[-2]:
        assert commits[-1]["state"] == commits[-2]["state"]
        versions.pop()
    recovery = next(i for i, e in enumerate(commits) if e["tag"] == "recovery")
    if versions[recovery] == v_last:  # nothing to recover: the same commit again
        assert commits[recovery]["state"] == state_at[v_last]
        del versions[recovery]
    assert versions == sorted(set(versions)), versions
    # the recovery commit shows the last commit plus a prefix of the puts
    # the killed writer never flushed (those its index already held)
    found = commits[recovery]["state"]
    prefixes = [dict(state_at[v_last])]
    for key, seq in intents:
        prefixes.append({**prefixes[-1], key: seq})
    assert found in prefixes
    assert (commits[recovery]["version"] == v_last) == (found == state_at[v_last])

    # what the readers saw: only committed states, several of them, no failure
    for i, result in enumerate(results):
        assert result["failures"] == [], f"reader {i}:\n" + "\n".join(result["failures"])
        seen = {int(v): d for v, d in result["seen"].items()}
        assert len(seen) >= 10 and result["iterations"] >= 10
        for version, digest in seen.items():
            assert version in state_at, f"reader {i} saw version {version}, never committed"
            assert digest == state_digest(state_at[version]), f"reader {i}, version {version}"
    with lv.Store.open(path, "r") as store:
        assert snapshot_state(store) == (final, state_at[final])
        assert store.verify()["ok"]


# -- 2. a read-only mount ------------------------------------------------------------

# sh -c _BIND_RO sh SRC DST COMMAND...: mounts SRC read-only on DST, runs COMMAND
_BIND_RO = (
    'src=$1 dst=$2; shift 2; mount --bind "$src" "$dst" '
    '&& mount -o remount,bind,ro "$dst" && exec "$@"'
)
_TOUCH_FAILS = ("sh", "-c", '! touch "$0"/x')
_READ_EVERYTHING = (sys.executable, str(HERE), "read-everything")
_unshare_ok: list[bool] = []


def unshare_works(tmp_path: Path) -> bool:
    """Whether ``unshare -m`` and a read-only bind mount are permitted here
    (checked once)."""
    if not _unshare_ok:
        src, dst = tmp_path / "probe-src", tmp_path / "probe-dst"
        src.mkdir()
        dst.mkdir()
        try:
            proc = subprocess.run(
                ["unshare", "-m", "sh", "-c", _BIND_RO, "sh", src, dst, *_TOUCH_FAILS, dst],
                capture_output=True,
                timeout=30,
            )
            _unshare_ok.append(proc.returncode == 0 and not (src / "x").exists())
        except (OSError, subprocess.SubprocessError):
            _unshare_ok.append(False)
        shutil.rmtree(src)
        dst.rmdir()
    return _unshare_ok[0]


def crashed_store(path: Path) -> dict[str, int]:
    """A store whose writer flushed and was then killed before closing (only
    the empty checkpoint of its creation: readers replay the journal), with unflushed puts after the
    flush; returns the committed {key: seq}."""
    code = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(HERE.parent)!r})\n"
        "import lazyvault as lv\n"
        "from test_readers import value_for\n"
        "s = lv.Store.open(sys.argv[1])\n"
        "s.update({f'k{i:07d}': value_for(i) for i in range(8)})\n"
        "s.flush()\n"
        "s['k0000003'] = value_for(100)\n"
        "s['unflushed'] = value_for(101)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, path], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # only the empty checkpoint its creation wrote: readers replay the journal
    ckpts = sorted(p.name for p in (path / "checkpoints").glob("*.ckpt"))
    assert ckpts == ["0000000000000000.ckpt"], ckpts
    return {f"k{i:07d}": i for i in range(8)}


def check_read_everything(got: dict[str, Any], state: dict[str, int]) -> None:
    want = expected_reads(state)
    at_5 = sorted(k for k, seq in state.items() if seq >= 5)
    for mode in ("r", "default"):
        g = got[mode]
        assert g["mode"] == ("r" if mode == "r" else "a")
        assert g["len"] == len(state) and g["records"] == want
        assert g["find"] == at_5 and g["count"] == len(at_5)
        assert g["verify"]["ok"] and g["verify"]["records"] == len(state)
        assert g["verify"]["problems"] == []
        assert g["refresh"] == g["version"] and g["is_writer"] is False
    assert got["r"]["version"] == got["default"]["version"]


@pytest.mark.parametrize("kind", ["closed", "crashed"])
def test_readers_on_a_read_only_bind_mount(tmp_path: Path, kind: str) -> None:
    if not shutil.which("unshare") or not unshare_works(tmp_path):
        pytest.skip("`unshare -m` with a read-only bind mount is not permitted here")
    src, dst = tmp_path / "s.lv", tmp_path / "ro"
    dst.mkdir()
    state = fill(path=src, n=12) if kind == "closed" else crashed_store(src)
    before = listing(src)
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", _BIND_RO, "sh", src, dst, *_READ_EVERYTHING, dst],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    check_read_everything(got, state)
    # the write in the default mode: refused by the file system, nothing lost
    write = got["default"]["write"]
    assert write is not None and "StorageError" in write["types"], write
    assert write["errno"] == errno.EROFS, write
    assert got["default"]["after_write"] == {"keys": sorted(state), "is_writer": False}
    assert listing(src) == before
    assert not any(dst.iterdir())  # the mount lived in the child's namespace only


# -- 3. no write permission -----------------------------------------------------------

_DROP_DAC = (
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
)


def without_write_permission(tmp_path: Path) -> tuple[str, ...] | None:
    """A command prefix under which permission bits bind this process's
    children (root's CAP_DAC_OVERRIDE dropped), or None if there is none."""
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            return None
        prefix = _DROP_DAC
    probe = tmp_path / "probe"
    probe.mkdir()
    probe.chmod(0o555)
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, "-c", "import sys; open(sys.argv[1] + '/x', 'w')", probe],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return prefix if proc.returncode != 0 and "PermissionError" in proc.stderr else None
    finally:
        probe.chmod(0o755)
        shutil.rmtree(probe)


def set_writable(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        path.chmod(mode | 0o200 if writable else mode & ~0o222)


@pytest.mark.parametrize("kind", ["closed", "crashed"])
def test_readers_without_write_permission(tmp_path: Path, kind: str) -> None:
    prefix = without_write_permission(tmp_path)
    if prefix is None:
        pytest.skip(
            "cannot make permission bits bind a child here (root, and setpriv cannot "
            "drop CAP_DAC_OVERRIDE)"
        )
    path = tmp_path / "s.lv"
    if kind == "crashed":
        state = crashed_store(path)
    else:
        state = fill(path)
        with lv.Store.open(path) as store:  # superseded payloads, a second checkpoint
            store["k0000004"] = value_for(40)
            store.flush()
            del store["k0000002"]
        state["k0000004"] = 40
        del state["k0000002"]
    set_writable(path, False)
    try:
        before = listing(path)
        proc = subprocess.run(
            [*prefix, sys.executable, HERE, "read-everything", path],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        check_read_everything(got, state)
        write = got["default"]["write"]
        assert write is not None, "a write succeeded without write permission"
        assert "StorageError" in write["types"] and "OSError" in write["types"], write
        assert write["errno"] in (errno.EACCES, errno.EROFS, errno.EPERM), write
        assert got["default"]["after_write"] == {"keys": sorted(state), "is_writer": False}
        assert listing(path) == before
    finally:
        set_writable(path, True)
    with lv.Store.open(path, "r") as store:  # nothing lost
        assert snapshot_state(store)[1] == state and store.verify()["ok"]


# -- 4. two default-mode processes: the first write wins ------------------------------


def test_two_processes_read_the_first_write_wins_the_other_writes_after_it_closes(
    tmp_path: Path, spawn: Callable[..., Child]
) -> None:
    path = tmp_path / "s.lv"
    state = fill(path, n=6)
    first, second = spawn("first", "client"), spawn("second", "client")
    for c in (first, second):
        c.run(f"s = lv.Store.open({str(path)!r})")
        assert c.run("snapshot_state(s)[1]") == state  # both read
        assert c.run("s.is_writer") is False
    first.run("s['from-first'] = value_for(100)")
    assert first.run("s.is_writer") is True
    t0 = time.monotonic()
    refused = second.error("s['from-second'] = value_for(200)")
    assert time.monotonic() - t0 < 10  # at once, not after the first closes
    assert refused["type"] == "StoreLockedError" and "LazyvaultError" in refused["types"]
    assert refused["pid"] == first.pid and str(first.pid) in refused["msg"]
    assert second.run("s.is_writer") is False
    assert second.run("sorted(s)") == sorted(state)  # still a reader of its snapshot
    # the first flushes: the second sees it after refresh(), and still may not write
    first.run("s.flush()")
    version = first.run("s.version")
    assert second.run("s.refresh()") == version
    assert second.run("check_record(s['from-first'])") == 100
    assert second.error("del s['k0000001']")["pid"] == first.pid
    first.run("s.close()")
    # the first closed (its process still runs): the second's write succeeds
    second.run("s['from-second'] = value_for(200)")
    assert second.run("s.is_writer") is True
    second.run("del s['k0000001']")
    second.run("s.close()")
    # nobody writes now: the first may write again, with a new handle
    first.run(f"s = lv.Store.open({str(path)!r})")
    first.run("s['again'] = value_for(300)")
    first.run("s.close()")
    assert first.finish() == 0 and second.finish() == 0
    with lv.Store.open(path, "r") as store:
        got = snapshot_state(store)[1]
    want = {**state, "from-first": 100, "from-second": 200, "again": 300}
    del want["k0000001"]
    assert got == want


# -- 5. one process: handles share the role; records keep no lock ------------------------

_WRITE_AND_CLOSE = """
import sys, numpy as np, lazyvault as lv
s = lv.Store.open(sys.argv[1])
s["from-child"] = {"seq": -1, "a": np.arange(3)}
s.close()
print("wrote")
"""


def test_reopening_in_one_process_shares_the_writer_and_records_keep_no_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.lv"
    fill(path, n=3)
    store = lv.Store.open(path)
    store["cell-1"] = value_for(10)
    assert store.is_writer
    earlier = store  # e.g. still referenced by a notebook's output history
    store = lv.Store.open(path)  # the cell runs again
    assert not store.is_writer and "cell-1" not in store  # a reader of the last commit
    store["cell-2"] = value_for(20)  # no StoreLockedError: the process's writer
    assert store.is_writer and earlier.is_writer
    assert {"cell-1", "cell-2"} <= set(store) and earlier["cell-2"].seq == 20
    rec = store["cell-1"]
    loaded = rec.a  # loaded while the store lives
    unloaded = store["cell-2"]
    # while a handle lives, another process may read but not write
    proc = subprocess.run(
        [sys.executable, "-c", _WRITE_AND_CLOSE, path], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "StoreLockedError" in proc.stderr
    assert str(os.getpid()) in proc.stderr
    del store, earlier
    gc.collect()
    assert rec.store is None and unloaded.store is None  # records hold their store weakly
    proc = subprocess.run(
        [sys.executable, "-c", _WRITE_AND_CLOSE, path], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr  # no lock left, though records are alive
    assert proc.stdout.strip() == "wrote"
    np.testing.assert_array_equal(loaded, array_for(10))
    assert rec.seq == 10
    with lv.Store.open(path, "r") as again:
        assert {"cell-1", "cell-2", "from-child"} <= set(again) and len(again) == 6
        assert check_record(again["cell-2"]) == 20


# -- 6. a pickled Store in a spawn Pool worker --------------------------------------


def read_pickled_store(store: lv.Store, flag: str) -> dict[str, Any]:
    """Runs in a spawn worker: waits for ``flag`` (the sender commits more
    meanwhile), then reads ``store`` at its version, refreshes, reads again."""
    deadline = time.monotonic() + 30
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            raise TimeoutError("the flag never came")
        time.sleep(0.01)
    version, state = snapshot_state(store)  # opens here, at its first use
    out: dict[str, Any] = {"mode": store.mode, "version": version, "state": state}
    out["refreshed"] = store.refresh()
    out["state_after"] = snapshot_state(store)[1]
    store.close()
    return out


def test_a_pickled_store_reads_at_the_senders_version_in_a_spawn_worker(
    tmp_path: Path, spawn: Callable[..., Child]
) -> None:
    path = tmp_path / "s.lv"
    state = fill(path, n=6)
    reader = lv.Store.open(path, "r")
    try:
        sent_version = reader.version
        writer = spawn("writer", "client")
        writer.run(f"s = lv.Store.open({str(path)!r}, retention=0)")
        writer.run("s['k0000001'] = value_for(101); s['new'] = value_for(102); s.flush()")
        assert reader.version == sent_version  # the sender shows its snapshot
        flag = tmp_path / "go"
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            pending = pool.apply_async(read_pickled_store, (reader, str(flag)))
            # more commits after the store was pickled, before its first use
            writer.run("del s['k0000002']; s['k0000003'] = value_for(103); s.flush()")
            writer.run("s.gc()")
            latest = writer.run("s.version")
            flag.touch()
            got = pending.get(timeout=60)
        writer.run("s.close()")
        assert writer.finish() == 0
    finally:
        reader.close()
    assert got["mode"] == "r"
    assert got["version"] == sent_version and got["state"] == state  # old payloads too
    assert got["refreshed"] == latest > sent_version
    want = {**state, "k0000001": 101, "new": 102, "k0000003": 103}
    del want["k0000002"]
    assert got["state_after"] == want


# -- 7. a payload removed under a reader ------------------------------------------------


def test_a_removed_payload_raises_corrupt_error_saying_to_refresh(
    tmp_path: Path, spawn: Callable[..., Child]
) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store["k"] = {"small": np.arange(10), "big": np.arange(100_000)}  # copied / mapped
        store["other"] = value_for(1)
        entries = store["k"]._record["arrays"].values()
        old_files = [payload_location(path, e)[0] for e in entries]  # a pack, a file
    assert all(f.exists() for f in old_files)
    reader = spawn("reader", "client")
    reader.run(f"s = lv.Store.open({str(path)!r}, 'r'); old = s['k']")  # not loaded
    writer = lv.Store.open(path, retention=0)
    try:
        writer["k"] = {"small": np.arange(10) + 1, "big": np.arange(100_000) + 1}
        writer.flush()
        reader.run("s.refresh()")
        writer.gc()  # a new checkpoint: the reader still pins the older one
        assert all(f.exists() for f in old_files)
        assert reader.run("s.refresh()") == writer.version
        writer.gc()  # nothing pins the old payloads any more
        assert not any(f.exists() for f in old_files)
    finally:
        writer.close()
    for name in ("small", "big"):
        err = reader.error(f"old.{name}")
        assert err["type"] == "CorruptError", err
        assert "refresh()" in err["msg"] and "'k'" in err["msg"], err["msg"]
    # the record taken again reads the new arrays; the process did not crash
    assert reader.run("s['k'].small.tolist()") == list(range(1, 11))
    assert reader.run("int(s['k'].big.sum())") == sum(range(1, 100_001))
    assert reader.run("check_record(s['other'])") == 1
    assert reader.finish() == 0


if __name__ == "__main__":
    main(*sys.argv[1:])
