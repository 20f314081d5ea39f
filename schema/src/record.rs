//! The record: what the index stores for one key.

use std::borrow::Cow;
use std::ops::Range;

use indexmap::IndexMap;
use serde::{de, Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::SchemaError;

/// Directory (relative to the store root) holding the payload files.
pub const PAYLOAD_DIR: &str = "arrays";
/// Length of a payload id: a random (version 4) UUID as 32 lowercase hex digits.
pub const PAYLOAD_ID_LEN: usize = 32;

/// One array payload of a record: a standard `.npy` file named by `id`.
///
/// `descr`, `shape` and `fortran_order` repeat the file's `.npy` header so
/// that queries and `ArrayInfo` never open the file; a reader must check that
/// the header agrees before trusting the data (a mismatch means corruption).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayEntry {
    /// Payload id: 32 lowercase hex digits. The file is
    /// `arrays/<id[0..2]>/<id>.npy`.
    pub id: String,
    /// The dtype as numpy's `.npy` header writes it: Python-literal text of
    /// `numpy.lib.format.dtype_to_descr(dtype)` (e.g. `'<f8'`,
    /// `[('x', '<i4'), ('y', '>f8', (2,))]`).
    pub descr: String,
    /// numpy's name of the dtype (`dtype.name`: `"float64"`, `"uint8"`,
    /// `"datetime64[ns]"`, `"void96"`), for queries.
    pub dtype: String,
    /// Shape, one entry per axis; empty for a 0-d array.
    pub shape: Vec<u64>,
    /// Whether the data is in Fortran (column-major) order.
    pub fortran_order: bool,
    /// Size of the data in bytes (elements x itemsize); for a pickled
    /// (`object` dtype) payload, the length of the pickle.
    pub nbytes: u64,
    /// Offset of the data in the file; a multiple of 64.
    pub data_offset: u64,
    /// An `object` array, stored as numpy stores it: a pickle after the
    /// header. Loading it needs `allow_pickle=True`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pickled: bool,
    /// Checksum of the data bytes recorded at write time, as
    /// `"<algorithm>:<hex digest>"` (today `"xxh3-64:"` and 16 hex digits);
    /// absent in records built straight into an archive and in records of
    /// older writers. Checked by
    /// `verify`, never on the read path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// The pack holding this payload as a member (format 1.4): its id, 32
    /// lowercase hex digits; the file is `arrays/<pack[0..2]>/<pack>.npz`,
    /// an uncompressed zip whose member `<id[0..24]>.npy` (`<id>.npy` in
    /// packs before format 2.0) is this payload. `None`:
    /// the payload is the file `arrays/<id[0..2]>/<id>.npy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<String>,
    /// Offset in the pack file of the member's `.npy` bytes (its header);
    /// present exactly when `pack` is. `pack_offset + data_offset` is a
    /// multiple of 64: the data start 64-byte aligned in the pack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack_offset: Option<u64>,
}

/// The record of one key.
/// Unknown fields are ignored (a newer minor version may add optional ones);
/// a change an older reader must not ignore bumps the major version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The JSON-able fields of the object: what queries see.
    pub meta: Map<String, Value>,
    /// Array payloads by path name (`"positions"`, `"frames/0"`,
    /// `"params/w"`), in the order they were found.
    pub arrays: IndexMap<String, ArrayEntry>,
    /// How to rebuild the original object from `meta`, `arrays` and the
    /// pickled remainder; opaque to the engine (see FORMAT.md).
    pub layout: Value,
    /// Whether a pickle of the remainder is stored beside the record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pickle: bool,
}

/// What reading one array of a record needs from its JSON, read without
/// building anything else (metadata and layout are skipped as JSON): the
/// array paths in stored order, where each one's entry is in the JSON, and
/// whether the record has a pickled remainder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordOutline<'a> {
    /// `(path, byte range of its entry's JSON object in the record JSON)`,
    /// in stored order; decode an entry with [`ArrayEntry::from_json`].
    pub arrays: Vec<(Cow<'a, str>, Range<usize>)>,
    /// As [`Record::pickle`].
    pub pickle: bool,
}

