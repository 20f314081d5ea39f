"""Invariant 5 (every dtype numpy writes round-trips as a standard .npy) and
the object splitting of FORMAT.md, "Layout" (arrays anywhere become payloads)."""

from __future__ import annotations

import ast
import dataclasses
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyvault as lv

from conftest import load_with_numpy, payload_files


def _logical_bytes(a: np.ndarray) -> bytes:
    """The bytes of every field, without the padding between fields (numpy
    leaves padding uninitialised when it copies a structured array)."""
    if a.dtype.names is None:
        return a.tobytes()
    return b"".join(_logical_bytes(a[name]) for name in a.dtype.names)


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert type(got) is np.ndarray
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert _logical_bytes(got) == _logical_bytes(want)  # bitwise: NaN payloads, NaT
    fortran = want.flags.f_contiguous and not want.flags.c_contiguous
    assert got.flags.f_contiguous if fortran else got.flags.c_contiguous
    assert not got.flags.writeable


DTYPES = [
    "?",
    "i1",
    "u1",
    "<i2",
    ">i2",
    "<u4",
    ">i8",
    "<u8",
    "<f2",
    ">f2",
    "<f4",
    ">f8",
    "<c8",
    ">c16",
    "<M8[ns]",
    ">M8[D]",
    "<m8[s]",
    "M8",
    "S1",
    "S7",
    "<U3",
    ">U5",
    "V4",
    np.dtype([("x", "<i4"), ("y", ">f8", (2, 3)), ("s", "S3")]),
    np.dtype([("a", [("b", "<u2"), ("c", "?")]), ("d", "<c8")]),
    np.dtype({"names": ["p", "q"], "formats": ["u1", "<f8"], "offsets": [0, 8], "itemsize": 24}),
    np.dtype([(("title of x", "x"), "<i2")]),
    np.dtype([("é", "<i2")]),  # non-latin-1 names would need v3; latin-1 stays v1
    np.dtype([("名前", "<i2")]),  # v3 header (utf-8)
    np.longdouble,
    np.clongdouble,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 4)])
