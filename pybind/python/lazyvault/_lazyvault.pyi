"""Type stubs of the compiled core ``lazyvault._lazyvault`` (Rust, pyo3).

Users call the Python API (:class:`lazyvault.Store`); these are the pieces
it is built on, and the exception classes :mod:`lazyvault.errors` re-exports.
"""

from collections.abc import Callable, Iterable, Iterator, Sequence
from os import PathLike
from typing import Any, ClassVar, final, overload

from typing_extensions import Buffer

__all__ = [
    "DEFAULT_MAX_DEFLATE_RATIO",
    "FORMAT_VERSION",
    "NPY_MAX_HEADER_SIZE",
    "SAFETENSORS_MAX_HEADER",
    "ArchiveBuffer",
    "ArchiveCore",
    "ArrayEntry",
    "ArrowStream",
    "ClosedError",
    "CorruptError",
    "Encoded",
    "ForkedStoreError",
    "FormatVersionError",
    "InteropError",
    "InvalidArrayError",
    "InvalidFieldError",
    "InvalidFileError",
    "InvalidKeyError",
    "KeyArray",
    "KeyTypeError",
    "LazyvaultError",
    "MappedBuffer",
    "MissingFileError",
    "MissingKeyError",
    "NotAStoreError",
    "PickleNotAllowedError",
    "QueryError",
    "ReadOnlyError",
    "RecordArrays",
    "RecordTooLargeError",
    "StorageError",
    "StoreCore",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "UnknownFormatError",
    "__version__",
    "_arrow_example",
    "check_query",
    "detect_format",
    "dumps_archive",
    "encode_flat",
    "export_npz",
    "export_safetensors",
    "import_files",
    "map_array",
    "missing_payload_hint",
    "npy_header",
    "npz_has_manifest",
    "npz_member_name",
    "parse_descr",
    "parse_npy_header",
    "read_array_bytes",
    "read_safetensors_header",
    "write_store_archive",
]

FORMAT_VERSION: str
"""On-disk format version this build writes, ``"MAJOR.MINOR"``."""
__version__: str
NPY_MAX_HEADER_SIZE: int
"""Largest ``.npy`` header text an import reads by default, in bytes
(numpy's ``max_header_size`` default, 10,000)."""
SAFETENSORS_MAX_HEADER: int
"""Largest safetensors header read, in bytes (the reference reader's cap)."""
DEFAULT_MAX_DEFLATE_RATIO: int
"""Largest uncompressed-to-compressed ratio a deflated ``.npz`` member may
declare unless the import says otherwise (deflate cannot pass ~1032:1)."""

# The exception classes, created by the core and re-exported (with their
# documentation) by :mod:`lazyvault.errors`.

class LazyvaultError(Exception): ...
class StorageError(LazyvaultError, OSError): ...
class MissingFileError(StorageError, FileNotFoundError): ...

class StoreLockedError(LazyvaultError):
    pid: int | None
    path: str | None

class StoreExistsError(LazyvaultError, FileExistsError):
    path: str | None

class StoreNotFoundError(LazyvaultError, FileNotFoundError):
    path: str | None

class NotAStoreError(LazyvaultError):
    path: str | None

class FormatVersionError(LazyvaultError):
    path: str | None

class CorruptError(LazyvaultError):
    key: str | None
    array: str | None
    path: str | None

class ReadOnlyError(LazyvaultError): ...
class ClosedError(LazyvaultError, ValueError): ...

class ForkedStoreError(LazyvaultError):
    opener_pid: int | None
    pid: int | None

class InvalidKeyError(LazyvaultError, ValueError): ...
class KeyTypeError(LazyvaultError, TypeError): ...

class MissingKeyError(LazyvaultError, KeyError):
    @property
    def key(self) -> object: ...

class QueryError(LazyvaultError, ValueError):
    column: int
    expression: str
    reason: str

class InvalidArrayError(LazyvaultError, ValueError):
    array: str | None

class RecordTooLargeError(LazyvaultError, ValueError):
    key: str | None
    size: int | None
    cap: int | None

class InvalidFieldError(LazyvaultError, ValueError): ...
class PickleNotAllowedError(LazyvaultError, ValueError): ...
class InteropError(LazyvaultError, ValueError): ...

class UnknownFormatError(InteropError):
    path: str | None

