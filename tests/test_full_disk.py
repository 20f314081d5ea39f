"""A real full disk: a 4 MiB tmpfs mounted for the test (root only; skipped
otherwise). A write that does not fit raises lv.StorageError (an OSError,
errno ENOSPC, naming the file); what was flushed before stays intact; the
store works again once space is freed.

A write that would leave less than 1 MiB free is refused before anything
is written (sled 0.34 does not recover from a failed write in the same
session): the index never fills up, and flush, put, delete and close work
again as soon as space is freed. Scenarios that fill the disk run in a
child process all the same, so that a regression cannot hang pytest."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv

DISK_SIZE = "4m"


def mount_tmpfs(where: Path, size: str = DISK_SIZE) -> None:
    """Mounts a tmpfs of ``size`` at ``where``, or skips the test saying why."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("a real full disk needs root (to mount a small tmpfs)")
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def unmount(where: Path) -> None:
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        # a file still open (a store stuck by a bug): detach it anyway
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """An empty 4 MiB file system."""
    where = tmp_path / "disk"
    mount_tmpfs(where)
    try:
        yield where
    finally:
        unmount(where)


def fill(path: Path) -> int:
    """Writes ``path`` until the disk is full; returns its size."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    size = 0
    try:
        while True:
            size += os.write(fd, b"\xa5" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return size


def value(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {
        "i": i,
        "name": f"record {i}",
        "data": rng.random(8192),  # 64 KiB
        "ids": np.arange(i, i + 100, dtype=">i4"),
    }


def assert_intact(store: lv.Store, key: str, i: int) -> None:
    want = value(i)
    rec = store[key]
    assert rec.meta == {"i": i, "name": want["name"]}
    for name in ("data", "ids"):
        got = rec.array(name)
        assert got.dtype == want[name].dtype and got.tobytes() == want[name].tobytes()


def assert_storage_full(err: BaseException, inside: Path) -> None:
    assert isinstance(err, lv.StorageError), repr(err)
    assert isinstance(err, OSError) and isinstance(err, lv.LazyvaultError)
    assert err.errno == errno.ENOSPC
    assert err.filename and str(err.filename).startswith(str(inside)), err.filename
    assert str(err.filename) in str(err)


def test_put_on_a_full_disk_then_recover(disk: Path) -> None:
    path = disk / "s.lv"
    store = lv.Store.open(path)
    committed: dict[str, int] = {}
    failed = None
    try:
        for i in range(1000):
            key = f"k{i:04d}"
            try:
                store[key] = value(i)
                store.flush()
            except lv.LazyvaultError as e:
                failed = (key, e)
                break
            committed[key] = i
        assert failed is not None, "the disk never filled up"
        key, err = failed
        assert_storage_full(err, path)
        assert len(committed) > 10
        # the failed put left nothing: no record, no payload, no temporary file
        assert key not in store
        assert len(store) == len(committed) and list(store) == sorted(committed)
        for k, i in committed.items():
            assert_intact(store, k, i)
        report = store.verify()
        assert report["ok"] and report["orphans"] == [], report
        # make room: delete half, flush (removes their payloads), gc
        for k in list(committed)[::2]:
            del store[k]
            del committed[k]
        store.flush()
        store.gc()
        for i in range(1000, 1005):
            store[f"k{i:04d}"] = value(i)
            committed[f"k{i:04d}"] = i
        store.flush()
        store.close()
        with lv.Store.open(path) as again:
            gc_report = again.gc()
            assert (gc_report["removed_files"], gc_report["removed_bytes"]) == (0, 0)
            report = again.verify()
            assert report["ok"] and report["orphans"] == [], report
            assert report["records"] == len(committed)
            assert list(again) == sorted(committed)
            for k, i in committed.items():
                assert_intact(again, k, i)
    finally:
        store.close()


def test_a_payload_larger_than_the_free_space_fails_cleanly(disk: Path) -> None:
    path = disk / "s.lv"
    with lv.Store.open(path) as store:
        store["small"] = {"a": np.arange(10)}
        store.flush()
        with pytest.raises(lv.StorageError) as info:
            store["huge"] = {"a": np.zeros(5 * 2**20 // 8)}  # 5 MiB on a 4 MiB disk
        assert_storage_full(info.value, path)
        # the same key again, smaller: the failed put left the key free
        store["huge"] = {"a": np.ones(10)}
        assert store["huge"].a.tolist() == [1.0] * 10
        assert store.verify()["orphans"] == []
    free = shutil.disk_usage(disk).free
    assert free > 3 * 2**20  # the partial 5 MiB payload was removed


def test_update_adds_whole_chunks_only_on_a_full_disk(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 records of 5 arrays per chunk: 10 payloads, the syncfs barrier path
    monkeypatch.setattr(lv.store, "_UPDATE_CHUNK_RECORDS", 2)
    path = disk / "s.lv"

    def obj(i: int, n: int) -> dict[str, Any]:
        return {"i": i, **{f"a{j}": np.full(n, i, dtype=np.uint8) for j in range(5)}}

    small = {f"k{i}": obj(i, 70_000) for i in range(2)}  # over 64 KiB: files, not a pack
    big = {f"k{i}": obj(i, 500_000) for i in range(2, 4)}  # 5 MB on a 4 MiB disk
    with lv.Store.open(path) as store:
        with pytest.raises(lv.StorageError) as info:
            store.update({**small, **big}, progress=False)
        assert_storage_full(info.value, path)
        # the first chunk stays, nothing of the second
        assert sorted(store) == ["k0", "k1"]
        for k, o in small.items():
            assert store[k].a4.tolist() == o["a4"].tolist()
        assert sorted(p.suffix for p in (path / "arrays").glob("*/*")) == [".npy"] * 10
        report = store.verify()
        assert report["ok"] and report["orphans"] == [], report
        store.update({"k2": obj(2, 10)}, progress=False)  # space is back
        assert store["k2"].a0.tolist() == [2] * 10
    free = shutil.disk_usage(disk).free
    assert free > 3 * 2**20  # the second chunk's payloads were removed


@pytest.fixture
def source(tmp_path: Path) -> Iterator[lv.Store]:
    """A store on the ordinary disk: 12 records of 512 KiB (6 MiB)."""
    with lv.Store.open(tmp_path / "src.lv") as store:
        for i in range(12):
            store[f"k{i:02d}"] = {"i": i, "a": np.full(2**16, i, dtype=np.float64)}
        store.flush()
        yield store


def test_export_to_a_full_disk(source: lv.Store, disk: Path, tmp_path: Path) -> None:
    target = disk / "x.lvz"
    source.export(target, keys=["k00"])  # fits
    before = target.read_bytes()
    # over an existing archive: it stays as it was
    with pytest.raises(lv.StorageError) as info:
        source.export(target)
    assert_storage_full(info.value, disk)
    assert sorted(os.listdir(disk)) == ["x.lvz"]  # no temporary file left
    assert target.read_bytes() == before
    with lv.Store.open(target) as archive:
        assert list(archive) == ["k00"] and archive.verify()["ok"]
    # to a new name: nothing is left behind
    with pytest.raises(lv.StorageError) as info:
        source.export(disk / "y.lvz")
    assert_storage_full(info.value, disk)
    assert sorted(os.listdir(disk)) == ["x.lvz"]
    # the source store is untouched, and exports what fits
    assert source.verify()["ok"] and len(source) == 12
    source.export(tmp_path / "all.lvz")
    target.unlink()
    source.export(disk / "some.lvz", keys=["k01", "k02", "k03", "k04"])
    with lv.Store.open(disk / "some.lvz") as archive:
        assert archive.verify()["ok"]
        assert [archive[k].a[0] for k in archive] == [1.0, 2.0, 3.0, 4.0]


def test_a_failed_export_prints_nothing(
    source: lv.Store, disk: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(lv.StorageError):
        source.export(disk / "x.lvz")
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("ext", [".npz", ".safetensors"])
def test_npz_and_safetensors_export_to_a_full_disk(source: lv.Store, disk: Path, ext: str) -> None:
    target = disk / f"x{ext}"
    with pytest.raises(OSError) as info:
        source.export(target)
    assert not target.exists() and os.listdir(disk) == []
    assert_storage_full(info.value, disk)


# -- a full disk under the index (sled's log), in a child process ----------------

_INDEX_FULL = """
import json, os, errno, sys, threading, numpy as np, lazyvault as lv

