//! Export to `.npz` and `.safetensors` through a store
//! (`interop::export`): read back with the zip crate and by hand, zip64
//! with lowered limits, and failures that leave nothing behind.

use std::fs;
use std::io::{Cursor, Read};
use std::path::Path;

use lazyvault_store::interop::export::{npz, safetensors, ZipLimits};
use lazyvault_store::{npy, ArraySource, Error, InteropError, Mode, Store, UsageError};
use serde_json::{json, Value};

fn array<'a>(
    name: &str,
    descr: &str,
    shape: &[u64],
    fortran: bool,
    data: &'a [u8],
) -> ArraySource<'a> {
    ArraySource {
        name: name.into(),
        descr: descr.into(),
        dtype: "x".into(),
        shape: shape.to_vec(),
        fortran_order: fortran,
        data,
        pickled: false,
    }
}

/// Two records: "a" (a C-ordered f8 (2, 3) and a big-endian Fortran i2
/// (3, 2)) and "../b" (a 100,000-byte u1 vector: a streamed member).
fn filled(dir: &Path) -> (Store, Vec<u8>, Vec<u8>, Vec<u8>) {
    let store = Store::open(dir.join("s.lv"), Mode::Append).unwrap();
    let f8: Vec<u8> = (0..6).flat_map(|i| f64::from(i).to_le_bytes()).collect();
    // Fortran order of [[0, 1], [2, 3], [4, 5]]: 0 2 4 1 3 5, big-endian
    let i2: Vec<u8> = [0i16, 2, 4, 1, 3, 5]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    let u1: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let meta = json!({"t": 1e-5, "s": "é"}).as_object().unwrap().clone();
    store
        .put(
            "a",
            meta,
            json!({"dict": {}}),
            &[
                array("x", "'<f8'", &[2, 3], false, &f8),
                array("w", "'>i2'", &[3, 2], true, &i2),
            ],
            None,
        )
        .unwrap();
    store
        .put(
            "../b",
            Default::default(),
            Value::Null,
            &[array("big", "'|u1'", &[100_000], false, &u1)],
            None,
        )
        .unwrap();
    (store, f8, i2, u1)
}

fn keys(store: &Store) -> Vec<String> {
    store.keys().unwrap()
}

fn no_progress() -> impl FnMut(u64, u64) -> lazyvault_store::Result<()> {
    |_, _| Ok(())
}

/// `{member name: (data start in the file, bytes)}` through the zip crate.
fn members(path: &Path) -> Vec<(String, u64, Vec<u8>)> {
    let bytes = fs::read(path).unwrap();
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes)).unwrap();
    (0..zip.len())
        .map(|i| {
            let mut f = zip.by_index(i).unwrap();
            let mut data = Vec::new();
            f.read_to_end(&mut data).unwrap();
            (
                f.name().unwrap().into_owned(),
                f.data_start().unwrap(),
                data,
            )
        })
        .collect()
}

fn check_npz(path: &Path, f8: &[u8], i2: &[u8], u1: &[u8]) {
    let got = members(path);
    let names: Vec<&str> = got.iter().map(|m| m.0.as_str()).collect();
    // keys in index order ("../b" sorts before "a"), sanitised
    assert_eq!(
        names,
        ["__lazyvault__.json", "__/b/big.npy", "a/x.npy", "a/w.npy"]
    );
    let manifest: Value = serde_json::from_slice(&got[0].2).unwrap();
    assert_eq!(manifest["format"], "lazyvault-npz");
    assert_eq!(manifest["records"][1]["arrays"]["w"], "a/w.npy");
    assert_eq!(manifest["records"][1]["meta"]["t"], 1e-5);
    for ((_, start, data), want) in got[1..].iter().zip([u1, f8, i2]) {
        let header = npy::parse_header(data, npy::NUMPY_MAX_HEADER_LEN).unwrap();
        assert_eq!((start + header.data_offset) % 64, 0);
        assert_eq!(&data[header.data_offset as usize..], want);
    }
    let w = npy::parse_header(&got[3].2, 10_000).unwrap();
    assert_eq!((w.descr.as_str(), w.fortran_order), ("'>i2'", true));
}

