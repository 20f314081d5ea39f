"""Malformed layouts (schema/FORMAT.md, "Layout") read back through every
path that reads one: ``lv.loads`` of a blob, an ``.lvz`` archive, a store's
record, a record pickled by value or passed by reference. Each raises
:class:`CorruptError`, with or without ``allow_pickle``, before anything is
built."""

from __future__ import annotations

import datetime
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pytest

import lazyvault as lv
from lazyvault import _arrays, _layout, _lazyvault

ARRAYS = {"x": np.arange(3)}

MALFORMED: list[Any] = [
    pytest.param([1, 2], id="json-array-as-node"),
    pytest.param({}, id="no-member"),
    pytest.param({"dict": {}, "list": []}, id="two-members"),
    pytest.param({"eict": {}}, id="unknown-kind"),
    pytest.param({"dict": [1]}, id="dict-of-list"),
    pytest.param({"list": {"a": 1}}, id="list-of-dict"),
    pytest.param({"tuple": 3}, id="tuple-of-int"),
    pytest.param({"array": "missing"}, id="missing-array"),
    pytest.param({"array": 0}, id="array-not-a-path"),
    pytest.param({"float": "NaN"}, id="float-not-non-finite"),
    pytest.param({"float": 1.5}, id="float-of-number"),
    pytest.param({"scalar": ["|O", 1]}, id="scalar-object-dtype"),
    pytest.param({"scalar": ["<c16", 1]}, id="scalar-complex-dtype"),
    pytest.param({"scalar": ["nonsense", 1]}, id="scalar-unknown-dtype"),
    pytest.param({"scalar": ["<f8"]}, id="scalar-without-value"),
    pytest.param({"scalar": ["<f8", "1"]}, id="scalar-of-text"),
    pytest.param({"$float": "NaN"}, id="tag-float-spelling"),
    pytest.param({"$int": "+5"}, id="tag-int-plus"),
    pytest.param({"$int": 5}, id="tag-int-number"),
    pytest.param({"$datetime": "yesterday"}, id="tag-datetime-text"),
    pytest.param({"$datetime": "2024-03-01T00:00:00[Europe/Paris]"}, id="tag-zone-no-offset"),
    pytest.param({"$datetime": "2024-03-01T00:00:00+01:00[../../etc]"}, id="tag-zone-path"),
    pytest.param({"$date": "2024-02-30"}, id="tag-date-invalid"),
    pytest.param({"$numpy": ["<c16", 1]}, id="tag-numpy-complex"),
    pytest.param({"$numpy": ["<i1", 300]}, id="tag-numpy-overflow"),
    pytest.param({"$numpy": ["<i8", 1.5]}, id="tag-numpy-float-as-int"),
    pytest.param({"$numpy": ["<M8[s]", 5]}, id="tag-numpy-datetime-number"),
    pytest.param({"$numpy": ["<M8[s]", "soon"]}, id="tag-numpy-datetime-text"),
    pytest.param({"$numpy": ["<f4", {"$float": "x"}]}, id="tag-numpy-bad-float"),
    pytest.param({"$tuple": [1]}, id="tag-tuple-is-meta-only"),
    pytest.param({"$dict": {"a": 1}}, id="tag-dict-is-meta-only"),
    pytest.param({"$set": [1]}, id="tag-unknown"),
    pytest.param({"object": {"class": "no colon", "state": {}}}, id="class-spec-without-colon"),
    pytest.param({"object": {"class": 3, "state": {}}}, id="class-spec-not-text"),
    pytest.param({"object": {"class": "collections:OrderedDict"}}, id="object-without-state"),
    pytest.param({"object": {"class": "collections:OrderedDict", "state": [1]}}, id="state-list"),
    pytest.param({"pickle": 0}, id="pickle-without-remainder"),
    pytest.param({"pickle": -1}, id="pickle-negative"),
    pytest.param({"pickle": "0"}, id="pickle-index-text"),
    pytest.param({"dict": {"ok": 1, "deep": {"list": [{"array": "nope"}]}}}, id="nested"),
    # the compact layout (format 1.5), over meta {} and the array "x"
    pytest.param({"fields": []}, id="fields-leave-out-an-array"),
    pytest.param({"fields": ["x", "x"]}, id="fields-twice"),
    pytest.param({"fields": ["x", "t"]}, id="fields-name-nothing"),
    pytest.param({"fields": "x"}, id="fields-not-a-list"),
    pytest.param({"fields": None, "dict": {}}, id="fields-and-another-member"),
    pytest.param({"dict": {"a": {"fields": None}}}, id="fields-nested"),
    # malformed under a node that needs unpickling: still damage, not a
    # question of allow_pickle
    pytest.param(
        {"object": {"class": "collections:OrderedDict", "state": {"a": {"eict": 1}}}},
        id="malformed-inside-object",
    ),
]

