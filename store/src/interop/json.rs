//! Strict JSON for the headers and manifests of imported files: as
//! `serde_json` (no NaN or Infinity, nesting capped at 128) but an object
//! naming a key twice is refused rather than silently keeping the last
//! value, as the safetensors reference reader and our Python layer did.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Parses `bytes` (UTF-8 JSON, one value, nothing after it but white space).
///
/// # Errors
/// The parser's message: invalid JSON or UTF-8, a duplicate key (`duplicate
/// key "a"`), trailing characters, nesting deeper than 128.
pub(crate) fn parse_strict(bytes: &[u8]) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// A `Value` seed that refuses duplicate keys at every level.
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number JSON cannot hold"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(de::Error::custom(format!("duplicate key {k:?}")));
            }
            let v = map.next_value_seed(Strict)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_json_and_refuses_duplicates_nan_and_trailing_text() {
        let v = parse_strict(br#"{"a": [1, -2, 2.5, "x", null, true], "b": {"c": {}}}"#).unwrap();
        assert_eq!(v["a"][2], 2.5);
        assert_eq!(v["b"]["c"], serde_json::json!({}));
        let keys: Vec<_> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["a", "b"], "order kept");
        assert!(parse_strict(br#"{"a": 1, "a": 2}"#)
            .unwrap_err()
            .contains("duplicate key \"a\""));
        assert!(parse_strict(br#"{"x": {"a": 1, "a": 2}}"#).is_err());
        assert!(parse_strict(b"[NaN]").is_err());
        assert!(parse_strict(b"{} x").is_err());
        assert!(parse_strict(b"{\"\xff\": 1}").is_err());
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(parse_strict(deep.as_bytes()).is_err());
    }
}
