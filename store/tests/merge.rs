//! `Store::merge`: other stores' records moved in, in one all-or-nothing
//! staged batch, their payload files hard-linked under new ids; the sources
//! stay valid, unchanged stores.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use lazyvault_store::query::Query;
use lazyvault_store::{
    fault, journal, load_payload, read_payload, Error, InteropError, Mode, Store, UsageError,
    MAX_RECORD_BYTES,
};
use serde_json::{json, Map, Value};

#[path = "common/records.rs"]
mod records;
use records::{meta, u8_array};

/// Fault injection is process-wide: these tests run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a record holds, payload bytes included (ids left out).
type Content = (
    Map<String, Value>,
    Value,
    BTreeMap<String, Vec<u8>>,
    Option<Vec<u8>>,
);

fn content(store: &Store, key: &str) -> Content {
    let rec = store.get(key).unwrap().expect("record");
    let arrays = rec
        .arrays
        .iter()
        .map(|(name, e)| {
            let bytes = if e.pickled {
                read_payload(store.root(), e).unwrap()
            } else {
                load_payload(store.root(), e).unwrap().as_bytes().to_vec()
            };
            (name.clone(), bytes)
        })
        .collect();
    (rec.meta, rec.layout, arrays, store.get_pickle(key).unwrap())
}

fn contents(store: &Store) -> BTreeMap<String, Content> {
    store
        .keys()
        .unwrap()
        .into_iter()
        .map(|k| {
            let c = content(store, &k);
            (k, c)
        })
        .collect()
}

/// A flushed, closed store at `path` with records `keys`, each with two
/// arrays (one large enough to be mapped), metadata, and for every other
/// one a pickled remainder.
fn make_source(path: &Path, keys: &[&str], seed: u8) {
    let store = Store::open(path, Mode::Create).unwrap();
    for (i, key) in keys.iter().enumerate() {
        let small: Vec<u8> = (0..10).map(|j| j + seed + i as u8).collect();
        let large: Vec<u8> = (0..100_000u32).map(|j| (j as u8) ^ seed).collect();
        let pickle = (i % 2 == 1).then(|| vec![seed, i as u8, 7]);
        store
            .put(
                key,
                meta(json!({"i": i, "seed": seed, "name": key})),
                json!({"kind": "dict"}),
                &[u8_array("small", &small), u8_array("large", &large)],
                pickle.as_deref(),
            )
            .unwrap();
    }
    store.close().unwrap();
}

fn payload_files(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(root.join("arrays"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|d| fs::read_dir(d.path()).into_iter().flatten().flatten())
        .map(|f| f.path())
        .collect();
    out.sort();
    out
}

/// `inode -> st_nlink` of every payload file of the store at `root`.
fn inodes(root: &Path) -> HashMap<u64, u64> {
    payload_files(root)
        .iter()
        .map(|p| {
            let m = fs::metadata(p).unwrap();
            (m.ino(), m.nlink())
        })
        .collect()
}

fn no_progress() -> impl FnMut(u64, u64) -> lazyvault_store::Result<()> {
    |_, _| Ok(())
}

#[test]
fn one_source_is_merged_by_hard_links_and_stays_unchanged() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("a.lv");
    make_source(&src, &["a", "b", "c"], 1);
    let before = {
        let s = Store::open(&src, Mode::ReadOnly).unwrap();
        contents(&s)
    };
    let files_before = payload_files(&src);
    let store = Store::open(dir.path().join("t.lv"), Mode::Append).unwrap();
    let mut calls = Vec::new();
    let keys = store
        .merge(std::slice::from_ref(&src), &mut |done, total| {
            calls.push((done, total));
            Ok(())
        })
        .unwrap();
    assert_eq!(keys, ["a", "b", "c"]);
    assert_eq!(calls.first(), Some(&(0, 3)));
    assert_eq!(calls.last(), Some(&(3, 3)));
    assert_eq!(contents(&store), before);
    // checksums kept, ids new
    let s = Store::open(&src, Mode::ReadOnly).unwrap();
    for key in ["a", "b", "c"] {
        let (ours, theirs) = (
            store.get(key).unwrap().unwrap(),
            s.get(key).unwrap().unwrap(),
        );
        for (name, e) in &ours.arrays {
            if e.pack.is_some() {
                // a small array: its pack linked under a new id, the member's kept
                assert_ne!(e.pack, theirs.arrays[name].pack);
                assert_eq!(e.id, theirs.arrays[name].id);
            } else {
                assert_ne!(e.id, theirs.arrays[name].id);
            }
            assert_eq!(e.checksum, theirs.arrays[name].checksum);
            assert!(e.checksum.is_some());
        }
    }
    // every payload is the source's file under a second name
    let (src_inodes, ours) = (inodes(&src), inodes(store.root()));
    assert_eq!(src_inodes.len(), 6);
    assert_eq!(ours.len(), 6);
    for (ino, links) in &ours {
        assert_eq!(*links, 2);
        assert_eq!(src_inodes.get(ino), Some(&2));
    }
    store.flush().unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(report.orphans.is_empty(), "{:?}", report.orphans);
    store.close().unwrap();
    // the source: same files, same records, verifies
    assert_eq!(payload_files(&src), files_before);
    assert_eq!(contents(&s), before);
    let report = s.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    drop(s);
    // merged records survive close and reopen
    let store = Store::open(dir.path().join("t.lv"), Mode::ReadOnly).unwrap();
    assert_eq!(contents(&store), before);
}

