//! `.lvz` archives: export from a store, read back, alignment, zip64, and
//! hostile or damaged archives (errors, never panics).

use std::io::{Cursor, Write};
use std::path::Path;

use lazyvault_store::archive::{
    export_store, write_archive_bytes, write_archive_file, Archive, ArchiveIndex, MANIFEST_MEMBER,
    RECORDS_MEMBER,
};
use lazyvault_store::query::Query;
use lazyvault_store::{map_payload, ArraySource, Error, Mode, OpenError, Store, UsageError};
use serde_json::{json, Map, Value};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

fn meta(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("object")
}

fn source<'a>(name: &str, descr: &str, shape: Vec<u64>, data: &'a [u8]) -> ArraySource<'a> {
    ArraySource {
        name: name.into(),
        descr: descr.into(),
        dtype: "x".into(),
        shape,
        fortran_order: false,
        data,
        pickled: false,
    }
}

fn filled_store(path: &Path) -> Store {
    let store = Store::open(path, Mode::Append).unwrap();
    let f8: Vec<u8> = (0..48u8).collect();
    let u1: Vec<u8> = (0..7u8).collect();
    for i in 0..5u8 {
        let pickle = (i % 2 == 0).then(|| vec![0x80, 5, i, b'.']);
        store
            .put(
                &format!("run-{i}"),
                meta(json!({"i": i, "material": if i < 3 {"Si"} else {"Ge"}})),
                json!({"dict": {"i": i}}),
                &[
                    source("positions", "'<f8'", vec![2, 3], &f8),
                    source("flags", "'|u1'", vec![7], &u1),
                    source("empty", "'<f4'", vec![0, 3], &[]),
                ],
                pickle.as_deref(),
            )
            .unwrap();
    }
    store
}

#[test]
fn export_round_trips_every_record_and_array() {
    let dir = tempfile::tempdir().unwrap();
    let store = filled_store(&dir.path().join("s.lv"));
    let lvz = dir.path().join("out.lvz");
    let keys = store.keys().unwrap();
    assert_eq!(store.all_keys().unwrap().to_vec(), keys);
    export_store(&store, &lvz, &keys).unwrap();
    let archive = Archive::open(&lvz).unwrap();
    let index = archive.index();
    assert_eq!(index.keys(), keys);
    assert_eq!(index.find_keys(None).to_vec(), keys);
    for key in &keys {
        let rec = index.get(key).unwrap();
        // the store's record, without the pack fields of its small arrays
        // (in an archive every payload is a member of its own)
        let stored = store.get(key).unwrap().unwrap();
        let mut unpacked = stored.clone();
        for e in unpacked.arrays.values_mut() {
            (e.pack, e.pack_offset) = (None, None);
        }
        assert!(stored.arrays.values().any(|e| e.pack.is_some()));
        assert_eq!(rec.json, unpacked.to_json());
        assert_eq!(rec.pickle, store.get_pickle(key).unwrap());
        for (name, entry) in &rec.record.arrays {
            let data = archive.array(entry).unwrap();
            let original = map_payload(store.root(), &stored.arrays[name]).unwrap();
            assert_eq!(data, original.as_bytes());
            // 64-byte aligned within the file
            let offset = data.as_ptr() as usize - archive.bytes().as_ptr() as usize;
            assert_eq!(offset % 64, 0, "{key} {}", entry.id);
        }
    }
    let q = Query::parse("material == 'Si' and positions.shape[1] == 3").unwrap();
    assert_eq!(index.find(&q), ["run-0", "run-1", "run-2"]);
    assert_eq!(index.find_keys(Some(&q)).to_vec(), index.find(&q));
    assert_eq!(index.count(&Query::parse("i >= 3").unwrap()), 2);
    // no temporary file left beside it
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    // a subset, and a missing key is an error that leaves nothing behind
    let sub = dir.path().join("sub.lvz");
    export_store(&store, &sub, &["run-3".to_owned()]).unwrap();
    assert_eq!(Archive::open(&sub).unwrap().index().keys(), ["run-3"]);
    let bad = dir.path().join("bad.lvz");
    assert!(export_store(&store, &bad, &["nope".to_owned()]).is_err());
    assert!(!bad.exists());
}

