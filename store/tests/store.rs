//! Integration tests of the engine through its public API.

use std::fs;

use lazyvault_store::query::Query;
use lazyvault_store::{
    load_payload, map_payload, ArraySource, Error, Mode, OpenError, Store, UsageError,
};
use serde_json::{json, Map, Value};

fn meta(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("object")
}

fn f64_source<'a>(name: &str, data: &'a [u8], shape: Vec<u64>) -> ArraySource<'a> {
    ArraySource {
        name: name.into(),
        descr: "'<f8'".into(),
        dtype: "float64".into(),
        shape,
        fortran_order: false,
        data,
        pickled: false,
    }
}

fn bytes_of(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn put_get_delete_len_iterate_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let data = bytes_of(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    {
        let store = Store::open(&path, Mode::Append).unwrap();
        assert_eq!(store.len().unwrap(), 0);
        for (i, key) in ["b", "a", "🦀", "../x"].iter().enumerate() {
            store
                .put(
                    key,
                    meta(json!({"i": i, "material": "Si"})),
                    Value::Null,
                    &[f64_source("positions", &data, vec![2, 3])],
                    None,
                )
                .unwrap();
        }
        assert_eq!(store.len().unwrap(), 4);
        assert_eq!(store.keys().unwrap(), ["../x", "a", "b", "🦀"]);
        assert!(store.delete("b").unwrap());
        assert!(!store.delete("b").unwrap());
        assert_eq!(store.len().unwrap(), 3);
        store.close().unwrap();
        assert!(matches!(store.len(), Err(Error::Usage(UsageError::Closed))));
    }
    let store = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(store.len().unwrap(), 3);
    let record = store.get("🦀").unwrap().unwrap();
    assert_eq!(record.meta["i"], json!(2));
    let entry = &record.arrays["positions"];
    assert_eq!(entry.shape, [2, 3]);
    assert_eq!(entry.data_offset % 64, 0);
    let mapped = map_payload(store.root(), entry).unwrap();
    assert_eq!(mapped.as_bytes(), &data[..]);
    assert!(store.get("b").unwrap().is_none());
    assert!(matches!(
        store.put("z", Map::new(), Value::Null, &[], None),
        Err(Error::Usage(UsageError::ReadOnly))
    ));
}

#[test]
fn find_and_count_use_the_query_language() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("q.lv"), Mode::Append).unwrap();
    let data = bytes_of(&[0.0; 12]);
    for i in 0..10u32 {
        let shape = vec![u64::from(i) % 3 + 1, 4];
        let n = (shape[0] * 4 * 8) as usize;
        store
            .put(
                &format!("run-{i}"),
                meta(json!({"temperature": 250 + 10 * i, "material": if i % 2 == 0 {"Si"} else {"Ge"}})),
                Value::Null,
                &[f64_source("positions", &data[..n], shape)],
                None,
            )
            .unwrap();
    }
    let q = Query::parse("temperature > 280 and material == 'Si'").unwrap();
    assert_eq!(store.find(&q).unwrap(), ["run-4", "run-6", "run-8"]);
    let q = Query::parse("positions.shape[0] == 3").unwrap();
    assert_eq!(store.count(&q).unwrap(), 3); // i = 2, 5, 8
    let q = Query::parse("key.startswith('run-1')").unwrap();
    assert_eq!(store.find(&q).unwrap(), ["run-1"]);
    assert!(Query::parse("temperature >> 3").is_err());
}

#[test]
fn array_bytes_must_match_dtype_and_shape() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("a.lv"), Mode::Append).unwrap();
    let data = bytes_of(&[1.0, 2.0]);
    let err = store
        .put(
            "k",
            Map::new(),
            Value::Null,
            &[f64_source("a", &data, vec![3])],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::Usage(UsageError::InvalidArray { .. })),
        "{err}"
    );
    let mut bad = f64_source("a", &data, vec![2]);
    bad.descr = "'<q9'".into();
    assert!(store
        .put("k", Map::new(), Value::Null, &[bad], None)
        .is_err());
    let dup = [
        f64_source("a", &data, vec![2]),
        f64_source("a", &data, vec![2]),
    ];
    assert!(store.put("k", Map::new(), Value::Null, &dup, None).is_err());
    assert!(matches!(
        store.put("", Map::new(), Value::Null, &[], None),
        Err(Error::Usage(UsageError::EmptyKey))
    ));
    // nothing was committed and no payload was left behind
    assert_eq!(store.len().unwrap(), 0);
    assert!(store.verify().unwrap().orphans.is_empty());
}

