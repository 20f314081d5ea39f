//! Column files: a [`Columns`] batch as an Arrow IPC file (the "Feather
//! v2" file format: magic `ARROW1`, schema, dictionaries, one record
//! batch, footer), written once through a temporary file, then
//! memory-mapped and read without copying: pyarrow, polars and DuckDB read
//! the same file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::Buffer;
use arrow_ipc::convert::try_fb_to_schema;
use arrow_ipc::reader::{read_footer_length, FileDecoder};
use arrow_ipc::root_as_footer;
use arrow_ipc::writer::{FileWriter, IpcWriteOptions};
use memmap2::Mmap;
use xxhash_rust::xxh3::Xxh3;

use super::Columns;
use crate::error::{Error, Result};
use crate::fsio;

/// File name suffix of column files (next to their run: `<run>.arrow`).
pub(crate) const COLUMNS_SUFFIX: &str = ".arrow";

/// A written column file, as a checkpoint lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ColumnsInfo {
    /// File name in its directory.
    pub file: String,
    pub bytes: u64,
    /// XXH3-64 of the whole file.
    pub checksum: u64,
}

/// A sink that hashes what it writes.
struct Hashing<W: Write> {
    inner: W,
    hash: Xxh3,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The memory map as the owner of Arrow buffers that point into it.
struct MappedFile(Mmap);

impl std::panic::RefUnwindSafe for MappedFile {}

impl Columns {
    /// Writes the columns to `dir/name` as an Arrow IPC file: to
    /// `name.tmp` first, fsynced, then renamed (the caller syncs `dir`).
    ///
    /// # Errors
    /// I/O errors; the temporary file is removed.
    pub(crate) fn write(&self, dir: &Path, name: &str) -> Result<ColumnsInfo> {
        let path = dir.join(name);
        let tmp = dir.join(format!("{name}.tmp"));
        let written = (|| -> Result<(u64, u64)> {
            let file = fsio::create(&tmp).map_err(Error::io(&tmp))?;
            let mut sink = Hashing {
                inner: BufWriter::with_capacity(1 << 20, file),
                hash: Xxh3::new(),
                bytes: 0,
            };
            // 64-byte aligned buffers: mapped columns are used in place.
            let options = IpcWriteOptions::try_new(64, false, arrow_ipc::MetadataVersion::V5)
                .map_err(super::build::arrow_err)?;
            let schema = self.batch.schema();
            let mut writer = FileWriter::try_new_with_options(&mut sink, &schema, options)
                .map_err(|e| io_or_arrow(e, &tmp))?;
            writer
                .write(&self.batch)
                .map_err(|e| io_or_arrow(e, &tmp))?;
            writer.finish().map_err(|e| io_or_arrow(e, &tmp))?;
            drop(writer);
            let (bytes, checksum) = (sink.bytes, sink.hash.digest());
            let file = sink
                .inner
                .into_inner()
                .map_err(|e| Error::io(&tmp)(e.into_error()))?;
            fsio::sync_file(&file, &tmp).map_err(Error::io(&tmp))?;
            Ok((bytes, checksum))
        })();
        let (bytes, checksum) = match written {
            Ok(v) => v,
            Err(e) => {
                let _ = fsio::remove_file(&tmp);
                return Err(e);
            }
        };
        if let Err(e) = fsio::rename(&tmp, &path) {
            let _ = fsio::remove_file(&tmp);
            return Err(Error::io(&path)(e));
        }
        Ok(ColumnsInfo {
            file: name.to_owned(),
            bytes,
            checksum,
        })
    }

