//! `.lvz` archives: records and their payloads in one zip file (see
//! FORMAT.md, "Archives (.lvz)").
//!
//! An archive is a zip file (PKWARE's APPNOTE.TXT, with zip64 fields for
//! members of 4 GiB and more) of uncompressed (`Stored`) members:
//!
//! - `lazyvault/manifest.json`: `{"format": "lazyvault", "format_version":
//!   "1.0", "kind": "archive", "created_by": ..., "records": n}`;
//! - `arrays/<id>.npy`: one standard `.npy` file per payload, named by its
//!   payload id only (never by a user key), whose data start 64-byte
//!   aligned within the archive;
//! - `lazyvault/records.jsonl`: one JSON line per record, `{"key": ...,
//!   "record": {...}, "pickle": "<base64>"}` (`pickle` only when the record
//!   has a pickled remainder).
//!
//! Reading maps the whole file once ([`Archive::open`]) or works over bytes
//! the caller keeps alive ([`ArchiveIndex::parse`]); every array is a byte
//! range of that mapping, checked against its record before use. Writing
//! goes to a temporary file, is fsynced and renamed into place
//! ([`write_archive_file`]), or into memory ([`write_archive_bytes`]), and
//! every member's offsets are verified after writing.
//!
//! - `writer.rs`: [`ArchiveWriter`] and the `write_archive_*` functions;
//! - `sink.rs`: where a writer's bytes go (a file, a counter, a buffer);
//! - `index.rs`: [`ArchiveIndex`], parsing and checking an archive's bytes;
//! - `reader.rs`: [`Archive`], a memory-mapped archive file.

mod arrow;
mod index;
mod reader;
mod sink;
mod writer;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::error::Error;

pub use index::{ArchiveIndex, ArchiveRecord};
pub use reader::Archive;
pub use sink::{ArchiveFile, MemorySink};
pub use writer::{
    archive_size, export_store, write_archive_bytes, write_archive_file, write_archive_into,
    ArchiveWriter,
};

/// Member holding the archive's manifest (a pretty-printed JSON object,
/// see the module docs); written last, after the records.
pub const MANIFEST_MEMBER: &str = "lazyvault/manifest.json";
/// Member holding the records, one JSON object per line (JSON Lines,
/// UTF-8, each line ending in `\n`).
pub const RECORDS_MEMBER: &str = "lazyvault/records.jsonl";
/// Directory (inside the zip) of the payload members: each is
/// `arrays/<id>.npy`, `<id>` being 32 lowercase hex digits.
pub const ARRAYS_PREFIX: &str = "arrays/";
/// Value of the manifest's `kind` field for an archive.
pub(crate) const ARCHIVE_KIND: &str = "archive";
/// The first four bytes of every `.lvz` file (a zip local file header).
pub(crate) const ZIP_MAGIC: &[u8; 4] = b"PK\x03\x04";

/// Smallest possible zip file: an end of central directory record.
const MIN_ZIP_LEN: u64 = 22;

fn corrupt(what: &str, detail: impl ToString) -> Error {
    Error::corrupt(what.to_owned(), detail)
}

/// The error for a file of `len` bytes, too short to be a zip file.
fn too_short(what: &str, len: u64) -> Error {
    corrupt(
        what,
        format!("not a .lvz archive: {len} bytes is too short for a zip file"),
    )
}

/// The archive manifest (`lazyvault/manifest.json`).
#[derive(Debug, Serialize, Deserialize)]
struct ArchiveManifest {
    format: String,
    format_version: String,
    kind: String,
    created_by: String,
    #[serde(default)]
    records: u64,
}

/// base64 of the pickled remainders in `records.jsonl`: the standard
/// alphabet, `=` padding written and required. Bits after the last byte in
/// the final symbol are ignored when decoding, as lazyvault always did.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(DecodePaddingMode::RequireCanonical)
        .with_decode_allow_trailing_bits(true),
);

/// Standard base64 with `=` padding.
pub(crate) fn base64_encode(data: &[u8]) -> String {
    BASE64.encode(data)
}