#[test]
fn a_second_handle_shares_the_writer_and_repair_is_locked_out_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    let second = Store::open(&path, Mode::Append).unwrap();
    second.put("k", Map::new(), Value::Null, &[], None).unwrap();
    assert!(store.contains("k").unwrap());
    match Store::repair(&path) {
        Err(Error::Open(OpenError::Locked { pid, .. })) => {
            assert_eq!(pid, Some(std::process::id()))
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("repair ran beside a writer"),
    }
    second.close().unwrap();
    store.close().unwrap();
    for _ in 0..20 {
        let s = Store::open(&path, Mode::Append).unwrap();
        s.close().unwrap();
    }
}

#[test]
fn newer_major_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.lv");
    Store::open(&path, Mode::Create).unwrap().close().unwrap();
    let manifest = path.join("lazyvault.json");
    let text = fs::read_to_string(&manifest).unwrap();
    let current = format!("\"{}\"", lazyvault_store::schema::FORMAT_VERSION);
    fs::write(&manifest, text.replace(&current, "\"9.0\"")).unwrap();
    let err = Store::open(&path, Mode::Append).err().expect("refused");
    assert!(
        matches!(err, Error::Open(OpenError::Format { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("9.0"));
}

#[test]
fn modes_check_existence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.lv");
    assert!(matches!(
        Store::open(&path, Mode::ReadOnly),
        Err(Error::Open(OpenError::NotFound(_)))
    ));
    Store::open(&path, Mode::Create).unwrap().close().unwrap();
    assert!(matches!(
        Store::open(&path, Mode::Create),
        Err(Error::Open(OpenError::Exists(_)))
    ));
    let other = dir.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("x"), b"x").unwrap();
    assert!(matches!(
        Store::open(&other, Mode::Append),
        Err(Error::Open(OpenError::NotAStore(_)))
    ));
}

#[test]
fn overwritten_payloads_go_at_flush_and_mappings_survive() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("o.lv"), Mode::Append).unwrap();
    let old = bytes_of(&[7.0; 1024]);
    store
        .put(
            "k",
            Map::new(),
            Value::Null,
            &[f64_source("a", &old, vec![1024])],
            None,
        )
        .unwrap();
    let entry = store.get("k").unwrap().unwrap().arrays["a"].clone();
    let mapped = map_payload(store.root(), &entry).unwrap();
    let new = bytes_of(&[1.0]);
    store
        .put(
            "k",
            Map::new(),
            Value::Null,
            &[f64_source("a", &new, vec![1])],
            None,
        )
        .unwrap();
    assert!(store.root().join(entry.relpath()).exists());
    store.flush().unwrap();
    assert!(!store.root().join(entry.relpath()).exists());
    assert_eq!(mapped.as_bytes(), &old[..]);
    assert!(map_payload(store.root(), &entry).is_err());
}

#[test]
fn short_payload_is_refused_before_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("t.lv"), Mode::Append).unwrap();
    let data = bytes_of(&[3.0; 4096]);
    store
        .put(
            "k",
            Map::new(),
            Value::Null,
            &[f64_source("a", &data, vec![4096])],
            None,
        )
        .unwrap();
    let entry = store.get("k").unwrap().unwrap().arrays["a"].clone();
    let file = store.root().join(entry.relpath());
    let f = fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(entry.data_offset + entry.nbytes - 1).unwrap();
    let err = map_payload(store.root(), &entry).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    let report = store.verify().unwrap();
    // the array, and (a small array is a pack member) its pack, whose zip
    // end record went with the cut
    assert_eq!(report.problems.len(), 2, "{report:?}");
    assert!(report.problems.iter().any(|p| p.contains("truncated")));
    assert!(report.problems.iter().any(|p| p.starts_with("pack ")));
}

