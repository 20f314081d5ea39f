//! Recovery at the start of a writing session: the journal past the
//! index's position is compared with the index, the changes no flush
//! acknowledged are cut off, and what the index holds without a commit
//! gets one (FORMAT.md, "Record journal" and "Write protocol").

use std::fs::{self, File};
use std::io::{Seek, SeekFrom};
use std::path::Path;

use super::Store;
use crate::error::{Error, Result};
use crate::fsio;
use crate::index::Index;
use crate::journal::{self, Change, Entry, Position, JOURNAL_DIR};
use crate::payload;

/// The journal after the index's position, as found at open.
pub(super) struct JournalTail {
    /// How many changes a flush acknowledged (a commit follows them) that
    /// the index does not reflect: the index is behind, not the journal.
    pub lost: Option<usize>,
    /// Where the journal can be cut: after the last commit past the
    /// index's position, or at that position.
    keep: Position,
    /// Whether changes the index holds follow the last commit before its
    /// position (a crash after sled wrote them, before a flush): they need
    /// a commit so that readers see what the writer sees.
    uncommitted: bool,
}

/// Reads the journal past the index's position (all of it when the index
/// has none) and compares the acknowledged changes there with the index:
/// after a crash they are duplicates of what the index holds (sled wrote
/// the batch, or a compaction had not yet moved the position); after a
/// power loss that cost the index flushed changes, they are not.
pub(super) fn journal_tail(root: &Path, index: &Index) -> Result<JournalTail> {
    let committed = index.journal_pos()?.unwrap_or((0, 0));
    let mut keep = committed;
    let mut pending: Vec<Entry> = Vec::new();
    let mut lost = 0;
    // Whether the entry right after the index's position is a commit: a
    // flush appends one there once the index holds the changes before it.
    let mut commit_follows = None;
    for (number, path) in journal::segments(root)? {
        if number < committed.0 {
            continue;
        }
        // Only what follows the position is read: a bulk load's segment of
        // hundreds of MiB costs nothing at the next session's start.
        let start = if number == committed.0 {
            committed.1
        } else {
            0
        };
        let read = journal::read_segment_from(&path, number, start)?;
        for (entry, end) in read.entries {
            if number == committed.0 && commit_follows.is_none() {
                commit_follows = Some(entry.change == Change::Commit);
            }
            if entry.change == Change::Commit {
                for change in pending.drain(..) {
                    if !reflected(index, &change)? {
                        lost += 1;
                    }
                }
                keep = (number, end);
            } else {
                pending.push(entry);
            }
        }
        // A torn tail ends the segment; the next one goes on.
    }
    Ok(JournalTail {
        lost: (lost > 0).then_some(lost),
        keep,
        // Without a commit right after it, what the index holds up to its
        // position may be uncommitted (a crash after sled wrote it): commit
        // it (an empty commit when it was committed already: harmless).
        uncommitted: committed != (0, 0) && commit_follows != Some(true) && keep == committed,
    })
}

/// Whether the index holds the result of the journal entry `change`: the
/// same record and pickled remainder for a put, no record for a delete.
fn reflected(index: &Index, change: &Entry) -> Result<bool> {
    Ok(match &change.change {
        Change::Put { record, pickle } => {
            index.get(&change.key)?.as_deref() == Some(&record[..])
                && index.get_pickle(&change.key)? == *pickle
        }
        Change::Delete => !index.contains(&change.key)?,
        Change::Commit => true,
    })
}

/// Cuts the segment at `path` back to `end` bytes and, when `commit`,
/// appends a commit entry there; then fsyncs it.
fn cut_segment(path: &Path, end: u64, commit: bool) -> Result<()> {
    let mut file = File::options()
        .write(true)
        .open(path)
        .map_err(Error::io(path))?;
    fsio::truncate(&file, path, end).map_err(Error::io(path))?;
    if commit {
        let entry = journal::encode(&Entry {
            key: String::new(),
            change: Change::Commit,
        });
        file.seek(SeekFrom::Start(end)).map_err(Error::io(path))?;
        fsio::write_all(&mut file, path, &entry).map_err(Error::io(path))?;
    }
    fsio::sync_file(&file, path).map_err(Error::io(path))
}

impl Store {
    /// Before the first write of a session: cuts the journal back to the
    /// position the index holds. Entries past it belong to changes a crash
    /// cut off before their index entry (never acknowledged by a flush);
    /// left in place, a later repair would bring them back. Changes the
    /// index holds but no commit covers get one, so readers see them too.
    /// Returns the number of the next segment.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the index is behind the journal (changes a
    /// flush acknowledged are missing from it: `repair` rebuilds it); I/O
    /// errors.
    pub(crate) fn recover_journal(root: &Path, index: &Index) -> Result<u64> {
        let segments = journal::segments(root)?;
        let tail = journal_tail(root, index)?;
        if let Some(lost) = tail.lost {
            return Err(Error::corrupt(
                format!("store {}", root.display()),
                format!(
                    "the index is behind the journal: {lost} change(s) that flush() acknowledged \
                     are missing from it (a power loss, or a damaged index); `lazyvault repair \
                     {}` rebuilds it from the journal",
                    root.display()
                ),
            ));
        }
        // Cut the changes no flush acknowledged: a crash cut them off
        // before their index entry.
        let (keep_segment, keep_end) = tail.keep;
        let mut changed = false;
        for (number, path) in &segments {
            if *number > keep_segment {
                fsio::remove_file(path).map_err(Error::io(path))?;
                changed = true;
            } else if *number == keep_segment {
                let len = fs::metadata(path).map_err(Error::io(path))?.len();
                if len > keep_end || tail.uncommitted {
                    cut_segment(path, keep_end, tail.uncommitted)?;
                }
            }
        }
        if changed {
            payload::sync_dir(&root.join(JOURNAL_DIR))?;
        }
        // Right after the last segment kept: segment numbers stay
        // consecutive, which readers rely on to find them without listing.
        let kept = segments
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| *n <= keep_segment);
        Ok(kept.max().map_or(1, |n| n + 1).max(keep_segment + 1))
    }
}