/// Strict decoding of [`base64_encode`]'s output (padding required, no
/// whitespace, no other alphabet); `None` for anything else.
pub(crate) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    BASE64.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// lazyvault's own base64 encoder before it used the `base64` crate.
    fn old_encode(data: &[u8]) -> String {
        const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in data.chunks(3) {
            let b = [
                chunk[0],
                chunk.get(1).copied().unwrap_or(0),
                chunk.get(2).copied().unwrap_or(0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    /// lazyvault's own base64 decoder before it used the `base64` crate.
    fn old_decode(text: &str) -> Option<Vec<u8>> {
        let bytes = text.as_bytes();
        if !bytes.len().is_multiple_of(4) {
            return None;
        }
        let value = |c: u8| -> Option<u32> {
            Some(match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                _ => return None,
            } as u32)
        };
        let mut out = Vec::new();
        let chunks = bytes.len() / 4;
        for (i, chunk) in bytes.chunks(4).enumerate() {
            let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
            if pad > 2 || (pad > 0 && i + 1 != chunks) {
                return None;
            }
            let mut n = 0u32;
            for &c in &chunk[..4 - pad] {
                n = (n << 6) | value(c)?;
            }
            n <<= 6 * pad as u32;
            let got = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            out.extend_from_slice(&got[..3 - pad]);
        }
        Some(out)
    }

    #[test]
    fn base64_round_trips_and_rejects_garbage() {
        for n in 0..40 {
            let data: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            let text = base64_encode(&data);
            assert_eq!(base64_decode(&text).unwrap(), data, "{n}");
        }
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"f"), "Zg==");
        for bad in ["Zm8", "Zm=8", "Z===", "Zm8=Zm8=", "Zm9v!mFy"] {
            assert!(base64_decode(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_base64_crate_writes_what_lazyvault_wrote() {
        // Every tail length (0, 1 and 2 bytes after whole 3-byte groups),
        // every byte value in each position of a short input.
        let mut inputs: Vec<Vec<u8>> = vec![vec![], b"\x00".to_vec(), b"\xff\xfe".to_vec()];
        inputs.extend((0..=255u8).flat_map(|b| [vec![b], vec![b, !b], vec![7, b, 200, b]]));
        inputs.push((0..=255u8).cycle().take(3 * 1000 + 2).collect());
        inputs.push(b"\x80\x05\x95\x0b\x00\x00\x00\x00\x00\x00\x00}\x94.".to_vec());
        for data in &inputs {
            let text = base64_encode(data);
            assert_eq!(text, old_encode(data), "{data:?}");
            assert_eq!(base64_decode(&text).as_deref(), Some(&data[..]));
        }
    }

    #[test]
    fn the_base64_crate_refuses_what_lazyvault_refused() {
        // Every string of up to 5 symbols over an alphabet with padding,
        // characters outside the alphabet and symbols whose low bits are
        // set ('B', '/', '9'): the same answer, accepted or refused.
        const SYMBOLS: &[u8] = b"AB/9=-_ \n";
        let mut texts = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..5 {
            last = last
                .iter()
                .flat_map(|t| SYMBOLS.iter().map(move |&c| format!("{t}{}", c as char)))
                .collect();
            texts.extend(last.iter().cloned());
        }
        for extra in [
            "Zm9vYmFy",
            "Zm9vYmE=",
            "Zm9vYg==",
            "Zm9vYmF=",
            "Zm9vYh==",
            "Zm9v====",
            "Zm9=Ymxh",
            "Zm9vYmFy\n",
            "Zm9v YmFy",
            "Zm9vYmFyAA",
            "Zm9v\u{e9}mFy",
        ] {
            texts.push(extra.to_owned());
        }
        let mut refused = 0;
        for text in &texts {
            assert_eq!(base64_decode(text), old_decode(text), "{text:?}");
            refused += usize::from(old_decode(text).is_none());
        }
        assert!(refused > texts.len() / 2, "{refused} of {}", texts.len());
    }
}
