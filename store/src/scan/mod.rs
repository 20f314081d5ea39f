//! How scans read records: a query is evaluated on each record JSON the
//! index holds, decoding only what the query reads ([`QueryNeeds`]).
//!
//! - [`ScanQuery::matches`]: one record's bytes → whether it matches;
//! - [`decode_for_scan`]: picks the cheapest decoding for the record's
//!   shape (the byte scanner of [`fast_meta`], the metadata and arrays
//!   objects alone, or the whole record);
//! - [`seeds`]: the serde seeds that skip what the query does not read.

mod fast_meta;
mod seeds;

use std::borrow::Cow;

use lazyvault_schema::ArrayEntry;
use serde::de::DeserializeSeed;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::query::{ArrayFacts, Query, QueryNeeds, RecordView};
use seeds::{ArraysSeed, MetaSeed, RecordSeed};

/// A query ready to run over record JSON, with what it reads worked out
/// once for the whole scan.
pub(crate) struct ScanQuery<'q> {
    query: &'q Query,
    needs: QueryNeeds,
}

impl<'q> ScanQuery<'q> {
    pub(crate) fn new(query: &'q Query) -> Self {
        ScanQuery {
            query,
            needs: query.needs(),
        }
    }

    /// Whether the record JSON `bytes` of `key` matches.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the bytes are not a record's JSON.
    pub(crate) fn matches(&self, key: &str, bytes: &[u8]) -> Result<bool> {
        let record = decode_for_scan(bytes, &self.needs)
            .map_err(|e| Error::corrupt(format!("record {key:?}"), e).with_key(key))?;
        Ok(self.query.matches(&ScanView {
            key,
            record: &record,
        }))
    }
}

/// Record as decoded for scans: only the metadata fields the query reads
/// (unescaped: see [`QueryNeeds::settle`]),
/// array facts only if it reads them, everything else (layout, ids, other
/// fields) skipped without building values.
#[derive(Default)]
struct ScanRecord<'a> {
    meta: Map<String, Value>,
    arrays: Vec<(String, ScanArray<'a>)>,
}

/// The facts of one array entry a query may read, borrowed from the record
/// JSON where it has no escapes.
#[derive(Deserialize)]
struct ScanArray<'a> {
    #[serde(borrow)]
    descr: Cow<'a, str>,
    #[serde(borrow)]
    dtype: Cow<'a, str>,
    shape: Vec<u64>,
    nbytes: u64,
}

/// Decodes `bytes` for evaluating a query that needs `needs`.
///
/// Records as this writer stores them start `{"meta":{...},"arrays":{...},`
/// (compact, in that order); then only those two values are parsed, and the
/// layout after them, which repeats the metadata, is never tokenized.
/// Any other shape is decoded in full.
fn decode_for_scan<'a>(bytes: &'a [u8], needs: &QueryNeeds) -> serde_json::Result<ScanRecord<'a>> {
    const META: &[u8] = br#"{"meta":"#;
    if needs.fields.is_empty() && !needs.arrays {
        return Ok(ScanRecord::default());
    }
    match bytes.strip_prefix(META) {
        Some(rest) if !needs.arrays => Ok(ScanRecord {
            meta: decode_meta(rest, needs)?,
            arrays: Vec::new(),
        }),
        Some(rest) => decode_meta_and_arrays(bytes, rest, needs),
        None => decode_whole(bytes, needs),
    }
}

/// The wanted fields of the metadata object at the start of `rest`, in one
/// pass; what follows it is never read. The fast scanner hands anything
/// unusual (escaped keys, malformed input) to serde_json, which decodes or
/// reports it.
fn decode_meta(rest: &[u8], needs: &QueryNeeds) -> serde_json::Result<Map<String, Value>> {
    match fast_meta::fast_meta(rest, needs) {
        Some(meta) => Ok(meta),
        None => MetaSeed { needs }.deserialize(&mut serde_json::Deserializer::from_slice(rest)),
    }
}

/// The metadata object at the start of `rest` (the record `bytes` after
/// `{"meta":`) and the `arrays` object right after it; the whole record
/// when `arrays` does not follow.
fn decode_meta_and_arrays<'a>(
    bytes: &'a [u8],
    rest: &'a [u8],
    needs: &QueryNeeds,
) -> serde_json::Result<ScanRecord<'a>> {
    const ARRAYS: &[u8] = br#","arrays":"#;
    // The extent of the metadata object first, then its wanted fields.
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<&RawValue>();
    let Some(raw) = values.next().transpose()? else {
        return decode_whole(bytes, needs);
    };
    let after_meta = &rest[values.byte_offset()..];
    let meta =
        MetaSeed { needs }.deserialize(&mut serde_json::Deserializer::from_str(raw.get()))?;
    let Some(arrays) = after_meta.strip_prefix(ARRAYS) else {
        return decode_whole(bytes, needs);
    };
    let arrays = ArraysSeed.deserialize(&mut serde_json::Deserializer::from_slice(arrays))?;
    Ok(ScanRecord { meta, arrays })
}

/// The whole record, whatever the order of its fields (checked to its end).
fn decode_whole<'a>(bytes: &'a [u8], needs: &QueryNeeds) -> serde_json::Result<ScanRecord<'a>> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let record = RecordSeed { needs }.deserialize(&mut de)?;
    de.end()?;
    Ok(record)
}

/// A scanned record as a query sees it.
struct ScanView<'a> {
    key: &'a str,
    record: &'a ScanRecord<'a>,
}

