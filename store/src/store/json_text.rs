//! Record parts handed over as JSON text ([`NewRecordJson`]): checked and
//! compacted once, then copied into the record JSON as they are, instead of
//! parsed into `serde_json::Value`s and serialized again (most of what a
//! small record costs the writer besides its I/O).

use std::fmt;

use indexmap::IndexMap;
use lazyvault_schema::{ArrayEntry, Record};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::Result;
use crate::payload::ArraySource;

use super::{check_record_size, NewRecord, MAX_RECORD_BYTES};

/// One JSON value as text, checked (it parses as [`serde_json::Value`]
/// would: same grammar, numbers in range) and compacted (no whitespace
/// outside strings). Build it with [`JsonText::object`] or
/// [`JsonText::value`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonText(String);

/// Why text is not a [`JsonText`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonTextError {
    /// Not JSON (serde_json's message, with line and column).
    #[error("not JSON: {0}")]
    NotJson(String),
    /// JSON, but not an object where one is required.
    #[error("not a JSON object")]
    NotObject,
}

impl JsonText {
    /// `text` if it is one JSON value of any kind.
    ///
    /// # Errors
    /// [`JsonTextError::NotJson`] when it does not parse.
    pub fn value(text: &str) -> std::result::Result<Self, JsonTextError> {
        let mut de = serde_json::Deserializer::from_str(text);
        Checked::deserialize(&mut de)
            .and_then(|_| de.end())
            .map_err(|e| JsonTextError::NotJson(e.to_string()))?;
        Ok(JsonText(compact(text)))
    }

    /// `text` if it is one JSON object.
    ///
    /// # Errors
    /// [`JsonTextError::NotJson`] when it does not parse,
    /// [`JsonTextError::NotObject`] for another kind of value.
    pub fn object(text: &str) -> std::result::Result<Self, JsonTextError> {
        let json = Self::value(text)?;
        if json.0.starts_with('{') {
            Ok(json)
        } else {
            Err(JsonTextError::NotObject)
        }
    }

    /// `text` as it is, without checking it: for text its caller built as
    /// one compact JSON value (the Python binding's encoder of flat dicts
    /// writes each token itself). Debug builds check it as
    /// [`JsonText::value`] would.
    #[must_use]
    pub fn trusted(text: String) -> Self {
        debug_assert!(
            JsonText::value(&text).is_ok_and(|j| j.0 == text),
            "not compact JSON: {text}"
        );
        JsonText(text)
    }

    /// The compact text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Parses any JSON value and keeps nothing: checks text as
/// `serde_json::Value` would parse it (numbers included), without building
/// one. Strings are borrowed or decoded into the parser's scratch space.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// `text` (valid JSON) without the whitespace outside its strings.
fn compact(text: &str) -> String {
    let bytes = text.as_bytes();
    if !bytes
        .iter()
        .any(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return text.to_owned();
    }
    let mut out = Vec::with_capacity(bytes.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        } else if b == b'"' {
            in_string = true;
        }
        out.push(b);
    }
    // Only ASCII whitespace was dropped, between tokens: still UTF-8.
    String::from_utf8(out).expect("compacted JSON stays UTF-8")
}

/// One record for [`Store::put_many_json`](super::Store::put_many_json):
/// as [`NewRecord`], with the metadata and layout as checked JSON text.
#[derive(Debug, Clone)]
pub struct NewRecordJson<'a> {
    /// The key (any non-empty string).
    pub key: &'a str,
    /// The JSON-able metadata, a JSON object (FORMAT.md, "Meta").
    pub meta: JsonText,
    /// How to rebuild the object (FORMAT.md, "Layout").
    pub layout: JsonText,
    /// The arrays, written as payloads; names unique within the record.
    pub arrays: &'a [ArraySource<'a>],
    /// The pickled remainder, if the object has one.
    pub pickle: Option<&'a [u8]>,
}

/// A record to write, in either form: what the write path needs of it.
pub(crate) trait Pending<'a> {
    fn key(&self) -> &'a str;
    fn arrays(&self) -> &'a [ArraySource<'a>];
    fn pickle(&self) -> Option<&'a [u8]>;
    /// The record JSON with `arrays` as its array entries, refused when
    /// over the size cap (as [`check_record_size`]).
    fn into_json(self, arrays: IndexMap<String, ArrayEntry>) -> Result<Vec<u8>>;
}

impl<'a> Pending<'a> for NewRecord<'a> {
    fn key(&self) -> &'a str {
        self.key
    }
    fn arrays(&self) -> &'a [ArraySource<'a>] {
        self.arrays
    }
    fn pickle(&self) -> Option<&'a [u8]> {
        self.pickle
    }
    fn into_json(self, arrays: IndexMap<String, ArrayEntry>) -> Result<Vec<u8>> {
        let record = Record {
            meta: self.meta,
            arrays,
            layout: self.layout,
            pickle: self.pickle.is_some(),
        };
        let json = record.to_json();
        check_record_size(self.key, &record, &json, self.pickle)?;
        Ok(json)
    }
}

