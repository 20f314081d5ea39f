"""``.lvz`` archives: a store's records in one zip file, and one object in
memory (``lazyvault.dumps`` / ``lazyvault.loads``).

An archive is a zip of uncompressed members (schema/FORMAT.md, "Archives
(.lvz)"): one standard ``.npy`` file per array, named by payload id
(``arrays/<id>.npy``) with its data 64-byte aligned in the file, plus
``lazyvault/records.jsonl`` (key, record, pickled remainder per line) and
``lazyvault/manifest.json``. ``np.load("x.lvz")`` reads it as an npz (the
arrays under ``arrays/<id>``); :class:`Archive` maps it once and hands out
read-only arrays that view the mapping, with no lock, so any number of
processes may read one archive at once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, KeysView, Mapping
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from . import _display, _frame, _layout, _lazyvault
from ._source import array_entry, corrupt_array, load_array
from .errors import (
    ClosedError,
    CorruptError,
    KeyTypeError,
    LazyvaultError,
    MissingKeyError,
    ReadOnlyError,
)
from .record import Record
from .store import Results, Store, check_key, plug_file_opener, raw_record

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "Archive",
    "ArchiveSource",
    "dumps",
    "export_lvz",
    "is_archive",
    "is_archive_file",
    "loads",
    "open_archive",
]

#: The first bytes of every ``.lvz`` file (a zip local file header).
ZIP_MAGIC = b"PK\x03\x04"

#: The key of the one record of a :func:`dumps` archive.
DUMPS_KEY = "obj"


def is_archive_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an existing regular file that starts like a zip
    (whatever its extension): what ``Store.open`` opens as an archive."""
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
    """The :class:`~lazyvault._source.Source` of records read from an
    archive: each array is a read-only ndarray viewing the archive's bytes
    (its file mapping, or the buffer given to :func:`loads`), no copy."""

    def __init__(self, core: _lazyvault.ArchiveCore, allow_pickle: bool) -> None:
        self.core = core
        self.allow_pickle = bool(allow_pickle)

    def get_pickle(self, key: str) -> bytes | None:
        return self.core.get_pickle(key)

    def read_array_bytes(self, key: str, name: str, entry: dict[str, Any]) -> bytes:
        """The raw data bytes of an array (for an ``object`` array: its
        pickle, not unpickled), checked against the record."""
        try:
            return self.core.read_array_bytes(array_entry(entry))
        except CorruptError as e:
            raise corrupt_array(e, key, name) from e

    def map_array(self, key: str, name: str, entry: dict[str, Any]) -> np.ndarray:
        return load_array(
            key, name, entry, self.allow_pickle, self.core.read_array_bytes, self.core.map_array
        )


