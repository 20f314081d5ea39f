"""Nothing big in the index (lazyvault issue 13): masked arrays become a ``masked`` layout node over
two mapped payloads; arrays, ndarray subclasses and out-of-band buffers inside a pickled remainder
become payloads; a record over the size cap is refused, naming its largest fields; a value that
cannot be pickled names its record and field."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv

from conftest import payload_files

MIB = 1 << 20
BIG = 1_000_000  # float64 elements: 8 MB


def journal_bytes(store_path: Path) -> int:
    return sum(f.stat().st_size for f in (store_path / "journal").rglob("*") if f.is_file())


def put_growth(store: lv.Store, store_path: Path, key: str, obj: Any) -> int:
    """How many bytes storing ``obj`` added to the journal (the record JSON and pickled
    remainder, as in the index)."""
    store.flush()
    before = journal_bytes(store_path)
    store[key] = obj
    store.flush()
    return journal_bytes(store_path) - before


def big_masked() -> np.ma.MaskedArray:
    data = np.arange(BIG, dtype=np.float64)
    return np.ma.masked_array(data, mask=data % 3 == 0)


def assert_masked_equal(got: Any, want: np.ma.MaskedArray) -> None:
    assert type(got) is np.ma.MaskedArray
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.data, want.data)
    assert np.array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(want))
    assert (got.mask is np.ma.nomask) == (want.mask is np.ma.nomask)
    assert got.hardmask == want.hardmask
    got_fill, want_fill = np.asarray(got.fill_value), np.asarray(want.fill_value)
    assert got_fill.dtype == want_fill.dtype and got_fill.tobytes() == want_fill.tobytes()


# -- masked arrays ------------------------------------------------------------


def test_a_masked_array_is_two_mapped_payloads_not_a_pickle(
    store: lv.Store, store_path: Path
) -> None:
    m = big_masked()
    grown = put_growth(store, store_path, "m", m)
    assert grown < 4096, grown  # was 18 MB: the whole array pickled twice
    assert len(payload_files(store_path)) == 2
    rec = store["m"]
    assert sorted(rec.arrays) == ["data", "data/mask"]
    got = rec.load()  # no allow_pickle needed
    assert_masked_equal(got, m)
    assert not got.data.flags.writeable and not got.mask.flags.writeable  # mapped read-only


def test_masked_arrays_of_every_kind_round_trip(store: lv.Store) -> None:
    structured = np.zeros(4, dtype=[("a", "<i4"), ("b", "<f8")])
    structured["a"] = [1, 2, 3, 4]
    cases: dict[str, np.ma.MaskedArray] = {
        "nomask": np.ma.masked_array(np.arange(5)),
        "hard": np.ma.masked_array(np.arange(5.0), mask=[0, 1, 0, 1, 0], hard_mask=True),
        "fill": np.ma.masked_array(np.arange(5.0), mask=[1, 0, 0, 0, 0], fill_value=-1.5),
        "nan_fill": np.ma.masked_array(np.arange(3.0), mask=[1, 0, 0], fill_value=np.nan),
        "text": np.ma.masked_array(np.array(["a", "bc"]), mask=[0, 1], fill_value="zz"),
        "structured": np.ma.masked_array(
            structured, mask=[(0, 1), (1, 0), (0, 0), (1, 1)], fill_value=(7, 2.5)
        ),
        "2d_fortran": np.ma.masked_array(
            np.asfortranarray(np.arange(6.0).reshape(2, 3)), mask=[[0, 1, 0], [1, 0, 0]]
        ),
    }
    for name, m in cases.items():
        store[name] = m
        assert_masked_equal(store[name].load(), m)
    # nested in dicts and lists, one masked array referenced twice stays one
    shared = cases["hard"]
    store["nested"] = {"x": 1, "ms": [shared, cases["nomask"]], "again": shared}
    got = store["nested"].load()
    assert got["x"] == 1
    assert_masked_equal(got["ms"][0], shared)
    assert_masked_equal(got["ms"][1], cases["nomask"])
    assert got["again"] is got["ms"][0]
    assert sorted(store["nested"].arrays) == ["ms/0", "ms/0/mask", "ms/1"]


def test_masked_records_match_the_json_schema(store: lv.Store) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = Path(__file__).resolve().parents[1] / "schema" / "json" / "record.schema.json"
    validator = jsonschema.Draft202012Validator(json.loads(schema_path.read_text("utf-8")))
    store["m"] = {
        "plain": np.ma.masked_array(np.arange(3)),
        "full": np.ma.masked_array(np.arange(3.0), mask=[0, 1, 0], fill_value=2.0),
        "text": np.ma.masked_array(np.array(["a"]), fill_value="z"),
        "nan": np.ma.masked_array(np.arange(3.0), fill_value=np.nan, hard_mask=True),
    }
    record = json.loads(store._core.get("m"))
    validator.validate(record)
    masked = record["layout"]["dict"]
    assert masked["plain"]["masked"]["mask"] is None
    assert masked["full"]["masked"]["mask"] == {"array": "full/mask"}
    assert masked["full"]["masked"]["fill_value"] == {"$numpy": ["<f8", 2.0]}
    assert masked["text"]["masked"]["fill_value"] == "z"
    assert masked["nan"]["masked"]["fill_value"] == {"$numpy": ["<f8", {"$float": "nan"}]}
    bad = {**record, "layout": {"masked": {"data": {"array": "plain"}}}}
    assert not validator.is_valid(bad)


def test_a_damaged_masked_node_is_corrupt() -> None:
    from lazyvault import _layout

    paths = {"data", "data/mask"}
    good = {"data": {"array": "data"}, "mask": None, "fill_value": None, "hard_mask": False}
    assert _layout.problem({"masked": good}, paths) is None
    for fill in ("zz", {"$numpy": ["<f8", 1.5]}, {"array": "data/mask"}):
        assert _layout.problem({"masked": {**good, "fill_value": fill}}, paths) is None
    for bad in (
        {**good, "hard_mask": 1},
        {**good, "data": {"array": "elsewhere"}},
        {**good, "mask": "data/mask"},
        {**good, "fill_value": {"list": [1]}},
        {**good, "fill_value": {"$numpy": ["<f8", "x"]}},
        {**good, "fill_value": {"scalar": ["<f8", 1.5]}},
        {**good, "fill_value": {"array": "nowhere"}},
        {"data": {"array": "data"}},
        [],
    ):
        assert _layout.problem({"masked": bad}, paths) is not None, bad


# -- arrays inside the pickled remainder ---------------------------------------


class Blob:
    """Pickles its bytes as an out-of-band buffer (PEP 574), as pyarrow buffers do."""

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (Blob, (pickle.PickleBuffer(self.data),))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blob) and self.data == other.data

    __hash__ = None  # type: ignore[assignment]


class Tagged:
    """Pickled whole (custom state), holding a set and an array."""

    def __init__(self, tags: set[str], values: np.ndarray) -> None:
        self.tags, self.values = tags, values

    def __getstate__(self) -> dict[str, Any]:
        return {"tags": self.tags, "values": self.values}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.tags, self.values = state["tags"], state["values"]


def big_leftovers() -> dict[str, Any]:
    values = np.arange(BIG, dtype=np.float64)
    cases: dict[str, Any] = {
        "int_keys": {1: values, 2: big_masked()},
        "matrix": np.matrix(values.reshape(1000, 1000)),
        "recarray": np.rec.fromarrays([values, values.astype(np.int64)], names="a,b"),
        "tagged": Tagged({"x", "y"}, values),
        "blob": Blob(values.tobytes()),
    }
    try:
        import pandas as pd
    except ImportError:
        pass
    else:
        cases["frame"] = pd.DataFrame({"a": values, "b": values.astype(np.int32)})
    return cases


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_arrays_and_buffers_inside_the_remainder_become_payloads(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    cases = big_leftovers()
    with lv.Store.open(path, allow_pickle=True) as store:
        for name, obj in cases.items():
            grown = put_growth(store, path, name, obj)
            assert grown < 8192, (name, grown)  # 8 MB of data in each
            assert store[name].arrays, name
        got = {name: store[name].load() for name in cases}
    assert np.array_equal(got["int_keys"][1], cases["int_keys"][1])
    assert_masked_equal(got["int_keys"][2], cases["int_keys"][2])
    assert type(got["matrix"]) is np.matrix and np.array_equal(got["matrix"], cases["matrix"])
    assert type(got["recarray"]) is np.recarray
    assert np.array_equal(got["recarray"].b, cases["recarray"].b)
    assert got["tagged"].tags == {"x", "y"}
    assert np.array_equal(got["tagged"].values, cases["tagged"].values)
    assert got["blob"] == cases["blob"]
    if "frame" in cases:
        assert got["frame"].equals(cases["frame"])


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_a_subclass_keeps_its_attributes_inside_the_remainder(tmp_path: Path) -> None:
    m = np.matrix([[1.0, 2.0], [3.0, 4.0]])
    m.__dict__["note"] = "kept"
    with lv.Store.open(tmp_path / "s.lv", allow_pickle=True) as store:
        store["k"] = {0: m}
        assert list(store["k"].arrays) == ["data/1"]
        got = store["k"].load()[0]
    assert type(got) is np.matrix and got.note == "kept"
    assert np.array_equal(got, m)


# -- the record size cap ------------------------------------------------------


def test_big_metadata_is_refused_naming_its_fields(store: lv.Store, store_path: Path) -> None:
    obj = {"text": "x" * (2 * MIB), "note": "y" * 1000, "n": 1, "a": np.arange(10)}
    with pytest.raises(lv.RecordTooLargeError) as info:
        store["big"] = obj
    err = info.value
    assert isinstance(err, ValueError)
    assert err.key == "big" and err.cap == MIB and err.size > 2 * MIB
    text = str(err)
    assert '"big"' in text and str(MIB) in text
    assert '"text" 2097154 bytes' in text and '"note" 1002 bytes' in text, text
    assert "arrays" in text
    # nothing written
    assert "big" not in store and len(store) == 0
    assert payload_files(store_path) == []
    # the same data as an array is fine
    store["big"] = {"text": np.frombuffer(b"x" * (2 * MIB), dtype=np.uint8), "n": 1}
    assert store["big"].n == 1


def test_a_big_pickled_remainder_is_refused(store: lv.Store) -> None:
    with pytest.raises(lv.RecordTooLargeError, match="pickled remainder") as info:
        store["k"] = {"ids": set(range(300_000))}
    assert info.value.key == "k"
    assert "k" not in store
    with pytest.raises(lv.RecordTooLargeError):
        lv.dumps({"text": "x" * (2 * MIB)})


def test_a_refused_update_chunk_leaves_the_store_as_it_was(
    store: lv.Store, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lv.store, "_UPDATE_CHUNK_RECORDS", 3)
    store["k0"] = {"v": "old", "a": np.arange(3)}
    store.flush()
    files = payload_files(store_path)
    objs = {
        "k0": {"v": "new", "a": np.arange(4)},
        "k1": {"v": 1, "a": np.arange(5)},
        "k2": {"v": "z" * (2 * MIB)},
    }
    with pytest.raises(lv.RecordTooLargeError, match="k2"):
        store.update(objs, progress=False)
    assert sorted(store) == ["k0"] and store["k0"].v == "old"
    assert store["k0"].a.tolist() == [0, 1, 2]
    store.flush()
    assert payload_files(store_path) == files


# -- pickling failures name the record and field -------------------------------


class _Refuses:
    def __reduce__(self) -> Any:
        raise pickle.PicklingError("this object refuses to be pickled")


def test_a_pickling_failure_names_the_record_and_field(store: lv.Store) -> None:
    with pytest.raises(pickle.PicklingError, match=r"record 'k'.*field 'inner/bad'") as info:
        store["k"] = {"inner": {"bad": _Refuses()}, "n": 1}
    assert isinstance(info.value.__cause__, pickle.PicklingError)
    # a lock raises TypeError inside pickle: still a PicklingError naming the field
    with pytest.raises(pickle.PicklingError, match=r"record 'u2'.*field 'lock'") as info:
        store.update({"u1": {"n": 1}, "u2": {"lock": threading.Lock()}}, progress=False)
    assert isinstance(info.value.__cause__, TypeError)
    assert len(store) == 0


_MISFITS = [np.array([True]), np.array([1, 0, 0]), np.zeros(5, bool), np.zeros((3, 1), bool)]
_MISFIT_IDS = ["one element", "int", "longer", "2-d"]


@pytest.mark.parametrize("mask", _MISFITS, ids=_MISFIT_IDS)
def test_a_mask_replaced_by_one_that_does_not_fit_is_refused(store: lv.Store, mask: Any) -> None:
    # replace_arrays took it, load() then raised CorruptError and verify said
    # nothing (a fresh user's trial)
    store["a"] = {"m": np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])}
    store.flush()
    with pytest.raises(lv.InvalidArrayError, match=r"record 'a': the mask 'm/mask' .* data 'm'"):
        store.replace_arrays("a", {"m/mask": mask})
    with pytest.raises(lv.InvalidArrayError, match="the mask 'm/mask'"):
        store.replace_arrays("a", {"m": np.arange(4.0)})  # the data, under the old mask
    assert store.version == 1 and store["a"].load()["m"].mask.tolist() == [False, True, False]
    # both together fit again; the other arrays of a record are not checked
    store.replace_arrays("a", {"m": np.arange(4.0), "m/mask": np.ones(4, bool)})
    assert store["a"].load()["m"].mask.tolist() == [True] * 4


def test_masks_inside_the_remainder_are_checked_too(store: lv.Store) -> None:
    masked = np.ma.masked_array([1.0, 2.0], mask=[0, 1])
    store["a"] = {"by_id": {7: masked}, "plain": np.zeros(3), "plain/mask": np.ones(1)}
    paths = set(store["a"].arrays)
    assert {"by_id/1", "by_id/1/mask", "plain", "plain/mask"} <= paths
    with pytest.raises(lv.InvalidArrayError, match="the mask 'by_id/1/mask'"):
        store.replace_arrays("a", {"by_id/1/mask": np.ones(3, bool)})
    store.replace_arrays("a", {"plain/mask": np.arange(5)})  # two plain arrays: free
    assert store["a"].array("plain/mask").tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("mask", _MISFITS, ids=_MISFIT_IDS)
def test_a_stored_mask_that_does_not_fit_is_corrupt(store: lv.Store, mask: Any) -> None:
    # numpy broadcast a one-element mask over the data, or raised its own
    # MaskError: a record written by other means (here the core itself, past
    # replace_arrays' check) is refused at load
    from lazyvault._arrays import payload_args
    from lazyvault.store import core_of

    store["a"] = {"m": np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])}
    core_of(store).replace_arrays("a", [payload_args("m/mask", mask)])
    with pytest.raises(lv.CorruptError, match="does not fit the data 'm'"):
        store["a"].load()
    assert store["a"].array("m").tolist() == [1.0, 2.0, 3.0]  # the data stays readable
