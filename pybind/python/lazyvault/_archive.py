"""``.lvz`` archives (schema/FORMAT.md, "Archives (.lvz)"; ``Store.export`` says what one holds):
a store's records in one zip file, and one object in memory (``lazyvault.dumps`` / ``loads``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import _layout, _lazyvault
from ._display import RecordsDisplay
from ._source import UNTRUSTED, Trust, array_entry, corrupt_array, load_array, trust_of
from .errors import (
    ClosedError,
    CorruptError,
    LazyvaultError,
    MissingKeyError,
    NotAStoreError,
    ReadOnlyError,
)
from .record import Record, from_json
from .store import Handle, Store, check_key, plug_file_opener, raw_record

#: The first bytes of every ``.lvz`` file (a zip local file header).
ZIP_MAGIC = b"PK\x03\x04"

#: The key of the one record of a :func:`dumps` archive.
DUMPS_KEY = "obj"


def is_archive_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an existing regular file that starts like a zip (whatever its extension):
    what ``Store.open`` opens as an archive."""
    try:
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as f:
            return f.read(4) == ZIP_MAGIC
    except OSError:
        return False


def is_archive(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a zip holding a lazyvault archive manifest (an
    ``.lvz`` archive rather than, say, an ``.npz``). Reads only the zip's
    central directory (the core's ``detect_format``)."""
    if not is_archive_file(path):
        return False
    try:
        return _lazyvault.detect_format(path) == "lvz"
    except (LazyvaultError, OSError):
        return False


class ArchiveSource:
    """The :class:`~lazyvault._source.Source` of records read from an archive: each array is a
    read-only ndarray viewing the archive's bytes (its file mapping, or the buffer given to
    :func:`loads`), no copy."""

    def __init__(self, core: _lazyvault.ArchiveCore, trust: Trust) -> None:
        self.core = core
        self.trust = trust

    def get_pickle(self, key: str) -> bytes | None:
        return self.core.get_pickle(key)

    def read_array_bytes(self, key: str, name: str, entry: dict[str, Any]) -> bytes:
        """The raw data bytes of an array (for an ``object`` array: its pickle, not unpickled),
        checked against the record."""
        try:
            return self.core.read_array_bytes(array_entry(entry))
        except CorruptError as e:
            raise corrupt_array(e, key, name) from e

    def map_array(self, key: str, name: str, entry: dict[str, Any]) -> np.ndarray:
        core, allow = self.core, self.trust.allow_pickle
        return load_array(key, name, entry, allow, core.read_array_bytes, core.map_array)


class Archive(Handle):
    """A ``.lvz`` archive opened read-only: a ``Mapping`` from key to :class:`Record`, like a store
    opened with ``mode="r"`` but without a lock, so any number of processes may read it at once;
    its arrays are read-only views of the one mapping. Open with :func:`lazyvault.Store.open` (or
    read one from bytes with :func:`lazyvault.loads`). ``find``, ``count``, ``keys(expr)`` and
    ``to_pandas`` work as on a :class:`Store` (see there), but in archive order (the order the keys
    were exported in).
    """

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        """Raises :class:`ReadOnlyError`: archives are read-only."""
        raise ReadOnlyError("a .lvz archive is read-only: import it into a store to change it")

    __setitem__ = __delitem__ = update = replace_arrays = _read_only

    def __init__(
        self, core: _lazyvault.ArchiveCore, trust: Trust = UNTRUSTED, path: str | None = None
    ) -> None:
        if not isinstance(core, _lazyvault.ArchiveCore):
            raise TypeError(
                "an Archive is opened by lazyvault.Store.open(path) (a .lvz file) or read from "
                "bytes by lazyvault.loads(data), not made by calling Archive"
            )
        self._core: _lazyvault.ArchiveCore | None = core
        self._path = path if path is not None else core.path
        self._trust = trust
        self._source = ArchiveSource(core, trust)

    def _index(self) -> _lazyvault.ArchiveCore:
        if self._core is None:
            raise ClosedError("archive is closed")
        return self._core

    @property
    def path(self) -> str | None:
        """The archive file (``None`` for an archive read from a buffer)."""
        return self._path

    @property
    def mode(self) -> str:
        """Always ``"r"``: archives are read-only."""
        return "r"

    @property
    def closed(self) -> bool:
        return self._core is None

    @property
    def nbytes(self) -> int:
        """Size of the archive in bytes."""
        return self._index().nbytes

    def __getitem__(self, key: str) -> Record:
        key = check_key(key)
        raw = self._index().get(key)
        if raw is None:
            raise MissingKeyError(key)
        return from_json(self._source, key, raw)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._index().contains(key)

    def get_pickle(self, key: str) -> bytes | None:
        """The pickled remainder bytes of ``key`` (not unpickled), if any."""
        return self._index().get_pickle(key)

    def verify(self) -> dict[str, Any]:
        """Checks every array of every record against its member (``.npy`` header, size, 64-byte
        alignment) without building any array. Returns ``{"ok": bool, "records": int, "arrays": int,
        "problems": [str]}``."""
        return self._index().verify()

    def close(self) -> None:
        """Drops the archive. Idempotent. Arrays already returned stay valid: the mapping goes when
        the last of them does."""
        self._core = None

    def __reduce__(self) -> Any:
        if self._path is None:
            raise TypeError("an archive read from a buffer cannot be pickled; pickle its records")
        return (open_archive, (self._path, *self._trust))

    def _title(self) -> str:
        where = repr(self._path) if self._path is not None else "<buffer>"
        if self._core is None:
            return f"lazyvault.Archive {where} (closed)"
        n = len(self)
        return f"lazyvault.Archive {where}: {n:,} record{'s' * (n != 1)}"

    _repr_pretty_ = RecordsDisplay._repr_pretty_  # before __repr__ (see RecordsDisplay)

    def __repr__(self) -> str:
        where = repr(self._path) if self._path is not None else "<buffer>"
        if self._core is None:
            return f"<lazyvault.Archive {where} (closed)>"
        return f"<lazyvault.Archive {where} records={len(self)} nbytes={self.nbytes}>"


def open_archive(
    path: str | os.PathLike[str], allow_pickle: bool = False, safe_classes: Iterable[type] = ()
) -> Archive:
    """Opens the ``.lvz`` archive at ``path`` read-only (memory-mapped once; no lock);
    ``allow_pickle`` and ``safe_classes`` as in ``Store.open``. Raises :class:`CorruptError` for a
    file that is not a lazyvault archive or is damaged (truncated, compressed or encrypted array
    members, unsafe member names), :class:`FormatVersionError` for a newer major format version."""
    trust = trust_of(allow_pickle, safe_classes)
    path = os.fspath(path)
    return Archive(_lazyvault.ArchiveCore.open(path), trust, path)


def _zip_without_manifest(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a readable zip without the archive manifest (a damaged one is not): the
    core reads its central directory; ``npz_has_manifest`` raises for an unreadable zip)."""
    try:
        if _lazyvault.detect_format(path) != "npz":
            return False
        _lazyvault.npz_has_manifest(path)
    except (LazyvaultError, OSError):
        return False
    return True


def open_if_archive(path: str | os.PathLike[str], mode: str | None, trust: Trust) -> Archive | None:
    """What ``Store.open`` opens for a file that starts like a zip (whatever its extension): the
    archive, read-only, or :class:`ReadOnlyError` for a mode other than ``"r"``;
    :class:`NotAStoreError` for a zip without the archive manifest (an ``.npz``); ``None`` for
    anything else."""
    if not is_archive_file(path):
        return None
    if _zip_without_manifest(path):  # an .npz, say: not damaged, just no store
        error = NotAStoreError(
            f"{os.fspath(path)}: a zip file that is neither a lazyvault store nor a .lvz archive "
            "(no lazyvault/manifest.json member); import its arrays with store.import_file(path)"
        )
        error.path = os.fspath(path)
        raise error
    if mode not in (None, "r"):
        raise ReadOnlyError(
            f"{os.fspath(path)!r} is a .lvz archive, which is read-only: open it with "
            f"mode='r' (or no mode), not {mode!r}; to change its records, "
            "import it into a store (store.import_file(path))"
        )
    return open_archive(path, *trust)


plug_file_opener(open_if_archive)


def _resolve_keys(store: Store, keys: Iterable[str] | None, query: str | None) -> list[str]:
    if keys is not None and query is not None:
        raise ValueError("export takes keys or query, not both")
    if query is not None:
        return store.keys(query)
    if keys is None:
        return list(store)
    if isinstance(keys, str):
        raise TypeError("keys must be an iterable of str, not a str")
    return list(keys)


def export_lvz(
    store: Store,
    path: str | os.PathLike[str],
    keys: Iterable[str] | None = None,
    query: str | None = None,
) -> list[str]:
    """Writes the records ``keys`` (or those matching ``query``; all by default) of ``store`` to the
    archive ``path``; returns the keys written. Payloads are copied byte for byte, streamed, to a
    temporary file, which is fsynced, checked (every array aligned and matching its record) and
    renamed into place. Raises ``ValueError`` for both ``keys`` and ``query``, ``TypeError`` for
    ``keys`` given as one str, :class:`MissingKeyError` for a key without a record (``path`` left as
    it was)."""
    items = []
    for key in dict.fromkeys(check_key(k) for k in _resolve_keys(store, keys, query)):
        got = raw_record(store, key)
        if got is None:
            raise MissingKeyError(key)
        items.append((key, *got))
    _lazyvault.write_store_archive(os.fspath(path), store.path, items)
    return [item[0] for item in items]


def dumps(obj: Any) -> bytes:
    """``obj`` as a one-record ``.lvz`` archive in memory (like ``pickle.dumps``; read it back with
    :func:`loads`). Arrays are split out as ``.npy`` members exactly as ``Store.__setitem__`` does;
    equal inputs give equal bytes."""
    return _lazyvault.dumps_archive(DUMPS_KEY, *_layout.encode(obj))


def loads(buffer: Any, *, allow_pickle: bool = False, safe_classes: Iterable[type] = ()) -> Any:
    """The object stored by :func:`dumps` in ``buffer`` (``bytes``, ``bytearray``, ``memoryview``,
    ``mmap``, ``uint8`` array: anything with a contiguous buffer; never written to), its arrays
    read-only views into ``buffer`` (no copy) that keep it alive. ``safe_classes``: classes whose
    instances are rebuilt without ``allow_pickle``, from the listed class (matched by
    ``module:qualname``, never imported; see ``Store.open``). Raises
    :class:`PickleNotAllowedError` when rebuilding needs unpickling (instances of other classes, a
    pickled remainder) without ``allow_pickle=True``; ``TypeError`` for another buffer, a bad
    ``allow_pickle`` or a ``safe_classes`` item that is not a class, ``ValueError`` for a class
    whose instances are stored as pickles; :class:`LazyvaultError` for an archive of more than one
    record."""
    trust = trust_of(allow_pickle, safe_classes)
    try:
        core = _lazyvault.ArchiveCore.from_buffer(buffer)
    except (TypeError, BufferError) as e:
        raise TypeError(
            "loads() takes bytes, bytearray, memoryview, mmap or a uint8 array, "
            f"not {type(buffer).__name__}"
        ) from e
    keys = core.keys()
    if len(keys) != 1:
        raise LazyvaultError(
            f"loads() expects an archive of one object, this one holds {len(keys)} records; "
            "open a multi-record archive with lazyvault.Store.open"
        )
    return Archive(core, trust)[keys[0]].load()
