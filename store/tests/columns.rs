//! Queries over column files agree with queries over records: random
//! sequences of puts (fields whose types change from record to record,
//! nested objects, lists, tagged values), deletes, flushes and reopenings
//! (each closing writes a checkpoint run with its column file, merged by
//! level), then `find`, `count` and `keys` of many queries, from the writer
//! with unflushed changes and from a reader, against the records' own
//! evaluation (`Query::matches`).

#[path = "common/records.rs"]
mod records;

use std::collections::BTreeMap;

use lazyvault_store::query::{ArrayFacts, Map, Query, RecordView};
use lazyvault_store::{Mode, Store};
use proptest::prelude::*;
use records::meta;
use serde_json::{json, Value};

const KEYS: usize = 40;

/// What the test knows of a record: its metadata.
struct Rec<'a> {
    key: &'a str,
    meta: &'a Map<String, Value>,
}

impl RecordView for Rec<'_> {
    fn key(&self) -> &str {
        self.key
    }
    fn meta(&self) -> &Map<String, Value> {
        self.meta
    }
    fn array(&self, _name: &str) -> Option<ArrayFacts<'_>> {
        None
    }
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (0i64..400).prop_map(Value::from),
        3 => (0i64..400).prop_map(|i| Value::from(i as f64 + 0.5)),
        3 => prop::sample::select(vec!["Si", "Ge", "GaAs", ""]).prop_map(Value::from),
        1 => any::<bool>().prop_map(Value::from),
        1 => Just(Value::Null),
        1 => Just(json!([1, "Si"])),
        1 => Just(json!({"$float": "nan"})),
        1 => Just(json!({"$datetime": "2024-03-01T12:00:00+01:00"})),
        1 => Just(json!({"$datetime": "2024-03-01T12:00:00"})),
        1 => (0i64..5).prop_map(|i| json!({"lr": i, "name": "adam"})),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Put(usize, Vec<Option<Value>>),
    Delete(usize),
    Flush,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..KEYS, prop::collection::vec(prop::option::of(value()), 3))
            .prop_map(|(k, v)| Op::Put(k, v)),
        2 => (0..KEYS).prop_map(Op::Delete),
        1 => Just(Op::Flush),
        2 => Just(Op::Reopen),
    ]
}

const QUERIES: &[&str] = &[
    "temperature > 250",
    "temperature > 250 and material == 'Si'",
    "temperature <= 100.5 or material in ['Ge', 'GaAs']",
    "not (material == 'Si')",
    "exists(temperature)",
    "material.startswith('G')",
    "temperature == material",
    "params.lr >= 2",
    "params.name == 'adam'",
    "material[0] == 1",
    "isnan(temperature)",
    "temperature > '2024-03-01T10:00:00Z'",
    "material != 'Si' and not exists(params)",
    "key >= 'k020'",
];

const FIELDS: [&str; 3] = ["temperature", "material", "params"];

fn check(store: &Store, oracle: &BTreeMap<String, Map<String, Value>>) {
    for src in QUERIES {
        let q = Query::parse(src).unwrap();
        let expected: Vec<String> = oracle
            .iter()
            .filter(|(k, m)| q.matches(&Rec { key: k, meta: m }))
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(store.find(&q).unwrap(), expected, "find {src}");
        assert_eq!(
            store.count(&q).unwrap(),
            expected.len() as u64,
            "count {src}"
        );
        let mut keys = Vec::new();
        store
            .scan_matching(Some(&q), |k| {
                keys.push(k.to_owned());
                Ok(())
            })
            .unwrap();
        assert_eq!(keys, expected, "scan_matching {src}");
        // The table of the query, of the keys find left packed (read from
        // the columns in place where they can be), and of the same keys
        // given as text: one table.
        let found = store.find_keys(&q).unwrap();
        assert_eq!(found.to_vec(), expected, "find_keys {src}");
        let of_query = table(store.to_arrow(Some(&q)).unwrap());
        let of_keys = table(store.to_arrow_of_keys(&found).unwrap());
        let looked_up = table(
            store
                .to_arrow_keys(expected.iter().map(String::as_str))
                .unwrap(),
        );
        assert_eq!(of_keys, of_query, "to_arrow_of_keys {src}");
        assert_eq!(looked_up, of_query, "to_arrow_keys {src}");
        // In another order, a key twice, a key not held: the rows taken so.
        let mut shuffled: Vec<&str> = expected.iter().rev().map(String::as_str).collect();
        shuffled.extend(expected.first().map(String::as_str));
        shuffled.push("absent");
        let rows: Vec<u32> = (0..expected.len() as u32)
            .rev()
            .chain((!expected.is_empty()).then_some(0))
            .collect();
        let taken =
            arrow_select::take::take_record_batch(&of_query, &arrow_array::UInt32Array::from(rows))
                .unwrap();
        assert_eq!(
            table(store.to_arrow_keys(shuffled).unwrap()),
            taken,
            "order {src}"
        );
    }
}

