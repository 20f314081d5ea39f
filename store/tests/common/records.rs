//! Small builders the integration tests share: metadata maps and one-
//! dimensional `uint8` arrays to put.

use lazyvault_store::ArraySource;
use serde_json::{Map, Value};

/// `v` (a JSON object) as a record's metadata map.
#[allow(dead_code)] // not every test file uses both
pub fn meta(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("object")
}

/// A C-order `uint8` array named `name` holding `data` (shape `[len]`).
#[allow(dead_code)]
pub fn u8_array<'a>(name: &str, data: &'a [u8]) -> ArraySource<'a> {
    ArraySource {
        name: name.into(),
        descr: "'|u1'".into(),
        dtype: "uint8".into(),
        shape: vec![data.len() as u64],
        fortran_order: false,
        data,
        pickled: false,
    }
}
