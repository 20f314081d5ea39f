"""``Store.export``: which records, and progress; the files are written by
the core (``store/src/interop/export``: ``.npz`` and ``.safetensors``,
streamed payload by payload; ``store/src/archive``: ``.lvz``). What each
file contains is specified there and in the docstring of ``_interop``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from . import _archive, _lazyvault
from ._progress import ProgressArg, progress_callback
from ._source import text_path
from .errors import InteropError, MissingKeyError, UnknownFormatError
from .record import array_entries
from .store import core_of, plug_export

if TYPE_CHECKING:
    from .store import Store

__all__ = ["export", "member_name"]


#: The npz member name (without ``.npy``) of an array path of a record:
#: ``<key>/<array path>``, each segment made safe, never absolute or ``..``.
member_name = _lazyvault.npz_member_name


def _resolve_keys(store: Store, keys: Iterable[str] | None, query: str | None) -> list[str]:
    if keys is not None and query is not None:
        raise InteropError("export() takes keys= or query=, not both")
    if query is not None:
        return list(store.keys(query))
    if keys is None:
        return list(store)
    if isinstance(keys, str | bytes) or not isinstance(keys, Iterable):
        kind = "one str (wrap it: keys=[key])" if isinstance(keys, str) else type(keys).__name__
        raise TypeError(f"keys must be an iterable of str, not {kind}")
    out = list(dict.fromkeys(keys))
    for k in out:
        if not isinstance(k, str):
            raise TypeError(f"keys must be an iterable of str, not of {type(k).__name__}")
        if k not in store:  # before anything is written
            raise MissingKeyError(k, f"no record with key {k!r} to export")
    return out


def export(
    store: Store,
    path: str | os.PathLike[str],
    keys: Iterable[str] | None = None,
    query: str | None = None,
    progress: ProgressArg = None,
) -> None:
    """Writes the selected records (all; ``keys``; or those matching
    ``query``) to ``path``, format by extension: ``.lvz``, ``.npz`` or
    ``.safetensors``. The file is written to a temporary file beside it and
    renamed into place, so a failed export leaves no partial file (and an
    existing file as it was).

    ``progress`` (see :mod:`lazyvault._progress`) counts arrays written;
    the core writes a ``.lvz`` in one step, reported as ``(0, n)`` and
    ``(n, n)``.

    Raises ``ValueError`` for a path holding a NUL byte (as ``open()``),
    ``TypeError`` when ``keys`` is not an iterable of str (a str
    alone included), :class:`MissingKeyError` (``key``: the first key
    without a record) before anything is written,
    :class:`UnknownFormatError` for another extension,
    :class:`InteropError` for a record with fields only pickle can hold
    (``.npz``, ``.safetensors``), :class:`InvalidArrayError` for an array
    the format cannot hold, :class:`StorageError` naming the file when
    writing (or reading a payload) fails, :class:`CorruptError` naming the
    record and array whose payload is damaged or gone.
    """
    path = text_path(path, "export path")
    selected = _resolve_keys(store, keys, query)
    ext = Path(path).suffix.lower()
    if ext == ".lvz":
        with progress_callback(progress, "export", "array") as report:
            if report is None:
                _archive.export_lvz(store, path, selected)
                return
            n = sum(len(array_entries(store[k])) for k in dict.fromkeys(selected))
            report(0, n)
            _archive.export_lvz(store, path, selected)
            report(n, n)
        return
    if ext not in (".npz", ".safetensors"):
        error = UnknownFormatError(
            f"{path}: export writes .lvz, .npz or .safetensors, not {ext or 'no extension'!r}"
        )
        error.path = os.fspath(path)
        raise error
    with progress_callback(progress, "export", "array") as report:
        if ext == ".npz":
            _lazyvault.export_npz(core_of(store), path, selected, report)
        else:
            _lazyvault.export_safetensors(core_of(store), path, selected, report)


plug_export(export)
