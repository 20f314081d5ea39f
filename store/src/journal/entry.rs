//! One journal entry: its encoding (header, key, record JSON, pickled
//! remainder, CRC-32) and its checked decoding (FORMAT.md, "Record
//! journal").

use crate::error::{Error, Result};

/// The first 8 bytes of every entry.
pub(super) const ENTRY_MAGIC: &[u8; 8] = b"LVREC\0\x01\n";
/// Length of an entry's fixed header.
const HEADER_LEN: usize = 40;
/// Length of the CRC-32 that ends an entry.
pub(super) const CRC_LEN: usize = 4;
/// Flag: a pickled remainder follows the record JSON.
const FLAG_PICKLE: u32 = 1;
/// Flag: a delete (no record).
pub(super) const FLAG_DELETE: u32 = 2;
/// Flag: a commit (no key, no record).
pub(super) const FLAG_COMMIT: u32 = 4;

/// What one journal entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `key` was set to this record JSON (byte for byte as the index holds
    /// it) and pickled remainder.
    Put {
        /// The record JSON (FORMAT.md, "Record").
        record: Vec<u8>,
        /// The pickled remainder, when the record has one.
        pickle: Option<Vec<u8>>,
    },
    /// `key` was deleted.
    Delete,
    /// `flush()` made everything before this point durable (the key is
    /// empty): changes before a commit were acknowledged to the caller.
    Commit,
}

/// One decoded entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The record's key (empty for a commit).
    pub key: String,
    /// What happened to it.
    pub change: Change,
}

fn too_large(what: &str) -> Error {
    Error::too_large(format!("{what} longer than 4 GiB"))
}

/// The 40-byte header of an entry; `kind` is 0 for a put, else the
/// delete or commit flag.
///
/// # Errors
/// [`UsageError::TooLarge`](crate::UsageError::TooLarge) for a key or record JSON of 4 GiB or more.
pub(super) fn entry_header(
    key: &str,
    record: &[u8],
    pickle: Option<&[u8]>,
    kind: u32,
) -> Result<[u8; HEADER_LEN]> {
    let key_len = u32::try_from(key.len()).map_err(|_| too_large("a key"))?;
    let record_len = u32::try_from(record.len()).map_err(|_| too_large("record metadata"))?;
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(ENTRY_MAGIC);
    h[16..20].copy_from_slice(&key_len.to_le_bytes());
    h[20..24].copy_from_slice(&record_len.to_le_bytes());
    let flags = if pickle.is_some() { FLAG_PICKLE } else { 0 } | kind;
    h[24..28].copy_from_slice(&flags.to_le_bytes());
    h[32..40].copy_from_slice(&(pickle.map_or(0, <[u8]>::len) as u64).to_le_bytes());
    Ok(h)
}

/// Appends one entry made of `parts` (header, key, record, pickle) and its
/// CRC-32 to `buf`.
pub(super) fn encode_into(buf: &mut Vec<u8>, parts: &[&[u8]]) {
    let mut crc = crc32fast::Hasher::new();
    buf.reserve(parts.iter().map(|p| p.len()).sum::<usize>() + CRC_LEN);
    for part in parts {
        crc.update(part);
        buf.extend_from_slice(part);
    }
    buf.extend_from_slice(&crc.finalize().to_le_bytes());
}

/// Encodes a whole entry into memory (tests, fuzzing, recovery's commit).
///
/// # Panics
/// For a key or record JSON of 4 GiB or more.
pub fn encode(entry: &Entry) -> Vec<u8> {
    let (record, pickle, kind) = match &entry.change {
        Change::Put { record, pickle } => (&record[..], pickle.as_deref(), 0),
        Change::Delete => (&[][..], None, FLAG_DELETE),
        Change::Commit => (&[][..], None, FLAG_COMMIT),
    };
    let header = entry_header(&entry.key, record, pickle, kind).expect("small inputs");
    let mut out = Vec::new();
    encode_into(
        &mut out,
        &[
            &header,
            entry.key.as_bytes(),
            record,
            pickle.unwrap_or_default(),
        ],
    );
    out
}

/// The lengths and flags of the entry header at the start of `bytes`.
struct Header {
    key_len: u64,
    record_len: u64,
    pickle_len: u64,
    flags: u32,
}

