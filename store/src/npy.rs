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
    #[error(".npy header dict has an unexpected key {0} (allowed: 'descr', 'fortran_order', 'shape')")]
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
/// `max_header_len` caps the declared length of the header text; it is checked
/// before anything is sliced or allocated from it. Returns
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
    r.by_ref()
        .take(header_len as u64)
        .read_to_end(&mut text)?;
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
    if let Some(inner) = descr
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
    {
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
        Some(Lit::Tuple(pair))
            if matches!(pair.as_slice(), [Lit::Str(_), Lit::Str(_)]) => {}
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
                _ => {
                    let Some((c, len)) = self.current_char() else {
                        return Err(self.error("invalid character in a string"));
                    };
                    out.push(c);
                    self.pos += len;
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
                        format!("escape \\{}{value:x} is not a valid character", char::from(b)),
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
