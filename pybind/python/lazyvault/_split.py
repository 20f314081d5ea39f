"""Splitting an object into metadata, array payloads and a remainder, and
joining them back.

An object becomes:

- ``meta``: the JSON-able fields (what queries see), nested as in the object;
- ``arrays``: every numpy array anywhere in it, by path name
  (``"positions"``, ``"frames/0"``, ``"params/w"``); one array referenced
  twice is stored once and comes back as one object;
- ``layout``: a JSON tree that says how to rebuild the object (see
  ``schema/FORMAT.md``, "Layout");
- ``leftovers``: values JSON cannot hold (sets, complex numbers, custom
  objects with their own pickling), pickled apart from the JSON so scans
  never parse them. Arrays inside them still become payloads.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import math
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import CorruptError, LazyvaultError, PickleNotAllowedError

_MISSING = object()
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what serde_json holds exactly
_PICKLE_PROTOCOL = 5


@dataclasses.dataclass
class Split:
    """An object taken apart for storing."""

    meta: dict[str, Any]
    layout: Any
    arrays: dict[str, np.ndarray]
    leftovers: list[Any]

    def meta_json(self) -> str:
        return _ENCODER.encode(self.meta)

    def layout_json(self) -> str:
        return _ENCODER.encode(self.layout)


# One encoder for every record: json.dumps with options builds a new one
# per call, a measurable share of a metadata-only put.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def _join_path(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python, not in C


def _text_ok(text: str) -> bool:
    """Whether ``text`` is Unicode text JSON and UTF-8 can hold (no lone
    surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plain_state_class(value: Any) -> bool:
    """Whether ``value`` is an instance whose state is just its ``__dict__``
    (dataclasses and ordinary classes without custom pickling). Subclasses
    of C types (``list``, ``dict``, ``int``, ``np.ndarray``, ...) keep state
    outside ``__dict__``, so they are not."""
    cls = type(value)
    if not hasattr(value, "__dict__") or isinstance(value, type):
        return False
    if "<locals>" in cls.__qualname__ or cls.__module__ in (None, "builtins"):
        return False
    if getattr(cls, "__slots__", None):
        return False
    if any(not (base.__flags__ & _HEAPTYPE) for base in cls.__mro__ if base is not object):
        return False
    return (
        cls.__reduce_ex__ is object.__reduce_ex__
        and cls.__reduce__ is object.__reduce__
        and getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__
        and not hasattr(cls, "__setstate__")
        and all(type(k) is str and _text_ok(k) for k in vars(value))
    )


# Containers nested deeper than this go to the pickled remainder: each level
# costs two levels of layout JSON, and readers cap JSON nesting (serde_json
# at 128).
MAX_DEPTH = 32
# Only these become payloads; other ndarray subclasses (masked arrays,
# np.matrix, recarrays) carry state a .npy file cannot hold.
_PLAIN_ARRAY_TYPES = (np.ndarray, np.memmap)


class _Cycle(Exception):
    """A container reached from itself: restart, pickling it whole."""

    def __init__(self, container_id: int) -> None:
        self.container_id = container_id


class _Splitter:
    def __init__(self, pickle_whole: set[int] | None = None) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self._path_of_id: dict[int, str] = {}
        self._active: set[int] = set()  # containers on the current path
        self._pickle_whole = pickle_whole or set()

    def array_path(self, array: np.ndarray, path: str) -> str:
        known = self._path_of_id.get(id(array))
        if known is not None:
            return known
        name = path or "data"
        if name in self.arrays:
            n = 2
            while f"{name}~{n}" in self.arrays:
                n += 1
            name = f"{name}~{n}"
        self.arrays[name] = array  # keeps it alive, so ids stay unique
        self._path_of_id[id(array)] = name
        return name

    def walk(self, value: Any, path: str, leftovers: list[Any], depth: int = 0) -> tuple[Any, Any]:
        """Returns ``(layout node, meta value or _MISSING)``."""
        t = type(value)
        if value is None or t is bool:
            return value, value
        if t is str:
            if _text_ok(value):
                return value, value
        elif (t is dict or t is list or t is tuple or _plain_state_class(value)) and (
            depth < MAX_DEPTH and id(value) not in self._pickle_whole
        ):
            if id(value) in self._active:
                raise _Cycle(id(value))
            self._active.add(id(value))
            try:
                return self._walk_container(value, path, leftovers, depth + 1)
            finally:
                self._active.discard(id(value))
        if t is int:
            if _INT_MIN <= value <= _INT_MAX:
                return value, value
        elif t is float:
            if math.isfinite(value):
                return value, value
            return {"float": repr(value)}, _MISSING
        elif t in _PLAIN_ARRAY_TYPES:
            return {"array": self.array_path(value, path)}, _MISSING
        elif (
            isinstance(value, np.generic)
            and value.dtype.kind in "biuf"
            and (value.dtype.kind != "f" or (value.dtype.itemsize <= 8 and np.isfinite(value)))
        ):
            item = value.item()
            return {"scalar": [value.dtype.str, item]}, item
        leftovers.append((value, path))
        return {"pickle": len(leftovers) - 1}, _MISSING

    def _walk_container(
        self, value: Any, path: str, leftovers: list[Any], depth: int
    ) -> tuple[Any, Any]:
        t = type(value)
        if t is dict and all(type(k) is str and _text_ok(k) for k in value):
            nodes: dict[str, Any] = {}
            meta: dict[str, Any] = {}
            for k, v in value.items():
                node, m = self.walk(v, _join_path(path, k), leftovers, depth)
                nodes[k] = node
                if m is not _MISSING:
                    meta[k] = m
            return {"dict": nodes}, meta
        if t is list or t is tuple:
            nodes_l, metas, complete = [], [], True
            for i, v in enumerate(value):
                node, m = self.walk(v, _join_path(path, str(i)), leftovers, depth)
                nodes_l.append(node)
                if m is _MISSING:
                    complete = False
                else:
                    metas.append(m)
            return {("list" if t is list else "tuple"): nodes_l}, (metas if complete else _MISSING)
        if t is not dict:  # a plain-state instance
            nodes_o: dict[str, Any] = {}
            meta_o: dict[str, Any] = {}
            for k, v in vars(value).items():
                node, m = self.walk(v, _join_path(path, k), leftovers, depth)
                nodes_o[k] = node
                if m is not _MISSING:
                    meta_o[k] = m
            cls = type(value)
            return {
                "object": {"class": f"{cls.__module__}:{cls.__qualname__}", "state": nodes_o}
            }, meta_o
        leftovers.append((value, path))  # a dict whose keys are not all text
        return {"pickle": len(leftovers) - 1}, _MISSING

    def pickle_leftovers(self, leftovers: list[tuple[Any, str]]) -> bytes:
        """Pickles the leftover values one after the other with one pickler
        (its memo persists across ``dump`` calls, so values shared between
        leftovers stay shared). Arrays inside them become payloads named
        ``<path>/<n>`` (persistent ids), so the pickle holds no array data."""
        splitter = self
        buf = io.BytesIO()

        class _Pickler(pickle.Pickler):
            base = ""
            count = 0

            def persistent_id(self, obj: Any) -> Any:
                if type(obj) in _PLAIN_ARRAY_TYPES:
                    self.count += 1
                    return ("array", splitter.array_path(obj, f"{self.base}/{self.count}"))
                return None

        pickler = _Pickler(buf, protocol=_PICKLE_PROTOCOL)
        for value, path in leftovers:
            pickler.base, pickler.count = path or "data", 0
            pickler.dump(value)
        return buf.getvalue()


def split(obj: Any) -> tuple[Split, _Splitter]:
    """Takes ``obj`` apart (see the module docstring)."""
    pickle_whole: set[int] = set()
    while True:
        splitter = _Splitter(pickle_whole)
        leftovers: list[Any] = []
        try:
            layout, meta = splitter.walk(obj, "", leftovers)
            break
        except _Cycle as cycle:
            pickle_whole.add(cycle.container_id)
    if not isinstance(meta, dict):
        meta = {}
    result = Split(meta=meta, layout=layout, arrays={}, leftovers=leftovers)
    return result, splitter


def needs_pickle(layout: Any) -> str | None:
    """Why rebuilding ``layout`` needs unpickling (a class import or a
    pickled remainder), or ``None``. Walks node by node kind: the keys of a
    ``dict`` node are user keys, never node kinds."""
    stack = [layout]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue  # a JSON scalar
        ((kind, body),) = node.items()
        if kind == "object":
            return f"it rebuilds an instance of {body['class']}"
        if kind == "pickle":
            return "part of it is a pickled remainder"
        if kind == "dict":
            stack.extend(body.values())
        elif kind in ("list", "tuple"):
            stack.extend(body)
    return None


def _find_class(spec: str) -> type:
    module_name, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{spec} is not a class")
    return obj


def join(
    layout: Any,
    get_array: Callable[[str], np.ndarray],
    get_pickle: Callable[[], bytes | None],
    allow_pickle: bool,
    what: str,
) -> Any:
    """Rebuilds the object described by ``layout``.

    ``get_array(path)`` returns the (memory-mapped) array of a path;
    ``get_pickle()`` the pickled remainder. Raises
    :class:`PickleNotAllowedError` if rebuilding needs unpickling and
    ``allow_pickle`` is false.
    """
    if not allow_pickle:
        reason = needs_pickle(layout)
        if reason is not None:
            raise PickleNotAllowedError(
                f"{what}: loading it needs unpickling ({reason}), which can run arbitrary "
                "code; open the store with allow_pickle=True if you trust it. Its metadata "
                "and arrays stay readable without it (.meta, .arrays)."
            )
    arrays: dict[str, np.ndarray] = {}
    leftovers: list[Any] | None = None

    def array(path: str) -> np.ndarray:
        if path not in arrays:
            arrays[path] = get_array(path)
        return arrays[path]

    def leftover(i: int) -> Any:
        nonlocal leftovers
        if leftovers is None:
            data = get_pickle()
            if data is None:
                raise PickleNotAllowedError(f"{what}: its pickled remainder is missing")

            class _Unpickler(pickle.Unpickler):
                def persistent_load(self, pid: Any) -> Any:
                    kind, path = pid
                    if kind != "array":
                        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
                    return array(path)

            stream = io.BytesIO(data)
            unpickler = _Unpickler(stream)
            leftovers = []
            while stream.tell() < len(data):
                leftovers.append(unpickler.load())
        return leftovers[i]

    def build(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        ((kind, body),) = node.items()
        if kind == "dict":
            return {k: build(v) for k, v in body.items()}
        if kind == "list":
            return [build(v) for v in body]
        if kind == "tuple":
            return tuple(build(v) for v in body)
        if kind == "array":
            return array(body)
        if kind == "float":
            return float(body)
        if kind == "scalar":
            return np.dtype(body[0]).type(body[1])
        if kind == "pickle":
            return leftover(body)
        if kind == "object":
            cls: Any = _find_class(body["class"])
            obj = cls.__new__(cls)
            obj.__dict__.update(build({"dict": body["state"]}))
            return obj
        raise ValueError(f"{what}: unknown layout node {kind!r}")

    try:
        return build(layout)
    except LazyvaultError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, EOFError) as e:
        # a layout or remainder that does not describe an object: damage
        # (or a class that changed since it was stored)
        raise CorruptError(f"{what}: cannot rebuild the object: {e!r}") from e
