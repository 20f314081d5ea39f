//! The index is derived data (FORMAT.md, "Repair"): deleting or damaging
//! it loses no committed record, `Store::repair` rebuilds it from the record
//! journal and payloads.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use lazyvault_store::schema::Record;
use lazyvault_store::{journal, map_payload, Error, Mode, OpenError, Store, INDEX_DIR};
use serde_json::{json, Value};

#[path = "common/records.rs"]
mod records;
use records::{meta, u8_array};

type Snapshot = BTreeMap<String, (Vec<u8>, Option<Vec<u8>>, Vec<Vec<u8>>)>;

/// Every record's JSON, pickle and payload bytes.
fn snapshot(store: &Store) -> Snapshot {
    let mut out = BTreeMap::new();
    for key in store.keys().unwrap() {
        let (json, pickle) = store.get_with_pickle(&key).unwrap().unwrap();
        let record = Record::from_json(&json).unwrap();
        let arrays = record
            .arrays
            .values()
            .map(|e| map_payload(store.root(), e).unwrap().as_bytes().to_vec())
            .collect();
        out.insert(key, (json, pickle, arrays));
    }
    out
}

/// A store with overwrites, deletes, pickles and zero-size arrays, closed.
fn populated(dir: &Path) -> (PathBuf, Snapshot) {
    let path = dir.join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    for i in 0..30u8 {
        let data = vec![i; usize::from(i) * 100];
        let pickle = (i % 3 == 0).then(|| vec![0x80, 5, i, b'.']);
        store
            .put(
                &format!("run/{}", i % 20),
                meta(json!({"i": i, "even": i % 2 == 0})),
                json!({"note": "layout"}),
                &[u8_array("a", &data), u8_array("empty", &[])],
                pickle.as_deref(),
            )
            .unwrap();
        if i % 7 == 6 {
            store.delete(&format!("run/{}", i % 5)).unwrap();
        }
        if i % 10 == 9 {
            store.flush().unwrap();
        }
    }
    store
        .put("🦀/../etc", meta(json!({})), Value::Null, &[], None)
        .unwrap();
    let snap = snapshot(&store);
    store.close().unwrap();
    (path, snap)
}

fn reopen_and_check(path: &Path, expected: &Snapshot) {
    let store = Store::open(path, Mode::Append).unwrap();
    assert_eq!(&snapshot(&store), expected);
    assert_eq!(store.len().unwrap(), expected.len() as u64);
    store.gc().unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(report.orphans.is_empty(), "{:?}", report.orphans);
    // The repaired store keeps working.
    store
        .put("after", meta(json!({"x": 1})), Value::Null, &[], None)
        .unwrap();
    store.close().unwrap();
}

