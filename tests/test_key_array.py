"""``find`` keeps the matching keys packed in Rust: ``KeyArray``, a sequence of ``str`` that makes
each ``str`` when it is read, behaves as a list of the same keys would; ``Results`` over it works as
over a list; ``find(q).to_arrow()`` reads the keys in place."""

from __future__ import annotations

import copy
import pickle
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyvault as lv
from lazyvault._lazyvault import KeyArray

# keys are Unicode text (no lone surrogates), empty ones included: KeyArray holds any str
_keys = st.lists(st.text(st.characters(exclude_categories=("Cs",)), max_size=6), max_size=12)
_index = st.integers(-20, 20)
_bound = st.none() | st.integers(-20, 20)
_slice = st.builds(slice, _bound, _bound, st.none() | st.integers(-5, 5).filter(bool))


def _outcome(f: Any) -> Any:
    """What ``f()`` gives, or the type of what it raises."""
    try:
        return ("value", f())
    except Exception as e:
        return ("raises", type(e))


@settings(max_examples=300, deadline=None)
@given(keys=_keys, indices=st.lists(_index, max_size=8), slices=st.lists(_slice, max_size=8))
def test_a_key_array_behaves_as_the_list_of_its_keys(
    keys: list[str], indices: list[int], slices: list[slice]
) -> None:
    a = KeyArray(keys)
    assert len(a) == len(keys) and bool(a) == bool(keys)
    assert list(a) == keys and a.to_list() == keys and list(reversed(a)) == keys[::-1]
    assert a == keys and keys == a and a == tuple(keys) and a == KeyArray(keys)
    assert not (a != keys)
    for i in indices:
        assert _outcome(lambda i=i: a[i]) == _outcome(lambda i=i: keys[i])
    for s in slices:
        part = a[s]
        assert type(part) is KeyArray and part == keys[s] and list(part) == keys[s]
        assert part[::-1] == keys[s][::-1]
    for k in [*keys, "absent", "", "\x00"]:
        assert (k in a) == (k in keys)
        assert a.count(k) == keys.count(k)
        assert _outcome(lambda k=k: a.index(k)) == _outcome(lambda k=k: keys.index(k))
        for b, e in ((1, 99), (-2, 10**6), (3, 1), (-(10**6), -1)):
            got = _outcome(lambda k=k, b=b, e=e: a.index(k, b, e))
            assert got == _outcome(lambda k=k, b=b, e=e: keys.index(k, b, e))
    assert a != [*keys, "x"] and (a != ["x", *keys[1:]] or keys[:1] == ["x"])


def test_a_key_array_is_a_sequence_of_str() -> None:
    a = KeyArray(["b", "a", "ü🦀"])
    assert isinstance(a, Sequence)
    assert [type(k) for k in a] == [str, str, str] and type(a[0]) is str
    it = iter(a)
    assert next(it) == "b" and list(it) == ["a", "ü🦀"]
    assert a[np.int64(1)] == "a" and a[True] == "a"  # anything with __index__, as for a list
    assert a[::-1] == ["ü🦀", "a", "b"] and a[10:] == [] and type(a[10:]) is KeyArray
    assert KeyArray(a) == a and KeyArray(iter(["x"])) == ["x"] and KeyArray([]) == ()


def test_a_key_array_refuses_what_a_list_refuses() -> None:
    a = KeyArray(["a", "b"])
    with pytest.raises(IndexError, match="out of range"):
        a[2]
    with pytest.raises(IndexError):
        a[-3]
    with pytest.raises(IndexError):
        a[2**80]
    with pytest.raises(TypeError, match="integers or slices, not str"):
        a["a"]
    with pytest.raises(TypeError, match="not float"):
        a[1.0]
    with pytest.raises(ValueError):  # slice step cannot be zero
        a[::0]
    with pytest.raises(ValueError, match="'c' is not in KeyArray"):
        a.index("c")
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)
    with pytest.raises(TypeError):  # immutable
        a[0] = "c"  # type: ignore[index]
    with pytest.raises(TypeError, match="not a str"):
        KeyArray("ab")
    with pytest.raises(TypeError, match="holds str, not int"):
        KeyArray(["a", 1])  # type: ignore[list-item]
    with pytest.raises(UnicodeEncodeError):
        KeyArray(["\ud800"])
    assert "\ud800" not in a and a.count("\ud800") == 0


