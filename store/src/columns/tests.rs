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
    let t = c.column(typed(&["t"]).typed.unwrap()).unwrap();
    assert_eq!(t.data_type(), &DataType::Float64);
    let t = t.as_primitive::<Float64Type>();
    assert_eq!(t.value(0), 1.5);
    assert_eq!(t.value(1), 2.0);
    assert!(t.value(2).is_nan());
    assert!(typed(&["t"]).json.is_none());
    // n: ints typed, the string in the json sibling
    let n = typed(&["n"]);
    let ints = c
        .column(n.typed.unwrap())
        .unwrap()
        .as_primitive::<Int64Type>();
    assert_eq!(
        (ints.value(0), ints.is_null(1), ints.value(2)),
        (1, true, 3)
    );
    let json = c.column(n.json.unwrap()).unwrap().as_string::<i32>();
    assert_eq!(json.value(1), "\"two\"");
    assert!(json.is_null(0));
    // dictionary strings, first-seen order
    let s = c.column(typed(&["s"]).typed.unwrap()).unwrap();
    let d = s.as_dictionary::<arrow_array::types::Int32Type>();
    assert_eq!(d.values().len(), 2);
    // nested paths, through $dict too
    let lr = c
        .column(typed(&["p", "lr"]).typed.unwrap())
        .unwrap()
        .as_primitive::<Float64Type>();
    assert_eq!((lr.value(0), lr.is_null(1), lr.value(2)), (0.1, true, 0.2));
    // a list is json only
    assert!(typed(&["l"]).typed.is_none());
    assert_eq!(
        c.column(typed(&["l"]).json.unwrap())
            .unwrap()
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
    assert!(c.live().unwrap().value(0) && !c.live().unwrap().value(1));
    let at = c
        .column(c.paths[&vec!["at".to_string()]].typed.unwrap())
        .unwrap();
    assert_eq!(
        at.data_type(),
        &DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some(UTC.into()))
    );
    let at = at.as_primitive::<arrow_array::types::TimestampMicrosecondType>();
    // 11:30 UTC
    assert_eq!(at.value(0), 1_709_292_600_000_000);
    let d = c
        .column(c.paths[&vec!["d".to_string()]].typed.unwrap())
        .unwrap();
    assert_eq!(
        d.data_type(),
        &DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, None)
    );
    let facts = &c.facts["x"];
    let nbytes = c.column(facts[&FactName::Nbytes]).unwrap();
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
    assert_eq!(back.batch().unwrap(), c.batch().unwrap());
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
    for cut in [0, 8, 20, bytes.len() / 3, bytes.len() - 11] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        // the checksum of the cut file, so that the layout checks are reached
        let cut_info = ColumnsInfo {
            file: info.file.clone(),
            bytes: cut as u64,
            checksum: xxhash_rust::xxh3::xxh3_64(&bytes[..cut]),
            footer: None,
            columns: Vec::new(),
        };
        assert!(Columns::open(&path, &cut_info).is_err(), "cut at {cut}");
    }
}

/// Damaged column files (past the checksum, as a crafted file would be)
/// are refused with an error, never a panic out of `open`.
#[test]
fn damaged_bytes_are_errors() {
    let c = build(&[
        json!({"t": 1.5, "s": "Si", "n": 3, "b": true}),
        json!({"t": 2.5, "s": "Ge", "x": [1], "d": {"$datetime": "2024-03-01T00:00:00"}}),
    ]);
    let dir = tempfile::tempdir().unwrap();
    c.write(dir.path(), "r.arrow").unwrap();
    let good = std::fs::read(dir.path().join("r.arrow")).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut refused = 0;
    for _ in 0..2000 {
        let mut bytes = good.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = next() as u8;
        }
        let buffer = arrow_buffer::Buffer::from_vec(bytes);
        let outcome = std::panic::catch_unwind(|| Columns::decode_caught(&buffer).map(|c| c.len()));
        match outcome {
            Ok(Err(_)) | Ok(Ok(1..)) => refused += 1,
            Ok(Ok(0)) => {}
            Err(_) => panic!("a panic escaped decode_caught"),
        }
    }
    assert!(refused > 100, "{refused}");
}

