//! A query evaluated over columns ([`crate::columns::Columns`]) instead
//! of one record at a time, with the same results.
//!
//! Each condition gives every row one of three answers: true, false, or
//! *unknown* where the columns cannot tell (the path holds a list, an
//! object, a value of another kind than its typed column, or the query
//! compares two paths). `and`, `or` and `not` combine them by Kleene's
//! three-valued logic, so a row is unknown at the end only when its
//! answer depends on an unknown condition; the caller checks those rows
//! against their records ([`Query::matches`]). Known answers follow the
//! rules of `value` exactly: a number column compares against a numeric
//! literal through the interval of values that satisfy it (worked out with
//! the exact comparison once per query), a string or boolean column
//! evaluates the condition once per distinct value.

use std::cmp::Ordering;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type, TimestampMicrosecondType, UInt64Type};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use serde_json::Value;

use super::ast::{CmpOp, FactKind, FactRef, Node, Operand, PathExpr, Root, Seg};
use super::tagged::Time;
use super::value::{apply_method, cmp_num, compare, List, Num, V};
use super::Query;
use crate::columns::{Columns, FactName, PathColumns};

/// Rows as bits, 64 to a word, row `i` at bit `i % 64` of word `i / 64`.
pub(crate) type Bits = Vec<u64>;

/// The answer of a query for every row: `yes` where it holds, `unknown`
/// where the record must decide; elsewhere it does not hold.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    pub yes: Bits,
    pub unknown: Bits,
    /// Why some rows are unknown (for `explain`), each reason once.
    pub reasons: Vec<String>,
}

/// A three-valued answer per row: `t` true, `f` false, neither unknown.
struct Tri {
    t: Bits,
    f: Bits,
}

fn words(n: usize) -> usize {
    n.div_ceil(64)
}

/// The bits of rows `0..n` set.
fn all(n: usize) -> Bits {
    let mut b = vec![u64::MAX; words(n)];
    if !n.is_multiple_of(64) {
        if let Some(last) = b.last_mut() {
            *last = (1u64 << (n % 64)) - 1;
        }
    }
    b
}

fn none(n: usize) -> Bits {
    vec![0; words(n)]
}

fn and(a: &Bits, b: &Bits) -> Bits {
    a.iter().zip(b).map(|(x, y)| x & y).collect()
}

fn or(a: &Bits, b: &Bits) -> Bits {
    a.iter().zip(b).map(|(x, y)| x | y).collect()
}

fn and_not(a: &Bits, b: &Bits) -> Bits {
    a.iter().zip(b).map(|(x, y)| x & !y).collect()
}

/// Set rows of `b`.
pub(crate) fn ones(b: &Bits) -> impl Iterator<Item = usize> + '_ {
    b.iter().enumerate().flat_map(|(w, &word)| {
        let mut rest = word;
        std::iter::from_fn(move || {
            if rest == 0 {
                return None;
            }
            let bit = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            Some(w * 64 + bit)
        })
    })
}

