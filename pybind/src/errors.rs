//! The exception classes of `lazyvault.errors`, created here once at module
//! init (by calling Python's `type(name, bases, dict)`, so a class can
//! subclass two builtins, e.g. `QueryError(LazyvaultError, ValueError)`),
//! and the one mapping from the engine's `Error` to them ([`to_pyerr`]).

use std::ffi::CStr;
use std::path::Path;

use lazyvault_store::schema::SchemaError;
use lazyvault_store::{Error, InteropError, OpenError, StorageError, UsageError};
use pyo3::call::PyCallArgs;
use pyo3::exceptions::{
    PyException, PyFileExistsError, PyFileNotFoundError, PyKeyError, PyOSError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::BoundObject;

/// A base of an exception class: another class of the table, or a builtin.
enum Base {
    Class(&'static ExcClass),
    Builtin(for<'py> fn(Python<'py>) -> Bound<'py, PyType>),
}

/// The default of a class attribute (what an exception raised by Python
/// code, without the engine's data, shows).
enum Default {
    None,
    Int(i64),
    Str(&'static str),
}

/// One exception class of `lazyvault.errors`, created on first use.
pub struct ExcClass {
    name: &'static str,
    doc: &'static str,
    bases: &'static [Base],
    attrs: &'static [(&'static str, Default)],
    /// Python source run in the class namespace before the class is made
    /// (methods and properties), or "".
    code: &'static CStr,
    class: PyOnceLock<Py<PyType>>,
}

impl ExcClass {
    /// The class, created on first use (module init creates them all).
    pub fn get<'py>(&'static self, py: Python<'py>) -> PyResult<&'py Bound<'py, PyType>> {
        self.class
            .get_or_try_init(py, || self.create(py))
            .map(|c| c.bind(py))
    }

    fn create(&'static self, py: Python<'_>) -> PyResult<Py<PyType>> {
        let bases = self
            .bases
            .iter()
            .map(|base| match base {
                Base::Class(class) => class.get(py).cloned(),
                Base::Builtin(builtin) => Ok(builtin(py)),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let dict = PyDict::new(py);
        dict.set_item("__doc__", self.doc)?;
        // Pickle finds the class again by module and name.
        dict.set_item("__module__", "lazyvault.errors")?;
        for (name, default) in self.attrs {
            match default {
                Default::None => dict.set_item(name, py.None())?,
                Default::Int(i) => dict.set_item(name, i)?,
                Default::Str(s) => dict.set_item(name, s)?,
            }
        }
        if !self.code.is_empty() {
            let globals = PyDict::new(py);
            py.run(self.code, Some(&globals), Some(&dict))?;
        }
        let class = py
            .get_type::<PyType>()
            .call1((self.name, PyTuple::new(py, bases)?, dict))?;
        Ok(class.cast_into::<PyType>()?.unbind())
    }

    /// An instance built from `args`, with the attributes `attrs` set.
    fn new_err<'py>(
        &'static self,
        py: Python<'py>,
        args: impl PyCallArgs<'py>,
        attrs: &[(&str, Bound<'py, PyAny>)],
    ) -> PyErr {
        let build = || -> PyResult<PyErr> {
            let exc = self.get(py)?.call1(args)?;
            for (name, value) in attrs {
                exc.setattr(*name, value)?;
            }
            Ok(PyErr::from_value(exc))
        };
        build().unwrap_or_else(|e| e)
    }
}

macro_rules! exc_class {
    ($static:ident, $name:literal, [$($base:expr),+], [$($attr:literal = $default:expr),*], $doc:literal) => {
        exc_class!($static, $name, [$($base),+], [$($attr = $default),*], $doc, c"");
    };
    ($static:ident, $name:literal, [$($base:expr),+], [$($attr:literal = $default:expr),*], $doc:literal, $code:expr) => {
        #[doc = concat!("`lazyvault.errors.", $name, "`.")]
        pub static $static: ExcClass = ExcClass {
            name: $name,
            doc: $doc,
            bases: &[$($base),+],
            attrs: &[$(($attr, $default)),*],
            code: $code,
            class: PyOnceLock::new(),
        };
    };
}

fn builtin<T: pyo3::PyTypeInfo>(py: Python<'_>) -> Bound<'_, PyType> {
    py.get_type::<T>()
}

exc_class!(
    LAZYVAULT_ERROR,
    "LazyvaultError",
    [Base::Builtin(builtin::<PyException>)],
    [],
    "Root of every lazyvault error."
);
exc_class!(
    STORAGE_ERROR,
    "StorageError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyOSError>)
    ],
    [],
    "An operating-system error on one of the store's files.

Keeps ``errno``, ``strerror`` and ``filename`` as :class:`OSError` does
(``errno.ENOSPC`` for a full disk, ``errno.EIO``, ``errno.ENOLCK`` for a file
system that refuses locks, ...); ``filename`` is the file the operation was on.
"
);
exc_class!(
    MISSING_FILE_ERROR,
    "MissingFileError",
    [
        Base::Class(&STORAGE_ERROR),
        Base::Builtin(builtin::<PyFileNotFoundError>)
    ],
    [],
    "A file that does not exist (``errno.ENOENT``): a :class:`StorageError`
and a :class:`FileNotFoundError`, with ``errno``, ``strerror`` and
``filename`` (the file) as :class:`OSError` has them. Raised, for one,
by importing a file that is not there.
"
);
exc_class!(
    STORE_LOCKED_ERROR,
    "StoreLockedError",
    [Base::Class(&LAZYVAULT_ERROR)],
    ["pid" = Default::None, "path" = Default::None],
    "Another ``Store`` (in this process or another) holds the store.

One writer process at a time (sled takes an exclusive lock). ``pid`` is
the holder's process id when known, else ``None``; ``path`` is the store's
directory. Share data with other processes by passing records or exporting
an archive instead.
"
);
exc_class!(
    STORE_EXISTS_ERROR,
    "StoreExistsError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyFileExistsError>)
    ],
    ["path" = Default::None],
    "``Store.open(path, mode=\"w\")`` on a path that exists (``path``)."
);
exc_class!(
    STORE_NOT_FOUND_ERROR,
    "StoreNotFoundError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyFileNotFoundError>)
    ],
    ["path" = Default::None],
    "``Store.open(path, mode=\"r\")`` on a path that holds no store (``path``)."
);
exc_class!(
    NOT_A_STORE_ERROR,
    "NotAStoreError",
    [Base::Class(&LAZYVAULT_ERROR)],
    ["path" = Default::None],
    "The path (``path``) is a non-empty directory without a lazyvault manifest, or a file."
);
exc_class!(
    FORMAT_VERSION_ERROR,
    "FormatVersionError",
    [Base::Class(&LAZYVAULT_ERROR)],
    ["path" = Default::None],
    "The store was written in a newer major format version than this
lazyvault reads; it is refused rather than misread (upgrade lazyvault).
``path`` is the manifest read."
);
exc_class!(
    CORRUPT_ERROR,
    "CorruptError",
    [Base::Class(&LAZYVAULT_ERROR)],
    [
        "key" = Default::None,
        "array" = Default::None,
        "path" = Default::None
    ],
    "A record or payload file is damaged: missing, truncated, or its
``.npy`` header disagrees with the record. The message names the key,
the array and the file; so do the attributes ``key``, ``array`` and
``path`` where known (else ``None``)."
);
exc_class!(
    READ_ONLY_ERROR,
    "ReadOnlyError",
    [Base::Class(&LAZYVAULT_ERROR)],
    [],
    "A write on a store opened with ``mode=\"r\"``."
);
exc_class!(
    CLOSED_ERROR,
    "ClosedError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyValueError>)
    ],
    [],
    "Use of a store after ``close()`` (a ``ValueError``, like I/O on a
closed file)."
);
exc_class!(
    FORKED_STORE_ERROR,
    "ForkedStoreError",
    [Base::Class(&LAZYVAULT_ERROR)],
    ["opener_pid" = Default::None, "pid" = Default::None],
    "A ``Store`` opened in a parent process (``opener_pid``) was used in a
``fork()``-ed child (``pid``), or a forked child tried to write a store
after its parent (``opener_pid``) had written one. sled, the writer's
index, cannot be used across fork: open the store in the child (to
write, in a child started with the 'spawn' or 'forkserver' method), or
pass records instead."
);
exc_class!(
    INVALID_KEY_ERROR,
    "InvalidKeyError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyValueError>)
    ],
    [],
    "The empty string is not a key (any other string is)."
);
exc_class!(
    KEY_TYPE_ERROR,
    "KeyTypeError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyTypeError>)
    ],
    [],
    "Keys are ``str``; anything else raises this ``TypeError``."
);
exc_class!(
    MISSING_KEY_ERROR,
    "MissingKeyError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyKeyError>)
    ],
    [],
    "No record under this key: a ``KeyError`` whose ``args[0]`` (and
