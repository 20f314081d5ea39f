//! The subset of Python literals that `.npy` headers use: strings, integers,
//! `True`/`False`, tuples, lists and (at the top) one dict. [`Parser`] reads
//! them as `ast.literal_eval` would, without `eval`; [`render`] writes them
//! back as `repr()` does.
//!
//! The parser is a small hand-written recursive descent (no regex), bounded
//! in nesting depth ([`MAX_DEPTH`]), that never panics and never allocates
//! from a length it has not checked.

use std::fmt::Write as _;

use super::NpyError;

/// Maximum nesting of tuples/lists accepted in a header, to bound recursion.
pub(super) const MAX_DEPTH: usize = 32;

/// Longest rendering of a value quoted in an error message, in characters.
const SNIPPET_CHARS: usize = 60;

/// A parsed Python literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Lit {
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

// ---------------------------------------------------------------------------
// Rendering, as Python's repr()

/// Renders a literal as Python's `repr()` does.
pub(super) fn render(lit: &Lit, out: &mut String) {
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
        Lit::Tuple(items) => render_seq(out, items, true, render),
        Lit::List(items) => render_seq(out, items, false, render),
    }
}

/// Renders a tuple (`tuple`) or a list of `items` as `repr()` does: items
/// separated by `", "`, a 1-tuple with its trailing comma.
pub(super) fn render_seq<T>(
    out: &mut String,
    items: &[T],
    tuple: bool,
    mut item: impl FnMut(&T, &mut String),
) {
    out.push(if tuple { '(' } else { '[' });
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        item(x, out);
    }
    if tuple && items.len() == 1 {
        out.push(',');
    }
    out.push(if tuple { ')' } else { ']' });
}

/// Renders a string as Python's `repr()` does: single quotes unless the
/// string contains a single quote and no double quote; backslash, the quote,
/// `\n`, `\r`, `\t` escaped; other non-printable characters as `\xhh`,
/// `\uhhhh` or `\Uhhhhhhhh`.
pub(super) fn render_str(s: &str, out: &mut String) {
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
pub(super) fn snippet(lit: &Lit) -> String {
    let mut s = String::new();
    render(lit, &mut s);
    shorten(s)
}

fn shorten(s: String) -> String {
    match s.char_indices().nth(SNIPPET_CHARS) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s,
    }
}

// ---------------------------------------------------------------------------
// Parsing

/// One `key: value` entry of a dict literal, with where each starts.
pub(super) struct Entry {
    pub(super) key: Lit,
    /// Offset of the key, relative to the parser's base.
    pub(super) key_offset: u64,
    pub(super) value: Lit,
    /// Offset of the value, relative to the parser's base.
    pub(super) value_offset: u64,
}

/// Recursive-descent parser for Python literals over header bytes.
///
/// Structural characters are all ASCII; non-ASCII bytes only occur inside
/// strings, where they are decoded as latin-1 (one byte, one character) or,
/// in UTF-8 mode, as the UTF-8 character starting there (the text was
/// validated up front, and the position only ever advances by whole
/// characters). Positions are byte offsets, reported relative to `base`.
pub(super) struct Parser<'a> {
    bytes: &'a [u8],
    /// The same bytes as a `str` in UTF-8 mode; `None` for latin-1.
    text: Option<&'a str>,
    pos: usize,
    base: u64,
    depth: usize,
}

impl<'a> Parser<'a> {
    /// A parser over latin-1 text (versions 1.0 and 2.0) that starts at
    /// byte `base` of the file.
    pub(super) fn latin1(bytes: &'a [u8], base: u64) -> Self {
        Parser {
            bytes,
            text: None,
            pos: 0,
            base,
            depth: 0,
        }
    }

    /// A parser over UTF-8 text (version 3.0, or a descr given to the
    /// writer) that starts at byte `base`.
    pub(super) fn utf8(text: &'a str, base: u64) -> Self {
        Parser {
            bytes: text.as_bytes(),
            text: Some(text),
            pos: 0,
            base,
            depth: 0,
        }
    }

    pub(super) fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn peek_at(&self, ahead: usize) -> Option<u8> {
        self.bytes.get(self.pos.checked_add(ahead)?).copied()
    }

