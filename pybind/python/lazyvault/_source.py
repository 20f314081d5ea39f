"""Where a :class:`Record` (which only knows its key and record JSON) gets its arrays and pickled
remainder from: a store directory, arrays in memory, or a ``.lvz`` archive (``_archive``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

import numpy as np

from . import _arrays, _layout, _lazyvault
from .errors import CorruptError, PickleNotAllowedError


def text_path(path: Any, what: str) -> str:
    """``path`` (a str, bytes or ``os.PathLike`` of either) as text, as ``open()`` takes it
    (``os.fsdecode``). Raises ``ValueError`` naming ``what`` for a NUL byte, as ``open()``: no file
    can be named so; ``TypeError`` for anything else."""
    text = os.fsdecode(path)
    if "\0" in text:
        raise ValueError(f"embedded null byte in the {what} {text!r}")
    return text


class Trust(NamedTuple):
    """What ``load()`` may rebuild beyond JSON values and arrays: anything, unpickling included
    (``allow_pickle``), or else only instances of ``safe_classes`` (object nodes whose class is
    named ``module:qualname`` of one of them, rebuilt from that class object: nothing is imported).
    A handle's, carried along by its records (and their pickles: classes pickle by reference)."""

    allow_pickle: bool = False
    safe_classes: tuple[type, ...] = ()

    def by_name(self) -> dict[str, type]:
        """``{"module:qualname": class}`` of the safe classes."""
        return {_layout.class_name(cls): cls for cls in self.safe_classes}


def trust_of(allow_pickle: object, safe_classes: Iterable[type] = ()) -> Trust:
    """The :class:`Trust` of ``Store.open`` / ``loads`` arguments. Raises ``TypeError`` for an
    ``allow_pickle`` that is not True or False, for ``safe_classes`` that is not an iterable (a
    ``str`` neither) or holds something other than a class (named); ``ValueError`` for a class
    whose instances lazyvault does not store as plain state (``__slots__``, custom pickling, a
    C base such as ``dict``, a class defined in a function): those are pickled, so loading them
    needs ``allow_pickle``."""
    if type(allow_pickle) is not bool:
        raise TypeError(f"allow_pickle must be True or False, not {allow_pickle!r}")
    if isinstance(safe_classes, (str, bytes, type)) or not isinstance(safe_classes, Iterable):
        raise TypeError(f"safe_classes must be a list of classes, not {safe_classes!r}")
    classes = tuple(safe_classes)
    for cls in classes:
        if not isinstance(cls, type):
            raise TypeError(f"safe_classes holds {cls!r}, which is not a class")
        if not _layout.plain_state_type(cls):
            raise ValueError(
                f"safe_classes holds {_layout.class_name(cls)}, whose instances lazyvault stores "
                "as a pickle (its state is not a plain __dict__: __slots__, custom pickling, a C "
                "base class, or a class defined in a function): loading them needs allow_pickle"
            )
    return Trust(allow_pickle, tuple(dict.fromkeys(classes)))


#: No trust: neither unpickling nor any class (what a handle opened with no arguments has).
UNTRUSTED = Trust()
_TRUSTED = Trust(allow_pickle=True)


class Source(Protocol):
    """What a :class:`Record` needs from where it was read."""

    trust: Trust

    def map_array(self, key: str, name: str, entry: dict[str, Any]) -> np.ndarray:
        """The array of ``entry`` (read-only, no copy where the source allows)."""

    def get_pickle(self, key: str) -> bytes | None:
        """The pickled remainder of ``key``, if any."""


def array_entry(entry: dict[str, Any]) -> _lazyvault.ArrayEntry:
    """The core's :class:`~lazyvault._lazyvault.ArrayEntry` of a record's array entry (a dict of its
    record JSON): what the core's payload readers take. Raises ``TypeError`` for an entry missing a
    field."""
    return _lazyvault.ArrayEntry(**entry)


