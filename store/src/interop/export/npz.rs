//! `.npz` export: a zip of `.npy` members, as `np.savez` writes, that
//! `np.load` reads, plus lazyvault's manifest so that import brings every
//! record back under its key.
//!
//! The file (uncompressed, every `.npy` member's data 64-byte aligned):
//!
//! - `__lazyvault__.json` first (not a `.npy`; `np.load` lists it and
//!   returns its bytes): `{"format": "lazyvault-npz", "version": 1,
//!   "records": [{"key", "meta", "arrays": {array path: member name},
//!   "layout"}, ...]}`, indented by one space as Python's `json.dumps(...,
//!   indent=1, ensure_ascii=False)` writes it. `arrays` is the exact inverse
//!   of the name sanitising below.
//! - one member per array, `<key>/<array path>.npy` after sanitising
//!   ([`member_name`]); names equal after sanitising get `~2`, `~3`... on
//!   their last segment. Each is a `.npy` file: the header the core writes
//!   for the array's dtype, order and shape ([`crate::npy::write_header`]),
//!   then the payload's data bytes as stored (an `object` array: its pickle,
//!   copied without unpickling).
//!
//! Records with a pickled remainder are refused before anything is written
//! (see [`super::load_records`]). ZIP64 fields appear where CPython's
//! `zipfile` puts them ([`ZipLimits`]): members over 2 GiB, offsets past
//! 2 GiB, more than 65,535 members.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::path::Path;

use serde_json::{Map, Value};

use super::pyjson::{self, Style};
use super::zipfile::StoredZipWriter;
use super::{c_order_too, in_array, load_records, write_atomic, ExportRecord, PayloadData};
use super::{target_error, Progress, ZipLimits, CHUNK};
use crate::error::{Error, Result};
use crate::interop::NPZ_MANIFEST;
use crate::npy;
use crate::Store;

/// The manifest's `format` value.
pub(crate) const NPZ_FORMAT: &str = "lazyvault-npz";
/// The manifest's `version` value.
pub(crate) const NPZ_VERSION: u64 = 1;
/// The descr of an `object` array (pickled payload), as numpy writes it.
const OBJECT_DESCR: &str = "'|O'";

/// The member name (without `.npy`) of array `array_path` of record `key`:
/// `<key>/<array path>` split on `/`, each segment made safe: control
/// characters, DEL, `\` and `:` become `_`; an empty segment or `.` becomes
/// `_`, `..` becomes `__`. So no name is absolute, has a drive letter or a
/// `..` segment, whatever the key (a zip extracted anywhere stays there).
pub fn member_name(key: &str, array_path: &str) -> String {
    let joined = format!("{key}/{array_path}");
    let segments: Vec<String> = joined
        .split('/')
        .map(|seg| {
            let seg: String = seg
                .chars()
                .map(|c| {
                    if (c as u32) < 0x20 || c == '\u{7f}' || c == '\\' || c == ':' {
                        '_'
                    } else {
                        c
                    }
                })
                .collect();
            match seg.as_str() {
                "" | "." => "_".to_owned(),
                ".." => "__".to_owned(),
                _ => seg,
            }
        })
        .collect();
    segments.join("/")
}

/// The member file name (with `.npy`) of every array of every record, in
/// record and array order, made unique with `~n` suffixes.
fn member_names(records: &[ExportRecord]) -> Vec<Vec<String>> {
    let mut taken: HashSet<String> = HashSet::new();
    records
        .iter()
        .map(|rec| {
            rec.record
                .arrays
                .keys()
                .map(|path| {
                    let base = member_name(&rec.key, path);
                    let mut name = format!("{base}.npy");
                    let mut n = 1;
                    while taken.contains(&name) {
                        n += 1;
                        name = match base.rsplit_once('/') {
                            Some((head, last)) => format!("{head}/{last}~{n}.npy"),
                            None => format!("{base}~{n}.npy"),
                        };
                    }
                    taken.insert(name.clone());
                    name
                })
                .collect()
        })
        .collect()
}

/// The manifest member's bytes (see the module doc).
fn manifest(records: &[ExportRecord], names: &[Vec<String>]) -> Vec<u8> {
    let docs = records
        .iter()
        .zip(names)
        .map(|(rec, names)| {
            let arrays: Map<String, Value> = rec
                .record
                .arrays
                .keys()
                .zip(names)
                .map(|(path, name)| (path.clone(), Value::String(name.clone())))
                .collect();
            let mut doc = Map::new();
            doc.insert("key".into(), Value::String(rec.key.clone()));
            doc.insert("meta".into(), Value::Object(rec.record.meta.clone()));
            doc.insert("arrays".into(), Value::Object(arrays));
            // a record with a pickled remainder never gets here: its layout
            // alone could not rebuild it
            if !rec.record.pickle {
                doc.insert("layout".into(), rec.record.layout.clone());
            }
            Value::Object(doc)
        })
        .collect();
    let mut top = Map::new();
    top.insert("format".into(), Value::String(NPZ_FORMAT.into()));
    top.insert("version".into(), Value::from(NPZ_VERSION));
    top.insert("records".into(), Value::Array(docs));
    let style = Style {
        indent: Some(1),
        ..Style::DEFAULT
    };
    pyjson::to_string(&Value::Object(top), style).into_bytes()
}

