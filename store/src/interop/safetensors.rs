//! `.safetensors` files: an 8-byte little-endian header length `N`, `N`
//! bytes of JSON (`{name: {"dtype", "shape", "data_offsets"},
//! "__metadata__": {str: str}}`), then the data section; every tensor
//! little-endian, C order, at `data_offsets` relative to the data section.
//!
//! The header is checked whole before anything is allocated from it or
//! written: its length against the file and [`SAFETENSORS_MAX_HEADER`] (as
//! the reference reader), strict JSON (no duplicate names), every tensor's
//! dtype, shape and offsets (in range, of the size shape and dtype imply),
//! and, as the reference reader requires, the tensors' byte ranges covering
//! the data section exactly: sorted by offset, each starts where the one
//! before ends, the first at 0 and the last at the end of the file (no
//! overlap, no gap, no trailing bytes). Shapes numpy cannot hold (more than
//! 64 dimensions, more than 2^63-1 bytes) are refused.
//!
//! `C64` (complex64, two little-endian `F32`) becomes numpy's `complex64`.
//!
//! BF16 and F8 tensors have no numpy dtype: they are kept as raw bits
//! (`uint16`, `uint8`), never converted, and their tags are kept in the
//! record's metadata under `"safetensors_dtypes"`. A `"lazyvault"` entry in
//! `__metadata__` (written by our export) says which values are JSON we
//! encoded and which were top-level metadata fields; in a file exported
//! from several records it also lists them (`"records"`: key, array paths,
//! layout), and the file comes back as those records under their keys. A
//! file without that list (written by other tools, or from one record) is
//! one record; an empty `__metadata__` gives no `"__metadata__"` field, as
//! none does.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::path::Path;

use indexmap::IndexMap;
use serde_json::{Map, Value};

use super::json::parse_strict;
use super::npz::quoted;
use super::{flat_record, invalid, shown, Field, PlannedArray, PlannedRecord, Source};
use crate::error::{Error, Result};

/// Largest header read, in bytes (the reference reader's cap, 100 MB).
pub const SAFETENSORS_MAX_HEADER: u64 = 100_000_000;
/// The key of the string map in the header.
pub(crate) const METADATA_KEY: &str = "__metadata__";
/// The metadata field that keeps raw-bit tensors' tags.
pub(crate) const TAGS_FIELD: &str = "safetensors_dtypes";
/// Our export's entry in `__metadata__`.
pub(crate) const MARKER: &str = "lazyvault";

/// A tag's `(descr, numpy dtype name, raw bits kept)`, or `None` when
/// unknown. Sub-byte tags are refused separately.
fn dtype_of(tag: &str) -> Option<(&'static str, &'static str, bool)> {
    Some(match tag {
        "BOOL" => ("'|b1'", "bool", false),
        "U8" => ("'|u1'", "uint8", false),
        "I8" => ("'|i1'", "int8", false),
        "U16" => ("'<u2'", "uint16", false),
        "I16" => ("'<i2'", "int16", false),
        "F16" => ("'<f2'", "float16", false),
        "U32" => ("'<u4'", "uint32", false),
        "I32" => ("'<i4'", "int32", false),
        "F32" => ("'<f4'", "float32", false),
        "F64" => ("'<f8'", "float64", false),
        "C64" => ("'<c8'", "complex64", false),
        "U64" => ("'<u8'", "uint64", false),
        "I64" => ("'<i8'", "int64", false),
        "BF16" => ("'<u2'", "uint16", true),
        "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => ("'|u1'", "uint8", true),
        _ => return None,
    })
}

/// Tags of kinds smaller than a byte, which lazyvault cannot hold.
const SUB_BYTE: [&str; 3] = ["F4", "F6_E2M3", "F6_E3M2"];

/// One tensor of a checked header.
#[derive(Debug, Clone)]
pub struct Tensor {
    /// The tensor's name, a key of the header (the array path it becomes).
    pub name: String,
    /// The safetensors dtype tag (`"F32"`, `"BF16"`).
    pub tag: String,
    /// The Python-literal descr it is stored as, little-endian (`"'<f4'"`,
    /// `"'|u1'"`), or the unsigned integer of the same width when `raw`.
    pub descr: &'static str,
    /// numpy's name of that dtype.
    pub dtype: &'static str,
    /// Whether the tag is a raw-bit kind numpy lacks.
    pub raw: bool,
    /// Elements per axis, outermost first (C order; `[]` for a scalar).
    pub shape: Vec<u64>,
    /// Start of its bytes, an offset into the data section (add
    /// [`Header::data_start`] for the file offset); `begin..end` holds
    /// exactly the bytes shape and dtype imply.
    pub begin: u64,
    /// End of its bytes (exclusive), an offset into the data section.
    pub end: u64,
}

