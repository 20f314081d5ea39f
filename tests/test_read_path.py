"""Reading one array of a store's record: the core reads it from the record JSON (no decoding in
Python until metadata is needed), from a pack kept open between reads; what the record shows is
what it showed before."""

from __future__ import annotations

import datetime as dt
import gc
import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest

import lazyvault as lv
from lazyvault import record as record_module


def _packs(root: Path) -> list[Path]:
    return sorted(root.glob("arrays/*/*.npz"))


def _open_packs(root: Path) -> list[str]:
    """The files under ``root/arrays`` this process has open."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root / "arrays")):
            found.append(target)
    return found


def _objects() -> dict[str, dict]:
    return {
        "plain": {"t": 1.5, "x": np.arange(64, dtype=np.float64)},
        "tagged": {
            "when": dt.datetime(2026, 1, 2, 3, 4, 5),
            "pair": (1, 2),
            "x": np.arange(6, dtype=">i4").reshape(2, 3),
        },
        "nested": {"frames": [np.ones(3, np.float32), np.zeros((2, 2), np.int8)], "n": 2},
        "fortran": {"x": np.asfortranarray(np.arange(12.0).reshape(3, 4))},
        "zero-d": {"x": np.array(7, dtype=np.int16)},
        "empty": {"x": np.zeros((0, 3), dtype=np.complex64)},
        "structured": {"x": np.zeros(3, dtype=[("a", "<i4"), ("b", ">f8", (2,))])},
        "big": {"x": np.arange(20_000, dtype=np.float64)},  # over 64 KiB: mapped
        "named pickle": {"pickle": True, "s": "pickle", "x": np.arange(3)},
        "with remainder": {"s": {1, 2}, "x": np.arange(4)},
        "objects": {"x": np.array([1, "a", None], dtype=object)},
        # paths the record JSON escapes, or writes as UTF-8
        "escaped": {'a"b': np.arange(2), "back\\slash": np.arange(3), "é/ü": np.arange(4)},
    }


def _check_equal(got: object, want: object) -> None:
    assert type(got) is type(want), (got, want)
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for k in want:
            _check_equal(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _check_equal(g, w)
    else:
        assert got == want


def _check_same(a: lv.Record, b: lv.Record) -> None:
    assert type(a) is type(b)
    assert a.meta == b.meta
    assert a.arrays == b.arrays
    for name in a.arrays:
        got, want = a.array(name), b.array(name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.flags.f_contiguous == want.flags.f_contiguous, name
        assert got.flags.writeable == want.flags.writeable == got.dtype.hasobject, name
        np.testing.assert_array_equal(got, want)


def test_records_read_the_fast_way_show_what_decoded_records_show(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    objects = _objects()
    with lv.Store.open(path) as store:
        store.update(objects.items(), progress=False)
    reader = lv.Store.open(path, "r", allow_pickle=True)
    for key, obj in objects.items():
        fast = reader[key]
        raw, remainder = record_module.entry_of(fast), fast._remainder()
        decoded = record_module.from_json(
            reader._source, key, json.dumps(raw).encode(), reader, remainder
        )
        _check_same(fast, decoded)
        _check_equal(reader[key].load(), obj)
    # the remainder is read with its record; a record naming "pickle" has none
    assert record_module.remainder_of(reader["with remainder"]) is not None
    assert record_module.remainder_of(reader["named pickle"]) is None
    rec = reader["escaped"]
    assert rec['a"b'].tolist() == [0, 1] and rec["é/ü"].tolist() == [0, 1, 2, 3]
    assert rec.array("back\\slash").tolist() == [0, 1, 2]
    rec = reader["nested"]
    assert rec["frames/1"].dtype == np.int8
    with pytest.raises(KeyError, match="frames/2"):
        rec.array("frames/2")
    with pytest.raises(AttributeError, match="nothing"):
        _ = rec.nothing


def test_reading_an_array_decodes_no_json_until_metadata_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store["k"] = {"t": 1.5, "x": np.arange(5.0)}
        store["nested"] = {"t": 2, "n": {"y": np.arange(3)}}
    reader = lv.Store.open(path, "r")
    decoded = []
    loads = json.loads

    def counting_loads(raw: bytes) -> object:
        decoded.append(raw)
        return loads(raw)

    monkeypatch.setattr(record_module.json, "loads", counting_loads)
    # by path and by getattr too (a trial found those decoded the JSON)
    nested = reader["nested"]
    np.testing.assert_array_equal(nested["n/y"], np.arange(3))
    np.testing.assert_array_equal(getattr(reader["nested"], "n/y"), np.arange(3))
    assert decoded == []
    rec = reader["k"]
    np.testing.assert_array_equal(rec.x, np.arange(5.0))
    assert "x" in dir(type(rec)) and decoded == []
    assert rec.t == 1.5
    assert len(decoded) == 1
    assert rec.meta == {"t": 1.5} and rec.arrays["x"].shape == (5,)
    assert len(decoded) == 1  # decoded once


def test_a_small_array_views_its_own_buffer(tmp_path: Path) -> None:
    with lv.Store.open(tmp_path / "s.lv") as store:
        store["k"] = {"x": np.arange(8.0)}
        x = store["k"].x
    # the buffer itself, not a memoryview of it: one object fewer per array
    assert type(x.base).__name__ == "MappedBuffer"
    # and one the cycle collector never walks (it holds no Python object)
    assert not gc.is_tracked(x.base)
    with lv.Store.open(tmp_path / "s.lv") as store:
        store["big"] = {"x": np.arange(100_000.0)}  # over 64 KiB: memory-mapped
    with lv.Store.open(tmp_path / "s.lv", mode="r") as reader:
        assert not gc.is_tracked(reader["big"].x.base)
    assert not x.flags.writeable and x.ctypes.data % 64 == 0
    with pytest.raises(ValueError):
        x.flags.writeable = True


def test_a_read_pack_is_kept_open_and_still_read_after_another_process_removes_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store.update({"a": {"x": np.arange(4)}, "b": {"x": np.arange(5)}}.items(), progress=False)
    [pack] = _packs(path)
    reader = lv.Store.open(path, "r")
    assert _open_packs(path) == []
    np.testing.assert_array_equal(reader["a"].x, np.arange(4))
    assert _open_packs(path) == [str(pack)]
    pack.unlink()  # as another process's gc would: the bytes never change
    np.testing.assert_array_equal(reader["b"].x, np.arange(5))
    # verify looks at the files as they are
    assert not reader.verify(progress=False)["ok"]
    # once the reader moves on, the pack is let go: its record's payload is missing
    reader.refresh()
    assert _open_packs(path) == []
    with pytest.raises(lv.CorruptError, match="missing") as err:
        _ = reader["b"].x
    assert err.value.key == "b" and err.value.array == "x"


def test_packs_kept_open_are_few_and_closed_with_the_store(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        for i in range(100):
            store[f"k{i}"] = {"x": np.full(3, i)}  # one pack per put
    assert len(_packs(path)) == 100
    reader = lv.Store.open(path, "r")
    for i in range(100):
        assert reader[f"k{i}"].x.tolist() == [i] * 3
    assert 1 <= len(_open_packs(path)) <= 64
    reader.close()
    assert _open_packs(path) == []


def _read_in_child(path: str, key: str, queue: multiprocessing.Queue) -> None:
    reader = lv.Store.open(path, "r")
    queue.put(reader[key].x.tolist())


def test_a_forked_child_reads_through_the_packs_its_parent_kept_open(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store.update({"a": {"x": np.arange(4)}, "b": {"x": np.arange(5)}}.items(), progress=False)
    reader = lv.Store.open(path, "r")
    _ = reader["a"].x
    assert len(_open_packs(path)) == 1
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(str(path), "b", queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0 and got == list(range(5))
    assert reader["a"].x.tolist() == list(range(4))  # pread: no shared file position


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"meta":{"m":1},"arrays":{}', id="truncated"),
        pytest.param(b'{"meta":{"m":1},"arrays":{}} x', id="trailing-garbage"),
        pytest.param(b'{"meta":{"m":"\xff"},"arrays":{}}', id="not-utf-8"),
        pytest.param(
            b'{"meta":{"m":' + b"[" * 100_000 + b"]" * 100_000 + b'},"arrays":{}}',
            id="nested-too-deep",
        ),
        pytest.param(b'{"meta":[1,2],"arrays":{}}', id="meta-a-list"),
        pytest.param(b'{"meta":{},"arrays":[]}', id="arrays-a-list"),
        pytest.param(b"[]", id="not-an-object"),
    ],
)
def test_record_json_that_does_not_decode_is_damage_naming_the_key(raw: bytes) -> None:
    # found by a fresh-user trial (a journal entry rewritten with a valid CRC):
    # these escaped as JSONDecodeError, UnicodeDecodeError, RecursionError, AttributeError
    with pytest.raises(lv.CorruptError, match="record 'k'") as caught:
        record_module.decode_record(raw, "k")
    assert caught.value.key == "k"
    assert record_module.decode_record(b'{"meta":{},"arrays":{}}', "k") == {
        "meta": {},
        "arrays": {},
    }
