//! [`Archive`]: an archive file memory-mapped once and parsed.

use std::fs::File;
use std::path::{Path, PathBuf};

use lazyvault_schema::ArrayEntry;
use memmap2::Mmap;

use super::{corrupt, too_short, ArchiveIndex, MIN_ZIP_LEN};
use crate::error::{Error, Result};

/// An archive file, memory-mapped once, read-only. Needs no lock: any
/// number of processes may open the same archive.
///
/// Like payload files, an archive must not be truncated or rewritten in
/// place while mapped (lazyvault replaces archives by rename only).
#[derive(Debug)]
pub struct Archive {
    path: PathBuf,
    map: Mmap,
    index: ArchiveIndex,
}

impl Archive {
    /// Opens and maps the archive at `path` and parses it (see
    /// [`ArchiveIndex::parse`]).
    ///
    /// # Errors
    /// I/O errors; [`Error::Corrupt`] for something other than a regular
    /// file, a file too short or too large to map, and what
    /// [`ArchiveIndex::parse`] refuses.
    pub fn open(path: impl AsRef<Path>) -> Result<Archive> {
        let path = path.as_ref();
        // the caller learns which file (CorruptError.path)
        Archive::open_unnamed(path).map_err(|e| e.with_path(path))
    }

    fn open_unnamed(path: &Path) -> Result<Archive> {
        let path = path.to_owned();
        let file = File::open(&path).map_err(Error::io(&path))?;
        let meta = file.metadata().map_err(Error::io(&path))?;
        let what = path.display().to_string();
        if !meta.is_file() {
            return Err(corrupt(&what, "not a regular file"));
        }
        if meta.len() < MIN_ZIP_LEN {
            return Err(too_short(&what, meta.len()));
        }
        if usize::try_from(meta.len()).is_err() {
            return Err(corrupt(&what, "too large to map"));
        }
        // SAFETY: archives are written to a temporary name and renamed into
        // place, never rewritten; the length was checked above and every
        // range is checked against the map's length before use.
        let map = unsafe { Mmap::map(&file) }.map_err(Error::io(&path))?;
        let index = ArchiveIndex::parse(&map, &what)?;
        Ok(Archive { path, map, index })
    }

    /// The archive's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The parsed records and members.
    pub fn index(&self) -> &ArchiveIndex {
        &self.index
    }

    /// The data of `entry`: a zero-copy slice of the mapping.
    ///
    /// # Errors
    /// As [`ArchiveIndex::array_range`].
    pub fn array(&self, entry: &ArrayEntry) -> Result<&[u8]> {
        let range = self.index.array_range(&self.map, entry)?;
        Ok(&self.map[range])
    }
}