impl<'a> Pending<'a> for NewRecordJson<'a> {
    fn key(&self) -> &'a str {
        self.key
    }
    fn arrays(&self) -> &'a [ArraySource<'a>] {
        self.arrays
    }
    fn pickle(&self) -> Option<&'a [u8]> {
        self.pickle
    }
    fn into_json(self, arrays: IndexMap<String, ArrayEntry>) -> Result<Vec<u8>> {
        // The members in `Record`'s order, as its serializer writes them.
        let (meta, layout) = (self.meta.as_str(), self.layout.as_str());
        // An entry takes about 300 bytes of JSON: one allocation mostly.
        let room = meta.len() + layout.len() + 320 * arrays.len() + 48;
        let mut json = Vec::with_capacity(room);
        json.extend_from_slice(b"{\"meta\":");
        json.extend_from_slice(meta.as_bytes());
        json.extend_from_slice(b",\"arrays\":");
        serde_json::to_writer(&mut json, &arrays).expect("array entries serialize");
        json.extend_from_slice(b",\"layout\":");
        json.extend_from_slice(layout.as_bytes());
        if self.pickle.is_some() {
            json.extend_from_slice(b",\"pickle\":true");
        }
        json.push(b'}');
        let pickled = self.pickle.map_or(0, <[u8]>::len);
        if json.len() + pickled > MAX_RECORD_BYTES {
            // Rare: parse it to name the largest fields in the error.
            let meta: Map<String, Value> = serde_json::from_str(meta).unwrap_or_default();
            let layout: Value = serde_json::from_str(layout).unwrap_or_default();
            let record = Record {
                meta,
                arrays,
                layout,
                pickle: self.pickle.is_some(),
            };
            check_record_size(self.key, &record, &json, self.pickle)?;
        }
        Ok(json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_text_is_compacted_outside_strings() {
        let j = JsonText::object("{\"a\": [1, 2.5e-5, \"x \\\" y\"],\n \"b c\": {}}").unwrap();
        assert_eq!(j.as_str(), "{\"a\":[1,2.5e-5,\"x \\\" y\"],\"b c\":{}}");
        assert_eq!(
            serde_json::from_str::<Value>(j.as_str()).unwrap(),
            serde_json::json!({"a": [1, 2.5e-5, "x \" y"], "b c": {}})
        );
        assert_eq!(JsonText::value(" 3 ").unwrap().as_str(), "3");
    }

    #[test]
    fn what_value_refuses_is_refused() {
        for bad in [
            "",
            "{",
            "{\"a\": 1} x",
            "[1,]",
            "1e400",
            "-1e999",
            "NaN",
            "{'a': 1}",
        ] {
            assert!(serde_json::from_str::<Value>(bad).is_err(), "{bad}");
            assert!(
                matches!(JsonText::value(bad), Err(JsonTextError::NotJson(_))),
                "{bad}"
            );
        }
        assert_eq!(JsonText::object("[1]"), Err(JsonTextError::NotObject));
        assert_eq!(JsonText::object(" \"{\" "), Err(JsonTextError::NotObject));
    }

    #[test]
    fn record_json_matches_the_parsed_form() {
        let meta = "{\"t\": 300.0, \"name\": \"Si \\u00e9\", \"n\": [1, null, true]}";
        let layout = "{\"dict\": {\"x\": {\"array\": \"x\"}}}";
        for pickle in [None, Some(&b"p"[..])] {
            let parsed = NewRecord {
                key: "k",
                meta: serde_json::from_str(meta).unwrap(),
                layout: serde_json::from_str(layout).unwrap(),
                arrays: &[],
                pickle,
            };
            let text = NewRecordJson {
                key: "k",
                meta: JsonText::object(meta).unwrap(),
                layout: JsonText::value(layout).unwrap(),
                arrays: &[],
                pickle,
            };
            let mut arrays = IndexMap::new();
            arrays.insert(
                "x".to_owned(),
                ArrayEntry {
                    id: "0123456789abcdef0123456789abcdef".into(),
                    descr: "'<f8'".into(),
                    dtype: "float64".into(),
                    shape: vec![64],
                    fortran_order: false,
                    nbytes: 512,
                    data_offset: 128,
                    pickled: false,
                    checksum: Some("xxh3-64:0123456789abcdef".into()),
                    pack: Some("fedcba9876543210fedcba9876543210".into()),
                    pack_offset: Some(64),
                },
            );
            for arrays in [IndexMap::new(), arrays] {
                let a = parsed.clone().into_json(arrays.clone()).unwrap();
                let b = text.clone().into_json(arrays).unwrap();
                assert_eq!(
                    Record::from_json(&a).unwrap(),
                    Record::from_json(&b).unwrap()
                );
            }
        }
    }
}