``key``) is the key. ``str()`` shows the key quoted, as ``KeyError``
does, or the message given after the key (``MissingKeyError(key,
message)``).",
    c"def __str__(self):
    # KeyError shows args[0] quoted; a message given after the key reads better
    if len(self.args) >= 2 and isinstance(self.args[1], str):
        return self.args[1]
    return KeyError.__str__(self)

@property
def key(self):
    \"\"\"The missing key (``args[0]``), or None.\"\"\"
    return self.args[0] if self.args else None
"
);
exc_class!(
    QUERY_ERROR,
    "QueryError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyValueError>)
    ],
    [
        "column" = Default::Int(0),
        "expression" = Default::Str(""),
        "reason" = Default::Str("")
    ],
    "A query expression that does not parse.

Attributes: ``column`` (1-based, in characters), ``expression`` (the
query text) and ``reason`` (the message without the caret line).
"
);
exc_class!(
    INVALID_ARRAY_ERROR,
    "InvalidArrayError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyValueError>)
    ],
    ["array" = Default::None],
    "An array that cannot be stored (its bytes disagree with its dtype and
shape, or its dtype has no ``.npy`` description), or a record's metadata
too large to store. ``array`` is the array's name when known, else ``None``."
);
exc_class!(
    RECORD_TOO_LARGE_ERROR,
    "RecordTooLargeError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyValueError>)
    ],
    [
        "key" = Default::None,
        "size" = Default::None,
        "cap" = Default::None
    ],
    "A record whose metadata, layout and pickled remainder would take more
