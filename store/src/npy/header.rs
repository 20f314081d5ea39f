//! Reading an `.npy` header: the prefix (magic `\x93NUMPY`, version 1.0, 2.0
//! or 3.0, header length) and the header dict with its three keys.
//!
//! The byte layout is in schema/FORMAT.md ("Byte layout (standard `.npy`)").
//! The header length is checked against the caller's limit before anything
//! is sliced, read or allocated from it.

use std::io::Read;

use super::descr::checked_render;
use super::literal::{snippet, Entry, Lit, Parser};
use super::{shape_product, NpyError, NpyHeader};

/// The magic string at the start of every `.npy` file.
pub(super) const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Length of magic + version.
const MAGIC_AND_VERSION_LEN: usize = 8;

/// Length of the longest prefix: magic, version and a u32 header length.
const MAX_PREFIX_LEN: usize = 12;

/// Initial buffer for reading a header from a reader: the buffer then grows
/// only as bytes actually arrive.
const READ_CHUNK: usize = 4096;

/// Parses a header from the start of `bytes` (which may contain data after the header).
///
/// `max_header_len` has the meaning of numpy's `max_header_size`
/// (`np.load`, numpy/lib/format.py): the longest header text accepted, in
/// bytes after the 10- or 12-byte prefix, padding and the final `'\n'`
/// included, the limit itself allowed. Pass [`NUMPY_MAX_HEADER_LEN`]
/// (10,000, numpy's default) to accept exactly what a plain `np.load` accepts
/// (numpy counts decoded characters, so for a 3.0 header with non-ASCII text
/// this is slightly stricter); `usize::MAX` for no limit. The declared length
/// is checked before anything is sliced or allocated from it.
///
/// Only versions 1.0, 2.0 and 3.0 are accepted. The data offset is not
/// required to be aligned (numpy before 1.14 used 16).
///
/// Errors: [`NpyError::BadMagic`], [`NpyError::UnsupportedVersion`],
/// [`NpyError::HeaderTooLong`] (declared length over `max_header_len`),
/// [`NpyError::Truncated`] (`bytes` shorter than the header it announces),
/// [`NpyError::HeaderEncoding`] and the errors of a bad header dict
/// ([`NpyError::Malformed`], `*Key`, `Bad*`, shape errors).
///
/// [`NUMPY_MAX_HEADER_LEN`]: super::NUMPY_MAX_HEADER_LEN
pub fn parse_header(bytes: &[u8], max_header_len: usize) -> Result<NpyHeader, NpyError> {
    let prefix = Prefix::parse(bytes, max_header_len)?;
    let end = prefix.data_offset(max_header_len)?;
    let text = bytes.get(prefix.len..end).ok_or(NpyError::Truncated {
        need: end as u64,
        have: bytes.len() as u64,
    })?;
    parse_header_text(prefix.version, text, prefix.len)
}

/// Reads just the header from a reader: the 8-byte magic and version first,
/// then the 2- or 4-byte length, which is checked against `max_header_len`
/// before any buffer is sized from it, then exactly that many bytes.
///
/// `max_header_len` and the errors are those of [`parse_header`], plus
/// [`NpyError::Io`]; on the same bytes both give the same result. On success
/// the reader is positioned at the start of the data.
pub fn read_header<R: Read>(r: &mut R, max_header_len: usize) -> Result<NpyHeader, NpyError> {
    let mut buf = [0u8; MAX_PREFIX_LEN];
    let got = read_full(r, &mut buf[..MAGIC_AND_VERSION_LEN])?;
    let version = check_magic_and_version(&buf[..got])?;
    let got = got + read_full(r, &mut buf[MAGIC_AND_VERSION_LEN..prefix_len(version)])?;
    let prefix = Prefix::parse(&buf[..got], max_header_len)?;
    let end = prefix.data_offset(max_header_len)?;
    let mut text = Vec::with_capacity(prefix.header_len.min(READ_CHUNK));
    r.by_ref()
        .take(prefix.header_len as u64)
        .read_to_end(&mut text)?;
    if text.len() < prefix.header_len {
        return Err(NpyError::Truncated {
            need: end as u64,
            have: (prefix.len + text.len()) as u64,
        });
    }
    parse_header_text(prefix.version, &text, prefix.len)
}

