//! Tagged metadata values (FORMAT.md, "Tagged values") through the Store
//! API: queries see them as the values they stand for, and a secondary
//! index answers exactly as a full scan does.

use lazyvault_store::query::Query;
use lazyvault_store::{Mode, Store};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn meta(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("object")
}

/// Records as the Python writer stores them.
fn records() -> Vec<(&'static str, Value)> {
    vec![
        (
            "jan",
            json!({"when": {"$datetime": "2024-01-15T08:00:00"}, "x": 1.5, "t": {"$tuple": [1, "a"]}}),
        ),
        (
            "feb-end",
            json!({"when": {"$datetime": "2024-02-29T23:59:59.999999"}, "x": {"$float": "nan"}}),
        ),
        (
            "mar",
            json!({"when": {"$date": "2024-03-01"}, "x": {"$float": "inf"}, "t": {"$tuple": [2, "b"]}}),
        ),
        (
            "mar-paris",
            json!({
                "when": {"$datetime": "2024-03-01T00:30:00+01:00[Europe/Paris]"},
                "x": {"$int": "123456789012345678901234567890"},
                "d": {"$dict": {"$x": 5}},
            }),
        ),
        (
            "apr-np",
            json!({
                "when": {"$numpy": ["<M8[s]", "2024-04-01T00:00:00"]},
                "x": {"$numpy": ["<f4", 1.5]},
                "d": {"$dict": {"$x": {"$numpy": ["<i8", 7]}}},
            }),
        ),
        (
            "nat",
            json!({"when": {"$numpy": ["<M8[s]", "NaT"]}, "x": {"$int": "-18446744073709551616"}}),
        ),
        ("text", json!({"when": "2024-03-05", "x": "1.5"})),
        ("escaped", json!({"$dict": {"$x": 1}})),
    ]
}

/// (query, keys that match).
const EXPECTED: &[(&str, &[&str])] = &[
    ("when >= '2024-03-01'", &["apr-np", "mar", "text"]),
    ("when < '2024-01-01T00:00:00'", &[]),
    ("when < '2024-03-01'", &["feb-end", "jan", "mar-paris"]),
    (
        "when >= '2024-01-01' and when < '2024-03-01T00:00:00'",
        &["feb-end", "jan", "mar-paris"],
    ),
    ("when == '2024-03-01T00:30:00+01:00'", &["mar-paris"]),
    ("when == '2024-02-29T23:30:00Z'", &["mar-paris"]),
    ("when == '2024-03-01'", &["mar"]),
    ("when in ['2024-03-01', '2024-03-05']", &["mar", "text"]),
    // NaT differs from everything; the string field is compared as a string.
    (
        "when != '2024-03-01'",
        &["apr-np", "feb-end", "jan", "mar-paris", "nat", "text"],
    ),
    ("when > 'a'", &[]),
    ("x == 1.5", &["apr-np", "jan"]),
    ("x != x", &["feb-end"]),
    ("isnan(x)", &["feb-end"]),
    ("isnan(when)", &["nat"]),
    ("x > 1e308", &["mar"]),
    ("x > 18446744073709551615", &["mar", "mar-paris"]),
    ("x < -1e19", &["nat"]),
    // The literal is a float (beyond 64 bits), -2^64 exactly.
    ("x < -18446744073709551615", &[]),
    ("x == -18446744073709551616", &["nat"]),
    (
        "x < 0 or x >= 0",
        &["apr-np", "jan", "mar", "mar-paris", "nat"],
    ),
    // Such literals are floats: 123456789012345677877719597056 here, which
    // the exact $int is above.
    ("x == 123456789012345678901234567890", &[]),
    ("x > 123456789012345678901234567890", &["mar", "mar-paris"]),
    ("t[0] == 2", &["mar"]),
    ("t[-1] == 'a'", &["jan"]),
    ("'b' in t", &["mar"]),
    ("t == [1, 'a']", &["jan"]),
    ("d['$x'] == 5", &["mar-paris"]),
    ("d['$x'] >= 5", &["apr-np", "mar-paris"]),
    ("meta['$x'] == 1", &["escaped"]),
    ("exists(meta['$dict'])", &[]),
];

fn check_expected(store: &Store) {
    for (src, want) in EXPECTED {
        let q = Query::parse(src).unwrap();
        assert_eq!(
            store.find(&q).unwrap(),
            *want,
            "{src}: {}",
            store.explain(&q).unwrap()
        );
        assert_eq!(store.count(&q).unwrap(), want.len() as u64, "{src}");
    }
}

