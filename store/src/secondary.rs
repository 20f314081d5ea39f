//! Secondary indexes on metadata fields: the order-preserving byte encoding
//! of their entries (the sled side lives in `index.rs`).
//!
//! An entry is `b"i" + field + 0x00 + value + key`, with an empty value,
//! where `field` is the dotted path (`params.lr`) and `value` encodes a
//! scalar so that byte order is the query language's order within a kind:
//!
//! ```text
//! null    01
//! bool    02 00|01
//! number  03 + 8 bytes: the value as f64 (-0 as 0), sign bit flipped for
//!         positives and every bit flipped for negatives, big-endian
//! string  04 + UTF-8 with 00 escaped as 00 FF + terminator 00 01
//! ```
//!
//! Numbers beyond 2^53 share an f64 with their neighbours, and the encoding
//! is not prefix-free across kinds in a way lookups rely on, so an index
//! only ever yields *candidates*: the store evaluates the whole query on
//! each. Keys are UTF-8, which never contains the byte FF, so
//! `value + FF` is above every entry of that value.

use serde_json::{Map, Value};

use crate::query::IndexLookup;

/// Prefix byte of index entries in the sled tree.
pub(crate) const ENTRY: u8 = b'i';

const NULL: u8 = 1;
const BOOL: u8 = 2;
const NUMBER: u8 = 3;
const STRING: u8 = 4;

/// Checks an indexable field name: dotted plain field names, each
/// non-empty, no NUL. Returns its segments.
pub(crate) fn parse_field(field: &str) -> Result<Vec<String>, String> {
    if field.contains('\0') {
        return Err("a field name cannot contain NUL".into());
    }
    let segs: Vec<String> = field.split('.').map(str::to_owned).collect();
    if segs.iter().any(String::is_empty) {
        return Err(format!(
            "{field:?} is not a field path: dotted non-empty names such as \"temperature\" or \"params.lr\""
        ));
    }
    Ok(segs)
}

/// The scalar at `segs` in `meta`, if there is one (lists and objects are
/// not indexed: no comparison with a scalar literal can match them).
pub(crate) fn field_value<'a>(meta: &'a Map<String, Value>, segs: &[String]) -> Option<&'a Value> {
    let (first, rest) = segs.split_first()?;
    let mut value = meta.get(first)?;
    for seg in rest {
        value = value.as_object()?.get(seg)?;
    }
    (!matches!(value, Value::Array(_) | Value::Object(_))).then_some(value)
}

fn number_bytes(v: f64) -> [u8; 8] {
    let v = if v == 0.0 { 0.0 } else { v };
    let bits = v.to_bits();
    let ordered = if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    };
    ordered.to_be_bytes()
}

/// Appends the encoding of a scalar; `false` for lists and objects.
pub(crate) fn encode_value(out: &mut Vec<u8>, value: &Value) -> bool {
    match value {
        Value::Null => out.push(NULL),
        Value::Bool(b) => out.extend_from_slice(&[BOOL, u8::from(*b)]),
        Value::Number(n) => {
            out.push(NUMBER);
            // u64, i64 and f64 all have an f64 (rounded to nearest).
            out.extend_from_slice(&number_bytes(n.as_f64().unwrap_or(f64::NAN)));
        }
        Value::String(s) => {
            out.push(STRING);
            for &b in s.as_bytes() {
                if b == 0 {
                    out.extend_from_slice(&[0, 0xFF]);
                } else {
                    out.push(b);
                }
            }
            out.extend_from_slice(&[0, 1]);
        }
        Value::Array(_) | Value::Object(_) => return false,
    }
    true
}

/// `b"i" + field + 0x00`: the prefix of every entry of one index.
pub(crate) fn field_prefix(field: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(field.len() + 2);
    p.push(ENTRY);
    p.extend_from_slice(field.as_bytes());
    p.push(0);
    p
}

/// The entry of `key` whose `field` holds `value`.
pub(crate) fn entry(field: &str, value: &Value, key: &str) -> Option<Vec<u8>> {
    let mut e = field_prefix(field);
    if !encode_value(&mut e, value) {
        return None;
    }
    e.extend_from_slice(key.as_bytes());
    Some(e)
}