/// A checked header.
#[derive(Debug, Clone)]
pub struct Header {
    /// The `__metadata__` string map, when present and not `null`.
    pub metadata: Option<IndexMap<String, String>>,
    /// Every tensor, in header order.
    pub tensors: Vec<Tensor>,
    /// Where the data section starts in the file (8 + header length).
    pub data_start: u64,
}

/// Reads and checks the header of the safetensors file in `r` (positioned
/// at its start; `file_len` bytes long; `what` names it).
///
/// # Errors
/// [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) for every refusal (see the module docs);
/// [`StorageError::Io`](crate::StorageError::Io) naming `what` when reading fails.
pub fn read_header(r: &mut dyn Read, file_len: u64, what: &str) -> Result<Header> {
    let mut head = [0u8; 8];
    let got = r.take(8).read(&mut head).map_err(Error::io(what))?;
    if got < 8 || file_len < 8 {
        return Err(invalid(what, "too short for a safetensors file"));
    }
    let n = u64::from_le_bytes(head);
    if n > file_len - 8 {
        return Err(invalid(
            what,
            format!("safetensors header length {n} exceeds the file ({file_len} bytes)"),
        ));
    }
    if n > SAFETENSORS_MAX_HEADER {
        return Err(invalid(
            what,
            format!("safetensors header length {n} exceeds {SAFETENSORS_MAX_HEADER}"),
        ));
    }
    let mut text = Vec::with_capacity(n as usize);
    r.take(n).read_to_end(&mut text).map_err(Error::io(what))?;
    if text.len() as u64 != n {
        return Err(invalid(what, "truncated safetensors header"));
    }
    let (metadata, tensors) = parse_header(&text, file_len - 8 - n, what)?;
    Ok(Header {
        metadata,
        tensors,
        data_start: 8 + n,
    })
}

/// The metadata and tensors of a header's JSON `text`, every entry checked
/// against a data section of `data_len` bytes.
///
/// # Errors
/// [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) (see the module docs).
#[allow(clippy::type_complexity)]
pub fn parse_header(
    text: &[u8],
    data_len: u64,
    what: &str,
) -> Result<(Option<IndexMap<String, String>>, Vec<Tensor>)> {
    if !text.starts_with(b"{") {
        return Err(invalid(what, "safetensors header does not start with '{'"));
    }
    let doc = parse_strict(text)
        .map_err(|e| invalid(what, format!("safetensors header is not valid JSON: {e}")))?;
    let Value::Object(mut doc) = doc else {
        return Err(invalid(what, "safetensors header is not a JSON object"));
    };
    let metadata = match doc.shift_remove(METADATA_KEY) {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => {
            let strings: Option<IndexMap<String, String>> = m
                .into_iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Some((k, s)),
                    _ => None,
                })
                .collect();
            Some(strings.ok_or_else(|| invalid(what, "__metadata__ must map strings to strings"))?)
        }
        Some(_) => return Err(invalid(what, "__metadata__ must map strings to strings")),
    };
    let tensors = doc
        .iter()
        .map(|(name, entry)| check_tensor(what, name, entry, data_len))
        .collect::<Result<Vec<_>>>()?;
    check_coverage(&tensors, data_len, what)?;
    Ok((metadata, tensors))
}

/// Checks that the tensors' byte ranges cover the data section of
/// `data_len` bytes exactly, as the reference reader does (its
/// `MetadataIncompleteBuffer` and `InvalidOffset`): sorted by offsets, each
/// starts where the previous one ends, from 0 to `data_len`.
fn check_coverage(tensors: &[Tensor], data_len: u64, what: &str) -> Result<()> {
    let mut spans: Vec<&Tensor> = tensors.iter().collect();
    spans.sort_by_key(|t| (t.begin, t.end));
    let mut end: u64 = 0;
    let mut last: Option<&Tensor> = None;
    for t in spans {
        if t.begin < end {
            let a = last.expect("end > 0 after a tensor");
            return Err(invalid(
                what,
                format!(
                    "tensors {} and {} overlap ({}-{} and {}-{})",
                    quoted(&a.name),
                    quoted(&t.name),
                    a.begin,
                    a.end,
                    t.begin,
                    t.end
                ),
            ));
        }
        if t.begin > end {
            return Err(invalid(
                what,
                format!(
                    "bytes {end}-{} of the data section belong to no tensor (tensor {} starts at \
                     {}): safetensors tensors cover the data section without gaps",
                    t.begin,
                    quoted(&t.name),
                    t.begin
                ),
            ));
        }
        end = t.end;
        last = Some(t);
    }
    if end != data_len {
        return Err(invalid(
            what,
            format!(
                "{} trailing bytes after the last tensor (the data section is {data_len} bytes, \
                 the tensors end at {end}): safetensors tensors cover the data section exactly",
                data_len - end
            ),
        ));
    }
    Ok(())
}

