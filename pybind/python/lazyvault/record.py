"""``Record``: a lazy proxy of one stored object, and ``ArrayInfo``."""

from __future__ import annotations

import functools
import json
import keyword
import math
import weakref
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, NamedTuple, SupportsIndex, cast

import numpy as np

from . import _arrays, _display, _layout, _lazyvault, _source, _tagged
from .errors import CorruptError

if TYPE_CHECKING:
    from ._source import Source
    from .store import Store


class ArrayInfo(NamedTuple):
    """What the index knows of one array payload, without opening it.

    ``shape``: one int per axis (``()`` for 0-d); ``dtype``: the numpy dtype (byte order included);
    ``nbytes``: data size in bytes (for an ``object`` array, the size of its pickle); ``order``:
    ``"C"`` (row-major) or ``"F"`` (Fortran, column-major), the memory order of the payload.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    order: str

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self.shape)


# Names the proxy itself uses; fields so named stay reachable as
# rec.meta[name] and arrays as rec.array(name).
_OWN = frozenset({"key", "meta", "arrays", "load", "array", "store"})


def _is_probe(name: str) -> bool:
    # What IPython, Jupyter and other tools probe with hasattr/getattr: a
    # field so named would answer (and map an array), so it is only ever
    # rec.meta[name] / rec[name], never an attribute.
    probes = ("trait_names", "_getAttributeNames", "getdoc")
    return name.startswith(("__", "_repr_", "_ipython_")) or name in probes


class Record:
    """A lazy proxy of the object stored under one key.

    Metadata attributes (``rec.temperature``) and ``.meta`` come from the index; ``.arrays``
    describes the payloads without opening them; an array attribute (``rec.positions``) loads its
    payload on first access as a read-only ``numpy.ndarray``, cached on the proxy: a view of a
    memory map (no copy) when over 64 KiB, a private aligned copy when smaller. ``load()`` rebuilds
    the original object.
    """

    __slots__ = (
        "__weakref__",
        "_cache",
        "_json",
        "_key",
        "_meta",
        "_parsed",
        "_pickle",
        "_raw",
        "_source",
        "_store",
    )

    def __new__(
        cls, source: Source, key: str, record: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Record:
        # A record with top-level arrays is an instance of a subclass that
        # has one property per array name (shared by every record with the
        # same names), so that introspection (IPython's completer, jedi,
        # inspect.getattr_static) sees the arrays as descriptors and never
        # calls them: only an explicit rec.name maps a payload.
        if cls is Record and record["arrays"]:
            cls = _class_for(tuple(record["arrays"]))
        return super().__new__(cls)

    def __init__(
        self,
        source: Source,
        key: str,
        record: dict[str, Any],
        store: Store | None = None,
        pickle: bytes | None = None,
    ) -> None:
        self._source = source
        self._pickle = pickle  # the remainder read with the record, if any
        # weak: a record never keeps its store (and a writer's lock) alive
        self._store = weakref.ref(store) if store is not None else None
        self._key = key
        self._json: dict[str, Any] | None = record
        # the record JSON while not decoded yet, and the core's parse of its
        # array entries (a record of a store directory: see from_store)
        self._raw: bytes | None = None
        self._parsed: _lazyvault.RecordArrays | None = None
        # meta with its tagged values decoded, on first use (see from_json)
        self._meta: dict[str, Any] | None = None
        self._cache: dict[str, np.ndarray] = {}

    @property
    def _record(self) -> dict[str, Any]:
        # the record entry (meta, arrays, layout, pickle), decoded on first
        # use: reading an array of a store's record does not need it
        record = self._json
        if record is None:
            raw = cast(bytes, self._raw)
            record = self._json = decode_record(raw, self._key)
            if self._meta is None and _plain(raw):
                self._meta = record["meta"]
            self._raw = None
        return record

    @property
    def key(self) -> str:
        """The key this record is stored under."""
        return self._key

    @property
    def store(self) -> Store | None:
        """The store this record was read from (``None`` for a record that travelled by pickle, or
        whose store was closed and freed: a record never keeps its store open)."""
        return self._store() if self._store is not None else None

    @property
    def meta(self) -> dict[str, Any]:
        """The metadata fields of the object, nested as in the object: JSON values, and NaN, big
        ints, datetimes, dates, tuples and numpy scalars as themselves (README, "Metadata types");
        arrays and values kept in the pickled remainder are left out."""
        meta = self._meta
        if meta is None:
            record = self._record  # decoding the JSON may set _meta (no tagged value)
            meta = self._meta
            if meta is None:
                meta = self._meta = _tagged.decode_meta(record["meta"])
        return meta

    @property
    def arrays(self) -> dict[str, ArrayInfo]:
        """``{path: ArrayInfo}`` for every array payload, in the order they were found (``"image"``,
        ``"frames/0"``, ``"params/w"``)."""
        return {
            name: ArrayInfo(
                tuple(e["shape"]),
                _arrays.dtype_from_descr(e["descr"]),
                e["nbytes"],
                "F" if e["fortran_order"] else "C",
            )
            for name, e in self._record["arrays"].items()
        }

    def array(self, name: str) -> np.ndarray:
        """The array stored at path ``name``, read-only (see the class). Raises ``KeyError`` if
        there is none, :class:`CorruptError` if its payload is missing or damaged,
        :class:`PickleNotAllowedError` for an ``object`` array when the store was opened without
        ``allow_pickle``."""
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        parsed = self._parsed
        if parsed is not None:
            # the core reads it from the record JSON (None: a pickled array,
            # or no such array: the general way below)
            try:
                got = parsed.read(name)
            except CorruptError as e:
                # (an error: decoding the record JSON here costs nothing that matters)
                source = self._source
                root = source.root if isinstance(source, _source.DirectorySource) else None
                entry = self._record["arrays"].get(name)
                raise _source.corrupt_array(e, self._key, name, root, entry) from e
            if got is not None:
                array = self._cache[name] = _arrays.array_from_buffer(*got)
                return array
        entry = self._record["arrays"].get(name)
        if entry is None:
            raise KeyError(f"record {self._key!r} has no array {name!r}")
        array = self._source.map_array(self._key, name, entry)
        self._cache[name] = array
        return array

    def load(self) -> Any:
        """The original object rebuilt: dicts, lists, tuples, dataclasses and
        class instances as they were, arrays read-only (as :meth:`array`).
        Raises :class:`PickleNotAllowedError` when that needs unpickling (an
        instance of a class not in the store's ``safe_classes``, a pickled
        remainder) without ``allow_pickle=True``."""
        trust = self._source.trust
        return _layout.join(
            self._record["layout"],
            self.array,
            self._remainder,
            trust.allow_pickle,
            f"record {self._key!r}",
            array_paths=self._record["arrays"],
            remainder=has_remainder(self),
            safe_classes=trust.by_name(),
            meta=self._record["meta"],
        )

    def ref(self) -> Any:
        """The :class:`lazyvault.RecordRef` of this record; ``ValueError`` for a record not read
        from a store directory."""
        return _plugged_pickling().ref(self)

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        # By value (PEP 574: arrays out-of-band with protocol 5); across
        # multiprocessing, by reference (see _pickling). A subclass pickles
        # as itself.
        return _plugged_pickling().reduce(self, int(protocol))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # ForkingPickler looks reducers up by exact type: each subclass too
        super().__init_subclass__(**kwargs)
        if _pickling is not None:
            _pickling.register_class(cls)

    def _remainder(self) -> bytes | None:
        """The pickled remainder of this record (read with it when it came from a store, so never
        the remainder of a record that replaced it)."""
        if not has_remainder(self):
            return None
        if self._pickle is not None:
            return self._pickle
        return self._source.get_pickle(self._key)

    def _array_names(self) -> Collection[str]:
        # the core's list when the JSON is not decoded yet (reading an array
        # by path then decodes no JSON in Python either)
        parsed = self._parsed
        if parsed is not None and self._json is None:
            return parsed.names
        return self._record["arrays"]

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: fields from the record.
        if name in _OWN or _is_probe(name):
            raise AttributeError(name)
        if name in self._array_names():
            return self.array(name)
        meta = self._meta
        if meta is None:
            meta = self.meta
        if name in meta:
            return meta[name]
        raise AttributeError(f"record {self._key!r} has no field {name!r}")

    def __getitem__(self, name: str) -> Any:
        """An array by path (``rec["params/w"]``) or a metadata field."""
        if name in self._array_names():
            return self.array(name)
        try:
            return self.meta[name]
        except KeyError:
            raise KeyError(f"record {self._key!r} has no field {name!r}") from None

    # Not a sequence: without this, Python would iterate via __getitem__(0).
    __iter__ = None

    def __contains__(self, name: object) -> bool:
        return name in self._record["arrays"] or name in self.meta

    def __dir__(self) -> list[str]:
        fields = [n for n in (*self.meta, *self._record["arrays"]) if _attribute_name(n)]
        return sorted(set(super().__dir__()) | set(fields))

    def _ipython_key_completions_(self) -> list[str]:
        """What ``rec["<tab>`` offers in IPython: metadata fields and array paths (``"frames/0"``
        too)."""
        return [*self.meta, *self._record["arrays"]]

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """IPython's text display: :meth:`__str__`."""
        _display.pretty(str(self), p, cycle)

    def _repr_html_(self) -> str:
        """The notebook display: :meth:`__str__` as HTML tables."""
        return _display.record_html(self, self._cache.keys())

    def __str__(self) -> str:
        """Several lines: metadata (nested fields as dotted names, the first 20) and arrays (shape,
        dtype, size, order, mapped yet or not); opens no payload."""
        return _display.record_text(self, self._cache.keys())

    def __repr__(self) -> str:
        name, value = _display.name_text, _display.short_repr
        meta = ", ".join(f"{name(k)}={value(v)}" for k, v in list(self.meta.items())[:8])
        if len(self.meta) > 8:
            meta += ", ..."
        arrays = ", ".join(
            f"{name(n)}: {info.dtype} {info.shape}" for n, info in list(self.arrays.items())[:8]
        )
        if len(self._record["arrays"]) > 8:
            arrays += ", ..."
        return f"<lazyvault.Record {self._key!r} meta({meta}) arrays({arrays})>"


