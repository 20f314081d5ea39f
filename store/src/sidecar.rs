//! Record sidecars: every record the store writes also goes, before its
//! index entry, to a file of its own holding its key, its record JSON and
//! its pickled remainder. The index is derived data (DESIGN.md invariant 7):
//! [`crate::Store::repair`] rebuilds it from the sidecars and payloads.
//!
//! A sidecar is `records/<gg>/<generation>.rec`, where `generation` is a
//! store-wide counter (16 lowercase hex digits) incremented by every put and
//! `gg` its low byte in hex. Binary layout, little-endian (FORMAT.md):
//!
//! ```text
//! 0   8  magic  b"LVREC\0\x01\n" (format version 1 of sidecars)
//! 8   8  generation (u64)
//! 16  4  key length (u32)
//! 20  4  record JSON length (u32)
//! 24  4  flags (u32): bit 0 = has a pickled remainder; other bits zero
//! 28  4  reserved, zero
//! 32  8  pickle length (u64; 0 without a pickle)
//! 40     key (UTF-8), record JSON, pickle
//! end-4  CRC-32 (IEEE) of every byte before it
//! ```

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fsio;
use crate::payload::TMP_SUFFIX;

/// Directory (relative to the store root) holding the record sidecars.
pub const SIDECAR_DIR: &str = "records";

const MAGIC: &[u8; 8] = b"LVREC\0\x01\n";
const HEADER_LEN: usize = 40;
const CRC_LEN: usize = 4;
const FLAG_PICKLE: u32 = 1;

/// One decoded sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sidecar {
    /// The put that wrote it; the highest generation of a key is its newest.
    pub generation: u64,
    pub key: String,
    /// The record JSON, byte for byte as the index holds it.
    pub record: Vec<u8>,
    /// The pickled remainder, if the record has one.
    pub pickle: Option<Vec<u8>>,
}

/// The sidecar file of `generation`, relative to the store root.
pub fn relpath(generation: u64) -> String {
    format!(
        "{SIDECAR_DIR}/{:02x}/{generation:016x}.rec",
        generation & 0xff
    )
}

/// The generation named by a sidecar file name (`<16 hex>.rec`), if it is one.
pub fn parse_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".rec")?;
    if hex.len() != 16 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Encodes the header, key, record JSON and pickle (without copying the
/// latter two) and the trailing CRC, as the parts of one file.
fn encode_header(
    generation: u64,
    key: &str,
    record: &[u8],
    pickle: Option<&[u8]>,
) -> Result<[u8; HEADER_LEN]> {
    let too_big = |what: &str| Error::TooLarge(format!("{what} longer than 4 GiB"));
    let key_len = u32::try_from(key.len()).map_err(|_| too_big("a key"))?;
    let record_len = u32::try_from(record.len()).map_err(|_| too_big("record metadata"))?;
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&generation.to_le_bytes());
    h[16..20].copy_from_slice(&key_len.to_le_bytes());
    h[20..24].copy_from_slice(&record_len.to_le_bytes());
    let flags = if pickle.is_some() { FLAG_PICKLE } else { 0 };
    h[24..28].copy_from_slice(&flags.to_le_bytes());
    h[32..40].copy_from_slice(&(pickle.map_or(0, <[u8]>::len) as u64).to_le_bytes());
    Ok(h)
}

