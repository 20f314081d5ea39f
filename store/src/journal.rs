//! The record journal: every put and delete is appended, before its index
//! entry, to an append-only segment file under `journal/`, and the segment
//! is fsynced by `flush()` before sled is (group commit: one fsync per flush,
//! whatever the number of records). The index is derived data (DESIGN.md
//! invariant 7): [`crate::Store::repair`] rebuilds it by replaying the
//! journal.
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

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fsio;

/// Directory (relative to the store root) holding the journal segments.
pub const JOURNAL_DIR: &str = "journal";

const SEGMENT_MAGIC: &[u8; 8] = b"LVJRNL\0\x01";
/// Length of a segment's header; the first entry starts here.
pub const SEGMENT_HEADER_LEN: u64 = 16;
const ENTRY_MAGIC: &[u8; 8] = b"LVREC\0\x01\n";
const HEADER_LEN: usize = 40;
const CRC_LEN: usize = 4;
const FLAG_PICKLE: u32 = 1;
const FLAG_DELETE: u32 = 2;
const FLAG_COMMIT: u32 = 4;

/// What one journal entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `key` was set to this record JSON (byte for byte as the index holds
    /// it) and pickled remainder.
    Put {
        record: Vec<u8>,
        pickle: Option<Vec<u8>>,
    },
    /// `key` was deleted.
    Delete,
    /// `flush()` made everything before this point durable (the key is
    /// empty): changes before a commit were acknowledged to the caller.
    Commit,
}

/// One decoded entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub change: Change,
}

/// A position in the journal: segment number and byte offset in it.
pub type Position = (u64, u64);

/// One put as the writer appends it: key, record JSON, pickled remainder.
pub(crate) type Put<'a> = (&'a str, &'a [u8], Option<&'a [u8]>);

fn too_large(what: &str) -> Error {
    Error::TooLarge(format!("{what} longer than 4 GiB"))
}

/// The 40-byte header of an entry; `kind` is 0 for a put, else the
/// delete or commit flag.
fn entry_header(
    key: &str,
    record: &[u8],
    pickle: Option<&[u8]>,
    kind: u32,
) -> Result<[u8; HEADER_LEN]> {
    let key_len = u32::try_from(key.len()).map_err(|_| too_large("a key"))?;
    let record_len = u32::try_from(record.len()).map_err(|_| too_large("record metadata"))?;
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(ENTRY_MAGIC);
    h[16..20].copy_from_slice(&key_len.to_le_bytes());
    h[20..24].copy_from_slice(&record_len.to_le_bytes());
    let flags = if pickle.is_some() { FLAG_PICKLE } else { 0 } | kind;
    h[24..28].copy_from_slice(&flags.to_le_bytes());
    h[32..40].copy_from_slice(&(pickle.map_or(0, <[u8]>::len) as u64).to_le_bytes());
    Ok(h)
}

