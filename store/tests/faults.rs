//! Fault injection: every file operation of the store (and every index
//! operation) is made to fail in turn, with ENOSPC and EIO. After each
//! failure the call raises an I/O error carrying the errno, the store stays
//! usable, and nothing committed before is lost.
//!
//! The fault plan is process-wide, so the tests here take one lock.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;

use lazyvault_store::schema::Record;
use lazyvault_store::{
    fault, map_payload, ArraySource, Error, Mode, NewRecord, StorageError, Store,
};
use serde_json::{json, Map, Value};

#[path = "common/records.rs"]
mod records;
use records::u8_array;

static SERIAL: Mutex<()> = Mutex::new(());

const ENOSPC: i32 = 28;
const EIO: i32 = 5;

/// What a key holds: (metadata value `v`, payload bytes by array name,
/// pickle).
type Model = BTreeMap<String, (i64, Arrays, Option<Vec<u8>>)>;
type Arrays = BTreeMap<String, Vec<u8>>;

/// Enough arrays for the `syncfs` barrier, and (spread over `arrays/<xx>`
/// by random ids) for its second barrier in place of directory fsyncs.
const MANY: usize = 24;
/// Arrays this large are payload files of their own (smaller ones are
/// packed: one file per put).
const BIG: usize = lazyvault_store::READ_MAX_BYTES as usize + 1;
/// Files of one put that take the barrier path (9 or more).
const BARRIER_FILES: usize = 9;

fn one(data: &[u8]) -> Arrays {
    BTreeMap::from([("a".to_owned(), data.to_vec())])
}

/// `n` arrays `a0`, `a1`, ... of `len` bytes `fill + i`.
fn many(n: usize, len: usize, fill: u8) -> Arrays {
    (0..n)
        .map(|i| (format!("a{i}"), vec![fill.wrapping_add(i as u8); len]))
        .collect()
}

fn sources(arrays: &Arrays) -> Vec<ArraySource<'_>> {
    arrays
        .iter()
        .map(|(name, data)| u8_array(name, data))
        .collect()
}

fn put(store: &Store, key: &str, v: i64, data: &[u8], pickle: Option<&[u8]>) -> Result<(), Error> {
    let meta: Map<String, Value> = json!({"v": v}).as_object().cloned().unwrap();
    store.put(key, meta, Value::Null, &[u8_array("a", data)], pickle)
}

/// `put_many` of `(key, v, arrays)`, no pickles.
fn put_many(store: &Store, records: &[(&str, i64, &Arrays)]) -> Result<(), Error> {
    let srcs: Vec<Vec<ArraySource<'_>>> = records.iter().map(|r| sources(r.2)).collect();
    let batch = records
        .iter()
        .zip(&srcs)
        .map(|(&(key, v, _), arrays)| NewRecord {
            key,
            meta: json!({ "v": v }).as_object().cloned().unwrap(),
            layout: Value::Null,
            arrays,
            pickle: None,
        })
        .collect();
    store.put_many(batch)
}