/// Encodes a whole sidecar into memory (tests and fuzzing).
pub fn encode(generation: u64, key: &str, record: &[u8], pickle: Option<&[u8]>) -> Vec<u8> {
    let header = encode_header(generation, key, record, pickle).expect("small inputs");
    let mut out = header.to_vec();
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(record);
    out.extend_from_slice(pickle.unwrap_or_default());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a sidecar, checking every length against the buffer before use
/// and the CRC before returning anything.
pub fn decode(bytes: &[u8]) -> std::result::Result<Sidecar, String> {
    if bytes.len() < HEADER_LEN + CRC_LEN {
        return Err(format!(
            "{} bytes, shorter than a sidecar header",
            bytes.len()
        ));
    }
    if &bytes[0..8] != MAGIC {
        return Err("not a lazyvault record sidecar (bad magic)".into());
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let generation = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let key_len = u64::from(u32_at(16));
    let record_len = u64::from(u32_at(20));
    let flags = u32_at(24);
    let pickle_len = u64::from_le_bytes(bytes[32..40].try_into().expect("8 bytes"));
    if flags & !FLAG_PICKLE != 0 || u32_at(28) != 0 {
        return Err(format!(
            "unknown flags {flags:#x} (written by a newer lazyvault?)"
        ));
    }
    if flags & FLAG_PICKLE == 0 && pickle_len != 0 {
        return Err("pickle length without the pickle flag".into());
    }
    let expected = (HEADER_LEN as u64 + CRC_LEN as u64)
        .checked_add(key_len)
        .and_then(|n| n.checked_add(record_len))
        .and_then(|n| n.checked_add(pickle_len));
    if expected != Some(bytes.len() as u64) {
        return Err(format!(
            "{} bytes, the header's lengths need {}",
            bytes.len(),
            expected.map_or("more than 2^64".into(), |n| n.to_string())
        ));
    }
    let body_end = bytes.len() - CRC_LEN;
    let stored_crc = u32::from_le_bytes(bytes[body_end..].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..body_end]) != stored_crc {
        return Err("CRC-32 mismatch: the file is damaged".into());
    }
    // Lengths were checked to add up to the buffer: these casts and slices hold.
    let key_end = HEADER_LEN + key_len as usize;
    let record_end = key_end + record_len as usize;
    let key = std::str::from_utf8(&bytes[HEADER_LEN..key_end])
        .map_err(|_| "the key is not UTF-8".to_owned())?;
    if key.is_empty() {
        return Err("empty key".into());
    }
    Ok(Sidecar {
        generation,
        key: key.to_owned(),
        record: bytes[key_end..record_end].to_vec(),
        pickle: (flags & FLAG_PICKLE != 0).then(|| bytes[record_end..body_end].to_vec()),
    })
}

/// Writes the sidecar of `generation` crash-safely (temporary file, fsync,
/// rename) and returns the directory holding it, which the caller fsyncs.
pub(crate) fn write(
    root: &Path,
    generation: u64,
    key: &str,
    record: &[u8],
    pickle: Option<&[u8]>,
) -> Result<PathBuf> {
    let header = encode_header(generation, key, record, pickle)?;
    let path = root.join(relpath(generation));
    let dir = path.parent().expect("sidecar has a directory").to_owned();
    fsio::create_dir_all(&dir).map_err(Error::io(&dir))?;
    let mut crc = crc32fast::Hasher::new();
    let pickle = pickle.unwrap_or_default();
    for part in [&header[..], key.as_bytes(), record, pickle] {
        crc.update(part);
    }
    let crc = crc.finalize().to_le_bytes();
    let tmp = path.with_extension(format!("rec{TMP_SUFFIX}"));
    fsio::write_new_file(
        &path,
        &tmp,
        &[&header, key.as_bytes(), record, pickle, &crc],
    )
    .map_err(Error::io(&tmp))?;
    Ok(dir)
}

/// Reads and decodes the sidecar file at `path`.
pub(crate) fn read(path: &Path) -> Result<Sidecar> {
    let bytes = std::fs::read(path).map_err(Error::io(path))?;
    decode(&bytes).map_err(|e| Error::corrupt(format!("sidecar {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_and_without_pickle() {
        for pickle in [None, Some(&b"\x80\x05N."[..]), Some(&b""[..])] {
            let bytes = encode(42, "a/b ✓", br#"{"meta":{}}"#, pickle);
            let s = decode(&bytes).unwrap();
            assert_eq!(s.generation, 42);
            assert_eq!(s.key, "a/b ✓");
            assert_eq!(s.record, br#"{"meta":{}}"#);
            assert_eq!(s.pickle.as_deref(), pickle);
        }
    }

    #[test]
    fn every_truncation_and_bit_flip_is_detected() {
        let bytes = encode(7, "k", br#"{"meta":{"x":1}}"#, Some(b"pickle"));
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(decode(&b).is_err(), "bit {bit} of byte {i}");
            }
        }
    }

    #[test]
    fn huge_lengths_are_refused_before_any_allocation() {
        let mut bytes = encode(1, "k", b"{}", None);
        bytes[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        bytes[24] = 1;
        assert!(decode(&bytes).unwrap_err().contains("need more than 2^64"));
    }

    #[test]
    fn names() {
        assert_eq!(relpath(0x1234), "records/34/0000000000001234.rec");
        assert_eq!(parse_name("0000000000001234.rec"), Some(0x1234));
        assert_eq!(parse_name("000000000000123.rec"), None);
        assert_eq!(parse_name("000000000000123G.rec"), None);
        assert_eq!(parse_name("0000000000001234.rec.tmp"), None);
    }
}
