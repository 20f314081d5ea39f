//! A writer that changed more than `MAX_PENDING_BYTES` of records since its
//! last checkpoint commits and checkpoints on its own (its memory stays
//! bounded). Its own test binary: the limit is set per process.

use lazyvault_store::{Mode, Store};
use serde_json::{json, Value};

#[path = "common/records.rs"]
mod records;
use records::meta;

#[test]
fn a_writer_holding_too_many_changes_in_memory_commits_and_checkpoints() {
    lazyvault_store::set_max_pending_bytes(64 << 10);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = Store::open(&path, Mode::Create).unwrap();
    let pad = "x".repeat(200);
    for i in 0..2000 {
        store
            .put(
                &format!("k{i:05}"),
                meta(json!({"i": i, "pad": pad})),
                Value::Null,
                &[],
                None,
            )
            .unwrap();
    }
    // No flush(): 2,000 records of ~250 B passed the 64 KiB limit several
    // times; each time the writer committed and wrote a checkpoint.
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    let seen = reader.len().unwrap();
    assert!((1500..2000).contains(&seen), "{seen}");
    assert!(
        reader.version().unwrap() >= 5,
        "{}",
        reader.version().unwrap()
    );
    for key in reader.keys().unwrap() {
        let i: u64 = key[1..].parse().unwrap();
        assert_eq!(reader.get(&key).unwrap().unwrap().meta["i"], json!(i));
    }
    // The journal those checkpoints cover is gone (no reader holds them).
    drop(reader);
    store
        .put("last", meta(json!({})), Value::Null, &[], None)
        .unwrap();
    store.close().unwrap();
    let reader = Store::open(&path, Mode::ReadOnly).unwrap();
    assert_eq!(reader.len().unwrap(), 2001);
    assert!(reader.verify().unwrap().is_ok());
    lazyvault_store::set_max_pending_bytes(0);
}
