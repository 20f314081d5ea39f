//! A checkpoint run: an immutable table of entries sorted strictly by key
//! (UTF-8 byte order), written once through a temporary file and then
//! memory-mapped by readers, who binary-search it. Each entry is a record
//! (its JSON bytes and an optional pickled remainder) or a tombstone (the
//! key was deleted; merges of newer runs over older ones need it).
//!
//! Layout, integers little-endian:
//!
//! ```text
//! header (64 bytes)
//!   0  magic b"LVRUN\0\x01\n" (8)
//!   8  entry count u64
//!   16 table offset u64: start of the key table = end of the entries
//!      (a multiple of 8, >= 64)
//!   24 file length u64 (= the file's actual length)
//!   32 reserved, zero (3 x u64): readers refuse non-zero (a newer version)
//!   56 CRC-32 (IEEE) of bytes 0..56 (u32)
//!   60 reserved u32, zero
//! entries, from byte 64, contiguous, each at a multiple of 8
//!   0  key length u32
//!   4  record length u32
//!   8  pickle length u64
//!   16 flags u32: bit 0 a pickle follows; bit 1 a tombstone (then both
//!      lengths are 0 and bit 0 is clear); other bits 0
//!   20 CRC-32 of (entry bytes 0..20, key, record, pickle) (u32)
//!   24 key (non-empty UTF-8) | record JSON | pickle | zero padding to 8
//! key table, at the table offset
//!   entry count x u64: each entry's offset, in key order
//!   u64: XXH3-64 of every file byte before this field
//! ```
//!
//! so the file length is `table offset + 8 * count + 8`.
//!
//! The bytes may be damaged or hostile: every length and offset is checked
//! against the buffer before use, nothing is allocated from a length read
//! from the file, and damage is reported as [`Error::Corrupt`] naming the
//! file, never a panic. Opening checks only the header (O(1)); each entry
//! returned has its CRC checked; [`Run::verify`] checks the whole file.

use std::cmp::Ordering;
use std::collections::binary_heap::{BinaryHeap, PeekMut};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use std::sync::Arc;

use crate::columns::{ColumnBuilder, Columns, ColumnsInfo, COLUMNS_SUFFIX};
use crate::error::{Error, Result};
use crate::fsio;

/// The column file name of a run (`<id>.run` -> `<id>.arrow`).
pub(crate) fn columns_name(run: &str) -> String {
    format!(
        "{}{COLUMNS_SUFFIX}",
        run.strip_suffix(".run").unwrap_or(run)
    )
}

/// The first 8 bytes of every run file (the `\x01` is the format version;
/// the `\n` catches a text-mode transfer that rewrote line ends).
pub(crate) const RUN_MAGIC: &[u8; 8] = b"LVRUN\0\x01\n";

/// Length of the file header; the first entry starts here.
const HEADER_LEN: u64 = 64;
/// Length of an entry's fixed part, before its key.
const ENTRY_HEADER_LEN: u64 = 24;
/// The smallest entry: its fixed part and a 1-byte key, padded to 8.
const MIN_ENTRY_LEN: u64 = 32;
/// The XXH3-64 checksum that ends the file.
const CHECKSUM_LEN: u64 = 8;
/// The smallest file: a header and a checksum (a run of 0 entries).
const MIN_FILE_LEN: u64 = HEADER_LEN + CHECKSUM_LEN;
/// Entry flag: a pickled remainder follows the record.
const FLAG_PICKLE: u32 = 1;
/// Entry flag: the key was deleted (no record, no pickle).
const FLAG_TOMBSTONE: u32 = 2;
/// Zeros for padding entries to a multiple of 8.
const PADDING: [u8; 8] = [0; 8];

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunValue<'a> {
    /// The key's record JSON and, if any, its pickled remainder (which may
    /// be empty: `Some(&[])` is not `None`).
    Put {
        record: &'a [u8],
        pickle: Option<&'a [u8]>,
    },
    /// The key was deleted: it hides the key in older runs.
    Deleted,
}

/// Facts about a written run, recorded in the checkpoint file so that a
/// reader can tell the run it maps is the one the checkpoint names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunInfo {
    /// The file name only (the run lives in the directory given to the
    /// writer).
    pub file: String,
    /// Number of entries, tombstones included.
    pub entries: u64,
    /// Number of entries that are not tombstones.
    pub puts: u64,
    /// The file's length in bytes.
    pub bytes: u64,
    /// The XXH3-64 stored at the end of the file.
    pub checksum: u64,
    /// Its column file (`<id>.arrow` beside it), if one could be built
    /// (a record that does not decode leaves the run without one).
    pub columns: Option<ColumnsInfo>,
}

/// `n` rounded up to a multiple of 8, `None` on overflow.
fn padded(n: u64) -> Option<u64> {
    n.checked_add(7).map(|n| n & !7)
}

/// `len` bytes of `bytes` from `at`, `None` if any of it lies outside
/// (including offsets that do not fit a `usize`).
fn slice(bytes: &[u8], at: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(at).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    bytes.get(start..end)
}

/// The little-endian `u64` at `at`, if in bounds.
fn u64_at(bytes: &[u8], at: u64) -> Option<u64> {
    Some(u64::from_le_bytes(slice(bytes, at, 8)?.try_into().ok()?))
}

/// The little-endian `u32` at `at`, if in bounds.
fn u32_at(bytes: &[u8], at: u64) -> Option<u32> {
    Some(u32::from_le_bytes(slice(bytes, at, 4)?.try_into().ok()?))
}

/// A key for an error message, cut short: keys are usually small, but an
/// error should not carry megabytes of one.
fn show(key: &[u8]) -> String {
    const MAX: usize = 80;
    let text = String::from_utf8_lossy(&key[..key.len().min(MAX)]);
    if key.len() > MAX {
        format!("{text:?}... ({} bytes)", key.len())
    } else {
        format!("{text:?}")
    }
}

/// The 64-byte file header for `count` entries ending at `table`, with its
/// CRC; `None` if the file length would overflow.
fn encode_header(count: u64, table: u64) -> Option<[u8; HEADER_LEN as usize]> {
    let len = count
        .checked_mul(8)?
        .checked_add(CHECKSUM_LEN)?
        .checked_add(table)?;
    let mut h = [0u8; HEADER_LEN as usize];
    h[0..8].copy_from_slice(RUN_MAGIC);
    h[8..16].copy_from_slice(&count.to_le_bytes());
    h[16..24].copy_from_slice(&table.to_le_bytes());
    h[24..32].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&h[..56]);
    h[56..60].copy_from_slice(&crc.to_le_bytes());
    Some(h)
}

/// Writes a run into a directory, entries in strictly increasing key order.
///
/// The run goes to `name` + `".tmp"` and is renamed to `name` by
/// [`finish`](RunWriter::finish) only once complete and fsynced, so a crash
/// or an error never leaves a partial run under the real name. Writes are
/// buffered in pieces of [`fsio::WRITE_CHUNK`] (4 MiB), each ending on a
/// multiple of it in the file (see there why), all through [`fsio`] so that
/// fault-injection tests reach them. Memory is two such buffers and the
/// last key, whatever the number of entries: the key table is rebuilt at
/// `finish` from the entries read back (from the page cache, usually),
/// which the checksum needs anyway since it covers the header, only known
/// at the end. A hash of the entries as pushed is compared with the bytes
/// read back, so the checksum never vouches for bytes that differ from
/// what was pushed.
///
/// Any error poisons the writer: `finish` then refuses. Dropping a writer
/// that was not finished, or [`abort`](RunWriter::abort)ing it, removes the
/// temporary file.
pub(crate) struct RunWriter {
    /// The temporary file, open for writing; `None` once dropped.
    file: Option<File>,
    tmp: PathBuf,
    path: PathBuf,
    name: String,
    /// Bytes not yet written; they start at file offset `written`.
    buf: Vec<u8>,
    /// Size (and file alignment) of each write.
    chunk: usize,
    /// Bytes handed to the file so far (its write position).
    written: u64,
    count: u64,
    puts: u64,
    /// The last key pushed, to refuse keys out of order.
    last_key: Vec<u8>,
    /// XXH3 of the entries' bytes as pushed, to check the read-back.
    pushed: Xxh3,
    /// An error happened: the file is not a valid run.
    failed: bool,
    /// Renamed into place: nothing to clean up.
    done: bool,
    /// The columns of the entries pushed (`None` once a record failed to
    /// decode: the run then has no column file).
    columns: Option<ColumnBuilder>,
    /// Columns given whole instead ([`RunWriter::set_columns`]).
    given: Option<Columns>,
}

