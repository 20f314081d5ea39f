//! The descr (dtype) grammar of `.npy` headers and the itemsize it implies.
//!
//! A descr is the Python literal `repr(numpy.lib.format.dtype_to_descr(dtype))`:
//! a type string such as `'<f8'` (byte order, kind, size), a list of
//! fields `[(name, descr), (name, descr, shape), ...]` for a structured
//! dtype, or a pair `(descr, shape)` for a subarray dtype, which numpy
//! writes for a field whose dtype is itself a subarray
//! (`[('c', ('<f8', (5,)), (2,))]`). See "descr" in schema/FORMAT.md.

use super::literal::{render, snippet, Lit, Parser};
use super::NpyError;

/// Itemsize in bytes of a descr (Python-literal text, e.g. `'<f8'` or a list
/// of fields), or `None` when it is malformed or of an unknown kind.
///
/// Type strings: `b1`; `i`/`u` 1, 2, 4, 8; `f` 2, 4, 8, 12, 16; `c` 8, 16,
/// 24, 32; `M8`/`m8` with an optional unit (`[ns]`, `[10s]`, ...); `S<n>`;
/// `U<n>` (4 bytes per character); `V<n>`; `O` (8, a pickled object pointer),
/// each with an optional byte-order character `<`, `>`, `|` or `=`.
/// Structured descrs: the sum of the field itemsizes, each times the product
/// of its subarray shape (third element) if any; a `(descr, shape)` pair:
/// the itemsize of `descr` times the product of `shape`. Surrounding whitespace is
/// allowed; an itemsize that overflows a u64 is `None`.
pub fn descr_itemsize(descr: &str) -> Option<u64> {
    // Fast path for the common case: a plain single-quoted type string.
    if let Some(inner) = descr.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        if !inner.contains(['\\', '\'']) {
            return type_str_itemsize(inner);
        }
    }
    let lit = parse_descr_literal(descr).ok()?;
    check_descr(&lit).ok()?;
    literal_itemsize(&lit)
}

/// Parses, validates and canonically re-renders descr text (what the writer
/// puts in a header). Errors are [`NpyError::BadDescr`], with the offset in
/// `descr` of the byte that does not parse, or 0 when it parses but is not a
/// descr.
pub(super) fn canonical_descr(descr: &str) -> Result<String, NpyError> {
    let lit = parse_descr_text(descr)?;
    checked_render(&lit).map_err(|reason| NpyError::BadDescr { offset: 0, reason })
}

/// The value of a descr: what `ast.literal_eval` makes of the text, in the
/// shape `numpy.lib.format.descr_to_dtype` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Descr {
    /// A type string such as `<f8`, `|S5` or `<M8[ns]` (its kind is not
    /// checked: see [`descr_itemsize`]).
    Type(String),
    /// The fields of a structured dtype, in order.
    Fields(Vec<DescrField>),
    /// A subarray dtype `(descr, shape)`: `shape` items of `descr` each
    /// (numpy's `dtype((base, shape))`, written for nested subarray fields).
    Subarray(Box<Descr>, SubarrayShape),
}

/// One field of a structured [`Descr`]: `(name, descr)`,
/// `((title, name), descr)` or either with a third element, the shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescrField {
    /// The field's title, when the name is a `(title, name)` pair.
    pub title: Option<String>,
    /// The field's name (empty for numpy's padding fields).
    pub name: String,
    /// The dtype of the field.
    pub descr: Descr,
    /// The subarray shape, when the field is a subarray.
    pub shape: Option<SubarrayShape>,
}

/// The subarray shape of a [`DescrField`], as written: an integer, or a
/// tuple of integers (all non-negative, their product fits a u64).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubarrayShape {
    /// A bare integer `n`, the same as the tuple `(n,)`.
    Int(u64),
    /// A tuple of dimensions (possibly empty).
    Tuple(Vec<u64>),
}

