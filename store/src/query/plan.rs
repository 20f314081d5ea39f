//! Query planning: which records a secondary index can narrow a query to
//! ([`Query::index_plan`]), and which parts of a record a scan must decode
//! for it ([`Query::needs`]). Plans are supersets: the store still evaluates
//! the whole query on every candidate, so a plan may be loose, never tight.

use std::cmp::Ordering;
use std::collections::HashSet;

use serde_json::{Map, Value};

use super::ast::{CmpOp, Node, Operand, PathExpr, Root, Seg};
use super::tagged::{tag, Tag};
use super::value::cmp_literal;
use super::Query;

/// How a secondary index on one metadata field can narrow a query: the
/// records whose field value is one of `Points`, or lies in `Range`. The
/// index gives candidates only; the whole query is still evaluated on each,
/// so a plan needs to be a superset, never exact.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum IndexLookup {
    /// Field equal to one of these scalars (`==`, `in [...]`); an empty
    /// list matches nothing.
    Points(Vec<Value>),
    /// Field within bounds of one kind (numbers or strings); each bound is
    /// `(value, inclusive)`.
    Range {
        /// The lower bound, `None` for none.
        lower: Option<(Value, bool)>,
        /// The upper bound, `None` for none.
        upper: Option<(Value, bool)>,
    },
}

/// A secondary-index plan: the field (dotted path segments) and the lookup.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IndexPlan {
    /// The indexed metadata field, as path segments: `["params", "lr"]`.
    pub field: Vec<String>,
    /// The values of that field the candidates have.
    pub lookup: IndexLookup,
}

/// The tag of an escaped dict, which may hold the whole metadata.
const ESCAPE: &str = "$dict";

/// What evaluating a query reads from a record, so a scan can skip the
/// rest while decoding: the top-level metadata fields its paths start with,
/// and whether it reads array facts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct QueryNeeds {
    /// The top-level metadata fields the query's paths start with.
    pub fields: HashSet<String>,
    /// Whether the query reads the record's array entries (facts, `exists`).
    pub arrays: bool,
}

impl QueryNeeds {
    /// Whether the top-level metadata field `name` is read. Queries name
    /// few fields: comparing them beats hashing `name` (SipHash) for each
    /// field of each record scanned. A `$dict` field is read whenever any
    /// is, since it may be the escape of the whole metadata (see
    /// [`QueryNeeds::settle`]).
    pub(crate) fn wants(&self, name: &str) -> bool {
        if name == ESCAPE && !self.fields.is_empty() {
            return true;
        }
        if self.fields.len() <= 8 {
            self.fields.iter().any(|f| f == name)
        } else {
            self.fields.contains(name)
        }
    }

    /// The metadata fields as [`crate::query::RecordView::fields`] sees
    /// them, from `meta`, the [`QueryNeeds::wants`] fields of a metadata
    /// object that has `keys` fields in all: the object inside when the
    /// whole metadata is `{"$dict": {...}}`, else `meta` without the
    /// `$dict` field read only to check for that.
    pub(crate) fn settle(&self, mut meta: Map<String, Value>, keys: usize) -> Map<String, Value> {
        if keys == 1 && matches!(tag(&meta), Some(Tag::Dict(_))) {
            if let Some(Value::Object(inner)) = meta.swap_remove(ESCAPE) {
                return inner;
            }
        }
        if !self.fields.contains(ESCAPE) {
            meta.swap_remove(ESCAPE);
        }
        meta
    }

    /// Notes what reading `path` needs; `exists` when the path is the
    /// argument of `exists()`, which may name an array.
    fn note(&mut self, path: &PathExpr, exists: bool) {
        if path.root == Root::Key {
            return;
        }
        if let Some(Seg::Field(first)) = path.segs.first() {
            self.fields.insert(first.clone());
        }
        // Array entries are read for a fact (`image.shape`) and, in
        // `exists`, for a path that may name an array; a plain comparison
        // of a field never reads them.
        if path.root == Root::Field && (path.fact.is_some() || (exists && path.array.is_some())) {
            self.arrays = true;
        }
    }

