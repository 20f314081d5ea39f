//! Readers beside a writer: snapshots, refresh, versions, checkpoints,
//! pins and retention (FORMAT.md, "Checkpoints" and "Reading beside a
//! writer"). Several processes are tested from Python (tests/test_readers.py).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lazyvault_store::{
    map_payload, ArraySource, Error, Mode, OpenError, StorageError, Store, UsageError,
    CHECKPOINT_DIR,
};
#[path = "common/records.rs"]
mod records;

use serde_json::{json, Map, Value};

fn meta(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn array(bytes: &[u8]) -> ArraySource<'_> {
    ArraySource {
        name: "x".into(),
        descr: "'|u1'".into(),
        dtype: "uint8".into(),
        shape: vec![bytes.len() as u64],
        fortran_order: false,
        data: bytes,
        pickled: false,
    }
}

fn put(store: &Store, key: &str, v: i64) {
    let data = vec![v as u8; 100];
    store
        .put(
            key,
            meta(json!({ "v": v })),
            Value::Null,
            &[array(&data)],
            None,
        )
        .unwrap();
}

fn values(store: &Store) -> BTreeMap<String, i64> {
    store
        .keys()
        .unwrap()
        .into_iter()
        .map(|k| {
            let v = store.get(&k).unwrap().unwrap().meta["v"].as_i64().unwrap();
            (k, v)
        })
        .collect()
}

/// Every file under `root` with its length and modification time.
fn listing(root: &Path) -> BTreeMap<PathBuf, (u64, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.insert(e.path(), (m.len(), m.modified().unwrap()));
        }
    }
    out
}

fn new_store(dir: &Path) -> PathBuf {
    let path = dir.join("s.lv");
    let store = Store::open(&path, Mode::Create).unwrap();
    for i in 0..20 {
        put(&store, &format!("k{i:02}"), i);
    }
    store.close().unwrap();
    path
}

#[test]
fn a_reader_sees_the_last_commit_and_moves_only_on_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let writer = Store::open(&path, Mode::Append).unwrap();
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    let v0 = reader.version().unwrap();
    assert_eq!(reader.len().unwrap(), 20);

    put(&writer, "k00", 100);
    put(&writer, "new", 1);
    assert!(writer.delete("k01").unwrap());
    // The writer sees its own changes at once; a reader never before a flush.
    assert_eq!(writer.len().unwrap(), 20);
    assert_eq!(reader.refresh().unwrap(), v0);
    assert_eq!(values(&reader)["k00"], 0);
    assert!(reader.contains("k01").unwrap());

    writer.flush().unwrap();
    // The snapshot does not move by itself.
    assert_eq!(reader.version().unwrap(), v0);
    assert_eq!(values(&reader)["k00"], 0);
    assert_eq!(reader.refresh().unwrap(), v0 + 1);
    let now = values(&reader);
    assert_eq!(now["k00"], 100);
    assert_eq!(now["new"], 1);
    assert!(!now.contains_key("k01"));
    assert_eq!(reader.len().unwrap(), 20);
    assert_eq!(now, values(&writer));
    // A flush without changes makes no new version.
    writer.flush().unwrap();
    assert_eq!(reader.refresh().unwrap(), v0 + 1);
    writer.close().unwrap();
    // close() wrote a checkpoint: a new reader opens from it, same records.
    let fresh = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(fresh.version().unwrap(), v0 + 1);
    assert_eq!(values(&fresh), now);
}

#[test]
fn opening_and_reading_changes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let before = listing(&path);
    for mode in [Mode::ReadOnly, Mode::Append] {
        let store = Store::open(&path, mode).unwrap();
        assert_eq!(store.len().unwrap(), 20);
        assert_eq!(
            store
                .find(&lazyvault_store::query::Query::parse("v > 10").unwrap())
                .unwrap()
                .len(),
            9
        );
        assert!(store.verify().unwrap().is_ok());
        store.refresh().unwrap();
        store.flush().unwrap();
        store.close().unwrap();
    }
    assert_eq!(listing(&path), before);
}