#[test]
fn every_member_is_stored_and_aligned_in_the_zip() {
    let dir = tempfile::tempdir().unwrap();
    let store = filled_store(&dir.path().join("s.lv"));
    let lvz = dir.path().join("out.lvz");
    export_store(&store, &lvz, &store.keys().unwrap()).unwrap();
    let bytes = std::fs::read(&lvz).unwrap();
    let mut zip = zip::ZipArchive::new(Cursor::new(&bytes[..])).unwrap();
    let mut names = Vec::new();
    for i in 0..zip.len() {
        let file = zip.by_index_raw(i).unwrap();
        assert_eq!(file.compression(), CompressionMethod::Stored);
        let start = file.data_start().unwrap();
        assert_eq!(start % 64, 0, "{}", file.name().unwrap());
        names.push(file.name().unwrap().into_owned());
    }
    assert!(names.contains(&MANIFEST_MEMBER.to_owned()));
    assert!(names.contains(&RECORDS_MEMBER.to_owned()));
    let arrays = names.iter().filter(|n| n.starts_with("arrays/")).count();
    assert_eq!(arrays, 15);
}

#[test]
fn in_memory_archive_with_zero_size_zero_d_and_pickled_arrays() {
    let f8 = 1.5f64.to_le_bytes();
    let fortran: Vec<u8> = (0..6u8).collect();
    let bytes = write_archive_bytes(|w| {
        w.add_record(
            "obj",
            meta(json!({"a": 1})),
            json!({"dict": {"a": 1}}),
            &[
                source("scalar", "'<f8'", vec![], &f8),
                source("empty", "'<i4'", vec![3, 0], &[]),
                ArraySource {
                    fortran_order: true,
                    ..source("f", "'|u1'", vec![2, 3], &fortran)
                },
                ArraySource {
                    pickled: true,
                    ..source("obj", "'|O'", vec![2], b"\x80\x04not really")
                },
            ],
            Some(b"pickle"),
        )
    })
    .unwrap();
    let again = write_archive_bytes(|w| {
        w.add_record(
            "obj",
            meta(json!({"a": 1})),
            json!({"dict": {"a": 1}}),
            &[
                source("scalar", "'<f8'", vec![], &f8),
                source("empty", "'<i4'", vec![3, 0], &[]),
                ArraySource {
                    fortran_order: true,
                    ..source("f", "'|u1'", vec![2, 3], &fortran)
                },
                ArraySource {
                    pickled: true,
                    ..source("obj", "'|O'", vec![2], b"\x80\x04not really")
                },
            ],
            Some(b"pickle"),
        )
    })
    .unwrap();
    assert_eq!(bytes, again, "equal inputs give equal archives");
    let index = ArchiveIndex::parse(&bytes, "mem").unwrap();
    let rec = index.get("obj").unwrap();
    assert_eq!(rec.pickle.as_deref(), Some(&b"pickle"[..]));
    let a = &rec.record.arrays;
    assert_eq!(&bytes[index.array_range(&bytes, &a["scalar"]).unwrap()], f8);
    assert!(index.array_range(&bytes, &a["empty"]).unwrap().is_empty());
    assert_eq!(&bytes[index.array_range(&bytes, &a["f"]).unwrap()], fortran);
    assert!(a["f"].fortran_order);
    assert_eq!(
        &bytes[index.array_range(&bytes, &a["obj"]).unwrap()],
        b"\x80\x04not really"
    );
    // a wrong byte count is refused before anything is written
    let err = write_archive_bytes(|w| {
        w.add_record(
            "x",
            Map::new(),
            Value::Null,
            &[source("a", "'<f8'", vec![2], &[0; 3])],
            None,
        )
    })
    .unwrap_err();
    assert!(
        matches!(err, Error::Usage(UsageError::InvalidArray { .. })),
        "{err}"
    );
}