/// Seconds since the epoch of an aware `$datetime` text
/// (`YYYY-MM-DDTHH:MM:SS±HH:MM`, whole seconds, as this test writes them).
fn instant(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 25 || b[10] != b'T' || !matches!(b[19], b'+' | b'-') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let secs = num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?;
    let offset = (num(20..22)? * 3600 + num(23..25)? * 60) * if b[19] == b'-' { -1 } else { 1 };
    // days from the civil date (proleptic Gregorian), 1970-01-01 = 0
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(days * 86_400 + secs - offset)
}

/// `v` with every number as an f64 and every aware datetime as its
/// instant: JSON text renders a number held in a Float64 column (ints
/// among floats) as `31.0` where its record has `31`, and an aware
/// datetime held in a timestamp column in UTC: the same values.
fn numbers_as_floats(v: Value) -> Value {
    match v {
        Value::Object(map) if map.len() == 1 => {
            match map
                .get("$datetime")
                .and_then(Value::as_str)
                .and_then(instant)
            {
                Some(secs) => serde_json::json!({ "$instant": secs }),
                None => Value::Object(
                    map.into_iter()
                        .map(|(k, v)| (k, numbers_as_floats(v)))
                        .collect(),
                ),
            }
        }
        Value::Number(n) => n.as_f64().map_or(Value::Number(n), Value::from),
        Value::Array(items) => Value::Array(items.into_iter().map(numbers_as_floats).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, numbers_as_floats(v)))
                .collect(),
        ),
        other => other,
    }
}

/// A table's columns by name: each one's type and values as text (the
/// order of columns and a dictionary's encoding left out; JSON text as the
/// value it reads as, numbers as f64).
fn logical(
    batch: &arrow_array::RecordBatch,
) -> BTreeMap<String, (arrow_schema::DataType, Vec<String>)> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use arrow_array::Array;
    let schema = batch.schema();
    schema
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(field, column)| {
            let values = (0..column.len())
                .map(|r| match column.data_type() {
                    _ if column.is_null(r) => "null".to_owned(),
                    arrow_schema::DataType::Utf8
                        if field.metadata().contains_key("lazyvault.json") =>
                    {
                        let text = column.as_string::<i32>().value(r);
                        numbers_as_floats(serde_json::from_str(text).unwrap()).to_string()
                    }
                    arrow_schema::DataType::Dictionary(..) => {
                        let dict = column.as_dictionary::<Int32Type>();
                        let text = dict.values().as_string::<i32>();
                        text.value(dict.keys().value(r) as usize).to_owned()
                    }
                    arrow_schema::DataType::Int64 => {
                        let ints = column.as_primitive::<arrow_array::types::Int64Type>();
                        format!("{:?}", ints.value(r) as f64)
                    }
                    arrow_schema::DataType::Float64 => {
                        let floats = column.as_primitive::<arrow_array::types::Float64Type>();
                        format!("{:?}", floats.value(r))
                    }
                    _ => format!("{:?}", column.slice(r, 1)),
                })
                .collect();
            // ints held beside floats come as Float64 (see numbers_as_floats)
            let data_type = match field.data_type() {
                arrow_schema::DataType::Int64 => arrow_schema::DataType::Float64,
                t => t.clone(),
            };
            (field.name().clone(), (data_type, values))
        })
        .collect()
}

/// One batch of a table.
fn table(
    (schema, batches): (arrow_schema::SchemaRef, Vec<arrow_array::RecordBatch>),
) -> arrow_array::RecordBatch {
    arrow_select::concat::concat_batches(&schema, &batches).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn columnar_queries_agree_with_records(ops in prop::collection::vec(op(), 1..120)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.lv");
        let mut store = Store::open(&path, Mode::Append).unwrap();
        let mut oracle: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Put(k, values) => {
                    let key = format!("k{k:03}");
                    let mut m = serde_json::Map::new();
                    for (name, v) in FIELDS.iter().zip(values) {
                        if let Some(v) = v {
                            m.insert((*name).to_owned(), v);
                        }
                    }
                    store.put(&key, m.clone(), Value::Null, &[], None).unwrap();
                    oracle.insert(key, m);
                }
                Op::Delete(k) => {
                    let key = format!("k{k:03}");
                    store.delete(&key).unwrap();
                    oracle.remove(&key);
                }
                Op::Flush => store.flush().unwrap(),
                Op::Reopen => {
                    store.close().unwrap();
                    store = Store::open(&path, Mode::Append).unwrap();
                }
            }
        }
        // The writer, with its unflushed changes.
        check(&store, &oracle);
        let tables: Vec<_> = QUERIES
            .iter()
            .map(|src| logical(&table(store.to_arrow(Some(&Query::parse(src).unwrap())).unwrap())))
            .collect();
        store.flush().unwrap();
        let reader = Store::open(&path, Mode::ReadOnly).unwrap();
        check(&reader, &oracle);
        store.close().unwrap();
        // After the closing checkpoint every record is in a column file.
        let reader = Store::open(&path, Mode::ReadOnly).unwrap();
        check(&reader, &oracle);
        // The same records give the same table, whichever runs and changes
        // they were read from (one run now; runs and changes before).
        for (src, before) in QUERIES.iter().zip(&tables) {
            let q = Query::parse(src).unwrap();
            let after = logical(&table(reader.to_arrow(Some(&q)).unwrap()));
            prop_assert_eq!(&after, before, "to_arrow {}", src);
        }
        let plan = reader.explain(&Query::parse("temperature > 1").unwrap()).unwrap();
        prop_assert!(plan.contains("column file"), "{}", plan);
    }
}

