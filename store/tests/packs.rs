//! Packs: small arrays of one put (or one `put_many` batch) are members of
//! one uncompressed zip of 64-byte aligned `.npy` members instead of one
//! file each (FORMAT.md, "Packs").

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use lazyvault_store::schema::ArrayEntry;
use lazyvault_store::{
    load_payload, map_payload, npy, read_payload, ArraySource, Mode, NewRecord, Store,
    READ_MAX_BYTES,
};
use serde_json::{json, Map, Value};

#[path = "common/records.rs"]
mod records;
use records::{meta, u8_array};

/// Every file under `arrays/`, by extension.
/// One record per key with its arrays, each with this metadata and pickle,
/// for one `put_many` batch.
fn records<'a, A: AsRef<[ArraySource<'a>]>>(
    keys: &'a [String],
    arrays: &'a [A],
    meta: Map<String, Value>,
    pickle: Option<&'a [u8]>,
) -> Vec<NewRecord<'a>> {
    keys.iter()
        .zip(arrays)
        .map(|(key, arrays)| NewRecord {
            key,
            meta: meta.clone(),
            layout: Value::Null,
            arrays: arrays.as_ref(),
            pickle,
        })
        .collect()
}

fn files(root: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut npy, mut npz) = (Vec::new(), Vec::new());
    for sub in fs::read_dir(root.join("arrays")).unwrap() {
        for f in fs::read_dir(sub.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            match p.extension().and_then(|e| e.to_str()) {
                Some("npy") => npy.push(p),
                Some("npz") => npz.push(p),
                other => panic!("unexpected file {p:?} ({other:?})"),
            }
        }
    }
    (npy, npz)
}

struct Arr {
    name: &'static str,
    descr: &'static str,
    dtype: &'static str,
    shape: Vec<u64>,
    fortran: bool,
    data: Vec<u8>,
}

fn arr(name: &'static str, descr: &'static str, shape: Vec<u64>, itemsize: usize) -> Arr {
    let n: u64 = shape.iter().product();
    Arr {
        name,
        descr,
        dtype: "x",
        shape,
        fortran: false,
        data: (0..n as usize * itemsize)
            .map(|i| (i * 7 + name.len()) as u8)
            .collect(),
    }
}

/// Arrays of every kind of dtype and layout a pack must hold.
fn every_kind() -> Vec<Arr> {
    vec![
        arr("f8", "'<f8'", vec![5], 8),
        arr("big-endian", "'>i4'", vec![3, 2], 4),
        arr("bool", "'|b1'", vec![4], 1),
        arr("complex", "'<c16'", vec![2], 16),
        arr("half", "'<f2'", vec![7], 2),
        arr("datetime", "'<M8[ns]'", vec![2], 8),
        arr("bytes", "'|S5'", vec![3], 5),
        arr("unicode", "'<U3'", vec![2], 12),
        arr(
            "structured",
            "[('x', '<i4'), ('y', '>f8', (2,))]",
            vec![3],
            20,
        ),
        Arr {
            fortran: true,
            ..arr("fortran", "'<f4'", vec![2, 3], 4)
        },
        arr("0-d", "'<i8'", vec![], 8),
        arr("zero-size", "'<f4'", vec![0, 3], 4),
        arr("one-byte", "'|u1'", vec![1], 1),
    ]
}

fn sources(arrays: &[Arr]) -> Vec<ArraySource<'_>> {
    arrays
        .iter()
        .map(|a| ArraySource {
            name: a.name.into(),
            descr: a.descr.into(),
            dtype: a.dtype.into(),
            shape: a.shape.clone(),
            fortran_order: a.fortran,
            data: &a.data,
            pickled: false,
        })
        .collect()
}

