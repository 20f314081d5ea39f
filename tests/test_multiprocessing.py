"""Records crossing process boundaries with a real multiprocessing.Pool:
by reference (the child maps the same payload files, no index, no lock)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv
from lazyvault._source import DirectorySource

METHODS = [m for m in ("spawn", "fork") if m in multiprocessing.get_all_start_methods()]


def payload_path(store_path: Path, rec: lv.Record, name: str) -> str:
    (path,) = (store_path / "arrays").glob(f"*/{rec._record['arrays'][name]['id']}.npy")
    return str(path.resolve())


def is_mapping_of(array: np.ndarray, path: str) -> bool:
    """Whether ``array``'s data lies in a mapping of file ``path`` in this
    process (``/proc/self/maps``)."""
    address = array.__array_interface__["data"][0]
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == path:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return True
    return False


# -- functions run in the pool's children (module level: spawn imports them) --


def summarize(rec: lv.Record) -> tuple[float, dict[str, Any], str, int]:
    return float(rec.image.sum()), rec.meta, type(rec._source).__name__, os.getpid()


def mapped_in_child(rec: lv.Record, path: str) -> tuple[bool, str, bool, int]:
    big = rec.big
    return (
        is_mapping_of(big, path),
        type(rec._source).__name__,
        big.flags.writeable,
        int(big[-1]),
    )


def load_remainder(rec: lv.Record) -> Any:
    return rec.load()["extra"]


def open_ref(ref: lv.RecordRef, path: str) -> tuple[bool, float]:
    rec = ref.open()
    return is_mapping_of(rec.image, path), float(rec.image.sum())


def read_store(store: lv.Store) -> tuple[list[str], int, str, int]:
    """What a worker sees of a pickled Store: keys, version, mode, the sum
    of k's array."""
    return sorted(store), store.version, store.mode, int(store["k"].a.sum())


def read_then_refresh(pickled: bytes) -> tuple[list[str], int, int, list[str]]:
    """Keys and version of a Store pickled earlier, then refresh() and the keys."""
    store = pickle.loads(pickled)
    keys, version = sorted(store), store.version
    return keys, version, store.refresh(), sorted(store)


def echo(rec: lv.Record) -> lv.Record:
    return rec


def from_queue(inbox: Any, outbox: Any, path: str) -> None:
    rec = inbox.get()
    outbox.put((is_mapping_of(rec.image, path), float(rec.image.sum()), rec))


# -- tests ----------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_pool_map_over_records(store_path: Path, method: str) -> None:
    with lv.Store.open(store_path) as store:
        for i in range(6):
            store[f"r{i}"] = {"i": i, "name": f"run {i}", "image": np.full((100, 100), i)}
        store.flush()
        records = list(store.values())
        with multiprocessing.get_context(method).Pool(2) as pool:
            results = pool.map(summarize, records)
        assert [r[0] for r in results] == [10_000.0 * i for i in range(6)]
        assert [r[1] for r in results] == [{"i": i, "name": f"run {i}"} for i in range(6)]
        assert {r[2] for r in results} == {"DirectorySource"}
        assert os.getpid() not in {r[3] for r in results}
        # the parent's store is still fine (never touched by the children)
        store["after"] = {"v": 1}
        assert len(store) == 7


@pytest.mark.parametrize("method", METHODS)
def test_records_travel_by_reference(store_path: Path, method: str) -> None:
    n = 10 * 2**20 // 8  # 10 MiB
    with lv.Store.open(store_path, allow_pickle=True) as store:
        store["k"] = {"big": np.arange(n, dtype=np.int64), "extra": {1, 2}, "m": 1}
        store.flush()
        rec = store["k"]
        path = payload_path(store_path, rec, "big")
        data = bytes(ForkingPickler.dumps(rec))
        assert len(data) < 4096
        # by reference, not by value: no array data in it
        assert len(pickle.dumps(rec, protocol=4)) > n * 8
        same = pickle.loads(data)
        assert isinstance(same._source, DirectorySource) and same.store is None
        assert np.shares_memory(same.big, rec.big) is False  # a second mapping
        assert is_mapping_of(same.big, path)
        with multiprocessing.get_context(method).Pool(2) as pool:
            mapped, source, writeable, last = pool.apply(mapped_in_child, (rec, path))
            extra = pool.apply(load_remainder, (rec,))
            back = pool.apply(echo, (rec,))  # and back again, by reference
        assert (mapped, source, writeable, last) == (True, "DirectorySource", False, n - 1)
        assert extra == {1, 2}
        assert isinstance(back._source, DirectorySource)
        assert back._record == rec._record and back.big[-1] == n - 1


@pytest.mark.parametrize("method", METHODS)
def test_record_ref_in_a_pool(store_path: Path, method: str) -> None:
    with lv.Store.open(store_path) as store:
        store["k"] = {"image": np.ones((300, 300))}
        rec = store["k"]
        path = payload_path(store_path, rec, "image")
        ref = rec.ref()
        assert len(pickle.dumps(ref)) < 1024
        with multiprocessing.get_context(method).Pool(2) as pool:
            assert pool.apply(open_ref, (ref, path)) == (True, 90_000.0)


@pytest.mark.parametrize("method", METHODS)
def test_records_through_queues(store_path: Path, method: str) -> None:
    ctx = multiprocessing.get_context(method)
    with lv.Store.open(store_path) as store:
        store["k"] = {"image": np.full((500, 500), 2.0)}
        rec = store["k"]
        path = payload_path(store_path, rec, "image")
        inbox, outbox = ctx.Queue(), ctx.Queue()
        child = ctx.Process(target=from_queue, args=(inbox, outbox, path))
        child.start()
        try:
            inbox.put(rec)
            mapped, total, back = outbox.get(timeout=15)
        finally:
            child.join(timeout=15)
        assert child.exitcode == 0
        assert (mapped, total) == (True, 500_000.0)
        assert isinstance(back._source, DirectorySource) and is_mapping_of(back.image, path)


def test_by_value_records_travel_by_value(store_path: Path) -> None:
    with lv.Store.open(store_path) as store:
        store["k"] = {"image": np.arange(1000.0)}
        by_value = pickle.loads(pickle.dumps(store["k"], protocol=5))
    # no store behind it any more: through multiprocessing it is sent whole
    data = bytes(ForkingPickler.dumps(by_value))
    assert len(data) > 8000
    back = pickle.loads(data)
    assert back.image.tolist() == list(np.arange(1000.0)) and not back.image.flags.writeable
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        total, meta, source, _ = pool.apply(summarize, (by_value,))
    assert (total, meta, source) == (499_500.0, {}, "MemorySource")


def test_passing_an_open_store_to_a_pool_reads_at_the_senders_version(tmp_path: Path) -> None:
    # found by a break-it trial: the worker died unpickling the Store (lock
    # held by the parent) and Pool.map waited forever; now a pickled Store is
    # a reader of the sender's version, so the worker reads
    store = lv.Store.open(tmp_path / "held.lv")
    store["k"] = {"v": 1, "a": np.arange(5)}
    store.flush()
    store["unflushed"] = {"v": 2}  # not committed: not in the sender's version
    try:
        sent_version = store.version
        pickled = pickle.dumps(store)
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            result = pool.map_async(read_store, [store])
            assert result.get(timeout=60) == [(["k"], sent_version, "r", 10)]
            store.flush()  # a new commit after pickling
            assert store.version > sent_version
            got = pool.apply_async(read_then_refresh, (pickled,)).get(timeout=60)
        assert got == (["k"], sent_version, store.version, ["k", "unflushed"])
    finally:
        store.close()