#[test]
fn queries_see_what_tagged_values_stand_for() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    for (key, m) in records() {
        store.put(key, meta(m), Value::Null, &[], None).unwrap();
    }
    let count = |src: &str| store.count(&Query::parse(src).unwrap()).unwrap();
    assert_eq!(count("when >= '2024-03-01'"), 3);
    assert_eq!(count("x == x"), 6);
    check_expected(&store);
    // The same answers through secondary indexes.
    for field in ["when", "x", "d.$x", "$x"] {
        store.create_index(field).unwrap();
    }
    let explain = |src: &str| store.explain(&Query::parse(src).unwrap()).unwrap();
    assert!(
        explain("when >= '2024-03-01'").starts_with("index when: >= \"2024-03-01\", 3 candidate")
    );
    assert!(explain("x == 1.5").starts_with("index x: equal to one of [1.5], 2 candidate"));
    assert!(explain("d['$x'] >= 5").starts_with("index d.$x: >= 5, 2 candidate"));
    assert!(explain("meta['$x'] == 1").starts_with("index $x: equal to one of [1], 1 candidate"));
    check_expected(&store);
    // Overwrites and deletes keep the index right.
    store
        .put(
            "mar",
            meta(json!({"when": {"$datetime": "2023-03-01T00:00:00Z"}})),
            Value::Null,
            &[],
            None,
        )
        .unwrap();
    store.delete("text").unwrap();
    assert_eq!(
        store
            .find(&Query::parse("when >= '2024-03-01'").unwrap())
            .unwrap(),
        ["apr-np"]
    );
    assert_eq!(
        store
            .find(&Query::parse("when < '2023-03-01T00:00:01'").unwrap())
            .unwrap(),
        ["mar"]
    );
}

/// Field values of every kind, tagged ones among them.
fn value_strategy() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        Just(Some(Value::Null)),
        (-3i64..3).prop_map(|i| Some(json!(i))),
        Just(Some(json!(1.5))),
        prop::sample::select(vec!["nan", "inf", "-inf"]).prop_map(|f| Some(json!({ "$float": f }))),
        prop::sample::select(vec!["18446744073709551616", "-18446744073709551617", "2"])
            .prop_map(|i| Some(json!({ "$int": i }))),
        Just(Some(json!({"$numpy": ["<f4", 1.5]}))),
        Just(Some(json!({"$numpy": ["|b1", true]}))),
        Just(Some(json!({"$numpy": ["<M8[s]", "NaT"]}))),
        prop::sample::select(vec![
            "2024-02-29T23:00:00",
            "2024-03-01T00:00:00",
            "2024-03-01T00:30:00+01:00",
            "2024-03-01T00:00:00+00:00[UTC]",
            "2024-03-01T12:00:00-05:30",
        ])
        .prop_map(|s| Some(json!({ "$datetime": s }))),
        prop::sample::select(vec!["2024-02-29", "2024-03-01", "2024-03-02"])
            .prop_map(|s| Some(json!({ "$date": s }))),
        prop::sample::select(vec!["2024-03-01T00", "2024-03-01T12:00:00.5"])
            .prop_map(|s| Some(json!({"$numpy": ["<M8[ms]", s]}))),
        prop::sample::select(vec!["2024-03-01", "2024-03-01T00:00:00Z", "b"])
            .prop_map(|s| Some(json!(s))),
        Just(Some(json!({"$tuple": [1]}))),
        Just(Some(json!({"$dict": {"$y": 1}}))),
    ]
}

const QUERIES: &[&str] = &[
    "t == 1.5",
    "t == 2",
    "t == 18446744073709551616",
    "t > 1e19",
    "t < -1e19",
    "t >= 1.5 and t < 1e308",
    "t == true",
    "t == null",
    "t in [2, 1.5, true]",
    "t == '2024-03-01'",
    "t == '2024-03-01T00:00:00Z'",
    "t == '2024-03-01T00:00:00+01:00'",
    "t in ['2024-03-01', '2024-02-29T23:30:00Z']",
    "t >= '2024-03-01'",
    "t > '2024-03-01'",
    "t < '2024-03-01T00:00:00+00:00[UTC]'",
    "t >= '2024-02-29 23:00' and t <= '2024-03-01T12:00'",
    "t > '2024-03-01' and t < 'c'",
    "t >= 'a'",
    "t > 'a' and t > '2024-03-01'",
    "t > '2024-03-01' and t > '2024-03-01T00:00:00-05:00'",
    "t < '2024-03-02' and t < '2024-03-01T06:00:00+06:00'",
    "t != t",
    "p.q == 1.5",
    "p.q >= '2024-03-01'",
    "p.q < 0",
    "p['$y'] == 1",
];

fn record_meta(t: &Option<Value>, q: &Option<Value>) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(t) = t {
        m.insert("t".into(), t.clone());
    }
    if let Some(q) = q {
        m.insert("p".into(), json!({ "$dict": { "$y": 0, "q": q } }));
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn indexed_queries_on_tagged_values_answer_as_a_full_scan_does(
        ops in prop::collection::vec((0u8..10, value_strategy(), value_strategy(), any::<bool>()), 1..30)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let indexed = Store::open(dir.path().join("indexed.lv"), Mode::Append).unwrap();
        let plain = Store::open(dir.path().join("plain.lv"), Mode::Append).unwrap();
        for field in ["t", "p.q", "p.$y"] {
            indexed.create_index(field).unwrap();
        }
        for (k, t, q, delete) in ops {
            let key = format!("k{k}");
            for s in [&indexed, &plain] {
                if delete {
                    s.delete(&key).unwrap();
                } else {
                    s.put(&key, record_meta(&t, &q), Value::Null, &[], None).unwrap();
                }
            }
            for src in QUERIES {
                let query = Query::parse(src).unwrap();
                prop_assert_eq!(
                    indexed.find(&query).unwrap(),
                    plain.find(&query).unwrap(),
                    "{}: {}", src, indexed.explain(&query).unwrap()
                );
            }
        }
    }
}