/// Writes the `.npz` of `records` (payloads under the store root `root`)
/// into `out`, positioned at its start; returns `out` (not synced).
/// `target` names the file in errors. `progress` gets `(0, n)` once the
/// manifest is written, then `(i, n)` after each of the `n` arrays.
///
/// Errors: [`StorageError::Io`](crate::StorageError::Io) naming `target` when writing fails;
/// [`Error::Corrupt`] or [`StorageError::Io`](crate::StorageError::Io) naming the record, the array and its
/// payload file when reading one fails (missing: the record changed since
/// it was read; truncated; header disagreeing with the record);
/// [`UsageError::InvalidArray`](crate::UsageError::InvalidArray) when an array's header cannot be written.
pub fn write_npz<W: Write + Seek>(
    out: W,
    target: &Path,
    root: &Path,
    records: &[ExportRecord],
    limits: ZipLimits,
    progress: Progress<'_>,
) -> Result<W> {
    let out_err = target_error(target);
    let names = member_names(records);
    let mut zip = StoredZipWriter::new(out, limits).map_err(out_err)?;
    zip.add(NPZ_MANIFEST, &manifest(records, &names), false)
        .map_err(out_err)?;
    let total = names.iter().map(|n| n.len() as u64).sum();
    progress(0, total)?;
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0;
    for (rec, names) in records.iter().zip(&names) {
        for ((path, entry), name) in rec.record.arrays.iter().zip(names) {
            let context = in_array(target, &rec.key, path);
            let header = if entry.pickled {
                npy::write_header(OBJECT_DESCR, entry.fortran_order, &entry.shape)
            } else {
                // numpy (np.save) calls an array with at most one axis
                // longer than 1 C-ordered, whatever its record says
                let fortran = entry.fortran_order && !c_order_too(&entry.shape);
                // as np.savez: any header the dtype needs
                npy::write_header_with_limit(
                    &entry.descr,
                    fortran,
                    &entry.shape,
                    npy::FORMAT_MAX_HEADER_LEN,
                )
            }
            .map_err(|e| {
                Error::from(crate::UsageError::InvalidArray {
                    name: format!("{}/{path}", rec.key),
                    detail: e.to_string(),
                })
            })?;
            let mut data = PayloadData::open(root, entry).map_err(&context)?;
            let size = header.len() as u64 + data.remaining();
            if size <= buf.len() as u64 {
                // small member: CRC known before the header, no seek back
                buf[..header.len()].copy_from_slice(&header);
                let n = data
                    .read_chunk(&mut buf[header.len()..])
                    .map_err(&context)?;
                zip.add(name, &buf[..header.len() + n], true)
                    .map_err(out_err)?;
            } else {
                zip.begin(name, size, true, None).map_err(out_err)?;
                zip.write(&header).map_err(out_err)?;
                while data.remaining() > 0 {
                    let n = data.read_chunk(&mut buf).map_err(&context)?;
                    zip.write(&buf[..n]).map_err(out_err)?;
                }
                zip.end().map_err(out_err)?;
            }
            drop(data); // one payload file open at a time
            done += 1;
            progress(done, total)?;
        }
    }
    zip.finish().map_err(out_err)
}

/// Exports the records `keys` of `store` (in that order) to a new `.npz`
/// file at `path`, replacing any file there atomically (see
/// [`write_atomic`] and [`write_npz`]); `limits` are normally
/// [`ZipLimits::default`].
///
/// Errors: those of [`load_records`] (before anything is written), of
/// [`write_npz`] and of [`write_atomic`]; on error `path` is untouched.
pub fn export_npz(
    store: &Store,
    path: &Path,
    keys: &[String],
    limits: ZipLimits,
    progress: Progress<'_>,
) -> Result<()> {
    let records = load_records(store, keys, ".npz")?;
    write_atomic(path, |out: &mut BufWriter<File>| {
        write_npz(out, path, store.root(), &records, limits, progress).map(drop)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_sanitised() {
        assert_eq!(member_name("../etc", "a/../b"), "__/etc/a/__/b");
        assert_eq!(member_name("/abs", ""), "_/abs/_");
        assert_eq!(member_name("C:\\win", "x\u{0}y\u{7f}"), "C__win/x_y_");
        assert_eq!(member_name("名前", "."), "名前/_");
    }
}
