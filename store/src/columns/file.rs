//! Column files: a [`Columns`] batch as an Arrow IPC file (the "Feather
//! v2" file format: magic `ARROW1`, schema, dictionaries, one record
//! batch, footer), written once through a temporary file, then
//! memory-mapped and read without copying: pyarrow, polars and DuckDB read
//! the same file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::Buffer;
use arrow_ipc::convert::try_fb_to_schema;
use arrow_ipc::reader::read_footer_length;
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
    /// XXH3-64 of the footer (the schema: which column holds what), and
    /// of each column's decoded buffers ([`column_checksum`]), checked at
    /// open and at a column's first use: a flipped bit must not change an
    /// answer. Empty when unknown (then not checked).
    pub footer: Option<u64>,
    pub columns: Vec<u64>,
}

/// The XXH3-64 of one decoded column: its length, validity and buffers,
/// and those of its children (list items, dictionary values), in order.
/// Deterministic for the same file bytes (decoding slices them as they
/// are).
pub(crate) fn column_checksum(array: &dyn arrow_array::Array) -> u64 {
    fn feed(data: &arrow_data::ArrayData, h: &mut Xxh3) {
        h.update(&(data.len() as u64).to_le_bytes());
        h.update(&(data.offset() as u64).to_le_bytes());
        match data.nulls() {
            Some(nulls) => {
                h.update(&[1]);
                h.update(nulls.buffer().as_slice());
            }
            None => h.update(&[0]),
        }
        for b in data.buffers() {
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b.as_slice());
        }
        for child in data.child_data() {
            feed(child, h);
        }
    }
    let mut h = Xxh3::new();
    feed(&array.to_data(), &mut h);
    h.digest()
}

