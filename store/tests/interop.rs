//! Importing `.npy`, `.npz` and `.safetensors` files (`lazyvault_store::interop`):
//! valid files of each format become the records the Python layer would
//! write, and every refusal leaves the store as it was (no record, no
//! payload file, no temporary file) with an error naming the file and the
//! member or tensor.

#[path = "common/zip_build.rs"]
mod zip_build;

use std::path::{Path, PathBuf};

use lazyvault_store::archive::export_store;
use lazyvault_store::interop::{
    detect_format, import_file, import_files, Format, ImportHooks, ImportOptions, ImportSource,
    PickledArray,
};
use lazyvault_store::{map_payload, Error, InteropError, Mode, StorageError, Store};
use serde_json::json;
use zip_build::{npy_file, zip_bytes, Member};

struct Fixture {
    dir: tempfile::TempDir,
    store: Store,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
        Fixture { dir, store }
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn import(&self, path: &Path) -> Result<Vec<String>, Error> {
        self.import_with(path, None, &ImportOptions::default())
    }

    fn import_with(
        &self,
        path: &Path,
        key: Option<&str>,
        options: &ImportOptions,
    ) -> Result<Vec<String>, Error> {
        import_file(
            &self.store,
            path,
            key,
            "k",
            options,
            &mut ImportHooks::default(),
        )
    }

    /// Every file under the store's payload directory.
    fn payload_files(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    walk(&e.path(), out);
                } else {
                    out.push(e.path());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.store.root().join("arrays"), &mut out);
        out
    }

    /// The array `name` of record `key`: its bytes.
    fn bytes(&self, key: &str, name: &str) -> Vec<u8> {
        let record = self.store.get(key).unwrap().unwrap();
        map_payload(self.store.root(), &record.arrays[name])
            .unwrap()
            .as_bytes()
            .to_vec()
    }

    /// Asserts that importing `bytes` fails with an InvalidFile error whose
    /// message contains every one of `parts`, leaving the store unchanged.
    fn refused(&self, bytes: &[u8], parts: &[&str]) {
        let path = self.file("bad.bin", bytes);
        let keys = self.store.keys().unwrap();
        let files = self.payload_files();
        let err = self.import(&path).expect_err("refused");
        let msg = err.to_string();
        assert!(
            matches!(err, Error::Interop(InteropError::InvalidFile { .. })),
            "{msg}: not InvalidFile"
        );
        // the error names the file as data too, not only in its text
        assert_eq!(invalid_file_path(&err), Some(path.as_path()), "{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        for part in parts {
            assert!(msg.contains(part), "{msg:?} lacks {part:?}");
        }
        assert_eq!(self.store.keys().unwrap(), keys);
        assert_eq!(self.payload_files(), files);
    }
}

/// The file an `InvalidFile` error names.
fn invalid_file_path(err: &Error) -> Option<&Path> {
    match err {
        Error::Interop(InteropError::InvalidFile { path, .. }) => path.as_deref(),
        _ => None,
    }
}

