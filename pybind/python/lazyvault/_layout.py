"""The object layout (schema/FORMAT.md, "Layout"), the one module that walks layouts: an object
split into ``meta`` (its JSON-able fields, what queries see), ``arrays`` (every numpy array in it by
path name, ``"frames/0"``; one array referenced twice is stored once and comes back as one object),
``layout`` (the JSON tree that rebuilds it; for a dict of values held whole in ``meta`` and arrays
at their own names, the compact ``{"fields": ...}``, rebuilt from ``meta`` and ``arrays``) and
``leftovers`` (values JSON cannot hold, pickled apart so scans never parse them; arrays inside them
still become payloads); a layout read back checked by :func:`scan` (a malformed one raises
:class:`CorruptError`; the same walk tells what needs ``allow_pickle``); the parts joined into the
object again.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import json
import math
import pickle
import re
from collections.abc import Callable, Collection, Container
from typing import Any, NamedTuple

import numpy as np

from . import _arrays, _lazyvault, _tagged
from .errors import CorruptError, LazyvaultError, PickleNotAllowedError

_MISSING = _tagged.MISSING
_INT_MIN, _INT_MAX = _tagged.INT_MIN, _tagged.INT_MAX
_PICKLE_PROTOCOL = 5


@dataclasses.dataclass
class Split:
    """An object taken apart for storing."""

    meta: dict[str, Any]
    layout: Any
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


_SURROGATE = re.compile("[\ud800-\udfff]")
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python, not in C


def text_ok(text: str) -> bool:
    """Whether ``text`` is Unicode text JSON and UTF-8 can hold (no lone surrogates)."""
    return text.isascii() or _SURROGATE.search(text) is None


def _plain_state_class(value: Any) -> bool:
    """Whether ``value`` is an instance whose state is just its ``__dict__`` (dataclasses and
    ordinary classes without custom pickling). Subclasses of C types (``list``, ``dict``, ``int``,
    ``np.ndarray``, ...) keep state outside ``__dict__``, so they are not."""
    return (
        hasattr(value, "__dict__")
        and not isinstance(value, type)
        and plain_state_type(type(value))
        and all(type(k) is str and text_ok(k) for k in vars(value))
    )


def plain_state_type(cls: type) -> bool:
    """Whether instances of ``cls`` may be stored as plain state (see :func:`_plain_state_class`),
    as far as the class tells: what ``safe_classes`` must be."""
    return (
        "<locals>" not in cls.__qualname__
        and cls.__dictoffset__ != 0  # instances have a __dict__
        and cls.__module__ not in (None, "builtins")
        and not getattr(cls, "__slots__", None)
        and all(base.__flags__ & _HEAPTYPE for base in cls.__mro__ if base is not object)
        and cls.__reduce_ex__ is object.__reduce_ex__
        and cls.__reduce__ is object.__reduce__
        and getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__
        and not hasattr(cls, "__setstate__")
    )


# Containers nested deeper than this go to the pickled remainder: each level
# costs two levels of layout JSON, and readers cap JSON nesting (serde_json
# at 128).
MAX_DEPTH = 32
# Only these become payloads as they are; masked arrays become a ``masked``
# node (their data and mask payloads), and inside the pickled remainder other
# ndarray subclasses (np.matrix, recarrays) become a payload of their plain
# view plus their class (see pickle_leftovers).
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
        self._masked: dict[int, dict[str, Any]] = {}  # id of a masked array -> its node body

    def array_path(self, array: np.ndarray, path: str) -> str:
        known = self._path_of_id.get(id(array))
        if known is not None:
            return known
        name = base = path or "data"
        n = 1
        while name in self.arrays:
            n += 1
            name = f"{base}~{n}"
        self.arrays[name] = array  # keeps it alive, so ids stay unique
        self._path_of_id[id(array)] = name
        return name

    def walk(self, value: Any, path: str, leftovers: list[Any], depth: int = 0) -> tuple[Any, Any]:
        """Returns ``(layout node, meta value or _MISSING)``."""
        t = type(value)
        if value is None or t is bool:
            return value, value
        if t is str:
            if text_ok(value):
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
        if t is float:
            if math.isfinite(value):
                return value, value
        elif t is int:
            if _INT_MIN <= value <= _INT_MAX:
                return value, value
        elif t in _PLAIN_ARRAY_TYPES:
            return {"array": self.array_path(value, path)}, _MISSING
        elif t is np.ma.MaskedArray and value.baseclass is np.ndarray:
            return {"masked": self.masked_body(value, path)}, _MISSING
        leaf = _tagged.json_leaf(value, t)  # a tagged value, the same in meta and layout
        if leaf is not _MISSING:
            return leaf, leaf
        leftovers.append((value, path))
        return {"pickle": len(leftovers) - 1}, _MISSING

    def masked_body(self, value: Any, path: str) -> dict[str, Any]:
        """The body of a ``masked`` node: its data and mask (``None`` for ``nomask``) as array
        paths ``<path>`` and ``<path>/mask``, its fill value (``None`` for numpy's default; a
        ``$numpy`` tagged value, a text, or a 0-d array ``<path>/fill_value``) and whether its mask
        is hard. One masked array met twice gives the same body."""
        known = self._masked.get(id(value))
        if known is not None:
            return known
        base = path or "data"
        mask = np.ma.getmask(value)
        fill = np.asarray(value.fill_value, dtype=value.dtype)  # a 0-d array
        default = np.asarray(np.ma.default_fill_value(value), dtype=value.dtype)
        fill_node: Any = None
        if fill.tobytes() != default.tobytes():
            item = fill[()]
            leaf = _tagged.json_leaf(item, type(item)) if isinstance(item, np.generic) else _MISSING
            if type(leaf) is dict and "$numpy" in leaf:
                fill_node = leaf
            elif isinstance(item, np.str_) and text_ok(str(item)):
                fill_node = str(item)
            else:
                fill_node = {"array": self.array_path(fill, f"{base}/fill_value")}
        body = {
            "data": {"array": self.array_path(value.view(np.ndarray), path)},
            "mask": None
            if mask is np.ma.nomask
            else {"array": self.array_path(mask, f"{base}/mask")},
            "fill_value": fill_node,
            "hard_mask": bool(value.hardmask),
        }
        self._masked[id(value)] = body
        return body

    def _walk_fields(
        self, fields: dict[str, Any], path: str, leftovers: list[Any], depth: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(nodes, meta)`` of the values of a dict or an instance's state."""
        nodes: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        for k, v in fields.items():
            nodes[k], m = self.walk(v, _join_path(path, k), leftovers, depth)
            if m is not _MISSING:
                meta[k] = m
        if len(meta) == 1 and next(iter(meta)).startswith("$"):
            meta = {"$dict": meta}  # escaped: never read as a tagged value
        return nodes, meta

    def _walk_container(
        self, value: Any, path: str, leftovers: list[Any], depth: int
    ) -> tuple[Any, Any]:
        t = type(value)
        if t is dict and all(type(k) is str and text_ok(k) for k in value):
            nodes, meta = self._walk_fields(value, path, leftovers, depth)
            return {"dict": nodes}, meta
        if t is list or t is tuple:
            pairs = [
                self.walk(v, _join_path(path, str(i)), leftovers, depth)
                for i, v in enumerate(value)
            ]
            metas: Any = [m for _, m in pairs]
            if any(m is _MISSING for m in metas):
                metas = _MISSING
            elif t is tuple:
                metas = {"$tuple": metas}
            return {("list" if t is list else "tuple"): [node for node, _ in pairs]}, metas
        if t is not dict:  # a plain-state instance
            state, meta = self._walk_fields(vars(value), path, leftovers, depth)
            spec = class_name(t)
            return {"object": {"class": spec, "state": state}}, meta
        leftovers.append((value, path))  # a dict whose keys are not all text
        return {"pickle": len(leftovers) - 1}, _MISSING

    def pickle_leftovers(self, leftovers: list[tuple[Any, str]], what: str = "the object") -> bytes:
        """Pickles the leftover values one after the other with one pickler (its memo persists
        across ``dump`` calls, so values shared between leftovers stay shared). Arrays inside them
        become payloads named ``<path>/<n>`` (persistent ids), so the pickle holds no array data:
        plain arrays; masked arrays (their data, mask and fill value, as a ``masked`` node); other
        ndarray subclasses whose pickling is numpy's (``np.matrix``, ``np.recarray``: their plain
        view, class and ``__dict__``); and every out-of-band buffer (``pickle.PickleBuffer``, PEP
        574: pyarrow buffers, ...) as raw bytes. Raises ``pickle.PicklingError`` naming ``what``
        (the record) and the field when a value cannot be pickled."""
        splitter = self
        buf = io.BytesIO()
        seen: dict[int, tuple[Any, Any]] = {}  # id -> (persistent id, the object, kept alive)

        class _Pickler(pickle.Pickler):
            base = ""
            count = 0

            def name(self) -> str:
                self.count += 1
                return f"{self.base}/{self.count}"

            def persistent_id(self, obj: Any) -> Any:
                t = type(obj)
                if t in _PLAIN_ARRAY_TYPES:
                    return ("array", splitter.array_path(obj, self.name()))
                if not (isinstance(obj, np.ndarray) or t is pickle.PickleBuffer):
                    return None
                known = seen.get(id(obj))
                if known is not None:
                    return known[0]
                pid: Any = None
                if t is np.ma.MaskedArray and obj.baseclass is np.ndarray:
                    pid = ("masked", splitter.masked_body(obj, self.name()))
                elif t is pickle.PickleBuffer:
                    try:
                        raw = obj.raw()
                    except BufferError:  # not contiguous: pickled in-band
                        return None
                    data = np.frombuffer(raw, dtype=np.uint8)  # no copy
                    pid = ("buffer", splitter.array_path(data, self.name()), raw.readonly)
                elif (
                    isinstance(obj, np.ndarray)
                    and t.__reduce__ is np.ndarray.__reduce__
                    and t.__reduce_ex__ is np.ndarray.__reduce_ex__
                    and getattr(t, "__setstate__", None) is np.ndarray.__setstate__
                ):
                    path = splitter.array_path(obj.view(np.ndarray), self.name())
                    pid = ("view", path, t, getattr(obj, "__dict__", None) or None)
                if pid is not None:
                    seen[id(obj)] = (pid, obj)
                return pid

        pickler = _Pickler(buf, protocol=_PICKLE_PROTOCOL)
        for value, path in leftovers:
            pickler.base, pickler.count = path or "data", 0
            try:
                pickler.dump(value)
            except Exception as e:
                field = f"field {path!r}" if path else "the object"
                raise pickle.PicklingError(
                    f"{what}: cannot pickle {field} ({type(value).__name__}): {e}"
                ) from e
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
    if not isinstance(meta, dict) or (len(meta) == 1 and _tagged_not_dict(meta)):
        meta = {}  # not a dict or an instance (a tuple, a tagged scalar...)
    return Split(meta, layout, leftovers), splitter