/// Number of set rows.
pub(crate) fn count(b: &Bits) -> u64 {
    b.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// The rows where `array` is not null (its own validity: a dictionary's
/// values are never null in column files, so its keys' validity says it).
pub(crate) fn valid(array: &dyn Array) -> Bits {
    let n = array.len();
    match array.nulls() {
        None => all(n),
        Some(nulls) => {
            let chunks = nulls.inner().bit_chunks();
            let mut out: Bits = chunks.iter().collect();
            if chunks.remainder_len() > 0 {
                out.push(chunks.remainder_bits());
            }
            out
        }
    }
}

/// Bits of `p(i)` for rows `0..n`.
fn bits_where(n: usize, mut p: impl FnMut(usize) -> bool) -> Bits {
    let mut out = none(n);
    for (w, word) in out.iter_mut().enumerate() {
        let base = w * 64;
        let end = (base + 64).min(n);
        let mut acc = 0u64;
        for i in base..end {
            acc |= u64::from(p(i)) << (i - base);
        }
        *word = acc;
    }
    out
}

/// Bits of `lo <= v[i] <= hi` (a loop the compiler vectorizes).
fn in_range<T: PartialOrd + Copy>(values: &[T], lo: T, hi: T) -> Bits {
    let mut out = none(values.len());
    for (word, chunk) in out.iter_mut().zip(values.chunks(64)) {
        let mut acc = 0u64;
        for (j, &x) in chunk.iter().enumerate() {
            acc |= u64::from((lo <= x) & (x <= hi)) << j;
        }
        *word = acc;
    }
    out
}

/// Where a path's value comes from, per row, in one batch.
struct Resolved<'c> {
    /// The typed column, if the path has one (rows where it is valid).
    typed: Option<&'c ArrayRef>,
    /// Rows whose value the columns cannot give (unknown).
    unknown: Bits,
    /// Rows where the metadata has a value at the path (typed, json or an
    /// object under it): the fact reading does not apply there.
    meta_present: Bits,
    /// The array fact the path reads where the metadata has no value.
    fact: Option<(&'c FactRef, FactColumns<'c>)>,
    /// Whether the path is `key`.
    key: bool,
    reasons: Vec<String>,
}

/// The fact columns of one array.
#[derive(Clone, Copy)]
struct FactColumns<'c> {
    shape: Option<&'c ArrayRef>,
    dtype: Option<&'c ArrayRef>,
    descr: Option<&'c ArrayRef>,
    nbytes: &'c ArrayRef,
}

/// The fact columns of `array`: `None` when no row has it, `Some(Err)`
/// when one cannot be decoded.
fn fact_columns<'c>(cols: &'c Columns, array: &str) -> Option<Result<FactColumns<'c>, ()>> {
    let f = cols.facts.get(array)?;
    let get = |name| -> Result<Option<&'c ArrayRef>, ()> {
        match f.get(&name) {
            None => Ok(None),
            Some(&i) => cols.column(i).map(Some).ok_or(()),
        }
    };
    Some((|| {
        Ok(FactColumns {
            shape: get(FactName::Shape)?,
            dtype: get(FactName::Dtype)?,
            descr: get(FactName::Descr)?,
            nbytes: get(FactName::Nbytes)?.ok_or(())?,
        })
    })())
}

