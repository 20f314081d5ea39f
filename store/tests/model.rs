//! Model-based test of the store: random sequences of operations (put new or
//! overwrite with 0-3 small arrays and an optional pickle, delete, flush,
//! close and reopen, gc, verify) run against a `Store` and against a
//! `BTreeMap` oracle. After every step the store must agree with the oracle
//! on `len`, `keys`, `contains`, `get`, `get_pickle`, `count` of a few
//! queries and the mapped bytes of every payload; `verify` must find no
//! problem and no orphan, `gc` nothing to remove, and after a flush exactly
//! the live payload files may remain on disk.

use std::collections::BTreeMap;
use std::path::Path;

use lazyvault_store::query::Query;
use lazyvault_store::{map_payload, ArraySource, Mode, Store};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Keys drawn by the operations: few, so that overwrites and deletes of
/// existing keys are common. Any non-empty string is a key.
const KEYS: &[&str] = &["a", "b", "run/1", "run/2", "é ü", "k\n😀"];
/// Array names, in the order a put uses them (rotated per put).
const NAMES: &[&str] = &["x", "frames/0", "params/w"];

/// Element types: (descr as written by numpy, dtype name, itemsize).
const DTYPES: &[(&str, &str, u64)] = &[
    ("'<f8'", "float64", 8),
    ("'|u1'", "uint8", 1),
    ("'>i4'", "int32", 4),
    ("[('a', '<i2'), ('b', '|u1')]", "void24", 3),
];

#[derive(Debug, Clone)]
struct ArraySpec {
    /// Index into [`DTYPES`], or `None` for a pickled `object` array.
    dtype: Option<usize>,
    shape: Vec<u64>,
    fortran_order: bool,
    /// First byte of the data (the rest count up from it).
    fill: u8,
    /// Length of a pickled array's bytes.
    pickle_len: usize,
}

#[derive(Debug, Clone)]
enum Op {
    Put {
        key: usize,
        tag: bool,
        n: i64,
        arrays: Vec<ArraySpec>,
        rotate: usize,
        pickle: Option<Vec<u8>>,
    },
    Delete {
        key: usize,
    },
    Flush,
    Reopen,
    Gc,
    Verify,
}

/// One array as the oracle keeps it.
#[derive(Debug, Clone)]
struct ModelArray {
    name: String,
    descr: String,
    dtype: String,
    shape: Vec<u64>,
    fortran_order: bool,
    pickled: bool,
    data: Vec<u8>,
}

/// One record as the oracle keeps it.
#[derive(Debug, Clone)]
struct ModelRecord {
    meta: Map<String, Value>,
    layout: Value,
    arrays: Vec<ModelArray>,
    pickle: Option<Vec<u8>>,
}

fn array_spec() -> impl Strategy<Value = ArraySpec> {
    (
        prop::option::weighted(0.8, 0..DTYPES.len()),
        prop::collection::vec(0u64..4, 0..=2),
        any::<bool>(),
        any::<u8>(),
        0usize..24,
    )
        .prop_map(
            |(dtype, shape, fortran_order, fill, pickle_len)| ArraySpec {
                dtype,
                shape,
                fortran_order,
                fill,
                pickle_len,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (
            0..KEYS.len(),
            any::<bool>(),
            any::<i64>(),
            prop::collection::vec(array_spec(), 0..=3),
            0..NAMES.len(),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..16)),
        )
            .prop_map(|(key, tag, n, arrays, rotate, pickle)| Op::Put {
                key,
                tag,
                n,
                arrays,
                rotate,
                pickle,
            }),
        2 => (0..KEYS.len()).prop_map(|key| Op::Delete { key }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => Just(Op::Gc),
        1 => Just(Op::Verify),
    ]
}

/// The arrays a put writes, as the oracle keeps them.
fn model_arrays(specs: &[ArraySpec], rotate: usize) -> Vec<ModelArray> {
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let name = NAMES[(i + rotate) % NAMES.len()].to_owned();
            let count: u64 = spec.shape.iter().product();
            let (descr, dtype, len, pickled) = match spec.dtype {
                Some(d) => {
                    let (descr, dtype, itemsize) = DTYPES[d];
                    (descr, dtype, (count * itemsize) as usize, false)
                }
                None => ("'|O'", "object", spec.pickle_len, true),
            };
            let data = (0..len).map(|j| spec.fill.wrapping_add(j as u8)).collect();
            ModelArray {
                name,
                descr: descr.to_owned(),
                dtype: dtype.to_owned(),
                shape: spec.shape.clone(),
                fortran_order: spec.fortran_order,
                pickled,
                data,
            }
        })
        .collect()
}

/// Queries checked after every step, each with its meaning on the oracle.
type Meaning = fn(&str, &ModelRecord) -> bool;

