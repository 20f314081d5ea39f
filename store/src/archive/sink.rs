//! Where an [`super::ArchiveWriter`] writes: the file of
//! [`super::write_archive_file`], which can be closed after an error, or
//! memory ([`MemorySink`]: a byte counter, then a buffer of that size).

use std::cell::RefCell;
use std::fs::File;
use std::io::{BufWriter, Cursor, Seek, SeekFrom, Write};
use std::rc::Rc;

/// The file [`super::write_archive_file`] writes through: it can be closed
/// while the zip writer that owns this handle is still alive (after an
/// error).
pub struct ArchiveFile(pub(super) Rc<RefCell<Option<BufWriter<File>>>>);

impl ArchiveFile {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        match self.0.borrow_mut().as_mut() {
            Some(w) => f(w),
            None => Err(std::io::Error::other("archive file closed after an error")),
        }
    }
}

impl Write for ArchiveFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.with(|w| w.write(buf))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.with(Write::flush)
    }
}

impl Seek for ArchiveFile {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.with(|w| w.seek(pos))
    }
}

/// Where [`super::write_archive_into`] and [`super::archive_size`] write: a
/// counter of bytes (first pass, to learn the exact size) or the caller's
/// buffer.
pub enum MemorySink<'a> {
    /// Counts: the position and the largest end written.
    Counting {
        /// The current position, in bytes.
        pos: u64,
        /// The largest end written so far, in bytes.
        len: u64,
    },
    /// Writes into a buffer of the exact size; writing past it fails.
    Buffer(Cursor<&'a mut [u8]>),
}

impl Write for MemorySink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            MemorySink::Counting { pos, len } => {
                *pos += buf.len() as u64;
                *len = (*len).max(*pos);
                Ok(buf.len())
            }
            MemorySink::Buffer(c) => c.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Seek for MemorySink<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        match self {
            MemorySink::Counting { pos, len } => {
                let target = match to {
                    SeekFrom::Start(n) => Some(n),
                    SeekFrom::End(d) => len.checked_add_signed(d),
                    SeekFrom::Current(d) => pos.checked_add_signed(d),
                };
                *pos = target.ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before start")
                })?;
                Ok(*pos)
            }
            MemorySink::Buffer(c) => c.seek(to),
        }
    }
}
