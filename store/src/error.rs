//! The engine's errors: one small enum per concern (the file system, opening
//! a store, damaged data, misuse by the caller, queries, the index), each
//! converting into the umbrella [`Error`] that every engine function returns
//! (the layout of redb's `error.rs`). The Python binding maps each variant to
//! one exception class.

use std::io;
use std::path::{Path, PathBuf};

use lazyvault_schema::SchemaError;

use crate::npy::NpyError;
use crate::query::QueryError;

/// Result alias of the engine: every fallible engine function returns
/// `Result<T>`, with [`Error`] as the error unless `E` is given.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine: one variant per concern.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file system failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A store could not be opened (or reopened) as asked.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// Data on disk is damaged (boxed: its context would make every
    /// `Result` of the engine larger).
    #[error(transparent)]
    Corrupt(Box<CorruptError>),
    /// The caller asked for something the store cannot do in its state.
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// A bad query expression.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The index (sled) failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// A file to import or export that lazyvault cannot read or write as
    /// asked.
    #[error(transparent)]
    Interop(#[from] InteropError),
}

/// The file system failed on one of the store's files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// An I/O error on a named file, with its `io::ErrorKind` and errno
    /// kept. Happens on a full disk (`ENOSPC`), a permission change, a
    /// failing device... The store stays consistent: retry once the cause
    /// is fixed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// The file system refuses locks (`ENOLCK`), so a writer cannot make
    /// sure it is alone. Mount it with locking, write on a local disk, or
    /// open read-only (readers need no lock).
    #[error("{0}: the file system refuses file locks (ENOLCK), so a writer cannot make sure it is the only one; mount it with locking (NFS: without `nolock`, with lockd running; Lustre: `-o flock`) or write the store on a local disk; readers (mode 'r') need no lock")]
    NoLocks(PathBuf),
}

/// A store could not be opened as asked (mode, path, format, other
/// writers, process).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Mode `"w"` on a path that exists: pick another path, or open with
    /// mode `"a"`.
    #[error("{0}: already exists (mode 'w' creates a new store)")]
    Exists(PathBuf),
    /// Mode `"r"` (or a repair, or a reader's refresh) on a path that holds
    /// no store: check the path, or create it with mode `"a"`/`"w"`.
    #[error("{0}: no such store")]
    NotFound(PathBuf),
    /// A file, or a directory that is neither empty nor a store: nothing
    /// is touched; pick another path.
    #[error("{0}: not a lazyvault store (a store is a directory holding lazyvault.json; an empty or missing directory becomes one when opened with mode 'a' or 'w')")]
    NotAStore(PathBuf),
    /// The manifest is from an unknown newer major version (upgrade
    /// lazyvault), or malformed.
    #[error("{path}: {source}")]
    Format {
        /// The manifest (or archive) read.
        path: PathBuf,
        /// What the schema refused.
        source: SchemaError,
    },
    /// Another process writes the store (one writer at a time): read with
    /// mode `"r"`, or write once that writer closes.
    #[error("store {path} is being written by {holder}: one writer at a time (readers need no lock: open with mode 'r', or read before writing; writing becomes possible once that writer closes)")]
    Locked {
        /// The store's directory.
        path: PathBuf,
        /// Who holds it, as far as known (a description for the message).
        holder: String,
        /// The holder's process id, when known.
        pid: Option<u32>,
    },
    /// The store was opened in a parent process and used after `fork()`:
    /// open it again in the child.
    #[error("this Store was opened in process {opener} and used in forked child {current}; sled cannot be used across fork(): open the store in the child, or pass records (they pickle by reference)")]
    Forked {
        /// The process that opened the store.
        opener: u32,
        /// The process that used it.
        current: u32,
    },
    /// A forked child tried to write a store (any store) after its parent
    /// had written one: sled, the writer's index, starts its I/O threads
    /// once per process and fork() does not copy them, so the child would
    /// wait forever. Readers (mode `"r"`) never use sled and work.
    #[error("this process ({current}) was forked from process {parent} after that process had written a store, so it cannot write one: sled, the writer's index, starts its I/O threads once per process and fork() does not copy them (it would hang); write from the parent, or start the worker with multiprocessing's 'spawn' or 'forkserver' method (reading with mode 'r' works in forked children)")]
    ForkedIndex {
        /// The process that first opened a sled index.
        parent: u32,
        /// This process.
        current: u32,
    },
}

