"""The exception classes: created by the core, re-exported by
``lazyvault.errors``, raised with their data as attributes, keeping their
builtin bases, and surviving pickling."""

from __future__ import annotations

import errno
import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import lazyvault as lv
import lazyvault._lazyvault as core
import lazyvault.errors as errors

from conftest import damage_payload, payload_location

# class name -> the builtin bases it keeps besides LazyvaultError
BUILTIN_BASES: dict[str, tuple[type[BaseException], ...]] = {
    "StorageError": (OSError,),
    "StoreExistsError": (FileExistsError, OSError),
    "StoreNotFoundError": (FileNotFoundError, OSError),
    "MissingFileError": (FileNotFoundError, OSError),
    "ClosedError": (ValueError,),
    "InvalidKeyError": (ValueError,),
    "KeyTypeError": (TypeError,),
    "MissingKeyError": (KeyError, LookupError),
    "QueryError": (ValueError,),
    "InvalidArrayError": (ValueError,),
    "InvalidFieldError": (ValueError,),
    "PickleNotAllowedError": (ValueError,),
    "InteropError": (ValueError,),
    "UnknownFormatError": (ValueError,),
    "InvalidFileError": (ValueError,),
}


def roundtrip(e: BaseException) -> BaseException:
    return pickle.loads(pickle.dumps(e))  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", errors.__all__)
def test_classes_come_from_the_core_with_their_bases_and_docs(name: str) -> None:
    cls = getattr(errors, name)
    assert cls is getattr(core, name) and cls is getattr(lv, name, cls)
    assert issubclass(cls, errors.LazyvaultError) and issubclass(cls, Exception)
    for base in BUILTIN_BASES.get(name, ()):
        assert issubclass(cls, base), (name, base)
    assert cls.__module__ == "lazyvault.errors" and cls.__name__ == name
    assert cls.__doc__ and len(cls.__doc__) > 20
    assert issubclass(errors.UnknownFormatError, errors.InteropError)
    assert issubclass(errors.InvalidFileError, errors.InteropError)


def test_attribute_defaults_are_declared() -> None:
    assert errors.CorruptError("x").key is None
    assert errors.CorruptError("x").array is None and errors.CorruptError("x").path is None
    assert errors.StoreLockedError("x").pid is None
    assert errors.InvalidArrayError("x").array is None
    assert errors.InvalidFileError("x").path is None and errors.InvalidFileError("x").what is None
    q = errors.QueryError("x")
    assert (q.column, q.expression, q.reason) == (0, "", "")


def test_corrupt_payload_names_key_array_and_file(store: lv.Store, store_path: Path) -> None:
    store["k"] = {"img": np.arange(10_000, dtype=np.uint16)}
    store.flush()
    entry = store["k"]._record["arrays"]["img"]
    path, _ = payload_location(store_path, entry)  # a pack: the array is small
    damage_payload(store_path, entry, lambda b: b[:-100])
    with pytest.raises(lv.CorruptError, match=r"'k'.*'img'.*truncated") as info:
        _ = store["k"].img
    e = info.value
    assert (e.key, e.array, e.path) == ("k", "img", str(path))
    back = roundtrip(e)
    assert type(back) is lv.CorruptError and str(back) == str(e)
    assert (back.key, back.array, back.path) == ("k", "img", str(path))


def test_damaged_npy_header_is_corrupt(store: lv.Store, store_path: Path) -> None:
    store["k"] = {"img": np.arange(100, dtype=np.uint16)}
    store.flush()
    entry = store["k"]._record["arrays"]["img"]
    path, _ = payload_location(store_path, entry)
    damage_payload(store_path, entry, lambda b: b"not a npy file" + b[14:])
    with pytest.raises(lv.CorruptError, match="bad magic") as info:
        _ = store["k"].img
    assert (info.value.key, info.value.array, info.value.path) == ("k", "img", str(path))


def test_bad_query_has_column_expression_reason(store: lv.Store) -> None:
    store["k"] = {"v": 1}
    with pytest.raises(lv.QueryError) as info:
        store.find("v >> 1")
    e = info.value
    assert isinstance(e, ValueError)
    assert e.column == 4 and e.expression == "v >> 1" and e.reason and e.reason in str(e)
    back = roundtrip(e)
    assert type(back) is lv.QueryError and str(back) == str(e)
    assert (back.column, back.expression, back.reason) == (e.column, e.expression, e.reason)