    /// The offset of the current position, relative to the base.
    fn offset(&self) -> u64 {
        self.base.saturating_add(self.pos as u64)
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

    /// "expected `what`, found" the character at the current position.
    pub(super) fn expected(&self, what: &str) -> NpyError {
        let found = match self.current_char() {
            Some((c, _)) => format!("{c:?}"),
            None => "the end of the text".to_owned(),
        };
        self.error(format!("expected {what}, found {found}"))
    }

    /// Skips Python whitespace (inside brackets newlines are whitespace too)
    /// and `#` comments.
    pub(super) fn skip_ws(&mut self) {
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

    /// Skips whitespace and fails with "expected `what`" unless the text
    /// ends there.
    pub(super) fn finish(&mut self, what: &str) -> Result<(), NpyError> {
        self.skip_ws();
        if self.pos < self.bytes.len() {
            return Err(self.expected(what));
        }
        Ok(())
    }

    /// Any supported literal; the current position is not whitespace.
    pub(super) fn value(&mut self) -> Result<Lit, NpyError> {
        if self.at_string() {
            return self.string();
        }
        match self.peek() {
            Some(b'(') => self.sequence(b')'),
            Some(b'[') => self.sequence(b']'),
            Some(b'0'..=b'9' | b'+' | b'-') => self.integer(),
            Some(b) if b.is_ascii_alphabetic() || b == b'_' => self.name(),
            _ => Err(self.expected("a value")),
        }
    }

    /// A dict literal; the current position is at its `{`. Calls `entry`
    /// with each entry in order, so that the caller can refuse a key or a
    /// value before the rest is read.
    pub(super) fn dict(
        &mut self,
        mut entry: impl FnMut(Entry) -> Result<(), NpyError>,
    ) -> Result<(), NpyError> {
        self.pos += 1;
        self.delimited(b'}', |p| {
            let key_offset = p.offset();
            let key = p.value()?;
            p.skip_ws();
            if p.peek() != Some(b':') {
                return Err(p.expected("':' after a dict key"));
            }
            p.pos += 1;
            p.skip_ws();
            let value_offset = p.offset();
            let value = p.value()?;
            entry(Entry {
                key,
                key_offset,
                value,
                value_offset,
            })
        })?;
        Ok(())
    }

    /// A tuple (`close` = `)`) or a list (`close` = `]`); the current
    /// position is at the opening bracket. A parenthesised single value
    /// without a comma is that value, as in Python.
    fn sequence(&mut self, close: u8) -> Result<Lit, NpyError> {
        if self.depth >= MAX_DEPTH {
            return Err(self.error(format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        self.depth += 1;
        self.pos += 1;
        let mut items = Vec::new();
        let comma = self.delimited(close, |p| {
            items.push(p.value()?);
            Ok(())
        })?;
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

    /// Comma-separated `item`s up to and including `close`, a trailing
    /// comma allowed (the opening bracket already read). Returns whether
    /// any comma was seen, which tells `(x)` from `(x,)`.
    fn delimited(
        &mut self,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Result<(), NpyError>,
    ) -> Result<bool, NpyError> {
        let mut comma = false;
        loop {
            self.skip_ws();
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok(comma);
            }
            item(self)?;
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    comma = true;
                }
                Some(b) if b == close => {
                    self.pos += 1;
                    return Ok(comma);
                }
                _ => return Err(self.expected(&format!("',' or '{}'", char::from(close)))),
            }
        }
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

    /// Whether a string literal starts here: a quote, or `u`/`U` and a quote.
    fn at_string(&self) -> bool {
        match self.peek() {
            Some(b'\'' | b'"') => true,
            Some(b'u' | b'U') => matches!(self.peek_at(1), Some(b'\'' | b'"')),
            _ => false,
        }
    }

    /// Whether `quote` starts here three times over (a triple quote).
    fn at_triple(&self, quote: u8) -> bool {
        (0..3).all(|i| self.peek_at(i) == Some(quote))
    }

    /// Steps over a line break: `\n`, `\r\n` or a lone `\r` (Python reads
    /// all three in source as one `\n`).
    fn skip_line_break(&mut self) {
        if self.peek() == Some(b'\r') {
            self.pos += 1;
        }
        if self.peek() == Some(b'\n') {
            self.pos += 1;
        }
    }

    /// One or more adjacent string literals (concatenated, as in Python).
    fn string(&mut self) -> Result<Lit, NpyError> {
        let mut out = String::new();
        loop {
            self.one_string(&mut out)?;
            let end = self.pos;
            self.skip_ws();
            if !self.at_string() {
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
        let triple = self.at_triple(quote);
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
                    if self.at_triple(quote) {
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
                // Only a line break in a triple-quoted string stops a run at once.
                b'\n' | b'\r' => {
                    self.skip_line_break();
                    out.push('\n');
                }
                0 => return Err(self.error("NUL character in a string")),
                _ => self.plain_run(quote, out)?,
            }
        }
    }

    /// Copies a run of plain string characters at once. The run ends before
    /// an ASCII byte, so on a UTF-8 character boundary.
    fn plain_run(&mut self, quote: u8, out: &mut String) -> Result<(), NpyError> {
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
        Ok(())
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
            b'\n' | b'\r' => self.skip_line_break(),
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
            b'x' | b'u' | b'U' => out.push(self.hex_escape(start, b)?),
            b'N' => return Err(self.error_at(start, "\\N{...} escapes are not supported")),
            // Unknown escape: Python keeps the backslash; the next character
            // is read normally by the caller.
            _ => out.push('\\'),
        }
        Ok(())
    }

    /// The character of a `\xhh`, `\uhhhh` or `\Uhhhhhhhh` escape (`kind` is
    /// `x`, `u` or `U`, at the current position); `start` is the backslash.
    fn hex_escape(&mut self, start: usize, kind: u8) -> Result<char, NpyError> {
        let digits = match kind {
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
                            char::from(kind)
                        ),
                    )
                })?;
            value = (value << 4) | digit;
            self.pos += 1;
        }
        char::from_u32(value).ok_or_else(|| {
            self.error_at(
                start,
                format!(
                    "escape \\{}{value:x} is not a valid character",
                    char::from(kind)
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_err, lit_of, parse, raw_header, s};
    use super::super::{descr_itemsize, parse_header, write_header};
    use super::*;

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
            matches!(e, NpyError::BadDescr { .. })
        });
    }
}