impl RunWriter {
    /// Creates `dir/name.tmp` (emptying one left by a crash) for a new run
    /// to be renamed to `dir/name`. Errors: [`StorageError::Io`](crate::StorageError::Io) naming the
    /// temporary file.
    pub(crate) fn create(dir: &Path, name: &str) -> Result<RunWriter> {
        RunWriter::with_chunk(dir, name, fsio::WRITE_CHUNK)
    }

    /// [`create`](RunWriter::create) with writes of `chunk` bytes (tests
    /// make it small to reach every way an entry can straddle two reads).
    fn with_chunk(dir: &Path, name: &str, chunk: usize) -> Result<RunWriter> {
        debug_assert!(chunk >= HEADER_LEN as usize);
        let path = dir.join(name);
        let tmp = dir.join(format!("{name}.tmp"));
        let file = fsio::create(&tmp).map_err(Error::io(&tmp))?;
        let mut writer = RunWriter {
            file: Some(file),
            tmp,
            path,
            name: name.to_owned(),
            buf: Vec::with_capacity(chunk),
            chunk,
            written: 0,
            count: 0,
            puts: 0,
            last_key: Vec::new(),
            pushed: Xxh3::new(),
            failed: false,
            done: false,
            columns: Some(ColumnBuilder::default()),
            given: None,
        };
        // Room for the header, written by finish() once the counts are known.
        writer.write(&[0; HEADER_LEN as usize])?;
        Ok(writer)
    }

    /// What errors about this writer name.
    fn what(&self) -> String {
        format!("checkpoint run {}", self.tmp.display())
    }

    /// Appends an entry. Errors, each of which poisons the writer:
    /// [`UsageError::EmptyKey`](crate::UsageError::EmptyKey); [`Error::Corrupt`] if `key` is not after the
    /// previous key in byte order (the caller's data is out of order: a run
    /// must never hold it); [`UsageError::TooLarge`](crate::UsageError::TooLarge) for a key or record of 4 GiB
    /// or more; [`StorageError::Io`](crate::StorageError::Io) from a buffered write.
    pub(crate) fn push(&mut self, key: &str, value: RunValue<'_>) -> Result<()> {
        if self.failed {
            return Err(self.poisoned());
        }
        let pushed = self.push_entry(key, value);
        if pushed.is_err() {
            self.failed = true;
        } else if let Some(columns) = &mut self.columns {
            let record = match value {
                RunValue::Put { record, .. } => Some(record),
                RunValue::Deleted => None,
            };
            if columns.push(key, record).is_err() {
                self.columns = None;
            }
        }
        pushed
    }

    fn poisoned(&self) -> Error {
        Error::corrupt(
            self.what(),
            "an earlier push or write failed: the run is incomplete",
        )
    }

    fn push_entry(&mut self, key: &str, value: RunValue<'_>) -> Result<()> {
        if key.is_empty() {
            return Err(Error::empty_key());
        }
        if self.count > 0 && key.as_bytes() <= &self.last_key[..] {
            return Err(Error::corrupt(
                self.what(),
                format!(
                    "key {} pushed after {}: keys must come in strictly increasing byte order",
                    show(key.as_bytes()),
                    show(&self.last_key)
                ),
            ));
        }
        let (record, pickle, flags) = match value {
            RunValue::Put { record, pickle } => (
                record,
                pickle,
                if pickle.is_some() { FLAG_PICKLE } else { 0 },
            ),
            RunValue::Deleted => (&[][..], None, FLAG_TOMBSTONE),
        };
        let pickle = pickle.unwrap_or_default();
        let key_len =
            u32::try_from(key.len()).map_err(|_| Error::too_large("a key of 4 GiB or more"))?;
        let record_len = u32::try_from(record.len())
            .map_err(|_| Error::too_large("a record of 4 GiB or more"))?;
        let mut h = [0u8; ENTRY_HEADER_LEN as usize];
        h[0..4].copy_from_slice(&key_len.to_le_bytes());
        h[4..8].copy_from_slice(&record_len.to_le_bytes());
        h[8..16].copy_from_slice(&(pickle.len() as u64).to_le_bytes());
        h[16..20].copy_from_slice(&flags.to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&h[..20]);
        crc.update(key.as_bytes());
        crc.update(record);
        crc.update(pickle);
        h[20..24].copy_from_slice(&crc.finalize().to_le_bytes());
        let body = ENTRY_HEADER_LEN as usize + key.len() + record.len() + pickle.len();
        let pad = body.next_multiple_of(8) - body;
        for part in [&h[..], key.as_bytes(), record, pickle, &PADDING[..pad]] {
            self.pushed.update(part);
            self.write(part)?;
        }
        self.count += 1;
        if flags & FLAG_TOMBSTONE == 0 {
            self.puts += 1;
        }
        self.last_key.clear();
        self.last_key.extend_from_slice(key.as_bytes());
        Ok(())
    }