def _attribute_name(name: str) -> bool:
    """Whether a field or top-level array ``name`` is reachable as ``rec.name``: an identifier that
    is not a keyword, not one of the proxy's own attributes and not an introspection probe."""
    return (
        name.isidentifier()
        and not keyword.iskeyword(name)
        and not _is_probe(name)
        and not hasattr(Record, name)
    )


def _array_property(name: str) -> property:
    def get(self: Record) -> np.ndarray:
        return self.array(name)

    get.__name__ = get.__qualname__ = name
    get.__doc__ = f"The array {name!r}, read-only, loaded on first access (see Record.array)."
    # a real class, not a string: jedi reads it to complete rec.name.<tab>
    get.__annotations__ = {"return": np.ndarray}
    return property(get)


@functools.lru_cache(maxsize=1024)
def _class_for(array_names: tuple[str, ...]) -> type[Record]:
    """The class of a record whose arrays are ``array_names`` (cached: this runs for every record
    read)."""
    names = tuple(n for n in array_names if _attribute_name(n))
    return _with_array_properties(names) if names else Record


@functools.lru_cache(maxsize=1024)
def _with_array_properties(names: tuple[str, ...]) -> type[Record]:
    """The subclass of :class:`Record` with a property per array name (cached: a store of like
    records shares one class)."""
    namespace: dict[str, Any] = {n: _array_property(n) for n in names}
    namespace.update(__slots__=(), __module__=Record.__module__, __qualname__="Record")
    namespace.update(__doc__=Record.__doc__, __record_arrays__=names)
    return type("Record", (Record,), namespace)  # registered by __init_subclass__


