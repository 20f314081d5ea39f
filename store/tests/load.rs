//! `load_payload`: small payloads are read into aligned memory, large ones
//! are memory-mapped, with the same checks either way.

use std::fs;

use lazyvault_store::{load_payload, ArraySource, Mode, Store, READ_MAX_BYTES};
use serde_json::{Map, Value};

#[path = "common/records.rs"]
mod records;
use records::u8_array;

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + 7) as u8).collect()
}

/// The number of mappings of this process (lines of /proc/self/maps).
fn map_count() -> usize {
    fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// The number of open file descriptors of this process.
fn fd_count() -> usize {
    fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn small_payloads_are_read_large_ones_mapped_at_the_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("t.lv"), Mode::Append).unwrap();
    let max = READ_MAX_BYTES as usize;
    let sizes = [1, 63, 64, 4096, max - 1, max, max + 1, 4 * max];
    let datas: Vec<Vec<u8>> = sizes.iter().map(|&n| pattern(n)).collect();
    let sources: Vec<ArraySource> = datas
        .iter()
        .enumerate()
        .map(|(i, d)| u8_array(["a", "b", "c", "d", "e", "f", "g", "h"][i], d))
        .collect();
    store
        .put("k", Map::new(), Value::Null, &sources, None)
        .unwrap();
    let record = store.get("k").unwrap().unwrap();
    for (src, data) in sources.iter().zip(&datas) {
        let entry = &record.arrays[&src.name];
        let loaded = load_payload(store.root(), entry).unwrap();
        assert_eq!(loaded.as_bytes(), &data[..], "{}", data.len());
        assert_eq!(
            loaded.is_mapped(),
            data.len() > max,
            "{} bytes: mapped iff over {max}",
            data.len()
        );
        assert_eq!(
            loaded.as_bytes().as_ptr() as usize % 64,
            0,
            "{} bytes: data 64-byte aligned",
            data.len()
        );
    }
}

#[test]
fn holding_many_small_payloads_holds_no_maps_and_no_fds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("m.lv"), Mode::Append).unwrap();
    let data = pattern(100);
    store
        .put("k", Map::new(), Value::Null, &[u8_array("a", &data)], None)
        .unwrap();
    let entry = store.get("k").unwrap().unwrap().arrays["a"].clone();
    let (maps_before, fds_before) = (map_count(), fd_count());
    // The same payload loaded 2000 times: 2000 copies held at once.
    let held: Vec<_> = (0..2000)
        .map(|_| load_payload(store.root(), &entry).unwrap())
        .collect();
    // Other test threads may map or open a few things meanwhile; 2000
    // mapped payloads (or leaked descriptors) would be far over this.
    assert!(map_count() < maps_before + 200, "{} maps", map_count());
    assert!(fd_count() < fds_before + 200, "{} fds", fd_count());
    for loaded in &held {
        assert!(!loaded.is_mapped());
        assert_eq!(loaded.as_bytes(), &data[..]);
    }
}

#[test]
fn small_payloads_get_the_same_checks_as_mapped_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("c.lv"), Mode::Append).unwrap();
    let data = pattern(1000);
    store
        .put("k", Map::new(), Value::Null, &[u8_array("a", &data)], None)
        .unwrap();
    let entry = store.get("k").unwrap().unwrap().arrays["a"].clone();
    let file = store.root().join(entry.relpath());
    let original = fs::read(&file).unwrap();
    // a small payload is a member of a pack: its .npy bytes end here
    let start = entry.npy_start() as usize;
    let end = start + (entry.data_offset + entry.nbytes) as usize;

    // One byte short of the data.
    fs::write(&file, &original[..end - 1]).unwrap();
    let err = load_payload(store.root(), &entry).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");

    // Cut inside the header.
    fs::write(&file, &original[..start + 20]).unwrap();
    let err = load_payload(store.root(), &entry).unwrap_err();
    assert!(matches!(err, lazyvault_store::Error::Corrupt(_)), "{err}");

    // A header that disagrees with the record (another shape).
    let mut other = entry.clone();
    other.shape = vec![999];
    other.nbytes = 999;
    fs::write(&file, &original).unwrap();
    let err = load_payload(store.root(), &other).unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");

    // A data offset far past any header is refused before allocating.
    let mut far = entry.clone();
    far.data_offset = 1 << 40;
    assert!(load_payload(store.root(), &far).is_err());

    // Extra bytes after the data are allowed (as when mapping).
    let mut longer = original.clone();
    longer.extend_from_slice(b"tail");
    fs::write(&file, &longer).unwrap();
    assert_eq!(
        load_payload(store.root(), &entry).unwrap().as_bytes(),
        &data[..]
    );

    // A pack read before stays open (packs never change): removed by
    // someone else, it still reads until its store lets it go.
    fs::remove_file(&file).unwrap();
    assert_eq!(
        load_payload(store.root(), &entry).unwrap().as_bytes(),
        &data[..]
    );
    store.close().unwrap();
    let err = load_payload(store.root(), &entry).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}