class InvalidFileError(InteropError):
    what: str | None
    path: str | None

@final
class MappedBuffer:
    """The data bytes of one ``.npy`` payload, read-only: a private copy,
    64-byte aligned, when at most 64 KiB; a memory map of the file when larger.

    Exports a read-only, 1-d, ``"B"``-format buffer (PEP 3118); a request for
    a writable buffer raises ``BufferError``. Keeps the bytes (copy or
    mapping) alive while any view (e.g. an ndarray from ``numpy.frombuffer``)
    exists.
    """

    def __len__(self) -> int: ...
    @property
    def mapped(self) -> bool:
        """Whether the bytes are a memory map of the payload file (``False``:
        a copy in memory)."""

@final
class RecordArrays:
    """The arrays of one record of a store directory
    (:meth:`StoreCore.get_record`): its record JSON, where each array's entry
    is in it, and the directory its payloads are in, so that reading one
    array decodes only that entry, in Rust, never the JSON in Python.
    Immutable."""

    @property
    def names(self) -> tuple[str, ...]:
        """The record's array paths (``"x"``, ``"frames/0"``), stored order."""
    def read(self, name: str) -> tuple[MappedBuffer | None, str, tuple[int, ...], bool] | None:
        """``(data, descr, shape, fortran_order)`` of the array at path
        ``name``, read and checked as :func:`map_array` does (``data`` ``None``
        for a zero-size array; ``descr`` the ``.npy`` descr text); ``None``
        when the record has no such array or it is a pickled ``object`` array.
        Raises ``CorruptError`` for a malformed entry or a missing, short or
        mismatched payload."""

@final
class ArrayEntry:
    """One array of a record, as its record JSON describes it (schema/FORMAT.md,
    "Record"): what :func:`map_array`, :func:`read_array_bytes` and the
    :class:`ArchiveCore` readers take. Immutable (assigning an attribute
    raises ``AttributeError``), equal when every field is equal, not hashable.

    Built from keywords named as the record's fields, so a record's entry dict
    can be passed as it is (``**entry``); keywords it does not know are
    ignored, as readers ignore fields a newer format version adds. Raises
    ``TypeError`` for a missing field or a value of the wrong type (a negative
    size too).
    """

    def __new__(
        cls,
        *,
        id: str,
        descr: str,
        dtype: str,
        shape: Sequence[int],
        fortran_order: bool,
        nbytes: int,
        data_offset: int,
        pickled: bool = False,
        checksum: str | None = None,
    ) -> ArrayEntry: ...
    @property
    def id(self) -> str:
        """Payload id: 32 lowercase hex digits, naming the payload file
        ``arrays/<id[:2]>/<id>.npy`` (or an archive member)."""
    @property
    def descr(self) -> str:
        """The dtype as the ``.npy`` header writes it: Python-literal text of
        ``numpy.lib.format.dtype_to_descr(dtype)`` (``"'<f8'"``)."""
    @property
    def dtype(self) -> str:
        """numpy's name of the dtype (``dtype.name``: ``"float64"``)."""
    @property
    def shape(self) -> tuple[int, ...]:
        """Shape, one length per axis; ``()`` for a 0-d array."""
    @property
    def fortran_order(self) -> bool:
        """Whether the data is in Fortran (column-major) order."""
    @property
    def nbytes(self) -> int:
        """Size of the data in bytes (of the pickle, for a pickled array)."""
    @property
    def data_offset(self) -> int:
        """Offset of the data in the payload file, in bytes (a multiple of 64)."""
    @property
    def pickled(self) -> bool:
        """Whether the payload is the pickle of an ``object`` array."""
    @property
    def checksum(self) -> str | None:
        """``"<algorithm>:<hex digest>"`` of the data bytes
        (``"xxh3-64:"`` and 16 hex digits), or ``None``."""
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

def map_array(root: str, entry: ArrayEntry) -> MappedBuffer | None:
    """The data of the payload of ``entry`` in the store at ``root`` after
    checking its ``.npy`` header against the entry (descr, shape,
    fortran_order, data_offset) and the file length against
    ``data_offset + nbytes``: read into memory when ``nbytes`` is at most
    64 KiB, memory-mapped when larger (the file is closed either way).
    ``None`` for 0 bytes.

    Raises ``CorruptError`` for a missing, short or mismatched payload.
    """