/// A dictionary code past its dictionary, or negative, is refused as
/// corrupt (whatever the checksums: a file written so); a code in a null
/// row is never read and passes, as Arrow's own check lets it.
#[test]
fn a_dictionary_code_out_of_range_is_corrupt() {
    use arrow_array::types::Int32Type;
    let c = build(&[
        json!({"s": "Si"}),
        json!({"s": "Ge"}),
        json!({"t": 1}),
        json!({"s": "Si"}),
    ]);
    let s = c.paths[&vec!["s".to_string()]].typed.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let info = c.write(dir.path(), "r.arrow").unwrap();
    let path = dir.path().join("r.arrow");
    let good = std::fs::read(&path).unwrap();
    // Where the codes of column `s` lie in the file.
    let buffer = arrow_buffer::Buffer::from_vec(good.clone());
    let decoded = Columns::decode(&buffer).unwrap();
    let column = decoded.column(s).unwrap().as_dictionary::<Int32Type>();
    assert_eq!(column.values().len(), 2);
    assert!(column.is_null(2));
    let codes = column.keys().values().as_ptr() as usize - buffer.as_ptr() as usize;
    // Open without the per-column checksums, so that the code check
    // itself is what refuses.
    let unchecked = ColumnsInfo {
        footer: None,
        columns: Vec::new(),
        ..info.clone()
    };
    for (row, code, refused) in [
        (1, 2, true),
        (3, -1, true),
        (0, i32::MAX, true),
        (2, 9, false),
        (1, 0, false),
    ] {
        let mut bytes = good.clone();
        bytes[codes + 4 * row..codes + 4 * row + 4].copy_from_slice(&code.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let opened = Columns::open(&path, &unchecked).unwrap();
        let why = opened
            .source
            .as_ref()
            .unwrap()
            .decode_column(opened.schema(), s)
            .err();
        let batch = opened.batch();
        if refused {
            let why = why.unwrap_or_else(|| panic!("code {code} in row {row} passed"));
            assert!(why.contains("dictionary code"), "{why}");
            match batch {
                Err(Error::Corrupt(e)) => assert!(e.to_string().contains("cannot be read"), "{e}"),
                other => panic!("code {code} in row {row}: {other:?}"),
            }
            assert!(read_file_bytes(&bytes).is_err());
        } else {
            assert_eq!(why, None, "code {code} in row {row}");
            let batch = batch.unwrap();
            let got = batch.column(s).as_dictionary::<Int32Type>();
            assert_eq!(got.keys().value(row), code);
            assert_eq!(read_file_bytes(&bytes), Ok(4));
        }
    }
}

/// The columns a query reads are decoded together, before it runs, and
/// checked as at first use; the others stay undecoded.
#[test]
fn a_query_decodes_the_columns_it_reads_together() {
    let c = build(&[
        json!({"t": 1.5, "s": "Si", "n": 1, "p": {"a": 1, "b": "x"}}),
        json!({"t": 2.5, "s": "Ge", "n": 2, "p": {"a": 2}}),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let info = c.write(dir.path(), "r.arrow").unwrap();
    let opened = Columns::open(&dir.path().join("r.arrow"), &info).unwrap();
    let typed = |p: &[&str]| {
        let p: Vec<String> = p.iter().map(|s| s.to_string()).collect();
        opened.paths[&p].typed.unwrap()
    };
    let query = crate::query::Query::parse("t > 2 and s == 'Si' or exists(p)").unwrap();
    let mut read = query.columns_read(&opened);
    read.sort_unstable();
    let mut expected = vec![
        typed(&["t"]),
        typed(&["s"]),
        typed(&["p", "a"]),
        typed(&["p", "b"]),
    ];
    expected.sort_unstable();
    assert_eq!(read, expected);
    opened.prefetch(&read);
    for (i, cell) in opened.cells.iter().enumerate() {
        assert_eq!(cell.get().is_some(), read.contains(&i), "column {i}");
        if let Some(decoded) = cell.get() {
            assert!(decoded.is_some(), "column {i} failed its checks");
        }
    }
    // A damaged column is refused by the prefetch as at first use.
    let damaged = ColumnsInfo {
        columns: info.columns.iter().map(|c| c ^ 1).collect(),
        ..info.clone()
    };
    let opened = Columns::open(&dir.path().join("r.arrow"), &damaged).unwrap();
    opened.prefetch(&read);
    for &i in &read {
        assert_eq!(opened.cells[i].get(), Some(&None), "column {i}");
    }
}

#[test]
#[ignore = "timing probe: LV_COLUMNS_FILE=<path> cargo test --release -- --ignored probe"]
fn probe_open_phases() {
    let Ok(path) = std::env::var("LV_COLUMNS_FILE") else {
        return;
    };
    let bytes = std::fs::read(&path).unwrap();
    let t = std::time::Instant::now();
    let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
    eprintln!("xxh3 {:?}", t.elapsed());
    let buffer = arrow_buffer::Buffer::from_vec(bytes);
    let t = std::time::Instant::now();
    let c = Columns::decode(&buffer).unwrap();
    eprintln!("open {:?} ({} rows, {sum})", t.elapsed(), c.len());
    for i in 0..c.schema().fields().len() {
        let t = std::time::Instant::now();
        assert!(c.column(i).is_some());
        eprintln!("column {i} {:?}", t.elapsed());
    }
}

#[test]
#[ignore = "timing probe: cargo test --release -- --ignored probe_build"]
fn probe_build() {
    let mats = ["Si", "Ge", "GaAs", "InP", "C"];
    let recs: Vec<Vec<u8>> = (0..300_000)
        .map(|i| {
            serde_json::to_vec(&json!({"meta": {"temperature": ((i * 7919) % 500) as f64, "material": mats[i % 5], "step": i, "ok": i % 3 == 0, "pressure": (i % 97) as f64 * 1.5},
                "arrays": {}, "layout": {"dict": {"temperature": {"meta": "temperature"}, "material": {"meta": "material"}, "step": {"meta": "step"}, "ok": {"meta": "ok"}, "pressure": {"meta": "pressure"}}}}))
            .unwrap()
        })
        .collect();
    let keys: Vec<String> = (0..recs.len()).map(|i| format!("run-{i:07}")).collect();
    let t = std::time::Instant::now();
    let c = Columns::build(
        keys.iter()
            .map(String::as_str)
            .zip(recs.iter().map(|r| Some(r.as_slice()))),
    )
    .unwrap();
    eprintln!("build {:?} for {} rows", t.elapsed(), c.len());
    let dir = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    c.write(dir.path(), "x.arrow").unwrap();
    eprintln!("write {:?}", t.elapsed());
}

#[test]
#[ignore = "timing probe: LV_COLUMNS_FILE=<path> cargo test --release -- --ignored probe_first_use"]
fn probe_first_use() {
    let Ok(path) = std::env::var("LV_COLUMNS_FILE") else {
        return;
    };
    let path = std::path::PathBuf::from(path);
    let info = ColumnsInfo {
        file: String::new(),
        bytes: std::fs::metadata(&path).unwrap().len(),
        checksum: 0,
        footer: None,
        columns: Vec::new(),
    };
    let names = ["temperature", "material"];
    for _ in 0..5 {
        let c = Columns::open(&path, &info).unwrap();
        let mut line = String::new();
        for name in names {
            let i = c.paths[&vec![name.to_string()]].typed.unwrap();
            let t = std::time::Instant::now();
            let a = c.column(i).unwrap();
            let decode = t.elapsed();
            let t = std::time::Instant::now();
            let sum = file::column_checksum(a.as_ref());
            let hash = t.elapsed();
            let t = std::time::Instant::now();
            let sum2 = file::column_checksum(a.as_ref());
            let hash2 = t.elapsed();
            assert_eq!(sum, sum2);
            line += &format!("{name}: decode {decode:?} hash {hash:?} again {hash2:?}; ");
        }
        eprintln!("{line}");
    }
}
