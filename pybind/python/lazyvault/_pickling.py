"""Pickling records and stores (PEP 574, pickle protocol 5); plugged into ``record`` and ``store``
when imported (unpickling builds Records and Stores).

- **By value** (``pickle.dumps(record, protocol=p)``, protocols 0-5): the record entry, the pickled
  remainder bytes and every array as the read-only ndarray viewing its payload (a memory map, or a
  private copy of at most 64 KiB). numpy's ``ndarray.__reduce_ex__`` moves the bytes: with protocol
  5 and a ``buffer_callback``, each C- or Fortran-contiguous array is one out-of-band
  :class:`pickle.PickleBuffer` of those bytes (no copy, no page read; the main pickle holds a few
  hundred bytes per array); otherwise, and always for ``datetime64``/``timedelta64``, they are
  copied in-band. The unpickled record needs no store (:class:`~lazyvault._source.MemorySource`),
  its arrays are read-only whatever the protocol, and equal records give equal bytes (no ids, no
  timestamps, dicts in stored order).
- **By reference across processes**: for ``multiprocessing``'s ``ForkingPickler`` (``Pool``
  arguments and results, queues, pipes; spawn and fork) a record of a store directory travels as
  the fields of its :class:`RecordRef` (:meth:`Record.ref`; see there), and the receiver opens it
  the same way. Other records travel by value. The records of a dask bag (``to_dask_bag``) pickle
  by reference with any pickler (their source says so), and come back as such records.
- A :class:`~lazyvault.Store` pickles by path (:func:`reduce_store`).

Each way carries the record's (store's) ``allow_pickle`` and ``safe_classes`` (classes pickle by
reference, by name), and a record of a user's subclass of :class:`Record` comes back as that class
(by name too), with its instance ``__dict__`` if it has one.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np

from . import _arrays
from ._source import DirectorySource, MemorySource, Trust
from .record import (
    PicklingHooks,
    Record,
    array_entries,
    entry_of,
    own_class,
    rebuild,
    remainder_of,
    source_of,
)
from .record import plug_pickling as plug_record_pickling
from .store import Store, open_deferred
from .store import plug_pickling as plug_store_pickling

__all__ = ["RecordRef", "record_ref", "reduce_record", "reduce_store"]


def _rebuild_record(
    key: str,
    record: dict[str, Any],
    arrays: dict[str, np.ndarray],
    pickled: bytes | None,
    allow_pickle: bool,
    safe_classes: tuple[type, ...] = (),
    cls: type[Record] | None = None,
) -> Record:
    """Unpickles a record sent by value (as ``cls``, a subclass of Record, when given, see
    :func:`~lazyvault.record.rebuild`): its arrays read-only again (numpy gives writable ones after
    protocols 0-4 and for in-band datetimes) and in the stored byte order (numpy's protocol 0-4 path
    rebuilds ``>i4`` as native ``<i4`` on little-endian: converted back, one copy of an in-band
    copy)."""
    entries = record["arrays"]
    for name, array in list(arrays.items()):
        entry = entries.get(name)
        if entry is not None and not entry.get("pickled"):
            dtype = _arrays.dtype_from_descr(entry["descr"])
            if array.dtype != dtype:
                arrays[name] = array = array.astype(dtype, order="K")
        array.flags.writeable = False
    return rebuild(
        cls, MemorySource(arrays, pickled, Trust(allow_pickle, safe_classes)), key, record
    )


def reduce_record(record: Record, protocol: int) -> tuple[Any, ...]:
    """``Record.__reduce_ex__``, by value: ``(_rebuild_record, (key, record entry, {name: ndarray},
    pickled remainder, allow_pickle, safe_classes, subclass or None))`` (and the instance
    ``__dict__`` of a subclass that has a non-empty one) whatever ``protocol`` (numpy reads the
    pickler's). ``allow_pickle`` and ``safe_classes`` travel along: a record of a store opened
    without them still refuses to unpickle its remainder after the round trip. Raises
    :class:`PickleNotAllowedError` for an object array when the source does not allow unpickling
    (never loaded behind the user's back, not even to pickle).
    """
    del protocol
    source = source_of(record)
    if type(source) is DirectorySource and source.by_reference:  # a record of a dask bag
        return _reduce_by_reference(record, by_reference=True)
    arrays = {name: record.array(name) for name in array_entries(record)}
    entry = entry_of(record)
    # payload ids (and packs) blanked: the arrays travel along, so where they lie means
    # nothing to the receiver, and without it equal records pickle to equal bytes
    ids = {
        name: {**{f: v for f, v in e.items() if f not in ("pack", "pack_offset")}, "id": "0" * 32}
        for name, e in entry["arrays"].items()
    }
    trust = source_of(record).trust
    args = (record.key, {**entry, "arrays": ids}, arrays, remainder_of(record), *trust)
    return _with_state(record, (_rebuild_record, (*args, own_class(record))))


def _with_state(record: Record, reduced: tuple[Any, ...]) -> tuple[Any, ...]:
    """``reduced`` and, for a subclass instance with a non-empty ``__dict__``, that dict (pickle
    sets it on the rebuilt record)."""
    state = getattr(record, "__dict__", None)
    return (*reduced, state) if state else reduced


# -- by reference -------------------------------------------------------------


def _open_reference(
    path: str,
    key: str,
    record: dict[str, Any],
    pickled: bytes | None,
    allow_pickle: bool,
    safe_classes: tuple[type, ...] = (),
    cls: type[Record] | None = None,
    by_reference: bool = False,
) -> Record:
    """A record of the store directory ``path`` rebuilt from its entry (the remainder came along:
    the index is not opened), as ``cls`` when given; its arrays are loaded from the payload files on
    first access (large ones memory-mapped). ``by_reference``: it pickles by reference again (a
    record of a dask bag)."""
    trust = Trust(allow_pickle, safe_classes)
    source = DirectorySource(path, trust, lambda key: pickled, by_reference)
    return rebuild(cls, source, key, record)


def _reference_args(
    record: Record,
) -> tuple[str, str, dict[str, Any], bytes | None, bool, tuple[type, ...]]:
    source = source_of(record)
    if type(source) is not DirectorySource:
        raise ValueError(
            f"record {record.key!r} is not read from a store directory (it was unpickled "
            "by value or comes from an archive): it has no reference; pickle it by value"
        )
    root, trust = os.path.abspath(source.root), source.trust
    return (root, record.key, entry_of(record), remainder_of(record), *trust)


def _reduce_for_multiprocessing(record: Record) -> tuple[Any, ...]:
    """The reducer registered with ``multiprocessing``'s ``ForkingPickler``: by reference for a
    record of a store directory, by value otherwise."""
    source = source_of(record)
    if type(source) is DirectorySource:
        return _reduce_by_reference(record, source.by_reference)
    return reduce_record(record, 4)


def _reduce_by_reference(record: Record, by_reference: bool = False) -> tuple[Any, ...]:
    """A record of a store directory by reference: the fields of its :class:`RecordRef` (and
    whether the receiver's record pickles by reference too)."""
    args = (*_reference_args(record), own_class(record))
    return _with_state(record, (_open_reference, (*args, by_reference) if by_reference else args))


def register_record_class(cls: type[Record]) -> None:
    """Registers ``cls`` (Record or a subclass: with array properties, or a user's) with
    ``ForkingPickler``, whose reducers are looked up by exact type."""
    ForkingPickler.register(cls, _reduce_for_multiprocessing)


@dataclasses.dataclass(frozen=True, repr=False)
class RecordRef:
    """A small, picklable reference to a record of a store directory: a few hundred bytes with any
    protocol (0-5), no array data.

    ``path``: the store's directory (absolute); ``key``; ``record``: the record entry (metadata,
    array entries, layout); ``pickle``: the pickled remainder bytes (``None`` if there is none);
    ``allow_pickle``: whether :meth:`open`-ed records may unpickle, ``safe_classes``: the classes
    whose instances they rebuild without it (both as the store it came from).
    :meth:`open` reads the payload files without opening the index, so any number of processes open
    it while a writer holds the store; it stays valid while the payloads exist (overwriting or
    deleting the record and flushing removes them: ``CorruptError`` then).
    """

    path: str
    key: str
    record: dict[str, Any]
    pickle: bytes | None = None
    allow_pickle: bool = False
    safe_classes: tuple[type, ...] = ()

    def open(self) -> Record:
        """The record, its arrays mapped read-only from the payload files on first access
        (``record.store`` is ``None``)."""
        return _open_reference(*self._fields())

    def _fields(self) -> tuple[Any, ...]:
        return (self.path, self.key, self.record, self.pickle, self.allow_pickle, self.safe_classes)

    def __hash__(self) -> int:
        return hash((self.path, self.key))

    def __reduce__(self) -> tuple[Any, ...]:
        # Explicit, so that every protocol (0 and 1 included) pickles the
        # same six fields.
        return (RecordRef, self._fields())

    def __repr__(self) -> str:
        arrays = list(self.record.get("arrays", {}))
        return f"RecordRef(path={self.path!r}, key={self.key!r}, arrays={arrays!r})"


def record_ref(record: Record) -> RecordRef:
    """``Record.ref()`` (see there)."""
    path, key, entry, pickled, allow_pickle, safe_classes = _reference_args(record)
    return RecordRef(path, key, copy.deepcopy(entry), pickled, allow_pickle, safe_classes)


# -- Store ----------------------------------------------------------------------


def _open_store(
    path: str, allow_pickle: bool, version: int | None, safe_classes: tuple[type, ...] = ()
) -> Store:
    """Unpickles a :class:`Store` (:func:`~lazyvault.store.open_deferred`): a version no longer kept
    raises at the first use, inside a Pool task where the caller sees it, not while unpickling
    (which kills a Pool worker, hanging ``map``)."""
    if version is not None and (type(version) is not int or version < 0):
        raise ValueError(f"bad store version {version!r}")
    return open_deferred(path, "r", Trust(allow_pickle, safe_classes), version)


def reduce_store(store: Store) -> tuple[Any, ...]:
    """``Store.__reduce__`` (see there): ``(_open_store, (absolute path, allow_pickle, version,
    safe_classes))``, none of its content."""
    version = None if store.closed else store.version
    path = os.path.abspath(store.path)
    return (_open_store, (path, store.allow_pickle, version, store.safe_classes))


plug_record_pickling(PicklingHooks(reduce_record, record_ref, register_record_class))
plug_store_pickling(reduce_store)