impl<'a> RecordOutline<'a> {
    /// The outline of the record JSON `bytes`. Entries are not decoded or
    /// checked beyond being JSON.
    pub fn from_json(bytes: &'a [u8]) -> Result<Self, SchemaError> {
        let outline: Outline<'a> = serde_json::from_slice(bytes).map_err(malformed)?;
        let base = bytes.as_ptr() as usize;
        let entries = outline.arrays.0;
        let mut arrays: Vec<(Cow<'a, str>, std::ops::Range<usize>)> =
            Vec::with_capacity(entries.len());
        // A path written twice (damage, or JSON from elsewhere) means what
        // it means to every other reader of the record (serde's map, Python's
        // json): the last entry, at the first one's place.
        let mut seen: std::collections::HashMap<Cow<'a, str>, usize> =
            std::collections::HashMap::new();
        for (name, raw) in entries {
            let start = raw.get().as_ptr() as usize - base;
            let range = start..start + raw.get().len();
            let earlier = if arrays.len() < 16 {
                arrays.iter().position(|(n, _)| *n == name)
            } else {
                if seen.is_empty() {
                    seen.extend(arrays.iter().enumerate().map(|(i, (n, _))| (n.clone(), i)));
                }
                seen.get(&name).copied()
            };
            match earlier {
                Some(i) => arrays[i].1 = range,
                None => {
                    if !seen.is_empty() {
                        seen.insert(name.clone(), arrays.len());
                    }
                    arrays.push((name, range));
                }
            }
        }
        Ok(RecordOutline {
            arrays,
            pickle: outline.pickle,
        })
    }
}

/// Whether the record JSON `bytes` may have a pickled remainder
/// ([`Record::pickle`]): `false` only when no `"pickle"` appears in it at
/// all, which a substring search tells without parsing (a record's own
/// fields are written as JSON strings, so `true` may also come from a
/// metadata field or value of that name; a reader told `false` for a field
/// name written with escapes finds the remainder with one more look-up).
pub fn may_have_pickle(bytes: &[u8]) -> bool {
    memchr::memmem::find(bytes, b"\"pickle\"").is_some()
}

impl ArrayEntry {
    /// An entry from its JSON object (a range of [`RecordOutline::arrays`]).
    /// Not validated: a reader checks it before opening its payload
    /// ([`ArrayEntry::validate`]).
    pub fn from_json(bytes: &[u8]) -> Result<Self, SchemaError> {
        serde_json::from_slice(bytes).map_err(malformed)
    }
}

fn malformed(e: serde_json::Error) -> SchemaError {
    SchemaError::Malformed {
        what: "record",
        detail: e.to_string(),
    }
}

/// A record's `arrays` (entries as raw JSON) and `pickle`.
#[derive(Deserialize)]
struct Outline<'a> {
    #[serde(borrow)]
    arrays: RawEntries<'a>,
    #[serde(default)]
    pickle: bool,
}