#[test]
fn explain_says_what_the_columns_answer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    for i in 0..10 {
        let m = if i % 3 == 0 {
            meta(json!({"t": i, "tags": ["a", "b"], "m": "Si"}))
        } else {
            meta(json!({"t": i as f64 + 0.5, "tags": "a", "m": "Ge"}))
        };
        store
            .put(&format!("r{i}"), m, Value::Null, &[], None)
            .unwrap();
    }
    store.close().unwrap();
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    let plan = |s: &str| reader.explain(&Query::parse(s).unwrap()).unwrap();
    let simple = plan("t > 3 and m == 'Si'");
    assert!(
        simple.starts_with("full scan of 10 records (no secondary index): 10 rows of 1 column file(s), every condition answered by the columns"),
        "{simple}"
    );
    let listy = plan("tags[0] == 'a'");
    assert!(
        listy.contains("the records deciding the rows where tags[0] indexes into lists"),
        "{listy}"
    );
    assert_eq!(
        reader
            .count(&Query::parse("tags[0] == 'a'").unwrap())
            .unwrap(),
        4
    );
    assert_eq!(
        reader
            .count(&Query::parse("t > 3 and m == 'Ge'").unwrap())
            .unwrap(),
        4
    );
}

#[test]
fn a_damaged_column_file_is_reported_and_queries_read_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    for i in 0..50 {
        let m = meta(json!({"t": i, "m": if i % 2 == 0 { "Si" } else { "Ge" }}));
        store
            .put(&format!("r{i:02}"), m, Value::Null, &[], None)
            .unwrap();
    }
    store.close().unwrap();
    let files: Vec<_> = std::fs::read_dir(path.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "arrow"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x55;
    std::fs::write(&files[0], &bytes).unwrap();
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    let q = Query::parse("t >= 10 and m == 'Si'").unwrap();
    assert_eq!(reader.count(&q).unwrap(), 20);
    assert_eq!(reader.find(&q).unwrap().len(), 20);
    let report = reader.verify().unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("column file") && p.contains("checksum")),
        "{:?}",
        report.problems
    );
    // Removed altogether: the same answers.
    std::fs::remove_file(&files[0]).unwrap();
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(reader.count(&q).unwrap(), 20);
}

/// A fresh user's trial: one flipped byte in a column file (same length)
/// changed answers (`t > 1000` counted 1000 of 999). Every byte position
/// (sampled) now leaves every answer right: the footer and each column
/// are checked against the checkpoint's checksums, and a damaged column
/// leaves its conditions to the records.
#[test]
fn a_flipped_byte_in_a_column_file_never_changes_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    for i in 0..400 {
        let material = ["Si", "Ge", "C"][i % 3];
        let m = meta(json!({
            "t": i as f64,
            "n": i,
            "m": material,
            "ok": i % 2 == 0,
            "p": {"lr": i % 5},
            "tags": if i % 7 == 0 { json!(["a"]) } else { json!("b") },
        }));
        store
            .put(&format!("r{i:04}"), m, Value::Null, &[], None)
            .unwrap();
    }
    store.close().unwrap();
    let queries = [
        "t > 100 and m == 'Si'",
        "n <= 50 or ok == false",
        "p.lr == 3",
        "not exists(tags) or tags == 'b'",
        "key >= 'r0300'",
    ];
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    let expected: Vec<Vec<String>> = queries
        .iter()
        .map(|q| reader.find(&Query::parse(q).unwrap()).unwrap())
        .collect();
    drop(reader);
    let file = std::fs::read_dir(path.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "arrow"))
        .unwrap();
    let good = std::fs::read(&file).unwrap();
    for at in (0..good.len()).step_by(37) {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        std::fs::write(&file, &bad).unwrap();
        let reader = Store::open(&path, Mode::ReadOnly).unwrap();
        for (q, want) in queries.iter().zip(&expected) {
            let q = Query::parse(q).unwrap();
            assert_eq!(&reader.find(&q).unwrap(), want, "byte {at} flipped: {q}");
            assert_eq!(
                reader.count(&q).unwrap(),
                want.len() as u64,
                "byte {at}: {q}"
            );
        }
    }
    std::fs::write(&file, &good).unwrap();
}