#[test]
fn a_deleted_index_is_refused_then_rebuilt_losing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, expected) = populated(dir.path());
    assert!(expected.len() > 10);
    fs::remove_dir_all(path.join(INDEX_DIR)).unwrap();
    // Readers never open the index: they still see every record.
    let store = Store::open(&path, Mode::Append).unwrap();
    assert_eq!(store.len().unwrap(), expected.len() as u64);
    // The writer needs it, and refuses to start without it.
    match store.begin_write() {
        Err(Error::Corrupt(c)) => assert!(c.detail().contains("repair"), "{c}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(store);
    let report = Store::repair(&path).unwrap();
    assert_eq!(report.records, expected.len() as u64);
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(report.moved_index, None);
    // The closed store's checkpoint holds every record: nothing to replay.
    assert_eq!(report.entries, 0);
    reopen_and_check(&path, &expected);
}

/// sled 0.34.7 writes a snapshot to `snap.<lsn>.generating`, fsyncs it, then
/// renames it; but at open it reads the last `snap.*` file by name, the
/// `.generating` one included (sled issue 1527). A writer killed while
/// writing a snapshot left one behind, and the store then refused to open
/// ("Read corrupted data"): the crash harness hit it about once in 13 runs
/// of 100 kills. The index drops such leftovers before opening sled.
#[test]
fn a_snapshot_left_half_written_by_a_kill_does_not_stop_the_store_opening() {
    let dir = tempfile::tempdir().unwrap();
    let (path, expected) = populated(dir.path());
    let index = path.join(INDEX_DIR);
    // what the kill leaves: an empty file, and one cut short, both named
    // to sort after every complete snapshot
    File::create(index.join("snap.FFFFFFFFFFFFFFF0.generating")).unwrap();
    fs::write(index.join("snap.FFFFFFFFFFFFFFFF.generating"), [7u8; 40]).unwrap();
    reopen_and_check(&path, &expected);
    let left: Vec<_> = fs::read_dir(&index)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".generating"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_damaged_index_is_refused_or_reported_then_rebuilt_losing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, expected) = populated(dir.path());
    // Overwrite every byte of every index file with noise.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for entry in fs::read_dir(path.join(INDEX_DIR)).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            let len = fs::metadata(&p).unwrap().len() as usize;
            let noise: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            fs::write(&p, noise).unwrap();
        }
    }
    // Readers never open the index: they still see every record.
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(reader.keys().unwrap().len(), expected.len());
    assert!(reader.verify().unwrap().is_ok());
    drop(reader);
    // sled may refuse the files or open them having lost records; either
    // way the writer's index must not look intact.
    let store = Store::open(&path, Mode::Append).unwrap();
    if store.begin_write().is_ok() {
        let intact = store
            .keys()
            .map(|k| k.len() == expected.len())
            .unwrap_or(false);
        let report = store.verify();
        assert!(!intact || report.is_err() || !report.unwrap().orphans.is_empty());
    }
    store.close().ok();
    drop(store);
    let report = Store::repair(&path).unwrap();
    let moved = report.moved_index.clone().expect("old index moved aside");
    assert!(moved.is_dir(), "the damaged index is kept for inspection");
    assert_eq!(report.records, expected.len() as u64);
    reopen_and_check(&path, &expected);
    // Repairing a healthy store gives the same store.
    let again = Store::repair(&path).unwrap();
    assert_eq!(again.records, expected.len() as u64 + 1);
}

#[test]
fn repair_falls_back_to_the_previous_version_when_payloads_are_missing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store
        .put(
            "k",
            meta(json!({"v": 1})),
            Value::Null,
            &[u8_array("a", b"one")],
            None,
        )
        .unwrap();
    let old_record = store.get("k").unwrap().unwrap();
    let old_payload = path.join(old_record.arrays["a"].relpath());
    let saved = fs::read(&old_payload).unwrap();
    store
        .put(
            "k",
            meta(json!({"v": 2})),
            Value::Null,
            &[u8_array("a", b"two")],
            None,
        )
        .unwrap();
    let new_record = store.get("k").unwrap().unwrap();
    // A crash after the flush: the journal holds both versions (a
    // checkpoint at close would hold only the last).
    let path = crash_image(store, &path);
    let old_payload = path.join(old_record.arrays["a"].relpath());
    // The old payload was removed at the flush; bring it back and lose the
    // new one, as a damaged disk might.
    fs::write(&old_payload, saved).unwrap();
    fs::remove_file(path.join(new_record.arrays["a"].relpath())).unwrap();
    fs::remove_dir_all(path.join(INDEX_DIR)).unwrap();

    let report = Store::repair(&path).unwrap();
    assert_eq!((report.records, report.entries), (1, 2));
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert!(
        report.skipped[0].contains("missing"),
        "{:?}",
        report.skipped
    );
    let store = Store::open(&path, Mode::Append).unwrap();
    assert_eq!(store.get("k").unwrap().unwrap().meta["v"], json!(1));
    let report = store.verify().unwrap();
    assert!(
        report
            .problems
            .iter()
            .all(|p| p.contains("journal's latest entry")),
        "{:?}",
        report.problems
    );
    store.close().unwrap();
}

#[test]
fn deleted_records_stay_deleted_after_repair() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    for k in ["a", "b", "c"] {
        store
            .put(
                k,
                meta(json!({})),
                Value::Null,
                &[u8_array("x", b"1")],
                None,
            )
            .unwrap();
    }
    store.flush().unwrap();
    assert!(store.delete("b").unwrap());
    store
        .put("c", meta(json!({"v": 2})), Value::Null, &[], None)
        .unwrap();
    let path = crash_image(store, &path);
    fs::remove_dir_all(path.join(INDEX_DIR)).unwrap();
    let report = Store::repair(&path).unwrap();
    assert_eq!((report.records, report.entries), (2, 5));
    let store = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(store.keys().unwrap(), ["a", "c"]);
    assert_eq!(store.get("c").unwrap().unwrap().meta["v"], json!(2));
}