#[test]
fn small_arrays_of_every_kind_round_trip_through_one_pack() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let arrays = every_kind();
    let srcs = sources(&arrays);
    store
        .put("k", meta(json!({"t": 1})), Value::Null, &srcs, None)
        .unwrap();
    let (npy_files, packs) = files(store.root());
    assert!(npy_files.is_empty(), "{npy_files:?}");
    assert_eq!(packs.len(), 1, "one pack per put");
    let record = store.get("k").unwrap().unwrap();
    let pack = record.arrays.values().next().unwrap().pack.clone().unwrap();
    assert_eq!(
        packs[0].file_name().unwrap().to_str().unwrap(),
        format!("{pack}.npz")
    );
    let mut ids = BTreeSet::new();
    for a in &arrays {
        let entry = &record.arrays[a.name];
        assert_eq!(entry.pack.as_deref(), Some(&*pack), "{}", a.name);
        assert!(ids.insert(entry.id.clone()), "ids are unique");
        assert_eq!((entry.npy_start() + entry.data_offset) % 64, 0);
        let loaded = load_payload(store.root(), entry).unwrap();
        assert_eq!(loaded.as_bytes(), &a.data[..], "{}", a.name);
        assert!(!loaded.is_mapped());
        if !a.data.is_empty() {
            assert_eq!(loaded.as_bytes().as_ptr() as usize % 64, 0, "aligned");
        }
        assert_eq!(
            map_payload(store.root(), entry).unwrap().as_bytes(),
            &a.data[..]
        );
        assert_eq!(read_payload(store.root(), entry).unwrap(), a.data);
    }
    // a reader reads them the same way
    store.close().unwrap();
    let reader = Store::open(dir.path().join("s.lv"), Mode::ReadOnly).unwrap();
    let record = reader.get("k").unwrap().unwrap();
    for a in &arrays {
        let got = load_payload(reader.root(), &record.arrays[a.name]).unwrap();
        assert_eq!(got.as_bytes(), &a.data[..], "{}", a.name);
    }
}

#[test]
fn the_pack_is_a_zip_of_standard_aligned_npy_members() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let arrays = every_kind();
    store
        .put("k", Map::new(), Value::Null, &sources(&arrays), None)
        .unwrap();
    let record = store.get("k").unwrap().unwrap();
    let (_, packs) = files(store.root());
    let bytes = fs::read(&packs[0]).unwrap();
    let mut zip = zip::ZipArchive::new(fs::File::open(&packs[0]).unwrap()).unwrap();
    assert_eq!(zip.len(), arrays.len());
    // local headers agree with the central directory (which lacks the padding)
    zip.validate_header_consistency().unwrap();
    let mut starts = Vec::new();
    for a in &arrays {
        let entry = &record.arrays[a.name];
        // since 1.6: the first 24 digits of the id
        let name = format!("{}.npy", &entry.id[..24]);
        let mut member = zip.by_name(&name).unwrap();
        assert_eq!(member.compression(), zip::CompressionMethod::Stored);
        // the alignment field is in the local header only
        assert_eq!(member.extra_data().unwrap_or_default(), Vec::<u8>::new());
        let start = member.data_start().unwrap();
        assert_eq!(start, entry.pack_offset.unwrap(), "{}", a.name);
        assert_eq!(start % 64, 0, "{}: member data 64-byte aligned", a.name);
        // local header (30 B), name (28 B), alignment field (6 B at least)
        let local = start - member.header_start();
        assert!((64..128).contains(&local), "{}: {local}", a.name);
        starts.push((member.header_start(), local));
        let mut npy_bytes = Vec::new();
        member.read_to_end(&mut npy_bytes).unwrap(); // checks the CRC-32
        assert_eq!(
            npy_bytes,
            bytes[start as usize..(start + entry.data_offset + entry.nbytes) as usize]
        );
        let header = npy::parse_header(&npy_bytes, 10_000).unwrap();
        assert_eq!(header.descr, entry.descr);
        assert_eq!(header.shape, entry.shape);
        assert_eq!(header.fortran_order, a.fortran);
        assert_eq!(header.data_offset, entry.data_offset);
        assert_eq!(&npy_bytes[entry.data_offset as usize..], &a.data[..]);
    }
    // a member starting 64-byte aligned (the first) has a 64-byte local header
    starts.sort_unstable();
    assert_eq!(starts[0], (0, 64));
}

