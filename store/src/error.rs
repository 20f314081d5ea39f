//! The engine's error type: one enum, each variant a distinct situation a
//! caller may want to handle (the Python binding maps each to an exception
//! class).

use std::io;
use std::path::PathBuf;

use lazyvault_schema::SchemaError;

use crate::npy::NpyError;
use crate::query::QueryError;

/// Result alias of the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O error on a named file, with its `io::ErrorKind` kept.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// Another process writes the store (one writer at a time).
    #[error("store {path} is being written by {holder}: one writer at a time (readers need no lock: open with mode 'r', or read before writing; writing becomes possible once that writer closes)")]
    Locked {
        path: PathBuf,
        holder: String,
        pid: Option<u32>,
    },
    /// The file system refuses locks (`ENOLCK`), so a writer cannot make
    /// sure it is alone.
    #[error("{0}: the file system refuses file locks (ENOLCK), so a writer cannot make sure it is the only one; mount it with locking (NFS: without `nolock`, with lockd running; Lustre: `-o flock`) or write the store on a local disk; readers (mode 'r') need no lock")]
    NoLocks(PathBuf),
    /// Mode `"w"` on a path that exists.
    #[error("{0}: already exists (mode 'w' creates a new store)")]
    Exists(PathBuf),
    /// Mode `"r"` on a path that is not there.
    #[error("{0}: no such store")]
    NotFound(PathBuf),
    /// A directory that is neither empty nor a store.
    #[error("{0}: not a lazyvault store (a store is a directory holding lazyvault.json; an empty or missing directory becomes one when opened with mode 'a' or 'w')")]
    NotAStore(PathBuf),
    /// The manifest is from an unknown newer major version, or malformed.
    #[error("{path}: {source}")]
    Format { path: PathBuf, source: SchemaError },
    /// A record, manifest or payload that is damaged.
    #[error("{what}: {detail}")]
    Corrupt { what: String, detail: String },
    /// A write on a store opened with mode `"r"`.
    #[error("store is read-only (opened with mode 'r')")]
    ReadOnly,
    /// Any use after `close()`.
    #[error("store is closed")]
    Closed,
    /// The store was opened in a parent process and used after `fork()`.
    #[error("this Store was opened in process {opener} and used in forked child {current}; sled cannot be used across fork(): open the store in the child, or pass records (they pickle by reference)")]
    Forked { opener: u32, current: u32 },
    /// The empty string is not a key.
    #[error("keys must be non-empty strings")]
    EmptyKey,
    /// A bad query expression.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// A payload the caller asked to write that does not describe itself
    /// consistently (wrong byte count for its dtype and shape, bad descr).
    #[error("array {name:?}: {detail}")]
    InvalidArray { name: String, detail: String },
    /// A key or a record's metadata beyond what the format can hold.
    #[error("{0} cannot be stored")]
    TooLarge(String),
    /// A field name that cannot have a secondary index.
    #[error("index field: {0}")]
    InvalidField(String),
    /// Data that a file format cannot carry (an export to `.npz` of a record
    /// with a pickled remainder...): the message says what and what to use.
    #[error("{0}")]
    Unsupported(String),
    /// A long operation stopped because its progress callback asked to.
    #[error("cancelled")]
    Cancelled,
    /// The index (sled) failed.
    #[error("index: {0}")]
    Index(String),
    /// A file to import that is none of the formats lazyvault reads.
    #[error("{path}: {detail}")]
    UnknownFormat { path: PathBuf, detail: String },
    /// A file to import that claims a known format but is malformed,
    /// truncated or hostile; `what` names the file and the member or tensor.
    #[error("{what}: {detail}")]
    InvalidFile { what: String, detail: String },
    /// Importing `what` (an `object` array) needs unpickling, and the store
    /// was opened without `allow_pickle`.
    #[error("{what} is an object array stored as a pickle; loading it can run arbitrary code: open the store with allow_pickle=True if you trust the file")]
    PickleNotAllowed { what: String },
    /// A file that cannot be imported as asked (e.g. `key=` for a file of
    /// several records).
    #[error("{0}")]
    Interop(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    pub(crate) fn invalid_file(what: impl Into<String>, detail: impl ToString) -> Error {
        Error::InvalidFile {
            what: what.into(),
            detail: detail.to_string(),
        }
    }

    pub(crate) fn corrupt(what: impl Into<String>, detail: impl ToString) -> Error {
        Error::Corrupt {
            what: what.into(),
            detail: detail.to_string(),
        }
    }
}

impl From<NpyError> for Error {
    fn from(e: NpyError) -> Self {
        Error::corrupt("npy header", e)
    }
}
