//! `.safetensors` export: 8-byte little-endian header length `N`, `N` bytes
//! of JSON (padded with spaces to a multiple of 8), then the data section;
//! every tensor little-endian, C order, at its `data_offsets` within the
//! data section (the format of huggingface/safetensors).
//!
//! What we write:
//!
//! - tensor names: the array paths for a single record, `<key>/<array
//!   path>` for several (a name occurring twice is an error);
//! - tensors sorted by item size, largest first, then by name, as the
//!   reference writer does: every tensor starts at a multiple of its item
//!   size, and a file imported and exported back is the same file;
//! - dtypes: `bool`, `(u)int8-64`, `float16/32/64` as `BOOL`, `U8`...
//!   `F64`, little-endian `complex64` as `C64`; big-endian arrays are
//!   byte-swapped and Fortran-ordered ones reordered to C order while
//!   streaming. Arrays that were imported from safetensors' raw-bit kinds
//!   (`BF16`, `F8_*`, kept as `uint16`/`uint8` with their tag in the
//!   record's `"safetensors_dtypes"` metadata field) get that tag back.
//!   Other dtypes (other complex ones, strings, datetimes,
//!   structured, `object`) have no safetensors form: an error;
//! - `__metadata__` (a string-to-string map by the format): for a single
//!   record, its metadata fields (strings as they are, anything else as
//!   JSON) merged with the `"__metadata__"` map it was imported with; for
//!   several records, `{key: JSON of the record's metadata}`; absent for a
//!   single record with neither. A `"lazyvault"` entry, JSON `{"version": 1,
//!   "json": [keys we JSON-encoded], "fields": [keys that were top-level
//!   metadata fields]}`, lets import decode exactly what we encoded; it is
//!   written only when needed, so a foreign file exported back keeps its
//!   `__metadata__` unchanged. For several records (or none) it also holds
//!   `"records": [{"key", "arrays": [array paths], "layout"}, ...]`, in
//!   export order, from which import splits the tensors back into those
//!   records. JSON text is Python's `json.dumps` text.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use indexmap::IndexMap;
use lazyvault_schema::ArrayEntry;
use serde_json::{json, Map, Value};

use super::pyjson::{self, Style};
use super::{c_order_too, in_array, load_records, write_atomic, ExportRecord, PayloadData};
use super::{target_error, Progress, CHUNK};
use crate::error::{Error, Result};
use crate::payload;
use crate::Store;

/// The header key of the string-to-string metadata map.
pub(crate) const METADATA_KEY: &str = "__metadata__";
/// The metadata field in which import keeps raw-bit dtype tags
/// (`{array path: "BF16"}`).
pub(crate) const TAGS_FIELD: &str = "safetensors_dtypes";
/// The `__metadata__` entry describing what we JSON-encoded.
pub(crate) const MARKER: &str = "lazyvault";

/// safetensors dtype tags of the numpy type codes (kind and item size,
/// byte order aside).
const TAGS: [(&str, &str); 13] = [
    ("b1", "BOOL"),
    ("u1", "U8"),
    ("i1", "I8"),
    ("u2", "U16"),
    ("i2", "I16"),
    ("f2", "F16"),
    ("u4", "U32"),
    ("i4", "I32"),
    ("f4", "F32"),
    ("f8", "F64"),
    ("u8", "U64"),
    ("i8", "I64"),
    ("c8", "C64"),
];
/// Raw-bit tags and the numpy type code their bits are kept as.
const RAW_TAGS: [(&str, &str); 4] = [
    ("BF16", "u2"),
    ("F8_E4M3", "u1"),
    ("F8_E5M2", "u1"),
    ("F8_E8M0", "u1"),
];

/// How one array becomes a tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorKind {
    /// The safetensors dtype tag (`"F32"`, `"BF16"`...).
    pub tag: String,
    /// Bytes per element: 1, 2, 4 or 8.
    pub itemsize: u64,
    /// Whether the stored bytes are big-endian (swapped on the way out).
    pub swap: bool,
}

