//! The query language of `find`, `count` and `keys`.
//!
//! A query such as `temperature > 250 and material == 'Si'` is parsed once into a
//! [`Query`] and then evaluated against any number of records through the
//! [`RecordView`] trait. Evaluation reads the record's key, its JSON metadata and the
//! facts the index keeps about its array payloads (shape, dtype, ...); it never opens
//! a payload. Evaluation never fails and never panics: a missing field or a type
//! mismatch simply does not match. Parsing reports a [`QueryError`] that points at the
//! offending column.
//!
//! The grammar and the semantics, written for users, are in `store/QUERY.md`.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

/// Longest accepted query source, in bytes.
pub const MAX_QUERY_BYTES: usize = 64 * 1024;

/// Deepest accepted nesting of parentheses, `not`, list literals and call arguments.
pub const MAX_NESTING: usize = 64;

/// Facts about one array payload of a record, available to queries without touching
/// the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayFacts<'a> {
    /// Dimensions, outermost first; empty for a 0-d array.
    pub shape: &'a [u64],
    /// numpy's name of the dtype, e.g. `"float64"`, `"uint8"`.
    pub dtype: &'a str,
    /// numpy's `descr` of the dtype as stored in the `.npy` header, e.g. `"'<f8'"`.
    pub descr: &'a str,
    /// Size of the data in bytes.
    pub nbytes: u64,
}

/// What a query can see of a record. Implemented by the store for its decoded records.
pub trait RecordView {
    /// The record's key.
    fn key(&self) -> &str;
    /// The record's JSON metadata.
    fn meta(&self) -> &Map<String, Value>;
    /// Array by its path name: top-level `"image"`, nested `"params/w"`, `"frames/0"`.
    fn array(&self, name: &str) -> Option<ArrayFacts<'_>>;
}

/// A query that could not be parsed.
///
/// `column` is the 1-based column, counted in characters (not bytes), of the offending
/// token; one past the last character when the expression ended too early. `Display`
/// shows the message, the expression and a caret under the column:
///
/// ```text
/// unexpected token '>'; expected a value ... at column 14
///   temperature >> 3
///                ^
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct QueryError {
    /// 1-based column, in characters, of the offending token.
    pub column: usize,
    /// What is wrong, without the position.
    pub message: String,
    /// The whole query source.
    pub expression: String,
}

impl QueryError {
    /// A new error at `column` (1-based, in characters) of `expression`.
    pub fn new(column: usize, message: impl Into<String>, expression: impl Into<String>) -> Self {
        QueryError {
            column,
            message: message.into(),
            expression: expression.into(),
        }
    }
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Characters shown around the column when the expression is long.
        const HALF: usize = 60;
        write!(f, "{} at column {}", self.message, self.column)?;
        // One displayed character per source character, so the caret lines up.
        let shown: Vec<char> = self
            .expression
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let at = self.column.saturating_sub(1).min(shown.len());
        let (start, end) = if shown.len() <= 2 * HALF {
            (0, shown.len())
        } else {
            let start = at.saturating_sub(HALF).min(shown.len() - 2 * HALF);
            (start, start + 2 * HALF)
        };
        let lead = if start > 0 { "..." } else { "" };
        let tail = if end < shown.len() { "..." } else { "" };
        let text: String = shown[start..end].iter().collect();
        let pad = " ".repeat(lead.len() + at - start);
        write!(f, "\n  {lead}{text}{tail}\n  {pad}^")
    }
}

/// A parsed query: parse once, evaluate many times.
///
/// ```ignore
/// let q: Query = "temperature > 250 and material == 'Si'".parse()?;
/// let hits = records.iter().filter(|r| q.matches(*r));
/// ```
#[derive(Debug, Clone)]
pub struct Query {
    source: String,
    root: Node,
}

impl Query {
    /// Parses `source`. Fails with a [`QueryError`] pointing at the offending column.
    pub fn parse(source: &str) -> Result<Query, QueryError> {
        let root = parse_query(source)?;
        Ok(Query {
            source: source.to_owned(),
            root,
        })
    }

    /// Whether `record` matches. Never fails and never panics; allocates only to
    /// compare lists or objects structurally.
    pub fn matches<R: RecordView + ?Sized>(&self, record: &R) -> bool {
        eval(&self.root, record)
    }

    /// The source the query was parsed from.
    pub fn source(&self) -> &str {
        &self.source
    }
}

impl FromStr for Query {
    type Err = QueryError;

    fn from_str(source: &str) -> Result<Query, QueryError> {
        Query::parse(source)
    }
}

