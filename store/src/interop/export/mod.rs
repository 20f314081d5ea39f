//! Export of store records to the array files other tools read: `.npz`
//! ([`npz`]) and `.safetensors` ([`safetensors`]). (`.lvz`, lazyvault's own
//! archive, is [`crate::archive`].)
//!
//! Both writers stream: each payload's data go from its file (read in
//! chunks, or memory-mapped when its bytes must be reordered) straight into
//! the output, one payload file open at a time, so an export of any number
//! of records holds a bounded number of open files and a bounded amount of
//! memory besides the records' metadata. The output is written to a
//! temporary file beside the target, fsynced and renamed into place
//! ([`write_atomic`]): a failed export leaves the target as it was and no
//! temporary file.
//!
//! What the files contain is specified in the docs of [`npz`] and
//! [`safetensors`]; the bytes are those the former Python writers produced
//! (CPython 3.11's `zipfile`, `json.dumps`), so exports are reproducible
//! across versions.

pub mod npz;
pub mod pyjson;
pub mod safetensors;
pub(crate) mod zipfile;

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use lazyvault_schema::{ArrayEntry, Record};

use crate::error::{Error, Result};
use crate::payload;
use crate::Store;

pub use zipfile::ZipLimits;

/// Bytes read from a payload file at a time, and the size of the reusable
/// buffer each writer holds (its memory bound besides the metadata).
pub(crate) const CHUNK: usize = 4 << 20;

/// Buffer of the output file: large writes bypass it.
const OUT_BUFFER: usize = 1 << 20;

/// The error of a failed write to the export's `target` file: an I/O error
/// naming it.
pub(crate) fn target_error(target: &Path) -> impl Fn(io::Error) -> Error + Copy + '_ {
    move |source| Error::io(target)(source)
}

/// A `(done, total)` callback: arrays written so far, of how many. An error
/// it returns (e.g. [`UsageError::Cancelled`](crate::UsageError::Cancelled)) stops the export, which then
/// leaves nothing behind.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64) -> Result<()>;

/// One record selected for export, as the store's index holds it.
#[derive(Debug, Clone)]
pub struct ExportRecord {
    /// The record's key.
    pub key: String,
    /// The decoded record (metadata, array entries, layout).
    pub record: Record,
}

/// Reads the records `keys` of `store` (in that order) for an export to a
/// `format` file (`".npz"`, `".safetensors"`: for messages).
///
/// Errors: [`Error::Corrupt`] naming the key when it has no record (it
/// vanished since the keys were chosen) or a damaged one;
/// [`InteropError::Unsupported`](crate::InteropError::Unsupported) for a record with a pickled remainder (fields
/// that only pickle can hold, which these formats cannot carry: `.lvz`
/// can).
pub fn load_records(store: &Store, keys: &[String], format: &str) -> Result<Vec<ExportRecord>> {
    keys.iter()
        .map(|key| {
            let record = store.get(key)?.ok_or_else(|| {
                Error::corrupt(
                    format!("export to {format}: record {key:?}"),
                    "no record under this key any more (deleted since the keys were chosen?)",
                )
            })?;
            if record.pickle {
                return Err(Error::from(crate::InteropError::Unsupported(format!(
                    "record {key:?} has values that only pickle can hold (sets, complex \
                     numbers, custom objects...); {format} cannot carry them: export it to \
                     .lvz instead"
                ))));
            }
            Ok(ExportRecord {
                key: key.clone(),
                record,
            })
        })
        .collect()
}