fn path_text(path: &PathExpr) -> String {
    let mut s = match path.root {
        Root::Key => "key".to_owned(),
        Root::Meta => "meta".to_owned(),
        Root::Field => String::new(),
    };
    for seg in &path.segs {
        match seg {
            Seg::Field(f) if s.is_empty() => s.push_str(f),
            Seg::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn resolve<'c>(path: &'c PathExpr, cols: &'c Columns) -> Resolved<'c> {
    let n = cols.len();
    let mut r = Resolved {
        typed: None,
        unknown: none(n),
        meta_present: none(n),
        fact: None,
        key: false,
        reasons: Vec::new(),
    };
    if path.root == Root::Key {
        r.key = true;
        return r;
    }
    let fields = leading_fields(path);
    let indexed = fields.len() < path.segs.len();
    let damaged = |mut r: Resolved<'c>| {
        r.typed = None;
        r.fact = None;
        r.unknown = all(n);
        r.meta_present = all(n);
        r.reasons.push(format!(
            "a column of {} fails its checks (damaged: `verify` reports it, `repair` rewrites it)",
            path_text(path)
        ));
        r
    };
    if !fields.is_empty() {
        let exact: PathColumns = cols.paths.get(&fields).copied().unwrap_or_default();
        let json_valid = match exact.json.map(|i| cols.column(i)) {
            None => None,
            Some(Some(a)) => Some(valid(a.as_ref())),
            Some(None) => return damaged(r),
        };
        if indexed {
            // Only a list (json text) can be indexed into.
            if let Some(j) = json_valid {
                if j.iter().any(|w| *w != 0) {
                    r.reasons
                        .push(format!("{} indexes into lists", path_text(path)));
                }
                r.unknown = j.clone();
                r.meta_present = j;
            }
        } else {
            let mut under = none(n);
            for (p, pc) in &cols.paths {
                if p.len() > fields.len() && p.starts_with(&fields) {
                    for i in [pc.typed, pc.json].into_iter().flatten() {
                        match cols.column(i) {
                            Some(a) => under = or(&under, &valid(a.as_ref())),
                            None => return damaged(r),
                        }
                    }
                }
            }
            let mut unknown = under.clone();
            if let Some(j) = &json_valid {
                unknown = or(&unknown, j);
            }
            if unknown.iter().any(|w| *w != 0) {
                r.reasons.push(format!(
                    "{} holds lists, objects or mixed kinds in some records",
                    path_text(path)
                ));
            }
            let mut present = unknown.clone();
            if let Some(t) = exact.typed {
                let Some(column) = cols.column(t) else {
                    return damaged(r);
                };
                present = or(&present, &valid(column.as_ref()));
                r.typed = Some(column);
            }
            if !cols.paths_complete {
                // A path left out of the columns may be at or under this
                // one in the rows where it has no value.
                unknown = or(&unknown, &and_not(&all(n), &present));
                present = all(n);
                r.reasons.push(format!(
                    "the columns leave out some fields of these records ({} may be one)",
                    path_text(path)
                ));
            }
            r.unknown = unknown;
            r.meta_present = present;
        }
        if indexed && !cols.paths_complete && exact.typed.is_none() && exact.json.is_none() {
            r.unknown = all(n);
            r.meta_present = all(n);
            r.reasons.push(format!(
                "the columns leave out some fields of these records ({} may be one)",
                path_text(path)
            ));
        }
    }
    if path.root == Root::Field {
        if let Some(fact) = &path.fact {
            match fact_columns(cols, &fact.array) {
                Some(Ok(fc)) => r.fact = Some((fact, fc)),
                Some(Err(())) => return damaged(r),
                None if !cols.facts_complete => {
                    // The array may be one whose facts were left out.
                    r.unknown = or(&r.unknown, &and_not(&all(n), &r.meta_present));
                    r.reasons.push(format!(
                        "the columns leave out the facts of some arrays ({} may be one)",
                        fact.array
                    ));
                }
                None => {}
            }
        }
    }
    r
}

/// The value of a typed column in row `i` (valid rows only).
fn typed_value(array: &ArrayRef, i: usize) -> Option<V<'_>> {
    if array.is_null(i) {
        return None;
    }
    Some(match array.data_type() {
        DataType::Int64 => V::Num(Num::I(array.as_primitive::<Int64Type>().value(i))),
        DataType::Float64 => V::Num(Num::F(array.as_primitive::<Float64Type>().value(i))),
        DataType::Boolean => V::Bool(array.as_boolean().value(i)),
        DataType::Dictionary(_, _) => {
            let d = array.as_dictionary::<Int32Type>();
            let k = usize::try_from(d.keys().value(i)).ok()?;
            V::Str(d.values().as_string::<i32>().value(k))
        }
        DataType::Timestamp(_, tz) => V::Time(Time {
            nanos: i128::from(array.as_primitive::<TimestampMicrosecondType>().value(i)) * 1000,
            aware: tz.is_some(),
        }),
        _ => return None,
    })
}

fn dict_text(array: &ArrayRef, i: usize) -> Option<&str> {
    if array.is_null(i) {
        return None;
    }
    let d = array.as_dictionary::<Int32Type>();
    let k = usize::try_from(d.keys().value(i)).ok()?;
    Some(d.values().as_string::<i32>().value(k))
}

/// The fact `fact` of row `i`'s array, if the row has the array.
fn fact_value<'c>(fact: &FactRef, fc: FactColumns<'c>, i: usize) -> Option<V<'c>> {
    if fc.nbytes.is_null(i) {
        return None;
    }
    let dims = || -> Option<&'c [u64]> {
        let shape = fc.shape?.as_list::<i32>();
        if shape.is_null(i) {
            return None;
        }
        let offsets = shape.value_offsets();
        let (a, b) = (
            usize::try_from(offsets[i]).ok()?,
            usize::try_from(offsets[i + 1]).ok()?,
        );
        shape
            .values()
            .as_primitive::<UInt64Type>()
            .values()
            .get(a..b)
    };
    Some(match fact.kind {
        FactKind::Shape => match fact.index {
            None => V::List(List::Dims(dims()?)),
            Some(idx) => {
                let d = dims()?;
                let len = i64::try_from(d.len()).ok()?;
                let at = if idx < 0 { len.checked_add(idx)? } else { idx };
                V::Num(Num::U(*d.get(usize::try_from(at).ok()?)?))
            }
        },
        FactKind::Dtype => V::Dtype {
            name: dict_text(fc.dtype?, i)?,
            descr: dict_text(fc.descr?, i)?,
        },
        FactKind::Ndim => V::Num(Num::U(dims()?.len() as u64)),
        FactKind::Nbytes => V::Num(Num::U(fc.nbytes.as_primitive::<UInt64Type>().value(i))),
        FactKind::Size => {
            let d = dims()?;
            V::Num(
                match d.iter().try_fold(1u64, |acc, &x| acc.checked_mul(x)) {
                    Some(s) => Num::U(s),
                    None => Num::F(d.iter().map(|&x| x as f64).product()),
                },
            )
        }
    })
}