#[test]
fn the_64_kib_boundary_packs_at_most_read_max_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let max = READ_MAX_BYTES as usize;
    let at = vec![1u8; max];
    let over = vec![2u8; max + 1];
    let srcs = [u8_array("at", &at), u8_array("over", &over)];
    store
        .put("k", Map::new(), Value::Null, &srcs, None)
        .unwrap();
    let record = store.get("k").unwrap().unwrap();
    assert!(record.arrays["at"].pack.is_some(), "64 KiB: packed");
    assert!(record.arrays["over"].pack.is_none(), "64 KiB + 1: a file");
    let (npy_files, packs) = files(store.root());
    assert_eq!((npy_files.len(), packs.len()), (1, 1));
    assert_eq!(
        load_payload(store.root(), &record.arrays["at"])
            .unwrap()
            .as_bytes(),
        &at[..]
    );
    let over_got = load_payload(store.root(), &record.arrays["over"]).unwrap();
    assert!(over_got.is_mapped());
    assert_eq!(over_got.as_bytes(), &over[..]);
}

#[test]
fn one_pack_per_put_and_per_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let datas: Vec<Vec<u8>> = (0..300).map(|i| vec![i as u8; 10 + i]).collect();
    // one batch of 100 records of 3 arrays: one pack
    let names = ["a", "b", "c"];
    let srcs: Vec<Vec<ArraySource>> = (0..100)
        .map(|i| {
            (0..3)
                .map(|j| u8_array(names[j], &datas[i * 3 + j]))
                .collect()
        })
        .collect();
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    store
        .put_many(records(&keys, &srcs, Map::new(), None))
        .unwrap();
    assert_eq!(files(store.root()).1.len(), 1);
    // three puts: three more packs
    for (i, data) in datas.iter().take(3).enumerate() {
        store
            .put(
                &format!("p{i}"),
                Map::new(),
                Value::Null,
                &[u8_array("x", data)],
                None,
            )
            .unwrap();
    }
    assert_eq!(files(store.root()).1.len(), 4);
    // a put with no array writes no pack
    store
        .put("none", Map::new(), Value::Null, &[], None)
        .unwrap();
    assert_eq!(files(store.root()).1.len(), 4);
    for (i, key) in keys.iter().enumerate() {
        let record = store.get(key).unwrap().unwrap();
        for (j, name) in names.iter().enumerate() {
            let got = load_payload(store.root(), &record.arrays[*name]).unwrap();
            assert_eq!(got.as_bytes(), &datas[i * 3 + j][..]);
        }
    }
}

/// The pack file of `entry` under `root`.
fn pack_of(root: &Path, entry: &ArrayEntry) -> PathBuf {
    root.join(entry.relpath())
}

#[test]
fn a_pack_lives_while_any_record_uses_it_and_gc_removes_it_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store.set_retention(std::time::Duration::ZERO);
    let (a, b) = (vec![1u8; 100], vec![2u8; 100]);
    let (a_srcs, b_srcs) = ([u8_array("x", &a)], [u8_array("x", &b)]);
    let batch = vec![
        NewRecord {
            key: "a",
            meta: Map::new(),
            layout: Value::Null,
            arrays: &a_srcs,
            pickle: None,
        },
        NewRecord {
            key: "b",
            meta: Map::new(),
            layout: Value::Null,
            arrays: &b_srcs,
            pickle: None,
        },
    ];
    store.put_many(batch).unwrap();
    let b_entry = store.get("b").unwrap().unwrap().arrays["x"].clone();
    let pack = pack_of(&path, &b_entry);
    // "a" overwritten, then deleted: "b" still reads, the pack stays
    store
        .put(
            "a",
            Map::new(),
            Value::Null,
            &[u8_array("x", &[3; 50])],
            None,
        )
        .unwrap();
    store.flush().unwrap();
    store.delete("a").unwrap();
    store.flush().unwrap();
    assert!(pack.exists());
    store.gc().unwrap();
    assert!(pack.exists(), "b's member is live");
    assert_eq!(load_payload(&path, &b_entry).unwrap().as_bytes(), &b[..]);
    assert!(store.verify().unwrap().is_ok());
    // a reader of the snapshot holding "b" keeps its pack through gc
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    store.delete("b").unwrap();
    store.flush().unwrap();
    store.gc().unwrap();
    assert!(pack.exists(), "a reader's snapshot references it");
    let seen = reader.get("b").unwrap().unwrap();
    assert_eq!(
        load_payload(reader.root(), &seen.arrays["x"])
            .unwrap()
            .as_bytes(),
        &b[..]
    );
    drop(reader);
    let report = store.gc().unwrap();
    assert!(!pack.exists(), "no record and no snapshot uses it");
    assert!(report.removed_files >= 1);
    assert!(files(&path).1.is_empty());
    assert!(store.verify().unwrap().is_ok());
}