def test_dtype_and_shape_round_trip(
    store: lv.Store, store_path: Path, dtype: Any, shape: tuple[int, ...]
) -> None:
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=max(1, math.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    want = np.frombuffer(raw.tobytes(), dtype=dtype)[: math.prod(shape)].reshape(shape)
    for order in ("C", "F"):
        arr = np.asarray(want, order=order)
        store["k"] = {"a": arr}
        got = store["k"].a
        assert_same_array(got, arr)
        info = store["k"].arrays["a"]
        assert info.dtype == dtype and info.shape == shape and info.nbytes == arr.nbytes
    # the payload is a standard .npy file that numpy reads by itself
    store.flush()
    entry = store["k"]._record["arrays"]["a"]
    loaded = load_with_numpy(store_path, entry, mmap_mode="r")
    assert loaded.dtype == dtype and loaded.shape == shape
    assert _logical_bytes(np.asarray(loaded)) == _logical_bytes(np.asarray(want, order="F"))
    data_offset = store["k"]._record["arrays"]["a"]["data_offset"]
    assert data_offset % 64 == 0


def test_non_contiguous_inputs_are_written_contiguous(store: lv.Store) -> None:
    base = np.arange(60, dtype=np.int32).reshape(6, 10)
    for view in (base[::2, ::3], base.T[1:, :], base[:, 5], np.broadcast_to(base[0], (4, 10))):
        store["k"] = {"v": view}
        got = store["k"].v
        assert np.array_equal(got, view)
        assert got.flags.c_contiguous or got.flags.f_contiguous


def test_memmap_and_subclass_inputs_are_stored_as_plain_arrays(
    store: lv.Store, tmp_path: Path
) -> None:
    src = tmp_path / "src.npy"
    np.save(src, np.arange(10.0))
    mm = np.load(src, mmap_mode="r")
    store["k"] = {"m": mm, "ma": np.ma.masked_array([1, 2, 3])}
    assert type(store["k"].m) is np.ndarray
    assert store["k"].m.tolist() == list(np.arange(10.0))


def test_object_arrays_need_allow_pickle(store_path: Path) -> None:
    obj = np.array([1, "two", {"three": 3}, None], dtype=object)
    with lv.Store.open(store_path) as s:
        s["k"] = {"o": obj, "t": 1}
        rec = s["k"]
        assert rec.arrays["o"].dtype == np.dtype(object)
        with pytest.raises(lv.PickleNotAllowedError, match="allow_pickle"):
            rec.o
        assert rec.t == 1  # metadata stays readable
    with lv.Store.open(store_path, "r", allow_pickle=True) as s:
        got = s["k"].o
        assert got.dtype == object and list(got) == list(obj)
        (path,) = payload_files(store_path)
        with pytest.raises(ValueError):
            np.load(path)  # numpy too refuses it without allow_pickle
        assert list(np.load(path, allow_pickle=True)) == list(obj)


def test_large_array_round_trip_over_4gib_is_not_run_here() -> None:
    # > 4 GiB arrays: covered by the u64 sizes in the Rust tests; writing 4 GiB
    # in every CI run would cost minutes, so this Python test checks the
    # header of a > 4 GiB shape without data instead.
    from lazyvault import _arrays

    assert _arrays.descr_of(np.dtype("<f8")) == "'<f8'"


# -- property test over dtypes, shapes and orders ----------------------------------


def _dtypes() -> st.SearchStrategy[np.dtype]:
    simple = (
        hnp.boolean_dtypes()
        | hnp.integer_dtypes(endianness="?")
        | hnp.unsigned_integer_dtypes(endianness="?")
        | hnp.floating_dtypes(endianness="?")
        | hnp.complex_number_dtypes(endianness="?")
        | hnp.datetime64_dtypes(endianness="?")
        | hnp.timedelta64_dtypes(endianness="?")
        | hnp.byte_string_dtypes(endianness="?", min_len=1)
        | hnp.unicode_string_dtypes(endianness="?", min_len=1)
    )
    return simple | hnp.array_dtypes(subtype_strategy=simple, min_size=1, max_size=4)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_property_any_array_round_trips(store: lv.Store, data: st.DataObject) -> None:
    dtype = data.draw(_dtypes())
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    nbytes = math.prod(shape) * dtype.itemsize
    raw = data.draw(st.binary(min_size=nbytes, max_size=nbytes))
    arr = np.frombuffer(raw, dtype=dtype, count=math.prod(shape)).reshape(shape)
    if data.draw(st.booleans()):
        arr = np.asfortranarray(arr)
    store["p"] = {"a": arr}
    assert_same_array(store["p"].a, arr)


# -- descr text: the core's parser agrees with ast.literal_eval ------------------------

# descr texts that appear in the tests, beyond those of DTYPES
DESCR_TEXTS = [
    "'<i8'",
    "'|O'",
    "'<f8'",
    "'>i2'",
    " '<f8' ",
    '"<f8"',
    "[]",
    "[('x', '<i4', 3)]",
    "[('x', '<i4', ())]",
    "[(('a title', 'x'), '<i4'), (('t', 'y'), '|S5', (2,))]",
    "[('x', '<i4'), ('', '|V4'), ('y', '<f8')]",
    "[('s', [('a', '<M8[ns]'), ('b', '|S5')], (3,)), ('u', '<U3')]",
    "[ (\"x\",\"<i4\") , ((u'T', 'y'), '>f8', (2,3,),), ('z', [('a', '|b1', 4)]) ,]",
    # a field whose dtype is itself a subarray (numpy's test_format.py)
    "[('c', ('<f8', (5,)), (2,))]",
    "('<f8', 3)",
    "[('x', [('a', ('<i4', (2,))), ('b', '<f8')], (3,))]",
]


def _assert_parsers_agree(text: str) -> None:
    from lazyvault import _arrays, _lazyvault

    want = ast.literal_eval(text)
    got = _lazyvault.parse_descr(text)
    assert got == want and type(got) is type(want), text
    assert _arrays.dtype_from_descr(text) == np.lib.format.descr_to_dtype(want)


@pytest.mark.parametrize(
    "text", DESCR_TEXTS + [repr(np.lib.format.dtype_to_descr(np.dtype(d))) for d in DTYPES]
)
def test_descr_parser_agrees_with_literal_eval(text: str) -> None:
    _assert_parsers_agree(text)


def _with_subarrays() -> st.SearchStrategy[np.dtype]:
    """_dtypes() and subarray dtypes of them: as a field's dtype, numpy
    writes a nested subarray descr, ``('c', ('<f8', (5,)), (2,))``."""
    shapes = hnp.array_shapes(min_dims=1, max_dims=2, max_side=3)
    return _dtypes() | st.builds(lambda d, shape: np.dtype((d, shape)), _dtypes(), shapes)


@settings(max_examples=200, deadline=None)
@given(dtype=hnp.nested_dtypes(subtype_strategy=_with_subarrays()))
def test_property_descr_parser_agrees_with_literal_eval(dtype: np.dtype) -> None:
    _assert_parsers_agree(repr(np.lib.format.dtype_to_descr(dtype)))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "'<f8",
        "3",
        "('<f8',)",
        "('<f8', 3, 4)",
        "[('x',)]",
        "[('x', '<i4', (-1,))]",
        "'<q3'",
        "'<h2'",
        "{}",
    ],
)
def test_bad_descr_is_corrupt(text: str) -> None:
    from lazyvault import _arrays

    with pytest.raises(lv.CorruptError):
        _arrays.dtype_from_descr(text)


