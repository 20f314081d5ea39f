"""Dask integration: :func:`write`, a dask bag of ``(key, obj)`` pairs into a store, all or nothing.

dask is imported only when a function here runs: ``import lazyvault`` never needs it (install it
with ``pip install 'lazyvault[dask]'``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .errors import LazyvaultError, MissingFileError, StoreNotFoundError
from .store import Store, check_key, writer_here

if TYPE_CHECKING:
    import dask.bag

__all__ = ["write"]

#: The file in a shards directory that says its write is still going on: the driver removes it
#: first when the write ends (see ``_remove_shards``).
_LIVE = "write-in-progress"


def _import_dask() -> Any:
    try:
        import dask
        import dask.bag
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"lazyvault.dask needs dask ({e}): pip install 'lazyvault[dask]'"
        ) from e
    return dask


def write(
    bag: dask.bag.Bag,
    path: str | os.PathLike[str],
    *,
    compute_kwargs: Mapping[str, Any] | None = None,
) -> list[str]:
    """Writes the ``(key, obj)`` pairs of a dask bag into the store at ``path``, all or nothing,
    in one commit; returns the keys written.

    Each partition is written by the worker that computes it into a store of its own (a shard)
    under ``<parent>/.<store name>.shards-<random>/``, next to the store (the same file system).
    The bag is computed with ``dask.compute`` (the current scheduler: a ``distributed.Client``
    when one is active; ``compute_kwargs``, e.g. ``{"scheduler": "threads"}``, go to it). Then
    this process opens ``path`` (mode ``"a"``: created if missing), merges every shard in one
    :meth:`Store.merge <lazyvault.Store.merge>` (payload files are hard-linked, never copied),
    flushes once (one commit: readers see none of the records, then all of them, at their next
    ``refresh()``; changes this process made through another handle of the store and did not
    flush yet go into that commit too, as with any ``flush()``), closes the store and removes the
    shards directory. ``path`` and its parent must be on a file system every worker sees at the
    same path (a local one for a single machine).

    ``bag``: a ``dask.bag.Bag`` whose items are ``(key, obj)`` tuples (or 2-item lists), ``key``
    a non-empty ``str``, ``obj`` anything ``store[key] = obj`` takes. Each key at most once in the
    bag: it is not a ``dict.update`` (which pair would win would depend on the partitioning).
    Keys already in the store are replaced, other records stay. Returns the keys written, in the
    bag's order. An empty bag writes nothing: the store is created if missing (empty, version
    0), no commit, ``[]`` is returned.

    All or nothing: if any task fails (the bag's own tasks, e.g. a ``map`` that raises; an item
    that is not a pair: ``TypeError`` naming the partition and the item's type; a bad key:
    ``KeyTypeError`` / ``InvalidKeyError`` as ``store[key] = obj``), a key is twice in the bag
    (``ValueError`` naming it and its partitions), or the merge fails, that exception propagates,
    the store is left exactly as it was (same version, records and payload files; one this write
    created is removed) and no shard is left behind (a task still running when the write fails
    removes what it wrote when it ends). The store is opened (created, locked) only once every
    task has succeeded: another process writing it then makes ``merge`` raise
    :class:`StoreLockedError`, which changes nothing either.

    A driver process killed while writing leaves the store with all the records or none of them
    (killed during the flush, after the index took the merged batch but before its commit: readers
    see none of them until the next writer takes the role and commits them all, see FORMAT.md,
    "Write protocol"; payload files the merge had linked are orphans that ``store.gc()``
    removes). A killed driver or worker can also leave a ``.<store name>.shards-<random>``
    directory beside the store, which no later write uses: remove it (``rm -r``) when no write to
    that store is running.

    Raises, before any task runs and creating nothing: ``TypeError`` when ``bag`` is not a dask
    bag or ``path`` is not a ``str``/``os.PathLike`` of one, ``ValueError`` for an empty path,
    the error ``Store.open(path, "a")`` gives for a ``path`` that is not a store
    (:class:`NotAStoreError` for a file or a non-empty directory, :class:`ReadOnlyError` for an
    archive), :class:`StoreLockedError` while another process writes the store,
    :class:`MissingFileError` (a ``FileNotFoundError``) when the parent directory is missing,
    ``OSError`` when it cannot be written. ``ModuleNotFoundError`` without dask.
    """
    dask = _import_dask()
    if not isinstance(bag, dask.bag.Bag):
        raise TypeError(
            f"write takes a dask.bag.Bag of (key, obj) pairs, not {type(bag).__name__} "
            "(make one with dask.bag.from_sequence)"
        )
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    if compute_kwargs is not None and not isinstance(compute_kwargs, Mapping):
        raise TypeError(f"compute_kwargs is a mapping, not {type(compute_kwargs).__name__}")
    if not os.fspath(path):
        raise ValueError("path is empty: name the store's directory")
    target = os.path.abspath(os.fspath(path))
    _check_target(target)
    was_dir = os.path.isdir(target)  # used when the write creates the store: then it was empty
    parent, name = os.path.split(target)
    token = secrets.token_hex(8)
    shards = os.path.join(parent, f".{name}.shards-{token}")
    os.mkdir(shards)
    try:
        with open(os.path.join(shards, _LIVE), "x"):
            pass
        tasks = [
            dask.delayed(_write_partition, pure=False)(
                part, shards, i, dask_key_name=(f"lazyvault-write-{token}", i)
            )
            for i, part in enumerate(bag.to_delayed(optimize_graph=True))
        ]
        written = dask.compute(*tasks, **(compute_kwargs or {}))
        _check_distinct(written)
        sources = [shard for shard, keys in written if keys]
        store = Store.open(target, "a")
        created = store.is_writer  # "a" takes the writer role at once only when it creates
        try:
            with store:
                if sources:
                    store.merge(sources)
                store.flush()
        except BaseException:
            if created:  # all or nothing: the store this write created goes too
                shutil.rmtree(target, ignore_errors=True)
                if was_dir:
                    os.mkdir(target)
            raise
        return [key for _, keys in written for key in keys]
    finally:
        _remove_shards(shards)


def _check_target(target: str) -> None:
    """Raises what ``Store.open(target, "a")`` would for a target that is not a store (a file,
    a non-empty directory, an archive) or one another process writes, without creating anything;
    ``MissingFileError`` for a missing parent directory."""
    try:
        handle = Store.open(target, "r")
    except StoreNotFoundError:  # missing, or an empty directory: created at the end
        if target.endswith(".lvz"):  # a missing archive: Store.open refuses it too
            raise
        parent = os.path.dirname(target)
        if not os.path.isdir(parent):
            raise MissingFileError(
                f"{parent!r}: no such directory, for the store {target!r} (create it first)"
            ) from None
        return
    handle.close()
    if not isinstance(handle, Store):  # an archive: read-only, mode "a" raises ReadOnlyError
        Store.open(target, "a")
    if writer_here(target):
        return  # no other process can write it; taking the role here and closing would commit
        # the unflushed changes of this process's other handles
    with Store.open(target, "a") as store:
        # another process writing the store: StoreLockedError now, not after all the work
        store.begin_write()


def _check_distinct(written: Iterable[tuple[str, list[str]]]) -> None:
    """``ValueError`` for a key that two partitions wrote."""
    owner: dict[str, int] = {}
    for i, (_, keys) in enumerate(written):
        for key in keys:
            j = owner.setdefault(key, i)
            if j != i:
                raise ValueError(
                    f"lazyvault.dask.write: key {key!r} is in partitions {j} and {i} (each key at "
                    "most once in the bag)"
                )


def _remove_shards(shards: str) -> None:
    """Removes a write's shards directory, even while tasks of the write still run elsewhere.

    Why nothing can be left: the marker file ``_LIVE`` goes first, and every task checks it when
    it starts (one that finds it gone writes nothing) and again as its very last step (one that
    finds it gone removes the shards directory itself). A task still writing while this runs can
    make ``rmtree`` fail (a file appears in a directory being emptied: retried here) or re-create
    the directory after ``rmtree`` succeeded (the store core creates its directories with their
    parents); either way that task's own last step removes it, and the last task to end sees
    every write before it. Only a process killed mid-task can leave the directory."""
    try:
        os.remove(os.path.join(shards, _LIVE))
    except FileNotFoundError:
        pass
    _remove_tree(shards)


def _remove_tree(directory: str) -> None:
    """``rm -r directory``, retried while other processes still write into it."""
    for attempt in range(20):
        shutil.rmtree(directory, ignore_errors=True)
        if not os.path.lexists(directory):
            return
        time.sleep(0.01 * (attempt + 1))


def _write_partition(pairs: Iterable[Any], shards: str, i: int) -> tuple[str, list[str]]:
    """A task of :func:`write`: writes partition ``i`` into a new shard store under ``shards``;
    returns its path and keys (in the partition's order)."""
    live = os.path.join(shards, _LIVE)
    if not os.path.exists(live):
        raise LazyvaultError(f"the write of {shards!r} has ended: partition {i} not written")
    # A name of its own per attempt: a task run again after its worker died (or run twice) never
    # meets the other attempt's shard. mkdir, not makedirs: fails once the write has ended.
    shard = os.path.join(shards, f"part-{i}-{secrets.token_hex(4)}.lv")
    try:
        os.mkdir(shard)
        seen: dict[str, None] = {}
        with Store.open(shard, "a") as store:
            store.update(_checked_pairs(pairs, i, seen), progress=False)  # no bar per task
            store.flush()
        return shard, list(seen)
    finally:
        if not os.path.exists(live):  # the write failed meanwhile: leave nothing (_remove_shards)
            _remove_tree(shards)


def _checked_pairs(
    pairs: Iterable[Any], i: int, seen: dict[str, None]
) -> Iterator[tuple[str, Any]]:
    """The items of partition ``i`` as ``(key, obj)``, each key added to ``seen``; ``TypeError``
    for an item that is not a pair, ``ValueError`` for a key seen before."""
    for n, item in enumerate(pairs):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            what = type(item).__name__
            if isinstance(item, (tuple, list)):
                what = f"{what} of {len(item)} items"
            raise TypeError(
                f"lazyvault.dask.write: item {n} of partition {i} is a {what}, not a (key, obj) "
                "pair"
            )
        key = check_key(item[0])
        if key in seen:
            raise ValueError(
                f"lazyvault.dask.write: key {key!r} is twice in partition {i} (each key at most "
                "once in the bag)"
            )
        seen[key] = None
        yield key, item[1]
