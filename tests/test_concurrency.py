"""Concurrency (FORMAT.md, "Lock file" and "Reading beside a writer"): one
writer process at a time, readers beside it; another process's first write
is refused at once with the writer's PID, handles in one process share the writer role, hand-offs
between writers are clean, sled is never used across fork(), and many processes map
the same payloads (store payloads passed by reference, one .lvz archive)
while a writer keeps writing."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv

from conftest import payload_location

# A bound against hangs, not a timing: a refused opener must fail at once,
# never wait for the holder.
AT_ONCE = 5.0
METHODS = [m for m in ("spawn", "fork") if m in multiprocessing.get_all_start_methods()]


def read_line(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """The next line the child prints, or a test failure (never a hang)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        pytest.fail(f"child printed nothing for {timeout} s")
    line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"child exited ({proc.returncode}) early: {err}")
    return line.strip()


def stop(proc: subprocess.Popen[str]) -> None:
    """Kills the child if it still runs, closes its pipes (an unclosed pipe
    is a ResourceWarning, an error in this suite) and waits for it."""
    if proc.poll() is None:
        proc.kill()
    with proc:  # Popen.__exit__ closes the pipes, then waits
        pass


def python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def digest(array: np.ndarray) -> str:
    """dtype, shape, memory order and the data bytes, as one hash."""
    order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}{order}".encode())
    h.update(array.tobytes(order="A"))
    return h.hexdigest()


# -- one writer at a time, readers beside it -------------------------------------

_OPEN_HELD = """
import json, sys, time, lazyvault as lv
out = {}
for mode in ("a", "r"):
    s = lv.Store.open(sys.argv[1], mode)
    got = {"keys": list(s), "a": s["k"].a.tolist(), "version": s.version}
    t0 = time.monotonic()
    try:
        s["mine"] = {"v": 3}
        got["wrote"] = True
    except lv.StoreLockedError as e:
        got.update(pid=e.pid, msg=str(e), root=isinstance(e, lv.LazyvaultError))
    except lv.ReadOnlyError as e:
        got["read_only"] = str(e)
    got["secs"] = time.monotonic() - t0
    got["is_writer"] = s.is_writer
    got["keys_after"] = list(s)
    s.close()
    out[mode] = got
print(json.dumps(out))
"""


def test_second_process_reads_beside_the_writer_and_is_refused_at_its_first_write(
    store: lv.Store, store_path: Path
) -> None:
    store["k"] = {"v": 1, "a": np.arange(4)}
    store.flush()
    store["unflushed"] = {"v": 2}
    proc = python(_OPEN_HELD, str(store_path))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    got = json.loads(out)
    for mode in ("a", "r"):
        # it opened (no lock needed) and shows the last commit only
        assert got[mode]["keys"] == ["k"] and got[mode]["a"] == [0, 1, 2, 3]
        assert got[mode]["version"] == store.version
        assert "wrote" not in got[mode], f"mode {mode!r} wrote beside the writer"
        assert got[mode]["secs"] < AT_ONCE
        assert got[mode]["is_writer"] is False and got[mode]["keys_after"] == ["k"]
    # mode "a": refused at the first write, naming this process
    assert got["a"]["pid"] == os.getpid()
    assert str(os.getpid()) in got["a"]["msg"] and got["a"]["root"]
    assert "read-only" in got["r"]["read_only"]
    # the holder is untouched
    store["k2"] = {"v": 2}
    store.flush()
    assert sorted(store) == ["k", "k2", "unflushed"] and store["k"].a.tolist() == [0, 1, 2, 3]
    assert "mine" not in store


_HOLDER = """
import sys, numpy as np, lazyvault as lv
s = lv.Store.open(sys.argv[1])
s["held"] = {"v": 1, "a": np.arange(6)}
s.flush()
print("ready", flush=True)
sys.stdin.readline()
s.close()
print("closed", flush=True)
sys.stdin.readline()
"""


