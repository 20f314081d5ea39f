//! `.npy` headers: parsing and writing, versions 1.0, 2.0 and 3.0.
//!
//! An `.npy` file starts with the magic `\x93NUMPY`, two version bytes, the
//! length of the header text (u16 little-endian for 1.0, u32 for 2.0 and 3.0),
//! then the header text itself: a Python dict literal with exactly the keys
//! `descr`, `fortran_order` and `shape`, padded with spaces and ending in
//! `'\n'`. Version 1.0 and 2.0 text is latin-1, 3.0 text is UTF-8. The array
//! data follows the header.
//!
//! The parser here reads the dict literal with a small hand-written
//! recursive-descent parser (no regex, no `eval`), bounded in nesting depth,
//! that never panics and never allocates from a length it has not checked.
//! The writer produces byte for byte what numpy >= 1.14 writes for the same
//! array (`np.save`), including numpy's spare spaces for the growth axis and
//! its 64-byte alignment of the data start.

use std::fmt::Write as _;
use std::io::Read;

/// numpy's default `max_header_size` for reading (numpy/lib/format.py, after the DoS report).
pub const NUMPY_MAX_HEADER_LEN: usize = 10_000;

/// Alignment of the data start that numpy >= 1.14 writes and that lazyvault requires.
pub const ALIGNMENT: usize = 64;

/// The magic string at the start of every `.npy` file.
const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Length of magic + version.
const MAGIC_AND_VERSION_LEN: usize = 8;

/// Maximum nesting of tuples/lists accepted in a header, to bound recursion.
const MAX_DEPTH: usize = 32;

/// numpy's `GROWTH_AXIS_MAX_DIGITS`: numpy leaves room for the growth axis
/// (first axis, last in Fortran order) to be rewritten with up to this many digits.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;

/// Longest rendering of a value quoted in an error message.
const SNIPPET_CHARS: usize = 60;

/// Initial buffer for reading a header from a reader: the buffer then grows
/// only as bytes actually arrive.
const READ_CHUNK: usize = 4096;

/// Everything that can be wrong with an `.npy` header.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NpyError {
    /// The file does not start with `\x93NUMPY`.
    #[error("not an .npy file: bad magic (expected the bytes \\x93NUMPY)")]
    BadMagic,
    /// A format version other than 1.0, 2.0 or 3.0.
    #[error("unsupported .npy format version {major}.{minor} (supported: 1.0, 2.0, 3.0)")]
    UnsupportedVersion {
        /// Major version byte.
        major: u8,
        /// Minor version byte.
        minor: u8,
    },
    /// The header text is (or would be) longer than the allowed limit.
    #[error(".npy header too long ({len} bytes > limit {limit})")]
    HeaderTooLong {
        /// Declared (or required) length of the header text, in bytes.
        len: u64,
        /// The limit in force.
        limit: usize,
    },
    /// The header text is not valid in its encoding (UTF-8 for version 3.0).
    #[error(".npy header is not valid {encoding}: invalid byte sequence at byte {offset}")]
    HeaderEncoding {
        /// The encoding the header should have had.
        encoding: &'static str,
        /// Offset of the first invalid byte from the start of the file.
        offset: u64,
    },
    /// The header text is not a well-formed Python dict literal.
    #[error("malformed .npy header dict at byte {offset}: {reason}")]
    Malformed {
        /// Offset from the start of the file (for `write_header`'s descr:
        /// from the start of the descr text).
        offset: u64,
        /// What was expected or found.
        reason: String,
    },
    /// One of `descr`, `fortran_order`, `shape` is missing.
    #[error(".npy header dict is missing the key '{0}'")]
    MissingKey(&'static str),
    /// One of `descr`, `fortran_order`, `shape` appears twice.
    #[error(".npy header dict has the key '{0}' more than once")]
    DuplicateKey(&'static str),
    /// A key other than `descr`, `fortran_order`, `shape`.
    #[error(
        ".npy header dict has an unexpected key {0} (allowed: 'descr', 'fortran_order', 'shape')"
    )]
    UnexpectedKey(String),
    /// The descr is not a type string or a list of fields.
    #[error("bad .npy descr: {0}")]
    BadDescr(String),
    /// `fortran_order` is not `True` or `False`.
    #[error("bad .npy fortran_order: expected True or False, got {0}")]
    BadFortranOrder(String),
    /// `shape` is not a tuple of integers.
    #[error("bad .npy shape: expected a tuple of non-negative integers, got {0}")]
    BadShape(String),
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

/// A parsed `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// Format version: (1, 0), (2, 0) or (3, 0).
    pub version: (u8, u8),
    /// Canonical Python-literal text of the descr, as `repr()` renders it
    /// (e.g. `'<f8'` or `[('x', '<i4'), ('y', '>f8', (2, 3))]`).
    pub descr: String,
    /// Whether the data is in Fortran (column-major) order.
    pub fortran_order: bool,
    /// Array shape; empty for a 0-d array.
    pub shape: Vec<u64>,
    /// Total header length including magic: where the data starts.
    pub data_offset: u64,
}

impl NpyHeader {
    /// Number of elements (product of the shape; 1 for a 0-d array), or
    /// `None` when the product of the non-zero dimensions overflows a u64.
    pub fn len(&self) -> Option<u64> {
        shape_product(&self.shape)
    }

    /// Whether the array has no elements (some dimension is 0).
    pub fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// Size of the data in bytes: `len * itemsize`, or `None` if the itemsize
    /// of the descr is unknown or the product overflows.
    pub fn nbytes(&self) -> Option<u64> {
        self.len()?.checked_mul(descr_itemsize(&self.descr)?)
    }
}

/// Parses a header from the start of `bytes` (which may contain data after the header).
///
/// `max_header_len` caps the declared length of the header text, in bytes
/// (numpy's `max_header_size` counts decoded characters, which for a 3.0
/// header can be fewer); it is checked before anything is sliced or
/// allocated from it. Returns
/// [`NpyError::Truncated`] if `bytes` is shorter than the header it announces.
/// The data offset is not required to be aligned (numpy before 1.14 used 16).
pub fn parse_header(bytes: &[u8], max_header_len: usize) -> Result<NpyHeader, NpyError> {
    let version = check_magic_and_version(bytes)?;
    let prefix_len = prefix_len(version);
    let prefix = bytes.get(..prefix_len).ok_or(NpyError::Truncated {
        need: prefix_len as u64,
        have: bytes.len() as u64,
    })?;
    let header_len = declared_header_len(prefix);
    let header_len = check_header_len(header_len, max_header_len)?;
    let end = prefix_len
        .checked_add(header_len)
        .ok_or(NpyError::HeaderTooLong {
            len: header_len as u64,
            limit: max_header_len,
        })?;
    let text = bytes.get(prefix_len..end).ok_or(NpyError::Truncated {
        need: end as u64,
        have: bytes.len() as u64,
    })?;
    parse_header_text(version, text, prefix_len)
}

/// Reads just the header from a reader: the 8-byte magic and version first,
/// then the 2- or 4-byte length, which is checked against `max_header_len`
/// before any buffer is sized from it, then exactly that many bytes.
///
/// On success the reader is positioned at the start of the data.
pub fn read_header<R: Read>(r: &mut R, max_header_len: usize) -> Result<NpyHeader, NpyError> {
    let mut prefix = [0u8; 12];
    let got = read_full(r, &mut prefix[..MAGIC_AND_VERSION_LEN])?;
    let version = check_magic_and_version(&prefix[..got])?;
    let prefix_len = prefix_len(version);
    let got = got + read_full(r, &mut prefix[MAGIC_AND_VERSION_LEN..prefix_len])?;
    if got < prefix_len {
        return Err(NpyError::Truncated {
            need: prefix_len as u64,
            have: got as u64,
        });
    }
    let header_len = check_header_len(declared_header_len(&prefix[..prefix_len]), max_header_len)?;
    let mut text = Vec::with_capacity(header_len.min(READ_CHUNK));
    r.by_ref().take(header_len as u64).read_to_end(&mut text)?;
    if text.len() < header_len {
        return Err(NpyError::Truncated {
            need: (prefix_len as u64).saturating_add(header_len as u64),
            have: (prefix_len + text.len()) as u64,
        });
    }
    parse_header_text(version, &text, prefix_len)
}

