//! Writing archives: [`ArchiveWriter`] adds records member by member (each
//! payload a stored `.npy` member whose data start 64-byte aligned); the
//! `write_archive_*` functions finish the archive, then verify it through
//! the reader before anyone sees it.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{BufWriter, Cursor, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use lazyvault_schema::{ArrayEntry, Record};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

use super::sink::{ArchiveFile, MemorySink};
use super::{
    base64_encode, corrupt, Archive, ArchiveIndex, ArchiveManifest, ARCHIVE_KIND, ARRAYS_PREFIX,
    MANIFEST_MEMBER, RECORDS_MEMBER,
};
use crate::error::{Error, Result};
use crate::npy;
use crate::payload::{self, ArraySource};

/// Largest member size written without zip64 extra fields.
const ZIP32_LIMIT: u64 = 0xFFFF_FFFE;

/// A zip error while writing `target`: I/O errors keep their kind.
fn zip_error(target: &Path, e: zip::result::ZipError) -> Error {
    match e {
        zip::result::ZipError::Io(source) => Error::from(crate::StorageError::Io {
            path: target.to_owned(),
            source,
        }),
        other => corrupt(&target.display().to_string(), other),
    }
}

/// One line of `lazyvault/records.jsonl`, as written.
#[derive(Serialize)]
struct RecordLine<'a> {
    key: &'a str,
    record: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
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
        zip_error(&self.target, e)
    }

    fn io_err(&self, source: std::io::Error) -> Error {
        crate::StorageError::Io {
            path: self.target.clone(),
            source,
        }
        .into()
    }

    /// Starts the member of payload `id` (checked: 32 lowercase hex digits,
    /// not used before in this archive) of `len` bytes.
    fn start_payload(&mut self, id: &str, len: u64) -> Result<()> {
        if !self.ids.insert(id.to_owned()) {
            return Err(crate::UsageError::InvalidArray {
                name: id.to_owned(),
                detail: "payload id written twice into one archive".into(),
            }
            .into());
        }
        let options = self.member_options(len);
        let started = self
            .zip
            .start_file(format!("{ARRAYS_PREFIX}{id}.npy"), options);
        started.map_err(|e| self.zip_err(e))
    }

    fn push_line(&mut self, key: &str, record_json: &[u8], pickle: Option<&[u8]>) -> Result<()> {
        if key.is_empty() {
            return Err(Error::empty_key());
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
    ///
    /// # Errors
    /// [`UsageError::EmptyKey`](crate::UsageError::EmptyKey);
    /// [`Error::Corrupt`] for a key already added, a `record_json` that is
    /// not a record or whose pickle flag disagrees with `pickle`, a payload
    /// that fails [`crate::open_payload`]'s checks or shrinks while copied;
    /// [`UsageError::InvalidArray`](crate::UsageError::InvalidArray) for a
    /// payload id already in this archive; [`StorageError::Io`](crate::StorageError::Io)
    /// reading a payload or writing the archive.
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
            // the payload's .npy bytes: the whole file, or a pack's member
            file.seek(std::io::SeekFrom::Start(entry.npy_start()))
                .map_err(Error::io(&path))?;
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
        if record.arrays.values().any(ArrayEntry::is_packed) {
            // In an archive every payload is a member `arrays/<id>.npy`:
            // the store's pack fields would point nowhere.
            let mut record = record;
            for entry in record.arrays.values_mut() {
                entry.pack = None;
                entry.pack_offset = None;
            }
            return self.push_line(key, &record.to_json(), pickle);
        }
        self.push_line(key, record_json, pickle)
    }

    /// Adds a record made of `meta`, `layout`, the arrays (written as new
    /// payload members from their bytes, as [`crate::Store::put`] writes
    /// files) and `pickle`. Payload ids are the member's number in this
    /// archive as 32 hex digits, so equal inputs give equal archives.
    ///
    /// # Errors
    /// [`UsageError::EmptyKey`](crate::UsageError::EmptyKey);
    /// [`UsageError::InvalidArray`](crate::UsageError::InvalidArray) for two
    /// arrays of one name or an array whose bytes do not match its dtype
    /// and shape (as [`crate::Store::put`]); [`Error::Corrupt`] for a key
    /// already added; [`StorageError::Io`](crate::StorageError::Io) writing
    /// the archive.
    pub fn add_record(
        &mut self,
        key: &str,
        meta: Map<String, Value>,
        layout: Value,
        arrays: &[ArraySource<'_>],
        pickle: Option<&[u8]>,
    ) -> Result<()> {
        payload::check_unique_names(arrays)?;
        let mut entries = indexmap::IndexMap::with_capacity(arrays.len());
        for src in arrays {
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
        let json = record.to_json();
        crate::store::check_record_size(key, &record, &json, pickle)?;
        self.push_line(key, &json, pickle)
    }

    /// Writes the records and the manifest and the central directory.
    fn finish(mut self) -> Result<W> {
        let manifest = ArchiveManifest {
            format: lazyvault_schema::FORMAT_NAME.to_owned(),
            format_version: lazyvault_schema::ARCHIVE_FORMAT_VERSION.to_string(),
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
        self.zip.finish().map_err(|e| zip_error(&target, e))
    }
}

/// Writes an archive at `path`: `fill` adds the records, then the archive is
/// finished, fsynced, checked (every member where it should be, every array
/// 64-byte aligned and matching its record) and renamed into place; the
/// directory is fsynced. On error nothing is left at `path` (an existing
/// file there is untouched) and the temporary file is removed.
///
/// The temporary file is `.<name>.<uuid>.tmp` beside `path` (same file
/// system, so the rename is atomic).
///
/// # Errors
/// Any error `fill` returns (see [`ArchiveWriter::add_record`] and
/// [`ArchiveWriter::add_store_record`]); [`StorageError::Io`](crate::StorageError::Io)
/// for a `path` without a file name or when creating, writing, syncing or
/// renaming fails; [`Error::Corrupt`] when the written file does not check
/// out (see [`ArchiveIndex::verify_all`]).
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
        .ok_or_else(|| {
            Error::from(crate::StorageError::Io {
                path: path.to_owned(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"),
            })
        })?
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(format!(
        ".{name}.{}{}",
        uuid::Uuid::new_v4().simple(),
        payload::TMP_SUFFIX
    ));
    // I/O errors name the file the caller asked for, not the hidden
    // temporary one it is written as.
    let result = (|| -> Result<()> {
        let file = File::options()
            .write(true)
            .read(true)
            .create_new(true)
            .open(&tmp)
            .map_err(Error::io(path))?;
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
            .map_err(|e| Error::io(path)(e.into_error()))?;
        file.sync_all().map_err(Error::io(path))?;
        // Verify what is on disk, through the reader.
        let archive = Archive::open(&tmp)?;
        archive.index().verify_all(archive.bytes())?;
        drop(archive);
        fs::rename(&tmp, path).map_err(Error::io(path))?;
        payload::sync_dir(&dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The exact size of the archive that `fill` describes, computed by
/// writing it to a counter (nothing is stored). In bytes.
///
/// # Errors
/// Any error `fill` returns; [`Error::Corrupt`] when the size does not fit
/// in `usize`.
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
///
/// # Errors
/// Any error `fill` returns; [`StorageError::Io`](crate::StorageError::Io)
/// when `buf` is too short; [`Error::Corrupt`] when it is too long or the
/// archive written does not check out.
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
/// [`archive_size`], then [`write_archive_into`]). `fill` runs twice and
/// must describe the same archive both times.
///
/// # Errors
/// As [`archive_size`] and [`write_archive_into`].
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
///
/// # Errors
/// [`Error::Corrupt`] for a key without a record; the errors of reading
/// `store` ([`crate::Store::get_json`]) and of [`write_archive_file`]. On
/// error nothing is left at `path`.
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
