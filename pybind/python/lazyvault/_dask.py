"""dask collections of a store's (or ``.lvz`` archive's) records: ``Handle.to_dask_array``,
``to_dask_dataframe``, ``to_dask_bag``. Each is built from the index only, at one commit (a
:class:`~lazyvault._pinned.PinnedSource`): its graph holds that source and the keys of each chunk or
partition, no handle and no array data; each task opens the pinned reader in its process and maps
the payloads. dask is optional: imported when a collection is made."""

from __future__ import annotations

import functools
import itertools
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from ._pinned import PinnedSource
from ._source import DirectorySource
from .errors import LazyvaultError
from .record import Record, entry_of, rebuild, remainder_of, source_of

if TYPE_CHECKING:
    from .store import Handle

__all__ = ["to_array", "to_bag", "to_dataframe"]


def _dask(what: str) -> Any:
    """The ``dask`` package, or ``ModuleNotFoundError`` saying how to install it."""
    try:
        import dask
    except ImportError as e:
        raise ModuleNotFoundError(
            f"{what}() needs dask, which is not installed: pip install 'lazyvault[dask]'",
            name="dask",
        ) from e
    return dask


def _query_arg(query: object) -> str | None:
    if query is not None and not isinstance(query, str):
        raise TypeError(f"the query is a str (or None: all records), not {type(query).__name__}")
    return query


def _pinned_keys(handle: Handle, query: str | None, what: str) -> tuple[PinnedSource, list[str]]:
    """The pinned source of ``handle`` and the keys matching ``query`` at its commit."""
    source = PinnedSource.of(handle, what)
    reader = source.open()
    keys = list(reader) if query is None else reader.keys(query)
    return source, keys


# -- to_dask_array ----------------------------------------------------------------