/// The footer bytes of an Arrow IPC file (the schema and the block
/// table), if the trailer is well formed.
fn footer_of(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() < 16 || &bytes[bytes.len() - 6..] != b"ARROW1" {
        return None;
    }
    let trailer = bytes.len() - 10;
    let len = read_footer_length(bytes[trailer..].try_into().ok()?).ok()?;
    Some(&bytes[trailer.checked_sub(len)?..trailer])
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

/// Bytes of each write of a column file: a multiple of 2 MiB.
const WRITE_CHUNK: usize = 8 << 20;

/// A file written in whole chunks (of [`WRITE_CHUNK`] bytes; the last one
/// shorter), each at an offset that is a multiple of the chunk. The page cache
/// then holds the file in large folios, which a mapping of it maps 2 MiB
/// per page fault: a reader's first query faults a few times instead of
/// hundreds (a file written 8 KiB at a time took 6.1 ms to touch once
/// mapped, 71 MB; in 8 MiB chunks 2.3 ms, as a file read from disk).
struct Chunked<W: Write> {
    inner: W,
    buf: Vec<u8>,
    chunk: usize,
}

impl<W: Write> Chunked<W> {
    fn new(inner: W, chunk: usize) -> Chunked<W> {
        Chunked {
            inner,
            buf: Vec::with_capacity(chunk),
            chunk,
        }
    }

    /// The writer, every byte written to it.
    fn into_inner(mut self) -> std::io::Result<W> {
        self.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for Chunked<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = bytes.len().min(self.chunk - self.buf.len());
        self.buf.extend_from_slice(&bytes[..n]);
        if self.buf.len() == self.chunk {
            self.inner.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.write_all(&self.buf)?;
        self.buf.clear();
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
                inner: Chunked::new(file, WRITE_CHUNK),
                hash: Xxh3::new(),
                bytes: 0,
            };
            // 64-byte aligned buffers: mapped columns are used in place.
            let options = IpcWriteOptions::try_new(64, false, arrow_ipc::MetadataVersion::V5)
                .map_err(super::build::arrow_err)?;
            let batch = self.batch()?;
            let schema = batch.schema();
            let mut writer = FileWriter::try_new_with_options(&mut sink, &schema, options)
                .map_err(|e| io_or_arrow(e, &tmp))?;
            writer.write(&batch).map_err(|e| io_or_arrow(e, &tmp))?;
            writer.finish().map_err(|e| io_or_arrow(e, &tmp))?;
            drop(writer);
            let (bytes, checksum) = (sink.bytes, sink.hash.digest());
            let file = sink.inner.into_inner().map_err(Error::io(&tmp))?;
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
        // The footer's and each column's checksum, from the file as a
        // reader will decode it (read back: it is in the page cache).
        let written = std::fs::read(&path).map_err(Error::io(&path))?;
        let footer = footer_of(&written).map(xxhash_rust::xxh3::xxh3_64);
        let decoded = Columns::decode_caught(&Buffer::from_vec(written))
            .map_err(|e| Error::corrupt(format!("column file {}", path.display()), e))?;
        let mut columns = Vec::with_capacity(decoded.schema().fields().len());
        for i in 0..decoded.schema().fields().len() {
            let array = decoded.column(i).ok_or_else(|| {
                Error::corrupt(
                    format!("column file {}", path.display()),
                    format!("column {i} does not read back"),
                )
            })?;
            columns.push(column_checksum(array.as_ref()));
        }
        Ok(ColumnsInfo {
            file: name.to_owned(),
            bytes,
            checksum,
            footer,
            columns,
        })
    }

    /// Maps the column file at `path` (whose length must be `expected`'s)
    /// and reads its schema, row count and dictionaries; each column is
    /// decoded at its first use ([`Columns::column`]), without copying,
    /// validated by Arrow (offsets, UTF-8, dictionary keys). The XXH3-64 is
    /// not checked here (it would read every byte at open): `verify`
    /// checks it, as it does for runs and payloads.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the file when its length differs or it is
    /// not a column file of one batch in our layout; I/O errors.
    pub(crate) fn open(path: &Path, expected: &ColumnsInfo) -> Result<Columns> {
        let corrupt =
            |detail: String| Error::corrupt(format!("column file {}", path.display()), detail);
        let file = File::open(path).map_err(Error::io(path))?;
        let len = file.metadata().map_err(Error::io(path))?.len();
        if len != expected.bytes {
            return Err(corrupt(format!(
                "{len} bytes where the checkpoint says {}",
                expected.bytes
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
        if let Some(expected_footer) = expected.footer {
            let sum = footer_of(buffer.as_slice()).map(xxhash_rust::xxh3::xxh3_64);
            if sum != Some(expected_footer) {
                return Err(corrupt(
                    "its footer (the schema) differs from the checkpoint's checksum".into(),
                ));
            }
        }
        let mut columns = Columns::decode_caught(&buffer).map_err(corrupt)?;
        if !expected.columns.is_empty() {
            if expected.columns.len() != columns.schema().fields().len() {
                return Err(corrupt(format!(
                    "{} columns where the checkpoint lists {} checksums",
                    columns.schema().fields().len(),
                    expected.columns.len()
                )));
            }
            columns.set_checksums(expected.columns.clone());
        }
        Ok(columns)
    }

    /// The layout of the Arrow IPC file held in `buffer` (one record batch,
    /// our column kinds), its dictionaries read, its columns left to decode
    /// on first use; a description of what is wrong otherwise. Never
    /// panics on damaged or hostile bytes (see [`Columns::decode_caught`]).
    pub(super) fn decode(buffer: &Buffer) -> std::result::Result<Columns, String> {
        let bytes = buffer.as_slice();
        if bytes.len() < 16 {
            return Err("too short for an Arrow IPC file".into());
        }
        if &bytes[..6] != b"ARROW1" || &bytes[bytes.len() - 6..] != b"ARROW1" {
            return Err("no Arrow IPC file magic".into());
        }
        let trailer = bytes.len() - 10;
        let footer_len = read_footer_length(bytes[trailer..].try_into().expect("10 bytes"))
            .map_err(|e| e.to_string())?;
        let footer_start = trailer
            .checked_sub(footer_len)
            .filter(|s| *s >= 8)
            .ok_or_else(|| String::from("footer length past the start"))?;
        let footer = root_as_footer(&bytes[footer_start..trailer]).map_err(|e| e.to_string())?;
        let schema = footer
            .schema()
            .ok_or_else(|| String::from("no schema"))
            .and_then(|s| try_fb_to_schema(s).map_err(|e| e.to_string()))?;
        let schema = Arc::new(schema);
        let version = footer.version();
        let block_of = |offset: i64, meta: i32, body: i64| {
            let start = usize::try_from(offset).ok();
            let len = usize::try_from(meta)
                .ok()
                .zip(usize::try_from(body).ok())
                .and_then(|(m, b)| m.checked_add(b));
            match (start, len) {
                (Some(s), Some(l)) if s.checked_add(l).is_some_and(|e| e <= footer_start) => {
                    check_block(&bytes[s..s + l], meta, body)?;
                    // The body, after the message.
                    Ok(buffer.slice_with_length(s, l))
                }
                _ => Err(String::from("a block lies outside the file")),
            }
        };
        let mut dictionaries = std::collections::HashMap::new();
        for block in footer.dictionaries().iter().flatten() {
            let data = block_of(block.offset(), block.metaDataLength(), block.bodyLength())?;
            let message = message_of(data.as_slice(), block.metaDataLength())?;
            let batch = message
                .header_as_dictionary_batch()
                .ok_or("a dictionary block without a dictionary batch")?;
            let body = data.slice(block.metaDataLength() as usize);
            arrow_ipc::reader::read_dictionary(&body, batch, &schema, &mut dictionaries, &version)
                .map_err(|e| e.to_string())?;
        }
        let batches = footer.recordBatches().ok_or("no record batch")?;
        if batches.len() != 1 {
            return Err(format!(
                "{} record batches where there must be one",
                batches.len()
            ));
        }
        let block = batches.get(0);
        let data = block_of(block.offset(), block.metaDataLength(), block.bodyLength())?;
        let meta_len = block.metaDataLength() as usize;
        let message = message_of(data.as_slice(), block.metaDataLength())?;
        let rows = message
            .header_as_record_batch()
            .ok_or("the record batch block holds another message")?
            .length();
        let rows = usize::try_from(rows).map_err(|_| format!("{rows} rows"))?;
        let mapped = Mapped {
            block: data,
            meta_len,
            dictionaries,
            version,
        };
        Columns::layout(schema, rows, Some(mapped)).map_err(|e| e.to_string())
    }

    /// [`Columns::decode`], with any panic of the Arrow reader on bytes it
    /// does not expect turned into an error (a backstop: `check_block`
    /// refuses the damage known to panic it).
    pub(super) fn decode_caught(buffer: &Buffer) -> std::result::Result<Columns, String> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Columns::decode(buffer)))
            .unwrap_or_else(|_| Err("the Arrow reader could not read it".into()))
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

/// What a mapped column file keeps to decode its columns later.
pub(crate) struct Mapped {
    /// The record batch's block: its message, then its body.
    block: Buffer,
    meta_len: usize,
    dictionaries: std::collections::HashMap<i64, arrow_array::ArrayRef>,
    version: arrow_ipc::MetadataVersion,
}

impl Mapped {
    /// Decodes column `i` (Arrow validates it; a dictionary column's codes
    /// are checked by [`dictionary_of`]); never panics.
    pub(crate) fn decode_column(
        &self,
        schema: &arrow_schema::SchemaRef,
        i: usize,
    ) -> std::result::Result<arrow_array::ArrayRef, String> {
        use arrow_schema::DataType as T;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let message = message_of(self.block.as_slice(), self.meta_len as i32)?;
            let batch = message
                .header_as_record_batch()
                .ok_or("the record batch block holds another message")?;
            let body = self.block.slice(self.meta_len);
            let field = schema.fields().get(i).ok_or("no such column")?;
            // A dictionary column with Int32 codes is read as its Int32
            // codes (the same node and buffers in the IPC layout, validated
            // by Arrow as any Int32 column), then the codes are checked
            // against the dictionary in one pass: Arrow's own check tests
            // each code's validity bit and bounds one by one (about as
            // long as hashing the column).
            let (schema, values) = match field.data_type() {
                T::Dictionary(k, v) if **k == T::Int32 => {
                    #[allow(deprecated)] // the id Arrow's reader keys dictionaries by
                    let values = match field.dict_id().and_then(|id| self.dictionaries.get(&id)) {
                        Some(values) => values.clone(),
                        // As Arrow: a column of nulls may have no dictionary.
                        None => arrow_array::new_empty_array(v),
                    };
                    let mut fields: Vec<arrow_schema::FieldRef> =
                        schema.fields().iter().cloned().collect();
                    fields[i] = Arc::new(arrow_schema::Field::new(
                        field.name(),
                        T::Int32,
                        field.is_nullable(),
                    ));
                    (Arc::new(arrow_schema::Schema::new(fields)), Some(values))
                }
                _ => (schema.clone(), None),
            };
            let decoded = arrow_ipc::reader::read_record_batch(
                &body,
                batch,
                schema,
                &self.dictionaries,
                Some(&[i]),
                &self.version,
            )
            .map_err(|e| e.to_string())?;
            let column = decoded.column(0).clone();
            match values {
                Some(values) => dictionary_of(&column, values),
                None => Ok(column),
            }
        }))
        .unwrap_or_else(|_| Err("the Arrow reader could not read it".into()))
    }
}

/// The dictionary array of `codes` (an Int32 column Arrow decoded and
/// validated) into `values` (a dictionary Arrow decoded and validated),
/// once every code of a valid (non-null) row is checked to index
/// `values`: the check `DictionaryArray::try_new` makes, as one
/// branch-free max over the codes (nulls masked to 0) that the compiler
/// vectorizes. Cast to `u32`, a negative code is above any valid index.
fn dictionary_of(
    codes: &arrow_array::ArrayRef,
    values: arrow_array::ArrayRef,
) -> std::result::Result<arrow_array::ArrayRef, String> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use arrow_array::Array;
    let codes = codes
        .as_primitive_opt::<Int32Type>()
        .ok_or("dictionary codes that are not Int32")?
        .clone();
    let raw: &[i32] = codes.values();
    let max = match codes.nulls() {
        None => raw.iter().fold(0u32, |m, &c| m.max(c as u32)),
        Some(nulls) => {
            let mut m = 0u32;
            let mut chunks = raw.chunks_exact(64);
            let mut bits = nulls.inner().bit_chunks().iter();
            for (chunk, valid) in (&mut chunks).zip(&mut bits) {
                for (j, &c) in chunk.iter().enumerate() {
                    // all ones where the row is valid, zero where null
                    let mask = 0u32.wrapping_sub(((valid >> j) & 1) as u32);
                    m = m.max(c as u32 & mask);
                }
            }
            let valid = nulls.inner().bit_chunks().remainder_bits();
            for (j, &c) in chunks.remainder().iter().enumerate() {
                let mask = 0u32.wrapping_sub(((valid >> j) & 1) as u32);
                m = m.max(c as u32 & mask);
            }
            m
        }
    };
    // Codes index `values` when the largest valid one is below its length
    // (and below 2^31, so that no negative code passes whatever the
    // length); a column of nulls only indexes nothing (Arrow's rule).
    let limit = values.len().min(1 << 31);
    let all_null = codes.null_count() == codes.len();
    if !all_null && max as usize >= limit {
        return Err(format!(
            "a dictionary code {} past the dictionary's {} values",
            max as i32,
            values.len()
        ));
    }
    // SAFETY: `DictionaryArray::new_unchecked` is sound when `try_new`
    // would succeed, and `try_new` checks only that every code of a valid
    // row is in `0..values.len()`: just proven (every valid code, as u32,
    // is below `limit`, and a negative one would be at least 2^31). The
    // codes and the values themselves were built and validated by Arrow.
    let array = unsafe { arrow_array::DictionaryArray::<Int32Type>::new_unchecked(codes, values) };
    Ok(Arc::new(array))
}

