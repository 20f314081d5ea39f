//! The record journal: every put and delete is appended, before its index
//! entry, to an append-only segment file under `journal/`, and the segment
//! is fsynced by `flush()` before sled is (group commit: one fsync per flush,
//! whatever the number of records). The index is derived data: everything
//! it holds can be rebuilt from the journal and the payloads, which
//! [`crate::Store::repair`] does by replaying the journal (FORMAT.md,
//! "Index" and "Repair").
//!
//! A segment is `journal/<number>.log` (16 lowercase hex digits); each
//! writing session appends to a new one. Layout (FORMAT.md, "Record
//! journal"), integers little-endian:
//!
//! ```text
//! segment  magic b"LVJRNL\0\x01" (8) | segment number u64 (8) | entries...
//! entry    magic b"LVREC\0\x01\n" (8) | reserved u64 = 0 (8)
//!          | key length u32 | record length u32 | flags u32 | reserved u32
//!          | pickle length u64 | key | record JSON | pickle
//!          | CRC-32 (IEEE) of the entry's preceding bytes (4)
//! flags    bit 0: a pickled remainder follows; bit 1: a delete (no record);
//!          bit 2: a commit (no key, no record): flush() made all before durable
//! ```
//!
//! - `entry.rs`: one entry's encoding and checked decoding;
//! - `segment.rs`: segment files, their names and numbers, reading one;
//! - `commit.rs`: the committed changes past a position, as readers see them;
//! - `writer.rs`: appending, undoing, syncing and committing.

mod commit;
mod entry;
mod segment;
mod writer;

pub(crate) use commit::{read_committed, Committed, CommittedTail};
pub use entry::{decode, encode, Change, Entry};
pub(crate) use segment::{damaged_commits, numbered_files, read_segment, SEGMENT_HEADER_LEN};
pub use segment::{relpath, segments};
pub(crate) use writer::JournalWriter;

/// Directory (relative to the store root) holding the journal segments.
pub const JOURNAL_DIR: &str = "journal";

/// A position in the journal: segment number and byte offset in it.
pub(crate) type Position = (u64, u64);

/// One put as the writer appends it: key, record JSON, pickled remainder.
pub(crate) type Put<'a> = (&'a str, &'a [u8], Option<&'a [u8]>);

/// Whether the journal of the store at `root` still starts at its first
/// segment (number 1): replayed alone it gives every record.
/// Since 1.6 the segments a checkpoint covers are removed once no reader
/// needs them, and from then on only a checkpoint holds their records.
///
/// # Errors
/// I/O errors listing `journal/`.
pub(crate) fn is_whole(root: &std::path::Path) -> crate::error::Result<bool> {
    Ok(segments(root)?.first().is_some_and(|(n, _)| *n == 1))
}
