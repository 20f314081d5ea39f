"""``to_dask_array``, ``to_dask_dataframe``, ``to_dask_bag``: lazy dask collections of a store's
records at one commit, computed here on a real ``distributed`` cluster of two worker processes."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv

from conftest import stored_files as payload_files

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
pd = pytest.importorskip("pandas")

BIG_ELEMENTS = 131_072  # float64: 1 MiB


@dataclasses.dataclass
class Point:
    x: int
    y: int


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """Two worker processes, one thread each; every compute() of the module runs there."""
    with (
        distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


def fill(store: lv.Store, n: int = 10, shape: tuple[int, ...] = (3, 4)) -> None:
    store.update(
        {
            f"r{i:02d}": {
                "i": i,
                "even": i % 2 == 0,
                "x": np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + i,
            }
            for i in range(n)
        }
    )
    store.flush()


def local_stack(store: lv.Handle, name: str, query: str | None = None) -> np.ndarray:
    keys = list(store) if query is None else store.keys(query)
    return np.stack([store[k].array(name) for k in keys])


# -- to_dask_array ------------------------------------------------------------------


def test_array_computes_the_stack_of_the_records(store: lv.Store, client: Any) -> None:
    fill(store)
    arr = store.to_dask_array("x")
    assert isinstance(arr, da.Array)
    assert arr.shape == (10, 3, 4) and arr.dtype == np.float32
    got = arr.compute()
    np.testing.assert_array_equal(got, local_stack(store, "x"))
    assert got.dtype == np.float32
    assert float(arr.sum().compute()) == float(local_stack(store, "x").sum())
    even = store.to_dask_array("x", "even == true")
    assert even.shape == (5, 3, 4)
    np.testing.assert_array_equal(even.compute(), local_stack(store, "x", "even == true"))
    np.testing.assert_array_equal(even[1:3, 2].compute(), local_stack(store, "x")[2:6:2, 2])


def test_array_chunks(store: lv.Store, client: Any) -> None:
    fill(store)  # 48 bytes an array
    assert store.to_dask_array("x").chunks == ((10,), (3,), (4,))  # 128 MiB: one chunk
    with dask.config.set({"array.chunk-size": "100B"}):
        arr = store.to_dask_array("x")
    assert arr.chunks == ((2, 2, 2, 2, 2), (3,), (4,))
    np.testing.assert_array_equal(arr.compute(), local_stack(store, "x"))
    with dask.config.set({"array.chunk-size": "10B"}):  # under one array: one record a chunk
        assert store.to_dask_array("x").chunks[0] == (1,) * 10
    arr = store.to_dask_array("x", chunks=3)
    assert arr.chunks[0] == (3, 3, 3, 1)
    np.testing.assert_array_equal(arr.compute(), local_stack(store, "x"))
    arr = store.to_dask_array("x", chunks=[6, 4])
    assert arr.chunks[0] == (6, 4)
    np.testing.assert_array_equal(arr.compute(), local_stack(store, "x"))


def test_array_runs_on_both_workers(store: lv.Store, client: Any) -> None:
    fill(store, 16)
    arr = store.to_dask_array("x", chunks=1)
    with distributed.get_task_stream(client) as stream:
        (arr + 0).sum().compute()
    workers = {t["worker"] for t in stream.data if t["key"][0].startswith("lazyvault-array-")}
    assert len(workers) == 2
    pids = set(client.run(os.getpid).values())
    assert len(pids) == 2 and os.getpid() not in pids


def test_array_records_that_differ(store: lv.Store) -> None:
    fill(store, 4)
    store["r02"] = {"i": 2, "x": np.zeros((3, 4), np.float64)}
    store.flush()
    with pytest.raises(
        ValueError,
        match=r"record 'r02' array 'x' has dtype float64, not the "
        r"dtype float32 of the first record 'r00'",
    ):
        store.to_dask_array("x")
    store["r02"] = {"i": 2, "x": np.zeros((4, 3), np.float32)}
    store.flush()
    with pytest.raises(
        ValueError,
        match=r"record 'r02' array 'x' has shape \(4, 3\), not the "
        r"shape \(3, 4\) of the first record 'r00'",
    ):
        store.to_dask_array("x")
    store["r03"] = {"i": 3}
    store.flush()
    with pytest.raises(ValueError, match="record 'r03' has no array 'x'"):
        store.to_dask_array("x", "i != 2")
    with pytest.raises(ValueError, match=r"no record .* matches 'i > 100'"):
        store.to_dask_array("x", "i > 100")
    np.testing.assert_array_equal(
        store.to_dask_array("x", "i < 2").compute(),
        local_stack(store, "x", "i < 2"),
    )
    store["o"] = {"kind": "o", "x": np.array([None, 1], dtype=object)}
    store.flush()
    with pytest.raises(ValueError, match="record 'o' array 'x' is an object array"):
        store.to_dask_array("x", "kind == 'o'")


def test_array_building_opens_no_payload(store: lv.Store, store_path: Path, client: Any) -> None:
    fill(store, 4)
    for path in payload_files(store_path):
        path.unlink()
    arr = store.to_dask_array("x", chunks=2)  # the index only
    assert arr.shape == (4, 3, 4)
    with pytest.raises(
        lv.CorruptError, match=r"record 'r0\d' array 'x'.*file is missing.*make a new dask array"
    ):
        arr.compute()


def _walk(obj: Any) -> Iterator[Any]:
    yield obj
    if isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _walk(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _walk(item)


def test_array_graph_is_small_and_holds_no_handle(store: lv.Store) -> None:
    store.update({f"r{i:03d}": {"x": np.full(20_000, i)} for i in range(100)})  # 160 KB each
    store.flush()
    arr = store.to_dask_array("x", chunks=10)
    graph = dict(arr.__dask_graph__())
    assert len(graph) == 10
    data = pickle.dumps(graph)
    assert len(data) < 10 * 400 + 600
    assert b"StoreCore" not in data and b"_DeferredCore" not in data
    back = pickle.loads(data)
    for task in back.values():
        for part in _walk(task):
            assert not isinstance(part, (np.ndarray, lv.Store, lv.Archive))
    sources = {type(part).__name__ for t in graph.values() for part in _walk(t)}
    assert "PinnedSource" in sources and "Store" not in sources


def test_array_of_a_writer_is_its_last_commit(store_path: Path, client: Any) -> None:
    with lv.Store.open(store_path) as store:
        store["a"] = {"x": np.zeros(3)}
        with pytest.raises(lv.LazyvaultError, match=r"no commit yet: .*flush"):
            store.to_dask_array("x")
        store.flush()
        store["a"] = {"x": np.ones(3)}  # unflushed: not in the array
        store["b"] = {"x": np.ones(3)}
        arr = store.to_dask_array("x")
        assert arr.shape == (1, 3)
        np.testing.assert_array_equal(arr.compute(), [[0, 0, 0]])
    with pytest.raises(lv.ClosedError):
        store.to_dask_array("x")


def test_array_fortran_order_and_byte_orders(store: lv.Store, client: Any) -> None:
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    store.update(
        {
            f"f{i}": {"f": np.asfortranarray(base + i), "b": (base + i).astype(">i4")}
            for i in range(3)
        }
    )
    store.flush()
    f = store.to_dask_array("f", chunks=2).compute()
    np.testing.assert_array_equal(f, [base + i for i in range(3)])
    b = store.to_dask_array("b", chunks=2)
    assert b.dtype == np.dtype(">i4")
    got = b.compute()
    assert got.dtype == np.dtype(">i4")
    np.testing.assert_array_equal(got, [base + i for i in range(3)])


def test_array_of_an_archive(store: lv.Store, tmp_path: Path, client: Any) -> None:
    fill(store, 5)
    path = tmp_path / "a.lvz"
    store.export(path)
    with lv.Store.open(path) as archive:
        arr = archive.to_dask_array("x", "i >= 1", chunks=2)
        expected = local_stack(archive, "x", "i >= 1")
    np.testing.assert_array_equal(arr.compute(), expected)


def test_array_bad_arguments(store: lv.Store) -> None:
    fill(store, 3)
    for name in (None, 3, b"x"):
        with pytest.raises(TypeError, match="array name is a str"):
            store.to_dask_array(name)  # type: ignore[arg-type]
    for query in (3, lambda r: True):
        with pytest.raises(TypeError, match="query is a str"):
            store.to_dask_array("x", query)  # type: ignore[arg-type]
    with pytest.raises(lv.QueryError):
        store.to_dask_array("x", "i >")
    for chunks in (0, -2, [1, 1], [3, 0]):
        with pytest.raises(ValueError, match="chunks"):
            store.to_dask_array("x", chunks=chunks)  # type: ignore[arg-type]
    for chunks in (True, 1.5, "2", [1.0, 2.0]):
        with pytest.raises(TypeError, match="chunks is an int"):
            store.to_dask_array("x", chunks=chunks)  # type: ignore[arg-type]
    store.close()
    with pytest.raises(lv.ClosedError):
        store.to_dask_array("x")


def test_array_pinned_against_later_commits(store: lv.Store, client: Any) -> None:
    fill(store, 6)
    before = local_stack(store, "x")
    arr = store.to_dask_array("x", chunks=2)
    for i in range(3):
        store[f"r{i:02d}"] = {"i": -i, "x": np.full((3, 4), -1, np.float32)}
    del store["r05"]
    store["r99"] = {"i": 99, "x": np.zeros((3, 4), np.float32)}
    store.flush()
    store.gc()
    np.testing.assert_array_equal(arr.compute(), before)
    assert store.to_dask_array("x").shape == (6, 3, 4)


# -- to_dask_dataframe ----------------------------------------------------------------


def mixed(store: lv.Store) -> None:
    """Records whose fields differ: missing fields, ints and floats, strings, datetimes, dates,
    nested fields, lists, arrays."""
    utc = dt.UTC
    store.update(
        {
            f"k{i:02d}": {
                "i": i,
                **({"f": 1.5 * i} if i % 3 else {"f": i}),  # ints and floats in one column
                **({"s": f"s{i}"} if i % 4 else {}),
                **({"t": dt.datetime(2024, 1, 1 + i, 12, tzinfo=utc)} if i < 9 else {}),
                **({"d": dt.date(2023, 5, 1 + i)} if i % 2 else {}),
                "params": {"lr": 0.1 * i} if i > 2 else {},
                **({"flag": i % 2 == 0} if i % 5 else {}),
                **({"tags": [i, "x"]} if i == 7 else {}),
                **({"x": np.zeros((2, i))} if i % 6 else {}),
            }
            for i in range(14)
        }
    )
    store.flush()


def local_frame(store: lv.Handle, query: str | None = None) -> pd.DataFrame:
    """``to_pandas``: what the dask dataframe computes to."""
    return store.to_pandas(query)


def test_dataframe_computes_to_pandas(store: lv.Store, client: Any) -> None:
    mixed(store)
    expected = local_frame(store)
    assert {"i", "f", "s", "t", "d", "params.lr", "flag", "tags", "x.shape", "x.dtype"} <= set(
        expected.columns
    )
    assert expected["f"].dtype == np.float64 and expected["i"].dtype == np.int64
    for n in (1, 2, 3, 5, 14):
        ddf = store.to_dask_dataframe(npartitions=n)
        assert ddf.npartitions == n
        assert list(ddf.columns) == list(expected.columns)
        pd.testing.assert_frame_equal(ddf.compute(), expected)
    ddf = store.to_dask_dataframe("i >= 4", npartitions=3)
    pd.testing.assert_frame_equal(ddf.compute(), local_frame(store, "i >= 4"))
    assert store.to_dask_dataframe(npartitions=100).npartitions == 14  # at most one per record
    assert store.to_dask_dataframe().npartitions == 1  # one per 1,000 records


def test_dataframe_divisions_and_loc(store: lv.Store, client: Any) -> None:
    mixed(store)
    ddf = store.to_dask_dataframe(npartitions=4)  # 14 records: 3, 4, 3, 4
    assert ddf.divisions == ("k00", "k03", "k07", "k10", "k13")
    assert ddf.known_divisions
    row = ddf.loc["k08"].compute()
    pd.testing.assert_frame_equal(row, local_frame(store).loc[["k08"]])
    part = ddf.loc["k05":"k09"].compute()
    assert part.index.tolist() == [f"k{i:02d}" for i in range(5, 10)]
    assert ddf["i"].sum().compute() == sum(range(14))


def test_dataframe_of_an_archive_and_of_nothing(store: lv.Store, tmp_path: Path) -> None:
    mixed(store)
    path = tmp_path / "a.lvz"
    store.export(path, keys=["k09", "k01", "k04"])  # archive order: not sorted
    with lv.Store.open(path) as archive:
        ddf = archive.to_dask_dataframe(npartitions=2)
        expected = local_frame(archive)
    assert not ddf.known_divisions
    pd.testing.assert_frame_equal(ddf.compute(), expected)
    assert expected.index.tolist() == ["k09", "k01", "k04"]
    empty = store.to_dask_dataframe("i > 100")
    assert len(empty.compute()) == 0


def test_dataframe_bad_arguments(store: lv.Store) -> None:
    mixed(store)
    for query in (3, lambda r: True):
        with pytest.raises(TypeError, match="query is a str"):
            store.to_dask_dataframe(query)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="query is a str"):
            store.to_dask_bag(query)  # type: ignore[arg-type]
    for bad in (1.5, "2", True):
        with pytest.raises(TypeError, match="npartitions is an int"):
            store.to_dask_dataframe(npartitions=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="npartitions is an int"):
            store.to_dask_bag(npartitions=bad)  # type: ignore[arg-type]
    for bad in (0, -1):
        with pytest.raises(ValueError, match="npartitions is at least 1"):
            store.to_dask_dataframe(npartitions=bad)
        with pytest.raises(ValueError, match="npartitions is at least 1"):
            store.to_dask_bag(npartitions=bad)
    with pytest.raises(lv.QueryError):
        store.to_dask_dataframe("i >")
    store.close()
    with pytest.raises(lv.ClosedError):
        store.to_dask_dataframe()
    with pytest.raises(lv.ClosedError):
        store.to_dask_bag()


def test_dataframe_pinned_against_later_commits(store: lv.Store, client: Any) -> None:
    mixed(store)
    before = local_frame(store)
    ddf = store.to_dask_dataframe(npartitions=3)
    store["k00"] = {"i": 100, "other": "new"}
    del store["k05"]
    store["k99"] = {"i": 99}
    store.flush()
    store.gc()
    pd.testing.assert_frame_equal(ddf.compute(), before)


# -- to_dask_bag ---------------------------------------------------------------------


def test_bag_gives_the_records(store: lv.Store, client: Any) -> None:
    fill(store, 7)
    store["r03"] = {"i": 3, "big": np.arange(BIG_ELEMENTS, dtype=np.float64), "obj": Point(1, 2)}
    store.flush()
    bag = store.to_dask_bag("i >= 1", npartitions=3)
    assert bag.npartitions == 3
    records = bag.compute()
    local = store.find("i >= 1")
    assert [r.key for r in records] == local.keys()
    for got, want in zip(records, local, strict=True):
        assert isinstance(got, lv.Record)
        assert got.meta == want.meta
        assert got.arrays == want.arrays
        for name in got.arrays:
            np.testing.assert_array_equal(got.array(name), want.array(name))
    assert bag.map(lambda r: r.meta["i"]).sum().compute() == sum(range(1, 7))
    assert bag.filter(lambda r: "big" in r.arrays).map(lambda r: float(r.big.sum())).compute() == [
        float(np.arange(BIG_ELEMENTS).sum())
    ]


def test_bag_records_pickle_by_reference(store: lv.Store, client: Any) -> None:
    store["big"] = {"i": 1, "a": np.ones(BIG_ELEMENTS)}  # 1 MB
    store.flush()
    (rec,) = store.to_dask_bag().compute()  # came back from a worker by reference
    data = pickle.dumps(rec, protocol=5)
    assert len(data) < 2000
    back = pickle.loads(data)
    assert back.key == "big" and back.meta == {"i": 1}
    np.testing.assert_array_equal(back.a, np.ones(BIG_ELEMENTS))
    assert len(pickle.dumps(back)) < 2000  # by reference again
    # an ordinary record (and a RecordRef's) still pickles by value
    assert len(pickle.dumps(store["big"], protocol=5)) > 8 * BIG_ELEMENTS
    assert len(pickle.dumps(store["big"].ref().open())) > 8 * BIG_ELEMENTS
    # a bag of records read on the workers, summed there: no array moves
    bag = store.to_dask_bag()
    assert bag.map(lambda r: float(r.a.sum())).compute() == [float(BIG_ELEMENTS)]


def test_bag_of_an_archive_pickles_by_value(store: lv.Store, tmp_path: Path) -> None:
    fill(store, 3)
    path = tmp_path / "a.lvz"
    store.export(path)
    with lv.Store.open(path) as archive:
        records = archive.to_dask_bag(npartitions=2).compute()
        assert [r.key for r in records] == list(archive)
    back = pickle.loads(pickle.dumps(records[1]))
    np.testing.assert_array_equal(back.x, local_stack(store, "x")[1])


def test_bag_pinned_against_later_commits(store: lv.Store, client: Any) -> None:
    fill(store, 4)
    bag = store.to_dask_bag(npartitions=2).map(lambda r: (r.key, r.meta["i"], float(r.x.sum())))
    before = [(k, store[k].meta["i"], float(store[k].x.sum())) for k in store]
    for i in range(4):
        store[f"r{i:02d}"] = {"i": -i, "x": np.zeros((3, 4), np.float32)}
    del store["r01"]
    store["r50"] = {"i": 50, "x": np.zeros((3, 4), np.float32)}
    store.flush()
    store.gc()
    assert bag.compute() == before


def test_without_dask_says_how_to_install_it(
    store: lv.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(store, 2)
    monkeypatch.setitem(sys.modules, "dask", None)  # import dask raises ImportError
    calls = {
        "to_dask_array": lambda: store.to_dask_array("x"),
        "to_dask_dataframe": store.to_dask_dataframe,
        "to_dask_bag": store.to_dask_bag,
    }
    for what, call in calls.items():
        with pytest.raises(ModuleNotFoundError, match=rf"{what}\(\) needs dask") as e:
            call()
        assert "pip install 'lazyvault[dask]'" in str(e.value) and e.value.name == "dask"


def test_the_first_record_that_differs_in_key_order_is_named(store: lv.Store) -> None:
    # a record lacking the array was named before an earlier one of another
    # dtype; mixed byte order was shown as "float64, not float64" (a fresh
    # user's trial)
    fill(store, 3)
    store["r01"] = {"x": np.zeros((3, 4), ">f4")}
    store["r02"] = {"i": 2}
    store.flush()
    with pytest.raises(ValueError, match=r"record 'r01' array 'x' has dtype >f4, not the.* <f4"):
        store.to_dask_array("x")


def test_a_store_moved_after_the_array_was_made_is_not_found(
    store: lv.Store, tmp_path: Path
) -> None:
    # the local scheduler blamed the writer's cleanup of an old version (a
    # fresh user's trial)
    fill(store, 4)
    arr = store.to_dask_array("x")
    store.close()
    os.rename(store.path, tmp_path / "moved.lv")
    with pytest.raises(lv.StoreNotFoundError, match="moved or removed since this dask array"):
        arr.compute(scheduler="sync")
