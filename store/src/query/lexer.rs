//! The lexer: query source to tokens, each with its column (1-based, in
//! characters) and byte range. Numbers and strings are decoded here (integers
//! that fit in u64 stay exact; string escapes follow JSON and Python), and so
//! are the errors for C-style operators (`&&`, `!`, `=`) and malformed
//! literals.

use super::ast::CmpOp;
use super::error::QueryError;

/// The words that cannot start a path: they are operators or literals.
/// After a dot they are plain field names (`p.and`).
pub(super) const KEYWORDS: &[&str] = &[
    "and", "or", "not", "in", "true", "false", "null", "True", "False", "None",
];

/// A token's kind, with the decoded value of a literal or a name.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    /// An integer literal that fits in u64.
    Int(u64),
    /// An integer literal too large for u64, kept as a float (as JSON parsers do).
    BigInt(f64),
    Float(f64),
    Str(String),
    /// `== != < <= > >=` (`in` and `not` are words).
    Cmp(CmpOp),
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Dot,
    Minus,
    End,
}

/// A token and where it stands in the source.
#[derive(Debug, Clone)]
pub(super) struct Token {
    pub(super) tok: Tok,
    /// 1-based column in characters.
    pub(super) col: usize,
    /// Byte range in the source.
    pub(super) start: usize,
    pub(super) end: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Reads tokens one at a time off a query source.
pub(super) struct Lexer<'s> {
    pub(super) src: &'s str,
    pos: usize,
    col: usize,
}

