"""The fast encodings of the common object (a dict of JSON scalars, tagged leaves and plain arrays),
in Python and in Rust (``_lazyvault.encode_flat``), against the generic walk: the same record byte
for byte (meta, layout, payload arguments, pickled remainder) for every object they take, and the
generic walk for every object they do not."""

from __future__ import annotations

import datetime
import json
import tempfile
from typing import Any
from zoneinfo import ZoneInfo

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import lazyvault as lv
from lazyvault import _layout, _lazyvault

ZONES = [
    datetime.UTC,
    datetime.timezone(datetime.timedelta(hours=-5)),
    datetime.timezone(datetime.timedelta(hours=1), "CET"),  # a name ISO text cannot keep
    datetime.timezone(datetime.timedelta(hours=1)),  # equal to it, but kept
    datetime.timezone(datetime.timedelta(seconds=1.5)),  # sub-second: not a tagged value
    ZoneInfo("Europe/Paris"),
    None,
]

# keys: text with "$" names (the escaped meta), the empty key and "data" (an array's default
# path), lone surrogates (not UTF-8 text)
keys = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["", "data", "$x", "$float", "$dict", "$tuple", "a/b", "a", "\ud800"]),
)

numpy_scalars = st.one_of(
    *(
        hnp.from_dtype(np.dtype(d))
        for d in ["<i1", "<u8", ">i4", "<f2", "<f4", "<f8", "?", "<M8[s]", "<m8[ms]", "<c8"]
    )
)

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=8),
    st.sampled_from(["\udfff", "a\ud800b"]),
    st.floats(),  # nan, inf too: tagged
    st.integers(min_value=-(2**70), max_value=2**70),  # beyond 64 bits: tagged
    st.dates(),
    st.builds(
        lambda d, tz: d.replace(tzinfo=tz),
        st.datetimes(),
        st.sampled_from(ZONES),
    ),
    numpy_scalars,
)

# the dtypes the Rust encoder covers, and some it leaves to the Python walk
DTYPES = ["<f8", "<f4", "<f2", "<i8", "<u4", "<i2", "|u1", "|i1", "?", "<c8", "<c16", "<q", "<L"]
DTYPES += [">i2", ">f8", "<U3", "S2", "<M8[ns]", "<m8[s]", "<f16"]

arrays = st.one_of(
    hnp.arrays(
        dtype=st.sampled_from([np.dtype(d) for d in DTYPES]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3),
    ),
    st.builds(lambda a: np.asfortranarray(a.reshape(2, 3)), st.just(np.arange(6.0))),
    st.just(np.arange(10, dtype="<i4")[::2]),  # not contiguous: copied
    st.just(np.array([{1}, "x"], dtype=object)),  # pickled payload
    st.just(np.ma.masked_array([1, 2], mask=[True, False])),  # a masked node: generic
)

other = st.one_of(
    st.dictionaries(st.text(max_size=3), leaves, max_size=3),
    st.lists(leaves, max_size=3),
    st.tuples(leaves),
    st.just({1, 2}),  # pickled remainder
    st.just(1 + 2j),
    st.just(np.longdouble(1)),
)


def flat_dicts(values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(keys, values, max_size=8)


def same_array_twice(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with one array under a second key too (one payload, two references)."""
    a = np.arange(4.0)
    return {**d, "first": a, "again": a}


objects = st.one_of(
    flat_dicts(st.one_of(leaves, arrays)),
    flat_dicts(st.one_of(leaves, arrays)).map(same_array_twice),
    flat_dicts(st.one_of(leaves, arrays, other)),
)


def comparable(encoded: tuple[Any, ...]) -> tuple[Any, ...]:
    """An encoding with each payload's data as bytes (views compare by value)."""
    meta, layout, payloads, pickled = encoded
    return meta, layout, [(*p[:5], bytes(p[5]), p[6]) for p in payloads], pickled


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(obj=objects)
def test_fast_encoding_is_the_generic_one(obj: dict[str, Any]) -> None:
    want = comparable(_layout.encode_generic(obj, "k"))
    assert comparable(_layout.encode(obj, "k")) == want
    flat = _layout._encode_flat(obj)
    if flat is not None:
        assert comparable(flat) == want


# the common object: what a user's loop of update() stores
COMMON = {
    "temperature": 300.5,
    "material": "Si",
    "step": 7,
    "ok": True,
    "started": datetime.datetime(2024, 3, 1, 12, tzinfo=datetime.UTC),
    "loss": float("nan"),
}


def test_the_common_object_takes_the_fast_path() -> None:
    obj = {
        **COMMON,
        "n": np.int64(3),
        "x": np.arange(64.0),
        "y": np.zeros((2, 3), dtype="<f4", order="F"),
    }
    flat = _layout._encode_flat(obj)
    assert flat is not None
    assert comparable(flat) == comparable(_layout.encode_generic(obj))


def test_other_objects_take_the_generic_walk() -> None:
    for obj in [
        {"nested": {"a": 1}},
        {"items": [1, 2]},
        {"tags": {"a"}},
        {"": np.arange(3)},
        {"text": "\ud800"},
        {"big": 10**5000},
        {"m": np.ma.masked_array([1.0])},
        {1: 2},
    ]:
        assert _layout._encode_flat(obj) is None


def test_a_named_timezone_is_not_taken_for_an_equal_unnamed_one() -> None:
    # timezones compare by offset alone: what ISO text keeps is known per object
    hour = datetime.timedelta(hours=1)
    named, plain = datetime.timezone(hour, "CET"), datetime.timezone(hour)
    when = datetime.datetime(2024, 3, 1, 12)
    for tz in [plain, named, plain, named]:
        encoded = _layout.encode({"t": when.replace(tzinfo=tz)})
        assert ('"$datetime"' in encoded[0]) == (tz is plain)
        assert (encoded[3] is not None) == (tz is named)  # pickled


# what the Rust encoder takes (and a few lone surrogates, which it leaves)
covered_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=8),
    st.floats(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.dates(),
    st.builds(
        lambda d, tz: d.replace(tzinfo=tz), st.datetimes(), st.sampled_from([None, datetime.UTC])
    ),
)
covered_arrays = hnp.arrays(
    dtype=st.sampled_from([np.dtype(d) for d in DTYPES[:13]]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3),
)
covered = st.dictionaries(keys, st.one_of(covered_leaves, covered_arrays), max_size=8)


def compact(text: str) -> str:
    """JSON text as the core stores it: no whitespace outside strings (the Python encoder writes
    ``", "`` and ``": "``)."""
    return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)