/// Checks one tensor entry.
fn check_tensor(file: &str, name: &str, entry: &Value, data_len: u64) -> Result<Tensor> {
    let what = format!("{file} tensor {}", quoted(name));
    let Some(entry) = entry.as_object() else {
        return Err(invalid(&what, "entry is not an object"));
    };
    let Some(tag) = entry.get("dtype").and_then(Value::as_str) else {
        return Err(invalid(&what, "missing dtype"));
    };
    if SUB_BYTE.contains(&tag) {
        return Err(invalid(
            &what,
            format!("sub-byte dtype {tag} is not supported by lazyvault"),
        ));
    }
    let Some((descr, dtype, raw)) = dtype_of(tag) else {
        return Err(invalid(&what, format!("unknown dtype {}", quoted(tag))));
    };
    let shape_value = entry.get("shape").unwrap_or(&Value::Null);
    let shape: Option<Vec<u64>> = shape_value
        .as_array()
        .and_then(|dims| dims.iter().map(Value::as_u64).collect());
    let Some(shape) = shape else {
        return Err(invalid(&what, format!("bad shape {shape_value}")));
    };
    let offsets_value = entry.get("data_offsets").unwrap_or(&Value::Null);
    let offsets: Option<Vec<i128>> = offsets_value.as_array().and_then(|o| {
        o.iter()
            .map(|v| v.as_i64().map(i128::from).or(v.as_u64().map(i128::from)))
            .collect()
    });
    let (begin, end) = match offsets.as_deref() {
        Some(&[b, e]) => (b, e),
        _ => return Err(invalid(&what, format!("bad data_offsets {offsets_value}"))),
    };
    if !(0 <= begin && begin <= end && end <= i128::from(data_len)) {
        return Err(invalid(
            &what,
            format!("data_offsets {offsets_value} outside the data section (0-{data_len})"),
        ));
    }
    let (begin, end) = (begin as u64, end as u64);
    let itemsize = descr_size(descr);
    let want = if shape.contains(&0) {
        Some(0)
    } else {
        shape
            .iter()
            .try_fold(itemsize, |acc: u64, &d| acc.checked_mul(d))
    };
    if want != Some(end - begin) {
        return Err(invalid(
            &what,
            format!(
                "data_offsets span {} bytes, shape {shape:?} of {tag} needs {}",
                end - begin,
                want.map_or("more than 2^64".to_owned(), |n| n.to_string())
            ),
        ));
    }
    if let Some(problem) = crate::npy::numpy_refuses(descr, &shape) {
        return Err(invalid(&what, problem));
    }
    Ok(Tensor {
        name: name.to_owned(),
        tag: tag.to_owned(),
        descr,
        dtype,
        raw,
        shape,
        begin,
        end,
    })
}

/// Bytes per item of one of [`dtype_of`]'s descrs (`'<f8'` → 8).
fn descr_size(descr: &str) -> u64 {
    let digits: String = descr.chars().filter(char::is_ascii_digit).collect();
    digits.parse().unwrap_or(1)
}

/// Our marker, `{"version": 1, "json": [...], "fields": [...]}` plus, in a
/// file exported from several records, `"records": [...]`.
struct Marker {
    /// Keys of `__metadata__` whose values are JSON we encoded.
    json: Vec<String>,
    /// Keys that were top-level metadata fields of the (single) record.
    fields: Vec<String>,
    /// `[{"key", "arrays": [array paths], "layout"}, ...]`, unchecked.
    records: Option<Value>,
}

