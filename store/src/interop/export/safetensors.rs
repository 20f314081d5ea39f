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
//!   `F64`; big-endian arrays are byte-swapped and Fortran-ordered ones
//!   reordered to C order while streaming. Arrays that were imported from
//!   safetensors' raw-bit kinds (`BF16`, `F8_*`, kept as `uint16`/`uint8`
//!   with their tag in the record's `"safetensors_dtypes"` metadata field)
//!   get that tag back. Other dtypes (complex, strings, datetimes,
//!   structured, `object`) have no safetensors form: an error;
//! - `__metadata__` (a string-to-string map by the format): for a single
//!   record, its metadata fields (strings as they are, anything else as
//!   JSON) merged with the `"__metadata__"` map it was imported with; for
//!   several records, `{key: JSON of the record's metadata}`; absent for a
//!   single record with neither. A `"lazyvault"` entry, JSON `{"version": 1,
//!   "json": [keys we JSON-encoded], "fields": [keys that were top-level
//!   metadata fields]}`, lets import decode exactly what we encoded; it is
//!   written only when needed, so a foreign file exported back keeps its
//!   `__metadata__` unchanged. JSON text is Python's `json.dumps` text.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use indexmap::IndexMap;
use lazyvault_schema::ArrayEntry;
use serde_json::{json, Map, Value};

use super::pyjson::{self, Style};
use super::{c_order_too, in_array, load_records, write_atomic, ExportRecord, PayloadData};
use super::{Progress, CHUNK};
use crate::error::{Error, Result};
use crate::payload;
use crate::Store;

/// The header key of the string-to-string metadata map.
pub const METADATA_KEY: &str = "__metadata__";
/// The metadata field in which import keeps raw-bit dtype tags
/// (`{array path: "BF16"}`).
pub const TAGS_FIELD: &str = "safetensors_dtypes";
/// The `__metadata__` entry describing what we JSON-encoded.
pub const MARKER: &str = "lazyvault";

/// safetensors dtype tags of the numpy type codes (kind and item size,
/// byte order aside).
const TAGS: [(&str, &str); 12] = [
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
pub struct TensorKind {
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
pub fn tensor_kind(descr: &str, kept: Option<&str>) -> Option<TensorKind> {
    let text = descr.strip_prefix('\'')?.strip_suffix('\'')?;
    let (order, code) = match text.chars().next()? {
        c @ ('<' | '>' | '|' | '=') => (c, &text[1..]),
        _ => ('=', text),
    };
    let itemsize: u64 = code.get(1..)?.parse().ok()?;
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
                return Err(Error::InvalidArray {
                    name,
                    detail: "tensor name occurs twice (keys and paths joined by '/')".into(),
                });
            }
            if entry.pickled {
                return Err(Error::InvalidArray {
                    name: path.clone(),
                    detail: format!(
                        "record {:?}: object arrays have no safetensors form",
                        rec.key
                    ),
                });
            }
            let tag = kept.and_then(|t| t.get(path)).and_then(Value::as_str);
            let kind = tensor_kind(&entry.descr, tag).ok_or_else(|| Error::InvalidArray {
                name: name.clone(),
                detail: format!(
                    "dtype {} has no safetensors equivalent (safetensors holds bool, \
                     (u)int8-64, float16/32/64, and BF16/F8 raw bits)",
                    entry.dtype
                ),
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
            return Err(Error::InvalidArray {
                name: METADATA_KEY.into(),
                detail: format!(
                    "metadata key {k:?} occurs twice in the safetensors {METADATA_KEY}"
                ),
            });
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
        if out.is_empty() && foreign.is_none() {
            return Ok(None);
        }
    } else {
        for rec in records {
            put(&rec.key, &Value::Object(rec.record.meta.clone()), false)?;
        }
    }
    if !encoded.is_empty() || !fields.is_empty() {
        let marker = json!({"version": 1, "json": encoded, "fields": fields});
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
            .ok_or_else(|| Error::InvalidArray {
                name: t.name.clone(),
                detail: "size overflows".into(),
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
/// Errors: [`Error::InvalidArray`] for a dtype safetensors cannot hold, an
/// `object` array, a tensor name or metadata key occurring twice;
/// [`Error::Io`] naming `target` when writing fails; [`Error::Corrupt`] or
/// [`Error::Io`] naming the record, the array and its payload file when
/// reading one fails.
pub fn write_safetensors<W: Write>(
    mut out: W,
    target: &Path,
    root: &Path,
    records: &[ExportRecord],
    progress: Progress<'_>,
) -> Result<W> {
    let out_err = |source| Error::Io {
        path: target.to_owned(),
        source,
    };
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

/// Streams `data` (elements of `itemsize` bytes, in Fortran order when
/// `fortran`, else C order, of `shape`) to `sink` in C order, byte-swapping
/// each element when `swap`, through `buf` (at least one element long).
fn reorder(
    data: &[u8],
    shape: &[u64],
    fortran: bool,
    itemsize: usize,
    swap: bool,
    buf: &mut [u8],
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let per_chunk = buf.len() / itemsize * itemsize;
    let put = |dst: &mut [u8], src: &[u8]| {
        dst.copy_from_slice(src);
        if swap {
            dst.reverse();
        }
    };
    if !fortran {
        for src in data.chunks(per_chunk) {
            let dst = &mut buf[..src.len()];
            for (d, s) in dst
                .chunks_exact_mut(itemsize)
                .zip(src.chunks_exact(itemsize))
            {
                put(d, s);
            }
            sink(dst)?;
        }
        return Ok(());
    }
    // Fortran to C order: the axes longer than 1 (others do not move
    // bytes), their strides in the Fortran-ordered input, and an odometer
    // over the output's C order whose last axis is gathered with its stride.
    let dims: Vec<usize> = shape
        .iter()
        .map(|&d| d as usize)
        .filter(|&d| d != 1)
        .collect();
    let mut strides = Vec::with_capacity(dims.len());
    let mut stride = itemsize;
    for &d in &dims {
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
            let at = base + j * inner_stride;
            put(
                &mut buf[filled..filled + itemsize],
                &data[at..at + itemsize],
            );
            filled += itemsize;
            if filled == per_chunk {
                sink(&buf[..filled])?;
                filled = 0;
            }
        }
        // next outer index, last outer axis fastest
        let mut axis = last;
        loop {
            if axis == 0 {
                if filled > 0 {
                    sink(&buf[..filled])?;
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
        assert_eq!(c_order(&f, &[2, 3], 1, false, 4), [0, 1, 2, 3, 4, 5]);
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
        for chunk in [2, 6, 64] {
            assert_eq!(c_order(&f, &shape, 2, true, chunk), want, "{chunk}");
        }
    }
}
