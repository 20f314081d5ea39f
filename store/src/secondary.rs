//! Secondary indexes on metadata fields: the order-preserving byte encoding
//! of their entries (the sled side lives in `index.rs`).
//!
//! An entry is `b"i" + field + 0x00 + value + key`, with an empty value,
//! where `field` is the dotted path (`params.lr`) and `value` encodes a
//! scalar so that byte order is the query language's order within a kind:
//!
//! ```text
//! null      01
//! bool      02 00|01
//! number    03 + 8 bytes: the value as f64 (-0 as 0), sign bit flipped for
//!           positives and every bit flipped for negatives, big-endian
//! string    04 + UTF-8 with 00 escaped as 00 FF + terminator 00 01
//! datetime  05 + 16 bytes: nanoseconds since the epoch as i128, sign bit
//!           flipped, big-endian
//! ```
//!
//! Tagged values (FORMAT.md, "Tagged values") are indexed as what they
//! stand for (see [`crate::query::index_scalar`]): `$int`, `$float`
//! infinities and numpy numbers as numbers, `$datetime`, `$date` and numpy
//! datetimes as datetimes, on the wall clock read as UTC, which is how
//! comparisons with ISO 8601 literals see them; so a string bound reads
//! both the strings and, when it is ISO 8601, the datetimes. NaN and NaT,
//! which no `==`, `in` or range can match, are left out, as are lists
//! (`$tuple` too) and objects.
//!
//! Numbers beyond 2^53 share an f64 with their neighbours, and the encoding
//! is not prefix-free across kinds in a way lookups rely on, so an index
//! only ever yields *candidates*: the store evaluates the whole query on
//! each. Keys are UTF-8, which never contains the byte FF, so
//! `value + FF` is above every entry of that value.

use serde_json::{Map, Value};

use crate::query::{fields, index_scalar, literal_time, IndexLookup, IndexScalar};

/// Prefix byte of index entries in the sled tree.
pub(crate) const ENTRY: u8 = b'i';

const NULL: u8 = 1;
const BOOL: u8 = 2;
const NUMBER: u8 = 3;
const STRING: u8 = 4;
const TIME: u8 = 5;

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

/// The scalar at `segs` in `meta`, found as queries find it (through
/// `$dict` objects), if there is one that an index keeps (not lists,
/// objects, NaN or NaT: no comparison with a scalar literal can match
/// them).
pub(crate) fn field_value<'a>(meta: &'a Map<String, Value>, segs: &[String]) -> Option<&'a Value> {
    let (first, rest) = segs.split_first()?;
    let mut value = fields(meta).get(first)?;
    for seg in rest {
        value = crate::query::field_of(value, seg)?;
    }
    index_scalar(value).is_some().then_some(value)
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

fn time_bytes(nanos: i128) -> [u8; 16] {
    (nanos.cast_unsigned() ^ (1 << 127)).to_be_bytes()
}

/// Appends the encoding of a datetime (see [`IndexScalar::Time`]).
fn encode_time(out: &mut Vec<u8>, nanos: i128) {
    out.push(TIME);
    out.extend_from_slice(&time_bytes(nanos));
}

