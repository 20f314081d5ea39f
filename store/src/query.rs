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

/// The JSON types of [`RecordView::meta`], re-exported so that implementors and
/// callers use the same `serde_json` as this crate.
pub use serde_json::{Map, Value};

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
/// ```text
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
// Index plans
// ---------------------------------------------------------------------------

/// How a secondary index on one metadata field can narrow a query: the
/// records whose field value is one of `Points`, or lies in `Range`. The
/// index gives candidates only; the whole query is still evaluated on each,
/// so a plan needs to be a superset, never exact.
#[derive(Debug, Clone, PartialEq)]
pub enum IndexLookup {
    /// Field equal to one of these scalars (`==`, `in [...]`).
    Points(Vec<Value>),
    /// Field within bounds of one kind (numbers or strings); each bound is
    /// `(value, inclusive)`.
    Range {
        lower: Option<(Value, bool)>,
        upper: Option<(Value, bool)>,
    },
}

/// A secondary-index plan: the field (dotted path segments) and the lookup.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexPlan {
    pub field: Vec<String>,
    pub lookup: IndexLookup,
}

impl Query {
    /// The best index plan for this query given which fields are indexed
    /// (`indexed(&["params", "lr"])`), or `None` for a full scan.
    ///
    /// Only a condition that every match must satisfy can narrow the
    /// scan: the query itself, or one item of a top-level `and`. Usable
    /// conditions compare a metadata path of plain field names (no list
    /// index, not an array fact) with a scalar literal: `==`, `in [...]` of
    /// scalars, and `< <= > >=` with a number or a string; several ranges
    /// on one field are intersected. Points beat ranges, two-sided ranges
    /// beat one-sided.
    pub fn index_plan(&self, indexed: &dyn Fn(&[String]) -> bool) -> Option<IndexPlan> {
        let items: &[Node] = match &self.root {
            Node::And(items) => items,
            other => std::slice::from_ref(other),
        };
        let mut points: Option<IndexPlan> = None;
        let mut ranges: Vec<IndexPlan> = Vec::new();
        for item in items {
            let Some(plan) = conjunct_plan(item, indexed) else {
                continue;
            };
            match plan.lookup {
                IndexLookup::Points(_) => {
                    let fewer = match (&points, &plan.lookup) {
                        (
                            Some(IndexPlan {
                                lookup: IndexLookup::Points(old),
                                ..
                            }),
                            IndexLookup::Points(new),
                        ) => new.len() < old.len(),
                        _ => true,
                    };
                    if fewer {
                        points = Some(plan);
                    }
                }
                IndexLookup::Range { .. } => {
                    match ranges.iter_mut().find(|r| r.field == plan.field) {
                        Some(existing) => intersect(existing, plan),
                        None => ranges.push(plan),
                    }
                }
            }
        }
        if points.is_some() {
            return points;
        }
        ranges.into_iter().max_by_key(|r| match &r.lookup {
            IndexLookup::Range { lower, upper } => {
                usize::from(lower.is_some()) + usize::from(upper.is_some())
            }
            IndexLookup::Points(_) => 0,
        })
    }
}

/// What evaluating a query reads from a record, so a scan can skip the
/// rest while decoding: the top-level metadata fields its paths start with
/// (`None`: all of them), and whether it reads array facts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueryNeeds {
    pub fields: std::collections::HashSet<String>,
    pub arrays: bool,
}

impl QueryNeeds {
    /// Whether the top-level metadata field `name` is read. Queries name
    /// few fields: comparing them beats hashing `name` (SipHash) for each
    /// field of each record scanned.
    pub fn wants(&self, name: &str) -> bool {
        if self.fields.len() <= 8 {
            self.fields.iter().any(|f| f == name)
        } else {
            self.fields.contains(name)
        }
    }
}

impl Query {
    /// The fields and facts this query reads (see [`QueryNeeds`]).
    pub fn needs(&self) -> QueryNeeds {
        let mut needs = QueryNeeds::default();
        let mut stack = vec![&self.root];
        // Array entries are read for a fact (`image.shape`) and, in
        // `exists`, for a path that may name an array; a plain comparison
        // of a field never reads them.
        let note = |path: &PathExpr, needs: &mut QueryNeeds, exists: bool| {
            if path.root == Root::Key {
                return;
            }
            if let Some(Seg::Field(first)) = path.segs.first() {
                needs.fields.insert(first.clone());
            }
            if path.root == Root::Field && (path.fact.is_some() || (exists && path.array.is_some()))
            {
                needs.arrays = true;
            }
        };
        while let Some(node) = stack.pop() {
            match node {
                Node::Or(items) | Node::And(items) => stack.extend(items),
                Node::Not(inner) => stack.push(inner),
                Node::Compare { lhs, rhs, .. } => {
                    for operand in [lhs, rhs] {
                        if let Operand::Path(p) = operand {
                            note(p, &mut needs, false);
                        }
                    }
                }
                Node::Exists(p) => note(p, &mut needs, true),
                Node::Method { target, arg, .. } => {
                    note(target, &mut needs, false);
                    if let Operand::Path(p) = arg {
                        note(p, &mut needs, false);
                    }
                }
            }
        }
        needs
    }
}

