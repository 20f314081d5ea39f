//! The parser: recursive descent from tokens to the syntax tree, one method
//! per grammar rule of `store/QUERY.md` (`or` below `and` below `not` below
//! comparison). It enforces [`MAX_QUERY_BYTES`] and [`MAX_NESTING`], and its
//! errors name what was expected and, where a common slip is likely, the fix.

use serde_json::Value;

use super::ast::{CmpOp, Method, Node, Operand, PathExpr, Root, Seg};
use super::error::QueryError;
use super::lexer::{shorten, Lexer, Tok, Token, KEYWORDS};
use super::{MAX_NESTING, MAX_QUERY_BYTES};

/// A value-like term, or a call that is already a condition.
enum Term {
    Value(Operand),
    Cond(Node),
}

/// The parser's state: the lexer, the current token (one token of lookahead)
/// and the nesting depth so far.
struct Parser<'s> {
    lexer: Lexer<'s>,
    cur: Token,
    depth: usize,
}

/// Parses a whole query source into its syntax tree.
pub(super) fn parse_query(src: &str) -> Result<Node, QueryError> {
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

    /// One level deeper (a parenthesis, `not`, a list or call arguments
    /// opened at `col`); fails beyond [`MAX_NESTING`], so that recursion
    /// cannot overflow the stack.
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

    /// Consumes the closer of `open` (`)` for `(`, `]` for `[`).
    fn close(&mut self, open: &Token) -> Result<Token, QueryError> {
        if self.cur.tok == Delimiters::of(open).close {
            return self.advance();
        }
        Err(self.missing_close(open, false))
    }

    /// The error for a current token that should have closed `open`;
    /// `or_comma` where a `,` and another item could also have come.
    fn missing_close(&self, open: &Token, or_comma: bool) -> QueryError {
        let pair = Delimiters::of(open);
        let comma = if or_comma { "',' or " } else { "" };
        self.error(
            self.cur.col,
            format!(
                "missing closing {}: expected {comma}'{}' to close the '{}' at column {}, \
                 found {}",
                pair.name,
                pair.close_char,
                pair.open_char,
                open.col,
                self.describe(&self.cur)
            ),
        )
    }

    /// `item, item, ...` up to the closer of the current token (`(` or `[`),
    /// which counts as one level of nesting; returns the items and the
    /// closer. A comma before the closer is allowed where `trailing_comma`
    /// (list literals, as in Python), not in call arguments.
    fn parse_delimited<T>(
        &mut self,
        trailing_comma: bool,
        mut item: impl FnMut(&mut Self) -> Result<T, QueryError>,
    ) -> Result<(Vec<T>, Token), QueryError> {
        let open = self.advance()?;
        self.enter(open.col)?;
        let close = Delimiters::of(&open).close;
        let mut items = Vec::new();
        if self.cur.tok != close {
            loop {
                items.push(item(self)?);
                if self.cur.tok == close {
                    break;
                }
                if self.cur.tok != Tok::Comma {
                    return Err(self.missing_close(&open, true));
                }
                self.advance()?;
                if trailing_comma && self.cur.tok == close {
                    break;
                }
            }
        }
        let closer = self.advance()?;
        self.leave();
        Ok((items, closer))
    }

    fn parse_or(&mut self) -> Result<Node, QueryError> {
        self.parse_joined("or", Self::parse_and, Node::Or)
    }

    fn parse_and(&mut self) -> Result<Node, QueryError> {
        self.parse_joined("and", Self::parse_not, Node::And)
    }

    /// Conditions that `operand` parses, joined by the keyword `word`.
    fn parse_joined(
        &mut self,
        word: &str,
        operand: fn(&mut Self) -> Result<Node, QueryError>,
        combine: fn(Vec<Node>) -> Node,
    ) -> Result<Node, QueryError> {
        let first = operand(self)?;
        if !self.is_word(word) {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.is_word(word) {
            self.advance()?;
            items.push(operand(self)?);
        }
        Ok(combine(items))
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
            self.close(&open)?;
            self.leave();
            return Ok(inner);
        }
        let (col, start) = (self.cur.col, self.cur.start);
        match self.parse_term("a condition")? {
            Term::Cond(node) => Ok(node),
            Term::Value(lhs) => self.parse_comparison(lhs, col, start),
        }
    }

    /// The comparison operators after `lhs`, which began at column `col`,
    /// byte `start`; a chain `a < b < c` means `a < b and b < c`. A single
    /// comparison, the common case, moves its operands into the node without
    /// a copy.
    fn parse_comparison(
        &mut self,
        lhs: Operand,
        col: usize,
        start: usize,
    ) -> Result<Node, QueryError> {
        let Some(mut op) = self.parse_operator()? else {
            return Err(self.bare_operand(&lhs, col, start));
        };
        let mut lhs = lhs;
        let mut chain = Vec::new();
        loop {
            let rhs = self.parse_rhs()?;
            let Some(next) = self.parse_operator()? else {
                let last = Node::Compare { lhs, op, rhs };
                if chain.is_empty() {
                    return Ok(last);
                }
                chain.push(last);
                return Ok(Node::And(chain));
            };
            chain.push(Node::Compare {
                lhs,
                op,
                rhs: rhs.clone(),
            });
            (lhs, op) = (rhs, next);
        }
    }

    /// The value on the right of a comparison operator.
    fn parse_rhs(&mut self) -> Result<Operand, QueryError> {
        let col = self.cur.col;
        match self.parse_term("a value (number, string, list, true, false, null or field path)")? {
            Term::Value(rhs) => Ok(rhs),
            Term::Cond(_) => Err(self.error(
                col,
                "a function or method call is a condition, not a value; \
                 combine conditions with 'and' or 'or'",
            )),
        }
    }

    /// Consumes a comparison operator (`not in` is two tokens), if one comes.
    fn parse_operator(&mut self) -> Result<Option<CmpOp>, QueryError> {
        let op = match &self.cur.tok {
            Tok::Cmp(op) => *op,
            Tok::Ident(w) if w == "in" => CmpOp::In,
            Tok::Ident(w) if w == "not" => {
                self.advance()?;
                if !self.is_word("in") {
                    return Err(self.unexpected("'in' after 'not'"));
                }
                CmpOp::NotIn
            }
            _ => return Ok(None),
        };
        self.advance()?;
        Ok(Some(op))
    }

    /// The error for an operand (begun at column `col`, byte `start`) that is
    /// not followed by a comparison operator.
    fn bare_operand(&self, operand: &Operand, col: usize, start: usize) -> QueryError {
        let ends_condition = matches!(self.cur.tok, Tok::End | Tok::RParen)
            || self.is_word("and")
            || self.is_word("or");
        if !ends_condition {
            return self.unexpected("a comparison operator (==, !=, <, <=, >, >=, in, not in)");
        }
        let message = match operand {
            Operand::Path(_) => {
                let text = shorten(self.src()[start..self.last_end()].trim_end());
                format!(
                    "'{text}' alone is not a condition: write exists({text}) to test whether \
                     it is present, or {text} == true to test a boolean field"
                )
            }
            Operand::Literal(_) => "a value alone is not a condition: compare it with \
                                    ==, !=, <, <=, >, >=, in or not in"
                .to_owned(),
        };
        self.error(col, message)
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

    /// The rest of a path whose first identifier, `first`, was consumed; a
    /// method call on the path makes it a condition.
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
                    let (name, name_tok) = self.parse_field_name()?;
                    if self.cur.tok == Tok::LParen {
                        return self.parse_method(root, segs, &name_tok).map(Term::Cond);
                    }
                    if root == Root::Key {
                        return Err(self.error(
                            name_tok.col,
                            format!(
                                "the record key is a string and has no field '{}'; \
                                 a metadata field called 'key' is meta.key",
                                shorten(&name)
                            ),
                        ));
                    }
                    segs.push(Seg::Field(name));
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
                    self.close(&open)?;
                    segs.push(seg);
                }
                _ => break,
            }
        }
        Ok(Term::Value(Operand::Path(PathExpr::new(root, segs))))
    }

    /// The name after a `.` in a path (any identifier, keywords too), and its token.
    fn parse_field_name(&mut self) -> Result<(String, Token), QueryError> {
        let Tok::Ident(name) = &self.cur.tok else {
            let mut e = self.unexpected("a field name after '.'");
            if let Tok::Int(n) = self.cur.tok {
                e.message
                    .push_str(&format!(" (write [{n}] to index a list)"));
            }
            return Err(e);
        };
        let name = name.clone();
        Ok((name, self.advance()?))
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
                    Tok::Int(n) => Seg::Index(negated(n).ok_or_else(|| out_of_range(self))?),
                    Tok::BigInt(_) => return Err(out_of_range(self)),
                    _ => return Err(self.unexpected("an integer index after '-'")),
                }
            }
            _ => return Err(self.unexpected("an integer index or a quoted field name")),
        };
        self.advance()?;
        Ok(seg)
    }

    /// The one argument of a call (`what` is `exists()`, `startswith()`, ...),
    /// the current token being its `(`; and the argument's column.
    fn parse_one_argument(&mut self, what: &str) -> Result<(Operand, usize), QueryError> {
        let argument = |p: &mut Self| {
            let col = p.cur.col;
            match p.parse_term("an argument")? {
                Term::Value(arg) => Ok((arg, col)),
                Term::Cond(_) => Err(p.error(col, "a condition cannot be used as an argument")),
            }
        };
        let (args, close) = self.parse_delimited(false, argument)?;
        match <[_; 1]>::try_from(args) {
            Ok([arg]) => Ok(arg),
            Err(args) if args.is_empty() => Err(self.error(
                close.col,
                format!("{what} takes exactly one argument (got 0)"),
            )),
            Err(args) => Err(self.error(
                args[1].1,
                format!("{what} takes exactly one argument (got {})", args.len()),
            )),
        }
    }

    /// `name(args)` where `name` is `first`, and the current token is `(`.
    fn parse_function(&mut self, first: &Token) -> Result<Node, QueryError> {
        let Tok::Ident(name) = &first.tok else {
            return Err(self.unexpected("a function name"));
        };
        let (what, node): (&str, fn(PathExpr) -> Node) = match name.as_str() {
            "exists" => ("exists", Node::Exists),
            "isnan" => ("isnan", Node::IsNan),
            _ => {
                let hint = if Method::from_name(name).is_some() {
                    format!("; {name} is a method: path.{name}(...)")
                } else {
                    "; the functions are exists(path) and isnan(path), and the methods are \
                     path.startswith(s), path.endswith(s) and path.contains(x)"
                        .to_owned()
                };
                return Err(self.error(
                    first.col,
                    format!("unknown function '{}'{hint}", shorten(name)),
                ));
            }
        };
        match self.parse_one_argument(&format!("{what}()"))? {
            (Operand::Path(path), _) => Ok(node(path)),
            (Operand::Literal(_), col) => Err(self.error(
                col,
                format!("{what}() takes a field path, e.g. {what}(params.lr), not a value"),
            )),
        }
    }

    /// `.name(arg)` after the path `root` + `segs`; `name` is the token
    /// `name_tok`, and the current token is `(`.
    fn parse_method(
        &mut self,
        root: Root,
        segs: Vec<Seg>,
        name_tok: &Token,
    ) -> Result<Node, QueryError> {
        if root == Root::Meta && segs.is_empty() {
            return Err(self.error(
                name_tok.col,
                "a method needs a field: meta.name.startswith(...)",
            ));
        }
        let Tok::Ident(name) = &name_tok.tok else {
            return Err(self.unexpected("a method name"));
        };
        let Some(method) = Method::from_name(name) else {
            let hint = if name == "exists" || name == "isnan" {
                format!("; {name} is a function: {name}(path)")
            } else {
                "; the methods are startswith, endswith and contains".to_owned()
            };
            return Err(self.error(
                name_tok.col,
                format!("unknown method '{}'{hint}", shorten(name)),
            ));
        };
        let (arg, _) = self.parse_one_argument(&format!("{name}()"))?;
        Ok(Node::Method {
            target: PathExpr::new(root, segs),
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
                match self.cur.tok {
                    // Below i64::MIN: a float, as JSON parsers do.
                    Tok::Int(n) => negated(n).map_or(Value::from(-(n as f64)), Value::from),
                    Tok::BigInt(f) | Tok::Float(f) => Value::from(-f),
                    _ => return Err(self.unexpected("a number after '-'")),
                }
            }
            Tok::LBracket => {
                let literal =
                    |p: &mut Self| p.parse_literal("a literal value (lists hold only literals)");
                let (items, _) = self.parse_delimited(true, literal)?;
                return Ok(Value::Array(items));
            }
            _ => return Err(self.unexpected(expected)),
        };
        self.advance()?;
        Ok(value)
    }
}

