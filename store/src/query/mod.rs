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
//!
//! # How the pieces fit
//!
//! ```text
//! source ──lexer──▶ tokens ──parser──▶ ast::Node ──eval──▶ bool, per record
//!                                          │                (value: JSON comparison rules)
//!                                          └──plan──▶ IndexPlan / QueryNeeds, per query
//! ```
//!
//! - `lexer`: characters to tokens (numbers, strings with their escapes,
//!   operators); the errors for C-style operators and malformed literals.
//! - `parser`: recursive descent from tokens to the syntax tree, with the
//!   nesting and length limits and the error messages that suggest a fix.
//! - `ast`: the syntax tree, and how a plain path also reads as an array
//!   name or an array fact (`image.shape[0]`).
//! - `value`: the comparison rules: numbers exactly across integer and
//!   float, strings by code point, lists and objects structurally, dtypes by
//!   name or descr, datetimes by instant and against ISO 8601 text; a type
//!   mismatch is false under every operator.
//! - `tagged`: tagged metadata values (`{"$float": "nan"}`, `$int`,
//!   `$datetime`, `$tuple`, `$dict`, `$numpy`...) and an ISO 8601 reader.
//! - `eval`: resolves paths against a [`RecordView`] and applies the `value` rules.
//! - `plan`: what a query allows a secondary index to narrow
//!   (`Query::index_plan`) and what a scan must decode (`Query::needs`).
//! - `error`: [`QueryError`] and its display with a caret under the column.
//!
//! Unit tests sit beside the code they test; `proptests` checks the whole
//! language against a reference evaluator, with fixtures from `test_support`.

mod ast;
pub(crate) mod columnar;
mod error;
mod eval;
mod lexer;
mod parser;
mod plan;
pub(crate) mod tagged;
mod value;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod test_support;

use std::fmt;
use std::str::FromStr;

pub use self::error::QueryError;
pub(crate) use self::plan::{IndexLookup, QueryNeeds};
pub(crate) use self::tagged::fields;
pub(crate) use self::value::{field as field_of, index_scalar, literal_time, IndexScalar};
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
    /// Size of the data in bytes (the product of `shape` times the
    /// itemsize; the pickle's size for an `object` array).
    pub nbytes: u64,
}

/// What a query can see of a record. Implemented by the store for its decoded records.
pub trait RecordView {
    /// The record's key.
    fn key(&self) -> &str;
    /// The record's JSON metadata.
    fn meta(&self) -> &Map<String, Value>;
    /// The metadata fields queries look up: [`RecordView::meta`], or the
    /// object inside when the whole metadata is escaped as
    /// `{"$dict": {...}}` (a dict whose only field's name starts with `$`;
    /// FORMAT.md, "Tagged values"). Override only when `meta` is partial
    /// and the implementor knows better.
    fn fields(&self) -> &Map<String, Value> {
        tagged::fields(self.meta())
    }
    /// Array by its path name: top-level `"image"`, nested `"params/w"`, `"frames/0"`.
    fn array(&self, name: &str) -> Option<ArrayFacts<'_>>;
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
    root: ast::Node,
}

impl Query {
    /// Parses `source` (the grammar is in `store/QUERY.md`).
    ///
    /// # Errors
    /// A [`QueryError`] pointing at the offending column: a syntax error, a
    /// source longer than [`MAX_QUERY_BYTES`], or nesting (parentheses,
    /// `not`, lists, call arguments) deeper than [`MAX_NESTING`] levels.
    pub fn parse(source: &str) -> Result<Query, QueryError> {
        let root = parser::parse_query(source)?;
        Ok(Query {
            source: source.to_owned(),
            root,
        })
    }

    /// Whether `record` matches. Never fails and never panics; allocates only to
    /// compare lists or objects structurally.
    pub fn matches<R: RecordView + ?Sized>(&self, record: &R) -> bool {
        eval::eval(&self.root, record)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::test_support::sample;

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
}