#[test]
fn a_readers_arrays_stay_while_the_writer_overwrites_deletes_and_collects() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    let old = reader.get("k05").unwrap().unwrap();
    let writer = Store::open(&path, Mode::Append).unwrap();
    writer.set_retention(Duration::ZERO);
    for i in 0..20 {
        put(&writer, &format!("k{i:02}"), 1000 + i);
    }
    writer.delete("k06").unwrap();
    writer.flush().unwrap();
    writer.gc().unwrap();
    writer.close().unwrap();
    // The reader's pin kept every payload of its snapshot.
    let mapped = map_payload(&path, &old.arrays["x"]).unwrap();
    assert_eq!(mapped.as_bytes(), &[5u8; 100][..]);
    for key in reader.keys().unwrap() {
        let rec = reader.get(&key).unwrap().unwrap();
        let v = rec.meta["v"].as_i64().unwrap() as u8;
        assert_eq!(
            map_payload(&path, &rec.arrays["x"]).unwrap().as_bytes(),
            &[v; 100][..]
        );
    }
    assert!(reader.verify().unwrap().is_ok());
    // Once the reader moves on, a writer's gc removes what only it held.
    reader.refresh().unwrap();
    assert!(!reader.contains("k06").unwrap());
    let writer = Store::open(&path, Mode::Append).unwrap();
    writer.set_retention(Duration::ZERO);
    let gc = writer.gc().unwrap();
    assert!(gc.removed_files >= 21, "{gc:?}");
    assert!(matches!(
        map_payload(&path, &old.arrays["x"]),
        Err(Error::Corrupt(_)) | Err(Error::Storage(StorageError::Io { .. }))
    ));
}

#[test]
fn retention_keeps_retired_payloads_for_readers_on_other_machines() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let old = Store::open(&path, Mode::ReadOnly)
        .unwrap()
        .get("k03")
        .unwrap()
        .unwrap();
    let file = path.join(old.arrays["x"].relpath());
    let writer = Store::open(&path, Mode::Append).unwrap();
    writer.set_retention(Duration::from_secs(3600));
    put(&writer, "k03", 33);
    writer.flush().unwrap();
    writer.gc().unwrap();
    writer.close().unwrap();
    assert!(file.exists(), "removed within the retention period");
    assert!(Store::open(&path, Mode::ReadOnly)
        .unwrap()
        .verify()
        .unwrap()
        .orphans
        .is_empty());
    let writer = Store::open(&path, Mode::Append).unwrap();
    writer.set_retention(Duration::ZERO);
    writer.gc().unwrap();
    assert!(!file.exists(), "kept past the retention period");
}

#[test]
fn a_version_opens_as_it_was_while_its_checkpoint_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let writer = Store::open(&path, Mode::Append).unwrap();
    let pinned = Store::open(&path, Mode::ReadOnly).unwrap();
    let v = pinned.version().unwrap();
    put(&writer, "k00", 7);
    writer.flush().unwrap();
    put(&writer, "k00", 8);
    writer.flush().unwrap();
    let at = Store::open_at(&path, v).unwrap();
    assert_eq!(values(&at)["k00"], 0);
    let at1 = Store::open_at(&path, v + 1).unwrap();
    assert_eq!(values(&at1)["k00"], 7);
    assert_eq!(at1.version().unwrap(), v + 1);
    assert!(matches!(
        Store::open_at(&path, v + 5),
        Err(Error::Corrupt(_))
    ));
    assert!(matches!(
        at.put("x", Map::new(), Value::Null, &[], None),
        Err(Error::Usage(UsageError::ReadOnly))
    ));
}

#[test]
fn handles_of_one_process_share_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let a = Store::open(&path, Mode::Append).unwrap();
    let b = Store::open(&path, Mode::Append).unwrap();
    put(&a, "from-a", 1);
    put(&b, "from-b", 2);
    assert!(a.is_writer() && b.is_writer());
    // b writes through the same index: it sees a's change at once.
    assert!(b.contains("from-a").unwrap());
    a.close().unwrap();
    put(&b, "after", 3);
    b.close().unwrap();
    let r = Store::open(&path, Mode::ReadOnly).unwrap();
    for k in ["from-a", "from-b", "after"] {
        assert!(r.contains(k).unwrap(), "{k}");
    }
}

