"""schema/FORMAT.md against what lazyvault really writes: the manifest and
every record validate against the JSON Schemas in schema/json/, payloads
read as standard .npy files with plain Python, and the pickled remainder
unpickles as FORMAT.md says, without lazyvault."""

from __future__ import annotations

import ast
import copy
import dataclasses
import datetime
import io
import json
import math
import pickle
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import jsonschema
import numpy as np
import pytest

import lazyvault as lv

from conftest import load_with_numpy, npy_bytes, payload_location

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schema" / "json"
# what the writer writes (the older "float" and "scalar" nodes are only read)
NODE_KINDS = {
    "json",
    "dict",
    "list",
    "tuple",
    "array",
    "object",
    "pickle",
    "$float",
    "$int",
    "$datetime",
    "$date",
    "$numpy",
    "fields",
}


@dataclasses.dataclass
class Run:
    """At module level, so it is stored as an ``{"object": ...}`` node."""

    name: str
    temperature: float
    positions: np.ndarray
    params: dict[str, Any]


W = np.arange(6, dtype="<f4").reshape(2, 3)
FORTRAN = np.asfortranarray(np.arange(6, dtype="<i2").reshape(2, 3))
BARE = np.arange(10, dtype="<i8")
BY_ID = np.arange(4)
UNICODE_FIELDS = np.array([(1.5,), (2.5,)], dtype=[("温度", "<f8")])
OBJECTS = np.array([1, "a", None], dtype=object)
PARIS = ZoneInfo("Europe/Paris")
ODD_OFFSET = datetime.timedelta(hours=-3, minutes=-30, seconds=-15)


def stored_objects() -> dict[str, Any]:
    return {
        "nested": {
            "temperature": 300.0,
            "material": "Si",
            "params": {"lr": 1e-3, "w": W, "deep": {"steps": [1, 2, 3]}},
        },
        "frames": {"frames": [np.zeros((2, 3)), np.ones(4, dtype=">f4"), FORTRAN]},
        "tuple": (1, "a", np.arange(3, dtype=np.uint8)),
        "nan": {"loss": float("nan"), "hi": float("inf"), "lo": float("-inf")},
        "scalar": {"f": np.float32(1.5), "b": np.bool_(True), "u": np.uint64(2**64 - 1)},
        "set": {"tags": {"hot", "Si"}, "by_id": {7: BY_ID}},
        "dataclass": Run("si-300", 300.0, np.zeros((5, 3)), {"lr": 0.1}),
        "bare": BARE,
        "objects": {"o": OBJECTS},
        "collide": {"a/b": np.zeros(2), "a": {"b": np.ones(2)}},
        "unicode": {"t": UNICODE_FIELDS},
        "shared": {"a": W, "b": [W, W]},
        "tagged": {
            "big": -(2**70),
            "when": datetime.datetime(2024, 3, 1, 12, 30, 0, 5, tzinfo=PARIS),
            "utc": datetime.datetime(2024, 3, 1, tzinfo=datetime.UTC),
            "odd": datetime.datetime(2024, 3, 1, tzinfo=datetime.timezone(ODD_OFFSET)),
            "naive": datetime.datetime(2024, 3, 1, 12, 30),
            "day": datetime.date(2024, 3, 1),
            "pair": (1, (float("inf"), "x")),
            "m": np.datetime64("2024-03-01T00:00:00"),
            "nat": np.datetime64("NaT", "ns"),
            "td": np.timedelta64(5, "10ms"),
            "f4nan": np.float32("nan"),
            "escaped": {"$x": [1, {"$y": 2.5}]},
            "list": [float("nan"), {"a": float("-inf")}],
        },
        # tagged leaves beside an array in a nested dict: the full layout holds them
        "tagged_nested": {
            "w": {
                "a": np.zeros(2),
                "big": -(2**70),
                "day": datetime.date(2024, 3, 1),
                "utc": datetime.datetime(2024, 3, 1, tzinfo=datetime.UTC),
                "loss": float("nan"),
                "f": np.float32(1.5),
            }
        },
    }


