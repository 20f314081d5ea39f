"""Where a :class:`Record` (which only knows its key and record JSON) gets its arrays and pickled
remainder from: a store directory, arrays in memory, or a ``.lvz`` archive (``_archive``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from . import _arrays, _lazyvault
from .errors import CorruptError, PickleNotAllowedError


class Source(Protocol):
    """What a :class:`Record` needs from where it was read."""

    allow_pickle: bool

    def map_array(self, key: str, name: str, entry: dict[str, Any]) -> np.ndarray:
        """The array of ``entry`` (read-only, no copy where the source allows)."""

    def get_pickle(self, key: str) -> bytes | None:
        """The pickled remainder of ``key``, if any."""


def array_entry(entry: dict[str, Any]) -> _lazyvault.ArrayEntry:
    """The core's :class:`~lazyvault._lazyvault.ArrayEntry` of a record's array entry (a dict of its
    record JSON): what the core's payload readers take. Raises ``TypeError`` for an entry missing a
    field."""
    return _lazyvault.ArrayEntry(**entry)


def corrupt_array(e: CorruptError, key: str, name: str) -> CorruptError:
    """``e`` again, its message and attributes naming the record and array."""
    err = CorruptError(f"record {key!r} array {name!r}: {e}")
    err.key, err.array, err.path = key, name, e.path
    return err


def load_array(
    key: str,
    name: str,
    entry: dict[str, Any],
    allow_pickle: bool,
    read_bytes: Callable[[_lazyvault.ArrayEntry], bytes],
    map_buffer: Callable[[_lazyvault.ArrayEntry], object],
) -> np.ndarray:
    """The array ``name`` of record ``key`` from its ``entry`` (a dict of the record JSON), read
    with a source's core readers: ``read_bytes`` (the pickle of an ``object`` array, loaded only if
    ``allow_pickle``) or ``map_buffer`` (the data, ``None`` for 0 bytes). Raises
    ``PickleNotAllowedError``, and ``CorruptError`` naming the record and array."""
    core_entry = array_entry(entry)
    try:
        if entry.get("pickled"):
            if not allow_pickle:
                raise PickleNotAllowedError(
                    f"record {key!r} array {name!r} is an object array, stored as a pickle; "
                    "loading it can run arbitrary code: open the store with allow_pickle=True "
                    "if you trust it"
                )
            return _arrays.load_pickled(read_bytes(core_entry))
        buffer = map_buffer(core_entry)
    except CorruptError as e:
        raise corrupt_array(e, key, name) from e
    return _arrays.array_from_buffer(
        buffer, entry["descr"], tuple(entry["shape"]), entry["fortran_order"]
    )


class DirectorySource:
    """The payload files of the store directory ``root`` (records from ``Store``, and records passed
    by reference to other processes), read without the index: each array is checked against its
    record and read into memory (at most 64 KiB) or memory-mapped (larger)."""

    def __init__(
        self, root: str, allow_pickle: bool, get_pickle: Callable[[str], bytes | None]
    ) -> None:
        self.root = root
        self.allow_pickle = allow_pickle
        self._get_pickle = get_pickle

    def get_pickle(self, key: str) -> bytes | None:
        return self._get_pickle(key)

    def map_array(self, key: str, name: str, entry: dict[str, Any]) -> np.ndarray:
        return load_array(
            key,
            name,
            entry,
            self.allow_pickle,
            functools.partial(_lazyvault.read_array_bytes, self.root),
            functools.partial(_lazyvault.map_array, self.root),
        )


class MemorySource:
    """Arrays and remainders held in memory (a record unpickled by value).

    Unpickling already ran whatever the pickle asked for, so loading the record's own remainder is
    allowed by default.
    """

    def __init__(
        self, arrays: dict[str, np.ndarray], pickle: bytes | None, allow_pickle: bool = True
    ) -> None:
        self.arrays = arrays
        self.pickle = pickle
        self.allow_pickle = allow_pickle

    def get_pickle(self, key: str) -> bytes | None:
        return self.pickle

    def map_array(self, key: str, name: str, entry: dict[str, Any]) -> np.ndarray:
        try:
            return self.arrays[name]
        except KeyError:
            raise CorruptError(f"record {key!r} array {name!r}: not carried") from None
