"""``Dataset``: the records of a store (or ``.lvz`` archive), or those a query matched, as a
map-style dataset for training loaders (``torch.utils.data.DataLoader``, ``multiprocessing``):
``len(ds)`` and ``ds[i]``, a dict of fields. It pickles by path, version and query, and opens the
store in each process at its first item."""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._pinned import PinnedSource
from .errors import LazyvaultError
from .record import Record, array_entries

if TYPE_CHECKING:
    from .store import Handle


class Dataset:
    """The records of a :class:`~lazyvault.Store` (or :class:`~lazyvault.Archive`) matching a
    query, as a map-style dataset: made by :meth:`Store.dataset <lazyvault.Store.dataset>`.

    ``len(ds)``: the number of records. ``ds[i]`` (``i`` an int, negative counts from the end):
    ``{"key": key, field: value, ...}``, a new dict: ``"key"`` the record's key, then the fields
    asked for (top-level metadata field names and array paths such as ``"params/w"``; with
    ``fields`` None, all metadata fields, then every array by path), metadata as
    ``record.meta`` gives it, arrays as read-only ``numpy.ndarray`` (memory-mapped when over 64 KiB,
    as :meth:`Record.array <lazyvault.Record.array>`). Raises ``IndexError`` out of range,
    ``TypeError`` for an index that is not an int, ``KeyError`` (naming the record and the field)
    for a field the record lacks, ``ValueError`` for a record with a metadata field ``"key"`` when
    all fields were asked for, :class:`PickleNotAllowedError` for an ``object`` array without
    ``allow_pickle``.

    The records are those of one commit, resolved once, in key order (archive order): later commits
    change nothing. Pickled (a few hundred bytes: path, version, query, fields, ``allow_pickle``,
    ``safe_classes``; no key, no open handle), it comes back unopened and, at its first item,
    opens the store read-only at that version and runs the query again, which gives the same keys.
    A forked child opens its own too (sled is not fork-safe). So the processes of a ``DataLoader``
    (``num_workers``, any start method) or a ``multiprocessing.Pool`` each read the store on their
    own, without a lock. ``len`` opens nothing.

    A worker's first item raises :class:`CorruptError` if the version is no longer kept (the process
    that made the dataset keeps it while the dataset lives; on a network file system, for
    ``retention`` seconds), :class:`StoreNotFoundError` if the store moved (both saying to make a
    new dataset) and :class:`LazyvaultError` if the records differ from those counted at
    creation (an archive file replaced since).
    """

    def __init__(
        self,
        source: PinnedSource,
        query: str | None,
        fields: tuple[str, ...] | None,
        size: int | None = None,
    ) -> None:
        self._source = source
        self._query = query
        self._fields = fields
        self._size = size  # the number of records, known once resolved
        self._pid: int | None = None  # the process that resolved _keys
        self._keys: list[str] = []

    def _state(self) -> tuple[Handle, list[str]]:
        """The open handle and the keys, opening and resolving them in a process that has not yet
        (after unpickling, or in a forked child: the parent's handle is not used there)."""
        handle = self._source.open()
        if self._pid != os.getpid():
            keys = list(handle) if self._query is None else handle.keys(self._query)
            if self._size is not None and len(keys) != self._size:
                at = "archive" if self.version is None else f"version {self.version}"
                raise LazyvaultError(
                    f"{self.path!r} ({at}) now has {len(keys)} matching "
                    f"records, not the {self._size} this dataset was made with: it was replaced"
                )
            self._keys, self._size = keys, len(keys)
            self._pid = os.getpid()
        return handle, self._keys

    @property
    def path(self) -> str:
        """The store's directory (archive file), absolute."""
        return self._source.path

    @property
    def version(self) -> int | None:
        """The commit the dataset reads (``None`` for an archive)."""
        return self._source.version

    def keys(self) -> list[str]:
        """The keys of the records, in dataset order (``ds[i]["key"] == ds.keys()[i]``)."""
        return list(self._state()[1])

    def __len__(self) -> int:
        """The number of records (opens nothing)."""
        assert self._size is not None
        return self._size

    def __getitem__(self, i: int) -> dict[str, Any]:
        """The item of record ``i`` (see the class): ``{"key": key, field: value, ...}``."""
        try:
            index = operator.index(i)
        except TypeError:
            raise TypeError(f"dataset indices are int, not {type(i).__name__}") from None
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"dataset index {index} out of range for {n} records")
        handle, keys = self._state()
        with self._source.reading():
            return self._item(handle[keys[index]])

    def _item(self, rec: Record) -> dict[str, Any]:
        item: dict[str, Any] = {"key": rec.key}
        if self._fields is not None:
            for name in self._fields:
                item[name] = rec[name]  # KeyError naming the record and the field
            return item
        meta = rec.meta
        if "key" in meta:
            raise ValueError(
                f"record {rec.key!r} has a metadata field 'key', which would hide the record's "
                "key in the item: make the dataset with fields=[...] not naming it"
            )
        item.update(meta)
        for name in array_entries(rec):
            item[name] = rec.array(name)
        return item

    def __reduce__(self) -> tuple[Any, ...]:
        return (Dataset, (self._source, self._query, self._fields, self._size))

    def __repr__(self) -> str:
        what = f"version={self.version}" if self.version is not None else "archive"
        fields = "all" if self._fields is None else list(self._fields)
        return (
            f"<lazyvault.Dataset {self.path!r} {what} records={self._size} "
            f"query={self._query!r} fields={fields!r}>"
        )


def _fields_arg(fields: object) -> tuple[str, ...] | None:
    """``fields`` as a tuple of distinct names, or TypeError / ValueError."""
    if fields is None:
        return None
    if not isinstance(fields, (list, tuple)):
        raise TypeError(f"fields is a list of str (or None: all), not {type(fields).__name__}")
    for name in fields:
        if not isinstance(name, str):
            raise TypeError(f"fields is a list of str, not of {type(name).__name__} ({name!r})")
    if "key" in fields:
        raise ValueError("'key' is the record's key in every item: it is not a field to ask for")
    return tuple(dict.fromkeys(fields))


def dataset_of(handle: Handle, query: str | None, fields: Sequence[str] | None) -> Dataset:
    """``Store.dataset`` (see there): the records of ``handle`` matching ``query``, resolved now
    against the version a pickled ``handle`` would come back at."""
    if query is not None and not isinstance(query, str):
        raise TypeError(
            f"a dataset's query is a str (the workers run it again), not {type(query).__name__}"
        )
    names = _fields_arg(fields)
    ds = Dataset(PinnedSource.of(handle, "dataset"), query, names)
    ds._state()  # resolves the keys
    return ds