fn state(store: &Store) -> Model {
    let mut out = Model::new();
    for key in store.keys().unwrap() {
        let (json, pickle) = store.get_with_pickle(&key).unwrap().unwrap();
        let record = Record::from_json(&json).unwrap();
        let arrays = record
            .arrays
            .iter()
            .map(|(name, entry)| {
                let data = map_payload(store.root(), entry)
                    .unwrap()
                    .as_bytes()
                    .to_vec();
                (name.clone(), data)
            })
            .collect();
        out.insert(key, (record.meta["v"].as_i64().unwrap(), arrays, pickle));
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
    /// One record with [`BARRIER_FILES`] large arrays: the `syncfs` barrier path.
    PutManyArrays,
    /// `put_many` of a new key, an overwrite and the new key again.
    PutMany,
    Overwrite,
    /// `replace_arrays` of the one array of `keep` (which has a pickle).
    ReplaceArray,
    Delete,
    Flush,
    Gc,
    Close,
}

fn run(store: &Store, op: Op) -> Result<(), Error> {
    match op {
        Op::PutNew => put(store, "new", 3, &[3; 5000], Some(b"p3")),
        Op::PutManyArrays => {
            let arrays = many(BARRIER_FILES, BIG, 10);
            let srcs = sources(&arrays);
            let meta = json!({"v": 3}).as_object().cloned().unwrap();
            store.put("new", meta, Value::Null, &srcs, None)
        }
        Op::PutMany => put_many(
            store,
            &[
                ("new", 3, &many(MANY / 2, 50, 20)),
                ("target", 4, &many(MANY / 2, 70, 40)),
                ("new", 6, &one(&[6; 30])),
            ],
        ),
        Op::Overwrite => put(store, "target", 4, &[4; 200], None),
        Op::ReplaceArray => store
            .replace_arrays("keep", &[u8_array("a", &[7; 300])])
            .map(drop),
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
            after.insert("new".into(), (3, one(&[3; 5000]), Some(b"p3".to_vec())));
        }
        Op::PutManyArrays => {
            after.insert("new".into(), (3, many(BARRIER_FILES, BIG, 10), None));
        }
        Op::PutMany => {
            after.insert("target".into(), (4, many(MANY / 2, 70, 40), None));
            after.insert("new".into(), (6, one(&[6; 30]), None));
        }
        Op::Overwrite => {
            after.insert("target".into(), (4, one(&[4; 200]), None));
        }
        Op::ReplaceArray => {
            after.insert("keep".into(), (1, one(&[7; 300]), Some(b"p1".to_vec())));
        }
        Op::Delete => {
            after.remove("target");
        }
        Op::Flush => {
            after.insert("target".into(), (5, one(&[5; 10]), None));
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
    let ctx = format!("{op:?}, operation {n} of its kind failing with errno {errno}: {outcome:?}");
    if let Err(e) = outcome {
        match e {
            Error::Storage(StorageError::Io { source, .. }) => {
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
            // A failed put removed every file it wrote (temporary or not).
            let orphans = store.verify().unwrap().orphans;
            assert!(orphans.is_empty(), "{ctx}: left {orphans:?}");
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

/// Every kind of operation the store routes through its fault injection.
const OP_NAMES: &[&str] = &[
    "mkdir",
    "open-dir",
    "create",
    "write",
    "fsync",
    "syncfs",
    "rename",
    "fsync-dir",
    "unlink",
    "truncate",
    "index",
    "index-flush",
    "statvfs",
    "flock",
];

/// Fails each operation of `op` in turn (the 1st, 2nd, ... of each kind);
/// returns how many were failed and the kinds that occurred.
fn each_operation_failing(op: Op, errno: i32) -> (u64, BTreeSet<String>) {
    let total = {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = baseline(dir.path());
        fault::count();
        run(&store, op).unwrap();
        let (n, all) = fault::clear();
        for seen in &all {
            let kind = seen.split(' ').next().unwrap();
            assert!(
                OP_NAMES.contains(&kind),
                "{op:?}: {kind} is missing from OP_NAMES"
            );
        }
        n
    };
    assert!(total > 0, "{op:?} makes no file operation");
    let mut names = BTreeSet::new();
    let mut injected = 0;
    for name in OP_NAMES {
        for k in 1.. {
            let dir = tempfile::tempdir().unwrap();
            let (store, before) = baseline(dir.path());
            fault::fail_nth_of(name, k, errno);
            let outcome = run(&store, op);
            let (_, failed) = fault::clear();
            if failed.is_empty() {
                // `op` made fewer than `k` operations of this kind.
                assert!(outcome.is_ok(), "{op:?}: {outcome:?}");
                break;
            }
            assert_eq!(failed.len(), 1, "{op:?} {name} {k}");
            assert!(failed[0].starts_with(&format!("{name} ")), "{failed:?}");
            names.insert((*name).to_owned());
            injected += 1;
            check_after_fault(dir.path(), store, op, &outcome, errno, &before, k);
        }
    }
    (injected, names)
}

#[test]
fn every_single_failing_operation_is_reported_and_loses_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut injected = 0;
    for op in [
        Op::PutNew,
        Op::PutManyArrays,
        Op::PutMany,
        Op::Overwrite,
        Op::ReplaceArray,
        Op::Delete,
        Op::Flush,
        Op::Gc,
        Op::Close,
    ] {
        for errno in [ENOSPC, EIO] {
            let (n, names) = each_operation_failing(op, errno);
            injected += n;
            if cfg!(target_os = "linux") && matches!(op, Op::PutManyArrays) {
                // The barrier path ran: its descriptor and syncfs failed in
                // turn, and no payload was fsynced on its own.
                for name in ["open-dir", "syncfs", "create", "write", "rename", "index"] {
                    assert!(
                        names.contains(name),
                        "{op:?}: {name} never failed: {names:?}"
                    );
                }
                assert!(!names.contains("fsync"), "{op:?}: {names:?}");
            }
            if matches!(op, Op::PutMany) {
                // Small arrays: one pack, written, fsynced and renamed.
                for name in ["create", "write", "fsync", "rename", "index"] {
                    assert!(
                        names.contains(name),
                        "{op:?}: {name} never failed: {names:?}"
                    );
                }
                assert!(!names.contains("syncfs"), "{op:?}: {names:?}");
            }
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
            matches!(&e, Error::Storage(StorageError::Io { source, .. }) if source.raw_os_error() == Some(ENOSPC)),
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
    assert_eq!(now.remove("after"), Some((7, one(&[7; 7]), None)));
    assert_eq!(now, before);
    store.gc().unwrap();
    assert!(store.verify().unwrap().orphans.is_empty());
}

#[test]
fn a_file_system_without_locks_refuses_a_writer_and_lets_readers_in() {
    const ENOLCK: i32 = 37;
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (store, model) = baseline(dir.path());
    store.close().unwrap();
    let path = dir.path().join("s.lv");
    fault::fail_all_of("flock", ENOLCK);
    // A reader needs no lock: it reads, unpinned.
    let reader = Store::open(&path, Mode::ReadOnly);
    // A writer cannot make sure it is alone: refused, saying what to do.
    let writer = Store::open(&path, Mode::Append).unwrap();
    let refused = put(&writer, "new", 9, &[9; 10], None);
    let created = Store::open(dir.path().join("new.lv"), Mode::Create);
    let (_, failed) = fault::clear();
    assert!(failed.iter().all(|f| f.starts_with("flock")), "{failed:?}");
    let reader = reader.unwrap();
    assert_eq!(state(&reader), model);
    for err in [refused.unwrap_err(), created.err().expect("refused")] {
        assert!(
            matches!(err, Error::Storage(StorageError::NoLocks(_))),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("ENOLCK") && text.contains("mode 'r'"),
            "{text}"
        );
    }
    // Nothing was lost or half-written; with locks back, writing works.
    drop(writer);
    let writer = Store::open(&path, Mode::Append).unwrap();
    assert_eq!(state(&writer), model);
    put(&writer, "new", 9, &[9; 10], None).unwrap();
    writer.close().unwrap();
}
