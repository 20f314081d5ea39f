//! `.lvz` archives: records and their payloads in one zip file (see
//! FORMAT.md, "Archives (.lvz)").
//!
//! An archive is a zip of uncompressed (`Stored`) members:
//!
//! - `lazyvault/manifest.json`: `{"format": "lazyvault", "format_version":
//!   "1.0", "kind": "archive", "created_by": ..., "records": n}`;
//! - `arrays/<id>.npy`: one standard `.npy` file per payload, named by its
//!   payload id only (never by a user key), whose data start 64-byte
//!   aligned within the archive;
//! - `lazyvault/records.jsonl`: one JSON line per record, `{"key": ...,
//!   "record": {...}, "pickle": "<base64>"}` (`pickle` only when the record
//!   has a pickled remainder).
//!
//! Reading maps the whole file once ([`Archive::open`]) or works over bytes
//! the caller keeps alive ([`ArchiveIndex::parse`]); every array is a byte
//! range of that mapping, checked against its record before use. Writing
//! goes to a temporary file, is fsynced and renamed into place
//! ([`write_archive_file`]), or into memory ([`write_archive_bytes`]), and
//! every member's offsets are verified after writing.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{BufWriter, Cursor, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use lazyvault_schema::{ArrayEntry, Manifest, Record};
use memmap2::Mmap;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipArchive, ZipWriter};

use crate::error::{Error, Result};
use crate::npy;
use crate::payload::{self, ArraySource};
use crate::query::{ArrayFacts, Query, RecordView};

/// Member holding the archive's manifest.
pub const MANIFEST_MEMBER: &str = "lazyvault/manifest.json";
/// Member holding the records, one JSON object per line.
pub const RECORDS_MEMBER: &str = "lazyvault/records.jsonl";
/// Directory (inside the zip) of the payload members.
pub const ARRAYS_PREFIX: &str = "arrays/";
/// Value of the manifest's `kind` field for an archive.
pub const ARCHIVE_KIND: &str = "archive";
/// The first four bytes of every `.lvz` file (a zip local file header).
pub const ZIP_MAGIC: &[u8; 4] = b"PK\x03\x04";

/// Largest member size written without zip64 extra fields.
const ZIP32_LIMIT: u64 = 0xFFFF_FFFE;
/// Fixed part of a zip local file header.
const LOCAL_HEADER_LEN: usize = 30;
const LOCAL_HEADER_SIG: u32 = 0x0403_4b50;
/// Smallest possible zip file: an end of central directory record.
const MIN_ZIP_LEN: u64 = 22;

fn corrupt(what: &str, detail: impl ToString) -> Error {
    Error::corrupt(what.to_owned(), detail)
}

// ---------------------------------------------------------------------------
// base64 (standard alphabet, padded): the pickled remainders in records.jsonl

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with `=` padding.
pub fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Strict decoding of [`base64_encode`]'s output; `None` for anything else.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let chunks = bytes.len() / 4;
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && i + 1 != chunks) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * pad as u32;
        let got = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&got[..3 - pad]);
    }
    Some(out)
}

// ---------------------------------------------------------------------------
// Writing

/// The archive manifest (`lazyvault/manifest.json`).
#[derive(Debug, Serialize, Deserialize)]
struct ArchiveManifest {
    format: String,
    format_version: String,
    kind: String,
    created_by: String,
    #[serde(default)]
    records: u64,
}

/// One line of `lazyvault/records.jsonl`, as written.
#[derive(Serialize)]
struct RecordLine<'a> {
    key: &'a str,
    record: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pickle: Option<String>,
}

/// One line of `lazyvault/records.jsonl`, as read.
#[derive(Deserialize)]
struct RecordLineIn<'a> {
    key: String,
    #[serde(borrow)]
    record: &'a RawValue,
    #[serde(default)]
    pickle: Option<String>,
}

/// Writes an archive member by member. Use [`write_archive_file`] or
/// [`write_archive_bytes`], which finish and verify it.
pub struct ArchiveWriter<W: Write + Seek> {
    zip: ZipWriter<W>,
    lines: Vec<u8>,
    keys: HashSet<String>,
    ids: HashSet<String>,
    records: u64,
    next_id: u64,
    force_zip64: bool,
    /// The file being written (for error messages).
    target: PathBuf,
}