def _records_per_chunk(dask: Any, chunks: object, n: int, nbytes: int) -> tuple[int, ...]:
    """The chunk sizes along axis 0 (records per chunk) of ``n`` records of ``nbytes`` each."""
    if chunks is None:
        limit = dask.utils.parse_bytes(dask.config.get("array.chunk-size"))
        chunks = max(1, limit // max(1, nbytes))
    if isinstance(chunks, numbers.Integral) and not isinstance(chunks, bool):
        step = int(chunks)
        if step < 1:
            raise ValueError(f"chunks is a number of records per chunk, at least 1, not {step}")
        return tuple(min(step, n - start) for start in range(0, n, step))
    if isinstance(chunks, (tuple, list)) and all(
        isinstance(c, numbers.Integral) and not isinstance(c, bool) for c in chunks
    ):
        sizes = tuple(int(c) for c in chunks)
        if any(c < 1 for c in sizes) or sum(sizes) != n:
            raise ValueError(
                f"chunks as a list gives the records of each chunk, each at least 1, {n} in all; "
                f"not {list(sizes)}"
            )
        return sizes
    raise TypeError(
        f"chunks is an int (records per chunk) or a list of ints (the records of each chunk), "
        f"not {chunks!r}"
    )


def _array_chunk(
    source: PinnedSource, keys: tuple[str, ...], name: str, dtype: np.dtype, shape: tuple[int, ...]
) -> np.ndarray:
    """The task of one chunk: array ``name`` of records ``keys``, stacked (a new array)."""
    handle = source.open()
    out = np.empty((len(keys), *shape), dtype)
    with source.reading():
        for i, key in enumerate(keys):
            array = handle[key].array(name)
            if array.dtype != dtype or array.shape != shape:
                raise LazyvaultError(
                    f"record {key!r} array {name!r} is now {array.dtype} {array.shape}, not the "
                    f"{dtype} {shape} of when the dask array was made: {source.path!r} was replaced"
                )
            out[i] = array
    return out


def _dtype_names(a: np.dtype, b: np.dtype) -> tuple[str, str]:
    """Two different dtypes as text that shows the difference (byte order: ``>f8``, ``<f8``)."""
    return (a.str, b.str) if a.str[1:] == b.str[1:] else (str(a), str(b))


def _differs(key: str, name: str, what: str, first_key: str, first: Any) -> ValueError:
    return ValueError(
        f"record {key!r} array {name!r} has {what}, not the {first} of the first record "
        f"{first_key!r}: a dask array stacks arrays of one dtype and shape"
    )


def to_array(handle: Handle, name: str, query: str | None, chunks: object) -> Any:
    """``Handle.to_dask_array`` (see there)."""
    dask = _dask("to_dask_array")
    import dask.array as da

    if not isinstance(name, str):
        raise TypeError(f"the array name is a str (a path such as 'image'), not {name!r}")
    query = _query_arg(query)
    source, keys = _pinned_keys(handle, query, "dask array")
    if not keys:
        raise ValueError(
            f"no record of {source.path!r} matches {query!r}: a dask array cannot stack none"
        )
    reader = source.open()
    first = None
    for key in keys:  # the first record that differs, in key order, is the one named
        info = reader[key].arrays.get(name)
        if info is None:
            raise ValueError(f"record {key!r} has no array {name!r}")
        if first is None:
            first = info
            if first.dtype.hasobject:
                raise ValueError(
                    f"record {key!r} array {name!r} is an object array (stored as a pickle): a "
                    "dask array holds numeric data only"
                )
        elif info.dtype != first.dtype:
            ours, theirs = _dtype_names(info.dtype, first.dtype)
            raise _differs(key, name, f"dtype {ours}", keys[0], f"dtype {theirs}")
        elif info.shape != first.shape:
            raise _differs(key, name, f"shape {info.shape}", keys[0], f"shape {first.shape}")
    assert first is not None
    sizes = _records_per_chunk(dask, chunks, len(keys), first.nbytes)
    token = dask.base.tokenize(source.path, source.version, source.reopen, name, keys, sizes)
    graph_name = f"lazyvault-array-{token}"
    inner = (0,) * len(first.shape)
    graph: dict[tuple[Any, ...], Any] = {}
    start = 0
    for i, size in enumerate(sizes):
        chunk_keys = tuple(keys[start : start + size])
        task = (_array_chunk, source, chunk_keys, name, first.dtype, first.shape)
        graph[(graph_name, i, *inner)] = task
        start += size
    meta = np.empty((0,) * (1 + len(first.shape)), first.dtype)
    all_chunks = (sizes, *((d,) for d in first.shape))
    return da.Array(graph, graph_name, all_chunks, meta=meta)


# -- to_dask_dataframe, to_dask_bag ---------------------------------------------------


def _partition_count(npartitions: object) -> int | None:
    if npartitions is None:
        return None
    if isinstance(npartitions, numbers.Integral) and not isinstance(npartitions, bool):
        if npartitions < 1:
            raise ValueError(f"npartitions is at least 1, not {npartitions}")
        return int(npartitions)
    raise TypeError(f"npartitions is an int (or None), not {npartitions!r}")


def _partitions(keys: list[str], count: int | None) -> list[tuple[str, ...]]:
    """``keys`` cut into ``count`` contiguous runs as even as can be (None: one per 1,000 keys; at
    most one per key, at least one)."""
    if count is None:
        count = -(-len(keys) // 1000)
    count = max(1, min(count, len(keys)))
    bounds = [len(keys) * i // count for i in range(count + 1)]
    return [tuple(keys[a:b]) for a, b in itertools.pairwise(bounds)]


def _frame_partition(keys: tuple[str, ...], source: PinnedSource, dtypes: dict[str, Any]) -> Any:
    """The task of one partition: ``to_pandas`` of ``keys``, with the columns (and dtypes) of
    the whole frame (a column its records lack: missing values)."""
    import pandas

    handle = source.open()
    part = handle.to_pandas(keys=keys)
    index = part.index
    data = {}
    for name, dtype in dtypes.items():
        if name in part:
            column = part[name].set_axis(index)
            data[name] = column if column.dtype == dtype else column.astype(dtype)
        else:
            data[name] = pandas.Series([None] * len(keys), index=index, dtype=dtype)
    return pandas.DataFrame(data, index=index)


def _partitioned(
    handle: Handle, query: object, npartitions: object, what: str
) -> tuple[PinnedSource, list[str], list[tuple[str, ...]]]:
    """The pinned source of ``handle``, the keys matching ``query`` and their partitions."""
    query = _query_arg(query)
    count = _partition_count(npartitions)
    source, keys = _pinned_keys(handle, query, what)
    return source, keys, _partitions(keys, count)


def to_dataframe(handle: Handle, query: str | None, npartitions: object) -> Any:
    """``Handle.to_dask_dataframe`` (see there)."""
    dask = _dask("to_dask_dataframe")
    import dask.dataframe as dd

    source, keys, parts = _partitioned(handle, query, npartitions, "dask dataframe")
    reader = source.open()
    whole = reader.to_pandas(keys=keys)
    columns = dict(whole.dtypes.items())
    meta = _frame_partition((), source, columns)
    ordered = all(a < b for a, b in itertools.pairwise(keys))
    divisions = None  # unknown: no record, or an archive's own order
    if keys and ordered:
        divisions = (*(p[0] for p in parts), parts[-1][-1])
    with dask.config.set({"dataframe.convert-string": False}):  # keep to_pandas's dtypes
        return dd.from_map(
            _frame_partition,
            parts,
            args=(source, columns),
            meta=meta,
            divisions=divisions,
            enforce_metadata=False,
            label="lazyvault-frame",
        )


def _same(value: bytes | None, key: str) -> bytes | None:
    return value


def _bag_partition(keys: tuple[str, ...], source: PinnedSource) -> list[Record]:
    """The task of one partition of a bag: the records of ``keys``, those of a store directory
    made to pickle by reference (``Record.ref()`` fields)."""
    handle = source.open()
    records = []
    for key in keys:
        rec = handle[key]
        where = source_of(rec)
        if type(where) is DirectorySource:
            remainder = functools.partial(_same, remainder_of(rec))
            by_ref = DirectorySource(where.root, where.trust, remainder, by_reference=True)
            rec = rebuild(None, by_ref, key, entry_of(rec))
        records.append(rec)
    return records


def to_bag(handle: Handle, query: str | None, npartitions: object) -> Any:
    """``Handle.to_dask_bag`` (see there)."""
    dask = _dask("to_dask_bag")
    import dask.bag as db

    source, _, parts = _partitioned(handle, query, npartitions, "dask bag")
    token = dask.base.tokenize(source.path, source.version, source.reopen, parts)
    name = f"lazyvault-bag-{token}"
    graph: dict[Any, Any] = {
        (name, i): (_bag_partition, part, source) for i, part in enumerate(parts)
    }
    return db.Bag(graph, name, len(parts))