#[test]
fn zero_size_arrays_map_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("z.lv"), Mode::Append).unwrap();
    store
        .put(
            "k",
            Map::new(),
            Value::Null,
            &[f64_source("a", &[], vec![0, 5])],
            None,
        )
        .unwrap();
    let entry = store.get("k").unwrap().unwrap().arrays["a"].clone();
    assert_eq!(entry.nbytes, 0);
    assert!(map_payload(store.root(), &entry)
        .unwrap()
        .as_bytes()
        .is_empty());
}

/// Files under `arrays/` (payloads and temporary files).
fn payload_files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for dir in fs::read_dir(root.join("arrays")).unwrap() {
        for f in fs::read_dir(dir.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    out.sort();
    out
}

#[test]
fn put_many_sets_every_record_in_order_with_one_batch() {
    use lazyvault_store::NewRecord;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    store.create_index("v").unwrap();
    store
        .put("old", meta(json!({"v": 0})), Value::Null, &[], None)
        .unwrap();
    // 30 arrays in all: the syncfs barrier path on Linux.
    let data: Vec<Vec<u8>> = (0..30).map(|i| bytes_of(&[i as f64; 4])).collect();
    let srcs: Vec<ArraySource<'_>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| f64_source(&format!("x{i}"), d, vec![4]))
        .collect();
    let record = |key: &'static str, v: i64, arrays| NewRecord {
        key,
        meta: meta(json!({ "v": v })),
        layout: Value::Null,
        arrays,
        pickle: None,
    };
    store
        .put_many(vec![
            record("a", 1, &srcs[..10]),
            record("old", 2, &srcs[10..20]),
            record("a", 3, &srcs[20..]),
        ])
        .unwrap();
    assert_eq!(store.len().unwrap(), 2, "a repeated key counts once");
    let a = store.get("a").unwrap().unwrap();
    assert_eq!(a.meta["v"], json!(3), "the later record of a key wins");
    assert_eq!(a.arrays.len(), 10);
    let mapped = map_payload(store.root(), &a.arrays["x25"]).unwrap();
    assert_eq!(mapped.as_bytes(), &bytes_of(&[25.0; 4])[..]);
    assert_eq!(store.get("old").unwrap().unwrap().meta["v"], json!(2));
    // The secondary index follows the last version of each key only.
    let find = |q: &str| store.find(&Query::parse(q).unwrap()).unwrap();
    assert_eq!(find("v == 3"), ["a"]);
    assert_eq!(find("v == 2"), ["old"]);
    assert!(find("v == 1").is_empty() && find("v == 0").is_empty());
    // The first version of "a" is unreferenced: removed at flush.
    store.flush().unwrap();
    // one pack: 20 of its 30 members live, so it stays (gc compacts it)
    assert_eq!(payload_files(store.root()).len(), 1);
    store.put_many(Vec::new()).unwrap();
    store.close().unwrap();
    // The journal holds all of it: a repaired index has the same records.
    Store::repair(dir.path().join("s.lv")).unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    assert_eq!(store.get("a").unwrap().unwrap().meta["v"], json!(3));
    assert_eq!(store.len().unwrap(), 2);
    assert!(store.verify().unwrap().is_ok());
}

#[test]
fn put_many_is_all_or_nothing() {
    use lazyvault_store::NewRecord;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let good = bytes_of(&[1.0, 2.0]);
    store
        .put(
            "keep",
            meta(json!({"v": 0})),
            Value::Null,
            &[f64_source("x", &good, vec![2])],
            None,
        )
        .unwrap();
    let before = payload_files(store.root());
    let many: Vec<ArraySource<'_>> = (0..20)
        .map(|i| f64_source(&format!("x{i}"), &good, vec![2]))
        .collect();
    let bad = [f64_source("x", &good, vec![3])]; // 16 bytes for 3 float64
    let record = |key: &'static str, arrays| NewRecord {
        key,
        meta: meta(json!({"v": 1})),
        layout: Value::Null,
        arrays,
        pickle: None,
    };
    for (arrays, late) in [(&many[..], &bad[..]), (&bad[..], &many[..])] {
        let err = store
            .put_many(vec![record("new", arrays), record("keep", late)])
            .unwrap_err();
        assert!(
            matches!(err, Error::Usage(UsageError::InvalidArray { .. })),
            "{err}"
        );
        assert!(!store.contains("new").unwrap());
        assert_eq!(store.get("keep").unwrap().unwrap().meta["v"], json!(0));
        assert_eq!(payload_files(store.root()), before, "payloads left behind");
    }
    // Invalid keys are refused before anything is written.
    let err = store
        .put_many(vec![record("new", &many[..]), record("", &[])])
        .unwrap_err();
    assert!(matches!(err, Error::Usage(UsageError::EmptyKey)), "{err}");
    assert_eq!(payload_files(store.root()), before);
    store.close().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    assert_eq!(store.keys().unwrap(), ["keep"]);
}

