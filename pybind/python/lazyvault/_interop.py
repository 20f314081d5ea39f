"""Interop with the array files users already have: ``store.import_file``
and, for what each format carries, ``store.export`` (``_export``).

Formats, and where their byte layouts are specified:

- ``.npy``: NEP 1 / the docstring of ``numpy/lib/format.py``. Versions 1.0
  (2-byte header length, latin-1), 2.0 (4-byte length, latin-1) and 3.0
  (4-byte length, utf-8), nothing else; headers of the Python 2 era
  (``(2L,)`` shapes) are read too. The header text is at most
  ``max_header_size`` bytes (numpy's knob and default, 10,000).
- ``.npz``: a zip of ``.npy`` members (``np.savez``), stored or deflated.
  The zip's declared size of each member is checked against the size its
  ``.npy`` header implies and, for a deflated member, against
  :data:`DEFAULT_MAX_DEFLATE_RATIO` (or ``max_ratio=``) times its
  compressed size; inflating stops as soon as a member goes past its
  declared size (decompression bombs), and every member's CRC-32 is
  checked.
- ``.safetensors``: 8-byte little-endian header length ``N``, ``N`` bytes of
  JSON (``{name: {"dtype", "shape", "data_offsets"}, "__metadata__":
  {str: str}}``), then the data section; every tensor little-endian, C
  order, at ``data_offsets`` relative to the data section. The header is
  checked whole (length against the file and a 100 MB cap, as the reference
  reader does, before anything is allocated from it; every tensor's offsets
  in range, non-overlapping, of the size its shape and dtype imply) before
  the file is mapped.
- ``.lvz``: lazyvault's own archive (``_archive``); records are copied at
  record level (metadata, layout, arrays, pickled remainder as bytes), so
  importing never unpickles.

Import detects the format from the content (magic bytes), not the name.
The Rust core reads every format (``lazyvault_store::interop``): the file
is opened once and checked whole (headers, zip directory, declared sizes,
manifest) before anything is written; then each array is streamed from
that one open file into its payload file (copied, or inflated), through a
buffer of a few MiB whatever its size, and the records are committed
together. So memory stays bounded, any number of members needs one file
descriptor, free space is checked first, and a rejected file leaves the
store as it was (no record, no payload file, no temporary file). This
module keeps the glue: directories, keys, progress bars.

What each format carries back
-----------------------------

``.npy`` becomes one record ``{"data": array}``. A foreign ``.npz`` becomes
one record ``{member name without ".npy": array}``. A ``.safetensors`` file
becomes one record ``{tensor name: array}`` whose metadata also holds
``"__metadata__"`` (the file's string map) and, when the file has tensors of
kinds numpy lacks, ``"safetensors_dtypes"`` (see below).

Our ``.npz`` export (``_export.export``, uncompressed, members 64-byte aligned):

- one member per array, named ``<key>/<array path>.npy`` after
  sanitising (``_export.member_name``): the text is split on ``/``; an empty
  segment becomes ``_``, ``.`` becomes ``_`` and ``..`` becomes ``__``;
  backslashes, ``:`` and control characters become ``_``. So no member name
  is absolute, has a drive letter or a ``..`` segment, whatever the key.
  Names that collide after sanitising get ``~2``, ``~3``... on the last
  segment.
- one member ``__lazyvault__.json`` (not a ``.npy``; ``np.load`` lists it
  and returns its bytes, and ignores it otherwise) mapping every record key
  to its metadata, its layout (when the record needs no pickled remainder,
  which npz cannot carry) and ``{array path: member name}``: the exact
  inverse of the sanitising. Importing such a file brings every record back
  under its own key.

Our ``.safetensors`` export: tensor names are the array paths for a single
record, ``<key>/<array path>`` for several. ``__metadata__`` (a
string-to-string map by the format) holds, for a single record, its
metadata fields (strings as they are, anything else JSON-encoded) merged
with the ``"__metadata__"`` map it was imported with; for several records,
``{key: JSON of the record's metadata}``. A ``"lazyvault"`` entry, JSON
``{"version": 1, "json": [keys JSON-encoded by us], "fields": [keys that
were top-level metadata fields]}``, lets import decode exactly what we
encoded; it is written only when needed, so a foreign file exported back
keeps its ``__metadata__`` unchanged.

Raw-bit dtypes: safetensors' ``BF16`` and ``F8_*`` kinds have no numpy
dtype. They are kept as raw bits (``uint16`` for BF16, ``uint8`` for F8),
never converted to another float, with the original tag in the record's
metadata: ``"safetensors_dtypes": {tensor name: "BF16"}``; export writes
that tag back.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from . import _arrays, _lazyvault
from ._progress import ProgressArg, Report, progress_callback
from .errors import (
    InteropError,
    InvalidFileError,
    KeyTypeError,
    UnknownFormatError,
)

if TYPE_CHECKING:
    from .record import Record
    from .store import Store

__all__ = [
    "DEFAULT_MAX_DEFLATE_RATIO",
    "InteropError",
    "InvalidFileError",
    "UnknownFormatError",
    "copy_record",
    "detect_format",
    "import_file",
]


# -- limits -----------------------------------------------------------------

#: Largest ``.npy`` header text read unless ``max_header_size=`` says
#: otherwise (numpy's own default and meaning).
NPY_MAX_HEADER_SIZE: int = _lazyvault.NPY_MAX_HEADER_SIZE
#: Largest safetensors header, as the reference reader (100 MB).
SAFETENSORS_MAX_HEADER: int = _lazyvault.SAFETENSORS_MAX_HEADER
#: Largest uncompressed-to-compressed size ratio a deflated ``.npz`` member
#: may declare unless ``max_ratio=`` says otherwise: deflate cannot expand
#: more than about 1032:1, so a member declaring more is lying.
DEFAULT_MAX_DEFLATE_RATIO: int = _lazyvault.DEFAULT_MAX_DEFLATE_RATIO

# Python 2 pickles of object arrays need it (numpy's advice for np.load);
# Python 3 pickles ignore it.
_PICKLE_ENCODING = "latin1"
_NPY_MAGIC = b"\x93NUMPY"


# -- detection ----------------------------------------------------------------


def detect_format(path: str | os.PathLike[str]) -> str:
    """``"npy"``, ``"npz"``, ``"safetensors"`` or ``"lvz"``, from the content.

    A zip is ``"lvz"`` when it holds lazyvault's archive manifest, else
    ``"npz"``. Raises :class:`UnknownFormatError` for anything else,
    :class:`InvalidFileError` for a file that starts like a safetensors file
    but whose header length exceeds it, :class:`StorageError` when the file
    cannot be read.
    """
    return str(_lazyvault.detect_format(os.fspath(path)))


# -- import -----------------------------------------------------------------


#: The files importing a directory picks up (by name; the format of each
#: is then read from its content).
IMPORT_SUFFIXES = (".npy", ".npz", ".safetensors", ".lvz")


@dataclass(frozen=True)
class _Limits:
    """The reading limits of one import (None: the defaults)."""

    max_header_size: int | None = None
    max_ratio: int | None = None


def import_file(
    store: Store,
    path: str | os.PathLike[str],
    key: str | None = None,
    progress: ProgressArg = None,
    max_header_size: int | None = None,
    max_ratio: int | None = None,
) -> list[str]:
    """Reads ``path`` (format from its content) into ``store``; returns the
    keys written. ``key`` defaults to the file's stem; an ``.lvz`` (or an
    ``.npz`` exported by lazyvault) brings its records back under their own
    keys unless it holds exactly one record and ``key`` is given.

    A directory: every file under it (subdirectories included) whose name
    ends in one of :data:`IMPORT_SUFFIXES` (case-insensitive), in sorted
    order, skipping names that start with ``.`` and lazyvault stores inside
    it; each single-record file is keyed by its path relative to the
    directory without the suffix (``"sub/a"``). ``key`` must be None. Every
    file's format is checked before anything is written, and two files that
    would give the same key (``a.npy`` and ``a.npz``) raise
    :class:`InteropError` up front.

    ``progress``: see :mod:`lazyvault._progress`; counts files for a
    directory, records for one file (it runs while the store's writer lock
    is held: it must not write to this store). ``max_header_size``: the largest
    ``.npy`` header text read, in bytes, for ``.npy`` files and ``.npz``
    members (numpy's ``max_header_size``; default
    :data:`NPY_MAX_HEADER_SIZE`, 10,000). ``max_ratio``: the largest
    uncompressed-to-compressed ratio a deflated ``.npz`` member may declare
    (default :data:`DEFAULT_MAX_DEFLATE_RATIO`, 1100).

    Raises :class:`UnknownFormatError`, :class:`InvalidFileError` (naming
    the file and the member or tensor; the store is unchanged),
    :class:`PickleNotAllowedError` for object arrays when the store was
    opened without ``allow_pickle``, :class:`StorageError` (``ENOSPC``)
    when the arrays do not fit on the store's file system (checked before
    writing). A file's records are written together, all or nothing; a
    directory (or an ``.lvz``) that fails on a later file (record) keeps
    those written before it.
    """
    path = os.fspath(path)
    if key is not None and not isinstance(key, str):
        raise KeyTypeError(f"keys are str, not {type(key).__name__}")
    limits = _Limits(max_header_size, max_ratio)
    if os.path.isdir(path):
        if key is not None:
            raise InteropError(
                f"{path} is a directory: its files are keyed by their paths, key= names "
                "the record of a single file"
            )
        return _import_directory(store, path, progress, limits)
    fmt = detect_format(path)
    with progress_callback(progress, "import", "record") as report:
        return _import_one(store, path, fmt, key, Path(path).stem, report, limits)


def _import_one(
    store: Store,
    path: str,
    fmt: str,
    key: str | None,
    default_key: str,
    report: Report | None,
    limits: _Limits,
) -> list[str]:
    """Imports one file of format ``fmt``; ``default_key`` names a
    single-record file when ``key`` is None."""
    if fmt == "lvz":
        return _import_lvz(store, path, key, report)
    keys = _lazyvault.import_file(
        store._core,
        path,
        key,
        default_key,
        allow_pickle=store.allow_pickle,
        max_header_size=limits.max_header_size,
        max_deflate_ratio=limits.max_ratio,
        progress=report,
        repickle=_repickle if store.allow_pickle else None,
    )
    return list(keys)


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


def _import_directory(store: Store, root: str, progress: ProgressArg, limits: _Limits) -> list[str]:
    files: list[tuple[str, str, str]] = []  # (path, format, default key)
    keys: dict[str, str] = {}
    for found in _importable_files(root):
        rel = found.relative_to(root)
        fmt = detect_format(found)
        default_key = rel.with_suffix("").as_posix()
        # .lvz files and our .npz carry their own keys
        if fmt in ("npy", "safetensors") or (
            fmt == "npz" and not _lazyvault.npz_has_manifest(os.fspath(found))
        ):
            if default_key in keys:
                raise InteropError(
                    f"{keys[default_key]} and {rel} would both be imported as {default_key!r}"
                )
            keys[default_key] = os.fspath(rel)
        files.append((os.fspath(found), fmt, default_key))
    written: list[str] = []
    with progress_callback(progress, "import", "file") as report:
        if report is not None:
            report(0, len(files))
        for done, (file, fmt, default_key) in enumerate(files, 1):
            written.extend(_import_one(store, file, fmt, None, default_key, None, limits))
            if report is not None:
                report(done, len(files))
    return written


# Reading headers (inspection; import reads them in the core) -----------------


@dataclass(frozen=True)
class NpyHeader:
    """A parsed ``.npy`` header; ``length`` is where the data start."""

    version: tuple[int, int]
    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype
    length: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def order(self) -> str:
        return "F" if self.fortran_order else "C"


def read_npy_header(fp: IO[bytes], what: str, max_header_size: int | None = None) -> NpyHeader:
    """Reads and checks the header of the ``.npy`` stream ``fp`` (positioned
    at its magic) with the core's parser; ``fp`` is left at the data.
    Raises :class:`InvalidFileError` naming ``what``."""
    limit = NPY_MAX_HEADER_SIZE if max_header_size is None else max_header_size
    prefix = fp.read(8)
    if len(prefix) == 8 and prefix.startswith(_NPY_MAGIC):
        prefix += fp.read(2 if prefix[6] == 1 else 4)
    if len(prefix) in (10, 12):
        declared = int.from_bytes(prefix[8:], "little")
        prefix += fp.read(min(declared, limit))
    version, descr, fortran, shape, length = _lazyvault.parse_npy_header(prefix, what, limit)
    return NpyHeader(
        (int(version[0]), int(version[1])),
        tuple(int(n) for n in shape),
        bool(fortran),
        _arrays.dtype_from_descr(descr),
        int(length),
    )


def read_safetensors_header(
    path: str | os.PathLike[str],
) -> tuple[dict[str, str] | None, list[dict[str, Any]], int]:
    """``(__metadata__ or None, tensors, data section offset)`` of a
    safetensors file, every entry checked by the core (each tensor a dict
    with ``name``, ``dtype`` (the tag), ``shape`` and ``data_offsets``);
    reads the header only. Raises :class:`InvalidFileError`."""
    metadata, tensors, data_start = _lazyvault.read_safetensors_header(os.fspath(path))
    return metadata, list(tensors), int(data_start)


# .lvz and record-level copies --------------------------------------------------


def _import_lvz(store: Store, path: str, key: str | None, report: Report | None) -> list[str]:
    try:
        from . import _archive
    except ImportError:
        raise InteropError(f"{path}: a .lvz archive, but this lazyvault cannot read them") from None
    archive = _archive.open_archive(path, allow_pickle=store.allow_pickle)
    try:
        # check every array (headers, sizes, CRC-32) before writing anything,
        # so a damaged archive leaves the store unchanged
        check = archive.verify()
        if not check["ok"]:
            raise InvalidFileError(f"{path}: damaged archive: {check['problems'][0]}")
        keys = list(archive)
        if key is not None and len(keys) != 1:
            raise InteropError(
                f"{path} holds {len(keys)} records; key= renames a single record only"
            )
        written = []
        if report is not None:
            report(0, len(keys))
        for k in keys:
            target = key if key is not None else k
            copy_record(store, target, archive[k])
            written.append(target)
            if report is not None:
                report(len(written), len(keys))
        return written
    finally:
        close = getattr(archive, "close", None)
        if close is not None:
            close()


def _raw_pickled_array(rec: Record, name: str, entry: dict[str, Any]) -> bytes | None:
    """The pickle bytes of an ``object`` array payload without unpickling,
    when the record's source can hand them over."""
    source = rec._source
    raw = getattr(source, "read_array_bytes", None)
    if raw is not None:
        return raw(rec.key, name, entry)
    root = getattr(source, "root", None)
    if root is not None and "id" in entry:
        return _lazyvault.read_array_bytes(
            root,
            entry["id"],
            entry["descr"],
            entry["shape"],
            entry["fortran_order"],
            entry["nbytes"],
            entry["data_offset"],
        )
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
    from .store import _check_key

    key = _check_key(key)
    record = rec._record
    arrays = [_record_payload_args(rec, n, e) for n, e in record["arrays"].items()]
    pickled = rec._remainder()
    store._core.put(
        key,
        json.dumps(record["meta"], ensure_ascii=False, allow_nan=False),
        json.dumps(record["layout"], ensure_ascii=False, allow_nan=False),
        arrays,
        pickled,
    )