/// The message at the start of a block (`meta` bytes, checked by
/// [`check_block`]).
fn message_of(block: &[u8], meta: i32) -> std::result::Result<arrow_ipc::Message<'_>, String> {
    let meta = usize::try_from(meta).map_err(|_| "a negative metadata length")?;
    if meta < 8 || meta > block.len() {
        return Err(format!(
            "a message of {meta} bytes in a block of {}",
            block.len()
        ));
    }
    let flatbuffer = if block[..4] == [0xff; 4] {
        &block[8..meta]
    } else {
        &block[4..meta]
    };
    arrow_ipc::root_as_message(flatbuffer).map_err(|e| e.to_string())
}

/// Checks what the Arrow reader takes on trust in one block (a message
/// and its body): the message parses, and every buffer it names lies
/// inside the body.
fn check_block(block: &[u8], meta: i32, body: i64) -> std::result::Result<(), String> {
    let message = message_of(block, meta)?;
    let batch = match message.header_type() {
        arrow_ipc::MessageHeader::RecordBatch => message.header_as_record_batch(),
        arrow_ipc::MessageHeader::DictionaryBatch => {
            message.header_as_dictionary_batch().and_then(|d| d.data())
        }
        other => return Err(format!("an unexpected {other:?} message")),
    }
    .ok_or("a message without its batch")?;
    for b in batch.buffers().iter().flatten() {
        let end = b.offset().checked_add(b.length());
        if b.offset() < 0 || b.length() < 0 || b.offset() % 8 != 0 || end.is_none_or(|e| e > body) {
            return Err(format!(
                "a buffer at {} of {} bytes past a body of {body}",
                b.offset(),
                b.length()
            ));
        }
    }
    Ok(())
}

