//! The comparison rules of the query language, on values borrowed from the
//! query or the record (`store/QUERY.md`, "Values and comparisons"):
//! numbers compare exactly across integer and float (no rounding through
//! f64, nor through big `$int` integers), strings by Unicode code point,
//! lists element-wise and objects by key set and values; a dtype equals its
//! name or its descr; datetimes by instant, and with ISO 8601 text. Values
//! of different kinds are unequal and unordered, so a type mismatch is
//! false under every operator, `!=` included; NaN (and NaT) is unordered
//! like IEEE 754 says: only `!=` holds.
//!
//! Tagged values (`{"$float": "nan"}`, `{"$tuple": [...]}`... see
//! [`super::tagged`]) are seen as the values they stand for.

use std::cmp::Ordering;

use serde_json::{Map, Value};

use super::ast::{CmpOp, Method};
use super::tagged::{parse_iso, tag, BigInt, Tag, Time};

/// A number as JSON holds it, or a big `$int`; compared exactly across kinds.
#[derive(Debug, Clone, Copy)]
pub(super) enum Num<'a> {
    I(i64),
    U(u64),
    F(f64),
    Big(BigInt<'a>),
}

/// A value seen by the evaluator, borrowed from the query or the record.
#[derive(Debug, Clone, Copy)]
pub(super) enum V<'a> {
    Null,
    Bool(bool),
    Num(Num<'a>),
    Str(&'a str),
    /// An array's dtype: equal to a string that is its name or its descr.
    Dtype {
        name: &'a str,
        descr: &'a str,
    },
    List(List<'a>),
    Obj(&'a Map<String, Value>),
    /// A datetime or date (`$datetime`, `$date`, a numpy datetime64).
    Time(Time),
    /// A numpy datetime64 NaT: unordered like NaN.
    NaT,
}

/// A list as the evaluator sees it: a JSON array, or an array's shape.
#[derive(Debug, Clone, Copy)]
pub(super) enum List<'a> {
    Json(&'a [Value]),
    /// Dimensions of an array payload, as [`super::ArrayFacts::shape`] gives them.
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

    /// Whether an element equals `value` (structurally, see [`values_eq`]).
    fn contains(self, value: V<'a>) -> bool {
        (0..self.len()).any(|i| values_eq(value, self.get(i)))
    }
}

/// The kind of a value: only values of one kind compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    Num,
    Str,
    List,
    Obj,
    Time,
}

impl<'a> V<'a> {
    /// The view of a JSON value.
    pub(super) fn from_json(value: &'a Value) -> V<'a> {
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
            Value::Object(map) => match tag(map) {
                None => V::Obj(map),
                Some(Tag::Float(f)) => V::Num(Num::F(f)),
                Some(Tag::NotANumber) => V::Num(Num::F(f64::NAN)),
                Some(Tag::Int(big)) => V::Num(Num::Big(big)),
                Some(Tag::Plain(value)) => V::from_json(value),
                Some(Tag::Time(t)) => V::Time(t),
                Some(Tag::NotATime) => V::NaT,
                Some(Tag::Tuple(items)) => V::List(List::Json(items)),
                Some(Tag::Dict(inner)) => V::Obj(inner),
            },
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
            V::Time(_) | V::NaT => Kind::Time,
        }
    }

    /// Whether this is a NaN number (a `$float`, a numpy float, a
    /// timedelta64 NaT) or a datetime64 NaT: what `isnan(x)` tests.
    pub(super) fn is_nan(self) -> bool {
        matches!(self, V::Num(Num::F(f)) if f.is_nan()) || matches!(self, V::NaT)
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

/// The field `name` of an object value (a `$dict` too); `None` for a
/// value that is not an object, tagged values included.
pub(crate) fn field<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    match V::from_json(value) {
        V::Obj(map) => map.get(name),
        _ => None,
    }
}

/// The elements of a list value (a `$tuple` too).
pub(super) fn items(value: &Value) -> Option<&[Value]> {
    match V::from_json(value) {
        V::List(List::Json(items)) => Some(items),
        _ => None,
    }
}

/// A field value as a secondary index orders it: by kind, then within a
/// kind in the order of the query language (numbers rounded to f64,
/// datetimes by wall clock read as UTC, as comparisons with ISO 8601
/// literals see them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum IndexScalar<'a> {
    Null,
    Bool(bool),
    Num(f64),
    Str(&'a str),
    /// Nanoseconds since the epoch (see [`Time`]).
    Time(i128),
}

/// How a secondary index keeps `value`; `None` for what no comparison
/// with a literal can match (lists, objects, NaN, NaT), left out of the
/// index.
pub(crate) fn index_scalar(value: &Value) -> Option<IndexScalar<'_>> {
    Some(match V::from_json(value) {
        V::Null => IndexScalar::Null,
        V::Bool(b) => IndexScalar::Bool(b),
        V::Num(n) => {
            let f = match n {
                Num::I(i) => i as f64,
                Num::U(u) => u as f64,
                Num::F(f) => f,
                Num::Big(big) => big.to_f64(),
            };
            if f.is_nan() {
                return None;
            }
            IndexScalar::Num(f)
        }
        V::Str(s) => IndexScalar::Str(s),
        V::Time(t) => IndexScalar::Time(t.nanos),
        V::Dtype { .. } | V::List(_) | V::Obj(_) | V::NaT => return None,
    })
}

/// The instant an ISO 8601 literal stands for in a secondary index of
/// datetimes (see [`IndexScalar::Time`]); `None` when the text is not
/// ISO 8601 (then it matches no datetime).
pub(crate) fn literal_time(text: &str) -> Option<i128> {
    parse_iso(text).map(|t| t.nanos)
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

/// The order of two integers written in decimal (see [`BigInt`]).
fn cmp_decimal(a: BigInt<'_>, b: BigInt<'_>) -> Ordering {
    let magnitude = |x: BigInt<'_>, y: BigInt<'_>| {
        x.digits
            .len()
            .cmp(&y.digits.len())
            .then_with(|| x.digits.cmp(y.digits))
    };
    match (a.negative, b.negative) {
        (false, false) => magnitude(a, b),
        (true, true) => magnitude(b, a),
        (false, true) => Ordering::Greater,
        (true, false) => Ordering::Less,
    }
}

/// Exact order of a big integer and a float; `None` for NaN.
fn cmp_big_float(big: BigInt<'_>, f: f64) -> Option<Ordering> {
    if f.is_nan() {
        return None;
    }
    if f.is_infinite() {
        return Some(if f > 0.0 {
            Ordering::Less
        } else {
            Ordering::Greater
        });
    }
    // The integer part of a finite float, written out exactly.
    let whole = f.trunc();
    let text = format!("{whole:.0}");
    let whole_int = BigInt::parse(&text)?;
    match cmp_decimal(big, whole_int) {
        Ordering::Equal => (0.0).partial_cmp(&(f - whole)),
        other => Some(other),
    }
}

/// The exact order of two numbers of any kinds; `None` when one is NaN.
pub(super) fn cmp_num(a: Num<'_>, b: Num<'_>) -> Option<Ordering> {
    let int = |n: Num<'_>| match n {
        Num::I(i) => Some(i128::from(i)),
        Num::U(u) => Some(i128::from(u)),
        Num::F(_) | Num::Big(_) => None,
    };
    match (a, b) {
        (Num::F(x), Num::F(y)) => x.partial_cmp(&y),
        (Num::Big(x), Num::F(y)) => cmp_big_float(x, y),
        (Num::F(x), Num::Big(y)) => cmp_big_float(y, x).map(Ordering::reverse),
        (Num::Big(x), Num::Big(y)) => Some(cmp_decimal(x, y)),
        (Num::Big(x), other) => {
            let text = int(other)?.to_string();
            Some(cmp_decimal(x, BigInt::parse(&text)?))
        }
        (other, Num::Big(y)) => {
            let text = int(other)?.to_string();
            Some(cmp_decimal(BigInt::parse(&text)?, y))
        }
        (Num::F(x), other) => cmp_int_float(int(other)?, x).map(Ordering::reverse),
        (other, Num::F(y)) => cmp_int_float(int(other)?, y),
        (x, y) => Some(int(x)?.cmp(&int(y)?)),
    }
}

/// The order of a stored datetime and another value: a datetime of the
/// same awareness, or text that reads as ISO 8601 (see
/// [`super::tagged::parse_iso`]), compared on the wall clock as if both were
/// UTC (an offset-less text against an aware value is UTC; a naive value
/// against text with an offset is UTC). `None` for NaT, a naive and an
/// aware datetime, or anything else.
fn cmp_time(t: Time, other: V<'_>) -> Option<Ordering> {
    match other {
        V::Time(u) if u.aware == t.aware => Some(t.nanos.cmp(&u.nanos)),
        V::Str(s) => Some(t.nanos.cmp(&parse_iso(s)?.nanos)),
        _ => None,
    }
}

/// Whether two values can be compared at all: same kind, or a datetime
/// (NaT too) and text that reads as ISO 8601. Comparing values that can't
/// is false under every operator.
fn comparable(a: V<'_>, b: V<'_>) -> bool {
    match (a, b) {
        (V::Time(_) | V::NaT, V::Str(s)) | (V::Str(s), V::Time(_) | V::NaT) => {
            parse_iso(s).is_some()
        }
        _ => a.kind() == b.kind(),
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

/// Equality of two texts: strings, or a dtype and a string that is its name
/// or its descr (with or without the descr's quotes).
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
            (V::Time(t), other) => cmp_time(t, other) == Some(Ordering::Equal),
            (V::Str(_), V::Time(t)) => cmp_time(t, x) == Some(Ordering::Equal),
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

/// The order of two numbers, two strings, or datetimes (see [`cmp_time`]);
/// `None` for other pairs (booleans, null, lists, objects and dtypes are
/// not ordered), NaN and NaT.
fn order(a: V<'_>, b: V<'_>) -> Option<Ordering> {
    match (a, b) {
        (V::Num(x), V::Num(y)) => cmp_num(x, y),
        // UTF-8 byte order is Unicode code point order.
        (V::Str(x), V::Str(y)) => Some(x.cmp(y)),
        (V::Time(t), other) => cmp_time(t, other),
        (other, V::Time(t)) => cmp_time(t, other).map(Ordering::reverse),
        _ => None,
    }
}

/// The order of two JSON literals as [`compare`] sees it (`None`: unordered).
pub(super) fn cmp_literal(a: &Value, b: &Value) -> Option<Ordering> {
    order(V::from_json(a), V::from_json(b))
}

/// `a op b`. False when the operands can't be compared (see
/// [`comparable`]), under every operator; `in` and `not in` are false when
/// the test does not apply. Otherwise `!=` is the negation of `==`, so it
/// holds for NaN and NaT, which equal nothing.
pub(super) fn compare<'a>(a: V<'a>, op: CmpOp, b: V<'a>) -> bool {
    match op {
        CmpOp::In => return membership(a, b).unwrap_or(false),
        CmpOp::NotIn => return membership(a, b).is_some_and(|found| !found),
        _ => {}
    }
    if !comparable(a, b) {
        return false;
    }
    let ordered = |test: fn(Ordering) -> bool| order(a, b).is_some_and(test);
    match op {
        CmpOp::Eq => values_eq(a, b),
        CmpOp::Ne => !values_eq(a, b),
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
        V::List(items) => Some(items.contains(needle)),
        V::Str(_) | V::Dtype { .. } => Some(haystack.text()?.contains(needle.text()?)),
        _ => None,
    }
}

/// `target.method(arg)`: string tests on text (a dtype's name counts), and
/// `contains` on lists too; false for any other kind.
pub(super) fn apply_method<'a>(method: Method, target: V<'a>, arg: V<'a>) -> bool {
    let texts = target.text().zip(arg.text());
    match method {
        Method::StartsWith => texts.is_some_and(|(t, a)| t.starts_with(a)),
        Method::EndsWith => texts.is_some_and(|(t, a)| t.ends_with(a)),
        Method::Contains => match target {
            V::List(items) => items.contains(arg),
            _ => texts.is_some_and(|(t, a)| t.contains(a)),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use proptest::prelude::*;
    use serde_json::{json, Value};

    use crate::query::test_support::*;

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

    /// A record of tagged values, as the Python writer stores them.
    fn tagged() -> TestRecord {
        TestRecord::new(json!({
            "nan": {"$float": "nan"},
            "inf": {"$float": "inf"},
            "ninf": {"$float": "-inf"},
            "big": {"$int": "123456789012345678901234567890"},
            "nbig": {"$int": "-123456789012345678901234567890"},
            "two64": {"$int": "18446744073709551616"},
            "f4": {"$numpy": ["<f4", 1.5]},
            "i8": {"$numpy": ["<i8", 7]},
            "b1": {"$numpy": ["|b1", true]},
            "fnan": {"$numpy": ["<f8", {"$float": "nan"}]},
            "td": {"$numpy": ["<m8[s]", 5]},
            "tdnat": {"$numpy": ["<m8[s]", "NaT"]},
            "when": {"$datetime": "2024-03-01T12:30:00"},
            "utc": {"$datetime": "2024-03-01T12:30:00+00:00"},
            "paris": {"$datetime": "2024-03-01T12:30:00+01:00[Europe/Paris]"},
            "day": {"$date": "2024-03-01"},
            "m8": {"$numpy": ["<M8[s]", "2024-03-01T12:30:00"]},
            "m8d": {"$numpy": ["<M8[D]", "2024-03-01"]},
            "nat": {"$numpy": ["<M8[s]", "NaT"]},
            "t": {"$tuple": [1, "a", {"$tuple": [2, 3]}]},
            "d": {"$dict": {"$x": 1}},
            "odd": {"$unknown": 1},
            "bad": {"$float": "NaN"},
        }))
    }

    #[test]
    fn nan_is_unordered() {
        let rec = tagged();
        expect_all(
            &rec,
            true,
            &[
                "nan != 1",
                "nan != 1.5",
                "nan != nan",
                "nan != inf",
                "fnan != fnan",
                "tdnat != 5",
                "not nan == nan",
                "nan not in [1, 2]",
                "inf > 1e308",
                "inf == inf",
                "inf > 18446744073709551615",
                "inf > big",
                "ninf < nbig",
                "ninf < -1e308",
                "ninf != inf",
                "f4 == 1.5",
                "f4 < 2",
                "i8 == 7",
                "i8 in [7, 8]",
                "b1 == true",
                "td == 5",
                "td > 4.5",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "nan == nan",
                "nan == 1",
                "nan < 1",
                "nan <= 1",
                "nan > 1",
                "nan >= 1",
                "nan < inf",
                "nan > ninf",
                "nan in [1, 2]",
                "nan != 'x'",
                "fnan == fnan",
                "fnan >= 0",
                "tdnat == tdnat",
                "tdnat < 5",
                "inf != inf",
                "b1 == 1",
                "i8 == '7'",
            ],
        );
    }

    #[test]
    fn isnan_finds_nan_and_nat() {
        let rec = tagged();
        expect_all(
            &rec,
            true,
            &[
                "isnan(nan)",
                "isnan(fnan)",
                "isnan(tdnat)",
                "isnan(nat)",
                "not isnan(inf)",
                "not isnan(f4)",
                "not isnan(when)",
                "not isnan(bad)",
                "not isnan(missing)",
                "not isnan(t)",
                "isnan(nan) and nan != nan",
                "isnan(meta.nan)",
            ],
        );
        // A field called isnan is still a field.
        let rec = TestRecord::new(json!({"isnan": 1}));
        assert!(check("isnan == 1", &rec));
    }

    #[test]
    fn big_tagged_integers_compare_exactly() {
        let rec = tagged();
        expect_all(
            &rec,
            true,
            &[
                "big == big",
                "big > 18446744073709551615",
                // The nearest double is 123456789012345677877719597056.
                "big > 1.2345678901234568e29",
                "big < 1.234567890123457e29",
                "big != 1.2345678901234568e29",
                "big > nbig",
                "nbig < -9223372036854775808",
                "nbig < -1e29",
                "nbig > -1.3e29",
                "two64 > 18446744073709551615",
                "two64 == 18446744073709551616.0",
                "two64 >= 18446744073709551616.0",
                "two64 < 18446744073709551617.5e0 or two64 == 18446744073709551616.0",
                "two64 != 18446744073709551615",
                "two64 < big",
                "big < 1e300",
                "nbig > -1e300",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "big == 1.2345678901234568e29",
                "big < 18446744073709551615",
                "two64 == 18446744073709551615",
                "two64 > 18446744073709551616.0",
                "big == '123456789012345678901234567890'",
                "nbig > 0",
            ],
        );
        // Two big integers, and one that fits 64 bits written as $int.
        let rec = TestRecord::new(json!({
            "a": {"$int": "-99999999999999999999"},
            "b": {"$int": "-100000000000000000000"},
            "c": {"$int": "42"},
            "z": {"$int": "-0"},
        }));
        expect_all(
            &rec,
            true,
            &[
                "a > b",
                "b < a",
                "a != b",
                "c == 42",
                "c == 42.0",
                "c < 42.5",
                "c > 41.9",
                "z == 0",
                "z == -0.0",
                "z > -0.5",
                "b < -99999999999999999999.0 or b < a",
            ],
        );
        expect_all(&rec, false, &["a < b", "a == b", "c != 42"]);
    }

    #[test]
    fn datetimes_compare_with_iso_text_and_each_other() {
        let rec = tagged();
        expect_all(
            &rec,
            true,
            &[
                "when >= '2024-03-01'",
                "when > '2024-03-01'",
                "when < '2024-03-02'",
                "when == '2024-03-01T12:30:00'",
                "when == '2024-03-01 12:30'",
                "when == '2024-03-01T12:30:00.000000000'",
                "when < '2024-03-01T12:30:00.000000001'",
                "when != '2024-03-01T12:30:01'",
                "when in ['2024-01-01', '2024-03-01T12:30']",
                "when not in ['2024-01-01']",
                "'2024-03-01' <= when",
                "'2024-01-01T00:00:00' < when",
                "'2023-12-31' < when < '2025-01-01'",
                // Aware values by instant; text without an offset is UTC.
                "utc == '2024-03-01T12:30:00Z'",
                "utc == '2024-03-01T13:30:00+01:00'",
                "utc == '2024-03-01T12:30:00'",
                "paris == '2024-03-01T11:30:00'",
                "paris == '2024-03-01T12:30:00+01:00'",
                "paris == '2024-03-01T12:30:00+01:00[Europe/Paris]'",
                "paris < utc",
                "paris != utc",
                "paris < '2024-03-01T12:00:00Z'",
                // A naive value against text with an offset: as if UTC.
                "when == '2024-03-01T12:30:00+00:00'",
                "when > '2024-03-01T12:30:00+01:00'",
                // Dates are midnight; numpy datetimes are naive.
                "day == '2024-03-01'",
                "day == '2024-03-01T00:00'",
                "day < when",
                "m8 == when",
                "m8 == '2024-03-01T12:30'",
                "m8d == day",
                "m8d < m8",
                // NaT, like NaN.
                "nat != '2024-03-01'",
                "nat != when",
                "nat != nat",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "when < '2024-03-01'",
                "when == '2024-03-01'",
                "when != '2024-03-01T12:30:00'",
                "when in ['2024-01-01']",
                "when not in ['2024-03-01T12:30']",
                // Naive and aware stored values are unordered.
                "when == utc",
                "when < utc",
                "when >= utc",
                "when <= paris",
                // Not ISO 8601: a plain string, false against a datetime.
                "when == 'yesterday'",
                "when != 'yesterday'",
                "when < 'z'",
                "when > '2024'",
                "when != '2024-02-30'",
                "when == 20240301",
                "when != 20240301",
                "when == null",
                "when == ['2024-03-01']",
                "when.startswith('2024')",
                "'2024' in when",
                "nat == nat",
                "nat < '2024-03-01'",
                "nat >= when",
                "nat != 'x'",
                "nat == 1",
            ],
        );
        // `!=` between naive and aware: they differ.
        assert!(check("when != utc", &rec));
    }

    #[test]
    fn tuples_dicts_and_odd_objects() {
        let rec = tagged();
        expect_all(
            &rec,
            true,
            &[
                "t == [1, 'a', [2, 3]]",
                "t[0] == 1",
                "t[-1][1] == 3",
                "t[2] == [2, 3]",
                "1 in t",
                "'a' in t",
                "[2, 3] in t",
                "t.contains('a')",
                "t[2].contains(3)",
                "exists(t[2][0])",
                "t != [1, 'a']",
                "d['$x'] == 1",
                "d == d",
                "exists(d['$x'])",
                "not exists(d['$dict'])",
                "odd['$unknown'] == 1",
                "bad['$float'] == 'NaN'",
                "not exists(nan['$float'])",
                "not exists(when['$datetime'])",
                "not exists(t['$tuple'])",
            ],
        );
        expect_all(
            &rec,
            false,
            &[
                "t == [1, 'a']",
                "t[3] == 1",
                "'b' in t",
                "t < [2]",
                "exists(t.x)",
                "d.x == 1",
                "d['$dict']['$x'] == 1",
                "nan['$float'] == 'nan'",
            ],
        );
        let same = TestRecord::new(json!({
            "a": {"$dict": {"$x": {"$tuple": [1, 2]}}},
            "b": {"$dict": {"$x": [1.0, 2]}},
            "c": {"$x": [1, 2]},
            "e": {"$dict": {"$float": "nan"}},
        }));
        expect_all(
            &same,
            true,
            &[
                "a == b",
                "a['$x'] == [1, 2]",
                "e['$float'] == 'nan'",
                "a != e",
                "not exists(c['$x'][0]) or c['$x'][0] == 1",
            ],
        );
    }

    #[test]
    fn escaped_metadata_is_looked_up_inside() {
        let rec = TestRecord::new(json!({"$dict": {"$x": {"$tuple": [1]}}}));
        expect_all(
            &rec,
            true,
            &[
                "meta['$x'] == [1]",
                "meta['$x'][0] == 1",
                "not exists(meta['$dict'])",
            ],
        );
        // Two fields: not an escape.
        let rec = TestRecord::new(json!({"$dict": {"$x": 1}, "y": 2}));
        expect_all(&rec, true, &["meta['$dict']['$x'] == 1", "y == 2"]);
        expect_all(&rec, false, &["meta['$x'] == 1"]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

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
}