/// The tensor kind of an array of `descr` (Python-literal `.npy` descr),
/// given the raw-bit tag `kept` for it, or `None` when safetensors cannot
/// hold the dtype.
pub(crate) fn tensor_kind(descr: &str, kept: Option<&str>) -> Option<TensorKind> {
    let text = descr.strip_prefix('\'')?.strip_suffix('\'')?;
    let (order, code) = match text.chars().next()? {
        c @ ('<' | '>' | '|' | '=') => (c, &text[1..]),
        _ => ('=', text),
    };
    let itemsize: u64 = code.get(1..)?.parse().ok()?;
    if code == "c8" && order == '>' {
        // swapping would reverse each 8-byte element, not its two halves
        return None;
    }
    let swap = order == '>' && itemsize > 1;
    if let Some(kept) = kept {
        if let Some((tag, _)) = RAW_TAGS.iter().find(|(t, c)| *t == kept && *c == code) {
            return Some(TensorKind {
                tag: (*tag).to_owned(),
                itemsize,
                swap,
            });
        }
    }
    let (_, tag) = TAGS.iter().find(|(c, _)| *c == code)?;
    Some(TensorKind {
        tag: (*tag).to_owned(),
        itemsize,
        swap,
    })
}

/// An array's dtype as a message shows it: numpy's name, or the descr for
/// a structured or opaque (`void`) dtype, whose name (`void640`) says
/// nothing of its fields.
fn shown_dtype(entry: &ArrayEntry) -> String {
    if entry.dtype.starts_with("void") || entry.descr.starts_with('[') {
        entry.descr.clone()
    } else {
        entry.dtype.clone()
    }
}

/// One tensor to write.
struct Tensor<'a> {
    name: String,
    kind: TensorKind,
    key: &'a str,
    path: &'a str,
    entry: &'a ArrayEntry,
}