def corrupt_array(
    e: CorruptError,
    key: str,
    name: str,
    root: str | None = None,
    entry: dict[str, Any] | None = None,
) -> CorruptError:
    """``e`` again, its message and attributes naming the record and array; for a payload file of
    the store directory ``root`` that is missing, with the core's word on why (the store damaged,
    or ``entry`` read before its record was overwritten or deleted)."""
    text = f"record {key!r} array {name!r}: {e}"
    if root is not None and entry is not None and e.path and not os.path.exists(e.path):
        text += f"; {_lazyvault.missing_payload_hint(root, key, array_entry(entry))}"
    err = CorruptError(text)
    err.key, err.array, err.path = key, name, e.path
    return err


def load_array(
    key: str,
    name: str,
    entry: dict[str, Any],
    allow_pickle: bool,
    read_bytes: Callable[[_lazyvault.ArrayEntry], bytes],
    map_buffer: Callable[[_lazyvault.ArrayEntry], object],
    root: str | None = None,
) -> np.ndarray:
    """The array ``name`` of record ``key`` from its ``entry`` (a dict of the record JSON), read
    with a source's core readers: ``read_bytes`` (the pickle of an ``object`` array, loaded only if
    ``allow_pickle``) or ``map_buffer`` (the data, ``None`` for 0 bytes). Raises
    ``PickleNotAllowedError``, and ``CorruptError`` naming the record and array (and, for a
    missing payload file of the store directory ``root``, why: see :func:`corrupt_array`)."""
    core_entry = array_entry(entry)
    try:
        if entry.get("pickled"):
            if not allow_pickle:
                raise PickleNotAllowedError(
                    f"record {key!r} array {name!r} is an object array, stored as a pickle; "
                    "loading it can run arbitrary code: if you trust its source, pass "
                    "allow_pickle=True (Store.open, lazyvault.loads)"
                )
            return _arrays.load_pickled(read_bytes(core_entry))
        buffer = map_buffer(core_entry)
    except CorruptError as e:
        raise corrupt_array(e, key, name, root, entry) from e
    return _arrays.array_from_buffer(
        buffer, entry["descr"], tuple(entry["shape"]), entry["fortran_order"]
    )


class DirectorySource:
    """The payload files of the store directory ``root`` (records from ``Store``, and records passed
    by reference to other processes), read without the index: each array is checked against its
    record and read into memory (at most 64 KiB) or memory-mapped (larger). ``by_reference``: its
    records pickle by reference (``Record.ref()`` fields; those of a dask bag), not by value."""

    def __init__(
        self,
        root: str,
        trust: Trust,
        get_pickle: Callable[[str], bytes | None],
        by_reference: bool = False,
    ) -> None:
        self.root = root
        self.trust = trust
        self._get_pickle = get_pickle
        self.by_reference = by_reference

    def get_pickle(self, key: str) -> bytes | None:
        return self._get_pickle(key)

    def map_array(self, key: str, name: str, entry: dict[str, Any]) -> np.ndarray:
        return load_array(
            key,
            name,
            entry,
            self.trust.allow_pickle,
            functools.partial(_lazyvault.read_array_bytes, self.root),
            functools.partial(_lazyvault.map_array, self.root),
            self.root,
        )


class MemorySource:
    """Arrays and remainders held in memory (a record unpickled by value).

    Unpickling already ran whatever the pickle asked for, so loading the record's own remainder is
    allowed by default.
    """

    def __init__(
        self, arrays: dict[str, np.ndarray], pickle: bytes | None, trust: Trust = _TRUSTED
    ) -> None:
        self.arrays = arrays
        self.pickle = pickle
        self.trust = trust

    def get_pickle(self, key: str) -> bytes | None:
        return self.pickle

    def map_array(self, key: str, name: str, entry: dict[str, Any]) -> np.ndarray:
        try:
            return self.arrays[name]
        except KeyError:
            raise CorruptError(f"record {key!r} array {name!r}: not carried") from None