def _tagged_not_dict(meta: dict[str, Any]) -> bool:
    """Whether the one-member ``meta`` is a tagged value other than an escaped dict."""
    name = next(iter(meta))
    return name.startswith("$") and name != "$dict"


def encode(
    obj: Any, key: str | None = None
) -> tuple[str, str, list[tuple[Any, ...]], bytes | None]:
    """``obj`` as the core's ``put`` (and ``dumps_archive``) take it after the key: ``(meta_json,
    layout_json, payload args, pickled remainder or None)``. Raises ``pickle.PicklingError`` naming
    the record ``key`` and the field for a value that cannot be pickled."""
    if type(obj) is dict:
        flat = _encode_flat(obj)
        if flat is not None:
            return flat
    return encode_generic(obj, key)


def put_args(obj: Any, key: str) -> tuple[Any, ...]:
    """What the core's ``put_many`` takes for ``obj`` after its ``key``: ``(Encoded,)`` when the
    Rust encoder covers it (``_lazyvault.encode_flat``: a dict of JSON scalars, naive or UTC
    datetimes, dates and plain numeric arrays, the same record as :func:`encode` gives, which tests
    check), else :func:`encode`'s four parts. Raises as :func:`encode`."""
    encoded = _lazyvault.encode_flat(obj)
    if encoded is not None:
        return (encoded,)
    return encode(obj, key)