#[test]
fn verify_names_the_key_of_a_damaged_packed_member() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    let (a, b) = (vec![1u8; 100], vec![2u8; 200]);
    let (a_srcs, b_srcs) = ([u8_array("x", &a)], [u8_array("y", &b)]);
    let batch = vec![
        NewRecord {
            key: "good",
            meta: Map::new(),
            layout: Value::Null,
            arrays: &a_srcs,
            pickle: None,
        },
        NewRecord {
            key: "bad",
            meta: Map::new(),
            layout: Value::Null,
            arrays: &b_srcs,
            pickle: None,
        },
    ];
    store.put_many(batch).unwrap();
    store.flush().unwrap();
    assert!(store.verify().unwrap().is_ok());
    let entry = store.get("bad").unwrap().unwrap().arrays["y"].clone();
    let pack = pack_of(&path, &entry);
    let mut bytes = fs::read(&pack).unwrap();
    let at = (entry.npy_start() + entry.data_offset + 17) as usize;
    bytes[at] ^= 0x40;
    fs::write(&pack, &bytes).unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.checksum_mismatches, 1, "{report:?}");
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert!(report.problems[0].contains("\"bad\""), "{report:?}");
    assert!(report.problems[0].contains("\"y\""), "{report:?}");
    // a damaged header is refused at read time, naming the pack
    let mut bytes = fs::read(&pack).unwrap();
    bytes[entry.npy_start() as usize + 20] = b'#';
    fs::write(&pack, &bytes).unwrap();
    let err = load_payload(&path, &entry).unwrap_err();
    assert!(err.to_string().contains(".npz"), "{err}");
    // a missing pack: "file is missing", for both keys
    fs::remove_file(&pack).unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.problems.len(), 2, "{report:?}");
    assert!(report.problems.iter().any(|p| p.contains("\"good\"")));
    // (read before, the pack is kept open until the store lets it go)
    store.close().unwrap();
    let err = load_payload(&path, &entry).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn hostile_packed_entries_are_refused_without_big_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store
        .put(
            "k",
            Map::new(),
            Value::Null,
            &[u8_array("x", &[5; 64])],
            None,
        )
        .unwrap();
    let entry = store.get("k").unwrap().unwrap().arrays["x"].clone();
    // says more data than a pack member holds
    let huge = ArrayEntry {
        nbytes: u64::MAX / 2,
        shape: vec![u64::MAX / 2],
        ..entry.clone()
    };
    assert!(load_payload(&path, &huge).is_err());
    // a member past the end of the pack
    let far = ArrayEntry {
        pack_offset: Some(1 << 40),
        ..entry.clone()
    };
    let err = load_payload(&path, &far).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    // a pack id that is not hex never reaches the file system
    let evil = ArrayEntry {
        pack: Some("../../../../../../etc/passwd".into()),
        ..entry.clone()
    };
    assert!(load_payload(&path, &evil).is_err());
    // an offset that is not where the member is
    let shifted = ArrayEntry {
        pack_offset: Some(entry.pack_offset.unwrap() + 64),
        ..entry
    };
    assert!(load_payload(&path, &shifted).is_err());
}