#[test]
fn closing_after_a_small_change_writes_a_small_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Create).unwrap();
    for i in 0..2000 {
        put(&store, &format!("k{i:05}"), i);
    }
    store.close().unwrap();
    let runs = |path: &Path| -> u64 {
        fs::read_dir(path.join(CHECKPOINT_DIR))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".run"))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    };
    let full = runs(&path);
    assert!(full > 2000 * 100, "{full}");
    for round in 0..5 {
        let store = Store::open(&path, Mode::Append).unwrap();
        put(&store, "k00010", 10 + round);
        let before = runs(&path);
        store.close().unwrap();
        let written = runs(&path).saturating_sub(before);
        // A few hundred bytes, not the 2,000 records again.
        assert!(written < full / 10, "round {round}: {written} of {full}");
    }
    let r = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(r.len().unwrap(), 2000);
    assert_eq!(values(&r)["k00010"], 14);
}

#[test]
fn many_checkpoints_merge_into_few_runs_with_the_same_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let mut model = BTreeMap::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..40 {
        let store = Store::open(&path, Mode::Append).unwrap();
        store.set_retention(Duration::ZERO);
        for _ in 0..5 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let key = format!("k{:02}", seed % 60);
            if seed.is_multiple_of(5) {
                store.delete(&key).unwrap();
                model.remove(&key);
            } else {
                put(&store, &key, round);
                model.insert(key, round);
            }
        }
        store.close().unwrap();
        let r = Store::open(&path, Mode::ReadOnly).unwrap();
        assert_eq!(values(&r), model, "round {round}");
        assert_eq!(r.len().unwrap(), model.len() as u64);
    }
    let runs = fs::read_dir(path.join(CHECKPOINT_DIR))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".run")
        })
        .count();
    assert!(runs <= 12, "{runs} runs");
}

#[test]
fn a_reader_reads_a_store_whose_writer_never_closed() {
    // No checkpoint at all: the whole committed journal is replayed.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let writer = Store::open(&path, Mode::Create).unwrap();
    put(&writer, "a", 1);
    writer.flush().unwrap();
    put(&writer, "b", 2); // not flushed: invisible
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(values(&reader), BTreeMap::from([("a".to_owned(), 1)]));
    assert_eq!(reader.version().unwrap(), 1);
    std::mem::forget(writer); // as if killed: no close, no checkpoint
}

#[test]
fn a_relative_path_keeps_naming_the_same_store_after_a_chdir() {
    // The only test here that changes the working directory: it restores it.
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("a")).unwrap();
    fs::create_dir(dir.path().join("b")).unwrap();
    let cwd = std::env::current_dir().unwrap();
    std::env::set_current_dir(dir.path().join("a")).unwrap();
    let writer = Store::open("runs.lv", Mode::Append).unwrap();
    put(&writer, "k", 1);
    writer.flush().unwrap();
    let reader = Store::open("runs.lv", Mode::ReadOnly).unwrap();
    std::env::set_current_dir(dir.path().join("b")).unwrap();
    put(&writer, "k2", 2);
    writer.flush().unwrap();
    let refreshed = reader.refresh();
    let closed = writer.close();
    std::env::set_current_dir(cwd).unwrap();
    assert_eq!(refreshed.unwrap(), 2);
    closed.unwrap();
    assert!(dir.path().join("a/runs.lv/checkpoints").is_dir());
    assert!(!dir.path().join("b/runs.lv").exists());
}

