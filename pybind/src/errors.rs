//! One mapping from the engine's `Error` to the exception classes of
//! `lazyvault.errors` (defined in Python so they can subclass two builtins,
//! e.g. `QueryError(LazyvaultError, ValueError)`). Unknown variants fall back
//! to the root class.

use lazyvault_store::Error;
use pyo3::call::PyCallArgs;
use pyo3::prelude::*;

/// Builds `lazyvault.errors.<class_name>(*args)` with extra attributes.
fn raise<'py, A: PyCallArgs<'py>>(
    py: Python<'py>,
    class_name: &str,
    args: A,
    attrs: &[(&str, Py<PyAny>)],
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let class = py.import("lazyvault.errors")?.getattr(class_name)?;
        let exc = class.call1(args)?;
        for (name, value) in attrs {
            exc.setattr(*name, value)?;
        }
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|e| e)
}

/// Converts an engine error into the matching Python exception.
pub fn to_pyerr(err: Error) -> PyErr {
    Python::attach(|py| {
        let msg = err.to_string();
        match &err {
            Error::Io { path, source } => {
                // sled rebuilds some errors from their kind alone: recover
                // the errno Python code tests for.
                let errno = source.raw_os_error().unwrap_or(match source.kind() {
                    std::io::ErrorKind::StorageFull => libc_errno::ENOSPC,
                    std::io::ErrorKind::PermissionDenied => libc_errno::EACCES,
                    std::io::ErrorKind::NotFound => libc_errno::ENOENT,
                    std::io::ErrorKind::ReadOnlyFilesystem => libc_errno::EROFS,
                    std::io::ErrorKind::QuotaExceeded => libc_errno::EDQUOT,
                    _ => libc_errno::EIO,
                });
                raise(
                    py,
                    "StorageError",
                    (
                        errno,
                        source.to_string(),
                        path.to_string_lossy().into_owned(),
                    ),
                    &[],
                )
            }
            Error::Locked { pid, .. } => raise(
                py,
                "StoreLockedError",
                (msg,),
                &[(
                    "pid",
                    pid.into_pyobject(py)
                        .map(|p| p.unbind())
                        .unwrap_or_else(|_| py.None()),
                )],
            ),
            Error::NoLocks(path) => raise(
                py,
                "StorageError",
                (
                    libc_errno::ENOLCK,
                    msg.clone(),
                    path.to_string_lossy().into_owned(),
                ),
                &[],
            ),
            Error::Exists(_) => raise(py, "StoreExistsError", (msg,), &[]),
            Error::NotFound(_) => raise(py, "StoreNotFoundError", (msg,), &[]),
            Error::NotAStore(_) => raise(py, "NotAStoreError", (msg,), &[]),
            Error::Format { source, .. } => {
                let class = match source {
                    lazyvault_store::schema::SchemaError::UnsupportedVersion { .. } => {
                        "FormatVersionError"
                    }
                    _ => "NotAStoreError",
                };
                raise(py, class, (msg,), &[])
            }
            Error::Corrupt { .. } => raise(py, "CorruptError", (msg,), &[]),
            Error::ReadOnly => raise(py, "ReadOnlyError", (msg,), &[]),
            Error::Closed => raise(py, "ClosedError", (msg,), &[]),
            Error::Forked { .. } => raise(py, "ForkedStoreError", (msg,), &[]),
            Error::EmptyKey => raise(py, "InvalidKeyError", (msg,), &[]),
            Error::InvalidArray { .. } => raise(py, "InvalidArrayError", (msg,), &[]),
            Error::InvalidField(_) => raise(py, "InvalidFieldError", (msg,), &[]),
            Error::TooLarge(_) => raise(py, "InvalidArrayError", (msg,), &[]),
            Error::UnknownFormat { .. } => raise(py, "UnknownFormatError", (msg,), &[]),
            Error::InvalidFile { .. } => raise(py, "InvalidFileError", (msg,), &[]),
            Error::PickleNotAllowed { .. } => raise(py, "PickleNotAllowedError", (msg,), &[]),
            Error::Interop(_) => raise(py, "InteropError", (msg,), &[]),
            Error::Unsupported(_) => raise(py, "InteropError", (msg,), &[]),
            Error::Query(q) => raise(
                py,
                "QueryError",
                (msg.clone(),),
                &[
                    (
                        "column",
                        q.column.into_pyobject(py).unwrap().into_any().unbind(),
                    ),
                    (
                        "expression",
                        q.expression
                            .clone()
                            .into_pyobject(py)
                            .unwrap()
                            .into_any()
                            .unbind(),
                    ),
                    (
                        "reason",
                        q.message
                            .clone()
                            .into_pyobject(py)
                            .unwrap()
                            .into_any()
                            .unbind(),
                    ),
                ],
            ),
            _ => raise(py, "LazyvaultError", (msg,), &[]),
        }
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
    /// The value, or the engine's error as its Python exception.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_pyerr)
    }
}