than the cap (1 MiB) in the index, which every scan reads (array entries
are not counted): nothing was written.
The message names its largest metadata fields with their sizes; store
big data as numpy arrays (payload files, memory-mapped) instead.
``key``: the record's key; ``size``: its size in bytes; ``cap``: the cap
in bytes (``None`` when not known)."
);
exc_class!(
    INVALID_FIELD_ERROR,
    "InvalidFieldError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyValueError>)
    ],
    [],
    "A name that cannot have a secondary index (not a dotted field path)."
);
exc_class!(
    PICKLE_NOT_ALLOWED_ERROR,
    "PickleNotAllowedError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyValueError>)
    ],
    [],
    "Loading this part needs unpickling, which can run arbitrary code; open
the store with ``allow_pickle=True`` if you trust it (numpy's ``np.load``
made the same choice after CVE-2019-6446)."
);
exc_class!(
    INTEROP_ERROR,
    "InteropError",
    [
        Base::Class(&LAZYVAULT_ERROR),
        Base::Builtin(builtin::<PyValueError>)
    ],
    [],
    "A file cannot be imported or exported (a ``ValueError``)."
);
exc_class!(
    UNKNOWN_FORMAT_ERROR,
    "UnknownFormatError",
    [Base::Class(&INTEROP_ERROR)],
    ["path" = Default::None],
    "The file's content is none of ``.npy``, ``.npz``, ``.safetensors``,
``.lvz``; or an export path has an extension lazyvault does not write.
``path``: the file, when the core found it out (else ``None``)."
);
exc_class!(
    INVALID_FILE_ERROR,
    "InvalidFileError",
    [Base::Class(&INTEROP_ERROR)],
    ["what" = Default::None, "path" = Default::None],
    "The file claims a known format but is malformed, truncated, damaged
or hostile (header larger than the file, overlapping tensors, a
decompression bomb, a damaged archive...). Nothing was written to the
store. ``path``: the file; ``what``: the file and the member, tensor or
record, as the message names them (both ``None`` when not known)."
);