def encode_generic(
    obj: Any, key: str | None = None, compact: bool = True
) -> tuple[str, str, list[tuple[Any, ...]], bytes | None]:
    """:func:`encode` by the generic walk (:func:`split`), for every object; with ``compact``
    false, never the ``fields`` layout (what writers before format 1.5 wrote)."""
    parts, splitter = split(obj)
    # before listing the arrays: arrays inside leftovers become payloads too
    what = "the object" if key is None else f"record {key!r}"
    pickled = splitter.pickle_leftovers(parts.leftovers, what) if parts.leftovers else None
    arrays = [_arrays.payload_args(name, a) for name, a in splitter.arrays.items()]
    if compact and not parts.leftovers:
        fields = fields_json(parts.layout)
        if fields is not None:
            return parts.meta_json(), fields, arrays, pickled
    return parts.meta_json(), parts.layout_json(), arrays, pickled


def fields_json(layout: Any) -> str | None:
    """The JSON text of the ``fields`` layout (schema/FORMAT.md, "Layout") that rebuilds what the
    full ``layout`` does, or ``None`` when there is none: ``layout`` must be a ``dict`` node each
    of whose entries is an ``array`` node named as the entry or a value held whole in ``meta``
    (JSON scalars, tagged leaves, and dict, list and tuple nodes of them only), which decoding
    ``meta`` rebuilds."""
    if type(layout) is not dict or len(layout) != 1 or type(layout.get("dict")) is not dict:
        return None
    arrays_yet = interleaved = False
    for name, node in layout["dict"].items():
        if type(node) is dict and node == {"array": name}:
            arrays_yet = True
        elif _held_whole(node):
            interleaved = interleaved or arrays_yet
        else:
            return None
    return _fields_json(tuple(layout["dict"]) if interleaved else None)