@dataclasses.dataclass
class Written:
    root: Path
    records: dict[str, dict[str, Any]]
    pickles: dict[str, bytes | None]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    root = tmp_path_factory.mktemp("format") / "s.lv"
    store = lv.Store.open(root)
    try:
        for key, obj in stored_objects().items():
            store[key] = obj
        # records live inside sled: take their JSON bytes through the core
        records = {key: json.loads(store._core.get(key)) for key in store}
        pickles = {key: store._core.get_pickle(key) for key in store}
    finally:
        store.close()
    return Written(root, records, pickles)


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def payload_path(root: Path, entry: dict[str, Any]) -> Path:
    """The file holding the payload: ``arrays/<id[:2]>/<id>.npy``, or its pack
    ``arrays/<pack[:2]>/<pack>.npz`` (FORMAT.md, "Packs")."""
    return payload_location(root, entry)[0]


def meta_node(value: Any) -> Any:
    """The full layout node of a meta value held whole (FORMAT.md, "Meta")."""
    if isinstance(value, list):
        return {"list": [meta_node(v) for v in value]}
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((name, body),) = value.items()
        if name == "$tuple":
            return {"tuple": [meta_node(v) for v in body]}
        if name == "$dict":
            return {"dict": {k: meta_node(v) for k, v in body.items()}}
        if name.startswith("$"):
            return value  # a tagged leaf
    return {"dict": {k: meta_node(v) for k, v in value.items()}}


def full_layout(record: dict[str, Any]) -> Any:
    """The record's layout, a compact ``fields`` one written out in full as FORMAT.md rebuilds
    it: each name an array node or its meta value held whole."""
    layout = record["layout"]
    if not (isinstance(layout, dict) and list(layout) == ["fields"]):
        return layout
    meta = record["meta"]
    if list(meta) == ["$dict"]:
        meta = meta["$dict"]
    names = layout["fields"]
    if names is None:  # meta's fields, then the arrays
        names = [*meta, *record["arrays"]]
    return {
        "dict": {n: {"array": n} if n in record["arrays"] else meta_node(meta[n]) for n in names}
    }


def nodes(node: Any) -> Iterator[tuple[str, Any]]:
    """Every layout node as ``(kind, body)``; JSON scalars as ``("json", value)``."""
    if not isinstance(node, dict):
        yield "json", node
        return
    ((kind, body),) = node.items()
    yield kind, body
    children: list[Any] = []
    if kind == "dict":
        children = list(body.values())
    elif kind in ("list", "tuple"):
        children = body
    elif kind == "object":
        children = list(body["state"].values())
    for child in children:
        yield from nodes(child)


def read_npy_header(path: Path | bytes) -> tuple[tuple[int, int], dict[str, Any], int]:
    """``(version, header dict, data offset)`` of an .npy file (or its bytes), read by hand
    as FORMAT.md's byte diagram says."""
    data = path if isinstance(path, bytes) else path.read_bytes()
    assert data[:6] == b"\x93NUMPY"
    version = (data[6], data[7])
    if version == (1, 0):
        prefix, (header_len,) = 10, struct.unpack("<H", data[8:10])
    else:
        assert version in ((2, 0), (3, 0))
        prefix, (header_len,) = 12, struct.unpack("<I", data[8:12])
    text = data[prefix : prefix + header_len]
    assert len(text) == header_len and text.endswith(b"\n")
    header = ast.literal_eval(text.decode("utf-8" if version == (3, 0) else "latin-1"))
    return version, header, prefix + header_len