impl fmt::Display for Query {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

// ---------------------------------------------------------------------------
// Syntax tree
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Or(Vec<Node>),
    And(Vec<Node>),
    Not(Box<Node>),
    Compare {
        lhs: Operand,
        op: CmpOp,
        rhs: Operand,
    },
    Exists(PathExpr),
    Method {
        target: PathExpr,
        method: Method,
        arg: Operand,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Operand {
    Literal(Value),
    Path(PathExpr),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    NotIn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    StartsWith,
    EndsWith,
    Contains,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Root {
    /// `key`: the record's key.
    Key,
    /// `meta.<path>`: explicitly a metadata field, never an array fact.
    Meta,
    /// A plain path: a metadata field, else an array fact.
    Field,
}

#[derive(Debug, Clone, PartialEq)]
enum Seg {
    Field(String),
    Index(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FactKind {
    Shape,
    Dtype,
    Ndim,
    Nbytes,
    Size,
}

/// How a plain path reads as an array fact: `<array>.<fact>` or `<array>.shape[i]`.
#[derive(Debug, Clone, PartialEq)]
struct FactRef {
    array: String,
    kind: FactKind,
    index: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
struct PathExpr {
    root: Root,
    /// Segments below the root; for `Root::Field` the first is the field name.
    segs: Vec<Seg>,
    /// The whole path as an array name (for `exists`), when it can be one.
    array: Option<String>,
    /// The path as an array fact, when it can be one.
    fact: Option<FactRef>,
}

impl PathExpr {
    fn new(root: Root, segs: Vec<Seg>) -> PathExpr {
        let (array, fact) = if root == Root::Field {
            (array_name(&segs), fact_ref(&segs))
        } else {
            (None, None)
        };
        PathExpr {
            root,
            segs,
            array,
            fact,
        }
    }
}

/// Array name of a path: fields and non-negative indexes joined by `/`.
fn array_name(segs: &[Seg]) -> Option<String> {
    let mut name = String::new();
    for (i, seg) in segs.iter().enumerate() {
        if i > 0 {
            name.push('/');
        }
        match seg {
            Seg::Field(f) => name.push_str(f),
            Seg::Index(n) if *n >= 0 => name.push_str(&n.to_string()),
            Seg::Index(_) => return None,
        }
    }
    (!name.is_empty()).then_some(name)
}

fn fact_kind(name: &str) -> Option<FactKind> {
    Some(match name {
        "shape" => FactKind::Shape,
        "dtype" => FactKind::Dtype,
        "ndim" => FactKind::Ndim,
        "nbytes" => FactKind::Nbytes,
        "size" => FactKind::Size,
        _ => return None,
    })
}

fn fact_ref(segs: &[Seg]) -> Option<FactRef> {
    let n = segs.len();
    let (prefix, kind, index) = match segs {
        [.., Seg::Field(last)] if n >= 2 => (&segs[..n - 1], fact_kind(last)?, None),
        [.., Seg::Field(shape), Seg::Index(i)] if n >= 3 && shape == "shape" => {
            (&segs[..n - 2], FactKind::Shape, Some(*i))
        }
        _ => return None,
    };
    Some(FactRef {
        array: array_name(prefix)?,
        kind,
        index,
    })
}

// ---------------------------------------------------------------------------
// Lexer
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// An integer literal that fits in u64.
    Int(u64),
    /// An integer literal too large for u64, kept as a float (as JSON parsers do).
    BigInt(f64),
    Float(f64),
    Str(String),
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Dot,
    Minus,
    End,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    /// 1-based column in characters.
    col: usize,
    /// Byte range in the source.
    start: usize,
    end: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

struct Lexer<'s> {
    src: &'s str,
    pos: usize,
    col: usize,
}

impl<'s> Lexer<'s> {
    fn new(src: &'s str) -> Self {
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

    fn next_token(&mut self) -> Result<Token, QueryError> {
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
            '=' if self.eat('=') => Tok::Eq,
            '=' => return Err(self.error(col, "'=' is not an operator; use '==' to test equality")),
            '!' if self.eat('=') => Tok::Ne,
            '!' => {
                return Err(self.error(col, "'!' is not supported; use 'not' to negate a condition"))
            }
            '<' if self.eat('=') => Tok::Le,
            '<' if self.peek() == Some('>') => {
                return Err(self.error(col, "'<>' is not supported; use '!='"))
            }
            '<' => Tok::Lt,
            '>' if self.eat('=') => Tok::Ge,
            '>' => Tok::Gt,
            '&' => {
                let op = if self.peek() == Some('&') { "&&" } else { "&" };
                return Err(self.error(col, format!("'{op}' is not supported; use 'and'")));
            }
            '|' => {
                let op = if self.peek() == Some('|') { "||" } else { "|" };
                return Err(self.error(col, format!("'{op}' is not supported; use 'or'")));
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
            while self.peek().is_some_and(is_ident_continue) {
                self.bump();
            }
            let text = &self.src[start..self.pos];
            return Err(self.error(col, format!("invalid number '{}'", shorten(text))));
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
fn shorten(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(MAX).collect();
        out.push_str("...");
        out
    }
}

// ---------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------

const KEYWORDS: &[&str] = &[
    "and", "or", "not", "in", "true", "false", "null", "True", "False", "None",
];

/// A value-like term, or a call that is already a condition.
enum Term {
    Value(Operand),
    Cond(Node),
}

struct Parser<'s> {
    lexer: Lexer<'s>,
    cur: Token,
    depth: usize,
}

fn parse_query(src: &str) -> Result<Node, QueryError> {
    if src.len() > MAX_QUERY_BYTES {
        let mut boundary = MAX_QUERY_BYTES;
        while !src.is_char_boundary(boundary) {
            boundary -= 1;
        }
        return Err(QueryError::new(
            src[..boundary].chars().count() + 1,
            format!(
                "query is too long ({} bytes; the limit is {MAX_QUERY_BYTES})",
                src.len()
            ),
            src,
        ));
    }
    let mut parser = Parser::new(src)?;
    if parser.cur.tok == Tok::End {
        return Err(parser.error(parser.cur.col, "empty expression"));
    }
    let node = parser.parse_or()?;
    match parser.cur.tok {
        Tok::End => Ok(node),
        Tok::RParen => Err(parser.error(parser.cur.col, "unmatched ')'")),
        _ => Err(parser.unexpected("'and', 'or' or the end of the expression")),
    }
}

impl<'s> Parser<'s> {
    fn new(src: &'s str) -> Result<Self, QueryError> {
        let mut lexer = Lexer::new(src);
        let cur = lexer.next_token()?;
        Ok(Parser {
            lexer,
            cur,
            depth: 0,
        })
    }

    fn src(&self) -> &'s str {
        self.lexer.src
    }

    /// Moves to the next token and returns the one that was current.
    fn advance(&mut self) -> Result<Token, QueryError> {
        let next = self.lexer.next_token()?;
        Ok(std::mem::replace(&mut self.cur, next))
    }

    fn error(&self, col: usize, message: impl Into<String>) -> QueryError {
        QueryError::new(col, message, self.src())
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(&self.cur.tok, Tok::Ident(w) if w == word)
    }

    fn describe(&self, token: &Token) -> String {
        let text = shorten(&self.src()[token.start..token.end]);
        match token.tok {
            Tok::End => "end of expression".to_owned(),
            Tok::Str(_) => format!("string {text}"),
            _ => format!("'{text}'"),
        }
    }

    /// An "unexpected token" error at the current token.
    fn unexpected(&self, expected: &str) -> QueryError {
        let token = &self.cur;
        let hint = match &token.tok {
            Tok::Ident(w) => match w.as_str() {
                "AND" | "And" => " (keywords are lowercase: did you mean 'and'?)",
                "OR" | "Or" => " (keywords are lowercase: did you mean 'or'?)",
                "NOT" | "Not" => " (keywords are lowercase: did you mean 'not'?)",
                "IN" | "In" => " (keywords are lowercase: did you mean 'in'?)",
                "is" => " (use '==' or '!=' to compare)",
                _ => "",
            },
            _ => "",
        };
        let message = match token.tok {
            Tok::End => format!("unexpected end of expression; expected {expected}"),
            _ => format!(
                "unexpected token {}; expected {expected}{hint}",
                self.describe(token)
            ),
        };
        self.error(token.col, message)
    }

    fn enter(&mut self, col: usize) -> Result<(), QueryError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(self.error(
                col,
                format!("expression is nested too deeply (more than {MAX_NESTING} levels)"),
            ));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    /// Consumes the closing `)` or `]` of `open`.
    fn close(&mut self, kind: Tok, open: &Token) -> Result<Token, QueryError> {
        if self.cur.tok == kind {
            return self.advance();
        }
        let (what, ch, opener) = if kind == Tok::RParen {
            ("parenthesis", ')', '(')
        } else {
            ("bracket", ']', '[')
        };
        Err(self.error(
            self.cur.col,
            format!(
                "missing closing {what}: expected '{ch}' to close the '{opener}' at column {}, \
                 found {}",
                open.col,
                self.describe(&self.cur)
            ),
        ))
    }

    fn parse_or(&mut self) -> Result<Node, QueryError> {
        let mut items = vec![self.parse_and()?];
        while self.is_word("or") {
            self.advance()?;
            items.push(self.parse_and()?);
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one item")
        } else {
            Node::Or(items)
        })
    }

    fn parse_and(&mut self) -> Result<Node, QueryError> {
        let mut items = vec![self.parse_not()?];
        while self.is_word("and") {
            self.advance()?;
            items.push(self.parse_not()?);
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one item")
        } else {
            Node::And(items)
        })
    }

    fn parse_not(&mut self) -> Result<Node, QueryError> {
        if self.is_word("not") {
            let not = self.advance()?;
            self.enter(not.col)?;
            let inner = self.parse_not()?;
            self.leave();
            return Ok(Node::Not(Box::new(inner)));
        }
        self.parse_primary()
    }

    fn parse_primary(&mut self) -> Result<Node, QueryError> {
        if self.cur.tok == Tok::LParen {
            let open = self.advance()?;
            self.enter(open.col)?;
            let inner = self.parse_or()?;
            self.close(Tok::RParen, &open)?;
            self.leave();
            return Ok(inner);
        }
        let first = self.cur.clone();
        match self.parse_term("a condition")? {
            Term::Cond(node) => Ok(node),
            Term::Value(lhs) => self.parse_comparison(lhs, &first),
        }
    }

    /// The comparison operators after `lhs` (`first` is its first token); a chain
    /// `a < b < c` means `a < b and b < c`.
    fn parse_comparison(&mut self, lhs: Operand, first: &Token) -> Result<Node, QueryError> {
        let mut operands = vec![lhs];
        let mut ops = Vec::new();
        loop {
            let op = match &self.cur.tok {
                Tok::Eq => CmpOp::Eq,
                Tok::Ne => CmpOp::Ne,
                Tok::Lt => CmpOp::Lt,
                Tok::Le => CmpOp::Le,
                Tok::Gt => CmpOp::Gt,
                Tok::Ge => CmpOp::Ge,
                Tok::Ident(w) if w == "in" => CmpOp::In,
                Tok::Ident(w) if w == "not" => {
                    self.advance()?;
                    if !self.is_word("in") {
                        return Err(self.unexpected("'in' after 'not'"));
                    }
                    CmpOp::NotIn
                }
                _ => break,
            };
            self.advance()?;
            let rhs_tok = self.cur.clone();
            let rhs = match self
                .parse_term("a value (number, string, list, true, false, null or field path)")?
            {
                Term::Value(rhs) => rhs,
                Term::Cond(_) => {
                    return Err(self.error(
                        rhs_tok.col,
                        "a function or method call is a condition, not a value; \
                         combine conditions with 'and' or 'or'",
                    ))
                }
            };
            ops.push(op);
            operands.push(rhs);
        }
        if ops.is_empty() {
            return Err(self.bare_operand(&operands[0], first));
        }
        if ops.len() == 1 {
            let rhs = operands.pop().expect("two operands");
            let lhs = operands.pop().expect("two operands");
            return Ok(Node::Compare {
                lhs,
                op: ops[0],
                rhs,
            });
        }
        Ok(Node::And(
            ops.iter()
                .enumerate()
                .map(|(i, op)| Node::Compare {
                    lhs: operands[i].clone(),
                    op: *op,
                    rhs: operands[i + 1].clone(),
                })
                .collect(),
        ))
    }

    /// The error for an operand that is not followed by a comparison operator.
    fn bare_operand(&self, operand: &Operand, first: &Token) -> QueryError {
        let ends_condition = matches!(self.cur.tok, Tok::End | Tok::RParen)
            || self.is_word("and")
            || self.is_word("or");
        if !ends_condition {
            return self.unexpected("a comparison operator (==, !=, <, <=, >, >=, in, not in)");
        }
        let message = match operand {
            Operand::Path(_) => {
                let text = shorten(self.src()[first.start..self.last_end()].trim_end());
                format!(
                    "'{text}' alone is not a condition: write exists({text}) to test whether \
                     it is present, or {text} == true to test a boolean field"
                )
            }
            Operand::Literal(_) => "a value alone is not a condition: compare it with \
                                    ==, !=, <, <=, >, >=, in or not in"
                .to_owned(),
        };
        self.error(first.col, message)
    }

    /// Byte offset where the previous token ended (start of the current token, less
    /// the whitespace before it).
    fn last_end(&self) -> usize {
        self.src()[..self.cur.start].trim_end().len()
    }

    /// A literal, a path, a path with a method call, or a function call.
    fn parse_term(&mut self, expected: &str) -> Result<Term, QueryError> {
        match &self.cur.tok {
            Tok::Ident(name) if !KEYWORDS.contains(&name.as_str()) => {
                let first = self.advance()?;
                if self.cur.tok == Tok::LParen {
                    return self.parse_function(&first).map(Term::Cond);
                }
                self.parse_path(&first)
            }
            _ => self
                .parse_literal(expected)
                .map(|v| Term::Value(Operand::Literal(v))),
        }
    }

    /// The rest of a path whose first identifier, `first`, was consumed.
    fn parse_path(&mut self, first: &Token) -> Result<Term, QueryError> {
        let Tok::Ident(name) = &first.tok else {
            return Err(self.unexpected("a field name"));
        };
        let (root, mut segs) = match name.as_str() {
            "key" => (Root::Key, Vec::new()),
            "meta" => (Root::Meta, Vec::new()),
            _ => (Root::Field, vec![Seg::Field(name.clone())]),
        };
        if root == Root::Meta && !matches!(self.cur.tok, Tok::Dot | Tok::LBracket) {
            return Err(self.error(
                first.col,
                "'meta' must be followed by a field: meta.name or meta['name'] \
                 (a metadata field called 'meta' is meta.meta)",
            ));
        }
        loop {
            match &self.cur.tok {
                Tok::Dot => {
                    self.advance()?;
                    let Tok::Ident(seg) = &self.cur.tok else {
                        return Err(self.unexpected("a field name after '.'"));
                    };
                    let seg = seg.clone();
                    let seg_tok = self.advance()?;
                    if self.cur.tok == Tok::LParen {
                        if root == Root::Meta && segs.is_empty() {
                            return Err(self.error(
                                seg_tok.col,
                                "a method needs a field: meta.name.startswith(...)",
                            ));
                        }
                        let target = PathExpr::new(root, segs);
                        return self.parse_method(target, &seg_tok).map(Term::Cond);
                    }
                    if root == Root::Key {
                        return Err(self.error(
                            seg_tok.col,
                            format!(
                                "the record key is a string and has no field '{}'; \
                                 a metadata field called 'key' is meta.key",
                                shorten(&seg)
                            ),
                        ));
                    }
                    segs.push(Seg::Field(seg));
                }
                Tok::LBracket => {
                    let open = self.advance()?;
                    if root == Root::Key {
                        return Err(self.error(
                            open.col,
                            "the record key is a string and cannot be indexed; \
                             a metadata field called 'key' is meta.key",
                        ));
                    }
                    let seg = self.parse_subscript()?;
                    self.close(Tok::RBracket, &open)?;
                    segs.push(seg);
                }
                _ => break,
            }
        }
        Ok(Term::Value(Operand::Path(PathExpr::new(root, segs))))
    }

    /// Inside `[...]` of a path: an integer index or a quoted field name.
    fn parse_subscript(&mut self) -> Result<Seg, QueryError> {
        let out_of_range = |p: &Self| p.error(p.cur.col, "index out of range");
        let seg = match &self.cur.tok {
            Tok::Str(s) => Seg::Field(s.clone()),
            Tok::Int(n) => Seg::Index(i64::try_from(*n).map_err(|_| out_of_range(self))?),
            Tok::BigInt(_) => return Err(out_of_range(self)),
            Tok::Minus => {
                self.advance()?;
                match self.cur.tok {
                    Tok::Int(n) if n <= 1 << 63 => Seg::Index((-i128::from(n)) as i64),
                    Tok::Int(_) | Tok::BigInt(_) => return Err(out_of_range(self)),
                    _ => return Err(self.unexpected("an integer index after '-'")),
                }
            }
            _ => return Err(self.unexpected("an integer index or a quoted field name")),
        };
        self.advance()?;
        Ok(seg)
    }

    /// `(args)` after a function or method name; returns the arguments with their
    /// columns and the closing parenthesis.
    fn parse_args(&mut self) -> Result<(Vec<(Operand, usize)>, Token), QueryError> {
        let open = self.advance()?;
        self.enter(open.col)?;
        let mut args = Vec::new();
        if self.cur.tok == Tok::RParen {
            let close = self.advance()?;
            self.leave();
            return Ok((args, close));
        }
        loop {
            let col = self.cur.col;
            match self.parse_term("an argument")? {
                Term::Value(arg) => args.push((arg, col)),
                Term::Cond(_) => {
                    return Err(self.error(col, "a condition cannot be used as an argument"))
                }
            }
            match self.cur.tok {
                Tok::Comma => {
                    self.advance()?;
                }
                Tok::RParen => break,
                _ => {
                    return Err(self.error(
                        self.cur.col,
                        format!(
                            "missing closing parenthesis: expected ',' or ')' to close the '(' \
                             at column {}, found {}",
                            open.col,
                            self.describe(&self.cur)
                        ),
                    ))
                }
            }
        }
        let close = self.advance()?;
        self.leave();
        Ok((args, close))
    }

    fn check_arity(
        &self,
        what: &str,
        args: &[(Operand, usize)],
        close: &Token,
    ) -> Result<(), QueryError> {
        match args.len() {
            1 => Ok(()),
            0 => Err(self.error(
                close.col,
                format!("{what} takes exactly one argument (got 0)"),
            )),
            n => Err(self.error(
                args[1].1,
                format!("{what} takes exactly one argument (got {n})"),
            )),
        }
    }

    /// `name(args)` where `name` is `first`, and the current token is `(`.
    fn parse_function(&mut self, first: &Token) -> Result<Node, QueryError> {
        let Tok::Ident(name) = &first.tok else {
            return Err(self.unexpected("a function name"));
        };
        if name != "exists" {
            let hint = if method_kind(name).is_some() {
                format!("; {name} is a method: path.{name}(...)")
            } else {
                "; the only function is exists(path), and the methods are \
                 path.startswith(s), path.endswith(s) and path.contains(x)"
                    .to_owned()
            };
            return Err(self.error(
                first.col,
                format!("unknown function '{}'{hint}", shorten(name)),
            ));
        }
        let (mut args, close) = self.parse_args()?;
        self.check_arity("exists()", &args, &close)?;
        match args.pop() {
            Some((Operand::Path(path), _)) => Ok(Node::Exists(path)),
            Some((Operand::Literal(_), col)) => Err(self.error(
                col,
                "exists() takes a field path, e.g. exists(params.lr), not a value",
            )),
            None => Err(self.error(close.col, "exists() takes exactly one argument (got 0)")),
        }
    }

    /// `.name(arg)` after `target`; `name` is the token `name_tok`, and the current
    /// token is `(`.
    fn parse_method(&mut self, target: PathExpr, name_tok: &Token) -> Result<Node, QueryError> {
        let Tok::Ident(name) = &name_tok.tok else {
            return Err(self.unexpected("a method name"));
        };
        let Some(method) = method_kind(name) else {
            let hint = if name == "exists" {
                "; exists is a function: exists(path)"
            } else {
                "; the methods are startswith, endswith and contains"
            };
            return Err(self.error(
                name_tok.col,
                format!("unknown method '{}'{hint}", shorten(name)),
            ));
        };
        let (mut args, close) = self.parse_args()?;
        self.check_arity(&format!("{name}()"), &args, &close)?;
        let (arg, _) = args.pop().expect("arity checked");
        Ok(Node::Method {
            target,
            method,
            arg,
        })
    }

    /// A literal value: number (with optional unary minus), string, list, or one of
    /// `true false null True False None`.
    fn parse_literal(&mut self, expected: &str) -> Result<Value, QueryError> {
        let value = match &self.cur.tok {
            Tok::Int(n) => Value::from(*n),
            Tok::BigInt(f) | Tok::Float(f) => Value::from(*f),
            Tok::Str(s) => Value::String(s.clone()),
            Tok::Ident(w) => match w.as_str() {
                "true" | "True" => Value::Bool(true),
                "false" | "False" => Value::Bool(false),
                "null" | "None" => Value::Null,
                _ => return Err(self.unexpected(expected)),
            },
            Tok::Minus => {
                self.advance()?;
                let value = match self.cur.tok {
                    Tok::Int(n) if n <= 1 << 63 => Value::from((-i128::from(n)) as i64),
                    // Below i64::MIN: a float, as JSON parsers do.
                    Tok::Int(n) => Value::from(-(n as f64)),
                    Tok::BigInt(f) | Tok::Float(f) => Value::from(-f),
                    _ => return Err(self.unexpected("a number after '-'")),
                };
                self.advance()?;
                return Ok(value);
            }
            Tok::LBracket => return self.parse_list(),
            _ => return Err(self.unexpected(expected)),
        };
        self.advance()?;
        Ok(value)
    }

    fn parse_list(&mut self) -> Result<Value, QueryError> {
        let open = self.advance()?;
        self.enter(open.col)?;
        let mut items = Vec::new();
        loop {
            if self.cur.tok == Tok::RBracket {
                break;
            }
            items.push(self.parse_literal("a literal value (lists hold only literals)")?);
            match self.cur.tok {
                Tok::Comma => {
                    self.advance()?;
                }
                Tok::RBracket => break,
                _ => {
                    return Err(self.error(
                        self.cur.col,
                        format!(
                            "missing closing bracket: expected ',' or ']' to close the '[' \
                             at column {}, found {}",
                            open.col,
                            self.describe(&self.cur)
                        ),
                    ))
                }
            }
        }
        self.advance()?;
        self.leave();
        Ok(Value::Array(items))
    }
}

fn method_kind(name: &str) -> Option<Method> {
    Some(match name {
        "startswith" => Method::StartsWith,
        "endswith" => Method::EndsWith,
        "contains" => Method::Contains,
        _ => return None,
    })
}

// ---------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------

/// A number as JSON holds it; compared exactly across kinds.
#[derive(Debug, Clone, Copy)]
enum Num {
    I(i64),
    U(u64),
    F(f64),
}

/// A value seen by the evaluator, borrowed from the query or the record.
#[derive(Debug, Clone, Copy)]
enum V<'a> {
    Null,
    Bool(bool),
    Num(Num),
    Str(&'a str),
    /// An array's dtype: equal to a string that is its name or its descr.
    Dtype {
        name: &'a str,
        descr: &'a str,
    },
    List(List<'a>),
    Obj(&'a Map<String, Value>),
}

#[derive(Debug, Clone, Copy)]
enum List<'a> {
    Json(&'a [Value]),
    Dims(&'a [u64]),
}

impl<'a> List<'a> {
    fn len(self) -> usize {
        match self {
            List::Json(items) => items.len(),
            List::Dims(dims) => dims.len(),
        }
    }

    fn get(self, i: usize) -> V<'a> {
        match self {
            List::Json(items) => V::from_json(&items[i]),
            List::Dims(dims) => V::Num(Num::U(dims[i])),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    Num,
    Str,
    List,
    Obj,
}

impl<'a> V<'a> {
    fn from_json(value: &'a Value) -> V<'a> {
        match value {
            Value::Null => V::Null,
            Value::Bool(b) => V::Bool(*b),
            Value::Number(n) => V::Num(if let Some(u) = n.as_u64() {
                Num::U(u)
            } else if let Some(i) = n.as_i64() {
                Num::I(i)
            } else {
                // Not representable (only with serde_json's arbitrary_precision):
                // NaN compares false under every operator.
                Num::F(n.as_f64().unwrap_or(f64::NAN))
            }),
            Value::String(s) => V::Str(s),
            Value::Array(items) => V::List(List::Json(items)),
            Value::Object(map) => V::Obj(map),
        }
    }

    fn kind(self) -> Kind {
        match self {
            V::Null => Kind::Null,
            V::Bool(_) => Kind::Bool,
            V::Num(_) => Kind::Num,
            V::Str(_) | V::Dtype { .. } => Kind::Str,
            V::List(_) => Kind::List,
            V::Obj(_) => Kind::Obj,
        }
    }

    /// The text of a string, or the name of a dtype.
    fn text(self) -> Option<&'a str> {
        match self {
            V::Str(s) => Some(s),
            V::Dtype { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// Exact order of an integer and a float.
fn cmp_int_float(i: i128, f: f64) -> Option<Ordering> {
    // 2^64 and -2^63: every i64 and u64 lies in [-2^63, 2^64).
    const TWO_64: f64 = 18_446_744_073_709_551_616.0;
    const MINUS_TWO_63: f64 = -9_223_372_036_854_775_808.0;
    if f.is_nan() {
        return None;
    }
    if f >= TWO_64 {
        return Some(Ordering::Less);
    }
    if f < MINUS_TWO_63 {
        return Some(Ordering::Greater);
    }
    // |trunc(f)| <= 2^64, so the conversion is exact.
    let whole = f.trunc();
    match i.cmp(&(whole as i128)) {
        Ordering::Equal => (0.0).partial_cmp(&(f - whole)),
        other => Some(other),
    }
}

fn cmp_num(a: Num, b: Num) -> Option<Ordering> {
    let int = |n: Num| match n {
        Num::I(i) => Some(i128::from(i)),
        Num::U(u) => Some(i128::from(u)),
        Num::F(_) => None,
    };
    match (a, b) {
        (Num::F(x), Num::F(y)) => x.partial_cmp(&y),
        (Num::F(x), other) => cmp_int_float(int(other)?, x).map(Ordering::reverse),
        (other, Num::F(y)) => cmp_int_float(int(other)?, y),
        (x, y) => Some(int(x)?.cmp(&int(y)?)),
    }
}

/// `'<f8'` -> `<f8`.
fn strip_quotes(s: &str) -> &str {
    for q in ['\'', '"'] {
        if let Some(inner) = s.strip_prefix(q).and_then(|t| t.strip_suffix(q)) {
            return inner;
        }
    }
    s
}

fn text_eq(a: V<'_>, b: V<'_>) -> bool {
    match (a, b) {
        (V::Str(x), V::Str(y)) => x == y,
        (V::Dtype { name, descr }, V::Str(s)) | (V::Str(s), V::Dtype { name, descr }) => {
            name == s || strip_quotes(descr) == s
        }
        (
            V::Dtype {
                name: n1,
                descr: d1,
            },
            V::Dtype {
                name: n2,
                descr: d2,
            },
        ) => n1 == n2 && strip_quotes(d1) == strip_quotes(d2),
        _ => false,
    }
}

/// Structural equality: numbers by value across int and float, lists element-wise,
/// objects by key set and values; different kinds are unequal. Iterative, so deep
/// values cannot overflow the stack.
fn values_eq<'a>(a: V<'a>, b: V<'a>) -> bool {
    let mut pending: Vec<(V<'a>, V<'a>)> = Vec::new();
    let (mut x, mut y) = (a, b);
    loop {
        let same = match (x, y) {
            (V::Null, V::Null) => true,
            (V::Bool(p), V::Bool(q)) => p == q,
            (V::Num(p), V::Num(q)) => cmp_num(p, q) == Some(Ordering::Equal),
            (V::List(p), V::List(q)) if p.len() == q.len() => {
                pending.extend((0..p.len()).map(|i| (p.get(i), q.get(i))));
                true
            }
            (V::Obj(p), V::Obj(q)) => {
                p.len() == q.len()
                    && p.iter().all(|(k, v)| match q.get(k) {
                        Some(w) => {
                            pending.push((V::from_json(v), V::from_json(w)));
                            true
                        }
                        None => false,
                    })
            }
            (p, q) if p.kind() == Kind::Str && q.kind() == Kind::Str => text_eq(p, q),
            _ => false,
        };
        if !same {
            return false;
        }
        match pending.pop() {
            Some((p, q)) => (x, y) = (p, q),
            None => return true,
        }
    }
}

fn compare<'a>(a: V<'a>, op: CmpOp, b: V<'a>) -> bool {
    match op {
        CmpOp::In => return membership(a, b).unwrap_or(false),
        CmpOp::NotIn => return membership(a, b).is_some_and(|found| !found),
        _ => {}
    }
    if a.kind() != b.kind() {
        return false;
    }
    let ordered = |test: fn(Ordering) -> bool| {
        let order = match (a, b) {
            (V::Num(x), V::Num(y)) => cmp_num(x, y),
            // UTF-8 byte order is Unicode code point order.
            (V::Str(x), V::Str(y)) => Some(x.cmp(y)),
            _ => None,
        };
        order.is_some_and(test)
    };
    match op {
        CmpOp::Eq => values_eq(a, b),
        CmpOp::Ne => match (a, b) {
            (V::Num(x), V::Num(y)) => cmp_num(x, y).is_some_and(Ordering::is_ne),
            _ => !values_eq(a, b),
        },
        CmpOp::Lt => ordered(Ordering::is_lt),
        CmpOp::Le => ordered(Ordering::is_le),
        CmpOp::Gt => ordered(Ordering::is_gt),
        CmpOp::Ge => ordered(Ordering::is_ge),
        CmpOp::In | CmpOp::NotIn => false,
    }
}

/// Whether `needle` is in `haystack`: an element of a list, or a substring of a
/// string. `None` when the test does not apply (then `in` and `not in` are false).
fn membership<'a>(needle: V<'a>, haystack: V<'a>) -> Option<bool> {
    match haystack {
        V::List(items) => Some((0..items.len()).any(|i| values_eq(needle, items.get(i)))),
        V::Str(_) | V::Dtype { .. } => Some(haystack.text()?.contains(needle.text()?)),
        _ => None,
    }
}

fn apply_method<'a>(method: Method, target: V<'a>, arg: V<'a>) -> bool {
    let texts = target.text().zip(arg.text());
    match method {
        Method::StartsWith => texts.is_some_and(|(t, a)| t.starts_with(a)),
        Method::EndsWith => texts.is_some_and(|(t, a)| t.ends_with(a)),
        Method::Contains => match target {
            V::List(items) => (0..items.len()).any(|i| values_eq(items.get(i), arg)),
            _ => texts.is_some_and(|(t, a)| t.contains(a)),
        },
    }
}

/// Resolves an index that may count from the end.
fn list_index(index: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let i = if index < 0 {
        len.checked_add(index)?
    } else {
        index
    };
    if (0..len).contains(&i) {
        usize::try_from(i).ok()
    } else {
        None
    }
}

fn lookup<'a>(meta: &'a Map<String, Value>, segs: &[Seg]) -> Option<&'a Value> {
    let (Seg::Field(first), rest) = segs.split_first()? else {
        return None;
    };
    let mut value = meta.get(first)?;
    for seg in rest {
        value = match seg {
            Seg::Field(name) => value.as_object()?.get(name)?,
            Seg::Index(i) => {
                let items = value.as_array()?;
                &items[list_index(*i, items.len())?]
            }
        };
    }
    Some(value)
}

fn path_value<'a, R: RecordView + ?Sized>(path: &'a PathExpr, rec: &'a R) -> Option<V<'a>> {
    if path.root == Root::Key {
        return Some(V::Str(rec.key()));
    }
    if let Some(value) = lookup(rec.meta(), &path.segs) {
        return Some(V::from_json(value));
    }
    let fact = path.fact.as_ref()?;
    let array = rec.array(&fact.array)?;
    Some(match fact.kind {
        FactKind::Shape => match fact.index {
            None => V::List(List::Dims(array.shape)),
            Some(i) => V::Num(Num::U(array.shape[list_index(i, array.shape.len())?])),
        },
        FactKind::Dtype => V::Dtype {
            name: array.dtype,
            descr: array.descr,
        },
        FactKind::Ndim => V::Num(Num::U(array.shape.len() as u64)),
        FactKind::Nbytes => V::Num(Num::U(array.nbytes)),
        FactKind::Size => V::Num(
            match array
                .shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            {
                Some(n) => Num::U(n),
                None => Num::F(array.shape.iter().map(|&d| d as f64).product()),
            },
        ),
    })
}

fn operand_value<'a, R: RecordView + ?Sized>(operand: &'a Operand, rec: &'a R) -> Option<V<'a>> {
    match operand {
        Operand::Literal(value) => Some(V::from_json(value)),
        Operand::Path(path) => path_value(path, rec),
    }
}

fn path_exists<R: RecordView + ?Sized>(path: &PathExpr, rec: &R) -> bool {
    match path.root {
        Root::Key => true,
        Root::Meta => lookup(rec.meta(), &path.segs).is_some(),
        Root::Field => {
            path_value(path, rec).is_some()
                || path
                    .array
                    .as_deref()
                    .is_some_and(|name| rec.array(name).is_some())
        }
    }
}

fn eval<R: RecordView + ?Sized>(node: &Node, rec: &R) -> bool {
    match node {
        Node::Or(items) => items.iter().any(|n| eval(n, rec)),
        Node::And(items) => items.iter().all(|n| eval(n, rec)),
        Node::Not(inner) => !eval(inner, rec),
        Node::Compare { lhs, op, rhs } => {
            match (operand_value(lhs, rec), operand_value(rhs, rec)) {
                (Some(a), Some(b)) => compare(a, *op, b),
                _ => false,
            }
        }
        Node::Exists(path) => path_exists(path, rec),
        Node::Method {
            target,
            method,
            arg,
        } => match (path_value(target, rec), operand_value(arg, rec)) {
            (Some(t), Some(a)) => apply_method(*method, t, a),
            _ => false,
        },
    }
}