def _held_whole(node: Any) -> bool:
    """Whether the layout ``node`` rebuilds just what decoding its ``meta`` value gives."""
    if type(node) is not dict:
        return True  # a JSON scalar (the walk writes no JSON array as a node)
    ((kind, body),) = node.items()
    if kind == "dict":
        return all(_held_whole(v) for v in body.values())
    if kind == "list" or kind == "tuple":
        return all(_held_whole(v) for v in body)
    return kind in _tagged.LEAF_TAGS


# field names -> the compact layout's JSON text: records of one shape share it
_FIELDS_JSON: dict[tuple[str, ...], str] = {}
_FIELDS_IN_ORDER = '{"fields": null}'


def _fields_json(names: tuple[str, ...] | None) -> str:
    """``{"fields": names}``; ``names`` ``None`` (``null``): meta's fields, then the arrays."""
    if names is None:
        return _FIELDS_IN_ORDER
    text = _FIELDS_JSON.get(names)
    if text is None:
        text = _ENCODER.encode({"fields": names})
        if len(_FIELDS_JSON) >= 1024:
            _FIELDS_JSON.clear()
        _FIELDS_JSON[names] = text
    return text


# Types whose values are tagged leaves (or the pickled remainder) whatever the walk: C types
# (never plain-state instances, no __dict__) that json_leaf knows; filled in as met.
_LEAF_TYPES: dict[type, bool] = {datetime.datetime: True, datetime.date: True}


def _leaf_type(t: type) -> bool:
    known = _LEAF_TYPES.get(t)
    if known is None:
        known = _LEAF_TYPES[t] = issubclass(t, np.generic) and not t.__flags__ & _HEAPTYPE
    return known


