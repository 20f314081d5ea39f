"""Pickling records (by value, PEP 574 out-of-band buffers), RecordRef, Store."""

from __future__ import annotations

import dataclasses
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv
from lazyvault._source import DirectorySource, MemorySource

PROTOCOLS = list(range(pickle.HIGHEST_PROTOCOL + 1))


def payload_path(store_path: Path, rec: lv.Record, name: str) -> Path:
    """The payload file of array ``name`` of ``rec``."""
    (path,) = (store_path / "arrays").glob(f"*/{rec._record['arrays'][name]['id']}.npy")
    return path


def mapping_rss_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path`` (/proc/self/smaps)."""
    target, total, inside = str(path.resolve()), 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:  # a mapping header line
            inside = len(head) >= 6 and " ".join(head[5:]) == target
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def assert_same_value(a: Any, b: Any) -> None:
    """Deep equality of loaded objects, arrays compared by dtype, shape, content."""
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same_value(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_value(x, y)
    else:
        assert a == b


def assert_same_record(a: lv.Record, b: lv.Record) -> None:
    assert b.key == a.key
    assert b.meta == a.meta
    assert b.arrays == a.arrays
    # by value, the random payload ids are blanked and packs dropped (they mean nothing there)
    ids = {name: "0" * 32 for name in a._record["arrays"]}
    place = ("pack", "pack_offset")
    want = {
        **a._record,
        "arrays": {
            n: {**{f: v for f, v in e.items() if f not in place}, "id": ids[n]}
            for n, e in a._record["arrays"].items()
        },
    }
    assert b._record in (a._record, want)
    for name in a.arrays:
        x, y = a.array(name), b.array(name)
        assert type(y) is np.ndarray
        assert_same_value(x, y)
        assert not y.flags.writeable
        assert y.flags.c_contiguous == x.flags.c_contiguous
        assert y.flags.f_contiguous == x.flags.f_contiguous
    assert_same_value(a.load(), b.load())


def sample(n: int = 1000) -> dict[str, Any]:
    return {
        "temperature": 300.5,
        "name": "run",
        "nested": {"tags": ["a", "b"], "pair": (1, 2)},
        "image": np.arange(n, dtype=np.float32).reshape(-1, 10),
        "fortran": np.asfortranarray(np.arange(24, dtype=">i4").reshape(4, 6)),
        "when": np.arange(5).astype("M8[s]"),
        "scalar0d": np.array(3.5),
        "empty": np.zeros((0, 3)),
        "frames": [np.ones(4, dtype=np.uint8), np.full(2, np.nan)],
        "extra": {1, 2, 3},  # a pickled remainder
        "z": 1 + 2j,
    }


def oob_dumps(obj: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return data, buffers


@pytest.fixture
def pstore(store_path: Path) -> Any:
    s = lv.Store.open(store_path, allow_pickle=True)
    yield s
    s.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_round_trip_every_protocol(pstore: lv.Store, protocol: int) -> None:
    key = "é/🦀 run\n0"  # any str is a key; protocol 0 is text
    pstore[key] = {**sample(), "ünïcode": "日本"}
    rec = pstore[key]
    back = pickle.loads(pickle.dumps(rec, protocol=protocol))
    assert isinstance(back, lv.Record)
    assert back.store is None and isinstance(back._source, MemorySource)
    assert_same_record(rec, back)
    # read-only even where numpy rebuilds writable arrays (protocols 0-4,
    # in-band datetime64)
    assert not back.image.flags.writeable and not back.when.flags.writeable
    with pytest.raises(ValueError):
        back.image[0, 0] = 1
    loaded = back.load()
    assert loaded["extra"] == {1, 2, 3} and loaded["z"] == 1 + 2j


def test_protocol5_out_of_band_one_buffer_per_contiguous_array(pstore: lv.Store) -> None:
    big = np.arange(50 * 2**20 // 8, dtype=np.float64)  # 50 MiB
    pstore["k"] = {**sample(), "big": big}
    rec = pstore["k"]
    data, buffers = oob_dumps(rec)
    # every array but the datetime64 one: C, F, 0-d, zero-size, frames, big
    expected = [n for n, info in rec.arrays.items() if info.dtype.kind not in "mM"]
    assert len(expected) == len(rec.arrays) - 1
    assert len(buffers) == len(expected)
    assert all(isinstance(b, pickle.PickleBuffer) for b in buffers)
    assert sum(b.raw().nbytes for b in buffers) == sum(rec.arrays[n].nbytes for n in expected)
    assert len(data) < 4096  # the 50 MiB stay out of band
    back = pickle.loads(data, buffers=buffers)
    assert_same_record(rec, back)
    for name in expected:
        if rec.arrays[name].size:
            assert np.shares_memory(back.array(name), rec.array(name)), name
        assert not back.array(name).flags.writeable
    # the buffers view the mapping itself, read-only
    assert all(b.raw().readonly for b in buffers)


def test_protocol5_without_callback_is_in_band(pstore: lv.Store) -> None:
    pstore["k"] = {"a": np.arange(10_000.0)}
    rec = pstore["k"]
    data = pickle.dumps(rec, protocol=5)
    assert len(data) > 80_000
    back = pickle.loads(data)
    assert not np.shares_memory(back.a, rec.a)
    assert_same_record(rec, back)


@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_protocols_below_5_copy_in_band(pstore: lv.Store, protocol: int) -> None:
    pstore["k"] = {"a": np.arange(10_000.0)}
    rec = pstore["k"]
    data = pickle.dumps(rec, protocol=protocol, buffer_callback=None)
    assert len(data) > 80_000
    with pytest.raises(ValueError, match="buffer_callback needs protocol >= 5"):
        pickle.dumps(rec, protocol=protocol, buffer_callback=list().append)


def test_missing_buffers_raise_the_pickle_module_errors(pstore: lv.Store) -> None:
    pstore["k"] = {"a": np.arange(10.0), "b": np.ones(3)}
    data, buffers = oob_dumps(pstore["k"])
    assert len(buffers) == 2
    with pytest.raises(pickle.UnpicklingError, match="no \\*buffers\\* argument"):
        pickle.loads(data)
    with pytest.raises(pickle.UnpicklingError, match="not enough out-of-band buffers"):
        pickle.loads(data, buffers=buffers[:1])
    with pytest.raises(pickle.UnpicklingError, match="not enough out-of-band buffers"):
        pickle.loads(data, buffers=[])


def test_datetime_arrays_go_in_band(pstore: lv.Store) -> None:
    pstore["k"] = {
        "t": np.arange(1000).astype("M8[ms]"),
        "d": np.arange(1000).astype("m8[s]"),
    }
    rec = pstore["k"]
    data, buffers = oob_dumps(rec)
    assert buffers == []  # numpy cannot export a datetime buffer
    assert len(data) > 16_000
    back = pickle.loads(data)
    assert_same_record(rec, back)
    assert not back.t.flags.writeable and not back.d.flags.writeable


def test_pickling_a_never_touched_record_faults_nothing_in(store: lv.Store, store_path: Path):
    store["k"] = {"big": np.ones(64 * 2**20 // 8)}  # 64 MiB
    store.flush()
    rec = store["k"]
    data, buffers = oob_dumps(rec)
    path = payload_path(store_path, rec, "big")
    assert len(buffers) == 1 and len(data) < 1024
    # mapped, but nothing (beyond the header page and fault-around) resident
    assert mapping_rss_kib(path) < 1024
    back = pickle.loads(data, buffers=buffers)
    assert mapping_rss_kib(path) < 1024
    assert back.big.shape == (64 * 2**20 // 8,)
    # control: the in-band protocol 4 reads all of it
    pickle.dumps(rec, protocol=4)
    assert mapping_rss_kib(path) > 60 * 1024


@pytest.mark.parametrize("how", ["p4", "p5-in-band", "p5-out-of-band"])
def test_by_value_survives_deleting_the_store(store_path: Path, how: str) -> None:
    with lv.Store.open(store_path, allow_pickle=True) as s:
        s["k"] = sample()
        rec = s["k"]
        expected = rec.load()
        if how == "p4":
            data, buffers = pickle.dumps(rec, protocol=4), None
        elif how == "p5-in-band":
            data, buffers = pickle.dumps(rec, protocol=5), None
        else:
            data, buffers = oob_dumps(rec)
    del rec
    shutil.rmtree(store_path)
    assert not store_path.exists()
    back = pickle.loads(data, buffers=buffers)
    assert back.temperature == 300.5
    assert_same_value(expected, back.load())


def test_pickled_bytes_are_deterministic(pstore: lv.Store) -> None:
    pstore["k"] = sample()
    for protocol in PROTOCOLS:
        a, b = pstore["k"], pstore["k"]  # two proxies of one record
        first = pickle.dumps(a, protocol=protocol)
        assert pickle.dumps(a, protocol=protocol) == first
        assert pickle.dumps(b, protocol=protocol) == first
        # and a round-tripped record pickles to the same bytes again
        assert pickle.dumps(pickle.loads(first), protocol=protocol) == first
    data_a, buf_a = oob_dumps(pstore["k"])
    data_b, buf_b = oob_dumps(pstore["k"])
    assert data_a == data_b
    assert [bytes(x.raw()) for x in buf_a] == [bytes(x.raw()) for x in buf_b]


def test_load_results_pickle_out_of_band(pstore: lv.Store) -> None:
    pstore["k"] = {
        "x": 1,
        "image": np.arange(100_000, dtype=np.int64),
        "frames": [np.ones((10, 10)), np.asfortranarray(np.ones((20, 3)))],
    }
    obj = pstore["k"].load()
    assert type(obj["image"]) is np.ndarray  # a plain ndarray, not np.memmap
    data, buffers = oob_dumps(obj)
    assert len(buffers) == 3 and len(data) < 1024
    back = pickle.loads(data, buffers=buffers)
    assert_same_value(obj, back)
    assert np.shares_memory(back["image"], obj["image"])
    assert not back["image"].flags.writeable


def test_record_ref(pstore: lv.Store, store_path: Path) -> None:
    pstore["k"] = {**sample(), "big": np.ones(2**20)}
    rec = pstore["k"]
    ref = rec.ref()
    assert isinstance(ref, lv.RecordRef)
    assert ref.path == str(store_path.resolve()) and ref.key == "k"
    assert ref.record == rec._record and ref.allow_pickle is True
    assert ref.pickle == pstore._core.get_pickle("k")
    assert "RecordRef(" in repr(ref) and "'big'" in repr(ref) and len(repr(ref)) < 400
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.key = "x"  # type: ignore[misc]
    assert hash(ref) == hash(rec.ref()) and ref == rec.ref()
    for protocol in PROTOCOLS:
        data = pickle.dumps(ref, protocol=protocol)
        assert len(data) < 4096
        back = pickle.loads(data)
        assert back == ref
        opened = back.open()
        assert isinstance(opened._source, DirectorySource)
        assert opened.store is None
        assert_same_record(rec, opened)  # while the writer holds the store
    # a by-value record has no reference
    with pytest.raises(ValueError, match="pickle it by value"):
        pickle.loads(pickle.dumps(rec)).ref()


def test_record_ref_keeps_allow_pickle(store: lv.Store) -> None:
    store["k"] = {"s": {1, 2}, "a": np.arange(3)}
    opened = pickle.loads(pickle.dumps(store["k"].ref())).open()
    assert opened.a.tolist() == [0, 1, 2]
    with pytest.raises(lv.PickleNotAllowedError):
        opened.load()


@pytest.mark.parametrize("mode", ["a", "r", "w"])
def test_store_pickles_by_path_as_a_reader_of_the_senders_version(
    tmp_path: Path, mode: str
) -> None:
    path = tmp_path / "s.lv"
    if mode != "w":
        with lv.Store.open(path) as s:
            s["k"] = {"v": 1, "a": np.arange(4)}
    store = lv.Store.open(path, mode, allow_pickle=True)
    if mode == "w":
        store["k"] = {"v": 1, "a": np.arange(4)}
        store.flush()
    version = store.version
    # a later commit by another handle: the sender (a reader in modes a and
    # r) still shows `version`, and so does its pickle
    with lv.Store.open(path) as other:
        other["later"] = {"v": 2}
    if mode == "w":
        assert store.version > version  # one process, one writer: it moved along
        version = store.version
        store["unflushed"] = {"v": 3}  # not committed: not in its version
    else:
        assert store.version == version and list(store) == ["k"]
    for protocol in PROTOCOLS:
        data = pickle.dumps(store, protocol=protocol)
        assert len(data) < 512 and b"arange" not in data
        # it opens again at its first use, as a reader beside this Store
        deferred = pickle.loads(data)
        assert deferred.mode == "r" and deferred.version == version
        assert sorted(deferred) == (["k", "later"] if mode == "w" else ["k"])
        with pytest.raises(lv.ReadOnlyError):
            deferred["x"] = {"v": 0}
        deferred.close()
    again = pickle.loads(data)
    try:
        assert isinstance(again, lv.Store)
        assert again.path == str(path.resolve())
        assert again.mode == "r"  # opened here, before the sender closes
        store.close()  # commits (mode "w") and cleans up, but `again` pins its snapshot
        assert again.allow_pickle is True
        assert again.version == version
        assert again["k"].v == 1 and again["k"].a.tolist() == [0, 1, 2, 3]
        latest = again.refresh()
        assert latest > version
        want = ["k", "later", "unflushed"] if mode == "w" else ["k", "later"]
        assert sorted(again) == want
    finally:
        again.close()
    # pickling a closed store works too (by path): a reader of the latest version
    with pickle.loads(pickle.dumps(again)) as third:
        assert third.mode == "r" and third.version == latest and sorted(third) == want


def test_object_array_records(store_path: Path) -> None:
    obj = {"o": np.array([1, "two", None], dtype=object), "a": np.arange(3), "m": 1}
    with lv.Store.open(store_path) as s:
        s["k"] = obj
        rec = s["k"]
        assert rec.m == 1
        for protocol in PROTOCOLS:
            with pytest.raises(lv.PickleNotAllowedError, match="allow_pickle"):
                pickle.dumps(rec, protocol=protocol)
        # still nothing loaded behind the user's back
        assert "o" not in rec._cache
    with lv.Store.open(store_path, "r", allow_pickle=True) as s:
        rec = s["k"]
        for protocol in PROTOCOLS:
            back = pickle.loads(pickle.dumps(rec, protocol=protocol))
            assert back.o.tolist() == [1, "two", None]
            assert not back.o.flags.writeable
            assert_same_record(rec, back)
        data, buffers = oob_dumps(rec)
        assert len(buffers) == 1  # only the int array; the object array is in-band
        assert pickle.loads(data, buffers=buffers).o.tolist() == [1, "two", None]


def test_by_value_keeps_allow_pickle_of_its_store(store: lv.Store) -> None:
    """A remainder read from a store opened without allow_pickle travels as
    bytes and is still refused after the round trip."""
    store["k"] = {"s": {1, 2}, "a": np.arange(3), "m": "x"}
    for protocol in PROTOCOLS:
        back = pickle.loads(pickle.dumps(store["k"], protocol=protocol))
        assert back.m == "x" and back.a.tolist() == [0, 1, 2]
        with pytest.raises(lv.PickleNotAllowedError):
            back.load()


def test_stale_record_keeps_its_own_remainder(tmp_path) -> None:
    # found by a break-it trial: the remainder was looked up by key, so a
    # proxy read before an overwrite mixed old arrays with the new remainder
    path = tmp_path / "stale.lv"
    store = lv.Store.open(path, allow_pickle=True)
    store["k"] = {"img": np.arange(3.0), "s": {1, 2}}
    old = store["k"]
    store["k"] = {"img": np.full(3, 7.0), "s": {"NEW"}}
    assert old.load()["s"] == {1, 2}
    assert pickle.loads(pickle.dumps(old)).load()["s"] == {1, 2}
    assert old.ref().open().load()["s"] == {1, 2}
    store["k"] = {"img": np.zeros(1)}  # no remainder at all now
    assert old.load()["s"] == {1, 2}
    store.close()
    # read before close: the remainder travels with the proxy
    assert old.load()["s"] == {1, 2}
    assert pickle.loads(pickle.dumps(old, protocol=5)).load()["s"] == {1, 2}


def test_equal_records_under_two_keys_pickle_to_equal_bytes(store: lv.Store) -> None:
    # found by a break-it trial: random payload ids leaked into by-value pickles
    store["a"] = {"x": np.arange(4), "m": 1}
    store["b"] = {"x": np.arange(4), "m": 1}
    da = pickle.dumps(store["a"], protocol=5)
    db = pickle.dumps(store["b"], protocol=5)
    assert len(da) == len(db)
    assert sum(x != y for x, y in zip(da, db, strict=True)) == 1  # the key
    assert pickle.loads(da).x.tolist() == [0, 1, 2, 3]


def test_assigning_a_record_copies_it(tmp_path: Path) -> None:
    # found by a break-it trial: dst[k] = src[k] stored a pickled proxy
    with lv.Store.open(tmp_path / "src.lv") as src, lv.Store.open(tmp_path / "dst.lv") as dst:
        src["k"] = {"t": 300.0, "pos": np.ones((3, 2)), "nested": {"w": np.eye(2)}}
        dst["k"] = src["k"]
        rec = dst["k"]
        assert rec.meta == {"t": 300.0, "nested": {}}
        assert set(rec.arrays) == {"pos", "nested/w"}
        assert dst.count("t == 300") == 1
        back = rec.load()
        assert back["pos"].tolist() == [[1.0, 1.0]] * 3 and back["nested"]["w"][1, 1] == 1.0


class Frame(lv.Record):
    """A user's subclass of Record (no __slots__, so instances have a __dict__)."""

    @property
    def total(self) -> float:
        return float(self.image.sum())


