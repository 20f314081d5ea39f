"""``store.dataset()``: a map-style dataset that pickles by path, version and
query and opens the store in each worker (spawn and fork), pinned to the
commit it was made from."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv

METHODS = [m for m in ("spawn", "fork") if m in multiprocessing.get_all_start_methods()]
BIG = 20_000  # float64 elements: 160 KB, over 64 KiB, so memory-mapped


def fill(store: lv.Store, n: int = 8) -> None:
    store.update(
        {
            f"r{i}": {
                "i": i,
                "split": "train" if i % 2 else "test",
                "x": np.full(3, i),
                "big": (np.arange(BIG, dtype=np.float64) + i),
            }
            for i in range(n)
        }
    )
    store.flush()


def summary(item: dict[str, Any]) -> dict[str, Any]:
    """An item with its arrays as (sum, writeable, shape): comparable with ==."""
    return {
        k: (float(v.sum()), v.flags.writeable, v.shape) if isinstance(v, np.ndarray) else v
        for k, v in item.items()
    }


def mapped_files() -> set[str]:
    return {
        line.split(maxsplit=5)[5]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if len(line.split(maxsplit=5)) == 6
    }


# -- run in pool workers (module level: spawn imports them) ---------------------


def fetch(ds: lv.Dataset, i: int) -> tuple[dict[str, Any], int]:
    return summary(ds[i]), os.getpid()


_INHERITED: list[lv.Dataset] = []


def fetch_inherited(i: int) -> tuple[dict[str, Any], int]:
    """An item of a dataset the worker inherited by fork (opened in the parent)."""
    return summary(_INHERITED[0][i]), os.getpid()


# -- tests ---------------------------------------------------------------------------


def test_len_items_and_indexes(store: lv.Store) -> None:
    fill(store)
    ds = store.dataset()
    assert isinstance(ds, lv.Dataset)
    assert len(ds) == 8
    assert ds.keys() == [f"r{i}" for i in range(8)]
    item = ds[3]
    assert list(item) == ["key", "i", "split", "x", "big"]
    assert item["key"] == "r3" and item["i"] == 3 and item["split"] == "train"
    np.testing.assert_array_equal(item["x"], [3, 3, 3])
    assert summary(ds[-1]) == summary(ds[7])
    assert ds[-8]["key"] == "r0"
    assert ds[np.int64(2)]["key"] == "r2"  # any integer (operator.index)
    for bad in (8, -9, 100):
        with pytest.raises(IndexError, match="out of range for 8 records"):
            ds[bad]
    for not_int in ("r1", 1.0, slice(0, 2)):
        with pytest.raises(TypeError, match="indices are int"):
            ds[not_int]  # type: ignore[index]
    assert [it["key"] for it in ds] == ds.keys()  # iteration stops at IndexError


def test_query_and_fields(store: lv.Store) -> None:
    fill(store)
    ds = store.dataset("split == 'train' and i > 2", ["big", "i"])
    assert ds.keys() == ["r3", "r5", "r7"]
    item = ds[0]
    assert list(item) == ["key", "big", "i"]
    assert item["i"] == 3 and item["big"][0] == 3.0
    assert len(store.dataset("i > 100")) == 0
    assert list(store.dataset(fields=[])[0]) == ["key"]
    assert list(store.dataset(fields=("x", "x"))[0]) == ["key", "x"]  # duplicates once


def test_missing_field_names_record_and_field(store: lv.Store) -> None:
    fill(store, 2)
    store["r9"] = {"i": 9}  # no arrays
    store.flush()
    ds = store.dataset(fields=["i", "x"])
    assert ds[0]["i"] == 0
    with pytest.raises(KeyError, match="record 'r9' has no field 'x'"):
        ds[2]


def test_arrays_are_read_only_and_large_ones_mapped(store_path: Path) -> None:
    with lv.Store.open(store_path) as store:
        fill(store, 2)
        ds = store.dataset()
    item = ds[1]  # the store is closed: the dataset has its own reader
    for name in ("x", "big"):
        assert not item[name].flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            item[name][0] = 1
    assert any(p.startswith(str(store_path.resolve())) for p in mapped_files())
    assert item["big"][-1] == BIG


def test_a_metadata_field_named_key(store: lv.Store) -> None:
    store["a"] = {"key": "mine", "v": 1}
    store.flush()
    with pytest.raises(ValueError, match="record 'a' has a metadata field 'key'"):
        store.dataset()[0]
    assert store.dataset(fields=["v"])[0] == {"key": "a", "v": 1}
    with pytest.raises(ValueError, match="'key' is the record's key"):
        store.dataset(fields=["key"])


def test_bad_arguments(store: lv.Store) -> None:
    fill(store, 2)
    with pytest.raises(lv.QueryError) as e:
        store.dataset("i >")
    assert e.value.column == 4
    for fields in ("i", ["i", 3], {"i": 1}, 7):
        with pytest.raises(TypeError, match="fields is a list of str"):
            store.dataset(fields=fields)  # type: ignore[arg-type]
    for query in (lambda r: True, 3, b"i > 1"):
        with pytest.raises(TypeError, match="query is a str"):
            store.dataset(query)  # type: ignore[arg-type]


def test_writer_without_a_commit_and_unflushed_changes(store_path: Path) -> None:
    with lv.Store.open(store_path) as store:
        store["a"] = {"v": 1}
        with pytest.raises(lv.LazyvaultError, match=r"no commit yet: .*flush"):
            store.dataset()
        store.flush()
        store["b"] = {"v": 2}  # not flushed: not in a dataset made now
        ds = store.dataset()
        assert ds.keys() == ["a"] and ds.version == 1
    store = lv.Store.open(store_path)
    store.close()
    with pytest.raises(lv.ClosedError):
        store.dataset()


def test_pickles_small_without_keys(store: lv.Store) -> None:
    store.update({f"record-{i:06d}": {"i": i, "a": np.arange(4)} for i in range(2000)})
    store.flush()
    ds = store.dataset("i >= 10", ["a", "i"])
    data = pickle.dumps(ds)
    assert len(data) < 1024
    assert b"record-" not in data  # the query travels, not the keys
    back = pickle.loads(data)
    assert len(back) == 1990  # len opens nothing
    assert summary(back[5]) == summary(ds[5]) and back[5]["key"] == "record-000015"
    assert back.keys() == ds.keys()
    assert repr(back) == repr(ds)
    assert f"version={store.version}" in repr(ds) and "records=1990" in repr(ds)


@pytest.mark.parametrize("method", METHODS)
def test_pool_workers_give_the_local_items(store: lv.Store, method: str) -> None:
    fill(store)
    ds = store.dataset("i >= 2")
    local = [summary(ds[i]) for i in range(len(ds))]
    with multiprocessing.get_context(method).Pool(2) as pool:
        got = pool.starmap(fetch, [(ds, i) for i in range(len(ds))])
    assert [g[0] for g in got] == local
    assert os.getpid() not in {g[1] for g in got}


def test_forked_workers_reopen_an_inherited_dataset(store: lv.Store) -> None:
    if "fork" not in METHODS:
        pytest.skip("no fork start method")
    fill(store)
    ds = store.dataset(fields=["i", "big"])
    local = [summary(ds[i]) for i in range(len(ds))]  # opened here before the fork
    _INHERITED[:] = [ds]
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            got = pool.map(fetch_inherited, range(len(ds)))
    finally:
        _INHERITED.clear()
    assert [g[0] for g in got] == local
    assert os.getpid() not in {g[1] for g in got}
    # the children dropped their copies of the parent's reader: it still pins its version
    store.update({f"r{i}": {"i": -i} for i in range(8)})
    store.flush()
    store.gc()
    assert [summary(ds[i]) for i in range(len(ds))] == local


@pytest.mark.parametrize("method", METHODS)
def test_later_commits_change_nothing(store: lv.Store, method: str) -> None:
    fill(store, 4)
    ds = store.dataset("i >= 1")
    before = [summary(ds[i]) for i in range(len(ds))]
    pickled = pickle.dumps(ds)
    for i in range(4):
        store[f"r{i}"] = {"i": i + 10, "x": np.zeros(3), "big": np.zeros(BIG)}
    store["r0b"] = {"i": 5}
    del store["r3"]
    store.flush()
    store.gc()  # the dataset's commit stays readable: its reader pins it
    assert [summary(ds[i]) for i in range(len(ds))] == before
    assert [summary(item) for item in pickle.loads(pickled)] == before
    with multiprocessing.get_context(method).Pool(2) as pool:
        got = pool.starmap(fetch, [(ds, i) for i in range(len(ds))])
    assert [g[0] for g in got] == before
    assert store.dataset("i >= 1").keys() == ["r0", "r0b", "r1", "r2"]


def test_object_arrays_follow_allow_pickle(store_path: Path) -> None:
    with lv.Store.open(store_path) as store:
        store["o"] = {"objs": np.array([{"a": 1}, None], dtype=object)}
    with lv.Store.open(store_path, "r") as reader:
        with pytest.raises(lv.PickleNotAllowedError):
            reader.dataset()[0]
    with lv.Store.open(store_path, "r", allow_pickle=True) as reader:
        back = pickle.loads(pickle.dumps(reader.dataset()))
    assert back[0]["objs"][0] == {"a": 1}


def test_archive_dataset(store: lv.Store, tmp_path: Path) -> None:
    fill(store, 3)
    path = tmp_path / "a.lvz"
    store.export(path)
    with lv.Store.open(path) as archive:
        ds = archive.dataset("i > 0", ["i", "x"])
    assert ds.version is None and ds.keys() == ["r1", "r2"]
    back = pickle.loads(pickle.dumps(ds))
    assert summary(back[1]) == summary(ds[1]) == {"key": "r2", "i": 2, "x": (6.0, False, (3,))}
    # the file replaced by one with other records: a worker says so
    pickled = pickle.dumps(ds)
    del store["r2"]
    store.flush()
    store.export(tmp_path / "b.lvz")
    os.replace(tmp_path / "b.lvz", path)
    with pytest.raises(lv.LazyvaultError, match="now has 1 matching records, not the 2"):
        pickle.loads(pickled)[0]
    with pytest.raises(TypeError, match="opened by path"):
        lv.Archive(lv._lazyvault.ArchiveCore.from_buffer(lv.dumps({"a": 1}))).dataset()


def test_torch_dataloader(store: lv.Store) -> None:
    torch = pytest.importorskip("torch")
    fill(store)
    ds = store.dataset(fields=["i", "x"])
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2)
    batches = list(loader)
    assert [b["key"] for b in batches] == [["r0", "r1", "r2"], ["r3", "r4", "r5"], ["r6", "r7"]]
    assert torch.cat([b["i"] for b in batches]).tolist() == list(range(8))
    assert batches[1]["x"].shape == (3, 3) and batches[1]["x"][2, 0].item() == 5


def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "Training loaders" example runs as written and says what is true."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Training loaders", 1)[1]
    block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(block, "README.md", "exec"), namespace)
    train, items = namespace["train"], namespace["items"]
    assert len(train) == 80
    assert list(train[0]) == ["key", "image", "label"]
    assert train[0]["key"] == "s001" and train[0]["label"] == 1
    assert len(pickle.dumps(train)) < 512
    assert [it["key"] for it in items] == ["s001", "s002", "s003", "s004"]
    assert [float(it["image"][0, 0]) for it in items] == [1.0, 2.0, 3.0, 4.0]


def test_opens_at_the_first_item_not_when_unpickled(store_path: Path, tmp_path: Path) -> None:
    with lv.Store.open(store_path) as store:
        fill(store, 3)
        data = pickle.dumps(store.dataset("i > 0"))
    moved = tmp_path / "elsewhere.lv"
    store_path.rename(moved)
    back = pickle.loads(data)  # nothing opened: unpickling cannot fail
    assert len(back) == 2
    with pytest.raises(lv.StoreNotFoundError):
        back[0]
    moved.rename(store_path)
    assert back[1]["key"] == "r2"  # a failed open is tried again


def test_a_version_no_longer_kept_says_to_make_a_new_dataset(store: lv.Store) -> None:
    fill(store, 3)
    pickled = pickle.dumps(store.dataset())  # the dataset dropped: nothing pins version 1
    gc.collect()
    for i in range(3):
        store[f"r{i}"] = {"i": -i, "x": np.zeros(3), "big": np.zeros(BIG)}
    store.flush()  # removes version 1's payloads; its journal entries stay (no gc)
    back = pickle.loads(pickled)
    with pytest.raises(lv.CorruptError) as e:
        back[0]
    message = str(e.value)
    assert "record 'r0' array" in message and "file is missing" in message
    assert "make a new dataset" in message and "version 1" in message
    assert "refresh" not in message
    assert e.value.key == "r0" and e.value.path is not None
    del back, e  # its reader pinned version 1
    gc.collect()
    store.gc()  # version 1 itself goes
    with pytest.raises(lv.CorruptError) as e:
        pickle.loads(pickled)[0]
    message = str(e.value)
    assert "version 1, which is no longer kept" in message and "make a new dataset" in message
    assert "open the store again" not in message


def test_a_moved_store_says_to_make_a_new_dataset(store_path: Path, tmp_path: Path) -> None:
    with lv.Store.open(store_path) as store:
        fill(store, 2)
        pickled = pickle.dumps(store.dataset())
    store_path.rename(tmp_path / "moved.lv")
    with pytest.raises(lv.StoreNotFoundError) as e:
        pickle.loads(pickled)[0]
    assert "make a new dataset from it where it is now" in str(e.value)
    assert e.value.path == str(store_path.resolve())