impl<W: Write + Seek> ArchiveWriter<W> {
    fn new(inner: W, target: PathBuf) -> Self {
        ArchiveWriter {
            target,
            zip: ZipWriter::new(inner),
            lines: Vec::new(),
            keys: HashSet::new(),
            ids: HashSet::new(),
            records: 0,
            next_id: 0,
            force_zip64: false,
        }
    }

    /// Writes every payload member with zip64 size fields, as members of
    /// 4 GiB and more need (for tests and for readers that want to check
    /// their zip64 path without a 4 GiB file).
    pub fn force_zip64(&mut self, on: bool) {
        self.force_zip64 = on;
    }

    fn member_options(&self, len: u64) -> SimpleFileOptions {
        SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .last_modified_time(DateTime::default())
            .unix_permissions(0o644)
            .with_alignment(npy::ALIGNMENT as u16)
            .large_file(self.force_zip64 || len > ZIP32_LIMIT)
    }

    fn zip_err(&self, e: zip::result::ZipError) -> Error {
        match e {
            zip::result::ZipError::Io(source) => Error::Io {
                path: self.target.clone(),
                source,
            },
            other => corrupt(&self.target.display().to_string(), other),
        }
    }

    fn io_err(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.target.clone(),
            source,
        }
    }

    /// Starts the member of payload `id` (checked: 32 lowercase hex digits,
    /// not used before in this archive) of `len` bytes.
    fn start_payload(&mut self, id: &str, len: u64) -> Result<()> {
        if !self.ids.insert(id.to_owned()) {
            return Err(Error::InvalidArray {
                name: id.to_owned(),
                detail: "payload id written twice into one archive".into(),
            });
        }
        let options = self.member_options(len);
        let started = self
            .zip
            .start_file(format!("{ARRAYS_PREFIX}{id}.npy"), options);
        started.map_err(|e| self.zip_err(e))
    }

    fn push_line(&mut self, key: &str, record_json: &[u8], pickle: Option<&[u8]>) -> Result<()> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if !self.keys.insert(key.to_owned()) {
            return Err(corrupt(
                "archive writer",
                format!("key {key:?} written twice into one archive"),
            ));
        }
        let text =
            std::str::from_utf8(record_json).map_err(|e| corrupt(&format!("record {key:?}"), e))?;
        let raw: &RawValue =
            serde_json::from_str(text).map_err(|e| corrupt(&format!("record {key:?}"), e))?;
        let line = RecordLine {
            key,
            record: raw,
            pickle: pickle.map(base64_encode),
        };
        serde_json::to_writer(&mut self.lines, &line).expect("record line serializes");
        self.lines.push(b'\n');
        self.records += 1;
        Ok(())
    }

    /// Adds the record `key` of the store at `root`: `record_json` as the
    /// index holds it, its pickled remainder, and each payload file copied
    /// byte for byte (streamed, after the checks of
    /// [`crate::open_payload`]).
    pub fn add_store_record(
        &mut self,
        root: &Path,
        key: &str,
        record_json: &[u8],
        pickle: Option<&[u8]>,
    ) -> Result<()> {
        let record =
            Record::from_json(record_json).map_err(|e| corrupt(&format!("record {key:?}"), e))?;
        if record.pickle != pickle.is_some() {
            return Err(corrupt(
                &format!("record {key:?}"),
                "the record's pickle flag and its pickled remainder disagree",
            ));
        }
        for entry in record.arrays.values() {
            let (mut file, path) = payload::open_payload(root, entry)?;
            let len = entry.data_offset + entry.nbytes;
            file.rewind().map_err(Error::io(&path))?;
            self.start_payload(&entry.id, len)?;
            let mut from = file.take(len);
            let copied = std::io::copy(&mut from, &mut self.zip).map_err(|e| self.io_err(e))?;
            if copied != len {
                return Err(corrupt(
                    &format!("payload {}", path.display()),
                    format!("file shrank while copying: {copied} of {len} bytes"),
                ));
            }
        }
        self.push_line(key, record_json, pickle)
    }

    /// Adds a record made of `meta`, `layout`, the arrays (written as new
    /// payload members from their bytes, as [`crate::Store::put`] writes
    /// files) and `pickle`. Payload ids are the member's number in this
    /// archive as 32 hex digits, so equal inputs give equal archives.
    pub fn add_record(
        &mut self,
        key: &str,
        meta: Map<String, Value>,
        layout: Value,
        arrays: &[ArraySource<'_>],
        pickle: Option<&[u8]>,
    ) -> Result<()> {
        let mut entries = indexmap::IndexMap::with_capacity(arrays.len());
        for src in arrays {
            if entries.contains_key(&src.name) {
                return Err(Error::InvalidArray {
                    name: src.name.clone(),
                    detail: "two arrays with the same name".into(),
                });
            }
            let (header, entry) = payload::prepare_payload(src)?;
            let id = loop {
                self.next_id += 1;
                let id = format!("{:032x}", self.next_id);
                if !self.ids.contains(&id) {
                    break id;
                }
            };
            let len = header.len() as u64 + src.data.len() as u64;
            self.start_payload(&id, len)?;
            let written = self
                .zip
                .write_all(&header)
                .and_then(|_| self.zip.write_all(src.data));
            written.map_err(|e| self.io_err(e))?;
            entries.insert(src.name.clone(), ArrayEntry { id, ..entry });
        }
        let record = Record {
            meta,
            arrays: entries,
            layout,
            pickle: pickle.is_some(),
        };
        self.push_line(key, &record.to_json(), pickle)
    }

    /// Writes the records and the manifest and the central directory.
    fn finish(mut self) -> Result<W> {
        let manifest = ArchiveManifest {
            format: lazyvault_schema::FORMAT_NAME.to_owned(),
            format_version: lazyvault_schema::FORMAT_VERSION.to_string(),
            kind: ARCHIVE_KIND.to_owned(),
            created_by: format!("lazyvault {}", env!("CARGO_PKG_VERSION")),
            records: self.records,
        };
        let mut manifest_json = serde_json::to_vec_pretty(&manifest).expect("manifest");
        manifest_json.push(b'\n');
        let lines = std::mem::take(&mut self.lines);
        for (name, body) in [(RECORDS_MEMBER, &lines), (MANIFEST_MEMBER, &manifest_json)] {
            let options = self.member_options(body.len() as u64);
            let started = self.zip.start_file(name, options);
            let written = started
                .map_err(|e| self.zip_err(e))
                .and_then(|()| self.zip.write_all(body).map_err(|e| self.io_err(e)));
            if let Err(e) = written {
                // zip's Drop would try to finish and print its failure.
                std::mem::forget(self);
                return Err(e);
            }
        }
        let target = self.target.clone();
        self.zip.finish().map_err(|e| match e {
            zip::result::ZipError::Io(source) => Error::Io {
                path: target,
                source,
            },
            other => corrupt(&target.display().to_string(), other),
        })
    }
}

