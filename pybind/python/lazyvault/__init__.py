"""lazyvault: store Python objects made of small metadata and large numpy
arrays. Metadata goes to a JSON record indexed in sled; arrays go to standard
``.npy`` payload files, loaded read-only on first access (copied when at
most 64 KiB, memory-mapped when larger).

>>> import lazyvault as lv
>>> store = lv.Store.open("runs.lv")                       # doctest: +SKIP
>>> store["run-001"] = {"temperature": 300.0, "positions": positions}  # doctest: +SKIP
>>> store.find("temperature > 250")                        # doctest: +SKIP
"""

# _export, _interop plug into Store; dask is lazyvault.dask (it imports dask only when it runs)
from . import _export, _interop, dask, errors  # noqa: F401
from ._archive import Archive, dumps, loads
from ._dataset import Dataset
from ._lazyvault import FORMAT_VERSION, __version__
from ._pickling import RecordRef
from .errors import *  # noqa: F403 (the exception classes, errors.__all__)
from .record import ArrayInfo, Record
from .store import Results, Store

__all__ = [
    "FORMAT_VERSION",
    "Archive",
    "ArrayInfo",
    "Dataset",
    "Record",
    "RecordRef",
    "Results",
    "Store",
    "__version__",
    "dumps",
    "loads",
]
__all__ += errors.__all__