#[test]
fn forced_zip64_members_read_back() {
    let data: Vec<u8> = (0..=255u8).collect();
    let bytes = write_archive_bytes(|w| {
        w.force_zip64(true);
        w.add_record(
            "k",
            Map::new(),
            Value::Null,
            &[source("a", "'|u1'", vec![256], &data)],
            None,
        )
    })
    .unwrap();
    let mut zip = zip::ZipArchive::new(Cursor::new(&bytes[..])).unwrap();
    let file = zip.by_index_raw(0).unwrap();
    // the local header carries a zip64 extra field (id 0x0001)
    let start = file.header_start() as usize;
    let name_len = u16::from_le_bytes([bytes[start + 26], bytes[start + 27]]) as usize;
    let extra_len = u16::from_le_bytes([bytes[start + 28], bytes[start + 29]]) as usize;
    let extra = &bytes[start + 30 + name_len..start + 30 + name_len + extra_len];
    let mut ids = Vec::new();
    let mut at = 0;
    while at + 4 <= extra.len() {
        ids.push(u16::from_le_bytes([extra[at], extra[at + 1]]));
        at += 4 + u16::from_le_bytes([extra[at + 2], extra[at + 3]]) as usize;
    }
    assert!(ids.contains(&1), "{ids:?}");
    drop(file);
    let index = ArchiveIndex::parse(&bytes, "mem").unwrap();
    let entry = &index.get("k").unwrap().record.arrays["a"];
    assert_eq!(&bytes[index.array_range(&bytes, entry).unwrap()], &data[..]);
}

#[test]
fn more_than_65535_members_use_the_zip64_end_record() {
    const N: usize = 65_600;
    let names: Vec<String> = (0..N).map(|i| format!("a{i}")).collect();
    let bytes = write_archive_bytes(|w| {
        let sources: Vec<_> = names
            .iter()
            .map(|n| source(n, "'<f8'", vec![0], &[]))
            .collect();
        w.add_record("many", Map::new(), Value::Null, &sources, None)
    })
    .unwrap();
    // zip64 end of central directory record signature
    assert!(bytes.windows(4).any(|w| w == b"PK\x06\x06"));
    let index = ArchiveIndex::parse(&bytes, "mem").unwrap();
    assert_eq!(index.get("many").unwrap().record.arrays.len(), N);
}

fn sample_archive() -> Vec<u8> {
    let data: Vec<u8> = (0..64u8).collect();
    write_archive_bytes(|w| {
        w.add_record(
            "k",
            meta(json!({"x": 1})),
            Value::Null,
            &[source("a", "'<f8'", vec![8], &data)],
            Some(b"abc"),
        )
    })
    .unwrap()
}

#[test]
fn truncated_and_damaged_archives_are_errors_not_panics() {
    let bytes = sample_archive();
    for cut in 0..bytes.len() {
        assert!(
            ArchiveIndex::parse(&bytes[..cut], "cut").is_err(),
            "truncated at {cut} accepted"
        );
    }
    // flip each byte: parse and then every array access must not panic
    for at in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x5a;
        if let Ok(index) = ArchiveIndex::parse(&damaged, "flip") {
            for rec in index.records() {
                for entry in rec.record.arrays.values() {
                    let _ = index.array_range(&damaged, entry);
                }
            }
        }
    }
    // a truncated file on disk
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.lvz");
    std::fs::write(&path, &bytes[..bytes.len() - 30]).unwrap();
    let err = Archive::open(&path).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(Archive::open(&path), Err(Error::Corrupt(_))));
}

fn zip_with(members: &[(&str, &[u8], CompressionMethod)]) -> Vec<u8> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    for (name, body, method) in members {
        zip.start_file(
            *name,
            SimpleFileOptions::default().compression_method(*method),
        )
        .unwrap();
        zip.write_all(body).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn member(bytes: &[u8], name: &str) -> Vec<u8> {
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes)).unwrap();
    let mut file = zip.by_name(name).unwrap();
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut out).unwrap();
    out
}

