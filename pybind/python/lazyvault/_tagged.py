"""Tagged values (schema/FORMAT.md, "Tagged values"): metadata values JSON cannot hold (NaN and
±inf, ints beyond 64 bits, datetimes and dates, tuples, numpy scalars), written as one-member JSON
objects whose name starts with ``$`` (``{"$float": "nan"}``), the same in a record's ``meta`` and as
``layout`` leaves; the one encoder (:func:`json_leaf`) and decoder (:func:`decode`) of them.
"""

from __future__ import annotations

import datetime
import functools
import math
import re
import zoneinfo
from collections.abc import Callable
from typing import Any

import numpy as np

#: What :func:`json_leaf` gives for a value that is no JSON leaf (it goes to the pickled remainder).
MISSING: Any = object()
INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # what serde_json holds exactly
NON_FINITE = ("nan", "inf", "-inf")
#: What decoding a malformed body raises.
DAMAGE = (ValueError, TypeError, LookupError, OverflowError)


def cut(value: Any) -> str:
    """``repr(value)``, cut to 60 characters (for error messages)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_INT_TEXT = re.compile(r"-?(0|[1-9][0-9]*)")


# id of a datetime.timezone -> (it, whether ISO text keeps it): by identity, since timezones
# compare by offset alone ("CET" == UTC+1); checking costs a datetime's encoding a third.
_TZ_KEPT: dict[int, tuple[datetime.timezone, bool]] = {}


def _iso_keeps(tz: datetime.timezone) -> bool:
    """Whether ISO 8601 text keeps ``tz``: neither a zone's own name ("CET") nor a sub-second
    offset survives it."""
    offset = tz.utcoffset(None)
    plain = datetime.timezone(offset)
    return not offset.microseconds and tz == plain and tz.tzname(None) == plain.tzname(None)


def json_leaf(value: Any, t: type) -> Any:
    """The JSON form of a leaf value, the same in ``meta`` and ``layout``: itself when JSON holds
    it, else its tagged value (``{"$float": "nan"}``, ``{"$numpy": ["<f4", 1.5]}``...), else
    ``MISSING`` (the value goes to the pickled remainder)."""
    if t is int:
        if INT_MIN <= value <= INT_MAX:
            return value
        try:
            return {"$int": str(value)}
        except ValueError:  # more digits than int-to-str allows (sys.get_int_max_str_digits)
            return MISSING
    if t is float:
        return value if math.isfinite(value) else {"$float": repr(value)}
    if t is datetime.datetime:
        tz = value.tzinfo
        if tz is None:
            return {"$datetime": value.isoformat()}
        if type(tz) is datetime.timezone:
            known = _TZ_KEPT.get(id(tz))
            if known is None or known[0] is not tz:
                known = (tz, _iso_keeps(tz))
                if len(_TZ_KEPT) >= 256:
                    _TZ_KEPT.clear()
                _TZ_KEPT[id(tz)] = known  # holds tz: its id stays its own
            if not known[1]:
                return MISSING
            return {"$datetime": value.isoformat()}
        if type(tz) is zoneinfo.ZoneInfo and tz.key and value.utcoffset() is not None:
            return {"$datetime": f"{value.isoformat()}[{tz.key}]"}
        return MISSING
    if t is datetime.date:
        return {"$date": value.isoformat()}
    if isinstance(value, np.generic):
        scalar: Any = value  # numpy's stubs type datetime_as_string's argument narrowly
        dtype = scalar.dtype
        kind = dtype.kind
        if kind in "biu" or (kind == "f" and dtype.itemsize <= 8):
            item = value.item()
            if kind == "f" and not math.isfinite(item):
                item = {"$float": repr(item)}
            return {"$numpy": [dtype.str, item]}
        if kind == "M":
            return {"$numpy": [dtype.str, str(np.datetime_as_string(scalar))]}
        if kind == "m":
            return {"$numpy": [dtype.str, "NaT" if np.isnat(value) else int(value.view("i8"))]}
    return MISSING


def _float_tag(body: Any) -> float:
    if type(body) is str and body in NON_FINITE:
        return float(body)
    raise ValueError(f"not 'nan', 'inf' or '-inf': {cut(body)}")


def _int_tag(body: Any) -> int:
    if type(body) is str and _INT_TEXT.fullmatch(body):
        return decimal_int(body)
    raise ValueError(f"not a decimal integer: {cut(body)}")


# Below the lowest int-to-text limit Python allows (640 digits).
_DIGITS_PER_STEP = 600


def decimal_int(text: str) -> int:
    """``int(text)`` for a decimal integer text of any length. Python refuses texts of more digits
    than its int-to-text limit (``sys.set_int_max_str_digits``, 4,300 by default), which a reader
    may have set lower than the writer that stored the value: such a text is converted in steps of
    fewer digits than any limit."""
    try:
        return int(text)
    except ValueError:
        if not _INT_TEXT.fullmatch(text):
            raise
    digits = text.lstrip("-")
    value = 0
    for start in range(0, len(digits), _DIGITS_PER_STEP):
        step = digits[start : start + _DIGITS_PER_STEP]
        value = value * 10 ** len(step) + int(step)
    return -value if text.startswith("-") else value


def _datetime_tag(body: Any) -> datetime.datetime:
    if type(body) is not str:
        raise TypeError(f"not a string: {cut(body)}")
    text, zone = body, ""
    if body.endswith("]"):
        text, _, zone = body[:-1].partition("[")
    value = datetime.datetime.fromisoformat(text)
    if not zone:
        return value
    if value.tzinfo is None:
        raise ValueError(f"a time zone without an offset: {cut(body)}")
    try:
        tz = zoneinfo.ZoneInfo(zone)
    except zoneinfo.ZoneInfoNotFoundError:
        return value  # no such zone here (no tz database): the same instant, its fixed offset
    # the same wall time and fold (a repeated hour) when the zone agrees with the offset
    for fold in (0, 1):
        wall = value.replace(tzinfo=tz, fold=fold)
        if wall.utcoffset() == value.utcoffset():
            return wall
    return value.astimezone(tz)  # the zone's rules changed since: the same instant


def _date_tag(body: Any) -> datetime.date:
    if type(body) is not str:
        raise TypeError(f"not a string: {cut(body)}")
    return datetime.date.fromisoformat(body)


@functools.lru_cache(maxsize=64)
def _numpy_dtype(descr: str) -> np.dtype:
    """The dtype of a ``$numpy`` value: bool, int, uint, float of at most 8 bytes, datetime64,
    timedelta64 (``ValueError`` otherwise)."""
    try:
        dtype = np.dtype(descr)
    except Exception as e:  # numpy raises TypeError, ValueError, SyntaxError...
        raise ValueError(f"not a dtype: {cut(descr)}") from e
    if dtype.kind in "biuMm" or (dtype.kind == "f" and dtype.itemsize <= 8):
        return dtype
    raise ValueError(f"no $numpy value has dtype {descr!r}")


def _numpy_tag(body: Any) -> np.generic:
    if type(body) is not list or len(body) != 2 or type(body[0]) is not str:
        raise ValueError(f"not [dtype, value]: {cut(body)}")
    dtype = _numpy_dtype(body[0])
    value = body[1]
    t, kind = type(value), dtype.kind
    unit: Any = np.datetime_data(dtype) if kind in "Mm" else None  # ("s", 1), ("ms", 10)...
    if kind == "M" and t is str:
        return np.datetime64(value, unit)
    if kind == "m" and (t is int or value == "NaT"):
        return np.timedelta64(value, unit)
    if kind == "f" and t is dict and len(value) == 1 and "$float" in value:
        return dtype.type(_float_tag(value["$float"]))
    if (
        (kind == "b" and t is bool)
        or (kind in "iu" and t is int)
        or (kind == "f" and (t is int or (t is float and math.isfinite(value))))
    ):
        return dtype.type(value)  # OverflowError out of the dtype's range
    raise ValueError(f"not a {dtype} value: {cut(value)}")


# The tagged values that are also layout leaf nodes, each by its decoder (which raises ValueError,
# TypeError, LookupError or OverflowError for a malformed body).
LEAF_TAGS: dict[str, Callable[[Any], Any]] = {
    "$float": _float_tag,
    "$int": _int_tag,
    "$datetime": _datetime_tag,
    "$date": _date_tag,
    "$numpy": _numpy_tag,
}


def decode_tag(tag: str, body: Any) -> Any:
    """The value the tagged leaf ``{tag: body}`` stands for (``$float``, ``$int``, ``$datetime``,
    ``$date``, ``$numpy``), in ``meta`` and in ``layout`` alike. Raises ``LookupError`` for another
    tag, ``ValueError``/``TypeError``/``OverflowError`` for a malformed body."""
    return LEAF_TAGS[tag](body)


def decode(value: Any, strict: bool = False) -> Any:
    """A ``meta`` value with its tagged values (``$tuple`` and ``$dict`` too) decoded, at any depth.
    A one-member object whose name starts with ``$`` but that is no well-formed tagged value (JSON
    from elsewhere) stays as it is; with ``strict`` (``meta`` read as the object itself, for the
    ``fields`` layout, where a malformed tagged value is damage as in any layout) it raises
    ``ValueError`` (or ``TypeError``, ``LookupError``, ``OverflowError``)."""
    t = type(value)
    if t is list:
        return [decode(v, strict) for v in value]
    if t is not dict:
        return value
    if len(value) == 1:
        ((name, body),) = value.items()
        if name[:1] == "$":
            if name == "$tuple" and type(body) is list:
                return tuple(decode(v, strict) for v in body)
            if name == "$dict" and type(body) is dict:
                return {k: decode(v, strict) for k, v in body.items()}
            try:
                return decode_tag(name, body)
            except DAMAGE as e:
                if strict:
                    raise ValueError(f"a malformed tagged value {cut(value)}: {e}") from e
    return {k: decode(v, strict) for k, v in value.items()}


def decode_meta(meta: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    """A record's ``meta`` decoded (see :func:`decode`); still a dict."""
    decoded = decode(meta, strict)
    return decoded if type(decoded) is dict else meta