    /// Maps the column file at `path` and reads its batch without copying,
    /// after checking the file's length and XXH3-64 against `expected`
    /// (what the checkpoint recorded: a flipped bit in a value would
    /// otherwise change query results silently); Arrow then validates
    /// every array (offsets, UTF-8, dictionary keys).
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the file when its length or checksum
    /// differ, or it is not a column file of one batch in our layout; I/O
    /// errors.
    pub(crate) fn open(path: &Path, expected: &ColumnsInfo) -> Result<Columns> {
        let expected_len = expected.bytes;
        let corrupt =
            |detail: String| Error::corrupt(format!("column file {}", path.display()), detail);
        let file = File::open(path).map_err(Error::io(path))?;
        let len = file.metadata().map_err(Error::io(path))?.len();
        if len != expected_len {
            return Err(corrupt(format!(
                "{len} bytes where the checkpoint says {expected_len}"
            )));
        }
        if len < 16 {
            return Err(corrupt("too short for an Arrow IPC file".into()));
        }
        // SAFETY: column files are immutable once renamed into place (the
        // writer never rewrites one; FORMAT.md, "Column files"), so the
        // mapping does not change under the slices Arrow makes of it.
        let map = unsafe { Mmap::map(&file) }.map_err(Error::io(path))?;
        let owner = Arc::new(MappedFile(map));
        let ptr = NonNull::new(owner.0.as_ptr() as *mut u8)
            .ok_or_else(|| corrupt("empty mapping".into()))?;
        // SAFETY: the pointer and length are those of the mapping, which
        // `owner` keeps alive as long as any buffer sliced from it.
        let buffer = unsafe { Buffer::from_custom_allocation(ptr, owner.0.len(), owner.clone()) };
        let bytes = buffer.as_slice();
        let sum = xxhash_rust::xxh3::xxh3_64(bytes);
        if sum != expected.checksum {
            return Err(corrupt(format!(
                "checksum xxh3-64:{sum:016x} where the checkpoint says xxh3-64:{:016x}",
                expected.checksum
            )));
        }
        if &bytes[..6] != b"ARROW1" || &bytes[bytes.len() - 6..] != b"ARROW1" {
            return Err(corrupt("no Arrow IPC file magic".into()));
        }
        let trailer = bytes.len() - 10;
        let footer_len = read_footer_length(bytes[trailer..].try_into().expect("10 bytes"))
            .map_err(|e| corrupt(e.to_string()))?;
        let footer_start = trailer
            .checked_sub(footer_len)
            .filter(|s| *s >= 8)
            .ok_or_else(|| corrupt("footer length past the start".into()))?;
        let footer =
            root_as_footer(&bytes[footer_start..trailer]).map_err(|e| corrupt(e.to_string()))?;
        let schema = footer
            .schema()
            .ok_or_else(|| corrupt("no schema".into()))
            .and_then(|s| try_fb_to_schema(s).map_err(|e| corrupt(e.to_string())))?;
        let mut decoder = FileDecoder::new(Arc::new(schema), footer.version());
        let block_of = |offset: i64, meta: i32, body: i64| -> Result<Buffer> {
            let start = usize::try_from(offset).ok();
            let len = usize::try_from(meta)
                .ok()
                .zip(usize::try_from(body).ok())
                .and_then(|(m, b)| m.checked_add(b));
            match (start, len) {
                (Some(s), Some(l)) if s.checked_add(l).is_some_and(|e| e <= footer_start) => {
                    Ok(buffer.slice_with_length(s, l))
                }
                _ => Err(corrupt("a block lies outside the file".into())),
            }
        };
        for block in footer.dictionaries().iter().flatten() {
            let data = block_of(block.offset(), block.metaDataLength(), block.bodyLength())?;
            decoder
                .read_dictionary(block, &data)
                .map_err(|e| corrupt(e.to_string()))?;
        }
        let batches = footer
            .recordBatches()
            .ok_or_else(|| corrupt("no record batch".into()))?;
        if batches.len() != 1 {
            return Err(corrupt(format!(
                "{} record batches where there must be one",
                batches.len()
            )));
        }
        let block = batches.get(0);
        let data = block_of(block.offset(), block.metaDataLength(), block.bodyLength())?;
        let batch = decoder
            .read_record_batch(block, &data)
            .map_err(|e| corrupt(e.to_string()))?
            .ok_or_else(|| corrupt("an empty record batch message".into()))?;
        Columns::new(batch).map_err(|e| corrupt(e.to_string()))
    }

    /// Whether the file at `path` has the length and checksum recorded
    /// (for `verify`: reading maps, it does not hash).
    ///
    /// # Errors
    /// I/O errors.
    pub(crate) fn check_file(path: &Path, info: &ColumnsInfo) -> Result<Option<String>> {
        let bytes = std::fs::read(path).map_err(Error::io(path))?;
        if bytes.len() as u64 != info.bytes {
            return Ok(Some(format!(
                "{} bytes where the checkpoint says {}",
                bytes.len(),
                info.bytes
            )));
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
        if sum != info.checksum {
            return Ok(Some(format!(
                "checksum xxh3-64:{sum:016x} where the checkpoint says xxh3-64:{:016x}",
                info.checksum
            )));
        }
        Ok(None)
    }
}

/// An Arrow error while writing: I/O ones keep their path.
fn io_or_arrow(e: arrow_schema::ArrowError, path: &PathBuf) -> Error {
    match e {
        arrow_schema::ArrowError::IoError(_, io) => Error::io(path)(io),
        other => super::build::arrow_err(other),
    }
}
