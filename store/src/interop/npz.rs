//! `.npz` files (`np.savez`, `np.savez_compressed`, and lazyvault's own
//! export): a zip of `.npy` members, read through one open file.
//!
//! Every member is checked before anything is written: its method (stored
//! or deflated), encryption, that it lies inside the file, its `.npy`
//! header (read from the first bytes only, inflating just those), and the
//! size the zip declares against the size the header implies — and, for a
//! deflated member, against [`ImportOptions::max_deflate_ratio`] times its
//! compressed size. Then the bytes are streamed into payloads (see
//! [`super`]) and the CRC-32 is checked on the way.
//!
//! lazyvault's own `.npz` carries [`NPZ_MANIFEST`], a JSON member mapping
//! every record key to its metadata, its layout and `{array path: member
//! name}`; every record then comes back under its own key.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufReader, Read, Seek};
use std::path::Path;

use indexmap::IndexMap;
use serde_json::{Map, Value};

use super::json::parse_strict;
use super::npy::{header_error, planned_array};
use super::zip::{MemberInfo, ZipIn};
use super::{
    check_pickles, flat_record, invalid, shown, ArrayBytes, Field, ImportOptions, PlannedArray,
    PlannedRecord, Source, NPZ_MANIFEST,
};
use crate::error::{Error, Result};
use crate::npy as core_npy;

/// The `format` of lazyvault's npz manifest.
pub(crate) const NPZ_FORMAT: &str = "lazyvault-npz";
/// The largest manifest read, in bytes.
const MANIFEST_MAX: u64 = 1 << 30;

/// One record of lazyvault's npz manifest, checked.
#[derive(Debug, Clone)]
pub struct ManifestRecord {
    /// The record's key: non-empty, unique within the manifest.
    pub key: String,
    /// Its metadata (the JSON object the manifest gives).
    pub meta: Map<String, Value>,
    /// Its layout; `None`: the flat dict `{**meta, **arrays}`.
    pub layout: Option<Value>,
    /// Array path → member name; every name is a member of the file.
    pub arrays: IndexMap<String, String>,
}

/// What phase 1 finds in an `.npz`.
#[derive(Debug)]
pub struct NpzContents {
    /// The `.npy` members by name, in zip order, each with its array.
    pub(crate) members: IndexMap<String, PlannedArray>,
    /// lazyvault's manifest, if the file has one.
    pub manifest: Option<Vec<ManifestRecord>>,
}

impl NpzContents {
    /// The member names and the `(descr, shape)` their headers give.
    pub fn arrays(&self) -> Vec<(String, String, Vec<u64>)> {
        let members = self.members.iter();
        members
            .map(|(n, a)| (n.clone(), a.descr.clone(), a.shape.clone()))
            .collect()
    }
}

/// `name` quoted as Python's `repr` quotes a str, for messages.
pub(crate) fn quoted(name: &str) -> String {
    if name.contains('\'') && !name.contains('"') {
        format!("\"{name}\"")
    } else {
        format!("'{}'", name.replace('\'', "\\'"))
    }
}

