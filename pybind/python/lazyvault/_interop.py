"""Interop with the array files users already have: ``store.import_file``
and ``store.export`` (DESIGN.md, "Pickle and archives", Interop).

Formats, and where their byte layouts are specified:

- ``.npy``: NEP 1 / the docstring of ``numpy/lib/format.py``. Versions 1.0
  (2-byte header length, latin-1), 2.0 (4-byte length, latin-1) and 3.0
  (4-byte length, utf-8); headers of the Python 2 era (``(2L,)`` shapes)
  are read too. The data are mapped in place (what
  ``np.load(path, mmap_mode="r")`` does), never read whole into memory.
- ``.npz``: a zip of ``.npy`` members (``np.savez``). Stored members are
  mapped in place at their offset in the zip; deflated members are
  decompressed once, streaming, into one buffer of the size their ``.npy``
  header implies, after checking the zip's declared size against that
  size and against a ratio cap (decompression bombs).
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
Everything is validated before the store is written, so a rejected file
leaves the store as it was (no record, no payload file).

What each format carries back
-----------------------------

``.npy`` becomes one record ``{"data": array}``. A foreign ``.npz`` becomes
one record ``{member name without ".npy": array}``. A ``.safetensors`` file
becomes one record ``{tensor name: array}`` whose metadata also holds
``"__metadata__"`` (the file's string map) and, when the file has tensors of
kinds numpy lacks, ``"safetensors_dtypes"`` (see below).

Our ``.npz`` export (written by the core, ``store/src/interop/export``;
``lazyvault._export``; uncompressed, members 64-byte aligned):

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

import ast
import io
import json
import math
import os
import struct
import tokenize
import zipfile
import zlib
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
    LazyvaultError,
    PickleNotAllowedError,
    StorageError,
    UnknownFormatError,
)

if TYPE_CHECKING:
    from .record import Record
    from .store import Store

__all__ = [
    "InteropError",
    "InvalidFileError",
    "UnknownFormatError",
    "copy_record",
    "detect_format",
    "import_file",
]


# -- limits -----------------------------------------------------------------

#: Largest ``.npy`` header read (numpy's own default is 10,000 characters
#: with a knob; lazyvault writes structured dtypes with longer headers).
NPY_MAX_HEADER = 1 << 20
#: Largest safetensors header, as the reference reader (100 MB).
SAFETENSORS_MAX_HEADER = 100_000_000
#: Deflate cannot expand more than ~1032:1; a member declaring more is lying.
DEFLATE_MAX_RATIO = 1100
#: The npz member holding lazyvault's record metadata.
NPZ_MANIFEST = "__lazyvault__.json"
NPZ_FORMAT = "lazyvault-npz"

# Python 2 pickles of object arrays need it (numpy's advice for np.load);
# Python 3 pickles ignore it.
_PICKLE_ENCODING = "latin1"
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a member first; or an empty zip
_CHUNK = 16 << 20

# safetensors dtype tags -> numpy dtypes; raw-bit kinds numpy lacks are kept
# as unsigned integers of the same width and their tag is remembered.
_ST_DTYPES = {
    "BOOL": "|b1",
    "U8": "|u1",
    "I8": "|i1",
    "U16": "<u2",
    "I16": "<i2",
    "F16": "<f2",
    "U32": "<u4",
    "I32": "<i4",
    "F32": "<f4",
    "F64": "<f8",
    "U64": "<u8",
    "I64": "<i8",
}
_ST_RAW = {"BF16": "<u2", "F8_E4M3": "|u1", "F8_E5M2": "|u1", "F8_E8M0": "|u1"}
_ST_SUBBYTE = frozenset({"F4", "F6_E2M3", "F6_E3M2"})
_ST_META_KEY = "__metadata__"
_ST_TAGS_FIELD = "safetensors_dtypes"
_ST_MARKER = "lazyvault"

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


# -- detection ----------------------------------------------------------------


def detect_format(path: str | os.PathLike[str]) -> str:
    """``"npy"``, ``"npz"``, ``"safetensors"`` or ``"lvz"``, from the content.

    A zip is ``"lvz"`` when it holds lazyvault's archive manifest
    (``_archive.is_archive``), else ``"npz"``. Raises
    :class:`UnknownFormatError` for anything else.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(9)
    if head.startswith(_NPY_MAGIC):
        return "npy"
    if head[:4] in _ZIP_MAGICS:
        return "lvz" if _looks_like_lvz(path) else "npz"
    if len(head) == 9 and head[8:9] == b"{":
        (n,) = struct.unpack("<Q", head[:8])
        if n <= size - 8:
            return "safetensors"
        raise InvalidFileError(
            f"{path}: starts like a safetensors file but its header length {n} "
            f"exceeds the file ({size} bytes): truncated or not safetensors"
        )
    raise UnknownFormatError(
        f"{path}: not a .npy, .npz, .safetensors or .lvz file (starts with {head[:8]!r})"
    )