#[test]
fn npz_round_trips_through_the_zip_crate() {
    let dir = tempfile::tempdir().unwrap();
    let (store, f8, i2, u1) = filled(dir.path());
    let path = dir.path().join("out.npz");
    let mut calls = Vec::new();
    let mut progress = |done, total| {
        calls.push((done, total));
        Ok(())
    };
    npz::export_npz(
        &store,
        &path,
        &keys(&store),
        ZipLimits::default(),
        &mut progress,
    )
    .unwrap();
    assert_eq!(calls, [(0, 3), (1, 3), (2, 3), (3, 3)]);
    check_npz(&path, &f8, &i2, &u1);
    assert!(!fs::read(&path)
        .unwrap()
        .windows(4)
        .any(|w| w == b"PK\x06\x06"));
}

#[test]
fn npz_zip64_with_lowered_limits() {
    let dir = tempfile::tempdir().unwrap();
    let (store, f8, i2, u1) = filled(dir.path());
    let path = dir.path().join("out.npz");
    let limits = ZipLimits { size: 0, count: 2 };
    npz::export_npz(&store, &path, &keys(&store), limits, &mut no_progress()).unwrap();
    let bytes = fs::read(&path).unwrap();
    assert!(bytes.windows(4).any(|w| w == b"PK\x06\x06"));
    assert!(bytes.windows(4).any(|w| w == b"PK\x06\x07"));
    check_npz(&path, &f8, &i2, &u1);
}

#[test]
fn safetensors_is_little_endian_c_order_sorted_by_itemsize() {
    let dir = tempfile::tempdir().unwrap();
    let (store, f8, _, u1) = filled(dir.path());
    let path = dir.path().join("out.safetensors");
    safetensors::export_safetensors(&store, &path, &keys(&store), &mut no_progress()).unwrap();
    let bytes = fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(n % 8, 0);
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let names: Vec<&String> = header.as_object().unwrap().keys().collect();
    assert_eq!(names, ["__metadata__", "a/x", "a/w", "../b/big"]);
    let metadata = &header["__metadata__"];
    assert_eq!(metadata["a"], r#"{"t": 1e-05, "s": "é"}"#);
    let range = |name: &str| {
        let o = &header[name]["data_offsets"];
        o[0].as_u64().unwrap() as usize..o[1].as_u64().unwrap() as usize
    };
    assert_eq!(&data[range("a/x")], f8);
    let w: Vec<u8> = (0..6i16).flat_map(i16::to_le_bytes).collect();
    assert_eq!(&data[range("a/w")], w);
    assert_eq!(header["a/w"]["dtype"], "I16");
    assert_eq!(&data[range("../b/big")], u1);
    assert_eq!(data.len(), range("../b/big").end);
}

#[test]
fn safetensors_of_several_records_imports_back_as_those_records() {
    // came back as one record "k" of tensors "a/x"..., the records' metadata
    // as one "__metadata__" map, although the file carries our marker
    use lazyvault_store::interop::{import_file, ImportHooks, ImportOptions};
    let dir = tempfile::tempdir().unwrap();
    let (store, f8, _, u1) = filled(dir.path());
    let path = dir.path().join("out.safetensors");
    safetensors::export_safetensors(&store, &path, &keys(&store), &mut no_progress()).unwrap();
    let back = Store::open(dir.path().join("back.lv"), Mode::Append).unwrap();
    let import = |key: Option<&str>| {
        let options = ImportOptions::default();
        import_file(
            &back,
            &path,
            key,
            "k",
            &options,
            &mut ImportHooks::default(),
        )
    };
    // key= renames a single record only: refused, nothing written
    let err = import(Some("x")).unwrap_err();
    assert!(
        matches!(&err, Error::Interop(InteropError::Unsupported(m)) if m.contains("2 records")),
        "{err}"
    );
    assert!(back.keys().unwrap().is_empty());
    assert_eq!(import(None).unwrap(), ["../b", "a"]);
    assert_eq!(keys(&back), keys(&store));
    for key in keys(&store) {
        let (was, now) = (
            store.get(&key).unwrap().unwrap(),
            back.get(&key).unwrap().unwrap(),
        );
        assert_eq!(now.meta, was.meta, "{key}");
        assert_eq!(now.layout, was.layout, "{key}");
        let paths = |r: &lazyvault_schema::Record| r.arrays.keys().cloned().collect::<Vec<_>>();
        assert_eq!(paths(&now), paths(&was), "{key}");
    }
    let bytes = |key: &str, name: &str| {
        let record = back.get(key).unwrap().unwrap();
        lazyvault_store::map_payload(back.root(), &record.arrays[name])
            .unwrap()
            .as_bytes()
            .to_vec()
    };
    assert_eq!(bytes("a", "x"), f8);
    assert_eq!(bytes("../b", "big"), u1);
    // the big-endian Fortran-ordered array comes back little-endian, C order
    let w = back.get("a").unwrap().unwrap().arrays["w"].clone();
    assert_eq!((w.descr.as_str(), w.fortran_order), ("'<i2'", false));
    let c: Vec<u8> = (0..6i16).flat_map(i16::to_le_bytes).collect();
    assert_eq!(bytes("a", "w"), c);
}

#[test]
fn a_vanished_payload_names_everything_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ..) = filled(dir.path());
    let record = store.get("../b").unwrap().unwrap();
    let payload = dir.path().join("s.lv").join(record.arrays["big"].relpath());
    fs::remove_file(&payload).unwrap();
    let out = dir.path().join("out");
    fs::create_dir(&out).unwrap();
    for name in ["x.npz", "x.safetensors"] {
        let path = out.join(name);
        fs::write(&path, b"old").unwrap();
        let err = if name.ends_with("npz") {
            npz::export_npz(
                &store,
                &path,
                &keys(&store),
                ZipLimits::default(),
                &mut no_progress(),
            )
        } else {
            safetensors::export_safetensors(&store, &path, &keys(&store), &mut no_progress())
        }
        .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Corrupt(_)), "{text}");
        for part in [name, "\"../b\"", "\"big\"", &record.arrays["big"].id] {
            assert!(text.contains(part), "{part} not in {text}");
        }
        assert_eq!(fs::read(&path).unwrap(), b"old");
    }
    assert_eq!(fs::read_dir(&out).unwrap().count(), 2); // no temporary file
}