#: Well-formed, but naming a class that cannot be imported: damage too, found
#: when rebuilding (without allow_pickle nothing is imported: refused first).
UNKNOWN_CLASSES: list[Any] = [
    pytest.param({"object": {"class": "lazyvault_no_such_module:Thing", "state": {}}}, id="mod"),
    pytest.param({"object": {"class": "collections:NoSuchClass", "state": {}}}, id="class"),
    pytest.param({"object": {"class": "collections:namedtuple", "state": {}}}, id="not-a-class"),
]


def _blob(layout: Any, pickled: bytes | None = None) -> bytes:
    arrays = [_arrays.payload_args(n, a) for n, a in ARRAYS.items()]
    return _lazyvault.dumps_archive("obj", "{}", json.dumps(layout), arrays, pickled)


def _store(path: Path, layouts: list[Any], allow_pickle: bool) -> lv.Store:
    """A store with the record ``str(i)`` of ``layouts[i]``, opened again to read."""
    with lv.Store.open(path, "w") as store:
        arrays = [_arrays.payload_args(n, a) for n, a in ARRAYS.items()]
        for i, layout in enumerate(layouts):
            store._core.put(str(i), "{}", json.dumps(layout), arrays, None)
    return lv.Store.open(path, "r", allow_pickle=allow_pickle)


def _archived(tmp: Path, layout: Any, allow_pickle: bool) -> lv.Record:
    path = tmp / "bad.lvz"
    path.write_bytes(_blob(layout))
    return lv.Store.open(path, allow_pickle=allow_pickle)["obj"]


Load = Callable[[], Any]


def _loads(tmp: Path, layouts: list[Any], allow: bool) -> list[Load]:
    return [lambda x=x: lv.loads(_blob(x), allow_pickle=allow) for x in layouts]


def _archive(tmp: Path, layouts: list[Any], allow: bool) -> list[Load]:
    return [lambda x=x: _archived(tmp, x, allow).load() for x in layouts]


def _from_store(tmp: Path, layouts: list[Any], allow: bool) -> list[Load]:
    store = _store(tmp / "s.lv", layouts, allow)
    return [lambda i=i: store[str(i)].load() for i in range(len(layouts))]


def _by_value(tmp: Path, layouts: list[Any], allow: bool) -> list[Load]:
    store = _store(tmp / "s.lv", layouts, allow)
    return [
        lambda i=i: pickle.loads(pickle.dumps(store[str(i)])).load() for i in range(len(layouts))
    ]


def _by_reference(tmp: Path, layouts: list[Any], allow: bool) -> list[Load]:
    store = _store(tmp / "s.lv", layouts, allow)
    return [lambda i=i: store[str(i)].ref().open().load() for i in range(len(layouts))]


#: Every path that reads a layout back: (tmp_path, layouts, allow_pickle) ->
#: one load per layout.
READERS: dict[str, Callable[[Path, list[Any], bool], list[Load]]] = {
    "loads": _loads,
    "archive": _archive,
    "store": _from_store,
    "by-value": _by_value,
    "by-reference": _by_reference,
}


def _values(params: list[Any]) -> list[tuple[str, Any]]:
    return [(p.id, p.values[0]) for p in params]


def _expect(load: Load, error: type[Exception], match: str, case: str) -> None:
    try:
        load()
    except error as e:
        assert match in str(e), (case, e)
    except Exception as e:
        pytest.fail(f"{case}: {e!r}, not {error.__name__}")
    else:
        pytest.fail(f"{case}: loaded")


@pytest.mark.parametrize("allow_pickle", [False, True])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_malformed_layouts_raise_corrupt_error(
    tmp_path: Path, reader: str, allow_pickle: bool
) -> None:
    cases = _values(MALFORMED)
    loads = READERS[reader](tmp_path, [layout for _, layout in cases], allow_pickle)
    for (case, _), load in zip(cases, loads, strict=True):
        _expect(load, lv.CorruptError, "malformed layout", case)


@pytest.mark.parametrize("reader", ["loads", "store"])
def test_a_class_that_cannot_be_imported_is_damage(tmp_path: Path, reader: str) -> None:
    cases = _values(UNKNOWN_CLASSES)
    layouts = [layout for _, layout in cases]
    (tmp_path / "refused").mkdir()
    (tmp_path / "allowed").mkdir()
    refused = READERS[reader](tmp_path / "refused", layouts, False)
    allowed = READERS[reader](tmp_path / "allowed", layouts, True)
    for (case, _), refuse, load in zip(cases, refused, allowed, strict=True):
        _expect(refuse, lv.PickleNotAllowedError, "allow_pickle", case)
        _expect(load, lv.CorruptError, "cannot rebuild", case)