fn queries() -> Vec<(Query, Meaning)> {
    fn array<'a>(r: &'a ModelRecord, name: &str) -> Option<&'a ModelArray> {
        r.arrays.iter().find(|a| a.name == name)
    }
    let meanings: [(&str, Meaning); 8] = [
        ("tag == 'x'", |_, r| r.meta["tag"] == "x"),
        ("n >= 0 and not nested.v[0] < 0", |_, r| {
            r.meta["n"].as_i64().unwrap() >= 0
        }),
        ("exists(x)", |_, r| array(r, "x").is_some()),
        ("x.shape[0] >= 2", |_, r| {
            array(r, "x").is_some_and(|a| a.shape.first().is_some_and(|&d| d >= 2))
        }),
        ("key.startswith('run/') and params.w.ndim != 1", |k, r| {
            k.starts_with("run/") && array(r, "params/w").is_some_and(|a| a.shape.len() != 1)
        }),
        (
            "frames[0].dtype == 'object' or frames[0].dtype in ['<f8', 'uint8']",
            |_, r| {
                array(r, "frames/0").is_some_and(|a| {
                    a.dtype == "object" || a.descr == "'<f8'" || a.dtype == "uint8"
                })
            },
        ),
        ("exists(params.w.shape[1])", |_, r| {
            array(r, "params/w").is_some_and(|a| a.shape.len() >= 2)
        }),
        ("nested.v[1] == key and frames[0].size == 0", |_, r| {
            array(r, "frames/0").is_some_and(|a| a.shape.contains(&0))
        }),
    ];
    meanings
        .into_iter()
        .map(|(text, meaning)| (Query::parse(text).expect(text), meaning))
        .collect()
}

/// Payload files (`arrays/<xx>/<id>.npy`, and temporary files) on disk.
fn payload_files(root: &Path) -> usize {
    let Ok(dirs) = std::fs::read_dir(root.join("arrays")) else {
        return 0;
    };
    dirs.map(|d| std::fs::read_dir(d.unwrap().path()).unwrap().count())
        .sum()
}

/// Everything the store says must agree with the oracle.
fn check(store: &Store, oracle: &BTreeMap<String, ModelRecord>, queries: &[(Query, Meaning)]) {
    assert_eq!(store.len().unwrap(), oracle.len() as u64);
    assert_eq!(store.is_empty().unwrap(), oracle.is_empty());
    let keys: Vec<&String> = oracle.keys().collect();
    assert_eq!(store.keys().unwrap().iter().collect::<Vec<_>>(), keys);
    for key in KEYS {
        let expected = oracle.get(*key);
        assert_eq!(store.contains(key).unwrap(), expected.is_some(), "{key:?}");
        let record = store.get(key).unwrap();
        let pickle = store.get_pickle(key).unwrap();
        let (Some(record), Some(model)) = (record, expected) else {
            assert!(expected.is_none(), "{key:?} is missing");
            assert!(pickle.is_none(), "{key:?} has a pickle but no record");
            continue;
        };
        assert_eq!(record.meta, model.meta, "{key:?}");
        assert_eq!(record.layout, model.layout, "{key:?}");
        assert_eq!(record.pickle, model.pickle.is_some(), "{key:?}");
        assert_eq!(pickle, model.pickle, "{key:?}");
        let names: Vec<&str> = record.arrays.keys().map(String::as_str).collect();
        let model_names: Vec<&str> = model.arrays.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, model_names, "{key:?}");
        for array in &model.arrays {
            let entry = &record.arrays[&array.name];
            let what = format!("{key:?} array {:?}", array.name);
            assert_eq!(entry.descr, array.descr, "{what}");
            assert_eq!(entry.dtype, array.dtype, "{what}");
            assert_eq!(entry.shape, array.shape, "{what}");
            assert_eq!(entry.fortran_order, array.fortran_order, "{what}");
            assert_eq!(entry.pickled, array.pickled, "{what}");
            assert_eq!(entry.nbytes, array.data.len() as u64, "{what}");
            let mapped = map_payload(store.root(), entry).unwrap();
            assert_eq!(mapped.as_bytes(), &array.data[..], "{what}");
        }
    }
    for (query, meaning) in queries {
        let expected: Vec<&String> = oracle
            .iter()
            .filter(|(k, r)| meaning(k, r))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            store.count(query).unwrap(),
            expected.len() as u64,
            "{query}"
        );
        assert_eq!(
            store.find(query).unwrap().iter().collect::<Vec<_>>(),
            expected,
            "{query}"
        );
    }
}

fn live_arrays(oracle: &BTreeMap<String, ModelRecord>) -> usize {
    oracle.values().map(|r| r.arrays.len()).sum()
}

/// The files the store's records use: payload files, and packs (small
/// arrays share them).
fn live_files(store: &Store) -> usize {
    let mut files = std::collections::BTreeSet::new();
    for key in store.keys().unwrap() {
        let record = store.get(&key).unwrap().unwrap();
        files.extend(record.arrays.values().map(|e| e.relpath()));
    }
    files.len()
}