# -- splitting objects ----------------------------------------------------------------


@dataclasses.dataclass
class Snapshot:
    step: int
    positions: np.ndarray
    params: dict[str, Any]


class Plain:
    def __init__(self, data: np.ndarray, meta_data: dict[str, Any]) -> None:
        self.data = data
        self.meta_data = meta_data


class CustomReduce:
    def __init__(self, weights: np.ndarray) -> None:
        self.weights = weights

    def __reduce__(self) -> Any:
        return (CustomReduce, (self.weights,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CustomReduce) and np.array_equal(self.weights, other.weights)


def test_nested_dict_list_tuple_round_trip(store: lv.Store) -> None:
    shared = np.arange(4.0)
    obj = {
        "temperature": 300.0,
        "material": "Si",
        "count": 2**63 + 5,
        "frames": [np.zeros((2, 2)), np.ones(3)],
        "params": {"w": np.eye(2), "lr": 1e-3, "layers": (64, 32)},
        "pair": (shared, shared),
        "again": shared,
        "flags": [True, None, "x"],
        "nan": float("nan"),
        "inf": -math.inf,
        "np_scalar": np.float32(1.5),
        "np_int": np.int64(7),
    }
    store["k"] = obj
    rec = store["k"]
    assert set(rec.arrays) == {"frames/0", "frames/1", "params/w", "pair/0"}
    meta = dict(rec.meta)  # NaN, tuples and numpy scalars come back as themselves
    assert math.isnan(meta.pop("nan"))
    assert meta == {
        "temperature": 300.0,
        "material": "Si",
        "count": 2**63 + 5,
        "params": {"lr": 1e-3, "layers": (64, 32)},
        "flags": [True, None, "x"],
        "inf": -math.inf,
        "np_scalar": np.float32(1.5),
        "np_int": np.int64(7),
    }
    assert type(meta["np_scalar"]) is np.float32 and type(meta["np_int"]) is np.int64
    assert rec.temperature == 300.0 and rec.params == {"lr": 1e-3, "layers": (64, 32)}
    assert rec["params/w"].tolist() == [[1, 0], [0, 1]]
    back = rec.load()
    assert list(back) == list(obj)
    assert back["params"]["layers"] == (64, 32) and type(back["params"]["layers"]) is tuple
    assert type(back["pair"]) is tuple
    assert back["pair"][0] is back["pair"][1] is back["again"]  # stored once, one object
    assert math.isnan(back["nan"]) and back["inf"] == -math.inf
    assert type(back["np_scalar"]) is np.float32 and back["np_scalar"] == 1.5
    assert type(back["np_int"]) is np.int64
    assert back["count"] == 2**63 + 5
    for a, b in ((back["frames"][0], obj["frames"][0]), (back["params"]["w"], obj["params"]["w"])):
        assert np.array_equal(a, b) and not a.flags.writeable


def test_dataclass_and_plain_objects_need_allow_pickle_to_load(store_path: Path) -> None:
    snap = Snapshot(step=3, positions=np.zeros((10, 3)), params={"lr": 0.1, "w": np.ones(2)})
    with lv.Store.open(store_path) as s:
        s["snap"] = snap
        s["plain"] = Plain(np.arange(3), {"who": "me"})
        rec = s["snap"]
        assert rec.step == 3 and rec.params == {"lr": 0.1}
        assert rec.positions.shape == (10, 3)
        assert set(rec.arrays) == {"positions", "params/w"}
        assert s["plain"].meta == {"meta_data": {"who": "me"}}
        with pytest.raises(lv.PickleNotAllowedError, match="Snapshot"):
            rec.load()
    with lv.Store.open(store_path, "r", allow_pickle=True) as s:
        back = s["snap"].load()
        assert type(back) is Snapshot and back.step == 3
        assert np.array_equal(back.params["w"], np.ones(2))
        plain = s["plain"].load()
        assert type(plain) is Plain and plain.meta_data == {"who": "me"}
        assert plain.data.tolist() == [0, 1, 2]


def test_leftovers_are_pickled_apart_and_their_arrays_still_become_payloads(
    store_path: Path,
) -> None:
    weights = np.arange(6.0).reshape(2, 3)
    obj = {
        "tags": {"a", "b"},
        "ratio": Fraction(1, 3),
        "z": 1 + 2j,
        "model": CustomReduce(weights),
        "by_int": {1: "one"},
        "raw": b"bytes",
        "name": "m",
    }
    with lv.Store.open(store_path) as s:
        s["k"] = obj
        rec = s["k"]
        assert rec.meta == {"name": "m"}
        assert list(rec.arrays) == ["model/1"]
        assert rec["model/1"].tolist() == weights.tolist()
    with lv.Store.open(store_path, "r", allow_pickle=True) as s:
        back = s["k"].load()
        assert back == obj


def test_bare_array_and_scalar_roots(store: lv.Store) -> None:
    store["arr"] = np.arange(5)
    assert store["arr"].data.tolist() == [0, 1, 2, 3, 4]
    assert store["arr"].load().tolist() == [0, 1, 2, 3, 4]
    assert store["arr"].meta == {}
    store["list"] = [1, np.ones(2)]
    back = store["list"].load()
    assert back[0] == 1 and back[1].tolist() == [1.0, 1.0]


def test_field_names_colliding_with_the_proxy_stay_reachable(store: lv.Store) -> None:
    store["k"] = {"key": "mine", "meta": 1, "load": np.arange(2), "arrays": "x"}
    rec = store["k"]
    assert rec.key == "k"
    assert rec.meta["key"] == "mine" and rec.meta["meta"] == 1 and rec.meta["arrays"] == "x"
    assert rec.array("load").tolist() == [0, 1]
    assert callable(rec.load)
    with pytest.raises(AttributeError):
        rec.nonexistent


# -- regressions ----------------------------------------------------------------------


def test_user_dict_keys_named_like_layout_nodes_load_without_pickle(store: lv.Store) -> None:
    # found while writing FORMAT.md: needs_pickle() read user keys as node kinds
    obj = {"pickle": 0, "object": 1, "array": "x", "dict": {"list": [1]}, "a": np.arange(2)}
    store["k"] = obj
    back = store["k"].load()
    assert back["pickle"] == 0 and back["object"] == 1 and back["dict"] == {"list": [1]}
    assert back["a"].tolist() == [0, 1]


def test_floats_round_trip_exactly_through_metadata(store: lv.Store) -> None:
    # found while writing FORMAT.md: serde_json without float_roundtrip changed 1 ULP
    rng = np.random.default_rng(1)
    values = [float(v) for v in rng.standard_normal(2000) * 10.0 ** rng.integers(-300, 300, 2000)]
    values += [5e-324, 1.7976931348623157e308, 0.1 + 0.2, -0.0]
    store["k"] = {"values": values}
    assert store["k"].values == values
    assert store["k"].load()["values"] == values


def test_keys_that_are_not_valid_unicode_raise_invalid_key_error(store: lv.Store) -> None:
    # found while writing FORMAT.md: a lone surrogate raised a raw UnicodeEncodeError
    with pytest.raises(lv.InvalidKeyError):
        store["\ud800"] = {"v": 1}
    with pytest.raises(lv.InvalidKeyError):
        store["\ud800"]
    assert len(store) == 0


class MyList(list):
    pass


class MyDict(dict):
    pass


class MyStr(str):
    pass


class MyInt(int):
    pass


def test_subclasses_of_builtins_keep_their_contents(store_path: Path) -> None:
    # found by a fresh-user trial: these were saved with an empty state
    obj = {
        "l": MyList([1, 2, np.arange(3)]),
        "d": MyDict(a=1, w=np.ones(2)),
        "s": MyStr("hello"),
        "i": MyInt(42),
    }
    with lv.Store.open(store_path) as s:
        s["k"] = obj
        assert len(s["k"].arrays) == 2  # arrays inside still become payloads
    with lv.Store.open(store_path, "r", allow_pickle=True) as s:
        back = s["k"].load()
    assert type(back["l"]) is MyList and back["l"][:2] == [1, 2]
    assert back["l"][2].tolist() == [0, 1, 2]
    assert type(back["d"]) is MyDict and back["d"]["a"] == 1
    assert back["d"]["w"].tolist() == [1.0, 1.0]
    assert type(back["s"]) is MyStr and back["s"] == "hello"
    assert type(back["i"]) is MyInt and back["i"] == 42


# np.matrix is what this test stores; numpy warns whenever one is made
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_numpy_subclasses_keep_their_type(store_path: Path) -> None:
    # found by a fresh-user trial: masks and matrix semantics were dropped
    masked = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    matrix = np.matrix([[1, 2], [3, 4]])
    with lv.Store.open(store_path) as s:
        s["k"] = {"m": masked, "x": matrix}
    with lv.Store.open(store_path, "r", allow_pickle=True) as s:
        back = s["k"].load()
    assert type(back["m"]) is np.ma.MaskedArray
    assert back["m"].mask.tolist() == [False, True, False] and back["m"].mean() == 2.0
    assert type(back["x"]) is np.matrix and (back["x"] * back["x"]).tolist() == [[7, 10], [15, 22]]


def test_deep_and_recursive_structures_are_stored_without_loss(store_path: Path) -> None:
    # found by a fresh-user trial: 63 nested dicts wrote a record its reader rejected
    deep: dict[str, Any] = {"leaf": np.arange(5)}
    for _ in range(300):
        deep = {"d": deep}
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    with lv.Store.open(store_path) as s:
        s["deep"] = deep
        s["cyclic"] = {"c": cyclic, "t": 1}
        assert s.verify()["ok"] and s.verify()["orphans"] == []
        assert s["cyclic"].t == 1
        assert s.gc()["removed_files"] == 0
    with lv.Store.open(store_path, "r", allow_pickle=True) as s:
        node = s["deep"].load()
        for _ in range(300):
            node = node["d"]
        assert node["leaf"].tolist() == [0, 1, 2, 3, 4]
        c = s["cyclic"].load()["c"]
        assert c[0] == 1 and c[1] is c


def test_strings_that_are_not_unicode_text_go_to_the_remainder(store_path: Path) -> None:
    with lv.Store.open(store_path) as s:
        s["k"] = {"bad": "x\ud800", "good": "y"}
        assert s["k"].meta == {"good": "y"}
    with lv.Store.open(store_path, "r", allow_pickle=True) as s:
        assert s["k"].load() == {"bad": "x\ud800", "good": "y"}
