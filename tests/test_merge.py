"""``Store.merge``: other stores' records moved in, in one all-or-nothing batch, their payload files
hard-linked under new ids (no byte copied); the sources stay valid, unchanged stores."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_full_disk import mount_tmpfs, unmount

import lazyvault as lv
from lazyvault.store import raw_record

from conftest import payload_location, stored_files


def make_source(path: Path, keys: list[str], *, seed: int = 0) -> dict[str, dict[str, Any]]:
    """A flushed, closed store at ``path`` with one record per key; returns what it holds."""
    rng = np.random.default_rng(seed)
    objs = {
        k: {"x": rng.random((3, 4)), "i": np.arange(i + 2), "name": k, "n": i}
        for i, k in enumerate(keys)
    }
    with lv.Store.open(path, mode="w") as s:
        s.update(objs, progress=False)
    return objs


def check_equal(store: lv.Store, objs: dict[str, dict[str, Any]]) -> None:
    for k, obj in objs.items():
        rec = store[k]
        np.testing.assert_array_equal(rec["x"], obj["x"])
        np.testing.assert_array_equal(rec["i"], obj["i"])
        assert rec["name"] == obj["name"]
        assert rec["n"] == obj["n"]


def inodes(path: Path) -> dict[int, int]:
    """``{inode: st_nlink}`` of every payload file and pack of the store at ``path``."""
    return {f.stat().st_ino: f.stat().st_nlink for f in stored_files(path)}


def test_merge_links_payloads_and_keeps_the_sources(tmp_path: Path) -> None:
    a = make_source(tmp_path / "a.lv", ["a1", "a2"], seed=1)
    b = make_source(tmp_path / "b.lv", ["b1"], seed=2)
    with lv.Store.open(tmp_path / "t.lv") as t:
        t["old"] = {"y": np.ones(2)}
        keys = t.merge([tmp_path / "a.lv", str(tmp_path / "b.lv")], progress=False)
        assert keys == ["a1", "a2", "b1"]
        assert sorted(t) == ["a1", "a2", "b1", "old"]
        check_equal(t, a | b)
    src = inodes(tmp_path / "a.lv") | inodes(tmp_path / "b.lv")
    dst = inodes(tmp_path / "t.lv")
    # every source payload is also a payload of the target: the same inode, two links
    assert set(src) <= set(dst)
    assert all(dst[i] == 2 for i in src)
    with lv.Store.open(tmp_path / "t.lv", mode="r") as t:
        check_equal(t, a | b)
        assert t.verify(progress=False)["ok"]
    for name, objs in [("a.lv", a), ("b.lv", b)]:
        with lv.Store.open(tmp_path / name, mode="r") as s:
            assert sorted(s) == sorted(objs)
            check_equal(s, objs)
            assert s.verify(progress=False)["ok"]


def test_a_key_in_two_sources_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    make_source(tmp_path / "a.lv", ["k", "a"])
    make_source(tmp_path / "b.lv", ["b", "k"])
    with lv.Store.open(tmp_path / "t.lv") as t:
        t["old"] = {"y": np.ones(2)}
        before = stored_files(tmp_path / "t.lv")
        with pytest.raises(lv.InteropError, match="'k'") as info:
            t.merge([tmp_path / "a.lv", tmp_path / "b.lv"], progress=False)
        assert isinstance(info.value, ValueError)
        assert "a.lv" in str(info.value) and "b.lv" in str(info.value)
        # merging them one at a time would replace a record: the advice says so
        assert "the later replacing the earlier's record" in str(info.value)
        assert sorted(t) == ["old"]
        assert stored_files(tmp_path / "t.lv") == before


def test_existing_keys_are_replaced(tmp_path: Path) -> None:
    a = make_source(tmp_path / "a.lv", ["k", "new"])
    with lv.Store.open(tmp_path / "t.lv") as t:
        t["k"] = {"y": np.zeros(5)}
        t.flush()
        assert t.merge(tmp_path / "a.lv", progress=False) == ["k", "new"]
        check_equal(t, a)
        assert sorted(t["k"].arrays) == ["i", "x"]
        t.flush()
    with lv.Store.open(tmp_path / "t.lv", mode="r") as t:
        check_equal(t, a)
        assert len(t) == 2


def test_progress_counts_records(tmp_path: Path) -> None:
    make_source(tmp_path / "a.lv", [f"k{i}" for i in range(5)])
    calls: list[tuple[int, int | None]] = []
    with lv.Store.open(tmp_path / "t.lv") as t:
        t.merge([tmp_path / "a.lv"], progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 5)
    assert calls[-1] == (5, 5)


def test_merging_a_store_into_itself_is_refused(tmp_path: Path) -> None:
    make_source(tmp_path / "a.lv", ["k"])
    with lv.Store.open(tmp_path / "a.lv") as t:
        with pytest.raises(lv.InteropError, match="itself"):
            t.merge(os.fspath(tmp_path / "a.lv"), progress=False)
        assert sorted(t) == ["k"]
        assert len(stored_files(tmp_path / "a.lv")) == 1  # its one pack


def test_pickled_parts_indexes_and_reopening(tmp_path: Path) -> None:
    with lv.Store.open(tmp_path / "a.lv", mode="w", allow_pickle=True) as a:
        a["tags"] = {"tags": {"x", "y"}, "obj": np.array([1, "two"], dtype=object), "n": 3}
        a["plain"] = {"x": np.arange(5), "n": 4}
    with lv.Store.open(tmp_path / "t.lv", allow_pickle=True) as t:
        t.create_index("n")
        t["mine"] = {"n": 3}
        assert t.merge(tmp_path / "a.lv", progress=False) == ["plain", "tags"]
        # the index answers with the merged records at once
        assert t.keys("n == 3") == ["mine", "tags"]
        assert t.keys("n == 4") == ["plain"]
    with lv.Store.open(tmp_path / "t.lv", mode="r", allow_pickle=True) as t:
        assert t.keys("n >= 3") == ["mine", "plain", "tags"]
        assert "n" in t.indexes()
        obj = t["tags"].load()
        assert obj["tags"] == {"x", "y"}
        assert obj["obj"].tolist() == [1, "two"]
        assert obj["n"] == 3
        np.testing.assert_array_equal(t["plain"]["x"], np.arange(5))
        assert t.verify(progress=False)["ok"]


def test_a_source_with_a_writer_in_another_process_is_read_at_its_last_commit(
    tmp_path: Path,
) -> None:
    make_source(tmp_path / "a.lv", ["a1"])
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys
                import numpy as np
                import lazyvault as lv
                s = lv.Store.open(sys.argv[1])
                s["a2"] = {"x": np.arange(3)}
                s.flush()
                s["unflushed"] = {"x": np.arange(4)}
                print("ready", flush=True)
                sys.stdin.readline()  # holds the writer role until told
                s.close()
                """
            ),
            str(tmp_path / "a.lv"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        assert writer.stdin is not None and writer.stdout is not None
        try:
            assert writer.stdout.readline() == "ready\n"
            with lv.Store.open(tmp_path / "t.lv") as t:
                assert t.merge(tmp_path / "a.lv", progress=False) == ["a1", "a2"]
                np.testing.assert_array_equal(t["a2"]["x"], np.arange(3))
                t.flush()
                assert t.verify(progress=False)["ok"]
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.wait(timeout=120) == 0
        finally:
            if writer.poll() is None:
                writer.kill()
    with lv.Store.open(tmp_path / "a.lv", mode="r") as a:
        assert sorted(a) == ["a1", "a2", "unflushed"]
        assert a.verify(progress=False)["ok"]


def run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter with ``args``."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_many_sources_need_no_descriptor_each(tmp_path: Path) -> None:
    # Was: every source's reader stayed open until the merge ended (one
    # descriptor each), so merging more sources than the descriptor limit
    # (1,024 by default; dask.write merges one shard per partition) failed
    # with EMFILE. The child's limit is 64, the sources 80.
    sources = [tmp_path / f"s{i}.lv" for i in range(80)]
    for i, path in enumerate(sources):
        with lv.Store.open(path, mode="w") as s:
            s[f"k{i:03}"] = {"x": np.full(3, i)}
    done = run_child(
        """
        import resource, sys
        import lazyvault as lv
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        with lv.Store.open(sys.argv[1]) as t:
            keys = t.merge(sys.argv[2:], progress=False)
        print(len(keys))
        """,
        str(tmp_path / "t.lv"),
        *map(str, sources),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["80"]
    with lv.Store.open(tmp_path / "t.lv", mode="r") as t:
        assert len(t) == 80
        np.testing.assert_array_equal(t["k079"]["x"], np.full(3, 79))


def test_bad_arguments_are_refused_and_change_nothing(tmp_path: Path) -> None:
    make_source(tmp_path / "a.lv", ["a1"])
    (tmp_path / "file.txt").write_text("not a store")
    with lv.Store.open(tmp_path / "a.lv", mode="r") as a:
        a.export(tmp_path / "a.lvz")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x").write_text("a directory that is not a store")
    with lv.Store.open(tmp_path / "t.lv") as t:
        t["old"] = {"y": np.ones(2)}
        t.flush()
        before = stored_files(tmp_path / "t.lv")
        bad: list[tuple[Any, type[Exception], str]] = [
            (None, TypeError, "not None"),
            (3, TypeError, "not int"),
            ([tmp_path / "a.lv", 3.5], TypeError, "not float"),
            ([tmp_path / "a.lv", None], TypeError, "not None"),
            # bytes are a path, as for open() (a fresh user's trial: TypeError), "" names none
            (os.fsencode(tmp_path / "missing.lv"), lv.StoreNotFoundError, "missing.lv"),
            ("", lv.StoreNotFoundError, "empty path"),
            (tmp_path / "missing.lv", lv.StoreNotFoundError, "missing.lv"),
            ([tmp_path / "a.lv", tmp_path / "file.txt"], lv.NotAStoreError, "file.txt"),
            # an archive is a file: its advice is import_file (a fresh user's trial)
            (tmp_path / "a.lvz", lv.NotAStoreError, r"a\.lvz: a file, not a store .*import_file"),
            ([tmp_path / "dir"], lv.NotAStoreError, "not a lazyvault store"),
            ([tmp_path / "a.lv", tmp_path / "a.lv"], lv.InteropError, "twice"),
        ]
        for sources, error, text in bad:
            with pytest.raises(error, match=text):
                t.merge(sources, progress=False)
            assert sorted(t) == ["old"]
            assert stored_files(tmp_path / "t.lv") == before
        # a progress callback that is not one
        with pytest.raises(TypeError, match="progress"):
            t.merge(tmp_path / "a.lv", progress="yes")  # type: ignore[arg-type]

        # an exception the callback raises stops the merge: nothing set
        def stop(done: int, total: int | None) -> None:
            if done:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            t.merge(tmp_path / "a.lv", progress=stop)
        assert sorted(t) == ["old"]
        assert stored_files(tmp_path / "t.lv") == before
        # nothing to merge
        assert t.merge([], progress=False) == []
    with lv.Store.open(tmp_path / "t.lv", mode="r") as r:
        with pytest.raises(lv.ReadOnlyError):
            r.merge(tmp_path / "a.lv", progress=False)
        assert sorted(r) == ["old"]


def test_a_missing_or_truncated_source_payload_raises_corrupt_error(tmp_path: Path) -> None:
    make_source(tmp_path / "a.lv", ["a1", "a2"])
    with lv.Store.open(tmp_path / "a.lv", mode="r") as s:
        raw = raw_record(s, "a2")
        assert raw is not None
        entry = json.loads(raw[0])["arrays"]["x"]
    victim, _ = payload_location(tmp_path / "a.lv", entry)  # the source's pack
    assert victim.exists()
    original = victim.read_bytes()
    with lv.Store.open(tmp_path / "t.lv") as t:
        for damage in ["missing", "truncated"]:
            if damage == "missing":
                victim.unlink()  # the pack of both records: the first is named
                key, array = "a1", "x"
            else:  # cut into the data of a2's "x"
                end = entry["pack_offset"] + entry["data_offset"] + entry["nbytes"]
                victim.write_bytes(original[: end - 8])
                key, array = "a2", "x"
            with pytest.raises(lv.CorruptError, match=damage) as info:
                t.merge(tmp_path / "a.lv", progress=False)
            assert info.value.key == key
            assert info.value.array == array
            assert info.value.path == str(victim)
            assert str(tmp_path / "a.lv") in str(info.value)
            assert len(t) == 0
            assert stored_files(tmp_path / "t.lv") == []
        victim.write_bytes(original)
        assert t.merge(tmp_path / "a.lv", progress=False) == ["a1", "a2"]


def test_a_source_on_another_file_system_is_copied(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "64M")
    try:
        objs = make_source(disk / "a.lv", ["a1", "a2"], seed=5)
        with lv.Store.open(tmp_path / "t.lv") as t:
            assert t.merge(disk / "a.lv", progress=False) == ["a1", "a2"]
            check_equal(t, objs)
            t.flush()
            assert t.verify(progress=False)["ok"]
        # copied into the merge's own pack
        assert sorted(inodes(tmp_path / "t.lv").values()) == [1]
        with lv.Store.open(disk / "a.lv", mode="r") as s:
            check_equal(s, objs)
            assert s.verify(progress=False)["ok"]
    finally:
        unmount(disk)


# -- crash: a merging process killed with SIGKILL at random moments ------------------------------

_CRASH_SOURCES = 3
_CRASH_RECORDS = 300


def crash_value(s: int, i: int) -> np.ndarray:
    return np.arange(64, dtype=np.int64) + (s * 1000 + i)


def make_crash_sources(tmp_path: Path) -> list[Path]:
    sources = []
    for s in range(_CRASH_SOURCES):
        path = tmp_path / f"src{s}.lv"
        with lv.Store.open(path, mode="w") as store:
            store.update(
                {
                    f"s{s}/{i:04}": {"x": crash_value(s, i), "s": s, "i": i}
                    for i in range(_CRASH_RECORDS)
                },
                progress=False,
            )
        sources.append(path)
    return sources


_MERGER = """
import sys
import lazyvault as lv
target, *sources = sys.argv[1:]
store = lv.Store.open(target)
store.begin_write()
print("merging", flush=True)
store.merge(sources, progress=False)
store.flush()
print("merged", flush=True)
store.close()
print("closed", flush=True)
"""


def run_merger(target: Path, sources: list[Path], delay: float | None) -> tuple[str, float]:
    """Runs a merging child; kills it with SIGKILL ``delay`` seconds after it starts merging
    (never when None); returns the last line it printed and the seconds from the start of its
    merge to its end."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _MERGER, str(target), *map(str, sources)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line == "merging\n", proc.stderr.read() if proc.stderr else ""
        start = time.monotonic()
        if delay is not None:
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
        span = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if delay is None:
        assert proc.returncode == 0, err[-3000:]
    lines = (line + out).split()
    return lines[-1], span


def check_all_or_nothing(target: Path) -> bool:
    """Opens ``target`` (recovering what the killed writer left) and checks that it holds either
    every merged record, arrays equal, or none of them, and verifies; returns which."""
    with lv.Store.open(target) as store:
        store.begin_write()
        keys = sorted(store)
        merged = [k for k in keys if k != "old"]
        assert "old" in keys
        np.testing.assert_array_equal(store["old"]["y"], np.arange(4))
        if merged:
            assert merged == sorted(
                f"s{s}/{i:04}" for s in range(_CRASH_SOURCES) for i in range(_CRASH_RECORDS)
            )
            for key in merged:
                rec = store[key]
                np.testing.assert_array_equal(rec["x"], crash_value(rec["s"], rec["i"]))
        report = store.verify(progress=False)
        assert report["ok"], report["problems"]
    return bool(merged)


def test_a_merge_killed_at_any_moment_leaves_all_or_nothing(tmp_path: Path) -> None:
    sources = make_crash_sources(tmp_path)
    rng = np.random.default_rng(14)

    def fresh_target(n: int) -> Path:
        target = tmp_path / f"t{n}.lv"
        with lv.Store.open(target, mode="w") as t:
            t["old"] = {"y": np.arange(4)}
        return target

    # an uninterrupted run: how long a merge takes here (to spread the kills over it)
    target = fresh_target(0)
    last, span = run_merger(target, sources, None)
    assert last == "closed"
    assert check_all_or_nothing(target)
    for n in range(1, 9):
        target = fresh_target(n)
        delay = float(rng.uniform(0, 1.2 * span))
        last, _ = run_merger(target, sources, delay)
        merged = check_all_or_nothing(target)
        if last in ("merged", "closed"):
            assert merged  # flushed: committed
    # the sources are untouched by it all
    for s, path in enumerate(sources):
        with lv.Store.open(path, mode="r") as store:
            assert len(store) == _CRASH_RECORDS
            np.testing.assert_array_equal(store[f"s{s}/0007"]["x"], crash_value(s, 7))
            report = store.verify(progress=False)
            assert report["ok"], report["problems"]


def test_links_need_no_free_space_for_payloads(tmp_path: Path) -> None:
    # Was: the free-space check asked 4 KiB per linked payload as for a
    # written one, so a merge by links on a file system without room for a
    # copy was refused with ENOSPC though the links take none.
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "16M")
    try:
        arrays = {f"a{j}": np.full(2, j) for j in range(20)}
        with lv.Store.open(disk / "a.lv", mode="w") as s:
            for i in range(100):
                s[f"k{i:03}"] = arrays
        # small arrays are packs: fill the disk so that it has no room for the
        # 4 KiB per payload the old check asked for
        filler = shutil.disk_usage(disk).free - 6 * 2**20
        (disk / "filler").write_bytes(b"\0" * filler)
        free = shutil.disk_usage(disk).free
        assert free < 2000 * 4096
        with lv.Store.open(disk / "t.lv") as t:
            assert len(t.merge(disk / "a.lv", progress=False)) == 100
            np.testing.assert_array_equal(t["k099"]["a19"], np.full(2, 19))
            t.flush()
            assert t.verify(progress=False)["ok"]
        assert all(n == 2 for n in inodes(disk / "t.lv").values())
    finally:
        unmount(disk)