#[test]
fn replace_arrays_writes_only_the_new_payloads_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    // over 64 KiB: a file of its own (the small labels are a pack's member)
    let big = bytes_of(&[1.0; 8200]);
    let labels = bytes_of(&[1.0, 2.0]);
    let store = Store::open(&path, Mode::Append).unwrap();
    let arrays = [
        f64_source("big", &big, vec![100, 82]),
        f64_source("labels", &labels, vec![2]),
    ];
    let pickle: &[u8] = b"\x80\x05N.";
    store
        .put(
            "k",
            meta(json!({"run": 7})),
            json!({"t": "dict"}),
            &arrays,
            Some(pickle),
        )
        .unwrap();
    store.flush().unwrap();
    let before = store.get("k").unwrap().unwrap();
    let big_file = path.join(before.arrays["big"].relpath());
    let old_labels = path.join(before.arrays["labels"].relpath());

    let new_labels = bytes_of(&[5.0, 6.0, 7.0]);
    let replaced = store
        .replace_arrays("k", &[f64_source("labels", &new_labels, vec![3])])
        .unwrap();
    assert!(replaced);
    let after = store.get("k").unwrap().unwrap();
    assert_eq!(after.meta, before.meta);
    assert_eq!(after.layout, before.layout);
    assert_eq!(store.get_pickle("k").unwrap().as_deref(), Some(pickle));
    // same payload for the kept array, a new one for the replaced, same order
    assert_eq!(after.arrays["big"], before.arrays["big"]);
    assert_ne!(after.arrays["labels"].id, before.arrays["labels"].id);
    assert_eq!(after.arrays.keys().collect::<Vec<_>>(), ["big", "labels"]);
    let mapped = map_payload(&path, &after.arrays["labels"]).unwrap();
    assert_eq!(mapped.as_bytes(), &new_labels[..]);

    store.flush().unwrap();
    assert!(big_file.exists(), "a kept payload must never be removed");
    assert!(!old_labels.exists(), "the replaced payload goes at flush");
    assert_eq!(payload_files(&path).len(), 2);
    let report = store.verify().unwrap();
    assert!(
        report.problems.is_empty() && report.orphans.is_empty(),
        "{report:?}"
    );
    store.close().unwrap();

    // the journal says the same: a rebuilt index has the same record
    Store::repair(&path).unwrap();
    let store = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(store.get("k").unwrap().unwrap(), after);
}

#[test]
fn replace_arrays_refuses_unknown_or_repeated_names_and_missing_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let data = bytes_of(&[1.0, 2.0]);
    let store = Store::open(&path, Mode::Append).unwrap();
    store
        .put(
            "k",
            meta(json!({})),
            Value::Null,
            &[f64_source("a", &data, vec![2])],
            None,
        )
        .unwrap();
    let before = store.get_json("k").unwrap();
    assert!(!store
        .replace_arrays("missing", &[f64_source("a", &data, vec![2])])
        .unwrap());
    let err = store
        .replace_arrays("k", &[f64_source("b", &data, vec![2])])
        .unwrap_err();
    assert!(
        matches!(&err, Error::Usage(UsageError::InvalidArray { name, detail }) if name == "b" && detail.contains("no array of this name")),
        "{err}"
    );
    let twice = [
        f64_source("a", &data, vec![2]),
        f64_source("a", &data, vec![2]),
    ];
    let err = store.replace_arrays("k", &twice).unwrap_err();
    assert!(
        matches!(&err, Error::Usage(UsageError::InvalidArray { detail, .. }) if detail.contains("same name"))
    );
    let bad = store
        .replace_arrays("k", &[f64_source("a", &data, vec![3])])
        .unwrap_err();
    assert!(matches!(bad, Error::Usage(UsageError::InvalidArray { .. })));
    assert_eq!(store.get_json("k").unwrap(), before, "nothing changed");
    assert_eq!(
        payload_files(&path).len(),
        1,
        "no file left by a refused call"
    );
    assert!(!store.contains("missing").unwrap());
}

