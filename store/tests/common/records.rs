//! Small builders the integration tests share: metadata maps and one-
//! dimensional `uint8` arrays to put.

use lazyvault_store::ArraySource;
use serde_json::{Map, Value};

/// `v` (a JSON object) as a record's metadata map.
#[allow(dead_code)] // not every test file uses both
pub fn meta(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("object")
}

/// A C-order `uint8` array named `name` holding `data` (shape `[len]`).
#[allow(dead_code)]
pub fn u8_array<'a>(name: &str, data: &'a [u8]) -> ArraySource<'a> {
    ArraySource {
        name: name.into(),
        descr: "'|u1'".into(),
        dtype: "uint8".into(),
        shape: vec![data.len() as u64],
        fortran_order: false,
        data,
        pickled: false,
    }
}

/// The journal segment the next change of the closed store at `root`
/// continues, and its bytes: the last segment, or, when a checkpoint
/// covers every segment (they are removed then, since 1.6), the new one
/// its position names, as just its header. For tests that append entries
/// by hand.
#[allow(dead_code)]
pub fn tail_segment(root: &std::path::Path) -> (std::path::PathBuf, Vec<u8>) {
    if let Some((_, path)) = lazyvault_store::journal::segments(root).unwrap().pop() {
        let bytes = std::fs::read(&path).unwrap();
        return (path, bytes);
    }
    let mut ckpts: Vec<_> = std::fs::read_dir(root.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ckpt"))
        .collect();
    ckpts.sort();
    let file = std::fs::read(ckpts.last().expect("a checkpoint")).unwrap();
    let len = u32::from_le_bytes(file[8..12].try_into().unwrap()) as usize;
    let doc: Value = serde_json::from_slice(&file[12..12 + len]).unwrap();
    let number = doc["journal"][0].as_u64().unwrap();
    assert_eq!(doc["journal"][1], 0, "a checkpoint at a segment's start");
    let mut header = b"LVJRNL\0\x01".to_vec();
    header.extend_from_slice(&number.to_le_bytes());
    (root.join(lazyvault_store::journal::relpath(number)), header)
}
