//! Writing an `.npy` header byte for byte as numpy >= 1.14 writes it
//! (`np.save`, `_write_array_header`): the dict with its keys in order,
//! numpy's spare spaces for the growth axis, version 1.0/2.0/3.0 chosen as
//! numpy chooses it, and padding so that the data start is 64-byte aligned.
//! The rules are in schema/FORMAT.md ("Byte layout (standard `.npy`)").

use std::fmt::Write as _;

use super::descr::canonical_descr;
use super::header::{prefix_len, write_prefix};
use super::literal::render_seq;
use super::{shape_product, NpyError, ALIGNMENT, NUMPY_MAX_HEADER_LEN};

/// numpy's `GROWTH_AXIS_MAX_DIGITS`: numpy leaves room for the growth axis
/// (first axis, last in Fortran order) to be rewritten with up to this many digits.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;

/// Builds a complete header (magic, version, length, dict, padding, `'\n'`)
/// whose total length is a multiple of [`ALIGNMENT`] (64 bytes), byte for
/// byte as numpy writes it.
///
/// `descr` is Python-literal text as produced by
/// `repr(numpy.lib.format.dtype_to_descr(dtype))`; it is validated and
/// re-rendered canonically. `fortran_order` says whether the data will be in
/// Fortran (column-major) rather than C (row-major) order; `shape` is the
/// array shape (empty for a 0-d array).
///
/// Version 1.0 when the text is latin-1 and its length fits a u16, 2.0 when it
/// is latin-1 but longer, 3.0 (UTF-8) when the descr contains characters
/// outside latin-1.
///
/// Errors: [`NpyError::BadDescr`] for descr text that does not parse or is
/// not a descr; [`NpyError::ShapeOverflow`] when the number of elements
/// overflows a u64; [`NpyError::HeaderTooLong`] when the header text would
/// be longer than [`NUMPY_MAX_HEADER_LEN`] bytes (numpy's default
/// `max_header_size`), so that a plain `np.load` always reads the result.
pub fn write_header(descr: &str, fortran_order: bool, shape: &[u64]) -> Result<Vec<u8>, NpyError> {
    build_header(descr, fortran_order, shape, NUMPY_MAX_HEADER_LEN)
}

/// [`write_header`] with another limit on the header text, in bytes:
/// [`FORMAT_MAX_HEADER_LEN`](super::FORMAT_MAX_HEADER_LEN) writes what
/// `np.save` writes for any dtype (version 2.0 past 65,535 bytes), which
/// `np.load` reads only with a `max_header_size` as large.
///
/// Errors: those of [`write_header`], [`NpyError::HeaderTooLong`] against
/// `max_header_len`.
pub fn write_header_with_limit(
    descr: &str,
    fortran_order: bool,
    shape: &[u64],
    max_header_len: usize,
) -> Result<Vec<u8>, NpyError> {
    build_header(descr, fortran_order, shape, max_header_len)
}

/// [`write_header`] with any limit on the header text, in bytes.
pub(super) fn build_header(
    descr: &str,
    fortran_order: bool,
    shape: &[u64],
    max_header_len: usize,
) -> Result<Vec<u8>, NpyError> {
    let descr = canonical_descr(descr)?;
    if shape_product(shape).is_none() {
        return Err(NpyError::ShapeOverflow);
    }
    let dict = header_dict(&descr, fortran_order, shape);

    // Same version choice and padding as numpy's `_wrap_header_guess_version`.
    let latin1 = dict.chars().all(|c| u32::from(c) <= 0xff);
    let encoded_len = if latin1 {
        dict.chars().count()
    } else {
        dict.len()
    };
    let text_len = encoded_len + 1; // the final '\n'
    let padded = |prefix: usize| text_len + (ALIGNMENT - (prefix + text_len) % ALIGNMENT);
    let version = if !latin1 {
        (3, 0)
    } else if padded(prefix_len((1, 0))) <= usize::from(u16::MAX) {
        (1, 0)
    } else {
        (2, 0)
    };
    let prefix_len = prefix_len(version);
    let header_len = padded(prefix_len);
    let too_long = || NpyError::HeaderTooLong {
        len: header_len as u64,
        limit: max_header_len,
    };
    if header_len > max_header_len {
        return Err(too_long());
    }

    let mut out = Vec::with_capacity(prefix_len + header_len);
    write_prefix(&mut out, version, header_len).map_err(|_| too_long())?;
    if latin1 {
        out.extend(dict.chars().map(|c| u8::try_from(c).unwrap_or(b'?')));
    } else {
        out.extend_from_slice(dict.as_bytes());
    }
    out.resize(prefix_len + header_len - 1, b' ');
    out.push(b'\n');
    Ok(out)
}