/// Builds a complete header (magic, version, length, dict, padding, `'\n'`)
/// whose total length is a multiple of 64, byte for byte as numpy writes it.
///
/// Version 1.0 when the text is latin-1 and its length fits a u16, 2.0 when it
/// is latin-1 but longer, 3.0 (UTF-8) when the descr contains characters
/// outside latin-1. `descr` is Python-literal text as produced by
/// `repr(numpy.lib.format.dtype_to_descr(dtype))`; it is validated and
/// re-rendered canonically. A header text longer than
/// [`NUMPY_MAX_HEADER_LEN`] is refused, so that numpy's default `np.load`
/// always reads the result.
pub fn write_header(descr: &str, fortran_order: bool, shape: &[u64]) -> Result<Vec<u8>, NpyError> {
    build_header(descr, fortran_order, shape, NUMPY_MAX_HEADER_LEN)
}

/// Itemsize in bytes of a descr (Python-literal text, e.g. `'<f8'` or a list
/// of fields), or `None` when it is malformed or of an unknown kind.
///
/// Type strings: `b1`; `i`/`u` 1, 2, 4, 8; `f` 2, 4, 8, 12, 16; `c` 8, 16,
/// 24, 32; `M8`/`m8` with an optional unit (`[ns]`, `[10s]`, ...); `S<n>`;
/// `U<n>` (4 bytes per character); `V<n>`; `O` (8, a pickled object pointer),
/// each with an optional byte-order character `<`, `>`, `|` or `=`.
/// Structured descrs: the sum of the field itemsizes, each times the product
/// of its subarray shape (third element) if any.
pub fn descr_itemsize(descr: &str) -> Option<u64> {
    // Fast path for the common case: a plain single-quoted type string.
    if let Some(inner) = descr.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        if !inner.contains(['\\', '\'']) {
            return type_str_itemsize(inner);
        }
    }
    let lit = parse_descr_literal(descr).ok()?;
    check_descr(&lit).ok()?;
    literal_itemsize(&lit)
}

// ---------------------------------------------------------------------------
// Prefix handling

/// Checks magic and version from the first (up to) 8 bytes of `bytes`.
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

/// Length of magic + version + header-length field for a (supported) version.
fn prefix_len(version: (u8, u8)) -> usize {
    if version.0 == 1 {
        10
    } else {
        12
    }
}

/// The header length declared in a complete prefix (10 or 12 bytes).
fn declared_header_len(prefix: &[u8]) -> u64 {
    match prefix {
        [_, _, _, _, _, _, _, _, a, b, c, d] => u64::from(u32::from_le_bytes([*a, *b, *c, *d])),
        [_, _, _, _, _, _, _, _, a, b] => u64::from(u16::from_le_bytes([*a, *b])),
        _ => 0,
    }
}

fn check_header_len(len: u64, max_header_len: usize) -> Result<usize, NpyError> {
    match usize::try_from(len) {
        Ok(n) if n <= max_header_len => Ok(n),
        _ => Err(NpyError::HeaderTooLong {
            len,
            limit: max_header_len,
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
    let (descr, fortran_order, shape) = parser.header_dict()?;
    Ok(NpyHeader {
        version,
        descr,
        fortran_order,
        shape,
        data_offset: (base + text.len()) as u64,
    })
}

// ---------------------------------------------------------------------------
// Writing

fn build_header(
    descr: &str,
    fortran_order: bool,
    shape: &[u64],
    max_header_len: usize,
) -> Result<Vec<u8>, NpyError> {
    let descr = canonical_descr(descr)?;
    if shape_product(shape).is_none() {
        return Err(NpyError::ShapeOverflow);
    }

    // Same text as numpy's `_write_array_header` (keys sorted).
    let mut dict = String::with_capacity(64 + descr.len() + 22 * shape.len());
    dict.push_str("{'descr': ");
    dict.push_str(&descr);
    dict.push_str(", 'fortran_order': ");
    dict.push_str(if fortran_order { "True" } else { "False" });
    dict.push_str(", 'shape': ");
    render_shape(&mut dict, shape);
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

    // Same version choice and padding as numpy's `_wrap_header_guess_version`.
    let latin1 = dict.chars().all(|c| u32::from(c) <= 0xff);
    let encoded_len = if latin1 {
        dict.chars().count()
    } else {
        dict.len()
    };
    let text_len = encoded_len + 1; // the final '\n'
    let padded = |prefix: usize| text_len + (ALIGNMENT - (prefix + text_len) % ALIGNMENT);
    let v1_len = padded(10);
    let (version, prefix_len, header_len) = if latin1 && v1_len <= usize::from(u16::MAX) {
        ((1u8, 0u8), 10usize, v1_len)
    } else if latin1 {
        ((2, 0), 12, padded(12))
    } else {
        ((3, 0), 12, padded(12))
    };
    let too_long = || NpyError::HeaderTooLong {
        len: header_len as u64,
        limit: max_header_len,
    };
    if header_len > max_header_len {
        return Err(too_long());
    }

    let mut out = Vec::with_capacity(prefix_len + header_len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version.0, version.1]);
    if version.0 == 1 {
        let len = u16::try_from(header_len).map_err(|_| too_long())?;
        out.extend_from_slice(&len.to_le_bytes());
    } else {
        let len = u32::try_from(header_len).map_err(|_| too_long())?;
        out.extend_from_slice(&len.to_le_bytes());
    }
    if latin1 {
        out.extend(dict.chars().map(|c| u8::try_from(c).unwrap_or(b'?')));
    } else {
        out.extend_from_slice(dict.as_bytes());
    }
    out.resize(prefix_len + header_len - 1, b' ');
    out.push(b'\n');
    Ok(out)
}

/// Parses, validates and canonically re-renders descr text.
fn canonical_descr(descr: &str) -> Result<String, NpyError> {
    let lit = parse_descr_literal(descr).map_err(|e| match e {
        NpyError::Malformed { offset, reason } => NpyError::BadDescr(format!(
            "cannot parse {} at byte {offset}: {reason}",
            snippet_str(descr)
        )),
        other => other,
    })?;
    check_descr(&lit).map_err(NpyError::BadDescr)?;
    let mut out = String::with_capacity(descr.len() + 8);
    render(&lit, &mut out);
    Ok(out)
}

/// Parses descr text (surrounding whitespace allowed) into a literal tree.
fn parse_descr_literal(descr: &str) -> Result<Lit, NpyError> {
    let mut p = Parser::utf8(descr, 0);
    p.skip_ws();
    let lit = p.value()?;
    p.skip_ws();
    if p.pos < p.bytes.len() {
        return Err(p.expected("the end of the descr"));
    }
    Ok(lit)
}

fn render_shape(out: &mut String, shape: &[u64]) {
    out.push('(');
    for (i, dim) in shape.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{dim}");
    }
    if shape.len() == 1 {
        out.push(',');
    }
    out.push(')');
}

fn decimal_digits(mut n: u64) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

/// Product of a shape; `None` if the product of its non-zero dimensions
/// overflows (numpy refuses such shapes even when a dimension is 0).
fn shape_product(shape: &[u64]) -> Option<u64> {
    let mut product: u64 = 1;
    let mut zero = false;
    for &dim in shape {
        if dim == 0 {
            zero = true;
        } else {
            product = product.checked_mul(dim)?;
        }
    }
    Some(if zero { 0 } else { product })
}

// ---------------------------------------------------------------------------
// Literal trees

/// The subset of Python literals that `.npy` headers use.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lit {
    Str(String),
    /// `magnitude` is `None` when it does not fit a u64.
    Int {
        negative: bool,
        magnitude: Option<u64>,
    },
    Bool(bool),
    Tuple(Vec<Lit>),
    List(Vec<Lit>),
}

/// Renders a literal as Python's `repr()` does.
fn render(lit: &Lit, out: &mut String) {
    match lit {
        Lit::Str(s) => render_str(s, out),
        Lit::Int {
            negative,
            magnitude,
        } => match magnitude {
            Some(m) => {
                if *negative && *m != 0 {
                    out.push('-');
                }
                let _ = write!(out, "{m}");
            }
            None => out.push_str(if *negative {
                "<integer below -2**64>"
            } else {
                "<integer above 2**64>"
            }),
        },
        Lit::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Lit::Tuple(items) => {
            out.push('(');
            render_items(items, out);
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        Lit::List(items) => {
            out.push('[');
            render_items(items, out);
            out.push(']');
        }
    }
}

fn render_items(items: &[Lit], out: &mut String) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        render(item, out);
    }
}