def test_holder_in_another_process_is_named_and_hands_over_on_close(tmp_path: Path) -> None:
    path = tmp_path / "held.lv"
    proc = python(_HOLDER, str(path))
    assert proc.stdin is not None
    try:
        assert read_line(proc) == "ready"
        second = lv.Store.open(path)  # a reader until its first write
        reader = lv.Store.open(path, "r")
        assert second["held"].a.tolist() == list(range(6)) and not second.is_writer
        assert reader["held"].a.tolist() == list(range(6))
        t0 = time.monotonic()
        with pytest.raises(lv.StoreLockedError) as info:
            second["mine"] = {"v": 2}
        assert time.monotonic() - t0 < AT_ONCE
        assert info.value.pid == proc.pid
        assert str(proc.pid) in str(info.value)
        assert isinstance(info.value, lv.LazyvaultError)
        assert not second.is_writer and "mine" not in second
        with pytest.raises(lv.ReadOnlyError):
            reader["mine"] = {"v": 2}
        proc.stdin.write("close\n")
        proc.stdin.flush()
        assert read_line(proc) == "closed"
        # the holder process still runs, but it closed: the same handle writes now
        second["mine"] = {"v": 2}
        assert second.is_writer
        second.flush()
        assert reader.refresh() == second.version
        assert sorted(reader) == ["held", "mine"] and reader["mine"].v == 2
        second.close()
        reader.close()
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
    finally:
        stop(proc)
    with lv.Store.open(path, "r") as s:
        assert sorted(s) == ["held", "mine"] and s.verify()["ok"]


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    path = tmp_path / "killed.lv"
    proc = python(_HOLDER, str(path))
    try:
        assert read_line(proc) == "ready"
        s = lv.Store.open(path)
        with pytest.raises(lv.StoreLockedError) as info:
            s["mine"] = {"v": 2}
        assert info.value.pid == proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        stop(proc)
    try:
        t0 = time.monotonic()
        s["mine"] = {"v": 2}  # the lock died with its holder: no wait
        assert time.monotonic() - t0 < AT_ONCE
        assert s.is_writer
        assert s["held"].v == 1 and s["held"].a.tolist() == list(range(6))  # it was flushed
        assert sorted(s) == ["held", "mine"]
        assert s.verify()["ok"]
    finally:
        s.close()
    with lv.Store.open(path, "r") as again:
        assert sorted(again) == ["held", "mine"] and again["mine"].v == 2


def test_second_opener_in_a_thread_shares_the_writer_role(
    store: lv.Store, store_path: Path
) -> None:
    store["k"] = {"v": 1}
    store.flush()
    store["unflushed"] = {"v": 0}
    got: dict[str, Any] = {}

    def open_again() -> None:
        t0 = time.monotonic()
        try:
            with lv.Store.open(store_path) as again:
                # a reader until its first write: the last commit
                got["before"] = (sorted(again), again.is_writer)
                again["from_thread"] = {"v": 2}
                # then the writer's latest state, the other handle's changes included
                got["after"] = (sorted(again), again.is_writer)
        except BaseException as e:
            got["error"] = e
        got["secs"] = time.monotonic() - t0

    thread = threading.Thread(target=open_again)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert "error" not in got, got["error"]
    assert got["before"] == (["k"], False)
    assert got["after"] == (["from_thread", "k", "unflushed"], True)
    assert got["secs"] < AT_ONCE
    # one index: the thread's write is in this handle, which still writes
    assert store["from_thread"].v == 2 and store.is_writer
    store["k"] = {"v": 3}
    store.flush()
    assert sorted(store) == ["from_thread", "k", "unflushed"] and store["k"].v == 3


def test_open_close_reopen_200_times(store_path: Path) -> None:
    for i in range(200):
        with lv.Store.open(store_path) as s:
            s[f"k{i}"] = {"i": i, "a": np.full(8, i, dtype=np.int32)}
            rec = s[f"k{i}"]
            assert rec.i == i and rec.a.tolist() == [i] * 8
            if i:
                assert s[f"k{i - 1}"].i == i - 1
            assert len(s) == i + 1
    with lv.Store.open(store_path, "r") as s:
        assert [s[f"k{i}"].a[0] for i in range(200)] == list(range(200))
        assert s.verify()["ok"]


