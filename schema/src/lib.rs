//! The on-disk format of a lazyvault store: the manifest, the record that the
//! index keeps for each key, and the rules that make them valid.
//!
//! `FORMAT.md` beside this crate is the prose specification; this crate is its
//! executable half. Everything that decides where a file lives or whether a
//! record may be trusted goes through here, so that a hostile record can never
//! name a path outside the store (FORMAT.md, "Payload files").

mod manifest;
mod record;

pub use manifest::{
    FormatVersion, Manifest, ARCHIVE_FORMAT_VERSION, FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE,
    OLDEST_MAJOR,
};
pub use record::{
    may_have_pickle, pack_relpath, payload_relpath, ArrayEntry, Record, RecordOutline, PAYLOAD_DIR,
    PAYLOAD_ID_LEN,
};

/// A manifest or record that does not follow the format.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaError {
    /// The manifest names another format (this directory is not a lazyvault store).
    #[error("not a lazyvault store: manifest format is {found:?}, expected {FORMAT_NAME:?}")]
    WrongFormat {
        /// The manifest's `format` value.
        found: String,
    },
    /// The store was written by a newer, incompatible major version.
    #[error(
        "store format version {found} is newer than this lazyvault supports ({supported}); \
         upgrade lazyvault to open it"
    )]
    UnsupportedVersion {
        /// The store's `MAJOR.MINOR` format version.
        found: String,
        /// The newest format version this build reads (`FORMAT_VERSION`).
        supported: String,
    },
    /// The store claims a major version older than any lazyvault wrote.
    #[error(
        "store format version {found} is older than any this lazyvault reads ({oldest}.0 and \
         later): not a store lazyvault wrote, or a damaged manifest"
    )]
    OlderVersion {
        /// The store's `MAJOR.MINOR` format version.
        found: String,
        /// The oldest major this build reads.
        oldest: u32,
    },
    /// A version string that is not `MAJOR.MINOR`.
    #[error("malformed format version {0:?} (expected MAJOR.MINOR)")]
    MalformedVersion(String),
    /// JSON that does not decode as the expected document.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// The document: `"manifest"` or `"record"`.
        what: &'static str,
        /// The JSON decoder's message.
        detail: String,
    },
    /// A record that decodes but breaks a rule of the format.
    #[error("invalid record: {0}")]
    InvalidRecord(String),
}
