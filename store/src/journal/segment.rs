//! Journal segments: `journal/<number>.log` files (16 lowercase hex
//! digits), their 16-byte header (magic, number), how they are listed, and
//! how the entries in one are read up to the first torn or damaged one.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::entry::{decode, Entry};
use super::JOURNAL_DIR;
use crate::error::{Error, Result};

/// The first 8 bytes of every segment.
const SEGMENT_MAGIC: &[u8; 8] = b"LVJRNL\0\x01";
/// Length of a segment's header; the first entry starts here.
pub(crate) const SEGMENT_HEADER_LEN: u64 = 16;

/// The header of segment `number`: magic, then the number (u64 LE).
pub(super) fn header(number: u64) -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..].copy_from_slice(&number.to_le_bytes());
    h
}

/// Whether `bytes` start with the header of segment `number`.
fn has_header(bytes: &[u8], number: u64) -> bool {
    bytes.get(..SEGMENT_HEADER_LEN as usize) == Some(&header(number)[..])
}

/// Whether the segment at `path` has a wrong header (magic or number)
/// although whole entries with a commit follow it: damage, not a segment
/// whose header is still being written (which holds nothing yet).
fn header_damaged(path: &Path, number: u64) -> Result<bool> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(path)(e)),
    };
    if bytes.len() <= SEGMENT_HEADER_LEN as usize || has_header(&bytes, number) {
        return Ok(false);
    }
    Ok(body_commits(&bytes[SEGMENT_HEADER_LEN as usize..]))
}

/// Whether `body` (a segment after its header) holds a whole commit entry
/// among entries decoded from its start.
fn body_commits(body: &[u8]) -> bool {
    let mut at = 0usize;
    while let Ok((entry, used)) = decode(&body[at..]) {
        if entry.change == super::Change::Commit {
            return true;
        }
        at += used;
        if at >= body.len() {
            break;
        }
    }
    false
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
///
/// # Errors
/// I/O errors listing `journal/` (a missing directory has none).
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
pub(crate) struct SegmentEntries {
    /// Each entry and the byte offset in the segment just after it.
    pub entries: Vec<(Entry, u64)>,
    /// Why reading stopped before the end, if it did.
    pub torn: Option<String>,
}

/// The entries in `bytes`, the part of a segment that starts at byte
/// `base`, in order, each with its end offset in the segment; after the
/// first entry that does not decode, one error (its offset in the segment
/// and why) and nothing more.
pub(super) fn entries(
    bytes: &[u8],
    base: u64,
) -> impl Iterator<Item = std::result::Result<(Entry, u64), (u64, String)>> + '_ {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        match decode(&bytes[at..]) {
            Ok((entry, used)) => {
                at += used;
                Some(Ok((entry, base + at as u64)))
            }
            Err(e) => {
                let offset = base + at as u64;
                at = bytes.len();
                Some(Err((offset, e)))
            }
        }
    })
}

/// Where `bytes` (the part of a segment that starts at byte `base`)
/// stops decoding, when a whole commit entry (its CRC-32 checked) still
/// follows: damage to acknowledged changes, not a torn tail. A crash can
/// only tear the end of what was appended, and a commit is written only
/// once everything before it is durable, so no commit can follow a torn
/// entry. `None`: the entries decode to the end, or nothing committed
/// follows the first that does not.
pub(crate) fn damage_before_commit(bytes: &[u8], base: u64) -> Option<u64> {
    let mut at = 0usize;
    while at < bytes.len() {
        match decode(&bytes[at..]) {
            Ok((_, used)) => at += used,
            Err(_) => break,
        }
    }
    if at >= bytes.len() {
        return None;
    }
    let commit_follows =
        whole_entries_after(bytes, at + 1).any(|(_, entry)| entry.change == super::Change::Commit);
    commit_follows.then_some(base + at as u64)
}