#[test]
fn several_sources_replace_existing_keys_and_update_indexes() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.lv"), dir.path().join("b.lv"));
    make_source(&a, &["a1", "shared", "a2"], 1);
    make_source(&b, &["b1", "b2"], 2);
    let path = dir.path().join("t.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store.create_index("seed").unwrap();
    let old = [9u8; 50];
    for key in ["shared", "b2", "mine"] {
        store
            .put(
                key,
                meta(json!({"seed": 9})),
                Value::Null,
                &[u8_array("old", &old)],
                None,
            )
            .unwrap();
    }
    store.flush().unwrap();
    let replaced: Vec<PathBuf> = ["shared", "b2"]
        .iter()
        .map(|k| {
            let e = &store.get(k).unwrap().unwrap().arrays["old"];
            path.join(e.relpath())
        })
        .collect();
    let keys = store
        .merge(&[a.clone(), b.clone()], &mut no_progress())
        .unwrap();
    assert_eq!(keys, ["a1", "a2", "shared", "b1", "b2"]);
    assert_eq!(store.len().unwrap(), 6);
    let mut expected = contents(&Store::open(&a, Mode::ReadOnly).unwrap());
    expected.extend(contents(&Store::open(&b, Mode::ReadOnly).unwrap()));
    let mine = content(&store, "mine");
    expected.insert("mine".into(), mine);
    assert_eq!(contents(&store), expected);
    // the secondary index answers with the merged records
    let q = |text: &str| store.find(&Query::parse(text).unwrap()).unwrap();
    assert_eq!(q("seed == 1"), ["a1", "a2", "shared"]);
    assert_eq!(q("seed == 2"), ["b1", "b2"]);
    assert_eq!(q("seed == 9"), ["mine"]);
    assert!(store
        .explain(&Query::parse("seed == 1").unwrap())
        .unwrap()
        .contains("seed"));
    // the replaced records' payloads are retired as a put's
    store.set_retention(std::time::Duration::ZERO);
    store.flush().unwrap();
    for p in &replaced {
        assert!(!p.exists(), "{} not retired", p.display());
    }
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(report.orphans.is_empty(), "{:?}", report.orphans);
    store.close().unwrap();
    let store = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(contents(&store), expected);
    assert_eq!(
        store.find(&Query::parse("seed == 2").unwrap()).unwrap(),
        ["b1", "b2"]
    );
    for src in [&a, &b] {
        let s = Store::open(src, Mode::ReadOnly).unwrap();
        assert!(s.verify().unwrap().is_ok());
    }
}

/// The store at `path` as a test sees it: keys and payload files.
fn state(store: &Store) -> (Vec<String>, Vec<PathBuf>) {
    (store.keys().unwrap(), payload_files(store.root()))
}