/// The dict text as numpy's `_write_array_header` writes it (keys sorted,
/// `repr()` of each value, a trailing `", }"`), then the spare spaces for
/// the growth axis.
fn header_dict(descr: &str, fortran_order: bool, shape: &[u64]) -> String {
    let mut dict = String::with_capacity(64 + descr.len() + 22 * shape.len());
    dict.push_str("{'descr': ");
    dict.push_str(descr);
    dict.push_str(", 'fortran_order': ");
    dict.push_str(if fortran_order { "True" } else { "False" });
    dict.push_str(", 'shape': ");
    render_seq(&mut dict, shape, true, |dim, out| {
        let _ = write!(out, "{dim}");
    });
    dict.push_str(", }");
    let growth_axis = if fortran_order {
        shape.last()
    } else {
        shape.first()
    };
    if let Some(&dim) = growth_axis {
        let spare = GROWTH_AXIS_MAX_DIGITS.saturating_sub(decimal_digits(dim));
        dict.extend(std::iter::repeat_n(' ', spare));
    }
    dict
}

fn decimal_digits(mut n: u64) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_err, parse, NUMPY_FIXTURES};
    use super::super::{parse_header, NUMPY_MAX_HEADER_LEN};
    use super::*;

    // -- Exact bytes, as numpy 2.x writes them

    #[test]
    fn writes_numpy_bytes_for_zeros_3x4() {
        let mut expected =
            b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }"
                .to_vec();
        expected.resize(127, b' ');
        expected.push(b'\n');
        assert_eq!(expected.len(), 128);
        assert_eq!(write_header("'<f8'", false, &[3, 4]).unwrap(), expected);
    }

    #[test]
    fn writes_numpy_bytes_for_0d_and_1d() {
        for (shape, text) in [
            (
                &[][..],
                "{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
            ),
            (
                &[5][..],
                "{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }",
            ),
        ] {
            let mut expected = b"\x93NUMPY\x01\x00v\x00".to_vec();
            expected.extend_from_slice(text.as_bytes());
            expected.resize(127, b' ');
            expected.push(b'\n');
            assert_eq!(write_header("'<f8'", false, shape).unwrap(), expected);
        }
    }

    #[test]
    fn numpy_pads_a_full_alignment_unit_when_already_aligned() {
        let (_, descr, _, shape, bytes) = NUMPY_FIXTURES
            .iter()
            .find(|f| f.0 == "pad64")
            .copied()
            .unwrap();
        // dict + 20 growth-axis spaces + '\n' would end on a 64-byte boundary;
        // numpy then adds 64 spaces rather than none.
        let text = std::str::from_utf8(&bytes[10..]).unwrap();
        let dict_end = text.find('}').unwrap() + 1;
        assert_eq!((10 + dict_end + 20 + 1) % ALIGNMENT, 0);
        assert_eq!(text.len() - dict_end, 20 + 64 + 1);
        assert_eq!(write_header(descr, false, shape).unwrap(), bytes);
    }

    #[test]
    fn growth_axis_spaces_follow_numpy() {
        // Fortran order: the spare spaces depend on the last dimension.
        let h = write_header("'<f8'", true, &[1, 123_456_789_012_345_678]).unwrap();
        let text = std::str::from_utf8(&h[10..]).unwrap();
        let dict = "{'descr': '<f8', 'fortran_order': True, 'shape': (1, 123456789012345678), }";
        assert!(text.starts_with(&format!("{dict}{}", " ".repeat(3))));
        assert_eq!(h.len() % ALIGNMENT, 0);
        // u64::MAX has 20 digits: one spare space, still parses back.
        let h = write_header("'|u1'", false, &[u64::MAX]).unwrap();
        assert_eq!(parse(&h).unwrap().shape, vec![u64::MAX]);
    }

    #[test]
    fn writes_version_2_and_3_when_needed() {
        let long_name = "n".repeat(70_000);
        let descr = format!("[('{long_name}', '<f4')]");
        let bytes = build_header(&descr, false, &[2], usize::MAX).unwrap();
        assert_eq!(&bytes[6..8], &[2, 0]);
        assert_eq!(bytes.len() % ALIGNMENT, 0);
        let h = parse_header(&bytes, usize::MAX).unwrap();
        assert_eq!((h.version, h.descr.as_str()), ((2, 0), descr.as_str()));

        let long_name = "é".repeat(70_000); // latin-1: still version 2.0
        let bytes = build_header(
            &format!("[('{long_name}', '<f4')]"),
            false,
            &[2],
            usize::MAX,
        )
        .unwrap();
        assert_eq!(&bytes[6..8], &[2, 0]);
        assert_eq!(
            parse_header(&bytes, usize::MAX)
                .unwrap()
                .descr
                .chars()
                .count(),
            70_013
        );

        let bytes = write_header("[('\u{3b1}\u{3b2}', '<f4')]", false, &[2]).unwrap();
        assert_eq!(&bytes[6..8], &[3, 0]);
        assert_eq!(bytes.len() % ALIGNMENT, 0);
        assert_eq!(parse(&bytes).unwrap().descr, "[('\u{3b1}\u{3b2}', '<f4')]");

        // The same boundary as numpy 2.4 (measured): a 65439-character field
        // name still fits version 1.0, 65440 needs 2.0.
        for (n, version) in [(65_439, 1u8), (65_440, 2)] {
            let descr = format!("[('{}', '<f4')]", "n".repeat(n));
            let bytes = build_header(&descr, false, &[2], usize::MAX).unwrap();
            assert_eq!(&bytes[6..8], &[version, 0], "{n}");
            assert_eq!(bytes.len() % ALIGNMENT, 0);
            assert_eq!(parse_header(&bytes, usize::MAX).unwrap().descr, descr);
        }
    }

    // -- Rejections

    #[test]
    fn write_refuses_headers_numpy_would_not_read() {
        let descr = format!("[('{}', '<f4')]", "n".repeat(NUMPY_MAX_HEADER_LEN));
        assert_err(
            write_header(&descr, false, &[1]),
            |e| matches!(e, NpyError::HeaderTooLong { len, limit: NUMPY_MAX_HEADER_LEN } if *len > 10_000),
        );
        // Just under the limit is fine, and our reader takes it with the default limit.
        let descr = format!("[('{}', '<f4')]", "n".repeat(9_800));
        let bytes = write_header(&descr, false, &[1]).unwrap();
        assert!(bytes.len() - 10 <= NUMPY_MAX_HEADER_LEN);
        assert!(parse(&bytes).is_ok());
    }

    #[test]
    fn write_rejects_bad_descr_and_shape() {
        for descr in [
            "<f8",
            "'<f8",
            "3",
            "('<f8',)",
            "[('a',)]",
            "[('a', '<f4', -1)]",
            "[('a', '<f4', (2, -1))]",
            "[(1, '<f4')]",
            "[(('t', 'n', 'x'), '<f4')]",
            "[['a', '<f4']]",
            "'<f8' 'x' 3",
            "'<f8', ",
            "",
        ] {
            let e = assert_err(write_header(descr, false, &[1]), |e| {
                matches!(e, NpyError::BadDescr { .. })
            });
            assert!(e.to_string().starts_with("bad .npy descr"), "{e}");
        }
        assert_err(write_header("'<f8'", false, &[1 << 32, 1 << 32]), |e| {
            matches!(e, NpyError::ShapeOverflow)
        });
    }

    #[test]
    fn write_locates_the_bad_byte_of_a_descr() {
        // An unterminated string is reported where it starts.
        let e = assert_err(write_header("'<f8", false, &[1]), |e| {
            matches!(e, NpyError::BadDescr { offset: 0, .. })
        });
        assert_eq!(
            e.to_string(),
            "bad .npy descr at byte 0: cannot parse \"'<f8\": unterminated string"
        );
        assert_err(write_header("'<f8' x", false, &[1]), |e| {
            matches!(e, NpyError::BadDescr { offset: 6, .. })
        });
        // Parses, but is not a descr: offset 0.
        assert_err(
            write_header("[('a',)]", false, &[1]),
            |e| matches!(e, NpyError::BadDescr { offset: 0, reason } if reason.starts_with("field 0: ")),
        );
    }
}