#[test]
fn changes_cut_off_by_a_crash_are_cut_from_the_journal_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    for i in 0..3 {
        store
            .put(
                &format!("k{i}"),
                meta(json!({"i": i})),
                Value::Null,
                &[],
                None,
            )
            .unwrap();
    }
    store.close().unwrap();
    // A put that reached the journal but no commit, then a torn entry.
    let (segment, mut bytes) = records::tail_segment(&path);
    let committed = bytes.len() as u64;
    let ghost = journal::encode(&journal::Entry {
        key: "ghost".into(),
        change: journal::Change::Put {
            record: br#"{"meta":{},"arrays":{},"layout":null}"#.to_vec(),
            pickle: None,
        },
    });
    bytes.extend_from_slice(&ghost);
    bytes.extend_from_slice(&ghost[..10]);
    fs::write(&segment, &bytes).unwrap();
    // A read-only open leaves the files alone, and verify ignores the tail.
    let ro = Store::open(&path, Mode::ReadOnly).unwrap();
    let report = ro.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    ro.close().unwrap();
    assert_eq!(fs::metadata(&segment).unwrap().len(), bytes.len() as u64);
    // A writer cuts it.
    let store = Store::open(&path, Mode::Append).unwrap();
    store.begin_write().unwrap();
    assert_eq!(fs::metadata(&segment).unwrap().len(), committed);
    store.close().unwrap();
    fs::remove_dir_all(path.join(INDEX_DIR)).unwrap();
    let report = Store::repair(&path).unwrap();
    assert_eq!(report.records, 3);
    let store = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(store.keys().unwrap(), ["k0", "k1", "k2"]);
}

#[test]
fn the_journal_a_checkpoint_covers_goes_once_no_reader_needs_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    // A reader pins the new store's checkpoint: the journal after it stays.
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    for i in 0..200 {
        store
            .put(
                &format!("k{}", i % 10),
                meta(json!({"i": i})),
                Value::Null,
                &[],
                Some(b"p"),
            )
            .unwrap();
    }
    store.delete("k3").unwrap();
    store.close().unwrap();
    assert_eq!(journal::segments(&path).unwrap().len(), 1);
    assert!(reader.keys().unwrap().is_empty());
    drop(reader);
    let store = Store::open(&path, Mode::Append).unwrap();
    store
        .put("new", meta(json!({})), Value::Null, &[], None)
        .unwrap();
    let expected = snapshot(&store);
    let report = store.gc().unwrap();
    assert!(report.journal_bytes_freed > 200 * 50, "{report:?}");
    // gc's checkpoint holds every record: no segment is needed.
    assert_eq!(journal::segments(&path).unwrap(), []);
    assert!(store.verify().unwrap().is_ok());
    store
        .put("later", meta(json!({})), Value::Null, &[], None)
        .unwrap();
    store.close().unwrap();
    assert_eq!(journal::segments(&path).unwrap(), []);
    fs::remove_dir_all(path.join(INDEX_DIR)).unwrap();
    let report = Store::repair(&path).unwrap();
    assert_eq!(report.records, expected.len() as u64 + 1);
    let store = Store::open(&path, Mode::Append).unwrap();
    let mut now = snapshot(&store);
    assert!(now.remove("later").is_some());
    assert_eq!(now, expected);
}

