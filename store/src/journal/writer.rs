//! The journal writer: appends entries to this session's segment, cuts
//! back the entry of a change that failed, and makes entries durable (one
//! fsync per flush) and committed.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::entry::{encode_into, entry_header, FLAG_COMMIT, FLAG_DELETE};
use super::segment::{self, relpath, SEGMENT_HEADER_LEN};
use super::{Position, Put, JOURNAL_DIR};
use crate::error::{Error, Result};
use crate::fsio;

/// The segment this session appends to.
struct Segment {
    file: File,
    path: PathBuf,
    number: u64,
    len: u64,
    /// Whether its directory entry is not yet known durable.
    new: bool,
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
            if let Err(e) = fsio::write_all(&mut file, &path, &segment::header(number)) {
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

    /// Appends a put of `key`; returns the position after it.
    #[cfg(test)]
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
        // header, key, record, pickle and CRC of each: one allocation
        let size = puts
            .iter()
            .map(|(k, r, p)| 44 + k.len() + r.len() + p.map_or(0, <[u8]>::len))
            .sum();
        let mut buf = Vec::with_capacity(size);
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

    /// Appends a commit even when nothing changed since the last one: a
    /// new version of the same records (what `gc()` makes).
    pub(crate) fn commit_version(&mut self) -> Result<()> {
        self.uncommitted = true;
        self.commit().map(drop)
    }

    /// Whether changes were appended since the last commit.
    pub(crate) fn has_uncommitted(&self) -> bool {
        self.uncommitted
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