fn f8(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn header_text(text: &str, version: u8) -> Vec<u8> {
    let mut t = text.as_bytes().to_vec();
    let prefix = if version == 1 { 10 } else { 12 };
    while !(prefix + t.len() + 1).is_multiple_of(64) {
        t.push(b' ');
    }
    t.push(b'\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(t.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(t.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(&t);
    out
}

// ---------------------------------------------------------------------------
// .npy

#[test]
fn npy_versions_orders_and_python2_shapes() {
    let fx = Fixture::new();
    let data: Vec<u8> = (0..12i16).flat_map(|v| v.to_be_bytes()).collect();
    for (i, version) in [1u8, 2, 3].into_iter().enumerate() {
        let mut file = header_text(
            "{'descr': '>i2', 'fortran_order': True, 'shape': (3L, 4L), }",
            version,
        );
        if version == 3 {
            // 3.0 is UTF-8; `L` suffixes are Python 2's, so use plain ints
            file = header_text(
                "{'descr': '>i2', 'fortran_order': True, 'shape': (3, 4), }",
                3,
            );
        }
        file.extend_from_slice(&data);
        let path = fx.file(&format!("v{version}.npy"), &file);
        assert_eq!(detect_format(&path).unwrap(), Format::Npy);
        let key = format!("v{i}");
        let keys = fx
            .import_with(&path, Some(&key), &ImportOptions::default())
            .unwrap();
        assert_eq!(keys, std::slice::from_ref(&key));
        let record = fx.store.get(&key).unwrap().unwrap();
        let entry = &record.arrays["data"];
        assert_eq!(entry.descr, "'>i2'");
        assert_eq!(entry.dtype, "int16");
        assert_eq!(entry.shape, [3, 4]);
        assert!(entry.fortran_order);
        assert!(entry.checksum.is_some());
        // the compact layout (FORMAT.md 1.5): the array at its own name
        assert_eq!(record.layout, json!({"fields": null}));
        assert!(record.meta.is_empty());
        assert_eq!(fx.bytes(&key, "data"), data);
    }
}

#[test]
fn npy_refusals() {
    let fx = Fixture::new();
    let good = npy_file("'<f8'", &[4], &f8(&[1.0, 2.0, 3.0, 4.0]));
    let mut v11 = good.clone();
    v11[7] = 1;
    fx.refused(&v11, &["version 1.1"]);
    let open = header_text(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), ",
        1,
    );
    fx.refused(&open, &["malformed"]);
    fx.refused(&good[..good.len() - 1], &["truncated", "32 data bytes"]);
    fx.refused(&good[..50], &["truncated"]);
    let missing = header_text("{'descr': '<f8', 'fortran_order': False}", 1);
    fx.refused(&missing, &["shape"]);
    let long = header_text(
        &format!(
            "{{'descr': '<f8', 'fortran_order': False, 'shape': (0,), }}{}",
            " ".repeat(11_000)
        ),
        1,
    );
    fx.refused(&long, &["too long"]);
    // ... unless the limit allows it
    let path = fx.file("long.npy", &long);
    let options = ImportOptions {
        max_header_size: 20_000,
        ..ImportOptions::default()
    };
    fx.import_with(&path, Some("long"), &options).unwrap();
    assert_eq!(
        fx.store.get("long").unwrap().unwrap().arrays["data"].shape,
        [0]
    );
}

#[test]
fn object_arrays_need_allow_pickle_and_go_through_the_hook() {
    let fx = Fixture::new();
    let path = fx.file("o.npy", &npy_file("'|O'", &[2], b"\x80\x03pickled"));
    let err = fx.import(&path).unwrap_err();
    assert!(
        matches!(err, Error::Interop(InteropError::PickleNotAllowed { .. })),
        "{err}"
    );
    assert!(fx.payload_files().is_empty());
    let options = ImportOptions {
        allow_pickle: true,
        ..ImportOptions::default()
    };
    let mut seen = Vec::new();
    let mut repickle = |what: &str, data: Vec<u8>| {
        seen.push((what.to_owned(), data));
        Ok(PickledArray {
            descr: "'|O'".into(),
            dtype: "object".into(),
            shape: vec![2],
            fortran_order: false,
            data: b"new pickle".to_vec(),
        })
    };
    let mut hooks = ImportHooks {
        progress: None,
        repickle: Some(&mut repickle),
    };
    import_file(&fx.store, &path, None, "o", &options, &mut hooks).unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].1, b"\x80\x03pickled");
    let entry = &fx.store.get("o").unwrap().unwrap().arrays["data"];
    assert!(entry.pickled);
    assert_eq!(fx.bytes("o", "data"), b"new pickle");
}

// ---------------------------------------------------------------------------
// .npz

#[test]
fn foreign_npz_stored_and_deflated_members() {
    let fx = Fixture::new();
    let a = f8(&[1.0, 2.0, 3.0]);
    let b: Vec<u8> = vec![7; 10_000];
    let zip = zip_bytes(&[
        Member::stored("a.npy", &npy_file("'<f8'", &[3], &a)),
        Member::deflated("sub/b.npy", &npy_file("'|u1'", &[100, 100], &b)),
        Member::stored("dir/", b""),
        Member::deflated("empty.npy", &npy_file("'<i4'", &[0, 3], b"")),
    ]);
    let path = fx.file("f.npz", &zip);
    assert_eq!(detect_format(&path).unwrap(), Format::Npz);
    let mut calls = Vec::new();
    let mut progress = |done, total| {
        calls.push((done, total));
        true
    };
    let mut hooks = ImportHooks {
        progress: Some(&mut progress),
        repickle: None,
    };
    let keys = import_file(
        &fx.store,
        &path,
        None,
        "f",
        &ImportOptions::default(),
        &mut hooks,
    )
    .unwrap();
    assert_eq!(keys, ["f"]);
    // progress counts arrays, the total known from the start (it counted
    // records: one record gave a lone (1, 1) after every byte was copied)
    assert_eq!(calls, [(0, 3), (1, 3), (2, 3), (3, 3)]);
    let record = fx.store.get("f").unwrap().unwrap();
    let names: Vec<&String> = record.arrays.keys().collect();
    assert_eq!(names, ["a", "sub/b", "empty"]);
    assert_eq!(fx.bytes("f", "a"), a);
    assert_eq!(fx.bytes("f", "sub/b"), b);
    assert_eq!(record.arrays["empty"].shape, [0, 3]);
    assert_eq!(record.layout, json!({"fields": null}));
}