#[test]
fn verify_reports_damaged_journal_entries_and_payload_checksums() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    let data = vec![7u8; 4096];
    store
        .put(
            "k",
            meta(json!({})),
            Value::Null,
            &[u8_array("a", &data)],
            None,
        )
        .unwrap();
    store.flush().unwrap();
    let record = store.get("k").unwrap().unwrap();
    let checksum = record.arrays["a"]
        .checksum
        .clone()
        .expect("recorded at write");
    assert!(
        checksum.starts_with("xxh3-64:") && checksum.len() == 8 + 16,
        "{checksum}"
    );
    let report = store.verify().unwrap();
    assert_eq!((report.checksummed, report.checksum_mismatches), (1, 0));

    // Flip one data byte: header and size still match, only the checksum tells.
    let payload = path.join(record.arrays["a"].relpath());
    let mut bytes = fs::read(&payload).unwrap();
    // the last data byte (of the file, or of the member in its pack)
    let e = &record.arrays["a"];
    let last = (e.npy_start() + e.data_offset + e.nbytes - 1) as usize;
    bytes[last] ^= 1;
    fs::write(&payload, &bytes).unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.problems.len(), 1);
    // the one checksum compared is counted, as the one that failed (it
    // said 0 checksums, as if none had been compared)
    assert_eq!((report.checksummed, report.checksum_mismatches), (1, 1));
    assert!(
        report.problems[0].contains("checksum"),
        "{:?}",
        report.problems
    );
    let quick = store.verify_with(false, &mut |_, _| true).unwrap();
    assert!(quick.is_ok(), "without checksums the flip is not seen");

    // A damaged journal entry is a problem too: the record is not in it.
    let (_, segment) = journal::segments(&path).unwrap().pop().unwrap();
    let mut bytes = fs::read(&segment).unwrap();
    bytes[16 + 45] ^= 0x20;
    fs::write(&segment, &bytes).unwrap();
    let report = store.verify_with(false, &mut |_, _| true).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("not in the journal")),
        "{:?}",
        report.problems
    );
    let mut seen = Vec::new();
    store
        .verify_with(false, &mut |done, total| {
            seen.push((done, total));
            true
        })
        .unwrap();
    assert_eq!(seen, [(0, 1), (1, 1)]);
}

#[test]
fn repair_refuses_what_is_not_a_store_and_a_held_store() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Store::repair(dir.path().join("nope")),
        Err(Error::Open(OpenError::NotFound(_)))
    ));
    fs::create_dir(dir.path().join("plain")).unwrap();
    assert!(matches!(
        Store::repair(dir.path().join("plain")),
        Err(Error::Open(OpenError::NotAStore(_)))
    ));
    let store = Store::open(dir.path().join("held"), Mode::Append).unwrap();
    assert!(matches!(
        Store::repair(dir.path().join("held")),
        Err(Error::Open(OpenError::Locked { .. }))
    ));
    store.close().unwrap();
}

#[test]
fn journal_entries_of_a_store_whose_index_saw_no_change_are_cut_at_open() {
    // A writer killed before sled persisted its first batch (found by the
    // crash harness, seed 0x188f41dadfc1f2c0): the index has no journal
    // position, the journal has entries.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    Store::open(&path, Mode::Append).unwrap().close().unwrap();
    let mut segment = b"LVJRNL\0\x01".to_vec();
    segment.extend_from_slice(&1u64.to_le_bytes());
    segment.extend_from_slice(&journal::encode(&journal::Entry {
        key: "k08".into(),
        change: journal::Change::Put {
            record: br#"{"meta":{},"arrays":{},"layout":null}"#.to_vec(),
            pickle: None,
        },
    }));
    let file = path.join(journal::relpath(1));
    fs::write(&file, &segment).unwrap();
    let ro = Store::open(&path, Mode::ReadOnly).unwrap();
    let report = ro.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    ro.close().unwrap();
    let store = Store::open(&path, Mode::Append).unwrap();
    store.begin_write().unwrap();
    // The new store's checkpoint starts at segment 1: its entry is cut,
    // its header stays.
    assert_eq!(fs::metadata(&file).unwrap().len(), 16);
    assert!(store.is_empty().unwrap());
    store.close().unwrap();
}

/// Copies a directory tree (for keeping an old index).
/// A store in `dir` whose writer put "a", "b" and "c" (an array each),
/// flushing after each, then crashed (see [`crash_image`]): the image and
/// its one journal segment, which holds the three commits.
fn three_flushes_then_a_crash(dir: &Path) -> (PathBuf, PathBuf) {
    let path = dir.join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    for k in ["a", "b", "c"] {
        store
            .put(
                k,
                meta(json!({"k": k})),
                Value::Null,
                &[u8_array("x", b"1")],
                None,
            )
            .unwrap();
        store.flush().unwrap();
    }
    let path = crash_image(store, &path);
    let (_, segment) = journal::segments(&path).unwrap().pop().unwrap();
    (path, segment)
}