/// Every class, bases before subclasses.
static ALL: [&ExcClass; 23] = [
    &LAZYVAULT_ERROR,
    &STORAGE_ERROR,
    &MISSING_FILE_ERROR,
    &STORE_LOCKED_ERROR,
    &STORE_EXISTS_ERROR,
    &STORE_NOT_FOUND_ERROR,
    &NOT_A_STORE_ERROR,
    &FORMAT_VERSION_ERROR,
    &CORRUPT_ERROR,
    &READ_ONLY_ERROR,
    &CLOSED_ERROR,
    &FORKED_STORE_ERROR,
    &INVALID_KEY_ERROR,
    &KEY_TYPE_ERROR,
    &MISSING_KEY_ERROR,
    &QUERY_ERROR,
    &INVALID_ARRAY_ERROR,
    &RECORD_TOO_LARGE_ERROR,
    &INVALID_FIELD_ERROR,
    &PICKLE_NOT_ALLOWED_ERROR,
    &INTEROP_ERROR,
    &UNKNOWN_FORMAT_ERROR,
    &INVALID_FILE_ERROR,
];

/// Creates every class and adds it to the module `m`.
pub fn add_classes(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for class in ALL {
        m.add(class.name, class.get(m.py())?)?;
    }
    Ok(())
}