/// Renders a string as Python's `repr()` does: single quotes unless the
/// string contains a single quote and no double quote; backslash, the quote,
/// `\n`, `\r`, `\t` escaped; other non-printable characters as `\xhh`,
/// `\uhhhh` or `\Uhhhhhhhh`.
fn render_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c => {
                let v = u32::from(c);
                let _ = if v <= 0xff {
                    write!(out, "\\x{v:02x}")
                } else if v <= 0xffff {
                    write!(out, "\\u{v:04x}")
                } else {
                    write!(out, "\\U{v:08x}")
                };
            }
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable()` for one character, approximated without
/// Unicode tables: exact for latin-1; beyond it, separators, format
/// characters and private-use characters are non-printable, while
/// unassigned code points (which Python also escapes) are treated as
/// printable. Either way the rendering evaluates to the same string.
fn is_printable(c: char) -> bool {
    let v = u32::from(c);
    !matches!(
        v,
        0x00..=0x1f
            | 0x7f..=0xa0
            | 0xad
            | 0x0600..=0x0605
            | 0x061c
            | 0x06dd
            | 0x070f
            | 0x0890..=0x0891
            | 0x08e2
            | 0x1680
            | 0x180e
            | 0x2000..=0x200f
            | 0x2028..=0x202f
            | 0x205f..=0x206f
            | 0x3000
            | 0xe000..=0xf8ff
            | 0xfeff
            | 0xfff0..=0xfffb
            | 0x110bd
            | 0x110cd
            | 0x13430..=0x1343f
            | 0x1bca0..=0x1bca3
            | 0x1d173..=0x1d17a
            | 0xe0000..=0xe00ff
            | 0xf0000..=0x10ffff
    ) && v & 0xfffe != 0xfffe
}

/// Renders a literal for an error message, shortened.
fn snippet(lit: &Lit) -> String {
    let mut s = String::new();
    render(lit, &mut s);
    shorten(s)
}

fn snippet_str(s: &str) -> String {
    let mut out = String::new();
    render_str(s, &mut out);
    shorten(out)
}

fn shorten(s: String) -> String {
    match s.char_indices().nth(SNIPPET_CHARS) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s,
    }
}

// ---------------------------------------------------------------------------
// Descr validation and itemsize

/// Checks that a literal has the shape of a descr: a type string, or a list
/// of `(name, descr)` / `(name, descr, shape)` tuples where name is a string
/// or a `(title, name)` pair of strings and shape an integer or a tuple of
/// integers.
fn check_descr(lit: &Lit) -> Result<(), String> {
    match lit {
        Lit::Str(_) => Ok(()),
        Lit::List(fields) => {
            for (i, field) in fields.iter().enumerate() {
                check_field(field).map_err(|e| format!("field {i}: {e}"))?;
            }
            Ok(())
        }
        other => Err(format!(
            "expected a type string or a list of fields, got {}",
            snippet(other)
        )),
    }
}

fn check_field(field: &Lit) -> Result<(), String> {
    let items = match field {
        Lit::Tuple(items) if (2..=3).contains(&items.len()) => items,
        other => {
            return Err(format!(
                "expected a tuple (name, descr) or (name, descr, shape), got {}",
                snippet(other)
            ))
        }
    };
    match items.first() {
        Some(Lit::Str(_)) => {}
        Some(Lit::Tuple(pair)) if matches!(pair.as_slice(), [Lit::Str(_), Lit::Str(_)]) => {}
        Some(other) => {
            return Err(format!(
                "a field name must be a string or a (title, name) tuple of strings, got {}",
                snippet(other)
            ))
        }
        None => {}
    }
    if let Some(descr) = items.get(1) {
        check_descr(descr)?;
    }
    if let Some(shape) = items.get(2) {
        if subarray_count(shape).is_none() {
            return Err(format!(
                "a subarray shape must be a non-negative integer or a tuple of them, got {}",
                snippet(shape)
            ));
        }
    }
    Ok(())
}

/// Number of elements of a field's subarray shape (an int or a tuple of
/// ints); `None` if it is not one or the product overflows.
fn subarray_count(shape: &Lit) -> Option<u64> {
    fn dim(lit: &Lit) -> Option<u64> {
        match lit {
            Lit::Int {
                negative,
                magnitude: Some(m),
            } if !*negative || *m == 0 => Some(*m),
            _ => None,
        }
    }
    match shape {
        Lit::Tuple(dims) => dims
            .iter()
            .try_fold(1u64, |acc, d| acc.checked_mul(dim(d)?)),
        other => dim(other),
    }
}

fn literal_itemsize(lit: &Lit) -> Option<u64> {
    match lit {
        Lit::Str(s) => type_str_itemsize(s),
        Lit::List(fields) => fields.iter().try_fold(0u64, |acc, field| {
            let Lit::Tuple(items) = field else {
                return None;
            };
            let size = literal_itemsize(items.get(1)?)?;
            let count = match items.get(2) {
                Some(shape) => subarray_count(shape)?,
                None => 1,
            };
            acc.checked_add(size.checked_mul(count)?)
        }),
        _ => None,
    }
}

/// Itemsize of a numpy type string such as `<f8`, `|S5`, `<M8[ns]`.
fn type_str_itemsize(s: &str) -> Option<u64> {
    let s = s.strip_prefix(['<', '>', '|', '=']).unwrap_or(s);
    let mut chars = s.chars();
    let kind = chars.next()?;
    let rest = chars.as_str();
    match kind {
        'b' => (rest == "1").then_some(1),
        'i' | 'u' => decimal(rest).filter(|n| matches!(n, 1 | 2 | 4 | 8)),
        'f' => decimal(rest).filter(|n| matches!(n, 2 | 4 | 8 | 12 | 16)),
        'c' => decimal(rest).filter(|n| matches!(n, 8 | 16 | 24 | 32)),
        'M' | 'm' => {
            let unit = rest.strip_prefix('8')?;
            (unit.is_empty() || datetime_unit_ok(unit)).then_some(8)
        }
        'S' | 'V' => decimal(rest),
        'U' => decimal(rest)?.checked_mul(4),
        'O' => match rest {
            "" | "8" => Some(8),
            "4" => Some(4),
            _ => None,
        },
        _ => None,
    }
}

/// `[unit]` or `[<multiplier>unit]` of a datetime64/timedelta64 type string.
fn datetime_unit_ok(s: &str) -> bool {
    let Some(inner) = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')) else {
        return false;
    };
    let unit = inner.trim_start_matches(|c: char| c.is_ascii_digit());
    let multiplier = &inner[..inner.len() - unit.len()];
    (multiplier.is_empty() || decimal(multiplier).is_some_and(|n| n > 0))
        && matches!(
            unit,
            "Y" | "M"
                | "W"
                | "D"
                | "h"
                | "m"
                | "s"
                | "ms"
                | "us"
                | "μs"
                | "ns"
                | "ps"
                | "fs"
                | "as"
                | "generic"
        )
}

/// A non-empty run of ASCII digits as a u64.
fn decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.bytes().try_fold(0u64, |acc, b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

// ---------------------------------------------------------------------------
// Parser

/// Recursive-descent parser for Python literals over header bytes.
///
/// Structural characters are all ASCII; non-ASCII bytes only occur inside
/// strings, where they are decoded as latin-1 (one byte, one character) or,
/// in UTF-8 mode, as the UTF-8 character starting there (the text was
/// validated up front, and the position only ever advances by whole
/// characters). Positions are byte offsets, reported relative to `base`.
struct Parser<'a> {
    bytes: &'a [u8],
    /// The same bytes as a `str` in UTF-8 mode; `None` for latin-1.
    text: Option<&'a str>,
    pos: usize,
    base: u64,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn latin1(bytes: &'a [u8], base: u64) -> Self {
        Parser {
            bytes,
            text: None,
            pos: 0,
            base,
            depth: 0,
        }
    }

    fn utf8(text: &'a str, base: u64) -> Self {
        Parser {
            bytes: text.as_bytes(),
            text: Some(text),
            pos: 0,
            base,
            depth: 0,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn peek_at(&self, ahead: usize) -> Option<u8> {
        self.bytes.get(self.pos.checked_add(ahead)?).copied()
    }

    /// The character at the current position, and its length in bytes.
    fn current_char(&self) -> Option<(char, usize)> {
        let b = self.peek()?;
        if b < 0x80 {
            return Some((char::from(b), 1));
        }
        match self.text {
            None => Some((char::from(b), 1)),
            Some(text) => {
                let c = text.get(self.pos..)?.chars().next()?;
                Some((c, c.len_utf8()))
            }
        }
    }

    fn error_at(&self, pos: usize, reason: impl Into<String>) -> NpyError {
        NpyError::Malformed {
            offset: self.base.saturating_add(pos as u64),
            reason: reason.into(),
        }
    }

    fn error(&self, reason: impl Into<String>) -> NpyError {
        self.error_at(self.pos, reason)
    }

    fn expected(&self, what: &str) -> NpyError {
        let found = match self.current_char() {
            Some((c, _)) => format!("{c:?}"),
            None => "the end of the text".to_owned(),
        };
        self.error(format!("expected {what}, found {found}"))
    }

    /// Skips Python whitespace (inside brackets newlines are whitespace too)
    /// and `#` comments.
    fn skip_ws(&mut self) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' | b'\n' | b'\r' | 0x0c => self.pos += 1,
                b'#' => {
                    while !matches!(self.peek(), None | Some(b'\n' | b'\r')) {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    /// The header dict: exactly the keys descr, fortran_order and shape.
    fn header_dict(&mut self) -> Result<(String, bool, Vec<u64>), NpyError> {
        self.skip_ws();
        if self.peek() != Some(b'{') {
            return Err(self.expected("'{' (the header must be a dict)"));
        }
        self.pos += 1;
        let mut descr = None;
        let mut fortran_order = None;
        let mut shape = None;
        loop {
            self.skip_ws();
            if self.peek() == Some(b'}') {
                self.pos += 1;
                break;
            }
            let key = self.value()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.expected("':' after a dict key"));
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value()?;
            match &key {
                Lit::Str(k) if k == "descr" => {
                    set_once(&mut descr, "descr", convert_descr(&value)?)?;
                }
                Lit::Str(k) if k == "fortran_order" => {
                    let order = match value {
                        Lit::Bool(b) => b,
                        other => return Err(NpyError::BadFortranOrder(snippet(&other))),
                    };
                    set_once(&mut fortran_order, "fortran_order", order)?;
                }
                Lit::Str(k) if k == "shape" => {
                    set_once(&mut shape, "shape", convert_shape(&value)?)?;
                }
                other => return Err(NpyError::UnexpectedKey(snippet(other))),
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(self.expected("',' or '}'")),
            }
        }
        self.skip_ws();
        if self.pos < self.bytes.len() {
            return Err(self.expected("only padding after the header dict"));
        }
        Ok((
            descr.ok_or(NpyError::MissingKey("descr"))?,
            fortran_order.ok_or(NpyError::MissingKey("fortran_order"))?,
            shape.ok_or(NpyError::MissingKey("shape"))?,
        ))
    }

    /// Any supported literal; the current position is not whitespace.
    fn value(&mut self) -> Result<Lit, NpyError> {
        match self.peek() {
            Some(b'(') => self.sequence(b')'),
            Some(b'[') => self.sequence(b']'),
            Some(b'\'' | b'"') => self.string(),
            Some(b'u' | b'U') if matches!(self.peek_at(1), Some(b'\'' | b'"')) => self.string(),
            Some(b'0'..=b'9' | b'+' | b'-') => self.integer(),
            Some(b) if b.is_ascii_alphabetic() || b == b'_' => self.name(),
            _ => Err(self.expected("a value")),
        }
    }

    /// A tuple (`close` = `)`) or a list (`close` = `]`). A parenthesised
    /// single value without a comma is that value, as in Python.
    fn sequence(&mut self, close: u8) -> Result<Lit, NpyError> {
        if self.depth >= MAX_DEPTH {
            return Err(self.error(format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        self.depth += 1;
        self.pos += 1;
        let mut items = Vec::new();
        let mut comma = false;
        loop {
            self.skip_ws();
            if self.peek() == Some(close) {
                self.pos += 1;
                break;
            }
            items.push(self.value()?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    comma = true;
                }
                Some(b) if b == close => {
                    self.pos += 1;
                    break;
                }
                _ => {
                    return Err(self.expected(if close == b')' {
                        "',' or ')'"
                    } else {
                        "',' or ']'"
                    }))
                }
            }
        }
        self.depth -= 1;
        if close == b']' {
            return Ok(Lit::List(items));
        }
        if !comma && items.len() == 1 {
            if let Some(item) = items.pop() {
                return Ok(item);
            }
        }
        Ok(Lit::Tuple(items))
    }

    /// `True` or `False`; any other name is an error.
    fn name(&mut self) -> Result<Lit, NpyError> {
        let start = self.pos;
        while matches!(self.peek(), Some(b) if b.is_ascii_alphanumeric() || b == b'_') {
            self.pos += 1;
        }
        match &self.bytes[start..self.pos] {
            b"True" => Ok(Lit::Bool(true)),
            b"False" => Ok(Lit::Bool(false)),
            other => Err(self.error_at(
                start,
                format!(
                    "unsupported value {:?} (expected a string, an integer, True, False, a tuple or a list)",
                    String::from_utf8_lossy(other)
                ),
            )),
        }
    }

    /// A decimal integer with an optional sign, `_` separators and a
    /// Python 2 `L` suffix.
    fn integer(&mut self) -> Result<Lit, NpyError> {
        let mut negative = false;
        if let Some(sign @ (b'+' | b'-')) = self.peek() {
            negative = sign == b'-';
            self.pos += 1;
            self.skip_ws();
        }
        let start = self.pos;
        let mut magnitude = Some(0u64);
        let mut digits = 0usize;
        let mut after_underscore = false;
        loop {
            match self.peek() {
                Some(d @ b'0'..=b'9') => {
                    magnitude = magnitude
                        .and_then(|m| m.checked_mul(10))
                        .and_then(|m| m.checked_add(u64::from(d - b'0')));
                    digits += 1;
                    after_underscore = false;
                    self.pos += 1;
                }
                Some(b'_') if digits > 0 && !after_underscore => {
                    after_underscore = true;
                    self.pos += 1;
                }
                _ => break,
            }
        }
        if digits == 0 {
            return Err(self.expected("a digit"));
        }
        if after_underscore {
            return Err(self.expected("a digit after '_'"));
        }
        if self.bytes.get(start) == Some(&b'0') && magnitude != Some(0) {
            return Err(self.error_at(start, "leading zeros in a non-zero integer"));
        }
        if matches!(self.peek(), Some(b'L' | b'l')) {
            self.pos += 1;
        }
        if matches!(self.peek(), Some(b) if b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b >= 0x80)
        {
            return Err(self.expected("a decimal integer"));
        }
        Ok(Lit::Int {
            negative,
            magnitude,
        })
    }

    /// One or more adjacent string literals (concatenated, as in Python).
    fn string(&mut self) -> Result<Lit, NpyError> {
        let mut out = String::new();
        loop {
            self.one_string(&mut out)?;
            let end = self.pos;
            self.skip_ws();
            let next_is_string = match self.peek() {
                Some(b'\'' | b'"') => true,
                Some(b'u' | b'U') => matches!(self.peek_at(1), Some(b'\'' | b'"')),
                _ => false,
            };
            if !next_is_string {
                self.pos = end;
                return Ok(Lit::Str(out));
            }
        }
    }

    /// One string literal: optional `u` prefix, single or double quotes,
    /// possibly triple, with Python's backslash escapes.
    fn one_string(&mut self, out: &mut String) -> Result<(), NpyError> {
        let start = self.pos;
        if matches!(self.peek(), Some(b'u' | b'U')) {
            self.pos += 1;
        }
        let quote = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(self.expected("a string")),
        };
        let triple = self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote);
        self.pos += if triple { 3 } else { 1 };
        loop {
            let Some(b) = self.peek() else {
                return Err(self.error_at(start, "unterminated string"));
            };
            match b {
                _ if b == quote => {
                    if !triple {
                        self.pos += 1;
                        return Ok(());
                    }
                    if self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote) {
                        self.pos += 3;
                        return Ok(());
                    }
                    out.push(char::from(quote));
                    self.pos += 1;
                }
                b'\\' => self.escape(out)?,
                b'\n' | b'\r' if !triple => {
                    return Err(self.error_at(start, "unterminated string (line break inside it)"));
                }
                b'\r' => {
                    // Python reads "\r\n" and a lone "\r" in source as "\n".
                    self.pos += 1;
                    if self.peek() == Some(b'\n') {
                        self.pos += 1;
                    }
                    out.push('\n');
                }
                0 => return Err(self.error("NUL character in a string")),
                // Only a line break in a triple-quoted string stops a run at once.
                b'\n' => {
                    out.push('\n');
                    self.pos += 1;
                }
                _ => {
                    // Copy a run of plain characters at once. The run ends
                    // before an ASCII byte, so on a UTF-8 character boundary.
                    let rest = self.bytes.get(self.pos..).unwrap_or_default();
                    let run = rest
                        .iter()
                        .position(|&c| matches!(c, b'\\' | b'\n' | b'\r' | 0) || c == quote)
                        .unwrap_or(rest.len());
                    let (plain, end) = (&rest[..run], self.pos + run);
                    match self.text {
                        None => out.extend(plain.iter().map(|&c| char::from(c))),
                        Some(text) => match text.get(self.pos..end) {
                            Some(plain) => out.push_str(plain),
                            None => return Err(self.error("invalid character in a string")),
                        },
                    }
                    self.pos = end;
                }
            }
        }
    }

    /// A backslash escape inside a (non-raw) string; position at the backslash.
    fn escape(&mut self, out: &mut String) -> Result<(), NpyError> {
        let start = self.pos;
        self.pos += 1;
        let Some(b) = self.peek() else {
            return Err(self.error_at(start, "unterminated string"));
        };
        let simple = match b {
            b'\\' => Some('\\'),
            b'\'' => Some('\''),
            b'"' => Some('"'),
            b'a' => Some('\x07'),
            b'b' => Some('\x08'),
            b'f' => Some('\x0c'),
            b'n' => Some('\n'),
            b'r' => Some('\r'),
            b't' => Some('\t'),
            b'v' => Some('\x0b'),
            _ => None,
        };
        if let Some(c) = simple {
            out.push(c);
            self.pos += 1;
            return Ok(());
        }
        match b {
            // Line continuation: backslash-newline is dropped.
            b'\n' => self.pos += 1,
            b'\r' => {
                self.pos += 1;
                if self.peek() == Some(b'\n') {
                    self.pos += 1;
                }
            }
            b'0'..=b'7' => {
                let mut value = 0u32;
                let mut n = 0;
                while n < 3 {
                    match self.peek() {
                        Some(d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            self.pos += 1;
                            n += 1;
                        }
                        _ => break,
                    }
                }
                // At most 0o777, always a valid scalar value.
                out.push(char::from_u32(value).unwrap_or(char::REPLACEMENT_CHARACTER));
            }
            b'x' | b'u' | b'U' => {
                let digits = match b {
                    b'x' => 2,
                    b'u' => 4,
                    _ => 8,
                };
                self.pos += 1;
                let mut value = 0u32;
                for _ in 0..digits {
                    let digit = self
                        .peek()
                        .and_then(|d| char::from(d).to_digit(16))
                        .ok_or_else(|| {
                            self.error_at(
                                start,
                                format!(
                                    "truncated \\{} escape (needs {digits} hex digits)",
                                    char::from(b)
                                ),
                            )
                        })?;
                    value = (value << 4) | digit;
                    self.pos += 1;
                }
                let c = char::from_u32(value).ok_or_else(|| {
                    self.error_at(
                        start,
                        format!(
                            "escape \\{}{value:x} is not a valid character",
                            char::from(b)
                        ),
                    )
                })?;
                out.push(c);
            }
            b'N' => return Err(self.error_at(start, "\\N{...} escapes are not supported")),
            // Unknown escape: Python keeps the backslash; the next character
            // is read normally by the caller.
            _ => out.push('\\'),
        }
        Ok(())
    }
}

