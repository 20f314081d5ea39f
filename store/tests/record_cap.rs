//! The record size cap (FORMAT.md, "Record size cap"): a record whose JSON
//! (without its array entries) plus pickled remainder is over
//! `MAX_RECORD_BYTES` is refused on every path that writes records, naming
//! its largest fields, and nothing is written.

use lazyvault_store::archive::write_archive_bytes;
use lazyvault_store::{
    ArraySource, Error, Mode, NewRecord, StagedRecord, Store, UsageError, MAX_RECORD_BYTES,
};
use serde_json::{json, Map};

#[path = "common/records.rs"]
mod records;
use records::{meta, u8_array};

fn payload_files(store: &Store) -> usize {
    let arrays = store.root().join(lazyvault_schema_dir());
    let dirs = std::fs::read_dir(arrays).into_iter().flatten().flatten();
    dirs.flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .count()
}

fn lazyvault_schema_dir() -> &'static str {
    lazyvault_store::schema::PAYLOAD_DIR
}

/// The refusal's key, size, cap and message.
fn refused(err: Error) -> (String, u64, u64, String) {
    let text = err.to_string();
    match err {
        Error::Usage(UsageError::RecordTooLarge { key, size, cap, .. }) => (key, size, cap, text),
        other => panic!("not a RecordTooLarge: {other}"),
    }
}

#[test]
fn a_record_over_the_cap_is_refused_naming_its_largest_fields() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let big = "x".repeat(MAX_RECORD_BYTES);
    let data = [1u8; 100];
    let err = store
        .put(
            "k",
            meta(json!({"text": big, "small": 1, "medium": "y".repeat(1000)})),
            json!(null),
            &[u8_array("a", &data)],
            None,
        )
        .unwrap_err();
    let (key, size, cap, text) = refused(err);
    assert_eq!(key, "k");
    assert_eq!(cap, MAX_RECORD_BYTES as u64);
    assert!(size > cap, "{size}");
    // the largest first, with their sizes (JSON bytes)
    let text_at = text.find(&format!("\"text\" {} bytes", MAX_RECORD_BYTES + 2));
    let medium_at = text.find("\"medium\" 1002 bytes");
    assert!(text_at.is_some() && medium_at.is_some(), "{text}");
    assert!(text_at < medium_at, "{text}");
    assert!(text.contains("arrays"), "{text}");
    assert!(!text.contains("its pickled remainder"), "{text}");
    assert!(
        text.contains("metadata, layout and pickled remainder"),
        "{text}"
    );
    // nothing written: no record, no payload file
    assert!(store.keys().unwrap().is_empty());
    assert_eq!(payload_files(&store), 0);
    // just under the cap is taken
    let fits = "x".repeat(MAX_RECORD_BYTES - 1000);
    store
        .put("k", meta(json!({"text": fits})), json!(null), &[], None)
        .unwrap();
    assert!(store.get_json("k").unwrap().unwrap().len() <= MAX_RECORD_BYTES);
}

#[test]
fn a_big_pickled_remainder_counts_and_a_batch_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    store
        .put("old", meta(json!({"v": 1})), json!(null), &[], None)
        .unwrap();
    let pickle = vec![0u8; MAX_RECORD_BYTES];
    let data = [2u8; 10];
    let sources = [u8_array("a", &data)];
    let records = vec![
        NewRecord {
            key: "fine",
            meta: meta(json!({"v": 2})),
            layout: json!(null),
            arrays: &sources,
            pickle: None,
        },
        NewRecord {
            key: "old",
            meta: meta(json!({"v": 3})),
            layout: json!(null),
            arrays: &[],
            pickle: Some(&pickle),
        },
    ];
    let (key, size, _, text) = refused(store.put_many(records).unwrap_err());
    assert_eq!(key, "old");
    assert!(size > MAX_RECORD_BYTES as u64);
    assert!(
        text.contains(&format!("pickled remainder {MAX_RECORD_BYTES} bytes")),
        "{text}"
    );
    // the whole batch: the store is as it was
    assert_eq!(store.keys().unwrap(), vec!["old".to_owned()]);
    assert_eq!(store.get("old").unwrap().unwrap().meta["v"], json!(1));
    assert_eq!(payload_files(&store), 0);
}

#[test]
fn staged_puts_and_archives_are_capped_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let big = "z".repeat(MAX_RECORD_BYTES);
    let data = [3u8; 10];
    // a staged put (what imports use): refused, its payloads removed
    let err = store
        .put_staged(1, 10, 1, |stage| {
            let entry = stage.write(&u8_array("a", &data))?;
            Ok(vec![StagedRecord {
                key: "imported".into(),
                meta: meta(json!({"note": big})),
                layout: json!(null),
                arrays: [("a".to_owned(), entry)].into_iter().collect(),
                pickle: None,
            }])
        })
        .unwrap_err();
    assert_eq!(refused(err).0, "imported");
    assert!(store.keys().unwrap().is_empty());
    assert_eq!(payload_files(&store), 0);
    // an archive
    let err = write_archive_bytes(|w| {
        w.add_record(
            "in-archive",
            meta(json!({"note": big})),
            json!(null),
            &[],
            None,
        )
    })
    .unwrap_err();
    assert_eq!(refused(err).0, "in-archive");
}

#[test]
fn array_entries_do_not_count() {
    // 10,000 arrays: about 1.7 MB of array entries, taken
    let names: Vec<String> = (0..10_000).map(|i| format!("frames/{i}")).collect();
    let sources: Vec<ArraySource<'_>> = names.iter().map(|n| u8_array(n, &[])).collect();
    let layout = json!({"list": names.iter().map(|n| json!({"array": n})).collect::<Vec<_>>()});
    let bytes =
        write_archive_bytes(|w| w.add_record("many", Map::new(), layout.clone(), &sources, None))
            .unwrap();
    let index = lazyvault_store::archive::ArchiveIndex::parse(&bytes, "mem").unwrap();
    let record = &index.get("many").unwrap().record;
    assert_eq!(record.arrays.len(), 10_000);
    assert!(record.to_json().len() > MAX_RECORD_BYTES);
}