/// A new store at `path` holding one record, "mine", that merges leave alone.
fn target_holding_mine(path: &Path) -> Store {
    let store = Store::open(path, Mode::Append).unwrap();
    let arrays = [u8_array("a", &[1, 2])];
    store
        .put("mine", Map::new(), Value::Null, &arrays, None)
        .unwrap();
    store
}

#[test]
fn a_key_in_two_sources_is_refused_naming_both_and_nothing_changes() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.lv"), dir.path().join("b.lv"));
    make_source(&a, &["x", "dup"], 1);
    make_source(&b, &["dup", "y"], 2);
    let store = target_holding_mine(&dir.path().join("t.lv"));
    let before = state(&store);
    let err = store
        .merge(&[a.clone(), b.clone()], &mut no_progress())
        .unwrap_err();
    match &err {
        Error::Interop(InteropError::KeyCollision { key, first, second }) => {
            assert_eq!(key, "dup");
            assert_eq!((first, second), (&a, &b));
        }
        other => panic!("not a key collision: {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("a.lv") && text.contains("b.lv") && text.contains("dup"),
        "{text}"
    );
    assert_eq!(state(&store), before);
    // the same source twice, and the store itself, are refused too
    let err = store
        .merge(&[a.clone(), a.clone()], &mut no_progress())
        .unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    let err = store
        .merge(&[store.root().to_owned()], &mut no_progress())
        .unwrap_err();
    assert!(
        matches!(err, Error::Interop(InteropError::Unsupported(_))),
        "{err}"
    );
    assert!(err.to_string().contains("itself"), "{err}");
    // through another path to the same directory
    let alias = dir.path().join("alias");
    std::os::unix::fs::symlink(store.root(), &alias).unwrap();
    let err = store.merge(&[alias], &mut no_progress()).unwrap_err();
    assert!(err.to_string().contains("itself"), "{err}");
    assert_eq!(state(&store), before);
}

#[test]
fn a_missing_or_truncated_source_payload_is_corrupt_and_changes_nothing() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.lv"), dir.path().join("b.lv"));
    make_source(&a, &["a1", "a2"], 1);
    make_source(&b, &["b1", "b2", "b3"], 2);
    let store = target_holding_mine(&dir.path().join("t.lv"));
    let before = state(&store);
    let victim = {
        let s = Store::open(&b, Mode::ReadOnly).unwrap();
        b.join(s.get("b2").unwrap().unwrap().arrays["large"].relpath())
    };
    let original = fs::read(&victim).unwrap();
    let damages: [(&str, &dyn Fn()); 3] = [
        ("missing", &|| fs::remove_file(&victim).unwrap()),
        ("truncated", &|| {
            fs::write(&victim, &original[..original.len() - 1]).unwrap()
        }),
        ("does not match", &|| {
            // another shape in the header
            let mut bytes = original.clone();
            let at = bytes.windows(6).position(|w| w == b"100000").unwrap();
            bytes[at..at + 6].copy_from_slice(b"100001");
            fs::write(&victim, &bytes).unwrap()
        }),
    ];
    for (what, damage) in damages {
        damage();
        let err = store
            .merge(&[a.clone(), b.clone()], &mut no_progress())
            .unwrap_err();
        let Error::Corrupt(c) = &err else {
            panic!("{what}: not corrupt: {err}")
        };
        let text = err.to_string();
        assert!(text.contains(what), "{text}");
        assert!(text.contains(&b.display().to_string()), "{text}");
        assert_eq!(c.key(), Some("b2"), "{text}");
        assert_eq!(c.array(), Some("large"));
        assert_eq!(c.path(), Some(victim.as_path()));
        assert_eq!(state(&store), before, "{what}");
        fs::write(&victim, &original).unwrap();
    }
    // repaired, it merges
    store.merge(&[a, b], &mut no_progress()).unwrap();
    assert_eq!(store.len().unwrap(), 6);
}