#[test]
fn refusals_and_cancellation_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ..) = filled(dir.path());
    store
        .put("p", Default::default(), Value::Null, &[], Some(b"pickle"))
        .unwrap();
    let path = dir.path().join("x.npz");
    let p = vec!["p".to_owned()];
    let err = npz::export_npz(&store, &path, &p, ZipLimits::default(), &mut no_progress());
    assert!(matches!(err, Err(Error::Interop(InteropError::Unsupported(m))) if m.contains(".lvz")));
    let missing = vec!["nope".to_owned()];
    let err = npz::export_npz(
        &store,
        &path,
        &missing,
        ZipLimits::default(),
        &mut no_progress(),
    );
    assert!(matches!(err, Err(Error::Corrupt(_))));
    let mut stop = |done, _| {
        if done == 2 {
            Err(Error::from(UsageError::Cancelled))
        } else {
            Ok(())
        }
    };
    let all = vec!["a".to_owned(), "../b".to_owned()];
    let err = npz::export_npz(&store, &path, &all, ZipLimits::default(), &mut stop);
    assert!(matches!(err, Err(Error::Usage(UsageError::Cancelled))));
    let st = dir.path().join("x.safetensors");
    let err = safetensors::export_safetensors(&store, &st, &all, &mut stop);
    assert!(matches!(err, Err(Error::Usage(UsageError::Cancelled))));
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["s.lv"]);
}

#[test]
fn complex64_exports_as_c64() {
    // the format lists C64; export refused complex64 as having no form
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let le: Vec<u8> = [1.0f32, 2.0, -3.0, 0.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let be: Vec<u8> = [1.0f32, 2.0, -3.0, 0.5]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    store
        .put(
            "z",
            Default::default(),
            Value::Null,
            &[array("z", "'<c8'", &[2], false, &le)],
            None,
        )
        .unwrap();
    store
        .put(
            "big",
            Default::default(),
            Value::Null,
            &[array("z", "'>c8'", &[2], false, &be)],
            None,
        )
        .unwrap();
    let path = dir.path().join("z.safetensors");
    safetensors::export_safetensors(&store, &path, &["z".to_owned()], &mut no_progress()).unwrap();
    let bytes = fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["z"]["dtype"], "C64");
    assert_eq!(header["z"]["shape"], json!([2]));
    assert_eq!(&bytes[8 + n..], le);
    // a big-endian complex64 is refused rather than swapped as one 8-byte
    // item (which would exchange its real and imaginary parts)
    let err =
        safetensors::export_safetensors(&store, &path, &["big".to_owned()], &mut no_progress())
            .unwrap_err();
    assert!(err.to_string().contains("complex64"), "{err}");
}