/// A condition on one path's value (`None`: the path has no value).
type Test<'q> = Box<dyn Fn(Option<V<'_>>) -> bool + 'q>;

/// The interval `[lo, hi]` of values of an ordered domain where `ord(x)`
/// (monotone: Less, then Equal, then Greater) satisfies `op`, found by
/// bisection over the domain's `keys` (`from_key` maps back); `None` when
/// empty.
fn interval<T: Copy>(
    op: CmpOp,
    min: i64,
    max: i64,
    from_key: impl Fn(i64) -> T,
    ord: impl Fn(T) -> Ordering,
) -> Option<(T, T)> {
    // Smallest key whose value is at least `want` (Less < Equal < Greater).
    let first_at_least = |want: Ordering| -> Option<i64> {
        if ord(from_key(max)) < want {
            return None;
        }
        let (mut lo, mut hi) = (min, max);
        while lo < hi {
            let mid = lo + ((hi as i128 - lo as i128) / 2) as i64;
            if ord(from_key(mid)) >= want {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Some(lo)
    };
    // Largest key whose value is at most `want`.
    let last_at_most = |want: Ordering| -> Option<i64> {
        if ord(from_key(min)) > want {
            return None;
        }
        let (mut lo, mut hi) = (min, max);
        while lo < hi {
            let mid = hi - ((hi as i128 - lo as i128) / 2) as i64;
            if ord(from_key(mid)) <= want {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Some(lo)
    };
    let (lo, hi) = match op {
        CmpOp::Gt => (first_at_least(Ordering::Greater)?, max),
        CmpOp::Ge => (first_at_least(Ordering::Equal)?, max),
        CmpOp::Lt => (min, last_at_most(Ordering::Less)?),
        CmpOp::Le => (min, last_at_most(Ordering::Equal)?),
        CmpOp::Eq | CmpOp::Ne => (
            first_at_least(Ordering::Equal)?,
            last_at_most(Ordering::Equal)?,
        ),
        CmpOp::In | CmpOp::NotIn => return None,
    };
    (lo <= hi).then(|| (from_key(lo), from_key(hi)))
}

/// The total order key of a non-NaN f64: -inf ... +inf as increasing
/// i64 (-0.0 just below 0.0; both compare equal to 0).
fn f64_key(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    if bits < 0 {
        i64::MIN - bits - 1
    } else {
        bits
    }
}

fn f64_from_key(k: i64) -> f64 {
    let bits = if k < 0 { i64::MIN - k - 1 } else { k };
    f64::from_bits(bits as u64)
}

/// A condition number columns answer without a call per row.
enum Fast<'q> {
    /// `value op number`.
    Cmp(CmpOp, Num<'q>),
    /// `value in [...]` (`not in` with `negate`): the list's numbers.
    In { numbers: Vec<Num<'q>>, negate: bool },
}

/// The values of an Int64 column where `value op literal` holds: an
/// interval (`None`: no value), worked out with the exact comparison.
fn int_span(op: CmpOp, literal: Num<'_>) -> Option<(i64, i64)> {
    interval(
        op,
        i64::MIN,
        i64::MAX,
        |k| k,
        |x| cmp_num(Num::I(x), literal).unwrap_or(Ordering::Less),
    )
}

/// [`int_span`] for a Float64 column (NaN lies outside every interval:
/// false for ordering and ==, true for !=, as it equals nothing).
fn float_span(op: CmpOp, literal: Num<'_>) -> Option<(f64, f64)> {
    interval(
        op,
        f64_key(f64::NEG_INFINITY),
        f64_key(f64::INFINITY),
        f64_from_key,
        |x| cmp_num(Num::F(x), literal).unwrap_or(Ordering::Less),
    )
}

/// Rows of a number column whose value equals one of `numbers` (none of
/// them with `negate`): each number's interval of equal values, sorted,
/// then one binary search per row.
fn numeric_in(array: &ArrayRef, numbers: &[Num<'_>], negate: bool) -> Option<Bits> {
    fn search<T: PartialOrd + Copy>(values: &[T], mut ranges: Vec<(T, T)>, negate: bool) -> Bits {
        ranges.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(Ordering::Equal));
        bits_where(values.len(), |i| {
            let x = values[i];
            let at = ranges.partition_point(|r| r.0 <= x);
            let found = at > 0 && x <= ranges[at - 1].1;
            found != negate
        })
    }
    match array.data_type() {
        DataType::Int64 => Some(search(
            array.as_primitive::<Int64Type>().values(),
            numbers
                .iter()
                .filter_map(|&n| int_span(CmpOp::Eq, n))
                .collect(),
            negate,
        )),
        DataType::Float64 => Some(search(
            array.as_primitive::<Float64Type>().values(),
            numbers
                .iter()
                .filter_map(|&n| float_span(CmpOp::Eq, n))
                .collect(),
            negate,
        )),
        _ => None,
    }
}

/// Rows of a number column where `column op literal` holds, for ordering
/// and equality operators (`!=`: the complement of `==`); `None` when this
/// fast path does not apply.
fn numeric_fast(array: &ArrayRef, op: CmpOp, literal: Num<'_>) -> Option<Bits> {
    if matches!(literal, Num::F(l) if l.is_nan()) {
        return None; // unordered: the general path decides
    }
    // `!=` is the complement of `==` (NaN included: it equals nothing).
    let (eq_op, ne) = if op == CmpOp::Ne {
        (CmpOp::Eq, true)
    } else {
        (op, false)
    };
    let hit = match array.data_type() {
        DataType::Int64 => {
            let values = array.as_primitive::<Int64Type>().values();
            match int_span(eq_op, literal) {
                Some((lo, hi)) => in_range(values, lo, hi),
                None => none(values.len()),
            }
        }
        DataType::Float64 => {
            let values = array.as_primitive::<Float64Type>().values();
            match float_span(eq_op, literal) {
                Some((lo, hi)) => in_range(values, lo, hi),
                None => none(values.len()),
            }
        }
        _ => return None,
    };
    Some(if ne {
        and_not(&all(array.len()), &hit)
    } else {
        hit
    })
}

/// A comparison's path, operator and literal, with the path first
/// (`1 < x` is `x > 1`); `None` for two paths or two literals, and for
/// `in` with the literal first.
fn path_first<'q>(
    lhs: &'q Operand,
    op: CmpOp,
    rhs: &'q Operand,
) -> Option<(&'q PathExpr, CmpOp, &'q Value)> {
    match (lhs, rhs) {
        (Operand::Path(p), Operand::Literal(l)) => Some((p, op, l)),
        (Operand::Literal(l), Operand::Path(p)) => Some((p, op.flipped()?, l)),
        _ => None,
    }
}

struct Ctx<'c> {
    cols: &'c Columns,
    n: usize,
    reasons: Vec<String>,
}

impl<'c> Ctx<'c> {
    fn unknown_all(&mut self, why: String) -> Tri {
        self.reasons.push(why);
        Tri {
            t: none(self.n),
            f: none(self.n),
        }
    }

    fn constant(&self, value: bool) -> Tri {
        if value {
            Tri {
                t: all(self.n),
                f: none(self.n),
            }
        } else {
            Tri {
                t: none(self.n),
                f: all(self.n),
            }
        }
    }

    fn node(&mut self, node: &Node) -> Tri {
        match node {
            Node::And(items) => {
                let mut acc = self.constant(true);
                for item in items {
                    let x = self.node(item);
                    acc = Tri {
                        t: and(&acc.t, &x.t),
                        f: or(&acc.f, &x.f),
                    };
                }
                acc
            }
            Node::Or(items) => {
                let mut acc = self.constant(false);
                for item in items {
                    let x = self.node(item);
                    acc = Tri {
                        t: or(&acc.t, &x.t),
                        f: and(&acc.f, &x.f),
                    };
                }
                acc
            }
            Node::Not(inner) => {
                let x = self.node(inner);
                Tri { t: x.f, f: x.t }
            }
            Node::Compare { lhs, op, rhs } => {
                if let (Operand::Literal(a), Operand::Literal(b)) = (lhs, rhs) {
                    return self.constant(compare(V::from_json(a), *op, V::from_json(b)));
                }
                let Some((path, op, lit)) = path_first(lhs, *op, rhs) else {
                    return match (lhs, rhs) {
                        (Operand::Literal(l), Operand::Path(p)) => {
                            // `literal in path`: membership in the path's value.
                            let (l, op) = (l, *op);
                            self.test(
                                p,
                                Box::new(move |v: Option<V<'_>>| {
                                    v.is_some_and(|v| compare(V::from_json(l), op, v))
                                }),
                                None,
                            )
                        }
                        _ => self.unknown_all(format!(
                            "`{}` compares two paths",
                            describe_compare(lhs, rhs)
                        )),
                    };
                };
                let fast = match (V::from_json(lit), op) {
                    (V::Num(num), _) if !matches!(op, CmpOp::In | CmpOp::NotIn) => {
                        Some(Fast::Cmp(op, num))
                    }
                    // Only the numbers of the list can equal a number.
                    (_, CmpOp::In | CmpOp::NotIn) if lit.is_array() => {
                        let numbers = lit
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|e| match V::from_json(e) {
                                V::Num(n) => Some(n),
                                _ => None,
                            })
                            .collect();
                        Some(Fast::In {
                            numbers,
                            negate: op == CmpOp::NotIn,
                        })
                    }
                    _ => None,
                };
                self.test(
                    path,
                    Box::new(move |v: Option<V<'_>>| {
                        v.is_some_and(|v| compare(v, op, V::from_json(lit)))
                    }),
                    fast,
                )
            }
            Node::Exists(path) => self.exists(path),
            Node::IsNan(path) => self.test(
                path,
                Box::new(|v: Option<V<'_>>| v.is_some_and(V::is_nan)),
                None,
            ),
            Node::Method {
                target,
                method,
                arg,
            } => match arg {
                Operand::Literal(a) => {
                    let m = *method;
                    self.test(
                        target,
                        Box::new(move |v: Option<V<'_>>| {
                            v.is_some_and(|v| apply_method(m, v, V::from_json(a)))
                        }),
                        None,
                    )
                }
                Operand::Path(p) => {
                    self.unknown_all(format!("a method's argument is the path {}", path_text(p)))
                }
            },
        }
    }

    /// Rows where `test` holds for the path's value; `fast`: the test is
    /// `value op number`, which number columns answer by interval.
    fn test(&mut self, path: &PathExpr, test: Test<'_>, fast: Option<Fast<'_>>) -> Tri {
        let n = self.n;
        let cols = self.cols;
        let r = resolve(path, cols);
        self.reasons.extend(r.reasons.iter().cloned());
        if r.key {
            let Some(keys) = cols.keys() else {
                return self.unknown_all("the key column cannot be read".into());
            };
            let t = bits_where(n, |i| test(Some(V::Str(keys.value(i)))));
            let f = and_not(&all(n), &t);
            return Tri { t, f };
        }
        // Rows answered by the typed column.
        let mut t = none(n);
        if let Some(column) = r.typed {
            let typed_valid = valid(column.as_ref());
            let hits = match (fast, column.data_type()) {
                (Some(Fast::Cmp(op, num)), DataType::Int64 | DataType::Float64) => {
                    numeric_fast(column, op, num)
                }
                (Some(Fast::In { numbers, negate }), DataType::Int64 | DataType::Float64) => {
                    numeric_in(column, &numbers, negate)
                }
                _ => None,
            };
            let hits = match hits {
                Some(h) => h,
                None => match column.data_type() {
                    DataType::Dictionary(_, _) => {
                        let d = column.as_dictionary::<Int32Type>();
                        let values = d.values().as_string::<i32>();
                        let table: Vec<bool> = (0..values.len())
                            .map(|k| test(Some(V::Str(values.value(k)))))
                            .collect();
                        let keys = d.keys().values();
                        bits_where(n, |i| {
                            usize::try_from(keys[i])
                                .ok()
                                .and_then(|k| table.get(k).copied())
                                .unwrap_or(false)
                        })
                    }
                    DataType::Boolean => {
                        let b = column.as_boolean();
                        let (on_true, on_false) =
                            (test(Some(V::Bool(true))), test(Some(V::Bool(false))));
                        bits_where(n, |i| if b.value(i) { on_true } else { on_false })
                    }
                    _ => bits_where(n, |i| test(typed_value(column, i))),
                },
            };
            t = and(&hits, &typed_valid);
        }
        // Rows with no metadata value: the array fact, else nothing.
        let absent = and_not(&all(n), &r.meta_present);
        let none_holds = test(None);
        match r.fact {
            Some((fact, fc)) => {
                let from_fact = bits_where(n, |i| {
                    if (absent[i / 64] >> (i % 64)) & 1 == 0 {
                        return false;
                    }
                    test(fact_value(fact, fc, i))
                });
                t = or(&t, &from_fact);
            }
            None if none_holds => t = or(&t, &absent),
            None => {}
        }
        let f = and_not(&and_not(&all(n), &t), &r.unknown);
        Tri { t, f }
    }

    fn exists(&mut self, path: &PathExpr) -> Tri {
        let n = self.n;
        let cols = self.cols;
        let r = resolve(path, cols);
        self.reasons.extend(r.reasons.iter().cloned());
        if r.key {
            return self.constant(true);
        }
        // Present where the metadata has a value (an indexed path: only
        // where the list is, which the records decide: unknown).
        let mut t = and_not(&r.meta_present, &r.unknown);
        if path.root == Root::Field {
            if let Some((fact, fc)) = r.fact {
                t = or(&t, &bits_where(n, |i| fact_value(fact, fc, i).is_some()));
            }
            let array = path.array.as_deref();
            match array.and_then(|a| fact_columns(cols, a)) {
                None if array.is_some() && !cols.facts_complete => {
                    // Maybe an array whose facts were left out: where the
                    // metadata has no value, the record decides.
                    let unknown = or(&r.unknown, &and_not(&all(n), &r.meta_present));
                    let f = and_not(&and_not(&all(n), &t), &unknown);
                    return Tri {
                        t: and_not(&t, &unknown),
                        f,
                    };
                }
                Some(Ok(fc)) => t = or(&t, &valid(fc.nbytes.as_ref())),
                Some(Err(())) => {
                    return self
                        .unknown_all(format!("a column of {} cannot be read", path_text(path)))
                }
                None => {}
            }
        }
        let f = and_not(&and_not(&all(n), &t), &r.unknown);
        Tri { t, f }
    }
}