def test_record_subclass_keeps_its_class_and_out_of_band_buffers(pstore: lv.Store) -> None:
    pstore["k"] = {"frame": 3, "image": np.arange(20_000.0)}
    rec = pstore["k"]
    frame = Frame(rec._source, rec.key, rec._record)
    data, buffers = oob_dumps(frame)
    assert len(buffers) == 1 and len(data) < 4096  # the array stays out of band
    back = pickle.loads(data, buffers=buffers)
    assert type(back) is Frame and back.total == frame.total and back.frame == 3
    assert np.shares_memory(back.image, frame.image) and not back.image.flags.writeable
    # deterministic, and a state set on the instance travels with it
    assert pickle.dumps(frame, protocol=4) == pickle.dumps(Frame(rec._source, "k", rec._record))
    frame.label = "kept"
    assert pickle.loads(pickle.dumps(frame)).label == "kept"


@dataclasses.dataclass
class Point:
    x: float
    y: float


def test_record_ref_carries_safe_classes_by_name(store_path: Path) -> None:
    with lv.Store.open(store_path) as s:
        s["k"] = {"point": Point(1.0, 2.0)}
    with lv.Store.open(store_path, "r", safe_classes=[Point]) as s:
        ref = s["k"].ref()
        assert ref.safe_classes == (Point,)
        for protocol in PROTOCOLS:
            data = pickle.dumps(ref, protocol=protocol)
            assert len(data) < 4096 and b"Point" in data
            back = pickle.loads(data)
            assert back == ref and back.open().load() == {"point": Point(1.0, 2.0)}
