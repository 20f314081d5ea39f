//! Full scans (`find`, `count`) split over two threads give the answers,
//! in key order, of a sequential scan.

use lazyvault_store::query::Query;
use lazyvault_store::{Mode, Store};
use serde_json::{json, Map, Value};

fn meta(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("object")
}

#[test]
fn split_scans_answer_in_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let mut keys: Vec<String> = (0..300).map(|i| format!("run-{i:04}")).collect();
    keys.extend(["", "a", "🦀", "🦀/1", "z\u{7f}", "Z", "run-", "run-0150x"].map(String::from));
    keys.retain(|k| !k.is_empty());
    for (i, key) in keys.iter().enumerate() {
        let m = json!({"i": i, "even": i % 2 == 0, "note": "x\"}]{[".repeat(i % 5)});
        store.put(key, meta(m), Value::Null, &[], None).unwrap();
    }
    keys.sort();
    let all = Query::parse("exists(i)").unwrap();
    assert_eq!(store.find(&all).unwrap(), keys);
    let even = Query::parse("even == true and i >= 10").unwrap();
    let want: Vec<String> = keys
        .iter()
        .filter(|k| {
            let rec = store.get(k).unwrap().unwrap();
            rec.meta["even"] == json!(true) && rec.meta["i"].as_u64().unwrap() >= 10
        })
        .cloned()
        .collect();
    assert!(want.len() > 100);
    assert_eq!(store.find(&even).unwrap(), want);
    assert_eq!(store.count(&even).unwrap(), want.len() as u64);
    let mut sequential = Vec::new();
    store
        .scan_matching(Some(&even), |k| {
            sequential.push(k.to_owned());
            Ok(())
        })
        .unwrap();
    assert_eq!(sequential, want);
    // A single record, and none.
    let one = Query::parse("i == 3").unwrap();
    assert_eq!(store.find(&one).unwrap().len(), 1);
    let none = Query::parse("i < 0").unwrap();
    assert!(store.find(&none).unwrap().is_empty());
    assert_eq!(store.count(&none).unwrap(), 0);
}

#[test]
fn split_scans_of_tiny_stores() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("t.lv"), Mode::Append).unwrap();
    let q = Query::parse("i >= 0").unwrap();
    assert!(store.find(&q).unwrap().is_empty());
    store
        .put("b", meta(json!({"i": 1})), Value::Null, &[], None)
        .unwrap();
    assert_eq!(store.find(&q).unwrap(), ["b"]);
    store
        .put("a", meta(json!({"i": 0})), Value::Null, &[], None)
        .unwrap();
    assert_eq!(store.find(&q).unwrap(), ["a", "b"]);
    assert_eq!(store.count(&q).unwrap(), 2);
}
