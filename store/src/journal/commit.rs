//! What readers take from the journal: the changes a commit covers, past a
//! position (FORMAT.md, "Reading beside a writer").

use std::path::{Path, PathBuf};

use super::entry::{Change, Entry};
use super::segment::{entries, relpath, segment_bytes_from, segments, SEGMENT_HEADER_LEN};
use super::Position;
use crate::error::{Error, Result};

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
/// the newest checkpoint instead), or when a segment is removed while it
/// is read; I/O errors.
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
    for (number, path) in segments_from(root, from)? {
        let start = if number == from.0 { from.1 } else { 0 };
        let Some(bytes) = segment_bytes_from(&path, number, start)? else {
            // Removed while we read (a gc() that wrote a newer checkpoint):
            // what we have is no longer one state; the caller starts over.
            return Err(Error::corrupt(
                format!("journal {}", path.display()),
                "removed while it was being read (a newer checkpoint replaces it)",
            ));
        };
        let mut pending: Vec<Entry> = Vec::new();
        // The first entry that does not decode ends the segment.
        for (entry, end) in entries(&bytes, start.max(SEGMENT_HEADER_LEN)).map_while(|e| e.ok()) {
            if entry.change != Change::Commit {
                pending.push(entry);
                continue;
            }
            for e in pending.drain(..) {
                let change = match e.change {
                    Change::Put { record, pickle } => Some((record, pickle)),
                    _ => None,
                };
                apply(e.key, change);
            }
            tail.commits += 1;
            tail.end = (number, end);
            if max_commits.is_some_and(|m| tail.commits >= m) {
                return Ok(tail);
            }
        }
    }
    Ok(tail)
}

/// The segments holding `from` and after it, by number.
///
/// From a checkpoint, the segments are probed by number (a writer numbers
/// them consecutively): opening costs what the tail holds, not what the
/// whole journal directory lists. From the start, listed.
fn segments_from(root: &Path, from: Position) -> Result<Vec<(u64, PathBuf)>> {
    if from.0 == 0 {
        segments(root)
    } else if root.join(relpath(from.0)).exists() {
        Ok((from.0..)
            .map(|n| (n, root.join(relpath(n))))
            .take_while(|(_, p)| p.exists())
            .collect())
    } else if segments(root)?.iter().any(|(n, _)| *n > from.0) {
        Err(Error::corrupt(
            format!("journal {}", root.join(relpath(from.0)).display()),
            "removed since this snapshot's checkpoint was written",
        ))
    } else {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::JournalWriter;

    /// The keys `read_committed` applies from `from`, and what it returns.
    fn read(root: &Path, from: Position, max: Option<u64>) -> (Vec<String>, CommittedTail) {
        let mut keys = Vec::new();
        let tail = read_committed(root, from, max, |k, c| {
            keys.push(format!("{k}{}", if c.is_some() { "" } else { "-" }))
        })
        .unwrap();
        (keys, tail)
    }

    /// Segment 1: put and delete of "a", committed; segment 2: a put of
    /// "b", committed, then a put of "c", not. Returns the positions after
    /// the two commits.
    fn two_segments(root: &Path) -> (Position, Position) {
        let mut w = JournalWriter::new(root, 1);
        w.put("a", b"{}", None).unwrap();
        w.delete("a").unwrap();
        w.commit().unwrap();
        let first = w.position().unwrap();
        w.finish_segment();
        w.put("b", b"{}", Some(b"p")).unwrap();
        w.commit().unwrap();
        let second = w.position().unwrap();
        w.put("c", b"{}", None).unwrap();
        (first, second)
    }

    #[test]
    fn only_committed_changes_are_applied_in_journal_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (first, second) = two_segments(root);
        let (keys, tail) = read(root, (0, 0), None);
        assert_eq!(keys, ["a", "a-", "b"]);
        assert_eq!((tail.commits, tail.end), (2, second));
        let (keys, tail) = read(root, (0, 0), Some(1));
        assert_eq!(keys, ["a", "a-"]);
        assert_eq!((tail.commits, tail.end), (1, first));
        let (keys, tail) = read(root, first, None);
        assert_eq!(keys, ["b"]);
        assert_eq!(tail.end, second);
        let (keys, tail) = read(root, second, None);
        assert!(keys.is_empty());
        assert_eq!((tail.commits, tail.end), (0, second));
    }

    #[test]
    fn a_compacted_start_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        two_segments(root);
        std::fs::remove_file(root.join(relpath(1))).unwrap();
        let err = read_committed(root, (1, SEGMENT_HEADER_LEN), None, |_, _| {}).unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)), "{err}");
        // Nothing after it either: nothing to read, not an error.
        std::fs::remove_file(root.join(relpath(2))).unwrap();
        let (keys, _) = read(root, (1, SEGMENT_HEADER_LEN), None);
        assert!(keys.is_empty());
    }
}
