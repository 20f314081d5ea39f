"""``lazyvault._lazyvault.ArrayEntry``: the one shape in which an array of a
record crosses from Python to the core's payload readers."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv
from lazyvault._lazyvault import ArchiveCore, ArrayEntry, map_array, read_array_bytes
from lazyvault._source import array_entry

FIELDS: dict[str, Any] = {
    "id": "0123456789abcdef0123456789abcdef",
    "descr": "<f8",
    "dtype": "float64",
    "shape": [2, 3],
    "fortran_order": False,
    "nbytes": 48,
    "data_offset": 128,
    "pickled": False,
    "checksum": "xxh3-64:0123456789abcdef",
}


def test_fields_are_named_and_typed() -> None:
    e = ArrayEntry(**FIELDS)
    assert (e.id, e.descr, e.dtype) == (FIELDS["id"], "<f8", "float64")
    assert e.shape == (2, 3) and isinstance(e.shape, tuple)
    assert (e.fortran_order, e.nbytes, e.data_offset) == (False, 48, 128)
    assert (e.pickled, e.checksum) == (False, "xxh3-64:0123456789abcdef")


def test_optional_fields_default_as_in_the_record_json() -> None:
    e = ArrayEntry(**{k: v for k, v in FIELDS.items() if k not in ("pickled", "checksum")})
    assert e.pickled is False and e.checksum is None
    assert e.shape != () and ArrayEntry(**{**FIELDS, "shape": []}).shape == ()


def test_is_frozen() -> None:
    e = ArrayEntry(**FIELDS)
    for name in FIELDS:
        with pytest.raises(AttributeError):
            setattr(e, name, getattr(e, name))
    with pytest.raises(AttributeError):
        e.other = 1  # type: ignore[attr-defined]
    assert e == ArrayEntry(**FIELDS)


def test_equality_is_field_by_field() -> None:
    assert ArrayEntry(**FIELDS) == ArrayEntry(**FIELDS)
    for name, other in [("id", "f" * 32), ("shape", [3, 2]), ("pickled", True), ("checksum", None)]:
        assert ArrayEntry(**FIELDS) != ArrayEntry(**{**FIELDS, name: other}), name
    assert ArrayEntry(**FIELDS) != FIELDS
    with pytest.raises(TypeError):
        hash(ArrayEntry(**FIELDS))


def test_repr_is_the_call_that_makes_an_equal_entry() -> None:
    e = ArrayEntry(**{**FIELDS, "descr": "[('x', '<i4'), ('y', '>f8', (2,))]", "shape": [5]})
    text = repr(e)
    assert text.startswith("ArrayEntry(id='0123456789abcdef0123456789abcdef', descr=\"[('x'")
    assert "shape=(5,)" in text and "checksum='xxh3-64:0123456789abcdef'" in text
    assert eval(text, {"ArrayEntry": ArrayEntry}) == e
    bare = ArrayEntry(**{**FIELDS, "checksum": None, "shape": []})
    assert repr(bare).endswith(
        "shape=(), fortran_order=False, nbytes=48, data_offset=128, pickled=False, checksum=None)"
    )


@pytest.mark.parametrize(
    "fields",
    [
        {k: v for k, v in FIELDS.items() if k != "data_offset"},
        {**FIELDS, "nbytes": -1},
        {**FIELDS, "shape": "23"},
        {**FIELDS, "fortran_order": 0},
    ],
)
def test_a_missing_or_mistyped_field_is_a_type_error(fields: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=r"^ArrayEntry\(\): "):
        ArrayEntry(**fields)


def test_takes_keywords_only() -> None:
    with pytest.raises(TypeError):
        ArrayEntry(*FIELDS.values())  # type: ignore[misc]
    with pytest.raises(TypeError, match="keywords"):
        ArrayEntry()  # type: ignore[call-arg]


def test_unknown_fields_are_ignored_as_readers_of_the_format_do() -> None:
    assert ArrayEntry(**FIELDS, added_by_a_newer_version=1) == ArrayEntry(**FIELDS)


def test_is_not_pickled() -> None:
    # records pickle their entry dicts; an ArrayEntry is made per read
    with pytest.raises(TypeError):
        pickle.dumps(ArrayEntry(**FIELDS))


def test_entries_of_a_stored_record_read_its_arrays(store: lv.Store, store_path: Path) -> None:
    a = np.arange(20_000, dtype="<u4").reshape(100, 200)
    obj = np.array([{"x": 1}, None], dtype=object)
    store["k"] = {"a": a, "small": np.float32(1.5), "obj": obj}
    store.flush()
    raw = store._core.get("k")
    assert raw is not None
    arrays = json.loads(raw)["arrays"]
    e = array_entry(arrays["a"])
    assert e == ArrayEntry(**arrays["a"])
    assert (e.shape, e.nbytes, e.dtype, e.pickled) == ((100, 200), a.nbytes, "uint32", False)
    assert e.checksum is not None and e.checksum.startswith("xxh3-64:")
    buffer = map_array(str(store_path), e)
    assert buffer is not None and bytes(memoryview(buffer)) == a.tobytes()
    pickled = array_entry(arrays["obj"])
    assert pickled.pickled and pickle.loads(read_array_bytes(str(store_path), pickled))[0] == {
        "x": 1
    }


def test_entries_of_an_archive_record_read_its_arrays(tmp_path: Path) -> None:
    a = np.arange(1000, dtype=np.int16)
    path = tmp_path / "one.lvz"
    path.write_bytes(lv.dumps({"a": a}))
    core = ArchiveCore.open(path)
    key = core.keys()[0]
    raw = core.get(key)
    assert raw is not None
    e = array_entry(json.loads(raw)["arrays"]["a"])
    buffer = core.map_array(e)
    assert buffer is not None and bytes(memoryview(buffer)) == a.tobytes()
    assert core.read_array_bytes(e) == a.tobytes()