/// `value` as a Python object (`None` if it cannot be converted: the error
/// being raised matters more than one attribute).
fn obj<'py, T: IntoPyObject<'py>>(py: Python<'py>, value: T) -> Bound<'py, PyAny> {
    value
        .into_pyobject(py)
        .map_or_else(|_| py.None().into_bound(py), |v| v.into_any().into_bound())
}

/// Converts an engine error into the matching Python exception, with the
/// error's data as attributes.
pub fn to_pyerr(err: Error) -> PyErr {
    // One piece (about 90 lines): one match over every error variant, so
    // the whole engine-to-Python exception mapping reads in one place.
    Python::attach(|py| {
        let msg = err.to_string();
        let path = |p: &Path| obj(py, p.to_string_lossy());
        match &err {
            Error::Storage(StorageError::Io { path, source }) => {
                let errno = errno_of(source);
                let class = if errno == libc_errno::ENOENT {
                    &MISSING_FILE_ERROR
                } else {
                    &STORAGE_ERROR
                };
                class.new_err(py, (errno, strerror(source), path.to_string_lossy()), &[])
            }
            Error::Storage(StorageError::NoLocks(path)) => {
                STORAGE_ERROR.new_err(py, (libc_errno::ENOLCK, msg, path.to_string_lossy()), &[])
            }
            Error::Open(e) => {
                let (class, data) = match e {
                    OpenError::Exists(p) => (&STORE_EXISTS_ERROR, vec![("path", path(p))]),
                    OpenError::NotFound(p) => (&STORE_NOT_FOUND_ERROR, vec![("path", path(p))]),
                    OpenError::NotAStore(p) => (&NOT_A_STORE_ERROR, vec![("path", path(p))]),
                    OpenError::Format { path: p, source } => (
                        match source {
                            SchemaError::UnsupportedVersion { .. }
                            | SchemaError::OlderVersion { .. } => &FORMAT_VERSION_ERROR,
                            _ => &NOT_A_STORE_ERROR,
                        },
                        vec![("path", path(p))],
                    ),
                    OpenError::Locked { path: p, pid, .. } => (
                        &STORE_LOCKED_ERROR,
                        vec![("path", path(p)), ("pid", obj(py, pid))],
                    ),
                    OpenError::Forked { opener, current } => (
                        &FORKED_STORE_ERROR,
                        vec![("opener_pid", obj(py, opener)), ("pid", obj(py, current))],
                    ),
                    OpenError::ForkedIndex { parent, current } => (
                        &FORKED_STORE_ERROR,
                        vec![("opener_pid", obj(py, parent)), ("pid", obj(py, current))],
                    ),
                    // Anything newer: the root class.
                    _ => (&LAZYVAULT_ERROR, vec![]),
                };
                class.new_err(py, (msg,), &data)
            }
            Error::Corrupt(c) => {
                let file = c.path().map(|p| p.to_string_lossy().into_owned());
                let data = [
                    ("key", obj(py, c.key())),
                    ("array", obj(py, c.array())),
                    ("path", obj(py, file)),
                ];
                CORRUPT_ERROR.new_err(py, (msg,), &data)
            }
            Error::Usage(e) => {
                let (class, data) = match e {
                    UsageError::ReadOnly => (&READ_ONLY_ERROR, vec![]),
                    UsageError::Closed => (&CLOSED_ERROR, vec![]),
                    UsageError::EmptyKey => (&INVALID_KEY_ERROR, vec![]),
                    UsageError::InvalidField(_) => (&INVALID_FIELD_ERROR, vec![]),
                    UsageError::InvalidArray { name, .. } => {
                        (&INVALID_ARRAY_ERROR, vec![("array", obj(py, name))])
                    }
                    UsageError::TooLarge(_) => (&INVALID_ARRAY_ERROR, vec![]),
                    UsageError::RecordTooLarge { key, size, cap, .. } => (
                        &RECORD_TOO_LARGE_ERROR,
                        vec![
                            ("key", obj(py, key)),
                            ("size", obj(py, size)),
                            ("cap", obj(py, cap)),
                        ],
                    ),
                    // Cancelled, and anything newer: the root class.
                    _ => (&LAZYVAULT_ERROR, vec![]),
                };
                class.new_err(py, (msg,), &data)
            }
            Error::Query(q) => {
                let data = [
                    ("column", obj(py, q.column)),
                    ("expression", obj(py, &q.expression)),
                    ("reason", obj(py, &q.message)),
                ];
                QUERY_ERROR.new_err(py, (msg,), &data)
            }
            Error::Interop(e) => {
                let (class, data) = match e {
                    InteropError::UnknownFormat { path: p, .. } => {
                        (&UNKNOWN_FORMAT_ERROR, vec![("path", path(p))])
                    }
                    InteropError::InvalidFile { what, path: p, .. } => (
                        &INVALID_FILE_ERROR,
                        vec![
                            ("what", obj(py, what)),
                            ("path", obj(py, p.as_deref().map(Path::to_string_lossy))),
                        ],
                    ),
                    InteropError::PickleNotAllowed { .. } => (&PICKLE_NOT_ALLOWED_ERROR, vec![]),
                    // Unsupported, and anything newer: the concern's class.
                    _ => (&INTEROP_ERROR, vec![]),
                };
                class.new_err(py, (msg,), &data)
            }
            // The index (sled), and anything newer: the root class.
            _ => LAZYVAULT_ERROR.new_err(py, (msg,), &[]),
        }
    })
}

/// What the operating system said, as Python's `strerror` (without the
/// " (os error N)" that Rust appends).
fn strerror(source: &std::io::Error) -> String {
    let text = source.to_string();
    match source.raw_os_error() {
        Some(code) => text
            .strip_suffix(&format!(" (os error {code})"))
            .map_or(text.clone(), str::to_owned),
        None => text,
    }
}

/// The errno of `source`: sled rebuilds some errors from their kind alone,
/// so recover the errno Python code tests for.
fn errno_of(source: &std::io::Error) -> i32 {
    source.raw_os_error().unwrap_or(match source.kind() {
        std::io::ErrorKind::StorageFull => libc_errno::ENOSPC,
        std::io::ErrorKind::PermissionDenied => libc_errno::EACCES,
        std::io::ErrorKind::NotFound => libc_errno::ENOENT,
        std::io::ErrorKind::ReadOnlyFilesystem => libc_errno::EROFS,
        std::io::ErrorKind::QuotaExceeded => libc_errno::EDQUOT,
        _ => libc_errno::EIO,
    })
}

/// The errno values of the kinds above (Linux numbering, as Python's
/// `errno` module on Linux).
mod libc_errno {
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const EACCES: i32 = 13;
    pub const ENOSPC: i32 = 28;
    pub const EROFS: i32 = 30;
    pub const ENOLCK: i32 = 37;
    pub const EDQUOT: i32 = 122;
}

/// `Result` of the engine into `PyResult`.
pub trait IntoPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_pyerr)
    }
}