/// Writes an archive at `path`: `fill` adds the records, then the archive is
/// finished, fsynced, checked (every member where it should be, every array
/// 64-byte aligned and matching its record) and renamed into place; the
/// directory is fsynced. On error nothing is left at `path` (an existing
/// file there is untouched) and the temporary file is removed.
pub fn write_archive_file(
    path: &Path,
    fill: impl FnOnce(&mut ArchiveWriter<ArchiveFile>) -> Result<()>,
) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| Error::Io {
            path: path.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"),
        })?
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(format!(
        ".{name}.{}{}",
        uuid::Uuid::new_v4().simple(),
        payload::TMP_SUFFIX
    ));
    let result = (|| -> Result<()> {
        let file = File::options()
            .write(true)
            .read(true)
            .create_new(true)
            .open(&tmp)
            .map_err(Error::io(&tmp))?;
        let shared = Rc::new(RefCell::new(Some(BufWriter::with_capacity(1 << 20, file))));
        let mut writer = ArchiveWriter::new(ArchiveFile(Rc::clone(&shared)), path.to_owned());
        let filled = fill(&mut writer);
        let finished = match filled {
            Ok(()) => writer.finish().map(drop),
            Err(e) => {
                // zip's Drop would try to finish the archive and print its
                // failure to stderr: close the file (freeing its space once
                // removed below), then forget the writer's small remains.
                shared.borrow_mut().take();
                std::mem::forget(writer);
                Err(e)
            }
        };
        let buffered = shared.borrow_mut().take();
        finished?;
        let file = buffered
            .expect("finish leaves the file")
            .into_inner()
            .map_err(|e| Error::io(&tmp)(e.into_error()))?;
        file.sync_all().map_err(Error::io(&tmp))?;
        // Verify what is on disk, through the reader.
        let archive = Archive::open(&tmp)?;
        archive.index.verify_all(archive.bytes())?;
        drop(archive);
        fs::rename(&tmp, path).map_err(Error::io(path))?;
        payload::sync_dir(&dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The file [`write_archive_file`] writes through: it can be closed while
/// the zip writer that owns this handle is still alive (after an error).
pub struct ArchiveFile(Rc<RefCell<Option<BufWriter<File>>>>);

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

/// Where [`write_archive_into`] and [`archive_size`] write: a counter of
/// bytes (first pass, to learn the exact size) or the caller's buffer.
pub enum MemorySink<'a> {
    /// Counts: the position and the largest end written.
    Counting { pos: u64, len: u64 },
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
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        match self {
            MemorySink::Counting { pos, len } => {
                let target = match to {
                    std::io::SeekFrom::Start(n) => Some(n),
                    std::io::SeekFrom::End(d) => len.checked_add_signed(d),
                    std::io::SeekFrom::Current(d) => pos.checked_add_signed(d),
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

/// The exact size of the archive that `fill` describes, computed by
/// writing it to a counter (nothing is stored).
pub fn archive_size(
    fill: impl FnOnce(&mut ArchiveWriter<MemorySink<'_>>) -> Result<()>,
) -> Result<usize> {
    let mut writer = ArchiveWriter::new(
        MemorySink::Counting { pos: 0, len: 0 },
        PathBuf::from("<memory>"),
    );
    fill(&mut writer)?;
    match writer.finish()? {
        MemorySink::Counting { len, .. } => {
            usize::try_from(len).map_err(|_| corrupt("<memory>", "archive too large for memory"))
        }
        MemorySink::Buffer(_) => unreachable!("counting sink"),
    }
}

/// Writes the archive that `fill` describes into `buf`, which must be
/// exactly [`archive_size`] bytes long (the same `fill` gives the same
/// bytes), then checks it as [`write_archive_file`] does.
pub fn write_archive_into(
    buf: &mut [u8],
    fill: impl FnOnce(&mut ArchiveWriter<MemorySink<'_>>) -> Result<()>,
) -> Result<()> {
    let expected = buf.len();
    let mut writer = ArchiveWriter::new(
        MemorySink::Buffer(Cursor::new(&mut *buf)),
        PathBuf::from("<memory>"),
    );
    fill(&mut writer)?;
    let end = match writer.finish()? {
        MemorySink::Buffer(c) => c.position(),
        MemorySink::Counting { .. } => unreachable!("buffer sink"),
    };
    if end != expected as u64 {
        return Err(corrupt(
            "<memory>",
            format!("archive is {end} bytes, the buffer {expected}"),
        ));
    }
    let index = ArchiveIndex::parse(buf, "archive")?;
    index.verify_all(buf)
}

/// Writes an archive into a new `Vec` of its exact size (two passes:
/// [`archive_size`], then [`write_archive_into`]).
pub fn write_archive_bytes(
    mut fill: impl FnMut(&mut ArchiveWriter<MemorySink<'_>>) -> Result<()>,
) -> Result<Vec<u8>> {
    let size = archive_size(&mut fill)?;
    let mut bytes = vec![0u8; size];
    write_archive_into(&mut bytes, fill)?;
    Ok(bytes)
}

/// Exports the records `keys` of `store` into a new archive at `path`
/// (see [`write_archive_file`]). A key without a record is an error.
pub fn export_store(store: &crate::Store, path: &Path, keys: &[String]) -> Result<()> {
    write_archive_file(path, |w| {
        for key in keys {
            let json = store.get_json(key)?.ok_or_else(|| {
                corrupt(
                    "export",
                    format!("no record under key {key:?} in the store"),
                )
            })?;
            let pickle = store.get_pickle(key)?;
            w.add_store_record(store.root(), key, &json, pickle.as_deref())?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Reading

/// One record of an archive.
#[derive(Debug)]
pub struct ArchiveRecord {
    /// The key.
    pub key: String,
    /// The record JSON, compact, as the writer stored it.
    pub json: Vec<u8>,
    /// The decoded record.
    pub record: Record,
    /// The pickled remainder, when the record has one.
    pub pickle: Option<Vec<u8>>,
}

impl RecordView for ArchiveRecord {
    fn key(&self) -> &str {
        &self.key
    }
    fn meta(&self) -> &Map<String, Value> {
        &self.record.meta
    }
    fn array(&self, name: &str) -> Option<ArrayFacts<'_>> {
        self.record.arrays.get(name).map(|a| ArrayFacts {
            shape: &a.shape,
            dtype: &a.dtype,
            descr: &a.descr,
            nbytes: a.nbytes,
        })
    }
}

/// What an archive holds, parsed from its bytes: the records and where each
/// payload member's bytes are. Holds offsets only, no borrow of the bytes:
/// the caller keeps the bytes alive and passes them back to
/// [`ArchiveIndex::array_range`].
#[derive(Debug)]
pub struct ArchiveIndex {
    what: String,
    len: usize,
    records: Vec<ArchiveRecord>,
    by_key: HashMap<String, usize>,
    /// Payload id → byte range of the member's data (the whole `.npy` file).
    members: HashMap<String, Range<usize>>,
    /// Payload id → the member's CRC-32 from the central directory.
    member_crcs: HashMap<String, u32>,
}

/// Checks a member's bytes against the CRC-32 the zip recorded for it.
fn check_crc(data: &[u8], expected: u32, what: &str) -> Result<()> {
    let found = crc32fast::hash(data);
    if found != expected {
        return Err(corrupt(
            what,
            format!("CRC-32 mismatch (zip says {expected:08x}, data gives {found:08x})"),
        ));
    }
    Ok(())
}

fn is_payload_id(id: &str) -> bool {
    id.len() == lazyvault_schema::PAYLOAD_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether a member name could escape a directory if extracted (absolute,
/// `..`, backslashes, drive letters, NUL): lazyvault never extracts, but
/// such an archive was not written by lazyvault and is refused.
fn unsafe_member_name(name: &str) -> bool {
    name.is_empty()
        || name.starts_with('/')
        || name.contains('\\')
        || name.contains('\0')
        || name.as_bytes().get(1) == Some(&b':')
        || name.split('/').any(|part| part == "..")
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl ArchiveIndex {
    /// Parses the archive in `bytes`: the central directory (with the zip
    /// crate), every member's local header, the manifest and the records.
    /// `what` names the archive in error messages (its path).
    ///
    /// Refuses, with [`Error::Corrupt`] (or [`Error::Format`] for a newer
    /// major version): anything that is not a zip, a truncated file, a
    /// member whose header or data lie outside the file or overlap the
    /// central directory, compressed or encrypted members, unsafe or
    /// duplicate member names, a missing or foreign manifest, malformed
    /// records, duplicate keys, and records naming a payload the archive
    /// does not hold. Array headers are checked when an array is asked for.
    pub fn parse(bytes: &[u8], what: &str) -> Result<ArchiveIndex> {
        let len = bytes.len();
        if (len as u64) < MIN_ZIP_LEN {
            return Err(corrupt(
                what,
                format!("not a .lvz archive: {len} bytes is too short for a zip file"),
            ));
        }
        if bytes[..4] != ZIP_MAGIC[..] {
            return Err(corrupt(
                what,
                "not a .lvz archive: it does not start with a zip local file header (PK\\x03\\x04)",
            ));
        }
        let zip = ZipArchive::new(Cursor::new(bytes))
            .map_err(|e| corrupt(what, format!("not a readable zip archive: {e}")))?;
        if zip.has_duplicate_names() {
            return Err(corrupt(what, "the zip lists a member name twice"));
        }
        let cd_start = usize::try_from(zip.central_directory_start())
            .ok()
            .filter(|&s| s <= len)
            .ok_or_else(|| corrupt(what, "central directory lies outside the file"))?;
        let mut members = HashMap::new();
        let mut manifest_range = None;
        let mut records_range = None;
        let mut member_crcs = HashMap::new();
        for i in 0..zip.len() {
            let file = zip
                .by_index_data(i)
                .map_err(|e| corrupt(what, format!("zip member {i}: {e}")))?;
            let name = String::from_utf8(file.name_raw().to_vec())
                .map_err(|_| corrupt(what, format!("zip member {i}: name is not UTF-8")))?;
            let mwhat = || format!("{what}: member {name:?}");
            if unsafe_member_name(&name) {
                return Err(corrupt(
                    &mwhat(),
                    "unsafe member name (absolute, '..', backslash or drive): not a lazyvault archive",
                ));
            }
            let kind = if name == MANIFEST_MEMBER {
                Some(0)
            } else if name == RECORDS_MEMBER {
                Some(1)
            } else {
                name.strip_prefix(ARRAYS_PREFIX)
                    .and_then(|n| n.strip_suffix(".npy"))
                    .filter(|id| is_payload_id(id))
                    .map(|_| 2)
            };
            let Some(kind) = kind else {
                continue; // another member: ignored (a newer minor may add some)
            };
            if file.encrypted() {
                return Err(corrupt(&mwhat(), "encrypted members are not supported"));
            }
            if file.compression() != CompressionMethod::Stored {
                return Err(corrupt(
                    &mwhat(),
                    format!(
                        "compressed with {:?}; lazyvault archives store members uncompressed \
                         (Stored) so that arrays can be memory-mapped",
                        file.compression()
                    ),
                ));
            }
            if file.compressed_size() != file.size() {
                return Err(corrupt(
                    &mwhat(),
                    "stored member whose compressed and uncompressed sizes differ",
                ));
            }
            let header_start = usize::try_from(file.header_start())
                .ok()
                .filter(|&h| {
                    h.checked_add(LOCAL_HEADER_LEN)
                        .is_some_and(|end| end <= cd_start)
                })
                .ok_or_else(|| corrupt(&mwhat(), "local header lies outside the file"))?;
            let local = &bytes[header_start..header_start + LOCAL_HEADER_LEN];
            if u32::from_le_bytes([local[0], local[1], local[2], local[3]]) != LOCAL_HEADER_SIG {
                return Err(corrupt(&mwhat(), "bad local file header signature"));
            }
            let name_len = usize::from(u16_at(local, 26));
            let extra_len = usize::from(u16_at(local, 28));
            let name_start = header_start + LOCAL_HEADER_LEN;
            if bytes.get(name_start..name_start + name_len) != Some(name.as_bytes()) {
                return Err(corrupt(
                    &mwhat(),
                    "local header names another member than the central directory",
                ));
            }
            let data_start = name_start + name_len + extra_len;
            let data_end = usize::try_from(file.size())
                .ok()
                .and_then(|n| data_start.checked_add(n))
                .filter(|&end| end <= cd_start)
                .ok_or_else(|| {
                    corrupt(
                        &mwhat(),
                        format!(
                            "its {} bytes of data do not fit in the file (truncated archive?)",
                            file.size()
                        ),
                    )
                })?;
            let range = data_start..data_end;
            let crc = file.crc32();
            match kind {
                0 => manifest_range = Some((range, crc)),
                1 => records_range = Some((range, crc)),
                _ => {
                    let id = &name[ARRAYS_PREFIX.len()..name.len() - 4];
                    members.insert(id.to_owned(), range);
                    member_crcs.insert(id.to_owned(), crc);
                }
            }
        }
        drop(zip);

        let manifest_range = manifest_range.ok_or_else(|| {
            corrupt(
                what,
                format!("not a lazyvault archive: no {MANIFEST_MEMBER} member"),
            )
        })?;
        // The small members are checked in full: their bytes drive keys,
        // metadata and unpickling. Array members are checked by verify() and
        // before unpickling (a full read would defeat the memory map).
        let (manifest_range, manifest_crc) = manifest_range;
        let manifest_bytes = &bytes[manifest_range];
        check_crc(
            manifest_bytes,
            manifest_crc,
            &format!("{what}: {MANIFEST_MEMBER}"),
        )?;
        let manifest: ArchiveManifest = serde_json::from_slice(manifest_bytes)
            .map_err(|e| corrupt(&format!("{what}: {MANIFEST_MEMBER}"), e))?;
        Manifest {
            format: manifest.format.clone(),
            format_version: manifest.format_version.clone(),
            created_by: manifest.created_by.clone(),
        }
        .check()
        .map_err(|source| Error::Format {
            path: PathBuf::from(what),
            source,
        })?;
        if manifest.kind != ARCHIVE_KIND {
            return Err(corrupt(
                &format!("{what}: {MANIFEST_MEMBER}"),
                format!("kind is {:?}, expected {ARCHIVE_KIND:?}", manifest.kind),
            ));
        }
        let records_range =
            records_range.ok_or_else(|| corrupt(what, format!("no {RECORDS_MEMBER} member")))?;
        let (records_range, records_crc) = records_range;
        check_crc(
            &bytes[records_range.clone()],
            records_crc,
            &format!("{what}: {RECORDS_MEMBER}"),
        )?;
        let text = std::str::from_utf8(&bytes[records_range])
            .map_err(|e| corrupt(&format!("{what}: {RECORDS_MEMBER}"), e))?;
        let mut records = Vec::new();
        let mut by_key = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let lwhat = || format!("{what}: {RECORDS_MEMBER} line {}", n + 1);
            let parsed: RecordLineIn =
                serde_json::from_str(line).map_err(|e| corrupt(&lwhat(), e))?;
            if parsed.key.is_empty() {
                return Err(corrupt(&lwhat(), "empty key"));
            }
            let json = parsed.record.get().as_bytes().to_vec();
            let record = Record::from_json(&json)
                .map_err(|e| corrupt(&format!("{}: record {:?}", lwhat(), parsed.key), e))?;
            let pickle = match &parsed.pickle {
                None => None,
                Some(b64) => Some(base64_decode(b64).ok_or_else(|| {
                    corrupt(&lwhat(), "the pickled remainder is not valid base64")
                })?),
            };
            if record.pickle != pickle.is_some() {
                return Err(corrupt(
                    &lwhat(),
                    "the record's pickle flag and its pickled remainder disagree",
                ));
            }
            for (name, entry) in &record.arrays {
                if !members.contains_key(&entry.id) {
                    return Err(corrupt(
                        &format!("{}: record {:?} array {name:?}", lwhat(), parsed.key),
                        format!("member {ARRAYS_PREFIX}{}.npy is missing", entry.id),
                    ));
                }
            }
            if by_key.insert(parsed.key.clone(), records.len()).is_some() {
                return Err(corrupt(
                    &lwhat(),
                    format!("key {:?} appears twice", parsed.key),
                ));
            }
            records.push(ArchiveRecord {
                key: parsed.key,
                json,
                record,
                pickle,
            });
        }
        if manifest.records != records.len() as u64 {
            return Err(corrupt(
                what,
                format!(
                    "the manifest announces {} records, {RECORDS_MEMBER} holds {}",
                    manifest.records,
                    records.len()
                ),
            ));
        }
        Ok(ArchiveIndex {
            what: what.to_owned(),
            len,
            records,
            by_key,
            members,
            member_crcs,
        })
    }

    /// Records in archive order.
    pub fn records(&self) -> &[ArchiveRecord] {
        &self.records
    }

    /// The record of `key`.
    pub fn get(&self, key: &str) -> Option<&ArchiveRecord> {
        self.by_key.get(key).map(|&i| &self.records[i])
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the archive holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Keys in archive order.
    pub fn keys(&self) -> Vec<String> {
        self.records.iter().map(|r| r.key.clone()).collect()
    }

    /// Keys of the records matching `query`, in archive order.
    pub fn find(&self, query: &Query) -> Vec<String> {
        self.records
            .iter()
            .filter(|r| query.matches(*r))
            .map(|r| r.key.clone())
            .collect()
    }

    /// Number of records matching `query`.
    pub fn count(&self, query: &Query) -> usize {
        self.records.iter().filter(|r| query.matches(*r)).count()
    }

    /// Byte range (within `bytes`, the same bytes [`ArchiveIndex::parse`]
    /// read) of the data of `entry`, after checking its member: present,
    /// its `.npy` header agrees with the entry, long enough, and the data
    /// 64-byte aligned within the archive.
    pub fn array_range(&self, bytes: &[u8], entry: &ArrayEntry) -> Result<Range<usize>> {
        let what = || format!("{}: member {ARRAYS_PREFIX}{}.npy", self.what, entry.id);
        if bytes.len() != self.len {
            return Err(corrupt(&what(), "the archive bytes changed size"));
        }
        let member = self
            .members
            .get(&entry.id)
            .ok_or_else(|| corrupt(&what(), "member is missing"))?;
        let data = &bytes[member.clone()];
        let header =
            npy::parse_header(data, npy::NUMPY_MAX_HEADER_LEN).map_err(|e| corrupt(&what(), e))?;
        crate::payload::check_header_matches(&header, entry).map_err(|d| corrupt(&what(), d))?;
        let start = usize::try_from(entry.data_offset)
            .ok()
            .and_then(|o| member.start.checked_add(o));
        let end = start.and_then(|s| usize::try_from(entry.nbytes).ok()?.checked_add(s));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(corrupt(&what(), "size overflows"));
        };
        if end > member.end {
            return Err(corrupt(
                &what(),
                format!(
                    "member is truncated: {} bytes, the array needs {}",
                    member.len(),
                    end - member.start
                ),
            ));
        }
        if !start.is_multiple_of(npy::ALIGNMENT) {
            return Err(corrupt(
                &what(),
                format!("array data at archive offset {start}, not a multiple of 64"),
            ));
        }
        Ok(start..end)
    }

    /// Checks the whole member of `entry` against its CRC-32 (reads every
    /// byte: used before unpickling a payload and by verify).
    pub fn check_member_crc(&self, bytes: &[u8], entry: &ArrayEntry) -> Result<()> {
        let what = format!("{}: member {ARRAYS_PREFIX}{}.npy", self.what, entry.id);
        if bytes.len() != self.len {
            return Err(corrupt(&what, "the archive bytes changed size"));
        }
        let (Some(range), Some(&crc)) =
            (self.members.get(&entry.id), self.member_crcs.get(&entry.id))
        else {
            return Err(corrupt(&what, "member is missing"));
        };
        check_crc(&bytes[range.clone()], crc, &what)
    }

    /// Checks every array of every record like [`ArchiveIndex::verify_all`]
    /// but reports all problems: `(records, arrays, problems)`.
    pub fn verify_report(&self, bytes: &[u8]) -> (u64, u64, Vec<String>) {
        let mut arrays = 0;
        let mut problems = Vec::new();
        for record in &self.records {
            for (name, entry) in &record.record.arrays {
                arrays += 1;
                if let Err(e) = self
                    .array_range(bytes, entry)
                    .and_then(|_| self.check_member_crc(bytes, entry))
                {
                    problems.push(format!("record {:?} array {name:?}: {e}", record.key));
                }
            }
        }
        (self.records.len() as u64, arrays, problems)
    }

    /// Checks every array of every record (see [`ArchiveIndex::array_range`]).
    pub fn verify_all(&self, bytes: &[u8]) -> Result<()> {
        for record in &self.records {
            for entry in record.record.arrays.values() {
                self.array_range(bytes, entry)?;
                self.check_member_crc(bytes, entry)?;
            }
        }
        Ok(())
    }
}

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
    pub fn open(path: impl AsRef<Path>) -> Result<Archive> {
        let path = path.as_ref().to_owned();
        let file = File::open(&path).map_err(Error::io(&path))?;
        let meta = file.metadata().map_err(Error::io(&path))?;
        let what = path.display().to_string();
        if !meta.is_file() {
            return Err(corrupt(&what, "not a regular file"));
        }
        if meta.len() < MIN_ZIP_LEN {
            return Err(corrupt(
                &what,
                format!(
                    "not a .lvz archive: {} bytes is too short for a zip file",
                    meta.len()
                ),
            ));
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
    pub fn array(&self, entry: &ArrayEntry) -> Result<&[u8]> {
        let range = self.index.array_range(&self.map, entry)?;
        Ok(&self.map[range])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_rejects_garbage() {
        for n in 0..40 {
            let data: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            let text = base64_encode(&data);
            assert_eq!(base64_decode(&text).unwrap(), data, "{n}");
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        for bad in ["Zm8", "Zm=8", "Z===", "Zm8=Zm8=", "Zm9v!mFy"] {
            assert!(base64_decode(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn unsafe_names_are_detected() {
        for bad in [
            "../x.npy",
            "/etc/passwd",
            "a/../../b",
            "c:\\x",
            "a\\b",
            "",
            "C:/x",
        ] {
            assert!(unsafe_member_name(bad), "{bad}");
        }
        for ok in ["arrays/00.npy", "lazyvault/records.jsonl", "a..b/c"] {
            assert!(!unsafe_member_name(ok), "{ok}");
        }
    }
}
