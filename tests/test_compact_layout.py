"""The compact ``fields`` layout (schema/FORMAT.md, "Layout", format 1.5): a dict whose entries are
each an array at its own name or a value held whole in ``meta`` is rebuilt from ``meta`` and
``arrays``. Round trips of objects that get it and of objects that do not, through every reader;
records written before it (the full layout) still load; the record shrinks; malformed ``fields``
layouts are damage."""

from __future__ import annotations

import datetime
import json
import math
import pickle
import zipfile
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyvault as lv
from lazyvault import _arrays, _layout, _lazyvault
from lazyvault.record import entry_of


def same(a: Any, b: Any) -> bool:
    """Equal with the same types (tuple is not list, np.float32 is not float), NaN equal to NaN,
    datetimes with the same wall time, offset and zone, arrays with the same dtype, shape and
    bytes."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, np.generic):
        if a.dtype.kind == "f" and np.isnan(a):  # NaN payload bits are not kept
            return a.dtype == b.dtype and bool(np.isnan(b))
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, datetime.datetime):
        return (
            a.replace(tzinfo=None) == b.replace(tzinfo=None)
            and a.utcoffset() == b.utcoffset()
            and getattr(a.tzinfo, "key", None) == getattr(b.tzinfo, "key", None)
        )
    return bool(a == b)


keys = st.one_of(st.text(max_size=5), st.sampled_from(["$x", "$dict", "$tuple", "data", "a/b"]))
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=6),
    st.floats(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.dates(),
    st.builds(
        lambda d, tz: d.replace(tzinfo=tz),
        st.datetimes(),
        st.sampled_from([None, datetime.UTC, ZoneInfo("Europe/Paris")]),
    ),
    hnp.from_dtype(np.dtype("<f4")),
    hnp.from_dtype(np.dtype("<M8[s]")),
)
# values held whole in meta: nested dicts, lists and tuples of leaves
held = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(keys, inner, max_size=3),
    ),
    max_leaves=8,
)
arrays = hnp.arrays(
    dtype=st.sampled_from([np.dtype("<f8"), np.dtype(">i2"), np.dtype("<U2")]),
    shape=hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3),
)
# what keeps the full layout: an array inside a container, a pickled value
other = st.one_of(
    st.builds(lambda a: {"w": a}, arrays),
    st.builds(lambda a: [a], arrays),
    st.just({"tags", "Si"}),
)
qualifying = st.dictionaries(keys.filter(bool), st.one_of(held, arrays), max_size=6)
objects = st.one_of(qualifying, st.dictionaries(keys, st.one_of(held, arrays, other), max_size=6))


def compact(layout_json: str) -> bool:
    return "fields" in json.loads(layout_json)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(obj=objects)
def test_round_trip_in_memory(obj: dict[str, Any]) -> None:
    meta_json, layout_json, _, pickled = _layout.encode(obj)
    full = _layout.encode_generic(obj, compact=False)
    assert meta_json == full[0]  # meta is the same either way
    if compact(layout_json):
        assert pickled is None
    assert same(lv.loads(lv.dumps(obj), allow_pickle=True), obj)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(obj=qualifying)
def test_objects_of_values_held_whole_and_arrays_get_the_compact_layout(
    obj: dict[str, Any],
) -> None:
    layout_json = _layout.encode(obj)[1]
    # null when the arrays come after every metadata field, else the names in order
    kinds = [isinstance(v, np.ndarray) for v in obj.values()]
    in_order = kinds == sorted(kinds)
    assert json.loads(layout_json) == {"fields": None if in_order else list(obj)}
    assert same(lv.loads(lv.dumps(obj)), obj)


SAMPLE = {
    "temperature": 300.5,
    "material": "Si",
    "step": 7,
    "ok": True,
    "started": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    "loss": float("nan"),
    "params": {"lr": 1e-3, "shape": (2, 3), "$only": [1, {"$y": 2}]},
    "$x": 1,
    "x": np.arange(64.0),
}


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({"params": {"w": np.zeros(2)}}, id="array-inside"),
        pytest.param({"a": SAMPLE["x"], "b": SAMPLE["x"]}, id="array-twice"),
        pytest.param({"": np.zeros(2)}, id="array-at-empty-key"),
        pytest.param({"tags": {"a"}}, id="pickled"),
        pytest.param({"m": np.ma.masked_array([1.0], mask=[True])}, id="masked"),
        pytest.param({"deep": [{"a": np.zeros(1)}]}, id="array-deep"),
        pytest.param([1, 2], id="not-a-dict"),
    ],
)
def test_other_objects_keep_the_full_layout(obj: Any) -> None:
    assert not compact(_layout.encode(obj)[1])
    assert same(lv.loads(lv.dumps(obj), allow_pickle=True), obj)


def _fill(path: Path, full: bool) -> None:
    """One store holding SAMPLE under ``"k"``, written with the compact layout or (``full``) the
    full one, as writers before format 1.5 did."""
    with lv.Store.open(path, "w") as store:
        if full:
            store._core.put("k", *_layout.encode_generic(SAMPLE, "k", compact=False))
        else:
            store["k"] = SAMPLE
        store.flush()


@pytest.mark.parametrize("full", [False, True], ids=["compact", "full"])
def test_every_reader_rebuilds_both_layouts(tmp_path: Path, full: bool) -> None:
    path = tmp_path / "s.lv"
    _fill(path, full)
    with lv.Store.open(path, "r") as store:
        rec = store["k"]
        layout = json.loads(store._core.get("k"))["layout"]
        assert ("fields" in layout) is not full
        loaded = [
            rec.load(),
            pickle.loads(pickle.dumps(rec)).load(),  # by value
            pickle.loads(pickle.dumps(rec, protocol=5)).load(),
            rec.ref().open().load(),  # by reference
        ]
        store.export(tmp_path / "a.lvz")
        with lv.Store.open(tmp_path / "a.lvz") as archive:
            loaded.append(archive["k"].load())
        with lv.Store.open(tmp_path / "copy.lv") as copy:
            copy["c"] = rec  # a record copied as a record: the same layout
            assert json.loads(copy._core.get("c"))["layout"] == layout
            loaded.append(copy["c"].load())
        for ext in ("npz", "safetensors"):
            store.export(tmp_path / f"e.{ext}")
            with lv.Store.open(tmp_path / f"i{ext}.lv") as imported:
                imported.import_file(tmp_path / f"e.{ext}")
                loaded.append(imported[next(iter(imported))].load())
        loaded.append(lv.loads(lv.dumps(rec.load())))
        assert same(rec.meta, {k: v for k, v in SAMPLE.items() if k != "x"})
    for i, obj in enumerate(loaded):
        assert same(obj, SAMPLE), i


@pytest.mark.parametrize("full", [False, True], ids=["compact", "full"])
def test_a_merged_record_keeps_its_layout(tmp_path: Path, full: bool) -> None:
    path = tmp_path / "s.lv"
    _fill(path, full)
    with lv.Store.open(tmp_path / "m.lv") as merged:
        assert merged.merge(path) == ["k"]
        assert ("fields" in json.loads(merged._core.get("k"))["layout"]) is not full
        assert same(merged["k"].load(), SAMPLE)


def test_the_loaded_object_shares_nothing_with_meta(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    _fill(path, full=False)
    with lv.Store.open(path, "r") as store:
        rec = store["k"]
        obj = rec.load()
        obj["params"]["lr"] = 1.0
        assert rec.meta["params"]["lr"] == 1e-3
        assert rec.load()["params"]["lr"] == 1e-3


def test_the_record_shrinks(tmp_path: Path) -> None:
    obj = {k: SAMPLE[k] for k in ("temperature", "material", "step", "ok", "started", "x")}
    sizes: dict[bool, int] = {}
    for full in (False, True):
        with lv.Store.open(tmp_path / f"{full}.lv", "w") as store:
            store._core.put("k", *_layout.encode_generic(obj, "k", compact=not full))
            sizes[full] = len(store._core.get("k"))
    # the five values are no longer written twice
    meta = json.dumps(json.loads(_layout.encode(obj)[0]), separators=(",", ":"))
    assert sizes[True] - sizes[False] >= len(meta) - 10
    assert sizes[False] < 0.8 * sizes[True]


ARRAYS = {"x": np.arange(3)}


@pytest.mark.parametrize(
    ("meta", "fields", "match"),
    [
        pytest.param({"t": 1}, ["t"], "leaves out 'x'", id="leaves-out-an-array"),
        pytest.param({"t": 1}, ["x"], "leaves out 't'", id="leaves-out-a-field"),
        pytest.param({"t": 1}, ["t", "x", "u"], "names 'u'", id="names-nothing"),
        pytest.param({"t": 1}, ["t", "x", "t"], "twice", id="twice"),
        pytest.param({"x": 1}, ["x"], "both", id="field-and-array"),
        pytest.param({"$dict": {"x": 1}}, ["x"], "both", id="escaped-field-and-array"),
        pytest.param({"x": 1}, None, "both", id="null-field-and-array"),
        pytest.param({"t": 1}, "tx", "not a list", id="not-a-list"),
        pytest.param({"t": 1}, ["t", 1, "x"], "not a list of names", id="not-names"),
        # meta is the object here: a malformed tagged value is damage, as in a full layout
        pytest.param({"t": {"$float": "bogus"}}, None, "malformed tagged", id="bad-float"),
        pytest.param({"t": {"$int": "01"}}, None, "malformed tagged", id="bad-int"),
        pytest.param({"t": [{"$datetime": "no"}]}, None, "malformed tagged", id="bad-datetime"),
        pytest.param({"t": {"$numpy": ["<c8", 1]}}, None, "malformed tagged", id="bad-numpy"),
        pytest.param({"t": {"$weird": 1}}, None, "malformed tagged", id="unknown-tag"),
    ],
)
def test_malformed_fields_layouts_are_damage(
    tmp_path: Path, meta: dict[str, Any], fields: Any, match: str
) -> None:
    args = [_arrays.payload_args(n, a) for n, a in ARRAYS.items()]
    layout = json.dumps({"fields": fields})
    blob = _lazyvault.dumps_archive("obj", json.dumps(meta), layout, args, None)
    for allow_pickle in (False, True):
        with pytest.raises(lv.CorruptError, match=f"malformed layout: .*{match}"):
            lv.loads(blob, allow_pickle=allow_pickle)
    with lv.Store.open(tmp_path / "s.lv") as store:
        store._core.put("k", json.dumps(meta), layout, args, None)
        rec = store["k"]
        assert rec.arrays.keys() == {"x"}  # metadata and arrays stay readable
        with pytest.raises(lv.CorruptError, match="malformed layout"):
            rec.load()


def test_an_exported_npz_with_a_bad_fields_layout_is_refused(tmp_path: Path) -> None:
    with lv.Store.open(tmp_path / "s.lv") as store:
        store["k"] = {"t": 1, "x": np.arange(3)}
        store.export(tmp_path / "e.npz")
    with zipfile.ZipFile(tmp_path / "e.npz") as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members["__lazyvault__.json"])
    assert manifest["records"][0]["layout"] == {"fields": None}
    manifest["records"][0]["layout"] = {"fields": ["t"]}  # leaves out the array
    members["__lazyvault__.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(tmp_path / "bad.npz", "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    with (
        lv.Store.open(tmp_path / "t.lv") as store,
        pytest.raises(lv.InvalidFileError, match="bad layout"),
    ):
        store.import_file(tmp_path / "bad.npz")


def test_an_int_longer_than_the_readers_int_to_text_limit_still_loads(tmp_path: Path) -> None:
    # The writer stores an int as text when its own limit allows; a reader whose
    # limit (sys.set_int_max_str_digits) is lower must still get the int back.
    import sys

    big = -(10**5000) - 7
    before = sys.get_int_max_str_digits()
    try:
        sys.set_int_max_str_digits(0)
        with lv.Store.open(tmp_path / "s.lv") as store:
            store["compact"] = {"h": big, "a": np.zeros(1)}
            store["full"] = {"h": big, "a": {"b": np.zeros(1)}}
            blob = lv.dumps({"h": big, "a": np.zeros(1)})
        sys.set_int_max_str_digits(640)
        with lv.Store.open(tmp_path / "s.lv", mode="r") as reader:
            assert compact(json.dumps(entry_of(reader["compact"])["layout"]))
            for key in ("compact", "full"):
                assert reader[key].h == big
                assert reader[key].load()["h"] == big
        assert lv.loads(blob)["h"] == big
    finally:
        sys.set_int_max_str_digits(before)
