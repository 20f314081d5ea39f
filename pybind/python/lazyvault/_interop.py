"""Interop with the array files users already have: ``store.import_file``
(``.npy``, ``.npz``, ``.safetensors``, ``.lvz``; ``store.export`` is in
``_export``).

The Rust core detects, checks and reads every format, ``.lvz`` included,
and imports all the files of one call as one commit
(``lazyvault_store::interop``, whose module docs specify the byte formats
and what each becomes; README.md, "Sharing records", for users). This module
keeps the glue: directories, keys, argument checks, progress, object-array
pickles, and record-level copies between stores and archives
(:func:`copy_record`).
"""

from __future__ import annotations

import json
import operator
import os
import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _arrays, _lazyvault
from ._progress import ProgressArg, progress_callback
from ._source import array_entry, text_path
from .errors import (
    InteropError,
    InvalidFileError,
    InvalidKeyError,
    KeyTypeError,
)
from .record import entry_of, remainder_of, source_of
from .store import check_key, core_of, plug_interop

if TYPE_CHECKING:
    from .record import Record
    from .store import Store

__all__ = [
    "DEFAULT_MAX_DEFLATE_RATIO",
    "copy_record",
    "detect_format",
    "import_file",
]


# -- limits -----------------------------------------------------------------

#: Largest ``.npy`` header text read unless ``max_header_size=`` says
#: otherwise (numpy's own default and meaning).
NPY_MAX_HEADER_SIZE: int = _lazyvault.NPY_MAX_HEADER_SIZE
#: Largest uncompressed-to-compressed size ratio a deflated ``.npz`` member
#: may declare unless ``max_ratio=`` says otherwise: deflate cannot expand
#: more than about 1032:1, so a member declaring more is lying.
DEFAULT_MAX_DEFLATE_RATIO: int = _lazyvault.DEFAULT_MAX_DEFLATE_RATIO

# Python 2 pickles of object arrays need it (numpy's advice for np.load);
# Python 3 pickles ignore it.
_PICKLE_ENCODING = "latin1"


# -- detection ----------------------------------------------------------------


#: ``"npy"``, ``"npz"``, ``"safetensors"`` or ``"lvz"``, from the content (the core's).
detect_format = _lazyvault.detect_format


# -- import -----------------------------------------------------------------


#: The files importing a directory picks up (by name; the format of each
#: is then read from its content).
IMPORT_SUFFIXES = (".npy", ".npz", ".safetensors", ".lvz")


_U64_MAX = 2**64 - 1


def _limit(name: str, value: object, what: str) -> int | None:
    """``value`` of the ``name=`` parameter checked: None, or an int from 1
    to 2**64-1 (``what`` says what it counts, for the message)."""
    if value is None:
        return None
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int ({what}) or None, not {type(value).__name__}")
    number = operator.index(value)  # type: ignore[arg-type]
    if not 1 <= number <= _U64_MAX:
        raise ValueError(f"{name} must be from 1 to 2**64-1 ({what}), not {number}")
    return number


def import_file(
    store: Store,
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    key: str | None = None,
    progress: ProgressArg = None,
    max_header_size: int | None = None,
    max_ratio: int | None = None,
) -> list[str]:
    """Reads ``path`` (format from its content) into ``store``; returns the keys written. ``key``
    defaults to the file's stem; an ``.lvz`` (or an ``.npz`` exported by lazyvault) brings its
    records back under their own keys unless it holds exactly one record and ``key`` is given.

    A directory: every file under it (subdirectories included) whose name ends in one of
    :data:`IMPORT_SUFFIXES` (case-insensitive), in sorted order, skipping names that start with
    ``.`` and lazyvault stores inside it; each single-record file is keyed by its path relative to
    the directory without the suffix (``"sub/a"``). ``key`` must be None. A list or tuple of files
    and directories: all of them, in one commit.

    All or nothing: every file is checked whole (headers, zip directories, declared sizes, an
    archive's CRC-32s) before anything is written, and the records of every file are committed
    together, so a refusal at any file, or a failure while copying (a CRC mismatch, a full disk),
    leaves the store unchanged. Two files that would give the same key (``a.npy`` and ``a.npz``; a
    key an ``.lvz`` brings back) raise :class:`InteropError` naming the key and both files.

    ``progress``: see :mod:`lazyvault._progress`; counts arrays over every file, ``(0, total)`` once
    all are checked, then after each array (it runs while the store's writer lock is held: it must
    not write to this store). ``max_header_size``: the largest ``.npy`` header text read, in bytes,
    for ``.npy`` files and ``.npz`` members (numpy's ``max_header_size``; an int from 1, default
    :data:`NPY_MAX_HEADER_SIZE`, 10,000). ``max_ratio``: the largest uncompressed-to-compressed
    ratio a deflated ``.npz`` member may declare (an int from 1, default
    :data:`DEFAULT_MAX_DEFLATE_RATIO`, 1100).

    Raises :class:`UnknownFormatError`, :class:`InvalidFileError` (``path`` the file, ``what`` and
    the message naming the member, tensor or record), :class:`PickleNotAllowedError` for object
    arrays of a ``.npy``/``.npz`` when the store was opened without ``allow_pickle``,
    :class:`StorageError` (``ENOSPC``) when the arrays do not fit on the store's file system
    (checked before writing), ``FileNotFoundError`` (:class:`StorageError` too) for a missing file,
    ``TypeError`` or ``ValueError`` for a bad ``key``, ``max_header_size`` or ``max_ratio``,
    ``TypeError`` for a ``path`` that is not a path or a list of paths, ``ValueError`` for a path
    holding a NUL byte; :class:`InteropError` for
    a directory with no file to import or an empty list (nothing is written, and the command
    line's ``import`` creates no store) and for a file given twice.
    """
    # bytes paths too, as os.fspath accepts them
    items: list[Any] = list(path) if isinstance(path, list | tuple) else [path]
    for item in items:
        if not isinstance(item, str | bytes | os.PathLike):
            shown = "None" if item is None else type(item).__name__
            raise TypeError(f"path must be a path or a list of paths, not {shown}")
    if not items:
        raise InteropError("path is an empty list: nothing to import")
    paths = [text_path(p, "file path") for p in items]
    if key is not None and not isinstance(key, str):
        raise KeyTypeError(f"keys are str, not {type(key).__name__}")
    header_limit = _limit("max_header_size", max_header_size, "bytes of .npy header text")
    ratio_limit = _limit("max_ratio", max_ratio, "uncompressed bytes per compressed byte")
    files: list[tuple[str, str | None, str]] = []  # (path, key, default key)
    for item in paths:
        if key is not None and (len(paths) > 1 or os.path.isdir(item)):
            raise InteropError(
                f"{item}: key= names the record of a single file; a directory's files are "
                "keyed by their paths, several files by their names"
            )
        if os.path.isdir(item):
            found = list(_importable_files(item))
            if not found:
                raise InteropError(
                    f"{item}: no .npy, .npz, .safetensors or .lvz file under this directory: "
                    "nothing to import"
                )
            files += [
                (os.fspath(f), None, f.relative_to(item).with_suffix("").as_posix()) for f in found
            ]
        else:
            files.append((item, key, Path(item).stem if key is None else key))
    for file, given, default in files:
        if given is None and _not_utf8(default):
            raise InvalidKeyError(
                f"{file!r}: a file name that is not valid UTF-8 cannot be a key; rename the "
                "file, or import it alone with key="
            )
    with progress_callback(progress, "import", "array") as report:
        keys = _lazyvault.import_files(
            core_of(store),
            files,
            allow_pickle=store.allow_pickle,
            max_header_size=header_limit,
            max_deflate_ratio=ratio_limit,
            progress=report,
            repickle=_repickle if store.allow_pickle else None,
        )
    return list(keys)