#[test]
fn a_pack_whose_members_all_died_this_session_goes_at_the_next_flush() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store.set_retention(std::time::Duration::ZERO);
    let data = vec![7u8; 100];
    let srcs = [u8_array("a", &data), u8_array("b", &data)];
    store
        .put("k", Map::new(), Value::Null, &srcs, None)
        .unwrap();
    store.flush().unwrap();
    let pack = pack_of(&path, &store.get("k").unwrap().unwrap().arrays["a"]);
    // one member replaced: the pack stays (the other is live)
    assert!(store
        .replace_arrays("k", &[u8_array("a", &[1; 10])])
        .unwrap());
    store.flush().unwrap();
    assert!(pack.exists());
    // the other too: no member left, the pack goes with the flush
    assert!(store
        .replace_arrays("k", &[u8_array("b", &[2; 10])])
        .unwrap());
    store.flush().unwrap();
    assert!(!pack.exists());
    let record = store.get("k").unwrap().unwrap();
    assert_eq!(
        load_payload(&path, &record.arrays["a"]).unwrap().as_bytes(),
        &[1; 10]
    );
    assert_eq!(
        load_payload(&path, &record.arrays["b"]).unwrap().as_bytes(),
        &[2; 10]
    );
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "{report:?}");
    // two packs are left, the second one's member "a" dead: an orphan only
    // when every member is dead
    assert!(report.orphans.is_empty(), "{report:?}");
    // deaths of an earlier session are not known: the pack waits for gc
    store
        .put("k2", Map::new(), Value::Null, &srcs, None)
        .unwrap();
    let shared = pack_of(&path, &store.get("k2").unwrap().unwrap().arrays["a"]);
    assert!(store
        .replace_arrays("k2", &[u8_array("a", &[3; 10])])
        .unwrap());
    store.close().unwrap();
    let store = Store::open(&path, Mode::Append).unwrap();
    store.set_retention(std::time::Duration::ZERO);
    let record = store.get("k").unwrap().unwrap();
    let b_pack = pack_of(&path, &record.arrays["b"]);
    assert!(store.delete("k").unwrap());
    assert!(store.delete("k2").unwrap());
    store.flush().unwrap();
    assert!(!b_pack.exists(), "one member, dead this session");
    assert!(
        shared.exists(),
        "its member \"a\" died in the earlier session"
    );
    store.gc().unwrap();
    assert!(!shared.exists(), "no record uses it");
    assert!(files(&path).1.is_empty());
}

#[test]
fn gc_compacts_a_mostly_dead_pack_and_readers_keep_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store.set_retention(std::time::Duration::ZERO);
    let datas: Vec<Vec<u8>> = (0..10).map(|i| vec![i as u8; 1000 + i]).collect();
    let srcs: Vec<[ArraySource; 1]> = datas.iter().map(|d| [u8_array("x", d)]).collect();
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    store
        .put_many(records(&keys, &srcs, meta(json!({"n": 1})), Some(b"p")))
        .unwrap();
    let old_entry = store.get("k9").unwrap().unwrap().arrays["x"].clone();
    let old_pack = pack_of(&path, &old_entry);
    // 4 of 10 replaced: 60% live, kept as it is
    for key in &keys[..4] {
        store
            .put(
                key,
                Map::new(),
                Value::Null,
                &[u8_array("x", &[1; 8])],
                None,
            )
            .unwrap();
    }
    assert_eq!(store.gc().unwrap().packs_compacted, 0);
    assert!(old_pack.exists());
    // 7 of 10 replaced: 30% live, rewritten
    for key in &keys[4..7] {
        store
            .put(
                key,
                Map::new(),
                Value::Null,
                &[u8_array("x", &[2; 8])],
                None,
            )
            .unwrap();
    }
    store.flush().unwrap();
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    let report = store.gc().unwrap();
    assert_eq!(report.packs_compacted, 1);
    assert!(old_pack.exists(), "the reader's snapshot still uses it");
    let seen = reader.get("k9").unwrap().unwrap();
    assert_eq!(seen.arrays["x"], old_entry);
    assert_eq!(
        load_payload(&path, &seen.arrays["x"]).unwrap().as_bytes(),
        &datas[9][..]
    );
    for (i, key) in keys.iter().enumerate().skip(7) {
        let record = store.get(key).unwrap().unwrap();
        let entry = &record.arrays["x"];
        assert_ne!(entry.pack, old_entry.pack, "moved to a new pack");
        assert_eq!(entry.checksum, seen_checksum(&reader, key));
        assert_eq!(
            load_payload(&path, entry).unwrap().as_bytes(),
            &datas[i][..]
        );
        // metadata and pickled remainder are kept
        assert_eq!(record.meta, meta(json!({"n": 1})));
        assert_eq!(store.get_pickle(key).unwrap().as_deref(), Some(&b"p"[..]));
    }
    drop(reader);
    let report = store.gc().unwrap();
    assert_eq!(report.packs_compacted, 0, "the new pack is all live");
    assert!(!old_pack.exists(), "no reader left");
    assert!(store.verify().unwrap().is_ok());
    // everything still reads after a reopen, as a reader
    store.close().unwrap();
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    for (i, key) in keys.iter().enumerate().skip(7) {
        let record = reader.get(key).unwrap().unwrap();
        assert_eq!(
            load_payload(&path, &record.arrays["x"]).unwrap().as_bytes(),
            &datas[i][..]
        );
    }
    assert!(reader.verify().unwrap().is_ok());
}