/// Phase 1 of an `.npz` (the zip in `zip`, `path` for I/O errors): every
/// member and the manifest checked, nothing written.
///
/// # Errors
/// [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) naming the file and the member for every refusal
/// (see the module docs).
pub fn read_npz<R: Read + Seek>(
    zip: &mut ZipIn<R>,
    path: &Path,
    options: &ImportOptions,
) -> Result<NpzContents> {
    let file = zip.what().to_owned();
    let mut members = IndexMap::new();
    let mut manifest_member = None;
    for m in zip.members() {
        let what = format!("{file} member {}", quoted(&m.name));
        if m.name == NPZ_MANIFEST {
            manifest_member = Some(m);
            continue;
        }
        if m.name.ends_with('/') {
            continue;
        }
        if m.encrypted {
            return Err(invalid(&what, "encrypted members are not supported"));
        }
        if !m.is_stored() && !m.is_deflated() {
            return Err(invalid(
                &what,
                format!(
                    "compression method {} is not supported (np.savez writes stored or \
                     deflated members)",
                    m.method
                ),
            ));
        }
        if m.is_stored() && m.compressed_size != m.size {
            return Err(invalid(&what, "stored member with two different sizes"));
        }
        let ratio = options.max_deflate_ratio;
        if m.is_deflated() && m.size > ratio.saturating_mul(m.compressed_size.max(1)) {
            return Err(invalid(
                &what,
                format!(
                    "declares {} bytes from {} compressed, more than deflate can expand \
                     (decompression bomb?; the cap is {ratio}:1)",
                    m.size, m.compressed_size
                ),
            ));
        }
        let header = {
            let mut r = zip.reader(&m, &what)?;
            core_npy::read_header(&mut r, options.max_header_size)
                .map_err(|e| header_error(&what, e, path))?
        };
        let rest = m.size.saturating_sub(header.data_offset);
        let array = planned_array(&what, &header, rest, Source::Member(m.clone()))?;
        if !array.pickled {
            let implied = header.data_offset.checked_add(array.nbytes);
            if implied != Some(m.size) {
                return Err(invalid(
                    &what,
                    format!(
                        "the zip declares {} bytes but its .npy header implies {} (shape {:?}, \
                         {}): refusing to read it (decompression bomb or corrupt file)",
                        m.size,
                        implied.map_or("more than 2^64".to_owned(), |n| n.to_string()),
                        header.shape,
                        array.dtype
                    ),
                ));
            }
        }
        members.insert(m.name.clone(), array);
    }
    let manifest = match manifest_member {
        None => None,
        Some(m) => Some(read_manifest(zip, &m, &members, options)?),
    };
    Ok(NpzContents { members, manifest })
}

/// Reads and checks lazyvault's manifest member `m`.
fn read_manifest<R: Read + Seek>(
    zip: &mut ZipIn<R>,
    m: &MemberInfo,
    members: &IndexMap<String, PlannedArray>,
    options: &ImportOptions,
) -> Result<Vec<ManifestRecord>> {
    let what = format!("{} member {}", zip.what(), quoted(NPZ_MANIFEST));
    let cap = options
        .max_deflate_ratio
        .saturating_mul(m.compressed_size.max(1))
        .min(MANIFEST_MAX);
    if m.size > cap || m.encrypted || !(m.is_stored() || m.is_deflated()) {
        return Err(invalid(
            &what,
            format!("implausibly large ({} bytes) or unreadable", m.size),
        ));
    }
    let mut text = Vec::new();
    zip.reader(m, &what)?
        .read_to_end(&mut text)
        .map_err(|e| match super::unwrap_io(e) {
            Ok(err) => err,
            Err(e) => invalid(&what, format!("not valid JSON: {e}")),
        })?;
    let doc = parse_strict(&text).map_err(|e| invalid(&what, format!("not valid JSON: {e}")))?;
    check_manifest(&doc, members, &what)
}

/// Whether a JSON value equals Python's `1` (as `==` compares: `1`, `1.0`
/// and `true` do).
pub(super) fn is_one(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Number(n)) => n.as_f64() == Some(1.0),
        Some(Value::Bool(b)) => *b,
        _ => false,
    }
}