    /// Buffers `bytes`, writing the buffer whenever the file position
    /// reaches a multiple of `chunk`.
    fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let at = self.written + self.buf.len() as u64;
            let room = self.chunk - (at % self.chunk as u64) as usize;
            let take = room.min(bytes.len());
            self.buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if take == room {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Writes out the buffer.
    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let Some(file) = self.file.as_mut() else {
            return Err(self.poisoned());
        };
        fsio::write_all(file, &self.tmp, &self.buf).map_err(Error::io(&self.tmp))?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Completes the run: writes the header, the key table and the
    /// checksum, fsyncs the file and renames it to its name (the caller
    /// fsyncs the directory, once for all the files it writes). Errors:
    /// [`StorageError::Io`](crate::StorageError::Io); [`Error::Corrupt`] if an earlier push failed. On error
    /// the temporary file is removed and nothing is renamed.
    pub(crate) fn finish(mut self) -> Result<RunInfo> {
        if self.failed {
            return Err(self.poisoned());
        }
        let finished = self.complete();
        if finished.is_err() {
            self.failed = true;
        }
        finished
    }

    fn complete(&mut self) -> Result<RunInfo> {
        self.flush()?;
        let table = self.written;
        let header = encode_header(self.count, table)
            .ok_or_else(|| Error::too_large(format!("{}: a run over 16 EiB", self.what())))?;
        let file_len = u64::from_le_bytes(header[24..32].try_into().expect("8 bytes"));
        {
            let file = self.file.as_mut().expect("open until dropped");
            file.seek(SeekFrom::Start(0))
                .and_then(|_| fsio::write_all(file, &self.tmp, &header))
                .and_then(|_| file.seek(SeekFrom::Start(table)))
                .map_err(Error::io(&self.tmp))?;
        }
        let mut hasher = Xxh3::new();
        hasher.update(&header);
        self.write_table(&mut hasher, table)?;
        let checksum = hasher.digest();
        self.write(&checksum.to_le_bytes())?;
        self.flush()?;
        if self.written != file_len {
            return Err(Error::corrupt(
                self.what(),
                format!("wrote {} bytes, the header says {file_len}", self.written),
            ));
        }
        let file = self.file.as_ref().expect("open until dropped");
        fsio::sync_file(file, &self.tmp).map_err(Error::io(&self.tmp))?;
        // The columns before the run's rename: a run in place always has
        // its column file written (or none at all), never a partial one.
        let columns = self.write_columns()?;
        fsio::rename(&self.tmp, &self.path).map_err(Error::io(&self.path))?;
        self.done = true;
        Ok(RunInfo {
            file: self.name.clone(),
            entries: self.count,
            puts: self.puts,
            bytes: file_len,
            checksum,
            columns,
        })
    }

    /// Reads the entries back from the temporary file, hashing them after
    /// the header and appending each one's offset to the file (the key
    /// table), then reads that table back to hash it too. Keeping the
    /// offsets in memory instead would cost 8 bytes an entry; the entries
    /// have to be read again for the checksum in any case.
    fn write_table(&mut self, hasher: &mut Xxh3, table: u64) -> Result<()> {
        let tmp = self.tmp.clone();
        let io = |e: std::io::Error| Error::io(&tmp)(e);
        let mut reader = File::open(&tmp).map_err(io)?;
        reader.seek(SeekFrom::Start(HEADER_LEN)).map_err(io)?;
        let mut chunk = vec![0u8; self.chunk];
        // File offsets: of chunk[0], and of the next entry to list.
        let mut pos = HEADER_LEN;
        let mut next = HEADER_LEN;
        let mut listed = 0u64;
        let mut read_back = Xxh3::new();
        while pos < table {
            let n = (table - pos).min(self.chunk as u64) as usize;
            reader.read_exact(&mut chunk[..n]).map_err(io)?;
            let end = pos + n as u64;
            let mut used = n;
            while next < end {
                if next + ENTRY_HEADER_LEN > end {
                    // The entry's lengths straddle the chunk's end: stop
                    // the chunk there and read again from the entry.
                    used = (next - pos) as usize;
                    break;
                }
                let at = (next - pos) as usize;
                let h = &chunk[at..at + ENTRY_HEADER_LEN as usize];
                let lens = u64::from(u32::from_le_bytes(h[0..4].try_into().expect("4")))
                    + u64::from(u32::from_le_bytes(h[4..8].try_into().expect("4")));
                let body = u64::from_le_bytes(h[8..16].try_into().expect("8"))
                    .checked_add(lens + ENTRY_HEADER_LEN)
                    .and_then(padded);
                self.write(&next.to_le_bytes())?;
                listed += 1;
                // Overflow cannot come from our own pushes: fail the check below.
                next = body.and_then(|b| next.checked_add(b)).unwrap_or(u64::MAX);
            }
            if used == 0 {
                break;
            }
            hasher.update(&chunk[..used]);
            read_back.update(&chunk[..used]);
            pos += used as u64;
            if used < n {
                reader.seek(SeekFrom::Start(pos)).map_err(io)?;
            }
        }
        if pos != table || next != table || listed != self.count {
            return Err(Error::corrupt(
                self.what(),
                format!(
                    "{listed} entries ending at byte {next} read back, {} ending at {table} written",
                    self.count
                ),
            ));
        }
        if read_back.digest() != self.pushed.digest() {
            return Err(Error::corrupt(
                self.what(),
                "the entries read back differ from those written",
            ));
        }
        self.flush()?;
        let mut left = self.count * 8;
        while left > 0 {
            let n = left.min(self.chunk as u64) as usize;
            reader.read_exact(&mut chunk[..n]).map_err(io)?;
            hasher.update(&chunk[..n]);
            left -= n as u64;
        }
        Ok(())
    }

    /// Stops building columns from the records pushed: the caller gives
    /// them whole with [`RunWriter::set_columns`] before finishing (or the
    /// run gets none).
    pub(crate) fn skip_column_builder(&mut self) {
        self.columns = None;
    }

    /// The columns of the entries pushed, built by the caller.
    pub(crate) fn set_columns(&mut self, columns: Columns) {
        self.given = Some(columns);
    }

    /// Writes the column file of the entries pushed, named after the run.
    /// Columns are derived data: when they cannot be built the run has
    /// none (queries then read its records); an I/O error fails the run.
    fn write_columns(&mut self) -> Result<Option<ColumnsInfo>> {
        let columns = match (self.given.take(), self.columns.take()) {
            (Some(given), _) if given.len() as u64 == self.count => given,
            (_, Some(builder)) => match builder.finish() {
                Ok(columns) => columns,
                Err(_) => return Ok(None),
            },
            _ => return Ok(None),
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        columns.write(dir, &columns_name(&self.name)).map(Some)
    }

    /// Gives up the run and removes its temporary file (on error paths;
    /// dropping the writer does the same).
    pub(crate) fn abort(self) {}
}

impl Drop for RunWriter {
    /// Removes the temporary file of a run that was not renamed into place
    /// (best effort: a leftover is emptied by the next `create`).
    fn drop(&mut self) {
        // Closed first: some systems refuse to remove an open file.
        drop(self.file.take());
        if !self.done {
            let _ = fsio::remove_file(&self.tmp);
        }
    }
}

/// An entry's fixed part, its lengths checked against the entries region.
struct EntryHead {
    /// The entry's file offset.
    at: u64,
    key_len: u64,
    record_len: u64,
    pickle_len: u64,
    flags: u32,
    crc: u32,
    /// Offset of the end of the pickle (before the padding).
    end: u64,
}

/// A run read from bytes: a [`Mmap`] of a file ([`Run::open`]), or any
/// bytes (tests, fuzzing). Every access is bounds-checked against the
/// bytes, so damaged or hostile input yields [`Error::Corrupt`], never a
/// panic or an out-of-bounds read.
pub(crate) struct Run<B: AsRef<[u8]>> {
    bytes: B,
    /// The file (or label) that errors name.
    name: String,
    count: u64,
    /// Offset of the key table, checked: `64 <= table`, `table % 8 == 0`,
    /// `table + 8 * count + 8 == bytes.len()`.
    table: u64,
    /// The position the last [`Run::lower_bound`] returned: a reader going
    /// through keys in order (`for k in store.keys()`) looks up the next
    /// key after it, found with two key reads instead of a binary search.
    hint: std::sync::atomic::AtomicU64,
}

impl Run<Mmap> {
    /// Opens and maps the run file at `path` read-only, checking only its
    /// header and length (O(1)). Errors: [`StorageError::Io`](crate::StorageError::Io) (a missing file
    /// included); [`Error::Corrupt`] for a bad header or a length that
    /// does not match it (truncated or extended).
    pub(crate) fn open(path: &Path) -> Result<Run<Mmap>> {
        let file = File::open(path).map_err(Error::io(path))?;
        let len = file.metadata().map_err(Error::io(path))?.len();
        let name = path.display().to_string();
        if len < MIN_FILE_LEN {
            // Mapping an empty file fails on some systems: refuse it first.
            return Err(Error::corrupt(
                format!("checkpoint run {name}"),
                format!("{len} bytes, shorter than a run's header and checksum"),
            ));
        }
        // SAFETY: run files are immutable once renamed into place and are
        // only ever removed, never rewritten or truncated, by lazyvault; the
        // header checks the mapping's length against the recorded one.
        let map = unsafe { Mmap::map(&file) }.map_err(Error::io(path))?;
        Run::from_bytes(map, &name)
    }
}

impl<B: AsRef<[u8]>> Run<B> {
    /// Checks the header of the run in `bytes` (magic, CRC, reserved
    /// fields zero, entry count, table offset and length consistent with
    /// no overflow), in O(1) and without allocating from any of its
    /// numbers. `name` labels errors. Errors: [`Error::Corrupt`].
    pub(crate) fn from_bytes(bytes: B, name: &str) -> Result<Run<B>> {
        let data = bytes.as_ref();
        let bad = |detail: String| Error::corrupt(format!("checkpoint run {name}"), detail);
        let len = data.len() as u64;
        let header = match data.get(..HEADER_LEN as usize) {
            Some(h) if len >= MIN_FILE_LEN => h,
            _ => {
                return Err(bad(format!(
                    "{len} bytes, shorter than a run's header and checksum ({MIN_FILE_LEN})"
                )))
            }
        };
        if &header[0..8] != RUN_MAGIC {
            return Err(bad("not a checkpoint run (bad magic)".into()));
        }
        let field = |at: u64| u64_at(header, at).unwrap_or_default();
        let stored_crc = u32_at(header, 56).unwrap_or_default();
        if crc32fast::hash(&header[..56]) != stored_crc {
            return Err(bad("header CRC-32 mismatch: the header is damaged".into()));
        }
        if header[32..56]
            .iter()
            .chain(&header[60..64])
            .any(|&b| b != 0)
        {
            return Err(bad(
                "reserved header fields are not zero (written by a newer lazyvault?)".into(),
            ));
        }
        let (count, table, file_len) = (field(8), field(16), field(24));
        if file_len != len {
            return Err(bad(format!(
                "the header says {file_len} bytes, there are {len} (truncated or extended)"
            )));
        }
        if table < HEADER_LEN || table % 8 != 0 {
            return Err(bad(format!("bad key table offset {table}")));
        }
        let expected = count
            .checked_mul(8)
            .and_then(|t| t.checked_add(CHECKSUM_LEN))
            .and_then(|t| t.checked_add(table));
        if expected != Some(len) {
            return Err(bad(format!(
                "{count} entries and a key table at byte {table} do not make {len} bytes"
            )));
        }
        if (table - HEADER_LEN) / MIN_ENTRY_LEN < count {
            return Err(bad(format!(
                "{count} entries cannot fit in {} bytes",
                table - HEADER_LEN
            )));
        }
        Ok(Run {
            name: name.to_owned(),
            count,
            table,
            bytes,
            hint: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn data(&self) -> &[u8] {
        self.bytes.as_ref()
    }

    fn corrupt(&self, detail: impl ToString) -> Error {
        Error::corrupt(format!("checkpoint run {}", self.name), detail)
    }

    /// Number of entries (tombstones included).
    pub(crate) fn len(&self) -> u64 {
        self.count
    }

    /// The offset of entry `i`, from the key table.
    fn offset(&self, i: u64) -> Result<u64> {
        if i >= self.count {
            return Err(self.corrupt(format!("entry {i} asked for, the run has {}", self.count)));
        }
        // In bounds when the header was accepted: table + 8 * count < len.
        u64_at(self.data(), self.table + i * 8)
            .ok_or_else(|| self.corrupt(format!("key table slot {i} out of bounds")))
    }

    /// The fixed part of entry `i`, its flags and lengths checked against
    /// the entries region (not its CRC).
    fn head(&self, i: u64) -> Result<EntryHead> {
        let at = self.offset(i)?;
        let bad = |detail: &str| self.corrupt(format!("entry {i} at byte {at}: {detail}"));
        // table >= 64 (checked by from_bytes): the subtraction holds.
        if at < HEADER_LEN || at % 8 != 0 || at > self.table - ENTRY_HEADER_LEN {
            return Err(bad("offset outside the entries region or misaligned"));
        }
        let data = self.data();
        let (Some(key_len), Some(record_len), Some(pickle_len), Some(flags), Some(crc)) = (
            u32_at(data, at),
            u32_at(data, at + 4),
            u64_at(data, at + 8),
            u32_at(data, at + 16),
            u32_at(data, at + 20),
        ) else {
            return Err(bad("entry header out of bounds"));
        };
        if flags & !(FLAG_PICKLE | FLAG_TOMBSTONE) != 0 {
            return Err(bad(&format!(
                "unknown flags {flags:#x} (written by a newer lazyvault?)"
            )));
        }
        if flags & FLAG_PICKLE == 0 && pickle_len != 0 {
            return Err(bad("pickle length without the pickle flag"));
        }
        if flags & FLAG_TOMBSTONE != 0 && (record_len != 0 || flags & FLAG_PICKLE != 0) {
            return Err(bad("a tombstone carries a record or a pickle"));
        }
        if key_len == 0 {
            return Err(bad("empty key"));
        }
        let (key_len, record_len) = (u64::from(key_len), u64::from(record_len));
        let end = (at + ENTRY_HEADER_LEN)
            .checked_add(key_len + record_len)
            .and_then(|n| n.checked_add(pickle_len))
            .filter(|&end| end <= self.table)
            .ok_or_else(|| bad("lengths run past the entries region"))?;
        Ok(EntryHead {
            at,
            key_len,
            record_len,
            pickle_len,
            flags,
            crc,
            end,
        })
    }

    /// The key bytes of entry `i`, bounds-checked but not CRC-checked (for
    /// the binary search, which reads keys it does not return).
    fn key_at(&self, i: u64) -> Result<&[u8]> {
        let h = self.head(i)?;
        slice(self.data(), h.at + ENTRY_HEADER_LEN, h.key_len)
            .ok_or_else(|| self.corrupt(format!("entry {i}: key out of bounds")))
    }

    /// Entry `i` decoded and CRC-checked, with its head.
    fn decode(&self, i: u64) -> Result<(EntryHead, &str, RunValue<'_>)> {
        let h = self.head(i)?;
        let bad = |detail: &str| self.corrupt(format!("entry {i} at byte {}: {detail}", h.at));
        let whole = slice(self.data(), h.at, h.end - h.at).ok_or_else(|| bad("out of bounds"))?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&whole[..20]);
        crc.update(&whole[ENTRY_HEADER_LEN as usize..]);
        if crc.finalize() != h.crc {
            return Err(bad("CRC-32 mismatch: the entry is damaged"));
        }
        // Lengths were checked to sum to the slice's length: these hold.
        let rest = &whole[ENTRY_HEADER_LEN as usize..];
        let (key, rest) = rest.split_at(h.key_len as usize);
        let (record, pickle) = rest.split_at(h.record_len as usize);
        debug_assert_eq!(pickle.len() as u64, h.pickle_len);
        let key = std::str::from_utf8(key).map_err(|_| bad("the key is not UTF-8"))?;
        let value = if h.flags & FLAG_TOMBSTONE != 0 {
            RunValue::Deleted
        } else {
            RunValue::Put {
                record,
                pickle: (h.flags & FLAG_PICKLE != 0).then_some(pickle),
            }
        };
        Ok((h, key, value))
    }

    /// The value of `key`: a binary search, then the found entry's CRC is
    /// checked. `Ok(None)` if the run has no entry for `key` (a tombstone
    /// is `Some(RunValue::Deleted)`). Errors: [`Error::Corrupt`] for a
    /// damaged entry on the search path.
    pub(crate) fn get(&self, key: &str) -> Result<Option<RunValue<'_>>> {
        let i = self.lower_bound(key.as_bytes())?;
        if i == self.count {
            return Ok(None);
        }
        let (found, value) = self.entry(i)?;
        Ok((found == key).then_some(value))
    }

    /// The entry at position `i` (`0..len()`) with its key, CRC checked.
    /// Errors: [`Error::Corrupt`] if damaged or if `i` is out of range.
    pub(crate) fn entry(&self, i: u64) -> Result<(&str, RunValue<'_>)> {
        self.decode(i).map(|(_, key, value)| (key, value))
    }

    /// The first position whose key is `>= key` in byte order (`len()` if
    /// none): where a range scan starts. Reads O(log n) keys, unchecked by
    /// CRC (a damaged key misdirects the search at worst; what is returned
    /// is checked by `entry`). Errors: [`Error::Corrupt`] for an entry
    /// whose offset or lengths are out of bounds.
    pub(crate) fn lower_bound(&self, key: &[u8]) -> Result<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        // The answer is `h` when the key before `h` is below `key` and the
        // key at `h` is not (what the binary search finds too, keys being
        // in order): tried at the hint, then just after it.
        let at =
            |h: u64| -> Result<bool> {
                Ok((h == 0 || self.key_at(h - 1)? < key)
                    && (h == self.count || self.key_at(h)? >= key))
            };
        let hint = self.hint.load(Relaxed);
        for h in [hint + 1, hint] {
            if h <= self.count && at(h)? {
                self.hint.store(h, Relaxed);
                return Ok(h);
            }
        }
        let (mut lo, mut hi) = (0, self.count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.key_at(mid)? < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        self.hint.store(lo, Relaxed);
        Ok(lo)
    }

    /// The entries from position `from` to the end, in key order, each
    /// CRC-checked; the iteration ends after the first error.
    pub(crate) fn iter_from(
        &self,
        from: u64,
    ) -> impl Iterator<Item = Result<(&str, RunValue<'_>)>> + '_ {
        let mut i = from;
        let mut failed = false;
        std::iter::from_fn(move || {
            if failed || i >= self.count {
                return None;
            }
            let entry = self.entry(i);
            i += 1;
            failed = entry.is_err();
            Some(entry)
        })
    }

    /// Checks the whole file (for `verify()`): every entry decodes with a
    /// good CRC, entries are contiguous from byte 64 to the key table (so
    /// in bounds and not overlapping) with zero padding, keys strictly
    /// increase, and the XXH3-64 matches. Returns the XXH3. Errors:
    /// [`Error::Corrupt`] saying what is wrong first.
    pub(crate) fn verify(&self) -> Result<u64> {
        let mut expected = HEADER_LEN;
        let mut previous: Option<&str> = None;
        for i in 0..self.count {
            let (h, key, _) = self.decode(i)?;
            if h.at != expected {
                return Err(self.corrupt(format!(
                    "entry {i} starts at byte {}, expected {expected} (entries are contiguous, in key order)",
                    h.at
                )));
            }
            if let Some(previous) = previous.filter(|p| *p >= key) {
                return Err(self.corrupt(format!(
                    "entry {i}: key {} is not after {}",
                    show(key.as_bytes()),
                    show(previous.as_bytes())
                )));
            }
            // end <= table, a multiple of 8: the padding is in bounds.
            let next = padded(h.end).unwrap_or(u64::MAX);
            match slice(self.data(), h.end, next - h.end) {
                Some(pad) if pad.iter().all(|&b| b == 0) => {}
                _ => return Err(self.corrupt(format!("entry {i}: padding is not zero"))),
            }
            previous = Some(key);
            expected = next;
        }
        if expected != self.table {
            return Err(self.corrupt(format!(
                "entries end at byte {expected}, the key table starts at {}",
                self.table
            )));
        }
        let data = self.data();
        let body = data.len().saturating_sub(CHECKSUM_LEN as usize);
        let stored =
            u64_at(data, body as u64).ok_or_else(|| self.corrupt("checksum out of bounds"))?;
        let computed = xxh3_64(&data[..body]);
        if stored != computed {
            return Err(self.corrupt(format!(
                "XXH3-64 mismatch: stored {stored:016x}, computed {computed:016x}"
            )));
        }
        Ok(stored)
    }
}

/// The current entry of one run in a merge. Ordered so that a
/// [`BinaryHeap`] (a max-heap) pops the smallest key first and, among equal
/// keys, the newest run (the lowest index) first.
struct Cursor<'a> {
    key: &'a str,
    value: RunValue<'a>,
    run: usize,
    pos: u64,
}

impl Ord for Cursor<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .key
            .cmp(self.key)
            .then_with(|| other.run.cmp(&self.run))
    }
}

impl PartialOrd for Cursor<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Cursor<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Cursor<'_> {}

/// Pushes the entry of `runs[run]` at `pos`, if any, onto `heap`; its key
/// must be after `after` (the entry before it in the same run), otherwise
/// the run is out of order, hence damaged.
fn advance<'a, B: AsRef<[u8]>>(
    heap: &mut BinaryHeap<Cursor<'a>>,
    runs: &[&'a Run<B>],
    run: usize,
    pos: u64,
    after: Option<&str>,
) -> Result<()> {
    let r = runs[run];
    if pos >= r.len() {
        return Ok(());
    }
    let (key, value) = r.entry(pos)?;
    if let Some(after) = after.filter(|a| *a >= key) {
        return Err(r.corrupt(format!(
            "entry {pos}: key {} is not after {}",
            show(key.as_bytes()),
            show(after.as_bytes())
        )));
    }
    heap.push(Cursor {
        key,
        value,
        run,
        pos,
    });
    Ok(())
}

/// Merges `runs`, newest first (for a key in several runs, the newest
/// entry wins), into a new run `dir/name` written like [`RunWriter`]; with
/// `drop_tombstones` (merging into the oldest level, where a deletion has
/// nothing left to hide) tombstones are left out. A streaming k-way merge:
/// memory holds one entry reference per run and the writer's buffers,
/// whatever the runs' sizes. Each entry read is CRC-checked. Errors:
/// [`Error::Corrupt`] for a damaged input run (or one whose keys are out
/// of order), [`StorageError::Io`](crate::StorageError::Io); on error nothing is renamed into place.
pub(crate) fn merge_runs<B: AsRef<[u8]>>(
    runs: &[&Run<B>],
    drop_tombstones: bool,
    dir: &Path,
    name: &str,
    columns: Option<&[Arc<Columns>]>,
) -> Result<RunInfo> {
    let mut writer = RunWriter::create(dir, name)?;
    // With the inputs' columns, the merged columns are theirs interleaved
    // (no record parsed again): note which input row each entry is.
    let mut picks: Option<Vec<(usize, usize)>> = columns.map(|_| Vec::new());
    if picks.is_some() {
        writer.skip_column_builder();
    }
    let mut heap = BinaryHeap::with_capacity(runs.len());
    for run in 0..runs.len() {
        advance(&mut heap, runs, run, 0, None)?;
    }
    while let Some(top) = heap.pop() {
        advance(&mut heap, runs, top.run, top.pos + 1, Some(top.key))?;
        // The same key in older runs: shadowed by `top`.
        loop {
            let older = match heap.peek_mut() {
                Some(older) if older.key == top.key => PeekMut::pop(older),
                _ => break,
            };
            advance(&mut heap, runs, older.run, older.pos + 1, Some(older.key))?;
        }
        if !(drop_tombstones && top.value == RunValue::Deleted) {
            writer.push(top.key, top.value)?;
            if let Some(p) = &mut picks {
                p.push((top.run, top.pos as usize));
            }
        }
    }
    if let (Some(inputs), Some(picks)) = (columns, &picks) {
        let merged = match crate::columns::merge::interleave(inputs, picks) {
            Some(merged) => Some(merged),
            // Paths typed differently in two inputs: from the records.
            None => {
                let mut builder = ColumnBuilder::default();
                let mut built = Ok(());
                for &(run, pos) in picks {
                    let (key, value) = runs[run].entry(pos as u64)?;
                    let record = match value {
                        RunValue::Put { record, .. } => Some(record),
                        RunValue::Deleted => None,
                    };
                    built = builder.push(key, record);
                    if built.is_err() {
                        break;
                    }
                }
                built.ok().and_then(|()| builder.finish().ok())
            }
        };
        if let Some(merged) = merged {
            writer.set_columns(merged);
        }
    }
    writer.finish()
}

/// One entry `salvage` found in a damaged run file, or a damaged span.
pub(crate) enum Salvaged {
    /// An entry whose CRC-32 checks: its key and value (`None`: a
    /// tombstone).
    Entry(String, crate::journal::Committed),
    /// Bytes between whole entries that are not one (its key unknown).
    Damaged,
}

/// The entries of a run file's bytes that can still be trusted, found
/// without its header or key table (either may be the damaged part): from
/// byte 64, each 8-byte aligned offset is tried as an entry, kept when its
/// lengths fit and its CRC-32 checks, and the next one tried after it;
/// bytes that hold none are reported once per span. What `repair` reads of
/// a run that does not open or whose entries fail their checks.
pub(crate) fn salvage(bytes: &[u8]) -> Vec<Salvaged> {
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
    let mut out = Vec::new();
    let mut at = 64usize;
    let mut in_damage = false;
    // An intact header says where the entries end (the key table follows).
    let header_ok = bytes.len() >= 64
        && &bytes[..8] == RUN_MAGIC
        && crc32fast::hash(&bytes[..56]) == u32_at(56);
    let limit = if header_ok {
        let table = u64::from_le_bytes(bytes[16..24].try_into().expect("8"));
        usize::try_from(table).map_or(bytes.len(), |t| t.min(bytes.len()))
    } else {
        bytes.len()
    };
    let bytes = &bytes[..limit];
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
    while at + ENTRY_HEADER_LEN as usize <= bytes.len() {
        let key_len = u32_at(at) as usize;
        let record_len = u32_at(at + 4) as usize;
        let pickle_len = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().expect("8"));
        let flags = u32_at(at + 16);
        let crc = u32_at(at + 20);
        let body = ENTRY_HEADER_LEN as usize;
        let end = usize::try_from(pickle_len).ok().and_then(|p| {
            (at + body)
                .checked_add(key_len)?
                .checked_add(record_len)?
                .checked_add(p)
        });
        let entry = end.filter(|&end| {
            end <= bytes.len() && key_len > 0 && flags & !(FLAG_PICKLE | FLAG_TOMBSTONE) == 0
        });
        let found = entry.and_then(|end| {
            let mut h = crc32fast::Hasher::new();
            h.update(&bytes[at..at + 20]);
            h.update(&bytes[at + body..end]);
            if h.finalize() != crc {
                return None;
            }
            let key = std::str::from_utf8(&bytes[at + body..at + body + key_len]).ok()?;
            let record = &bytes[at + body + key_len..at + body + key_len + record_len];
            let pickle = &bytes[at + body + key_len + record_len..end];
            let value = (flags & FLAG_TOMBSTONE == 0).then(|| {
                (
                    record.to_vec(),
                    (flags & FLAG_PICKLE != 0).then(|| pickle.to_vec()),
                )
            });
            Some((key.to_owned(), value, end))
        });
        match found {
            Some((key, value, end)) => {
                out.push(Salvaged::Entry(key, value));
                in_damage = false;
                at = end.next_multiple_of(8);
            }
            None => {
                if !in_damage {
                    out.push(Salvaged::Damaged);
                    in_damage = true;
                }
                at += 8;
            }
        }
    }
    // Without the header, the key table and checksum after the last entry
    // are scanned too: a damaged span found only there is no lost entry.
    if !header_ok && matches!(out.last(), Some(Salvaged::Damaged)) {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A test entry's value: `None` is a tombstone.
    type Val = Option<(Vec<u8>, Option<Vec<u8>>)>;

    fn rv(v: &Val) -> RunValue<'_> {
        match v {
            None => RunValue::Deleted,
            Some((record, pickle)) => RunValue::Put {
                record,
                pickle: pickle.as_deref(),
            },
        }
    }