/// The offsets in `bytes`, from `from` on, where a whole entry (magic,
/// lengths and CRC-32 checked) starts, with that entry: what lies past
/// damage, found by its magic.
fn whole_entries_after(bytes: &[u8], from: usize) -> impl Iterator<Item = (usize, Entry)> + '_ {
    let magic = super::entry::ENTRY_MAGIC;
    let mut probe = from;
    std::iter::from_fn(move || loop {
        let found = memchr::memmem::find(bytes.get(probe..)?, magic)?;
        let start = probe + found;
        probe = start + 1;
        if let Ok((entry, _)) = decode(&bytes[start..]) {
            return Some((start, entry));
        }
    })
}

/// The first journal segment of the store at `root`, from position `from`
/// on, that is damaged before a commit (see [`damage_before_commit`]),
/// described: acknowledged changes a reader or writer would silently stop
/// before. `None` when there is none.
///
/// # Errors
/// I/O errors reading the journal.
pub(crate) fn damaged_commits(root: &Path, from: super::Position) -> Result<Option<String>> {
    for (number, path) in segments(root)? {
        if number < from.0 {
            continue;
        }
        if header_damaged(&path, number)? {
            return Ok(Some(format!(
                "journal segment {} has a damaged header (magic or number), and committed \
                 changes follow it (readers skip the whole segment); `lazyvault repair` keeps \
                 them",
                path.display()
            )));
        }
        let start = if number == from.0 { from.1 } else { 0 };
        let Some(bytes) = segment_bytes_from(&path, number, start)? else {
            continue;
        };
        let base = start.max(SEGMENT_HEADER_LEN);
        if let Some(at) = damage_before_commit(&bytes, base) {
            return Ok(Some(format!(
                "journal segment {} is damaged at byte {at}, and committed changes follow it \
                 (readers stop before it); `lazyvault repair` keeps the changes after it, the \
                 damaged one is lost",
                path.display()
            )));
        }
    }
    Ok(None)
}

/// Collects [`entries`] of a segment at `path` into [`SegmentEntries`].
fn collect_entries(path: &Path, bytes: &[u8], base: u64) -> SegmentEntries {
    let mut out = SegmentEntries {
        entries: Vec::new(),
        torn: None,
    };
    let mut notes: Vec<String> = Vec::new();
    let mut at = 0usize;
    loop {
        let mut stopped = None;
        for item in entries(&bytes[at..], base + at as u64) {
            match item {
                Ok(entry) => out.entries.push(entry),
                Err(stop) => stopped = Some(stop),
            }
        }
        let Some((offset, e)) = stopped else { break };
        let local = (offset - base) as usize;
        // A torn tail ends the segment; damage with a commit after it is
        // skipped to the next whole entry (what repair keeps).
        let next = damage_before_commit(&bytes[local..], offset)
            .and_then(|_| whole_entries_after(bytes, local + 1).next())
            .map(|(start, _)| start);
        match next {
            Some(next) => {
                notes.push(format!(
                    "{} bytes {offset} to {}: damaged ({e}); skipped, the changes written there \
                     are lost, the committed ones after them kept",
                    path.display(),
                    base + next as u64
                ));
                at = next;
            }
            None => {
                notes.push(format!("{} at byte {offset}: {e}", path.display()));
                break;
            }
        }
    }
    if !notes.is_empty() {
        out.torn = Some(notes.join("; "));
    }
    out
}