def test_a_class_missing_from_the_process_is_named_with_the_way_out(tmp_path: Path) -> None:
    # "cannot rebuild the object: AttributeError(...)" read as damage (a
    # fresh user's trial)
    import subprocess
    import sys

    script = (
        "import dataclasses, sys, numpy as np, lazyvault as lv\n"
        "@dataclasses.dataclass\n"
        "class Run:\n"
        "    t: float\n"
        "    x: np.ndarray\n"
        "with lv.Store.open(sys.argv[1]) as s:\n"
        "    s['a'] = Run(1.0, np.arange(3))\n"
    )
    path = tmp_path / "runs.lv"
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=120)
    with lv.Store.open(path, allow_pickle=True) as store:
        with pytest.raises(lv.CorruptError, match=r"'Run'.*define or import it first"):
            store["a"].load()
        assert store["a"].t == 1.0 and store["a"].x.tolist() == [0, 1, 2]


def test_a_pickle_index_past_the_remainder_is_damage() -> None:
    blob = _blob({"dict": {"a": {"pickle": 1}}}, pickle.dumps("only one", protocol=5))
    with pytest.raises(lv.PickleNotAllowedError):
        lv.loads(blob)
    with pytest.raises(lv.CorruptError, match="cannot rebuild"):
        lv.loads(blob, allow_pickle=True)


def test_metadata_and_arrays_stay_readable(tmp_path: Path) -> None:
    rec = _store(tmp_path / "s.lv", [{"eict": {}}], False)["0"]
    assert rec.meta == {} and rec.x.tolist() == [0, 1, 2]


def test_what_split_writes_scans_clean() -> None:
    class Plain:
        pass

    obj_with_state = Plain()
    obj_with_state.__dict__.update(a=1)
    objects = [
        None,
        {"a": [1, 2.5, (True, "s")], "x": np.arange(3), "f": float("nan")},
        {"s": np.float32(1.5), "i": np.int8(-3), "u": np.uint64(2**64 - 1), "b": np.bool_(1)},
        {"tags": {1, 2}, "c": 1j, "arr": np.zeros(2)},
        [2**63, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1],
        {"t": (1, (float("inf"),)), "$x": {"$y": 1}, "n": np.float16("nan")},
        {"d": datetime.date(2024, 3, 1), "m": np.datetime64("NaT"), "td": np.timedelta64(3, "D")},
        [datetime.datetime(2024, 3, 1, tzinfo=ZoneInfo("Europe/Paris")), datetime.datetime.min],
    ]
    for obj in objects:
        parts, splitter = _layout.split(obj)
        splitter.pickle_leftovers(parts.leftovers)
        found = _layout.scan(parts.layout, splitter.arrays, bool(parts.leftovers))
        assert found.problem is None, (obj, found)
        assert (found.needs_pickle is not None) == bool(parts.leftovers)


def test_problem_names_what_is_wrong() -> None:
    assert _layout.problem({"dict": {"a": {"array": "x"}}}, {"x"}) is None
    assert "names no array" in (_layout.problem({"array": "y"}, {"x"}) or "")
    # npz manifests come without a pickled remainder
    assert "no pickled remainder" in (_layout.problem({"pickle": 0}, set()) or "")
    assert _layout.problem({"pickle": 0}, set(), remainder=True) is None
    assert "unknown node kind" in (_layout.problem({"set": [1]}, set()) or "")


def _nested(levels: int) -> dict[str, Any]:
    """An object of ``levels`` nested dicts (the object itself the first), ``{"v": 1}`` inside."""
    obj: dict[str, Any] = {"v": 1}
    for _ in range(levels - 1):
        obj = {"n": obj}
    return obj


def test_containers_nested_past_32_levels_go_to_the_pickled_remainder(tmp_path: Path) -> None:
    # what README says ("Containers nested more than 32 levels deep"): a fresh user's trial
    # found the limit documented nowhere
    path = "n/" * 31 + "v"
    with lv.Store.open(tmp_path / "s") as s:
        s["ok"], s["deep"] = _nested(32), _nested(33)
        s.flush()
        assert s.keys(f"{path.replace('/', '.')} == 1") == ["ok"]
        assert s["ok"].load() == _nested(32)
        assert "n" in s["deep"].meta and s["deep"].meta["n"]["n"] is not None
    with lv.Store.open(tmp_path / "s", "r") as s:
        assert s["ok"].load() == _nested(32)
        with pytest.raises(lv.PickleNotAllowedError):
            s["deep"].load()
    with lv.Store.open(tmp_path / "s", "r", allow_pickle=True) as s:
        assert s["deep"].load() == _nested(33)