    fn write_run(dir: &Path, name: &str, entries: &BTreeMap<String, Val>) -> RunInfo {
        let mut w = RunWriter::create(dir, name).unwrap();
        for (k, v) in entries {
            w.push(k, rv(v)).unwrap();
        }
        w.finish().unwrap()
    }

    /// The bytes of a run holding `entries`.
    fn run_bytes(entries: &BTreeMap<String, Val>) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        write_run(dir.path(), "r", entries);
        std::fs::read(dir.path().join("r")).unwrap()
    }

    fn sample() -> BTreeMap<String, Val> {
        let mut m = BTreeMap::new();
        m.insert("a".into(), Some((br#"{"x":1}"#.to_vec(), None)));
        m.insert(
            "b/🦀".into(),
            Some((b"{}".to_vec(), Some(b"\x80\x05N.".to_vec()))),
        );
        m.insert("c".into(), None);
        m.insert("d".into(), Some((Vec::new(), Some(Vec::new()))));
        m
    }

    fn entries_of<B: AsRef<[u8]>>(run: &Run<B>) -> Vec<(String, Val)> {
        run.iter_from(0)
            .map(|e| {
                let (k, v) = e.unwrap();
                let v = match v {
                    RunValue::Deleted => None,
                    RunValue::Put { record, pickle } => {
                        Some((record.to_vec(), pickle.map(<[u8]>::to_vec)))
                    }
                };
                (k.to_owned(), v)
            })
            .collect()
    }

    /// Checks `run` holds exactly `model`, through every accessor.
    fn check_matches<B: AsRef<[u8]>>(run: &Run<B>, model: &BTreeMap<String, Val>) {
        assert_eq!(run.len(), model.len() as u64);
        let listed: Vec<(String, Val)> =
            model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(entries_of(run), listed);
        for (i, (k, v)) in model.iter().enumerate() {
            assert_eq!(run.entry(i as u64).unwrap(), (k.as_str(), rv(v)));
            assert_eq!(run.get(k).unwrap(), Some(rv(v)), "get {k:?}");
            assert_eq!(run.lower_bound(k.as_bytes()).unwrap(), i as u64);
            let rest: Vec<_> = run
                .iter_from(i as u64)
                .map(|e| e.unwrap().0.to_owned())
                .collect();
            assert_eq!(rest, model.keys().skip(i).cloned().collect::<Vec<_>>());
        }
        assert!(run.entry(run.len()).is_err(), "past the end");
        assert_eq!(run.iter_from(run.len() + 5).count(), 0);
    }

    /// Sets the header's CRC to match its bytes (to test the checks after it).
    fn fix_header_crc(bytes: &mut [u8]) {
        let crc = crc32fast::hash(&bytes[..56]);
        bytes[56..60].copy_from_slice(&crc.to_le_bytes());
    }

    /// `lower_bound` starts from the last answer (a reader going through
    /// keys in order): whatever the order of the look-ups, present keys or
    /// not, it answers as a binary search does.
    #[test]
    fn lower_bound_in_any_order_of_look_ups() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = BTreeMap::new();
        for i in (0..60).step_by(2) {
            model.insert(format!("k{i:02}"), Some((b"{}".to_vec(), None)));
        }
        let info = write_run(dir.path(), "r", &model);
        let run = Run::open(&dir.path().join(&info.file)).unwrap();
        let keys: Vec<&String> = model.keys().collect();
        let expected = |q: &str| {
            keys.iter()
                .position(|k| k.as_str() >= q)
                .unwrap_or(keys.len())
        };
        let mut queries: Vec<String> = (0..62).map(|i| format!("k{i:02}")).collect();
        queries.extend(["".into(), "a".into(), "z".into(), "k".into(), "k591".into()]);
        let mut state = 7u64;
        let mut orders = vec![queries.clone(), queries.iter().rev().cloned().collect()];
        for _ in 0..3 {
            let mut shuffled = queries.clone();
            for i in (1..shuffled.len()).rev() {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                shuffled.swap(i, (state >> 33) as usize % (i + 1));
            }
            orders.push(shuffled);
        }
        for order in orders {
            for q in &order {
                for _ in 0..2 {
                    assert_eq!(
                        run.lower_bound(q.as_bytes()).unwrap(),
                        expected(q) as u64,
                        "{q:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn empty_run_works() {
        let dir = tempfile::tempdir().unwrap();
        let info = write_run(dir.path(), "empty", &BTreeMap::new());
        let bytes = std::fs::read(dir.path().join("empty")).unwrap();
        assert_eq!(bytes.len(), 72);
        assert_eq!(
            info,
            RunInfo {
                file: "empty".into(),
                entries: 0,
                puts: 0,
                bytes: 72,
                checksum: xxh3_64(&bytes[..64]),
                columns: info.columns.clone(),
            }
        );
        // An empty run has an empty column file beside it.
        assert_eq!(info.columns.as_ref().unwrap().file, "empty.arrow");
        let run = Run::open(&dir.path().join("empty")).unwrap();
        assert_eq!(run.len(), 0);
        assert_eq!(run.get("a").unwrap(), None);
        assert_eq!(run.lower_bound(b"a").unwrap(), 0);
        assert_eq!(run.lower_bound(b"").unwrap(), 0);
        assert_eq!(run.iter_from(0).count(), 0);
        assert_eq!(run.verify().unwrap(), info.checksum);
        assert!(run.entry(0).is_err());
    }

    #[test]
    fn layout_is_the_documented_one() {
        let mut m = BTreeMap::new();
        m.insert("k".to_string(), Some((b"{}".to_vec(), Some(b"P".to_vec()))));
        m.insert("z".to_string(), None);
        let b = run_bytes(&m);
        let u64_le = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let u32_le = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!(&b[..8], b"LVRUN\0\x01\n");
        assert_eq!(u64_le(8), 2, "count");
        // Entry "k": 24 + 1 + 2 + 1 = 28, padded to 32; tombstone "z": 25 -> 32.
        assert_eq!(u64_le(16), 64 + 32 + 32, "table offset");
        assert_eq!(u64_le(24), b.len() as u64);
        assert_eq!(b.len(), 128 + 2 * 8 + 8);
        assert!(b[32..56].iter().all(|&x| x == 0) && b[60..64] == [0; 4]);
        assert_eq!(u32_le(56), crc32fast::hash(&b[..56]));
        // First entry.
        assert_eq!(
            (u32_le(64), u32_le(68), u64_le(72), u32_le(80)),
            (1, 2, 1, 1)
        );
        let mut crc = crc32fast::Hasher::new();
        crc.update(&b[64..84]);
        crc.update(b"k{}P");
        assert_eq!(u32_le(84), crc.finalize());
        assert_eq!(&b[88..92], b"k{}P");
        assert_eq!(&b[92..96], &[0; 4]);
        // Tombstone.
        assert_eq!(
            (u32_le(96), u32_le(100), u64_le(104), u32_le(112)),
            (1, 0, 0, 2)
        );
        assert_eq!(b[120], b'z');
        // Key table and checksum.
        assert_eq!((u64_le(128), u64_le(136)), (64, 96));
        assert_eq!(u64_le(144), xxh3_64(&b[..144]));
    }

    #[test]
    fn fixed_entries_round_trip_with_emoji_empty_record_and_empty_pickle() {
        let dir = tempfile::tempdir().unwrap();
        let model = sample();
        let info = write_run(dir.path(), "run-1", &model);
        let path = dir.path().join("run-1");
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(info.file, "run-1");
        assert_eq!((info.entries, info.puts), (4, 3));
        assert_eq!(info.bytes, bytes.len() as u64);
        assert_eq!(info.checksum, xxh3_64(&bytes[..bytes.len() - 8]));
        let run = Run::open(&path).unwrap();
        check_matches(&run, &model);
        assert_eq!(run.verify().unwrap(), info.checksum);
        assert_eq!(
            run.get("d").unwrap(),
            Some(RunValue::Put {
                record: b"",
                pickle: Some(b"")
            })
        );
        assert_eq!(
            run.get("a").unwrap(),
            Some(RunValue::Put {
                record: br#"{"x":1}"#,
                pickle: None
            })
        );
        for absent in ["", "0", "aa", "b", "b/🦀x", "cc", "e", "🦀"] {
            assert_eq!(run.get(absent).unwrap(), None, "{absent:?}");
        }
        assert_eq!(run.lower_bound(b"").unwrap(), 0);
        assert_eq!(run.lower_bound(b"aa").unwrap(), 1);
        assert_eq!(run.lower_bound(b"b/").unwrap(), 1);
        assert_eq!(run.lower_bound(b"c\0").unwrap(), 3);
        assert_eq!(run.lower_bound(b"\xff").unwrap(), 4);
        let keys: Vec<_> = run.iter_from(2).map(|e| e.unwrap().0).collect();
        assert_eq!(keys, ["c", "d"]);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["run-1"]);
    }

    #[test]
    fn small_write_chunks_give_the_same_file() {
        // Entries of many sizes, so that with small chunks entry headers
        // straddle reads at every offset.
        let model: BTreeMap<String, Val> = (0..60)
            .map(|i| {
                let v = match i % 3 {
                    0 => None,
                    1 => Some((vec![b'r'; i * 5], None)),
                    _ => Some((vec![b'{'; i], Some(vec![7; i * 3]))),
                };
                (format!("key{i:03}{}", "x".repeat(i % 11)), v)
            })
            .collect();
        let expected = run_bytes(&model);
        for chunk in [64, 72, 80, 88, 96, 100, 104, 120, 128, 200, 256, 1000] {
            let dir = tempfile::tempdir().unwrap();
            let mut w = RunWriter::with_chunk(dir.path(), "r", chunk).unwrap();
            for (k, v) in &model {
                w.push(k, rv(v)).unwrap();
            }
            let info = w.finish().unwrap();
            let bytes = std::fs::read(dir.path().join("r")).unwrap();
            assert!(bytes == expected, "chunk {chunk}: different bytes");
            assert_eq!(info.checksum, xxh3_64(&expected[..expected.len() - 8]));
        }
    }

    #[test]
    fn finish_refuses_entries_changed_after_they_were_written() {
        use std::io::{Seek, Write};
        let dir = tempfile::tempdir().unwrap();
        // Small writes, so that the first entries reach the file at once.
        let mut w = RunWriter::with_chunk(dir.path(), "r", 64).unwrap();
        for (k, v) in &sample() {
            w.push(k, rv(v)).unwrap();
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("r.tmp"))
            .unwrap();
        f.seek(SeekFrom::Start(90)).unwrap(); // in the record of "a"
        f.write_all(b"?").unwrap();
        drop(f);
        let err = w.finish().unwrap_err();
        assert!(err.to_string().contains("differ"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn out_of_order_or_repeated_keys_are_refused_and_nothing_is_renamed() {
        for second in ["a", "b"] {
            let dir = tempfile::tempdir().unwrap();
            let mut w = RunWriter::create(dir.path(), "r").unwrap();
            w.push("b", RunValue::Deleted).unwrap();
            let err = w.push(second, RunValue::Deleted).unwrap_err();
            assert!(
                matches!(&err, Error::Corrupt(c) if c.detail().contains(&format!("key {second:?} pushed after \"b\""))),
                "{err}"
            );
            // Poisoned: later pushes and finish refuse too.
            assert!(w.push("c", RunValue::Deleted).is_err());
            assert!(w.finish().is_err());
            assert_eq!(
                std::fs::read_dir(dir.path()).unwrap().count(),
                0,
                "no file left"
            );
        }
    }

    #[test]
    fn empty_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = RunWriter::create(dir.path(), "r").unwrap();
        assert!(matches!(
            w.push("", RunValue::Deleted),
            Err(Error::Usage(crate::UsageError::EmptyKey))
        ));
        assert!(w.finish().is_err());
        assert!(!dir.path().join("r").exists());
    }

    #[test]
    fn abort_and_drop_remove_the_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = RunWriter::create(dir.path(), "r").unwrap();
        w.push("a", RunValue::Deleted).unwrap();
        assert!(dir.path().join("r.tmp").exists());
        w.abort();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let w = RunWriter::create(dir.path(), "r").unwrap();
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        let bytes = run_bytes(&sample());
        for cut in 0..bytes.len() {
            assert!(
                Run::from_bytes(&bytes[..cut], "t").is_err(),
                "truncated to {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Run::from_bytes(&longer[..], "t").is_err());
        let dir = tempfile::tempdir().unwrap();
        for cut in [0, 10, 71, bytes.len() - 1] {
            let path = dir.path().join("cut");
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let err = Run::open(&path).map(|_| ()).unwrap_err();
            assert!(
                matches!(&err, Error::Corrupt(c) if c.what().contains("cut")),
                "{err}"
            );
        }
    }

    #[test]
    fn every_bit_flip_is_caught_by_verify_and_never_returns_a_wrong_value() {
        let model = sample();
        let bytes = run_bytes(&model);
        let original = Run::from_bytes(&bytes[..], "t").unwrap();
        // Padding bytes are not covered by the entry CRCs: flipping one must
        // leave every lookup unchanged (only verify() sees it).
        let mut padding = vec![false; bytes.len()];
        for i in 0..original.len() {
            let (h, _, _) = original.decode(i).unwrap();
            for b in h.end..padded(h.end).unwrap() {
                padding[b as usize] = true;
            }
        }
        assert!(padding.iter().any(|&p| p), "the sample has padding");
        let mut refused_at_open = 0;
        for byte in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[byte] ^= 1 << bit;
                let Ok(run) = Run::from_bytes(&b[..], "t") else {
                    refused_at_open += 1;
                    continue;
                };
                assert!(
                    run.verify().is_err(),
                    "verify missed bit {bit} of byte {byte}"
                );
                for (k, v) in &model {
                    match run.get(k) {
                        Ok(Some(got)) => assert_eq!(got, rv(v), "byte {byte} bit {bit}"),
                        Ok(None) | Err(_) => assert!(!padding[byte], "padding byte {byte}"),
                    }
                }
                let _ = run.lower_bound(b"b");
                let listed: Vec<_> = run.iter_from(0).collect();
                if padding[byte] {
                    assert_eq!(entries_of(&run), entries_of(&original));
                } else {
                    // What iteration returns without error is genuine.
                    for (k, v) in listed.into_iter().map_while(|e| e.ok()) {
                        assert_eq!(Some(&v), model.get(k).map(rv).as_ref(), "byte {byte}");
                    }
                }
            }
        }
        // Every header bit is covered by its CRC.
        assert_eq!(refused_at_open, 64 * 8);
    }

    #[test]
    fn huge_counts_and_table_offsets_are_refused() {
        let bytes = run_bytes(&sample());
        let len = bytes.len() as u64;
        for (count, table) in [
            (u64::MAX, 64),
            (u64::MAX / 8, 64),
            (1 << 61, len - 16),
            (0, u64::MAX - 7),
            (4, !7),
            // Consistent lengths, but the entries cannot fit before the table.
            ((len - 72) / 16, len - (len - 72) / 16 * 8 - 8),
            ((len - 72) / 8, 64),
            (4, 8),                   // table inside the header
            (4, len - 4 * 8 - 8 - 4), // misaligned table
        ] {
            let mut b = bytes.clone();
            b[8..16].copy_from_slice(&count.to_le_bytes());
            b[16..24].copy_from_slice(&table.to_le_bytes());
            fix_header_crc(&mut b);
            assert!(
                Run::from_bytes(&b[..], "t").is_err(),
                "count {count} table {table}"
            );
        }
        let mut b = bytes.clone();
        b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        fix_header_crc(&mut b);
        assert!(Run::from_bytes(&b[..], "t").is_err());
    }

    #[test]
    fn reserved_fields_and_unknown_flags_are_refused() {
        let bytes = run_bytes(&sample());
        for at in [32, 40, 48, 55, 60, 63] {
            let mut b = bytes.clone();
            b[at] = 1;
            fix_header_crc(&mut b);
            let err = Run::from_bytes(&b[..], "t").map(|_| ()).unwrap_err();
            assert!(err.to_string().contains("newer"), "{err}");
        }
        // An entry with an unknown flag (its CRC fixed): refused on read.
        let mut b = bytes.clone();
        b[80] |= 4;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&b[64..84]);
        crc.update(&b[88..88 + 1 + 7]); // key "a", record {"x":1}
        b[84..88].copy_from_slice(&crc.finalize().to_le_bytes());
        let run = Run::from_bytes(&b[..], "t").unwrap();
        let err = run.entry(0).unwrap_err();
        assert!(err.to_string().contains("unknown flags"), "{err}");
    }

    /// Sets the XXH3 at the end of `bytes` to match them, so that verify()
    /// has to find what is wrong by itself.
    fn fix_checksum(bytes: &mut [u8]) {
        let body = bytes.len() - 8;
        let sum = xxh3_64(&bytes[..body]);
        bytes[body..].copy_from_slice(&sum.to_le_bytes());
    }

    #[test]
    fn verify_checks_the_structure_even_under_a_matching_checksum() {
        let model = sample();
        let bytes = run_bytes(&model);
        let u64_le = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let err_of = |b: &[u8]| {
            Run::from_bytes(b, "t")
                .unwrap()
                .verify()
                .unwrap_err()
                .to_string()
        };

        // Non-zero padding (entry "d", 25 bytes, is padded to 32).
        let (h, _, _) = Run::from_bytes(&bytes[..], "t").unwrap().decode(3).unwrap();
        let mut b = bytes.clone();
        b[h.end as usize] = 1;
        fix_checksum(&mut b);
        let err = err_of(&b);
        assert!(err.contains("padding"), "{err}");

        // A gap of 8 zero bytes after the first entry, every offset fixed.
        let table = u64_le(&bytes, 16) as usize;
        let second = u64_le(&bytes, table + 8) as usize;
        let mut b = bytes[..second].to_vec();
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&bytes[second..]);
        b[16..24].copy_from_slice(&(table as u64 + 8).to_le_bytes());
        b[24..32].copy_from_slice(&(bytes.len() as u64 + 8).to_le_bytes());
        fix_header_crc(&mut b);
        for i in 1..model.len() {
            let at = table + 8 + i * 8;
            let moved = u64_le(&b, at) + 8;
            b[at..at + 8].copy_from_slice(&moved.to_le_bytes());
        }
        fix_checksum(&mut b);
        let run = Run::from_bytes(&b[..], "t").unwrap();
        check_matches(&run, &model);
        let err = err_of(&b);
        assert!(err.contains("entry 1 starts at byte"), "{err}");

        // Contiguous entries whose keys are out of order or repeated: two
        // tombstones "a" and "b" with their keys rewritten, CRCs redone.
        let two: BTreeMap<String, Val> = [("a".into(), None), ("b".into(), None)]
            .into_iter()
            .collect();
        for (first, second) in [(b'b', b'a'), (b'a', b'a')] {
            let mut b = run_bytes(&two);
            for (at, key) in [(64, first), (96, second)] {
                b[at + 24] = key;
                let mut crc = crc32fast::Hasher::new();
                crc.update(&b[at..at + 20]);
                crc.update(&[key]);
                b[at + 20..at + 24].copy_from_slice(&crc.finalize().to_le_bytes());
            }
            fix_checksum(&mut b);
            let err = err_of(&b);
            let expected = format!(
                "key \"{}\" is not after \"{}\"",
                second as char, first as char
            );
            assert!(err.contains(&expected), "{err}");
        }
    }

    #[test]
    fn swapped_table_slots_are_caught_by_verify_and_merge() {
        let bytes = run_bytes(&sample());
        let table = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
        let mut b = bytes.clone();
        let (first, second) = (
            b[table..table + 8].to_vec(),
            b[table + 8..table + 16].to_vec(),
        );
        b[table..table + 8].copy_from_slice(&second);
        b[table + 8..table + 16].copy_from_slice(&first);
        let run = Run::from_bytes(&b[..], "t").unwrap();
        assert!(run.verify().is_err());
        let dir = tempfile::tempdir().unwrap();
        let err = merge_runs(&[&run], false, dir.path(), "m", None).unwrap_err();
        assert!(err.to_string().contains("is not after"), "{err}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "nothing renamed"
        );
    }

    #[test]
    fn merge_newest_wins_and_tombstones_drop_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let put = |r: &str| Some((r.as_bytes().to_vec(), None));
        let newest: BTreeMap<String, Val> = [("b".into(), None), ("c".into(), put("c-new"))]
            .into_iter()
            .collect();
        let oldest: BTreeMap<String, Val> = [
            ("a".into(), put("a-old")),
            ("b".into(), put("b-old")),
            ("c".into(), put("c-old")),
            ("d".into(), None),
        ]
        .into_iter()
        .collect();
        write_run(dir.path(), "new", &newest);
        write_run(dir.path(), "old", &oldest);
        let new = Run::open(&dir.path().join("new")).unwrap();
        let old = Run::open(&dir.path().join("old")).unwrap();
        let info = merge_runs(&[&new, &old], false, dir.path(), "kept", None).unwrap();
        let kept = Run::open(&dir.path().join("kept")).unwrap();
        let expected: BTreeMap<String, Val> = [
            ("a".into(), put("a-old")),
            ("b".into(), None),
            ("c".into(), put("c-new")),
            ("d".into(), None),
        ]
        .into_iter()
        .collect();
        check_matches(&kept, &expected);
        assert_eq!((info.entries, info.puts), (4, 2));
        merge_runs(&[&new, &old], true, dir.path(), "dropped", None).unwrap();
        let dropped = Run::open(&dir.path().join("dropped")).unwrap();
        let expected: BTreeMap<String, Val> =
            [("a".into(), put("a-old")), ("c".into(), put("c-new"))]
                .into_iter()
                .collect();
        check_matches(&dropped, &expected);
        let file = std::fs::read(dir.path().join("dropped")).unwrap();
        assert_eq!(dropped.verify().unwrap(), xxh3_64(&file[..file.len() - 8]));
        // No runs at all: an empty run.
        let none: [&Run<Mmap>; 0] = [];
        assert_eq!(
            merge_runs(&none, false, dir.path(), "none", None)
                .unwrap()
                .entries,
            0
        );
    }

    /// A small deterministic PRNG (xorshift64*), so the mutation test needs
    /// no dependency and replays exactly.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    #[test]
    fn mutated_runs_never_panic_and_verify_catches_every_change() {
        let model = sample();
        let bytes = run_bytes(&model);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let extremes = |rng: &mut Rng, len: u64| match rng.below(8) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => u64::from(u32::MAX),
            4 => len,
            5 => len - 8,
            6 => 1 << 63,
            _ => rng.next(),
        };
        let mut opened = 0;
        for round in 0..2000 {
            let mut b = bytes.clone();
            for _ in 0..=rng.below(3) {
                match rng.below(4) {
                    0 | 1 => {
                        let at = rng.below(b.len() as u64) as usize;
                        b[at] ^= 1 << rng.below(8);
                    }
                    2 => {
                        // A whole u64 field (header, entry or key table).
                        let at = (rng.below(b.len() as u64 / 8) * 8) as usize;
                        let v = extremes(&mut rng, bytes.len() as u64);
                        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
                    }
                    _ => {
                        if rng.below(4) == 0 {
                            let cut = rng.below(b.len() as u64) as usize;
                            b.truncate(cut);
                        }
                    }
                }
                if b.len() < 64 {
                    break;
                }
            }
            // Half the time, make the header self-consistent, so that the
            // mutations behind it are reached.
            if b.len() >= 64 && rng.below(2) == 0 {
                fix_header_crc(&mut b);
            }
            let Ok(run) = Run::from_bytes(&b[..], "m") else {
                continue;
            };
            opened += 1;
            let _ = run.len();
            for k in model
                .keys()
                .map(String::as_str)
                .chain(["", "0", "bb", "\u{10ffff}"])
            {
                let _ = run.get(k);
                let _ = run.lower_bound(k.as_bytes());
            }
            for i in [0, 1, run.len().saturating_sub(1), run.len(), u64::MAX] {
                let _ = run.entry(i);
                let _ = run.iter_from(i).count();
            }
            let verified = run.verify();
            if b != bytes {
                assert!(verified.is_err(), "round {round}: verify accepted a change");
            }
        }
        assert!(opened > 500, "only {opened} mutants got past the header");
    }

    /// Keys: short ones from a tiny alphabet (so runs share keys) and any
    /// Unicode, emoji included.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            "[ab🦀]{1,3}",
            prop::collection::vec(any::<char>(), 1..6).prop_map(String::from_iter),
        ]
    }

    fn value() -> impl Strategy<Value = Val> {
        prop_oneof![
            1 => Just(None),
            3 => (
                prop::collection::vec(any::<u8>(), 0..40),
                prop::option::of(prop::collection::vec(any::<u8>(), 0..20)),
            )
                .prop_map(Some),
        ]
    }

    fn entries() -> impl Strategy<Value = BTreeMap<String, Val>> {
        prop::collection::btree_map(key(), value(), 0..30)
    }

    proptest! {
        #[test]
        fn random_runs_round_trip(model in entries(), probes in prop::collection::vec(key(), 0..10)) {
            let dir = tempfile::tempdir().unwrap();
            let info = write_run(dir.path(), "r", &model);
            let bytes = std::fs::read(dir.path().join("r")).unwrap();
            prop_assert_eq!(info.bytes, bytes.len() as u64);
            prop_assert_eq!(info.entries, model.len() as u64);
            prop_assert_eq!(info.puts, model.values().filter(|v| v.is_some()).count() as u64);
            let run = Run::from_bytes(bytes, "r").unwrap();
            check_matches(&run, &model);
            prop_assert_eq!(run.verify().unwrap(), info.checksum);
            for probe in &probes {
                prop_assert_eq!(run.get(probe).unwrap(), model.get(probe).map(rv));
                // The model's answer: how many keys sort before the probe.
                let before = model.keys().filter(|k| k.as_str() < probe.as_str()).count();
                let at = run.lower_bound(probe.as_bytes()).unwrap();
                prop_assert_eq!(at, before as u64);
                let first = model.keys().nth(before).cloned();
                prop_assert_eq!(run.iter_from(at).next().map(|e| e.unwrap().0.to_owned()), first);
            }
        }

        #[test]
        fn merges_match_a_model(runs in prop::collection::vec(entries(), 0..4), drop_tombstones: bool) {
            let dir = tempfile::tempdir().unwrap();
            for (i, m) in runs.iter().enumerate() {
                write_run(dir.path(), &format!("in{i}"), m);
            }
            let opened: Vec<Run<Mmap>> = (0..runs.len())
                .map(|i| Run::open(&dir.path().join(format!("in{i}"))).unwrap())
                .collect();
            let refs: Vec<&Run<Mmap>> = opened.iter().collect();
            let info = merge_runs(&refs, drop_tombstones, dir.path(), "out", None).unwrap();
            // Model: apply the oldest run first, so newer entries overwrite.
            let mut expected = BTreeMap::new();
            for m in runs.iter().rev() {
                expected.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            if drop_tombstones {
                expected.retain(|_, v| v.is_some());
            }
            let out = Run::open(&dir.path().join("out")).unwrap();
            check_matches(&out, &expected);
            prop_assert_eq!(out.verify().unwrap(), info.checksum);
            prop_assert_eq!(info.entries, expected.len() as u64);
        }
    }
}