/// A dtype of 500 long-named fields needs a 145 KB header (version 2.0 of
/// the format): numpy writes it, and so does the store, which reads it back
/// small (one read) and large (mapped), and through verify.
#[test]
fn a_header_past_numpys_default_limit_is_written_and_read_back() {
    let fields: Vec<String> = (0..500)
        .map(|i| format!("('{}', '<f8')", i.to_string().repeat(100)))
        .collect();
    let descr = format!("[{}]", fields.join(", "));
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("w.lv"), Mode::Append).unwrap();
    for (key, len) in [("small", 2u64), ("large", 40)] {
        let data: Vec<u8> = (0..len * 500 * 8).map(|i| (i % 251) as u8).collect();
        let src = ArraySource {
            name: "a".into(),
            descr: descr.clone(),
            dtype: "void32000".into(),
            shape: vec![len],
            fortran_order: false,
            data: &data,
            pickled: false,
        };
        store
            .put(key, Map::new(), Value::Null, &[src], None)
            .unwrap();
        let record = store.get(key).unwrap().unwrap();
        let entry = &record.arrays["a"];
        assert!(entry.data_offset > 100_000, "{}", entry.data_offset);
        let header = fs::read(store.root().join(entry.relpath())).unwrap();
        assert_eq!(&header[6..8], &[2, 0], "version 2.0");
        assert_eq!(
            load_payload(store.root(), entry).unwrap().as_bytes(),
            &data[..]
        );
        assert_eq!(
            map_payload(store.root(), entry).unwrap().as_bytes(),
            &data[..]
        );
    }
    let report = store.verify().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// An array numpy could not create (65 dimensions, or more than 2^63-1
/// bytes) is refused at put, and a record holding one reads as damaged.
#[test]
fn shapes_numpy_cannot_hold_are_refused_and_read_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("n.lv"), Mode::Append).unwrap();
    let data = bytes_of(&[1.0]);
    for shape in [vec![1u64; 65], vec![0, 1 << 62]] {
        match store.put(
            "k",
            Map::new(),
            Value::Null,
            &[f64_source("a", &data, shape)],
            None,
        ) {
            Err(Error::Usage(UsageError::InvalidArray { detail, .. })) => {
                assert!(
                    detail.contains("numpy") || detail.contains("dimensions"),
                    "{detail}"
                )
            }
            other => panic!("expected InvalidArray, got {other:?}"),
        }
    }
    store
        .put(
            "k",
            Map::new(),
            Value::Null,
            &[f64_source("a", &data, vec![1])],
            None,
        )
        .unwrap();
    let mut entry = store.get("k").unwrap().unwrap().arrays["a"].clone();
    entry.shape = vec![1; 65];
    for result in [
        load_payload(store.root(), &entry).map(|_| ()),
        map_payload(store.root(), &entry).map(|_| ()),
    ] {
        assert!(matches!(result, Err(Error::Corrupt(_))), "{result:?}");
    }
}

#[test]
fn verify_reports_a_layout_naming_an_array_the_record_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    let data = bytes_of(&[1.0, 2.0]);
    let layout = json!({"dict": {"x": {"array": "x"}, "lost": {"list": [{"array": "frames/9"}]},
                        "t": 1, "d": {"dict": {"array": "not a node"}}}});
    store
        .put(
            "k",
            meta(json!({"t": 1})),
            layout,
            &[f64_source("x", &data, vec![2])],
            None,
        )
        .unwrap();
    let fields = json!({"fields": ["t", "x", "gone"]});
    store
        .put(
            "f",
            meta(json!({"t": 1})),
            fields,
            &[f64_source("x", &data, vec![2])],
            None,
        )
        .unwrap();
    let sound = json!({"fields": ["x", "t"]});
    store
        .put(
            "ok",
            meta(json!({"t": 1})),
            sound,
            &[f64_source("x", &data, vec![2])],
            None,
        )
        .unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.problems.len(), 2, "{report:?}");
    let k = report
        .problems
        .iter()
        .find(|p| p.contains("\"k\""))
        .unwrap();
    assert!(k.contains("\"frames/9\"") && k.contains("layout"), "{k}");
    let f = report
        .problems
        .iter()
        .find(|p| p.contains("\"f\""))
        .unwrap();
    assert!(f.contains("\"gone\""), "{f}");
}