/// Damaged data: a record, the journal, a checkpoint, the index or a
/// payload file is not what the store wrote. Nothing is changed; a writer
/// can often recover with `Store::repair`, a reader by refreshing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptError {
    /// Damage described in text.
    #[error("{what}: {detail}")]
    Damaged {
        /// What is damaged (e.g. `payload <path>`, `record "k"`).
        what: String,
        /// What is wrong with it.
        detail: String,
        /// The record's key, when known.
        key: Option<String>,
        /// The array's name, when known.
        array: Option<String>,
        /// The damaged file, when known.
        path: Option<PathBuf>,
    },
    /// A payload's `.npy` header that does not parse.
    #[error("{what}: {source}")]
    NpyHeader {
        /// What holds the header (e.g. `payload <path>`).
        what: String,
        /// What is wrong with the header.
        source: NpyError,
        /// The record's key, when known.
        key: Option<String>,
        /// The array's name, when known.
        array: Option<String>,
        /// The damaged file, when known.
        path: Option<PathBuf>,
    },
}

impl CorruptError {
    /// The record's key, when known.
    pub fn key(&self) -> Option<&str> {
        match self {
            CorruptError::Damaged { key, .. } | CorruptError::NpyHeader { key, .. } => {
                key.as_deref()
            }
        }
    }

    /// The array's name, when known.
    pub fn array(&self) -> Option<&str> {
        match self {
            CorruptError::Damaged { array, .. } | CorruptError::NpyHeader { array, .. } => {
                array.as_deref()
            }
        }
    }

    /// The damaged file, when known.
    pub fn path(&self) -> Option<&Path> {
        match self {
            CorruptError::Damaged { path, .. } | CorruptError::NpyHeader { path, .. } => {
                path.as_deref()
            }
        }
    }

    /// What is damaged.
    pub fn what(&self) -> &str {
        match self {
            CorruptError::Damaged { what, .. } | CorruptError::NpyHeader { what, .. } => what,
        }
    }

    /// What is wrong with it.
    pub fn detail(&self) -> String {
        match self {
            CorruptError::Damaged { detail, .. } => detail.clone(),
            CorruptError::NpyHeader { source, .. } => source.to_string(),
        }
    }

    fn context(
        &mut self,
    ) -> (
        &mut Option<String>,
        &mut Option<String>,
        &mut Option<PathBuf>,
    ) {
        match self {
            CorruptError::Damaged {
                key, array, path, ..
            }
            | CorruptError::NpyHeader {
                key, array, path, ..
            } => (key, array, path),
        }
    }
}

/// The caller asked for something the store cannot do (in its state, or
/// with these arguments); nothing was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    /// A write on a store opened with mode `"r"`: open it with `"a"`.
    #[error("store is read-only (opened with mode 'r')")]
    ReadOnly,
    /// Any use after `close()`: open the store again.
    #[error("store is closed")]
    Closed,
    /// The empty string is not a key (any other string is).
    #[error("keys must be non-empty strings")]
    EmptyKey,
    /// A field name that cannot have a secondary index (not a dotted field
    /// path).
    #[error("index field: {0}")]
    InvalidField(String),
    /// A long operation stopped because its progress callback asked to;
    /// what was done before stays valid.
    #[error("cancelled")]
    Cancelled,
    /// A payload the caller asked to write (or read by name) that does not
    /// describe itself consistently (wrong byte count for its dtype and
    /// shape, bad descr, no array of this name).
    #[error("array {name:?}: {detail}")]
    InvalidArray {
        /// The array's name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// A key or a record's metadata beyond what the format can hold
    /// (4 GiB): store less.
    #[error("{0} cannot be stored")]
    TooLarge(String),
    /// A record whose JSON (without its array entries) plus pickled
    /// remainder would take more than
    /// [`MAX_RECORD_BYTES`](crate::MAX_RECORD_BYTES) in the index (FORMAT.md,
    /// "Record size cap"): nothing was written. Big data belongs in arrays
    /// (payload files, memory-mapped), not in metadata.
    #[error(
        "record {key:?} would take {size} bytes in the index (its metadata, layout and pickled \
         remainder; a metadata value that a full layout repeats counts twice), \
         over the cap of {cap} bytes: {detail}; store big data as numpy arrays (payload files), \
         not as metadata"
    )]
    RecordTooLarge {
        /// The record's key.
        key: String,
        /// Its JSON without array entries plus pickled remainder, in bytes.
        size: u64,
        /// The cap, [`MAX_RECORD_BYTES`](crate::MAX_RECORD_BYTES).
        cap: u64,
        /// Its largest top-level metadata fields with their sizes, and the
        /// size of its pickled remainder when it has one.
        detail: String,
    },
}

/// The index (sled) failed other than by I/O or corruption (both of which
/// become [`StorageError`] / [`CorruptError`]). Reopening, or
/// `Store::repair`, rebuilds it from the journal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// sled reported a failure; the text names the index directory.
    #[error("index: {0}")]
    Sled(String),
}