/// Checks the manifest document: every record well formed, naming only
/// members that exist, every member named.
fn check_manifest(
    doc: &Value,
    members: &IndexMap<String, PlannedArray>,
    what: &str,
) -> Result<Vec<ManifestRecord>> {
    // One piece (about 90 lines): a flat sequence of checks on one
    // document, each refusing with its own message, read top to bottom.
    let Some(doc) = doc.as_object() else {
        return Err(invalid(what, format!("not a {NPZ_FORMAT} manifest")));
    };
    if doc.get("format").and_then(Value::as_str) != Some(NPZ_FORMAT) {
        return Err(invalid(what, format!("not a {NPZ_FORMAT} manifest")));
    }
    if !is_one(doc.get("version")) {
        let v = doc
            .get("version")
            .map_or("None".to_owned(), Value::to_string);
        return Err(invalid(what, format!("unknown version {v}")));
    }
    let Some(records) = doc.get("records").and_then(Value::as_array) else {
        return Err(invalid(what, "'records' is not a list"));
    };
    let mut used: HashSet<String> = HashSet::new();
    let mut keys: HashSet<&str> = HashSet::new();
    let mut out = Vec::with_capacity(records.len());
    for rec in records {
        let Some(rec) = rec.as_object() else {
            return Err(invalid(what, "a record is not an object"));
        };
        let key = match rec.get("key").and_then(Value::as_str) {
            Some(k) if !k.is_empty() && keys.insert(k) => k,
            other => {
                let shown = other.map_or_else(
                    || rec.get("key").map_or("None".to_owned(), Value::to_string),
                    quoted,
                );
                return Err(invalid(what, format!("bad or duplicate key {shown}")));
            }
        };
        let Some(meta) = rec.get("meta").and_then(Value::as_object) else {
            return Err(invalid(
                what,
                format!("record {}: bad metadata", quoted(key)),
            ));
        };
        let arrays = rec.get("arrays").and_then(Value::as_object);
        let arrays: Option<IndexMap<String, String>> = arrays.and_then(|a| {
            a.iter()
                .map(|(p, m)| {
                    let m = m.as_str().filter(|m| members.contains_key(*m))?;
                    Some((p.clone(), m.to_owned()))
                })
                .collect()
        });
        let Some(arrays) = arrays else {
            return Err(invalid(
                what,
                format!("record {}: arrays name missing members", quoted(key)),
            ));
        };
        used.extend(arrays.values().cloned());
        let layout = match rec.get("layout") {
            None | Some(Value::Null) => None,
            Some(layout) => {
                let paths: HashSet<&str> = arrays.keys().map(String::as_str).collect();
                if !layout_ok(layout, &paths) {
                    return Err(invalid(what, format!("record {}: bad layout", quoted(key))));
                }
                Some(layout.clone())
            }
        };
        out.push(ManifestRecord {
            key: key.to_owned(),
            meta: meta.clone(),
            layout,
            arrays,
        });
    }
    let mut unlisted: Vec<&str> = members
        .keys()
        .map(String::as_str)
        .filter(|n| !used.contains(*n))
        .collect();
    if !unlisted.is_empty() {
        unlisted.sort_unstable();
        let shown: Vec<String> = unlisted.iter().take(5).map(|n| quoted(n)).collect();
        return Err(invalid(
            what,
            format!("members not listed in it: [{}]", shown.join(", ")),
        ));
    }
    Ok(out)
}

/// The layout kinds FORMAT.md defines (a pickled remainder cannot come
/// from an npz), besides the tagged leaves ("Tagged values").
const LAYOUT_KINDS: [&str; 8] = [
    "dict", "list", "tuple", "array", "float", "scalar", "object", "masked",
];

/// The tagged values that may be layout leaves (`$tuple` and `$dict` are
/// meta only: the layout has its own `tuple` and `dict` nodes).
const LEAF_TAGS: [&str; 5] = ["$float", "$int", "$datetime", "$date", "$numpy"];