#[test]
fn npz_member_refusals() {
    let fx = Fixture::new();
    let small = npy_file("'<f8'", &[4], &f8(&[0.0; 4]));
    let len = small.len() as u32;
    let with = |m: Member| zip_bytes(&[Member::stored("ok.npy", &small), m]);
    fx.refused(
        &with(Member {
            size: Some(len + 8),
            ..Member::stored("x.npy", &small)
        }),
        &["member 'x.npy'", "two different sizes"],
    );
    fx.refused(
        &with(Member {
            flags: 1,
            ..Member::stored("x.npy", &small)
        }),
        &["member 'x.npy'", "encrypted"],
    );
    fx.refused(
        &with(Member {
            method: Some(12),
            ..Member::stored("x.npy", &small)
        }),
        &["member 'x.npy'", "compression method 12"],
    );
    fx.refused(
        &with(Member::deflated("x.txt", b"hello")),
        &["member 'x.txt'", "not a .npy"],
    );
    // the header implies 4 float64, the zip declares more (a bomb)
    let mut big = small.clone();
    big.extend_from_slice(&[0; 5_000_000]);
    fx.refused(
        &with(Member {
            size: Some(big.len() as u32),
            ..Member::deflated("x.npy", &big)
        }),
        &[
            "member 'x.npy'",
            "declares 5000160 bytes but its .npy header implies 160",
        ],
    );
    // declares what the header says, but inflates past it: stopped there
    fx.refused(
        &with(Member {
            size: Some(len),
            crc: Some(crc32fast::hash(&small)),
            ..Member::deflated("x.npy", &big)
        }),
        &["member 'x.npy'", "more than the 160 bytes"],
    );
    // a ratio no deflate stream reaches
    let mut huge = npy_file("'<f8'", &[100_000_000], b"");
    let huge_len = huge.len() as u32 + 800_000_000;
    huge.extend_from_slice(&[0; 1000]);
    fx.refused(
        &with(Member {
            size: Some(huge_len),
            ..Member::deflated("x.npy", &huge)
        }),
        &["member 'x.npy'", "more than deflate can expand"],
    );
    // a damaged member: found while copying, nothing kept
    fx.refused(
        &with(Member {
            crc: Some(1),
            ..Member::stored("x.npy", &small)
        }),
        &["member 'x.npy'", "CRC mismatch"],
    );
    fx.refused(
        &with(Member {
            crc: Some(1),
            ..Member::deflated("x.npy", &small)
        }),
        &["member 'x.npy'", "CRC mismatch"],
    );
    // a deflated member ending before its declared size
    let mut short = small.clone();
    short.truncate(small.len() - 8);
    fx.refused(
        &with(Member {
            size: Some(len),
            crc: Some(crc32fast::hash(&small)),
            ..Member::deflated("x.npy", &short)
        }),
        &["member 'x.npy'", "truncated"],
    );
    // members colliding once ".npy" is dropped, and duplicate names
    fx.refused(
        &zip_bytes(&[Member::stored("a", &small), Member::stored("a.npy", &small)]),
        &["members 'a' and 'a.npy' are both the array 'a'"],
    );
    fx.refused(
        &zip_bytes(&[
            Member::stored("a.npy", &small),
            Member::stored("a.npy", &small),
        ]),
        &["twice"],
    );
    // a truncated zip
    let whole = with(Member::stored("x.npy", &small));
    fx.refused(&whole[..whole.len() / 2], &["zip"]);
}

fn manifest(records: serde_json::Value) -> Member {
    let doc = json!({"format": "lazyvault-npz", "version": 1, "records": records});
    Member::stored("__lazyvault__.json", doc.to_string().as_bytes())
}

#[test]
fn lazyvault_npz_brings_records_back_under_their_keys() {
    let fx = Fixture::new();
    let w = npy_file("'<f8'", &[2], &f8(&[1.0, 2.0]));
    let zip = zip_bytes(&[
        manifest(json!([
            {"key": "run-1", "meta": {"t": 1.5}, "arrays": {"params/w": "run-1/params/w.npy"},
             "layout": {"dict": {"t": 1.5, "params": {"dict": {"w": {"array": "params/w"}}}}}},
            {"key": "run-2", "meta": {"n": 2, "x": "replaced"}, "arrays": {"x": "run-2/x.npy"}}
        ])),
        Member::stored("run-1/params/w.npy", &w),
        Member::deflated("run-2/x.npy", &w),
    ]);
    let path = fx.file("ours.npz", &zip);
    assert_eq!(fx.import(&path).unwrap(), ["run-1", "run-2"]);
    let one = fx.store.get("run-1").unwrap().unwrap();
    assert_eq!(one.meta["t"], 1.5);
    assert_eq!(
        one.layout["dict"]["params"]["dict"]["w"],
        json!({"array": "params/w"})
    );
    assert_eq!(fx.bytes("run-1", "params/w"), f8(&[1.0, 2.0]));
    // without a layout: the flat dict {**meta, **arrays}
    let two = fx.store.get("run-2").unwrap().unwrap();
    assert_eq!(serde_json::Value::Object(two.meta.clone()), json!({"n": 2}));
    assert_eq!(two.layout, json!({"fields": null}));
    // key= renames a single record only
    let err = fx
        .import_with(&path, Some("both"), &ImportOptions::default())
        .unwrap_err();
    assert!(
        matches!(err, Error::Interop(InteropError::Unsupported(_))),
        "{err}"
    );
    assert!(err.to_string().contains("single record"));
}