def _encode_flat(
    obj: dict[Any, Any],
) -> tuple[str, str, list[tuple[Any, ...]], bytes | None] | None:
    """:func:`encode_generic` of the common object, a dict whose values are JSON scalars, tagged
    leaves (datetimes, numpy scalars...) and plain arrays, without the generic walk: the same
    output byte for byte (tests compare them), or ``None`` for any other object (nested containers,
    values for the pickled remainder, an empty key, texts with lone surrogates), which takes the
    generic walk."""
    nodes: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    arrays: list[tuple[Any, ...]] = []
    array_path: dict[int, str] | None = None  # id -> path, once there is an array
    compact = True  # no array met twice: the fields layout rebuilds it (see fields_json)
    interleaved = False  # a metadata field after an array: the fields layout lists names
    for k, v in obj.items():
        if type(k) is not str or not k or not (k.isascii() or text_ok(k)):
            return None
        t = type(v)
        if v is None or t is bool:
            pass
        elif t is str:
            if not (v.isascii() or text_ok(v)):
                return None
        elif t is float:
            if not math.isfinite(v):
                v = _tagged.json_leaf(v, t)
        elif t is int:
            if not _INT_MIN <= v <= _INT_MAX:
                v = _tagged.json_leaf(v, t)
                if v is _MISSING:
                    return None
        elif t in _PLAIN_ARRAY_TYPES:
            if array_path is None:
                array_path = {}
            path = array_path.get(id(v))
            if path is None:  # keys are distinct and not empty: no collision, no "data"
                path = array_path[id(v)] = k
                arrays.append(_arrays.payload_args(k, v))
            else:
                compact = False
            nodes[k] = {"array": path}
            continue
        elif _leaf_type(t):
            v = _tagged.json_leaf(v, t)
            if v is _MISSING:
                return None
        else:
            return None
        nodes[k] = meta[k] = v
        if array_path is not None:
            interleaved = True
    if len(meta) == 1 and next(iter(meta)).startswith("$"):
        meta = {"$dict": meta}
    if compact:
        layout = _fields_json(tuple(nodes) if interleaved else None)
    else:
        layout = _ENCODER.encode({"dict": nodes})
    return _ENCODER.encode(meta), layout, arrays, None


# -- reading a layout back ------------------------------------------------------


class Scan(NamedTuple):
    """What :func:`scan` found in a layout."""

    problem: str | None  # why it is malformed (the first thing found), or None
    needs_pickle: str | None  # why rebuilding it needs unpickling, or None
    # the classes outside ``safe`` it imports, when those are all it needs unpickling for
    untrusted: tuple[str, ...] = ()


# The 1.2 writer's leaf nodes, read as the tagged values that replaced them (same bodies).
_OLD_LEAVES = {"float": "$float", "scalar": "$numpy"}
# What rebuilding a damaged layout or remainder raises (join turns it into CorruptError).
_DAMAGE = (ValueError, TypeError, LookupError, AttributeError, EOFError, OverflowError, ImportError)


def scan(
    layout: Any, array_paths: Container[str], remainder: bool, safe: Container[str] = ()
) -> Scan:
    """Checks ``layout`` node by node against schema/FORMAT.md, "Layout": known node kinds of one
    member each with well-formed bodies, ``array`` nodes naming one of ``array_paths``, ``pickle``
    nodes only when the record has a pickled ``remainder``. On the way it notes the first node that
    needs unpickling (an ``object`` node imports a class, unless ``safe`` holds its name; a
    ``pickle`` node unpickles). The keys of a ``dict`` node are user keys, never node kinds."""
    needs: str | None = None
    untrusted: dict[str, None] = {}  # object nodes' classes outside safe, in order
    pickled = False
    stack = [layout]
    while stack:
        node = stack.pop()
        t = type(node)
        if t is dict:
            if len(node) != 1:
                return Scan(f"a node has {len(node)} members, not one", needs)
            ((kind, body),) = node.items()
            b = type(body)
            if kind == "dict" and b is dict:
                stack.extend(body.values())
            elif (kind == "list" or kind == "tuple") and b is list:
                stack.extend(body)
            elif kind == "array" and b is str:
                if body not in array_paths:
                    return Scan(f"{{'array': {body!r}}} names no array of the record", needs)
            elif kind == "object" and b is dict and _class_spec_ok(body.get("class")):
                state = body.get("state")
                if type(state) is not dict:
                    return Scan(f"the object node of {body['class']} has no state dict", needs)
                if body["class"] not in safe:
                    needs = needs or f"it rebuilds an instance of {body['class']}"
                    untrusted[body["class"]] = None
                stack.extend(state.values())
            elif kind == "masked":
                bad = _masked_problem(body, array_paths)
                if bad is not None:
                    return Scan(f"a 'masked' node {bad}: {_cut(body)}", needs)
            elif kind == "pickle" and b is int and body >= 0:
                if not remainder:
                    return Scan(f"{node!r} but the record has no pickled remainder", needs)
                needs = needs or "part of it is a pickled remainder"
                pickled = True
            elif kind in _tagged.LEAF_TAGS or kind in _OLD_LEAVES:
                try:
                    _tagged.decode_tag(_OLD_LEAVES.get(kind, kind), body)
                except _DAMAGE:
                    return Scan(f"a {kind!r} node holds {_cut(body)}", needs)
            elif kind in ("dict", "list", "tuple", "array", "float", "scalar", "object", "pickle"):
                return Scan(f"a {kind!r} node holds {_cut(body)}", needs)
            else:
                return Scan(f"unknown node kind {_cut(kind)}", needs)
        elif t is float:
            if not math.isfinite(node):
                return Scan(f"a non-finite JSON number {node!r}", needs)
        elif t is int:
            if not _INT_MIN <= node <= _INT_MAX:
                return Scan(f"the integer {node} is out of range", needs)
        elif not (node is None or t is bool or t is str):
            # a JSON array (a list is {"list": [...]}), or not JSON at all
            return Scan(f"a {t.__name__} where a node belongs: {_cut(node)}", needs)
    return Scan(None, needs, () if pickled else tuple(untrusted))