disk = sys.argv[1]
path = os.path.join(disk, "s.lv")
out = {}

def describe(e):
    return {"type": type(e).__name__, "storage": isinstance(e, lv.StorageError),
            "oserror": isinstance(e, OSError), "errno": getattr(e, "errno", None),
            "filename": getattr(e, "filename", None), "text": str(e)}

def timed(fn):
    # "ok", a description of the error, or "hang" after 10 s
    got = {}
    def run():
        try:
            fn()
            got["r"] = "ok"
        except BaseException as e:
            got["r"] = describe(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    return got.get("r", "hang")

s = lv.Store.open(path)
for i in range(5):
    s[f"c{i}"] = {"i": i, "a": np.full(100, i)}
s.flush()
filler = os.path.join(disk, "filler")
fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
size = 0
try:
    while True:
        size += os.write(fd, b"\\xa5" * 4096)
except OSError:
    pass
# room for a few flushes past the 1 MiB lazyvault keeps free, then full
os.ftruncate(fd, size - (1 << 20) - 64 * 1024)
os.close(fd)
out["committed"] = 0
out["error"] = None
# metadata-only records: nothing but sled's log needs the space
for n in range(100_000):
    out["failed_in"] = "put"
    try:
        s[f"m{n:05d}"] = {"n": n, "pad": "y" * 100}
        if n % 10 == 9:
            out["failed_in"] = "flush"
            s.flush()
            out["committed"] = n + 1
    except BaseException as e:
        out["error"] = describe(e)
        break
out["flush_on_full_disk"] = timed(s.flush)
os.remove(filler)  # space again
out["flush"] = timed(s.flush)
out["put"] = timed(lambda: s.__setitem__("after", {"a": np.arange(3)}))
out["delete"] = timed(lambda: s.__delitem__("c0"))
out["close"] = timed(s.close)
print(json.dumps(out), flush=True)
os._exit(0)  # no atexit: a stuck store must not hang this child
"""


@pytest.fixture
def index_full(disk: Path) -> dict[str, Any]:
    """Runs _INDEX_FULL on the disk; returns what it observed."""
    done = subprocess.run(
        [sys.executable, "-c", _INDEX_FULL, str(disk)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    assert out["error"] is not None, "the disk never filled up"
    return out


def test_flushed_records_survive_a_full_index(disk: Path, index_full: dict[str, Any]) -> None:
    # in a new process (the child is gone), with space again
    with lv.Store.open(disk / "s.lv") as store:
        keys = list(store)
        assert len(store) == len(keys)
        for i in range(5):
            if i == 0 and "c0" not in store:
                continue  # deleted after the failure (once that works)
            assert store[f"c{i}"].a.tolist() == [i] * 100
        assert index_full["committed"] > 0
        for n in range(index_full["committed"]):
            assert store[f"m{n:05d}"].n == n
        store.gc()
        report = store.verify()
        assert report["ok"] and report["orphans"] == [], report
        store["new"] = {"a": np.arange(4)}
        store.flush()
    with lv.Store.open(disk / "s.lv") as store:
        assert store["new"].a.tolist() == [0, 1, 2, 3]


def test_a_full_index_is_a_storage_error(disk: Path, index_full: dict[str, Any]) -> None:
    # the write is refused before the index could fail (a free-space check
    # with a margin): a storage error naming the store, and the commit of
    # what was written before still succeeds on the full disk
    err = index_full["error"]
    assert index_full["failed_in"] == "put"
    assert err["storage"] and err["oserror"], err
    assert err["errno"] == errno.ENOSPC
    assert "free space" in err["text"] and "nothing was written" in err["text"]
    assert err["filename"] and err["filename"].startswith(str(disk / "s.lv"))
    assert index_full["flush_on_full_disk"] == "ok"


def test_the_store_works_again_once_space_is_freed(index_full: dict[str, Any]) -> None:
    assert {op: index_full[op] for op in ("flush", "put", "delete", "close")} == {
        "flush": "ok",
        "put": "ok",
        "delete": "ok",
        "close": "ok",
    }


_CLOSE_AFTER_BLOB_ENOSPC = """
import json, os, subprocess, sys, threading, lazyvault as lv

base = sys.argv[1]
result = {"attempts": 0, "hung": None, "errors": []}
for attempt in range(int(sys.argv[2])):
    disk = os.path.join(base, f"d{attempt}")
    os.mkdir(disk)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", disk], check=True)
    result["attempts"] += 1
    try:
        s = lv.Store.open(os.path.join(disk, "s.lv"))
        try:
            for i in range(10_000):
                # 20 kB values: sled writes them as separate blob files
                s[f"k{i}"] = {"i": i, "pad": "x" * 20_000}
                if i % 5 == 4:
                    s.flush()
        except lv.LazyvaultError as e:
            result["errors"].append(str(e))
        done = threading.Event()
        def close():
            try:
                s.close()
            except Exception:
                pass
            done.set()
        threading.Thread(target=close, daemon=True).start()
        if not done.wait(5):
            result["hung"] = attempt
            break
    finally:
        subprocess.run(["umount", "-l", disk])
print(json.dumps(result), flush=True)
os._exit(0)
"""


def test_close_after_a_full_disk_returns(tmp_path: Path) -> None:
    mount_tmpfs(tmp_path / "probe")  # skips when tmpfs cannot be mounted
    unmount(tmp_path / "probe")
    # each attempt: a fresh 4 MiB disk filled through sled's blob files, then
    # close() with 5 s to return; it hangs in about one attempt in three
    done = subprocess.run(
        [sys.executable, "-c", _CLOSE_AFTER_BLOB_ENOSPC, str(tmp_path), "40"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["errors"], "the disk never filled up"
    assert result["hung"] is None, f"close() hung in attempt {result['hung']}"