#[test]
fn npz_manifest_refusals() {
    let fx = Fixture::new();
    let w = npy_file("'<f8'", &[2], &f8(&[1.0, 2.0]));
    let member = || Member::stored("w.npy", &w);
    let rec = |extra: serde_json::Value| {
        let mut r = json!({"key": "k", "meta": {}, "arrays": {"w": "w.npy"}});
        r.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        r
    };
    let bad_json = Member::stored("__lazyvault__.json", b"{\"format\": \"lazyvault-npz\", ");
    fx.refused(&zip_bytes(&[bad_json, member()]), &["not valid JSON"]);
    let dup = Member::stored(
        "__lazyvault__.json",
        br#"{"format": "lazyvault-npz", "format": "x", "version": 1, "records": []}"#,
    );
    fx.refused(&zip_bytes(&[dup, member()]), &["duplicate key"]);
    for (records, part) in [
        (
            json!([rec(json!({"arrays": {"w": "../x.npy"}}))]),
            "missing members",
        ),
        (
            json!([rec(json!({"layout": {"dict": {"w": {"array": "nope"}}}}))]),
            "bad layout",
        ),
        (json!([rec(json!({"layout": [1]}))]), "bad layout"),
        (json!([rec(json!({"meta": []}))]), "bad metadata"),
        (
            json!([rec(json!({})), rec(json!({}))]),
            "bad or duplicate key 'k'",
        ),
        (json!([rec(json!({"key": ""}))]), "bad or duplicate key"),
        (
            json!([rec(json!({"arrays": {}}))]),
            "members not listed in it: ['w.npy']",
        ),
        (json!({}), "'records' is not a list"),
    ] {
        fx.refused(
            &zip_bytes(&[manifest(records), member()]),
            &["__lazyvault__.json", part],
        );
    }
    let v2 = json!({"format": "lazyvault-npz", "version": 2, "records": []});
    fx.refused(
        &zip_bytes(&[Member::stored(
            "__lazyvault__.json",
            v2.to_string().as_bytes(),
        )]),
        &["unknown version 2"],
    );
}

// ---------------------------------------------------------------------------
// .safetensors

fn safetensors(header: serde_json::Value, data: &[u8]) -> Vec<u8> {
    let mut text = header.to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(data);
    out
}

#[test]
fn safetensors_tensors_metadata_and_raw_bits() {
    let fx = Fixture::new();
    let w: Vec<u8> = (0..8u8).collect();
    let marker = json!({"version": 1, "json": ["t"], "fields": ["t", "name"]}).to_string();
    let file = safetensors(
        json!({
            "__metadata__": {"t": "300.0", "name": "Si", "format": "pt", "lazyvault": marker},
            "w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
            "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]},
            "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [12, 12]}
        }),
        &[&w[..], &[1, 2, 3, 4]].concat(),
    );
    let path = fx.file("m.safetensors", &file);
    assert_eq!(detect_format(&path).unwrap(), Format::Safetensors);
    assert_eq!(fx.import(&path).unwrap(), ["k"]);
    let record = fx.store.get("k").unwrap().unwrap();
    assert_eq!(
        serde_json::Value::Object(record.meta.clone()),
        json!({
            "t": 300.0, "name": "Si", "__metadata__": {"format": "pt"},
            "safetensors_dtypes": {"w": "BF16"}
        })
    );
    assert_eq!(record.arrays["w"].descr, "'<u2'");
    assert_eq!(record.arrays["w"].dtype, "uint16");
    assert_eq!(record.arrays["b"].dtype, "uint8");
    assert_eq!(fx.bytes("k", "w"), w);
    assert_eq!(fx.bytes("k", "b"), [1, 2, 3, 4]);
    assert_eq!(record.arrays["e"].shape, [0, 3]);
    // metadata fields, then the arrays: the compact layout says no more
    assert_eq!(record.layout, json!({"fields": null}));
    let names: Vec<&String> = record.arrays.keys().collect();
    assert_eq!(names, ["w", "b", "e"]);
}