/// The marker in `metadata`, or `None` when it has none or one that is not
/// ours (its text is then kept like any other entry).
fn marker_of(metadata: Option<&IndexMap<String, String>>) -> Option<Marker> {
    let doc: Value = serde_json::from_str(metadata?.get(MARKER)?).ok()?;
    if !super::npz::is_one(doc.get("version")) {
        return None;
    }
    let strings = |key: &str| -> Option<Vec<String>> {
        doc.get(key)?
            .as_array()?
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    Some(Marker {
        json: strings("json")?,
        fields: strings("fields")?,
        records: doc.get("records").cloned(),
    })
}

/// `(top-level fields, the rest for "__metadata__")` of a file's
/// `__metadata__`: values our export JSON-encoded are decoded, fields it
/// lifted from the record go back to the top. Without a valid marker
/// everything stays text in the rest.
fn decode_metadata(
    metadata: &IndexMap<String, String>,
    marker: Option<&Marker>,
) -> (Map<String, Value>, Map<String, Value>) {
    let Some(marker) = marker else {
        let rest = metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        return (Map::new(), rest);
    };
    let mut top = Map::new();
    let mut rest = Map::new();
    for (k, v) in metadata.iter().filter(|(k, _)| *k != MARKER) {
        let value = if marker.json.contains(k) {
            // not ours after all: keep the text
            parse_strict(v.as_bytes()).unwrap_or_else(|_| Value::String(v.clone()))
        } else {
            Value::String(v.clone())
        };
        if marker.fields.contains(k) {
            top.insert(k.clone(), value);
        } else {
            rest.insert(k.clone(), value);
        }
    }
    (top, rest)
}

/// The planned array of tensor `t` of a file (`what` names it).
fn planned_array(header: &Header, t: &Tensor, what: &str) -> PlannedArray {
    PlannedArray {
        what: format!("{what} tensor {}", quoted(&t.name)),
        descr: t.descr.to_owned(),
        dtype: t.dtype.to_owned(),
        shape: t.shape.clone(),
        fortran_order: false,
        nbytes: t.end - t.begin,
        header_len: 0,
        pickled: false,
        source: Source::Range {
            offset: header.data_start + t.begin,
        },
    }
}

/// The record a checked header gives (see [`super`]): its metadata fields,
/// then `"__metadata__"` (when not empty: a file without it and one with
/// `{}` give the same record), `"safetensors_dtypes"`, then the tensors.
fn plan_record(
    header: &Header,
    marker: Option<&Marker>,
    key: &str,
    what: &str,
) -> Result<PlannedRecord> {
    let mut obj = Map::new();
    if let Some(metadata) = &header.metadata {
        let (top, rest) = decode_metadata(metadata, marker);
        obj.extend(top);
        if !rest.is_empty() {
            // the file's own strings: a lone "$float" key is not a tag
            obj.insert(METADATA_KEY.to_owned(), super::escaped_object(rest));
        }
    }
    let tags: Map<String, Value> = header
        .tensors
        .iter()
        .filter(|t| t.raw)
        .map(|t| (t.name.clone(), Value::String(t.tag.clone())))
        .collect();
    if !tags.is_empty() {
        obj.insert(TAGS_FIELD.to_owned(), Value::Object(tags));
    }
    let mut fields: Vec<(String, Field)> =
        obj.into_iter().map(|(k, v)| (k, Field::Json(v))).collect();
    let mut names: HashSet<String> = fields.iter().map(|(k, _)| k.clone()).collect();
    for t in &header.tensors {
        if !names.insert(t.name.clone()) {
            return Err(invalid(
                what,
                format!("tensor {} collides with a metadata field", quoted(&t.name)),
            ));
        }
        fields.push((t.name.clone(), Field::Array(planned_array(header, t, what))));
    }
    Ok(flat_record(key, fields))
}

/// The records of a file our export wrote from several records (the
/// marker's `"records"`): each under its own key (or its only one under
/// `key`), its metadata the JSON object `__metadata__` holds under that
/// key, its arrays the tensors `<key>/<array path>` of its `"arrays"`, laid
/// out by its `"layout"`. Every tensor and every `__metadata__` entry must
/// belong to a record.
///
/// # Errors
/// [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) when the
/// records do not match the header;
/// [`InteropError::Unsupported`](crate::InteropError::Unsupported) for `key`
/// with several records.
fn plan_records(
    header: &Header,
    records: &Value,
    key: Option<&str>,
    what: &str,
) -> Result<Vec<PlannedRecord>> {
    let bad = |detail: String| invalid(what, format!("lazyvault's {MARKER:?} metadata: {detail}"));
    let empty = IndexMap::new();
    let metadata = header.metadata.as_ref().unwrap_or(&empty);
    let Some(list) = records.as_array() else {
        return Err(bad("'records' is not a list".into()));
    };
    let tensors: HashMap<&str, &Tensor> = header
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let mut used: HashSet<&str> = HashSet::new();
    let mut keys: HashSet<&str> = HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for rec in list {
        let Some(rec) = rec.as_object() else {
            return Err(bad("a record is not an object".into()));
        };
        let k = match rec.get("key").and_then(Value::as_str) {
            Some(k) if !k.is_empty() && keys.insert(k) => k,
            _ => {
                let shown = rec.get("key").map_or("None".to_owned(), Value::to_string);
                return Err(bad(format!("bad or duplicate key {shown}")));
            }
        };
        let meta = metadata
            .get(k)
            .and_then(|text| parse_strict(text.as_bytes()).ok());
        let Some(Value::Object(meta)) = meta else {
            return Err(bad(format!(
                "record {}: {METADATA_KEY} holds no JSON object under its key",
                quoted(k)
            )));
        };
        let paths: Option<Vec<&str>> = rec
            .get("arrays")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_str).collect());
        let Some(paths) = paths else {
            return Err(bad(format!(
                "record {}: 'arrays' is not a list of array paths",
                quoted(k)
            )));
        };
        let tags = meta.get(TAGS_FIELD).and_then(Value::as_object);
        let mut arrays = IndexMap::with_capacity(paths.len());
        for &p in &paths {
            let name = format!("{k}/{p}");
            let Some((&name, &t)) = tensors.get_key_value(name.as_str()) else {
                return Err(bad(format!(
                    "record {}: no tensor {}",
                    quoted(k),
                    quoted(&name)
                )));
            };
            if !used.insert(name) || arrays.contains_key(p) {
                return Err(bad(format!("tensor {} listed twice", quoted(name))));
            }
            let tag = tags.and_then(|m| m.get(p)).and_then(Value::as_str);
            if t.raw && tag != Some(t.tag.as_str()) {
                return Err(bad(format!(
                    "record {}: tensor {} is {} but the record's {TAGS_FIELD:?} does not say so",
                    quoted(k),
                    quoted(name),
                    t.tag
                )));
            }
            arrays.insert(p.to_owned(), planned_array(header, t, what));
        }
        let set: HashSet<&str> = paths.iter().copied().collect();
        let layout = match rec.get("layout") {
            Some(layout) if super::npz::layout_ok(layout, &set) => layout.clone(),
            _ => return Err(bad(format!("record {}: bad or missing layout", quoted(k)))),
        };
        out.push(PlannedRecord {
            key: k.to_owned(),
            meta,
            layout,
            arrays,
            pickle: None,
        });
    }
    if let Some(t) = header
        .tensors
        .iter()
        .find(|t| !used.contains(t.name.as_str()))
    {
        return Err(bad(format!(
            "tensor {} belongs to no record",
            quoted(&t.name)
        )));
    }
    if let Some(k) = metadata
        .keys()
        .find(|k| *k != MARKER && !keys.contains(k.as_str()))
    {
        return Err(bad(format!(
            "{METADATA_KEY} entry {} belongs to no record",
            quoted(k)
        )));
    }
    if let Some(key) = key {
        if out.len() != 1 {
            return Err(Error::from(crate::InteropError::Unsupported(format!(
                "{what} holds {} records; key= renames a single record only",
                out.len()
            ))));
        }
        out[0].key = key.to_owned();
    }
    Ok(out)
}

/// Reads and checks the header of the safetensors file at `path`.
///
/// # Errors
/// As [`read_header`]; [`StorageError::Io`](crate::StorageError::Io) when the file cannot be opened.
pub fn read_file_header(path: &Path) -> Result<Header> {
    let mut file = File::open(path).map_err(Error::io(path))?;
    let len = file.metadata().map_err(Error::io(path))?.len();
    read_header(&mut file, len, &shown(path))
}

/// Phase 1 of the safetensors file at `path`, checked, nothing written: the
/// records of a file our export wrote from several records, each under its
/// own key ([`plan_records`]); otherwise one record under `key`, or
/// `default_key`.
pub(crate) fn plan(
    path: &Path,
    key: Option<&str>,
    default_key: &str,
) -> Result<Vec<PlannedRecord>> {
    let what = shown(path);
    let header = read_file_header(path)?;
    let marker = marker_of(header.metadata.as_ref());
    if let Some(records) = marker.as_ref().and_then(|m| m.records.as_ref()) {
        return plan_records(&header, records, key, &what);
    }
    let key = key.unwrap_or(default_key);
    Ok(vec![plan_record(&header, marker.as_ref(), key, &what)?])
}