/// What a crash right after `store`'s last flush leaves of the store at
/// `path` (no closing checkpoint: the journal holds what the session
/// wrote), as a copy next to it; `store` is then closed.
fn crash_image(store: Store, path: &Path) -> PathBuf {
    store.flush().unwrap();
    let image = path.with_extension("crashed");
    copy_dir(path, &image);
    store.close().unwrap();
    image
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn an_index_behind_the_journal_loses_nothing_and_its_secondary_indexes_are_rebuilt() {
    // As after a power loss that cost sled flushed changes: the writer's
    // records come from the checkpoint and the journal (since 1.6), so an
    // old index costs nothing but a rebuild of its secondary indexes.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store
        .put(
            "a",
            meta(json!({"v": 1})),
            Value::Null,
            &[u8_array("x", b"old")],
            None,
        )
        .unwrap();
    store.create_index("v").unwrap();
    store.close().unwrap();
    copy_dir(&path.join(INDEX_DIR), &dir.path().join("old-index"));
    let store = Store::open(&path, Mode::Append).unwrap();
    store
        .put("b", meta(json!({"v": 1})), Value::Null, &[], None)
        .unwrap();
    store
        .put(
            "a",
            meta(json!({"v": 2})),
            Value::Null,
            &[u8_array("x", b"new")],
            None,
        )
        .unwrap();
    store.close().unwrap();
    fs::remove_dir_all(path.join(INDEX_DIR)).unwrap();
    copy_dir(&dir.path().join("old-index"), &path.join(INDEX_DIR));

    let ro = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(ro.keys().unwrap(), ["a", "b"]);
    assert_eq!(ro.get("a").unwrap().unwrap().meta["v"], json!(2));
    ro.close().unwrap();
    let store = Store::open(&path, Mode::Append).unwrap();
    store.begin_write().unwrap();
    assert_eq!(store.keys().unwrap(), ["a", "b"]);
    assert_eq!(store.get("a").unwrap().unwrap().meta["v"], json!(2));
    // The old index's entries (a: v=1) were rebuilt from the records.
    let q = |s: &str| lazyvault_store::query::Query::parse(s).unwrap();
    assert_eq!(store.find(&q("v == 2")).unwrap(), ["a"]);
    assert_eq!(store.find(&q("v == 1")).unwrap(), ["b"]);
    let plan = store.explain(&q("v == 1")).unwrap();
    assert!(plan.contains("index"), "{plan}");
    assert!(store.verify().unwrap().is_ok());
    store.gc().unwrap();
    assert_eq!(store.get("a").unwrap().unwrap().meta["v"], json!(2));
    assert!(store.verify().unwrap().is_ok());
}

#[test]
fn an_emptied_index_is_refused_and_gc_never_runs_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let (path, expected) = populated(dir.path());
    // sled opens an empty database from these files: an empty index
    let db = path.join(INDEX_DIR).join("db");
    File::options()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(100)
        .unwrap();
    let store = Store::open(&path, Mode::Append).unwrap();
    if store.begin_write().is_ok() {
        // if sled still reads records, gc must refuse rather than drop any
        if store.len().unwrap() != expected.len() as u64 {
            assert!(matches!(store.gc(), Err(Error::Corrupt(_))));
        }
        store.close().ok();
    }
    let report = Store::repair(&path).unwrap();
    assert_eq!(report.records, expected.len() as u64);
    reopen_and_check(&path, &expected);
}

#[test]
fn repair_keeps_a_record_whose_only_version_has_a_damaged_payload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store
        .put(
            "k",
            meta(json!({"v": 1})),
            Value::Null,
            &[u8_array("a", b"one"), u8_array("b", b"two")],
            None,
        )
        .unwrap();
    let record = store.get("k").unwrap().unwrap();
    store.close().unwrap();
    fs::remove_file(path.join(record.arrays["a"].relpath())).unwrap();
    fs::remove_dir_all(path.join(INDEX_DIR)).unwrap();
    let report = Store::repair(&path).unwrap();
    assert_eq!(report.records, 1);
    assert!(report
        .skipped
        .iter()
        .any(|s| s.contains("kept in its latest version")));
    let store = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(store.get("k").unwrap().unwrap().meta["v"], json!(1));
    let report = store.verify().unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("missing")),
        "{:?}",
        report.problems
    );
}