/// The checkpoint files (`.ckpt`) of the store at `path`, oldest first.
fn checkpoints(path: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(path.join(CHECKPOINT_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ckpt"))
        .collect();
    out.sort();
    out
}

#[test]
fn damaged_or_stray_checkpoints_give_way_to_older_ones_and_repair_replaces_them() {
    let dir = tempfile::tempdir().unwrap();
    // A reader held the new store's checkpoint while it was written: that
    // checkpoint and the journal after it are still there.
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Create).unwrap();
    let pin = Store::open(&path, Mode::ReadOnly).unwrap();
    for i in 0..20 {
        put(&store, &format!("k{i:02}"), i);
    }
    store.close().unwrap();
    drop(pin);
    let expected = values(&Store::open(&path, Mode::ReadOnly).unwrap());
    for what in ["truncated", "a run missing", "a stray newer file"] {
        let copy = dir.path().join(format!("copy-{}", what.replace(' ', "-")));
        copy_store(&path, &copy);
        let path = copy;
        damage_newest_checkpoint(&path, what);
        // Readers fall back to the older checkpoint and the journal after
        // it: every record, nothing else.
        let reader = Store::open(&path, Mode::ReadOnly).unwrap();
        assert_eq!(values(&reader), expected, "{what}");
        let report = reader.verify().unwrap();
        assert!(!report.problems.is_empty(), "{what}: verify saw nothing");
        drop(reader);
        // A writer works on, and its checkpoint replaces the damage.
        let writer = Store::open(&path, Mode::Append).unwrap();
        put(&writer, "after", 1);
        writer.close().unwrap();
        let reader = Store::open(&path, Mode::ReadOnly).unwrap();
        assert_eq!(reader.len().unwrap(), expected.len() as u64 + 1, "{what}");
        assert!(reader.verify().unwrap().is_ok(), "{what}");
        drop(reader);
        // repair as well, on a fresh copy of the damage.
        Store::repair(&path).unwrap();
        let reader = Store::open(&path, Mode::ReadOnly).unwrap();
        assert!(reader.verify().unwrap().is_ok(), "{what} after repair");
        assert_eq!(reader.len().unwrap(), expected.len() as u64 + 1, "{what}");
    }
}

/// Copies the store at `from` to `to` as it is (`cp -a`).
fn copy_store(from: &Path, to: &Path) {
    assert!(std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success());
}

/// Damages the newest checkpoint of the store at `path` as `what` says.
fn damage_newest_checkpoint(path: &Path, what: &str) {
    let newest = checkpoints(path).pop().unwrap();
    match what {
        "truncated" => fs::File::options()
            .write(true)
            .open(&newest)
            .unwrap()
            .set_len(100)
            .unwrap(),
        "a run missing" => {
            let doc = fs::read(&newest).unwrap();
            for e in fs::read_dir(path.join(CHECKPOINT_DIR)).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_str().unwrap().to_owned();
                let listed = doc.windows(name.len()).any(|w| w == name.as_bytes());
                if p.extension().is_some_and(|e| e == "run") && listed {
                    fs::remove_file(p).unwrap();
                }
            }
        }
        _ => fs::write(
            path.join(CHECKPOINT_DIR).join("ffffffffffffffff.ckpt"),
            b"junk",
        )
        .unwrap(),
    }
}

#[test]
fn a_damaged_checkpoint_whose_journal_is_gone_is_refused_never_read_as_empty_and_repair_salvages_it(
) {
    // Since 1.6 the journal a checkpoint covers goes once no reader needs
    // it: the checkpoint alone holds those records.
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    assert_eq!(lazyvault_store::journal::segments(&path).unwrap(), []);
    for what in ["truncated", "a run missing"] {
        let copy = dir.path().join(format!("gone-{}", what.replace(' ', "-")));
        copy_store(&path, &copy);
        damage_newest_checkpoint(&copy, what);
        assert!(
            matches!(Store::open(&copy, Mode::ReadOnly), Err(Error::Corrupt(_))),
            "{what}"
        );
        assert!(
            matches!(Store::open(&copy, Mode::Append), Err(Error::Corrupt(_))),
            "{what}"
        );
        // repair keeps what can be read, and says what it could not.
        let report = Store::repair(&copy).unwrap();
        let (records, said) = match what {
            // the run is intact: all of it
            "truncated" => (20, "no checkpoint document can be read"),
            // the run is gone: so are its records
            _ => (0, "records are lost"),
        };
        assert!(
            report.skipped.iter().any(|s| s.contains(said)),
            "{what}: {:?}",
            report.skipped
        );
        assert_eq!(report.records, records, "{what}");
    }
}

#[test]
fn a_store_removed_under_a_reader_is_not_found_on_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    fs::remove_dir_all(&path).unwrap();
    assert!(matches!(
        reader.refresh(),
        Err(Error::Open(OpenError::NotFound(_)))
    ));
    assert_eq!(reader.len().unwrap(), 20); // the snapshot it had
}

#[test]
fn gc_counts_the_retired_payloads_it_removes() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    let writer = Store::open(&path, Mode::Append).unwrap();
    writer.set_retention(Duration::ZERO);
    put(&writer, "k00", 50);
    writer.flush().unwrap(); // the reader's pin keeps the old payload
    drop(reader);
    let gc = writer.gc().unwrap();
    assert_eq!(gc.removed_files, 1, "{gc:?}");
    assert!(gc.removed_bytes > 100, "{gc:?}");
}

