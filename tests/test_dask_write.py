"""``lazyvault.dask.write``: a dask bag of ``(key, obj)`` pairs written into a store by the
workers, merged in one commit, all or nothing; on a real ``distributed.LocalCluster`` (two worker
processes) and on the local threaded scheduler."""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv
import lazyvault.dask

from conftest import stored_files as payload_files

dask = pytest.importorskip("dask")
db = pytest.importorskip("dask.bag")
distributed = pytest.importorskip("distributed")

SCHEDULERS = ["distributed", "threads"]


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    import cloudpickle

    # the workers cannot import this test module: its functions travel by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with (
        distributed.LocalCluster(
            n_workers=2,
            processes=True,
            threads_per_worker=1,
            dashboard_address=None,  # no dashboard; its HTTP server (still started) on any port
            scheduler_kwargs={"dashboard_address": ":0"},
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(params=SCHEDULERS)
def compute(request: pytest.FixtureRequest) -> dict[str, Any]:
    """``compute_kwargs`` for write: the cluster's client (the default scheduler while it is
    active), or the local threaded scheduler."""
    if request.param == "distributed":
        request.getfixturevalue("client")
        return {}
    return {"scheduler": "threads"}


def make_obj(i: int) -> dict[str, Any]:
    return {
        "i": i,
        "name": f"item {i}",
        "x": np.arange(5, dtype=np.float64) + i,
        "big": np.full(20_000, i, dtype=np.int32),  # 80 KB: memory-mapped when read
        "nested": {"a": [np.full(3, i, dtype=np.int16), {"b": np.eye(2) * i}], "t": (i, "s")},
    }


def make_pair(i: int) -> tuple[str, dict[str, Any]]:
    return f"r{i:03d}", make_obj(i)


def pairs_bag(n: int = 40, npartitions: int = 8) -> Any:
    return db.from_sequence(range(n), npartitions=npartitions).map(make_pair)


def same(a: Any, b: Any) -> bool:
    """Deep equality of objects with numpy arrays in them (types kept)."""
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def state(path: Path) -> tuple[int, dict[str, Any], list[tuple[str, bytes]]]:
    """A store's version, every record (as loaded) and its payload files with their bytes."""
    with lv.Store.open(path, "r") as s:
        records = {k: s[k].load() for k in s}
        version = s.version
    payloads = [(str(p), p.read_bytes()) for p in payload_files(path)]
    return version, records, payloads


def same_state(a: Any, b: Any) -> bool:
    return a[0] == b[0] and same(a[1], b[1]) and a[2] == b[2]


def shard_dirs(parent: Path) -> list[Path]:
    return sorted(parent.glob(".*.shards-*"))


def old_store(path: Path) -> None:
    """A store with records the writes meet: r001 (replaced by the bags), old-0, old-1."""
    with lv.Store.open(path, "w") as s:
        s.update({"r001": {"old": True, "x": np.ones(4)}, "old-0": {"x": np.zeros(7)}})
        s.flush()
        s["old-1"] = {"i": -1, "y": np.arange(100_000)}
        s.flush()


def wait_idle(client: Any) -> None:
    """Returns once no worker runs a task (tasks of a failed write may still be running)."""

    def executing(dask_worker: Any) -> int:
        return len(dask_worker.state.executing)

    while any(client.run(executing).values()):
        threading.Event().wait(0.05)


# -- a write, then a read ------------------------------------------------------------


def test_round_trip_on_two_workers(client: Any, tmp_path: Path) -> None:
    path = tmp_path / "out.lv"
    with distributed.get_task_stream(client) as stream:
        keys = lazyvault.dask.write(pairs_bag(), path)
    assert sorted(keys) == [f"r{i:03d}" for i in range(40)] and len(keys) == 40
    writers = {t["worker"] for t in stream.data if "lazyvault-write" in str(t["key"])}
    assert len(writers) == 2, stream.data
    with lv.Store.open(path, "r") as s:
        assert s.version == 1
        assert sorted(s) == sorted(keys)
        for i in range(40):
            rec = s[f"r{i:03d}"]
            assert rec.meta["i"] == i and rec.meta["name"] == f"item {i}"
            assert same(rec.array("x"), np.arange(5, dtype=np.float64) + i)
            assert same(rec.load(), make_obj(i))
        assert s.verify()["ok"]
    assert shard_dirs(tmp_path) == []


def test_threaded_scheduler(tmp_path: Path) -> None:
    path = tmp_path / "out.lv"
    keys = lazyvault.dask.write(pairs_bag(12, 3), path, compute_kwargs={"scheduler": "threads"})
    assert sorted(keys) == [f"r{i:03d}" for i in range(12)]
    with lv.Store.open(path, "r") as s:
        assert s.version == 1 and len(s) == 12
        assert all(same(s[f"r{i:03d}"].load(), make_obj(i)) for i in range(12))
    assert shard_dirs(tmp_path) == []


def test_payloads_are_linked_not_copied(
    compute: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's payload files are the shards' files (same inodes), which had one link
    each in the shard: merged by hard links, the shards then removed."""
    shard_files: dict[int, tuple[str, int]] = {}
    merge = lv.Store.merge

    def recording_merge(self: lv.Store, sources: Any, **kwargs: Any) -> list[str]:
        for source in sources:
            for p in payload_files(Path(source)):
                st = p.stat()
                shard_files[st.st_ino] = (str(p), st.st_nlink)
        return merge(self, sources, **kwargs)

    monkeypatch.setattr(lv.Store, "merge", recording_merge)
    path = tmp_path / "out.lv"
    lazyvault.dask.write(pairs_bag(16, 4), path, compute_kwargs=compute)
    files = payload_files(path)
    # the shards' packs (their records' arrays are small), each linked once
    assert 0 < len(files) == len(shard_files) <= 16 * 4
    assert {f.stat().st_ino for f in files} == set(shard_files)
    assert all(links == 1 for _, links in shard_files.values())
    assert all(f.stat().st_nlink == 1 for f in files)  # the shard's link is gone
    assert shard_dirs(tmp_path) == []


# -- all or nothing --------------------------------------------------------------------


def boom_at_13(i: int) -> tuple[str, dict[str, Any]]:
    if i == 13:
        raise ArithmeticError("boom at 13")
    return make_pair(i)


def not_a_pair_at_13(i: int) -> Any:
    return [make_pair(i)] if i == 13 else make_pair(i)


def three_items_at_13(i: int) -> Any:
    return (*make_pair(i), "x") if i == 13 else make_pair(i)


def dup_across(i: int) -> tuple[str, dict[str, Any]]:
    return make_pair(3 if i == 37 else i)  # r003 in the first and the last partition


def dup_within(i: int) -> tuple[str, dict[str, Any]]:
    return make_pair(12 if i == 13 else i)


def int_key_at_13(i: int) -> tuple[Any, dict[str, Any]]:
    return (13 if i == 13 else f"r{i:03d}"), make_obj(i)


def empty_key_at_13(i: int) -> tuple[str, dict[str, Any]]:
    return ("" if i == 13 else f"r{i:03d}"), make_obj(i)


FAILURES: list[tuple[Callable[[int], Any], type[BaseException], str]] = [
    (boom_at_13, ArithmeticError, "boom at 13"),
    (not_a_pair_at_13, TypeError, r"item 1 of partition 3 is a list of 1 items, not a \(key, obj"),
    (three_items_at_13, TypeError, "item 1 of partition 3 is a tuple of 3 items"),
    (dup_across, ValueError, "key 'r003' is in partitions 0 and 9"),
    (dup_within, ValueError, "key 'r012' is twice in partition 3"),
    (int_key_at_13, lv.KeyTypeError, "keys are str, not int"),
    (empty_key_at_13, lv.InvalidKeyError, "keys must be non-empty strings"),
]


@pytest.mark.parametrize(
    ("func", "error", "match"), FAILURES, ids=[f[0].__name__ for f in FAILURES]
)
@pytest.mark.parametrize("existing", [True, False], ids=["existing", "new"])
def test_a_failing_task_changes_nothing(
    compute: dict[str, Any],
    tmp_path: Path,
    func: Callable[[int], Any],
    error: type[BaseException],
    match: str,
    existing: bool,
    request: pytest.FixtureRequest,
) -> None:
    path = tmp_path / "out.lv"
    if existing:
        old_store(path)
        before = state(path)
    bag = db.from_sequence(range(40), npartitions=10).map(func)
    with pytest.raises(error, match=match):
        lazyvault.dask.write(bag, path, compute_kwargs=compute)
    if not compute:
        wait_idle(request.getfixturevalue("client"))
    if existing:
        assert same_state(state(path), before)
    else:
        assert not path.exists()
    assert shard_dirs(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == (["out.lv"] if existing else [])


ENTERED = threading.Event()
RELEASE = threading.Event()


def first_waits_others_fail(i: int) -> tuple[str, Any]:
    if i == 0:
        return make_pair(0)
    assert ENTERED.wait(30)  # the task of partition 0 is about to open its shard
    raise ArithmeticError("boom while partition 0 writes")


def test_a_task_still_writing_after_the_failure_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write fails while the task of partition 0 is about to open its shard (its directory
    made); the driver removes the shards directory; that task then goes on, and opening its
    shard (with mode "a") creates the directory again with its parents; at its end, the task
    removes it."""
    ENTERED.clear()
    RELEASE.clear()
    store_open = lv.Store.open

    def held_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if ".shards-" in str(path):
            ENTERED.set()
            assert RELEASE.wait(30)
        return store_open(path, *args, **kwargs)

    monkeypatch.setattr(lv.Store, "open", held_open)
    path = tmp_path / "out.lv"
    old_store(path)
    before = state(path)
    bag = db.from_sequence([0, 1], npartitions=2).map(first_waits_others_fail)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        kwargs = {"scheduler": "threads", "pool": pool}
        with pytest.raises(ArithmeticError, match="boom while partition 0"):
            lazyvault.dask.write(bag, path, compute_kwargs=kwargs)
        assert shard_dirs(tmp_path) == []
        RELEASE.set()  # the task of partition 0 goes on; the pool's exit waits for it
    assert shard_dirs(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["out.lv"]
    assert same_state(state(path), before)


# -- into an existing store ------------------------------------------------------------


def test_into_an_existing_store_one_commit(compute: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "out.lv"
    old_store(path)
    reader = lv.Store.open(path, "r")
    old = {k: reader[k].load() for k in reader}
    assert reader.version == 2
    keys = lazyvault.dask.write(pairs_bag(10, 3), path, compute_kwargs=compute)
    assert sorted(keys) == [f"r{i:03d}" for i in range(10)]
    # the reader opened before still sees its snapshot, until refresh()
    assert reader.version == 2 and sorted(reader) == ["old-0", "old-1", "r001"]
    assert same(reader["r001"].load(), old["r001"])
    assert reader.refresh() == 3
    assert sorted(reader) == ["old-0", "old-1", *(f"r{i:03d}" for i in range(10))]
    assert same(reader["r001"].load(), make_obj(1))  # replaced
    assert same(reader["old-1"].load(), old["old-1"])  # kept
    assert all(same(reader[f"r{i:03d}"].load(), make_obj(i)) for i in range(10))
    assert reader.verify()["ok"]
    reader.close()
    assert shard_dirs(tmp_path) == []


@pytest.mark.parametrize("existing", [True, False], ids=["existing", "new"])
def test_an_empty_bag_writes_nothing(
    compute: dict[str, Any], tmp_path: Path, existing: bool
) -> None:
    path = tmp_path / "out.lv"
    if existing:
        old_store(path)
        before = state(path)
    bag = db.from_sequence([], npartitions=1)
    assert lazyvault.dask.write(bag, path, compute_kwargs=compute) == []
    if existing:
        assert same_state(state(path), before)
    else:  # created, empty, no commit
        with lv.Store.open(path, "r") as s:
            assert len(s) == 0 and s.version == 0
    assert shard_dirs(tmp_path) == []


# -- bad arguments ------------------------------------------------------------------------


def never_run(i: int) -> Any:
    raise AssertionError("a task ran")


@pytest.mark.parametrize(
    ("case", "error", "match"),
    [
        ("list", TypeError, "write takes a dask.bag.Bag of .key, obj. pairs, not list"),
        ("none", TypeError, "path must be a str or os.PathLike, not NoneType"),
        ("bytes", TypeError, "path must be a str or os.PathLike, not bytes"),
        ("file", lv.NotAStoreError, "out.lv: not a lazyvault store"),
        ("dir", lv.NotAStoreError, "out.lv: not a lazyvault store"),
        ("archive", lv.ReadOnlyError, "out.lvz' is a .lvz archive, which is read-only"),
        ("no-archive", lv.StoreNotFoundError, "no such archive"),
        ("no-parent", lv.MissingFileError, "no such directory"),
        ("kwargs", TypeError, "compute_kwargs is a mapping, not list"),
        # "" wrote a store into the working directory (a fresh user's trial)
        ("empty", ValueError, "path is empty"),
    ],
)
def test_bad_arguments_create_nothing(tmp_path: Path, case: str, error: type, match: str) -> None:
    bag = db.from_sequence(range(4), npartitions=2).map(never_run)
    path: Any = tmp_path / "out.lv"
    kwargs: Any = {"scheduler": "threads"}
    if case == "list":
        bag = [("a", 1)]
    elif case == "none":
        path = None
    elif case == "bytes":
        path = os.fsencode(path)
    elif case == "file":
        path.write_text("not a store")
    elif case == "dir":
        path.mkdir()
        (path / "notes.txt").write_text("mine")
    elif case == "archive":
        with lv.Store.open(tmp_path / "src.lv", "w") as s:
            s["a"] = {"x": np.ones(2)}
        path = tmp_path / "out.lvz"
        lv.Store.open(tmp_path / "src.lv", "r").export(path)
    elif case == "no-archive":
        path = tmp_path / "out.lvz"
    elif case == "no-parent":
        path = tmp_path / "missing" / "out.lv"
    elif case == "kwargs":
        kwargs = ["scheduler"]
    elif case == "empty":
        path = ""
    listing = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    with pytest.raises(error, match=match):
        lazyvault.dask.write(bag, path, compute_kwargs=kwargs)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == listing


def test_without_dask(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("dask", "dask.bag"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'lazyvault\[dask\]'"):
        lazyvault.dask.write(None, tmp_path / "out.lv")  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


def test_import_lazyvault_imports_no_dask() -> None:
    code = (
        "import sys, lazyvault; lazyvault.dask.write; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dask'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# -- a driver killed while merging ----------------------------------------------------

CHILD = """
import os
import sys
import lazyvault as lv
import lazyvault.dask
import dask.bag as db
import numpy as np

target = os.path.abspath(sys.argv[1])
merge, flush = lv.Store.merge, lv.Store.flush

def announced_merge(self, sources, **kwargs):
    print("merging", flush=True)
    return merge(self, sources, **kwargs)

def announced_flush(self):
    if self.path != target:  # a shard
        return flush(self)
    print("flushing", flush=True)
    flush(self)
    print("flushed", flush=True)

lv.Store.merge, lv.Store.flush = announced_merge, announced_flush

def pair(i):
    return f"r{i:04d}", {"i": i, "x": np.full(3, i), "y": np.arange(i % 7)}

bag = db.from_sequence(range(N), npartitions=8).map(pair)
lazyvault.dask.write(bag, target, compute_kwargs={"scheduler": "threads"})
print("done", flush=True)
"""

N_CRASH = 1500  # records: 3,000 payload files to link


def expected_new(i: int) -> dict[str, Any]:
    return {"i": i, "x": np.full(3, i), "y": np.arange(i % 7)}


#: When the child is killed: ``(what it printed last, up to how many seconds after)``.
KILLS = {
    "computing": (None, 2.0),  # from its start: importing, computing, or later
    "merge-starts": ("merging", 0.0),
    "merging-1": ("merging", 0.3),
    "merging-2": ("merging", 0.3),
    "flush-starts": ("flushing", 0.0),
    "flushing-1": ("flushing", 0.05),
    "flushing-2": ("flushing", 0.05),
    "flushed": ("flushed", 0.0),
}


@pytest.mark.parametrize("when", list(KILLS))
def test_a_driver_killed_leaves_all_or_nothing(tmp_path: Path, when: str) -> None:
    """A driver process killed (SIGKILL) at some moment of its write: the store holds all the
    records or none of them, for a reader and for the next writer."""
    path = tmp_path / "out.lv"
    with lv.Store.open(path, "w") as s:
        s.update({"r0001": {"old": 1}, "keep": {"x": np.arange(4)}})
    before = state(path)
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD).replace("range(N)", f"range({N_CRASH})"))
    child = subprocess.Popen(
        [sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    line, most = KILLS[when]
    while line is not None:
        got = child.stdout.readline()
        assert got, f"the child ended before printing {line!r}"
        if got == f"{line}\n":
            break
    threading.Event().wait(random.Random(when).uniform(0.0, most))
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    after = state(path)
    seen = outcome(after[1], before[1])  # by a reader: the last commit
    if when == "merge-starts":
        assert seen == "none"  # flush() had not begun
    if when == "flushed":
        assert seen == "all" and after[0] == before[0] + 1
    if seen == "none":  # the payloads merge linked, if any, are orphans
        assert after[0] == before[0] and set(after[2]) >= set(before[2])
    with lv.Store.open(path, "a") as s:  # a writer recovers the crashed one's leftovers
        s.begin_write()
        recovered = outcome({k: s[k].load() for k in s}, before[1])
        # killed after sled wrote the merge's batch, before its commit: the next writer keeps
        # the whole batch, with a recovery commit (FORMAT.md, "Write protocol")
        assert recovered == seen or (seen, recovered) == ("none", "all")
        s.gc()
        assert s.verify()["ok"]
    final = state(path)
    assert outcome(final[1], before[1]) == recovered
    if recovered == "none":  # gc() removed the orphans, and only them
        assert final[2] == before[2]


def outcome(records: dict[str, Any], before: dict[str, Any]) -> str:
    """``"none"`` when ``records`` are those of ``before``, ``"all"`` when they are those plus
    every record of the write (``r0001`` replaced); anything else fails."""
    if same(records, before):
        return "none"
    assert sorted(records) == sorted([*(f"r{i:04d}" for i in range(N_CRASH)), "keep"])
    assert same(records["keep"], before["keep"])
    assert all(same(records[f"r{i:04d}"], expected_new(i)) for i in range(N_CRASH))
    return "all"


def test_a_store_another_process_writes_is_refused_before_any_task_runs(tmp_path: Path) -> None:
    # the lock was found at the merge, after every task had run (a fresh user's trial)
    import subprocess
    import sys

    path = tmp_path / "held.lv"
    old_store(path)
    before = state(path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, lazyvault as lv\n"
            "s = lv.Store.open(sys.argv[1])\n"
            "s['held'] = {'n': 1}\n"
            "print('ready', flush=True)\n"
            "time.sleep(120)\n",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        bag = db.from_sequence(range(4), npartitions=2).map(never_run)
        with pytest.raises(lv.StoreLockedError, match=f"process {holder.pid}"):
            lazyvault.dask.write(bag, path, compute_kwargs={"scheduler": "threads"})
    finally:
        holder.kill()
        holder.communicate()  # waits, and closes its pipe
    assert shard_dirs(tmp_path) == [] and same_state(state(path), before)


def test_a_failed_write_commits_no_other_handles_changes(tmp_path: Path) -> None:
    # the early lock check took the writer role and its close committed what
    # another handle of this process had not flushed (a fresh user's trial)
    path = tmp_path / "t.lv"
    old_store(path)
    mine = lv.Store.open(path)
    try:
        mine["pending"] = {"x": np.ones(2)}
        bag = db.from_sequence(range(4), npartitions=2).map(never_run)
        with pytest.raises(AssertionError, match="a task ran"):
            lazyvault.dask.write(bag, path, compute_kwargs={"scheduler": "threads"})
        with lv.Store.open(path, "r") as reader:
            assert reader.version == 2 and "pending" not in reader
        assert "pending" in mine and shard_dirs(tmp_path) == []
    finally:
        mine.close()