    fn note_operand(&mut self, operand: &Operand) {
        if let Operand::Path(p) = operand {
            self.note(p, false);
        }
    }
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
    /// on one field are intersected. Points beat ranges (fewer points
    /// beat more), two-sided ranges beat one-sided.
    pub(crate) fn index_plan(&self, indexed: &dyn Fn(&[String]) -> bool) -> Option<IndexPlan> {
        let items: &[Node] = match &self.root {
            Node::And(items) => items,
            other => std::slice::from_ref(other),
        };
        let mut points: Option<(IndexPlan, usize)> = None;
        let mut ranges: Vec<IndexPlan> = Vec::new();
        for plan in items.iter().filter_map(|item| conjunct_plan(item, indexed)) {
            match &plan.lookup {
                IndexLookup::Points(values) => {
                    let count = values.len();
                    if points.as_ref().is_none_or(|(_, fewest)| count < *fewest) {
                        points = Some((plan, count));
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
        if let Some((plan, _)) = points {
            return Some(plan);
        }
        ranges.into_iter().max_by_key(|r| match &r.lookup {
            IndexLookup::Range { lower, upper } => {
                usize::from(lower.is_some()) + usize::from(upper.is_some())
            }
            IndexLookup::Points(_) => 0,
        })
    }

    /// The fields and facts this query reads (see [`QueryNeeds`]).
    pub(crate) fn needs(&self) -> QueryNeeds {
        let mut needs = QueryNeeds::default();
        let mut stack = vec![&self.root];
        while let Some(node) = stack.pop() {
            match node {
                Node::Or(items) | Node::And(items) => stack.extend(items),
                Node::Not(inner) => stack.push(inner),
                Node::Compare { lhs, rhs, .. } => {
                    needs.note_operand(lhs);
                    needs.note_operand(rhs);
                }
                Node::Exists(p) => needs.note(p, true),
                Node::IsNan(p) => needs.note(p, false),
                Node::Method { target, arg, .. } => {
                    needs.note(target, false);
                    needs.note_operand(arg);
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

/// A value of a range, which tells the range's kind; `None` for a points
/// lookup.
fn range_kind(lookup: &IndexLookup) -> Option<&Value> {
    let IndexLookup::Range { lower, upper } = lookup else {
        return None;
    };
    lower.as_ref().or(upper.as_ref()).map(|(v, _)| v)
}

/// Tightens `into`'s range with `other`'s (same field); ranges over
/// different kinds (a number and a string bound) match nothing, which an
/// empty point set says.
fn intersect(into: &mut IndexPlan, other: IndexPlan) {
    let (Some(kind), Some(kind2)) = (range_kind(&into.lookup), range_kind(&other.lookup)) else {
        return;
    };
    if !same_kind(kind, kind2) {
        into.lookup = IndexLookup::Points(Vec::new());
        return;
    }
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
    *lower = tighter(lower.take(), lower2, Ordering::Greater);
    *upper = tighter(upper.take(), upper2, Ordering::Less);
}

/// The tighter of two bounds on one side: the one further in the direction
/// `want` (`Greater` for lower bounds, `Less` for upper), exclusive on a tie
/// if either is.
fn tighter(
    a: Option<(Value, bool)>,
    b: Option<(Value, bool)>,
    want: Ordering,
) -> Option<(Value, bool)> {
    match (a, b) {
        (None, b) => b,
        (a, None) => a,
        (Some((x, xi)), Some((y, yi))) => match cmp_literal(&x, &y) {
            Some(o) if o == want => Some((x, xi)),
            Some(Ordering::Equal) => Some((x, xi && yi)),
            Some(_) => Some((y, yi)),
            None => Some((x, xi)),
        },
    }
}

/// The plan one condition allows on its own.
fn conjunct_plan(node: &Node, indexed: &dyn Fn(&[String]) -> bool) -> Option<IndexPlan> {
    let Node::Compare { lhs, op, rhs } = node else {
        return None;
    };
    let (path, op, literal) = match (lhs, rhs) {
        (Operand::Path(p), Operand::Literal(v)) => (p, *op, v),
        // `5 in x` is membership in the field, which the index cannot
        // answer: `flipped` has no `in`.
        (Operand::Literal(v), Operand::Path(p)) => (p, op.flipped()?, v),
        _ => return None,
    };
    let field = plain_field(path)?;
    if !indexed(&field) {
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

/// The field names of a path an index can serve: a metadata path of field
/// names only (no list index, not the key), that does not read as an array
/// fact.
fn plain_field(path: &PathExpr) -> Option<Vec<String>> {
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
    (!field.is_empty()).then_some(field)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::{IndexLookup, IndexPlan};
    use crate::query::Query;

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

    #[test]
    fn needs_read_dict_escapes_and_settle_them() {
        let needs = Query::parse("meta['$x'] == 1").unwrap().needs();
        assert!(needs.wants("$x") && needs.wants("$dict") && !needs.wants("y"));
        assert!(!Query::parse("key == 'a'").unwrap().needs().wants("$dict"));
        let map = |v: Value| v.as_object().unwrap().clone();
        // The only field: the escape of the whole metadata.
        assert_eq!(
            needs.settle(map(json!({"$dict": {"$x": 1}})), 1),
            map(json!({"$x": 1}))
        );
        // One of several fields (the others not wanted): a plain field, dropped.
        assert_eq!(
            needs.settle(map(json!({"$dict": {"$x": 1}})), 2),
            map(json!({}))
        );
        assert_eq!(needs.settle(map(json!({"$dict": 5})), 1), map(json!({})));
        let wanted = Query::parse("meta['$dict'] == 1").unwrap().needs();
        assert_eq!(
            wanted.settle(map(json!({"$dict": {"$x": 1}})), 2),
            map(json!({"$dict": {"$x": 1}}))
        );
    }

    /// The plan of `src` when the fields `a`, `b` and `a.dtype` are indexed.
    fn plan(src: &str) -> Option<IndexPlan> {
        let indexed = |field: &[String]| {
            matches!(
                field.iter().map(String::as_str).collect::<Vec<_>>()[..],
                ["a"] | ["b"] | ["a", "dtype"]
            )
        };
        Query::parse(src).unwrap().index_plan(&indexed)
    }

    fn points(field: &str, values: Vec<Value>) -> Option<IndexPlan> {
        Some(IndexPlan {
            field: field.split('.').map(String::from).collect(),
            lookup: IndexLookup::Points(values),
        })
    }

    fn range(
        field: &str,
        lower: Option<(Value, bool)>,
        upper: Option<(Value, bool)>,
    ) -> Option<IndexPlan> {
        Some(IndexPlan {
            field: field.split('.').map(String::from).collect(),
            lookup: IndexLookup::Range { lower, upper },
        })
    }

    #[test]
    fn index_plan_points_beat_ranges_and_fewer_points_win() {
        assert_eq!(plan("a == 1"), points("a", vec![json!(1)]));
        assert_eq!(plan("'x' == a"), points("a", vec![json!("x")]));
        assert_eq!(
            plan("a in [1, 'x', null]"),
            points("a", vec![json!(1), json!("x"), json!(null)])
        );
        assert_eq!(plan("b in [1, 2] and a == 3"), points("a", vec![json!(3)]));
        // A tie keeps the first.
        assert_eq!(plan("b == 2 and a == 3"), points("b", vec![json!(2)]));
        assert_eq!(plan("a > 0 and b == 2"), points("b", vec![json!(2)]));
        assert_eq!(
            plan("meta.a.dtype == 'f'"),
            points("a.dtype", vec![json!("f")])
        );
    }

    #[test]
    fn index_plan_intersects_ranges_on_one_field() {
        assert_eq!(plan("a > 1"), range("a", Some((json!(1), false)), None));
        assert_eq!(plan("1 <= a"), range("a", Some((json!(1), true)), None));
        assert_eq!(plan("'m' > a"), range("a", None, Some((json!("m"), false))));
        assert_eq!(
            plan("a > 1 and a <= 5.5"),
            range("a", Some((json!(1), false)), Some((json!(5.5), true)))
        );
        assert_eq!(
            plan("a > 1 and a >= 3 and a > 3 and a < 9 and a <= 7"),
            range("a", Some((json!(3), false)), Some((json!(7), true)))
        );
        assert_eq!(
            plan("1 < a < 4"),
            range("a", Some((json!(1), false)), Some((json!(4), false)))
        );
        // Bounds of two kinds: nothing matches.
        assert_eq!(plan("a > 1 and a < 'x'"), points("a", vec![]));
        // Two-sided beats one-sided.
        assert_eq!(
            plan("a > 1 and b > 0 and b < 9"),
            range("b", Some((json!(0), false)), Some((json!(9), false)))
        );
    }

    #[test]
    fn index_plan_skips_what_an_index_cannot_answer() {
        for src in [
            "a == 1 or b == 2",
            "not a == 1",
            "a != 1",
            "1 in a",
            "a not in [1]",
            "a[0] == 1",
            "a == [1]",
            "a in [1, [2]]",
            "a > true",
            "a > [1]",
            "c == 1",
            "key == 'x'",
            "a.dtype == 'f'",
            "exists(a)",
            "a.startswith('x')",
            "a == b",
        ] {
            assert_eq!(plan(src), None, "{src}");
        }
    }
}