/// An Arrow error while writing: I/O ones keep their path.
fn io_or_arrow(e: arrow_schema::ArrowError, path: &PathBuf) -> Error {
    match e {
        arrow_schema::ArrowError::IoError(_, io) => Error::io(path)(io),
        other => super::build::arrow_err(other),
    }
}

#[cfg(test)]
mod chunked_tests {
    use std::io::Write;

    use super::Chunked;

    /// Records the length of each write it is given.
    #[derive(Default)]
    struct Recorder {
        bytes: Vec<u8>,
        writes: Vec<usize>,
    }

    impl Write for Recorder {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.bytes.extend_from_slice(buf);
            self.writes.push(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_chunked_file_is_written_in_whole_chunks_then_the_rest() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let mut w = Chunked::new(Recorder::default(), 1024);
        // pieces smaller and larger than a chunk, as Arrow's writer gives
        for piece in data
            .chunks(7)
            .take(50)
            .chain([&data[350..5000], &data[5000..]])
        {
            w.write_all(piece).unwrap();
        }
        let out = w.into_inner().unwrap();
        assert_eq!(out.bytes, data);
        let (last, whole) = out.writes.split_last().unwrap();
        assert!(whole.iter().all(|&n| n == 1024), "{:?}", out.writes);
        assert_eq!(*last, 10_000 % 1024);
    }
}