#[test]
fn a_failed_or_interrupted_repair_leaves_the_store_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (path, expected) = populated(dir.path());
    // Bad input: the index stays in place, the store still opens.
    fs::write(path.join("indexes.json"), b"[not json").unwrap();
    assert!(matches!(Store::repair(&path), Err(Error::Corrupt(_))));
    fs::remove_file(path.join("indexes.json")).unwrap();
    let journal_dir = path.join(journal::JOURNAL_DIR);
    fs::rename(&journal_dir, dir.path().join("journal.saved")).unwrap();
    fs::write(&journal_dir, b"a file").unwrap();
    assert!(Store::repair(&path).is_err());
    fs::remove_file(&journal_dir).unwrap();
    fs::rename(dir.path().join("journal.saved"), &journal_dir).unwrap();
    assert!(path.join(INDEX_DIR).is_dir());
    // A repair killed while building leaves `index.repairing`; the next
    // repair starts over.
    fs::create_dir(path.join("index.repairing")).unwrap();
    fs::write(path.join("index.repairing").join("junk"), b"x").unwrap();
    reopen_and_check(&path, &expected);
    let report = Store::repair(&path).unwrap();
    assert_eq!(report.records, expected.len() as u64 + 1);
    assert!(!path.join("index.repairing").exists());
}

#[test]
fn repair_of_an_empty_directory_or_a_file_says_what_a_store_is() {
    // final trial: the message said "and not empty" for an empty directory
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("empty")).unwrap();
    fs::write(dir.path().join("file"), b"hi").unwrap();
    for name in ["empty", "file"] {
        let err = Store::repair(dir.path().join(name)).unwrap_err();
        assert!(matches!(err, Error::Open(OpenError::NotAStore(_))), "{err}");
        let text = err.to_string();
        assert!(!text.contains("not empty"), "{text}");
        assert!(
            text.contains("a store is a directory holding lazyvault.json"),
            "{text}"
        );
    }
}

#[test]
fn changes_no_flush_committed_are_cut_when_the_next_writer_takes_the_role() {
    // The store as a crash leaves it: the journal holds entries after its
    // last commit (the page cache kept them), no commit covers them.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store
        .put(
            "kept",
            meta(json!({"v": 1})),
            Value::Null,
            &[u8_array("x", b"k")],
            None,
        )
        .unwrap();
    store.flush().unwrap();
    store
        .put("kept", meta(json!({"v": 2})), Value::Null, &[], None)
        .unwrap();
    store
        .put(
            "lost",
            meta(json!({})),
            Value::Null,
            &[u8_array("x", b"l")],
            None,
        )
        .unwrap();
    let crashed = dir.path().join("crashed.lv");
    copy_dir(&path, &crashed);
    drop(store);
    let journal_len = |p: &Path| -> u64 {
        journal::segments(p)
            .unwrap()
            .iter()
            .map(|(_, f)| fs::metadata(f).unwrap().len())
            .sum()
    };
    let before = journal_len(&crashed);

    // A reader sees the last commit only.
    let ro = Store::open(&crashed, Mode::ReadOnly).unwrap();
    assert_eq!(ro.keys().unwrap(), ["kept"]);
    assert_eq!(ro.get("kept").unwrap().unwrap().meta["v"], json!(1));
    ro.close().unwrap();
    // So does the next writer, which cuts the rest off the journal.
    let store = Store::open(&crashed, Mode::Append).unwrap();
    store.begin_write().unwrap();
    assert!(journal_len(&crashed) < before);
    assert_eq!(store.keys().unwrap(), ["kept"]);
    assert_eq!(store.get("kept").unwrap().unwrap().meta["v"], json!(1));
    store.close().unwrap();
    // Nothing brings them back: not a reopen, not repair.
    Store::repair(&crashed).unwrap();
    let store = Store::open(&crashed, Mode::Append).unwrap();
    assert_eq!(store.keys().unwrap(), ["kept"]);
    assert_eq!(store.get("kept").unwrap().unwrap().meta["v"], json!(1));
    let report = store.verify().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // The cut change's payload is an orphan for gc.
    assert_eq!(report.orphans.len(), 1, "{:?}", report.orphans);
}