fn set_once<T>(slot: &mut Option<T>, key: &'static str, value: T) -> Result<(), NpyError> {
    if slot.is_some() {
        return Err(NpyError::DuplicateKey(key));
    }
    *slot = Some(value);
    Ok(())
}

fn convert_descr(value: &Lit) -> Result<String, NpyError> {
    check_descr(value).map_err(NpyError::BadDescr)?;
    let mut out = String::new();
    render(value, &mut out);
    Ok(out)
}

fn convert_shape(value: &Lit) -> Result<Vec<u64>, NpyError> {
    let (Lit::Tuple(items) | Lit::List(items)) = value else {
        return Err(NpyError::BadShape(snippet(value)));
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
            _ => return Err(NpyError::BadShape(snippet(value))),
        }
    }
    if shape_product(&shape).is_none() {
        return Err(NpyError::ShapeOverflow);
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    // -- Allocation tracking, to show that hostile lengths allocate nothing big.

    struct TrackingAlloc;

    thread_local! {
        static LARGEST_ALLOC: Cell<usize> = const { Cell::new(0) };
    }

    fn note_alloc(size: usize) {
        let _ = LARGEST_ALLOC.try_with(|m| m.set(m.get().max(size)));
    }

    // SAFETY: forwards to the system allocator; only records sizes.
    unsafe impl GlobalAlloc for TrackingAlloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note_alloc(layout.size());
            // SAFETY: same contract as the caller's.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: same contract as the caller's.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note_alloc(new_size);
            // SAFETY: same contract as the caller's.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static GLOBAL: TrackingAlloc = TrackingAlloc;

    /// Runs `f` and returns its result with the largest single allocation it
    /// made on this thread.
    fn largest_alloc_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
        LARGEST_ALLOC.with(|m| m.set(0));
        let out = f();
        (out, LARGEST_ALLOC.with(|m| m.get()))
    }

    // -- Helpers

    /// A header the way a given era of writer laid it out: `prefix` bytes of
    /// magic + version + length, `text` padded with spaces to `align`, '\n'.
    fn raw_header(version: (u8, u8), text: &[u8], align: usize) -> Vec<u8> {
        let prefix = if version.0 == 1 { 10 } else { 12 };
        let mut total = prefix + text.len() + 1;
        total = total.div_ceil(align) * align;
        let hlen = total - prefix;
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[version.0, version.1]);
        if version.0 == 1 {
            out.extend_from_slice(&u16::try_from(hlen).unwrap().to_le_bytes());
        } else {
            out.extend_from_slice(&u32::try_from(hlen).unwrap().to_le_bytes());
        }
        out.extend_from_slice(text);
        out.resize(total - 1, b' ');
        out.push(b'\n');
        out
    }

    fn v1(text: &str) -> Vec<u8> {
        raw_header((1, 0), text.as_bytes(), 64)
    }

    fn parse(bytes: &[u8]) -> Result<NpyHeader, NpyError> {
        parse_header(bytes, NUMPY_MAX_HEADER_LEN)
    }

    fn parse_text(text: &str) -> Result<NpyHeader, NpyError> {
        parse(&v1(text))
    }

    fn lit_of(descr: &str) -> Lit {
        parse_descr_literal(descr).unwrap()
    }

    fn s(x: &str) -> Lit {
        Lit::Str(x.to_owned())
    }

    fn int(x: u64) -> Lit {
        Lit::Int {
            negative: false,
            magnitude: Some(x),
        }
    }

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

    type Fixture = (
        &'static str,
        &'static str,
        bool,
        &'static [u64],
        &'static [u8],
    );

    /// (name, repr(descr), fortran_order, shape, header bytes), all produced
    /// by numpy 2.4 (`np.save`, header part only).
    #[rustfmt::skip]
    const NUMPY_FIXTURES: &[Fixture] = &[
        ("f8_3x4", "'<f8'", false, &[3, 4], b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }                                                          \n"),
        ("f8_0d", "'<f8'", false, &[], b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (), }                                                              \n"),
        ("f8_5", "'<f8'", false, &[5], b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }                                                            \n"),
        ("bei4_fortran", "'>i4'", true, &[2, 3, 4], b"\x93NUMPY\x01\x00v\x00{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3, 4), }                                                        \n"),
        ("u1_big", "'|u1'", false, &[1099511627776, 3], b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (1099511627776, 3), }                                              \n"),
        ("structured", "[(('title', 'name'), '<i4', (2, 3)), ('s', [('a', '<M8[ns]'), ('b', '|S5')]), ('u', '<U3'), ('f3', '|V4')]", false, &[7], b"\x93NUMPY\x01\x00\xb6\x00{'descr': [(('title', 'name'), '<i4', (2, 3)), ('s', [('a', '<M8[ns]'), ('b', '|S5')]), ('u', '<U3'), ('f3', '|V4')], 'fortran_order': False, 'shape': (7,), }                       \n"),
        ("v3_alpha", "[('α', '<f4')]", false, &[2], b"\x93NUMPY\x03\x00t\x00\x00\x00{'descr': [('\xce\xb1', '<f4')], 'fortran_order': False, 'shape': (2,), }                                                \n"),
        ("latin1_e", "[('café', '<f4')]", false, &[2], b"\x93NUMPY\x01\x00v\x00{'descr': [('caf\xe9', '<f4')], 'fortran_order': False, 'shape': (2,), }                                                \n"),
        ("quote_name", "[(\"it's\", '<i2'), ('a\\\\b\\'\"\\n\\x85\\xa0', '|u1')]", false, &[1, 1], b"\x93NUMPY\x01\x00\xb6\x00{'descr': [(\"it's\", '<i2'), ('a\\\\b\\'\"\\n\\x85\\xa0', '|u1')], 'fortran_order': False, 'shape': (1, 1), }                                                                                \n"),
        ("empty_struct", "[]", false, &[3], b"\x93NUMPY\x01\x00v\x00{'descr': [], 'fortran_order': False, 'shape': (3,), }                                                               \n"),
        ("obj", "'|O'", false, &[2], b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (2,), }                                                             \n"),
        ("m8", "'<m8[D]'", false, &[4], b"\x93NUMPY\x01\x00v\x00{'descr': '<m8[D]', 'fortran_order': False, 'shape': (4,), }                                                         \n"),
        ("M8generic", "'<M8'", false, &[4], b"\x93NUMPY\x01\x00v\x00{'descr': '<M8', 'fortran_order': False, 'shape': (4,), }                                                            \n"),
        ("pad64", "[('xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', '<f8')]", false, &[1], b"\x93NUMPY\x01\x00\xb6\x00{'descr': [('xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', '<f8')], 'fortran_order': False, 'shape': (1,), }                                                                                    \n"),
    ];

    #[test]
    fn matches_numpy_fixtures() {
        for &(name, descr, fortran_order, shape, bytes) in NUMPY_FIXTURES {
            let written = write_header(descr, fortran_order, shape).unwrap();
            assert_eq!(written, bytes, "{name}: written bytes differ from numpy's");
            let h = parse(bytes).unwrap();
            assert_eq!(h.descr, descr, "{name}");
            assert_eq!(h.fortran_order, fortran_order, "{name}");
            assert_eq!(h.shape, shape, "{name}");
            assert_eq!(h.data_offset, bytes.len() as u64, "{name}");
            assert_eq!(h.data_offset % ALIGNMENT as u64, 0, "{name}");
            let expected_version = if name == "v3_alpha" { (3, 0) } else { (1, 0) };
            assert_eq!(h.version, expected_version, "{name}");
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
        let bytes = write_header("[('caf\u{e9}', '<f4')]", false, &[2]).unwrap();
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

    #[test]
    fn string_literals_follow_python() {
        let cases = [
            (r#"'a\'b'"#, "a'b"),
            (r#""a\"b""#, "a\"b"),
            (
                r"'\x41\u00e9\U0001F600\101\0\t\\'",
                "A\u{e9}\u{1f600}A\0\t\\",
            ),
            (r"'\q\8'", "\\q\\8"),
            ("'line\\\ncontinued'", "linecontinued"),
            ("'ad' \"jacent\" u'ly'", "adjacently"),
            ("'''tri'ple\nquoted'''", "tri'ple\nquoted"),
            ("\"\"", ""),
            ("'\\a\\b\\f\\v\\r\\n'", "\x07\x08\x0c\x0b\r\n"),
        ];
        for (literal, value) in cases {
            assert_eq!(lit_of(literal), s(value), "{literal}");
        }
    }

    #[test]
    fn renders_strings_like_python_repr() {
        // Expected values are Python 3.11's repr().
        let cases = [
            ("a'b", r#""a'b""#),
            ("a\"b", r#"'a"b'"#),
            ("a'\"b", r#"'a\'"b'"#),
            ("tab\t\n\r", r"'tab\t\n\r'"),
            (
                "\x00\x07\x1b\x7f\u{80}\u{9f}\u{a0}\u{ad}\u{e9}\u{ff}",
                "'\\x00\\x07\\x1b\\x7f\\x80\\x9f\\xa0\\xad\u{e9}\u{ff}'",
            ),
            (
                "\u{3b1}\u{2028}\u{200b}\u{e000}\u{1f600}\u{f0000}\u{feff}\u{3000}",
                "'\u{3b1}\\u2028\\u200b\\ue000\u{1f600}\\U000f0000\\ufeff\\u3000'",
            ),
            ("back\\slash", r"'back\\slash'"),
            ("", "''"),
        ];
        for (value, expected) in cases {
            let mut out = String::new();
            render_str(value, &mut out);
            assert_eq!(out, expected);
            assert_eq!(lit_of(&out), s(value), "rendering must parse back");
        }
    }

    #[test]
    fn descr_is_rendered_canonically() {
        let h = parse_text(
            "{'descr': [ (\"x\",\"<i4\") , ((u'T', 'y'), '>f8', (2,3,),), ('z', [('a', '|b1', 4)]) ,], 'fortran_order': False, 'shape': (), }",
        )
        .unwrap();
        assert_eq!(
            h.descr,
            "[('x', '<i4'), (('T', 'y'), '>f8', (2, 3)), ('z', [('a', '|b1', 4)])]"
        );
        assert_eq!(h.shape, Vec::<u64>::new());
        assert_eq!(h.len(), Some(1));
        assert_eq!(h.nbytes(), Some(4 + 48 + 4));
        assert_eq!(
            canonical_descr("  [('a', '<f4', (1,))] ").unwrap(),
            "[('a', '<f4', (1,))]"
        );
    }

    // -- Rejections

    fn assert_err<T: std::fmt::Debug>(
        result: Result<T, NpyError>,
        check: impl Fn(&NpyError) -> bool,
    ) -> NpyError {
        match result {
            Ok(v) => panic!("expected an error, got {v:?}"),
            Err(e) => {
                assert!(check(&e), "unexpected error: {e:?} ({e})");
                e
            }
        }
    }

    fn good_header() -> Vec<u8> {
        write_header("[('a', '<f4'), ('b', '|S3', (2,))]", false, &[3, 4]).unwrap()
    }

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
    fn rejects_header_over_limit_without_allocating() {
        // Version 2.0 declaring a 4 GiB header, with only a few bytes present.
        let mut bytes = b"\x93NUMPY\x02\x00\xff\xff\xff\xff{'descr'".to_vec();
        let (result, largest) = largest_alloc_during(|| parse(&bytes));
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
        let (result, largest) =
            largest_alloc_during(|| read_header(&mut &bytes[..], NUMPY_MAX_HEADER_LEN));
        assert_err(result, |e| matches!(e, NpyError::HeaderTooLong { .. }));
        assert!(largest < 1 << 20, "allocated {largest} bytes");

        // With no limit at all: a length error (truncated), not a 4 GiB buffer.
        let (result, largest) = largest_alloc_during(|| parse_header(&bytes, usize::MAX));
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
        let (result, largest) = largest_alloc_during(|| read_header(&mut &bytes[..], usize::MAX));
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

        // The limit is inclusive and applies to the declared length.
        let header = good_header();
        let declared = header.len() - 10;
        assert!(parse_header(&header, declared).is_ok());
        assert_err(parse_header(&header, declared - 1), |e| {
            matches!(e, NpyError::HeaderTooLong { .. })
        });
        bytes.clear();
    }

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
                matches!(e, NpyError::BadDescr(_))
            });
            assert!(e.to_string().starts_with("bad .npy descr"), "{e}");
        }
        assert_err(write_header("'<f8'", false, &[1 << 32, 1 << 32]), |e| {
            matches!(e, NpyError::ShapeOverflow)
        });
    }

    #[test]
    fn rejects_missing_extra_and_duplicate_keys() {
        type Check = fn(&NpyError) -> bool;
        let cases: [(&str, Check); 7] = [
            ("{'descr': '<f8', 'fortran_order': False}", |e| {
                matches!(e, NpyError::MissingKey("shape"))
            }),
            ("{'shape': (), 'fortran_order': False}", |e| {
                matches!(e, NpyError::MissingKey("descr"))
            }),
            ("{'descr': '<f8', 'shape': ()}", |e| {
                matches!(e, NpyError::MissingKey("fortran_order"))
            }),
            ("{}", |e| matches!(e, NpyError::MissingKey(_))),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (), 'extra': 1}",
                |e| matches!(e, NpyError::UnexpectedKey(k) if k == "'extra'"),
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (), 'descr': '<f4'}",
                |e| matches!(e, NpyError::DuplicateKey("descr")),
            ),
            (
                "{'descr': '<f8', 1: False, 'shape': ()}",
                |e| matches!(e, NpyError::UnexpectedKey(k) if k == "1"),
            ),
        ];
        for (text, check) in cases {
            assert_err(parse_text(text), check);
        }
    }

    #[test]
    fn rejects_bad_values() {
        let with = |descr: &str, order: &str, shape: &str| {
            parse_text(&format!(
                "{{'descr': {descr}, 'fortran_order': {order}, 'shape': {shape}, }}"
            ))
        };
        assert_err(with("'<f8'", "False", "(3, -1)"), |e| {
            matches!(e, NpyError::NegativeShape { axis: 1 })
        });
        assert_err(with("'<f8'", "False", "(-99999999999999999999,)"), |e| {
            matches!(e, NpyError::NegativeShape { axis: 0 })
        });
        assert_err(with("'<f8'", "False", "(4294967296, 4294967296)"), |e| {
            matches!(e, NpyError::ShapeOverflow)
        });
        assert_err(with("'<f8'", "False", "(18446744073709551616,)"), |e| {
            matches!(e, NpyError::ShapeOverflow)
        });
        // numpy refuses this too, although a dimension is 0.
        assert_err(with("'<f8'", "False", "(9223372036854775808, 0, 2)"), |e| {
            matches!(e, NpyError::ShapeOverflow)
        });
        assert_eq!(
            with("'<f8'", "False", "(18446744073709551615,)")
                .unwrap()
                .shape,
            vec![u64::MAX]
        );
        assert_err(with("'<f8'", "False", "3"), |e| {
            matches!(e, NpyError::BadShape(_))
        });
        assert_err(with("'<f8'", "False", "(True,)"), |e| {
            matches!(e, NpyError::BadShape(_))
        });
        assert_err(with("'<f8'", "False", "(3.0,)"), |e| {
            matches!(e, NpyError::Malformed { .. })
        });
        assert_err(with("'<f8'", "False", "(03,)"), |e| {
            matches!(e, NpyError::Malformed { .. })
        });
        assert_err(with("'<f8'", "False", "(0x3,)"), |e| {
            matches!(e, NpyError::Malformed { .. })
        });
        assert_err(
            with("'<f8'", "1", "()"),
            |e| matches!(e, NpyError::BadFortranOrder(v) if v == "1"),
        );
        assert_err(with("'<f8'", "None", "()"), |e| {
            matches!(e, NpyError::Malformed { .. })
        });
        assert_err(with("'<f8'", "Falsey", "()"), |e| {
            matches!(e, NpyError::Malformed { .. })
        });
        assert_err(with("('<f8',)", "False", "()"), |e| {
            matches!(e, NpyError::BadDescr(_))
        });
        assert_err(with("[('a', '<f4', (-1,))]", "False", "()"), |e| {
            matches!(e, NpyError::BadDescr(_))
        });
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
    fn rejects_deep_nesting_without_overflowing_the_stack() {
        let nested = |depth: usize| {
            format!(
                "{{'descr': {}'<f8'{}, 'fortran_order': False, 'shape': (), }}",
                "[('a', ".repeat(depth),
                ")]".repeat(depth)
            )
        };
        // 15 fields deep = 30 levels of brackets: accepted.
        let ok = parse(&raw_header((2, 0), nested(15).as_bytes(), 64)).unwrap();
        assert_eq!(descr_itemsize(&ok.descr), Some(8));
        let e = assert_err(
            parse(&raw_header((2, 0), nested(17).as_bytes(), 64)),
            |e| matches!(e, NpyError::Malformed { reason, .. } if reason.contains("nesting")),
        );
        assert!(e.to_string().contains("deeper than 32"));
        // Hostile: 100k open brackets.
        let text = format!("{{'descr': {}", "[".repeat(100_000));
        let bytes = raw_header((2, 0), text.as_bytes(), 64);
        assert_err(parse_header(&bytes, usize::MAX), |e| {
            matches!(e, NpyError::Malformed { .. })
        });
        assert!(descr_itemsize(&"(".repeat(100_000)).is_none());
        assert_err(write_header(&"[".repeat(100_000), false, &[]), |e| {
            matches!(e, NpyError::BadDescr(_))
        });
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

    // -- Itemsize

    #[test]
    fn itemsize_of_simple_descrs() {
        let cases: &[(&str, Option<u64>)] = &[
            ("'|b1'", Some(1)),
            ("'<i1'", Some(1)),
            ("'<i2'", Some(2)),
            ("'>i4'", Some(4)),
            ("'=i8'", Some(8)),
            ("'|u1'", Some(1)),
            ("'<u2'", Some(2)),
            ("'<u4'", Some(4)),
            ("'<u8'", Some(8)),
            ("'<f2'", Some(2)),
            ("'<f4'", Some(4)),
            ("'>f8'", Some(8)),
            ("'<f12'", Some(12)),
            ("'<f16'", Some(16)),
            ("'<c8'", Some(8)),
            ("'<c16'", Some(16)),
            ("'<c32'", Some(32)),
            ("'<M8'", Some(8)),
            ("'<M8[ns]'", Some(8)),
            ("'>m8[D]'", Some(8)),
            ("'<M8[10s]'", Some(8)),
            ("'<m8[generic]'", Some(8)),
            ("'|S5'", Some(5)),
            ("'|S0'", Some(0)),
            ("'<U5'", Some(20)),
            ("'>U1'", Some(4)),
            ("'|V16'", Some(16)),
            ("'|O'", Some(8)),
            ("'|O8'", Some(8)),
            ("'f8'", Some(8)),
            ("\"<f8\"", Some(8)),
            (" '<f8' ", Some(8)),
            ("[]", Some(0)),
            // Unknown or malformed.
            ("'<f3'", None),
            ("'<i16'", None),
            ("'|b2'", None),
            ("'<M4'", None),
            ("'<M8[parsec]'", None),
            ("'<M8[0s]'", None),
            ("'<M8[ns'", None),
            ("'<U'", None),
            ("'|S+5'", None),
            ("'<x8'", None),
            ("'!f8'", None),
            ("''", None),
            ("'<f8", None),
            ("<f8", None),
            ("3", None),
            ("'<U9999999999999999999'", None),
        ];
        for &(descr, expected) in cases {
            assert_eq!(descr_itemsize(descr), expected, "{descr}");
        }
    }

    #[test]
    fn itemsize_of_structured_descrs() {
        let cases: &[(&str, Option<u64>)] = &[
            ("[('x', '<i4'), ('y', '>f8')]", Some(12)),
            ("[('x', '<i4'), ('y', '>f8', (2, 3))]", Some(52)),
            ("[('x', '<i4', 3)]", Some(12)),
            ("[('x', '<i4', ())]", Some(4)),
            ("[('x', '<i4', (2, 0))]", Some(0)),
            (
                "[(('a title', 'x'), '<i4'), (('t', 'y'), '|S5', (2,))]",
                Some(14),
            ),
            ("[('x', '<i4'), ('', '|V4'), ('y', '<f8')]", Some(16)),
            (
                "[('s', [('a', '<M8[ns]'), ('b', '|S5')], (3,)), ('u', '<U3')]",
                Some(51),
            ),
            ("[('x', '<i4'), ('y', '<f3')]", None),
            ("[('x', '<i4', (-1,))]", None),
            ("[('x', '<u8', (4294967296, 4294967296))]", None),
            ("[('x', '|S18446744073709551615'), ('y', '|u1')]", None),
            ("[('x',)]", None),
            ("[('x', '<i4'),", None),
        ];
        for &(descr, expected) in cases {
            assert_eq!(descr_itemsize(descr), expected, "{descr}");
        }
    }

    #[test]
    fn len_and_nbytes() {
        let header = |descr: &str, shape: &[u64]| NpyHeader {
            version: (1, 0),
            descr: descr.to_owned(),
            fortran_order: false,
            shape: shape.to_vec(),
            data_offset: 128,
        };
        assert_eq!(header("'<f8'", &[]).len(), Some(1));
        assert_eq!(header("'<f8'", &[]).nbytes(), Some(8));
        assert_eq!(header("'<f8'", &[3, 4]).nbytes(), Some(96));
        assert_eq!(header("'<U2'", &[5]).nbytes(), Some(40));
        assert_eq!(header("'<f8'", &[0, 4]).nbytes(), Some(0));
        assert!(header("'<f8'", &[0, 4]).is_empty());
        assert_eq!(header("'<f8'", &[1 << 62]).len(), Some(1 << 62));
        assert_eq!(header("'<f8'", &[1 << 62]).nbytes(), None);
        assert_eq!(header("'<f8'", &[1 << 32, 1 << 32]).len(), None);
        assert_eq!(header("'<q8'", &[3]).nbytes(), None);
    }

    // -- Property tests

    #[derive(Debug, Clone)]
    enum TDescr {
        Simple(&'static str, u64),
        Struct(Vec<TField>),
    }

    #[derive(Debug, Clone)]
    struct TField {
        name: String,
        title: Option<String>,
        descr: TDescr,
        shape: Option<TShape>,
    }

    #[derive(Debug, Clone)]
    enum TShape {
        Int(u64),
        Tuple(Vec<u64>),
    }

    const SIMPLE: &[(&str, u64)] = &[
        ("<f8", 8),
        ("|u1", 1),
        (">i2", 2),
        ("=f4", 4),
        ("<c16", 16),
        ("|b1", 1),
        ("<f16", 16),
        ("<M8[ns]", 8),
        ("<m8", 8),
        ("|S5", 5),
        ("<U3", 12),
        ("|V16", 16),
        ("|O", 8),
    ];

    impl TDescr {
        fn itemsize(&self) -> u64 {
            match self {
                TDescr::Simple(_, size) => *size,
                TDescr::Struct(fields) => fields
                    .iter()
                    .map(|f| {
                        let count = match &f.shape {
                            None => 1,
                            Some(TShape::Int(n)) => *n,
                            Some(TShape::Tuple(dims)) => dims.iter().product(),
                        };
                        f.descr.itemsize() * count
                    })
                    .sum(),
            }
        }

        /// The value the descr text must evaluate to.
        fn lit(&self) -> Lit {
            match self {
                TDescr::Simple(t, _) => s(t),
                TDescr::Struct(fields) => Lit::List(
                    fields
                        .iter()
                        .map(|f| {
                            let mut items = vec![
                                match &f.title {
                                    None => s(&f.name),
                                    Some(t) => Lit::Tuple(vec![s(t), s(&f.name)]),
                                },
                                f.descr.lit(),
                            ];
                            match &f.shape {
                                None => {}
                                Some(TShape::Int(n)) => items.push(int(*n)),
                                Some(TShape::Tuple(dims)) => {
                                    items.push(Lit::Tuple(dims.iter().map(|d| int(*d)).collect()))
                                }
                            }
                            Lit::Tuple(items)
                        })
                        .collect(),
                ),
            }
        }

        /// Non-canonical text: double quotes, every non-alphanumeric
        /// character as a \U escape, extra spaces and trailing commas.
        fn loose_text(&self, out: &mut String) {
            fn quoted(x: &str, out: &mut String) {
                out.push('"');
                for c in x.chars() {
                    if c.is_ascii_alphanumeric() {
                        out.push(c);
                    } else {
                        let _ = write!(out, "\\U{:08x}", u32::from(c));
                    }
                }
                out.push('"');
            }
            match self {
                TDescr::Simple(t, _) => quoted(t, out),
                TDescr::Struct(fields) => {
                    out.push_str("[ ");
                    for f in fields {
                        out.push_str("( ");
                        match &f.title {
                            None => quoted(&f.name, out),
                            Some(t) => {
                                out.push('(');
                                quoted(t, out);
                                out.push(',');
                                quoted(&f.name, out);
                                out.push(')');
                            }
                        }
                        out.push_str(" ,\n");
                        f.descr.loose_text(out);
                        match &f.shape {
                            None => {}
                            Some(TShape::Int(n)) => {
                                let _ = write!(out, ", {n}L");
                            }
                            Some(TShape::Tuple(dims)) => {
                                out.push_str(", (");
                                for d in dims {
                                    let _ = write!(out, "{d} ,");
                                }
                                out.push(')');
                            }
                        }
                        out.push_str(" , ) ,");
                    }
                    out.push(']');
                }
            }
        }
    }

    fn name_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => "[a-z_][a-z0-9_]{0,6}",
            1 => Just(String::new()),
            1 => "[ -~]{0,6}",
            1 => "[\u{80}-\u{ff}'\"\\\\]{1,4}",
            1 => any::<String>(),
        ]
    }

    fn shape_strategy() -> impl Strategy<Value = Option<TShape>> {
        prop_oneof![
            3 => Just(None),
            1 => (0u64..5).prop_map(|n| Some(TShape::Int(n))),
            1 => prop::collection::vec(0u64..4, 0..3).prop_map(|d| Some(TShape::Tuple(d))),
        ]
    }

    fn descr_strategy() -> impl Strategy<Value = TDescr> {
        let leaf = prop::sample::select(SIMPLE).prop_map(|(t, n)| TDescr::Simple(t, n));
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop::collection::vec(
                (
                    name_strategy(),
                    prop::option::weighted(0.2, name_strategy()),
                    inner,
                    shape_strategy(),
                )
                    .prop_map(|(name, title, descr, shape)| TField {
                        name,
                        title,
                        descr,
                        shape,
                    }),
                0..4,
            )
            .prop_map(TDescr::Struct)
        })
    }

    fn array_shape_strategy() -> impl Strategy<Value = Vec<u64>> {
        prop_oneof![
            4 => prop::collection::vec(0u64..2000, 0..5),
            1 => any::<u64>().prop_map(|d| vec![d]),
            1 => (0u64..=u64::from(u32::MAX), 0u64..=u64::from(u32::MAX)).prop_map(|(a, b)| vec![a, b]),
        ]
    }

    /// Writes with numpy's limit, or with no limit when the header is too
    /// long for it.
    fn write_any(descr: &str, fortran_order: bool, shape: &[u64]) -> Vec<u8> {
        match write_header(descr, fortran_order, shape) {
            Ok(bytes) => bytes,
            Err(NpyError::HeaderTooLong { len, .. }) => {
                assert!(len > NUMPY_MAX_HEADER_LEN as u64);
                build_header(descr, fortran_order, shape, usize::MAX).unwrap()
            }
            Err(e) => panic!("write failed: {e}"),
        }
    }

    /// What the fuzz target checks: a header that parses is rewritten to a
    /// header that parses to the same fields.
    fn check_rewrite(h: &NpyHeader) {
        let bytes = write_any(&h.descr, h.fortran_order, &h.shape);
        let again = parse_header(&bytes, usize::MAX).unwrap();
        assert_eq!(again.descr, h.descr);
        assert_eq!(again.fortran_order, h.fortran_order);
        assert_eq!(again.shape, h.shape);
        assert_eq!(again.data_offset, bytes.len() as u64);
        assert_eq!(descr_itemsize(&again.descr), descr_itemsize(&h.descr));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn round_trip(
            descr in descr_strategy(),
            fortran_order in any::<bool>(),
            shape in array_shape_strategy(),
        ) {
            let mut text = String::new();
            descr.loose_text(&mut text);
            let bytes = write_any(&text, fortran_order, &shape);
            prop_assert_eq!(bytes.len() % ALIGNMENT, 0);

            let h = parse_header(&bytes, usize::MAX).unwrap();
            prop_assert_eq!(parse_descr_literal(&h.descr).unwrap(), descr.lit());
            prop_assert_eq!(h.fortran_order, fortran_order);
            prop_assert_eq!(&h.shape, &shape);
            prop_assert_eq!(h.data_offset, bytes.len() as u64);
            prop_assert_eq!(h.len(), Some(shape.iter().product::<u64>()));
            prop_assert_eq!(descr_itemsize(&h.descr), Some(descr.itemsize()));
            let latin1 = h.descr.chars().all(|c| u32::from(c) <= 0xff);
            let expected_version = match (latin1, bytes.len() <= 65_535 + 10) {
                (true, true) => (1, 0),
                (true, false) => (2, 0),
                (false, _) => (3, 0),
            };
            prop_assert_eq!(h.version, expected_version);

            // The canonical text is a fixed point and rewrites to the same bytes.
            prop_assert_eq!(canonical_descr(&h.descr).unwrap(), h.descr.clone());
            prop_assert_eq!(write_any(&h.descr, fortran_order, &shape), bytes.clone());

            // The reader agrees with the slice parser, and data after the header is ignored.
            let mut file = bytes.clone();
            file.extend_from_slice(b"\x00\x01\x02");
            prop_assert_eq!(&parse_header(&file, usize::MAX).unwrap(), &h);
            prop_assert_eq!(&read_header(&mut &file[..], usize::MAX).unwrap(), &h);
        }

        #[test]
        fn arbitrary_header_text_never_panics(
            version in prop::sample::select(&[(1u8, 0u8), (2, 0), (3, 0)][..]),
            text in prop::collection::vec(any::<u8>(), 0..200),
        ) {
            let bytes = raw_header(version, &text, 64);
            if let Ok(h) = parse(&bytes) {
                check_rewrite(&h);
            }
        }

        #[test]
        fn mutated_headers_never_panic(
            descr in descr_strategy(),
            shape in array_shape_strategy(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
        ) {
            let mut text = String::new();
            descr.loose_text(&mut text);
            let mut bytes = write_any(&text, false, &shape);
            for (index, byte, op) in edits {
                if bytes.is_empty() {
                    break;
                }
                let i = index.index(bytes.len());
                match op {
                    0 => bytes[i] = byte,
                    1 => { bytes.remove(i); }
                    _ => bytes.insert(i, byte),
                }
            }
            let parsed = parse_header(&bytes, usize::MAX);
            let read = read_header(&mut &bytes[..], usize::MAX);
            match (&parsed, &read) {
                (Ok(a), Ok(b)) => {
                    prop_assert_eq!(a, b);
                    check_rewrite(a);
                }
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                _ => prop_assert!(false, "parse and read disagree: {:?} vs {:?}", parsed, read),
            }
            let _ = descr_itemsize(&String::from_utf8_lossy(&bytes));
        }
    }
}