def npy_header_of(array: np.ndarray) -> bytes:
    """The header np.save writes for ``array``."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Stored array in format 3.0"
        np.save(buf, array, allow_pickle=True)
    data = buf.getvalue()
    return data[: read_npy_header_bytes(data)]


def read_npy_header_bytes(data: bytes) -> int:
    if data[6] == 1:
        return 10 + struct.unpack("<H", data[8:10])[0]
    return 12 + struct.unpack("<I", data[8:12])[0]


def test_manifest_matches_schema(written: Written) -> None:
    manifest = json.loads((written.root / "lazyvault.json").read_text(encoding="utf-8"))
    validator("manifest.schema.json").validate(manifest)
    assert manifest["format"] == "lazyvault"
    assert manifest["format_version"] == lv.FORMAT_VERSION


def test_every_record_matches_schema(written: Written) -> None:
    check = validator("record.schema.json")
    assert set(written.records) == set(stored_objects())
    kinds_seen: set[str] = set()
    for key, record in written.records.items():
        check.validate(record)
        # what the schema cannot say: layout references resolve
        layout_nodes = list(nodes(record["layout"]))
        kinds_seen |= {kind for kind, _ in layout_nodes}
        for kind, body in layout_nodes:
            if kind == "array":
                assert body in record["arrays"], (key, body)
            if kind == "fields":  # names each meta field and array once, or null
                meta = record["meta"].get("$dict", record["meta"])
                assert not set(meta) & set(record["arrays"]), key
                assert body is None or sorted(body) == sorted([*meta, *record["arrays"]]), key
        has_pickle = any(kind == "pickle" for kind, _ in layout_nodes)
        assert record.get("pickle", False) is has_pickle, key
        assert (written.pickles[key] is not None) is has_pickle, key
        for entry in record["arrays"].values():
            assert payload_path(written.root, entry).is_file(), (key, entry["id"])
            # small arrays are pack members, larger ones and pickles files of their own
            packable = entry["nbytes"] <= 65536 and not entry.get("pickled", False)
            assert ("pack" in entry) is packable, (key, entry)
    # the store above exercises every node kind of the schema
    assert kinds_seen == NODE_KINDS


def test_array_paths_and_meta_follow_format(written: Written) -> None:
    r = written.records
    assert list(r["nested"]["arrays"]) == ["params/w"]
    assert r["nested"]["meta"] == {
        "temperature": 300.0,
        "material": "Si",
        "params": {"lr": 1e-3, "deep": {"steps": [1, 2, 3]}},
    }
    assert list(r["frames"]["arrays"]) == ["frames/0", "frames/1", "frames/2"]
    assert r["frames"]["meta"] == {}  # a list with arrays is left out of meta
    assert list(r["tuple"]["arrays"]) == ["2"] and r["tuple"]["meta"] == {}
    assert list(r["bare"]["arrays"]) == ["data"] and r["bare"]["layout"] == {"array": "data"}
    assert list(r["collide"]["arrays"]) == ["a/b", "a/b~2"]
    assert list(r["set"]["arrays"]) == ["by_id/1"]
    assert list(r["shared"]["arrays"]) == ["a"]
    # a dict of values held whole in meta and arrays at their own names: the compact layout
    assert r["nan"]["layout"] == {"fields": None}  # meta's fields, then the arrays
    assert r["unicode"]["layout"] == {"fields": None}
    assert full_layout(r["nan"])["dict"]["loss"] == {"$float": "nan"}
    assert r["nan"]["meta"] == {
        "loss": {"$float": "nan"},
        "hi": {"$float": "inf"},
        "lo": {"$float": "-inf"},
    }
    assert full_layout(r["scalar"])["dict"]["u"] == {"$numpy": ["<u8", 2**64 - 1]}
    # an array inside, one met twice: the full layout
    assert "dict" in r["nested"]["layout"] and "dict" in r["shared"]["layout"]
    assert r["scalar"]["meta"] == {
        "f": {"$numpy": ["<f4", 1.5]},
        "b": {"$numpy": ["|b1", True]},
        "u": {"$numpy": ["<u8", 2**64 - 1]},
    }
    obj = r["dataclass"]["layout"]["object"]
    assert obj["class"] == f"{Run.__module__}:Run"
    assert r["dataclass"]["meta"] == {"name": "si-300", "temperature": 300.0, "params": {"lr": 0.1}}
    assert r["objects"]["arrays"]["o"]["pickled"] is True


def test_tagged_values_follow_format(written: Written) -> None:
    tagged = written.records["tagged"]
    assert tagged["meta"] == {
        "big": {"$int": "-1180591620717411303424"},
        "when": {"$datetime": "2024-03-01T12:30:00.000005+01:00[Europe/Paris]"},
        "utc": {"$datetime": "2024-03-01T00:00:00+00:00"},
        "odd": {"$datetime": "2024-03-01T00:00:00-03:30:15"},
        "naive": {"$datetime": "2024-03-01T12:30:00"},
        "day": {"$date": "2024-03-01"},
        "pair": {"$tuple": [1, {"$tuple": [{"$float": "inf"}, "x"]}]},
        "m": {"$numpy": ["<M8[s]", "2024-03-01T00:00:00"]},
        "nat": {"$numpy": ["<M8[ns]", "NaT"]},
        "td": {"$numpy": ["<m8[10ms]", 5]},
        "f4nan": {"$numpy": ["<f4", {"$float": "nan"}]},
        "escaped": {"$dict": {"$x": [1, {"$dict": {"$y": 2.5}}]}},
        "list": [{"$float": "nan"}, {"a": {"$float": "-inf"}}],
    }
    assert tagged["layout"] == {"fields": None}
    layout = full_layout(tagged)["dict"]
    # leaves: the same tagged value as in meta; containers: layout nodes, user keys as they are
    for name in ("big", "when", "utc", "odd", "naive", "day", "m", "nat", "td", "f4nan"):
        assert layout[name] == tagged["meta"][name], name
    assert layout["pair"] == {"tuple": [1, {"tuple": [{"$float": "inf"}, "x"]}]}
    assert layout["escaped"] == {"dict": {"$x": {"list": [1, {"dict": {"$y": 2.5}}]}}}
    assert "pickle" not in tagged


@pytest.mark.parametrize(
    ("key", "name", "expected", "version"),
    [
        ("nested", "params/w", W, (1, 0)),
        ("frames", "frames/2", FORTRAN, (1, 0)),
        ("bare", "data", BARE, (1, 0)),
        ("set", "by_id/1", BY_ID, (1, 0)),
        ("unicode", "t", UNICODE_FIELDS, (3, 0)),
    ],
)
def test_payload_is_a_standard_npy_file(
    written: Written, key: str, name: str, expected: np.ndarray, version: tuple[int, int]
) -> None:
    entry = written.records[key]["arrays"][name]
    npy = npy_bytes(written.root, entry)
    got_version, header, data_offset = read_npy_header(npy)
    assert got_version == version
    assert data_offset % 64 == 0
    assert data_offset == entry["data_offset"]
    assert set(header) == {"descr", "fortran_order", "shape"}
    assert header["descr"] == ast.literal_eval(entry["descr"])
    assert list(header["shape"]) == entry["shape"]
    assert header["fortran_order"] is entry["fortran_order"]
    assert entry["fortran_order"] is (key == "frames")
    itemsize = np.lib.format.descr_to_dtype(header["descr"]).itemsize
    assert itemsize * math.prod(header["shape"]) == entry["nbytes"]
    assert len(npy) == entry["data_offset"] + entry["nbytes"]
    # byte for byte the header np.save writes for the same array
    assert npy[:data_offset] == npy_header_of(expected)
    path, start = payload_location(written.root, entry)
    assert (start + data_offset) % 64 == 0  # aligned in the pack too

    if "pack" in entry:  # a pack is an npz: numpy reads the member as it is
        mapped = load_with_numpy(written.root, entry)
    else:
        mapped = np.load(path, mmap_mode="r")
        assert isinstance(mapped, np.memmap)
    assert mapped.dtype == expected.dtype and mapped.shape == expected.shape
    assert mapped.tobytes(order="A") == expected.tobytes(order="A")
    np.testing.assert_array_equal(mapped, expected)


def test_every_payload_header_agrees_with_its_record(written: Written) -> None:
    for key, record in written.records.items():
        for name, entry in record["arrays"].items():
            npy = npy_bytes(written.root, entry)
            _, header, data_offset = read_npy_header(npy)
            assert data_offset == entry["data_offset"] and data_offset % 64 == 0, (key, name)
            assert repr(header["descr"]) == entry["descr"], (key, name)
            assert list(header["shape"]) == entry["shape"], (key, name)
            assert len(npy) == data_offset + entry["nbytes"], (key, name)


def test_object_array_payload_is_a_pickle_after_the_header(written: Written) -> None:
    entry = written.records["objects"]["arrays"]["o"]
    path = payload_path(written.root, entry)
    _, header, data_offset = read_npy_header(path)
    assert header["descr"] == "|O" and entry["descr"] == "'|O'"
    assert path.stat().st_size == data_offset + entry["nbytes"]
    with pytest.raises(ValueError, match="allow_pickle"):
        np.load(path)
    loaded = np.load(path, allow_pickle=True)
    assert loaded.dtype == object and loaded.tolist() == OBJECTS.tolist()


def test_pickled_remainder_unpickles_without_lazyvault(written: Written) -> None:
    record, data = written.records["set"], written.pickles["set"]
    assert data is not None
    assert record["layout"]["dict"]["tags"] == {"pickle": 0}
    assert record["layout"]["dict"]["by_id"] == {"pickle": 1}

    def array(path: str) -> np.ndarray:
        return load_with_numpy(written.root, record["arrays"][path], mmap_mode="r")

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            kind, path = pid
            if kind != "array":
                raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
            return array(path)

    # one unpickler for the whole sequence: the memo carries across pickles
    stream = io.BytesIO(data)
    unpickler = Unpickler(stream)
    leftovers = []
    while stream.tell() < len(data):
        leftovers.append(unpickler.load())
    assert len(leftovers) == 2
    assert leftovers[0] == {"hot", "Si"}
    assert list(leftovers[1]) == [7]
    np.testing.assert_array_equal(leftovers[1][7], BY_ID)


VALID_RECORD: dict[str, Any] = {
    "meta": {"temperature": 300.0, "params": {"lr": 0.001}},
    "arrays": {
        "positions": {
            "id": "00112233445566778899aabbccddeeff",
            "descr": "'<f8'",
            "dtype": "float64",
            "shape": [4, 3],
            "fortran_order": False,
            "nbytes": 96,
            "data_offset": 128,
        }
    },
    "layout": {
        "dict": {
            "temperature": 300.0,
            "params": {"dict": {"lr": 0.001}},
            "positions": {"array": "positions"},
        }
    },
}


def _with(change: Any) -> dict[str, Any]:
    record = copy.deepcopy(VALID_RECORD)
    change(record)
    return record


def _entry(record: dict[str, Any]) -> dict[str, Any]:
    return record["arrays"]["positions"]


def test_valid_record_and_unknown_fields_are_accepted() -> None:
    check = validator("record.schema.json")
    check.validate(VALID_RECORD)
    # unknown fields are ignored on purpose (a newer minor may add them)
    check.validate(_with(lambda r: r.update(from_a_newer_minor=1)))
    check.validate(_with(lambda r: _entry(r).update(from_a_newer_minor=1)))
    check.validate(_with(lambda r: r.update(layout={"fields": ["temperature", "positions"]})))
    check.validate(_with(lambda r: r.update(layout={"fields": None})))


@pytest.mark.parametrize(("field", "value"), [("id", "../../etc/passwd"), ("data_offset", 80)])
def test_schema_rejects_path_id_and_unaligned_offset(field: str, value: Any) -> None:
    record = _with(lambda r: _entry(r).update({field: value}))
    errors = list(validator("record.schema.json").iter_errors(record))
    # rejected for that field and nothing else
    assert [list(e.absolute_path) for e in errors] == [["arrays", "positions", field]]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda r: _entry(r).update(data_offset=0), id="offset-0"),
        pytest.param(lambda r: _entry(r).update(id="00112233445566778899AABBCCDDEEFF"), id="upper"),
        pytest.param(lambda r: _entry(r).update(id="00112233445566778899aabbccddeef"), id="short"),
        pytest.param(lambda r: _entry(r).update(shape=[-1, 3]), id="negative-dim"),
        pytest.param(lambda r: _entry(r).pop("descr"), id="no-descr"),
        pytest.param(lambda r: r["arrays"].update({"": _entry(r)}), id="empty-name"),
        pytest.param(lambda r: r.pop("layout"), id="no-layout"),
        pytest.param(lambda r: r.update(meta=[]), id="meta-list"),
        pytest.param(lambda r: r.update(layout={"dict": {}, "list": []}), id="two-kinds"),
        pytest.param(lambda r: r.update(layout={"set": [1, 2]}), id="unknown-kind"),
        pytest.param(lambda r: r.update(layout={"float": "NaN"}), id="float-spelling"),
        pytest.param(lambda r: r.update(layout={"pickle": -1}), id="pickle-index"),
        pytest.param(lambda r: r.update(layout={"scalar": ["<f8"]}), id="scalar-no-value"),
        pytest.param(lambda r: r.update(layout={"object": {"class": "Run"}}), id="object-bare"),
        pytest.param(lambda r: r.update(layout={"fields": ["a", 1]}), id="fields-not-names"),
        pytest.param(lambda r: r.update(layout={"fields": ["a", "a"]}), id="fields-twice"),
        pytest.param(lambda r: r.update(layout={"fields": {"a": 1}}), id="fields-of-dict"),
        pytest.param(
            lambda r: r.update(layout={"dict": {"a": {"fields": ["a"]}}}), id="fields-nested"
        ),
    ],
)
def test_schema_rejects_bad_records(change: Any) -> None:
    with pytest.raises(jsonschema.ValidationError):
        validator("record.schema.json").validate(_with(change))


@pytest.mark.parametrize(
    "meta",
    [
        {"t": {"$datetime": "2024-03-01T12:30:00.000005+01:00[Europe/Paris]"}},
        {"t": {"$datetime": "2024-03-01T12:30:00"}, "d": {"$date": "2024-03-01"}},
        {"n": [{"$float": "nan"}, {"$int": "-18446744073709551617"}]},
        {"s": {"$numpy": ["<f4", {"$float": "-inf"}]}, "m": {"$numpy": ["<m8[s]", "NaT"]}},
        {"p": {"$tuple": [1, {"$tuple": []}]}, "e": {"$dict": {"$x": {"$dict": {"$y": 1}}}}},
        {"$dict": {"$top": 1}},
        {"a": 1, "$b": 2},
        {"x": {"$tuple": [1], "y": 2}},
    ],
)
def test_schema_accepts_tagged_meta(meta: dict[str, Any]) -> None:
    validator("record.schema.json").validate(_with(lambda r: r.update(meta=meta)))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"x": {"$float": "NaN"}}, id="float-spelling"),
        pytest.param({"x": {"$int": "+5"}}, id="int-plus"),
        pytest.param({"x": {"$int": "007"}}, id="int-leading-zero"),
        pytest.param({"x": {"$datetime": "2024-03-01 12:30"}}, id="datetime-not-isoformat"),
        pytest.param({"x": {"$datetime": "2024-03-01T12:30:00[Europe/Paris]"}}, id="zone-no-off"),
        pytest.param({"x": {"$date": "2024-03-01T00:00:00"}}, id="date-with-time"),
        pytest.param({"x": {"$numpy": ["<c16", 1]}}, id="numpy-complex"),
        pytest.param({"x": {"$numpy": ["<f4"]}}, id="numpy-no-value"),
        pytest.param({"x": {"$x": 1}}, id="unescaped-dollar-key"),
        pytest.param({"$x": 1}, id="unescaped-top-level"),
    ],
)
def test_schema_rejects_bad_tagged_meta(change: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        validator("record.schema.json").validate(_with(lambda r: r.update(meta=change)))


@pytest.mark.parametrize(
    "layout",
    [
        {"float": "nan"},
        {"scalar": ["<f4", 1.5]},
        {"list": [{"$numpy": ["<f4", {"$float": "nan"}]}, {"$int": "18446744073709551616"}]},
    ],
)
def test_schema_accepts_old_and_tagged_layout_leaves(layout: Any) -> None:
    validator("record.schema.json").validate(_with(lambda r: r.update(layout=layout)))


@pytest.mark.parametrize(
    "layout",
    [{"$tuple": [1]}, {"$dict": {"a": 1}}, {"$float": "NaN"}, {"$numpy": ["|O", 1]}],
)
def test_schema_rejects_meta_only_tags_and_bad_leaves_in_layout(layout: Any) -> None:
    with pytest.raises(jsonschema.ValidationError):
        validator("record.schema.json").validate(_with(lambda r: r.update(layout=layout)))


@pytest.mark.parametrize(
    "manifest",
    [
        {"format": "lazyvault", "format_version": "3.0", "created_by": "x"},
        {"format": "zarr", "format_version": "1.0", "created_by": "x"},
        {"format": "lazyvault", "format_version": "1", "created_by": "x"},
        {"format": "lazyvault", "format_version": "1.0"},
    ],
)
def test_schema_rejects_bad_manifests(manifest: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        validator("manifest.schema.json").validate(manifest)


def test_manifest_of_a_newer_minor_is_accepted() -> None:
    manifest = {"format": "lazyvault", "format_version": "1.7", "created_by": "x", "extra": 1}
    validator("manifest.schema.json").validate(manifest)