def missing_payload_hint(root: str, key: str, entry: ArrayEntry) -> str:
    """What to say of the missing payload file of ``entry``, an array of the
    record ``key`` of the store at ``root`` as some handle read it: that the
    store is damaged when its latest commit still references the payload,
    else that the record was overwritten or deleted since it was read. Opens
    no payload; for error messages."""

def read_array_bytes(root: str, entry: ArrayEntry) -> bytes:
    """Reads the ``nbytes`` data bytes of the payload of ``entry`` (the pickle
    of an ``object`` array), with the same checks as :func:`map_array`."""

def check_query(expr: str) -> None:
    """Raises ``QueryError`` (with ``.column``) if ``expr`` does not parse."""

@final
class StoreCore:
    """An open store: a reader's snapshot (the newest checkpoint plus the
    committed journal after it; no lock) until its first write, then the
    writer role (the sled index and the store's lock), shared by every
    handle of the store in this process."""

    def __new__(cls, path: str | PathLike[str], mode: str, version: int | None = None) -> StoreCore:
        """Opens ``path`` with ``mode`` ``"r"``, ``"a"`` or ``"w"``; with
        ``version`` (mode ``"r"`` only), as of that commit. Raises
        ``ValueError`` for a bad mode, ``CorruptError`` for a version no
        longer kept."""
    @property
    def root(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def version(self) -> int:
        """Commits since the store was created, as this handle shows them."""
    @property
    def has_uncommitted_changes(self) -> bool:
        """Whether this handle holds changes not yet committed (a writer's puts or deletes since
        its last flush); False for a reader."""
    def refresh(self) -> int:
        """Moves a reader to the latest commit; returns the new version."""
    def begin_write(self) -> None:
        """Takes the writer role now rather than at the first write."""
    @property
    def is_writer(self) -> bool:
        """Whether this handle holds the writer role."""
    @property
    def retention(self) -> float:
        """Seconds superseded data is kept for readers on other machines;
        settable (``ValueError`` for a negative or non-finite number)."""
    @retention.setter
    def retention(self, seconds: float) -> None: ...
    def put(
        self,
        key: str,
        meta_json: str,
        layout_json: str,
        arrays: list[tuple[str, str, str, tuple[int, ...], bool, Buffer, bool]],
        pickle: bytes | None = None,
    ) -> None:
        """Writes each array ``(name, descr, dtype_name, shape, fortran_order,
        data, pickled)`` as a payload (temp file, fsync, rename), then the
        record. ``data`` is C-contiguous bytes."""
    def put_many(
        self,
        records: list[
            tuple[
                str,
                str,
                str,
                list[tuple[str, str, str, tuple[int, ...], bool, Buffer, bool]],
                bytes | None,
            ]
            | tuple[str, Encoded]
        ],
    ) -> None:
        """Puts each ``(key, meta_json, layout_json, arrays, pickle)`` (the
        arguments of :meth:`put`) or ``(key, Encoded)`` (:func:`encode_flat`),
        in order, all or nothing: every payload is
        written, made durable with one barrier (``syncfs`` for many files)
        and renamed, then the records enter the journal and the index in one
        batch. On error none is added and their payload files are removed."""
    def replace_arrays(
        self, key: str, arrays: list[tuple[str, str, str, tuple[int, ...], bool, Buffer, bool]]
    ) -> bool:
        """Replaces the arrays of ``key`` named like those of ``arrays``
        (tuples as for :meth:`put`), keeping its metadata, layout, pickled
        remainder and other payloads; False when ``key`` has no record."""
    def get(self, key: str) -> bytes | None:
        """The record JSON of ``key`` (see schema/FORMAT.md)."""
    def get_full(self, key: str) -> tuple[bytes, bytes | None] | None:
        """``(record JSON, pickled remainder or None)`` read together."""
    def get_record(self, key: str) -> tuple[bytes, bytes | None, RecordArrays | None] | None:
        """``(record JSON, pickled remainder or None, its arrays)`` read
        together; the remainder is looked up only when the JSON may have one
        (it names ``"pickle"``); the arrays are ``None`` when the JSON does not
        parse as a record (its array paths and entries as JSON)."""
    def get_pickle(self, key: str) -> bytes | None: ...
    def contains(self, key: str) -> bool: ...
    def delete(self, key: str) -> bool: ...
    def __len__(self) -> int: ...
    def keys(self) -> list[str]: ...
    def find(self, expr: str | None) -> KeyArray:
        """Keys of the records matching ``expr`` (all with None), held
        packed (no ``str`` made until one is read)."""
    def count(self, expr: str) -> int: ...
    def to_arrow(self, expr: str | None = None) -> ArrowStream:
        """The metadata of the records matching ``expr`` (all with None) as an
        Arrow table (columns: ``Store.to_arrow``)."""
    def to_arrow_keys(self, keys: KeyArray | Sequence[str]) -> ArrowStream:
        """``to_arrow`` of the records of ``keys``, in that order (keys not
        held are left out); a ``KeyArray`` is read in place (no ``str``
        made)."""
    def create_index(self, field: str) -> None: ...
    def drop_index(self, field: str) -> bool: ...
    def indexes(self) -> list[str]: ...
    def explain(self, expr: str) -> str: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def gc(self) -> dict[str, int]: ...
    def verify(
        self, checksums: bool = True, progress: Callable[[int, int], Any] | None = None
    ) -> dict[str, Any]:
        """Checks records, the journal and payloads; ``progress(done, total)``
        is called about ten times a second; an exception it raises stops
        the check."""
    def merge(
        self,
        sources: Sequence[str | PathLike[str]],
        progress: Callable[[int, int], Any] | None = None,
    ) -> list[str]:
        """Moves the records of the stores at ``sources`` (each read at its
        latest commit) into this one in one batch, payloads hard-linked
        under new ids; returns the keys merged. ``progress(done, total)``
        counts records; an exception it raises stops the merge, nothing
        set."""
    @staticmethod
    def repair(path: str | PathLike[str]) -> dict[str, Any]:
        """Rebuilds the index from the record journal, then writes a new
        checkpoint (see ``Store.repair``)."""

@final
class Encoded:
    """A ``dict`` split in Rust by :func:`encode_flat`, as ``_layout.encode``
    splits it: its metadata and layout as compact JSON text and its arrays,
    whose buffers it keeps exported while it lives."""

    @property
    def meta_json(self) -> str:
        """The metadata, a compact JSON object (FORMAT.md, "Meta")."""
    @property
    def layout_json(self) -> str:
        """The layout, compact JSON (FORMAT.md, "Layout")."""
    @property
    def arrays(self) -> list[tuple[str, str, str, list[int], bool]]:
        """``(name, descr, dtype_name, shape, fortran_order)`` of each array,
        in the dict's order."""
    @property
    def nbytes(self) -> int:
        """The bytes of all its arrays."""

def encode_flat(obj: object) -> Encoded | None:
    """``obj`` split as ``_layout.encode`` splits it, or ``None`` when it is
    not a ``dict`` the Rust encoder covers: ``str`` keys (not empty, no lone
    surrogate) whose values are ``None``, ``bool``, ``int`` in [-2**63,
    2**64), ``float``, ``str``, naive or UTC ``datetime.datetime``,
    ``datetime.date``, and ``numpy.ndarray``/``memmap`` objects (each once)
    of a native-order bool, integer, float16/32/64 or complex64/128 dtype,
    C-contiguous. The caller then takes the Python walk."""

@final
class ArrowStream:
    """An Arrow table held in Rust, exported through the Arrow PyCapsule
    interface (the Arrow C stream interface): ``pa.table(s)``,
    ``pl.DataFrame(s)``, DuckDB. Each export is a new stream over the same
    buffers (no copy)."""

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """A PyCapsule "arrow_array_stream" of the table's record batches
        (``requested_schema`` is ignored)."""
    def __arrow_c_schema__(self) -> object:
        """A PyCapsule "arrow_schema" of the table's schema."""
    @property
    def num_rows(self) -> int: ...

@final
class KeyArray(Sequence[str]):
    """The keys a query matched (``StoreCore.find``), in key order (archive
    order for an archive): an immutable sequence of ``str`` held packed in
    Rust (one UTF-8 buffer), each ``str`` made when it is read. Equal to a
    ``KeyArray``, list or tuple of the same keys; unhashable; pickles as its
    keys. A registered ``collections.abc.Sequence``."""

    def __new__(cls, keys: Iterable[str]) -> KeyArray: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, key: int, /) -> str: ...
    @overload
    def __getitem__(self, key: slice, /) -> KeyArray: ...
    def __iter__(self) -> Iterator[str]: ...
    def __contains__(self, key: object, /) -> bool: ...
    def index(self, value: object, start: int = 0, stop: int = ...) -> int: ...
    def count(self, value: object) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __reduce__(self) -> tuple[type[KeyArray], tuple[list[str]]]: ...
    def to_list(self) -> list[str]:
        """The keys as a list of new ``str`` objects."""

