"""Records' metadata as Arrow tables (``to_arrow``), polars DataFrames (``to_polars``) and the
pandas DataFrames of ``to_pandas``, from the index only: no payload is opened.

The table is built in Rust (``Store::to_arrow``: its doc gives the columns) and handed over through
the Arrow PyCapsule interface (an object with ``__arrow_c_stream__``: the Arrow C stream interface),
buffers shared, not copied. pyarrow and polars are optional: each import fails with a
``ModuleNotFoundError`` naming the extra to install.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _frame, _tagged

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl
    import pyarrow as pa

    from . import _lazyvault

__all__ = ["frame", "polars_frame", "table"]

_PYARROW_MISSING = (
    "{what}() needs pyarrow, which is not installed: "
    "pip install pyarrow (or pip install 'lazyvault[arrow]')"
)
_POLARS_MISSING = (
    "to_polars() needs polars, which is not installed: "
    "pip install polars (or pip install 'lazyvault[polars]')"
)

#: Field metadata (bytes, as pyarrow gives it) of the columns that hold JSON text.
_JSON = b"lazyvault.json"
_KIND = b"lazyvault.kind"
_FACT = b"lazyvault.fact"
#: Set by the column builder when every value of a typed column was a ``$numpy`` scalar of one
#: dtype (its descr) or a ``$date``: the values go back to pandas as they were.
_NUMPY = b"lazyvault.numpy"
_DATE = b"lazyvault.date"


def _pyarrow(what: str) -> Any:
    try:
        import pyarrow
    except ImportError as e:
        raise ModuleNotFoundError(_PYARROW_MISSING.format(what=what), name="pyarrow") from e
    return pyarrow


def require_pyarrow(what: str) -> None:
    """``ModuleNotFoundError`` naming the extra unless pyarrow imports (before any work)."""
    _pyarrow(what)


def require_polars() -> None:
    """``ModuleNotFoundError`` naming the extra unless polars imports (before any work)."""
    _polars()


def _polars() -> Any:
    try:
        import polars
    except ImportError as e:
        raise ModuleNotFoundError(_POLARS_MISSING, name="polars") from e
    return polars


def has_pyarrow() -> bool:
    """Whether pyarrow imports (``to_pandas`` goes through Arrow then)."""
    try:
        _pyarrow("to_pandas")
    except ModuleNotFoundError:
        return False
    return True


def table(stream: _lazyvault.ArrowStream) -> pa.Table:
    """``stream`` (the core's Arrow C stream) as a ``pyarrow.Table``: no copy of the buffers."""
    return _pyarrow("to_arrow").table(stream)


def polars_frame(stream: _lazyvault.ArrowStream) -> pl.DataFrame:
    """``stream`` as a ``polars.DataFrame`` (imported through the PyCapsule interface: pyarrow not
    needed), string columns as ``pl.String`` rather than categoricals."""
    polars = _polars()
    df = polars.DataFrame(stream)
    categorical = [n for n, t in df.schema.items() if isinstance(t, polars.Categorical)]
    if categorical:
        df = df.with_columns(polars.col(categorical).cast(polars.String))
    return df


def frame(stream: _lazyvault.ArrowStream) -> pd.DataFrame:
    """``to_pandas`` (see ``Handle.to_pandas``) from the Arrow table of ``stream``: the same frame
    the record-by-record path (:func:`_frame.records_frame`) builds."""
    pd = _frame.pandas_module()
    t = table(stream)
    labels = pd.Index(t.column(0).to_pylist(), name="key", dtype=str)
    # the record-by-record frame's column order: by the first row holding each (stable, so the
    # Rust order, metadata then facts, breaks ties as a row's own order does)
    _pyarrow("to_pandas")
    import pyarrow.compute as pc

    first = {i: pc.index(t.column(i).is_valid(), True).as_py() for i in range(1, t.num_columns)}
    data: dict[str, Any] = {}
    facts: set[str] = set()
    pa = _pyarrow("to_pandas")
    plain = (pa.float64(), pa.int64(), pa.bool_())
    for i in sorted(first, key=first.__getitem__):
        field = t.schema.field(i)
        meta = field.metadata or {}
        if field.name in facts:
            continue  # an array fact wins over a metadata field of the same name
        if meta.get(_KIND) == b"fact":
            facts.add(field.name)
        column = t.column(i)
        if pa.types.is_dictionary(column.type) and _NUMPY not in meta:
            data[field.name] = pd.Series(_strings(column), index=labels)
        elif column.type in plain and _NUMPY not in meta:
            # numbers and bools: numpy's array as pandas would build it from the values (float64
            # with NaN for ints with nulls, object for bools with nulls), without a Python object
            # per cell
            data[field.name] = pd.Series(column.to_numpy(), index=labels)
        else:
            data[field.name] = _frame.column(pd, _values(column, meta), labels)
    return pd.DataFrame(data, index=labels)


def _strings(column: pa.ChunkedArray) -> np.ndarray:
    """A dictionary column of strings as an object array of str and None, through its indices
    (no Python object per cell but the dictionary's)."""
    parts = []
    for chunk in column.chunks:
        words = np.array([*chunk.dictionary.to_pylist(), None], dtype=object)
        indices = chunk.indices.fill_null(len(chunk.dictionary)).to_numpy()
        parts.append(words[indices])
    return np.concatenate(parts) if parts else np.array([], dtype=object)


def _values(column: pa.ChunkedArray, meta: dict[bytes, bytes]) -> list[Any]:
    """A column's cells as the Python values of the record-by-record frame: JSON text decoded
    (tagged values too), shapes as tuples."""
    if meta.get(_JSON) == b"true":
        texts = column.to_pylist()
        # one parse of all cells (a JSON array of them; a null cell reads as the null it stands
        # for, as a missing field does), then tagged values decoded where a cell has one (a tag's
        # name starts with "$)
        values = json.loads("[" + ",".join("null" if t is None else t for t in texts) + "]")
        return [
            _tagged.decode(v) if t is not None and '"$' in t else v
            for v, t in zip(values, texts, strict=True)
        ]
    values = column.to_pylist()
    if meta.get(_FACT) == b"shape":
        return [None if v is None else tuple(v) for v in values]
    if meta.get(_DATE) == b"true":
        return [None if v is None else v.date() for v in values]
    descr = meta.get(_NUMPY)
    if descr is not None:
        dtype = np.dtype(descr.decode())
        if dtype.kind == "M":
            return [None if v is None else np.datetime64(v).astype(dtype) for v in values]
        return [None if v is None else dtype.type(v) for v in values]
    return values
