//! Recovery at the start of a writing session: the changes no flush
//! acknowledged (after the journal's last commit) are cut off (FORMAT.md,
//! "Record journal" and "Write protocol").

use std::fs::{self, File};
use std::path::Path;

use super::Store;
use crate::error::{Error, Result};
use crate::fsio;
use crate::journal::{self, Position, JOURNAL_DIR};
use crate::payload;

/// Cuts the segment at `path` back to `end` bytes, then fsyncs it.
fn cut_segment(path: &Path, end: u64) -> Result<()> {
    let file = File::options()
        .write(true)
        .open(path)
        .map_err(Error::io(path))?;
    fsio::truncate(&file, path, end).map_err(Error::io(path))?;
    fsio::sync_file(&file, path).map_err(Error::io(path))
}

impl Store {
    /// Before the first write of a session: cuts the journal back to its
    /// last commit after `from` (the position of the checkpoint the writer
    /// starts from), or to `from` when none follows. Entries past it belong
    /// to changes no flush acknowledged (a crash cut them off, or a session
    /// ended without one): readers never saw them and the writer starts
    /// without them; left in place, a later repair would bring them back.
    /// Returns the number of the next segment.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the segment holding `from` is gone although
    /// later ones exist; I/O errors.
    pub(crate) fn recover_journal(root: &Path, from: Position) -> Result<u64> {
        let segments = journal::segments(root)?;
        let keep = journal::read_committed(root, from, None, |_, _| {})?.end;
        // A segment's header stays (a position before its end means none
        // of its entries).
        let (keep_segment, keep_end) = (keep.0, keep.1.max(journal::SEGMENT_HEADER_LEN));
        let mut changed = false;
        for (number, path) in &segments {
            if *number > keep_segment {
                fsio::remove_file(path).map_err(Error::io(path))?;
                changed = true;
            } else if *number == keep_segment {
                let len = fs::metadata(path).map_err(Error::io(path))?.len();
                if len > keep_end {
                    cut_segment(path, keep_end)?;
                }
            }
        }
        if changed {
            payload::sync_dir(&root.join(JOURNAL_DIR))?;
        }
        // Right after the last segment kept: segment numbers stay
        // consecutive, which readers rely on to find them without listing.
        // A checkpoint at the start of a segment not yet written (`[n, 0]`)
        // means the next one is `n`.
        let highest = segments
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| *n <= keep_segment)
            .max();
        Ok(match highest {
            Some(h) if h >= keep_segment => h + 1,
            _ => keep_segment.max(1),
        })
    }
}