/// The two delimiters of a bracketed part (`(...)` or `[...]`), found from the
/// opening token, and what messages call them.
struct Delimiters {
    close: Tok,
    name: &'static str,
    open_char: char,
    close_char: char,
}

impl Delimiters {
    fn of(open: &Token) -> Delimiters {
        if open.tok == Tok::LBracket {
            Delimiters {
                close: Tok::RBracket,
                name: "bracket",
                open_char: '[',
                close_char: ']',
            }
        } else {
            Delimiters {
                close: Tok::RParen,
                name: "parenthesis",
                open_char: '(',
                close_char: ')',
            }
        }
    }
}

/// `-n` for an integer literal `n`, when it fits in i64.
fn negated(n: u64) -> Option<i64> {
    (n <= 1 << 63).then(|| (-i128::from(n)) as i64)
}

#[cfg(test)]
mod tests {
    use crate::query::test_support::*;
    use crate::query::{Query, MAX_QUERY_BYTES};
    use serde_json::json;

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
    fn error_unknown_function_and_method() {
        assert_err("foo(x)", 1, "unknown function 'foo'");
        assert_err("a == 1 and bar(x) == 2", 12, "unknown function 'bar'");
        assert_err("startswith(x, 'a')", 1, "startswith is a method");
        assert_err("x.upper('a')", 3, "unknown method 'upper'");
        assert_err("x.exists(y)", 3, "exists is a function");
        assert_err("x.isnan(y)", 3, "isnan is a function: isnan(path)");
        assert_err(
            "foo(x)",
            1,
            "the functions are exists(path) and isnan(path)",
        );
        assert_err("isnan(1.5)", 7, "isnan() takes a field path");
        assert_err(
            "isnan(a, b)",
            10,
            "isnan() takes exactly one argument (got 2)",
        );
        assert_err("isnan(a) == true", 10, "expected 'and', 'or'");
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

    /// The contents of the `...` code spans of a line of markdown.
    fn code_spans(text: &str) -> Vec<&str> {
        text.split('`').skip(1).step_by(2).collect()
    }

    #[test]
    fn documented_examples_parse() {
        let doc = include_str!("../../QUERY.md");
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
        let doc = include_str!("../../QUERY.md");
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
}