#[test]
fn verify_reports_an_entry_whose_dtype_disagrees_with_its_descr() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    let data = bytes_of(&[1.0, 2.0]);
    let mut wrong = f64_source("w/x", &data, vec![2]);
    wrong.dtype = "int32".into();
    store
        .put("k", Map::new(), Value::Null, &[wrong], None)
        .unwrap();
    store
        .put(
            "fine",
            Map::new(),
            Value::Null,
            &[f64_source("x", &data, vec![2])],
            None,
        )
        .unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.problems.len(), 1, "{report:?}");
    let p = &report.problems[0];
    for part in ["\"k\"", "\"w/x\"", "\"int32\"", "'<f8'", "float64"] {
        assert!(p.contains(part), "{part} not in {p}");
    }
}

#[test]
fn a_missing_payload_says_missing_and_why_only_when_known() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    store.set_retention(std::time::Duration::ZERO);
    let data = bytes_of(&[1.5; 20_000]); // a payload file of its own
    let src = [f64_source("z", &data, vec![20_000])];
    store.put("k", Map::new(), Value::Null, &src, None).unwrap();
    store.flush().unwrap();
    let old = store.get("k").unwrap().unwrap().arrays["z"].clone();
    let file = store.root().join(old.relpath());
    fs::remove_file(&file).unwrap();
    let err = load_payload(&path, &old).unwrap_err().to_string();
    assert!(
        err.contains("file is missing") && err.contains(file.to_str().unwrap()),
        "{err}"
    );
    assert!(!err.contains("overwritten"), "{err}");
    // the latest commit still references it: damage, not a stale record
    let hint = Store::missing_payload_hint(&path, "k", &old);
    assert!(
        hint.contains("still references") && hint.contains("verify"),
        "{hint}"
    );
    // replaced since: the record read was stale
    let data2 = bytes_of(&[2.5; 20_000]);
    let src2 = [f64_source("z", &data2, vec![20_000])];
    store
        .put("k", Map::new(), Value::Null, &src2, None)
        .unwrap();
    store.flush().unwrap();
    let hint = Store::missing_payload_hint(&path, "k", &old);
    assert!(
        hint.contains("overwritten or deleted since it was read"),
        "{hint}"
    );
    store.delete("k").unwrap();
    store.flush().unwrap();
    let hint = Store::missing_payload_hint(&path, "k", &old);
    assert!(
        hint.contains("overwritten or deleted since it was read"),
        "{hint}"
    );
}

#[test]
fn a_damaged_entry_names_no_made_up_array() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Append).unwrap();
    let data = bytes_of(&[1.0; 4]);
    let src = [f64_source("frames/0", &data, vec![4])];
    store.put("k", Map::new(), Value::Null, &src, None).unwrap();
    let entry = store.get("k").unwrap().unwrap().arrays["frames/0"].clone();
    let damaged = [
        lazyvault_store::schema::ArrayEntry {
            data_offset: 100,
            ..entry.clone()
        },
        lazyvault_store::schema::ArrayEntry {
            id: "not hex".into(),
            ..entry.clone()
        },
        lazyvault_store::schema::ArrayEntry {
            shape: vec![1; 65],
            ..entry.clone()
        },
    ];
    for bad in damaged {
        for err in [load_payload(&path, &bad), map_payload(&path, &bad)] {
            let text = err.unwrap_err().to_string();
            assert!(!text.contains("\"payload\""), "{text}");
            assert!(text.starts_with("array entry: "), "{text}");
        }
    }
}
