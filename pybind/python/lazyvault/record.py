"""``Record``: a lazy proxy of one stored object, and ``ArrayInfo``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from . import _arrays, _split

if TYPE_CHECKING:
    from ._source import Source
    from .store import Store


class ArrayInfo(NamedTuple):
    """What the index knows of one array payload, without opening it.

    ``shape``: one int per axis (``()`` for 0-d); ``dtype``: the numpy dtype
    (byte order included); ``nbytes``: data size in bytes (for an ``object``
    array, the size of its pickle); ``order``: ``"C"`` (row-major) or ``"F"``
    (Fortran, column-major), the memory order of the payload.
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


# Names the proxy itself uses; metadata fields with these names stay
# reachable as rec.meta[name] and arrays as rec.array(name).
_OWN = frozenset({"key", "meta", "arrays", "load", "array", "store"})


class Record:
    """A lazy proxy of the object stored under one key.

    Metadata attributes (``rec.temperature``) and ``.meta`` come straight from
    the index; ``.arrays`` describes the payloads without opening them; an
    array attribute (``rec.positions``) memory-maps its payload on first
    access and returns a read-only ``numpy.ndarray`` viewing the map (no
    copy), cached on the proxy. ``load()`` rebuilds the original object.
    """

    __slots__ = ("__weakref__", "_cache", "_key", "_pickle", "_record", "_source", "_store")

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
        self._store = store
        self._key = key
        self._record = record
        self._cache: dict[str, np.ndarray] = {}

    @property
    def key(self) -> str:
        """The key this record is stored under."""
        return self._key

    @property
    def store(self) -> Store | None:
        """The store this record was read from (``None`` for a record that
        travelled by pickle or comes from an archive)."""
        return self._store

    @property
    def meta(self) -> dict[str, Any]:
        """The JSON-able fields of the object, nested as in the object
        (arrays and non-JSON values are left out)."""
        return self._record["meta"]

    @property
    def arrays(self) -> dict[str, ArrayInfo]:
        """``{path: ArrayInfo}`` for every array payload, in the order they
        were found (``"image"``, ``"frames/0"``, ``"params/w"``)."""
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
        """The array stored at path ``name``, memory-mapped read-only.

        Raises ``KeyError`` if there is none, :class:`CorruptError` if its
        payload is missing or damaged, :class:`PickleNotAllowedError` for an
        ``object`` array when the store was opened without ``allow_pickle``.
        """
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        entry = self._record["arrays"].get(name)
        if entry is None:
            raise KeyError(f"record {self._key!r} has no array {name!r}")
        array = self._source.map_array(self._key, name, entry)
        self._cache[name] = array
        return array

    def load(self) -> Any:
        """The original object rebuilt: dicts, lists, tuples, dataclasses and
        class instances as they were, arrays memory-mapped read-only.

        Raises :class:`PickleNotAllowedError` when rebuilding needs unpickling
        (a class instance or a pickled remainder) and the store was opened
        without ``allow_pickle=True``.
        """
        return _split.join(
            self._record["layout"],
            self.array,
            self._remainder,
            self._source.allow_pickle,
            f"record {self._key!r}",
        )

    def ref(self) -> Any:
        """A small, picklable reference to this record (store path + record
        entry): another process maps the same payload files without opening
        the index. See :class:`lazyvault.RecordRef`."""
        from . import _pickling

        return _pickling.record_ref(self)

    def __reduce_ex__(self, protocol: int) -> Any:
        # By value (PEP 574: arrays out-of-band with protocol 5); across
        # multiprocessing, by reference (see _pickling).
        from . import _pickling

        return _pickling.reduce_record(self, protocol)

    def _remainder(self) -> bytes | None:
        """The pickled remainder of this record (read with it when it came
        from a store, so never the remainder of a record that replaced it)."""
        if not self._record.get("pickle"):
            return None
        if self._pickle is not None:
            return self._pickle
        return self._source.get_pickle(self._key)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: fields from the record.
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        record = self._record
        if name in record["arrays"]:
            return self.array(name)
        meta = record["meta"]
        if name in meta:
            return meta[name]
        raise AttributeError(f"record {self._key!r} has no field {name!r}")

    def __getitem__(self, name: str) -> Any:
        """An array by path (``rec["params/w"]``) or a metadata field."""
        if name in self._record["arrays"]:
            return self.array(name)
        try:
            return self._record["meta"][name]
        except KeyError:
            raise KeyError(f"record {self._key!r} has no field {name!r}") from None

    # Not a sequence: without this, Python would iterate via __getitem__(0).
    __iter__ = None

    def __contains__(self, name: object) -> bool:
        return name in self._record["arrays"] or name in self._record["meta"]

    def __dir__(self) -> list[str]:
        fields = [
            n
            for n in (*self._record["meta"], *self._record["arrays"])
            if n.isidentifier() and n not in _OWN
        ]
        return sorted(set(super().__dir__()) | set(fields))

    def __repr__(self) -> str:
        meta = ", ".join(f"{k}={v!r}" for k, v in list(self.meta.items())[:8])
        if len(self.meta) > 8:
            meta += ", ..."
        arrays = ", ".join(
            f"{n}: {info.dtype} {info.shape}" for n, info in list(self.arrays.items())[:8]
        )
        if len(self._record["arrays"]) > 8:
            arrays += ", ..."
        return f"<lazyvault.Record {self._key!r} meta({meta}) arrays({arrays})>"
