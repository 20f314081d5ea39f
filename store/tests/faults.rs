//! Fault injection: every file operation of the store (and every index
//! operation) is made to fail in turn, with ENOSPC and EIO. After each
//! failure the call raises an I/O error carrying the errno, the store stays
//! usable, and nothing committed before is lost.
//!
//! The fault plan is process-wide, so the tests here take one lock.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use lazyvault_store::schema::Record;
use lazyvault_store::{fault, map_payload, ArraySource, Error, Mode, Store};
use serde_json::{json, Map, Value};

static SERIAL: Mutex<()> = Mutex::new(());

const ENOSPC: i32 = 28;
const EIO: i32 = 5;

/// What a key holds: (metadata value `v`, payload bytes, pickle).
type Model = BTreeMap<String, (i64, Vec<u8>, Option<Vec<u8>>)>;

fn array(data: &[u8]) -> ArraySource<'_> {
    ArraySource {
        name: "a".into(),
        descr: "'|u1'".into(),
        dtype: "uint8".into(),
        shape: vec![data.len() as u64],
        fortran_order: false,
        data,
        pickled: false,
    }
}

fn put(store: &Store, key: &str, v: i64, data: &[u8], pickle: Option<&[u8]>) -> Result<(), Error> {
    let meta: Map<String, Value> = json!({"v": v}).as_object().cloned().unwrap();
    store.put(key, meta, Value::Null, &[array(data)], pickle)
}

fn state(store: &Store) -> Model {
    let mut out = Model::new();
    for key in store.keys().unwrap() {
        let (json, pickle) = store.get_with_pickle(&key).unwrap().unwrap();
        let record = Record::from_json(&json).unwrap();
        let data = map_payload(store.root(), &record.arrays["a"])
            .unwrap()
            .as_bytes()
            .to_vec();
        out.insert(key, (record.meta["v"].as_i64().unwrap(), data, pickle));
    }
    out
}

/// A fresh store with two committed records.
fn baseline(dir: &Path) -> (Store, Model) {
    let store = Store::open(dir.join("s.lv"), Mode::Append).unwrap();
    put(&store, "keep", 1, &[1; 3000], Some(b"p1")).unwrap();
    put(&store, "target", 2, &[2; 100], None).unwrap();
    store.flush().unwrap();
    let model = state(&store);
    (store, model)
}

/// The operations under test, each on a store holding the baseline.
#[derive(Debug, Clone, Copy)]
enum Op {
    PutNew,
    Overwrite,
    Delete,
    Flush,
    Gc,
    Close,
}

fn run(store: &Store, op: Op) -> Result<(), Error> {
    match op {
        Op::PutNew => put(store, "new", 3, &[3; 5000], Some(b"p3")),
        Op::Overwrite => put(store, "target", 4, &[4; 200], None),
        Op::Delete => store.delete("target").map(drop),
        Op::Flush => {
            put(store, "target", 5, &[5; 10], None)?;
            store.flush()
        }
        Op::Gc => store.gc().map(drop),
        Op::Close => store.close(),
    }
}

/// The states `op` may leave when it fails part-way: the one before it,
/// or the one after it (for the parts that were already done).
fn allowed(op: Op, before: &Model) -> Vec<Model> {
    let mut after = before.clone();
    match op {
        Op::PutNew => {
            after.insert("new".into(), (3, vec![3; 5000], Some(b"p3".to_vec())));
        }
        Op::Overwrite => {
            after.insert("target".into(), (4, vec![4; 200], None));
        }
        Op::Delete => {
            after.remove("target");
        }
        Op::Flush => {
            after.insert("target".into(), (5, vec![5; 10], None));
        }
        Op::Gc | Op::Close => {}
    }
    vec![before.clone(), after]
}