/// The tensors of `records` in file order, after every check.
fn tensors(records: &[ExportRecord]) -> Result<Vec<Tensor<'_>>> {
    let single = records.len() == 1;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for rec in records {
        let kept = match rec.record.meta.get(TAGS_FIELD) {
            Some(Value::Object(tags)) => Some(tags),
            _ => None,
        };
        for (path, entry) in &rec.record.arrays {
            let name = if single {
                path.clone()
            } else {
                format!("{}/{path}", rec.key)
            };
            if !seen.insert(name.clone()) {
                return Err(Error::from(crate::UsageError::InvalidArray {
                    name,
                    detail: "tensor name occurs twice (keys and paths joined by '/')".into(),
                }));
            }
            if entry.pickled {
                return Err(Error::from(crate::UsageError::InvalidArray {
                    name: path.clone(),
                    detail: format!(
                        "record {:?}: object arrays have no safetensors form",
                        rec.key
                    ),
                }));
            }
            let tag = kept.and_then(|t| t.get(path)).and_then(Value::as_str);
            let kind = tensor_kind(&entry.descr, tag).ok_or_else(|| {
                Error::from(crate::UsageError::InvalidArray {
                    name: name.clone(),
                    detail: format!(
                        "dtype {} has no safetensors equivalent (safetensors holds bool, \
                     (u)int8-64, float16/32/64, little-endian complex64, and BF16/F8 raw bits)",
                        shown_dtype(entry)
                    ),
                })
            })?;
            out.push(Tensor {
                name,
                kind,
                key: &rec.key,
                path,
                entry,
            });
        }
    }
    // largest items first, then by name (code point order, as Python's)
    out.sort_by(|a, b| {
        b.kind
            .itemsize
            .cmp(&a.kind.itemsize)
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(out)
}

/// The `__metadata__` map (see the module doc), or `None` when there is none.
fn metadata(records: &[ExportRecord]) -> Result<Option<Map<String, Value>>> {
    let mut out: IndexMap<String, String> = IndexMap::new();
    let mut encoded: Vec<String> = Vec::new();
    let mut fields: Vec<String> = Vec::new();
    let mut put = |k: &str, v: &Value, field: bool| -> Result<()> {
        if out.contains_key(k) || k == MARKER {
            return Err(Error::from(crate::UsageError::InvalidArray {
                name: METADATA_KEY.into(),
                detail: format!(
                    "metadata key {k:?} occurs twice in the safetensors {METADATA_KEY}"
                ),
            }));
        }
        let text = match v {
            Value::String(s) => s.clone(),
            other => {
                encoded.push(k.to_owned());
                pyjson::to_string(other, Style::DEFAULT)
            }
        };
        out.insert(k.to_owned(), text);
        if field {
            fields.push(k.to_owned());
        }
        Ok(())
    };
    if let [rec] = records {
        let meta = &rec.record.meta;
        let foreign = match meta.get(METADATA_KEY) {
            Some(Value::Object(m)) => Some(m),
            _ => None,
        };
        for (k, v) in foreign.into_iter().flatten() {
            put(k, v, false)?;
        }
        for (k, v) in meta {
            let kept_apart = (k == METADATA_KEY || k == TAGS_FIELD) && v.is_object();
            if !kept_apart {
                put(k, v, true)?;
            }
        }
        let nothing_put = meta.iter().all(|(k, v)| k == TAGS_FIELD && v.is_object());
        if nothing_put && foreign.is_none() {
            return Ok(None);
        }
    }
    let mut listed = None;
    if records.len() != 1 {
        for rec in records {
            put(&rec.key, &Value::Object(rec.record.meta.clone()), false)?;
        }
        // what import needs to split the tensors back into records
        let list: Vec<Value> = records
            .iter()
            .map(|rec| {
                let paths: Vec<&String> = rec.record.arrays.keys().collect();
                json!({"key": rec.key, "arrays": paths, "layout": rec.record.layout})
            })
            .collect();
        listed = Some(list);
    }
    if !encoded.is_empty() || !fields.is_empty() || listed.is_some() {
        let mut marker = json!({"version": 1, "json": encoded, "fields": fields});
        if let Some(list) = listed {
            marker["records"] = Value::Array(list);
        }
        let ascii = Style {
            ensure_ascii: true,
            ..Style::DEFAULT
        };
        out.insert(MARKER.into(), pyjson::to_string(&marker, ascii));
    }
    Ok(Some(
        out.into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect(),
    ))
}

/// The header bytes: length, JSON, padding; and the tensors in file order.
fn header(records: &[ExportRecord]) -> Result<(Vec<u8>, Vec<Tensor<'_>>)> {
    let tensors = tensors(records)?;
    let mut top = Map::new();
    if let Some(meta) = metadata(records)? {
        top.insert(METADATA_KEY.into(), Value::Object(meta));
    }
    let mut offset = 0u64;
    for t in &tensors {
        let len = t
            .entry
            .len()
            .and_then(|n| n.checked_mul(t.kind.itemsize))
            .ok_or_else(|| {
                Error::from(crate::UsageError::InvalidArray {
                    name: t.name.clone(),
                    detail: "size overflows".into(),
                })
            })?;
        top.insert(
            t.name.clone(),
            json!({"dtype": t.kind.tag, "shape": t.entry.shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let compact = Style {
        compact: true,
        ..Style::DEFAULT
    };
    let mut text = pyjson::to_string(&Value::Object(top), compact).into_bytes();
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + text.len());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    Ok((out, tensors))
}

/// Writes the `.safetensors` file of `records` (payloads under the store
/// root `root`) into `out`; returns `out` (not synced). `target` names the
/// file in errors. Every check (names, dtypes, metadata) runs before the
/// first byte is written. `progress` gets `(0, n)` after the header, then
/// `(i, n)` after each of the `n` tensors.
///
/// Errors: [`UsageError::InvalidArray`](crate::UsageError::InvalidArray) for a dtype safetensors cannot hold, an
/// `object` array, a tensor name or metadata key occurring twice;
/// [`StorageError::Io`](crate::StorageError::Io) naming `target` when writing fails; [`Error::Corrupt`] or
/// [`StorageError::Io`](crate::StorageError::Io) naming the record, the array and its payload file when
/// reading one fails.
pub fn write_safetensors<W: Write>(
    mut out: W,
    target: &Path,
    root: &Path,
    records: &[ExportRecord],
    progress: Progress<'_>,
) -> Result<W> {
    let out_err = target_error(target);
    let (head, tensors) = header(records)?;
    out.write_all(&head).map_err(out_err)?;
    let total = tensors.len() as u64;
    progress(0, total)?;
    let mut buf = vec![0u8; CHUNK];
    for (i, t) in tensors.iter().enumerate() {
        let context = in_array(target, t.key, t.path);
        let transpose = t.entry.fortran_order && !c_order_too(&t.entry.shape);
        if !t.kind.swap && !transpose {
            // the stored bytes are the tensor's bytes: copy them
            let mut data = PayloadData::open(root, t.entry).map_err(&context)?;
            while data.remaining() > 0 {
                let n = data.read_chunk(&mut buf).map_err(&context)?;
                out.write_all(&buf[..n]).map_err(out_err)?;
            }
        } else {
            let mapped = payload::load_payload(root, t.entry).map_err(&context)?;
            reorder(
                mapped.as_bytes(),
                &t.entry.shape,
                transpose,
                t.kind.itemsize as usize,
                t.kind.swap,
                &mut buf,
                &mut |chunk| out.write_all(chunk).map_err(out_err),
            )?;
        }
        progress(i as u64 + 1, total)?;
    }
    Ok(out)
}

/// Streams `data` (elements of `itemsize` bytes, 1, 2, 4 or 8, in Fortran
/// order when `fortran`, else C order, of `shape`) to `sink` in C order,
/// byte-swapping each element when `swap`, through `buf` (at least 8 bytes).
fn reorder(
    data: &[u8],
    shape: &[u64],
    fortran: bool,
    itemsize: usize,
    swap: bool,
    buf: &mut [u8],
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    // one copy of the loops per element size: fixed-size copies and swaps
    match itemsize {
        1 => reorder_n::<1>(data, shape, fortran, swap, buf, sink),
        2 => reorder_n::<2>(data, shape, fortran, swap, buf, sink),
        4 => reorder_n::<4>(data, shape, fortran, swap, buf, sink),
        8 => reorder_n::<8>(data, shape, fortran, swap, buf, sink),
        _ => Err(Error::from(crate::UsageError::InvalidArray {
            name: "tensor".into(),
            detail: format!("item size {itemsize} is not 1, 2, 4 or 8"),
        })),
    }
}

/// Copies element `from` of `src` to element `to` of `dst` (elements of
/// `N` bytes), reversing its bytes when `swap`.
#[inline(always)]
fn put<const N: usize>(dst: &mut [u8], to: usize, src: &[u8], from: usize, swap: bool) {
    let mut e: [u8; N] = src[from * N..from * N + N].try_into().expect("N bytes");
    if swap {
        e.reverse();
    }
    dst[to * N..to * N + N].copy_from_slice(&e);
}

fn reorder_n<const N: usize>(
    data: &[u8],
    shape: &[u64],
    fortran: bool,
    swap: bool,
    buf: &mut [u8],
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let per_chunk = buf.len() / N;
    if !fortran {
        for src in data.chunks(per_chunk * N) {
            let n = src.len() / N;
            for i in 0..n {
                put::<N>(buf, i, src, i, swap);
            }
            sink(&buf[..n * N])?;
        }
        return Ok(());
    }
    // Fortran to C order. Axes of length 1 move no bytes: drop them. The
    // output's slowest axis is the input's fastest, so output rows are
    // made `rows` at a time: for each position in the other axes (visited
    // in input order, so the input is read sequentially), the `rows`
    // consecutive input elements go to the same column of each row.
    let dims: Vec<usize> = shape
        .iter()
        .map(|&d| d as usize)
        .filter(|&d| d != 1)
        .collect();
    let (d0, rest) = (dims[0], &dims[1..]);
    let row: usize = rest.iter().product();
    if row > per_chunk {
        return gather_n::<N>(data, &dims, swap, buf, sink);
    }
    // C strides (in elements) of the other axes within an output row
    let mut cstrides = vec![0; rest.len()];
    let mut stride = 1;
    for (k, &d) in rest.iter().enumerate().rev() {
        cstrides[k] = stride;
        stride *= d;
    }
    let rows = (per_chunk / row).min(d0);
    let mut index = vec![0usize; rest.len()];
    let mut first = 0;
    while first < d0 {
        let r = rows.min(d0 - first);
        let mut col = 0;
        for f in 0..row {
            let from = first + d0 * f;
            for i in 0..r {
                put::<N>(buf, i * row + col, data, from + i, swap);
            }
            // next position in Fortran order (first of the other axes fastest)
            for k in 0..rest.len() {
                index[k] += 1;
                col += cstrides[k];
                if index[k] < rest[k] {
                    break;
                }
                col -= cstrides[k] * rest[k];
                index[k] = 0;
            }
        }
        sink(&buf[..r * row * N])?;
        first += r;
    }
    Ok(())
}

/// Fortran to C order element by element, for arrays whose output rows do
/// not fit the buffer: an odometer over the output's C order whose last
/// axis is gathered with its input stride.
fn gather_n<const N: usize>(
    data: &[u8],
    dims: &[usize],
    swap: bool,
    buf: &mut [u8],
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let per_chunk = buf.len() / N;
    let mut strides = Vec::with_capacity(dims.len());
    let mut stride = 1;
    for &d in dims {
        strides.push(stride);
        stride *= d;
    }
    let last = dims.len() - 1;
    let (inner_len, inner_stride) = (dims[last], strides[last]);
    let mut index = vec![0usize; last];
    let mut filled = 0;
    loop {
        let base: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        for j in 0..inner_len {
            put::<N>(buf, filled, data, base + j * inner_stride, swap);
            filled += 1;
            if filled == per_chunk {
                sink(&buf[..filled * N])?;
                filled = 0;
            }
        }
        // next outer index, last outer axis fastest
        let mut axis = last;
        loop {
            if axis == 0 {
                if filled > 0 {
                    sink(&buf[..filled * N])?;
                }
                return Ok(());
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < dims[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

/// Exports the records `keys` of `store` (in that order) to a new
/// `.safetensors` file at `path`, replacing any file there atomically (see
/// [`write_atomic`] and [`write_safetensors`]).
///
/// Errors: those of [`load_records`] and [`write_safetensors`] (all checks
/// before the temporary file is created) and of [`write_atomic`]; on error
/// `path` is untouched.
pub fn export_safetensors(
    store: &Store,
    path: &Path,
    keys: &[String],
    progress: Progress<'_>,
) -> Result<()> {
    let records = load_records(store, keys, ".safetensors")?;
    // the checks, before a temporary file exists
    header(&records)?;
    write_atomic(path, |out: &mut BufWriter<File>| {
        write_safetensors(out, path, store.root(), &records, progress).map(drop)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interop::export::c_order_too;

    #[test]
    fn tensor_kinds() {
        let kind = |d: &str, k: Option<&str>| tensor_kind(d, k).map(|k| (k.tag, k.swap));
        assert_eq!(kind("'<f4'", None), Some(("F32".into(), false)));
        assert_eq!(kind("'>f8'", None), Some(("F64".into(), true)));
        assert_eq!(kind("'|b1'", None), Some(("BOOL".into(), false)));
        assert_eq!(kind("'>u2'", Some("BF16")), Some(("BF16".into(), true)));
        assert_eq!(
            kind("'|u1'", Some("F8_E5M2")),
            Some(("F8_E5M2".into(), false))
        );
        // a tag that does not fit the dtype is ignored
        assert_eq!(kind("'<f2'", Some("BF16")), Some(("F16".into(), false)));
        for bad in [
            "'<c16'",
            "'<U1'",
            "'<M8[D]'",
            "'|O'",
            "[('a', '<i4')]",
            "'<f16'",
        ] {
            assert_eq!(kind(bad, None), None, "{bad}");
        }
    }

    fn c_order(data: &[u8], shape: &[u64], itemsize: usize, swap: bool, chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; chunk];
        reorder(data, shape, true, itemsize, swap, &mut buf, &mut |c| {
            out.extend_from_slice(c);
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn fortran_to_c_order() {
        // a (2, 3) array [[0, 1, 2], [3, 4, 5]] in Fortran order: 0 3 1 4 2 5
        let f = [0u8, 3, 1, 4, 2, 5];
        for chunk in [8, 3, 4] {
            assert_eq!(c_order(&f, &[2, 3], 1, false, chunk), [0, 1, 2, 3, 4, 5]);
        }
        // (2, 1, 3, 2) of u16, swapped: element k of C order has value k
        let shape = [2u64, 1, 3, 2];
        let mut f = vec![0u8; 24];
        for i0 in 0..2 {
            for i2 in 0..3 {
                for i3 in 0..2 {
                    let c = (i0 * 3 + i2) * 2 + i3;
                    let at = i0 + 2 * (i2 + 3 * i3);
                    f[2 * at..2 * at + 2].copy_from_slice(&(c as u16).to_be_bytes());
                }
            }
        }
        let want: Vec<u8> = (0..12u16).flat_map(u16::to_le_bytes).collect();
        // 8 bytes: rows (of 6 elements) longer than the buffer, gathered
        for chunk in [8, 12, 14, 64] {
            assert_eq!(c_order(&f, &shape, 2, true, chunk), want, "{chunk}");
        }
        // C order, swapped
        let mut out = Vec::new();
        let be: Vec<u8> = (0..12u16).flat_map(u16::to_be_bytes).collect();
        reorder(&be, &[12], false, 2, true, &mut [0; 10], &mut |c| {
            out.extend_from_slice(c);
            Ok(())
        })
        .unwrap();
        assert_eq!(out, want);
    }

    proptest::proptest! {
        #[test]
        fn reorder_matches_a_naive_transpose(
            shape in proptest::collection::vec(1u64..6, 1..5),
            size_pow in 0u32..4,
            swap: bool,
            chunk in 8usize..300,
        ) {
            let itemsize = 1usize << size_pow;
            let len: usize = shape.iter().product::<u64>() as usize;
            let data: Vec<u8> = (0..len * itemsize).map(|i| (i * 7 % 251) as u8).collect();
            // naive: the C-order element (i0..in) is the Fortran element at
            // i0 + d0 * (i1 + d1 * (...))
            let mut want = Vec::with_capacity(data.len());
            for c in 0..len {
                let mut rem = c;
                let mut index = vec![0usize; shape.len()];
                for (k, &d) in shape.iter().enumerate().rev() {
                    index[k] = rem % d as usize;
                    rem /= d as usize;
                }
                let mut f = 0;
                for (k, &d) in shape.iter().enumerate().rev() {
                    f = f * d as usize + index[k];
                }
                let mut e = data[f * itemsize..(f + 1) * itemsize].to_vec();
                if swap {
                    e.reverse();
                }
                want.extend_from_slice(&e);
            }
            let fortran = !c_order_too(&shape);
            if fortran {
                proptest::prop_assert_eq!(c_order(&data, &shape, itemsize, swap, chunk), want);
            }
        }
    }
}