#[test]
fn safetensors_without_metadata_and_with_an_empty_map_import_alike() {
    // no "__metadata__" gave no field, `{}` gave the field {}
    let fx = Fixture::new();
    let tensor = json!({"dtype": "U8", "shape": [2], "data_offsets": [0, 2]});
    let none = fx.file(
        "none.safetensors",
        &safetensors(json!({"w": tensor}), &[1, 2]),
    );
    let empty = safetensors(json!({"__metadata__": {}, "w": tensor}), &[1, 2]);
    let empty = fx.file("empty.safetensors", &empty);
    fx.import_with(&none, Some("none"), &ImportOptions::default())
        .unwrap();
    fx.import_with(&empty, Some("empty"), &ImportOptions::default())
        .unwrap();
    let (a, b) = (
        fx.store.get("none").unwrap().unwrap(),
        fx.store.get("empty").unwrap().unwrap(),
    );
    assert!(a.meta.is_empty(), "{:?}", a.meta);
    assert_eq!((&b.meta, &b.layout), (&a.meta, &a.layout));
}

#[test]
fn safetensors_records_marker_must_match_the_file() {
    // our export of several records lists them in its marker; a file whose
    // tensors or metadata do not match its list is refused, naming what
    let fx = Fixture::new();
    let t = |begin: u64| json!({"dtype": "U8", "shape": [1], "data_offsets": [begin, begin + 1]});
    let file = |records: serde_json::Value, metadata: serde_json::Value| {
        let marker = json!({"version": 1, "json": ["a", "b"], "fields": [], "records": records});
        let mut metadata = metadata.as_object().unwrap().clone();
        metadata.insert("lazyvault".into(), marker.to_string().into());
        safetensors(
            json!({"__metadata__": metadata, "a/x": t(0), "b/y": t(1)}),
            &[1, 2],
        )
    };
    let layout = |p: &str| json!({"dict": {p: {"array": p}}});
    let good = json!([
        {"key": "a", "arrays": ["x"], "layout": layout("x")},
        {"key": "b", "arrays": ["y"], "layout": layout("y")}
    ]);
    let meta = json!({"a": "{}", "b": r#"{"n": 1}"#});
    for (records, metadata, part) in [
        (json!({}), meta.clone(), "'records' is not a list"),
        (
            json!([{"key": "a", "arrays": ["x"], "layout": layout("x")}]),
            meta.clone(),
            "tensor 'b/y' belongs to no record",
        ),
        (
            json!([
                {"key": "a", "arrays": ["x", "z"], "layout": layout("x")},
                {"key": "b", "arrays": ["y"], "layout": layout("y")}
            ]),
            meta.clone(),
            "record 'a': no tensor 'a/z'",
        ),
        (
            json!([
                {"key": "a", "arrays": ["x"], "layout": layout("x")},
                {"key": "a", "arrays": ["y"], "layout": layout("y")}
            ]),
            meta.clone(),
            "duplicate key",
        ),
        (
            json!([
                {"key": "a", "arrays": ["x"], "layout": layout("y")},
                {"key": "b", "arrays": ["y"], "layout": layout("y")}
            ]),
            meta.clone(),
            "record 'a': bad or missing layout",
        ),
        (
            good.clone(),
            json!({"a": "{}", "b": "[1]"}),
            "record 'b': __metadata__ holds no JSON object",
        ),
        (
            good.clone(),
            json!({"a": "{}", "b": "{}", "c": "x"}),
            "__metadata__ entry 'c' belongs to no record",
        ),
    ] {
        fx.refused(&file(records, metadata), &["lazyvault", part]);
    }
    let path = fx.file("good.safetensors", &file(good, meta));
    assert_eq!(fx.import(&path).unwrap(), ["a", "b"]);
    let b = fx.store.get("b").unwrap().unwrap();
    assert_eq!(serde_json::Value::Object(b.meta), json!({"n": 1}));
    assert_eq!(fx.bytes("b", "y"), [2]);
    assert_eq!(fx.bytes("a", "x"), [1]);
}

#[test]
fn safetensors_refusals() {
    let fx = Fixture::new();
    let t = |dtype: &str, shape: serde_json::Value, offsets: serde_json::Value| json!({"dtype": dtype, "shape": shape, "data_offsets": offsets});
    for (header, data, part) in [
        (
            json!({"a": t("F32", json!([4]), json!([0, 16]))}),
            8,
            "outside the data section",
        ),
        (
            json!({"a": t("U8", json!([1]), json!([-1, 0]))}),
            1,
            "outside the data section",
        ),
        (
            json!({"a": t("F32", json!([2]), json!([0, 8])), "b": t("F32", json!([2]), json!([4, 12]))}),
            12,
            "overlap",
        ),
        (
            json!({"a": t("F32", json!([3]), json!([0, 8]))}),
            8,
            "needs 12",
        ),
        (
            json!({"a": t("F64", json!([1u64 << 40, 1u64 << 40]), json!([0, 8]))}),
            8,
            "more than 2^64",
        ),
        (
            json!({"a": t("Q7", json!([1]), json!([0, 1]))}),
            1,
            "unknown dtype 'Q7'",
        ),
        (
            json!({"a": t("F4", json!([1]), json!([0, 1]))}),
            1,
            "sub-byte",
        ),
        (
            json!({"a": t("U8", json!([1.0]), json!([0, 1]))}),
            1,
            "bad shape",
        ),
        (
            json!({"a": t("U8", json!([1]), json!([0]))}),
            1,
            "bad data_offsets",
        ),
        (json!({"a": 1}), 0, "not an object"),
        (
            json!({"__metadata__": {"a": 1}}),
            0,
            "__metadata__ must map strings",
        ),
    ] {
        fx.refused(&safetensors(header, &vec![0; data]), &[part]);
    }
    let dup = br#"{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}"#;
    let mut file = (dup.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(dup);
    file.push(0);
    fx.refused(&file, &["duplicate key"]);
    // a length past the end: InvalidFile from the detection already
    let mut past = 1u64.to_le_bytes().to_vec();
    past[0] = 200;
    past.extend_from_slice(b"{}");
    fx.refused(&past, &["exceeds the file"]);
    // a raw-bit tensor named like the field that keeps the tags
    let clash = safetensors(
        json!({"safetensors_dtypes": t("BF16", json!([1]), json!([0, 2]))}),
        &[0, 0],
    );
    fx.refused(&clash, &["tensor 'safetensors_dtypes' collides"]);
}

#[test]
fn unknown_formats() {
    let fx = Fixture::new();
    for content in [&b""[..], b"hello world", b"\x89PNG\r\n\x1a\n0000", b"{}"] {
        let path = fx.file("x", content);
        let err = fx.import(&path).unwrap_err();
        assert!(
            matches!(err, Error::Interop(InteropError::UnknownFormat { .. })),
            "{err}"
        );
        assert!(err.to_string().contains("not a .npy, .npz"), "{err}");
    }
    let err = fx.import(&fx.dir.path().join("missing.npy")).unwrap_err();
    assert!(
        matches!(err, Error::Storage(StorageError::Io { .. })),
        "{err}"
    );
}

#[test]
fn free_space_and_many_members() {
    let fx = Fixture::new();
    // 3,000 members through one file: no descriptor per member
    let members: Vec<Member> = (0..3000)
        .map(|i| {
            Member::stored(
                &format!("a{i}.npy"),
                &npy_file("'<f8'", &[1], &f8(&[i as f64])),
            )
        })
        .collect();
    let path = fx.file("many.npz", &zip_bytes(&members));
    fx.import(&path).unwrap();
    let record = fx.store.get("k").unwrap().unwrap();
    assert_eq!(record.arrays.len(), 3000);
    assert_eq!(fx.bytes("k", "a2999"), f8(&[2999.0]));
}

// ---------------------------------------------------------------------------
// Found by a new user's trial

#[test]
fn shapes_numpy_cannot_hold_are_refused() {
    // numpy reads none of these back (NPY_MAXDIMS is 64; sizes fit intp):
    // they used to import, and reading them raised numpy's ValueError
    let fx = Fixture::new();
    let dims65 = format!(
        "{{'descr': '<f8', 'fortran_order': False, 'shape': ({}), }}",
        "1, ".repeat(65)
    );
    let mut npy65 = header_text(&dims65, 1);
    npy65.extend_from_slice(&f8(&[1.0]));
    fx.refused(&npy65, &["65 dimensions", "at most 64"]);
    let empty_huge = header_text(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 9223372036854775807), }",
        1,
    );
    fx.refused(&empty_huge, &["more than 2^63-1 bytes"]);
    fx.refused(
        &zip_bytes(&[Member::stored("x.npy", &npy65)]),
        &["member 'x.npy'", "65 dimensions"],
    );
    let t = |shape: serde_json::Value, end: u64| json!({"t": {"dtype": "F64", "shape": shape, "data_offsets": [0, end]}});
    fx.refused(
        &safetensors(t(json!(vec![1; 65]), 8), &[0; 8]),
        &["tensor 't'", "65 dimensions"],
    );
    fx.refused(
        &safetensors(t(json!([0, (1u64 << 63) - 1]), 0), &[]),
        &["tensor 't'", "more than 2^63-1 bytes"],
    );
    // numpy's own limit, not a stricter one: 64 dimensions import
    let dims64 = format!(
        "{{'descr': '<f8', 'fortran_order': False, 'shape': ({}), }}",
        "1, ".repeat(64)
    );
    let mut npy64 = header_text(&dims64, 1);
    npy64.extend_from_slice(&f8(&[1.0]));
    let path = fx.file("d64.npy", &npy64);
    fx.import(&path).unwrap();
    assert_eq!(
        fx.store.get("k").unwrap().unwrap().arrays["data"]
            .shape
            .len(),
        64
    );
}

#[test]
fn safetensors_tensors_cover_the_data_section_exactly() {
    // the reference reader refuses gaps and trailing bytes
    // (MetadataIncompleteBuffer, InvalidOffset); the importer took them
    let fx = Fixture::new();
    let t = |offsets: [u64; 2]| json!({"dtype": "U8", "shape": [offsets[1] - offsets[0]], "data_offsets": offsets});
    fx.refused(
        &safetensors(json!({"a": t([0, 4]), "b": t([6, 8])}), &[0; 8]),
        &["bytes 4-6", "no tensor"],
    );
    fx.refused(
        &safetensors(json!({"a": t([2, 4])}), &[0; 4]),
        &["bytes 0-2", "no tensor"],
    );
    fx.refused(
        &safetensors(json!({"a": t([0, 4])}), &[0; 8]),
        &["4 trailing bytes"],
    );
    fx.refused(&safetensors(json!({}), &[0; 8]), &["8 trailing bytes"]);
    // an empty tensor anywhere on the boundaries is fine
    let ok = safetensors(
        json!({"b": t([4, 8]), "e": t([4, 4]), "a": t([0, 4]), "z": t([8, 8])}),
        &[1, 2, 3, 4, 5, 6, 7, 8],
    );
    let path = fx.file("ok.safetensors", &ok);
    fx.import(&path).unwrap();
    assert_eq!(fx.bytes("k", "b"), [5, 6, 7, 8]);
}

#[test]
fn safetensors_c64_is_complex64() {
    // the format lists C64; the importer said "unknown dtype 'C64'"
    let fx = Fixture::new();
    // two complex64 values: (1+2j), (-3+0.5j)
    let c: Vec<u8> = [1.0f32, 2.0, -3.0, 0.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let file = safetensors(
        json!({"z": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}),
        &c,
    );
    let path = fx.file("c.safetensors", &file);
    fx.import(&path).unwrap();
    let record = fx.store.get("k").unwrap().unwrap();
    assert_eq!(record.arrays["z"].descr, "'<c8'");
    assert_eq!(record.arrays["z"].dtype, "complex64");
    assert!(!record.meta.contains_key("safetensors_dtypes"));
    assert_eq!(fx.bytes("k", "z"), c);
}

#[test]
fn duplicate_zip_members_are_named() {
    let fx = Fixture::new();
    let small = npy_file("'<f8'", &[1], &f8(&[1.0]));
    fx.refused(
        &zip_bytes(&[
            Member::stored("a.npy", &small),
            Member::stored("b.npy", &small),
            Member::stored("b.npy", &small),
        ]),
        &["member 'b.npy' occurs twice"],
    );
}

impl Fixture {
    /// An `.lvz` of the records `keys`, each `{"data": [1.0, 2.0]}`, written
    /// from a store of its own.
    fn lvz(&self, name: &str, keys: &[&str]) -> PathBuf {
        let src =
            Store::open(self.dir.path().join(format!("{name}.src.lv")), Mode::Append).unwrap();
        let npy = self.file(
            &format!("{name}.src.npy"),
            &npy_file("'<f8'", &[2], &f8(&[1.0, 2.0])),
        );
        for key in keys {
            import_file(
                &src,
                &npy,
                Some(key),
                "x",
                &ImportOptions::default(),
                &mut ImportHooks::default(),
            )
            .unwrap();
        }
        let path = self.dir.path().join(name);
        let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        export_store(&src, &path, &keys).unwrap();
        path
    }

    fn import_all(&self, paths: &[(&Path, &str)]) -> Result<Vec<String>, Error> {
        let sources: Vec<ImportSource<'_>> = paths
            .iter()
            .map(|(path, default_key)| ImportSource {
                path,
                key: None,
                default_key,
            })
            .collect();
        import_files(
            &self.store,
            &sources,
            &ImportOptions::default(),
            &mut ImportHooks::default(),
        )
    }
}

#[test]
fn a_damaged_lvz_is_an_invalid_file_naming_it() {
    // the archive reader's CorruptError came through, without the file
    let fx = Fixture::new();
    let path = fx.lvz("a.lvz", &["r"]);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[35] ^= 0xff; // the first member's name in its local header
    let err = fx.import(&fx.file("bad.lvz", &bytes)).unwrap_err();
    assert!(
        matches!(err, Error::Interop(InteropError::InvalidFile { .. })),
        "{err:?}"
    );
    assert_eq!(
        invalid_file_path(&err),
        Some(fx.dir.path().join("bad.lvz").as_path())
    );
    assert!(err.to_string().contains("member"), "{err}");
    assert!(fx.store.keys().unwrap().is_empty());
    assert!(fx.payload_files().is_empty());
    // a sound one imports, records under their own keys
    assert_eq!(fx.import(&path).unwrap(), ["r"]);
    assert_eq!(fx.bytes("r", "data"), f8(&[1.0, 2.0]));
}

#[test]
fn keys_of_several_files_must_not_collide() {
    // a directory's .lvz brought back a key an earlier file was imported
    // as: the later one overwrote it, the key list held it twice
    let fx = Fixture::new();
    let npy = fx.file("a.npy", &npy_file("'<f8'", &[1], &f8(&[7.0])));
    let lvz = fx.lvz("b.lvz", &["x", "a"]);
    let err = fx.import_all(&[(&npy, "a"), (&lvz, "b")]).unwrap_err();
    assert!(
        matches!(err, Error::Interop(InteropError::KeyCollision { .. })),
        "{err:?}"
    );
    let msg = err.to_string();
    for part in ["'a'", "a.npy", "b.lvz"] {
        assert!(msg.contains(part), "{msg} lacks {part}");
    }
    assert!(fx.store.keys().unwrap().is_empty());
    assert!(fx.payload_files().is_empty());
}

#[test]
fn a_file_given_twice_is_named_as_such() {
    // was reported as two files giving one key
    let fx = Fixture::new();
    let npy = fx.file("a.npy", &npy_file("'<f8'", &[1], &f8(&[7.0])));
    let other = fx.dir.path().join(".").join("a.npy");
    for (second, key) in [(&npy, "a"), (&other, "b")] {
        let err = fx.import_all(&[(&npy, "a"), (second, key)]).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, Error::Interop(InteropError::Unsupported(_))),
            "{err:?}"
        );
        assert!(
            msg.contains("given twice") && msg.contains("a.npy"),
            "{msg}"
        );
    }
    assert!(fx.store.keys().unwrap().is_empty());
    assert!(fx.payload_files().is_empty());
}