_ALTERNATE = """
import sys, numpy as np, lazyvault as lv
for line in sys.stdin:
    i = int(line)
    try:
        with lv.Store.open(sys.argv[1]) as s:
            rec = s[f"p{i}"]
            assert rec.i == i and rec.a.tolist() == [i] * 4, (rec.i, rec.a)
            s[f"c{i}"] = {"i": i, "a": np.full(4, -i)}
            n = len(s)
        print(f"ok {i} {n}", flush=True)
    except BaseException as e:
        print(f"error {i} {type(e).__name__}: {e}", flush=True)
        break
"""


def test_two_processes_alternate_200_hand_offs(store_path: Path) -> None:
    """100 rounds, each two hand-offs (this process -> child -> this
    process); each side opens as soon as the other says it closed."""
    proc = python(_ALTERNATE, str(store_path))
    assert proc.stdin is not None
    try:
        for i in range(100):
            with lv.Store.open(store_path) as s:
                if i:
                    rec = s[f"c{i - 1}"]
                    assert rec.i == i - 1 and rec.a.tolist() == [1 - i] * 4
                s[f"p{i}"] = {"i": i, "a": np.full(4, i)}
                assert len(s) == 2 * i + 1
            proc.stdin.write(f"{i}\n")
            proc.stdin.flush()
            assert read_line(proc) == f"ok {i} {2 * i + 2}"
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        stop(proc)
    with lv.Store.open(store_path) as s:
        assert len(s) == 200
        assert s.verify() == {
            "ok": True,
            "records": 200,
            "arrays": 200,
            "checksummed": 200,
            "checksum_mismatches": 0,
            "problems": [],
            "orphans": [],
        }


def test_threads_share_one_store(store: lv.Store) -> None:
    """Writers are serialised inside the store, readers run alongside: four
    writer threads and two reader threads on one Store lose nothing and
    never see a torn record."""
    errors: list[str] = []
    every_key = {f"w{w}/{i:02d}" for w in range(4) for i in range(25)}

    def writer(w: int) -> None:
        try:
            for i in range(25):
                store[f"w{w}/{i:02d}"] = {"w": w, "i": i, "a": np.full(500, w * 100 + i)}
                if i % 5 == 4:
                    del store[f"w{w}/{i - 1:02d}"]
                    store.flush()
        except BaseException:
            errors.append(traceback.format_exc())

    def reader() -> None:
        try:
            for _ in range(60):
                for key in list(store)[-4:]:
                    rec = store.get(key)
                    if rec is None:
                        continue  # deleted meanwhile
                    try:
                        a = rec.a
                    except lv.CorruptError:
                        # deleted and flushed between get and mapping: the
                        # payload of a record not yet mapped goes (documented)
                        assert key not in store
                        continue
                    assert a.shape == (500,) and (a == rec.w * 100 + rec.i).all(), key
                # queries run alongside the writers, and see only real keys
                assert set(store.keys("w >= 0")) <= every_key
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    want = sorted(f"w{w}/{i:02d}" for w in range(4) for i in range(25) if i % 5 != 3)
    assert list(store) == want and len(store) == len(want)
    for key in want:
        rec = store[key]
        assert rec.a[0] == rec.w * 100 + rec.i
    report = store.verify()
    assert report["ok"] and report["orphans"] == []


def test_verify_while_another_thread_writes_reports_no_false_problems(store: lv.Store) -> None:
    for i in range(50):
        store[f"k{i:02d}"] = {"a": np.full(100, i)}
    store.flush()
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            store[f"k{i % 50:02d}"] = {"a": np.full(100, i)}  # overwrite...
            store.flush()  # ...and unlink the old payload
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    problems: list[str] = []
    try:
        deadline = time.monotonic() + 10
        while not problems and time.monotonic() < deadline:
            problems = store.verify()["problems"]
    finally:
        stop.set()
        thread.join(timeout=60)
    assert problems == []
    assert store.verify()["ok"]  # the store was healthy all along


# -- fork ---------------------------------------------------------------------------