/// A file to import (`.npy`, `.npz`, `.safetensors`) or export that cannot
/// be read or written as asked; nothing was written to the store (import)
/// and no file was left (export).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InteropError {
    /// A file to import that is none of the formats lazyvault reads.
    #[error("{path}: {detail}")]
    UnknownFormat {
        /// The file.
        path: PathBuf,
        /// What its first bytes are, and what was expected.
        detail: String,
    },
    /// A file to import that claims a known format but is malformed,
    /// truncated or hostile (a header larger than the file, overlapping
    /// tensors, a decompression bomb...).
    #[error("{what}: {detail}")]
    InvalidFile {
        /// The file, and the member or tensor.
        what: String,
        /// What is wrong.
        detail: String,
        /// The file, when known (an import sets it for every file it reads).
        path: Option<PathBuf>,
    },
    /// Two files of one import would write the same key (a directory's
    /// `.lvz` or lazyvault `.npz` bringing back a key another file is
    /// imported as): nothing was written.
    #[error("{first} and {second} would both be imported as {}: nothing was written (one import or merge takes each key once); rename it in one of them, or import or merge them one at a time, the later replacing the earlier's record", crate::interop::npz::quoted(.key))]
    KeyCollision {
        /// The key.
        key: String,
        /// The file that gives it first.
        first: PathBuf,
        /// The file that gives it again.
        second: PathBuf,
    },
    /// Importing `what` (an `object` array) needs unpickling, and the store
    /// was opened without `allow_pickle`.
    #[error("{what} is an object array stored as a pickle; loading it can run arbitrary code: open the store with allow_pickle=True if you trust the file")]
    PickleNotAllowed {
        /// The file and member.
        what: String,
    },
    /// Data the format cannot carry or a request it cannot answer (an
    /// export to `.npz` of a record with a pickled remainder, `key=` for a
    /// file of several records): the message says what to use instead.
    #[error("{0}")]
    Unsupported(String),
}

impl Error {
    /// An [`InteropError::InvalidFile`]: `what` (file and member) is
    /// malformed, `detail` says how.
    pub(crate) fn invalid_file(what: impl Into<String>, detail: impl ToString) -> Error {
        InteropError::InvalidFile {
            what: what.into(),
            detail: detail.to_string(),
            path: None,
        }
        .into()
    }

