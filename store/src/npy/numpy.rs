//! What numpy knows of a descr beyond its grammar: `dtype.name`,
//! `dtype.hasobject`, and the arrays numpy can create at all.

use super::descr::{descr_itemsize, parse_descr, Descr};

/// numpy's `NPY_MAXDIMS`: the most dimensions an array can have.
pub const NUMPY_MAX_DIMS: usize = 64;

/// Why numpy cannot create an array of `descr` (Python-literal text) and
/// `shape`, or `None` when it can: more than [`NUMPY_MAX_DIMS`]
/// dimensions, a dimension past `intp`, or a byte size (the item size times
/// every non-zero dimension, as numpy multiplies them) past `intp`
/// (`i64::MAX` bytes). An unknown descr is left to other checks.
///
/// A record holding such an array could be written but never read back
/// (numpy raises `ValueError`), so import refuses it; the store's read path
/// can call this to report such a record as damaged.
pub fn numpy_refuses(descr: &str, shape: &[u64]) -> Option<String> {
    const INTP_MAX: u64 = i64::MAX as u64;
    if shape.len() > NUMPY_MAX_DIMS {
        return Some(format!(
            "{} dimensions: numpy arrays have at most {NUMPY_MAX_DIMS}",
            shape.len()
        ));
    }
    if let Some(d) = shape.iter().find(|&&d| d > INTP_MAX) {
        return Some(format!(
            "dimension {d} exceeds numpy's largest ({INTP_MAX}, 2^63-1)"
        ));
    }
    let itemsize = descr_itemsize(descr)?;
    let bytes = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(itemsize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= INTP_MAX);
    match bytes {
        Some(_) => None,
        None => Some(format!(
            "shape {shape:?} of {} takes more than 2^63-1 bytes (numpy multiplies the item size by \
             every non-zero dimension, and refuses such arrays, even empty ones)",
            dtype_name(descr)
        )),
    }
}

/// Whether a descr (Python-literal text) holds Python objects anywhere
/// (numpy's `dtype.hasobject`): such arrays are written as pickles.
/// A descr that does not parse has none.
pub fn descr_has_object(descr: &str) -> bool {
    fn has_object(descr: &Descr) -> bool {
        match descr {
            Descr::Type(t) => t.trim_start_matches(['<', '>', '|', '=']).starts_with('O'),
            Descr::Fields(fields) => fields.iter().any(|f| has_object(&f.descr)),
            Descr::Subarray(base, _) => has_object(base),
        }
    }
    parse_descr(descr).is_ok_and(|d| has_object(&d))
}

/// numpy's `dtype.name` for a descr (Python-literal text): `"float64"`,
/// `"datetime64[D]"`, `"str96"`, `"bytes40"`, `"void160"` for a structured
/// dtype of 20 bytes, `"object"`. The descr text itself when it is none of
/// numpy's kinds.
pub fn dtype_name(descr: &str) -> String {
    match parse_descr(descr) {
        Ok(Descr::Type(t)) => type_name(&t).unwrap_or_else(|| descr.to_owned()),
        Ok(Descr::Fields(_) | Descr::Subarray(..)) => match descr_itemsize(descr) {
            Some(0) => "void".to_owned(),
            Some(n) => format!("void{}", n * 8),
            None => descr.to_owned(),
        },
        Err(_) => descr.to_owned(),
    }
}

/// numpy's name of a type string (`"<f8"` → `"float64"`).
fn type_name(t: &str) -> Option<String> {
    let t = t.trim_start_matches(['<', '>', '|', '=']);
    let mut chars = t.chars();
    let kind = chars.next()?;
    let rest = chars.as_str();
    let size = || rest.parse::<u64>().ok();
    let bits = |per: u64| size().map(|n| n * per);
    Some(match kind {
        'b' if rest == "1" => "bool".to_owned(),
        '?' => "bool".to_owned(),
        'i' => format!("int{}", bits(8)?),
        'u' => format!("uint{}", bits(8)?),
        'f' => format!("float{}", bits(8)?),
        'c' => format!("complex{}", bits(8)?),
        'M' | 'm' => {
            let unit = rest.strip_prefix('8').unwrap_or(rest);
            let base = if kind == 'M' {
                "datetime64"
            } else {
                "timedelta64"
            };
            format!("{base}{unit}")
        }
        'S' | 'a' => match size()? {
            0 => "bytes".to_owned(),
            n => format!("bytes{}", n * 8),
        },
        'U' => match size()? {
            0 => "str".to_owned(),
            n => format!("str{}", n * 32),
        },
        'V' => match size()? {
            0 => "void".to_owned(),
            n => format!("void{}", n * 8),
        },
        'O' => "object".to_owned(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_are_numpys() {
        for (descr, name) in [
            ("'<f8'", "float64"),
            ("'>f4'", "float32"),
            ("'<f2'", "float16"),
            ("'<f16'", "float128"),
            ("'|b1'", "bool"),
            ("'|u1'", "uint8"),
            ("'<i8'", "int64"),
            ("'<c16'", "complex128"),
            ("'<M8[D]'", "datetime64[D]"),
            ("'<m8[10s]'", "timedelta64[10s]"),
            ("'<M8'", "datetime64"),
            ("'>U3'", "str96"),
            ("'|S5'", "bytes40"),
            ("'|V8'", "void64"),
            ("'|O'", "object"),
            ("[('x', '<i4'), ('y', '>f8', (2,))]", "void160"),
            ("[('名前', '<i2')]", "void16"),
            ("[('c', ('<f8', (5,)), (2,))]", "void640"),
        ] {
            assert_eq!(dtype_name(descr), name, "{descr}");
        }
    }

    #[test]
    fn numpy_refuses_what_it_cannot_create() {
        assert_eq!(numpy_refuses("'<f8'", &[1; 64]), None);
        assert!(numpy_refuses("'<f8'", &[1; 65])
            .unwrap()
            .contains("65 dimensions"));
        // numpy's own limits, probed with np.empty
        assert!(numpy_refuses("'<f8'", &[0, (1 << 63) - 1]).is_some());
        assert!(numpy_refuses("'<f8'", &[0, 1 << 62]).is_some());
        assert_eq!(numpy_refuses("'|i1'", &[0, (1 << 63) - 1]), None);
        assert!(numpy_refuses("'|i1'", &[0, 1 << 62, 2]).is_some());
        assert!(numpy_refuses("'|i1'", &[1 << 63]).is_some());
        assert_eq!(numpy_refuses("'|V0'", &[1 << 62]), None);
        assert!(numpy_refuses("'<f8'", &[1 << 40, 1 << 30]).is_some());
        assert!(numpy_refuses("'<f8'", &[1 << 30, 1 << 30]).is_some()); // 2^63 bytes
        assert_eq!(numpy_refuses("'<f8'", &[1 << 30, 1 << 29]), None);
    }

    #[test]
    fn objects_are_found_in_type_strings_and_fields_not_names() {
        assert!(descr_has_object("'|O'"));
        assert!(descr_has_object("[('a', '<f8'), ('b', '|O')]"));
        assert!(descr_has_object("[('a', [('b', '|O', (2,))])]"));
        assert!(!descr_has_object("[('Oscar', '<f8')]"));
        assert!(!descr_has_object("'<f8'"));
        assert!(!descr_has_object("[(('title', 'O'), '<i4')]"));
        // a field whose dtype is a subarray of objects
        assert!(descr_has_object("[('c', ('|O', (5,)), (2,))]"));
        assert!(!descr_has_object("[('c', ('<f8', (5,)), (2,))]"));
        assert!(!descr_has_object("not a descr"));
    }
}