def problem(layout: Any, array_paths: Container[str], remainder: bool = False) -> str | None:
    """Why ``layout`` is malformed (see :func:`scan`), or ``None``: for readers that report it their
    own way (an npz manifest's layout, which comes without a pickled remainder, is an
    ``InvalidFileError``)."""
    return scan(layout, array_paths, remainder).problem


_cut = _tagged.cut


_MASKED_KEYS = {"data", "mask", "fill_value", "hard_mask"}


def _masked_problem(body: Any, array_paths: Container[str]) -> str | None:
    """What is wrong with a ``masked`` node's body, or ``None``: ``data`` an ``array`` node,
    ``mask`` one or null, ``fill_value`` null, a text, a ``$numpy`` value or an ``array`` node,
    ``hard_mask`` a bool; array nodes name arrays of ``array_paths``."""
    if type(body) is not dict or body.keys() != _MASKED_KEYS:
        return f"needs exactly the members {sorted(_MASKED_KEYS)}"
    for part in ("data", "mask", "fill_value"):
        node = body[part]
        if (node is None and part != "data") or (type(node) is str and part == "fill_value"):
            continue
        if part == "fill_value" and type(node) is dict and list(node) == ["$numpy"]:
            try:
                _tagged.decode_tag("$numpy", node["$numpy"])
            except _DAMAGE:
                return "has a malformed $numpy fill_value"
            continue
        if type(node) is not dict or list(node) != ["array"] or type(node["array"]) is not str:
            return f"has a {part} that is not an array node"
        if node["array"] not in array_paths:
            return f"names no array of the record ({node['array']!r})"
    if type(body["hard_mask"]) is not bool:
        return "has a hard_mask that is not a bool"
    return None


def masked_pairs(layout: Any, array_paths: Collection[str]) -> list[tuple[str, str]]:
    """``(data path, mask path)`` of every masked array of a record: its ``masked`` layout nodes
    with a mask, and inside the pickled remainder (whose masked arrays the layout does not show)
    each array ``p`` not named by the layout that has an array ``p/mask`` beside it."""
    if type(layout) is dict and "fields" in layout:
        return []  # no masked array, no pickled remainder
    pairs: list[tuple[str, str]] = []
    named: set[str] = set()
    stack = [layout]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            for kind, body in node.items():
                if kind == "masked" and type(body) is dict:
                    data, mask = body.get("data"), body.get("mask")
                    if type(data) is dict and type(mask) is dict:
                        pairs.append((str(data.get("array")), str(mask.get("array"))))
                if kind == "array" and type(body) is str:
                    named.add(body)
                stack.append(body)
        elif type(node) is list:
            stack.extend(node)
    named.update(p for pair in pairs for p in pair)
    return pairs + [
        (p, f"{p}/mask") for p in array_paths if p not in named and f"{p}/mask" in array_paths
    ]


def class_name(cls: type) -> str:
    """``"module:qualname"``: how an ``object`` node names the class of an instance. A class of the
    main script is ``__main__`` also where multiprocessing's spawn and forkserver workers import
    that script as ``__mp_main__`` (aliased as ``__main__``): every process names it alike."""
    module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
    return f"{module}:{cls.__qualname__}"


def _class_spec_ok(spec: Any) -> bool:
    """``"<module>:<qualname>"`` (whether it names a class shows at import)."""
    if type(spec) is not str:
        return False
    module, sep, qualname = spec.partition(":")
    return bool(module and sep and qualname)