/// Reads and checks the fixed header: magic, reserved fields, flags and
/// their combinations (not the lengths against the buffer).
fn decode_header(bytes: &[u8]) -> std::result::Result<Header, String> {
    if bytes.len() < HEADER_LEN + CRC_LEN {
        return Err(format!(
            "{} bytes, shorter than an entry header",
            bytes.len()
        ));
    }
    if &bytes[0..8] != ENTRY_MAGIC {
        return Err("not a journal entry (bad magic)".into());
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let h = Header {
        key_len: u64::from(u32_at(16)),
        record_len: u64::from(u32_at(20)),
        flags: u32_at(24),
        pickle_len: u64::from_le_bytes(bytes[32..40].try_into().expect("8 bytes")),
    };
    let flags = h.flags;
    if flags & !(FLAG_PICKLE | FLAG_DELETE | FLAG_COMMIT) != 0
        || u32_at(28) != 0
        || bytes[8..16] != [0; 8]
    {
        return Err(format!(
            "unknown flags {flags:#x} (written by a newer lazyvault?)"
        ));
    }
    if flags & FLAG_PICKLE == 0 && h.pickle_len != 0 {
        return Err("pickle length without the pickle flag".into());
    }
    if flags & FLAG_DELETE != 0 && (h.record_len != 0 || flags & FLAG_PICKLE != 0) {
        return Err("a delete carries a record".into());
    }
    if flags & FLAG_COMMIT != 0 && (flags != FLAG_COMMIT || h.record_len != 0 || h.key_len != 0) {
        return Err("a commit carries a key or a record".into());
    }
    Ok(h)
}

/// Decodes the entry at the start of `bytes`; returns it and its length.
/// Every length is checked against the buffer before use and the CRC before
/// anything is returned, so a torn or damaged entry is an error, never a
/// panic or an allocation from an unchecked size.
///
/// # Errors
/// Why the bytes are not a whole, intact entry.
pub fn decode(bytes: &[u8]) -> std::result::Result<(Entry, usize), String> {
    let h = decode_header(bytes)?;
    let total = (HEADER_LEN as u64 + CRC_LEN as u64)
        .checked_add(h.key_len)
        .and_then(|n| n.checked_add(h.record_len))
        .and_then(|n| n.checked_add(h.pickle_len))
        .filter(|&n| n <= bytes.len() as u64)
        .ok_or_else(|| format!("{} bytes left, the entry's lengths need more", bytes.len()))?;
    // Checked against the buffer above: these casts and slices hold.
    let total = total as usize;
    let body_end = total - CRC_LEN;
    let stored_crc = u32::from_le_bytes(bytes[body_end..total].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..body_end]) != stored_crc {
        return Err("CRC-32 mismatch: the entry is damaged or torn".into());
    }
    let key_end = HEADER_LEN + h.key_len as usize;
    let record_end = key_end + h.record_len as usize;
    let key = std::str::from_utf8(&bytes[HEADER_LEN..key_end])
        .map_err(|_| "the key is not UTF-8".to_owned())?;
    if key.is_empty() && h.flags != FLAG_COMMIT {
        return Err("empty key".into());
    }
    let change = if h.flags & FLAG_COMMIT != 0 {
        Change::Commit
    } else if h.flags & FLAG_DELETE != 0 {
        Change::Delete
    } else {
        Change::Put {
            record: bytes[key_end..record_end].to_vec(),
            pickle: (h.flags & FLAG_PICKLE != 0).then(|| bytes[record_end..body_end].to_vec()),
        }
    };
    let entry = Entry {
        key: key.to_owned(),
        change,
    };
    Ok((entry, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, record: &[u8], pickle: Option<&[u8]>) -> Entry {
        Entry {
            key: key.into(),
            change: Change::Put {
                record: record.to_vec(),
                pickle: pickle.map(<[u8]>::to_vec),
            },
        }
    }

    #[test]
    fn round_trips() {
        for entry in [
            put("a/b ✓", br#"{"meta":{}}"#, None),
            put("k", b"{}", Some(b"\x80\x05N.")),
            put("k", b"{}", Some(b"")),
            Entry {
                key: "gone".into(),
                change: Change::Delete,
            },
            Entry {
                key: String::new(),
                change: Change::Commit,
            },
        ] {
            let mut bytes = encode(&entry);
            let n = bytes.len();
            bytes.extend_from_slice(b"next entry...");
            assert_eq!(decode(&bytes).unwrap(), (entry, n));
        }
    }

    #[test]
    fn every_truncation_and_bit_flip_is_detected() {
        let bytes = encode(&put("k", br#"{"meta":{"x":1}}"#, Some(b"pickle")));
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
        let mut bytes = encode(&put("k", b"{}", None));
        bytes[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        bytes[24] = 1;
        assert!(decode(&bytes).unwrap_err().contains("need more"));
    }
}