def _looks_like_lvz(path: str) -> bool:
    try:
        from . import _archive
    except ImportError:  # a build without archives: judge by the name
        return path.lower().endswith(".lvz")
    return _archive.is_archive(path)


# -- import -----------------------------------------------------------------


#: The files importing a directory picks up (by name; the format of each
#: is then read from its content).
IMPORT_SUFFIXES = (".npy", ".npz", ".safetensors", ".lvz")


def import_file(
    store: Store,
    path: str | os.PathLike[str],
    key: str | None = None,
    progress: ProgressArg = None,
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
    directory, records for one file.

    Raises :class:`UnknownFormatError`, :class:`InvalidFileError` (the store
    is unchanged), :class:`PickleNotAllowedError` for object arrays when the
    store was opened without ``allow_pickle``. Records are validated whole
    before each is written; a multi-record file (``.lvz``, our ``.npz``) or
    a directory that fails on a later record keeps the records written
    before it.
    """
    path = os.fspath(path)
    if key is not None and not isinstance(key, str):
        raise KeyTypeError(f"keys are str, not {type(key).__name__}")
    if os.path.isdir(path):
        if key is not None:
            raise InteropError(
                f"{path} is a directory: its files are keyed by their paths, key= names "
                "the record of a single file"
            )
        return _import_directory(store, path, progress)
    fmt = _format_of(path)
    with progress_callback(progress, "import", "record") as report:
        return _import_one(store, path, fmt, key, Path(path).stem, report)


def _format_of(path: str) -> str:
    try:
        return detect_format(path)
    except LazyvaultError:
        raise
    except OSError as e:  # missing file, no permission
        raise StorageError(e.errno or 0, e.strerror or str(e), path) from None


def _import_one(
    store: Store, path: str, fmt: str, key: str | None, default_key: str, report: Report | None
) -> list[str]:
    """Imports one file of format ``fmt``; ``default_key`` names a
    single-record file when ``key`` is None."""
    target = key if key is not None else default_key
    if fmt == "npy":
        store[target] = {"data": _read_npy(path, store.allow_pickle)}
    elif fmt == "safetensors":
        store[target] = _read_safetensors(path)
    elif fmt == "npz":
        return _import_npz(store, path, key, default_key, report)
    else:
        return _import_lvz(store, path, key, report)
    if report is not None:
        report(1, 1)
    return [target]


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


def _has_npz_manifest(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            return NPZ_MANIFEST in zf.namelist()
    except zipfile.BadZipFile as e:
        raise InvalidFileError(f"{path}: not a readable zip: {e}") from e


def _import_directory(store: Store, root: str, progress: ProgressArg) -> list[str]:
    files: list[tuple[str, str, str]] = []  # (path, format, default key)
    keys: dict[str, str] = {}
    for file in _importable_files(root):
        rel = file.relative_to(root)
        fmt = _format_of(os.fspath(file))
        default_key = rel.with_suffix("").as_posix()
        # .lvz files and our .npz carry their own keys
        if fmt in ("npy", "safetensors") or (fmt == "npz" and not _has_npz_manifest(file)):
            if default_key in keys:
                raise InteropError(
                    f"{keys[default_key]} and {rel} would both be imported as {default_key!r}"
                )
            keys[default_key] = os.fspath(rel)
        files.append((os.fspath(file), fmt, default_key))
    written: list[str] = []
    with progress_callback(progress, "import", "file") as report:
        if report is not None:
            report(0, len(files))
        for done, (file, fmt, default_key) in enumerate(files, 1):
            written.extend(_import_one(store, file, fmt, None, default_key, None))
            if report is not None:
                report(done, len(files))
    return written


# .npy headers (NEP 1) ----------------------------------------------------------


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


def _drop_long_suffix(text: str) -> str:
    # Python 2 wrote shapes as (2L, 3L): drop an L that follows a number
    # token (tokenising keeps it out of quoted field names).
    out: list[tuple[int, str]] = []
    after_number = False
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if after_number and tok.type == tokenize.NAME and tok.string == "L":
            after_number = False
            continue
        out.append((tok.type, tok.string))
        after_number = tok.type == tokenize.NUMBER
    return tokenize.untokenize(out)


def read_npy_header(fp: IO[bytes], what: str) -> NpyHeader:
    """Reads and checks the header of the ``.npy`` stream ``fp`` (positioned
    at its magic). Raises :class:`InvalidFileError`."""
    magic = fp.read(8)
    if len(magic) < 8 or not magic.startswith(_NPY_MAGIC):
        raise InvalidFileError(f"{what}: not a .npy (magic {magic[:6]!r})")
    version = (magic[6], magic[7])
    if version[0] == 1:
        size_bytes = fp.read(2)
        fmt = "<H"
    elif version[0] in (2, 3):
        size_bytes = fp.read(4)
        fmt = "<I"
    else:
        raise InvalidFileError(f"{what}: unknown .npy format version {version[0]}.{version[1]}")
    if len(size_bytes) != struct.calcsize(fmt):
        raise InvalidFileError(f"{what}: truncated .npy header")
    (hlen,) = struct.unpack(fmt, size_bytes)
    if hlen > NPY_MAX_HEADER:
        raise InvalidFileError(f"{what}: .npy header of {hlen} bytes exceeds {NPY_MAX_HEADER}")
    raw = fp.read(hlen)
    if len(raw) != hlen:
        raise InvalidFileError(f"{what}: truncated .npy header ({len(raw)} of {hlen} bytes)")
    try:
        text = raw.decode("utf-8" if version[0] == 3 else "latin-1")
        try:
            d = ast.literal_eval(text)
        except SyntaxError:
            if version[0] == 3:
                raise
            d = ast.literal_eval(_drop_long_suffix(text))
    except (SyntaxError, ValueError, UnicodeDecodeError, MemoryError, RecursionError) as e:
        raise InvalidFileError(f"{what}: unreadable .npy header: {e}") from None
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        raise InvalidFileError(f"{what}: .npy header is not the NEP 1 dict: {text[:200]!r}")
    shape, fortran = d["shape"], d["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise InvalidFileError(f"{what}: bad shape {shape!r} in .npy header")
    if type(fortran) is not bool:
        raise InvalidFileError(f"{what}: bad fortran_order {fortran!r} in .npy header")
    try:
        dtype = np.lib.format.descr_to_dtype(d["descr"])
    except (TypeError, ValueError) as e:
        raise InvalidFileError(f"{what}: bad descr {d['descr']!r} in .npy header: {e}") from None
    length = 8 + struct.calcsize(fmt) + hlen
    return NpyHeader(version, shape, fortran, dtype, length)


def _empty(header: NpyHeader) -> np.ndarray:
    # zeros, not empty: a zero-itemsize dtype (S0) gets itemsize 1 from numpy
    # and np.empty would hand back uninitialised memory
    return np.zeros(header.shape, dtype=header.dtype, order=header.order)


def _map(path: str, header: NpyHeader, offset: int) -> np.ndarray:
    """The array whose data start at ``offset`` in ``path``, mapped read-only
    (nothing read now). Zero bytes: an empty array (POSIX cannot map 0)."""
    if header.nbytes == 0:
        return _empty(header)
    mapped = np.memmap(
        path, dtype=header.dtype, mode="r", offset=offset, shape=header.shape, order=header.order
    )
    return np.asarray(mapped)  # a plain ndarray viewing the map


def _refuse_pickle(what: str) -> PickleNotAllowedError:
    return PickleNotAllowedError(
        f"{what} is an object array stored as a pickle; loading it can run arbitrary code: "
        "open the store with allow_pickle=True if you trust the file"
    )


def _read_npy(path: str, allow_pickle: bool) -> np.ndarray:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header = read_npy_header(f, path)
    if header.dtype.hasobject:
        if not allow_pickle:
            raise _refuse_pickle(path)
        try:
            return np.load(path, allow_pickle=True, encoding=_PICKLE_ENCODING)
        except Exception as e:  # a pickle can fail in any way
            raise InvalidFileError(f"{path}: unreadable object array: {e}") from e
    if size < header.length + header.nbytes:
        raise InvalidFileError(
            f"{path}: truncated .npy: header promises {header.nbytes} data bytes, "
            f"file has {size - header.length}"
        )
    return _map(path, header, header.length)


# .npz ---------------------------------------------------------------------------


@dataclass
class _Member:
    info: zipfile.ZipInfo
    header: NpyHeader
    data_start: int  # of the member's bytes in the zip (stored members)


def _local_data_start(f: IO[bytes], info: zipfile.ZipInfo, size: int, what: str) -> int:
    f.seek(info.header_offset)
    local = f.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise InvalidFileError(f"{what}: bad local header for member {info.filename!r}")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    if start + info.compress_size > size:
        raise InvalidFileError(f"{what}: member {info.filename!r} runs past the end of the file")
    return start


def _npz_members(zf: zipfile.ZipFile, f: IO[bytes], size: int, path: str) -> dict[str, _Member]:
    """Every ``.npy`` member checked (headers, declared sizes, ratio) before
    any data is read."""
    members: dict[str, _Member] = {}
    for info in zf.infolist():
        name = info.filename
        what = f"{path} member {name!r}"
        if name in members:
            raise InvalidFileError(f"{path}: duplicate member {name!r}")
        if name.endswith("/") or name == NPZ_MANIFEST:
            continue
        if info.flag_bits & 0x1:
            raise InvalidFileError(f"{what}: encrypted members are not supported")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise InvalidFileError(
                f"{what}: compression method {info.compress_type} is not supported "
                "(np.savez writes stored or deflated members)"
            )
        start = _local_data_start(f, info, size, path)
        if info.compress_type == zipfile.ZIP_STORED:
            if info.compress_size != info.file_size:
                raise InvalidFileError(f"{what}: stored member with two different sizes")
            f.seek(start)
            header = read_npy_header(_Bounded(f, info.file_size), what)
        else:
            if info.file_size > DEFLATE_MAX_RATIO * max(info.compress_size, 1):
                raise InvalidFileError(
                    f"{what}: declares {info.file_size} bytes from {info.compress_size} "
                    "compressed, more than deflate can expand (decompression bomb?)"
                )
            with zf.open(info) as stream:
                header = read_npy_header(stream, what)  # type: ignore[arg-type]
        if not header.dtype.hasobject and info.file_size != header.length + header.nbytes:
            raise InvalidFileError(
                f"{what}: the zip declares {info.file_size} bytes but its .npy header "
                f"implies {header.length + header.nbytes} (shape {header.shape}, "
                f"{header.dtype}): refusing to read it (decompression bomb or corrupt file)"
            )
        members[name] = _Member(info, header, start)
    return members


class _Bounded(io.RawIOBase):
    """Reads at most ``limit`` bytes of ``f`` from its current position."""

    def __init__(self, f: IO[bytes], limit: int) -> None:
        self._f, self._left = f, limit

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")[: self._left]
        n = self._f.readinto(view)  # type: ignore[attr-defined]
        self._left -= n or 0
        return n or 0


def _read_member(zf: zipfile.ZipFile, path: str, member: _Member, allow_pickle: bool) -> np.ndarray:
    info, header = member.info, member.header
    what = f"{path} member {info.filename!r}"
    if header.dtype.hasobject:
        if not allow_pickle:
            raise _refuse_pickle(what)
        try:
            with zf.open(info) as stream:
                return np.lib.format.read_array(
                    stream, allow_pickle=True, pickle_kwargs={"encoding": _PICKLE_ENCODING}
                )
        except Exception as e:
            raise InvalidFileError(f"{what}: unreadable object array: {e}") from e
    if info.compress_type == zipfile.ZIP_STORED:
        array = _map(path, header, member.data_start + header.length)
        _check_crc(path, member, array)
        return array
    # Deflated: one buffer of the size the header implies (checked equal to
    # the zip's declared size), filled by streaming; zipfile stops at the
    # declared size and checks the CRC at the end.
    out = np.empty(header.nbytes, dtype=np.uint8)
    view = memoryview(out)
    try:
        with zf.open(info) as stream:
            stream.read(header.length)
            filled = 0
            while filled < header.nbytes:
                n = stream.readinto(view[filled : filled + _CHUNK])  # type: ignore[attr-defined]
                if not n:
                    raise InvalidFileError(
                        f"{what}: truncated ({filled} of {header.nbytes} data bytes)"
                    )
                filled += n
            stream.read(1)  # reach the end: zipfile checks the CRC there
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise InvalidFileError(f"{what}: {e}") from e
    flat = out.view(header.dtype) if header.nbytes else np.empty(0, header.dtype)
    return flat.reshape(header.shape, order=header.order)


def _check_crc(path: str, member: _Member, array: np.ndarray) -> None:
    # The mapped data are read anyway when the store copies them; the CRC
    # catches a damaged member before anything is written.
    header, info = member.header, member.info
    with open(path, "rb") as f:
        f.seek(member.data_start)
        crc = zlib.crc32(f.read(header.length))  # the .npy header is part of the member
    if header.nbytes:
        data = _bytes_view(array)
        for i in range(0, len(data), _CHUNK):
            crc = zlib.crc32(data[i : i + _CHUNK], crc)
    if crc != info.CRC:
        raise InvalidFileError(f"{path} member {info.filename!r}: CRC mismatch (damaged member)")


def _bytes_view(array: np.ndarray) -> memoryview:
    if array.flags.f_contiguous and not array.flags.c_contiguous:
        array = array.T
    return memoryview(array.reshape(-1).view(np.uint8))


def _import_npz(
    store: Store, path: str, key: str | None, default_key: str, report: Report | None
) -> list[str]:
    try:
        with open(path, "rb") as f, open(path, "rb") as zfile, zipfile.ZipFile(zfile) as zf:
            size = os.fstat(f.fileno()).st_size
            members = _npz_members(zf, f, size, path)
            manifest = _read_npz_manifest(zf, path, members)
            arrays = {
                name: _read_member(zf, path, m, store.allow_pickle) for name, m in members.items()
            }
    except zipfile.BadZipFile as e:
        raise InvalidFileError(f"{path}: not a readable zip: {e}") from e
    if manifest is None:
        target = key if key is not None else default_key
        obj: dict[str, np.ndarray] = {}
        for name, a in arrays.items():
            short = name.removesuffix(".npy")  # as np.load names them
            if short in obj:
                raise InvalidFileError(f"{path}: members {short!r} and {name!r} collide")
            obj[short] = a
        store[target] = obj
        return [target]
    if key is not None:
        if len(manifest) != 1:
            raise InteropError(
                f"{path} holds {len(manifest)} records; key= renames a single record only"
            )
        manifest = [dict(manifest[0], key=key)]
    written = []
    for rec in manifest:
        rec_arrays = {p: arrays[m] for p, m in rec["arrays"].items()}
        _put(store, rec["key"], rec["meta"], rec.get("layout"), rec_arrays, None)
        written.append(rec["key"])
        if report is not None:
            report(len(written), len(manifest))
    return written


def _read_npz_manifest(
    zf: zipfile.ZipFile, path: str, members: dict[str, _Member]
) -> list[dict[str, Any]] | None:
    """The records of an npz lazyvault wrote, checked; ``None`` for a
    foreign npz."""
    if NPZ_MANIFEST not in zf.NameToInfo:
        return None
    info = zf.getinfo(NPZ_MANIFEST)
    what = f"{path} member {NPZ_MANIFEST!r}"
    if info.file_size > min(DEFLATE_MAX_RATIO * max(info.compress_size, 1), 1 << 30):
        raise InvalidFileError(f"{what}: implausibly large ({info.file_size} bytes)")
    try:
        doc = _strict_json(zf.read(info).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, zipfile.BadZipFile) as e:
        raise InvalidFileError(f"{what}: not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != NPZ_FORMAT:
        raise InvalidFileError(f"{what}: not a {NPZ_FORMAT} manifest")
    if doc.get("version") != 1:
        raise InvalidFileError(f"{what}: unknown version {doc.get('version')!r}")
    records = doc.get("records")
    if not isinstance(records, list):
        raise InvalidFileError(f"{what}: 'records' is not a list")
    used: set[str] = set()
    keys: set[str] = set()
    for rec in records:
        if not isinstance(rec, dict):
            raise InvalidFileError(f"{what}: a record is not an object")
        k, meta, arrays = rec.get("key"), rec.get("meta"), rec.get("arrays")
        if not isinstance(k, str) or not k or k in keys:
            raise InvalidFileError(f"{what}: bad or duplicate key {k!r}")
        keys.add(k)
        if not isinstance(meta, dict) or not _json_values_ok(meta):
            raise InvalidFileError(f"{what}: record {k!r}: bad metadata")
        if not isinstance(arrays, dict) or not all(
            isinstance(p, str) and isinstance(m, str) and m in members for p, m in arrays.items()
        ):
            raise InvalidFileError(f"{what}: record {k!r}: arrays name missing members")
        used.update(arrays.values())
        if "layout" in rec and not _layout_ok(rec["layout"], set(arrays)):
            raise InvalidFileError(f"{what}: record {k!r}: bad layout")
    unlisted = set(members) - used
    if unlisted:
        raise InvalidFileError(f"{what}: members not listed in it: {sorted(unlisted)[:5]}")
    return records


# .safetensors -----------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        names = [k for k, _ in pairs]
        dup = next(k for k in names if names.count(k) > 1)
        raise ValueError(f"duplicate key {dup!r}")
    return d


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _strict_json(text: str) -> Any:
    """JSON without NaN/Infinity and without duplicate keys."""
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)


@dataclass(frozen=True)
class _Tensor:
    name: str
    tag: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def read_safetensors_header(path: str) -> tuple[dict[str, str] | None, list[_Tensor], int]:
    """``(__metadata__ or None, tensors, data section offset)`` of a
    safetensors file, every entry checked; reads the header only."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise InvalidFileError(f"{path}: too short for a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise InvalidFileError(
                f"{path}: safetensors header length {n} exceeds the file ({size} bytes)"
            )
        if n > SAFETENSORS_MAX_HEADER:
            raise InvalidFileError(
                f"{path}: safetensors header length {n} exceeds {SAFETENSORS_MAX_HEADER}"
            )
        raw = f.read(n)
    if not raw.startswith(b"{"):
        raise InvalidFileError(f"{path}: safetensors header does not start with '{{'")
    try:
        header = _strict_json(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidFileError(f"{path}: safetensors header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise InvalidFileError(f"{path}: safetensors header is not a JSON object")
    data_start = 8 + n
    data_len = size - data_start
    metadata = header.pop(_ST_META_KEY, None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise InvalidFileError(f"{path}: __metadata__ must map strings to strings")
    tensors = [_check_tensor(path, name, entry, data_len) for name, entry in header.items()]
    prev: _Tensor | None = None
    for t in sorted((t for t in tensors if t.end > t.begin), key=lambda t: t.begin):
        if prev is not None and t.begin < prev.end:
            raise InvalidFileError(
                f"{path}: tensors {prev.name!r} and {t.name!r} overlap "
                f"({prev.begin}-{prev.end} and {t.begin}-{t.end})"
            )
        prev = t
    return metadata, tensors, data_start


def _check_tensor(path: str, name: str, entry: Any, data_len: int) -> _Tensor:
    what = f"{path} tensor {name!r}"
    if not isinstance(entry, dict):
        raise InvalidFileError(f"{what}: entry is not an object")
    tag, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(tag, str):
        raise InvalidFileError(f"{what}: missing dtype")
    if tag in _ST_SUBBYTE:
        raise InvalidFileError(f"{what}: sub-byte dtype {tag} is not supported by lazyvault")
    descr = _ST_DTYPES.get(tag) or _ST_RAW.get(tag)
    if descr is None:
        raise InvalidFileError(f"{what}: unknown dtype {tag!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidFileError(f"{what}: bad shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
    ):
        raise InvalidFileError(f"{what}: bad data_offsets {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        raise InvalidFileError(
            f"{what}: data_offsets {offsets} outside the data section (0-{data_len})"
        )
    dtype = np.dtype(descr)
    want = math.prod(shape) * dtype.itemsize
    if end - begin != want:
        raise InvalidFileError(
            f"{what}: data_offsets span {end - begin} bytes, shape {shape} of {tag} needs {want}"
        )
    return _Tensor(name, tag, dtype, tuple(shape), begin, end)


def _decode_metadata(metadata: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(top-level fields, __metadata__)`` from a file's ``__metadata__``:
    values we JSON-encoded are decoded, fields we lifted go back to the top."""
    md = dict(metadata)
    marker = _parse_marker(md.get(_ST_MARKER))
    if marker is None:
        return {}, md
    del md[_ST_MARKER]
    encoded, fields = set(marker["json"]), set(marker["fields"])
    top: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for k, v in md.items():
        value = v
        if k in encoded:
            try:
                value = _strict_json(v)
            except ValueError:
                value = v  # not ours after all: keep the text
        (top if k in fields else rest)[k] = value
    return top, rest


def _parse_marker(text: str | None) -> dict[str, list[str]] | None:
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if (
        isinstance(doc, dict)
        and doc.get("version") == 1
        and all(
            isinstance(doc.get(k), list) and all(isinstance(s, str) for s in doc[k])
            for k in ("json", "fields")
        )
    ):
        return doc
    return None


def _read_safetensors(path: str) -> dict[str, Any]:
    metadata, tensors, data_start = read_safetensors_header(path)
    obj: dict[str, Any] = {}
    if metadata is not None:
        top, rest = _decode_metadata(metadata)
        obj.update(top)
        if rest or _ST_MARKER not in metadata:
            obj[_ST_META_KEY] = rest
    tags = {t.name: t.tag for t in tensors if t.tag in _ST_RAW}
    if tags:
        obj[_ST_TAGS_FIELD] = tags
    data_len = os.path.getsize(path) - data_start
    section = (
        np.asarray(np.memmap(path, dtype=np.uint8, mode="r", offset=data_start, shape=data_len))
        if data_len > 0 and tensors
        else np.empty(0, np.uint8)
    )
    for t in tensors:
        if t.name in obj:
            raise InvalidFileError(f"{path}: tensor {t.name!r} collides with a metadata field")
        if t.end == t.begin:
            obj[t.name] = np.empty(t.shape, dtype=t.dtype)
        else:
            obj[t.name] = section[t.begin : t.end].view(t.dtype).reshape(t.shape)
    return obj


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


def _put(
    store: Store,
    key: str,
    meta: dict[str, Any],
    layout: Any,
    arrays: dict[str, np.ndarray],
    pickled: bytes | None,
) -> None:
    """Writes a record from its parts; without a layout, the object is the
    flat dict ``{**meta, **arrays}``."""
    if layout is None:
        store[key] = {**meta, **arrays}
        return
    from .store import _check_key

    args = [_arrays.payload_args(name, a) for name, a in arrays.items()]
    store._core.put(
        _check_key(key),
        json.dumps(meta, ensure_ascii=False, allow_nan=False),
        json.dumps(layout, ensure_ascii=False, allow_nan=False),
        args,
        pickled,
    )


def _json_values_ok(value: Any) -> bool:
    """Whether ``value`` is JSON the index holds (ints in range, no NaN)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                return False
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif type(v) is int:
            if not _INT_MIN <= v <= _INT_MAX:
                return False
        elif type(v) is float:
            if not math.isfinite(v):
                return False
        elif v is not None and type(v) not in (str, bool):
            return False
    return True


_LAYOUT_KINDS = frozenset({"dict", "list", "tuple", "array", "float", "scalar", "object"})


def _layout_ok(layout: Any, array_paths: set[str]) -> bool:
    """Whether ``layout`` is a tree of known nodes (schema/FORMAT.md,
    "Layout") naming only ``array_paths`` and no pickled remainder (npz
    carries none). ``object`` nodes are allowed: loading them is gated by
    ``allow_pickle`` as for any record."""
    stack = [layout]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            return False
        if not isinstance(node, dict):
            if type(node) is float and not math.isfinite(node):
                return False
            continue
        if len(node) != 1:
            return False
        ((kind, body),) = node.items()
        if kind not in _LAYOUT_KINDS:
            return False
        if kind == "dict":
            if not isinstance(body, dict):
                return False
            stack.extend(body.values())
        elif kind in ("list", "tuple"):
            if not isinstance(body, list):
                return False
            stack.extend(body)
        elif kind == "array":
            if body not in array_paths:
                return False
        elif kind == "float":
            if body not in ("nan", "inf", "-inf"):
                return False
        elif kind == "scalar":
            if not (isinstance(body, list) and len(body) == 2 and isinstance(body[0], str)):
                return False
        elif kind == "object":
            if not (
                isinstance(body, dict)
                and isinstance(body.get("class"), str)
                and isinstance(body.get("state"), dict)
            ):
                return False
            stack.extend(body["state"].values())
    return True