fn run(ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.lv");
    let queries = queries();
    let mut store = Store::open(&path, Mode::Append).unwrap();
    let mut oracle: BTreeMap<String, ModelRecord> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Put {
                key,
                tag,
                n,
                arrays,
                rotate,
                pickle,
            } => {
                let key = KEYS[*key];
                let meta = json!({
                    "tag": if *tag { "x" } else { "y" },
                    "n": n,
                    "nested": {"v": [n, key]},
                });
                let meta = meta.as_object().unwrap().clone();
                let layout = if arrays.is_empty() {
                    Value::Null
                } else {
                    json!({"dict": {"tag": 0, "arrays": arrays.len()}})
                };
                let model = model_arrays(arrays, *rotate);
                let sources: Vec<ArraySource<'_>> = model
                    .iter()
                    .map(|a| ArraySource {
                        name: a.name.clone(),
                        descr: a.descr.clone(),
                        dtype: a.dtype.clone(),
                        shape: a.shape.clone(),
                        fortran_order: a.fortran_order,
                        data: &a.data,
                        pickled: a.pickled,
                    })
                    .collect();
                store
                    .put(
                        key,
                        meta.clone(),
                        layout.clone(),
                        &sources,
                        pickle.as_deref(),
                    )
                    .unwrap();
                oracle.insert(
                    key.to_owned(),
                    ModelRecord {
                        meta,
                        layout,
                        arrays: model,
                        pickle: pickle.clone(),
                    },
                );
            }
            Op::Delete { key } => {
                let key = KEYS[*key];
                assert_eq!(store.delete(key).unwrap(), oracle.remove(key).is_some());
            }
            Op::Flush => {
                store.flush().unwrap();
                // a pack some of whose members died in an earlier session
                // waits for gc
                assert!(payload_files(&path) >= live_files(&store));
                assert!(live_files(&store) <= live_arrays(&oracle));
            }
            Op::Reopen => {
                store.close().unwrap();
                assert!(store.is_closed());
                assert!(store.len().is_err(), "a closed store answers");
                drop(store);
                store = Store::open(&path, Mode::Append).unwrap();
                assert!(payload_files(&path) >= live_files(&store));
            }
            Op::Gc => {
                // gc flushes first: it removes (and counts) the payloads
                // of records replaced since the last flush, nothing else.
                // (and packs no record uses; it rewrites mostly dead ones)
                let before = payload_files(&path);
                let report = store.gc().unwrap();
                assert!(report.removed_files as usize <= before, "{report:?}");
                assert_eq!(payload_files(&path), live_files(&store));
            }
            Op::Verify => {
                let report = store.verify().unwrap();
                assert!(report.is_ok(), "{report:?}");
                assert!(report.orphans.is_empty(), "{report:?}");
                assert_eq!(report.records, oracle.len() as u64);
                assert_eq!(report.arrays, live_arrays(&oracle) as u64);
            }
        }
        check(&store, &oracle, &queries);
    }
    // Whatever happened, a fresh open sees the same store.
    store.close().unwrap();
    drop(store);
    let store = Store::open(&path, Mode::Append).unwrap();
    check(&store, &oracle, &queries);
    let report = store.verify().unwrap();
    // orphans: only packs whose members died across sessions (gc's work)
    let packs_only = report
        .orphans
        .iter()
        .all(|p| p.extension().is_some_and(|e| e == "npz"));
    assert!(report.is_ok() && packs_only, "{report:?}");
    assert_eq!(
        payload_files(&path),
        live_files(&store) + report.orphans.len()
    );
}

proptest! {
    // Every put fsyncs its payloads and every reopen reopens sled: keep the
    // number of cases small (~10 s in a debug build on 2 cores).
    #![proptest_config(ProptestConfig {
        cases: 24,
        max_shrink_iters: 256,
        ..ProptestConfig::default()
    })]

    #[test]
    fn store_agrees_with_a_btreemap(ops in prop::collection::vec(op(), 1..32)) {
        run(&ops);
    }
}

/// A fixed sequence that goes through every operation, so that the model's
/// plumbing is exercised whatever the random cases draw.
#[test]
fn every_operation_once() {
    let spec = |dtype, shape: &[u64]| ArraySpec {
        dtype,
        shape: shape.to_vec(),
        fortran_order: shape.len() == 2,
        fill: 7,
        pickle_len: 5,
    };
    let put = |key, arrays: Vec<ArraySpec>, pickle: Option<&[u8]>| Op::Put {
        key,
        tag: key % 2 == 0,
        n: key as i64 - 2,
        arrays,
        rotate: key,
        pickle: pickle.map(<[u8]>::to_vec),
    };
    run(&[
        put(
            0,
            vec![spec(Some(0), &[2, 3]), spec(None, &[2])],
            Some(b"p"),
        ),
        put(1, vec![], None),
        put(
            2,
            vec![
                spec(Some(3), &[]),
                spec(Some(1), &[0, 3]),
                spec(Some(2), &[3]),
            ],
            None,
        ),
        Op::Verify,
        put(0, vec![spec(Some(1), &[1])], None),
        Op::Delete { key: 1 },
        Op::Delete { key: 1 },
        Op::Verify,
        Op::Flush,
        put(4, vec![spec(Some(0), &[3, 1])], Some(b"")),
        Op::Reopen,
        Op::Delete { key: 2 },
        Op::Gc,
        put(5, vec![spec(None, &[])], None),
        Op::Verify,
    ]);
}
