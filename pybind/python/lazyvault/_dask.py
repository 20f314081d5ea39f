"""dask collections of a store's (or ``.lvz`` archive's) records: ``Handle.to_dask_array``,
``to_dask_dataframe``, ``to_dask_bag``. Each is built from the index only, at one commit (a
:class:`~lazyvault._pinned.PinnedSource`): its graph holds that source and the keys of each chunk or
partition, no handle and no array data; each task opens the pinned reader in its process and maps
the payloads. dask is optional: imported when a collection is made."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from ._pinned import PinnedSource
from .errors import LazyvaultError

if TYPE_CHECKING:
    from .store import Handle

__all__ = ["to_array"]


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
    infos = []
    for key in keys:
        info = reader[key].arrays.get(name)
        if info is None:
            raise ValueError(f"record {key!r} has no array {name!r}")
        infos.append(info)
    first = infos[0]
    if first.dtype.hasobject:
        raise ValueError(
            f"record {keys[0]!r} array {name!r} is an object array (stored as a pickle): a dask "
            "array holds numeric data only"
        )
    for key, info in zip(keys, infos, strict=True):
        if info.dtype != first.dtype:
            raise _differs(key, name, f"dtype {info.dtype}", keys[0], f"dtype {first.dtype}")
        if info.shape != first.shape:
            raise _differs(key, name, f"shape {info.shape}", keys[0], f"shape {first.shape}")
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
