//! [`NpyError`]: everything that can be wrong with an `.npy` header.
//!
//! Byte offsets count from the start of the file (the magic's first byte),
//! except for the descr text given to [`write_header`](super::write_header),
//! where they count from the start of that text.

/// Everything that can be wrong with an `.npy` header, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NpyError {
    /// The file does not start with `\x93NUMPY`.
    #[error("not an .npy file: bad magic (expected the bytes \\x93NUMPY)")]
    BadMagic,
    /// A format version other than 1.0, 2.0 or 3.0 (numpy knows no other;
    /// 1.1 or 2.1 are refused like 4.0).
    #[error("unsupported .npy format version {major}.{minor} (supported: 1.0, 2.0, 3.0)")]
    UnsupportedVersion {
        /// Major version byte (byte 6 of the file).
        major: u8,
        /// Minor version byte (byte 7 of the file).
        minor: u8,
    },
    /// The header text is (or would be) longer than the allowed limit.
    #[error(".npy header too long ({len} bytes > limit {limit})")]
    HeaderTooLong {
        /// Declared (or, when writing, required) length of the header text
        /// (`HEADER_LEN`: after the 10- or 12-byte prefix, padding and the
        /// final `'\n'` included), in bytes.
        len: u64,
        /// The limit in force, in bytes (numpy's `max_header_size`; see
        /// [`NUMPY_MAX_HEADER_LEN`](super::NUMPY_MAX_HEADER_LEN)).
        limit: usize,
    },
    /// The header text is not valid in its encoding (UTF-8 for version 3.0).
    #[error(".npy header is not valid {encoding}: invalid byte sequence at byte {offset}")]
    HeaderEncoding {
        /// The encoding the header should have had.
        encoding: &'static str,
        /// Offset of the first invalid byte.
        offset: u64,
    },
    /// The header text is not a well-formed Python dict literal (or the
    /// descr text given to `write_header` not a well-formed literal).
    #[error("malformed .npy header dict at byte {offset}: {reason}")]
    Malformed {
        /// Offset of the byte where parsing stopped.
        offset: u64,
        /// What was expected or found.
        reason: String,
    },
    /// One of `descr`, `fortran_order`, `shape` is missing.
    #[error(".npy header dict is missing the key '{key}'")]
    MissingKey {
        /// The missing key.
        key: &'static str,
    },
    /// One of `descr`, `fortran_order`, `shape` appears twice.
    #[error(".npy header dict has the key '{key}' more than once (again at byte {offset})")]
    DuplicateKey {
        /// The repeated key.
        key: &'static str,
        /// Offset of its second occurrence.
        offset: u64,
    },
    /// A key other than `descr`, `fortran_order`, `shape`.
    #[error(
        ".npy header dict has an unexpected key {key} at byte {offset} \
         (allowed: 'descr', 'fortran_order', 'shape')"
    )]
    UnexpectedKey {
        /// The key as Python's `repr()` renders it, shortened.
        key: String,
        /// Offset of the key.
        offset: u64,
    },
    /// The descr is not a type string or a list of fields.
    #[error("bad .npy descr at byte {offset}: {reason}")]
    BadDescr {
        /// Offset of the descr value in the header; for `write_header`, of
        /// the byte of the descr text that does not parse, or 0 when the
        /// text parses but is not a descr.
        offset: u64,
        /// What is wrong (which field, what was expected, what was found).
        reason: String,
    },
    /// `fortran_order` is not `True` or `False`.
    #[error("bad .npy fortran_order at byte {offset}: expected True or False, got {value}")]
    BadFortranOrder {
        /// The value as Python's `repr()` renders it, shortened.
        value: String,
        /// Offset of the value.
        offset: u64,
    },
    /// `shape` is not a tuple (or list) of integers.
    #[error(
        "bad .npy shape at byte {offset}: expected a tuple of non-negative integers, got {value}"
    )]
    BadShape {
        /// The value as Python's `repr()` renders it, shortened.
        value: String,
        /// Offset of the value.
        offset: u64,
    },
    /// `shape` has a negative dimension.
    #[error("bad .npy shape: negative dimension at axis {axis}")]
    NegativeShape {
        /// Index of the offending dimension.
        axis: usize,
    },
    /// A dimension, or the number of elements, does not fit in a u64.
    #[error("bad .npy shape: a dimension or the number of elements overflows u64")]
    ShapeOverflow,
    /// The input ends before the header it announces.
    #[error("truncated .npy header: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed from the start of the file.
        need: u64,
        /// Bytes available.
        have: u64,
    },
    /// Reading from the underlying reader failed.
    #[error("I/O error while reading an .npy header: {0}")]
    Io(#[from] std::io::Error),
}