/// Whether `layout` is a tree of known nodes (FORMAT.md, "Layout") naming
/// only `paths` as arrays, or the `fields` layout (since format 1.5: the
/// whole layout, never a nested node): `null`, or distinct names with every
/// array path among them; that its other names are the metadata's fields
/// is checked where the object is rebuilt. `object` nodes are allowed: loading
/// them is gated by `allow_pickle` as for any record.
pub(super) fn layout_ok(layout: &Value, paths: &HashSet<&str>) -> bool {
    if let Some(m) = layout.as_object().filter(|m| m.len() == 1) {
        if let Some(names) = m.get("fields") {
            let names = match names {
                Value::Null => return true,
                Value::Array(names) => names,
                _ => return false,
            };
            let mut seen = HashSet::with_capacity(names.len());
            for name in names {
                match name.as_str() {
                    Some(n) if seen.insert(n) => {}
                    _ => return false,
                }
            }
            return paths.iter().all(|p| seen.contains(p));
        }
    }
    let mut stack = vec![layout];
    while let Some(node) = stack.pop() {
        let node = match node {
            Value::Array(_) => return false,
            Value::Object(m) => m,
            _ => continue,
        };
        let mut entries = node.iter();
        let (Some((kind, body)), None) = (entries.next(), entries.next()) else {
            return false;
        };
        if LEAF_TAGS.contains(&kind.as_str()) {
            if crate::query::tagged::tag(node).is_none() {
                return false;
            }
            continue;
        }
        if !LAYOUT_KINDS.contains(&kind.as_str()) {
            return false;
        }
        let ok = match (kind.as_str(), body) {
            ("dict", Value::Object(m)) => {
                stack.extend(m.values());
                true
            }
            ("list" | "tuple", Value::Array(items)) => {
                stack.extend(items);
                true
            }
            ("array", Value::String(p)) => paths.contains(p.as_str()),
            ("float", Value::String(f)) => matches!(f.as_str(), "nan" | "inf" | "-inf"),
            ("scalar", Value::Array(pair)) => pair.len() == 2 && pair[0].is_string(),
            ("masked", Value::Object(m)) => {
                let array = |v: Option<&Value>| match v {
                    Some(Value::Object(n)) => {
                        matches!(n.get("array"), Some(Value::String(p)) if n.len() == 1 && paths.contains(p.as_str()))
                    }
                    _ => false,
                };
                let fill_ok = match m.get("fill_value") {
                    Some(Value::Null | Value::String(_)) => true,
                    Some(v @ Value::Object(n)) if n.contains_key("$numpy") => {
                        stack.push(v);
                        true
                    }
                    v => array(v),
                };
                m.len() == 4
                    && array(m.get("data"))
                    && (m.get("mask") == Some(&Value::Null) || array(m.get("mask")))
                    && fill_ok
                    && m.get("hard_mask").is_some_and(Value::is_boolean)
            }
            ("object", Value::Object(o)) => match (o.get("class"), o.get("state")) {
                (Some(Value::String(_)), Some(Value::Object(state))) => {
                    stack.extend(state.values());
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// The records an `.npz` becomes (see [`super`]): one `{short name: array}`
/// for a foreign file, the manifest's otherwise.
fn plan_records(
    contents: NpzContents,
    what: &str,
    key: Option<&str>,
    default_key: &str,
) -> Result<Vec<PlannedRecord>> {
    let NpzContents { members, manifest } = contents;
    let Some(mut manifest) = manifest else {
        let mut fields: Vec<(String, Field)> = Vec::with_capacity(members.len());
        // numpy's np.load names a member without its ".npy": "a.npy" and
        // "a" would be one array
        let mut shorts: HashMap<String, String> = HashMap::new();
        for (name, array) in members {
            let short = name.strip_suffix(".npy").unwrap_or(&name).to_owned();
            if let Some(first) = shorts.insert(short.clone(), name.clone()) {
                return Err(invalid(
                    what,
                    format!(
                        "members {} and {} are both the array {}",
                        quoted(&first),
                        quoted(&name),
                        quoted(&short)
                    ),
                ));
            }
            fields.push((short, Field::Array(array)));
        }
        return Ok(vec![flat_record(key.unwrap_or(default_key), fields)]);
    };
    if let Some(key) = key {
        if manifest.len() != 1 {
            return Err(Error::from(crate::InteropError::Unsupported(format!(
                "{what} holds {} records; key= renames a single record only",
                manifest.len()
            ))));
        }
        manifest[0].key = key.to_owned();
    }
    let records = manifest.into_iter().map(|rec| {
        let arrays = rec
            .arrays
            .iter()
            .map(|(p, m)| (p.clone(), members[m].clone()));
        match rec.layout {
            Some(layout) => PlannedRecord {
                key: rec.key,
                meta: rec.meta,
                layout,
                arrays: arrays.collect(),
                pickle: None,
            },
            None => {
                // the flat dict {**meta, **arrays}: an array replaces a
                // field of its name, in the field's place
                let mut arrays: IndexMap<String, PlannedArray> = arrays.collect();
                let mut fields = Vec::with_capacity(rec.meta.len() + arrays.len());
                for (k, v) in rec.meta {
                    let field = match arrays.shift_remove(&k) {
                        Some(a) => Field::Array(a),
                        None => Field::Json(v),
                    };
                    fields.push((k, field));
                }
                fields.extend(arrays.into_iter().map(|(p, a)| (p, Field::Array(a))));
                flat_record(&rec.key, fields)
            }
        }
    });
    Ok(records.collect())
}

/// Member bytes of an open zip.
pub(crate) struct Members<R: Read + Seek>(pub ZipIn<R>);

impl<R: Read + Seek> ArrayBytes for Members<R> {
    fn open(&mut self, array: &PlannedArray) -> Result<Box<dyn Read + '_>> {
        let Source::Member(m) = &array.source else {
            unreachable!("an npz plan holds members only");
        };
        let mut r = self.0.reader(m, &array.what)?;
        // the .npy header is part of the member (and of its CRC)
        io::copy(&mut (&mut r).take(array.header_len), &mut io::sink())
            .map_err(|e| super::unwrap_io(e).unwrap_or_else(|e| invalid(&array.what, e)))?;
        Ok(Box::new(r))
    }
}

/// Opens the `.npz` at `path` with one descriptor.
pub(crate) fn open(path: &Path) -> Result<ZipIn<BufReader<File>>> {
    let file = File::open(path).map_err(Error::io(path))?;
    ZipIn::new(BufReader::with_capacity(64 << 10, file), &shown(path))
}

/// Whether the zip at `path` holds lazyvault's npz manifest.
///
/// # Errors
/// [`StorageError::Io`](crate::StorageError::Io) when it cannot be opened; [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) when it
/// is not a readable zip.
pub fn has_manifest(path: &Path) -> Result<bool> {
    Ok(open(path)?.contains(NPZ_MANIFEST))
}

/// Phase 1 of the `.npz` at `path`: its records, checked, nothing written
/// (see [`super::import_file`] for `key` and `default_key`).
pub(crate) fn plan(
    path: &Path,
    key: Option<&str>,
    default_key: &str,
    options: &ImportOptions,
) -> Result<Vec<PlannedRecord>> {
    let mut zip = open(path)?;
    let contents = read_npz(&mut zip, path, options)?;
    let records = plan_records(contents, &shown(path), key, default_key)?;
    check_pickles(&records, options)?;
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::layout_ok;
    use serde_json::json;
    use std::collections::HashSet;

    #[test]
    fn tagged_leaves_and_masked_nodes_are_known_layout() {
        let paths: HashSet<&str> = ["m", "m/mask"].into_iter().collect();
        let masked = |fill: serde_json::Value| {
            json!({"masked": {"data": {"array": "m"}, "mask": {"array": "m/mask"},
                              "fill_value": fill, "hard_mask": false}})
        };
        for good in [
            json!({"dict": {"a": {"$float": "nan"}, "b": {"$int": "-123456789012345678901234"}}}),
            json!({"list": [{"$datetime": "2024-03-01T12:30:00+01:00[Europe/Paris]"}]}),
            json!({"tuple": [{"$date": "2024-03-01"}, {"$numpy": ["<f4", 1.5]}]}),
            masked(json!(null)),
            masked(json!("z")),
            masked(json!({"$numpy": ["<f8", {"$float": "nan"}]})),
            json!({"masked": {"data": {"array": "m"}, "mask": null, "fill_value": null,
                              "hard_mask": true}}),
        ] {
            assert!(layout_ok(&good, &paths), "{good}");
        }
        for bad in [
            json!({"$float": "zero"}),
            json!({"$tuple": [1]}),
            json!({"$dict": {}}),
            json!({"$numpy": ["<f4", "x"]}),
            masked(json!({"array": "nowhere"})),
            masked(json!({"$numpy": ["<f8", "x"]})),
            json!({"masked": {"data": {"array": "elsewhere"}, "mask": null,
                              "fill_value": null, "hard_mask": false}}),
            json!({"masked": {"data": {"array": "m"}, "mask": null, "fill_value": null}}),
        ] {
            assert!(!layout_ok(&bad, &paths), "{bad}");
        }
    }

    #[test]
    fn the_fields_layout_is_known_at_the_root_only() {
        let paths: HashSet<&str> = ["x"].into_iter().collect();
        assert!(layout_ok(&json!({"fields": ["t", "x", "$y"]}), &paths));
        assert!(layout_ok(&json!({"fields": null}), &paths));
        for bad in [
            json!({"fields": ["t"]}),           // leaves out the array
            json!({"fields": ["t", "x", "t"]}), // a name twice
            json!({"fields": ["x", 1]}),
            json!({"fields": {"x": "x"}}),
            json!({"fields": ["x"], "dict": {}}),
            json!({"dict": {"a": {"fields": ["x"]}}}),
            json!({"dict": {"a": {"fields": null}}}),
        ] {
            assert!(!layout_ok(&bad, &paths), "{bad}");
        }
    }
}
