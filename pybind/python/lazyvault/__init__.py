"""lazyvault: store Python objects made of small metadata and large numpy
arrays. Metadata goes to a JSON record indexed in sled; arrays go to standard
``.npy`` payload files, loaded read-only on first access (copied when at
most 64 KiB, memory-mapped when larger).

>>> import lazyvault as lv
>>> store = lv.Store.open("runs.lv")                       # doctest: +SKIP
>>> store["run-001"] = {"temperature": 300.0, "positions": positions}  # doctest: +SKIP
>>> store.find("temperature > 250")                        # doctest: +SKIP
"""

from . import _export, _interop  # noqa: F401 (they plug import and export into Store)
from ._archive import Archive, dumps, loads
from ._lazyvault import FORMAT_VERSION, __version__
from ._pickling import RecordRef
from .errors import (
    ClosedError,
    CorruptError,
    ForkedStoreError,
    FormatVersionError,
    InteropError,
    InvalidArrayError,
    InvalidFieldError,
    InvalidFileError,
    InvalidKeyError,
    KeyTypeError,
    LazyvaultError,
    MissingFileError,
    MissingKeyError,
    NotAStoreError,
    PickleNotAllowedError,
    QueryError,
    ReadOnlyError,
    StorageError,
    StoreExistsError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownFormatError,
)
from .record import ArrayInfo, Record
from .store import Results, Store

__all__ = [
    "FORMAT_VERSION",
    "Archive",
    "ArrayInfo",
    "ClosedError",
    "CorruptError",
    "ForkedStoreError",
    "FormatVersionError",
    "InteropError",
    "InvalidArrayError",
    "InvalidFieldError",
    "InvalidFileError",
    "InvalidKeyError",
    "KeyTypeError",
    "LazyvaultError",
    "MissingFileError",
    "MissingKeyError",
    "NotAStoreError",
    "PickleNotAllowedError",
    "QueryError",
    "ReadOnlyError",
    "Record",
    "RecordRef",
    "Results",
    "StorageError",
    "Store",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "UnknownFormatError",
    "__version__",
    "dumps",
    "loads",
]