#[test]
fn a_writer_upgrades_a_1x_manifest_and_a_reader_leaves_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store
        .put("k", meta(json!({"v": 1})), Value::Null, &[], None)
        .unwrap();
    store.close().unwrap();
    let manifest_path = path.join("lazyvault.json");
    let manifest = |p: &Path| -> Value { serde_json::from_slice(&fs::read(p).unwrap()).unwrap() };
    assert_eq!(manifest(&manifest_path)["format_version"], "2.0");
    let mut old = manifest(&manifest_path);
    old["format_version"] = json!("1.5");
    old["created_by"] = json!("lazyvault 0.0.9");
    fs::write(&manifest_path, serde_json::to_vec(&old).unwrap()).unwrap();
    // A reader changes no file.
    let ro = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(ro.keys().unwrap(), ["k"]);
    ro.close().unwrap();
    assert_eq!(manifest(&manifest_path), old);
    // The writer makes it 2.0 (a 1.x writer then refuses the store).
    let store = Store::open(&path, Mode::Append).unwrap();
    store.begin_write().unwrap();
    let now = manifest(&manifest_path);
    assert_eq!(now["format_version"], "2.0");
    assert_eq!(now["created_by"], "lazyvault 0.0.9");
    assert_eq!(store.keys().unwrap(), ["k"]);
    store.close().unwrap();
}

#[test]
fn a_damaged_entry_before_committed_ones_is_never_cut_and_repair_keeps_what_follows() {
    // Bit rot, not a torn tail: whole commits follow the damaged entry.
    let dir = tempfile::tempdir().unwrap();
    let (path, segment) = three_flushes_then_a_crash(dir.path());
    let mut bytes = fs::read(&segment).unwrap();
    bytes[16 + 45] ^= 0x20; // inside the first put (of "a")
    fs::write(&segment, &bytes).unwrap();
    let ro = Store::open(&path, Mode::ReadOnly).unwrap();
    let report = ro.verify().unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("damaged at byte")),
        "{:?}",
        report.problems
    );
    drop(ro);
    // The writer refuses rather than cut the commits of b and c.
    let store = Store::open(&path, Mode::Append).unwrap();
    match store.begin_write() {
        Err(Error::Corrupt(c)) => assert!(c.to_string().contains("repair"), "{c}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(store);
    assert_eq!(fs::read(&segment).unwrap(), bytes, "nothing was cut");
    let report = Store::repair(&path).unwrap();
    assert!(
        report.skipped.iter().any(|s| s.contains("damaged")),
        "{:?}",
        report.skipped
    );
    let store = Store::open(&path, Mode::Append).unwrap();
    store.begin_write().unwrap();
    assert_eq!(store.keys().unwrap(), ["b", "c"]);
    store.close().unwrap();
}

#[test]
fn a_damaged_segment_header_before_committed_entries_is_reported_and_repaired() {
    // A fresh user's trial: one flipped byte of the 16-byte header hid the
    // whole segment, and verify said ok.
    let dir = tempfile::tempdir().unwrap();
    let (path, segment) = three_flushes_then_a_crash(dir.path());
    for at in [0, 7, 8, 15] {
        let image = path.with_extension(format!("h{at}"));
        copy_dir(&path, &image);
        let seg = image.join(segment.strip_prefix(&path).unwrap());
        let mut bytes = fs::read(&seg).unwrap();
        bytes[at] ^= 0xFF;
        fs::write(&seg, &bytes).unwrap();
        let ro = Store::open(&image, Mode::ReadOnly).unwrap();
        let report = ro.verify().unwrap();
        assert!(
            report.problems.iter().any(|p| p.contains("damaged header")),
            "{at}: {:?}",
            report.problems
        );
        drop(ro);
        let store = Store::open(&image, Mode::Append).unwrap();
        assert!(
            matches!(store.begin_write(), Err(Error::Corrupt(_))),
            "{at}"
        );
        drop(store);
        let report = Store::repair(&image).unwrap();
        assert_eq!(report.records, 3, "{at}: {:?}", report.skipped);
        let ro = Store::open(&image, Mode::ReadOnly).unwrap();
        assert_eq!(ro.keys().unwrap(), ["a", "b", "c"], "{at}");
    }
}
