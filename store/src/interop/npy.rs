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
use crate::npy::{self as core_npy, NpyError, NpyHeader};
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

/// numpy's `NPY_MAXDIMS`: the most dimensions an array can have.
pub const NUMPY_MAX_DIMS: usize = 64;

/// Why numpy cannot create an array of `descr` (Python-literal text) and
/// `shape`, or `None` when it can: more than [`NUMPY_MAX_DIMS`]
/// dimensions, a dimension past `intp`, or a byte size (the item size times
/// every non-zero dimension, as numpy multiplies them) past `intp`
/// (`i64::MAX` bytes). An unknown descr is left to other checks.
///
/// A record holding such an array could be written but never read back
/// (numpy raises `ValueError`), so import refuses it; the store's read path
/// can call this to report such a record as damaged.
pub fn numpy_refuses(descr: &str, shape: &[u64]) -> Option<String> {
    const INTP_MAX: u64 = i64::MAX as u64;
    if shape.len() > NUMPY_MAX_DIMS {
        return Some(format!(
            "{} dimensions: numpy arrays have at most {NUMPY_MAX_DIMS}",
            shape.len()
        ));
    }
    if let Some(d) = shape.iter().find(|&&d| d > INTP_MAX) {
        return Some(format!(
            "dimension {d} exceeds numpy's largest ({INTP_MAX}, 2^63-1)"
        ));
    }
    let itemsize = core_npy::descr_itemsize(descr)?;
    let bytes = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(itemsize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= INTP_MAX);
    match bytes {
        Some(_) => None,
        None => Some(format!(
            "shape {shape:?} of {} takes more than 2^63-1 bytes (numpy multiplies the item size by \
             every non-zero dimension, and refuses such arrays, even empty ones)",
            dtype_name(descr)
        )),
    }
}

// ---------------------------------------------------------------------------
// What numpy knows of a descr

/// A Python literal of a descr, as far as dtype names need it.
enum Lit {
    Str(String),
    Seq(Vec<Lit>),
    Other,
}

/// Parses the Python literal at `s[*i..]` (strings, tuples, lists, numbers);
/// `None` when malformed or nested deeper than 32.
fn parse_lit(s: &[u8], i: &mut usize, depth: usize) -> Option<Lit> {
    while s.get(*i).is_some_and(u8::is_ascii_whitespace) {
        *i += 1;
    }
    match *s.get(*i)? {
        q @ (b'\'' | b'"') => {
            *i += 1;
            let start = *i;
            while *s.get(*i)? != q {
                *i += if s[*i] == b'\\' { 2 } else { 1 };
            }
            let text = String::from_utf8_lossy(&s[start..*i]).into_owned();
            *i += 1;
            Some(Lit::Str(text))
        }
        open @ (b'(' | b'[') => {
            if depth >= 32 {
                return None;
            }
            let close = if open == b'(' { b')' } else { b']' };
            *i += 1;
            let mut items = Vec::new();
            loop {
                while s.get(*i).is_some_and(u8::is_ascii_whitespace) {
                    *i += 1;
                }
                if *s.get(*i)? == close {
                    *i += 1;
                    return Some(Lit::Seq(items));
                }
                items.push(parse_lit(s, i, depth + 1)?);
                while s.get(*i).is_some_and(u8::is_ascii_whitespace) {
                    *i += 1;
                }
                match *s.get(*i)? {
                    b',' => *i += 1,
                    c if c == close => {}
                    _ => return None,
                }
            }
        }
        _ => {
            let start = *i;
            while s
                .get(*i)
                .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.'))
            {
                *i += 1;
            }
            (*i > start).then_some(Lit::Other)
        }
    }
}

fn parse_descr(descr: &str) -> Option<Lit> {
    let mut i = 0;
    parse_lit(descr.as_bytes(), &mut i, 0)
}

/// Whether a descr (Python-literal text) holds Python objects anywhere
/// (numpy's `dtype.hasobject`): such arrays are written as pickles.
pub(crate) fn descr_has_object(descr: &str) -> bool {
    fn lit_has_object(lit: &Lit) -> bool {
        match lit {
            Lit::Str(t) => t.trim_start_matches(['<', '>', '|', '=']).starts_with('O'),
            // a list of fields (name, type[, shape]): the type is second
            Lit::Seq(fields) => fields.iter().any(|f| match f {
                Lit::Seq(parts) => parts.get(1).is_some_and(lit_has_object),
                _ => false,
            }),
            Lit::Other => false,
        }
    }
    parse_descr(descr).is_some_and(|l| lit_has_object(&l))
}