/// The key at the end of an entry, given the entry minus its field prefix.
pub(crate) fn entry_key(rest: &[u8]) -> Option<&str> {
    let value_len = match *rest.first()? {
        NULL => 1,
        BOOL => 2,
        NUMBER => 9,
        STRING => {
            let mut i = 1;
            loop {
                match (rest.get(i)?, rest.get(i + 1)?) {
                    (0, 1) => break i + 2,
                    (0, _) => i += 2,
                    _ => i += 1,
                }
            }
        }
        _ => return None,
    };
    std::str::from_utf8(rest.get(value_len..)?).ok()
}

/// Byte ranges `[start, end)` of the entries a lookup must read.
pub(crate) fn ranges(field: &str, lookup: &IndexLookup) -> Vec<(Vec<u8>, Vec<u8>)> {
    let prefix = field_prefix(field);
    let with = |tail: &[u8]| {
        let mut v = prefix.clone();
        v.extend_from_slice(tail);
        v
    };
    let encoded = |value: &Value| {
        let mut v = prefix.clone();
        encode_value(&mut v, value).then_some(v)
    };
    let above = |mut v: Vec<u8>| {
        v.push(0xFF);
        v
    };
    match lookup {
        IndexLookup::Points(values) => values
            .iter()
            .filter_map(|v| encoded(v).map(|start| (start.clone(), above(start))))
            .collect(),
        IndexLookup::Range { lower, upper } => {
            let kind = lower.as_ref().or(upper.as_ref()).map(|(v, _)| v);
            let tag = match kind {
                Some(Value::Number(_)) => NUMBER,
                Some(Value::String(_)) => STRING,
                _ => return Vec::new(),
            };
            // Bounds are inclusive here: exclusiveness and numbers that
            // round to the same f64 are settled by evaluating the query.
            let start = match lower {
                Some((v, _)) => encoded(v).unwrap_or_else(|| with(&[tag])),
                None => with(&[tag]),
            };
            let end = match upper {
                Some((v, _)) => above(encoded(v).unwrap_or_else(|| with(&[tag + 1]))),
                None => with(&[tag + 1]),
            };
            if start < end {
                vec![(start, end)]
            } else {
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn enc(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        assert!(encode_value(&mut out, v));
        out
    }

    proptest! {
        #[test]
        fn numbers_keep_their_order(a in any::<f64>(), b in any::<f64>()) {
            prop_assume!(a.is_finite() && b.is_finite());
            let (ea, eb) = (enc(&json!(a)), enc(&json!(b)));
            prop_assert_eq!(a.partial_cmp(&b).unwrap(), ea.cmp(&eb));
        }

        #[test]
        fn integers_never_reverse_order(a in any::<i64>(), b in any::<u64>()) {
            let (ea, eb) = (enc(&json!(a)), enc(&json!(b)));
            if i128::from(a) < i128::from(b) {
                prop_assert!(ea <= eb);
            } else if i128::from(a) > i128::from(b) {
                prop_assert!(ea >= eb);
            }
        }

        #[test]
        fn strings_keep_code_point_order_and_keys_come_back(a in ".*", b in ".*", key in ".+") {
            let (ea, eb) = (enc(&json!(a)), enc(&json!(b)));
            prop_assert_eq!(a.cmp(&b), ea.cmp(&eb));
            let e = entry("f", &json!(a), &key).unwrap();
            prop_assert_eq!(entry_key(&e[3..]), Some(key.as_str()));
        }
    }

    #[test]
    fn zero_signs_and_kinds() {
        assert_eq!(enc(&json!(0.0)), enc(&json!(-0.0)));
        assert_eq!(enc(&json!(0)), enc(&json!(0.0)));
        assert!(enc(&json!(null)) < enc(&json!(false)));
        assert!(enc(&json!(true)) < enc(&json!(-1e300)));
        assert!(enc(&json!(1e300)) < enc(&json!("")));
        assert!(!encode_value(&mut Vec::new(), &json!([1])));
        assert_eq!(
            entry_key(
                &enc(&json!("a\0b"))
                    .into_iter()
                    .chain(*b"k")
                    .collect::<Vec<_>>()
            ),
            Some("k")
        );
    }

    #[test]
    fn field_names() {
        assert_eq!(parse_field("params.lr").unwrap(), ["params", "lr"]);
        for bad in ["", ".x", "x.", "a..b", "a\0b"] {
            assert!(parse_field(bad).is_err(), "{bad:?}");
        }
    }
}