/// Runs `write` on a new temporary file beside `target` (`.<name>.<uuid>.tmp`),
/// then flushes and fsyncs it, renames it onto `target` and fsyncs the
/// directory. On any error the temporary file is removed and `target` is
/// untouched; I/O errors on the output name `target`.
pub fn write_atomic(
    target: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    let io_err = target_error(target);
    let name = target.file_name().ok_or_else(|| {
        io_err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file name",
        ))
    })?;
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    ));
    let file = File::options()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io_err)?;
    let result = (|| {
        let mut out = BufWriter::with_capacity(OUT_BUFFER, file);
        write(&mut out)?;
        let file = out.into_inner().map_err(|e| io_err(e.into_error()))?;
        file.sync_all().map_err(io_err)?;
        drop(file);
        fs::rename(&tmp, target).map_err(io_err)?;
        payload::sync_dir(&dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Whether an array of `shape` in Fortran order has the same bytes in C
/// order, i.e. numpy flags it C-contiguous too: no elements, or at most one
/// axis longer than 1.
pub(crate) fn c_order_too(shape: &[u64]) -> bool {
    shape.contains(&0) || shape.iter().filter(|&&d| d != 1).count() <= 1
}

/// Adds what was being exported to an error from reading a payload: the
/// target, the record and the array. Keeps the variant (and an I/O error's
/// kind), so callers still tell corruption from a failing disk.
pub(crate) fn in_array(target: &Path, key: &str, array: &str) -> impl Fn(Error) -> Error {
    let context = format!(
        "export to {}: record {key:?} array {array:?}",
        target.display()
    );
    let (key, array) = (key.to_owned(), array.to_owned());
    move |e| match e {
        Error::Corrupt(c) => {
            let out = Error::corrupt(format!("{context}: {}", c.what()), c.detail())
                .with_key(&key)
                .with_array(&array);
            match c.path() {
                Some(p) => out.with_path(p),
                None => out,
            }
        }
        Error::Storage(crate::StorageError::Io { path, source }) => {
            Error::from(crate::StorageError::Io {
                path,
                source: io::Error::new(source.kind(), format!("{context}: {source}")),
            })
        }
        other => other,
    }
}

/// The data bytes of one payload file, read in order (the file is open
/// only while this lives).
pub(crate) struct PayloadData {
    source: Source,
    remaining: u64,
}

enum Source {
    /// A small payload, read whole by one `read` with its header.
    Loaded {
        data: payload::MappedPayload,
        at: usize,
    },
    /// A large payload's file, positioned in its data.
    File { file: File, path: PathBuf },
}

impl PayloadData {
    /// Opens the payload of `entry` after [`payload::open_payload`]'s checks
    /// (header agrees with the record, file long enough) at its data. Small
    /// payloads are read at once ([`payload::load_payload`]: one `read` for
    /// header and data; tens of thousands of tiny arrays are common).
    pub(crate) fn open(root: &Path, entry: &ArrayEntry) -> Result<PayloadData> {
        let source = if entry.nbytes <= payload::READ_MAX_BYTES {
            Source::Loaded {
                data: payload::load_payload(root, entry)?,
                at: 0,
            }
        } else {
            let (mut file, path) = payload::open_payload(root, entry)?;
            file.seek(SeekFrom::Start(entry.npy_start() + entry.data_offset))
                .map_err(Error::io(&path))?;
            Source::File { file, path }
        };
        Ok(PayloadData {
            source,
            remaining: entry.nbytes,
        })
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Fills `buf` (or what remains, if less); the number of bytes read.
    /// A file that ends early is corruption (it shrank since it was
    /// checked).
    pub(crate) fn read_chunk(&mut self, buf: &mut [u8]) -> Result<usize> {
        let n = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        match &mut self.source {
            Source::Loaded { data, at } => {
                buf[..n].copy_from_slice(&data.as_bytes()[*at..*at + n]);
                *at += n;
            }
            Source::File { file, path } => file.read_exact(&mut buf[..n]).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    Error::corrupt(
                        format!("payload {}", path.display()),
                        "file shrank while it was read",
                    )
                } else {
                    Error::io(&*path)(e)
                }
            })?,
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_order_too_as_numpy_flags() {
        assert!(c_order_too(&[]));
        assert!(c_order_too(&[5]));
        assert!(c_order_too(&[3, 1]));
        assert!(c_order_too(&[1, 4, 1]));
        assert!(c_order_too(&[0, 3]));
        assert!(!c_order_too(&[2, 3]));
        assert!(!c_order_too(&[2, 1, 3]));
    }

    use std::io::Write;

    #[test]
    fn write_atomic_leaves_nothing_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x.npz");
        fs::write(&target, b"old").unwrap();
        let err = write_atomic(&target, |out| {
            out.write_all(b"partial").unwrap();
            Err(Error::cancelled())
        })
        .unwrap_err();
        assert!(matches!(err, Error::Usage(crate::UsageError::Cancelled)));
        assert_eq!(fs::read(&target).unwrap(), b"old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        // a missing directory: an I/O error naming the target
        let missing = dir.path().join("no/such/x.npz");
        let err = write_atomic(&missing, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("no/such/x.npz"), "{err}");
        write_atomic(&target, |out| out.write_all(b"new").map_err(Error::io("x"))).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