impl<'s> Lexer<'s> {
    pub(super) fn new(src: &'s str) -> Self {
        Lexer {
            src,
            pos: 0,
            col: 1,
        }
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek2(&self) -> Option<char> {
        self.src[self.pos..].chars().nth(1)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        self.col += 1;
        Some(c)
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn error(&self, col: usize, message: impl Into<String>) -> QueryError {
        QueryError::new(col, message, self.src)
    }

    /// The next token; [`Tok::End`] (again and again) at the end of the source.
    pub(super) fn next_token(&mut self) -> Result<Token, QueryError> {
        while self.peek().is_some_and(char::is_whitespace) {
            self.bump();
        }
        let start = self.pos;
        let col = self.col;
        let Some(c) = self.bump() else {
            return Ok(Token {
                tok: Tok::End,
                col,
                start,
                end: start,
            });
        };
        let tok = match c {
            '(' => Tok::LParen,
            ')' => Tok::RParen,
            '[' => Tok::LBracket,
            ']' => Tok::RBracket,
            ',' => Tok::Comma,
            '.' => Tok::Dot,
            '-' => Tok::Minus,
            '=' if self.eat('=') => Tok::Cmp(CmpOp::Eq),
            '=' => return Err(self.error(col, "'=' is not an operator; use '==' to test equality")),
            '!' if self.eat('=') => Tok::Cmp(CmpOp::Ne),
            '!' => {
                return Err(self.error(col, "'!' is not supported; use 'not' to negate a condition"))
            }
            '<' if self.eat('=') => Tok::Cmp(CmpOp::Le),
            '<' if self.peek() == Some('>') => {
                return Err(self.error(col, "'<>' is not supported; use '!='"))
            }
            '<' => Tok::Cmp(CmpOp::Lt),
            '>' if self.eat('=') => Tok::Cmp(CmpOp::Ge),
            '>' => Tok::Cmp(CmpOp::Gt),
            '&' | '|' => {
                let op = if self.peek() == Some(c) {
                    format!("{c}{c}")
                } else {
                    c.to_string()
                };
                let word = if c == '&' { "and" } else { "or" };
                return Err(self.error(col, format!("'{op}' is not supported; use '{word}'")));
            }
            '\'' | '"' => self.string(c, col)?,
            c if c.is_ascii_digit() => self.number(start, col)?,
            c if is_ident_start(c) => {
                while self.peek().is_some_and(is_ident_continue) {
                    self.bump();
                }
                Tok::Ident(self.src[start..self.pos].to_owned())
            }
            other => return Err(self.error(col, format!("unexpected character {other:?}"))),
        };
        Ok(Token {
            tok,
            col,
            start,
            end: self.pos,
        })
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.bump();
        }
    }

    /// A number literal whose first digit was consumed.
    fn number(&mut self, start: usize, col: usize) -> Result<Tok, QueryError> {
        self.digits();
        let mut float = false;
        if self.peek() == Some('.') {
            match self.peek2() {
                Some(d) if d.is_ascii_digit() => {
                    self.bump();
                    self.digits();
                    float = true;
                }
                // `1.x` or `1..`: leave the dot to the parser.
                Some(d) if is_ident_continue(d) || d == '.' => {}
                // `1.` is a float, as in Python.
                _ => {
                    self.bump();
                    float = true;
                }
            }
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            let mut ahead = self.src[self.pos..].chars().skip(1);
            let exponent = match ahead.next() {
                Some(d) if d.is_ascii_digit() => true,
                Some('+' | '-') => ahead.next().is_some_and(|d| d.is_ascii_digit()),
                _ => false,
            };
            if exponent {
                self.bump();
                if matches!(self.peek(), Some('+' | '-')) {
                    self.bump();
                }
                self.digits();
                float = true;
            }
        }
        if self.peek().is_some_and(is_ident_continue) {
            let number_end = self.pos;
            while self.peek().is_some_and(is_ident_continue) {
                self.bump();
            }
            let text = &self.src[start..self.pos];
            let rest = &self.src[number_end..self.pos];
            let hint = if KEYWORDS.contains(&rest) {
                format!(": add a space before '{rest}'")
            } else {
                String::new()
            };
            return Err(self.error(col, format!("invalid number '{}'{hint}", shorten(text))));
        }
        let text = &self.src[start..self.pos];
        if !float {
            if let Ok(n) = text.parse::<u64>() {
                return Ok(Tok::Int(n));
            }
        }
        let value: f64 = text
            .parse()
            .map_err(|_| self.error(col, format!("invalid number '{}'", shorten(text))))?;
        if !value.is_finite() {
            return Err(self.error(col, format!("number '{}' is out of range", shorten(text))));
        }
        Ok(if float {
            Tok::Float(value)
        } else {
            Tok::BigInt(value)
        })
    }

    /// A string literal whose opening quote (at `col`) was consumed.
    fn string(&mut self, quote: char, col: usize) -> Result<Tok, QueryError> {
        let mut out = String::new();
        loop {
            let Some(c) = self.bump() else {
                return Err(self.error(col, "unterminated string"));
            };
            if c == quote {
                return Ok(Tok::Str(out));
            }
            if c != '\\' {
                out.push(c);
                continue;
            }
            let esc_col = self.col - 1;
            let Some(e) = self.bump() else {
                return Err(self.error(col, "unterminated string"));
            };
            let ch = match e {
                '\\' => '\\',
                '\'' => '\'',
                '"' => '"',
                '/' => '/',
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                '0' => '\0',
                'b' => '\u{8}',
                'f' => '\u{c}',
                'u' => self.unicode_escape(esc_col, col)?,
                'U' => {
                    let code = self.hex_digits(8, 'U', esc_col, col)?;
                    char::from_u32(code).ok_or_else(|| {
                        self.error(
                            esc_col,
                            format!("invalid code point \\U{code:08X} in string"),
                        )
                    })?
                }
                other => {
                    return Err(self.error(
                        esc_col,
                        format!(
                            "unknown escape '\\{other}' in string; \
                             write '\\\\' for a backslash"
                        ),
                    ))
                }
            };
            out.push(ch);
        }
    }

    fn hex_digits(
        &mut self,
        count: usize,
        letter: char,
        esc_col: usize,
        str_col: usize,
    ) -> Result<u32, QueryError> {
        let mut code = 0u32;
        for _ in 0..count {
            let Some(c) = self.peek() else {
                return Err(self.error(str_col, "unterminated string"));
            };
            let Some(d) = c.to_digit(16) else {
                return Err(self.error(
                    esc_col,
                    format!("invalid escape: \\{letter} needs {count} hex digits"),
                ));
            };
            self.bump();
            code = code * 16 + d;
        }
        Ok(code)
    }

    /// `\uXXXX`, with a surrogate pair `\uD83D\uDE00` read as one character.
    fn unicode_escape(&mut self, esc_col: usize, str_col: usize) -> Result<char, QueryError> {
        let unpaired = |lexer: &Self| {
            lexer.error(
                esc_col,
                "invalid escape: unpaired UTF-16 surrogate in string",
            )
        };
        let high = self.hex_digits(4, 'u', esc_col, str_col)?;
        let code = match high {
            0xD800..=0xDBFF => {
                if !(self.peek() == Some('\\') && self.peek2() == Some('u')) {
                    return Err(unpaired(self));
                }
                self.bump();
                self.bump();
                let low = self.hex_digits(4, 'u', esc_col, str_col)?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(unpaired(self));
                }
                0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(unpaired(self)),
            _ => high,
        };
        char::from_u32(code).ok_or_else(|| unpaired(self))
    }
}

/// At most 40 characters of `s`, for messages.
pub(super) fn shorten(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(MAX).collect();
        out.push_str("...");
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::query::test_support::*;
    use serde_json::json;

    #[test]
    fn number_literals() {
        let rec = TestRecord::new(json!({"count": 7, "t": 300.0, "lr": 0.001, "neg": -5, "z": 0}));
        expect_all(
            &rec,
            true,
            &[
                "count == 7",
                "count == 7.0",
                "count == 7.",
                "count == 7e0",
                "count == 70E-1",
                "count < 7.5",
                "count > -1",
                "t == 300",
                "t == 3e2",
                "t == 3.0E+2",
                "lr == 1e-3",
                "lr == 0.001",
                "neg == -5",
                "neg == - 5",
                "neg < -4.5",
                "neg == -5.0",
                "z == -0",
                "z == -0.0",
                "z == 0.0",
            ],
        );
        expect_all(
            &rec,
            false,
            &["count == 7.000001", "neg == 5", "lr == 1e-4"],
        );
    }

    #[test]
    fn string_literals_and_escapes() {
        let rec =
            TestRecord::new(json!({"s": "it's \"q\"\n\t\\ é 😀", "e": "", "nul": "a\u{0}b/"}));
        expect_all(
            &rec,
            true,
            &[
                r#"s == 'it\'s "q"\n\t\\ é 😀'"#,
                r#"s == "it's \"q\"\n\t\\ \u00e9 \ud83d\ude00""#,
                r#"s == 'it\'s \"q\"\n\t\\ \u00E9 \U0001F600'"#,
                "e == ''",
                "e == \"\"",
                r"nul == 'a\0b\/'",
            ],
        );
        expect_all(&rec, false, &["s == 'it'", "e == ' '"]);
    }

    #[test]
    fn error_c_style_operators_suggest_keywords() {
        assert_err("a == 1 && b == 2", 8, "use 'and'");
        assert_err("a == 1 & b == 2", 8, "use 'and'");
        assert_err("a == 1 || b == 2", 8, "use 'or'");
        assert_err("a == 1 | b == 2", 8, "use 'or'");
        assert_err("!a == 1", 1, "use 'not'");
        assert_err("!(a == 1)", 1, "use 'not'");
        assert_err("a = 1", 3, "use '=='");
        assert_err("a == 1 or b = 2", 13, "use '=='");
    }

    #[test]
    fn error_unterminated_string_and_bad_escapes() {
        assert_err("material == 'Si", 13, "unterminated string");
        assert_err("material == \"Si", 13, "unterminated string");
        assert_err("material == 'Si\"", 13, "unterminated string");
        assert_err("s == 'abc\\", 6, "unterminated string");
        assert_err("s == '\\u12", 6, "unterminated string");
        assert_err("s == 'a\\qb'", 8, "unknown escape '\\q'");
        assert_err("s == '\\u12g4'", 7, "needs 4 hex digits");
        assert_err("s == '\\U0011FFFF'", 7, "invalid code point");
        assert_err("s == '\\ud800'", 7, "unpaired");
        assert_err("s == '\\ud800\\u0041'", 7, "unpaired");
        assert_err("s == '\\udc00'", 7, "unpaired");
    }

    #[test]
    fn error_bad_numbers() {
        assert_err("x == 12abc", 6, "invalid number '12abc'");
        assert_err("x == 1_000", 6, "invalid number '1_000'");
        assert_err("x == 1e999", 6, "out of range");
        assert_err("x == 1else", 6, "invalid number");
        assert_err("x == 1.e5", 7, "unexpected token '.'");
        assert_err(
            "count==7and material=='Si'",
            8,
            "invalid number '7and': add a space before 'and'",
        );
    }

    #[test]
    fn error_columns_count_characters_not_bytes() {
        assert_err("温度 >> 3", 5, "unexpected token '>'");
        assert_err("s == '😀😀' )", 11, "unmatched ')'");
        assert_err("名 == \"abc", 6, "unterminated string");
        assert_err("ünïcode == 'é' && x == 1", 16, "use 'and'");
        assert_err("'é' == 'ü' ü", 12, "unexpected token 'ü'");
        assert_err("x == 'ab\\qc' ", 9, "unknown escape");
        assert_err("x == 'é\\qc' ", 8, "unknown escape");
    }

    #[test]
    fn whitespace_is_free() {
        let rec = sample();
        expect_all(
            &rec,
            true,
            &[
                "count==7",
                "count==7 and(material=='Si')",
                "  count\t==\n7  ",
                "(count==7)or(material=='x')",
                "tags [ 0 ] == 'a'",
                "params . lr == 0.001",
                "material . startswith ( 'S' )",
                "not(count==8)",
            ],
        );
    }
}