/// Length of magic + version + header-length field for a (supported) version:
/// 10 for 1.0 (u16 length), 12 for 2.0 and 3.0 (u32 length).
pub(super) fn prefix_len(version: (u8, u8)) -> usize {
    if version.0 == 1 {
        10
    } else {
        MAX_PREFIX_LEN
    }
}

/// Appends the prefix of a header: magic, `version` and `header_len` as a
/// little-endian u16 (1.0) or u32 (2.0, 3.0). Fails when `header_len` does
/// not fit that field.
pub(super) fn write_prefix(
    out: &mut Vec<u8>,
    version: (u8, u8),
    header_len: usize,
) -> Result<(), std::num::TryFromIntError> {
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version.0, version.1]);
    if version.0 == 1 {
        out.extend_from_slice(&u16::try_from(header_len)?.to_le_bytes());
    } else {
        out.extend_from_slice(&u32::try_from(header_len)?.to_le_bytes());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Prefix

/// The prefix of a header, checked.
struct Prefix {
    version: (u8, u8),
    /// Length of the prefix itself: where the header text starts.
    len: usize,
    /// Declared length of the header text, at most the limit.
    header_len: usize,
}

impl Prefix {
    /// Checks magic, version and the declared header length (against
    /// `max_header_len`) at the start of `bytes`.
    fn parse(bytes: &[u8], max_header_len: usize) -> Result<Prefix, NpyError> {
        let version = check_magic_and_version(bytes)?;
        let len = prefix_len(version);
        let field = bytes
            .get(MAGIC_AND_VERSION_LEN..len)
            .ok_or(NpyError::Truncated {
                need: len as u64,
                have: bytes.len() as u64,
            })?;
        let declared = match *field {
            [a, b, c, d] => u64::from(u32::from_le_bytes([a, b, c, d])),
            [a, b] => u64::from(u16::from_le_bytes([a, b])),
            _ => 0,
        };
        let header_len = match usize::try_from(declared) {
            Ok(n) if n <= max_header_len => n,
            _ => {
                return Err(NpyError::HeaderTooLong {
                    len: declared,
                    limit: max_header_len,
                })
            }
        };
        Ok(Prefix {
            version,
            len,
            header_len,
        })
    }

    /// Where the data starts: prefix + header text (an error only where the
    /// sum overflows a usize, i.e. with no limit on a 32-bit target).
    fn data_offset(&self, max_header_len: usize) -> Result<usize, NpyError> {
        self.len
            .checked_add(self.header_len)
            .ok_or(NpyError::HeaderTooLong {
                len: self.header_len as u64,
                limit: max_header_len,
            })
    }
}

/// Checks magic and version from the first (up to) 8 bytes of `bytes`:
/// versions 1.0, 2.0 and 3.0 only (numpy defines no other; a 1.1 is refused).
fn check_magic_and_version(bytes: &[u8]) -> Result<(u8, u8), NpyError> {
    let n = bytes.len().min(MAGIC.len());
    if bytes.get(..n) != MAGIC.get(..n) {
        return Err(NpyError::BadMagic);
    }
    match bytes {
        [_, _, _, _, _, _, major, minor, ..] => match (*major, *minor) {
            v @ ((1, 0) | (2, 0) | (3, 0)) => Ok(v),
            (major, minor) => Err(NpyError::UnsupportedVersion { major, minor }),
        },
        _ => Err(NpyError::Truncated {
            need: MAGIC_AND_VERSION_LEN as u64,
            have: bytes.len() as u64,
        }),
    }
}

/// Reads until `buf` is full or the reader is exhausted; returns the count.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<usize, NpyError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n.min(buf.len() - got),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

// ---------------------------------------------------------------------------
// Header dict

/// Decodes and parses the header text; `base` is its offset in the file.
fn parse_header_text(version: (u8, u8), text: &[u8], base: usize) -> Result<NpyHeader, NpyError> {
    let mut parser = if version.0 >= 3 {
        let s = std::str::from_utf8(text).map_err(|e| NpyError::HeaderEncoding {
            encoding: "UTF-8",
            offset: (base + e.valid_up_to()) as u64,
        })?;
        Parser::utf8(s, base as u64)
    } else {
        Parser::latin1(text, base as u64)
    };
    let (descr, fortran_order, shape) = header_dict(&mut parser)?;
    Ok(NpyHeader {
        version,
        descr,
        fortran_order,
        shape,
        data_offset: (base + text.len()) as u64,
    })
}

/// The header dict: exactly the keys descr, fortran_order and shape, in any
/// order, then only whitespace (the padding).
fn header_dict(p: &mut Parser<'_>) -> Result<(String, bool, Vec<u64>), NpyError> {
    p.skip_ws();
    if p.peek() != Some(b'{') {
        return Err(p.expected("'{' (the header must be a dict)"));
    }
    let mut descr = None;
    let mut fortran_order = None;
    let mut shape = None;
    p.dict(|entry: Entry| {
        let bad_key = || NpyError::UnexpectedKey {
            key: snippet(&entry.key),
            offset: entry.key_offset,
        };
        let Lit::Str(k) = &entry.key else {
            return Err(bad_key());
        };
        match k.as_str() {
            "descr" => {
                let d = checked_render(&entry.value).map_err(|reason| NpyError::BadDescr {
                    offset: entry.value_offset,
                    reason,
                })?;
                set_once(&mut descr, "descr", entry.key_offset, d)
            }
            "fortran_order" => match &entry.value {
                Lit::Bool(b) => set_once(&mut fortran_order, "fortran_order", entry.key_offset, *b),
                other => Err(NpyError::BadFortranOrder {
                    value: snippet(other),
                    offset: entry.value_offset,
                }),
            },
            "shape" => {
                let s = convert_shape(&entry.value, entry.value_offset)?;
                set_once(&mut shape, "shape", entry.key_offset, s)
            }
            _ => Err(bad_key()),
        }
    })?;
    p.finish("only padding after the header dict")?;
    let missing = |key| NpyError::MissingKey { key };
    Ok((
        descr.ok_or(missing("descr"))?,
        fortran_order.ok_or(missing("fortran_order"))?,
        shape.ok_or(missing("shape"))?,
    ))
}

/// Fills `slot` with the value of `key` (at `offset`) unless it already has one.
fn set_once<T>(
    slot: &mut Option<T>,
    key: &'static str,
    offset: u64,
    value: T,
) -> Result<(), NpyError> {
    if slot.is_some() {
        return Err(NpyError::DuplicateKey { key, offset });
    }
    *slot = Some(value);
    Ok(())
}

/// The shape value (at `offset`): a tuple (or list) of non-negative integers
/// whose product fits a u64.
fn convert_shape(value: &Lit, offset: u64) -> Result<Vec<u64>, NpyError> {
    let bad_shape = || NpyError::BadShape {
        value: snippet(value),
        offset,
    };
    let (Lit::Tuple(items) | Lit::List(items)) = value else {
        return Err(bad_shape());
    };
    let mut shape = Vec::with_capacity(items.len());
    for (axis, item) in items.iter().enumerate() {
        match item {
            Lit::Int {
                negative,
                magnitude,
            } => {
                if *negative && *magnitude != Some(0) {
                    return Err(NpyError::NegativeShape { axis });
                }
                shape.push(magnitude.ok_or(NpyError::ShapeOverflow)?);
            }
            _ => return Err(bad_shape()),
        }
    }
    if shape_product(&shape).is_none() {
        return Err(NpyError::ShapeOverflow);
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{
        assert_err, good_header, largest_alloc_during, parse, parse_text, raw_header,
    };
    use super::super::NUMPY_MAX_HEADER_LEN;
    use super::*;

    // -- Headers from other eras and writers

    #[test]
    fn parses_python2_long_suffix_and_16_byte_alignment() {
        let mut file = raw_header(
            (1, 0),
            b"{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 3l), }",
            16,
        );
        let offset = file.len() as u64;
        assert_ne!(offset % 64, 0);
        file.extend_from_slice(&[0u8; 48]);
        let h = parse(&file).unwrap();
        assert_eq!(h.shape, vec![2, 3]);
        assert_eq!(h.data_offset, offset);
        assert_eq!(h.nbytes(), Some(48));
    }

    #[test]
    fn parses_version_2_header() {
        let file = raw_header(
            (2, 0),
            b"{'descr': '>i2', 'fortran_order': True, 'shape': (7, 0, 2), }",
            64,
        );
        let h = parse(&file).unwrap();
        assert_eq!(h.version, (2, 0));
        assert_eq!(h.descr, "'>i2'");
        assert!(h.fortran_order);
        assert_eq!(h.shape, vec![7, 0, 2]);
        assert_eq!(h.data_offset, file.len() as u64);
        assert!(h.is_empty());
        assert_eq!(h.nbytes(), Some(0));
    }

    #[test]
    fn parses_version_3_with_non_latin1_field_name() {
        let text = "{'descr': [('\u{3b1}', '<f4'), ('\u{65e5}\u{672c}', '|u1', (3,))], 'fortran_order': False, 'shape': (2,), }";
        let h = parse(&raw_header((3, 0), text.as_bytes(), 64)).unwrap();
        assert_eq!(h.version, (3, 0));
        assert_eq!(
            h.descr,
            "[('\u{3b1}', '<f4'), ('\u{65e5}\u{672c}', '|u1', (3,))]"
        );
        assert_eq!(h.nbytes(), Some(14));
    }

    #[test]
    fn version_1_is_latin1_not_utf8() {
        let mut text = b"{'descr': [('caf".to_vec();
        text.push(0xe9);
        text.extend_from_slice(b"', '<f4')], 'fortran_order': False, 'shape': (2,), }");
        let h = parse(&raw_header((1, 0), &text, 64)).unwrap();
        assert_eq!(h.descr, "[('caf\u{e9}', '<f4')]");
        // UTF-8 bytes in a latin-1 header are two latin-1 characters.
        let text = "{'descr': [('caf\u{e9}', '<f4')], 'fortran_order': False, 'shape': (2,), }";
        let h = parse(&raw_header((1, 0), text.as_bytes(), 64)).unwrap();
        assert_eq!(h.descr, "[('caf\u{c3}\u{a9}', '<f4')]");
        // And the written form of 'é' is the single latin-1 byte.
        let bytes = super::super::write_header("[('caf\u{e9}', '<f4')]", false, &[2]).unwrap();
        assert!(bytes.windows(5).any(|w| w == b"caf\xe9'"));
    }

    #[test]
    fn lenient_syntax_double_quotes_key_order_whitespace() {
        let text = " { \"shape\" :( 3 ,4 , ) ,\n\t\"fortran_order\":True,u\"descr\":\"<f8\" , } # comment\n";
        let h = parse_text(text).unwrap();
        assert_eq!(h.descr, "'<f8'");
        assert!(h.fortran_order);
        assert_eq!(h.shape, vec![3, 4]);

        // A list for the shape, no trailing comma, '+' sign, '_' separators.
        let h =
            parse_text("{'descr':'|u1','fortran_order':False,'shape':[1_000, +2, -0]}").unwrap();
        assert_eq!(h.shape, vec![1000, 2, 0]);

        // A parenthesised int is not a tuple.
        let h = parse_text("{'descr': '|u1', 'fortran_order': False, 'shape': ((5),), }").unwrap();
        assert_eq!(h.shape, vec![5]);
    }

    // -- Rejections

    #[test]
    fn rejects_bad_magic() {
        let mut bytes = good_header();
        bytes[0] = b'x';
        assert_err(parse(&bytes), |e| matches!(e, NpyError::BadMagic));
        assert_err(parse(b"NUMPY\x01\x00"), |e| matches!(e, NpyError::BadMagic));
        assert_err(parse(b"\x93NUMPZ\x01\x00v\x00"), |e| {
            matches!(e, NpyError::BadMagic)
        });
        assert_err(parse(b"PK\x03\x04"), |e| matches!(e, NpyError::BadMagic));
        let e = assert_err(parse(b""), |e| {
            matches!(e, NpyError::Truncated { need: 8, have: 0 })
        });
        assert_eq!(e.to_string(), "truncated .npy header: need 8 bytes, have 0");
    }

    #[test]
    fn rejects_unsupported_versions() {
        for (major, minor) in [(4, 0), (1, 1), (0, 0), (2, 1), (255, 255)] {
            let mut bytes = good_header();
            bytes[6] = major;
            bytes[7] = minor;
            let e = assert_err(
                parse(&bytes),
                |e| matches!(e, NpyError::UnsupportedVersion { major: a, minor: b } if (*a, *b) == (major, minor)),
            );
            assert!(e.to_string().contains(&format!("{major}.{minor}")));
            let e2 = read_header(&mut &bytes[..], NUMPY_MAX_HEADER_LEN).unwrap_err();
            assert_eq!(e.to_string(), e2.to_string());
        }
    }

    #[test]
    fn refuses_version_1_1() {
        // A well-formed 1.0 header but for the minor version byte.
        let mut bytes = good_header();
        bytes[7] = 1;
        assert!(bytes.starts_with(b"\x93NUMPY\x01\x01"));
        for limit in [NUMPY_MAX_HEADER_LEN, usize::MAX] {
            for result in [
                parse_header(&bytes, limit),
                read_header(&mut &bytes[..], limit),
                parse_header(&bytes[..8], limit),
            ] {
                let e = assert_err(result, |e| {
                    matches!(e, NpyError::UnsupportedVersion { major: 1, minor: 1 })
                });
                assert_eq!(
                    e.to_string(),
                    "unsupported .npy format version 1.1 (supported: 1.0, 2.0, 3.0)"
                );
            }
        }
    }

    #[test]
    fn refuses_every_version_but_1_0_2_0_3_0() {
        for major in 0..=u8::MAX {
            for minor in 0..=u8::MAX {
                let mut bytes = raw_header(
                    (major, minor),
                    b"{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
                    64,
                );
                bytes.extend_from_slice(&[0; 8]);
                let parsed = parse(&bytes);
                let read = read_header(&mut &bytes[..], NUMPY_MAX_HEADER_LEN);
                if matches!((major, minor), (1, 0) | (2, 0) | (3, 0)) {
                    assert_eq!(parsed.unwrap(), read.unwrap());
                } else {
                    for result in [parsed, read] {
                        assert_err(result, |e| {
                            matches!(e, NpyError::UnsupportedVersion { major: a, minor: b }
                                if (*a, *b) == (major, minor))
                        });
                    }
                }
            }
        }
    }

    #[test]
    fn rejects_header_over_limit_without_allocating() {
        // Version 2.0 declaring a 4 GiB header, with only a few bytes present.
        let bytes = b"\x93NUMPY\x02\x00\xff\xff\xff\xff{'descr'".to_vec();
        // parse_header and read_header, each with the largest allocation it made.
        let both = |limit: usize| {
            [
                largest_alloc_during(|| parse_header(&bytes, limit)),
                largest_alloc_during(|| read_header(&mut &bytes[..], limit)),
            ]
        };
        for (result, largest) in both(NUMPY_MAX_HEADER_LEN) {
            assert_err(result, |e| {
                matches!(
                    e,
                    NpyError::HeaderTooLong {
                        len: 0xffff_ffff,
                        limit: NUMPY_MAX_HEADER_LEN
                    }
                )
            });
            assert!(largest < 1 << 20, "allocated {largest} bytes");
        }
        // With no limit at all: a length error (truncated), not a 4 GiB buffer.
        for (result, largest) in both(usize::MAX) {
            assert_err(result, |e| {
                matches!(
                    e,
                    NpyError::Truncated {
                        need: 0x1_0000_000b,
                        have: 20
                    }
                )
            });
            assert!(largest < 1 << 20, "allocated {largest} bytes");
        }

        // The limit is inclusive and applies to the declared length.
        let header = good_header();
        let declared = header.len() - 10;
        assert!(parse_header(&header, declared).is_ok());
        assert_err(parse_header(&header, declared - 1), |e| {
            matches!(e, NpyError::HeaderTooLong { .. })
        });
    }

    #[test]
    fn default_limit_is_numpys_max_header_size() {
        // numpy's np.load reads a header text of exactly 10,000 bytes
        // (`len(header) > max_header_size` fails), not one of 10,001.
        let dict = b"{'descr': '<f8', 'fortran_order': False, 'shape': (), }";
        for (version, prefix) in [((1, 0), 10), ((2, 0), 12), ((3, 0), 12)] {
            for (header_len, ok) in [(10_000, true), (10_001, false)] {
                // Alignment 1: HEADER_LEN is exactly the text, padding and '\n'.
                let mut text = dict.to_vec();
                text.resize(header_len - 1, b' ');
                let bytes = raw_header(version, &text, 1);
                assert_eq!(bytes.len(), prefix + header_len);
                for result in [
                    parse_header(&bytes, NUMPY_MAX_HEADER_LEN),
                    read_header(&mut &bytes[..], NUMPY_MAX_HEADER_LEN),
                ] {
                    match result {
                        Ok(h) => assert!(ok && h.data_offset == bytes.len() as u64),
                        Err(e) => assert!(
                            !ok && matches!(
                                e,
                                NpyError::HeaderTooLong {
                                    len: 10_001,
                                    limit: 10_000
                                }
                            ),
                            "{e}"
                        ),
                    }
                }
            }
        }
    }

    #[test]
    fn rejects_missing_extra_and_duplicate_keys() {
        type Check = fn(&NpyError) -> bool;
        let cases: [(&str, Check); 7] = [
            ("{'descr': '<f8', 'fortran_order': False}", |e| {
                matches!(e, NpyError::MissingKey { key: "shape" })
            }),
            ("{'shape': (), 'fortran_order': False}", |e| {
                matches!(e, NpyError::MissingKey { key: "descr" })
            }),
            ("{'descr': '<f8', 'shape': ()}", |e| {
                matches!(
                    e,
                    NpyError::MissingKey {
                        key: "fortran_order"
                    }
                )
            }),
            ("{}", |e| matches!(e, NpyError::MissingKey { .. })),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (), 'extra': 1}",
                |e| matches!(e, NpyError::UnexpectedKey { key, .. } if key == "'extra'"),
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (), 'descr': '<f4'}",
                |e| matches!(e, NpyError::DuplicateKey { key: "descr", .. }),
            ),
            (
                "{'descr': '<f8', 1: False, 'shape': ()}",
                |e| matches!(e, NpyError::UnexpectedKey { key, .. } if key == "1"),
            ),
        ];
        for (text, check) in cases {
            assert_err(parse_text(text), check);
        }
    }

    #[test]
    fn errors_locate_keys_and_values() {
        // (header text, what the offset points at, the offset of the expected error).
        type Locate = fn(&NpyError) -> Option<u64>;
        let cases: [(&str, &str, Locate); 5] = [
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (), 'extra': 1}",
                "'extra'",
                |e| match e {
                    NpyError::UnexpectedKey { key, offset } if key == "'extra'" => Some(*offset),
                    _ => None,
                },
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (), 'descr': '<f4'}",
                "'descr'",
                |e| match e {
                    NpyError::DuplicateKey {
                        key: "descr",
                        offset,
                    } => Some(*offset),
                    _ => None,
                },
            ),
            (
                "{'descr': '<f8', 'fortran_order': 0, 'shape': ()}",
                "0",
                |e| match e {
                    NpyError::BadFortranOrder { value, offset } if value == "0" => Some(*offset),
                    _ => None,
                },
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 'a')}",
                "(1",
                |e| match e {
                    NpyError::BadShape { value, offset } if value == "(1, 'a')" => Some(*offset),
                    _ => None,
                },
            ),
            (
                "{'descr': ('<f8',), 'fortran_order': False, 'shape': ()}",
                "('<f8'",
                |e| match e {
                    NpyError::BadDescr { offset, .. } => Some(*offset),
                    _ => None,
                },
            ),
        ];
        for (text, needle, locate) in cases {
            let e = parse_text(text).unwrap_err();
            // From the start of the file: 10 bytes of prefix, then the text.
            let want = 10 + text.rfind(needle).unwrap() as u64;
            assert_eq!(locate(&e), Some(want), "{text}: {e}");
        }
        let e = parse_text(cases[0].0).unwrap_err();
        assert_eq!(
            e.to_string(),
            ".npy header dict has an unexpected key 'extra' at byte 64 \
             (allowed: 'descr', 'fortran_order', 'shape')"
        );
        let e = parse_text(cases[4].0).unwrap_err();
        assert!(
            e.to_string().starts_with("bad .npy descr at byte 20: "),
            "{e}"
        );
    }

    #[test]
    fn rejects_bad_values() {
        let with = |descr: &str, order: &str, shape: &str| {
            parse_text(&format!(
                "{{'descr': {descr}, 'fortran_order': {order}, 'shape': {shape}, }}"
            ))
        };
        type Check = fn(&NpyError) -> bool;
        let malformed: Check = |e| matches!(e, NpyError::Malformed { .. });
        let bad_shape: Check = |e| matches!(e, NpyError::BadShape { .. });
        let bad_descr: Check = |e| matches!(e, NpyError::BadDescr { .. });
        let overflow: Check = |e| matches!(e, NpyError::ShapeOverflow);
        let cases: [(&str, &str, &str, Check); 15] = [
            ("'<f8'", "False", "(3, -1)", |e| {
                matches!(e, NpyError::NegativeShape { axis: 1 })
            }),
            ("'<f8'", "False", "(-99999999999999999999,)", |e| {
                matches!(e, NpyError::NegativeShape { axis: 0 })
            }),
            ("'<f8'", "False", "(4294967296, 4294967296)", overflow),
            ("'<f8'", "False", "(18446744073709551616,)", overflow),
            // numpy refuses this too, although a dimension is 0.
            ("'<f8'", "False", "(9223372036854775808, 0, 2)", overflow),
            ("'<f8'", "False", "3", bad_shape),
            ("'<f8'", "False", "(True,)", bad_shape),
            ("'<f8'", "False", "(3.0,)", malformed),
            ("'<f8'", "False", "(03,)", malformed),
            ("'<f8'", "False", "(0x3,)", malformed),
            (
                "'<f8'",
                "1",
                "()",
                |e| matches!(e, NpyError::BadFortranOrder { value, .. } if value == "1"),
            ),
            ("'<f8'", "None", "()", malformed),
            ("'<f8'", "Falsey", "()", malformed),
            ("('<f8',)", "False", "()", bad_descr),
            ("[('a', '<f4', (-1,))]", "False", "()", bad_descr),
        ];
        for (descr, order, shape, check) in cases {
            assert_err(with(descr, order, shape), check);
        }
        // The largest dimension that fits is fine.
        assert_eq!(
            with("'<f8'", "False", "(18446744073709551615,)")
                .unwrap()
                .shape,
            vec![u64::MAX]
        );
    }

    #[test]
    fn rejects_malformed_text_with_position() {
        let e = assert_err(
            parse_text("{'descr': '<f8' 'fortran_order': False, 'shape': ()}"),
            |e| matches!(e, NpyError::Malformed { .. }),
        );
        // Adjacent strings concatenate, so the error is at the ':' (byte 10 + 31).
        assert!(matches!(e, NpyError::Malformed { offset: 41, .. }), "{e}");
        for text in [
            "['descr', '<f8']",
            "{'descr': '<f8', 'fortran_order': False, 'shape': ()} x",
            "{'descr': '<f8', 'fortran_order': False, 'shape': ()",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (,)}",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (1 2)}",
            "{'descr': '<f8, 'fortran_order': False, 'shape': ()}",
            "{'descr': '<f8', 'fortran_order': False,, 'shape': ()}",
            "{'descr': '<f\\N{DIGIT EIGHT}', 'fortran_order': False, 'shape': ()}",
            "{'descr': '<f\\x8', 'fortran_order': False, 'shape': ()}",
            "{'descr': '\\ud800', 'fortran_order': False, 'shape': ()}",
            "{'descr': 'a\nb', 'fortran_order': False, 'shape': ()}",
            "{'descr': b'<f8', 'fortran_order': False, 'shape': ()}",
            "{'descr': {'a': 1}, 'fortran_order': False, 'shape': ()}",
        ] {
            assert_err(parse_text(text), |e| {
                matches!(e, NpyError::Malformed { .. })
            });
        }
        // NUL padding (not spaces) after the dict.
        let mut bytes = good_header();
        let n = bytes.len();
        bytes[n - 5] = 0;
        let e = assert_err(parse(&bytes), |e| matches!(e, NpyError::Malformed { .. }));
        assert!(matches!(e, NpyError::Malformed { offset, .. } if offset == n as u64 - 5));
    }

    #[test]
    fn rejects_truncated_input_at_every_length() {
        let bytes = good_header();
        for cut in 0..bytes.len() {
            let e = assert_err(
                parse(&bytes[..cut]),
                |e| matches!(e, NpyError::Truncated { have, .. } if *have == cut as u64),
            );
            let need = match cut {
                0..8 => 8,
                8..10 => 10,
                _ => bytes.len() as u64,
            };
            assert!(
                matches!(e, NpyError::Truncated { need: n, .. } if n == need),
                "{e}"
            );
            let e2 = read_header(&mut &bytes[..cut], NUMPY_MAX_HEADER_LEN).unwrap_err();
            assert_eq!(e.to_string(), e2.to_string());
        }
        assert!(parse(&bytes).is_ok());
    }

    #[test]
    fn rejects_invalid_utf8_in_version_3() {
        let mut text = b"{'descr': [('a".to_vec();
        text.extend_from_slice(&[0xff, 0xfe]);
        text.extend_from_slice(b"', '<f4')], 'fortran_order': False, 'shape': (), }");
        let bytes = raw_header((3, 0), &text, 64);
        assert_err(parse(&bytes), |e| {
            matches!(
                e,
                NpyError::HeaderEncoding {
                    encoding: "UTF-8",
                    offset: 26
                }
            )
        });
        // The same bytes are fine as latin-1 in version 1.0.
        let bytes = raw_header((1, 0), &text, 64);
        assert_eq!(parse(&bytes).unwrap().descr, "[('a\u{ff}\u{fe}', '<f4')]");
    }

    // -- Reader

    #[test]
    fn read_header_stops_at_the_data() {
        let mut file = good_header();
        let offset = file.len();
        file.extend_from_slice(b"DATA");
        let mut reader = std::io::Cursor::new(&file);
        let h = read_header(&mut reader, NUMPY_MAX_HEADER_LEN).unwrap();
        assert_eq!(h, parse(&file).unwrap());
        assert_eq!(reader.position(), offset as u64);
        assert_eq!(h.data_offset, offset as u64);

        // A reader that hands out one byte at a time and is interrupted.
        struct Trickle<'a>(&'a [u8], bool);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                self.1 = !self.1;
                if self.1 {
                    return Err(std::io::ErrorKind::Interrupted.into());
                }
                match (self.0.split_first(), buf.first_mut()) {
                    (Some((b, rest)), Some(slot)) => {
                        *slot = *b;
                        self.0 = rest;
                        Ok(1)
                    }
                    _ => Ok(0),
                }
            }
        }
        let h2 = read_header(&mut Trickle(&file, false), NUMPY_MAX_HEADER_LEN).unwrap();
        assert_eq!(h, h2);

        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("disk on fire"))
            }
        }
        let e = read_header(&mut Failing, NUMPY_MAX_HEADER_LEN).unwrap_err();
        assert!(matches!(e, NpyError::Io(_)) && e.to_string().contains("disk on fire"));
    }
}