#[test]
fn hostile_member_names_and_foreign_zips_are_refused() {
    let good = sample_archive();
    let manifest = member(&good, MANIFEST_MEMBER);
    let records = member(&good, RECORDS_MEMBER);
    let stored = CompressionMethod::Stored;
    for name in ["../evil.npy", "/etc/evil", "arrays/../../x.npy", "a\\..\\b"] {
        let bytes = zip_with(&[
            (MANIFEST_MEMBER, &manifest, stored),
            (name, b"x", stored),
            (RECORDS_MEMBER, b"", stored),
        ]);
        let err = ArchiveIndex::parse(&bytes, "evil").unwrap_err();
        assert!(err.to_string().contains("unsafe member name"), "{err}");
    }
    // a plain zip without a manifest
    let bytes = zip_with(&[("x.npy", b"abc", stored)]);
    let err = ArchiveIndex::parse(&bytes, "plain").unwrap_err();
    assert!(
        err.to_string().contains("no lazyvault/manifest.json"),
        "{err}"
    );
    // records naming a payload the archive does not hold
    let bytes = zip_with(&[
        (MANIFEST_MEMBER, &manifest, stored),
        (RECORDS_MEMBER, &records, stored),
    ]);
    let err = ArchiveIndex::parse(&bytes, "missing").unwrap_err();
    assert!(err.to_string().contains("is missing"), "{err}");
    // a newer major version
    let newer = String::from_utf8(manifest.clone()).unwrap().replace(
        &format!("\"{}\"", lazyvault_store::schema::ARCHIVE_FORMAT_VERSION),
        "\"3.0\"",
    );
    let bytes = zip_with(&[
        (MANIFEST_MEMBER, newer.as_bytes(), stored),
        (RECORDS_MEMBER, b"", stored),
    ]);
    assert!(matches!(
        ArchiveIndex::parse(&bytes, "newer"),
        Err(Error::Open(OpenError::Format { .. }))
    ));
    // garbage that is not a zip at all
    assert!(ArchiveIndex::parse(&[7u8; 100], "garbage").is_err());
}

#[test]
fn compressed_array_members_are_refused() {
    let mut bytes = sample_archive();
    // mark the array member (the first one) as deflated in its central
    // directory header (method field at offset 10 of the header)
    let cd = bytes
        .windows(4)
        .position(|w| w == b"PK\x01\x02")
        .expect("central directory");
    bytes[cd + 10] = 8;
    let err = ArchiveIndex::parse(&bytes, "deflated").unwrap_err();
    assert!(err.to_string().contains("uncompressed"), "{err}");
}

#[test]
fn write_archive_file_replaces_by_rename_and_cleans_up_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.lvz");
    std::fs::write(&path, b"old").unwrap();
    let err = write_archive_file(&path, |_| Err(Error::Usage(UsageError::EmptyKey))).unwrap_err();
    assert!(matches!(err, Error::Usage(UsageError::EmptyKey)));
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    write_archive_file(&path, |w| {
        w.add_record("k", Map::new(), Value::Null, &[], None)
    })
    .unwrap();
    assert_eq!(Archive::open(&path).unwrap().index().keys(), ["k"]);
}

/// Found by the fuzz smoke test: `check_member_crc` sliced the bytes it was
/// given without checking that they are those `parse` read (as
/// `array_range` does), and panicked on shorter ones.
#[test]
fn member_crc_of_other_bytes_is_an_error_not_a_panic() {
    let bytes = sample_archive();
    let index = ArchiveIndex::parse(&bytes, "mem").unwrap();
    let entry = &index.get("k").unwrap().record.arrays["a"];
    index.check_member_crc(&bytes, entry).unwrap();
    for other in [&bytes[..bytes.len() / 2], &bytes[..0]] {
        let err = index.check_member_crc(other, entry).unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)), "{err}");
        assert!(index.array_range(other, entry).is_err());
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(index.check_member_crc(&longer, entry).is_err());
}