def _find_class(spec: str) -> type:
    module_name, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{spec} is not a class")
    return obj


def fields_problem(names: Any, decoded: dict[str, Any], array_paths: Collection[str]) -> str | None:
    """Why the body of a ``fields`` layout is malformed, or ``None``: no name is both a field of
    the decoded ``meta`` and an array path, and ``names`` is ``None`` or lists, once each, every
    field and every array path."""
    if names is not None and (type(names) is not list or not all(type(n) is str for n in names)):
        return f"a 'fields' node holds {_cut(names)}, not a list of names or null"
    both = next((n for n in decoded if n in array_paths), None)
    if both is not None:
        return f"{both!r} is both a metadata field and an array"
    if names is None:
        return None
    listed = set(names)
    if len(listed) != len(names):
        return "a 'fields' node lists a name twice"
    missing = next((n for n in (*decoded, *array_paths) if n not in listed), None)
    if missing is not None:
        return f"the 'fields' node leaves out {missing!r}"
    extra = next((n for n in names if n not in decoded and n not in array_paths), None)
    if extra is not None:
        return f"the 'fields' node names {extra!r}, neither a metadata field nor an array"
    return None


def _join_fields(
    names: Any,
    meta: dict[str, Any],
    get_array: Callable[[str], np.ndarray],
    array_paths: Collection[str],
    what: str,
) -> dict[str, Any]:
    """The dict a ``fields`` layout rebuilds: in the order of ``names`` (``None``: the decoded
    metadata fields, then the arrays), each array path's array or the decoded metadata field
    (decoded afresh: the object shares nothing with ``Record.meta``)."""
    try:
        decoded = _tagged.decode_meta(meta, strict=True)
    except _DAMAGE as e:
        raise CorruptError(f"{what}: malformed layout: {e}") from e
    bad = fields_problem(names, decoded, array_paths)
    if bad is not None:
        raise CorruptError(f"{what}: malformed layout: {bad}")
    try:
        if names is None:
            return {**decoded, **{p: get_array(p) for p in array_paths}}
        return {n: get_array(n) if n in array_paths else decoded[n] for n in names}
    except LazyvaultError:
        raise
    except _DAMAGE as e:
        raise CorruptError(f"{what}: cannot rebuild the object: {e!r}") from e