struct RawEntries<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for RawEntries<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> de::Visitor<'de> for Visit<'a> {
            type Value = RawEntries<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of array entries")
            }
            fn visit_map<A: de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RawEntries<'a>, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<BorrowedOrOwned<'a>>()? {
                    entries.push((key.0, map.next_value::<&'a RawValue>()?));
                }
                Ok(RawEntries(entries))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// A string, borrowed from the input when it has no escapes.
struct BorrowedOrOwned<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for BorrowedOrOwned<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> de::Visitor<'de> for Visit<'a> {
            type Value = BorrowedOrOwned<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(BorrowedOrOwned(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(BorrowedOrOwned(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Visit(std::marker::PhantomData))
    }
}

/// Path of a payload file relative to the store root. The id must have been
/// validated (see [`ArrayEntry::validate`]); only hex digits ever reach a path.
pub fn payload_relpath(id: &str) -> String {
    format!("{PAYLOAD_DIR}/{}/{id}.npy", &id[..2])
}

/// Path of a pack file relative to the store root (same fan-out directory
/// as payloads, extension `.npz`). The id must have been validated.
pub fn pack_relpath(pack: &str) -> String {
    format!("{PAYLOAD_DIR}/{}/{pack}.npz", &pack[..2])
}

/// Whether `id` is exactly 32 lowercase hex digits (a payload or pack id).
fn is_hex_id(id: &str) -> bool {
    id.len() == PAYLOAD_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl ArrayEntry {
    /// Checks the rules that protect the file system and the mapping: the id
    /// is exactly 32 lowercase hex digits and the data offset is 64-aligned
    /// (see [`ArrayEntry::check`]), and the array path `name` is not empty.
    pub fn validate(&self, name: &str) -> Result<(), SchemaError> {
        self.check()
            .map_err(|p| SchemaError::InvalidRecord(format!("array {name:?}: {p}")))?;
        if name.is_empty() {
            return Err(SchemaError::InvalidRecord("empty array name".into()));
        }
        Ok(())
    }

    /// [`ArrayEntry::validate`]'s rules of the entry alone, for a caller that
    /// does not know the array's path (it names the array itself): what is
    /// wrong, if anything.
    pub fn check(&self) -> Result<(), String> {
        if !is_hex_id(&self.id) {
            return Err(format!(
                "payload id {:?} is not {PAYLOAD_ID_LEN} lowercase hex digits",
                self.id
            ));
        }
        if self.data_offset < 64 || !self.data_offset.is_multiple_of(64) {
            return Err(format!(
                "data offset {} is not a positive multiple of 64",
                self.data_offset
            ));
        }
        match (&self.pack, self.pack_offset) {
            (None, None) => {}
            (Some(pack), Some(offset)) => {
                if !is_hex_id(pack) {
                    return Err(format!(
                        "pack id {pack:?} is not {PAYLOAD_ID_LEN} lowercase hex digits"
                    ));
                }
                let aligned = offset
                    .checked_add(self.data_offset)
                    .is_some_and(|end| end.is_multiple_of(64));
                if !aligned {
                    return Err(format!(
                        "pack offset {offset} plus data offset {} is not a multiple of 64",
                        self.data_offset
                    ));
                }
            }
            _ => return Err("pack and pack_offset must be given together".into()),
        }
        Ok(())
    }

    /// The file holding this payload, relative to the store root: its pack
    /// (`arrays/<pack[0..2]>/<pack>.npz`) for a packed payload, else
    /// `arrays/<id[0..2]>/<id>.npy`.
    pub fn relpath(&self) -> String {
        match &self.pack {
            Some(pack) => pack_relpath(pack),
            None => payload_relpath(&self.id),
        }
    }

    /// Whether the payload is a member of a pack.
    pub fn is_packed(&self) -> bool {
        self.pack.is_some()
    }

    /// Offset of the payload's `.npy` bytes in its file: `pack_offset` for
    /// a pack member, 0 for a payload file.
    pub fn npy_start(&self) -> u64 {
        self.pack_offset.unwrap_or(0)
    }

    /// Number of elements (1 for a 0-d array); `None` on overflow.
    pub fn len(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }
}

impl Record {
    /// Decodes and validates a record from its JSON bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, SchemaError> {
        let record: Record = serde_json::from_slice(bytes).map_err(|e| SchemaError::Malformed {
            what: "record",
            detail: e.to_string(),
        })?;
        record.validate()?;
        Ok(record)
    }

    /// Checks every array entry.
    pub fn validate(&self) -> Result<(), SchemaError> {
        for (name, entry) in &self.arrays {
            entry.validate(name)?;
        }
        Ok(())
    }

    /// Compact JSON, as stored in the index.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("record serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str) -> ArrayEntry {
        ArrayEntry {
            id: id.to_owned(),
            descr: "'<f8'".into(),
            dtype: "float64".into(),
            shape: vec![3, 4],
            fortran_order: false,
            nbytes: 96,
            data_offset: 128,
            pickled: false,
            checksum: None,
            pack: None,
            pack_offset: None,
        }
    }

    #[test]
    fn record_round_trips_through_json() {
        let mut arrays = IndexMap::new();
        arrays.insert("b".to_owned(), entry("00112233445566778899aabbccddeeff"));
        arrays.insert("a".to_owned(), entry("ffeeddccbbaa99887766554433221100"));
        let record = Record {
            meta: serde_json::from_str(r#"{"z": 1, "a": {"b": [1, 2.5, "x"]}}"#).unwrap(),
            arrays,
            layout: serde_json::json!({"dict": {"z": 1}}),
            pickle: false,
        };
        let json = record.to_json();
        let back = Record::from_json(&json).unwrap();
        assert_eq!(back, record);
        // insertion order survives (preserve_order), so the layout rebuilds
        // dicts in their original order
        assert_eq!(back.arrays.keys().collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(back.meta.keys().collect::<Vec<_>>(), ["z", "a"]);
        assert!(!String::from_utf8(json).unwrap().contains("pickle"));
    }

    #[test]
    fn an_outline_has_the_array_paths_and_where_each_entry_is() {
        let mut arrays = IndexMap::new();
        arrays.insert("z".to_owned(), entry("00112233445566778899aabbccddeeff"));
        arrays.insert(
            "a/\"0\"".to_owned(),
            entry("ffeeddccbbaa99887766554433221100"),
        );
        for pickle in [false, true] {
            let record = Record {
                meta: serde_json::from_str(r#"{"arrays": {"t": {"$d": "2026"}}, "x": [1, {}]}"#)
                    .unwrap(),
                arrays: arrays.clone(),
                layout: serde_json::json!({"dict": {"z": {"array": "z"}}}),
                pickle,
            };
            let json = record.to_json();
            let outline = RecordOutline::from_json(&json).unwrap();
            assert_eq!(outline.pickle, pickle);
            let names: Vec<_> = outline.arrays.iter().map(|(n, _)| n.as_ref()).collect();
            assert_eq!(names, ["z", "a/\"0\""]);
            for ((_, range), e) in outline.arrays.iter().zip(arrays.values()) {
                assert_eq!(&ArrayEntry::from_json(&json[range.clone()]).unwrap(), e);
            }
        }
        let none = RecordOutline::from_json(br#"{"meta":{},"arrays":{},"layout":null}"#).unwrap();
        assert!(none.arrays.is_empty() && !none.pickle);
        // what Record::from_json refuses as JSON, this refuses too
        for bad in [
            &b"{"[..],
            br#"{"meta":{}}"#,
            b"[]",
            br#"{"arrays":[]}"#,
            br#"{"arrays":{}} x"#,
            br#"{"arrays":{"x":{"id":1}"#,
        ] {
            assert!(Record::from_json(bad).is_err(), "{bad:?}");
            assert!(RecordOutline::from_json(bad).is_err(), "{bad:?}");
        }
        assert!(ArrayEntry::from_json(br#"{"id":1}"#).is_err());
    }

    #[test]
    fn a_record_with_a_pickle_may_have_one() {
        let mut record = Record {
            meta: Map::new(),
            arrays: IndexMap::new(),
            layout: Value::Null,
            pickle: false,
        };
        assert!(!may_have_pickle(&record.to_json()));
        record.pickle = true;
        assert!(may_have_pickle(&record.to_json()));
        // pretty-printed too
        assert!(may_have_pickle(
            &serde_json::to_vec_pretty(&record).unwrap()
        ));
    }

    #[test]
    fn hostile_payload_ids_are_rejected() {
        for id in [
            "../../../../etc/passwd",
            "00112233445566778899AABBCCDDEEFF",
            "0011223344556677889",
            "00112233445566778899aabbccddeef/",
            "00112233445566778899aabbccddeeff0",
            "",
        ] {
            let e = entry(id);
            assert!(e.validate("x").is_err(), "{id:?} accepted");
        }
        assert!(entry("00112233445566778899aabbccddeeff")
            .validate("x")
            .is_ok());
    }

    #[test]
    fn unaligned_offset_is_rejected_and_unknown_fields_ignored() {
        let mut e = entry("00112233445566778899aabbccddeeff");
        e.data_offset = 80;
        assert!(e.validate("x").is_err());
        let json = br#"{"meta":{},"arrays":{},"layout":null,"from_a_newer_minor":1}"#;
        assert!(Record::from_json(json).is_ok());
        assert!(Record::from_json(br#"{"meta":[],"arrays":{},"layout":null}"#).is_err());
    }

    #[test]
    fn relpath_uses_the_id_only() {
        let e = entry("abcdef00112233445566778899aabbcc");
        assert_eq!(
            e.relpath(),
            "arrays/ab/abcdef00112233445566778899aabbcc.npy"
        );
        assert_eq!(e.len(), Some(12));
    }

    #[test]
    fn packed_entries_name_their_pack_and_are_checked() {
        let mut e = entry("abcdef00112233445566778899aabbcc");
        e.pack = Some("00112233445566778899aabbccddeeff".into());
        e.pack_offset = Some(192);
        assert!(e.validate("x").is_ok());
        assert_eq!(
            e.relpath(),
            "arrays/00/00112233445566778899aabbccddeeff.npz"
        );
        assert_eq!(e.npy_start(), 192);
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.ends_with(r#""pack":"00112233445566778899aabbccddeeff","pack_offset":192}"#));
        e.pack_offset = Some(100);
        assert!(e.validate("x").is_err(), "unaligned data");
        e.pack_offset = None;
        assert!(e.validate("x").is_err(), "pack without offset");
        e.pack = Some("../../etc/passwd".into());
        e.pack_offset = Some(0);
        assert!(e.validate("x").is_err(), "hostile pack id");
        e.pack = None;
        assert!(e.validate("x").is_err(), "offset without pack");
    }

    #[test]
    fn a_path_written_twice_means_its_last_entry_as_for_every_reader() {
        // few paths (a linear search) and many (a hash map)
        for n in [3usize, 40] {
            let mut parts: Vec<String> =
                (0..n).map(|i| format!(r#""p{i}":{{"id":{i}}}"#)).collect();
            parts.push(r#""p1":{"id":"last"}"#.into());
            let json = format!(
                r#"{{"meta":{{}},"arrays":{{{}}},"layout":null}}"#,
                parts.join(",")
            );
            let outline = RecordOutline::from_json(json.as_bytes()).unwrap();
            let names: Vec<&str> = outline.arrays.iter().map(|(n, _)| n.as_ref()).collect();
            let want: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
            assert_eq!(names, want, "first place kept, no path twice");
            let (_, range) = &outline.arrays[1];
            assert_eq!(&json[range.clone()], r#"{"id":"last"}"#);
            // what serde's map (the full record parse) makes of it
            let full: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str::<serde_json::Value>(&json).unwrap()["arrays"]
                    .as_object()
                    .unwrap()
                    .clone();
            assert_eq!(full["p1"], serde_json::json!({"id": "last"}));
        }
    }
}