def rust_comparable(encoded: _lazyvault.Encoded) -> tuple[Any, ...]:
    return encoded.meta_json, encoded.layout_json, encoded.arrays, encoded.nbytes


def python_comparable(encoded: tuple[Any, ...]) -> tuple[Any, ...]:
    meta, layout, payloads, pickled = encoded
    assert pickled is None
    arrays = [(p[0], p[1], p[2], list(p[3]), p[4]) for p in payloads]
    return compact(meta), compact(layout), arrays, sum(len(bytes(p[5])) for p in payloads)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(obj=st.one_of(objects, covered))
def test_rust_encoding_is_the_generic_one(obj: dict[str, Any]) -> None:
    encoded = _lazyvault.encode_flat(obj)
    if encoded is not None:
        assert rust_comparable(encoded) == python_comparable(_layout.encode_generic(obj, "k"))


@settings(max_examples=600)
@given(x=st.one_of(st.floats(), st.integers(-(2**63), 2**64 - 1), st.text()))
@example(x=562949953421312.2)  # a fresh clone's run: exactly halfway between ...2 and ...3
def test_rust_writes_numbers_and_texts_as_python_json_does(x: Any) -> None:
    encoded = _lazyvault.encode_flat({"v": x})
    want = compact(_layout.encode_generic({"v": x})[0])
    if isinstance(x, str) and not _layout.text_ok(x):
        assert encoded is None
    else:
        assert encoded is not None and encoded.meta_json == want


def test_the_common_object_takes_the_rust_path() -> None:
    obj = {
        **COMMON,
        "day": datetime.date(999, 1, 2),
        "at": datetime.datetime(2024, 3, 1, 12, 0, 1, 5),
        "none": None,
        "x": np.arange(64.0),
        "after": -1e-7,
    }
    encoded = _lazyvault.encode_flat(obj)
    assert encoded is not None
    assert rust_comparable(encoded) == python_comparable(_layout.encode_generic(obj))
    assert encoded.layout_json.startswith('{"fields":["temperature"')  # a field after an array


def test_objects_the_rust_encoder_leaves_to_python() -> None:
    t = np.arange(3.0)
    for obj in [
        {"n": np.int64(3)},  # numpy scalars
        {"y": np.zeros((2, 3), order="F")},  # Fortran order
        {"y": np.arange(6)[::2]},  # not contiguous
        {"y": np.zeros(2, ">f8")},  # not native
        {"t": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))},
        {"a": t, "b": t},  # one array twice
        {"big": 2**64},
        {"m": np.ma.masked_array([1.0])},
        {"nested": {"a": 1}},
        {"": 1},
        {1: 2},
        [("a", 1)],
    ]:
        assert _lazyvault.encode_flat(obj) is None, obj


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(objs=st.lists(covered, min_size=1, max_size=4))
def test_records_written_through_rust_encoding_are_the_python_ones(
    objs: list[dict[str, Any]],
) -> None:
    with tempfile.TemporaryDirectory() as d, lv.Store.open(f"{d}/s.lv", "w") as store:
        rust, python = [], []
        for i, obj in enumerate(objs):
            encoded = _lazyvault.encode_flat(obj)
            if encoded is not None:
                rust.append((f"r{i}", encoded))
                python.append((f"p{i}", *_layout.encode_generic(obj, "k")))
        store._core.put_many(rust)
        store._core.put_many(python)
        for (r, _), (p, *_) in zip(rust, python, strict=True):
            got, want = json.loads(store._core.get(r)), json.loads(store._core.get(p))
            for entries in (got["arrays"], want["arrays"]):
                for e in entries.values():
                    for name in ("id", "pack", "pack_offset"):
                        e.pop(name, None)
            assert got == want
            back, again = store[r].load(), store[p].load()
            assert list(back) == list(again)
            for k, v in back.items():
                if isinstance(v, np.ndarray):
                    assert v.dtype == again[k].dtype and v.shape == again[k].shape
                    assert v.tobytes() == again[k].tobytes()
                else:
                    assert repr(v) == repr(again[k])
