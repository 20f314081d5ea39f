//! Evaluation of a parsed query against one record: paths resolve to the
//! metadata first, then to an array fact (`image.shape`), and the
//! comparison rules of `value` decide. Evaluation never fails: a path that
//! resolves to nothing makes its condition false.

use serde_json::{Map, Value};

use super::ast::{FactKind, FactRef, Node, Operand, PathExpr, Root, Seg};
use super::value::{apply_method, compare, field, items, List, Num, V};
use super::{ArrayFacts, RecordView};

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

/// The metadata value at a plain path (first segment a field name) of the
/// fields `meta` ([`RecordView::fields`]); steps go into `$dict` objects and
/// `$tuple` lists as into plain ones, never into other tagged values.
fn lookup<'a>(meta: &'a Map<String, Value>, segs: &[Seg]) -> Option<&'a Value> {
    let (Seg::Field(first), rest) = segs.split_first()? else {
        return None;
    };
    let mut value = meta.get(first)?;
    for seg in rest {
        value = match seg {
            Seg::Field(name) => field(value, name)?,
            Seg::Index(i) => {
                let items = items(value)?;
                items.get(list_index(*i, items.len())?)?
            }
        };
    }
    Some(value)
}

/// The value a path reads from `rec`: the key, a metadata value, else (for
/// a plain path) an array fact.
fn path_value<'a, R: RecordView + ?Sized>(path: &'a PathExpr, rec: &'a R) -> Option<V<'a>> {
    if path.root == Root::Key {
        return Some(V::Str(rec.key()));
    }
    if let Some(value) = lookup(rec.fields(), &path.segs) {
        return Some(V::from_json(value));
    }
    let fact = path.fact.as_ref()?;
    fact_value(fact, rec.array(&fact.array)?)
}

/// The fact `fact` of `array`; `None` for a dimension past the last.
fn fact_value<'a>(fact: &FactRef, array: ArrayFacts<'a>) -> Option<V<'a>> {
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
        // The element count; past u64 (only from a corrupt shape) a float.
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

/// The value of a literal, or of a path in `rec`.
fn operand_value<'a, R: RecordView + ?Sized>(operand: &'a Operand, rec: &'a R) -> Option<V<'a>> {
    match operand {
        Operand::Literal(value) => Some(V::from_json(value)),
        Operand::Path(path) => path_value(path, rec),
    }
}

/// `exists(path)`: the key always; a metadata value; for a plain path also
/// an array fact or an array of that name.
fn path_exists<R: RecordView + ?Sized>(path: &PathExpr, rec: &R) -> bool {
    match path.root {
        Root::Key => true,
        Root::Meta => lookup(rec.fields(), &path.segs).is_some(),
        Root::Field => {
            path_value(path, rec).is_some()
                || path
                    .array
                    .as_deref()
                    .is_some_and(|name| rec.array(name).is_some())
        }
    }
}

/// Whether `rec` satisfies `node`.
pub(super) fn eval<R: RecordView + ?Sized>(node: &Node, rec: &R) -> bool {
    match node {
        Node::Or(items) => items.iter().any(|n| eval(n, rec)),
        Node::And(items) => items.iter().all(|n| eval(n, rec)),
        Node::Not(inner) => !eval(inner, rec),
        Node::Compare { lhs, op, rhs } => operand_value(lhs, rec)
            .zip(operand_value(rhs, rec))
            .is_some_and(|(a, b)| compare(a, *op, b)),
        Node::Exists(path) => path_exists(path, rec),
        Node::IsNan(path) => path_value(path, rec).is_some_and(V::is_nan),
        Node::Method {
            target,
            method,
            arg,
        } => path_value(target, rec)
            .zip(operand_value(arg, rec))
            .is_some_and(|(t, a)| apply_method(*method, t, a)),
    }
}

#[cfg(test)]
mod tests {
    use crate::query::test_support::*;
    use serde_json::json;

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
}