/// Reads a segment (see [`SegmentEntries`]); a segment whose header is not
/// that of segment `number` is torn at its start.
///
/// # Errors
/// I/O errors; [`Error::Corrupt`] for a segment too large for memory.
pub(crate) fn read_segment(path: &Path, number: u64, limit: Option<u64>) -> Result<SegmentEntries> {
    let mut file = File::open(path).map_err(Error::io(path))?;
    let len = file.metadata().map_err(Error::io(path))?.len();
    let end = limit.map_or(len, |l| l.min(len));
    let end = usize::try_from(end)
        .map_err(|_| Error::corrupt(format!("journal {}", path.display()), "too large"))?;
    let mut bytes = vec![0u8; end];
    file.read_exact(&mut bytes).map_err(Error::io(path))?;
    let base = SEGMENT_HEADER_LEN as usize;
    if !has_header(&bytes, number) {
        if bytes.len() > base && body_commits(&bytes[base..]) {
            // a damaged header before whole committed entries: keep them
            let mut read = collect_entries(path, &bytes[base..], base as u64);
            let note = format!(
                "{}: its header (magic or number) is damaged; its entries were read",
                path.display()
            );
            read.torn = Some(match read.torn {
                Some(t) => format!("{note}; {t}"),
                None => note,
            });
            return Ok(read);
        }
        return Ok(SegmentEntries {
            entries: Vec::new(),
            torn: Some(format!(
                "{}: not a journal segment numbered {number}",
                path.display()
            )),
        });
    }
    Ok(collect_entries(path, &bytes[base..], base as u64))
}

/// The header of segment `number` checked, then its bytes from `start`
/// (at least the header's end) to its end: `None` when the file is gone,
/// empty when its header is not (yet) written.
pub(super) fn segment_bytes_from(path: &Path, number: u64, start: u64) -> Result<Option<Vec<u8>>> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        // Removed since it was listed: a newer checkpoint covers it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path)(e)),
    };
    let mut header = [0u8; SEGMENT_HEADER_LEN as usize];
    if file.read_exact(&mut header).is_err() || !has_header(&header, number) {
        // A segment whose header is not (yet) written holds no commit.
        return Ok(Some(Vec::new()));
    }
    let start = start.max(SEGMENT_HEADER_LEN);
    file.seek(SeekFrom::Start(start)).map_err(Error::io(path))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(Error::io(path))?;
    Ok(Some(bytes))
}

/// The entries of segment `number` from byte `start` on (its header
/// checked), each with its end offset in the segment, up to the first torn
/// or damaged one (see [`SegmentEntries`]). A missing segment has none.
/// (What [`crate::journal::read_committed`] reads, entry by entry.)
#[cfg(test)]
pub(crate) fn read_segment_from(path: &Path, number: u64, start: u64) -> Result<SegmentEntries> {
    let Some(bytes) = segment_bytes_from(path, number, start)? else {
        return Ok(SegmentEntries {
            entries: Vec::new(),
            torn: None,
        });
    };
    Ok(collect_entries(path, &bytes, start.max(SEGMENT_HEADER_LEN)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Change, JournalWriter};

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

    #[test]
    fn reading_from_an_offset_reports_offsets_in_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = JournalWriter::new(dir.path(), 1);
        let (n, end_a) = w.put("a", b"{}", None).unwrap();
        let (_, end_b) = w.put("b", b"{}", None).unwrap();
        let path = dir.path().join(relpath(n));
        let from = read_segment_from(&path, n, end_a).unwrap();
        assert_eq!(from.entries.len(), 1);
        assert_eq!(from.entries[0].1, end_b);
        // From before the header: the same as from the header's end.
        let all = read_segment_from(&path, n, 0).unwrap();
        assert_eq!(all.entries, read_segment(&path, n, None).unwrap().entries);
        // Cut inside "b": torn at its start, given in segment offsets.
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(end_b - 1)
            .unwrap();
        let torn = read_segment_from(&path, n, end_a).unwrap();
        assert!(torn.entries.is_empty());
        assert!(torn.torn.unwrap().contains(&format!("at byte {end_a}")));
        // Another segment's number: no entries, not an error.
        assert!(read_segment_from(&path, n + 1, 0)
            .unwrap()
            .entries
            .is_empty());
        let missing = dir.path().join(relpath(99));
        assert!(read_segment_from(&missing, 99, 0)
            .unwrap()
            .entries
            .is_empty());
    }
}
