//! serde seeds that decode a record JSON keeping only what a query reads:
//! the wanted metadata fields and, when asked, the array facts. Everything
//! else is skipped with [`IgnoredAny`], without building values.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use super::{ScanArray, ScanRecord};
use crate::query::QueryNeeds;

/// A whole record object: `meta` through [`MetaSeed`], `arrays` through
/// [`ArraysSeed`] when the query reads array facts, the rest skipped.
pub(super) struct RecordSeed<'n> {
    pub needs: &'n QueryNeeds,
}

impl<'de> DeserializeSeed<'de> for RecordSeed<'_> {
    type Value = ScanRecord<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RecordSeed<'_> {
    type Value = ScanRecord<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a record")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut record = ScanRecord::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match &*key {
                "meta" => record.meta = map.next_value_seed(MetaSeed { needs: self.needs })?,
                "arrays" if self.needs.arrays => record.arrays = map.next_value_seed(ArraysSeed)?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(record)
    }
}

/// A map key, borrowed from the input when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

/// The metadata object, keeping only the top-level fields `needs` names
/// (settled as [`QueryNeeds::settle`] says).
pub(super) struct MetaSeed<'n> {
    pub needs: &'n QueryNeeds,
}

impl<'de> DeserializeSeed<'de> for MetaSeed<'_> {
    type Value = Map<String, Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetaSeed<'_> {
    type Value = Map<String, Value>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a metadata object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut meta = Map::new();
        let mut keys = 0;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            keys += 1;
            if self.needs.wants(&key) {
                meta.insert(key.into_owned(), map.next_value::<Value>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(self.needs.settle(meta, keys))
    }
}

/// The `arrays` object as scans see it: (name, facts) in record order.
pub(super) struct ArraysSeed;

impl<'de> DeserializeSeed<'de> for ArraysSeed {
    type Value = Vec<(String, ScanArray<'de>)>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ArraysSeed {
    type Value = Vec<(String, ScanArray<'de>)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of array entries")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(1));
        while let Some(entry) = map.next_entry::<String, ScanArray<'de>>()? {
            out.push(entry);
        }
        Ok(out)
    }
}