def test_equality_is_that_of_a_list_of_the_keys() -> None:
    a = KeyArray(["a", "b"])
    assert a == ["a", "b"] and a == ("a", "b") and ["a", "b"] == a
    assert a != ["b", "a"] and a != ["a"] and a != ["a", "b", "c"] and a != "ab"
    assert a != ["a", 2] and a != {"a", "b"} and a != None  # noqa: E711

    class Anything:
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = None  # type: ignore[assignment]

    # an item that is not a str is asked, as a list asks it
    assert a == [Anything(), "b"] and Anything() in a and a.count(Anything()) == 2
    assert a.index(Anything()) == 0 and ["a", "b"] == [Anything(), "b"]


def test_repr_is_short() -> None:
    assert repr(KeyArray([])) == "KeyArray([])"
    assert repr(KeyArray(["a", "it's"])) == """KeyArray(['a', "it's"])"""
    ten = [f"k{i}" for i in range(10)]
    assert repr(KeyArray(ten)) == f"KeyArray({ten!r})"
    many = KeyArray(f"k{i}" for i in range(1000))
    assert repr(many) == "KeyArray(['k0', 'k1', 'k2', 'k3', 'k4', ...], 1000 keys)"


def test_a_key_array_pickles_as_its_keys() -> None:
    a = KeyArray(["run-1", "", "ünï", "🦀/x"])
    assert a.__reduce__() == (KeyArray, (["run-1", "", "ünï", "🦀/x"],))
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(a, protocol))
        assert type(back) is KeyArray and back == a
    assert copy.copy(a) == a and copy.deepcopy(a) == a


@pytest.fixture
def filled(store: lv.Store) -> lv.Store:
    for i in range(40):
        store[f"r{i:03}"] = {"t": i, "m": "Si" if i % 3 else "Ge", "x": np.arange(2)}
    store.flush()
    return store


QUERY = "t >= 10 and m == 'Si'"
EXPECTED = [f"r{i:03}" for i in range(10, 40) if i % 3]


def _check_find(handle: lv.Handle, expected: list[str], everything: list[str]) -> None:
    results = handle.find(QUERY)
    assert type(results._keys) is KeyArray and results._keys == expected
    assert len(results) == len(expected) and results.keys() == expected
    assert type(results.keys()) is list and type(handle.keys(QUERY)) is list
    assert handle.keys(QUERY) == expected
    assert [r.key for r in results] == expected and results[-1].key == expected[-1]
    assert results[1:3].keys() == expected[1:3] and type(results[::2]._keys) is KeyArray
    assert results[::-1].keys() == expected[::-1]
    assert f"{len(expected)} records ['{expected[0]}', " in repr(results)
    assert str(results).splitlines()[0].startswith(f"lazyvault.Results: {len(expected)} records")
    every = handle.find()
    assert type(every._keys) is KeyArray and every.keys() == everything
    assert handle.find("t < 0").keys() == [] and len(handle.find("t < 0")) == 0
    table = results.to_arrow()
    assert table.equals(handle.to_arrow(QUERY))
    assert table.column("key").to_pylist() == expected
    assert results[::-1].to_arrow().column("key").to_pylist() == expected[::-1]
    assert results.to_polars()["key"].to_list() == expected
    assert results.to_pandas().index.tolist() == expected
    assert handle.to_arrow(keys=results._keys).equals(table)
    with pytest.raises(ValueError, match="not both"):
        handle.to_arrow(QUERY, keys=results._keys)


def test_find_on_a_writer_a_reader_and_an_archive(
    filled: lv.Store, store_path: Path, tmp_path: Path
) -> None:
    everything = list(filled)
    _check_find(filled, EXPECTED, everything)
    with lv.Store.open(store_path, mode="r") as reader:
        _check_find(reader, EXPECTED, everything)
    # a writer's unflushed changes are found too
    filled["r100"] = {"t": 100, "m": "Si"}
    del filled["r011"]
    changed = [k for k in EXPECTED if k != "r011"] + ["r100"]
    _check_find(filled, changed, list(filled))
    filled.export(tmp_path / "a.lvz")
    with lv.Store.open(tmp_path / "a.lvz") as archive:
        assert isinstance(archive, lv.Archive)
        _check_find(archive, changed, list(archive))


