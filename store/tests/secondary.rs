//! Secondary indexes: queries that use one give exactly the answers of a
//! full scan, through puts, overwrites, deletes, reopen and repair.

use std::fs;

use lazyvault_store::query::Query;
use lazyvault_store::{Error, Mode, Store, UsageError, INDEX_DIR};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Values of every kind, including ones that share an f64 (2^53 + 1) and
/// the two zeros.
fn value_strategy() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        Just(Some(Value::Null)),
        any::<bool>().prop_map(|b| Some(json!(b))),
        (-5i64..5).prop_map(|i| Some(json!(i))),
        (-5.0f64..5.0).prop_map(|f| Some(json!((f * 4.0).round() / 4.0))),
        Just(Some(json!(9_007_199_254_740_993u64))),
        Just(Some(json!(9_007_199_254_740_992u64))),
        Just(Some(json!(-0.0))),
        "[a-c\u{0}é]{0,3}".prop_map(|s| Some(json!(s))),
        Just(Some(json!([1, 2]))),
        Just(Some(json!({"x": 1}))),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, Option<Value>, Option<Value>),
    Delete(u8),
    Reopen,
    Repair,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..12, value_strategy(), value_strategy()).prop_map(|(k, a, b)| Op::Put(k, a, b)),
        2 => (0u8..12).prop_map(Op::Delete),
        1 => Just(Op::Reopen),
        1 => Just(Op::Repair),
    ]
}

const QUERIES: &[&str] = &[
    "t == 1",
    "t == 1.0",
    "t == -0.0",
    "t == 0",
    "t == null",
    "t == true",
    "t == 'a'",
    "t == 'a\\u0000'",
    "t in [1, 'b', null, false]",
    "t in []",
    "t > 0",
    "t >= 1.5 and t < 4",
    "t <= -1",
    "t > 'a'",
    "t >= 'b' and t <= 'c'",
    "t < 'é'",
    "t > 9007199254740992",
    "t >= 9007199254740993",
    "t == 9007199254740993",
    "t > 1 and t > 'a'",
    "2 < t",
    "p.q == 1",
    "p.q >= 0 and not p.q == 2",
    "p.q in [1, 2, 'a']",
    "t == 1 and p.q == 1",
    "t == 1 or p.q == 1",
    "t != 1",
    "t == [1, 2]",
    "exists(t)",
];

fn record_meta(t: &Option<Value>, q: &Option<Value>) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(t) = t {
        m.insert("t".into(), t.clone());
    }
    if let Some(q) = q {
        m.insert("p".into(), json!({ "q": q }));
    }
    m
}

fn check(indexed: &Store, plain: &Store) {
    for text in QUERIES {
        let q = Query::parse(text).unwrap();
        assert_eq!(
            indexed.find(&q).unwrap(),
            plain.find(&q).unwrap(),
            "{text}: {}",
            indexed.explain(&q).unwrap()
        );
        assert_eq!(
            indexed.count(&q).unwrap(),
            plain.count(&q).unwrap(),
            "{text}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn indexed_queries_answer_as_a_full_scan_does(ops in prop::collection::vec(op_strategy(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let ipath = dir.path().join("indexed.lv");
        let mut indexed = Store::open(&ipath, Mode::Append).unwrap();
        let plain = Store::open(dir.path().join("plain.lv"), Mode::Append).unwrap();
        indexed.create_index("t").unwrap();
        for op in ops {
            match op {
                Op::Put(k, t, q) => {
                    for s in [&indexed, &plain] {
                        s.put(&format!("k{k}"), record_meta(&t, &q), Value::Null, &[], None).unwrap();
                    }
                }
                Op::Delete(k) => {
                    indexed.delete(&format!("k{k}")).unwrap();
                    plain.delete(&format!("k{k}")).unwrap();
                }
                Op::Reopen => {
                    indexed.close().unwrap();
                    indexed = Store::open(&ipath, Mode::Append).unwrap();
                }
                Op::Repair => {
                    indexed.close().unwrap();
                    fs::remove_dir_all(ipath.join(INDEX_DIR)).unwrap();
                    let report = Store::repair(&ipath).unwrap();
                    prop_assert!(report.indexes.contains(&"t".to_owned()));
                    indexed = Store::open(&ipath, Mode::Append).unwrap();
                }
            }
            if indexed.indexes().unwrap().len() == 1 {
                indexed.create_index("p.q").unwrap();
            }
            check(&indexed, &plain);
        }
        prop_assert_eq!(indexed.indexes().unwrap(), ["p.q", "t"]);
    }
}

#[test]
fn explain_names_the_index_and_the_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    for i in 0..100 {
        let meta = json!({"temperature": i, "material": if i % 2 == 0 { "Si" } else { "Ge" }});
        store
            .put(
                &format!("r{i:03}"),
                meta.as_object().unwrap().clone(),
                Value::Null,
                &[],
                None,
            )
            .unwrap();
    }
    let q = |s: &str| Query::parse(s).unwrap();
    let before = store.explain(&q("temperature > 90")).unwrap();
    assert!(
        before.starts_with("full scan of 100 records (no secondary index)"),
        "{before}"
    );
    store.create_index("temperature").unwrap();
    store.create_index("temperature").unwrap(); // idempotent
    assert_eq!(store.indexes().unwrap(), ["temperature"]);
    let plan = store
        .explain(&q("temperature > 90 and material == 'Si'"))
        .unwrap();
    assert_eq!(
        plan,
        "index temperature: > 90, 10 candidate record(s), each checked against the whole query"
    );
    assert_eq!(
        store
            .find(&q("temperature > 90 and material == 'Si'"))
            .unwrap(),
        ["r092", "r094", "r096", "r098"]
    );
    let plan = store.explain(&q("temperature in [3, 5, 500]")).unwrap();
    assert!(
        plan.starts_with("index temperature: equal to one of [3, 5, 500], 2 candidate"),
        "{plan}"
    );
    let plan = store
        .explain(&q("temperature > 90 or material == 'Si'"))
        .unwrap();
    assert!(
        plan.starts_with("full scan of 100 records (no condition"),
        "{plan}"
    );
    assert!(store.drop_index("temperature").unwrap());
    assert!(!store.drop_index("temperature").unwrap());
    assert!(store
        .explain(&q("temperature > 90"))
        .unwrap()
        .starts_with("full scan"));
    assert_eq!(store.count(&q("temperature > 90")).unwrap(), 9);
    for bad in ["", "a..b", ".x"] {
        assert!(
            matches!(
                store.create_index(bad),
                Err(Error::Usage(UsageError::InvalidField(_)))
            ),
            "{bad:?}"
        );
    }
    store.close().unwrap();
    let ro = Store::open(dir.path().join("s.lv"), Mode::ReadOnly).unwrap();
    assert!(matches!(
        ro.create_index("material"),
        Err(Error::Usage(UsageError::ReadOnly))
    ));
}
