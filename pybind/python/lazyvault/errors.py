"""The exception hierarchy of lazyvault.

Every error lazyvault raises derives from :class:`LazyvaultError`; where
Python itself would raise a builtin exception the class derives from that
builtin too, so ``except KeyError`` / ``except ValueError`` keep working
(the pattern of pydantic-core's ``ValidationError(ValueError)``).
"""

from __future__ import annotations

__all__ = [
    "ClosedError",
    "CorruptError",
    "ForkedStoreError",
    "FormatVersionError",
    "InvalidArrayError",
    "InvalidFieldError",
    "InvalidKeyError",
    "KeyTypeError",
    "LazyvaultError",
    "MissingKeyError",
    "NotAStoreError",
    "PickleNotAllowedError",
    "QueryError",
    "ReadOnlyError",
    "StorageError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
]


class LazyvaultError(Exception):
    """Root of every lazyvault error."""


class StorageError(LazyvaultError, OSError):
    """An operating-system error on one of the store's files.

    Keeps ``errno``, ``strerror`` and ``filename`` as :class:`OSError` does
    (``errno.ENOSPC`` for a full disk, ``errno.EIO``, ...).
    """


class StoreLockedError(LazyvaultError):
    """Another ``Store`` (in this process or another) holds the store.

    One writer process at a time (sled takes an exclusive lock). ``pid`` is
    the holder's process id when known, else ``None``. Share data with other
    processes by passing records or exporting an archive instead.
    """

    pid: int | None = None


class StoreExistsError(LazyvaultError, FileExistsError):
    """``Store.open(path, mode="w")`` on a path that exists."""


class StoreNotFoundError(LazyvaultError, FileNotFoundError):
    """``Store.open(path, mode="r")`` on a path that holds no store."""


class NotAStoreError(LazyvaultError):
    """The path is a non-empty directory without a lazyvault manifest, or a file."""


class FormatVersionError(LazyvaultError):
    """The store was written in a newer major format version than this
    lazyvault reads; it is refused rather than misread (upgrade lazyvault)."""


class CorruptError(LazyvaultError):
    """A record or payload file is damaged: missing, truncated, or its
    ``.npy`` header disagrees with the record. The message names the key,
    the array and the file."""


class ReadOnlyError(LazyvaultError):
    """A write on a store opened with ``mode="r"``."""


class ClosedError(LazyvaultError, ValueError):
    """Use of a store after ``close()`` (a ``ValueError``, like I/O on a
    closed file)."""


class ForkedStoreError(LazyvaultError):
    """A ``Store`` opened in a parent process was used in a ``fork()``-ed
    child. sled cannot be used across fork; open the store in the child or
    pass records instead."""


class InvalidKeyError(LazyvaultError, ValueError):
    """The empty string is not a key (any other string is)."""


class KeyTypeError(LazyvaultError, TypeError):
    """Keys are ``str``; anything else raises this ``TypeError``."""


class MissingKeyError(LazyvaultError, KeyError):
    """No record under this key (a ``KeyError``)."""


class QueryError(LazyvaultError, ValueError):
    """A query expression that does not parse.

    Attributes: ``column`` (1-based, in characters), ``expression`` (the
    query text) and ``reason`` (the message without the caret line).
    """

    column: int = 0
    expression: str = ""
    reason: str = ""


class InvalidArrayError(LazyvaultError, ValueError):
    """An array that cannot be stored (its bytes disagree with its dtype and
    shape, or its dtype has no ``.npy`` description)."""


class InvalidFieldError(LazyvaultError, ValueError):
    """A name that cannot have a secondary index (not a dotted field path)."""


class PickleNotAllowedError(LazyvaultError, ValueError):
    """Loading this part needs unpickling, which can run arbitrary code; open
    the store with ``allow_pickle=True`` if you trust it (numpy's ``np.load``
    made the same choice after CVE-2019-6446)."""


class InteropError(LazyvaultError, ValueError):
    """A file cannot be imported or exported (a ``ValueError``)."""


class UnknownFormatError(InteropError):
    """The file's content is none of ``.npy``, ``.npz``, ``.safetensors``,
    ``.lvz``; or an export path has an extension lazyvault does not write."""


class InvalidFileError(InteropError):
    """The file claims a known format but is malformed, truncated or
    hostile (header larger than the file, overlapping tensors, a
    decompression bomb...). Nothing was written to the store."""