fn check_after_fault(
    dir: &Path,
    store: Store,
    op: Op,
    outcome: &Result<(), Error>,
    errno: i32,
    before: &Model,
    n: u64,
) {
    let ctx = format!("{op:?}, operation {n} failing with errno {errno}: {outcome:?}");
    if let Err(e) = outcome {
        match e {
            Error::Io { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(errno), "{ctx}")
            }
            other => panic!("{ctx}: expected an I/O error, got {other}"),
        }
    }
    let choices = allowed(op, before);
    let usable = !matches!(op, Op::Close) || outcome.is_err() && !store.is_closed();
    if usable && !store.is_closed() {
        // The same store object keeps working.
        let now = state(&store);
        assert!(choices.contains(&now), "{ctx}: state {now:?}");
        if outcome.is_err() && !matches!(op, Op::Flush | Op::Gc | Op::Close) {
            assert_eq!(&now, before, "{ctx}: a failed write changed the store");
        }
        put(&store, "later", 9, &[9; 10], None).unwrap_or_else(|e| panic!("{ctx}: then {e}"));
        store.flush().unwrap_or_else(|e| panic!("{ctx}: flush {e}"));
    }
    store.close().ok();
    drop(store);
    // Reopened: committed records are all there, files check out.
    let store =
        Store::open(dir.join("s.lv"), Mode::Append).unwrap_or_else(|e| panic!("{ctx}: reopen {e}"));
    let mut now = state(&store);
    now.remove("later");
    assert!(choices.contains(&now), "{ctx}: reopened state {now:?}");
    assert_eq!(now["keep"], before["keep"], "{ctx}");
    store.gc().unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "{ctx}: {:?}", report.problems);
    assert!(report.orphans.is_empty(), "{ctx}: {:?}", report.orphans);
    store.close().unwrap();
}

fn each_operation_failing(op: Op, errno: i32) -> u64 {
    // How many operations does `op` make?
    let total = {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = baseline(dir.path());
        fault::count();
        run(&store, op).unwrap();
        let (n, _) = fault::clear();
        n
    };
    assert!(total > 0, "{op:?} makes no file operation");
    for n in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let (store, before) = baseline(dir.path());
        fault::fail_nth(n, errno);
        let outcome = run(&store, op);
        let (_, failed) = fault::clear();
        assert_eq!(failed.len(), 1, "{op:?} op {n}");
        check_after_fault(dir.path(), store, op, &outcome, errno, &before, n);
    }
    total
}

#[test]
fn every_single_failing_operation_is_reported_and_loses_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut injected = 0;
    for op in [
        Op::PutNew,
        Op::Overwrite,
        Op::Delete,
        Op::Flush,
        Op::Gc,
        Op::Close,
    ] {
        for errno in [ENOSPC, EIO] {
            injected += each_operation_failing(op, errno);
        }
    }
    assert!(injected > 40, "only {injected} faults injected");
    eprintln!("{injected} faults injected");
}

#[test]
fn a_full_disk_fails_every_write_until_space_returns() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (store, before) = baseline(dir.path());
    fault::fail_from(1, ENOSPC);
    for i in 0..5 {
        let e = put(&store, &format!("full{i}"), i, &[0; 64], None).unwrap_err();
        assert!(
            matches!(&e, Error::Io { source, .. } if source.raw_os_error() == Some(ENOSPC)),
            "{e}"
        );
        assert!(e.to_string().contains("No space left"), "{e}");
    }
    assert!(store.delete("target").is_err());
    assert!(store.flush().is_err());
    let (_, failed) = fault::clear();
    assert!(failed.len() >= 7, "{failed:?}");
    // Space is back: nothing was lost, the store works.
    assert_eq!(state(&store), before);
    put(&store, "after", 7, &[7; 7], None).unwrap();
    store.close().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let mut now = state(&store);
    assert_eq!(now.remove("after"), Some((7, vec![7; 7], None)));
    assert_eq!(now, before);
    store.gc().unwrap();
    assert!(store.verify().unwrap().orphans.is_empty());
}