_SECOND_WRITER = """
import json, pickle, sys, lazyvault as lv
with lv.Store.open(sys.argv[1]) as s:
    try:
        s["mine"] = {"v": 3}
    except lv.StoreLockedError as e:
        back = pickle.loads(pickle.dumps(e))
        same = type(back) is lv.StoreLockedError and str(back) == str(e)
        print(json.dumps({"pid": e.pid, "path": e.path, "msg": str(e),
                          "back_pid": back.pid, "same": same}))
"""


def test_locked_store_has_pid_and_path(store: lv.Store, store_path: Path) -> None:
    store["a"] = {"v": 1}
    store.flush()
    proc = subprocess.run(
        [sys.executable, "-c", _SECOND_WRITER, str(store_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(proc.stdout)
    assert got["pid"] == os.getpid() and str(os.getpid()) in got["msg"]
    assert got["path"] == str(store_path.absolute())
    assert got["back_pid"] == os.getpid() and got["same"]


def test_storage_error_is_an_oserror_with_errno_and_filename(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(lv.StorageError) as info:
        lv.Store.open(blocker / "store", "a")
    e = info.value
    assert isinstance(e, OSError) and e.errno == errno.ENOTDIR
    assert e.strerror and e.filename and e.filename.startswith(str(blocker))
    back = roundtrip(e)
    assert type(back) is lv.StorageError
    assert (back.errno, back.strerror, back.filename) == (e.errno, e.strerror, e.filename)


def test_open_errors_have_path(tmp_path: Path) -> None:
    with pytest.raises(lv.StoreNotFoundError) as info:
        lv.Store.open(tmp_path / "nope", "r")
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.path == str(tmp_path / "nope")
    lv.Store.open(tmp_path / "s", "w").close()
    with pytest.raises(lv.StoreExistsError) as exists:
        lv.Store.open(tmp_path / "s", "w")
    assert isinstance(exists.value, FileExistsError)
    assert exists.value.path == str(tmp_path / "s")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_bytes(b"")
    with pytest.raises(lv.NotAStoreError) as other:
        lv.Store.open(tmp_path / "other")
    assert other.value.path == str(tmp_path / "other")
    assert roundtrip(other.value).path == other.value.path  # type: ignore[attr-defined]


def test_invalid_array_has_its_name(store: lv.Store) -> None:
    store["k"] = {"a": np.arange(3)}
    with pytest.raises(lv.InvalidArrayError, match="no array of this name") as info:
        store.replace_arrays("k", {"b": np.arange(2)})
    assert info.value.array == "b" and isinstance(info.value, ValueError)
    back = roundtrip(info.value)
    assert type(back) is lv.InvalidArrayError and back.array == "b"


def test_usage_errors_keep_their_builtin_bases(store_path: Path) -> None:
    store = lv.Store.open(store_path)
    with pytest.raises(ValueError) as empty:
        store[""] = {"v": 1}
    assert type(empty.value) is lv.InvalidKeyError
    store.close()
    with pytest.raises(ValueError) as closed:
        len(store)
    assert type(closed.value) is lv.ClosedError
    assert type(roundtrip(closed.value)) is lv.ClosedError
    with lv.Store.open(store_path, "r") as reader:
        with pytest.raises(lv.ReadOnlyError):
            reader["k"] = {"v": 1}


def test_invalid_file_error_has_path_and_what(store: lv.Store, tmp_path: Path) -> None:
    # it had .what only; the README promises the file
    path = tmp_path / "bad.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x.npy", b"not an npy")
    with pytest.raises(lv.InvalidFileError) as info:
        store.import_file(path)
    e = info.value
    assert e.path == str(path) and e.what == f"{path} member 'x.npy'"
    back = roundtrip(e)
    assert type(back) is lv.InvalidFileError and str(back) == str(e)
    assert (back.path, back.what) == (e.path, e.what)  # type: ignore[attr-defined]


def test_a_missing_input_file_is_a_file_not_found_error(store: lv.Store, tmp_path: Path) -> None:
    # it was a StorageError whose strerror ended "(os error 2)"
    missing = tmp_path / "nope.npy"
    with pytest.raises(FileNotFoundError) as info:
        store.import_file(missing)
    e = info.value
    assert type(e) is lv.MissingFileError and isinstance(e, lv.StorageError)
    assert e.errno == errno.ENOENT and e.filename == str(missing)
    assert e.strerror == os.strerror(errno.ENOENT)
    assert str(e) == f"[Errno 2] {os.strerror(errno.ENOENT)}: {str(missing)!r}"
    back = roundtrip(e)
    assert type(back) is type(e)
    assert (back.errno, back.strerror, back.filename) == (e.errno, e.strerror, e.filename)  # type: ignore[attr-defined]
    assert type(e).__module__ == "lazyvault.errors"


def test_missing_key_error_follows_key_error(store: lv.Store) -> None:
    # KeyError's convention: args[0] is the key, str() shows it quoted
    with pytest.raises(lv.MissingKeyError) as info:
        store["nope"]
    e = info.value
    assert e.args == ("nope",) and e.key == "nope" and str(e) == "'nope'"
    told = lv.MissingKeyError("k", "no record 'k' in here")
    assert told.key == "k" and told.args[0] == "k" and str(told) == "no record 'k' in here"
    back = roundtrip(told)
    assert type(back) is lv.MissingKeyError and back.args == told.args and str(back) == str(told)
    assert lv.MissingKeyError().key is None


def test_archive_and_export_errors_name_the_users_path(store: lv.Store, tmp_path: Path) -> None:
    # found by a new user's trial: each of these had .path None, or named a
    # hidden temporary file
    with pytest.raises(lv.StoreNotFoundError) as missing:
        lv.Store.open(tmp_path / "missing.lvz")
    assert missing.value.path == str(tmp_path / "missing.lvz")
    np.savez(tmp_path / "foreign.npz", a=np.arange(3))
    (tmp_path / "short.lvz").write_bytes(b"PK\x03\x04" + b"\0" * 40)
    # a zip without the archive manifest is no store; a truncated one, damaged
    errors: dict[str, type[lv.LazyvaultError]] = {
        "foreign.npz": lv.NotAStoreError,
        "short.lvz": lv.CorruptError,
    }
    for name, error in errors.items():
        with pytest.raises(error) as damaged:
            lv.Store.open(tmp_path / name)
        assert damaged.value.path == str(tmp_path / name)
    store["a"] = {"x": np.arange(3)}
    with pytest.raises(lv.UnknownFormatError) as unknown:
        store.export(tmp_path / "out.txt")
    assert unknown.value.path == str(tmp_path / "out.txt")
    target = tmp_path / "no" / "such" / "dir" / "out.lvz"
    with pytest.raises(lv.StorageError) as failed:
        store.export(target)
    assert failed.value.filename == str(target) and ".tmp" not in str(failed.value)


def test_a_missing_payload_of_an_unchanged_store_says_missing_not_overwritten(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path) as store:
        store["big"] = {"z": np.zeros(100_000)}  # a payload file of its own
        store["small"] = {"y": np.arange(3)}  # a pack member
    for key, name in (("big", "z"), ("small", "y")):
        with lv.Store.open(path, mode="r") as reader:
            file, _ = payload_location(path, reader[key]._record["arrays"][name])
        file.unlink()
        with lv.Store.open(path, mode="r") as reader:  # nobody wrote since
            with pytest.raises(lv.CorruptError) as info:
                _ = reader[key][name]
        text = str(info.value)
        assert "file is missing" in text and str(file) in text, text
        assert "overwritten or deleted" not in text, text
        assert "lazyvault verify" in text, text
        assert (info.value.key, info.value.array, info.value.path) == (key, name, str(file))


def test_a_payload_removed_after_its_record_was_overwritten_says_so(tmp_path: Path) -> None:
    path = tmp_path / "s.lv"
    with lv.Store.open(path, retention=0) as store:
        store["k"] = {"z": np.zeros(100_000)}
        store.flush()
        old = store["k"]
        store["k"] = {"z": np.ones(100_000)}
        store.gc()  # nothing pins the old payload: removed
        with pytest.raises(lv.CorruptError, match="overwritten or deleted since it was read"):
            _ = old.z
        np.testing.assert_array_equal(store["k"].z, np.ones(100_000))
