"""``Store``: a ``MutableMapping`` from string keys to stored objects, and ``Results``, the records
a query matched."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import math
import numbers
import os
import pickle
import sys
import weakref
from collections.abc import (
    Callable,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    MutableMapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Literal, Self, cast, overload

import numpy as np

from . import _arrays, _arrow, _dask, _frame, _layout, _lazyvault, _tagged
from ._dataset import Dataset, dataset_of
from ._display import RecordsDisplay
from ._progress import ProgressArg, progress_callback
from ._source import UNTRUSTED, DirectorySource, Trust, text_path, trust_of
from .errors import (
    ClosedError,
    InvalidArrayError,
    InvalidKeyError,
    KeyTypeError,
    LazyvaultError,
    MissingKeyError,
    NotAStoreError,
    QueryError,
    StoreNotFoundError,
)
from .record import Record, entry_of, from_store

if TYPE_CHECKING:
    import dask.array as da
    import dask.bag as db
    import dask.dataframe as dd
    import pandas as pd
    import polars as pl
    import pyarrow as pa

_open_stores: weakref.WeakSet[Store] = weakref.WeakSet()


@atexit.register
def _close_open_stores() -> None:
    # sled flushes on its own only every 500 ms: close what is still open so
    # that a script that forgot close() loses nothing at interpreter exit.
    for store in list(_open_stores):
        with contextlib.suppress(Exception):
            store.close()


# update() writes records in chunks of at most this many records or array
# bytes: each chunk costs one durability barrier (two or three fsyncs, about
# 1.5 ms each on a VM disk: at 1,000 records a chunk they were a sixth of
# writing small records) and one index batch, and holds its objects' arrays
# (views, no copies) until it is written.
_UPDATE_CHUNK_RECORDS = 10_000
_UPDATE_CHUNK_BYTES = 256 << 20


def check_key(key: object) -> str:
    """``key`` as a ``str`` the store takes, or :class:`KeyTypeError` / :class:`InvalidKeyError`."""
    if type(key) is not str:
        if not isinstance(key, str):
            raise KeyTypeError(f"keys are str, not {type(key).__name__}")
        key = str(key)
    if not _layout.text_ok(key):  # lone surrogates: not Unicode scalar values
        raise InvalidKeyError(f"key {key!r} is not valid Unicode text: surrogates not allowed")
    return key


class _DeferredCore:
    """Stands in for the core of a Store until its first use, then opens it and replaces itself."""

    def __init__(self, store: Store, path: str, mode: str, version: int | None) -> None:
        self._store, self.root, self._mode, self._version = store, path, mode, version

    def _open(self) -> _lazyvault.StoreCore:
        core = _lazyvault.StoreCore(self.root, self._mode, self._version)
        self._store._core = core
        return core

    def __getattr__(self, name: str) -> Any:
        return getattr(self._open(), name)

    def __len__(self) -> int:
        return len(self._open())


def _retention_seconds(retention: object) -> float | None:
    """``retention`` as seconds (None: the file system's default), or TypeError / ValueError."""
    if retention is None:
        return None
    if isinstance(retention, bool) or not isinstance(retention, numbers.Real):
        raise TypeError(f"retention is a number of seconds, not {retention!r}")
    seconds = float(retention)
    if not (math.isfinite(seconds) and 0 <= seconds <= 1e15):
        raise ValueError(
            f"retention must be a finite number of seconds from 0 to 1e15, not {seconds:.6g}"
        )
    return seconds


def _query_text(expr: object) -> str:
    """The query as text the core can take, or QueryError / TypeError."""
    if not isinstance(expr, str):
        raise TypeError(f"a query is a str, not {type(expr).__name__}")
    if not _layout.text_ok(expr):
        column = next(i for i, c in enumerate(expr, 1) if not _layout.text_ok(c))
        err = QueryError(f"query text is not valid Unicode at column {column}")
        err.column, err.expression, err.reason = column, expr, "not valid Unicode"
        raise err
    return expr


def _keys_arg(expr: object, keys: object) -> Sequence[str]:
    """``keys`` (given with no query) as a list of checked keys, or as it is when it is a
    ``KeyArray`` (the keys of a ``find``: valid keys, kept packed); ValueError / TypeError."""
    if expr is not None:
        raise ValueError("give a query or keys, not both")
    if isinstance(keys, _lazyvault.KeyArray):
        return keys
    if isinstance(keys, str) or not isinstance(keys, Iterable):
        raise TypeError(f"keys is a list of str, not {type(keys).__name__}")
    return [check_key(k) for k in keys]


def _no_report(done: int, total: int | None) -> None:
    pass


def _field(field: object) -> str:
    if not isinstance(field, str):
        raise TypeError(f"field must be a str, not {type(field).__name__}")
    return field


class Handle(RecordsDisplay, Mapping[str, Record]):
    """What a :class:`Store` and a ``.lvz`` :class:`~lazyvault.Archive` share: queries,
    ``to_pandas`` and displays, all from the index alone (no payload opened). A handle, like a file
    object, is equal only to itself (the ``Mapping`` default would compare every record, loading
    everything) and closes at the end of a ``with`` block."""

    # What Store and Archive define: the core answering keys(), find(text), count(text) and len(),
    # a display title, path, closed and close().
    _trust: Trust
    _index: Callable[[], Any]
    _title: Callable[[], str]
    close: Callable[[], None]

    @property
    def path(self) -> str | None:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def allow_pickle(self) -> bool:
        """Whether parts that need unpickling may be loaded."""
        return self._trust.allow_pickle

    @property
    def safe_classes(self) -> tuple[type, ...]:
        """The classes whose instances ``load()`` rebuilds without ``allow_pickle`` (see
        :meth:`Store.open`)."""
        return self._trust.safe_classes

    def __iter__(self) -> Iterator[str]:
        """The keys, a snapshot taken now: in Unicode code point order (an archive: in the order
        they were exported in)."""
        return iter(self._index().keys())

    def __len__(self) -> int:
        return len(self._index())

    @overload
    def keys(self) -> KeysView[str]: ...
    @overload
    def keys(self, expr: str) -> list[str]: ...
    def keys(self, expr: str | None = None) -> KeysView[str] | list[str]:
        """All keys, or with ``expr`` the keys of the matching records (a new list of ``str``; the
        :class:`Results` of :meth:`find` keep them packed instead)."""
        if expr is None:
            return KeysView(self)
        return self._index().find(_query_text(expr)).to_list()

    def find(self, expr: str | Callable[[Record], bool] | None = None) -> Results:
        """Records whose metadata match ``expr``, in key (archive) order; every record when
        ``expr`` is ``None`` (as :meth:`count` counts them all). The :class:`Results` hold the
        matching keys packed in Rust (one buffer): no ``str`` object is made per key until one is
        read.

        ``expr`` is a query (``"temperature > 250 and material == 'Si'"``, grammar in
        store/QUERY.md) evaluated in Rust over the index, opening no payload, with the GIL released
        (a full scan runs on two threads when there are two cores); or a Python callable taking a
        :class:`Record` (slower: each record crosses into Python). Raises :class:`QueryError` (a
        ``ValueError`` with ``.column``) for a malformed query, ``TypeError`` for anything else
        (``find(3)``).
        """
        if expr is None:
            return Results(self, self._index().find(None))
        if callable(expr):
            return Results(self, [k for k in self._index().keys() if expr(self[k])])
        if not isinstance(expr, str):
            raise TypeError(f"find() takes a query string or a callable, not {type(expr).__name__}")
        return Results(self, self._index().find(_query_text(expr)))

    def count(self, expr: str | Callable[[Record], bool] | None = None) -> int:
        """Number of records matching ``expr`` (all records without one); ``expr`` as in
        :meth:`find`."""
        if expr is None:
            return len(self)
        if callable(expr):
            return len(self.find(expr))
        return int(self._index().count(_query_text(expr)))

    def to_pandas(
        self, expr: str | None = None, *, keys: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """All records (or those matching the query ``expr``, or those of ``keys`` in that order)
        as a pandas DataFrame, from the index
        only: one row per record, index ``"key"`` (the keys, of pandas' dtype for str labels:
        ``str`` with pandas 3, ``object`` before); columns in first-seen order: the metadata, nested
        dicts flattened to dotted names (``params.lr``; lists stay values), then per array path
        ``<path>.shape`` (a tuple) and ``<path>.dtype`` (its ``str``), winning over a metadata field
        of the same name. Fields a record lacks are missing values (NaN). Built from
        :meth:`to_arrow`'s table when pyarrow is installed (JSON-text columns decoded back to the
        values they hold; aware datetimes as instants in UTC, numpy scalars as plain numbers unless
        the table says their dtype), record by record otherwise. Raises ``ModuleNotFoundError`` (an
        ``ImportError``) naming ``pip install pandas`` when pandas is not installed,
        :class:`QueryError` for a malformed ``expr``, :class:`MissingKeyError` for a key of
        ``keys`` not held, ``ValueError`` when given both ``expr`` and ``keys``.
        """
        if _arrow.has_pyarrow():
            _frame.pandas_module()  # without pandas, say so first
            return _arrow.frame(self._arrow_stream(expr, keys))
        if keys is not None:
            chosen = _keys_arg(expr, keys)
        else:
            chosen = self._index().keys() if expr is None else self.keys(expr)
        return _frame.records_frame(self.__getitem__, chosen)

    def to_arrow(self, expr: str | None = None, *, keys: Sequence[str] | None = None) -> pa.Table:
        """All records (or those matching the query ``expr``) as a ``pyarrow.Table`` of their
        metadata, from the index only (no payload opened), one row per record in key (archive)
        order; with ``keys``, the records of those keys in that order (the columns and types of
        the table a query matching exactly them gives; a key given twice is two rows). Built in
        Rust and handed to pyarrow through the Arrow PyCapsule interface (the Arrow C stream
        interface): the buffers are shared, not copied.

        Columns (each field's metadata ``lazyvault.kind`` says which it is):

        - ``key``: ``string``, never null;
        - per metadata path, in first-seen order, named by the path's segments joined with ``.``
          (``params.lr``: nested dicts are walked; a list or an empty dict is a value), with
          ``lazyvault.path`` the segments as a JSON array, typed from the selected values alone:
          ``int64``, ``double`` (ints and floats together; an int stored beside floats of its field
          may come as a ``double``), ``bool``, ``dictionary<int32, string>`` (strings),
          ``timestamp[us]`` (naive datetimes) or ``timestamp[us, tz=+00:00]`` (aware ones, as
          instants in UTC), null where
          a record lacks the path (numpy numbers count as their value; a column of one numpy
          dtype, or of dates, says so in ``lazyvault.numpy`` / ``lazyvault.date``). A path holding
          values of several kinds, nulls, lists, tuples or other tagged values
          (schema/FORMAT.md) is a ``string`` column of
          each value's JSON text (field metadata ``lazyvault.json`` = ``"true"``;
          :meth:`to_pandas` decodes it);
        - per array path, ``<path>.shape`` (``list<uint64>``) and ``<path>.dtype``
          (``dictionary<int32, string>``: numpy's dtype name), null where a record lacks the array.

        Paths no selected record holds are left out. The table works with anything that reads
        Arrow: ``pl.from_arrow(t)``, ``duckdb.sql("select ... from t")``. Raises
        ``ModuleNotFoundError`` naming ``pip install 'lazyvault[arrow]'`` when pyarrow (>= 15) is
        not installed, :class:`QueryError` for a malformed ``expr``, :class:`MissingKeyError` for
        a key of ``keys`` not held, ``ValueError`` when given both ``expr`` and ``keys``.
        """
        _arrow.require_pyarrow("to_arrow")
        return _arrow.table(self._arrow_stream(expr, keys))

    def to_polars(
        self, expr: str | None = None, *, keys: Sequence[str] | None = None
    ) -> pl.DataFrame:
        """:meth:`to_arrow`'s table as a ``polars.DataFrame`` (imported through the Arrow PyCapsule
        interface: pyarrow is not needed): the same columns, strings as ``pl.String``, JSON-text
        columns as text (``pl.col(name).str.json_decode()`` reads those that hold one kind).
        ``keys`` and errors as :meth:`to_arrow`, ``ModuleNotFoundError`` naming
        ``pip install 'lazyvault[polars]'`` when polars is not installed."""
        _arrow.require_polars()
        return _arrow.polars_frame(self._arrow_stream(expr, keys))

    def _arrow_stream(
        self, expr: str | None, keys: Sequence[str] | None = None
    ) -> _lazyvault.ArrowStream:
        """The core's Arrow C stream of the records matching ``expr`` (all without one), or of
        ``keys``."""
        if keys is None:
            return self._index().to_arrow(None if expr is None else _query_text(expr))
        chosen = _keys_arg(expr, keys)
        index = self._index()
        stream = index.to_arrow_keys(chosen)
        if stream.num_rows != len(chosen):  # the core leaves out keys it does not hold
            raise MissingKeyError(next(k for k in chosen if not index.contains(k)))
        return stream

    def dataset(self, query: str | None = None, fields: Sequence[str] | None = None) -> Dataset:
        """The records matching ``query`` (all without one) as a map-style dataset for
        ``torch.utils.data.DataLoader`` and ``multiprocessing`` (see :class:`Dataset`); with
        ``fields`` (a list of top-level metadata field names and array paths; None: all of each
        record) only those. Keys resolved now, in key (archive) order, from the last commit
        (:attr:`version`; a writer's unflushed changes are not in it). Raises :class:`QueryError`
        for a malformed query, ``TypeError`` for a query that is not a str or ``fields`` not a list
        of str, ``ValueError`` for a field ``"key"``, :class:`ClosedError` for a closed handle,
        :class:`LazyvaultError` for a writer that never committed (``flush()`` first)."""
        return dataset_of(self, query, fields)

    def to_dask_array(
        self, name: str, query: str | None = None, *, chunks: int | Sequence[int] | None = None
    ) -> da.Array:
        """Array ``name`` (a path as in ``record.arrays``) of every record matching ``query`` (all
        without one), stacked in key (archive) order, as a lazy ``dask.array.Array`` of shape ``(n,
        *shape)`` and the records' dtype (byte order included). The records are those of the last
        commit (:attr:`version`): on a writer with unflushed changes, the last commit (unflushed
        records are not in it); later commits change nothing (the process that made it pins that
        version while the array lives). Building it reads the index only; computing a chunk opens
        the pinned reader in the worker's process and copies the chunk's payloads into one array.

        Chunks along axis 0 only: ``chunks`` None gives each chunk ``max(1, array.chunk-size //
        nbytes of one array)`` records (dask's config, 128 MiB by default), an int that many
        records, a list of ints the records of each chunk (summing to ``n``). The graph holds no
        handle and no array data: per chunk, the source (path, version, trust) and the chunk's
        keys, a few hundred bytes; it works on any scheduler (``distributed`` workers open the
        store by path: on a shared file system for other machines).

        Raises ``ModuleNotFoundError`` without dask (``pip install 'lazyvault[dask]'``);
        ``ValueError`` when no record matches, for a record without array ``name`` (naming it), for
        one whose array differs in dtype or shape from the first record's (naming both), for an
        ``object`` array, for bad ``chunks``; ``TypeError`` for a ``name`` or ``query`` that is not
        a str or ``chunks`` of another type; :class:`QueryError`; :class:`ClosedError` for a closed
        handle; :class:`LazyvaultError` for a writer that never committed (``flush()`` first).
        Computing raises :class:`CorruptError` for a payload missing or damaged (naming the record
        and array), and, if the version is no longer kept, saying to make a new one.
        """
        return _dask.to_array(self, name, query, chunks)

    def to_dask_dataframe(
        self, query: str | None = None, *, npartitions: int | None = None
    ) -> dd.DataFrame:
        """The records matching ``query`` (all without one) as a lazy ``dask.dataframe.DataFrame``
        whose ``compute()`` is :meth:`to_pandas` of them: the same columns, dtypes, values and
        index ``"key"``. The records are those of the last commit (as
        :meth:`to_dask_array`); building it reads the index once here (to find the columns and
        their dtypes), and each partition's task reads its records' index entries again in its
        worker. No payload is opened.

        Partitions: contiguous runs of keys, ``npartitions`` of them as even as can be (None: one
        per 1,000 records; at most one per record); ``divisions`` are the keys at their boundaries
        (``ddf.loc[key]`` reads one partition), unknown for an archive whose keys are not sorted.
        Raises ``ModuleNotFoundError`` without dask, ``TypeError`` for a ``query`` that is not a
        str or ``npartitions`` not an int, ``ValueError`` for ``npartitions`` under 1, and the
        errors of :meth:`to_dask_array` for a closed handle or a writer that never committed.
        """
        return _dask.to_dataframe(self, query, npartitions)

    def to_dask_bag(self, query: str | None = None, *, npartitions: int | None = None) -> db.Bag:
        """The records matching ``query`` (all without one), in key (archive) order, as a lazy
        ``dask.bag.Bag`` of :class:`Record`, at the last commit (as :meth:`to_dask_array`);
        partitions as in :meth:`to_dask_dataframe`. The records of a store directory pickle by
        reference (the fields of :meth:`Record.ref`: no array data, whatever their size; they map
        their payloads wherever they are unpickled, valid while those payloads exist, as a
        :class:`RecordRef`), so a bag computed, persisted or passed between workers moves no array
        bytes; those of an archive pickle by value. Raises as :meth:`to_dask_dataframe`.
        """
        return _dask.to_bag(self, query, npartitions)

    def _ipython_key_completions_(self) -> list[str]:
        """What ``store["<tab>`` offers in IPython: the keys."""
        return list(self._index().keys())

    def _display_parts(self) -> tuple[str, Callable[[str], Record], Sequence[str]]:
        return self._title(), self.__getitem__, [] if self.closed else self._index().keys()


class Store(Handle, MutableMapping[str, Record]):
    """A store of objects made of metadata and numpy arrays (see the README).

    Open with :meth:`Store.open`. ``store[key] = obj`` splits ``obj`` into a JSON metadata record
    and ``.npy`` payloads; ``store[key]`` returns a lazy :class:`Record`. Keys are any non-empty
    ``str`` (never turned into paths).

    ``progress=`` (:meth:`update`, :meth:`verify`, :meth:`gc`, :meth:`export`, :meth:`import_file`,
    :meth:`merge`):
    None (default) a tqdm bar when someone is watching (stderr is a terminal, or a Jupyter kernel
    runs the code), never when output goes to a file or pipe; True forces one, False turns it off; a
    callable ``f(done, total)`` gets the counts instead (``total`` None when unknown in advance).
    """

    def __init__(self, core: _lazyvault.StoreCore, trust: Trust = UNTRUSTED) -> None:
        if not isinstance(core, (_lazyvault.StoreCore, _DeferredCore)):
            raise TypeError("open a store with lazyvault.Store.open(path, mode)")
        self._core = core
        self._path = core.root
        self._trust = trust
        # a weak reference: a Store dropped without close() must be freed (and
        # its lock released) at once, not when the cycle collector runs
        this = weakref.ref(self)
        self._source = DirectorySource(
            self._path, trust, lambda key: cast(Store, this())._core.get_pickle(key)
        )
        _open_stores.add(self)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        mode: Literal["r", "a", "w"] | None = None,
        *,
        allow_pickle: bool = False,
        safe_classes: Iterable[type] = (),
        retention: float | None = None,
    ) -> Any:
        """Opens the store at ``path``. ``mode``: ``"a"`` read/write, create if missing (default);
        ``"r"`` read-only, must exist; ``"w"`` create, must not exist.

        An existing store opens as a **reader** (no lock, nothing written, on read-only media too)
        showing a snapshot, the writer's last ``flush()``/``close()`` (:attr:`version`), until
        :meth:`refresh`. In mode ``"a"`` the first write takes the **writer** role: one process at a
        time, shared by the handles of one process (README, "Sharing a store"). ``retention``:
        seconds superseded data is kept for readers on *other machines*, whose locks this one cannot
        see (default: 900 on a network file system, 0 on a local one). ``allow_pickle``: allow
        loading parts that need unpickling (object arrays, class instances, pickled remainders), off
        by default as unpickling can run arbitrary code. ``safe_classes``: classes (dataclasses and
        other classes whose state is a plain ``__dict__``) whose instances ``load()`` rebuilds
        without ``allow_pickle``: an instance stored as class ``module:qualname`` is rebuilt from
        the listed class of that name, which is never imported (a class defined in ``__main__`` or
        a notebook works; a redefined class of the same name is the one listed); list the classes
        of nested instances too. Any other class, and pickled parts, still need ``allow_pickle``.

        A file that starts like a zip (a ``.lvz``, whatever its extension) opens as a read-only
        :class:`lazyvault.Archive` instead (no lock; ``mode`` ``"a"``/``"w"`` raise
        :class:`ReadOnlyError`).

        Raises :class:`StoreExistsError` / :class:`StoreNotFoundError` by mode,
        :class:`NotAStoreError`, :class:`FormatVersionError` for a newer major format version,
        ``ValueError`` for a bad mode or a path holding a NUL byte or not valid UTF-8,
        ``TypeError`` / ``ValueError`` for a bad ``allow_pickle``, ``retention`` or
        ``safe_classes`` (``TypeError`` for an item that is not a class,
        ``ValueError`` for a class whose instances are stored as pickles: ``__slots__``, custom
        pickling, a C base class, a class defined in a function).
        """
        if mode is not None and mode not in ("r", "a", "w"):
            raise ValueError(f"mode must be 'r', 'a' or 'w', not {mode!r}")
        path = store_path(path)
        trust = trust_of(allow_pickle, safe_classes)
        seconds = _retention_seconds(retention)  # checked before anything is opened
        opened = _hook("open_file")(path, mode, trust)  # an .lvz archive
        if opened is not None:
            return opened
        if os.fspath(path).endswith(".lvz") and not os.path.exists(path):
            # a mistyped archive name must not become a new directory store
            error = StoreNotFoundError(f"{os.fspath(path)}: no such archive")
            error.path = os.fspath(path)
            raise error
        core = _lazyvault.StoreCore(os.fspath(path), mode or "a")
        if seconds is not None:
            core.retention = seconds
        return cls(core, trust)

    @property
    def path(self) -> str:
        """The store's directory."""
        return self._path

    @property
    def mode(self) -> str:
        """``"r"``, ``"a"`` or ``"w"``."""
        return self._core.mode

    @property
    def version(self) -> int:
        """The commit this handle shows: the number of commits (flushes and
        closes that changed something, ``gc()``) since the store was created;
        a reader's moves only on :meth:`refresh`."""
        return self._core.version

    def refresh(self) -> int:
        """Moves a reader to the writer's latest commit; returns the new :attr:`version`. Records
        and results taken before stay as they were, but payloads only an older snapshot referenced
        may go once no handle pins it (loading one then raises :class:`CorruptError`: take
        ``store[key]`` again)."""
        if isinstance(self._core, _DeferredCore):
            # a pickled store not opened yet: the latest commit, whatever
            # version it was pinned to (that one may be gone)
            self._core._version = None
        return self._core.refresh()

    def begin_write(self) -> None:
        """Takes the writer role now rather than at the first write (as SQLite's ``BEGIN
        IMMEDIATE``), recovering a crashed writer's leftovers. Raises :class:`ReadOnlyError` in mode
        ``"r"``, :class:`StoreLockedError` (naming the PID) while another process writes,
        :class:`CorruptError` when the index needs ``repair``, :class:`StorageError` when the store
        cannot be written (``EROFS``, ``EACCES``; ``ENOLCK`` without locks)."""
        self._core.begin_write()

    @property
    def is_writer(self) -> bool:
        """Whether this handle holds the writer role (it has written)."""
        return self._core.is_writer

    @property
    def retention(self) -> float:
        """``retention`` (see :meth:`open`); settable, for this handle's later flushes, closes and
        ``gc()`` (``TypeError``/``ValueError`` as there)."""
        return self._core.retention

    @retention.setter
    def retention(self, seconds: float) -> None:
        checked = _retention_seconds(seconds)
        if checked is None:
            raise TypeError("retention is a number of seconds, not None")
        self._core.retention = checked

    @property
    def closed(self) -> bool:
        return self._core.closed

    def _index(self) -> _lazyvault.StoreCore:
        return self._core

    # -- mapping ---------------------------------------------------------

    def __getitem__(self, key: str) -> Record:
        """The lazy record of ``key``, from the index. Raises :class:`MissingKeyError` (a
        ``KeyError``) if absent, :class:`KeyTypeError` for a non-``str`` key,
        :class:`InvalidKeyError` for ``""``."""
        if type(key) is not str or not key.isascii():  # an ASCII str is a key (or "": the core)
            key = check_key(key)
        got = self._core.get_record(key)
        if got is None:
            raise MissingKeyError(key)
        raw, remainder, arrays = got
        return from_store(self._source, key, raw, arrays, self, remainder)

    def __setitem__(self, key: str, obj: Any) -> None:
        """Stores ``obj`` under ``key``, replacing what was there: arrays anywhere in it
        (attributes, nested dict/list/tuple) as ``.npy`` payloads first, then the record (metadata,
        layout, pickled remainder) into the index. Durable after :meth:`flush` or :meth:`close`."""
        key = check_key(key)
        if isinstance(obj, Record):
            # a record from this or another store (or an archive): copy it as
            # a record (metadata, layout, payloads), never pickle the proxy
            _hook("copy_record")(self, key, obj)
            return
        self._core.put_many([(key, *_layout.put_args(obj, key))])

    def replace_arrays(self, key: str, arrays: Mapping[str, Any]) -> None:
        """Replaces some arrays of the record under ``key``, keeping the rest and writing only the
        new payloads (h5py's ``del group[name]; group[name] = new``). ``arrays``: ``{name as in
        store[key].arrays: numpy.ndarray}``, dtype and shape free (``object`` arrays are pickled:
        reading back needs ``allow_pickle``). The old payloads go at the next :meth:`flush`
        (mappings of them stay valid; a proxy not yet loaded then raises ``CorruptError``: take
        ``store[key]`` again).

        Raises, changing nothing, :class:`MissingKeyError` for no record; :class:`InvalidArrayError`
        (a ``ValueError``) for a name the record has no array of (store the whole object to add
        one), or for a masked array's data or mask that would no longer fit the other (a mask is
        bool, per field, with the data's shape: replace both together); ``TypeError`` for a value
        that is not a plain ``numpy.ndarray``, or for ``arrays`` that is not a mapping.
        """
        key = check_key(key)
        if not isinstance(arrays, Mapping):
            raise TypeError(
                f"arrays must be a mapping of array names to numpy arrays, not "
                f"{type(arrays).__name__}"
            )
        for name, a in arrays.items():
            if type(a) is not np.ndarray:  # subclasses (masked, matrix) would lose state
                raise TypeError(
                    f"replace_arrays takes numpy.ndarray values; {name!r} is "
                    f"{type(a).__name__} (store the whole object for other types)"
                )
        args = [_arrays.payload_args(name, a) for name, a in arrays.items()]
        self._check_masks_fit(key, arrays)
        if not self._core.replace_arrays(key, args):
            raise MissingKeyError(key)

    def _check_masks_fit(self, key: str, arrays: Mapping[str, np.ndarray]) -> None:
        """``InvalidArrayError`` if a masked array's mask would no longer fit its data (bool, per
        field for a structured dtype, the data's shape) once ``arrays`` replace the record's."""
        if key not in self:
            return  # the core raises MissingKeyError
        record = entry_of(self[key])
        entries = record["arrays"]
        for data, mask in _layout.masked_pairs(record["layout"], entries):
            if (data not in arrays and mask not in arrays) or not {data, mask} <= entries.keys():
                continue  # untouched, or a malformed layout (load() reports it)
            shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
            for path in (data, mask):
                if path in arrays:
                    shapes[path] = (arrays[path].shape, arrays[path].dtype)
                else:
                    entry = entries[path]
                    dtype = _arrays.dtype_from_descr(entry["descr"])
                    shapes[path] = (tuple(entry["shape"]), dtype)
            (data_shape, data_dtype), (mask_shape, mask_dtype) = shapes[data], shapes[mask]
            if mask_shape != data_shape or mask_dtype != np.ma.make_mask_descr(data_dtype):
                raise InvalidArrayError(
                    f"record {key!r}: the mask {mask!r} ({mask_dtype}, shape {mask_shape}) would "
                    f"not fit the data {data!r} ({data_dtype}, shape {data_shape}): a masked "
                    "array's mask is bool (per field) with its data's shape; replace both together"
                )

    def __delitem__(self, key: str) -> None:
        key = check_key(key)
        if not self._core.delete(key):
            raise MissingKeyError(key)

    def update(  # type: ignore[override]
        self,
        other: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
        /,
        *,
        progress: ProgressArg = None,
        **kwargs: Any,
    ) -> None:
        """Stores every ``key, obj`` of ``other`` (a mapping, or an iterable of pairs, read one at a
        time) and of ``kwargs``, as ``dict.update``, in chunks of 10,000 records (ending early with
        the record that brings a chunk over 256 MiB of arrays): one durability barrier and one index
        batch a chunk, much faster than ``store[key] = obj`` each. A chunk is all or nothing: if
        writing it fails (``StorageError``, ``InvalidArrayError``, ...), one of its keys is invalid
        or splitting one of its objects raises, none of its records is added and its payload files
        are removed; earlier chunks stay. Durable after :meth:`flush` or :meth:`close`.

        ``progress`` (see :class:`Store`) counts records, ``0`` first, then after each chunk; an
        exception it raises stops the update (earlier chunks stay). It is this option, never a key:
        ``store["progress"] = obj`` stores that record.
        """
        if isinstance(other, (str, bytes)):
            raise TypeError(
                f"update() takes a mapping or an iterable of (key, obj) pairs, not "
                f"{type(other).__name__}"
            )
        pairs: Iterable[tuple[str, Any]] = other  # type: ignore[assignment]
        if hasattr(other, "keys"):  # dict.update's rule: mappings and mapping-likes
            pairs = ((k, other[k]) for k in other.keys())  # type: ignore[index]
        try:
            total: int | None = len(other) + len(kwargs)  # type: ignore[arg-type]
        except TypeError:
            total = None
        with progress_callback(progress, "update", "record") as report:
            tick = report or _no_report
            done = chunk_bytes = 0
            tick(0, total)
            chunk: list[tuple[Any, ...]] = []

            def send(copied: int = 0) -> None:
                nonlocal done, chunk_bytes
                if chunk:
                    self._core.put_many(chunk)
                if chunk or copied:
                    done += len(chunk) + copied
                    chunk.clear()
                    chunk_bytes = 0
                    tick(done, total)

            for i, pair in enumerate(itertools.chain(pairs, kwargs.items())):
                try:
                    key, obj = pair
                except (TypeError, ValueError):
                    # as dict.update: say which element is no pair (its chunk is not written)
                    raise TypeError(
                        f"update() takes a mapping or an iterable of (key, obj) pairs: element "
                        f"#{i} is {type(pair).__name__} {_tagged.cut(pair)}, not a pair"
                    ) from None
                key = check_key(key)
                if isinstance(obj, Record):
                    send()  # keep the order: a copied record goes alone
                    self[key] = obj
                    send(copied=1)
                    continue
                args = (key, *_layout.put_args(obj, key))
                chunk.append(args)
                if len(args) == 2:  # (key, Encoded)
                    chunk_bytes += args[1].nbytes
                else:
                    for a in args[3]:  # not sum(generator): a share of a small record's cost
                        chunk_bytes += len(a[5])
                if len(chunk) >= _UPDATE_CHUNK_RECORDS or chunk_bytes >= _UPDATE_CHUNK_BYTES:
                    send()
            send()

    def __contains__(self, key: object) -> bool:
        return self._core.contains(check_key(key))

    # -- secondary indexes ------------------------------------------------

    def create_index(self, field: str) -> None:
        """Indexes the metadata field ``field`` (a dotted path: ``"params.lr"``) so that
        ``find``/``count`` with ``==``, ``in [...]`` or a range on it read only the matching
        records. Built now, kept by every write, rebuilt by :meth:`repair`; an existing one is left
        as it is. Only scalars (None, bool, numbers, str) are indexed; answers are always those of a
        full scan. Raises ``InvalidFieldError`` (a ``ValueError``) for a bad field path,
        ``ReadOnlyError`` in mode ``"r"``.
        """
        self._core.create_index(_field(field))

    def drop_index(self, field: str) -> bool:
        """Removes the index on ``field``; returns whether there was one."""
        return self._core.drop_index(_field(field))

    def indexes(self) -> list[str]:
        """The indexed fields, sorted."""
        return self._core.indexes()

    def explain(self, expr: str) -> str:
        """How ``find(expr)`` runs: ``"index temperature: > 250, 42 candidate record(s), ..."`` when
        an index narrows it, else ``"full scan of N records (...)"`` with the reason. Raises
        ``QueryError``."""
        return self._core.explain(_query_text(expr))

    # -- durability and maintenance ---------------------------------------

    def flush(self) -> None:
        """Makes every change so far durable (it survives a crash) and commits it for readers that
        open or :meth:`refresh` from now on, then removes the payloads of replaced records no reader
        may still see. Nothing to do for a handle that has not written."""
        self._core.flush()

    def close(self) -> None:
        """Flushes, publishes a checkpoint (readers then open in constant time), and releases the
        snapshot or, for the last handle of the writer, the index and the lock. Idempotent."""
        if not isinstance(self._core, _DeferredCore):  # never opened: nothing to do
            self._core.close()
        _open_stores.discard(self)

    def verify(self, *, checksums: bool = True, progress: ProgressArg = None) -> dict[str, Any]:
        """Checks every record against its payload files (each exists, its ``.npy`` header agrees
        with the record, it holds all the data; with ``checksums``, the data hashed against the
        XXH3-64 recorded at write time, reading every byte) and the journal (each key's latest entry
        is its record; no record is in the journal alone); that each array entry's ``dtype`` is
        numpy's name of its ``descr``, that the layout names no array path the record lacks, and
        that each pack is a readable zip (its end record and central directory, from its tail, as
        ``np.load`` needs them). Files no record references are orphans (``gc()`` removes them).
        ``progress`` (see :class:`Store`) counts records.

        Returns ``{"ok": bool, "records": int, "arrays": int, "checksummed": int,
        "checksum_mismatches": int, "problems": [str], "orphans": [path]}``: ``checksummed`` counts
        the checksums compared, ``checksum_mismatches`` those that differed (each also a problem);
        ``TypeError`` for a non-bool ``checksums``.
        """
        if not isinstance(checksums, bool):
            raise TypeError(f"checksums must be a bool, not {type(checksums).__name__}")
        with progress_callback(progress, "verify", "record") as callback:
            return self._core.verify(checksums, callback)

    def gc(self, *, progress: ProgressArg = None) -> dict[str, int]:
        """Flushes, removes payload and temporary files no record references (left by a crash or an
        overwrite), writes one full checkpoint (after which the journal it covers is removed), and
        rewrites the packs of small arrays that are more than half dead. Returns
        ``{"removed_files": n, "removed_bytes": n, "journal_bytes_freed": n, "packs_compacted": n,
        "packs_damaged": n}`` (sizes in bytes).
        ``packs_damaged`` counts the packs due for that rewrite but left as they are because they
        are damaged (a live member that no longer reads or matches its checksum, or no readable
        zip): nothing damaged is copied under a good checksum; :meth:`verify` names them and their
        records. ``progress`` (see :class:`Store`) gets ``(0, 1)``, then ``(1, 1)``: the core
        works in one step."""
        with progress_callback(progress, "gc", "step") as report:
            tick = report or _no_report
            tick(0, 1)
            result = self._core.gc()
            tick(1, 1)
        return result

    @staticmethod
    def repair(path: str | os.PathLike[str]) -> dict[str, Any]:
        """Rebuilds a lost or damaged index and checkpoint (FORMAT.md, "Repair"): takes the lock,
        moves the old index aside to ``index.damaged-<n>``, starts from the newest checkpoint that
        checks whole (or salvages what damaged ones still hold: every run entry whose CRC-32 checks,
        naming records that may be stale), replays the journal after it keeping each key's latest
        version whose payloads are sound (deleted keys stay deleted), writes a new checkpoint and
        rebuilds the secondary indexes. What it could not keep is listed in ``skipped``. Returns
        ``{"records": n, "entries": n, "skipped": [str], "indexes":
        [str], "moved_index": path or None}``. Raises ``StoreNotFoundError``, ``NotAStoreError``,
        ``StoreLockedError`` while a Store holds it, ``TypeError`` for a path of another type,
        ``ValueError`` for a path holding a NUL byte or not valid UTF-8.
        """
        if not isinstance(path, str | bytes | os.PathLike):
            raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
        return _lazyvault.StoreCore.repair(store_path(path))

    # -- pickling, archives, interop (thin: the work is in their modules) ----

    def __reduce__(self) -> Any:
        """A Store pickles by path, version, allow_pickle and safe_classes (by name), none of its
        content; it comes back as a reader (mode ``"r"``, no lock) pinned to that version (opened at
        its first use; ``refresh()`` moves it on); a closed store comes back as a reader of the
        latest version."""
        return _hook("reduce")(self)

    def export(
        self,
        path: str | os.PathLike[str],
        keys: Iterable[str] | None = None,
        query: str | None = None,
        *,
        progress: ProgressArg = None,
    ) -> None:
        """Writes records to one file, format by extension: ``.lvz`` (a zip of uncompressed ``.npy``
        members, one per array, data 64-byte aligned, plus the records; ``Store.open`` maps it,
        ``np.load`` reads it as an npz),
        ``.npz`` or ``.safetensors``. ``keys`` or ``query`` select the records (all by default).
        ``progress`` (see :class:`Store`) counts arrays written (a ``.lvz``: ``(0, n)`` then ``(n,
        n)``, the core writes it in one step). The errors raised are in
        :func:`lazyvault._export.export`."""
        _hook("export")(self, path, keys=keys, query=query, progress=progress)

    def import_file(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        key: str | None = None,
        *,
        progress: ProgressArg = None,
        max_header_size: int | None = None,
        max_ratio: int | None = None,
    ) -> list[str]:
        """Reads a ``.npy``, ``.npz``, ``.safetensors`` or ``.lvz`` file (format from the content),
        every such file under a directory, or a list of files and directories, into the store in
        bounded memory, all or nothing (one commit); returns the keys written. ``key`` names the
        record of a single file (default: the file's stem; under a directory, its path there
        without the suffix; a ``.lvz`` keeps its keys). ``progress`` (see :class:`Store`) counts
        arrays over every file, from ``(0, total)``. ``max_header_size``: the largest ``.npy``
        header read, in bytes (numpy's meaning, default 10,000); ``max_ratio``: the largest
        expansion a deflated ``.npz`` member may declare (default 1100). The rules and the errors
        raised are in :func:`lazyvault._interop.import_file`.
        """
        limits = {"max_header_size": max_header_size, "max_ratio": max_ratio}
        keys: list[str] = _hook("import_file")(self, path, key=key, progress=progress, **limits)
        return keys

    def merge(
        self,
        sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        progress: ProgressArg = None,
    ) -> list[str]:
        """Moves the records of the stores at ``sources`` (a path, or a list or tuple of paths, of
        store directories) into this one; returns their keys (``list[str]``) in source order, each
        source's in key order. No payload byte is copied: each array file is hard-linked into this
        store under a new id (copied only when a source is on another file system); metadata,
        layouts, checksums and pickled remainders are kept as the source has them. Each source is
        read at its latest commit (a writer may work on it in another process; its unflushed
        changes are not seen) and stays a valid, unchanged store.

        A key this store has is replaced (``dict.update``: its old arrays are removed as a put's).
        All or nothing: every record of every source is set in one batch, or none (no file left
        behind). Like :meth:`update`, the records are visible in this process at once and durable
        (committed for other readers) after the next :meth:`flush` or :meth:`close`.
        ``progress`` (see :class:`Store`) counts records, ``(0, total)`` once every source is read
        and checked, then as their arrays are linked (it runs while the writer lock is held: it
        must not write to this store). An empty list merges nothing and returns ``[]``.

        Raises ``TypeError`` for ``sources`` not a path or a list of paths, ``ValueError`` for a
        path holding a NUL byte; :class:`ReadOnlyError`
        in mode ``"r"``; for a source, what ``Store.open(path, mode="r")`` raises
        (:class:`StoreNotFoundError`, :class:`NotAStoreError`, :class:`FormatVersionError`, ...);
        :class:`InteropError` (a ``ValueError``) for a source that is this store, a source given
        twice, or a key two sources hold (naming it and both sources; nothing is changed);
        :class:`CorruptError` naming the source, key and file for a source payload that is missing,
        truncated or disagrees with its record; :class:`RecordTooLargeError`;
        :class:`StoreLockedError` while another process writes this store; :class:`StorageError`
        (``ENOSPC``, ...).
        """
        items: list[Any] = list(sources) if isinstance(sources, list | tuple) else [sources]
        for item in items:
            if not isinstance(item, str | bytes | os.PathLike):
                shown = "None" if item is None else type(item).__name__
                raise TypeError(f"sources must be a store path or a list of them, not {shown}")
        paths = [store_path(p) for p in items]
        for path in paths:
            if os.path.isfile(path):  # the core says only what a store is
                error = NotAStoreError(
                    f"{path}: a file, not a store directory: merge takes stores; read an archive "
                    "(.lvz) or a .npy, .npz or .safetensors file in with store.import_file()"
                )
                error.path = path
                raise error
        with progress_callback(progress, "merge", "record") as report:
            return self._core.merge(paths, report)

    # -- display (index only: no payload is opened) ---------------------------

    def _title(self) -> str:
        if self.closed:
            return f"lazyvault.Store {self._path!r} (closed)"
        n = len(self)
        return f"lazyvault.Store {self._path!r} (mode {self.mode!r}): {n:,} record{'s' * (n != 1)}"

    _repr_pretty_ = RecordsDisplay._repr_pretty_  # before __repr__ (see RecordsDisplay)

    def __repr__(self) -> str:
        # never raises: notebooks and debuggers call it on anything
        try:
            if self.closed:
                return f"<lazyvault.Store {self._path!r} (closed)>"
            return (
                f"<lazyvault.Store {self._path!r} mode={self.mode!r} records={len(self)} "
                f"version={self.version}>"
            )
        except LazyvaultError as e:
            return f"<lazyvault.Store {self._path!r} (unavailable: {type(e).__name__}: {e})>"


def writer_here(path: str | os.PathLike[str]) -> bool:
    """Whether an open :class:`Store` of this process holds the writer role of the store at
    ``path`` (the handles of one process share it, and closing the last commits their changes)."""
    where = os.path.abspath(path)
    return any(
        not s.closed and s.is_writer and os.path.abspath(s.path) == where
        for s in list(_open_stores)
    )


def open_deferred(path: str, mode: str, trust: Trust, version: int | None = None) -> Store:
    """A Store that opens ``path`` at its first use (how a pickled Store comes back: unpickling
    never fails, the first use raises where the caller can see it), as of commit ``version`` when
    given."""
    store = Store.__new__(Store)
    core = _DeferredCore(store, path, mode, version)
    Store.__init__(store, core, trust)  # type: ignore[arg-type]
    return store


def core_of(store: Store) -> _lazyvault.StoreCore:
    """The compiled core of ``store``, for the modules above that hand it to the core's file writers
    and readers (export, import)."""
    return store._core


def raw_record(store: Store, key: str) -> tuple[bytes, bytes | None] | None:
    """``(record JSON, pickled remainder or None)`` of ``key`` as the index holds them (read
    together), or ``None``."""
    return store._core.get_full(key)


# -- seams: the modules a layer up plug in here when imported (lazyvault/__init__
# imports them all before any store is opened) ---------------------------------

#: What the ``plug_*`` functions below plug in, by name.
_hooks: dict[str, Callable[..., Any]] = {}


def _hook(name: str) -> Callable[..., Any]:
    hook = _hooks.get(name)
    if hook is None:
        raise RuntimeError(f"lazyvault's {name} is not plugged in: import lazyvault")
    return hook


def plug_interop(
    *, import_file: Callable[..., list[str]], copy_record: Callable[[Store, str, Record], None]
) -> None:
    """Makes these the store's import and record copy (``_interop``): ``import_file(store,
    path, key=, progress=, max_header_size=, max_ratio=)`` -> keys, ``copy_record(store, key,
    record)``."""
    _hooks.update(import_file=import_file, copy_record=copy_record)


def store_path(path: Any) -> str:
    """A store's path (a str, bytes or ``os.PathLike`` of either) as text (:func:`text_path`).
    Raises ``ValueError`` for a NUL byte or a path that is not valid UTF-8 (the core names a
    store's files by UTF-8 paths), :class:`StoreNotFoundError` for ``""`` (as ``open("")``),
    ``TypeError`` for anything else."""
    text = text_path(path, "store path")
    if text == "":
        error = StoreNotFoundError("'': an empty path names no store")
        error.path = ""
        raise error
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode's surrogate escapes of undecodable bytes
        raise ValueError(
            f"the store path {text!r} is not valid UTF-8: lazyvault names a store's files by UTF-8 "
            "paths; rename the directory"
        ) from None
    return text


def plug_export(export: Callable[..., None]) -> None:
    """Makes ``export(store, path, keys=, query=, progress=)`` the store's export (``_export``)."""
    _hooks["export"] = export


def plug_file_opener(opener: Callable[[str | os.PathLike[str], str | None, Trust], Any]) -> None:
    """Makes ``opener(path, mode, trust)`` the way ``Store.open`` opens a file
    (``_archive``): an opened ``.lvz`` archive, or None when ``path`` is not one."""
    _hooks["open_file"] = opener


def plug_pickling(reduce: Callable[[Store], Any]) -> None:
    """Makes ``reduce`` the way a store pickles (``_pickling``)."""
    _hooks["reduce"] = reduce


class Results(RecordsDisplay, Sequence[Record]):
    """The records a query matched: a sequence that builds each :class:`Record` only when asked.
    It holds the matching keys, not a snapshot: a record read from it is the handle's record of
    that key now (a key deleted since raises :class:`MissingKeyError`, in ``to_arrow()`` too); a
    reader (mode ``"r"``) keeps its version until ``refresh()``.
    The matching keys stay packed in Rust (a ``KeyArray``: one buffer, each key made a ``str`` only
    when read), so ``len``, slicing and :meth:`to_arrow` / :meth:`to_pandas` /
    :meth:`to_polars` make no ``str`` per key; :meth:`keys` makes the list."""

    def __init__(self, store: Handle, keys: Sequence[str]) -> None:
        self._store = store
        self._keys = keys

    def keys(self) -> list[str]:
        """The matching keys, in key order, as a new list of ``str``."""
        if isinstance(self._keys, _lazyvault.KeyArray):
            return self._keys.to_list()
        return list(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    @overload
    def __getitem__(self, i: int) -> Record: ...
    @overload
    def __getitem__(self, i: slice) -> Results: ...
    def __getitem__(self, i: int | slice) -> Record | Results:
        if isinstance(i, slice):
            return Results(self._store, self._keys[i])
        try:
            key = self._keys[i]
        except IndexError:
            raise IndexError("Results index out of range") from None
        except TypeError:
            what = type(i).__name__
            raise TypeError(f"Results indices must be integers or slices, not {what}") from None
        return self._store[key]

    def _key_of(self, value: object) -> str | None:
        """The key of ``value`` when it is a record read through this handle, else None."""
        if isinstance(value, Record) and value._source is getattr(self._store, "_source", None):
            return value.key
        return None

    def __contains__(self, value: object) -> bool:
        """Whether ``value`` is a :class:`Record` read through the same handle under one of these
        keys (records are matched by handle and key: each access builds a new one)."""
        key = self._key_of(value)
        return key is not None and key in self._keys

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        """The first position, at or after ``start`` and before ``stop``, of the key of ``value``
        (a :class:`Record` read through the same handle, see ``in``). Raises ``ValueError`` when
        there is none."""
        key = self._key_of(value)
        if key is not None:
            with contextlib.suppress(ValueError):
                return self._keys.index(key, start, sys.maxsize if stop is None else stop)
        what = f"record {value.key!r}" if isinstance(value, Record) else repr(value)
        raise ValueError(f"{what} is not in the results")

    def count(self, value: Any) -> int:
        """How many of these keys are that of ``value`` (a :class:`Record` read through the same
        handle, see ``in``): 0 or 1 for the results of a query."""
        key = self._key_of(value)
        return 0 if key is None else self._keys.count(key)

    def __iter__(self) -> Iterator[Record]:
        return map(self._store.__getitem__, self._keys)

    def to_pandas(self) -> pd.DataFrame:
        """These records as a pandas DataFrame, as :meth:`Store.to_pandas` (rows in this order)."""
        return self._store.to_pandas(keys=self._keys)

    def to_arrow(self) -> pa.Table:
        """These records as a ``pyarrow.Table``, as :meth:`Store.to_arrow` (rows in this
        order)."""
        return self._store.to_arrow(keys=self._keys)

    def to_polars(self) -> pl.DataFrame:
        """These records as a ``polars.DataFrame``, as :meth:`Store.to_polars` (rows in this
        order)."""
        return self._store.to_polars(keys=self._keys)

    def __reduce__(self) -> tuple[Any, ...]:
        """Results pickle as their store (see :meth:`Store.__reduce__`: a reader pinned to the
        store's last commit) and their keys, so they come back as the same records. Raises
        ``pickle.PicklingError`` while the store holds changes not yet committed (``flush()``
        first: the pickle would read the last commit, without them), :class:`ClosedError` once it
        is closed (it would come back at another version)."""
        store = self._store
        if store.closed:
            raise ClosedError(f"{store.path!r} is closed: its results cannot be pickled")
        if isinstance(store, Store) and store._core.has_uncommitted_changes:
            raise pickle.PicklingError(
                f"{store.path!r} holds changes not yet committed, and pickled results read the "
                "store's last commit: flush() the store first"
            )
        return (Results, (store, self._keys))

    def _display_parts(self) -> tuple[str, Callable[[str], Record], Sequence[str]]:
        n = len(self._keys)
        title = f"lazyvault.Results: {n:,} record{'s' * (n != 1)} of {self._store.path!r}"
        return title, self._store.__getitem__, self._keys

    _repr_pretty_ = RecordsDisplay._repr_pretty_

    def __repr__(self) -> str:
        shown = ", ".join(repr(k) for k in self._keys[:5])
        more = ", ..." if len(self._keys) > 5 else ""
        return f"<lazyvault.Results {len(self._keys)} records [{shown}{more}]>"