def _arrow_example() -> ArrowStream:
    """A small table of every column type of the metadata tables, twice
    (two batches): the export's own test."""

@final
class ArchiveCore:
    """A ``.lvz`` archive opened for reading: a file mapped once, or the
    bytes of a caller's buffer (held, never written to). No lock."""

    @staticmethod
    def open(path: str | PathLike[str]) -> ArchiveCore:
        """Maps and checks the archive file (``CorruptError`` if damaged)."""
    @staticmethod
    def from_buffer(buffer: Buffer) -> ArchiveCore:
        """Reads the archive in a C-contiguous buffer (``lazyvault.loads``)."""
    @property
    def path(self) -> str | None: ...
    @property
    def nbytes(self) -> int: ...
    def keys(self) -> list[str]:
        """Keys in archive order."""
    def __len__(self) -> int: ...
    def contains(self, key: str) -> bool: ...
    def get(self, key: str) -> bytes | None:
        """The record JSON of ``key``."""
    def get_pickle(self, key: str) -> bytes | None: ...
    def find(self, expr: str | None) -> KeyArray:
        """Keys of the records matching ``expr`` (all with None), held
        packed (no ``str`` made until one is read)."""
    def count(self, expr: str) -> int: ...
    def to_arrow(self, expr: str | None = None) -> ArrowStream:
        """The metadata of the records matching ``expr`` (all with None) as an
        Arrow table (columns: ``Store.to_arrow``)."""
    def to_arrow_keys(self, keys: KeyArray | Sequence[str]) -> ArrowStream:
        """``to_arrow`` of the records of ``keys``, in that order (keys not
        held are left out); a ``KeyArray`` is read in place (no ``str``
        made)."""
    def verify(self) -> dict[str, Any]:
        """``{"ok", "records", "arrays", "problems"}`` after checking every array."""
    def map_array(self, entry: ArrayEntry) -> ArchiveBuffer | None:
        """The bytes of the array of ``entry`` as a read-only buffer viewing the
        archive, after checking its member against the entry; ``None`` for 0
        bytes. ``CorruptError`` for a mismatch."""
    def read_array_bytes(self, entry: ArrayEntry) -> bytes:
        """The data bytes of the array of ``entry`` copied (the pickle of an
        object array), checked as by :meth:`map_array` and against the
        member's CRC-32."""

