//! Fuzzes the query language: any UTF-8 text either parses, and then evaluates
//! against fixed records without panicking, or fails with a `QueryError` whose column
//! lies inside the expression (or one past its end).
//!
//! Run with `cargo fuzz run query` from the repository root.

#![no_main]

use std::sync::LazyLock;

use lazyvault_store::query::{ArrayFacts, Map, Query, RecordView, Value};
use libfuzzer_sys::fuzz_target;

struct Array {
    name: &'static str,
    shape: Vec<u64>,
    dtype: &'static str,
    descr: &'static str,
    nbytes: u64,
}

struct Record {
    key: &'static str,
    meta: Map<String, Value>,
    arrays: Vec<Array>,
}

impl RecordView for Record {
    fn key(&self) -> &str {
        self.key
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
                dtype: a.dtype,
                descr: a.descr,
                nbytes: a.nbytes,
            })
    }
}

fn object(json: &str) -> Map<String, Value> {
    match json.parse::<Value>() {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

fn array(
    name: &'static str,
    shape: &[u64],
    dtype: &'static str,
    descr: &'static str,
    nbytes: u64,
) -> Array {
    Array {
        name,
        shape: shape.to_vec(),
        dtype,
        descr,
        nbytes,
    }
}

/// A record with every kind of value, nested fields, big integers, Unicode names and
/// arrays at the top level, nested and in lists; and an empty one.
static RECORDS: LazyLock<Vec<Record>> = LazyLock::new(|| {
    vec![
        Record {
            key: "mire-2/run-001",
            meta: object(
                r#"{
                    "temperature": 300.0, "material": "Si", "count": 7, "ok": true,
                    "nothing": null, "big": 9007199254740993, "umax": 18446744073709551615,
                    "imin": -9223372036854775808, "half": 0.5, "s": "it's \"q\" é 😀",
                    "params": {"lr": 0.001, "learning-rate": 0.01, "layers": [64, 32],
                               "name": "adam", "a": {"b": {"c": [1, [2, [3, {"d": 4}]]]}}},
                    "tags": ["a", "b", "c", 1, null, [1, 2], {"x": 1}],
                    "key": "meta-key", "meta": "meta-meta", "温度": 25,
                    "image": {"shape": [1, 2]}
                }"#,
            ),
            arrays: vec![
                array("image", &[480, 640], "uint8", "'|u1'", 307_200),
                array("params/w", &[3, 4], "float64", "'<f8'", 96),
                array("frames/0", &[10], "float32", "'<f4'", 40),
                array("scalar", &[], "int64", "'<i8'", 8),
                array("huge", &[u64::MAX, u64::MAX], "uint8", "'|u1'", u64::MAX),
            ],
        },
        Record {
            key: "",
            meta: Map::new(),
            arrays: Vec::new(),
        },
    ]
});

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    match Query::parse(source) {
        Ok(query) => {
            assert_eq!(query.source(), source);
            for record in RECORDS.iter() {
                let dynamic: &dyn RecordView = record;
                assert_eq!(query.matches(record), query.matches(dynamic));
            }
        }
        Err(error) => {
            let chars = source.chars().count();
            assert!(
                (1..=chars + 1).contains(&error.column),
                "column {} outside 1..={}",
                error.column,
                chars + 1
            );
            assert_eq!(error.expression, source);
            assert!(!error.message.is_empty());
            let shown = error.to_string();
            assert!(shown.contains(&error.message));
        }
    }
});
