"""The exception hierarchy of lazyvault.

Every error lazyvault raises derives from :class:`LazyvaultError`; where Python itself would raise a
builtin exception the class derives from that builtin too, so ``except KeyError`` / ``except
ValueError`` keep working (the pattern of pydantic-core's ``ValidationError(ValueError)``).

The classes are created by the compiled core (``lazyvault._lazyvault``), which raises them with
their data as attributes (``path``, ``key``, ``array``, ``pid``, ...; each class's docstring lists
its own); this module re-exports them.
"""

# ruff: noqa: F405 (the names of __all__ come from the star import)
# The classes come from the core, typed by its stub; ``__all__`` below is the
# one list of their names in the Python sources (``lazyvault`` re-exports it).
from ._lazyvault import *  # noqa: F403

__all__ = [
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
    "RecordTooLargeError",
    "StorageError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "UnknownFormatError",
]