def join(
    layout: Any,
    get_array: Callable[[str], np.ndarray],
    get_pickle: Callable[[], bytes | None],
    allow_pickle: bool,
    what: str,
    *,
    array_paths: Collection[str],
    remainder: bool,
    safe_classes: dict[str, type] | None = None,
    meta: dict[str, Any] | None = None,
) -> Any:
    """Rebuilds the object described by ``layout``.

    ``get_array(path)`` returns the (memory-mapped) array of a path; ``get_pickle()`` the pickled
    remainder; ``array_paths``, ``remainder`` and ``meta`` are the arrays, whether there is a
    remainder and the (raw) metadata, as the record says; ``safe_classes``: ``{"module:qualname":
    class}``, the classes whose instances are rebuilt from that class (nothing imported) without
    ``allow_pickle``. Checks the whole layout first (:func:`scan`). Raises :class:`CorruptError`
    for a malformed layout or one that does not describe an object, :class:`PickleNotAllowedError`
    if rebuilding needs unpickling (a pickled remainder, a class outside ``safe_classes``) and
    ``allow_pickle`` is false.
    """
    if type(layout) is dict and len(layout) == 1 and "fields" in layout:
        return _join_fields(layout["fields"], meta or {}, get_array, array_paths, what)
    safe_classes = safe_classes or {}
    found = scan(layout, array_paths, remainder, safe_classes)
    if found.problem is not None:
        raise CorruptError(f"{what}: malformed layout: {found.problem}")
    if not allow_pickle and found.needs_pickle is not None:
        if found.untrusted:
            names = ", ".join(name.partition(":")[2] for name in found.untrusted)
            raise PickleNotAllowedError(
                f"{what}: loading it rebuilds instances of {', '.join(found.untrusted)}, not "
                "in safe_classes; importing a class can run arbitrary code. If you trust the "
                f"class, list it: Store.open(..., safe_classes=[{names}]) (lazyvault.loads "
                "too); if you trust its source, pass allow_pickle=True there. Its metadata "
                "and arrays stay readable without either (.meta, .arrays)."
            )
        raise PickleNotAllowedError(
            f"{what}: loading it needs unpickling ({found.needs_pickle}), which can run "
            "arbitrary code; if you trust its source, pass allow_pickle=True (Store.open, "
            "lazyvault.loads). Its "
            "metadata and arrays stay readable without it (.meta, .arrays)."
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
                raise CorruptError(f"{what}: its pickled remainder is missing")

            class _Unpickler(pickle.Unpickler):
                def persistent_load(self, pid: Any) -> Any:
                    kind = pid[0] if type(pid) is tuple and pid else None
                    if kind == "array" and len(pid) == 2:
                        return array(pid[1])
                    if kind == "masked" and len(pid) == 2:
                        if _masked_problem(pid[1], array_paths) is None:
                            return masked(pid[1])
                    elif kind == "view" and len(pid) == 4 and isinstance(pid[2], type):
                        view: Any = array(pid[1]).view(pid[2])
                        if pid[3]:
                            view.__dict__.update(pid[3])
                        return view
                    elif kind == "buffer" and len(pid) == 3:
                        data = array(pid[1])
                        return data.data if pid[2] else bytearray(data)
                    raise pickle.UnpicklingError(f"unknown persistent id {_cut(pid)}")

            stream = io.BytesIO(data)
            unpickler = _Unpickler(stream)
            leftovers = []
            while stream.tell() < len(data):
                leftovers.append(unpickler.load())
        return leftovers[i]

    masks: dict[str, np.ma.MaskedArray] = {}

    def masked(body: dict[str, Any]) -> np.ma.MaskedArray:
        """A ``masked`` node's array over the mapped data and mask (one per data payload)."""
        path = body["data"]["array"]
        if path not in masks:
            mask = body["mask"]
            fill = body["fill_value"]
            data = array(path)
            mask_array = np.ma.nomask if mask is None else array(mask["array"])
            if mask is not None and (
                mask_array.shape != data.shape
                or mask_array.dtype != np.ma.make_mask_descr(data.dtype)
            ):
                # numpy would broadcast a mask of one element, or raise MaskError
                raise CorruptError(
                    f"{what}: the mask {mask['array']!r} ({mask_array.dtype}, shape "
                    f"{mask_array.shape}) does not fit the data {path!r} ({data.dtype}, shape "
                    f"{data.shape}): a mask is bool (per field) with the data's shape"
                )
            masks[path] = np.ma.MaskedArray(
                data,
                mask=mask_array,
                fill_value=None if fill is None else build(fill),
                hard_mask=body["hard_mask"],
                copy=False,
            )
        return masks[path]

    def instance(body: dict[str, Any]) -> Any:
        cls: Any = safe_classes.get(body["class"])  # a listed class: never imported
        if cls is None:
            cls = _find_class(body["class"])
        obj = cls.__new__(cls)
        obj.__dict__.update(build({"dict": body["state"]}))
        return obj

    # scan() let no other node kind through
    builders: dict[str, Callable[[Any], Any]] = {
        "dict": lambda body: {k: build(v) for k, v in body.items()},
        "list": lambda body: [build(v) for v in body],
        "tuple": lambda body: tuple(build(v) for v in body),
        "array": array,
        "float": _tagged.LEAF_TAGS["$float"],
        "scalar": _tagged.LEAF_TAGS["$numpy"],
        "pickle": leftover,
        "object": instance,
        "masked": masked,
        **_tagged.LEAF_TAGS,
    }

    def build(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        ((kind, body),) = node.items()
        return builders[kind](body)

    try:
        return build(layout)
    except LazyvaultError:
        raise
    except (*_DAMAGE, pickle.UnpicklingError) as e:
        # a layout or remainder that does not describe an object: damage
        # (or a class that changed or went away since it was stored)
        hint = ""
        if isinstance(e, (ImportError, AttributeError)):  # most often a class not defined here
            hint = (
                " (if a class it names is missing from this process, define or import it "
                "first, under the same module and name; .meta and .arrays stay readable)"
            )
        raise CorruptError(f"{what}: cannot rebuild the object: {e!r}{hint}") from e