/// Parses descr text (a Python literal such as `'<f8'` or
/// `[('x', '<i4'), ('y', '>f8', (2, 3))]`, surrounding whitespace allowed)
/// into its value. The type strings themselves are not checked.
///
/// Errors are [`NpyError::BadDescr`], with the offset in `descr` of the
/// byte that does not parse, or 0 when the text parses but is not a descr
/// (see "descr" in schema/FORMAT.md).
pub fn parse_descr(descr: &str) -> Result<Descr, NpyError> {
    let lit = parse_descr_text(descr)?;
    check_descr(&lit).map_err(|reason| NpyError::BadDescr { offset: 0, reason })?;
    Ok(descr_value(&lit))
}

/// Parses descr text into a literal tree, a parse error as
/// [`NpyError::BadDescr`].
fn parse_descr_text(descr: &str) -> Result<Lit, NpyError> {
    parse_descr_literal(descr).map_err(|e| match e {
        NpyError::Malformed { offset, reason } => NpyError::BadDescr {
            offset,
            reason: format!(
                "cannot parse {}: {reason}",
                snippet(&Lit::Str(descr.to_owned()))
            ),
        },
        other => other,
    })
}

/// The value of a subarray shape that [`check_descr`] accepted.
fn subarray_shape(shape: &Lit) -> SubarrayShape {
    fn dim(lit: &Lit) -> u64 {
        match lit {
            Lit::Int {
                magnitude: Some(m), ..
            } => *m,
            _ => 0,
        }
    }
    match shape {
        Lit::Tuple(dims) => SubarrayShape::Tuple(dims.iter().map(dim).collect()),
        other => SubarrayShape::Int(dim(other)),
    }
}

/// The value of a literal that [`check_descr`] accepted.
fn descr_value(lit: &Lit) -> Descr {
    match lit {
        Lit::List(fields) => Descr::Fields(
            fields
                .iter()
                .filter_map(|field| {
                    let Lit::Tuple(items) = field else {
                        return None;
                    };
                    let (title, name) = match items.first()? {
                        Lit::Tuple(pair) => match pair.as_slice() {
                            [Lit::Str(t), Lit::Str(n)] => (Some(t.clone()), n.clone()),
                            _ => return None,
                        },
                        Lit::Str(n) => (None, n.clone()),
                        _ => return None,
                    };
                    let shape = items.get(2).map(subarray_shape);
                    Some(DescrField {
                        title,
                        name,
                        descr: descr_value(items.get(1)?),
                        shape,
                    })
                })
                .collect(),
        ),
        Lit::Str(s) => Descr::Type(s.clone()),
        Lit::Tuple(pair) if pair.len() == 2 => {
            Descr::Subarray(Box::new(descr_value(&pair[0])), subarray_shape(&pair[1]))
        }
        // Not a descr: check_descr refuses it.
        _ => Descr::Fields(Vec::new()),
    }
}

/// Validates a parsed descr and renders it canonically (as `repr()` does);
/// the error is the reason it is not a descr.
pub(super) fn checked_render(lit: &Lit) -> Result<String, String> {
    check_descr(lit)?;
    let mut out = String::new();
    render(lit, &mut out);
    Ok(out)
}

/// Parses descr text (surrounding whitespace allowed) into a literal tree.
pub(super) fn parse_descr_literal(descr: &str) -> Result<Lit, NpyError> {
    let mut p = Parser::utf8(descr, 0);
    p.skip_ws();
    let lit = p.value()?;
    p.finish("the end of the descr")?;
    Ok(lit)
}

/// Checks that a literal has the shape of a descr: a type string, a list
/// of `(name, descr)` / `(name, descr, shape)` tuples where name is a string
/// or a `(title, name)` pair of strings and shape an integer or a tuple of
/// integers, or a `(descr, shape)` pair (numpy's `descr_to_dtype` takes a
/// tuple as a subarray dtype). Type strings are not checked here: a header whose type string
/// is of a kind [`descr_itemsize`] does not know still parses (its itemsize
/// is then `None`).
fn check_descr(lit: &Lit) -> Result<(), String> {
    match lit {
        Lit::Str(_) => Ok(()),
        Lit::List(fields) => {
            for (i, field) in fields.iter().enumerate() {
                check_field(field).map_err(|e| format!("field {i}: {e}"))?;
            }
            Ok(())
        }
        Lit::Tuple(pair) if pair.len() == 2 => {
            check_descr(&pair[0])?;
            check_subarray_shape(&pair[1])
        }
        other => Err(format!(
            "expected a type string, a list of fields or a (descr, shape) pair, got {}",
            snippet(other)
        )),
    }
}

