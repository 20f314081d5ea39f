"""Records as a pandas DataFrame (``Store.to_pandas``, ``Results.to_pandas``), from the index only:
no payload is opened. pandas is optional."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from . import _arrays
from ._display import flatten
from .record import Record, array_entries

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["column", "pandas_module", "records_frame"]

_MISSING = (
    "to_pandas() needs pandas, which is not installed: "
    "pip install pandas (or pip install 'lazyvault[pandas]')"
)


def pandas_module() -> Any:
    try:
        import pandas
    except ImportError as e:
        raise ModuleNotFoundError(_MISSING, name="pandas") from e
    return pandas


def records_frame(get: Callable[[str], Record], keys: Iterable[str]) -> pd.DataFrame:
    """``Store.to_pandas`` (see there) of the records ``keys``, each built by ``get``."""
    pd = pandas_module()
    index: list[str] = []
    rows: list[dict[str, Any]] = []
    for key in keys:
        rec = get(key)
        row = flatten(rec.meta)
        for name, entry in array_entries(rec).items():
            row[f"{name}.shape"] = tuple(entry["shape"])
            row[f"{name}.dtype"] = str(_arrays.dtype_from_descr(entry["descr"]))
        index.append(key)
        rows.append(row)
    # column by column: pandas would read a row's tuple cell as a sequence
    names = dict.fromkeys(name for row in rows for name in row)  # first-seen order
    columns = {name: [row.get(name) for row in rows] for name in names}
    labels = pd.Index(index, name="key", dtype=str)  # pandas' str labels: str on pandas 3
    data = {name: column(pd, values, labels) for name, values in columns.items()}
    return pd.DataFrame(data, index=labels)


def column(pd: Any, values: list[Any], labels: Any) -> pd.Series:
    """One column: object dtype for containers (tuples, lists, dicts: pandas keeps each as one
    value), datetime64 for dates (midnight; pandas infers it for datetimes and numpy scalars)."""
    if any(isinstance(v, (tuple, list, dict)) for v in values):
        return pd.Series(values, index=labels, dtype=object)
    column = pd.Series(values, index=labels)
    dates = [v for v in values if v is not None]
    if column.dtype == object and dates and all(type(v) is datetime.date for v in dates):
        column = pd.to_datetime(column)
    return column
