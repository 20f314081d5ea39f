//! Packs kept open between reads of their members: the reads see what they
//! saw before (every check still runs), a pack removed by another process
//! is still read from the kept descriptor until the reader refreshes, a
//! pack lazyvault removes is closed first, and only a few are kept.

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use lazyvault_store::schema::ArrayEntry;
use lazyvault_store::{load_payload, read_payload, Error, Mode, NewRecord, Store};
use serde_json::{Map, Value};

#[path = "common/records.rs"]
mod records;
use records::u8_array;

/// The kept packs are the process's: the tests here take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The open descriptors of this process on files under `dir`.
fn fds_under(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|f| fs::read_link(f.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// A store at `path` holding records `a` and `b` (arrays of 100 bytes of
/// 1 and of 2) in one pack.
fn two_in_one_pack(path: &Path) -> (ArrayEntry, ArrayEntry) {
    let store = Store::open(path, Mode::Append).unwrap();
    let (a, b) = ([u8_array("x", &[1; 100])], [u8_array("x", &[2; 100])]);
    let record = |key, arrays| NewRecord {
        key,
        meta: Map::new(),
        layout: Value::Null,
        arrays,
        pickle: None,
    };
    store
        .put_many(vec![record("a", &a[..]), record("b", &b[..])])
        .unwrap();
    let entry = |k| store.get(k).unwrap().unwrap().arrays["x"].clone();
    let (a, b) = (entry("a"), entry("b"));
    assert_eq!(a.pack, b.pack, "one pack");
    assert!(a.pack.is_some());
    store.close().unwrap();
    (a, b)
}

#[test]
#[cfg(target_os = "linux")]
fn a_read_pack_stays_open_and_serves_its_members_after_another_process_removed_it() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let (a, b) = two_in_one_pack(&path);
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    let pack = reader.root().join(a.relpath());
    assert!(fds_under(&path.join("arrays")).is_empty());
    assert_eq!(
        load_payload(reader.root(), &a).unwrap().as_bytes(),
        [1; 100]
    );
    assert_eq!(
        fds_under(&path.join("arrays")),
        std::slice::from_ref(&pack),
        "the pack is kept open"
    );
    // as another process's gc would (the bytes of a pack never change)
    fs::remove_file(&pack).unwrap();
    assert_eq!(
        load_payload(reader.root(), &b).unwrap().as_bytes(),
        [2; 100]
    );
    assert_eq!(read_payload(reader.root(), &b).unwrap(), [2; 100]);
    // verify looks at the files, not at what is kept open
    let report = reader.verify().unwrap();
    assert_eq!(report.problems.len(), 2, "{report:?}");
    assert!(report.problems[0].contains("missing"), "{report:?}");
    // a newer snapshot no longer protects the old packs: they are let go
    reader.refresh().unwrap();
    assert!(fds_under(&path.join("arrays")).is_empty());
    let err = load_payload(reader.root(), &b).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    assert!(err.to_string().contains("file is missing"), "{err}");
}

#[test]
#[cfg(target_os = "linux")]
fn closing_a_reader_closes_its_packs() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let (a, _) = two_in_one_pack(&path);
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    load_payload(reader.root(), &a).unwrap();
    assert_eq!(fds_under(&path.join("arrays")).len(), 1);
    reader.close().unwrap();
    assert!(fds_under(&path.join("arrays")).is_empty());
}

#[test]
#[cfg(target_os = "linux")]
fn a_pack_the_store_removes_is_closed_first() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let (a, b) = two_in_one_pack(&path);
    let store = Store::open(&path, Mode::Append).unwrap();
    store.set_retention(std::time::Duration::ZERO);
    let pack = store.root().join(a.relpath());
    load_payload(store.root(), &a).unwrap();
    assert_eq!(fds_under(&path.join("arrays")), std::slice::from_ref(&pack));
    store.delete("a").unwrap();
    store.delete("b").unwrap();
    store.flush().unwrap();
    store.gc().unwrap();
    assert!(!pack.exists());
    // no descriptor left on the removed pack (its space is freed)
    assert!(
        fds_under(&path.join("arrays")).is_empty(),
        "{:?}",
        fds_under(&path.join("arrays"))
    );
    assert!(load_payload(store.root(), &b).is_err());
}

#[test]
fn a_kept_pack_is_checked_on_every_read() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let (a, b) = two_in_one_pack(&path);
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    load_payload(reader.root(), &a).unwrap();
    // damage b's header in place: the kept descriptor sees it
    let mut file = fs::OpenOptions::new()
        .write(true)
        .open(reader.root().join(b.relpath()))
        .unwrap();
    file.seek(SeekFrom::Start(b.pack_offset.unwrap())).unwrap();
    file.write_all(b"\x00NOTNPY").unwrap();
    drop(file);
    let err = load_payload(reader.root(), &b).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    // a record whose fields differ from the header it points at is refused
    // right after a read of that same header was accepted
    load_payload(reader.root(), &a).unwrap();
    let mut reshaped = a.clone();
    reshaped.shape = vec![50, 2];
    let err = load_payload(reader.root(), &reshaped).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    load_payload(reader.root(), &a).unwrap();
    // and a record saying more than the pack holds is refused, never read
    let mut long = a.clone();
    long.pack_offset = Some(a.pack_offset.unwrap() + (1 << 30));
    let err = load_payload(reader.root(), &long).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
}

#[test]
#[cfg(target_os = "linux")]
fn at_most_64_packs_are_kept_open() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    let data: Vec<[u8; 8]> = (0..100u8).map(|i| [i; 8]).collect();
    for (i, d) in data.iter().enumerate() {
        let arrays = [u8_array("x", d)];
        store
            .put(&format!("k{i}"), Map::new(), Value::Null, &arrays, None)
            .unwrap();
    }
    store.close().unwrap();
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    for round in 0..2 {
        for (i, d) in data.iter().enumerate() {
            let entry = reader.get(&format!("k{i}")).unwrap().unwrap().arrays["x"].clone();
            assert_eq!(load_payload(reader.root(), &entry).unwrap().as_bytes(), d);
        }
        let open = fds_under(&path.join("arrays")).len();
        assert!((1..=64).contains(&open), "round {round}: {open} packs open");
    }
}

/// Packs are kept by store directory and id: a copy of a store has the
/// same pack ids, and each copy's reads come from its own file.
#[test]
fn a_copied_store_reads_its_own_packs() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (path, copy) = (dir.path().join("s.lv"), dir.path().join("copy.lv"));
    let (a, _) = two_in_one_pack(&path);
    let pack = a.relpath();
    fs::create_dir_all(copy.join(&pack).parent().unwrap()).unwrap();
    let mut bytes = fs::read(path.join(&pack)).unwrap();
    // the copy's member of `a` holds 7s instead of 1s
    let data = (a.pack_offset.unwrap() + a.data_offset) as usize;
    bytes[data..data + 100].fill(7);
    fs::write(copy.join(&pack), &bytes).unwrap();
    for _ in 0..2 {
        assert_eq!(load_payload(&path, &a).unwrap().as_bytes(), [1; 100]);
        assert_eq!(load_payload(&copy, &a).unwrap().as_bytes(), [7; 100]);
    }
}
