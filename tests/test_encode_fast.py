"""The fast encoding of the common object (a dict of JSON scalars, tagged leaves and plain arrays)
against the generic walk: the same record byte for byte (meta, layout, payload arguments, pickled
remainder) for every object it takes, and the generic walk for every object it does not."""

from __future__ import annotations

import datetime
from typing import Any
from zoneinfo import ZoneInfo

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazyvault import _layout

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

arrays = st.one_of(
    hnp.arrays(
        dtype=st.sampled_from([np.dtype(d) for d in ["<f8", ">i2", "<U3", "S2", "?", "<M8[ns]"]]),
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


def test_the_common_object_takes_the_fast_path() -> None:
    obj = {
        "temperature": 300.5,
        "material": "Si",
        "step": 7,
        "ok": True,
        "started": datetime.datetime(2024, 3, 1, 12, tzinfo=datetime.UTC),
        "loss": float("nan"),
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