fn seen_checksum(store: &Store, key: &str) -> Option<String> {
    store.get(key).unwrap().unwrap().arrays["x"]
        .checksum
        .clone()
}

#[test]
#[cfg(target_os = "linux")]
fn a_pack_beside_many_files_takes_the_barrier_and_a_failure_leaves_nothing() {
    use lazyvault_store::fault;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    let big: Vec<Vec<u8>> = (0..9)
        .map(|i| vec![i as u8; READ_MAX_BYTES as usize + 1])
        .collect();
    let small: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8; 10 + i]).collect();
    let names: Vec<String> = (0..14).map(|i| format!("a{i}")).collect();
    let srcs: Vec<ArraySource> = big
        .iter()
        .chain(&small)
        .zip(&names)
        .map(|(d, n)| u8_array(n, d))
        .collect();
    // the barrier's syncfs fails: nothing is left, not even the pack's .tmp
    fault::fail_nth_of("syncfs", 1, 28); // ENOSPC
    let err = store.put("k", Map::new(), Value::Null, &srcs, None);
    let (_, failed) = fault::clear();
    assert!(err.is_err() && failed.len() == 1, "{err:?} {failed:?}");
    assert!(store.get("k").unwrap().is_none());
    assert_eq!(files(&path), (vec![], vec![]));
    let tmp = fs::read_dir(path.join("arrays"))
        .unwrap()
        .flat_map(|d| fs::read_dir(d.unwrap().path()).unwrap())
        .count();
    assert_eq!(tmp, 0, "no temporary file left");
    // then it works: 9 files and one pack, renamed after the barrier
    store
        .put("k", Map::new(), Value::Null, &srcs, None)
        .unwrap();
    let (npy_files, packs) = files(&path);
    assert_eq!((npy_files.len(), packs.len()), (9, 1));
    let record = store.get("k").unwrap().unwrap();
    for (src, name) in big.iter().chain(&small).zip(&names) {
        let got = load_payload(&path, &record.arrays[name]).unwrap();
        assert_eq!(got.as_bytes(), &src[..]);
    }
    store.flush().unwrap();
    assert!(store.verify().unwrap().is_ok());
}