@final
class ArchiveBuffer:
    """The bytes of one array inside an archive: a read-only, 1-d, ``"B"``
    buffer that keeps the archive (its map or source buffer) alive."""

    def __len__(self) -> int: ...

def write_store_archive(
    path: str | PathLike[str],
    root: str | PathLike[str],
    items: list[tuple[str, bytes, bytes | None]],
) -> None:
    """Writes an archive of ``(key, record_json, pickle)`` records of the
    store at ``root`` (payload files copied as they are): temporary file,
    fsync, verify, rename."""

def dumps_archive(
    key: str,
    meta_json: str,
    layout_json: str,
    arrays: list[tuple[str, str, str, tuple[int, ...], bool, Buffer, bool]],
    pickle: bytes | None = None,
    force_zip64: bool = False,
) -> bytes:
    """One record as an archive in memory (``lazyvault.dumps``);
    ``force_zip64`` gives every payload member zip64 size fields."""

def npy_header(descr: str, fortran_order: bool, shape: Sequence[int]) -> bytes:
    """The ``.npy`` header numpy writes for (descr, order, shape): magic to
    newline, a multiple of 64 bytes (version 1.0, or 3.0 for non-latin-1
    descrs; NEP 1). ``ValueError`` for a bad descr or a header over 10,000
    bytes."""

def parse_descr(descr: str) -> str | list[tuple[Any, ...]]:
    """The value of ``.npy`` descr text, as ``ast.literal_eval`` makes it
    and ``np.lib.format.descr_to_dtype`` takes it: a type string, or a list
    of ``(name, descr[, shape])`` tuples (name a string or ``(title, name)``,
    shape an int or a tuple of ints). ``ValueError`` for a bad descr."""