fn check_subarray_shape(shape: &Lit) -> Result<(), String> {
    match subarray_count(shape) {
        Some(_) => Ok(()),
        None => Err(format!(
            "a subarray shape must be a non-negative integer or a tuple of them, got {}",
            snippet(shape)
        )),
    }
}

fn check_field(field: &Lit) -> Result<(), String> {
    let items = match field {
        Lit::Tuple(items) if (2..=3).contains(&items.len()) => items,
        other => {
            return Err(format!(
                "expected a tuple (name, descr) or (name, descr, shape), got {}",
                snippet(other)
            ))
        }
    };
    match items.first() {
        Some(Lit::Str(_)) => {}
        Some(Lit::Tuple(pair)) if matches!(pair.as_slice(), [Lit::Str(_), Lit::Str(_)]) => {}
        Some(other) => {
            return Err(format!(
                "a field name must be a string or a (title, name) tuple of strings, got {}",
                snippet(other)
            ))
        }
        None => {}
    }
    if let Some(descr) = items.get(1) {
        check_descr(descr)?;
    }
    match items.get(2) {
        Some(shape) => check_subarray_shape(shape),
        None => Ok(()),
    }
}

/// Number of elements of a field's subarray shape (an int or a tuple of
/// ints); `None` if it is not one or the product overflows.
fn subarray_count(shape: &Lit) -> Option<u64> {
    fn dim(lit: &Lit) -> Option<u64> {
        match lit {
            Lit::Int {
                negative,
                magnitude: Some(m),
            } if !*negative || *m == 0 => Some(*m),
            _ => None,
        }
    }
    match shape {
        Lit::Tuple(dims) => dims
            .iter()
            .try_fold(1u64, |acc, d| acc.checked_mul(dim(d)?)),
        other => dim(other),
    }
}

/// Itemsize of a checked descr literal; `None` for an unknown type string
/// or an overflow.
fn literal_itemsize(lit: &Lit) -> Option<u64> {
    match lit {
        Lit::Str(s) => type_str_itemsize(s),
        Lit::List(fields) => fields.iter().try_fold(0u64, |acc, field| {
            let Lit::Tuple(items) = field else {
                return None;
            };
            let size = literal_itemsize(items.get(1)?)?;
            let count = match items.get(2) {
                Some(shape) => subarray_count(shape)?,
                None => 1,
            };
            acc.checked_add(size.checked_mul(count)?)
        }),
        Lit::Tuple(pair) if pair.len() == 2 => {
            literal_itemsize(&pair[0])?.checked_mul(subarray_count(&pair[1])?)
        }
        _ => None,
    }
}

/// Itemsize of a numpy type string such as `<f8`, `|S5`, `<M8[ns]`.
fn type_str_itemsize(s: &str) -> Option<u64> {
    let s = s.strip_prefix(['<', '>', '|', '=']).unwrap_or(s);
    let mut chars = s.chars();
    let kind = chars.next()?;
    let rest = chars.as_str();
    match kind {
        'b' => (rest == "1").then_some(1),
        'i' | 'u' => decimal(rest).filter(|n| matches!(n, 1 | 2 | 4 | 8)),
        'f' => decimal(rest).filter(|n| matches!(n, 2 | 4 | 8 | 12 | 16)),
        'c' => decimal(rest).filter(|n| matches!(n, 8 | 16 | 24 | 32)),
        'M' | 'm' => {
            let unit = rest.strip_prefix('8')?;
            (unit.is_empty() || datetime_unit_ok(unit)).then_some(8)
        }
        'S' | 'V' => decimal(rest),
        'U' => decimal(rest)?.checked_mul(4),
        'O' => match rest {
            "" | "8" => Some(8),
            "4" => Some(4),
            _ => None,
        },
        _ => None,
    }
}