fn describe_compare(lhs: &Operand, rhs: &Operand) -> String {
    let side = |o: &Operand| match o {
        Operand::Path(p) => path_text(p),
        Operand::Literal(v) => v.to_string(),
    };
    format!("{} ... {}", side(lhs), side(rhs))
}

impl Query {
    /// The columns of `cols` that evaluating this query reads (those
    /// `resolve` and `exists` reach for), so that they can be decoded
    /// together before ([`Columns::prefetch`]).
    pub(crate) fn columns_read(&self, cols: &Columns) -> Vec<usize> {
        fn operand(o: &Operand) -> Option<&PathExpr> {
            match o {
                Operand::Path(p) => Some(p),
                Operand::Literal(_) => None,
            }
        }
        let mut out = Vec::new();
        let facts = |array: &str, out: &mut Vec<usize>| {
            if let Some(f) = cols.facts.get(array) {
                out.extend(f.values().copied());
            }
        };
        let mut paths: Vec<(&PathExpr, bool)> = Vec::new();
        let mut stack = vec![&self.root];
        while let Some(node) = stack.pop() {
            match node {
                Node::Or(items) | Node::And(items) => stack.extend(items),
                Node::Not(inner) => stack.push(inner),
                Node::Compare { lhs, rhs, .. } => {
                    paths.extend(
                        [operand(lhs), operand(rhs)]
                            .into_iter()
                            .flatten()
                            .map(|p| (p, false)),
                    );
                }
                Node::Exists(p) => paths.push((p, true)),
                Node::IsNan(p) => paths.push((p, false)),
                Node::Method { target, arg, .. } => {
                    paths.push((target, false));
                    paths.extend(operand(arg).map(|p| (p, false)));
                }
            }
        }
        for (path, exists) in paths {
            if path.root == Root::Key {
                out.push(cols.key);
                continue;
            }
            let fields = leading_fields(path);
            if !fields.is_empty() {
                let exact: PathColumns = cols.paths.get(&fields).copied().unwrap_or_default();
                out.extend([exact.typed, exact.json].into_iter().flatten());
                if fields.len() == path.segs.len() {
                    for (p, pc) in &cols.paths {
                        if p.len() > fields.len() && p.starts_with(&fields) {
                            out.extend([pc.typed, pc.json].into_iter().flatten());
                        }
                    }
                }
            }
            if path.root == Root::Field {
                if let Some(fact) = &path.fact {
                    facts(&fact.array, &mut out);
                }
                if let (true, Some(array)) = (exists, &path.array) {
                    facts(array, &mut out);
                }
            }
        }
        out
    }