#[test]
fn journal_segments_stay_consecutive_for_readers_to_probe() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let numbers = |path: &Path| -> Vec<u64> {
        let mut n: Vec<u64> = fs::read_dir(path.join("journal"))
            .unwrap()
            .map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                u64::from_str_radix(name.trim_end_matches(".log"), 16).unwrap()
            })
            .collect();
        n.sort();
        n
    };
    for round in 0..5 {
        let w = Store::open(&path, Mode::Append).unwrap();
        put(&w, "k01", 100 + round);
        w.close().unwrap();
        if round == 2 {
            // What a session killed before its first commit leaves: a
            // segment holding only an unacknowledged put. The next writer
            // removes it and reuses its number.
            // (The closed store's checkpoint covers every segment: the
            // next one is the number its position names.)
            let (stray, mut bytes) = records::tail_segment(&path);
            assert_eq!(bytes.len(), 16, "a new segment");
            bytes.extend_from_slice(&lazyvault_store::journal::encode(
                &lazyvault_store::journal::Entry {
                    key: "k02".into(),
                    change: lazyvault_store::journal::Change::Put {
                        record: br#"{"meta":{"v":999},"arrays":{},"layout":null}"#.to_vec(),
                        pickle: None,
                    },
                },
            ));
            fs::write(&stray, bytes).unwrap();
            // readers ignore it: no commit covers it
            let r = Store::open(&path, Mode::ReadOnly).unwrap();
            assert_eq!(values(&r)["k02"], 2);
        }
    }
    let n = numbers(&path);
    assert!(n.windows(2).all(|w| w[1] == w[0] + 1), "{n:?}");
    let r = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(values(&r)["k01"], 104);
    assert_eq!(values(&r)["k02"], 2);
    assert_eq!(r.len().unwrap(), 20);
}

#[test]
fn a_reader_of_a_store_never_closed_keeps_its_payloads_too() {
    // Found by a trial: a new store that was only flushed had no
    // checkpoint, so its readers pinned nothing and lost their payloads.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let writer = Store::open(&path, Mode::Create).unwrap();
    writer.set_retention(Duration::ZERO);
    put(&writer, "k", 1);
    writer.flush().unwrap();
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    let old = reader.get("k").unwrap().unwrap();
    put(&writer, "k", 2);
    writer.flush().unwrap();
    writer.gc().unwrap();
    assert_eq!(
        map_payload(&path, &old.arrays["x"]).unwrap().as_bytes(),
        &[1u8; 100][..]
    );
    drop(reader);
    writer.gc().unwrap();
    assert!(map_payload(&path, &old.arrays["x"]).is_err());
}

#[test]
fn repair_keeps_what_damaged_or_lost_checkpoint_files_still_hold() {
    // Since 2.0 a closed store keeps its records in its checkpoint only: a
    // damaged one is salvaged, never read as empty, and nothing is deleted.
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let expected = values(&Store::open(&path, Mode::ReadOnly).unwrap());
    let runs = |p: &Path| -> Vec<PathBuf> {
        let mut r: Vec<PathBuf> = fs::read_dir(p.join(CHECKPOINT_DIR))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "run"))
            .collect();
        r.sort();
        r
    };
    for what in [
        "the checkpoint's CRC",
        "the checkpoint's JSON",
        "no checkpoint file",
        "one run entry",
    ] {
        let copy = dir
            .path()
            .join(format!("salvage-{}", what.replace(' ', "-")));
        copy_store(&path, &copy);
        let ckpt = checkpoints(&copy).pop().unwrap();
        let mut bytes = fs::read(&ckpt).unwrap();
        match what {
            "the checkpoint's CRC" => {
                let n = bytes.len();
                bytes[n - 1] ^= 1;
                fs::write(&ckpt, &bytes).unwrap();
            }
            "the checkpoint's JSON" => {
                bytes[12] = b'x'; // its opening brace
                fs::write(&ckpt, &bytes).unwrap();
            }
            "no checkpoint file" => fs::remove_file(&ckpt).unwrap(),
            _ => {
                let run = runs(&copy).pop().unwrap();
                let mut r = fs::read(&run).unwrap();
                r[64 + 30] ^= 0x20; // inside the first entry's key or record
                fs::write(&run, &r).unwrap();
            }
        }
        let files_before = runs(&copy);
        // Never an empty store: a clear error naming repair (a damaged run
        // entry shows at the first read of it instead).
        if what != "one run entry" {
            match Store::open(&copy, Mode::ReadOnly) {
                Err(Error::Corrupt(c)) => {
                    assert!(c.to_string().contains("repair"), "{what}: {c}")
                }
                Ok(s) => panic!("{what}: opened with {} records", s.len().unwrap()),
                Err(e) => panic!("{what}: {e}"),
            }
        }
        let report = Store::repair(&copy).unwrap();
        assert!(!report.skipped.is_empty(), "{what}: repair said nothing");
        for run in &files_before {
            assert!(run.exists(), "{what}: repair deleted {}", run.display());
        }
        let reader = Store::open(&copy, Mode::ReadOnly).unwrap();
        let got = values(&reader);
        if what == "one run entry" {
            // that one record is lost, and said so; the others are kept
            assert_eq!(got.len(), expected.len() - 1, "{what}");
            assert!(
                report.skipped.iter().any(|s| s.contains("1 damaged span")),
                "{what}: {:?}",
                report.skipped
            );
            assert!(got.iter().all(|(k, v)| expected[k] == *v), "{what}");
        } else {
            assert_eq!(got, expected, "{what}: {:?}", report.skipped);
        }
        drop(reader);
        // A writer session then clears the damaged files; verify is clean.
        let writer = Store::open(&copy, Mode::Append).unwrap();
        put(&writer, "after", 1);
        writer.close().unwrap();
        let reader = Store::open(&copy, Mode::ReadOnly).unwrap();
        let report = reader.verify().unwrap();
        assert!(report.problems.is_empty(), "{what}: {:?}", report.problems);
    }
}