/// Appends the encoding of a scalar (tagged values as what they stand
/// for); `false` for what is not indexed (lists, objects, NaN, NaT).
pub(crate) fn encode_value(out: &mut Vec<u8>, value: &Value) -> bool {
    let Some(scalar) = index_scalar(value) else {
        return false;
    };
    match scalar {
        IndexScalar::Null => out.push(NULL),
        IndexScalar::Bool(b) => out.extend_from_slice(&[BOOL, u8::from(b)]),
        IndexScalar::Num(f) => {
            out.push(NUMBER);
            // u64, i64, big integers and f64 all have an f64 (rounded to nearest).
            out.extend_from_slice(&number_bytes(f));
        }
        IndexScalar::Time(nanos) => encode_time(out, nanos),
        IndexScalar::Str(s) => {
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
        TIME => 17,
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
    // An ISO 8601 string also stands for the datetime it reads as.
    let time = |value: &Value| match value {
        Value::String(s) => literal_time(s),
        _ => None,
    };
    let time_encoded = |nanos: i128| {
        let mut v = prefix.clone();
        encode_time(&mut v, nanos);
        v
    };
    match lookup {
        IndexLookup::Points(values) => {
            let mut out: Vec<(Vec<u8>, Vec<u8>)> = values
                .iter()
                .filter_map(|v| encoded(v).map(|start| (start.clone(), above(start))))
                .collect();
            out.extend(values.iter().filter_map(time).map(|nanos| {
                let start = time_encoded(nanos);
                (start.clone(), above(start))
            }));
            out
        }
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
            let mut out = Vec::new();
            if start < end {
                out.push((start, end));
            }
            // String bounds that all read as ISO 8601 bound datetimes too;
            // a bound that does not is false for every datetime.
            let bound_time = |b: &Option<(Value, bool)>| match b {
                None => Some(None),
                Some((v, _)) => time(v).map(Some),
            };
            if tag == STRING {
                if let (Some(low), Some(high)) = (bound_time(lower), bound_time(upper)) {
                    let start = low.map_or_else(|| with(&[TIME]), time_encoded);
                    let end = high.map_or_else(|| with(&[TIME + 1]), |n| above(time_encoded(n)));
                    if start < end {
                        out.push((start, end));
                    }
                }
            }
            out
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
    fn tagged_values_are_indexed_as_what_they_stand_for() {
        let inf = [&[NUMBER][..], &number_bytes(f64::INFINITY)].concat();
        assert_eq!(enc(&json!({"$float": "inf"})), inf);
        assert!(enc(&json!(1e308)) < enc(&json!({"$float": "inf"})));
        assert!(enc(&json!({"$float": "-inf"})) < enc(&json!(-1e308)));
        assert!(enc(&json!({"$float": "inf"})) < enc(&json!("")));
        assert_eq!(enc(&json!({"$numpy": ["<f4", 1.5]})), enc(&json!(1.5)));
        assert_eq!(enc(&json!({"$numpy": ["|b1", true]})), enc(&json!(true)));
        assert_eq!(enc(&json!({"$numpy": ["<m8[s]", 5]})), enc(&json!(5)));
        assert_eq!(
            enc(&json!({"$int": "18446744073709551616"})),
            enc(&json!(1.8446744073709552e19))
        );
        assert!(enc(&json!({"$int": "-18446744073709551616"})) < enc(&json!(i64::MIN)));
        let t = |s: &str| enc(&json!({ "$datetime": s }));
        // Aware values by instant, naive ones on the wall clock as UTC.
        assert_eq!(t("2024-03-01T12:00:00+01:00"), t("2024-03-01T11:00:00"));
        assert_eq!(
            t("2024-03-01T00:00:00"),
            enc(&json!({"$date": "2024-03-01"}))
        );
        assert_eq!(
            t("2024-03-01T00:00:00"),
            enc(&json!({"$numpy": ["<M8[D]", "2024-03-01"]}))
        );
        assert!(t("1969-12-31T23:59:59.999999") < t("1970-01-01T00:00:00"));
        assert!(t("2024-03-01T00:00:00") < t("2024-03-01T00:00:00.000001"));
        assert!(enc(&json!("\u{10ffff}")) < t("0001-01-01T00:00:00"));
        for skipped in [
            json!({"$float": "nan"}),
            json!({"$numpy": ["<f8", {"$float": "nan"}]}),
            json!({"$numpy": ["<M8[s]", "NaT"]}),
            json!({"$numpy": ["<m8[s]", "NaT"]}),
            json!({"$tuple": [1]}),
            json!({"$dict": {"$x": 1}}),
            json!({"$unknown": 1}),
        ] {
            assert!(!encode_value(&mut Vec::new(), &skipped), "{skipped}");
        }
        let e = entry("f", &json!({"$date": "2024-03-01"}), "k/1").unwrap();
        assert_eq!(entry_key(&e[3..]), Some("k/1"));
    }

    #[test]
    fn field_values_are_found_through_escaped_dicts() {
        let meta = json!({
            "p": {"$dict": {"$x": {"$date": "2024-03-01"}}},
            "n": {"$float": "nan"},
            "q": {"$float": "inf"},
        });
        let meta = meta.as_object().unwrap();
        let segs = |f: &str| parse_field(f).unwrap();
        assert_eq!(
            field_value(meta, &segs("p.$x")),
            Some(&json!({"$date": "2024-03-01"}))
        );
        assert_eq!(field_value(meta, &segs("p")), None);
        assert_eq!(field_value(meta, &segs("p.$dict")), None);
        assert_eq!(field_value(meta, &segs("n")), None);
        assert_eq!(field_value(meta, &segs("q.$float")), None);
        assert_eq!(
            field_value(meta, &segs("q")),
            Some(&json!({"$float": "inf"}))
        );
        let escaped = json!({"$dict": {"$x": 1}});
        assert_eq!(
            field_value(escaped.as_object().unwrap(), &segs("$x")),
            Some(&json!(1))
        );
    }

    /// The encoded values within the ranges of `lookup` on field "f".
    fn hits(lookup: &IndexLookup, values: &[Value]) -> Vec<Value> {
        let ranges = ranges("f", lookup);
        values
            .iter()
            .filter(|v| {
                let e = entry("f", v, "k").unwrap();
                ranges.iter().any(|(start, end)| *start <= e && e < *end)
            })
            .cloned()
            .collect()
    }

    #[test]
    fn string_bounds_also_read_datetimes() {
        let march = json!({"$datetime": "2024-03-01T12:30:00+01:00[Europe/Paris]"});
        let jan = json!({"$date": "2024-01-01"});
        let values = [
            march.clone(),
            jan.clone(),
            json!("2024-03-05"),
            json!("b"),
            json!(5),
        ];
        let range = |lower: Option<&str>, upper: Option<&str>| IndexLookup::Range {
            lower: lower.map(|v| (json!(v), true)),
            upper: upper.map(|v| (json!(v), true)),
        };
        assert_eq!(
            hits(&range(Some("2024-03-01"), None), &values),
            [march.clone(), json!("2024-03-05"), json!("b")]
        );
        assert_eq!(
            hits(&range(None, Some("2024-01-01T00:00:00Z")), &values),
            std::slice::from_ref(&jan)
        );
        assert_eq!(
            hits(
                &range(Some("2024-01-01"), Some("2024-03-01T11:30:00")),
                &values
            ),
            [march.clone(), jan.clone()]
        );
        // A bound that is not ISO 8601 matches no datetime.
        assert_eq!(hits(&range(Some("a"), None), &values), [json!("b")]);
        assert_eq!(
            hits(&range(Some("2024-01-01"), Some("a")), &values),
            [json!("2024-03-05")]
        );
        let points = IndexLookup::Points(vec![json!("2024-03-01T11:30:00Z"), json!(5)]);
        assert_eq!(hits(&points, &values), [march, json!(5)]);
        let points = IndexLookup::Points(vec![json!("2024-01-01"), json!("2024-03-05")]);
        assert_eq!(hits(&points, &values), [jan, json!("2024-03-05")]);
    }

    #[test]
    fn field_names() {
        assert_eq!(parse_field("params.lr").unwrap(), ["params", "lr"]);
        for bad in ["", ".x", "x.", "a..b", "a\0b"] {
            assert!(parse_field(bad).is_err(), "{bad:?}");
        }
    }
}