# -- for the package's other modules: a record's attribute names are the user's
# fields (``rec.layout`` is a field "layout"), so what they read off a record is
# offered as functions --------------------------------------------------------


def from_json(
    source: Source, key: str, raw: bytes, store: Store | None = None, pickle: bytes | None = None
) -> Record:
    """The record of ``key`` from its record JSON ``raw`` (UTF-8). A tagged value's name starts
    with ``"$``: a raw record without it (compact or not) has none, so its meta needs no decoding
    (keys and strings starting with ``$`` merely cost a walk)."""
    record = decode_record(raw, key)
    rec = Record(source, key, record, store, pickle)
    if _plain(raw):
        rec._meta = record["meta"]
    return rec


def from_store(
    source: Source,
    key: str,
    raw: bytes,
    arrays: _lazyvault.RecordArrays | None,
    store: Store | None = None,
    pickle: bytes | None = None,
) -> Record:
    """The record of ``key`` from its record JSON ``raw`` and ``arrays``, the core's parse of its
    array entries (``StoreCore.get_record``; ``None``: as :func:`from_json`). The JSON is decoded
    on first need (metadata, layout, ``.arrays``, pickling); reading an array needs only
    ``arrays``. ``source`` must be where ``arrays`` reads from (the store directory)."""
    if arrays is None:
        return from_json(source, key, raw, store, pickle)
    names = arrays.names
    cls = _class_for(names) if names else Record
    rec = object.__new__(cls)
    rec._source = source
    rec._pickle = pickle
    rec._store = weakref.ref(store) if store is not None else None
    rec._key = key
    rec._json = None
    rec._raw = raw
    rec._parsed = arrays
    rec._meta = None
    rec._cache = {}
    return rec


