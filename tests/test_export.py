"""``store.export`` to ``.npz`` and ``.safetensors``, written by the core
(``store/src/interop/export``): the same bytes as the former Python writer,
bounded open files for any number of records, zip64, and errors that name
the file and leave nothing behind. (What the files hold, and round trips
through import, are tested in ``test_interop.py``.)
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lazyvault as lv
from lazyvault import _layout, _lazyvault

from conftest import payload_files

MANY = 20_000


def fill_golden(store: lv.Store) -> None:
    # written with the full layout, as before format 1.5 (the compact one changes the bytes)
    for key, obj in golden_objects().items():
        store._core.put(key, *_layout.encode_generic(obj, key, compact=False))


def golden_objects() -> dict[str, Any]:
    return {
        "run-1": {
            "temperature": 300.0,
            "small": 1e-5,
            "e16": 1e16,
            "text": 'é "q"\n\x01',
            "tags": ["a", "名"],
            "n": 2**64 - 1,
            "nested": {"x": [], "y": {}},
            "w": np.asfortranarray(np.arange(6, dtype=">f4").reshape(2, 3)),
            "e": np.zeros((0, 2)),
            "b": np.array([True, False]),
        },
        "../x": {"..": np.arange(3, dtype="<i2"), "k": None},
    }


# sha256 of the files the former Python writer (zipfile, json.dumps, struct;
# lazyvault before issue 12) wrote for fill_golden's store; g2.safetensors
# since issue 13 also lists the records in its "lazyvault" metadata entry
# (without that list, the bytes are still the former writer's).
GOLDEN = {
    "g.npz": ({}, "0c1f1cc04ce51362fbb29da4b457bc4c93422eda802314d83434b547cb8d632f"),
    "g1.safetensors": (
        {"keys": ["run-1"]},
        "fcf814c1a5bde8106006e959517e57b7d1e71b13982dd4564f7f91b9b4ef5be5",
    ),
    "g2.safetensors": ({}, "7a03d9b524357d379261007383d3d1ccfb9a056c06036496792e71b66808d9b7"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_bytes_are_those_of_the_former_python_writer(
    store: lv.Store, tmp_path: Path, name: str
) -> None:
    fill_golden(store)
    kw, digest = GOLDEN[name]
    store.export(tmp_path / name, **kw)  # type: ignore[arg-type]
    assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == digest


# -- many records, few file descriptors --------------------------------------------


@pytest.fixture(scope="module")
def many_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("many") / "many.lv"
    with lv.Store.open(path) as store:
        store.update(
            ((f"r{i:05d}", {"i": i, "x": np.arange(3, dtype="<i4") + i}) for i in range(MANY)),
            progress=False,
        )
    return path


CHILD = textwrap.dedent(
    """
    import json, resource, struct, sys
    import numpy as np
    import lazyvault as lv

    store_path, out, ext = sys.argv[1:]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    with lv.Store.open(store_path, mode="r") as store:
        store.export(out, progress=False)
    if ext == "npz":
        with np.load(out) as npz:
            files = npz.files
            assert npz["r01234/x"].tolist() == [1234, 1235, 1236]
        print(len(files))
    else:
        with open(out, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        print(len([k for k in header if k != "__metadata__"]))
    """
)


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_many_records_export_with_256_file_descriptors(
    many_path: Path, tmp_path: Path, ext: str
) -> None:
    out = tmp_path / f"many.{ext}"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(many_path), str(out), ext],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    members = MANY + 1 if ext == "npz" else MANY  # the npz has the manifest too
    assert int(proc.stdout.split()[-1]) == members


# -- zip64 ------------------------------------------------------------------------


def test_zip64_npz_is_read_by_numpy_and_zipfile(store: lv.Store, tmp_path: Path) -> None:
    fill_golden(store)
    path = tmp_path / "z.npz"
    # every size and offset past the limit, more members than the count: the
    # zip64 fields of members over 2 GiB and of files of over 65,535 members
    _lazyvault.export_npz(store._core, path, list(store), None, (0, 2))
    data = path.read_bytes()
    assert b"PK\x06\x06" in data and b"PK\x06\x07" in data  # zip64 end records
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None
    with np.load(path) as npz:
        assert len(npz.files) == 5
        assert npz["run-1/w"].tolist() == store["run-1"].w.tolist()
        assert npz["__/x/__"].tolist() == [0, 1, 2]
    back_path = tmp_path / "back.lv"
    with lv.Store.open(back_path) as back:
        assert sorted(back.import_file(path)) == sorted(store)


# -- errors ------------------------------------------------------------------------


def only(tmp_path: Path, *names: str) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["test.lv", *names])


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_missing_directory_or_a_directory_as_target(
    store: lv.Store, tmp_path: Path, ext: str
) -> None:
    store["a"] = {"x": np.arange(3)}
    with pytest.raises(lv.StorageError, match="no/such") as e:
        store.export(tmp_path / "no" / "such" / f"x.{ext}")
    assert isinstance(e.value, OSError)
    (tmp_path / f"d.{ext}").mkdir()
    with pytest.raises(lv.StorageError, match=f"d.{ext}"):
        store.export(tmp_path / f"d.{ext}")
    only(tmp_path, f"d.{ext}")


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_a_vanished_payload_names_record_array_and_file(
    store: lv.Store, store_path: Path, tmp_path: Path, ext: str
) -> None:
    store["a"] = {"x": np.arange(3.0)}
    store["b"] = {"y": np.arange(100_000.0)}
    target = tmp_path / f"out.{ext}"
    target.write_bytes(b"old")
    (gone,) = [p for p in payload_files(store_path) if p.stat().st_size > 100_000]
    gone.unlink()
    with pytest.raises(lv.CorruptError) as e:
        store.export(target)
    message = str(e.value)
    assert all(f"'{n}'" in message or f'"{n}"' in message for n in ("b", "y"))
    assert gone.name in message and str(target) in message
    assert target.read_bytes() == b"old"
    only(tmp_path, target.name)


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_a_full_disk_leaves_nothing(store_path: Path, tmp_path: Path, ext: str) -> None:
    # RLIMIT_FSIZE makes writes past 1 MiB fail (EFBIG) like a full disk
    with lv.Store.open(store_path) as store:
        store["a"] = {"x": np.arange(1_000_000.0)}
    target = tmp_path / f"out.{ext}"
    target.write_bytes(b"old")
    child = textwrap.dedent(
        """
        import resource, signal, sys
        import lazyvault as lv
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        with lv.Store.open(sys.argv[1], mode="r") as store:
            try:
                store.export(sys.argv[2])
            except lv.StorageError as e:
                print(e.errno, e)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", child, str(store_path), str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    errno, _, message = proc.stdout.partition(" ")
    assert int(errno) == 27 and str(target) in message  # EFBIG
    assert target.read_bytes() == b"old"
    only(tmp_path, target.name)


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_an_exception_from_progress_stops_the_export(
    store: lv.Store, tmp_path: Path, ext: str
) -> None:
    store.update((f"k{i}", {"x": np.arange(i + 1)}) for i in range(5))

    def stop(done: int, total: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.export(tmp_path / f"x.{ext}", progress=stop)
    only(tmp_path)


def test_safetensors_checks_come_before_any_file(store: lv.Store, tmp_path: Path) -> None:
    store["a"] = {"w": {"v": np.ones(2, "f4")}}
    store["a/w"] = {"v": np.ones(2, "f4")}  # "a" + "w/v" and "a/w" + "v": one tensor name
    store["b"] = {"w": np.ones(2, "f4")}
    with pytest.raises(lv.InvalidArrayError, match="occurs twice"):
        store.export(tmp_path / "x.safetensors", keys=["a", "b", "a/w"])
    only(tmp_path)


def test_big_endian_and_fortran_tensors_are_little_endian_c_order(
    store: lv.Store, tmp_path: Path
) -> None:
    w = np.asfortranarray(np.arange(2 * 3 * 4, dtype=">i8").reshape(2, 3, 4))
    big = np.asfortranarray(np.arange(300 * 500, dtype=">f4").reshape(300, 500))
    store["r"] = {"w": w, "big": big, "h": np.arange(5, dtype=">f2")}
    path = tmp_path / "r.safetensors"
    store.export(path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    for name, want, dtype in [("w", w, "<i8"), ("big", big, "<f4"), ("h", store["r"].h, "<f2")]:
        begin, end = header[name]["data_offsets"]
        got = np.frombuffer(raw[8 + n + begin : 8 + n + end], dtype=dtype)
        assert got.reshape(want.shape).tolist() == want.tolist(), name


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("a", "keys must be an iterable of str, not one str"),
        (b"a", "keys must be an iterable of str, not bytes"),
        (5, "keys must be an iterable of str, not int"),
        ([1], "keys must be an iterable of str, not of int"),
    ],
)
def test_keys_must_be_an_iterable_of_str(
    store: lv.Store, tmp_path: Path, keys: object, message: str
) -> None:
    # keys=5 raised "'int' object is not iterable", keys=[1] a KeyTypeError
    # about store keys
    store["a"] = {"x": np.arange(2)}
    for ext in (".npz", ".lvz", ".safetensors"):
        with pytest.raises(TypeError, match=message):
            store.export(tmp_path / f"x{ext}", keys=keys)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.lv"]


def test_a_missing_key_is_args_0_of_the_key_error(store: lv.Store, tmp_path: Path) -> None:
    # args[0] was a sentence, against KeyError's convention
    store["a"] = {"x": np.arange(2)}
    with pytest.raises(lv.MissingKeyError) as e:
        store.export(tmp_path / "x.npz", keys=["a", "gone"])
    assert e.value.args[0] == "gone" and e.value.key == "gone"
    assert str(e.value) == "no record with key 'gone' to export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.lv"]