#[test]
fn across_file_systems_payloads_are_copied_and_checked() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.lv");
    make_source(&a, &["a1", "a2", "a3"], 3);
    let expected = contents(&Store::open(&a, Mode::ReadOnly).unwrap());
    let store = Store::open(dir.path().join("t.lv"), Mode::Append).unwrap();
    // every link fails as across file systems: copies
    fault::fail_all_of("link", 18); // EXDEV
    let merged = store.merge(std::slice::from_ref(&a), &mut no_progress());
    let (_, failed) = fault::clear();
    assert_eq!(merged.unwrap(), ["a1", "a2", "a3"]);
    assert_eq!(failed.len(), 6);
    assert_eq!(contents(&store), expected);
    let ours = inodes(store.root());
    assert_eq!(
        ours.len(),
        4,
        "3 large files, the 3 small arrays copied into one pack"
    );
    assert!(ours.values().all(|&n| n == 1));
    assert!(inodes(&a).values().all(|&n| n == 1));
    store.flush().unwrap();
    assert!(store.verify().unwrap().is_ok());
    // a copy checks the data against the checksum: a flipped byte is found
    let victim = {
        let s = Store::open(&a, Mode::ReadOnly).unwrap();
        a.join(s.get("a3").unwrap().unwrap().arrays["large"].relpath())
    };
    let mut bytes = fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&victim, &bytes).unwrap();
    let target = Store::open(dir.path().join("u.lv"), Mode::Append).unwrap();
    target.begin_write().unwrap();
    fault::fail_all_of("link", 18);
    let err = target
        .merge(std::slice::from_ref(&a), &mut no_progress())
        .unwrap_err();
    fault::clear();
    assert!(err.to_string().contains("checksum"), "{err}");
    assert!(
        matches!(&err, Error::Corrupt(c) if c.key() == Some("a3")),
        "{err}"
    );
    assert!(target.keys().unwrap().is_empty());
    assert_eq!(payload_files(target.root()), Vec::<PathBuf>::new());
}

#[test]
fn a_source_is_read_at_its_latest_commit_beside_its_writer() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.lv");
    make_source(&a, &["a1"], 1);
    let writer = Store::open(&a, Mode::Append).unwrap();
    writer
        .put("a2", Map::new(), Value::Null, &[u8_array("z", &[1])], None)
        .unwrap();
    writer.flush().unwrap();
    writer
        .put(
            "unflushed",
            Map::new(),
            Value::Null,
            &[u8_array("z", &[2])],
            None,
        )
        .unwrap();
    let store = Store::open(dir.path().join("t.lv"), Mode::Append).unwrap();
    let keys = store
        .merge(std::slice::from_ref(&a), &mut no_progress())
        .unwrap();
    assert_eq!(keys, ["a1", "a2"]);
    writer.close().unwrap();
    let s = Store::open(&a, Mode::ReadOnly).unwrap();
    assert_eq!(s.keys().unwrap(), ["a1", "a2", "unflushed"]);
    assert!(s.verify().unwrap().is_ok());
}

#[test]
fn bad_sources_and_modes_are_refused_as_open_and_writes_refuse_them() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.lv");
    make_source(&a, &["a1"], 1);
    let path = dir.path().join("t.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store
        .put("mine", Map::new(), Value::Null, &[], None)
        .unwrap();
    store.close().unwrap();
    // mode "r"
    let ro = Store::open(&path, Mode::ReadOnly).unwrap();
    let err = ro
        .merge(std::slice::from_ref(&a), &mut no_progress())
        .unwrap_err();
    assert!(matches!(err, Error::Usage(UsageError::ReadOnly)), "{err}");
    ro.close().unwrap();
    let err = ro
        .merge(std::slice::from_ref(&a), &mut no_progress())
        .unwrap_err();
    assert!(matches!(err, Error::Usage(UsageError::Closed)), "{err}");
    drop(ro);
    let store = Store::open(&path, Mode::Append).unwrap();
    let before = state(&store);
    let missing = dir.path().join("missing.lv");
    let err = store
        .merge(&[a.clone(), missing], &mut no_progress())
        .unwrap_err();
    assert!(
        matches!(err, Error::Open(lazyvault_store::OpenError::NotFound(_))),
        "{err}"
    );
    let file = dir.path().join("file.txt");
    fs::write(&file, b"hello").unwrap();
    let err = store
        .merge(&[a.clone(), file], &mut no_progress())
        .unwrap_err();
    assert!(
        matches!(err, Error::Open(lazyvault_store::OpenError::NotAStore(_))),
        "{err}"
    );
    // a progress callback's error stops it
    let err = store
        .merge(std::slice::from_ref(&a), &mut |done, _| {
            if done == 1 {
                Err(UsageError::Cancelled.into())
            } else {
                Ok(())
            }
        })
        .unwrap_err();
    assert!(matches!(err, Error::Usage(UsageError::Cancelled)), "{err}");
    assert_eq!(state(&store), before);
    // nothing to merge
    assert!(store.merge(&[], &mut no_progress()).unwrap().is_empty());
    assert_eq!(state(&store), before);
}