/// `[unit]` or `[<multiplier>unit]` of a datetime64/timedelta64 type string.
fn datetime_unit_ok(s: &str) -> bool {
    let Some(inner) = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')) else {
        return false;
    };
    let unit = inner.trim_start_matches(|c: char| c.is_ascii_digit());
    let multiplier = &inner[..inner.len() - unit.len()];
    (multiplier.is_empty() || decimal(multiplier).is_some_and(|n| n > 0))
        && matches!(
            unit,
            "Y" | "M"
                | "W"
                | "D"
                | "h"
                | "m"
                | "s"
                | "ms"
                | "us"
                | "μs"
                | "ns"
                | "ps"
                | "fs"
                | "as"
                | "generic"
        )
}

/// A non-empty run of ASCII digits as a u64.
fn decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.bytes().try_fold(0u64, |acc, b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::parse_text;
    use super::*;

    /// Checks [`descr_itemsize`] against each `(descr, expected)` case.
    fn assert_itemsizes(cases: &[(&str, Option<u64>)]) {
        for &(descr, expected) in cases {
            assert_eq!(descr_itemsize(descr), expected, "{descr}");
        }
    }

    #[test]
    fn itemsize_of_simple_descrs() {
        assert_itemsizes(&[
            ("'|b1'", Some(1)),
            ("'<i1'", Some(1)),
            ("'<i2'", Some(2)),
            ("'>i4'", Some(4)),
            ("'=i8'", Some(8)),
            ("'|u1'", Some(1)),
            ("'<u2'", Some(2)),
            ("'<u4'", Some(4)),
            ("'<u8'", Some(8)),
            ("'<f2'", Some(2)),
            ("'<f4'", Some(4)),
            ("'>f8'", Some(8)),
            ("'<f12'", Some(12)),
            ("'<f16'", Some(16)),
            ("'<c8'", Some(8)),
            ("'<c16'", Some(16)),
            ("'<c32'", Some(32)),
            ("'<M8'", Some(8)),
            ("'<M8[ns]'", Some(8)),
            ("'>m8[D]'", Some(8)),
            ("'<M8[10s]'", Some(8)),
            ("'<m8[generic]'", Some(8)),
            ("'|S5'", Some(5)),
            ("'|S0'", Some(0)),
            ("'<U5'", Some(20)),
            ("'>U1'", Some(4)),
            ("'|V16'", Some(16)),
            ("'|O'", Some(8)),
            ("'|O8'", Some(8)),
            ("'f8'", Some(8)),
            ("\"<f8\"", Some(8)),
            (" '<f8' ", Some(8)),
            ("[]", Some(0)),
            // Unknown or malformed.
            ("'<f3'", None),
            ("'<i16'", None),
            ("'|b2'", None),
            ("'<M4'", None),
            ("'<M8[parsec]'", None),
            ("'<M8[0s]'", None),
            ("'<M8[ns'", None),
            ("'<U'", None),
            ("'|S+5'", None),
            ("'<x8'", None),
            ("'!f8'", None),
            ("''", None),
            ("'<f8", None),
            ("<f8", None),
            ("3", None),
            ("'<U9999999999999999999'", None),
        ]);
    }

    #[test]
    fn itemsize_of_structured_descrs() {
        assert_itemsizes(&[
            ("[('x', '<i4'), ('y', '>f8')]", Some(12)),
            ("[('x', '<i4'), ('y', '>f8', (2, 3))]", Some(52)),
            ("[('x', '<i4', 3)]", Some(12)),
            ("[('x', '<i4', ())]", Some(4)),
            ("[('x', '<i4', (2, 0))]", Some(0)),
            (
                "[(('a title', 'x'), '<i4'), (('t', 'y'), '|S5', (2,))]",
                Some(14),
            ),
            ("[('x', '<i4'), ('', '|V4'), ('y', '<f8')]", Some(16)),
            (
                "[('s', [('a', '<M8[ns]'), ('b', '|S5')], (3,)), ('u', '<U3')]",
                Some(51),
            ),
            // a field whose dtype is itself a subarray (numpy writes these
            // for dtype([('c', ('<f8', (5,)), (2,))])): 2 x 5 x 8 bytes
            ("[('c', ('<f8', (5,)), (2,))]", Some(80)),
            ("[('c', (('<i2', 3), (2,)))]", Some(12)),
            ("('<f8', (5,))", Some(40)),
            ("('|V0', 3)", Some(0)),
            ("[('c', ('<f8', (5,), 1))]", None),
            ("[('c', ('<f8', (-5,)))]", None),
            ("[('x', '<i4'), ('y', '<f3')]", None),
            ("[('x', '<i4', (-1,))]", None),
            ("[('x', '<u8', (4294967296, 4294967296))]", None),
            ("[('x', '|S18446744073709551615'), ('y', '|u1')]", None),
            ("[('x',)]", None),
            ("[('x', '<i4'),", None),
        ]);
    }

    #[test]
    fn descr_values() {
        let field = |title: Option<&str>, name: &str, descr, shape| DescrField {
            title: title.map(str::to_owned),
            name: name.to_owned(),
            descr,
            shape,
        };
        let t = |s: &str| Descr::Type(s.to_owned());
        assert_eq!(parse_descr(" '<f8' ").unwrap(), t("<f8"));
        assert_eq!(parse_descr("'<q3'").unwrap(), t("<q3"));
        assert_eq!(parse_descr("[]").unwrap(), Descr::Fields(vec![]));
        assert_eq!(
            parse_descr("[(('T', 'x'), '<i4', 3), ('', '|V4'), ('s', [('a', '|b1')], (2, 0))]")
                .unwrap(),
            Descr::Fields(vec![
                field(Some("T"), "x", t("<i4"), Some(SubarrayShape::Int(3))),
                field(None, "", t("|V4"), None),
                field(
                    None,
                    "s",
                    Descr::Fields(vec![field(None, "a", t("|b1"), None)]),
                    Some(SubarrayShape::Tuple(vec![2, 0])),
                ),
            ])
        );
        assert_eq!(
            parse_descr("[('c', ('<f8', (5,)), (2,))]").unwrap(),
            Descr::Fields(vec![field(
                None,
                "c",
                Descr::Subarray(Box::new(t("<f8")), SubarrayShape::Tuple(vec![5])),
                Some(SubarrayShape::Tuple(vec![2])),
            )])
        );
        assert_eq!(
            parse_descr("('|u1', 3)").unwrap(),
            Descr::Subarray(Box::new(t("|u1")), SubarrayShape::Int(3))
        );
        for bad in [
            "",
            "'<f8",
            "3",
            "('<f8',)",
            "('<f8', 3, 4)",
            "('<f8', -1)",
            "(('<f8', 2), ('<f8', 2))",
            "[('x',)]",
            "[('x', '<i4', (-1,))]",
            "[(1, '<i4')]",
            "[('x', '<i4', 99999999999999999999)]",
            "{'a': 1}",
        ] {
            assert!(
                matches!(parse_descr(bad), Err(NpyError::BadDescr { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn descr_is_rendered_canonically() {
        let h = parse_text(
            "{'descr': [ (\"x\",\"<i4\") , ((u'T', 'y'), '>f8', (2,3,),), ('z', [('a', '|b1', 4)]) ,], 'fortran_order': False, 'shape': (), }",
        )
        .unwrap();
        assert_eq!(
            h.descr,
            "[('x', '<i4'), (('T', 'y'), '>f8', (2, 3)), ('z', [('a', '|b1', 4)])]"
        );
        assert_eq!(h.shape, Vec::<u64>::new());
        assert_eq!(h.len(), Some(1));
        assert_eq!(h.nbytes(), Some(4 + 48 + 4));
        assert_eq!(
            canonical_descr("  [('a', '<f4', (1,))] ").unwrap(),
            "[('a', '<f4', (1,))]"
        );
    }
}
