//! `.npy` files (NEP 1) to import: the header read with [`crate::npy`]
//! (versions 1.0, 2.0, 3.0; Python 2's `(2L,)` shapes), the data copied
//! into a payload; plus what numpy knows of a descr that the record needs
//! (its `dtype.name`, whether it holds objects).

use std::fs::File;
use std::path::Path;

use super::{
    check_pickles, flat_record, invalid, shown, Field, ImportOptions, PlannedArray, PlannedRecord,
    Source,
};
use crate::error::{Error, Result};
use crate::npy::{
    self as core_npy, descr_has_object, dtype_name, numpy_refuses, NpyError, NpyHeader,
};
use crate::payload::source_error;

/// Phase 1 of the `.npy` file at `path`: the record `{"data": array}`
/// under `key`, checked, nothing written.
pub(crate) fn plan(path: &Path, key: &str, options: &ImportOptions) -> Result<Vec<PlannedRecord>> {
    let what = shown(path);
    let mut file = File::open(path).map_err(Error::io(path))?;
    let size = file.metadata().map_err(Error::io(path))?.len();
    let header = core_npy::read_header(&mut file, options.max_header_size)
        .map_err(|e| header_error(&what, e, path))?;
    let rest = size.saturating_sub(header.data_offset);
    let array = planned_array(
        &what,
        &header,
        rest,
        Source::Range {
            offset: header.data_offset,
        },
    )?;
    if !array.pickled && array.nbytes > rest {
        return Err(invalid(
            &what,
            format!(
                "truncated .npy: header promises {} data bytes, file has {rest}",
                array.nbytes
            ),
        ));
    }
    let records = vec![flat_record(
        key,
        vec![("data".to_owned(), Field::Array(array))],
    )];
    check_pickles(&records, options)?;
    Ok(records)
}

/// Parses the `.npy` header at the start of `bytes` (data may follow) of
/// the file or member `what`, the header text at most `max_header_size`
/// bytes (numpy's `max_header_size`).
///
/// # Errors
/// [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) naming `what`: bad magic, a version other than
/// 1.0, 2.0 or 3.0, a header too long, truncated or malformed.
pub fn parse_header(bytes: &[u8], max_header_size: usize, what: &str) -> Result<NpyHeader> {
    core_npy::parse_header(bytes, max_header_size)
        .map_err(|e| header_error(what, e, Path::new(what)))
}

/// The array a `.npy` header describes, its data at `source`; `available`
/// bytes follow the header there (all of them are the pickle of an
/// `object` array).
///
/// # Errors
/// [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) when the descr has no known itemsize, the size
/// overflows, or numpy could not hold the array ([`numpy_refuses`]).
pub(crate) fn planned_array(
    what: &str,
    header: &NpyHeader,
    available: u64,
    source: Source,
) -> Result<PlannedArray> {
    if let Some(problem) = numpy_refuses(&header.descr, &header.shape) {
        return Err(invalid(what, problem));
    }
    let pickled = descr_has_object(&header.descr);
    let nbytes = if pickled {
        available
    } else {
        header.nbytes().ok_or_else(|| {
            invalid(
                what,
                format!(
                    "descr {} and shape {:?} give no byte size (unknown dtype, or more than \
                     2^64 bytes)",
                    header.descr, header.shape
                ),
            )
        })?
    };
    Ok(PlannedArray {
        what: what.to_owned(),
        descr: header.descr.clone(),
        dtype: dtype_name(&header.descr),
        shape: header.shape.clone(),
        fortran_order: header.fortran_order,
        nbytes,
        header_len: header.data_offset,
        pickled,
        source,
    })
}

/// A header error of the file or member `what` (`path` is the file, for
/// I/O errors): an [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) naming it, or the error a reader
/// carried.
pub(crate) fn header_error(what: &str, e: NpyError, path: &Path) -> Error {
    match e {
        NpyError::Io(io) => match source_error(io, path) {
            // an early end of the file, as numpy reports it
            Error::Storage(crate::StorageError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::UnexpectedEof =>
            {
                invalid(what, "truncated .npy header")
            }
            other => other,
        },
        NpyError::BadMagic => invalid(
            what,
            "not a .npy (it does not start with the magic bytes \\x93NUMPY)",
        ),
        other => invalid(what, other),
    }
}
