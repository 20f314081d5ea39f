//! Packs written before 1.6's short member names (members `<id>.npy`, 36
//! bytes, their alignment padding repeated in the central directory) are
//! still read, verified, compacted by `gc()` and merged (FORMAT.md, "Packs").
//!
//! Its own test binary: the switch to the old layout is process-wide.

use std::fs;
use std::path::{Path, PathBuf};

use lazyvault_store::{legacy, load_payload, ArraySource, Mode, NewRecord, Store};
use serde_json::{Map, Value};

#[path = "common/records.rs"]
mod records;
use records::u8_array;

/// The packs of the store at `root`.
fn packs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in fs::read_dir(root.join("arrays")).unwrap() {
        for f in fs::read_dir(sub.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|e| e == "npz") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The member names of the pack at `path`, and whether each has an extra
/// field in the central directory.
fn members(path: &Path) -> Vec<(String, bool)> {
    let mut zip = zip::ZipArchive::new(fs::File::open(path).unwrap()).unwrap();
    zip.validate_header_consistency().unwrap();
    (0..zip.len())
        .map(|i| {
            let m = zip.by_index_raw(i).unwrap();
            let central_extra = m.extra_data().is_some_and(|e| !e.is_empty());
            (m.name().unwrap().into_owned(), central_extra)
        })
        .collect()
}

/// A store of ten records `k0`..`k9`, each one small array in one pack,
/// written with the pack layout before 1.6.
fn old_store(path: &Path, datas: &[Vec<u8>]) -> Vec<String> {
    let keys: Vec<String> = (0..datas.len()).map(|i| format!("k{i}")).collect();
    let srcs: Vec<[ArraySource; 1]> = datas.iter().map(|d| [u8_array("x", d)]).collect();
    let batch = keys
        .iter()
        .zip(&srcs)
        .map(|(key, arrays)| NewRecord {
            key,
            meta: Map::new(),
            layout: Value::Null,
            arrays,
            pickle: None,
        })
        .collect();
    legacy::write_old_packs(true);
    let store = Store::open(path, Mode::Create).unwrap();
    store.put_many(batch).unwrap();
    store.close().unwrap();
    legacy::write_old_packs(false);
    keys
}

fn check_records(store: &Store, root: &Path, keys: &[String], datas: &[Vec<u8>]) {
    for (key, data) in keys.iter().zip(datas) {
        let record = store.get(key).unwrap().unwrap();
        let got = load_payload(root, &record.arrays["x"]).unwrap();
        assert_eq!(got.as_bytes(), &data[..], "{key}");
    }
}

#[test]
fn old_packs_are_read_verified_compacted_and_merged() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src.lv"), dir.path().join("dst.lv"));
    let datas: Vec<Vec<u8>> = (0..10).map(|i| vec![i as u8; 500 + i]).collect();
    let keys = old_store(&src, &datas);

    // the old layout: full ids, the padding repeated in the central directory
    let [old] = <[PathBuf; 1]>::try_from(packs(&src)).unwrap();
    let names = members(&old);
    assert_eq!(names.len(), 10);
    assert!(
        names.iter().all(|(n, extra)| n.len() == 36 && *extra),
        "{names:?}"
    );

    // read and verified as they are
    let store = Store::open(&src, Mode::Append).unwrap();
    store.set_retention(std::time::Duration::ZERO);
    check_records(&store, &src, &keys, &datas);
    assert!(store.verify().unwrap().is_ok());

    // merged: the old pack is linked, its members read in the target
    let target = Store::open(&dst, Mode::Append).unwrap();
    target.set_retention(std::time::Duration::ZERO);
    let merged = target
        .merge(std::slice::from_ref(&src), &mut |_, _| Ok(()))
        .unwrap();
    assert_eq!(merged.len(), 10);
    check_records(&target, &dst, &keys, &datas);
    assert!(target.verify().unwrap().is_ok());

    // compacted: 8 of 10 dead, gc moves the other two into a new-style pack
    for key in &keys[..8] {
        store.delete(key).unwrap();
    }
    assert_eq!(store.gc().unwrap().packs_compacted, 1);
    let [new] = <[PathBuf; 1]>::try_from(packs(&src)).unwrap();
    assert_ne!(new, old);
    let names = members(&new);
    assert_eq!(names.len(), 2);
    for (key, (name, extra)) in keys[8..].iter().zip(&names) {
        let entry = &store.get(key).unwrap().unwrap().arrays["x"];
        assert_eq!(name, &format!("{}.npy", &entry.id[..24]));
        assert!(!extra, "no padding in the central directory");
        assert_eq!(entry.pack_offset.unwrap() % 64, 0);
    }
    check_records(&store, &src, &keys[8..], &datas[8..]);
    assert!(store.verify().unwrap().is_ok());
    store.close().unwrap();

    // the target still reads its linked old pack, and compacts it too
    for key in &keys[..8] {
        target.delete(key).unwrap();
    }
    assert_eq!(target.gc().unwrap().packs_compacted, 1);
    check_records(&target, &dst, &keys[8..], &datas[8..]);
    assert!(target.verify().unwrap().is_ok());
}