#[test]
fn a_merged_pack_is_linked_once_and_compacted_in_the_target_only() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src.lv"), dir.path().join("dst.lv"));
    let datas: Vec<Vec<u8>> = (0..10).map(|i| vec![i as u8; 500]).collect();
    let srcs: Vec<[ArraySource; 1]> = datas.iter().map(|d| [u8_array("x", d)]).collect();
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    {
        let source = Store::open(&src, Mode::Create).unwrap();
        source
            .put_many(records(&keys, &srcs, Map::new(), None))
            .unwrap();
        source.close().unwrap();
        // a later session deletes most: the pack stays (gc's work)
        let source = Store::open(&src, Mode::Append).unwrap();
        for key in &keys[..8] {
            source.delete(key).unwrap();
        }
        source.close().unwrap();
    }
    let (_, src_packs) = files(&src);
    assert_eq!(src_packs.len(), 1);
    let target = Store::open(&dst, Mode::Append).unwrap();
    target.set_retention(std::time::Duration::ZERO);
    assert_eq!(
        target
            .merge(std::slice::from_ref(&src), &mut |_, _| Ok(()))
            .unwrap(),
        ["k8", "k9"]
    );
    // the source's pack under a second name, linked once for both records
    let (_, linked) = files(&dst);
    assert_eq!(linked.len(), 1);
    use std::os::unix::fs::MetadataExt;
    let ino = |p: &Path| fs::metadata(p).unwrap().ino();
    assert_eq!(ino(&linked[0]), ino(&src_packs[0]));
    // 2 of its 10 members are used here: gc rewrites it, the source keeps its own
    assert_eq!(target.gc().unwrap().packs_compacted, 1);
    let (_, now) = files(&dst);
    assert_eq!(now.len(), 1);
    assert_ne!(ino(&now[0]), ino(&src_packs[0]));
    assert!(src_packs[0].exists());
    for (i, key) in keys.iter().enumerate().skip(8) {
        let record = target.get(key).unwrap().unwrap();
        let got = load_payload(&dst, &record.arrays["x"]).unwrap();
        assert_eq!(got.as_bytes(), &datas[i][..]);
    }
    assert!(target.verify().unwrap().is_ok());
    let source = Store::open(&src, Mode::ReadOnly).unwrap();
    assert!(source.verify().unwrap().is_ok());
    for (i, key) in keys.iter().enumerate().skip(8) {
        let record = source.get(key).unwrap().unwrap();
        let got = load_payload(&src, &record.arrays["x"]).unwrap();
        assert_eq!(got.as_bytes(), &datas[i][..]);
    }
}

#[test]
fn verify_names_a_pack_whose_zip_end_record_was_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    let data = vec![3u8; 300];
    let srcs = [u8_array("a", &data), u8_array("b", &data)];
    store
        .put("k", Map::new(), Value::Null, &srcs, None)
        .unwrap();
    store.flush().unwrap();
    assert!(store.verify().unwrap().is_ok());
    let entry = store.get("k").unwrap().unwrap().arrays["b"].clone();
    let pack = pack_of(&path, &entry);
    let bytes = fs::read(&pack).unwrap();
    let members_end = (entry.npy_start() + entry.data_offset + entry.nbytes) as usize;
    // the end record gone, then the central directory too: members intact
    for cut in [bytes.len() - 22, members_end + 10, members_end] {
        fs::write(&pack, &bytes[..cut]).unwrap();
        assert!(zip::ZipArchive::new(fs::File::open(&pack).unwrap()).is_err());
        let report = store.verify().unwrap();
        assert_eq!(report.problems.len(), 1, "{cut}: {report:?}");
        let p = &report.problems[0];
        assert!(p.contains(pack.to_str().unwrap()), "{p}");
        assert!(p.contains("zip") && p.contains("\"k\""), "{p}");
        assert_eq!(load_payload(&path, &entry).unwrap().as_bytes(), &data[..]);
    }
    // the end record pointing elsewhere
    let mut moved = bytes.clone();
    let n = moved.len();
    moved[n - 6] ^= 1; // central directory offset
    fs::write(&pack, &moved).unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.problems.len(), 1, "{report:?}");
    // a central header pointing at another member's local header (a
    // fresh user's trial: np.load refused it, verify said ok)
    let mut crossed = bytes.clone();
    let central: Vec<usize> = crossed
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == b"PK\x01\x02")
        .map(|(i, _)| i)
        .collect();
    let first: [u8; 4] = crossed[central[0] + 42..central[0] + 46]
        .try_into()
        .unwrap();
    crossed[central[1] + 42..central[1] + 46].copy_from_slice(&first);
    fs::write(&pack, &crossed).unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert!(
        report.problems[0].contains("no local header of that name"),
        "{report:?}"
    );
    assert_eq!(load_payload(&path, &entry).unwrap().as_bytes(), &data[..]);
    // the method, CRC-32 or a size of a member changed in one header only
    // (a fresh user's trial: np.load refused them, verify said ok)
    let last = central[central.len() - 1];
    for (field, local_field) in [(10, 8), (16, 14), (20, 18), (24, 22)] {
        for (at, which) in [(last + field, "central"), (usize::MAX, "local")] {
            let mut flipped = bytes.clone();
            let at = if which == "local" {
                let local = u32::from_le_bytes(bytes[last + 42..last + 46].try_into().unwrap());
                local as usize + local_field
            } else {
                at
            };
            flipped[at] ^= 1;
            fs::write(&pack, &flipped).unwrap();
            let report = store.verify().unwrap();
            assert!(
                report.problems.iter().any(|p| p.contains("disagree")),
                "{which} {field}: {report:?}"
            );
        }
    }
    fs::write(&pack, &bytes).unwrap();
    assert!(store.verify().unwrap().is_ok());
}

