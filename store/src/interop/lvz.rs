//! `.lvz` archives to import: opened with [`crate::archive::Archive`]
//! (memory-mapped, its directory, manifest and records parsed), every
//! array's header and CRC-32 checked before anything is written, then each
//! record copied as it is: metadata, layout, array bytes (an `object`
//! array's pickle too, never unpickled) and pickled remainder.

use std::path::Path;

use indexmap::IndexMap;

use super::npz::quoted;
use super::{invalid, shown, PlannedArray, PlannedRecord, Source};
use crate::archive::Archive;
use crate::error::{Error, Result};

/// Phase 1 of the archive at `path`: the archive, mapped, and its records
/// (the only one under `key` when given), every array checked.
///
/// # Errors
/// [`Error::Corrupt`] for a damaged archive (the caller reports it as an
/// invalid input file); [`InteropError::InvalidFile`](crate::InteropError::InvalidFile)
/// for an array numpy could not hold;
/// [`InteropError::Unsupported`](crate::InteropError::Unsupported) for `key`
/// with an archive of several records.
pub(crate) fn plan(path: &Path, key: Option<&str>) -> Result<(Archive, Vec<PlannedRecord>)> {
    let file = shown(path);
    let archive = Archive::open(path)?;
    let index = archive.index();
    let bytes = archive.bytes();
    index.verify_all(bytes)?;
    if key.is_some() && index.len() != 1 {
        return Err(Error::from(crate::InteropError::Unsupported(format!(
            "{file} holds {} records; key= renames a single record only",
            index.len()
        ))));
    }
    let mut records = Vec::with_capacity(index.len());
    for r in index.records() {
        let mut arrays = IndexMap::with_capacity(r.record.arrays.len());
        for (name, entry) in &r.record.arrays {
            let what = format!("{file} record {} array {}", quoted(&r.key), quoted(name));
            if let Some(problem) = crate::npy::numpy_refuses(&entry.descr, &entry.shape) {
                return Err(invalid(&what, problem));
            }
            let range = index.array_range(bytes, entry)?;
            let array = PlannedArray {
                what,
                descr: entry.descr.clone(),
                dtype: entry.dtype.clone(),
                shape: entry.shape.clone(),
                fortran_order: entry.fortran_order,
                nbytes: entry.nbytes,
                header_len: 0,
                pickled: entry.pickled,
                source: Source::Mapped { start: range.start },
            };
            arrays.insert(name.clone(), array);
        }
        records.push(PlannedRecord {
            key: key.unwrap_or(&r.key).to_owned(),
            meta: r.record.meta.clone(),
            layout: r.record.layout.clone(),
            arrays,
            pickle: r.pickle.clone(),
        });
    }
    Ok((archive, records))
}