def test_results_pickle_as_their_records_and_refuse_changes_not_yet_committed(
    filled: lv.Store, store_path: Path, tmp_path: Path
) -> None:
    """A pickled Results reads its store's last commit: from a writer holding changes it has not
    committed, it would have given old values and keys it could not read (a fresh user's trial)."""
    results = filled.find(QUERY)
    back = pickle.loads(pickle.dumps(results))
    assert type(back) is lv.Results and type(back._keys) is KeyArray and back.keys() == EXPECTED
    assert [r.t for r in back] == [r.t for r in results]
    back._store.close()
    filled["r100"] = {"t": 100, "m": "Si"}
    filled["r010"] = {"t": 999, "m": "Si"}
    changed = filled.find(QUERY)
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        with pytest.raises(pickle.PicklingError, match="flush"):
            pickle.dumps(changed, protocol)
    filled.flush()
    found = filled.find(QUERY)
    filled["r200"] = {"t": 200, "m": "Ge"}  # a change after the find: still refused
    with pytest.raises(pickle.PicklingError, match="holds changes not yet committed"):
        pickle.dumps(found)
    filled.flush()
    back = pickle.loads(pickle.dumps(changed))
    assert back.keys() == changed.keys() and back[-1].key == "r100" and back[0].t == 999
    back._store.close()
    # a reader's results and an archive's pickle as theirs
    with lv.Store.open(store_path, mode="r") as reader:
        back = pickle.loads(pickle.dumps(reader.find(QUERY)))
        assert back.keys() == changed.keys() and back[0].t == 999
        back._store.close()
        kept = reader.find(QUERY)
    # closed, they would come back at another version (a fresh user's trial): refused
    with pytest.raises(lv.errors.ClosedError, match="cannot be pickled"):
        pickle.dumps(kept)
    filled.export(tmp_path / "a.lvz")
    with lv.Store.open(tmp_path / "a.lvz") as archive:
        back = pickle.loads(pickle.dumps(archive.find(QUERY)))
        assert back.keys() == changed.keys() and back[-1].t == 100
        back._store.close()


def test_results_find_their_records_by_handle_and_key_and_name_themselves_in_errors(
    filled: lv.Store, store_path: Path
) -> None:
    """``in``/``index``/``count`` matched nothing (each access builds a new Record, and records
    compare by identity) and errors said "KeyArray" (a fresh user's trial)."""
    results = filled.find(QUERY)
    first, last = results[0], filled[EXPECTED[-1]]
    assert first in results and last in results and filled["r000"] not in results
    assert results.index(first) == 0 and results.index(last) == len(EXPECTED) - 1
    assert results.count(last) == 1 and results.count(filled["r000"]) == 0
    assert results.index(last, 2) == len(EXPECTED) - 1
    with pytest.raises(ValueError, match="record 'r011' is not in the results"):
        results.index(filled["r011"], 0, 1)
    with pytest.raises(ValueError, match="'r011' is not in the results"):
        results.index("r011")  # a key is not a record
    assert "r011" not in results and results.count("r011") == 0
    with lv.Store.open(store_path, mode="r") as reader:  # another handle's record
        assert reader[EXPECTED[0]] not in results and results.count(reader[EXPECTED[0]]) == 0
    with pytest.raises(IndexError, match=r"^Results index out of range$"):
        results[len(EXPECTED)]
    with pytest.raises(TypeError, match=r"^Results indices must be integers or slices, not str$"):
        results["r011"]  # type: ignore[call-overload]


def test_find_with_a_callable_still_gives_results(filled: lv.Store) -> None:
    results = filled.find(lambda r: r.t == 5)
    assert results.keys() == ["r005"] and results.to_arrow().num_rows == 1


def test_a_key_array_of_keys_not_held_is_a_missing_key(filled: lv.Store) -> None:
    with pytest.raises(lv.errors.MissingKeyError, match="nope"):
        filled.to_arrow(keys=KeyArray(["r001", "nope"]))


def test_find_and_its_arrow_table_make_no_str_per_key(store: lv.Store) -> None:
    n = 20_000
    store.update(((f"key-{i:06}", {"t": i}) for i in range(n)), progress=False)
    store.close()
    with lv.Store.open(store.path, mode="r") as reader:
        reader.find("t >= 0").to_arrow()  # warm: imports, the columns mapped
        tracemalloc.start()
        try:
            results = reader.find("t >= 0")
            table = results.to_arrow()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(results) == n and table.num_rows == n
        # 20,000 str objects would take over 1 MiB of Python memory; the keys are in Rust
        assert peak < 200_000, peak
        tracemalloc.start()
        try:
            keys = results.keys()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(keys) == n and peak > 1_000_000  # the list does make them