def decode_record(raw: bytes, key: str) -> dict[str, Any]:
    """The record JSON ``raw`` of ``key`` decoded: a dict whose ``meta`` and ``arrays`` are
    objects (schema/FORMAT.md, "Record"). Raises :class:`CorruptError` naming the key for JSON that
    does not decode (truncated, not UTF-8, nested too deep for Python) or is no record."""
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        problem = f"its record JSON does not decode: {type(e).__name__}: {e}"
    else:
        if (
            type(record) is dict
            and type(record.get("meta")) is dict
            and type(record.get("arrays")) is dict
        ):
            return record
        problem = "its record JSON is no record (an object with 'meta' and 'arrays' objects)"
    err = CorruptError(f"record {key!r}: {problem}")
    err.key = key
    raise err


def _plain(raw: bytes) -> bool:
    """Whether the record JSON ``raw`` has no tagged value, so that its meta needs no decoding."""
    return _DOLLAR not in raw or b'"$' not in raw  # the first: memchr, a few ns


_DOLLAR = ord("$")


def entry_of(rec: Record) -> dict[str, Any]:
    """The record entry as read (``meta``, ``arrays``, ``layout``, ``pickle``): the record's own
    dict, not a copy; do not change it."""
    return rec._record


def array_entries(rec: Record) -> dict[str, dict[str, Any]]:
    """``{path: array entry}`` (``id``, ``descr``, ``shape``, ...) in stored order: the record's own
    dict, not a copy."""
    return rec._record["arrays"]


def has_remainder(rec: Record) -> bool:
    """Whether the record has a pickled remainder."""
    return bool(rec._record.get("pickle"))


def remainder_of(rec: Record) -> bytes | None:
    """The pickled remainder bytes of the record (not unpickled), if any."""
    return rec._remainder()


def source_of(rec: Record) -> Source:
    """Where the record's arrays and remainder come from."""
    return rec._source


def own_class(rec: Record) -> type[Record] | None:
    """The class of ``rec`` when it is a user's subclass of :class:`Record`, which ``rec`` pickles
    as; ``None`` for Record and the subclasses made here (which ``Record()`` picks again)."""
    cls = type(rec)
    return None if cls is Record or "__record_arrays__" in vars(cls) else cls


def rebuild(cls: type[Record] | None, source: Source, key: str, record: dict[str, Any]) -> Record:
    """A record of class ``cls`` (:func:`own_class`; ``None``: Record) as ``Record(source, key,
    record)`` makes one: the way an unpickled record comes back. A subclass's own ``__init__`` is
    not called (as with any unpickled object)."""
    if cls is None:
        return Record(source, key, record)
    if not (isinstance(cls, type) and issubclass(cls, Record)):
        raise TypeError(f"{cls!r} is not a subclass of lazyvault.Record")
    rec = cls.__new__(cls, source, key, record)
    Record.__init__(rec, source, key, record)
    return rec


# -- seam: _pickling (a layer up: unpickling builds Records) plugs in here when
# imported, which lazyvault/__init__ does before any record exists -------------


class PicklingHooks(NamedTuple):
    reduce: Callable[[Record, int], Any]  # Record.__reduce_ex__
    ref: Callable[[Record], Any]  # Record.ref
    register_class: Callable[[type[Record]], None]  # Record and each subclass made


_pickling: PicklingHooks | None = None


def plug_pickling(hooks: PicklingHooks) -> None:
    """Makes ``hooks`` the way records pickle (called by ``_pickling``)."""
    global _pickling
    _pickling = hooks
    hooks.register_class(Record)
    for cls in Record.__subclasses__():  # made before (none when imported as usual)
        hooks.register_class(cls)


def _plugged_pickling() -> PicklingHooks:
    if _pickling is None:
        raise RuntimeError("lazyvault._pickling is not loaded: import lazyvault")
    return _pickling
