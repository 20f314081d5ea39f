//! lazyvault's engine: a store of records (JSON metadata indexed in sled)
//! whose numpy arrays live in standard `.npy` payload files, memory-mapped on
//! first access; arrays of at most 64 KiB are members of packs (one
//! uncompressed zip of aligned `.npy` members per put) and read with one
//! `pread`.
//!
//! ```no_run
//! use lazyvault_store::{ArraySource, Mode, Store, query::Query};
//! let store = Store::open("runs.lv", Mode::Append)?;
//! let data: Vec<u8> = (0..24u8).collect();
//! let meta = serde_json::json!({"temperature": 300.0}).as_object().unwrap().clone();
//! store.put("run-1", meta, serde_json::Value::Null, &[ArraySource {
//!     name: "positions".into(), descr: "'|u1'".into(), dtype: "uint8".into(),
//!     shape: vec![8, 3], fortran_order: false, data: &data, pickled: false,
//! }], None)?;
//! let hits = store.find(&Query::parse("temperature > 250")?)?;
//! let record = store.get("run-1")?.unwrap();
//! let mapped = lazyvault_store::map_payload(store.root(), &record.arrays["positions"])?;
//! assert_eq!(mapped.as_bytes(), &data[..]);
//! # Ok::<(), lazyvault_store::Error>(())
//! ```

pub mod archive;
mod checkpoint;
mod columns;
mod error;
mod fsio;
mod index;
pub mod interop;
pub mod journal;
pub mod npy;
mod open_packs;
mod pack;
mod payload;
mod pid;
pub mod query;
mod scan;
mod secondary;
mod snapshot;
mod store;

pub use checkpoint::CHECKPOINT_DIR;
pub use error::{
    CorruptError, Error, IndexError, InteropError, OpenError, Result, StorageError, UsageError,
};
pub use fsio::fault;
pub use lazyvault_schema as schema;
#[doc(hidden)]
pub use payload::legacy;
pub use payload::{
    load_payload, map_payload, open_payload, read_payload, ArraySource, MappedPayload,
    READ_MAX_BYTES,
};
#[doc(hidden)]
pub use store::set_max_pending_bytes;
pub(crate) use store::INDEXES_FILE;

/// Reads `bytes` as a checkpoint column file (FORMAT.md, "Column files")
/// and decodes every column, as a reader does: the number of rows, or
/// what is wrong. Never panics. For the fuzz targets; not a stable API.
#[doc(hidden)]
pub fn read_column_file(bytes: &[u8]) -> std::result::Result<usize, String> {
    columns::read_file_bytes(bytes)
}
pub use store::{
    GcReport, JsonText, JsonTextError, Keys, Mode, NewRecord, NewRecordJson, RepairReport, Stage,
    StagedRecord, Store, VerifyReport, INDEX_DIR, MAX_RECORD_BYTES,
};