def _not_utf8(name: str) -> bool:
    """Whether ``name`` holds surrogates (a non-UTF-8 file name, PEP 383), which no key can hold."""
    return any("\ud800" <= c <= "\udfff" for c in name)


def _repickle(what: str, data: bytes) -> tuple[str, str, tuple[int, ...], bool, bytes]:
    """The payload of an object array read from a file: numpy's pickle
    (maybe from Python 2) loaded and pickled again as the store writes it.
    Called by the core only when the store allows pickles."""
    try:
        array = pickle.loads(data, encoding=_PICKLE_ENCODING)
    except Exception as e:  # a pickle can fail in any way
        raise InvalidFileError(f"{what}: unreadable object array: {e}") from e
    if not isinstance(array, np.ndarray):
        raise InvalidFileError(f"{what}: the pickle holds a {type(array).__name__}, not an array")
    _, descr, dtype, shape, fortran, pickled, _ = _arrays.payload_args("data", array)
    return descr, dtype, shape, fortran, bytes(pickled)


def _importable_files(root: str) -> Iterator[Path]:
    """The files a directory import reads, in sorted order: by suffix,
    skipping hidden names and lazyvault stores (their payloads are not
    objects of their own)."""
    if os.path.exists(os.path.join(root, "lazyvault.json")):
        raise InteropError(
            f"{root} is a lazyvault store: open it and copy its records "
            "(store[key] = other[key]), or export it to .lvz and import that"
        )
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".") and not os.path.exists(os.path.join(top, d, "lazyvault.json"))
        )
        for name in sorted(names):
            path = Path(top, name)
            if (
                not name.startswith(".")
                and path.suffix.lower() in IMPORT_SUFFIXES
                and path.is_file()
            ):
                yield path


# .lvz and record-level copies --------------------------------------------------


def _raw_pickled_array(rec: Record, name: str, entry: dict[str, Any]) -> bytes | None:
    """The pickle bytes of an ``object`` array payload without unpickling,
    when the record's source can hand them over."""
    source = source_of(rec)
    raw = getattr(source, "read_array_bytes", None)
    if raw is not None:
        return raw(rec.key, name, entry)
    root = getattr(source, "root", None)
    if root is not None and "id" in entry:
        return _lazyvault.read_array_bytes(root, array_entry(entry))
    return None


def _record_payload_args(rec: Record, name: str, entry: dict[str, Any]) -> tuple[Any, ...]:
    if entry.get("pickled"):
        data = _raw_pickled_array(rec, name, entry)
        if data is None:  # needs the object itself: unpickles, so allow_pickle applies
            return _arrays.payload_args(name, rec.array(name))
        dtype = _arrays.dtype_from_descr(entry["descr"])
        shape = tuple(entry["shape"])
        return (name, entry["descr"], dtype.name, shape, entry["fortran_order"], data, True)
    return _arrays.payload_args(name, rec.array(name))


def copy_record(store: Store, key: str, rec: Record) -> None:
    """Writes ``rec`` (from any source: a store, an archive) into ``store``
    under ``key`` at record level: metadata, layout, arrays (mapped, not
    rebuilt) and the pickled remainder as bytes. Nothing is unpickled."""
    key = check_key(key)
    record = entry_of(rec)
    arrays = [_record_payload_args(rec, n, e) for n, e in record["arrays"].items()]
    pickled = remainder_of(rec)
    core_of(store).put(
        key,
        json.dumps(record["meta"], ensure_ascii=False, allow_nan=False),
        json.dumps(record["layout"], ensure_ascii=False, allow_nan=False),
        arrays,
        pickled,
    )


plug_interop(import_file=import_file, copy_record=copy_record)