impl RecordView for ScanView<'_> {
    fn key(&self) -> &str {
        self.key
    }
    fn meta(&self) -> &Map<String, Value> {
        &self.record.meta
    }
    /// The decoders have already unescaped the fields (see
    /// [`QueryNeeds::settle`]); they know whether the metadata had one
    /// field only.
    fn fields(&self) -> &Map<String, Value> {
        &self.record.meta
    }
    fn array(&self, name: &str) -> Option<ArrayFacts<'_>> {
        // Records hold few arrays: a linear search beats hashing here.
        let (_, a) = self.record.arrays.iter().find(|(n, _)| n == name)?;
        Some(ArrayFacts {
            shape: &a.shape,
            dtype: &a.dtype,
            descr: &a.descr,
            nbytes: a.nbytes,
        })
    }
}

/// The facts a query reads of a decoded array entry (what every
/// [`RecordView`] over a [`lazyvault_schema::Record`] returns).
impl<'a> From<&'a ArrayEntry> for ArrayFacts<'a> {
    fn from(a: &'a ArrayEntry) -> Self {
        ArrayFacts {
            shape: &a.shape,
            dtype: &a.dtype,
            descr: &a.descr,
            nbytes: a.nbytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the writer stores it (`meta`, `arrays`, then the rest).
    const STORED: &str = r#"{"meta":{"t":300,"name":"Si","skip":{"deep":[1,2]}},"arrays":{"pos":{"id":"0123456789abcdef0123456789abcdef","descr":"'<f8'","dtype":"float64","shape":[4,3],"fortran_order":false,"nbytes":96,"data_offset":128}},"layout":{"t":300},"pickle":false}"#;

    /// Whether `query` matches the record JSON `text` under key "k".
    fn matches(query: &str, text: &str) -> Result<bool> {
        let query = Query::parse(query).unwrap();
        ScanQuery::new(&query).matches("k", text.as_bytes())
    }

    /// The same record with its fields in another order (decoded whole).
    fn reordered() -> String {
        reorder(STORED)
    }

    /// `text` with its fields in reverse order.
    fn reorder(text: &str) -> String {
        let value: Value = serde_json::from_str(text).unwrap();
        let mut fields: Vec<(String, Value)> =
            value.as_object().unwrap().clone().into_iter().collect();
        fields.reverse();
        let object: Map<String, Value> = fields.into_iter().collect();
        serde_json::to_string(&object).unwrap()
    }

    #[test]
    fn every_decoding_path_gives_the_same_answers() {
        let escaped = STORED.replacen(r#""name""#, r#""n\u0061me""#, 1);
        let spaced = STORED.replacen(r#","arrays":"#, r#", "arrays": "#, 1);
        let queries = [
            ("t == 300 and name == 'Si'", true),
            ("t > 300", false),
            ("pos.shape[0] == 4 and pos.dtype == 'float64'", true),
            ("t == 300 and pos.nbytes == 95", false),
            ("exists(skip) and not exists(other)", true),
            ("key == 'k'", true),
        ];
        for text in [STORED.to_owned(), reordered(), escaped, spaced] {
            for (query, want) in queries {
                assert_eq!(matches(query, &text).unwrap(), want, "{query} on {text}");
            }
        }
    }

    #[test]
    fn escaped_metadata_is_read_inside_on_every_decoding_path() {
        let escaped =
            r#"{"meta":{"$dict":{"$x":{"$tuple":[1,2]}}},"arrays":{},"layout":{},"pickle":false}"#;
        let two = r#"{"meta":{"$dict":{"$x":1},"y":2},"arrays":{},"layout":{},"pickle":false}"#;
        let cases: [(&str, &[(&str, bool)]); 2] = [
            (
                escaped,
                &[
                    ("meta['$x'] == [1, 2]", true),
                    ("meta['$x'][1] == 2 and not exists(pos)", true),
                    ("exists(meta['$dict'])", false),
                    ("meta['$dict']['$x'] == [1, 2]", false),
                    ("exists(y)", false),
                ],
            ),
            (
                two,
                &[
                    ("meta['$dict']['$x'] == 1", true),
                    ("meta['$dict']['$x'] == 1 and not exists(pos)", true),
                    ("y == 2", true),
                    ("meta['$x'] == 1", false),
                    ("exists(meta['$x'])", false),
                ],
            ),
        ];
        for (text, queries) in cases {
            // The byte scanner, serde_json (an escaped key), the whole record.
            let variants = [
                text.to_owned(),
                text.replacen(r#""$dict""#, r#""\u0024dict""#, 1),
                reorder(text),
            ];
            for variant in variants {
                for (query, want) in queries {
                    assert_eq!(
                        matches(query, &variant).unwrap(),
                        *want,
                        "{query} on {variant}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_damaged_record_is_corrupt_not_a_miss() {
        for text in [
            "",
            "[1]",
            r#"{"meta":{"t":300"#,
            r#"{"meta":{"t":300},"arrays":{"pos":{"shape":"x"}}}"#,
            r#"{"layout":{},"meta":5}"#,
        ] {
            let err = matches("t == 300 and exists(pos)", text).unwrap_err();
            assert!(matches!(err, Error::Corrupt(_)), "{text}: {err}");
        }
    }

    #[test]
    fn a_query_that_reads_nothing_decodes_nothing() {
        // Not even the JSON is checked: `key` alone needs no field.
        assert!(matches("key == 'k'", "not json").unwrap());
    }
}