#[test]
fn gc_says_how_many_packs_it_left_because_they_are_damaged() {
    for damage in ["data", "header"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.lv");
        let store = Store::open(&path, Mode::Append).unwrap();
        store.set_retention(std::time::Duration::ZERO);
        let datas: Vec<Vec<u8>> = (0..10).map(|i| vec![i as u8; 1000 + i]).collect();
        let srcs: Vec<[ArraySource; 1]> = datas.iter().map(|d| [u8_array("x", d)]).collect();
        let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        store
            .put_many(records(&keys, &srcs, Map::new(), None))
            .unwrap();
        let entry = store.get("k9").unwrap().unwrap().arrays["x"].clone();
        let pack = pack_of(&path, &entry);
        for key in &keys[..7] {
            let srcs = [u8_array("x", &[2; 8])];
            store
                .put(key, Map::new(), Value::Null, &srcs, None)
                .unwrap();
        }
        store.flush().unwrap();
        // a live member damaged: its pack is mostly dead, but left as it is
        let mut bytes = fs::read(&pack).unwrap();
        let at = match damage {
            "data" => entry.npy_start() + entry.data_offset + 3,
            _ => entry.npy_start() + 20,
        };
        bytes[at as usize] ^= 0x21;
        fs::write(&pack, &bytes).unwrap();
        let report = store.gc().unwrap();
        assert_eq!(report.packs_compacted, 0, "{damage}: {report:?}");
        assert_eq!(report.packs_damaged, 1, "{damage}: {report:?}");
        assert!(pack.exists());
        let verified = store.verify().unwrap();
        assert!(
            verified.problems.iter().any(|p| p.contains("\"k9\"")),
            "{verified:?}"
        );
        // the sound members still read
        let k8 = store.get("k8").unwrap().unwrap().arrays["x"].clone();
        assert_eq!(load_payload(&path, &k8).unwrap().as_bytes(), &datas[8][..]);
    }
}

#[test]
fn a_truncated_pack_says_so_with_the_member_offset_and_the_pack_length() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    let data = vec![4u8; 1000];
    let srcs = [u8_array("a", &data), u8_array("b", &data)];
    store
        .put("k", Map::new(), Value::Null, &srcs, None)
        .unwrap();
    store.close().unwrap();
    let store = Store::open(&path, Mode::ReadOnly).unwrap();
    let entry = store.get("k").unwrap().unwrap().arrays["b"].clone();
    let pack = pack_of(&path, &entry);
    let start = entry.npy_start();
    // cut inside the member's data, then inside its header, then before it
    for cut in [start + entry.data_offset + 10, start + 20, start - 5] {
        let bytes = fs::read(&pack).unwrap();
        fs::write(&pack, &bytes[..cut as usize]).unwrap();
        let err = load_payload(&path, &entry).unwrap_err().to_string();
        assert!(!err.contains("truncated .npy header"), "{cut}: {err}");
        for part in [
            format!("pack {}: the file is truncated", pack.display()),
            format!("{cut} bytes"),
            format!("offset {start}"),
        ] {
            assert!(err.contains(&part), "{part:?} not in {err}");
        }
    }
}
