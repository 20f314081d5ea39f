""".lvz archives (export, Store.open, np.load, many readers, damaged and
hostile files) and lv.dumps / lv.loads."""

from __future__ import annotations

import dataclasses
import gc
import io
import json
import mmap
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv
from lazyvault import _archive


@dataclasses.dataclass
class Run:
    name: str
    temperature: float
    positions: np.ndarray


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert type(got) is np.ndarray
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    fortran = want.flags.f_contiguous and not want.flags.c_contiguous
    assert got.flags.f_contiguous if fortran else got.flags.c_contiguous
    assert not got.flags.writeable


def assert_same_object(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert_same_array(got, want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same_object(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same_object(g, w)
    elif dataclasses.is_dataclass(want):
        assert_same_object(vars(got), vars(want))
    elif isinstance(want, float) and np.isnan(want):
        assert np.isnan(got)
    else:
        assert got == want


@pytest.fixture
def filled(store: lv.Store) -> lv.Store:
    rng = np.random.default_rng(0)
    for i in range(6):
        store[f"run-{i}"] = {
            "temperature": 250.0 + 20 * i,
            "material": "Si" if i % 2 else "Ge",
            "positions": rng.random((50 + i, 3)),
            "frames": [np.arange(i + 1, dtype="<i4"), np.zeros((0, 2))],
            "params": {"lr": 10.0**-i, "w": np.asfortranarray(rng.random((3, 4)))},
        }
    store["scalar"] = {"x": np.float64(3.5), "a": np.array(7, dtype=">i2"), "n": "z"}
    store["with-pickle"] = {"tags": {"a", "b"}, "data": np.arange(5)}
    store["objects"] = {"o": np.array([1, "two", None], dtype=object)}
    store.flush()
    return store


def export(store: lv.Store, path: Path, **kw: Any) -> list[str]:
    return _archive.export_lvz(store, path, **kw)


def compare_with_store(archive: lv.Archive, store: lv.Store, keys: list[str]) -> None:
    assert list(archive) == keys
    assert len(archive) == len(keys)
    for key in keys:
        got, want = archive[key], store[key]
        assert got.key == key
        assert got.meta == want.meta
        assert got.arrays == want.arrays
        # an archive's payloads are members of their own: no pack fields
        unpacked = {
            **want._record,
            "arrays": {
                name: {f: v for f, v in e.items() if f not in ("pack", "pack_offset")}
                for name, e in want._record["arrays"].items()
            },
        }
        assert got._record == unpacked
        assert archive.get_pickle(key) == store._core.get_pickle(key)
        for name, entry in want._record["arrays"].items():
            if entry.get("pickled"):
                continue
            assert_same_array(got.array(name), want.array(name))


def test_export_all_and_open_with_store_open(filled: lv.Store, tmp_path: Path) -> None:
    path = tmp_path / "all.lvz"
    written = export(filled, path)
    assert written == list(filled)
    with lv.Store.open(path) as archive:
        assert isinstance(archive, lv.Archive)
        assert archive.path == str(path)
        assert archive.mode == "r"
        compare_with_store(archive, filled, list(filled))
        report = archive.verify()
        assert report["ok"] and report["records"] == len(filled), report
        assert report["arrays"] == sum(len(filled[k].arrays) for k in filled)
        assert "run-1" in archive and "nope" not in archive and 3 not in archive
        with pytest.raises(KeyError):
            archive["nope"]
        assert repr(archive).startswith("<lazyvault.Archive")
        # a record with a pickled remainder needs allow_pickle to load
        with pytest.raises(lv.PickleNotAllowedError):
            archive["with-pickle"].load()
        with pytest.raises(lv.PickleNotAllowedError):
            archive["objects"].o
        assert archive["with-pickle"].data.tolist() == [0, 1, 2, 3, 4]
    assert archive.closed
    with pytest.raises(lv.ClosedError):
        len(archive)
    with lv.Store.open(path, "r", allow_pickle=True) as archive:
        obj = archive["with-pickle"].load()
        assert obj["tags"] == {"a", "b"}
        assert archive["objects"].o.tolist() == [1, "two", None]
        assert_same_object(archive["run-3"].load(), filled["run-3"].load())


def test_export_by_keys_and_by_query(filled: lv.Store, tmp_path: Path) -> None:
    path = tmp_path / "keys.lvz"
    assert export(filled, path, keys=["run-4", "run-1"]) == ["run-4", "run-1"]
    with lv.Store.open(path) as archive:
        compare_with_store(archive, filled, ["run-4", "run-1"])
    path = tmp_path / "query.lvz"
    query = "material == 'Si' and temperature > 280"
    written = export(filled, path, query=query)
    assert written == filled.keys(query) == ["run-3", "run-5"]
    with lv.Store.open(path) as archive:
        compare_with_store(archive, filled, written)
        assert archive.keys("positions.shape[0] > 54") == ["run-5"]
        assert archive.count("material == 'Si'") == 2
        assert archive.count() == 2
        assert [r.key for r in archive.find("temperature < 320")] == ["run-3"]
        assert len(archive.find(lambda r: r.temperature > 0)) == 2
        with pytest.raises(lv.QueryError):
            archive.find("temperature >> 3")
    with pytest.raises(lv.MissingKeyError):
        export(filled, tmp_path / "missing.lvz", keys=["run-1", "nope"])
    assert not (tmp_path / "missing.lvz").exists()


def test_store_export_goes_through_interop(filled: lv.Store, tmp_path: Path) -> None:
    path = tmp_path / "via-export.lvz"
    filled.export(path, query="material == 'Ge'")
    with lv.Store.open(path) as archive:
        compare_with_store(archive, filled, filled.keys("material == 'Ge'"))


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    real = os.path.realpath(path)
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_arrays_are_read_only_views_of_the_archive_mapping(
    filled: lv.Store, tmp_path: Path
) -> None:
    path = tmp_path / "mapped.lvz"
    export(filled, path)
    archive = lv.Store.open(path)
    positions = archive["run-2"].positions
    assert not positions.flags.writeable
    with pytest.raises(ValueError):
        positions.flags.writeable = True
    with pytest.raises(ValueError):
        positions[0, 0] = 1.0
    ranges = _mapped_ranges(path)
    assert ranges, "the archive is not mapped"
    address = positions.__array_interface__["data"][0]
    assert any(lo <= address and address + positions.nbytes <= hi for lo, hi in ranges)
    assert address % 64 == 0
    # the array keeps the mapping alive after the archive is closed
    archive.close()
    del archive
    gc.collect()
    assert _mapped_ranges(path)
    assert_same_array(positions, filled["run-2"].positions)


def test_np_load_reads_the_archive_as_an_npz(filled: lv.Store, tmp_path: Path) -> None:
    path = tmp_path / "npz.lvz"
    export(filled, path)
    with np.load(path) as npz:
        names = set(npz.files)
        for key in filled:
            rec = filled[key]
            for name, entry in rec._record["arrays"].items():
                member = f"arrays/{entry['id']}"
                assert member in names
                if entry.get("pickled"):
                    continue
                assert_same_array_values(npz[member], rec.array(name))
        # the records member is readable too (as bytes)
        records = npz["lazyvault/records.jsonl"]
        lines = [json.loads(line) for line in bytes(records).decode().splitlines()]
        assert [line["key"] for line in lines] == list(filled)
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None  # every CRC checks out
        for info in zf.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            assert not info.filename.startswith(("/", ".."))


def assert_same_array_values(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.tobytes(order="A") == want.tobytes(order="A")


_READER = """
import sys, time
import numpy as np
import lazyvault as lv
archive = lv.Store.open(sys.argv[1])
total = sum(float(archive[k].positions.sum()) for k in archive if k.startswith("run-"))
time.sleep(0.5)  # hold the archive open while the others open it
print(repr(total))
archive.close()
"""


def test_four_processes_open_the_same_archive_at_once(filled: lv.Store, tmp_path: Path) -> None:
    path = tmp_path / "shared.lvz"
    export(filled, path)
    want = sum(float(filled[k].positions.sum()) for k in filled if k.startswith("run-"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _READER, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    # and this process too, while they run
    with lv.Store.open(path) as archive:
        assert len(archive) == len(filled)
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            assert float(out) == pytest.approx(want)


def _sample_archive(tmp_path: Path) -> Path:
    path = tmp_path / "sample.lvz"
    with lv.Store.open(tmp_path / "src.lv") as store:
        store["a"] = {"x": 1, "data": np.arange(100.0)}
        export(store, path)
    return path


def test_truncated_archives_are_clear_errors(tmp_path: Path) -> None:
    path = _sample_archive(tmp_path)
    data = path.read_bytes()
    bad = tmp_path / "bad.lvz"
    for cut in [4, 30, 100, len(data) // 2, len(data) - 23, len(data) - 1]:
        bad.write_bytes(data[:cut])
        with pytest.raises(lv.CorruptError):
            lv.Store.open(bad)
        with pytest.raises(lv.CorruptError):
            lv.loads(data[:cut])
    # trailing garbage that hides the end record is refused too
    bad.write_bytes(data[: len(data) - 22] + b"\0" * 22)
    with pytest.raises(lv.LazyvaultError):
        lv.Store.open(bad)


def _rebuild_zip(src: Path, dst: Path, rename: dict[str, str], deflate: set[str]) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info.filename)
            name = rename.get(info.filename, info.filename)
            method = zipfile.ZIP_DEFLATED if info.filename in deflate else zipfile.ZIP_STORED
            zout.writestr(name, body, compress_type=method)


def test_deflated_npy_member_is_refused(tmp_path: Path) -> None:
    path = _sample_archive(tmp_path)
    with zipfile.ZipFile(path) as zf:
        npy = [n for n in zf.namelist() if n.endswith(".npy")]
    bad = tmp_path / "deflated.lvz"
    _rebuild_zip(path, bad, {}, set(npy))
    with pytest.raises(lv.CorruptError, match="uncompressed"):
        lv.Store.open(bad)
    # np.load itself still reads such a zip: it is only lazyvault that maps
    with np.load(bad) as npz:
        assert npz[npy[0][:-4]].shape == (100,)


def test_a_damaged_npy_header_is_found_by_verify_and_on_access(tmp_path: Path) -> None:
    path = _sample_archive(tmp_path)
    data = bytearray(path.read_bytes())
    at = data.index(b"'shape': (100,)")
    data[at : at + 15] = b"'shape': (99,) "
    bad = tmp_path / "hdr.lvz"
    bad.write_bytes(bytes(data))
    with lv.Store.open(bad) as archive:
        report = archive.verify()
        assert not report["ok"]
        assert "does not match" in report["problems"][0]
        assert archive["a"].x == 1  # metadata stays readable
        with pytest.raises(lv.CorruptError, match="does not match"):
            archive["a"].data


def test_member_names_escaping_a_folder_are_refused(tmp_path: Path) -> None:
    path = _sample_archive(tmp_path)
    with zipfile.ZipFile(path) as zf:
        npy = next(n for n in zf.namelist() if n.endswith(".npy"))
    for evil in ["../evil.npy", "/abs/evil.npy", "arrays/../../evil.npy"]:
        bad = tmp_path / "evil.lvz"
        _rebuild_zip(path, bad, {npy: evil}, set())
        with pytest.raises(lv.CorruptError, match="unsafe member name"):
            lv.Store.open(bad)
        with pytest.raises(lv.CorruptError):
            lv.loads(bad.read_bytes())


def test_a_zip_that_is_not_an_archive(tmp_path: Path) -> None:
    npz = tmp_path / "plain.npz"
    np.savez(npz, a=np.arange(3))
    # a zip without the manifest is not damaged: it is no store (it was a CorruptError)
    for mode in ("r", "a"):
        with pytest.raises(lv.NotAStoreError, match="neither a lazyvault store nor") as e:
            lv.Store.open(npz, mode)  # type: ignore[arg-type]
        assert e.value.path == str(npz) and "import_file" in str(e.value)
    assert not _archive.is_archive(npz)
    assert _archive.is_archive(_sample_archive(tmp_path))


def test_archives_are_read_only(tmp_path: Path) -> None:
    path = _sample_archive(tmp_path)
    for mode in ("a", "w"):
        with pytest.raises(lv.ReadOnlyError, match="read-only"):
            lv.Store.open(path, mode)
    with lv.Store.open(path, "r") as archive:
        with pytest.raises(lv.ReadOnlyError):
            archive["a"] = 1  # type: ignore[index]
    with pytest.raises(ValueError):
        lv.Store.open(path, "x")  # type: ignore[arg-type]


def test_archive_records_pickle_by_value(filled: lv.Store, tmp_path: Path) -> None:
    path = tmp_path / "p.lvz"
    export(filled, path)
    with lv.Store.open(path) as archive:
        rec = archive["run-1"]
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(rec, protocol=5, buffer_callback=buffers.append)
        back = pickle.loads(data, buffers=buffers)
        assert_same_array(back.positions, filled["run-1"].positions)
        assert np.shares_memory(back.positions, rec.positions)
        again = pickle.loads(pickle.dumps(archive))
        assert list(again) == list(archive)
        again.close()


# -- dumps / loads ------------------------------------------------------------

OBJECTS = [
    {"a": 1, "x": np.arange(10.0)},
    {"nested": {"deep": [np.ones((2, 3), dtype="<f4"), (1, "two", np.int8(3))]}, "s": "é"},
    (np.zeros(()), np.array(5, dtype=">u2"), np.zeros((0, 4)), np.zeros((3, 0), order="F")),
    [np.asfortranarray(np.arange(12).reshape(3, 4)), np.arange(12).reshape(3, 4)],
    np.arange(24, dtype=">i8").reshape(2, 3, 4),
    {
        "dt": np.array(["2024-01-01", "NaT"], dtype="M8[ns]"),
        "td": np.array([1, 2], dtype="<m8[s]"),
        "str": np.array(["ab", "c"], dtype="<U2"),
        "bytes": np.array([b"xy"], dtype="S2"),
        "bool": np.array([True, False]),
        "c": np.array([1 + 2j], dtype=">c16"),
        "h": np.array([1.5], dtype="<f2"),
        "rec": np.zeros(3, dtype=[("x", "<i4"), ("y", ">f8", (2,))]),
    },
    {"nan": float("nan"), "inf": float("-inf"), "none": None, "big": 2**64 - 1},
]


@pytest.mark.parametrize("obj", OBJECTS, ids=range(len(OBJECTS)))
def test_dumps_loads_round_trip(obj: Any) -> None:
    data = lv.dumps(obj)
    assert isinstance(data, bytes)
    assert data[:4] == b"PK\x03\x04"
    assert lv.dumps(obj) == data  # deterministic
    back = lv.loads(data)
    assert_same_object(back, obj)


def test_dumps_is_an_archive_np_load_reads(tmp_path: Path) -> None:
    obj = {"a": np.arange(5), "b": np.ones((2, 2))}
    data = lv.dumps(obj)
    with np.load(io.BytesIO(data)) as npz:
        got = sorted((npz[n].tolist() for n in npz.files if n.startswith("arrays/")), key=len)
    assert got == [np.ones((2, 2)).tolist(), list(range(5))]
    path = tmp_path / "dumped.lvz"
    path.write_bytes(data)
    with lv.Store.open(path) as archive:
        assert list(archive) == ["obj"]
        assert_same_object(archive["obj"].load(), obj)


def _buffers(data: bytes, tmp_path: Path) -> list[Any]:
    path = tmp_path / "buf.lvz"
    path.write_bytes(data)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return [
        data,
        bytearray(data),
        memoryview(data),
        memoryview(bytearray(data)),
        mm,
        np.frombuffer(data, np.uint8),
        np.frombuffer(bytearray(data), np.uint8),
    ]


def test_loads_from_every_buffer_type_shares_memory_and_keeps_it_alive(tmp_path: Path) -> None:
    obj = {"x": np.arange(1000.0), "y": np.arange(6, dtype="<i2").reshape(2, 3), "m": 1}
    data = lv.dumps(obj)
    for buf in _buffers(data, tmp_path):
        back = lv.loads(buf)
        assert back["m"] == 1
        x = back["x"]
        assert_same_array(x, obj["x"])
        assert np.shares_memory(x, np.frombuffer(buf, np.uint8)), type(buf)
        del buf
        gc.collect()
        assert_same_array(x, obj["x"])  # the buffer is still alive
        assert_same_array(back["y"], obj["y"])


def test_loads_never_needs_a_writable_buffer() -> None:
    data = lv.dumps({"x": np.arange(3)})
    ro = np.frombuffer(data, np.uint8)
    assert not ro.flags.writeable
    assert lv.loads(ro)["x"].tolist() == [0, 1, 2]
    assert lv.loads(memoryview(data).toreadonly())["x"].tolist() == [0, 1, 2]


def test_loads_refuses_pickle_unless_allowed() -> None:
    run = Run("a", 300.0, np.arange(3.0))
    for obj in [{"tags": {"a"}}, run, {"o": np.array([None, 1], dtype=object)}]:
        data = lv.dumps(obj)
        with pytest.raises(lv.PickleNotAllowedError):
            lv.loads(data)
        back = lv.loads(data, allow_pickle=True)
        if isinstance(obj, Run):
            assert_same_object(back, run)
        elif "tags" in obj:
            assert back == obj
        else:
            assert back["o"].tolist() == [None, 1]


def test_loads_rejects_non_buffers_and_non_archives() -> None:
    with pytest.raises(TypeError):
        lv.loads("not bytes")
    with pytest.raises(TypeError):
        lv.loads(12)
    with pytest.raises(lv.CorruptError):
        lv.loads(b"")
    with pytest.raises(lv.CorruptError):
        lv.loads(b"PK\x03\x04" + b"\0" * 100)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("x.npy", b"abc")
    with pytest.raises(lv.CorruptError):
        lv.loads(buf.getvalue())
    with pytest.raises(ValueError):
        lv.loads(np.arange(100, dtype=np.uint8)[::2])  # not contiguous


def test_zip64_members_read_by_numpy_and_lazyvault() -> None:
    # The path a payload of 4 GiB or more takes (zip64 size fields), on a
    # small array: numpy's zipfile and lazyvault's reader both follow it.
    from lazyvault import _arrays, _layout, _lazyvault

    obj = {"x": np.arange(1000.0), "m": 1}
    parts, splitter = _layout.split(obj)
    arrays = [_arrays.payload_args(n, a) for n, a in splitter.arrays.items()]
    data = _lazyvault.dumps_archive(
        "obj", parts.meta_json(), parts.layout_json(), arrays, None, force_zip64=True
    )
    assert data != lv.dumps(obj)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(".npy"))
        h = info.header_offset
        name_len, extra_len = np.frombuffer(data[h + 26 : h + 30], "<u2")
        extra = data[h + 30 + name_len : h + 30 + name_len + extra_len]
        assert extra[:2] == b"\x01\x00"  # the zip64 extended information field
        assert (h + 30 + name_len + extra_len) % 64 == 0
    with np.load(io.BytesIO(data)) as npz:
        assert npz[info.filename[:-4]].tolist() == obj["x"].tolist()
    assert_same_object(lv.loads(data), obj)


def _member_data_offset(blob: bytes, name: str) -> int:
    """Where a stored member's data starts in a zip held in memory."""
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        info = z.getinfo(name)
    start = info.header_offset
    name_len, extra_len = np.frombuffer(blob, "<u2", 2, start + 26)
    return start + 30 + int(name_len) + int(extra_len)


def test_flipped_bytes_in_checked_members_are_refused() -> None:
    # found by a break-it trial: CRCs were never checked, so a flipped bit in
    # records.jsonl changed keys silently, and one in an object-array member
    # crashed numpy's unpickler under allow_pickle=True
    blob = lv.dumps({"obj": np.array([1, "a", None], dtype=object), "x": 1})
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        names = z.namelist()
    records = _member_data_offset(blob, "lazyvault/records.jsonl")
    bad = bytearray(blob)
    bad[records + 2] ^= 0x01
    with pytest.raises(lv.CorruptError, match="CRC"):
        lv.loads(bytes(bad))
    (member,) = [n for n in names if n.startswith("arrays/")]
    start = _member_data_offset(blob, member)
    bad = bytearray(blob)
    bad[start + 128 + 20] ^= 0x80  # inside the pickle after the 128-byte header
    with pytest.raises(lv.CorruptError, match="CRC"):
        lv.loads(bytes(bad), allow_pickle=True)
    assert lv.loads(blob, allow_pickle=True)["x"] == 1


def test_damaged_records_raise_corrupt_error_not_builtins() -> None:
    # found by a break-it trial: KeyError/ValueError/SyntaxError escaped
    from lazyvault._source import MemorySource

    arr = np.arange(3)
    bad_layouts = [{"eict": {}}, {"array": "missing"}, {"dict": 1}, {"a": 1, "b": 2}]
    for layout in bad_layouts:
        record = {
            "meta": {},
            "arrays": {"x": {"descr": "'<i8'", "shape": [3], "fortran_order": False}},
            "layout": layout,
        }
        rec = lv.Record(MemorySource({"x": arr}, None), "k", record)
        with pytest.raises(lv.CorruptError):
            rec.load()
    record = {
        "meta": {},
        "arrays": {"x": {"descr": "'<h2'", "shape": [3], "fortran_order": False, "nbytes": 6}},
        "layout": None,
    }
    with pytest.raises(lv.CorruptError):
        lv.Record(MemorySource({}, None), "k", record).arrays


def test_archive_is_opened_not_called_and_errors_name_only_public_functions(
    tmp_path: Path,
) -> None:
    # a fresh user's trial: lv.Archive("x.lvz") raised AttributeError, and the advice to pass
    # allow_pickle named an open_archive the package does not export
    with pytest.raises(TypeError, match=r"Store\.open\(path\)"):
        lv.Archive("x.lvz")  # type: ignore[arg-type]
    with lv.Store.open(tmp_path / "s") as s:
        s["k"] = {"d": {1: "int keys need pickle"}}
        s.export(tmp_path / "a.lvz")
    with lv.Store.open(tmp_path / "a.lvz") as archive:
        with pytest.raises(lv.PickleNotAllowedError) as e:
            archive["k"].load()
    assert "open_archive" not in str(e.value) and "Store.open, lazyvault.loads" in str(e.value)