    /// Names the file `path` in an [`InteropError::InvalidFile`] that names
    /// none yet, and turns damage found in it ([`Error::Corrupt`], from the
    /// archive reader) into one: `path` is an input file, not the store's.
    /// Other errors pass.
    pub(crate) fn in_input_file(self, path: &Path) -> Error {
        match self {
            Error::Interop(InteropError::InvalidFile {
                what,
                detail,
                path: None,
            }) => InteropError::InvalidFile {
                what,
                detail,
                path: Some(path.to_owned()),
            }
            .into(),
            Error::Corrupt(c) => InteropError::InvalidFile {
                what: c.what().to_owned(),
                detail: c.detail(),
                path: Some(path.to_owned()),
            }
            .into(),
            other => other,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| StorageError::Io { path, source }.into()
    }

    /// A [`CorruptError`]: `what` is damaged, `detail` says how.
    pub fn corrupt(what: impl Into<String>, detail: impl ToString) -> Error {
        CorruptError::Damaged {
            what: what.into(),
            detail: detail.to_string(),
            key: None,
            array: None,
            path: None,
        }
        .into()
    }

    /// A damaged `.npy` header of `what`, keeping the header's error.
    pub(crate) fn npy(what: impl Into<String>, source: NpyError) -> Error {
        CorruptError::NpyHeader {
            what: what.into(),
            source,
            key: None,
            array: None,
            path: None,
        }
        .into()
    }

    pub(crate) fn closed() -> Error {
        UsageError::Closed.into()
    }

    pub(crate) fn read_only() -> Error {
        UsageError::ReadOnly.into()
    }

    pub(crate) fn empty_key() -> Error {
        UsageError::EmptyKey.into()
    }

    pub(crate) fn too_large(what: impl Into<String>) -> Error {
        UsageError::TooLarge(what.into()).into()
    }

    pub(crate) fn not_found(path: PathBuf) -> Error {
        OpenError::NotFound(path).into()
    }

    pub(crate) fn not_a_store(path: PathBuf) -> Error {
        OpenError::NotAStore(path).into()
    }

    pub(crate) fn cancelled() -> Error {
        UsageError::Cancelled.into()
    }

    pub(crate) fn invalid_field(detail: String) -> Error {
        UsageError::InvalidField(detail).into()
    }

    pub(crate) fn index(detail: String) -> Error {
        IndexError::Sled(detail).into()
    }

    /// Names the record `key` in a [`CorruptError`] (other errors pass).
    pub(crate) fn with_key(mut self, key: &str) -> Error {
        if let Error::Corrupt(c) = &mut self {
            *c.context().0 = Some(key.to_owned());
        }
        self
    }

    /// Names the array `name` in a [`CorruptError`] (other errors pass).
    pub(crate) fn with_array(mut self, name: &str) -> Error {
        if let Error::Corrupt(c) = &mut self {
            *c.context().1 = Some(name.to_owned());
        }
        self
    }

    /// Names the damaged file in a [`CorruptError`] (other errors pass).
    pub(crate) fn with_path(mut self, path: &Path) -> Error {
        if let Error::Corrupt(c) = &mut self {
            *c.context().2 = Some(path.to_owned());
        }
        self
    }
}

impl From<CorruptError> for Error {
    fn from(e: CorruptError) -> Self {
        Error::Corrupt(Box::new(e))
    }
}

impl From<NpyError> for Error {
    fn from(e: NpyError) -> Self {
        Error::npy("npy header", e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_errors_display_their_path_and_cause() {
        let e = Error::io("/s/f.npy")(io::Error::from_raw_os_error(28));
        let text = e.to_string();
        assert!(text.starts_with("/s/f.npy: "), "{text}");
        assert!(text.contains("28"), "{text}");
        let e = Error::from(StorageError::NoLocks("/nfs/s".into()));
        assert!(e
            .to_string()
            .contains("/nfs/s: the file system refuses file locks (ENOLCK)"));
    }

    #[test]
    fn open_errors_display_their_data() {
        let e = Error::from(OpenError::Locked {
            path: "/s".into(),
            holder: "process 42".into(),
            pid: Some(42),
        });
        assert!(e
            .to_string()
            .starts_with("store /s is being written by process 42: "));
        let e = Error::from(OpenError::Forked {
            opener: 1,
            current: 2,
        });
        assert!(e
            .to_string()
            .contains("opened in process 1 and used in forked child 2"));
        assert_eq!(
            Error::from(OpenError::NotFound("/x".into())).to_string(),
            "/x: no such store"
        );
        assert!(Error::from(OpenError::Exists("/x".into()))
            .to_string()
            .starts_with("/x: already exists"));
        assert!(Error::from(OpenError::NotAStore("/x".into()))
            .to_string()
            .starts_with("/x: not a lazyvault store"));
    }

    #[test]
    fn corrupt_errors_display_their_data_and_keep_context() {
        let e = Error::corrupt("payload /s/p.npy", "file is truncated")
            .with_key("k")
            .with_array("a")
            .with_path(Path::new("/s/p.npy"));
        assert_eq!(e.to_string(), "payload /s/p.npy: file is truncated");
        let Error::Corrupt(c) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(
            (c.key(), c.array(), c.path()),
            (Some("k"), Some("a"), Some(Path::new("/s/p.npy")))
        );
        assert_eq!(
            (c.what(), c.detail().as_str()),
            ("payload /s/p.npy", "file is truncated")
        );
        // A damaged .npy header keeps its NpyError as the source.
        let e = Error::from(NpyError::BadMagic);
        assert!(
            e.to_string().starts_with("npy header: not an .npy file"),
            "{e}"
        );
        let source = std::error::Error::source(&e);
        assert!(source.is_some_and(|s| s.is::<NpyError>()), "{e:?}");
        // Context is for corruption only.
        let e = Error::closed().with_key("k");
        assert!(matches!(e, Error::Usage(UsageError::Closed)));
    }

    #[test]
    fn usage_errors_display_their_data() {
        assert_eq!(Error::closed().to_string(), "store is closed");
        assert_eq!(
            Error::read_only().to_string(),
            "store is read-only (opened with mode 'r')"
        );
        assert_eq!(
            Error::empty_key().to_string(),
            "keys must be non-empty strings"
        );
        assert_eq!(
            Error::from(UsageError::InvalidArray {
                name: "x".into(),
                detail: "3 bytes, expected 8".into()
            })
            .to_string(),
            "array \"x\": 3 bytes, expected 8"
        );
        assert_eq!(
            Error::too_large("a key of 4 GiB or more").to_string(),
            "a key of 4 GiB or more cannot be stored"
        );
        assert_eq!(
            Error::from(UsageError::InvalidField("a..b".into())).to_string(),
            "index field: a..b"
        );
        assert_eq!(Error::from(UsageError::Cancelled).to_string(), "cancelled");
    }

    #[test]
    fn query_and_index_errors_display_their_data() {
        let e = Error::from(QueryError::new(3, "unexpected token", "a >> 1"));
        assert!(
            e.to_string().starts_with("unexpected token at column 3"),
            "{e}"
        );
        let e = Error::from(IndexError::Sled("/s/index: unsupported".into()));
        assert_eq!(e.to_string(), "index: /s/index: unsupported");
    }
}