fn scalar(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

fn same_kind(a: &Value, b: &Value) -> bool {
    matches!(
        (a, b),
        (Value::Number(_), Value::Number(_)) | (Value::String(_), Value::String(_))
    )
}

/// Tightens `into`'s range with `other`'s (same field); ranges over
/// different kinds (a number and a string bound) match nothing, which an
/// empty point set says.
fn intersect(into: &mut IndexPlan, other: IndexPlan) {
    let (
        IndexLookup::Range { lower, upper },
        IndexLookup::Range {
            lower: lower2,
            upper: upper2,
        },
    ) = (&mut into.lookup, other.lookup)
    else {
        return;
    };
    let kind = lower
        .as_ref()
        .or(upper.as_ref())
        .map(|(v, _)| v.clone())
        .expect("a range has a bound");
    let kind2 = lower2
        .as_ref()
        .or(upper2.as_ref())
        .map(|(v, _)| v.clone())
        .expect("a range has a bound");
    if !same_kind(&kind, &kind2) {
        into.lookup = IndexLookup::Points(Vec::new());
        return;
    }
    let tighter = |a: &Option<(Value, bool)>, b: Option<(Value, bool)>, want: Ordering| match (a, b)
    {
        (None, b) => b,
        (a, None) => a.clone(),
        (Some((x, xi)), Some((y, yi))) => match cmp_literal(x, &y) {
            Some(o) if o == want => Some((x.clone(), *xi)),
            Some(Ordering::Equal) => Some((x.clone(), *xi && yi)),
            Some(_) => Some((y, yi)),
            None => Some((x.clone(), *xi)),
        },
    };
    *lower = tighter(lower, lower2, Ordering::Greater);
    *upper = tighter(upper, upper2, Ordering::Less);
}

fn cmp_literal(a: &Value, b: &Value) -> Option<Ordering> {
    match (V::from_json(a), V::from_json(b)) {
        (V::Num(x), V::Num(y)) => cmp_num(x, y),
        (V::Str(x), V::Str(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// The plan one condition allows on its own.
fn conjunct_plan(node: &Node, indexed: &dyn Fn(&[String]) -> bool) -> Option<IndexPlan> {
    let Node::Compare { lhs, op, rhs } = node else {
        return None;
    };
    let (path, op, literal) = match (lhs, rhs) {
        (Operand::Path(p), Operand::Literal(v)) => (p, *op, v),
        (Operand::Literal(v), Operand::Path(p)) => (
            p,
            match op {
                CmpOp::Lt => CmpOp::Gt,
                CmpOp::Le => CmpOp::Ge,
                CmpOp::Gt => CmpOp::Lt,
                CmpOp::Ge => CmpOp::Le,
                CmpOp::Eq => CmpOp::Eq,
                // `5 in x`: membership in the field, not indexable
                _ => return None,
            },
            v,
        ),
        _ => return None,
    };
    let readable_as_fact = path.root == Root::Field && path.fact.is_some();
    if path.root == Root::Key || readable_as_fact {
        return None;
    }
    let field: Vec<String> = path
        .segs
        .iter()
        .map(|s| match s {
            Seg::Field(f) => Some(f.clone()),
            Seg::Index(_) => None,
        })
        .collect::<Option<_>>()?;
    if field.is_empty() || !indexed(&field) {
        return None;
    }
    let lookup = match op {
        CmpOp::Eq if scalar(literal) => IndexLookup::Points(vec![literal.clone()]),
        CmpOp::In => match literal {
            Value::Array(items) if items.iter().all(scalar) => IndexLookup::Points(items.clone()),
            _ => return None,
        },
        CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge
            if matches!(literal, Value::Number(_) | Value::String(_)) =>
        {
            let bound = Some((literal.clone(), matches!(op, CmpOp::Le | CmpOp::Ge)));
            if matches!(op, CmpOp::Lt | CmpOp::Le) {
                IndexLookup::Range {
                    lower: None,
                    upper: bound,
                }
            } else {
                IndexLookup::Range {
                    lower: bound,
                    upper: None,
                }
            }
        }
        _ => return None,
    };
    Some(IndexPlan { field, lookup })
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
        Ok(one_or(items, Node::Or))
    }

    fn parse_and(&mut self) -> Result<Node, QueryError> {
        let mut items = vec![self.parse_not()?];
        while self.is_word("and") {
            self.advance()?;
            items.push(self.parse_not()?);
        }
        Ok(one_or(items, Node::And))
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
        let compares = ops
            .iter()
            .zip(operands.windows(2))
            .map(|(op, pair)| Node::Compare {
                lhs: pair[0].clone(),
                op: *op,
                rhs: pair[1].clone(),
            })
            .collect();
        Ok(one_or(compares, Node::And))
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
                        let mut e = self.unexpected("a field name after '.'");
                        if let Tok::Int(n) = self.cur.tok {
                            e.message
                                .push_str(&format!(" (write [{n}] to index a list)"));
                        }
                        return Err(e);
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
        let Some((arg, _)) = args.pop() else {
            return Err(self.error(close.col, format!("{name}() takes exactly one argument")));
        };
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

/// The only node of `nodes`, or `combine(nodes)` when there are several.
fn one_or(nodes: Vec<Node>, combine: fn(Vec<Node>) -> Node) -> Node {
    match <[Node; 1]>::try_from(nodes) {
        Ok([node]) => node,
        Err(nodes) => combine(nodes),
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
                items.get(list_index(*i, items.len())?)?
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
            Some(i) => V::Num(Num::U(*array.shape.get(list_index(i, array.shape.len())?)?)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    // -- fixtures -----------------------------------------------------------

    #[derive(Debug, Clone)]
    struct TestArray {
        name: String,
        shape: Vec<u64>,
        dtype: String,
        descr: String,
        nbytes: u64,
    }

    #[derive(Debug, Clone)]
    struct TestRecord {
        key: String,
        meta: Map<String, Value>,
        arrays: Vec<TestArray>,
    }

    impl TestRecord {
        fn new(meta: Value) -> Self {
            Self::keyed("run-001", meta)
        }

        fn keyed(key: &str, meta: Value) -> Self {
            let Value::Object(meta) = meta else {
                panic!("metadata must be an object")
            };
            TestRecord {
                key: key.to_owned(),
                meta,
                arrays: Vec::new(),
            }
        }

        fn with_array(mut self, name: &str, shape: &[u64], dtype: &str, descr: &str) -> Self {
            let itemsize: u64 = descr
                .chars()
                .filter(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap_or(1);
            self.arrays.push(TestArray {
                name: name.to_owned(),
                shape: shape.to_vec(),
                dtype: dtype.to_owned(),
                descr: descr.to_owned(),
                nbytes: shape.iter().fold(itemsize, |acc, &d| acc.saturating_mul(d)),
            });
            self
        }
    }

    impl RecordView for TestRecord {
        fn key(&self) -> &str {
            &self.key
        }

        fn meta(&self) -> &Map<String, Value> {
            &self.meta
        }

        fn array(&self, name: &str) -> Option<ArrayFacts<'_>> {
            self.arrays
                .iter()
                .find(|a| a.name == name)
                .map(|a| ArrayFacts {
                    shape: &a.shape,
                    dtype: &a.dtype,
                    descr: &a.descr,
                    nbytes: a.nbytes,
                })
        }
    }

    fn sample() -> TestRecord {
        TestRecord::new(json!({
            "temperature": 300.0,
            "material": "Si",
            "count": 7,
            "ok": true,
            "nothing": null,
            "params": {"lr": 0.001, "learning-rate": 0.01, "layers": [64, 32], "name": "adam"},
            "tags": ["a", "b", "c"],
            "key": "meta-key",
            "meta": "meta-meta",
            "ünïcode": 1,
            "温度": 25,
        }))
        .with_array("image", &[480, 640], "uint8", "'|u1'")
        .with_array("params/w", &[3, 4], "float64", "'<f8'")
        .with_array("frames/0", &[10], "float32", "'<f4'")
        .with_array("scalar", &[], "int64", "'<i8'")
    }

    fn query(src: &str) -> Query {
        Query::parse(src).unwrap_or_else(|e| panic!("{:?} should parse:\n{e}", shorten(src)))
    }

    fn check(src: &str, rec: &TestRecord) -> bool {
        query(src).matches(rec)
    }

    /// Asserts that each query matches `rec` (`want = true`) or does not.
    fn expect_all(rec: &TestRecord, want: bool, sources: &[&str]) {
        for src in sources {
            assert_eq!(check(src, rec), want, "{src:?} should give {want}");
        }
    }

    fn parse_err(src: &str) -> QueryError {
        match Query::parse(src) {
            Ok(q) => panic!("{:?} should not parse, got {q:?}", shorten(src)),
            Err(e) => e,
        }
    }

    fn assert_err(src: &str, column: usize, fragment: &str) {
        let e = parse_err(src);
        let short = shorten(src);
        assert_eq!(e.column, column, "column for {short:?}: {}", e.message);
        assert!(
            e.message.contains(fragment),
            "message for {short:?} should contain {fragment:?}: {}",
            e.message
        );
        assert_eq!(e.expression, src);
    }

    // -- literals -----------------------------------------------------------

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
    fn bool_and_null_literals_in_both_spellings() {
        let rec = TestRecord::new(json!({"ok": true, "bad": false, "nothing": null}));
        expect_all(
            &rec,
            true,
            &[
                "ok == true",
                "ok == True",
                "ok != false",
                "ok != False",
                "bad == false",
                "nothing == null",
                "nothing == None",
                "null == nothing",
                "ok == ok",
            ],
        );
        expect_all(
            &rec,
            false,
            &["ok == false", "ok == 1", "bad == 0", "nothing == false"],
        );
    }

    #[test]
    fn list_literals() {
        let rec = sample();
        expect_all(
            &rec,
            true,
            &[
                "tags == ['a', 'b', 'c']",
                "tags == ['a', 'b', 'c',]",
                "params.layers == [64, 32.0]",
                "tags != ['a']",
                "tags != ['a', 'b', 'd']",
                "count in [1, 'x', 7]",
                "tags in [['a', 'b', 'c'], 1]",
                "[1, 2] == [1.0, 2]",
                "[] == []",
                "params.layers in [[], [64, 32]]",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "tags == ['c', 'b', 'a']",
                "tags == []",
                "count in []",
                "tags == 'a'",
            ],
        );
    }

    // -- paths ----------------------------------------------------------------

    #[test]
    fn dotted_indexed_and_bracketed_paths() {
        let rec = sample();
        expect_all(
            &rec,
            true,
            &[
                "params.lr < 1e-2",
                "params[\"learning-rate\"] == 0.01",
                "params['learning-rate'] == 0.01",
                "params['lr'] == params.lr",
                "tags[0] == 'a'",
                "tags[-1] == 'c'",
                "tags[-3] == 'a'",
                "params.layers[1] == 32",
                "params['layers'][-2] == 64",
                "ünïcode == 1",
                "温度 == 25",
                "exists(params.name)",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "tags[3] == 'a'",
                "tags[-4] == 'a'",
                "tags.x == 'a'",
                "params[0] == 1",
                "material[0] == 'S'",
                "params.lr.x == 1",
            ],
        );
    }

    #[test]
    fn key_and_meta_roots() {
        let rec = sample();
        expect_all(
            &rec,
            true,
            &[
                "key == 'run-001'",
                "key != 'meta-key'",
                "key < 's'",
                "key in ['run-001', 'run-002']",
                "key.startswith('run-')",
                "key.endswith('001')",
                "key.contains('n-0')",
                "meta.key == 'meta-key'",
                "meta['key'] == 'meta-key'",
                "meta.meta == 'meta-meta'",
                "meta.params.lr == 0.001",
                "meta.tags[-1] == 'c'",
                "exists(key)",
                "exists(meta.key)",
                "meta.key.startswith('meta-')",
            ],
        );
        let mire = TestRecord::keyed("mire-2/run 7", json!({}));
        assert!(check("key.startswith('mire-2/')", &mire));
        assert!(check("key == 'mire-2/run 7'", &mire));
        assert!(!check("key.startswith('mire-3/')", &mire));
    }

    // -- array facts -----------------------------------------------------------

    #[test]
    fn array_facts() {
        let rec = sample();
        expect_all(
            &rec,
            true,
            &[
                "image.shape == [480, 640]",
                "image.shape == [480.0, 640]",
                "image.shape != [640, 480]",
                "image.shape[0] > 300",
                "image.shape[1] == 640",
                "image.shape[-1] == 640",
                "image['shape'][0] == 480",
                "image.ndim == 2",
                "image.size == 307200",
                "image.nbytes == 307200",
                "image.dtype == 'uint8'",
                "image.dtype == '|u1'",
                "image.dtype != 'float64'",
                "image.dtype in ['int8', 'uint8']",
                "image.dtype not in ['float32', 'float64']",
                "image.dtype.startswith('uint')",
                "image.dtype.endswith('8')",
                "image.shape.contains(640)",
                "params.w.shape[0] == 3",
                "params.w.dtype == '<f8'",
                "params.w.nbytes == 96",
                "frames[0].dtype == 'float32'",
                "frames[0].shape == [10]",
                "scalar.ndim == 0",
                "scalar.size == 1",
                "scalar.shape == []",
                "exists(image)",
                "exists(params.w)",
                "exists(frames[0])",
                "exists(image.shape)",
                "exists(image.shape[1])",
                "'int' in image.dtype",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "image.shape[2] == 1",
                "image.shape[-3] == 1",
                "image.dtype == 'u1'",
                "image.dtype == 'float64'",
                "image.dtype < 'z'",
                "image.dtype > 'a'",
                "image.dtype == 8",
                "image.shape < [500]",
                "image == 1",
                "image.width == 1",
                "meta.image.shape == [480, 640]",
                "exists(meta.image)",
                "exists(image.shape[2])",
                "exists(image.width)",
                "exists(frames[-1])",
                "nothere.shape == []",
                "frames[0].shape[0][0] == 10",
            ],
        );
    }

    #[test]
    fn metadata_wins_over_array_facts() {
        let rec = TestRecord::new(json!({"image": {"shape": [1, 2]}, "w": {"dtype": "custom"}}))
            .with_array("image", &[3, 4], "uint8", "'|u1'")
            .with_array("w", &[5], "float64", "'<f8'");
        expect_all(
            &rec,
            true,
            &[
                "image.shape == [1, 2]",
                "image.shape[0] == 1",
                "w.dtype == 'custom'",
                // Not in the metadata: the array's fact.
                "image.ndim == 2",
                "w.shape == [5]",
            ],
        );
        expect_all(
            &rec,
            false,
            &["image.shape == [3, 4]", "w.dtype == 'float64'"],
        );
    }

    #[test]
    fn array_size_overflow_does_not_panic() {
        let rec = TestRecord::new(json!({})).with_array("huge", &[u64::MAX, 4], "uint8", "'|u1'");
        assert!(check("huge.size > 18446744073709551615", &rec));
    }

    // -- operators -------------------------------------------------------------

    #[test]
    fn comparison_operators_on_numbers_and_strings() {
        let rec = sample();
        expect_all(
            &rec,
            true,
            &[
                "count == 7",
                "count != 8",
                "count < 8",
                "count <= 7",
                "count > 6",
                "count >= 7",
                "7 == count",
                "8 > count",
                "material == 'Si'",
                "material != 'Ge'",
                "material < 'Sj'",
                "material <= 'Si'",
                "material > 'S'",
                "material >= 'Si'",
                "'A' < material",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "count != 7",
                "count < 7",
                "count > 7",
                "material < 'Si'",
                "material > 'Si'",
            ],
        );
    }

    #[test]
    fn strings_order_by_code_point() {
        let rec = TestRecord::new(json!({"bmp": "\u{ffff}", "z": "z", "upper": "Z"}));
        expect_all(
            &rec,
            true,
            &[
                "upper < z",
                "upper < 'a'",
                "z < 'é'",
                // U+FFFF < U+1F600 by code point (UTF-16 order would say otherwise).
                "bmp < '😀'",
                "bmp > 'é'",
                "'ab' < 'abc'",
                "'abc' < 'abd'",
                "'' < 'a'",
            ],
        );
        expect_all(&rec, false, &["bmp > '😀'", "'abc' < 'ab'"]);
    }

    #[test]
    fn chained_comparisons_mean_and() {
        let rec = sample();
        expect_all(
            &rec,
            true,
            &[
                "1 < count < 10",
                "1 < count <= 7",
                "7 == count == 7.0",
                "0 < count < 8 > 2",
            ],
        );
        expect_all(
            &rec,
            false,
            &["1 < count < 5", "8 < count < 10", "missing < 1 < 2"],
        );
        assert!(check("not 1 < count < 5", &rec));
    }

    #[test]
    fn in_and_not_in() {
        let rec = sample();
        expect_all(
            &rec,
            true,
            &[
                "material in ['Si', 'Ge']",
                "material not in ['Ge', 'C']",
                "count in [7.0]",
                "'S' in material",
                "material in 'xSiy'",
                "'a' in tags",
                "'z' not in tags",
                "64 in params.layers",
                "material in [1, 'Si']",
                "nothing in [null]",
                "ok not in [1, 'true']",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "material in ['Ge']",
                "material not in ['Si']",
                "count in 'abc'",
                "count not in 'abc'",
                "count in count",
                "count not in count",
                "'a' in params",
                "'a' not in params",
                "1 in material",
                "1 not in material",
            ],
        );
    }

    #[test]
    fn boolean_connectives() {
        let rec = sample();
        expect_all(
            &rec,
            true,
            &[
                "count == 7 and material == 'Si'",
                "count == 8 or material == 'Si'",
                "not count == 8",
                "not (count == 8)",
                "not not count == 7",
                "count == 7 and material == 'Si' and ok == true",
                "count == 1 or count == 2 or count == 7",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "count == 7 and material == 'Ge'",
                "count == 8 or material == 'Ge'",
                "not count == 7",
            ],
        );
    }

    #[test]
    fn precedence_or_below_and_below_not() {
        let rec = |a: i64, b: i64, c: i64| TestRecord::new(json!({"a": a, "b": b, "c": c}));
        let q = query("a == 1 or b == 2 and c == 3");
        // a or (b and c), not (a or b) and c.
        assert!(q.matches(&rec(1, 0, 0)));
        assert!(q.matches(&rec(0, 2, 3)));
        assert!(!q.matches(&rec(0, 2, 0)));
        let q = query("b == 2 and c == 3 or a == 1");
        assert!(q.matches(&rec(1, 0, 0)));
        let q = query("(a == 1 or b == 2) and c == 3");
        assert!(!q.matches(&rec(1, 0, 0)));
        assert!(q.matches(&rec(1, 0, 3)));
        // (not a) and b, not not (a and b).
        let q = query("not a == 1 and b == 2");
        assert!(q.matches(&rec(0, 2, 0)));
        assert!(!q.matches(&rec(1, 0, 0)));
        let q = query("not (a == 1 and b == 2)");
        assert!(q.matches(&rec(1, 0, 0)));
        // (not a) or b
        let q = query("not a == 1 or b == 2");
        assert!(!q.matches(&rec(1, 0, 0)));
        assert!(q.matches(&rec(1, 2, 0)));
        // Comparison binds tighter than not: not (a == 1).
        let q = query("not a == 1");
        assert!(q.matches(&rec(2, 0, 0)));
    }

    #[test]
    fn functions_and_methods() {
        let rec = sample();
        expect_all(
            &rec,
            true,
            &[
                "exists(params.lr)",
                "exists(params['learning-rate'])",
                "exists(nothing)",
                "exists(tags[-1])",
                "exists(tags[0]) and not exists(tags[3])",
                "material.startswith('S')",
                "material.startswith('')",
                "material.endswith('i')",
                "material.contains('i')",
                "tags.contains('b')",
                "params.layers.contains(64.0)",
                "params.name.startswith('ad')",
                "material.startswith(meta.material)",
                "not missing.startswith('a')",
                "params.contains('lr') or true == true",
                "exists( count )",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "exists(missing)",
                "exists(params.missing)",
                "exists(tags[3])",
                "material.startswith('i')",
                "material.endswith('S')",
                "material.contains('x')",
                "tags.contains('z')",
                "tags.contains(['a'])",
                "count.startswith('7')",
                "material.startswith(1)",
                "material.startswith(missing)",
                "missing.contains('a')",
                "params.contains('lr')",
            ],
        );
    }

    // -- semantics: missing fields and mixed types -----------------------------------

    #[test]
    fn missing_fields_never_match_a_comparison() {
        let rec = sample();
        expect_all(
            &rec,
            false,
            &[
                "missing == 1",
                "missing != 1",
                "missing < 1",
                "missing <= 1",
                "missing > 1",
                "missing >= 1",
                "missing == null",
                "missing != null",
                "missing in [1, null]",
                "missing not in [1]",
                "missing == missing",
                "missing != missing",
                "1 == missing",
                "params.missing == 1",
                "params.lr.deeper != 1",
                "tags[9] != 'a'",
                "count in missing",
                "count not in missing",
            ],
        );
        // `not` inverts the result, so it matches when the field is missing.
        expect_all(
            &rec,
            true,
            &[
                "not missing == 1",
                "not (missing != 1)",
                "not missing in [1]",
                "not exists(missing)",
            ],
        );
    }

    #[test]
    fn mixed_types_are_false_for_every_operator() {
        let rec = sample();
        expect_all(
            &rec,
            false,
            &[
                "count == '7'",
                "count != '7'",
                "count < '8'",
                "count >= '7'",
                "material > 1",
                "material != 1",
                "ok == 1",
                "ok != 1",
                "nothing != 1",
                "nothing != 'x'",
                "nothing == false",
                "tags == 'a'",
                "tags != 'a'",
                "params == 1",
                "params != tags",
                "material == ['Si']",
            ],
        );
    }

    #[test]
    fn bools_null_lists_and_objects_are_not_ordered() {
        let rec = sample();
        expect_all(
            &rec,
            false,
            &[
                "ok < true",
                "ok <= true",
                "ok >= true",
                "ok > false",
                "nothing <= null",
                "nothing >= null",
                "tags <= ['a', 'b', 'c']",
                "tags < ['b']",
                "params >= params",
                "params.layers > [1]",
            ],
        );
        expect_all(
            &rec,
            true,
            &[
                "ok == true",
                "nothing == null",
                "params == params",
                "tags != params.layers",
            ],
        );
    }

    #[test]
    fn objects_compare_structurally_ignoring_key_order() {
        let rec = TestRecord::new(json!({
            "p": {"a": 1, "b": [1, {"c": null}]},
            "q": {"b": [1.0, {"c": null}], "a": 1.0},
            "r": {"a": 1, "b": [1, {"c": false}]},
            "s": {"a": 1},
        }));
        expect_all(
            &rec,
            true,
            &["p == q", "q == p", "p != r", "p != s", "s != p"],
        );
        expect_all(&rec, false, &["p != q", "p == r", "p == s"]);
    }

    #[test]
    fn deep_values_compare_without_recursion() {
        // Building and dropping a deep serde_json value recurses, so that happens on a
        // thread with a big stack; the query runs on one with a small stack.
        let big = std::thread::Builder::new().stack_size(512 << 20);
        let outcome = big
            .spawn(|| {
                let mut deep = json!(1);
                for _ in 0..100_000 {
                    deep = Value::Array(vec![deep]);
                }
                let rec = TestRecord::new(json!({"x": deep.clone(), "y": deep}));
                let q_eq = query("x == y");
                let q_ne = query("x != y");
                let outcome = std::thread::scope(|s| {
                    std::thread::Builder::new()
                        .stack_size(256 << 10)
                        .spawn_scoped(s, || (q_eq.matches(&rec), q_ne.matches(&rec)))
                        .unwrap()
                        .join()
                        .unwrap()
                });
                outcome
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(outcome, (true, false));
    }

    #[test]
    fn big_integers_compare_exactly() {
        let two53 = 1u64 << 53;
        let rec = TestRecord::new(json!({
            "big": two53 + 1,
            "b53": two53,
            "f53": two53 as f64,
            "umax": u64::MAX,
            "imin": i64::MIN,
            "imax": i64::MAX,
            "h": 0.5,
            "nh": -0.5,
        }));
        expect_all(
            &rec,
            true,
            &[
                "big > 9007199254740992",
                "big != 9007199254740992",
                "big == 9007199254740993",
                "big > b53",
                "big != b53",
                "big > f53",
                "big != f53",
                "big > 9007199254740992.0",
                "b53 == 9007199254740992.0",
                "b53 == f53",
                "f53 < 9007199254740993",
                "f53 != 9007199254740993",
                "9007199254740993 > f53",
                "umax == 18446744073709551615",
                "umax > 18446744073709551614",
                "umax > imax",
                // 2^64 does not fit in u64: a float literal.
                "umax < 18446744073709551616",
                "umax != 18446744073709551616",
                "umax < 18446744073709551615.0",
                "imin == -9223372036854775808",
                "imin == -9223372036854775808.0",
                "imin < -9223372036854775807",
                // Integer literals below -2^63 are floats: this one rounds to -2^63.
                "imin == -9223372036854775809",
                "imin > -1e19",
                "imax == 9223372036854775807",
                "imax < 9223372036854775808",
                "imax < 9223372036854775807.0",
                "h > 0",
                "h < 1",
                "h != 0",
                "nh < 0",
                "nh > -1",
                "nh != -1",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "big == 9007199254740992",
                "big == 9007199254740992.0",
                "big == f53",
                "f53 == 9007199254740993",
                "umax == 18446744073709551615.0",
                "imax == 9223372036854775807.0",
                "h == 0",
                "h == 1",
            ],
        );
    }

    // -- errors -----------------------------------------------------------------

    #[test]
    fn error_unexpected_token() {
        assert_err("temperature >> 3", 14, "unexpected token '>'");
        assert_err("temperature == == 3", 16, "unexpected token '=='");
        assert_err("and a == 1", 1, "unexpected token 'and'");
        assert_err("a == 1 and or b == 2", 12, "unexpected token 'or'");
        assert_err("a == 1 AND b == 2", 8, "did you mean 'and'?");
        assert_err("a == 1 Or b == 2", 8, "did you mean 'or'?");
        assert_err("a is None", 3, "use '==' or '!='");
        assert_err("a == )", 6, "unexpected token ')'");
        assert_err("()", 2, "unexpected token ')'");
        assert_err("a == -b", 7, "a number after '-'");
        assert_err("a == --1", 7, "a number after '-'");
        assert_err("x.", 3, "a field name after '.'");
        assert_err(
            "x.1 == 2",
            3,
            "unexpected token '1'; expected a field name after '.'",
        );
        assert_err("frames.0.dtype == 'f'", 8, "(write [0] to index a list)");
        assert_err("x not y", 7, "'in' after 'not'");
        assert_err("x == [1, y]", 10, "lists hold only literals");
        assert_err("x == [1,, 2]", 9, "unexpected token ','");
        assert_err("x == exists(y)", 6, "a condition, not a value");
        assert_err(
            "exists(a.startswith('x'))",
            8,
            "cannot be used as an argument",
        );
        assert_err("tags[1.5] == 1", 6, "an integer index");
        assert_err("tags[x] == 1", 6, "an integer index");
        assert_err("tags[99999999999999999999] == 1", 6, "index out of range");
        assert_err("tags[9223372036854775808] == 1", 6, "index out of range");
        assert_err("tags[-9223372036854775809] == 1", 7, "index out of range");
        assert_err("x == $", 6, "unexpected character '$'");
        assert_err("x == {}", 6, "unexpected character '{'");
        assert_err("a <> 1", 3, "use '!='");
        assert_err("x.startswith('a') == true", 19, "'and', 'or' or the end");
    }

    #[test]
    fn error_unexpected_end() {
        assert_err("x ==", 5, "unexpected end of expression");
        assert_err("x == ", 6, "unexpected end of expression");
        assert_err(
            "not",
            4,
            "unexpected end of expression; expected a condition",
        );
        assert_err("a == 1 and", 11, "unexpected end of expression");
        assert_err("x in", 5, "unexpected end of expression");
        assert_err("x not", 6, "'in' after 'not'");
    }

    #[test]
    fn error_empty_expression() {
        assert_err("", 1, "empty expression");
        assert_err("   ", 4, "empty expression");
        assert_err("\n\t", 3, "empty expression");
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
    fn error_unknown_function_and_method() {
        assert_err("foo(x)", 1, "unknown function 'foo'");
        assert_err("a == 1 and bar(x) == 2", 12, "unknown function 'bar'");
        assert_err("startswith(x, 'a')", 1, "startswith is a method");
        assert_err("x.upper('a')", 3, "unknown method 'upper'");
        assert_err("x.exists(y)", 3, "exists is a function");
        assert_err("meta.startswith('a')", 6, "a method needs a field");
    }

    #[test]
    fn error_wrong_arity() {
        assert_err("exists()", 8, "exactly one argument (got 0)");
        assert_err("exists(a, b)", 11, "exactly one argument (got 2)");
        assert_err("exists(a, b, c)", 11, "(got 3)");
        assert_err(
            "x.startswith()",
            14,
            "startswith() takes exactly one argument (got 0)",
        );
        assert_err(
            "x.contains('a', 'b')",
            17,
            "contains() takes exactly one argument (got 2)",
        );
        assert_err("exists(3)", 8, "takes a field path");
        assert_err("exists('a')", 8, "takes a field path");
    }

    #[test]
    fn error_missing_closing_parenthesis_or_bracket() {
        assert_err("(a == 1", 8, "missing closing parenthesis");
        assert_err("((a == 1) or b == 2", 20, "close the '(' at column 1");
        assert_err("(a == 1 b == 2", 9, "found 'b'");
        assert_err("exists(a", 9, "missing closing parenthesis");
        assert_err("exists(a b)", 10, "expected ',' or ')'");
        assert_err("x in [1, 2", 11, "missing closing bracket");
        assert_err("x in [1 2]", 9, "close the '[' at column 6");
        assert_err("tags[0 == 1", 8, "missing closing bracket");
    }

    #[test]
    fn error_trailing_input() {
        assert_err(
            "a == 1 b",
            8,
            "expected 'and', 'or' or the end of the expression",
        );
        assert_err("a == 1 'x'", 8, "unexpected token string 'x'");
        assert_err("a == 1)", 7, "unmatched ')'");
        assert_err("(a == 1))", 9, "unmatched ')'");
        assert_err("exists(a) 2", 11, "expected 'and', 'or'");
    }

    #[test]
    fn error_bare_path_suggests_exists() {
        assert_err("temperature", 1, "exists(temperature)");
        assert_err("temperature", 1, "temperature == true");
        assert_err(
            "a == 1 and temperature",
            12,
            "'temperature' alone is not a condition",
        );
        assert_err("(params.lr)", 2, "exists(params.lr)");
        assert_err("tags[0] or a == 1", 1, "exists(tags[0])");
        assert_err("key", 1, "'key' alone");
        assert_err("not x", 5, "exists(x)");
        assert_err("temperature 300", 13, "expected a comparison operator");
        assert_err("true", 1, "a value alone is not a condition");
        assert_err("'Si' and a == 1", 1, "a value alone");
        assert_err("meta == 1", 1, "'meta' must be followed by a field");
        assert_err("exists(meta)", 8, "'meta' must be followed by a field");
        assert_err("key.x == 1", 5, "record key is a string");
        assert_err("key[0] == 'r'", 4, "cannot be indexed");
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
    fn nesting_depth_is_capped() {
        let ok = format!("{}a == 1{}", "(".repeat(64), ")".repeat(64));
        assert!(check(&ok, &TestRecord::new(json!({"a": 1}))));
        let deep = format!("{}a == 1{}", "(".repeat(65), ")".repeat(65));
        assert_err(&deep, 65, "nested too deeply");
        assert_err(&"(".repeat(60_000), 65, "nested too deeply");

        let ok = format!("{}a == 1", "not ".repeat(64));
        assert!(check(&ok, &TestRecord::new(json!({"a": 1}))));
        assert_err(
            &format!("{}a == 1", "not ".repeat(65)),
            257,
            "nested too deeply",
        );

        let ok = format!("x == {}{}", "[".repeat(64), "]".repeat(64));
        Query::parse(&ok).unwrap();
        assert_err(
            &format!("x == {}{}", "[".repeat(65), "]".repeat(65)),
            70,
            "nested too deeply",
        );

        let mixed = format!(
            "{}{}a == 1{}",
            "(".repeat(40),
            "not ".repeat(30),
            ")".repeat(40)
        );
        assert_err(&mixed, 137, "nested too deeply");
        assert_err(&"exists(".repeat(100), 7 * 65, "nested too deeply");
        assert_err(&"x.contains(".repeat(100), 11 * 65, "nested too deeply");
    }

    #[test]
    fn source_length_is_capped() {
        let mut long = "a == 1 or ".repeat(MAX_QUERY_BYTES / 10 + 1);
        long.push_str("a == 1");
        assert!(long.len() > MAX_QUERY_BYTES);
        assert_err(&long, MAX_QUERY_BYTES + 1, "too long");
        // Multi-byte characters: the column still counts characters.
        let wide = format!("s == '{}'", "é".repeat(MAX_QUERY_BYTES));
        let e = parse_err(&wide);
        assert_eq!(e.column, 6 + (MAX_QUERY_BYTES - 6) / 2 + 1);
        // Exactly at the limit is fine.
        let fits = format!("s == '{}'", "x".repeat(MAX_QUERY_BYTES - 7));
        assert_eq!(fits.len(), MAX_QUERY_BYTES);
        Query::parse(&fits).unwrap();
    }

    // -- error display -----------------------------------------------------------

    /// The character of `expression` above the caret of the displayed error.
    fn char_above_caret(e: &QueryError) -> Option<char> {
        let shown = e.to_string();
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 3, "{shown}");
        let caret = lines[2].chars().count() - 1;
        assert!(lines[2].ends_with('^') && lines[2].trim() == "^", "{shown}");
        lines[1].chars().nth(caret)
    }

    #[test]
    fn error_display_points_at_the_column() {
        let e = parse_err("temperature >> 3");
        let shown = e.to_string();
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(
            lines[0],
            "unexpected token '>'; expected a value (number, string, list, true, false, null \
             or field path) at column 14"
        );
        assert_eq!(lines[1], "  temperature >> 3");
        assert_eq!(lines[2], format!("  {}^", " ".repeat(13)));

        assert_eq!(char_above_caret(&parse_err("温度 == 1 ü")), Some('ü'));
        assert_eq!(char_above_caret(&parse_err("a ==\n\t$ ")), Some('$'));
        // At the end of the expression the caret is one past the last character.
        let e = parse_err("a ==");
        assert_eq!(char_above_caret(&e), None);
        assert!(e.to_string().ends_with("\n  a ==\n      ^"));
    }

    #[test]
    fn error_display_windows_long_expressions() {
        let src = format!(
            "{}a == 1 $ {}",
            "b == 1 and ".repeat(40),
            "c == 2 and ".repeat(40)
        );
        let e = parse_err(&src);
        assert_eq!(e.column, 40 * 11 + 8);
        let shown = e.to_string();
        let line = shown.lines().nth(1).unwrap();
        assert!(
            line.starts_with("  ...") && line.ends_with("..."),
            "{shown}"
        );
        assert!(line.chars().count() < 140, "{shown}");
        assert_eq!(char_above_caret(&e), Some('$'));
        // Near the start and the end.
        let e = parse_err(&format!("$ {}", "c == 2 and ".repeat(40)));
        assert_eq!(char_above_caret(&e), Some('$'));
        let e = parse_err(&format!("{}a ==", "c == 2 and ".repeat(40)));
        assert_eq!(char_above_caret(&e), None);
        assert!(e.to_string().lines().nth(1).unwrap().ends_with("a =="));
    }

    #[test]
    fn error_is_a_std_error() {
        let e: Box<dyn std::error::Error + Send + Sync> = Box::new(parse_err("a"));
        assert!(e.to_string().contains("at column 1"));
    }

    // -- API ---------------------------------------------------------------------

    #[test]
    fn from_str_source_and_display() {
        let q: Query = "count == 7".parse().unwrap();
        assert_eq!(q.source(), "count == 7");
        assert_eq!(q.to_string(), "count == 7");
        assert!("count ==".parse::<Query>().is_err());
        let rec = sample();
        let dynamic: &dyn RecordView = &rec;
        assert!(q.matches(dynamic));
        assert!(q.clone().matches(&rec));
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Query>();
        assert_send_sync::<QueryError>();
    }

    #[test]
    fn keywords_are_field_names_after_a_dot() {
        let rec = TestRecord::new(json!({"p": {"and": 1, "in": 2, "not": 3, "key": 4}, "in": 5}));
        expect_all(
            &rec,
            true,
            &[
                "p.and == 1",
                "p.in == 2",
                "p.not == 3",
                "p.key == 4",
                "meta.in == 5",
                "meta['in'] == 5",
            ],
        );
        assert_err("in == 5", 1, "unexpected token 'in'");
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

    // -- QUERY.md ------------------------------------------------------------------

    /// The contents of the `...` code spans of a line of markdown.
    fn code_spans(text: &str) -> Vec<&str> {
        text.split('`').skip(1).step_by(2).collect()
    }

    #[test]
    fn documented_examples_parse() {
        let doc = include_str!("../QUERY.md");
        let mut count = 0;
        for line in doc.lines() {
            if let Some(rest) = line.trim().strip_prefix("store.find(\"") {
                query(rest.strip_suffix("\")").expect("store.find(\"...\")"));
                count += 1;
            }
        }
        let examples = doc
            .split("## More examples")
            .nth(1)
            .and_then(|s| s.split("```text").nth(1))
            .and_then(|s| s.split("```").next())
            .expect("a text block under 'More examples'");
        for line in examples.lines().filter(|l| !l.trim().is_empty()) {
            query(line);
            count += 1;
        }
        assert!(count >= 15, "found {count} examples");
    }

    #[test]
    fn documented_errors_match() {
        let doc = include_str!("../QUERY.md");
        let table = doc.split("## Errors").nth(1).expect("an Errors section");
        let mut count = 0;
        for row in table.lines().filter(|l| l.starts_with("| ")) {
            let cells: Vec<&str> = row.split(" | ").collect();
            if cells.len() < 4 {
                continue;
            }
            let digits: String = cells[2].chars().take_while(char::is_ascii_digit).collect();
            let Ok(column) = digits.parse::<usize>() else {
                continue;
            };
            let examples = code_spans(cells[1]);
            let messages = code_spans(cells[3]);
            for (i, example) in examples.iter().enumerate() {
                let e = parse_err(example);
                assert_eq!(e.column, column, "documented column of {example:?}: {e}");
                let expected = if messages.len() == examples.len() {
                    messages[i]
                } else {
                    messages[0]
                };
                for piece in expected
                    .split("...")
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                {
                    assert!(
                        e.message.contains(piece),
                        "documented message of {example:?} has {piece:?}: {e}"
                    );
                }
                count += 1;
            }
        }
        assert!(count >= 20, "checked {count} documented errors");
    }

    // -- property tests ------------------------------------------------------------

    /// A path in a generated query.
    #[derive(Debug, Clone)]
    struct RPath {
        root: &'static str,
        segs: Vec<RSeg>,
    }

    #[derive(Debug, Clone)]
    enum RSeg {
        Field(&'static str, bool),
        Index(i64),
    }

    #[derive(Debug, Clone, Copy)]
    enum ROp {
        Eq,
        Ne,
        Lt,
        Le,
        Gt,
        Ge,
    }

    #[derive(Debug, Clone, Copy)]
    enum RMethod {
        StartsWith,
        EndsWith,
        Contains,
    }

    /// A generated query, evaluated by the reference evaluator below.
    #[derive(Debug, Clone)]
    enum RExpr {
        Cmp(RPath, ROp, Value, bool),
        CmpPaths(RPath, ROp, RPath),
        In(RPath, Vec<Value>, bool),
        Exists(RPath),
        Method(RPath, RMethod, Value),
        Not(Box<RExpr>),
        And(Vec<RExpr>),
        Or(Vec<RExpr>),
        Paren(Box<RExpr>),
    }

    fn string_strategy() -> impl Strategy<Value = String> {
        let chars = vec![
            'a', 'b', 'Z', '\'', '"', '\\', '\n', 'é', '😀', '\u{ffff}', ' ',
        ];
        prop::collection::vec(prop::sample::select(chars), 0..4)
            .prop_map(|v| v.into_iter().collect())
    }

    fn scalar_strategy() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-3i64..=3).prop_map(Value::from),
            prop::sample::select(vec![
                9_007_199_254_740_992i64,
                9_007_199_254_740_993,
                -9_007_199_254_740_993,
                i64::MIN,
                i64::MAX,
            ])
            .prop_map(Value::from),
            Just(Value::from(u64::MAX)),
            (-6i32..=6).prop_map(|k| Value::from(f64::from(k) / 2.0)),
            prop::sample::select(vec![
                9_007_199_254_740_992.0f64,
                1e20,
                -1e20,
                18_446_744_073_709_551_616.0,
                -0.0,
            ])
            .prop_map(Value::from),
            string_strategy().prop_map(Value::String),
        ]
    }

    fn value_strategy() -> impl Strategy<Value = Value> {
        prop_oneof![
            4 => scalar_strategy(),
            1 => prop::collection::vec(scalar_strategy(), 0..3).prop_map(Value::Array),
            1 => (scalar_strategy(), scalar_strategy()).prop_map(|(x, y)| json!({"x": x, "y z": y})),
        ]
    }

    fn literal_strategy() -> impl Strategy<Value = Value> {
        prop_oneof![
            4 => scalar_strategy(),
            1 => prop::collection::vec(scalar_strategy(), 0..3).prop_map(Value::Array),
        ]
    }

    const FIELDS: [&str; 4] = ["a", "b", "c", "d"];

    fn record_strategy() -> impl Strategy<Value = TestRecord> {
        prop::collection::vec(prop::option::of(value_strategy()), 4).prop_map(|values| {
            let mut meta = Map::new();
            for (name, value) in FIELDS.iter().zip(values) {
                if let Some(value) = value {
                    meta.insert((*name).to_owned(), value);
                }
            }
            TestRecord::new(Value::Object(meta))
        })
    }

    fn path_strategy() -> impl Strategy<Value = RPath> {
        let seg = prop_oneof![
            any::<bool>().prop_map(|b| RSeg::Field("x", b)),
            Just(RSeg::Field("y z", true)),
            (-2i64..=2).prop_map(RSeg::Index),
        ];
        (
            prop::sample::select(FIELDS.to_vec()),
            prop::collection::vec(seg, 0..2),
        )
            .prop_map(|(root, segs)| RPath { root, segs })
    }

    fn op_strategy() -> impl Strategy<Value = ROp> {
        prop::sample::select(vec![ROp::Eq, ROp::Ne, ROp::Lt, ROp::Le, ROp::Gt, ROp::Ge])
    }

    fn expr_strategy() -> impl Strategy<Value = RExpr> {
        let leaf = prop_oneof![
            4 => (path_strategy(), op_strategy(), literal_strategy(), any::<bool>())
                .prop_map(|(p, op, v, flip)| RExpr::Cmp(p, op, v, flip)),
            1 => (path_strategy(), op_strategy(), path_strategy())
                .prop_map(|(p, op, q)| RExpr::CmpPaths(p, op, q)),
            2 => (path_strategy(), prop::collection::vec(scalar_strategy(), 0..3), any::<bool>())
                .prop_map(|(p, items, neg)| RExpr::In(p, items, neg)),
            1 => path_strategy().prop_map(RExpr::Exists),
            1 => (
                path_strategy(),
                prop::sample::select(vec![RMethod::StartsWith, RMethod::EndsWith, RMethod::Contains]),
                literal_strategy(),
            )
                .prop_map(|(p, m, v)| RExpr::Method(p, m, v)),
        ];
        leaf.prop_recursive(4, 32, 3, |inner| {
            prop_oneof![
                inner.clone().prop_map(|e| RExpr::Not(Box::new(e))),
                prop::collection::vec(inner.clone(), 2..4).prop_map(RExpr::And),
                prop::collection::vec(inner.clone(), 2..4).prop_map(RExpr::Or),
                inner.prop_map(|e| RExpr::Paren(Box::new(e))),
            ]
        })
    }

    /// How a generated query is spelled: spacing, quotes, keyword spellings.
    #[derive(Debug, Clone, Copy)]
    struct Style {
        tight: bool,
        double_quotes: bool,
        python_words: bool,
        escape_unicode: bool,
    }

    fn style_strategy() -> impl Strategy<Value = Style> {
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(a, b, c, d)| {
            Style {
                tight: a,
                double_quotes: b,
                python_words: c,
                escape_unicode: d,
            }
        })
    }

    fn render_value(v: &Value, style: Style, out: &mut String) {
        match v {
            Value::Null => out.push_str(if style.python_words { "None" } else { "null" }),
            Value::Bool(b) => out.push_str(match (b, style.python_words) {
                (true, false) => "true",
                (true, true) => "True",
                (false, false) => "false",
                (false, true) => "False",
            }),
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => out.push_str(&u.to_string()),
                (_, Some(i), _) => out.push_str(&i.to_string()),
                (_, _, Some(f)) => out.push_str(&format!("{f:?}")),
                _ => unreachable!(),
            },
            Value::String(s) => {
                let quote = if style.double_quotes { '"' } else { '\'' };
                out.push(quote);
                for c in s.chars() {
                    match c {
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        c if c == quote => {
                            out.push('\\');
                            out.push(c);
                        }
                        c if style.escape_unicode && !c.is_ascii() => {
                            let mut units = [0u16; 2];
                            for unit in c.encode_utf16(&mut units) {
                                out.push_str(&format!("\\u{unit:04x}"));
                            }
                        }
                        c => out.push(c),
                    }
                }
                out.push(quote);
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    render_value(item, style, out);
                }
                out.push(']');
            }
            Value::Object(_) => unreachable!("no object literals"),
        }
    }

    fn render_path(p: &RPath, out: &mut String) {
        out.push_str(p.root);
        for seg in &p.segs {
            match seg {
                RSeg::Field(name, true) => out.push_str(&format!("[{name:?}]")),
                RSeg::Field(name, false) => {
                    out.push('.');
                    out.push_str(name);
                }
                RSeg::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
    }

    fn op_text(op: ROp) -> &'static str {
        match op {
            ROp::Eq => "==",
            ROp::Ne => "!=",
            ROp::Lt => "<",
            ROp::Le => "<=",
            ROp::Gt => ">",
            ROp::Ge => ">=",
        }
    }

    fn precedence(e: &RExpr) -> u8 {
        match e {
            RExpr::Or(_) => 1,
            RExpr::And(_) => 2,
            RExpr::Not(_) => 3,
            _ => 4,
        }
    }

    /// Renders `e` with the fewest parentheses the precedence rules allow (plus the
    /// explicit `Paren` nodes).
    fn render(e: &RExpr, style: Style, out: &mut String) {
        let sp = if style.tight { "" } else { " " };
        let child = |c: &RExpr, min: u8, out: &mut String| {
            if precedence(c) < min {
                out.push('(');
                render(c, style, out);
                out.push(')');
            } else {
                render(c, style, out);
            }
        };
        match e {
            RExpr::Cmp(p, op, v, flip) => {
                if *flip {
                    render_value(v, style, out);
                    out.push_str(&format!("{sp}{}{sp}", op_text(*op)));
                    render_path(p, out);
                } else {
                    render_path(p, out);
                    out.push_str(&format!("{sp}{}{sp}", op_text(*op)));
                    render_value(v, style, out);
                }
            }
            RExpr::CmpPaths(p, op, q) => {
                render_path(p, out);
                out.push_str(&format!("{sp}{}{sp}", op_text(*op)));
                render_path(q, out);
            }
            RExpr::In(p, items, negated) => {
                render_path(p, out);
                out.push_str(if *negated { " not in " } else { " in " });
                render_value(&Value::Array(items.clone()), style, out);
            }
            RExpr::Exists(p) => {
                out.push_str("exists(");
                render_path(p, out);
                out.push(')');
            }
            RExpr::Method(p, m, v) => {
                render_path(p, out);
                out.push_str(match m {
                    RMethod::StartsWith => ".startswith(",
                    RMethod::EndsWith => ".endswith(",
                    RMethod::Contains => ".contains(",
                });
                render_value(v, style, out);
                out.push(')');
            }
            RExpr::Not(inner) => {
                out.push_str("not ");
                child(inner, 3, out);
            }
            RExpr::And(items) | RExpr::Or(items) => {
                let (word, min) = if matches!(e, RExpr::And(_)) {
                    ("and", 2)
                } else {
                    ("or", 1)
                };
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&format!(" {word} "));
                    }
                    child(item, min, out);
                }
            }
            RExpr::Paren(inner) => {
                out.push('(');
                render(inner, style, out);
                out.push(')');
            }
        }
    }

    // The reference evaluator: written for clarity, independently of the module.

    fn ref_get<'a>(meta: &'a Map<String, Value>, p: &RPath) -> Option<&'a Value> {
        let mut v = meta.get(p.root)?;
        for seg in &p.segs {
            v = match seg {
                RSeg::Field(name, _) => v.as_object()?.get(*name)?,
                RSeg::Index(i) => {
                    let items = v.as_array()?;
                    let i = if *i < 0 { items.len() as i64 + i } else { *i };
                    if i < 0 {
                        return None;
                    }
                    items.get(i as usize)?
                }
            };
        }
        Some(v)
    }

    /// Twice the number, exactly (the generated floats are multiples of 0.5).
    fn ref_doubled(n: &serde_json::Number) -> i128 {
        if let Some(u) = n.as_u64() {
            i128::from(u) * 2
        } else if let Some(i) = n.as_i64() {
            i128::from(i) * 2
        } else {
            let f = n.as_f64().unwrap() * 2.0;
            assert_eq!(f.fract(), 0.0);
            f as i128
        }
    }

    fn ref_eq(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(x), Value::Bool(y)) => x == y,
            (Value::Number(x), Value::Number(y)) => ref_doubled(x) == ref_doubled(y),
            (Value::String(x), Value::String(y)) => x == y,
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| ref_eq(p, q))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .all(|(k, v)| y.get(k).is_some_and(|w| ref_eq(v, w)))
            }
            _ => false,
        }
    }

    fn ref_cmp(a: &Value, op: ROp, b: &Value) -> bool {
        if std::mem::discriminant(a) != std::mem::discriminant(b) {
            return false;
        }
        let order = match (a, b) {
            (Value::Number(x), Value::Number(y)) => Some(ref_doubled(x).cmp(&ref_doubled(y))),
            (Value::String(x), Value::String(y)) => Some(x.chars().cmp(y.chars())),
            _ => None,
        };
        match (op, order) {
            (ROp::Eq, _) => ref_eq(a, b),
            (ROp::Ne, _) => !ref_eq(a, b),
            (_, None) => false,
            (ROp::Lt, Some(o)) => o == Ordering::Less,
            (ROp::Le, Some(o)) => o != Ordering::Greater,
            (ROp::Gt, Some(o)) => o == Ordering::Greater,
            (ROp::Ge, Some(o)) => o != Ordering::Less,
        }
    }

    fn ref_eval(e: &RExpr, meta: &Map<String, Value>) -> bool {
        match e {
            RExpr::Cmp(p, op, v, flip) => match ref_get(meta, p) {
                None => false,
                Some(x) if *flip => ref_cmp(v, *op, x),
                Some(x) => ref_cmp(x, *op, v),
            },
            RExpr::CmpPaths(p, op, q) => match (ref_get(meta, p), ref_get(meta, q)) {
                (Some(x), Some(y)) => ref_cmp(x, *op, y),
                _ => false,
            },
            RExpr::In(p, items, negated) => match ref_get(meta, p) {
                None => false,
                Some(x) => items.iter().any(|i| ref_eq(x, i)) != *negated,
            },
            RExpr::Exists(p) => ref_get(meta, p).is_some(),
            RExpr::Method(p, m, arg) => match (ref_get(meta, p), m, arg) {
                (Some(Value::String(s)), RMethod::StartsWith, Value::String(a)) => {
                    s.starts_with(a.as_str())
                }
                (Some(Value::String(s)), RMethod::EndsWith, Value::String(a)) => {
                    s.ends_with(a.as_str())
                }
                (Some(Value::String(s)), RMethod::Contains, Value::String(a)) => {
                    s.contains(a.as_str())
                }
                (Some(Value::Array(items)), RMethod::Contains, a) => {
                    items.iter().any(|i| ref_eq(i, a))
                }
                _ => false,
            },
            RExpr::Not(inner) => !ref_eval(inner, meta),
            RExpr::And(items) => items.iter().all(|i| ref_eval(i, meta)),
            RExpr::Or(items) => items.iter().any(|i| ref_eval(i, meta)),
            RExpr::Paren(inner) => ref_eval(inner, meta),
        }
    }

    /// Parses arbitrary text; on success evaluates it, on failure checks the error.
    fn parse_never_panics(src: &str) {
        match Query::parse(src) {
            Ok(q) => {
                assert_eq!(q.source(), src);
                for rec in [sample(), TestRecord::new(json!({}))] {
                    q.matches(&rec);
                }
            }
            Err(e) => {
                let n = src.chars().count();
                assert!(
                    (1..=n + 1).contains(&e.column),
                    "column {} of {src:?}",
                    e.column
                );
                assert!(e.to_string().contains(&e.message));
                assert_eq!(e.expression, src);
            }
        }
    }

    const TOKENS: &[&str] = &[
        "(",
        ")",
        "[",
        "]",
        ",",
        ".",
        "-",
        "==",
        "!=",
        "<",
        "<=",
        ">",
        ">=",
        "=",
        "!",
        "&&",
        "and",
        "or",
        "not",
        "in",
        "exists",
        "startswith",
        "contains",
        "key",
        "meta",
        "a",
        "tags",
        "image",
        "shape",
        "dtype",
        "1",
        "-2",
        "2.5",
        "1e3",
        "'s'",
        "\"t\"",
        "'",
        "\\",
        "true",
        "None",
        "温度",
        "😀",
        " ",
        "\n",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn generated_queries_parse_and_agree_with_reference(
            expr in expr_strategy(),
            style in style_strategy(),
            records in prop::collection::vec(record_strategy(), 1..4),
        ) {
            let mut src = String::new();
            render(&expr, style, &mut src);
            let q = Query::parse(&src).map_err(|e| TestCaseError::fail(format!("{src:?}: {e}")))?;
            for rec in &records {
                prop_assert_eq!(
                    q.matches(rec),
                    ref_eval(&expr, &rec.meta),
                    "query {:?} on {:?}", src, rec.meta
                );
            }
        }

        #[test]
        fn arbitrary_strings_never_panic(src in any::<String>()) {
            parse_never_panics(&src);
        }

        #[test]
        fn token_soup_never_panics(tokens in prop::collection::vec(prop::sample::select(TOKENS), 0..40)) {
            parse_never_panics(&tokens.join(" "));
            parse_never_panics(&tokens.concat());
        }

        #[test]
        fn mutated_queries_never_panic(
            expr in expr_strategy(),
            style in style_strategy(),
            at in any::<prop::sample::Index>(),
            insert in prop::sample::select(vec!["", "(", ")", "'", "\"", "[", "]", "not ", "\\", "=", "é"]),
        ) {
            let mut src = String::new();
            render(&expr, style, &mut src);
            let chars: Vec<char> = src.chars().collect();
            let i = at.index(chars.len() + 1);
            let mut mutated: String = chars[..i].iter().collect();
            mutated.push_str(insert);
            // Drop one character when inserting nothing.
            let skip = usize::from(insert.is_empty() && i < chars.len());
            mutated.extend(&chars[i + skip..]);
            parse_never_panics(&mutated);
        }

        #[test]
        fn integers_compare_exactly(
            a in prop_oneof![any::<i64>().prop_map(i128::from), any::<u64>().prop_map(i128::from),
                             (-3i128..=3).prop_map(|d| (1i128 << 53) + d)],
            b in prop_oneof![any::<i64>().prop_map(i128::from), any::<u64>().prop_map(i128::from),
                             (-3i128..=3).prop_map(|d| (1i128 << 53) + d)],
        ) {
            let value = |n: i128| if n < 0 { Value::from(n as i64) } else { Value::from(n as u64) };
            let rec = TestRecord::new(json!({"x": value(a)}));
            let want = a.cmp(&b);
            for (op, ok) in [("==", want.is_eq()), ("!=", want.is_ne()), ("<", want.is_lt()),
                             ("<=", want.is_le()), (">", want.is_gt()), (">=", want.is_ge())] {
                prop_assert_eq!(check(&format!("x {op} {b}"), &rec), ok, "{} {} {}", a, op, b);
            }
        }

        #[test]
        fn integers_and_floats_compare_exactly(
            i in prop_oneof![any::<i64>().prop_map(i128::from), any::<u64>().prop_map(i128::from),
                             (-3i128..=3).prop_map(|d| (1i128 << 53) + d)],
            f in prop_oneof![
                any::<f64>().prop_filter("finite", |f| f.is_finite()),
                (-1e20f64..1e20),
                (-3i64..=3).prop_map(|d| (1u64 << 53) as f64 + d as f64 * 0.5),
            ],
            near in any::<bool>(),
        ) {
            // Often compare with the float nearest the integer, or its neighbours.
            let f = if near {
                let g = i as f64;
                match (f.to_bits() % 3, g) {
                    (0, g) => g,
                    (1, g) => f64::from_bits(g.to_bits() + 1),
                    (_, g) if g != 0.0 => f64::from_bits(g.to_bits() - 1),
                    (_, g) => g,
                }
            } else {
                f
            };
            prop_assume!(f.is_finite());
            let want = ref_cmp_int_float(i, f);
            let value = |n: i128| if n < 0 { Value::from(n as i64) } else { Value::from(n as u64) };
            let int_rec = TestRecord::new(json!({"x": value(i)}));
            let float_rec = TestRecord::new(json!({"x": f}));
            for (op, ok) in [("==", want.is_eq()), ("!=", want.is_ne()), ("<", want.is_lt()),
                             ("<=", want.is_le()), (">", want.is_gt()), (">=", want.is_ge())] {
                prop_assert_eq!(check(&format!("x {op} {f:?}"), &int_rec), ok, "{} {} {:?}", i, op, f);
                prop_assert_eq!(check(&format!("{i} {op} x"), &float_rec), ok, "{} {} {:?}", i, op, f);
            }
        }
    }

    /// Exact order of an integer and a float from the float's bits: f = m * 2^e.
    fn ref_cmp_int_float(i: i128, f: f64) -> Ordering {
        let bits = f.to_bits();
        let negative = bits >> 63 == 1;
        let biased = ((bits >> 52) & 0x7ff) as i32;
        let fraction = i128::from(bits & ((1u64 << 52) - 1));
        let (mantissa, exp) = if biased == 0 {
            (fraction, -1074)
        } else {
            (fraction | (1 << 52), biased - 1075)
        };
        let m = if negative { -mantissa } else { mantissa };
        if exp >= 0 {
            if exp > 70 {
                // |f| >= 2^70 > |i|
                return 0.cmp(&m);
            }
            i.cmp(&(m << exp))
        } else if -exp > 60 {
            // |f| < 2^53 / 2^61 < 1
            match i.cmp(&0) {
                Ordering::Equal => 0.cmp(&m),
                other => other,
            }
        } else {
            (i << -exp).cmp(&m)
        }
    }

    #[test]
    fn reference_int_float_order_is_sane() {
        assert_eq!(ref_cmp_int_float(1, 0.5), Ordering::Greater);
        assert_eq!(ref_cmp_int_float(0, 0.5), Ordering::Less);
        assert_eq!(ref_cmp_int_float(0, -0.0), Ordering::Equal);
        assert_eq!(ref_cmp_int_float(-1, -0.5), Ordering::Less);
        assert_eq!(
            ref_cmp_int_float((1 << 53) + 1, (1u64 << 53) as f64),
            Ordering::Greater
        );
        assert_eq!(ref_cmp_int_float(5, 1e300), Ordering::Less);
        assert_eq!(ref_cmp_int_float(5, -1e300), Ordering::Greater);
        assert_eq!(ref_cmp_int_float(0, 5e-324), Ordering::Less);
    }

    #[test]
    fn generated_query_rendering_round_trips_examples() {
        // Spot checks of the generator's renderer, so the property test means something.
        let style = Style {
            tight: false,
            double_quotes: false,
            python_words: true,
            escape_unicode: true,
        };
        let e = RExpr::And(vec![
            RExpr::Or(vec![
                RExpr::Exists(RPath {
                    root: "a",
                    segs: vec![RSeg::Field("y z", true)],
                }),
                RExpr::Cmp(
                    RPath {
                        root: "b",
                        segs: vec![RSeg::Index(-1)],
                    },
                    ROp::Le,
                    json!("é'"),
                    true,
                ),
            ]),
            RExpr::Not(Box::new(RExpr::In(
                RPath {
                    root: "c",
                    segs: vec![],
                },
                vec![Value::Null],
                true,
            ))),
        ]);
        let mut src = String::new();
        render(&e, style, &mut src);
        assert_eq!(
            src,
            r#"(exists(a["y z"]) or '\u00e9\'' <= b[-1]) and not c not in [None]"#
        );
        let rec = TestRecord::new(json!({"a": {"y z": 1}, "c": null}));
        assert_eq!(query(&src).matches(&rec), ref_eval(&e, &rec.meta));
        assert!(query(&src).matches(&rec));
    }

    #[test]
    fn needs_reads_array_entries_only_for_facts_and_exists() {
        let needs = |q: &str| Query::parse(q).unwrap().needs();
        let plain = needs("temperature > 399.0 and material == 'Si'");
        assert!(!plain.arrays);
        let fields: std::collections::HashSet<String> =
            ["temperature", "material"].map(String::from).into();
        assert_eq!(plain.fields, fields);
        assert!(plain.wants("material") && !plain.wants("note"));
        assert!(!needs("params.lr < 1 or name.startswith('a')").arrays);
        assert!(needs("image.shape[0] == 480").arrays);
        assert!(needs("image.dtype == 'uint8'").arrays);
        assert!(needs("exists(image)").arrays);
        assert!(needs("exists(frames[0])").arrays);
        assert!(!needs("key == 'a'").arrays);
        assert!(needs("key == 'a'").fields.is_empty());
    }
}