#[test]
fn the_record_cap_applies_to_merged_records() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.lv");
    make_source(&a, &["a1"], 1);
    // A committed record over the cap (as a writer without the cap wrote
    // it), appended to the source's journal.
    let (segment, mut bytes) = records::tail_segment(&a);
    let record =
        json!({"meta": {"text": "x".repeat(MAX_RECORD_BYTES)}, "arrays": {}, "layout": null});
    for entry in [
        journal::Entry {
            key: "big".into(),
            change: journal::Change::Put {
                record: serde_json::to_vec(&record).unwrap(),
                pickle: None,
            },
        },
        journal::Entry {
            key: String::new(),
            change: journal::Change::Commit,
        },
    ] {
        bytes.extend_from_slice(&journal::encode(&entry));
    }
    fs::write(&segment, &bytes).unwrap();
    assert_eq!(
        Store::open(&a, Mode::ReadOnly).unwrap().keys().unwrap(),
        ["a1", "big"]
    );
    let store = Store::open(dir.path().join("t.lv"), Mode::Append).unwrap();
    store.begin_write().unwrap();
    let err = store
        .merge(std::slice::from_ref(&a), &mut no_progress())
        .unwrap_err();
    match err {
        Error::Usage(UsageError::RecordTooLarge { key, .. }) => assert_eq!(key, "big"),
        other => panic!("not RecordTooLarge: {other}"),
    }
    assert!(store.keys().unwrap().is_empty());
    assert_eq!(payload_files(store.root()), Vec::<PathBuf>::new());
}

#[test]
fn a_source_committing_during_the_merge_is_read_again_and_checked_again() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.lv"), dir.path().join("b.lv"));
    make_source(&a, &["a1", "a2"], 1);
    make_source(&b, &["b1"], 2);
    let store = Store::open(dir.path().join("t.lv"), Mode::Append).unwrap();
    store.begin_write().unwrap();
    // Between the first reading and the links (when (0, total) is
    // reported), a writer of source a commits: a2 deleted, a3 added.
    let writer = Store::open(&a, Mode::Append).unwrap();
    let mut changed = false;
    let keys = store
        .merge(&[a.clone(), b.clone()], &mut |done, _| {
            if done == 0 {
                writer.delete("a2").unwrap();
                writer
                    .put("a3", Map::new(), Value::Null, &[u8_array("z", &[3])], None)
                    .unwrap();
                writer.flush().unwrap();
                changed = true;
            }
            Ok(())
        })
        .unwrap();
    assert!(changed);
    assert_eq!(keys, ["a1", "a3", "b1"]);
    assert_eq!(store.keys().unwrap(), ["a1", "a3", "b1"]);
    assert_eq!(content(&store, "a3").2["z"], [3]);
    // ... and a commit that brings a key another source has is refused,
    // nothing left behind
    let target = Store::open(dir.path().join("u.lv"), Mode::Append).unwrap();
    target.begin_write().unwrap();
    let err = target
        .merge(&[a.clone(), b.clone()], &mut |done, _| {
            if done == 0 {
                writer
                    .put("b1", Map::new(), Value::Null, &[], None)
                    .unwrap();
                writer.flush().unwrap();
            }
            Ok(())
        })
        .unwrap_err();
    match &err {
        Error::Interop(InteropError::KeyCollision { key, first, second }) => {
            assert_eq!((key.as_str(), first, second), ("b1", &a, &b));
        }
        other => panic!("not a key collision: {other}"),
    }
    assert!(target.keys().unwrap().is_empty());
    assert_eq!(payload_files(target.root()), Vec::<PathBuf>::new());
}