    /// The query's answer for every row of `cols` (see the module docs).
    /// Rows that are not live (deleted keys) are answered like any other:
    /// the caller masks them.
    pub(crate) fn eval_columns(&self, cols: &Columns) -> Verdict {
        let n = cols.len();
        let mut ctx = Ctx {
            cols,
            n,
            reasons: Vec::new(),
        };
        let tri = ctx.node(&self.root);
        let unknown = and_not(&and_not(&all(n), &tri.t), &tri.f);
        let mut reasons = ctx.reasons;
        reasons.dedup();
        let mut seen = std::collections::HashSet::new();
        reasons.retain(|r| seen.insert(r.clone()));
        Verdict {
            yes: tri.t,
            unknown,
            reasons,
        }
    }
}

/// The field names of `path` before its first list index.
fn leading_fields(path: &PathExpr) -> Vec<String> {
    path.segs
        .iter()
        .map_while(|s| match s {
            Seg::Field(f) => Some(f.clone()),
            Seg::Index(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_keys_are_monotone_and_invertible() {
        let xs = [
            f64::NEG_INFINITY,
            -1e300,
            -1.0,
            -f64::MIN_POSITIVE,
            -0.0,
            0.0,
            f64::MIN_POSITIVE,
            1.0,
            1e300,
            f64::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(f64_key(w[0]) <= f64_key(w[1]), "{w:?}");
        }
        for x in xs {
            assert_eq!(f64_from_key(f64_key(x)).to_bits(), x.to_bits(), "{x}");
        }
    }
}