class Archive(Mapping[str, Record]):
    """A ``.lvz`` archive opened read-only: a ``Mapping`` from key to
    :class:`Record`, like a store opened with ``mode="r"`` but without a
    lock. Open with :func:`lazyvault.Store.open` (or :func:`open_archive`).

    ``find``, ``count`` and ``keys(expr)`` take the same queries as
    :class:`Store` (evaluated in Rust over the records, no array touched).
    Keys iterate in archive order (the order they were exported in).
    ``close()`` drops the archive; arrays already handed out stay valid
    (they keep the mapping alive).
    """

    def __setitem__(self, key: str, value: Any) -> None:
        raise ReadOnlyError("a .lvz archive is read-only: import it into a store to change it")

    def __delitem__(self, key: str) -> None:
        raise ReadOnlyError("a .lvz archive is read-only: import it into a store to change it")

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Raises :class:`ReadOnlyError`: archives are read-only."""
        raise ReadOnlyError("a .lvz archive is read-only: import it into a store to change it")

    def replace_arrays(self, key: str, arrays: Any) -> None:
        """Raises :class:`ReadOnlyError`: archives are read-only."""
        raise ReadOnlyError("a .lvz archive is read-only: import it into a store to change it")

    def __init__(
        self,
        core: _lazyvault.ArchiveCore,
        allow_pickle: bool = False,
        path: str | None = None,
    ) -> None:
        self._core: _lazyvault.ArchiveCore | None = core
        self._path = path if path is not None else core.path
        self._allow_pickle = bool(allow_pickle)
        self._source = ArchiveSource(core, self._allow_pickle)

    # An archive is a handle, like a file: equal only to itself.
    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def _live(self) -> _lazyvault.ArchiveCore:
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
    def allow_pickle(self) -> bool:
        return self._allow_pickle

    @property
    def closed(self) -> bool:
        return self._core is None

    @property
    def nbytes(self) -> int:
        """Size of the archive in bytes."""
        return self._live().nbytes

    def __getitem__(self, key: str) -> Record:
        if not isinstance(key, str):
            raise KeyTypeError(f"keys are str, not {type(key).__name__}")
        raw = self._live().get(key)
        if raw is None:
            raise MissingKeyError(key)
        return Record(self._source, key, json.loads(raw))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._live().contains(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._live().keys())

    def __len__(self) -> int:
        return len(self._live())

    @overload
    def keys(self) -> KeysView[str]: ...
    @overload
    def keys(self, expr: str) -> list[str]: ...
    def keys(self, expr: str | None = None) -> KeysView[str] | list[str]:
        """All keys, or with ``expr`` the keys of the matching records."""
        if expr is None:
            return KeysView(self)
        return self._live().find(expr)

    def find(self, expr: str | Callable[[Record], bool]) -> Results:
        """Records whose metadata match ``expr`` (a query string, or a
        callable taking a :class:`Record`), in archive order."""
        core = self._live()
        if callable(expr):
            keys = [k for k in core.keys() if expr(self[k])]
        elif isinstance(expr, str):
            keys = core.find(expr)
        else:
            raise TypeError(f"find() takes a query string or a callable, not {type(expr).__name__}")
        return Results(self, keys)  # type: ignore[arg-type]

    def count(self, expr: str | None = None) -> int:
        """Number of records matching ``expr`` (all records without one)."""
        if expr is None:
            return len(self)
        return self._live().count(expr)

    def get_pickle(self, key: str) -> bytes | None:
        """The pickled remainder bytes of ``key`` (not unpickled), if any."""
        return self._live().get_pickle(key)

    def verify(self) -> dict[str, Any]:
        """Checks every array of every record against its member (``.npy``
        header, size, 64-byte alignment) without building any array.
        Returns ``{"ok": bool, "records": int, "arrays": int, "problems":
        [str]}``."""
        return self._live().verify()

    def close(self) -> None:
        """Drops the archive. Idempotent. Arrays already returned stay
        valid: the mapping goes when the last of them does."""
        self._core = None

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        if self._path is None:
            raise TypeError("an archive read from a buffer cannot be pickled; pickle its records")
        return (open_archive, (self._path, self._allow_pickle))

    # -- display and pandas (index only: no array is built) --------------------

    def to_pandas(self, expr: str | None = None) -> pd.DataFrame:
        """The records (or those matching ``expr``) as a pandas DataFrame,
        as :meth:`lazyvault.Store.to_pandas`."""
        keys = self._live().keys() if expr is None else self.keys(expr)
        return _frame.records_frame(self.__getitem__, keys)

    def _ipython_key_completions_(self) -> list[str]:
        return self._live().keys()

    def _title(self) -> str:
        where = repr(self._path) if self._path is not None else "<buffer>"
        if self._core is None:
            return f"lazyvault.Archive {where} (closed)"
        n = len(self)
        return f"lazyvault.Archive {where}: {n:,} record{'s' * (n != 1)}"

    def _keys_for_display(self) -> list[str]:
        return [] if self._core is None else self._core.keys()

    def __str__(self) -> str:
        """Several lines: a table of the first 20 records."""
        return _display.records_text(self._title(), self.__getitem__, self._keys_for_display())

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        _display.pretty(str(self), p, cycle)

    def _repr_html_(self) -> str:
        return _display.records_html(self._title(), self.__getitem__, self._keys_for_display())

    def __repr__(self) -> str:
        where = repr(self._path) if self._path is not None else "<buffer>"
        if self._core is None:
            return f"<lazyvault.Archive {where} (closed)>"
        return f"<lazyvault.Archive {where} records={len(self)} nbytes={self.nbytes}>"


def open_archive(path: str | os.PathLike[str], allow_pickle: bool = False) -> Archive:
    """Opens the ``.lvz`` archive at ``path`` read-only (memory-mapped once;
    no lock). Raises :class:`CorruptError` for a file that is not a
    lazyvault archive or is damaged (truncated, compressed or encrypted
    array members, unsafe member names), :class:`FormatVersionError` for a
    newer major format version."""
    path = os.fspath(path)
    return Archive(_lazyvault.ArchiveCore.open(path), allow_pickle, path)


def open_if_archive(
    path: str | os.PathLike[str], mode: str | None, allow_pickle: bool
) -> Archive | None:
    """What ``Store.open`` opens for a file that starts like a zip (whatever
    its extension): the archive, read-only, or :class:`ReadOnlyError` for a
    mode other than ``"r"``; ``None`` for anything else."""
    if not is_archive_file(path):
        return None
    if mode not in (None, "r"):
        raise ReadOnlyError(
            f"{os.fspath(path)!r} is a .lvz archive, which is read-only: open it with "
            f"mode='r' (or no mode), not {mode!r}; to change its records, "
            "import it into a store (store.import_file(path))"
        )
    return open_archive(path, allow_pickle=allow_pickle)


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
    """Writes the records ``keys`` (or those matching ``query``; all by
    default) of ``store`` to the archive ``path``; returns the keys written.

    Payload files are copied byte for byte, streamed; the archive is written
    to a temporary file, fsynced, checked (every array 64-byte aligned and
    matching its record) and renamed into place. A key without a record
    raises :class:`MissingKeyError` and leaves ``path`` untouched.
    """
    selected = [check_key(k) for k in _resolve_keys(store, keys, query)]
    items = []
    seen = set()
    for key in selected:
        if key in seen:
            continue
        seen.add(key)
        got = raw_record(store, key)
        if got is None:
            raise MissingKeyError(key)
        items.append((key, *got))
    _lazyvault.write_store_archive(os.fspath(path), store.path, items)
    return [item[0] for item in items]


def dumps(obj: Any) -> bytes:
    """``obj`` as a one-record ``.lvz`` archive in memory (like
    ``pickle.dumps``; read it back with :func:`loads`). Arrays are split out
    as ``.npy`` members exactly as ``Store.__setitem__`` does; equal inputs
    give equal bytes."""
    return _lazyvault.dumps_archive(DUMPS_KEY, *_layout.encode(obj))


def loads(buffer: Any, *, allow_pickle: bool = False) -> Any:
    """The object stored by :func:`dumps` in ``buffer`` (``bytes``,
    ``bytearray``, ``memoryview``, ``mmap``, ``uint8`` array: anything with
    a contiguous buffer; never written to).

    Arrays come back as read-only views into ``buffer`` (no copy) that keep
    it alive. Rebuilding class instances or a pickled remainder needs
    ``allow_pickle=True`` (as ``np.load``), otherwise
    :class:`PickleNotAllowedError`.
    """
    if type(allow_pickle) is not bool:
        raise TypeError(f"allow_pickle must be True or False, not {allow_pickle!r}")
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
    archive = Archive(core, allow_pickle)
    return archive[keys[0]].load()
