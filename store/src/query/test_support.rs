//! Fixtures of the query unit tests: a record with metadata and array
//! facts, and assertions on matches and parse errors.

use serde_json::{json, Map, Value};

use super::lexer::shorten;
use super::{ArrayFacts, Query, QueryError, RecordView};

#[derive(Debug, Clone)]
pub(super) struct TestArray {
    name: String,
    shape: Vec<u64>,
    dtype: String,
    descr: String,
    nbytes: u64,
}

#[derive(Debug, Clone)]
pub(super) struct TestRecord {
    pub(super) key: String,
    pub(super) meta: Map<String, Value>,
    pub(super) arrays: Vec<TestArray>,
}

impl TestRecord {
    pub(super) fn new(meta: Value) -> Self {
        Self::keyed("run-001", meta)
    }

    pub(super) fn keyed(key: &str, meta: Value) -> Self {
        let Value::Object(meta) = meta else {
            panic!("metadata must be an object")
        };
        TestRecord {
            key: key.to_owned(),
            meta,
            arrays: Vec::new(),
        }
    }

    pub(super) fn with_array(
        mut self,
        name: &str,
        shape: &[u64],
        dtype: &str,
        descr: &str,
    ) -> Self {
        let itemsize: u64 = descr
            .chars()
            .filter(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or(1);
        self.arrays.push(TestArray {
            name: name.to_owned(),
            shape: shape.to_vec(),
            dtype: dtype.to_owned(),
            descr: descr.to_owned(),
            nbytes: shape.iter().fold(itemsize, |acc, &d| acc.saturating_mul(d)),
        });
        self
    }
}

impl RecordView for TestRecord {
    fn key(&self) -> &str {
        &self.key
    }

    fn meta(&self) -> &Map<String, Value> {
        &self.meta
    }

    fn array(&self, name: &str) -> Option<ArrayFacts<'_>> {
        self.arrays
            .iter()
            .find(|a| a.name == name)
            .map(|a| ArrayFacts {
                shape: &a.shape,
                dtype: &a.dtype,
                descr: &a.descr,
                nbytes: a.nbytes,
            })
    }
}

pub(super) fn sample() -> TestRecord {
    TestRecord::new(json!({
        "temperature": 300.0,
        "material": "Si",
        "count": 7,
        "ok": true,
        "nothing": null,
        "params": {"lr": 0.001, "learning-rate": 0.01, "layers": [64, 32], "name": "adam"},
        "tags": ["a", "b", "c"],
        "key": "meta-key",
        "meta": "meta-meta",
        "ünïcode": 1,
        "温度": 25,
    }))
    .with_array("image", &[480, 640], "uint8", "'|u1'")
    .with_array("params/w", &[3, 4], "float64", "'<f8'")
    .with_array("frames/0", &[10], "float32", "'<f4'")
    .with_array("scalar", &[], "int64", "'<i8'")
}

pub(super) fn query(src: &str) -> Query {
    Query::parse(src).unwrap_or_else(|e| panic!("{:?} should parse:\n{e}", shorten(src)))
}

pub(super) fn check(src: &str, rec: &TestRecord) -> bool {
    query(src).matches(rec)
}

/// Asserts that each query matches `rec` (`want = true`) or does not.
pub(super) fn expect_all(rec: &TestRecord, want: bool, sources: &[&str]) {
    for src in sources {
        assert_eq!(check(src, rec), want, "{src:?} should give {want}");
    }
}

pub(super) fn parse_err(src: &str) -> QueryError {
    match Query::parse(src) {
        Ok(q) => panic!("{:?} should not parse, got {q:?}", shorten(src)),
        Err(e) => e,
    }
}

pub(super) fn assert_err(src: &str, column: usize, fragment: &str) {
    let e = parse_err(src);
    let short = shorten(src);
    assert_eq!(e.column, column, "column for {short:?}: {}", e.message);
    assert!(
        e.message.contains(fragment),
        "message for {short:?} should contain {fragment:?}: {}",
        e.message
    );
    assert_eq!(e.expression, src);
}

impl TestRecord {
    /// The record as the store keeps it (FORMAT.md, "Record"), for the
    /// column builder.
    pub(super) fn to_json(&self) -> Vec<u8> {
        let arrays: Map<String, Value> = self
            .arrays
            .iter()
            .map(|a| {
                (
                    a.name.clone(),
                    json!({
                        "id": "0".repeat(32), "descr": a.descr, "dtype": a.dtype,
                        "shape": a.shape, "fortran_order": false, "nbytes": a.nbytes,
                        "data_offset": 128,
                    }),
                )
            })
            .collect();
        serde_json::to_vec(&json!({"meta": self.meta, "arrays": arrays, "layout": null}))
            .expect("serializes")
    }
}

/// Asserts that `q` over the columns of `records` (rows the columns leave
/// unknown checked against the record) gives what `q.matches` gives for
/// each record; returns the number of unknown rows.
pub(super) fn assert_columns_agree(q: &Query, records: &[TestRecord]) -> usize {
    let jsons: Vec<Vec<u8>> = records.iter().map(TestRecord::to_json).collect();
    let cols = crate::columns::Columns::build(
        records
            .iter()
            .zip(&jsons)
            .map(|(r, j)| (r.key.as_str(), Some(j.as_slice()))),
    )
    .expect("builds");
    let verdict = q.eval_columns(&cols);
    let bit = |b: &[u64], i: usize| (b[i / 64] >> (i % 64)) & 1 == 1;
    let mut unknown = 0;
    for (i, rec) in records.iter().enumerate() {
        let expected = q.matches(rec);
        let got = if bit(&verdict.unknown, i) {
            unknown += 1;
            assert!(!bit(&verdict.yes, i), "row {i} both yes and unknown");
            expected
        } else {
            bit(&verdict.yes, i)
        };
        assert_eq!(
            got,
            expected,
            "query {:?} on row {i} {:?} (columns {:?})",
            q.source(),
            rec.meta,
            cols.schema()
                .fields()
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
        );
    }
    unknown
}