def detect_format(path: str | PathLike[str]) -> str:
    """``"npy"``, ``"npz"``, ``"safetensors"`` or ``"lvz"`` from the file's
    content. ``UnknownFormatError``, ``InvalidFileError``, ``StorageError``."""

def npz_has_manifest(path: str | PathLike[str]) -> bool:
    """Whether the zip at ``path`` holds lazyvault's npz manifest.
    ``InvalidFileError`` for an unreadable zip."""

def parse_npy_header(
    data: bytes, what: str, max_header_size: int | None = None
) -> tuple[tuple[int, int], str, bool, list[int], int]:
    """``(version, descr, fortran_order, shape, data offset)`` of the ``.npy``
    header at the start of ``data`` (the core's parser; header text at most
    ``max_header_size`` bytes, default 10,000). ``InvalidFileError`` naming
    ``what``."""

def read_safetensors_header(
    path: str | PathLike[str],
) -> tuple[dict[str, str] | None, list[dict[str, Any]], int]:
    """``(__metadata__ or None, tensors, data section offset)``; each tensor
    ``{"name", "dtype", "shape", "data_offsets"}``, all checked.
    ``InvalidFileError``."""

def import_files(
    store: StoreCore,
    files: Sequence[tuple[str | PathLike[str], str | None, str]],
    *,
    allow_pickle: bool = False,
    max_header_size: int | None = None,
    max_deflate_ratio: int | None = None,
    progress: Callable[[int, int], object] | None = None,
    repickle: Callable[[str, bytes], tuple[str, str, Sequence[int], bool, bytes]] | None = None,
) -> list[str]:
    """Imports every ``(path, key or None, default_key)`` of ``files`` into
    ``store`` as one commit: all checked before any array is written, every
    array streamed into its payload; returns the keys written (``key``, else
    ``default_key``, for a single-record file). ``progress(done, total)``
    counts arrays over all files, from ``(0, total)``; ``repickle(what,
    pickle)`` re-encodes an object array's pickle as ``(descr, dtype_name,
    shape, fortran_order, pickle)``; an exception either raises propagates,
    the store unchanged. Raises ``InvalidFileError`` (``path``: the file),
    ``UnknownFormatError``, ``PickleNotAllowedError``, ``InteropError`` (two
    files giving one key), ``StorageError`` (``ENOSPC`` before writing; a
    ``FileNotFoundError`` for a missing file)."""

def export_npz(
    store: StoreCore,
    path: str | PathLike[str],
    keys: Sequence[str],
    progress: Callable[[int, int], Any] | None = None,
    zip64_limits: tuple[int, int] | None = None,
) -> None:
    """Writes the records ``keys`` of ``store`` (in that order) to a new
    ``.npz`` at ``path``: a manifest member and one 64-byte aligned ``.npy``
    member per array, payloads streamed one file at a time; temporary file,
    fsync, rename (nothing left on error). ``progress(done, total)`` counts
    arrays; an exception it raises stops the export. ``zip64_limits=(size,
    count)`` lowers the sizes (bytes) and member count past which zip64
    fields are written (default ``(2**31 - 1, 65535)``, as ``zipfile``).
    ``InteropError`` for a record with a pickled remainder,
    ``StorageError``/``CorruptError`` naming the file, record and array."""

def export_safetensors(
    store: StoreCore,
    path: str | PathLike[str],
    keys: Sequence[str],
    progress: Callable[[int, int], Any] | None = None,
) -> None:
    """Writes the records ``keys`` of ``store`` (in that order) to a new
    ``.safetensors`` file at ``path`` (little-endian, C order, tensors by
    item size then name); temporary file, fsync, rename. ``progress(done,
    total)`` counts tensors. ``InvalidArrayError`` for a dtype safetensors
    cannot hold or a name occurring twice, ``InteropError`` for a record
    with a pickled remainder."""

def npz_member_name(key: str, array_path: str) -> str:
    """The ``.npz`` member name (without ``.npy``) of ``array_path`` of
    record ``key``: split on ``/``, control characters, ``\\`` and ``:``
    as ``_``, empty and ``.`` segments as ``_``, ``..`` as ``__``."""