/// numpy's `dtype.name` for a descr (Python-literal text): `"float64"`,
/// `"datetime64[D]"`, `"str96"`, `"bytes40"`, `"void160"` for a structured
/// dtype of 20 bytes, `"object"`. The descr text itself when it is none of
/// numpy's kinds.
pub fn dtype_name(descr: &str) -> String {
    match parse_descr(descr) {
        Some(Lit::Str(t)) => type_name(&t).unwrap_or_else(|| descr.to_owned()),
        Some(Lit::Seq(_)) => match core_npy::descr_itemsize(descr) {
            Some(0) => "void".to_owned(),
            Some(n) => format!("void{}", n * 8),
            None => descr.to_owned(),
        },
        _ => descr.to_owned(),
    }
}

/// numpy's name of a type string (`"<f8"` → `"float64"`).
fn type_name(t: &str) -> Option<String> {
    let t = t.trim_start_matches(['<', '>', '|', '=']);
    let mut chars = t.chars();
    let kind = chars.next()?;
    let rest = chars.as_str();
    let size = || rest.parse::<u64>().ok();
    let bits = |per: u64| size().map(|n| n * per);
    Some(match kind {
        'b' if rest == "1" => "bool".to_owned(),
        '?' => "bool".to_owned(),
        'i' => format!("int{}", bits(8)?),
        'u' => format!("uint{}", bits(8)?),
        'f' => format!("float{}", bits(8)?),
        'c' => format!("complex{}", bits(8)?),
        'M' | 'm' => {
            let unit = rest.strip_prefix('8').unwrap_or(rest);
            let base = if kind == 'M' {
                "datetime64"
            } else {
                "timedelta64"
            };
            format!("{base}{unit}")
        }
        'S' | 'a' => match size()? {
            0 => "bytes".to_owned(),
            n => format!("bytes{}", n * 8),
        },
        'U' => match size()? {
            0 => "str".to_owned(),
            n => format!("str{}", n * 32),
        },
        'V' => match size()? {
            0 => "void".to_owned(),
            n => format!("void{}", n * 8),
        },
        'O' => "object".to_owned(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_are_numpys() {
        for (descr, name) in [
            ("'<f8'", "float64"),
            ("'>f4'", "float32"),
            ("'<f2'", "float16"),
            ("'<f16'", "float128"),
            ("'|b1'", "bool"),
            ("'|u1'", "uint8"),
            ("'<i8'", "int64"),
            ("'<c16'", "complex128"),
            ("'<M8[D]'", "datetime64[D]"),
            ("'<m8[10s]'", "timedelta64[10s]"),
            ("'<M8'", "datetime64"),
            ("'>U3'", "str96"),
            ("'|S5'", "bytes40"),
            ("'|V8'", "void64"),
            ("'|O'", "object"),
            ("[('x', '<i4'), ('y', '>f8', (2,))]", "void160"),
            ("[('名前', '<i2')]", "void16"),
        ] {
            assert_eq!(dtype_name(descr), name, "{descr}");
        }
    }

    #[test]
    fn numpy_refuses_what_it_cannot_create() {
        assert_eq!(numpy_refuses("'<f8'", &[1; 64]), None);
        assert!(numpy_refuses("'<f8'", &[1; 65])
            .unwrap()
            .contains("65 dimensions"));
        // numpy's own limits, probed with np.empty
        assert!(numpy_refuses("'<f8'", &[0, (1 << 63) - 1]).is_some());
        assert!(numpy_refuses("'<f8'", &[0, 1 << 62]).is_some());
        assert_eq!(numpy_refuses("'|i1'", &[0, (1 << 63) - 1]), None);
        assert!(numpy_refuses("'|i1'", &[0, 1 << 62, 2]).is_some());
        assert!(numpy_refuses("'|i1'", &[1 << 63]).is_some());
        assert_eq!(numpy_refuses("'|V0'", &[1 << 62]), None);
        assert!(numpy_refuses("'<f8'", &[1 << 40, 1 << 30]).is_some());
        assert!(numpy_refuses("'<f8'", &[1 << 30, 1 << 30]).is_some()); // 2^63 bytes
        assert_eq!(numpy_refuses("'<f8'", &[1 << 30, 1 << 29]), None);
    }

    #[test]
    fn objects_are_found_in_type_strings_and_fields_not_names() {
        assert!(descr_has_object("'|O'"));
        assert!(descr_has_object("[('a', '<f8'), ('b', '|O')]"));
        assert!(descr_has_object("[('a', [('b', '|O', (2,))])]"));
        assert!(!descr_has_object("[('Oscar', '<f8')]"));
        assert!(!descr_has_object("'<f8'"));
        assert!(!descr_has_object("[(('title', 'O'), '<i4')]"));
    }
}