#[test]
fn several_files_are_imported_all_or_nothing() {
    // a directory import failing on its 3rd file kept the first two
    let fx = Fixture::new();
    let a = fx.file("a.npy", &npy_file("'<f8'", &[1], &f8(&[1.0])));
    let b = fx.lvz("b.lvz", &["r1", "r2"]);
    let good_c = npy_file("'<f8'", &[3], &f8(&[1.0, 2.0, 3.0]));
    let c = fx.file("c.npz", &zip_bytes(&[Member::deflated("x.npy", &good_c)]));
    // damaged in its data: found only while copying, after a.npy and b.lvz
    // were staged
    let crc_bad = Member {
        crc: Some(0),
        ..Member::deflated("x.npy", &good_c)
    };
    std::fs::write(&c, zip_bytes(&[crc_bad])).unwrap();
    let err = fx
        .import_all(&[(&a, "a"), (&b, "b"), (&c, "c")])
        .unwrap_err();
    assert!(err.to_string().contains("CRC"), "{err}");
    assert_eq!(invalid_file_path(&err), Some(c.as_path()));
    assert!(fx.store.keys().unwrap().is_empty());
    assert!(fx.payload_files().is_empty());
    // refused while checking: nothing staged at all
    std::fs::write(&c, b"\x93NUMPY garbage").unwrap();
    fx.import_all(&[(&a, "a"), (&b, "b"), (&c, "c")])
        .unwrap_err();
    assert!(fx.store.keys().unwrap().is_empty());
    // sound: one commit, progress per array over all the files
    std::fs::write(&c, zip_bytes(&[Member::deflated("x.npy", &good_c)])).unwrap();
    let mut calls = Vec::new();
    let mut progress = |done, total| {
        calls.push((done, total));
        true
    };
    let mut hooks = ImportHooks {
        progress: Some(&mut progress),
        repickle: None,
    };
    let sources: Vec<ImportSource<'_>> = [(&a, "a"), (&b, "b"), (&c, "c")]
        .iter()
        .map(|(path, default_key)| ImportSource {
            path,
            key: None,
            default_key,
        })
        .collect();
    let keys = import_files(&fx.store, &sources, &ImportOptions::default(), &mut hooks).unwrap();
    assert_eq!(keys, ["a", "r1", "r2", "c"]);
    assert_eq!(calls, [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]);
    assert_eq!(fx.bytes("c", "x"), f8(&[1.0, 2.0, 3.0]));
}