def in_forked_child(body: Callable[[], Any], timeout: float = 60) -> Any:
    """Runs ``body`` in an ``os.fork()``-ed child; returns what it returned
    (as JSON) or fails the test with the child's traceback."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        code = 0
        try:
            out = json.dumps({"ok": body()})
        except BaseException:
            out, code = json.dumps({"error": traceback.format_exc()}), 1
        try:
            with os.fdopen(write_end, "w") as f:
                f.write(out)
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + timeout
    with os.fdopen(read_end) as f:
        while True:
            ready, _, _ = select.select([f], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"forked child hung for {timeout} s")
            chunk = f.read()
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    result = json.loads("".join(chunks))
    assert "error" not in result, result["error"]
    assert os.waitstatus_to_exitcode(status) == 0
    return result["ok"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_every_store_operation_in_a_forked_child_raises_forked_store_error(
    store_path: Path, tmp_path: Path
) -> None:
    store = lv.Store.open(store_path, allow_pickle=True)
    try:
        store["mapped"] = {"v": 1, "a": np.arange(1000, dtype=np.float32)}
        store["lazy"] = {"v": 2, "a": np.asfortranarray(np.arange(12).reshape(3, 4))}
        store["pickled"] = {"tags": {"x", "y"}, "a": np.ones(3, dtype=">i8")}
        store.flush()
        mapped, lazy, pickled = store["mapped"], store["lazy"], store["pickled"]
        assert mapped.a[-1] == 999  # mapped before the fork; "lazy" is not
        results = store.find("v >= 1")
        ref = lazy.ref()
        parent = os.getpid()

        ops: dict[str, Callable[[], object]] = {
            "len": lambda: len(store),
            "getitem": lambda: store["mapped"],
            "setitem": lambda: store.__setitem__("new", {"v": 3}),
            "delitem": lambda: store.__delitem__("mapped"),
            "contains": lambda: "mapped" in store,
            "keys": lambda: list(store),
            "find": lambda: store.find("v == 1"),
            "count": lambda: store.count("v == 1"),
            "flush": store.flush,
            "verify": store.verify,
            "gc": store.gc,
            "export": lambda: store.export(tmp_path / "child.lvz"),
            "results": lambda: [r.key for r in results],
            "close": store.close,
        }

        def child() -> dict[str, Any]:
            raised = {}
            for name, op in ops.items():
                try:
                    op()
                    raised[name] = "no error"
                except lv.ForkedStoreError as e:
                    raised[name] = str(e)
                except BaseException as e:
                    raised[name] = f"{type(e).__name__}: {e}"
            return {
                "pid": os.getpid(),
                "raised": raised,
                "mapped": mapped.a.tolist() == list(range(1000)),
                "lazy": lazy.a.tolist() == np.arange(12).reshape(3, 4).tolist()
                and lazy.a.flags.f_contiguous,
                "pickled": sorted(pickled.load()["tags"]) + pickled.a.tolist(),
                "ref": ref.open().a.sum().item(),
                "result_keys": results.keys(),
                "meta": [mapped.v, lazy.meta, pickled.arrays["a"].dtype.str],
            }

        got = in_forked_child(child)
        child_pid = got["pid"]
        for name, message in got["raised"].items():
            assert "fork" in message, (name, message)
            assert str(parent) in message and str(child_pid) in message, (name, message)
        assert got["mapped"] and got["lazy"]
        assert got["pickled"] == ["x", "y", 1, 1, 1]
        assert got["ref"] == 66
        assert got["result_keys"] == ["lazy", "mapped"]
        assert got["meta"] == [1, {"v": 2}, ">i8"]
        # the parent's store is untouched by everything the child tried
        assert sorted(store) == ["lazy", "mapped", "pickled"]
        store["after"] = {"v": 4}
        store.flush()
        assert store.verify()["ok"] and not (tmp_path / "child.lvz").exists()
    finally:
        store.close()
    with lv.Store.open(store_path) as s:  # the child is gone: reopening works
        assert len(s) == 4


def _fork_target(store: lv.Store, rec: lv.Record, out: Any) -> None:
    try:
        store["x"] = {"v": 1}
        error = "no error"
    except lv.ForkedStoreError as e:
        error = str(e)
    out.put((error, rec.a.sum().item(), rec))


@pytest.mark.skipif("fork" not in METHODS, reason="needs the fork start method")
def test_multiprocessing_fork_child_gets_forked_store_error(store: lv.Store) -> None:
    store["k"] = {"a": np.arange(10)}
    rec = store["k"]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_fork_target, args=(store, rec, out))
    child.start()
    try:
        error, total, back = out.get(timeout=60)
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0
    assert "fork" in error and str(child.pid) in error
    assert total == 45
    assert back.a.tolist() == list(range(10))  # and back, by reference
    assert "x" not in store and len(store) == 1


# -- many readers, one writer -----------------------------------------------------

N_READERS = 8


def make_value(key: str, version: int) -> dict[str, Any]:
    """The deterministic content of ``key`` at ``version``: metadata and
    three arrays of different dtypes, orders and byte orders."""
    seed = int.from_bytes(hashlib.sha256(f"{key}/{version}".encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    return {
        "key": key,
        "version": version,
        "x": rng.random((96, 128)),  # 96 KiB float64: memory-mapped
        # 14 KiB and 3.6 KiB: at most 64 KiB, so read into memory
        "counts": np.asfortranarray(rng.integers(-1000, 1000, (50, 70)).astype(">i4")),
        "pixels": rng.integers(0, 255, (30, 40, 3), dtype=np.uint8),
    }


ARRAY_NAMES = ("x", "counts", "pixels")


def expected_digests(key: str, version: int) -> dict[str, str]:
    value = make_value(key, version)
    return {name: digest(value[name]) for name in ARRAY_NAMES}


def _mapping_file(array: np.ndarray) -> str | None:
    address = array.__array_interface__["data"][0]
    best = None
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                best = fields[5]
    return best


def store_reader(index: int, inbox: Any, outbox: Any, arrays_dir: str) -> None:
    """Receives records (by reference: lv.Record or lv.RecordRef), maps and
    hashes their arrays, keeps the arrays; on "recheck" hashes them all again."""
    held: list[tuple[str, int, dict[str, np.ndarray]]] = []
    try:
        while True:
            message = inbox.get(timeout=120)
            if message is None:
                break
            if message == "recheck":
                outbox.put(
                    (
                        "recheck",
                        index,
                        [
                            (k, v, {n: digest(a) for n, a in arrays.items()})
                            for k, v, arrays in held
                        ],
                    )
                )
                continue
            for item in message:
                rec = item.open() if isinstance(item, lv.RecordRef) else item
                arrays = {name: rec.array(name) for name in ARRAY_NAMES}
                held.append((rec.key, rec.version, arrays))
                files = {n: _mapping_file(a) or "" for n, a in arrays.items()}
                outbox.put(
                    (
                        "mapped",
                        index,
                        rec.key,
                        rec.version,
                        {n: digest(a) for n, a in arrays.items()},
                        type(rec._source).__name__,
                        # the large array maps the store's payload file, the
                        # small ones are copies (no mapping of any payload)
                        files["x"].startswith(arrays_dir)
                        and not any(files[n].startswith(arrays_dir) for n in ("counts", "pixels")),
                        any(a.flags.writeable for a in arrays.values()),
                    )
                )
    except BaseException:
        outbox.put(("error", index, traceback.format_exc()))


class Readers:
    """N reader processes, each with its own inbox, one shared outbox."""

    def __init__(self, method: str, target: Callable[..., None], *args: Any) -> None:
        ctx = multiprocessing.get_context(method)
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(N_READERS)]
        self.procs = [
            ctx.Process(target=target, args=(i, self.inboxes[i], self.outbox, *args))
            for i in range(N_READERS)
        ]
        for p in self.procs:
            p.start()

    def send(self, message: Any) -> None:
        for box in self.inboxes:
            box.put(message)

    def get(self, timeout: float = 120) -> tuple[Any, ...]:
        try:
            message = self.outbox.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no reader answered for {timeout} s")
        if message[0] == "error":
            pytest.fail(f"reader {message[1]} failed:\n{message[2]}")
        return message

    def stop(self) -> None:
        self.send(None)
        for p in self.procs:
            p.join(timeout=60)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join()
        assert [p.exitcode for p in self.procs] == [0] * N_READERS


@pytest.mark.parametrize("method", METHODS)
def test_readers_map_payloads_while_the_writer_writes_and_overwrites(
    store_path: Path, method: str
) -> None:
    """Records travel by reference to 8 readers that map and hash them while
    this process keeps adding records, overwriting (and flushing away the
    payloads of) records the readers hold, and deleting others. Every hash a
    reader computes, at once and again at the end, is byte-exact."""
    store = lv.Store.open(store_path)
    readers = None
    try:
        arrays_dir = str((store_path / "arrays").resolve())
        readers = Readers(method, store_reader, arrays_dir)
        sent: list[tuple[str, int]] = []  # every (key, version) sent
        acked: dict[tuple[str, int], int] = {}
        mapped: list[tuple[Any, ...]] = []

        def collect(until: Callable[[], bool]) -> None:
            while not until():
                message = readers.get()
                assert message[0] == "mapped"
                mapped.append(message)
                acked[message[2], message[3]] = acked.get((message[2], message[3]), 0) + 1

        def send_batch(keys: list[str], version: int) -> None:
            # half as lv.Record (by reference through the queue's
            # ForkingPickler), half as explicit lv.RecordRef
            batch = [store[k] if i % 2 == 0 else store[k].ref() for i, k in enumerate(keys)]
            readers.send(batch)
            sent.extend((k, version) for k in keys)

        rounds = 6
        batches: list[list[str]] = []
        old_payloads: list[Path] = []
        for r in range(rounds):
            keys = [f"round{r}/{j}" for j in range(4)]
            for k in keys:
                store[k] = make_value(k, 0)
            store.flush()
            send_batch(keys, 0)
            batches.append(keys)
            if r >= 2:
                # the readers hold mappings of round r-2: wait until all did,
                # then overwrite half of it and delete one, and flush (which
                # unlinks those payloads) while the readers map round r
                older = batches[r - 2]
                collect(lambda older=older: all(acked.get((k, 0)) == N_READERS for k in older))
                for k in older[:2]:
                    old_payloads += [
                        payload_location(store_path, e)[0]
                        for e in store[k]._record["arrays"].values()
                    ]
                    store[k] = make_value(k, 1)
                for e in store[older[3]]._record["arrays"].values():
                    old_payloads.append(payload_location(store_path, e)[0])
                del store[older[3]]
                store.flush()
                send_batch(older[:2], 1)
        collect(lambda: len(mapped) == N_READERS * len(sent))
        gc_report = store.gc()
        assert (gc_report["removed_files"], gc_report["removed_bytes"]) == (0, 0)
        assert old_payloads and not any(p.exists() for p in old_payloads)

        for _, _, key, version, digests, source, from_store, writeable in mapped:
            assert digests == expected_digests(key, version), (key, version)
            assert source == "DirectorySource"  # by reference, not by value
            assert from_store  # x mapped from the store's payload file: no copy
            assert not writeable
        assert sorted(acked.items()) == sorted((kv, N_READERS) for kv in set(sent))

        # the unlinked payloads are still intact in every reader's mappings
        readers.send("recheck")
        for _ in range(N_READERS):
            kind, _, held = readers.get()
            assert kind == "recheck"
            assert sorted((k, v) for k, v, _ in held) == sorted(sent)
            for key, version, digests in held:
                assert digests == expected_digests(key, version), (key, version)
        readers.stop()
        readers = None
        report = store.verify()
        assert report["ok"] and report["orphans"] == []
        assert len(store) == rounds * 4 - (rounds - 2)
    finally:
        if readers is not None:
            for p in readers.procs:
                p.kill()
                p.join()
        store.close()


def _smaps_of(path: str) -> tuple[int, int] | None:
    """(Rss, Pss) in KiB of this process's mappings of ``path`` ((0, 0) when
    it maps none), or None when /proc/self/smaps is missing or has no Pss."""
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    if "Pss:" not in text:
        return None
    rss = pss = 0
    in_file = False
    for line in text.splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            in_file = len(fields) >= 6 and " ".join(fields[5:]) == path
        elif in_file and fields and fields[0] == "Rss:":
            rss += int(fields[1])
        elif in_file and fields and fields[0] == "Pss:":
            pss += int(fields[1])
    return rss, pss


def archive_reader(index: int, inbox: Any, outbox: Any, path: str, barrier: Any) -> None:
    del inbox
    try:
        archive = lv.Store.open(path)
        kind = type(archive).__name__
        digests = {
            key: {name: digest(archive[key].array(name)) for name in ARRAY_NAMES} for key in archive
        }  # hashing read every page of every array
        barrier.wait(timeout=120)  # all readers have the archive mapped and read
        smaps = _smaps_of(path)
        barrier.wait(timeout=120)  # nobody unmaps before all have measured
        archive.close()
        outbox.put(("done", index, kind, digests, smaps))
    except BaseException:
        outbox.put(("error", index, traceback.format_exc()))


def test_readers_open_one_archive_while_the_writer_exports_another(
    store_path: Path, tmp_path: Path
) -> None:
    # each reader opens the archive by path itself, so the start method does
    # not matter here: the cheapest one (the other test covers spawn)
    method = METHODS[-1]
    shared = tmp_path / "shared.lvz"
    with lv.Store.open(store_path) as store:
        keys = [f"a{i}" for i in range(6)]
        for k in keys:
            store[k] = make_value(k, 0)
        store.export(shared)
        ctx = multiprocessing.get_context(method)
        barrier = ctx.Barrier(N_READERS)
        readers = Readers(method, archive_reader, str(shared.resolve()), barrier)
        try:
            # the writer keeps writing and exporting other archives meanwhile
            exported: list[tuple[Path, list[str]]] = []
            done: list[tuple[Any, ...]] = []
            n = 0
            while len(done) < N_READERS:
                if n < 10:
                    k = f"b{n}"
                    store[k] = make_value(k, 0)
                    path = tmp_path / f"other{n}.lvz"
                    store.export(path, keys=[f"b{i}" for i in range(n + 1)])
                    exported.append((path, [f"b{i}" for i in range(n + 1)]))
                    n += 1
                    try:
                        done.append(readers.outbox.get_nowait())
                    except queue.Empty:
                        pass
                else:
                    done.append(readers.get())
                if done and done[-1][0] == "error":
                    pytest.fail(f"reader {done[-1][1]} failed:\n{done[-1][2]}")
            readers.stop()
        finally:
            for p in readers.procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        want = {k: expected_digests(k, 0) for k in keys}
        smaps = []
        for _, _, kind, digests, measured in done:
            assert kind == "Archive"
            assert digests == want
            smaps.append(measured)
        for path, ks in exported:
            with lv.Store.open(path) as other:
                assert list(other) == ks and other.verify()["ok"]
                for k in ks:
                    assert {n: digest(other[k].array(n)) for n in ARRAY_NAMES} == (
                        expected_digests(k, 0)
                    )
    # Page sharing, where the kernel reports it (/proc/self/smaps with Pss)
    archive_kib = shared.stat().st_size // 1024
    for measured in smaps:
        if measured is None:
            continue
        rss, pss = measured
        # each reader read the arrays through its mapping of the archive...
        assert rss >= archive_kib * 0.8
        # ...and shares those pages with the others (8 mappers: Pss ~ Rss/8)
        assert pss < rss


_ARCHIVE_HOLDER = """
import sys, lazyvault as lv
archive = lv.Store.open(sys.argv[1])
a = archive["k"].array("x")
print(len(archive), float(a.sum()), flush=True)
sys.stdin.readline()  # the writer replaces the archive meanwhile
print(len(archive), float(a.sum()), float(archive["k"].array("x").sum()), flush=True)
with lv.Store.open(sys.argv[1]) as again:
    print(len(again), float(again["k"].array("x").sum()), flush=True)
"""


def test_exporting_over_an_archive_a_reader_has_mapped(store: lv.Store, tmp_path: Path) -> None:
    """Archives are replaced by rename: a reader keeps what it mapped, a new
    opener sees the new archive."""
    path = tmp_path / "x.lvz"
    store["k"] = {"x": np.full(2**16, 1.0)}
    store.export(path)
    proc = python(_ARCHIVE_HOLDER, str(path))
    assert proc.stdin is not None
    try:
        assert read_line(proc) == f"1 {2.0**16}"
        store["k"] = {"x": np.full(2**16, 2.0)}
        store["k2"] = {"x": np.zeros(3)}
        store.export(path)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert read_line(proc) == f"1 {2.0**16} {2.0**16}"
        assert read_line(proc) == f"2 {2.0**17}"
        assert proc.wait(timeout=60) == 0
    finally:
        stop(proc)