/// Encodes a whole entry into memory (tests and fuzzing).
pub fn encode(entry: &Entry) -> Vec<u8> {
    let (record, pickle, delete) = match &entry.change {
        Change::Put { record, pickle } => (&record[..], pickle.as_deref(), 0),
        Change::Delete => (&[][..], None, FLAG_DELETE),
        Change::Commit => (&[][..], None, FLAG_COMMIT),
    };
    let header = entry_header(&entry.key, record, pickle, delete).expect("small inputs");
    let mut out = header.to_vec();
    out.extend_from_slice(entry.key.as_bytes());
    out.extend_from_slice(record);
    out.extend_from_slice(pickle.unwrap_or_default());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes the entry at the start of `bytes`; returns it and its length.
/// Every length is checked against the buffer before use and the CRC before
/// anything is returned, so a torn or damaged entry is an error, never a
/// panic or an allocation from an unchecked size.
pub fn decode(bytes: &[u8]) -> std::result::Result<(Entry, usize), String> {
    if bytes.len() < HEADER_LEN + CRC_LEN {
        return Err(format!(
            "{} bytes, shorter than an entry header",
            bytes.len()
        ));
    }
    if &bytes[0..8] != ENTRY_MAGIC {
        return Err("not a journal entry (bad magic)".into());
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let key_len = u64::from(u32_at(16));
    let record_len = u64::from(u32_at(20));
    let flags = u32_at(24);
    let pickle_len = u64::from_le_bytes(bytes[32..40].try_into().expect("8 bytes"));
    if flags & !(FLAG_PICKLE | FLAG_DELETE | FLAG_COMMIT) != 0
        || u32_at(28) != 0
        || bytes[8..16] != [0; 8]
    {
        return Err(format!(
            "unknown flags {flags:#x} (written by a newer lazyvault?)"
        ));
    }
    if flags & FLAG_PICKLE == 0 && pickle_len != 0 {
        return Err("pickle length without the pickle flag".into());
    }
    if flags & FLAG_DELETE != 0 && (record_len != 0 || flags & FLAG_PICKLE != 0) {
        return Err("a delete carries a record".into());
    }
    if flags & FLAG_COMMIT != 0 && (flags != FLAG_COMMIT || record_len != 0 || key_len != 0) {
        return Err("a commit carries a key or a record".into());
    }
    let total = (HEADER_LEN as u64 + CRC_LEN as u64)
        .checked_add(key_len)
        .and_then(|n| n.checked_add(record_len))
        .and_then(|n| n.checked_add(pickle_len))
        .filter(|&n| n <= bytes.len() as u64)
        .ok_or_else(|| format!("{} bytes left, the entry's lengths need more", bytes.len()))?;
    // Checked against the buffer above: these casts and slices hold.
    let total = total as usize;
    let body_end = total - CRC_LEN;
    let stored_crc = u32::from_le_bytes(bytes[body_end..total].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..body_end]) != stored_crc {
        return Err("CRC-32 mismatch: the entry is damaged or torn".into());
    }
    let key_end = HEADER_LEN + key_len as usize;
    let record_end = key_end + record_len as usize;
    let key = std::str::from_utf8(&bytes[HEADER_LEN..key_end])
        .map_err(|_| "the key is not UTF-8".to_owned())?;
    if key.is_empty() && flags != FLAG_COMMIT {
        return Err("empty key".into());
    }
    let change = if flags & FLAG_COMMIT != 0 {
        Change::Commit
    } else if flags & FLAG_DELETE != 0 {
        Change::Delete
    } else {
        Change::Put {
            record: bytes[key_end..record_end].to_vec(),
            pickle: (flags & FLAG_PICKLE != 0).then(|| bytes[record_end..body_end].to_vec()),
        }
    };
    Ok((
        Entry {
            key: key.to_owned(),
            change,
        },
        total,
    ))
}

/// The segment file of `number`, relative to the store root.
pub fn relpath(number: u64) -> String {
    format!("{JOURNAL_DIR}/{number:016x}.log")
}

/// The number of a name `<16 lowercase hex digits><suffix>`.
fn parse_number(name: &str, suffix: &str) -> Option<u64> {
    let hex = name.strip_suffix(suffix)?;
    if hex.len() != 16 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// The segments of the store at `root`, by number.
pub fn segments(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    numbered_files(&root.join(JOURNAL_DIR), ".log")
}

/// The files of `dir` named `<16 lowercase hex digits><suffix>`, by that
/// number (none when `dir` is missing); other names are ignored.
pub(crate) fn numbered_files(dir: &Path, suffix: &str) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(Error::io(dir))?;
        let name = entry.file_name();
        if let Some(n) = name.to_str().and_then(|n| parse_number(n, suffix)) {
            out.push((n, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The entries of one segment read from `path`, up to `limit` bytes (the
/// committed end, when known), each with its end offset; and, if the
/// segment does not end cleanly there, why (a torn or damaged entry: the
/// entries after it are not read).
pub struct SegmentEntries {
    pub entries: Vec<(Entry, u64)>,
    pub torn: Option<String>,
}

/// Reads a segment (see [`SegmentEntries`]).
pub fn read_segment(path: &Path, number: u64, limit: Option<u64>) -> Result<SegmentEntries> {
    let mut file = File::open(path).map_err(Error::io(path))?;
    let len = file.metadata().map_err(Error::io(path))?.len();
    let end = limit.map_or(len, |l| l.min(len));
    let end = usize::try_from(end)
        .map_err(|_| Error::corrupt(format!("journal {}", path.display()), "too large"))?;
    let mut bytes = vec![0u8; end];
    file.read_exact(&mut bytes).map_err(Error::io(path))?;
    let mut out = SegmentEntries {
        entries: Vec::new(),
        torn: None,
    };
    if bytes.len() < SEGMENT_HEADER_LEN as usize
        || &bytes[..8] != SEGMENT_MAGIC
        || bytes[8..16] != number.to_le_bytes()
    {
        out.torn = Some(format!(
            "{}: not a journal segment numbered {number}",
            path.display()
        ));
        return Ok(out);
    }
    let mut at = SEGMENT_HEADER_LEN as usize;
    while at < bytes.len() {
        match decode(&bytes[at..]) {
            Ok((entry, used)) => {
                at += used;
                out.entries.push((entry, at as u64));
            }
            Err(e) => {
                out.torn = Some(format!("{} at byte {at}: {e}", path.display()));
                break;
            }
        }
    }
    Ok(out)
}

/// A committed change as readers apply it: the record and its pickled
/// remainder, or `None` for a delete.
pub(crate) type Committed = Option<(Vec<u8>, Option<Vec<u8>>)>;

/// What [`read_committed`] found past a position.
#[derive(Debug, Default)]
pub(crate) struct CommittedTail {
    /// Commits read.
    pub commits: u64,
    /// The position just after the last commit read (where the next read
    /// starts); the start position when there was none.
    pub end: Position,
}

/// The header of segment `number` checked, then its bytes from `start`
/// (at least the header's end) to its end.
fn segment_bytes_from(path: &Path, number: u64, start: u64) -> Result<Option<Vec<u8>>> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        // Removed since it was listed: a newer checkpoint covers it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path)(e)),
    };
    let mut header = [0u8; SEGMENT_HEADER_LEN as usize];
    if file.read_exact(&mut header).is_err()
        || &header[..8] != SEGMENT_MAGIC
        || header[8..16] != number.to_le_bytes()
    {
        // A segment whose header is not (yet) written holds no commit.
        return Ok(Some(Vec::new()));
    }
    let start = start.max(SEGMENT_HEADER_LEN);
    file.seek(SeekFrom::Start(start)).map_err(Error::io(path))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(Error::io(path))?;
    Ok(Some(bytes))
}

/// Reads the journal of `root` after `from` (segment, offset; `(0, 0)`
/// for the whole journal) and hands `apply(key, change)` every change that
/// a commit covers, in journal order, stopping after `max_commits` commits
/// when given. A commit covers the changes before it in its own segment
/// since the previous commit there; changes after a segment's last commit
/// were never acknowledged (a crash, or a write in progress) and are not
/// applied. Readers use this on a journal a writer appends to: a torn or
/// partly written entry ends the segment, exactly like an unflushed one.
///
/// # Errors
/// [`Error::Corrupt`] when the segment holding `from` is gone although
/// later ones exist (the journal was compacted since `from` was taken: open
/// the newest checkpoint instead); I/O errors.
pub(crate) fn read_committed(
    root: &Path,
    from: Position,
    max_commits: Option<u64>,
    mut apply: impl FnMut(String, Committed),
) -> Result<CommittedTail> {
    let mut tail = CommittedTail {
        commits: 0,
        end: from,
    };
    // From a checkpoint, the segments are probed by number (a writer
    // numbers them consecutively): opening costs what the tail holds, not
    // what the whole journal directory lists. From the start, listed.
    let listed: Vec<(u64, PathBuf)> = if from.0 == 0 {
        segments(root)?
    } else if root.join(relpath(from.0)).exists() {
        (from.0..)
            .map(|n| (n, root.join(relpath(n))))
            .take_while(|(_, p)| p.exists())
            .collect()
    } else if segments(root)?.iter().any(|(n, _)| *n > from.0) {
        return Err(Error::corrupt(
            format!("journal {}", root.join(relpath(from.0)).display()),
            "removed since this snapshot's checkpoint was written",
        ));
    } else {
        Vec::new()
    };
    for (number, path) in listed {
        if number < from.0 {
            continue;
        }
        let start = if number == from.0 { from.1 } else { 0 };
        let Some(bytes) = segment_bytes_from(&path, number, start)? else {
            // Removed while we read (a gc() that wrote a newer checkpoint):
            // what we have is no longer one state; the caller starts over.
            return Err(Error::corrupt(
                format!("journal {}", path.display()),
                "removed while it was being read (a newer checkpoint replaces it)",
            ));
        };
        let base = start.max(SEGMENT_HEADER_LEN);
        let mut pending: Vec<Entry> = Vec::new();
        let mut at = 0usize;
        while at < bytes.len() {
            let Ok((entry, used)) = decode(&bytes[at..]) else {
                break;
            };
            at += used;
            match entry.change {
                Change::Commit => {
                    for e in pending.drain(..) {
                        let change = match e.change {
                            Change::Put { record, pickle } => Some((record, pickle)),
                            _ => None,
                        };
                        apply(e.key, change);
                    }
                    tail.commits += 1;
                    tail.end = (number, base + at as u64);
                    if max_commits.is_some_and(|m| tail.commits >= m) {
                        return Ok(tail);
                    }
                }
                _ => pending.push(entry),
            }
        }
    }
    Ok(tail)
}

/// The entries of segment `number` from byte `start` on (its header
/// checked), each with its end offset in the segment, up to the first torn
/// or damaged one (see [`SegmentEntries`]). A missing segment has none.
pub(crate) fn read_segment_from(path: &Path, number: u64, start: u64) -> Result<SegmentEntries> {
    let mut out = SegmentEntries {
        entries: Vec::new(),
        torn: None,
    };
    let Some(bytes) = segment_bytes_from(path, number, start)? else {
        return Ok(out);
    };
    let base = start.max(SEGMENT_HEADER_LEN);
    let mut at = 0usize;
    while at < bytes.len() {
        match decode(&bytes[at..]) {
            Ok((entry, used)) => {
                at += used;
                out.entries.push((entry, base + at as u64));
            }
            Err(e) => {
                out.torn = Some(format!(
                    "{} at byte {}: {e}",
                    path.display(),
                    base + at as u64
                ));
                break;
            }
        }
    }
    Ok(out)
}

/// The segment this session appends to.
struct Segment {
    file: File,
    path: PathBuf,
    number: u64,
    len: u64,
    /// Whether its directory entry is not yet known durable.
    new: bool,
}

/// Appends one entry made of `parts` and its CRC to `buf`.
fn encode_into(buf: &mut Vec<u8>, parts: &[&[u8]]) {
    let mut crc = crc32fast::Hasher::new();
    buf.reserve(parts.iter().map(|p| p.len()).sum::<usize>() + CRC_LEN);
    for part in parts {
        crc.update(part);
        buf.extend_from_slice(part);
    }
    buf.extend_from_slice(&crc.finalize().to_le_bytes());
}

/// Appends entries for the writer; the caller serialises.
pub(crate) struct JournalWriter {
    root: PathBuf,
    current: Option<Segment>,
    next_number: u64,
    /// Appended since the last sync.
    dirty: bool,
    /// Changes appended since the last commit.
    uncommitted: bool,
    /// Bytes appended by this writer (for the checkpoint threshold).
    appended: u64,
}

impl JournalWriter {
    /// A writer whose first segment will be numbered `next_number`.
    pub(crate) fn new(root: &Path, next_number: u64) -> JournalWriter {
        JournalWriter {
            root: root.to_owned(),
            current: None,
            next_number,
            dirty: false,
            uncommitted: false,
            appended: 0,
        }
    }

    fn open_segment(&mut self) -> Result<&mut Segment> {
        if self.current.is_none() {
            let dir = self.root.join(JOURNAL_DIR);
            fsio::create_dir_all(&dir).map_err(Error::io(&dir))?;
            let number = self.next_number;
            let path = self.root.join(relpath(number));
            let mut file = fsio::create(&path).map_err(Error::io(&path))?;
            let mut header = SEGMENT_MAGIC.to_vec();
            header.extend_from_slice(&number.to_le_bytes());
            if let Err(e) = fsio::write_all(&mut file, &path, &header) {
                let _ = fsio::remove_file(&path);
                return Err(Error::io(&path)(e));
            }
            self.next_number += 1;
            self.current = Some(Segment {
                file,
                path,
                number,
                len: SEGMENT_HEADER_LEN,
                new: true,
            });
        }
        Ok(self.current.as_mut().expect("just opened"))
    }

    /// Starts a new segment now, even if nothing is appended to it.
    pub(crate) fn start_segment(&mut self) -> Result<()> {
        self.open_segment()?;
        self.dirty = true;
        self.uncommitted = true;
        Ok(())
    }

    /// Appends a put of `key`; returns the position after it.
    pub(crate) fn put(
        &mut self,
        key: &str,
        record: &[u8],
        pickle: Option<&[u8]>,
    ) -> Result<Position> {
        self.put_many(&[(key, record, pickle)])
    }

    /// Appends a put entry for each `(key, record, pickle)`, in order, with
    /// one write; returns the position after the last. On error none of
    /// them is in the segment.
    pub(crate) fn put_many(&mut self, puts: &[Put<'_>]) -> Result<Position> {
        let mut buf = Vec::new();
        for (key, record, pickle) in puts {
            let header = entry_header(key, record, *pickle, 0)?;
            encode_into(
                &mut buf,
                &[&header, key.as_bytes(), record, pickle.unwrap_or_default()],
            );
        }
        self.append(&buf)
    }

    /// Appends a delete of `key`; returns the position after it.
    pub(crate) fn delete(&mut self, key: &str) -> Result<Position> {
        let header = entry_header(key, &[], None, FLAG_DELETE)?;
        let mut buf = Vec::new();
        encode_into(&mut buf, &[&header, key.as_bytes()]);
        self.append(&buf)
    }

    /// Writes encoded entries at the end of the segment.
    fn append(&mut self, entries: &[u8]) -> Result<Position> {
        let segment = self.open_segment()?;
        match fsio::write_all(&mut segment.file, &segment.path, entries) {
            Ok(()) => {
                segment.len += entries.len() as u64;
                let pos = (segment.number, segment.len);
                self.appended += entries.len() as u64;
                self.dirty = true;
                self.uncommitted = true;
                Ok(pos)
            }
            Err(e) => {
                let err = Error::io(&segment.path)(e);
                self.undo_to(None);
                Err(err)
            }
        }
    }

    /// Cuts the current segment back to `end` (its length before the last
    /// append when `None`): the entry of a change that did not happen must
    /// not replay. If that fails, the segment is closed and the next append
    /// starts a new one; the stray entry is then cut at the next open,
    /// unless a later change is committed first (see FORMAT.md).
    pub(crate) fn undo_to(&mut self, end: Option<u64>) {
        let Some(segment) = self.current.as_mut() else {
            return;
        };
        let end = end.unwrap_or(segment.len);
        let cut = fsio::truncate(&segment.file, &segment.path, end)
            .and_then(|()| segment.file.seek(SeekFrom::Start(end)).map(drop));
        match cut {
            Ok(()) => segment.len = end,
            Err(_) => self.current = None,
        }
    }

    /// The end of the last entry appended (the current position).
    pub(crate) fn position(&self) -> Option<Position> {
        self.current.as_ref().map(|s| (s.number, s.len))
    }

    /// Makes every appended entry durable: fsync of the segment and, for a
    /// new segment, of the journal directory.
    pub(crate) fn sync(&mut self) -> Result<()> {
        if !self.dirty {
            return Ok(());
        }
        if let Some(segment) = self.current.as_mut() {
            fsio::sync_file(&segment.file, &segment.path).map_err(Error::io(&segment.path))?;
            if segment.new {
                let dir = self.root.join(JOURNAL_DIR);
                fsio::sync_dir(&dir).map_err(Error::io(&dir))?;
                segment.new = false;
            }
        }
        self.dirty = false;
        Ok(())
    }

    /// Appends a commit (see [`Change::Commit`]) after the changes since
    /// the last one and makes it durable: called once the index holds them
    /// durably too, so a commit means "acknowledged to the caller".
    /// Returns whether there was anything to commit.
    pub(crate) fn commit(&mut self) -> Result<bool> {
        if !self.uncommitted {
            return Ok(false);
        }
        let header = entry_header("", &[], None, FLAG_COMMIT)?;
        let mut buf = Vec::new();
        encode_into(&mut buf, &[&header]);
        self.append(&buf)?;
        self.sync()?;
        self.uncommitted = false;
        Ok(true)
    }

    /// Bytes appended so far by this writer.
    pub(crate) fn appended(&self) -> u64 {
        self.appended
    }

    /// Ends the current segment; the next append starts a new one.
    pub(crate) fn finish_segment(&mut self) {
        self.current = None;
    }

    /// The number the next new segment gets.
    pub(crate) fn next_number(&self) -> u64 {
        self.next_number
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, record: &[u8], pickle: Option<&[u8]>) -> Entry {
        Entry {
            key: key.into(),
            change: Change::Put {
                record: record.to_vec(),
                pickle: pickle.map(<[u8]>::to_vec),
            },
        }
    }

    #[test]
    fn round_trips() {
        for entry in [
            put("a/b ✓", br#"{"meta":{}}"#, None),
            put("k", b"{}", Some(b"\x80\x05N.")),
            put("k", b"{}", Some(b"")),
            Entry {
                key: "gone".into(),
                change: Change::Delete,
            },
        ] {
            let mut bytes = encode(&entry);
            let n = bytes.len();
            bytes.extend_from_slice(b"next entry...");
            assert_eq!(decode(&bytes).unwrap(), (entry, n));
        }
    }

    #[test]
    fn every_truncation_and_bit_flip_is_detected() {
        let bytes = encode(&put("k", br#"{"meta":{"x":1}}"#, Some(b"pickle")));
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(decode(&b).is_err(), "bit {bit} of byte {i}");
            }
        }
    }

    #[test]
    fn huge_lengths_are_refused_before_any_allocation() {
        let mut bytes = encode(&put("k", b"{}", None));
        bytes[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        bytes[24] = 1;
        assert!(decode(&bytes).unwrap_err().contains("need more"));
    }

    #[test]
    fn a_torn_tail_stops_replay_there() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = JournalWriter::new(dir.path(), 7);
        w.put("a", b"{}", None).unwrap();
        let (n, end) = w.delete("a").unwrap();
        let (_, end_b) = w.put("b", b"{}", Some(b"p")).unwrap();
        w.commit().unwrap();
        let path = dir.path().join(relpath(n));
        let full = fs::metadata(&path).unwrap().len();
        // commit() appended a commit after the last change.
        let read = read_segment(&path, n, None).unwrap();
        assert_eq!(read.entries.len(), 4);
        assert_eq!(read.entries[3].0.change, Change::Commit);
        assert_eq!(read.entries[3].1, full);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(full - 3)
            .unwrap();
        let read = read_segment(&path, n, None).unwrap();
        assert_eq!(read.entries.len(), 3);
        assert_eq!(read.entries[1].1, end);
        assert!(read.torn.unwrap().contains(&format!("at byte {end_b}")));
        assert_eq!(read_segment(&path, n, Some(end)).unwrap().torn, None);
        assert_eq!(segments(dir.path()).unwrap(), [(7, path)]);
    }
}
