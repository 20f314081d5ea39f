"""numpy arrays to and from ``.npy`` payloads: the only module that knows how an ndarray is laid out
for the Rust core."""

from __future__ import annotations

import functools
import math
import pickle
from typing import Any, Literal

import numpy as np

from . import _lazyvault
from .errors import CorruptError, InvalidArrayError

# What numpy's own writer uses for object arrays (numpy/lib/format.py).
_OBJECT_PICKLE_PROTOCOL = 4


def descr_of(dtype: np.dtype) -> str:
    """The ``.npy`` header's descr of ``dtype`` as Python-literal text (NEP 1)."""
    return repr(np.lib.format.dtype_to_descr(dtype))


@functools.lru_cache(maxsize=1024)
def dtype_from_descr(descr: str) -> np.dtype:
    """The dtype that a ``.npy`` descr text describes (no payload needed). Raises
    :class:`CorruptError` for text that describes no dtype."""
    try:
        value: Any = _lazyvault.parse_descr(descr)  # numpy's stubs omit str and titles
        return np.lib.format.descr_to_dtype(value)
    except (ValueError, TypeError) as e:
        raise CorruptError(f"bad dtype description {descr!r}: {e}") from None


# dtype -> (descr text, dtype.name) for dtypes without fields (equal ones have equal texts):
# dtype.name alone costs some microseconds, a share of a small record's put.
_DTYPE_TEXTS: dict[np.dtype, tuple[str, str]] = {}


def _dtype_texts(dtype: np.dtype) -> tuple[str, str]:
    """``(descr_of(dtype), dtype.name)``, cached for dtypes without fields."""
    texts = _DTYPE_TEXTS.get(dtype)
    if texts is None:
        texts = (descr_of(dtype), dtype.name)
        if dtype.names is None and not dtype.metadata:
            if len(_DTYPE_TEXTS) >= 1024:  # fixed-width texts could make many
                _DTYPE_TEXTS.clear()
            _DTYPE_TEXTS[dtype] = texts
    return texts


def payload_args(name: str, array: np.ndarray) -> tuple[Any, ...]:
    """The tuple the core's ``put`` takes for one array: ``(name, descr, dtype_name, shape,
    fortran_order, data, pickled)``; ``data`` is a C-contiguous ``uint8`` view of the array's bytes
    (no copy for C- or Fortran-contiguous input; other layouts copied to C order, as ``np.save``
    does), or the pickle of an ``object`` array. Raises :class:`InvalidArrayError` for a dtype that
    cannot be stored."""
    if type(array) is not np.ndarray:
        array = np.asarray(array)  # np.memmap and other subclasses: their data
    dtype = array.dtype
    shape = array.shape  # a tuple of ints
    descr, dtype_name = _dtype_texts(dtype)
    flags = array.flags
    if dtype.hasobject:
        fortran = bool(flags.f_contiguous and not flags.c_contiguous)
        data: bytes | np.ndarray = pickle.dumps(array, protocol=_OBJECT_PICKLE_PROTOCOL)
        return (name, descr, dtype_name, shape, fortran, data, True)
    if flags.c_contiguous:
        fortran, flat = False, array if array.ndim == 1 else array.reshape(-1)
    elif flags.f_contiguous:
        fortran, flat = True, array.T.reshape(-1)
    else:
        fortran, flat = False, np.ascontiguousarray(array).reshape(-1)
    try:
        data = flat.view(np.uint8)
    except (TypeError, ValueError) as e:
        raise InvalidArrayError(f"array {name!r}: cannot store dtype {dtype}: {e}") from e
    return (name, descr, dtype_name, shape, fortran, data, False)


def array_from_buffer(
    buffer: Any, descr: str, shape: tuple[int, ...], fortran_order: bool
) -> np.ndarray:
    """A read-only ndarray viewing ``buffer`` (a payload's bytes, mapped or copied) with no further
    copy; ``buffer`` is ``None`` for a zero-size array (nothing is read)."""
    known = _DTYPES.get(descr)
    if known is None:
        dtype = dtype_from_descr(descr)
        known = (dtype, dtype.subdtype is None)
        if len(_DTYPES) < 1024:
            _DTYPES[descr] = known
    dtype, plain = known
    order: Literal["C", "F"] = "F" if fortran_order else "C"
    if buffer is None:
        array = np.empty(shape, dtype=dtype, order=order)
        array.flags.writeable = False
        return array
    if plain:
        # the array's base is ``buffer`` itself (frombuffer would add a
        # memoryview: one more object for the cycle collector per array held)
        return np.ndarray(shape, dtype, buffer, 0, None, order)
    flat = np.frombuffer(buffer, dtype=dtype, count=math.prod(shape))
    return flat.reshape(shape, order=order)


# (dtype, whether it is no subarray dtype) by descr text, for array_from_buffer:
# a dict look-up is all a read of a small array can afford (dtype_from_descr
# parses on a miss)
_DTYPES: dict[str, tuple[np.dtype, bool]] = {}


def load_pickled(data: bytes) -> np.ndarray:
    """An ``object`` array from its payload pickle (caller checked allow_pickle)."""
    array = pickle.loads(data)
    if not isinstance(array, np.ndarray):
        raise InvalidArrayError("pickled payload is not an ndarray")
    return array
