//! Unit tests of the column builder and column files.

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::Array;
use arrow_schema::DataType;
use serde_json::json;

use super::*;

fn record(meta: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"meta": meta, "arrays": {}, "layout": null})).unwrap()
}

fn build(metas: &[serde_json::Value]) -> Columns {
    let recs: Vec<Vec<u8>> = metas.iter().map(|m| record(m.clone())).collect();
    let keys: Vec<String> = (0..metas.len()).map(|i| format!("k{i}")).collect();
    Columns::build(
        keys.iter()
            .map(String::as_str)
            .zip(recs.iter().map(|r| Some(r.as_slice()))),
    )
    .unwrap()
}

#[test]
fn typed_columns_and_json_siblings() {
    let c = build(&[
        json!({"t": 1.5, "n": 1, "s": "Si", "b": true, "p": {"lr": 0.1}}),
        json!({"t": 2, "n": "two", "s": "Ge", "l": [1, 2]}),
        json!({"t": {"$float": "nan"}, "n": 3, "s": "Si", "p": {"$dict": {"lr": 0.2}}}),
    ]);
    let typed = |p: &[&str]| {
        let p: Vec<String> = p.iter().map(|s| s.to_string()).collect();
        c.paths[&p]
    };
    let t = c.batch.column(typed(&["t"]).typed.unwrap());
    assert_eq!(t.data_type(), &DataType::Float64);
    let t = t.as_primitive::<Float64Type>();
    assert_eq!(t.value(0), 1.5);
    assert_eq!(t.value(1), 2.0);
    assert!(t.value(2).is_nan());
    assert!(typed(&["t"]).json.is_none());
    // n: ints typed, the string in the json sibling
    let n = typed(&["n"]);
    let ints = c.batch.column(n.typed.unwrap()).as_primitive::<Int64Type>();
    assert_eq!(
        (ints.value(0), ints.is_null(1), ints.value(2)),
        (1, true, 3)
    );
    let json = c.batch.column(n.json.unwrap()).as_string::<i32>();
    assert_eq!(json.value(1), "\"two\"");
    assert!(json.is_null(0));
    // dictionary strings, first-seen order
    let s = c.batch.column(typed(&["s"]).typed.unwrap());
    let d = s.as_dictionary::<arrow_array::types::Int32Type>();
    assert_eq!(d.values().len(), 2);
    // nested paths, through $dict too
    let lr = c
        .batch
        .column(typed(&["p", "lr"]).typed.unwrap())
        .as_primitive::<Float64Type>();
    assert_eq!((lr.value(0), lr.is_null(1), lr.value(2)), (0.1, true, 0.2));
    // a list is json only
    assert!(typed(&["l"]).typed.is_none());
    assert_eq!(
        c.batch
            .column(typed(&["l"]).json.unwrap())
            .as_string::<i32>()
            .value(1),
        "[1,2]"
    );
}

#[test]
fn datetimes_tombstones_and_facts() {
    let a = serde_json::to_vec(&json!({
        "meta": {"at": {"$datetime": "2024-03-01T12:30:00+01:00"}, "d": {"$datetime": "2024-03-01T12:30:00"}},
        "arrays": {"x": {"id": "0".repeat(32), "descr": "'<f8'", "dtype": "float64", "shape": [2, 3],
                         "fortran_order": false, "nbytes": 48, "data_offset": 128}},
        "layout": null})).unwrap();
    let c = Columns::build([("a", Some(a.as_slice())), ("b", None)]).unwrap();
    assert_eq!(c.len(), 2);
    assert!(c.live().value(0) && !c.live().value(1));
    let at = c
        .batch
        .column(c.paths[&vec!["at".to_string()]].typed.unwrap());
    assert_eq!(
        at.data_type(),
        &DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some(UTC.into()))
    );
    let at = at.as_primitive::<arrow_array::types::TimestampMicrosecondType>();
    // 11:30 UTC
    assert_eq!(at.value(0), 1_709_292_600_000_000);
    let d = c
        .batch
        .column(c.paths[&vec!["d".to_string()]].typed.unwrap());
    assert_eq!(
        d.data_type(),
        &DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, None)
    );
    let facts = &c.facts["x"];
    let nbytes = c.batch.column(facts[&FactName::Nbytes]);
    assert_eq!(
        nbytes
            .as_primitive::<arrow_array::types::UInt64Type>()
            .value(0),
        48
    );
    assert!(nbytes.is_null(1));
}

#[test]
fn files_round_trip_mapped() {
    let c = build(&[
        json!({"t": 1.5, "s": "Si"}),
        json!({"t": 2.5, "s": "Ge", "x": [1]}),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let info = c.write(dir.path(), "r.arrow").unwrap();
    let path = dir.path().join("r.arrow");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), info.bytes);
    assert!(!dir.path().join("r.arrow.tmp").exists());
    let back = Columns::open(&path, &info).unwrap();
    assert_eq!(back.batch, c.batch);
    assert_eq!(back.paths.len(), c.paths.len());
    assert_eq!(Columns::check_file(&path, &info).unwrap(), None);
    // the wrong length, a flipped byte, garbage: errors, never a panic
    let longer = ColumnsInfo {
        bytes: info.bytes + 1,
        ..info.clone()
    };
    assert!(Columns::open(&path, &longer).is_err());
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    assert!(Columns::check_file(&path, &info).unwrap().is_some());
    let err = Columns::open(&path, &info).unwrap_err().to_string();
    assert!(err.contains("checksum"), "{err}");
    for cut in [0, 8, 20, bytes.len() / 3, bytes.len() - 11] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        // the checksum of the cut file, so that the layout checks are reached
        let cut_info = ColumnsInfo {
            file: info.file.clone(),
            bytes: cut as u64,
            checksum: xxhash_rust::xxh3::xxh3_64(&bytes[..cut]),
        };
        assert!(Columns::open(&path, &cut_info).is_err(), "cut at {cut}");
    }
}