#[test]
fn repair_reads_runs_past_a_damaged_header_and_names_what_may_be_stale() {
    // A fresh user's second trial: a damaged newer run lost its records and
    // let an older run's versions (and deleted keys) back in, unnamed.
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path()); // k00..k19, v = i
    let w = Store::open(&path, Mode::Append).unwrap();
    put(&w, "k03", 333);
    assert!(w.delete("k05").unwrap());
    w.close().unwrap();
    let ckpt = checkpoints(&path).pop().unwrap();
    let doc = fs::read(&ckpt).unwrap();
    let text = String::from_utf8_lossy(&doc[12..doc.len() - 4]).into_owned();
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["runs"].as_array().unwrap().len(), 2, "{doc}");
    let newest = path
        .join(CHECKPOINT_DIR)
        .join(doc["runs"][0]["file"].as_str().unwrap());
    let expected = values(&Store::open(&path, Mode::ReadOnly).unwrap());
    for what in ["header", "trailer cut", "bytes appended", "the k03 entry"] {
        let copy = dir.path().join(format!("stale-{}", what.replace(' ', "-")));
        copy_store(&path, &copy);
        let run = copy.join(newest.strip_prefix(&path).unwrap());
        let mut bytes = fs::read(&run).unwrap();
        match what {
            "header" => bytes[0] ^= 0xFF,
            "trailer cut" => bytes.truncate(bytes.len() - 8),
            "bytes appended" => bytes.extend_from_slice(&[0; 8]),
            _ => {
                let at = bytes.windows(3).position(|w| w == b"k03").unwrap();
                bytes[at + 5] ^= 0x20;
            }
        }
        fs::write(&run, &bytes).unwrap();
        let report = Store::repair(&copy).unwrap();
        let got = values(&Store::open(&copy, Mode::ReadOnly).unwrap());
        if what == "the k03 entry" {
            // k03's newer entry is lost: the older value comes back, named
            assert_eq!(got["k03"], 3);
            assert!(!got.contains_key("k05"));
            assert!(
                report
                    .skipped
                    .iter()
                    .any(|s| s.contains("may be an older version") && s.contains("k03")),
                "{:?}",
                report.skipped
            );
        } else {
            assert_eq!(got, expected, "{what}: {:?}", report.skipped);
        }
    }
}

#[test]
fn verify_reports_a_damaged_run_entry_instead_of_failing() {
    // A fresh user's trial: verify raised the run's CorruptError.
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path());
    let run = fs::read_dir(path.join(CHECKPOINT_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "run"))
        .unwrap();
    let mut bytes = fs::read(&run).unwrap();
    let at = bytes.windows(3).position(|w| w == b"k07").unwrap();
    bytes[at + 5] ^= 0x20;
    fs::write(&run, &bytes).unwrap();
    for mode in [Mode::ReadOnly, Mode::Append] {
        let store = Store::open(&path, mode).unwrap();
        let report = store.verify().unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains("CRC-32") && p.contains("repair")),
            "{:?}",
            report.problems
        );
    }
}
