//! Building a column batch from records (see the module docs of
//! [`super`] for the conventions): one pass over `(key, record JSON)`
//! pairs collects each metadata path's leaves, sparse, then each path gets
//! its typed column (the most common scalar kind) and, where other kinds
//! occur, a JSON-text sibling.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int64Builder, ListBuilder, StringBuilder,
    StringDictionaryBuilder, TimestampMicrosecondBuilder, UInt64Builder,
};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use indexmap::IndexMap;
use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{field_meta, Columns, FactName, Kind, UTC};
use crate::error::{Error, Result};
use crate::query::tagged::{tag, Tag};

/// At most this many metadata paths get columns in one batch, and at
/// most this many array names get fact columns: past that (records with
/// thousands of fields or arrays), the rest are left to the records
/// (queries on them read the records), so that a column file stays a few
/// hundred columns at most. The schema says when some were left out.
pub(crate) const MAX_PATHS: usize = 1024;
pub(crate) const MAX_ARRAYS: usize = 64;

/// Ints of at most this magnitude are exact in an f64: a path holding
/// ints and floats stores such ints in its Float64 column.
const EXACT_F64_INT: i64 = 1 << 53;

/// A leaf value as the builder sorts it.
#[derive(Debug, Clone)]
enum Leaf {
    Int(i64),
    Float(f64),
    Bool(bool),
    /// Index into the path's string table.
    Str(u32),
    /// Microseconds since the epoch (UTC for aware, wall clock for naive).
    Time {
        micros: i64,
        aware: bool,
    },
    /// Any other value: its JSON text.
    Other(String),
}

/// The scalar kinds a typed column can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Scalar {
    Num,
    Bool,
    Str,
    NaiveTime,
    AwareTime,
}

#[derive(Default)]
struct PathValues {
    rows: Vec<(u32, Leaf)>,
    /// The record's own JSON text of tagged leaves (`$float`, `$numpy`,
    /// `$datetime`...), by row: what their JSON-text cell shows; and what
    /// the tag marks in the typed column's metadata.
    /// In row order (a path has at most one leaf a row).
    raw: Vec<(u32, String, Mark)>,
    strings: Vec<String>,
    string_ids: HashMap<String, u32>,
    ints: usize,
    floats: usize,
    inexact_ints: usize,
    counts: HashMap<Scalar, usize>,
}

impl PathValues {
    fn push(&mut self, row: u32, value: &Value) {
        let leaf = match (leaf_of(value), value) {
            (Some(Leaf::Other(_)) | None, _) => Leaf::Other(value.to_string()),
            (Some(Leaf::Str(_)), Value::String(text)) => return self.push_str(row, text),
            (Some(Leaf::Str(_)), _) => Leaf::Other(value.to_string()),
            (Some(other), _) => {
                if let Value::Object(map) = value {
                    self.raw.push((row, value.to_string(), Mark::of(map)));
                }
                other
            }
        };
        self.add(row, leaf);
    }

    /// The JSON text and mark of the tagged leaf of `row`, if it has one.
    fn raw(&self, row: u32) -> Option<(&String, &Mark)> {
        let at = self.raw.binary_search_by_key(&row, |(r, _, _)| *r).ok()?;
        let (_, text, mark) = &self.raw[at];
        Some((text, mark))
    }

    /// [`PathValues::push`] of a string value.
    fn push_str(&mut self, row: u32, text: &str) {
        let id = match self.string_ids.get(text) {
            Some(&id) => id,
            None => {
                let id = self.strings.len() as u32;
                self.strings.push(text.to_owned());
                self.string_ids.insert(text.to_owned(), id);
                id
            }
        };
        self.add(row, Leaf::Str(id));
    }

    /// Counts `leaf`'s kind and keeps it for `row`.
    fn add(&mut self, row: u32, leaf: Leaf) {
        let scalar = match &leaf {
            Leaf::Int(i) => {
                self.ints += 1;
                if i.unsigned_abs() > EXACT_F64_INT as u64 {
                    self.inexact_ints += 1;
                }
                Some(Scalar::Num)
            }
            Leaf::Float(_) => {
                self.floats += 1;
                Some(Scalar::Num)
            }
            Leaf::Bool(_) => Some(Scalar::Bool),
            Leaf::Str(_) => Some(Scalar::Str),
            Leaf::Time { aware: false, .. } => Some(Scalar::NaiveTime),
            Leaf::Time { aware: true, .. } => Some(Scalar::AwareTime),
            Leaf::Other(_) => None,
        };
        if let Some(s) = scalar {
            *self.counts.entry(s).or_default() += 1;
        }
        self.rows.push((row, leaf));
    }

    /// The kind of the typed column: the scalar kind with the most rows
    /// (ties broken in a fixed order), if any.
    fn typed(&self) -> Option<Scalar> {
        [
            Scalar::Num,
            Scalar::Str,
            Scalar::Bool,
            Scalar::AwareTime,
            Scalar::NaiveTime,
        ]
        .into_iter()
        .filter_map(|s| self.counts.get(&s).map(|&n| (s, n)))
        .fold(None, |best: Option<(Scalar, usize)>, (s, n)| match best {
            Some((_, m)) if m >= n => best,
            _ => Some((s, n)),
        })
        .map(|(s, _)| s)
    }
}

/// How a leaf value (not an object the walk descends into) is kept;
/// `None` for what only JSON text holds.
fn leaf_of(value: &Value) -> Option<Leaf> {
    Some(match value {
        Value::Bool(b) => Leaf::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Leaf::Int(i),
            // A u64 past i64: JSON text (an Int64 column cannot hold it).
            None if n.is_u64() => return None,
            None => Leaf::Float(n.as_f64()?),
        },
        Value::String(_) => Leaf::Str(0),
        Value::Object(map) => match tag(map)? {
            Tag::Float(f) => Leaf::Float(f),
            // A numpy scalar reads as its plain value (as queries see it).
            Tag::Plain(inner) => match inner {
                Value::Object(_) => leaf_of(inner)?,
                Value::Bool(_) | Value::Number(_) => leaf_of(inner)?,
                _ => return None,
            },
            Tag::Time(t) => {
                if t.nanos % 1000 != 0 {
                    return None;
                }
                Leaf::Time {
                    micros: i64::try_from(t.nanos / 1000).ok()?,
                    aware: t.aware,
                }
            }
            _ => return None,
        },
        Value::Null | Value::Array(_) => return None,
    })
}

/// An object the walk descends into: a plain non-empty object that is not
/// a tag, or a `$dict` tag's object (what query paths step into).
fn descend(value: &Value) -> Option<&Map<String, Value>> {
    let Value::Object(map) = value else {
        return None;
    };
    match tag(map) {
        Some(Tag::Dict(inner)) => Some(inner),
        Some(_) => None,
        None if map.is_empty() => None,
        None => Some(map),
    }
}

/// A path as borrowed names, to look up the builder's `Vec<String>` paths
/// without building one: it hashes as the `Vec` does (a slice of `str`s).
#[derive(Hash)]
struct PathRef<'p, 'v>(&'p [&'v str]);

impl indexmap::Equivalent<Vec<String>> for PathRef<'_, '_> {
    fn equivalent(&self, key: &Vec<String>) -> bool {
        self.0.len() == key.len() && self.0.iter().zip(key).all(|(a, b)| *a == b)
    }
}

/// What the builder reads of a record, read without building the
/// metadata's map (most of a checkpoint's time went into it): its
/// top-level metadata fields in order, strings borrowed from the record
/// when they have no escapes, numbers, booleans and nulls as `Value`s
/// (no allocation), objects and lists as `Value`s; and the array facts.
struct FastRecord<'de> {
    meta: Vec<(Cow<'de, str>, MetaValue<'de>)>,
    arrays: Vec<(Cow<'de, str>, SlimArray<'de>)>,
}

/// One top-level metadata value of a [`FastRecord`].
enum MetaValue<'de> {
    Str(Cow<'de, str>),
    Other(Value),
}

/// `bytes` as [`FastRecord`], or `None` (then read it as [`Slim`], which
/// decides what it holds or why it is refused) when it is not an object
/// with a `meta` object as the fast reading expects, or when its
/// metadata is not read alike both ways: a name starting with `$` (the
/// whole metadata may be a `$dict` escape) or a name twice (a map keeps
/// the last value, at the first one's place).
fn fast_parse(bytes: &[u8]) -> Option<FastRecord<'_>> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let record = FastRecord::deserialize(&mut de).ok()?;
    de.end().ok()?;
    let names = &record.meta;
    if names.len() > 16 {
        let mut sorted: Vec<&str> = names.iter().map(|(n, _)| n.as_ref()).collect();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return None;
        }
    }
    Some(record)
}

/// A string borrowed from the input when it has no escapes.
struct Text<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(
                self,
                s: &'de str,
            ) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for FastRecord<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FastRecord<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a record object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<FastRecord<'de>, A::Error> {
                let (mut meta, mut arrays) = (None, None);
                while let Some(Text(name)) = map.next_key()? {
                    match name.as_ref() {
                        "meta" if meta.is_none() => meta = Some(map.next_value::<Meta<'de>>()?.0),
                        "arrays" if arrays.is_none() => {
                            arrays = Some(map.next_value::<Arrays<'de>>()?.0)
                        }
                        "meta" | "arrays" => return Err(de::Error::custom("a field twice")),
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                let meta = meta.ok_or_else(|| de::Error::missing_field("meta"))?;
                Ok(FastRecord {
                    meta,
                    arrays: arrays.unwrap_or_default(),
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// The array entries, refused for a name twice (a map keeps the last).
struct Arrays<'de>(Vec<(Cow<'de, str>, SlimArray<'de>)>);

impl<'de> Deserialize<'de> for Arrays<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Arrays<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the array entries")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Arrays<'de>, A::Error> {
                let mut entries: Vec<(Cow<'de, str>, SlimArray<'de>)> = Vec::new();
                while let Some(Text(name)) = map.next_key()? {
                    let entry = map.next_value()?;
                    entries.push((name, entry));
                }
                let mut names: Vec<&str> = entries.iter().map(|(n, _)| n.as_ref()).collect();
                names.sort_unstable();
                if names.windows(2).any(|w| w[0] == w[1]) {
                    return Err(de::Error::custom("read as a map"));
                }
                Ok(Arrays(entries))
            }
        }
        d.deserialize_map(V)
    }
}

/// The metadata object's fields, refused (see [`fast_parse`]) for a name
/// starting with `$` or, among the first 16, a name twice.
struct Meta<'de>(Vec<(Cow<'de, str>, MetaValue<'de>)>);

impl<'de> Deserialize<'de> for Meta<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Meta<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a metadata object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Meta<'de>, A::Error> {
                let mut fields: Vec<(Cow<'de, str>, MetaValue<'de>)> = Vec::new();
                while let Some(Text(name)) = map.next_key()? {
                    let twice = fields.len() <= 16 && fields.iter().any(|(n, _)| *n == name);
                    if name.starts_with('$') || twice {
                        return Err(de::Error::custom("read as a map"));
                    }
                    fields.push((name, map.next_value()?));
                }
                Ok(Meta(fields))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for MetaValue<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        // As serde_json's `Value` visitor makes each kind of value.
        impl<'de> Visitor<'de> for V {
            type Value = MetaValue<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> std::result::Result<MetaValue<'de>, E> {
                Ok(MetaValue::Other(Value::Bool(b)))
            }
            fn visit_i64<E: de::Error>(self, i: i64) -> std::result::Result<MetaValue<'de>, E> {
                Ok(MetaValue::Other(Value::Number(i.into())))
            }
            fn visit_u64<E: de::Error>(self, u: u64) -> std::result::Result<MetaValue<'de>, E> {
                Ok(MetaValue::Other(Value::Number(u.into())))
            }
            fn visit_f64<E: de::Error>(self, x: f64) -> std::result::Result<MetaValue<'de>, E> {
                Ok(MetaValue::Other(
                    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number),
                ))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<MetaValue<'de>, E> {
                Ok(MetaValue::Other(Value::Null))
            }
            fn visit_borrowed_str<E: de::Error>(
                self,
                s: &'de str,
            ) -> std::result::Result<MetaValue<'de>, E> {
                Ok(MetaValue::Str(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<MetaValue<'de>, E> {
                Ok(MetaValue::Str(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(
                self,
                s: String,
            ) -> std::result::Result<MetaValue<'de>, E> {
                Ok(MetaValue::Str(Cow::Owned(s)))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                seq: A,
            ) -> std::result::Result<MetaValue<'de>, A::Error> {
                Value::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(MetaValue::Other)
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<MetaValue<'de>, A::Error> {
                Value::deserialize(de::value::MapAccessDeserializer::new(map)).map(MetaValue::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// What the builder reads of a record: its metadata and array facts.
#[derive(Deserialize)]
struct Slim<'a> {
    meta: Map<String, Value>,
    #[serde(default, borrow)]
    arrays: IndexMap<String, SlimArray<'a>>,
}

/// What the builder reads of an array entry (its strings borrowed from
/// the record when they have no escapes).
#[derive(Deserialize)]
struct SlimArray<'a> {
    #[serde(borrow)]
    dtype: Cow<'a, str>,
    #[serde(borrow)]
    descr: Cow<'a, str>,
    shape: Vec<u64>,
    nbytes: u64,
}

/// Per-array facts of every row that has the array: row, shape, dtype and
/// descr (indexes in `strings`), nbytes.
#[derive(Default)]
struct ArrayValues {
    rows: Vec<(u32, Vec<u64>, u32, u32, u64)>,
    /// The dtype and descr texts, each once.
    strings: Vec<String>,
    ids: HashMap<String, u32>,
}

impl ArrayValues {
    /// Adds the facts of `a` for `row`.
    fn push(&mut self, row: u32, a: SlimArray<'_>) {
        let (dtype, descr) = (self.intern(&a.dtype), self.intern(&a.descr));
        self.rows.push((row, a.shape, dtype, descr, a.nbytes));
    }

    /// The index of `text` in `strings` (added if new): the last row's
    /// dtype and descr are tried first.
    fn intern(&mut self, text: &str) -> u32 {
        if let Some(&(_, _, dtype, descr, _)) = self.rows.last() {
            for id in [dtype, descr] {
                if self.strings[id as usize] == text {
                    return id;
                }
            }
        }
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(text.to_owned());
        self.ids.insert(text.to_owned(), id);
        id
    }
}

/// Collects rows, then builds the batch.
#[derive(Default)]
pub(crate) struct ColumnBuilder {
    keys: Vec<String>,
    live: Vec<bool>,
    paths: IndexMap<Vec<String>, PathValues>,
    arrays: IndexMap<String, ArrayValues>,
    /// Every path and array gets columns, past [`MAX_PATHS`] and
    /// [`MAX_ARRAYS`] too (a table for a user, not a column file).
    unlimited: bool,
    /// For the `i`th top-level metadata field of the last record read
    /// fast, the index of its path in `paths`: records mostly list the
    /// same fields in the same order, and checking the guess costs less
    /// than hashing the path.
    hints: Vec<usize>,
}

impl ColumnBuilder {
    /// A builder that gives every path and array its columns, however
    /// many (for `to_arrow`: the user asked for all of them).
    pub(crate) fn unlimited() -> ColumnBuilder {
        ColumnBuilder {
            unlimited: true,
            ..ColumnBuilder::default()
        }
    }

    /// Adds the next row: `record` is the record JSON, `None` a deleted key.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the key when the record does not decode.
    pub(crate) fn push(&mut self, key: &str, record: Option<&[u8]>) -> Result<()> {
        self.push_read(key, record, true)
    }

    /// [`ColumnBuilder::push`], trying [`fast_parse`] first when `fast`
    /// (tests compare both ways).
    fn push_read(&mut self, key: &str, record: Option<&[u8]>, fast: bool) -> Result<()> {
        let row = u32::try_from(self.keys.len())
            .map_err(|_| Error::corrupt("columns", "more than 2^32 rows in one batch"))?;
        self.keys.push(key.to_owned());
        self.live.push(record.is_some());
        let Some(bytes) = record else {
            return Ok(());
        };
        match fast_parse(bytes).filter(|_| fast) {
            Some(fast) => {
                let mut path = Vec::new();
                for (i, (name, field)) in fast.meta.iter().enumerate() {
                    path.push(name.as_ref());
                    match field {
                        MetaValue::Str(text) => self.top_values(i, name).push_str(row, text),
                        MetaValue::Other(value) => match descend(value) {
                            Some(inner) => self.walk(row, inner, &mut path),
                            None => self.top_values(i, name).push(row, value),
                        },
                    }
                    path.pop();
                }
                for (name, a) in fast.arrays {
                    self.array_values(&name).push(row, a);
                }
            }
            None => {
                let slim: Slim<'_> = serde_json::from_slice(bytes)
                    .map_err(|e| Error::corrupt(format!("record {key:?}"), e).with_key(key))?;
                let mut path = Vec::new();
                self.walk(row, crate::query::fields(&slim.meta), &mut path);
                for (name, a) in slim.arrays {
                    self.array_values(&name).push(row, a);
                }
            }
        }
        Ok(())
    }

    /// The facts of the array `name`, new and empty when not seen yet.
    fn array_values(&mut self, name: &str) -> &mut ArrayValues {
        let at = match self.arrays.get_index_of(name) {
            Some(at) => at,
            None => {
                self.arrays
                    .insert_full(name.to_owned(), ArrayValues::default())
                    .0
            }
        };
        &mut self.arrays[at]
    }

    /// Adds the leaves of `map` under `path` (borrowed from the record:
    /// a path's names are copied once, when first seen).
    fn walk<'v>(&mut self, row: u32, map: &'v Map<String, Value>, path: &mut Vec<&'v str>) {
        for (name, value) in map {
            path.push(name);
            match descend(value) {
                Some(inner) => self.walk(row, inner, path),
                None => self.path_values(path).push(row, value),
            }
            path.pop();
        }
    }

    /// [`ColumnBuilder::path_values`] of the top-level field `name`, the
    /// `i`th of its record: the path of the last record's `i`th field when
    /// it is the same.
    fn top_values(&mut self, i: usize, name: &str) -> &mut PathValues {
        let guess = self.hints.get(i).copied().filter(|&at| {
            self.paths
                .get_index(at)
                .is_some_and(|(path, _)| path.len() == 1 && path[0] == name)
        });
        let at = match guess {
            Some(at) => at,
            None => {
                let at = self.path_index(&[name]);
                if self.hints.len() <= i {
                    self.hints.resize(i + 1, usize::MAX);
                }
                self.hints[i] = at;
                at
            }
        };
        &mut self.paths[at]
    }

    /// The values of `path`, new and empty when it was not seen yet (its
    /// names copied then only).
    fn path_values(&mut self, path: &[&str]) -> &mut PathValues {
        let at = self.path_index(path);
        &mut self.paths[at]
    }

    /// The index in `paths` of `path`, added when it was not seen yet.
    fn path_index(&mut self, path: &[&str]) -> usize {
        match self.paths.get_index_of(&PathRef(path)) {
            Some(at) => at,
            None => {
                let owned = path.iter().map(|n| (*n).to_owned()).collect();
                self.paths.insert_full(owned, PathValues::default()).0
            }
        }
    }

    /// The batch of every row pushed.
    ///
    /// # Errors
    /// Only if arrow refuses the arrays it was given (a bug, reported as
    /// [`Error::Corrupt`] rather than a panic).
    pub(crate) fn finish(self) -> Result<Columns> {
        let n = self.keys.len();
        let mut fields: Vec<Field> = Vec::new();
        let mut arrays: Vec<ArrayRef> = Vec::new();

        let mut keys = StringBuilder::with_capacity(n, self.keys.iter().map(String::len).sum());
        for k in &self.keys {
            keys.append_value(k);
        }
        fields.push(Field::new("key", DataType::Utf8, false).with_metadata(field_meta(&Kind::Key)));
        arrays.push(Arc::new(keys.finish()));
        let mut live = BooleanBuilder::with_capacity(n);
        live.append_slice(&self.live);
        fields.push(
            Field::new("$live", DataType::Boolean, false).with_metadata(field_meta(&Kind::Live)),
        );
        arrays.push(Arc::new(live.finish()));

        let (max_paths, max_arrays) = if self.unlimited {
            (usize::MAX, usize::MAX)
        } else {
            (MAX_PATHS, MAX_ARRAYS)
        };
        let paths_complete = self.paths.len() <= max_paths;
        let facts_complete = self.arrays.len() <= max_arrays;
        for (path, values) in self.paths.iter().take(max_paths) {
            let name = path.join(".");
            let typed = values.typed();
            let mut json = StringBuilder::new();
            let mut json_rows = 0usize;
            let mut next = 0usize;
            // JSON text for the rows the typed column does not hold.
            let mut marks = Marks::default();
            let mut json_push = |row: u32, text: Option<String>| {
                while next < row as usize {
                    json.append_null();
                    next += 1;
                }
                match text {
                    Some(t) => {
                        json.append_value(t);
                        json_rows += 1;
                    }
                    None => {
                        // A row of the typed column: what it was tagged as.
                        marks.note(values.raw(row).map(|(_, mark)| mark));
                        json.append_null();
                    }
                }
                next += 1;
            };
            let (data_type, array): (DataType, Option<ArrayRef>) = match typed {
                None => {
                    for (row, leaf) in &values.rows {
                        json_push(*row, Some(other_text(*row, leaf, values)));
                    }
                    (DataType::Null, None)
                }
                Some(Scalar::Num) if values.floats > 0 => {
                    // With values of other kinds beside, ints stay exact
                    // JSON text (a table shows `1`, not `1.0`, as the
                    // record has it).
                    let others = values.rows.len() > values.ints + values.floats;
                    let mut b = Float64Builder::with_capacity(n);
                    fill(
                        &mut b,
                        n,
                        values,
                        Float64Builder::append_null,
                        &mut json_push,
                        |b, leaf| {
                            match leaf {
                                Leaf::Float(f) => b.append_value(*f),
                                Leaf::Int(i)
                                    if !others && i.unsigned_abs() <= EXACT_F64_INT as u64 =>
                                {
                                    b.append_value(*i as f64)
                                }
                                _ => return Ok(false),
                            }
                            Ok(true)
                        },
                    )?;
                    (DataType::Float64, Some(Arc::new(b.finish())))
                }
                Some(Scalar::Num) => {
                    let mut b = Int64Builder::with_capacity(n);
                    fill(
                        &mut b,
                        n,
                        values,
                        Int64Builder::append_null,
                        &mut json_push,
                        |b, leaf| {
                            let Leaf::Int(i) = leaf else { return Ok(false) };
                            b.append_value(*i);
                            Ok(true)
                        },
                    )?;
                    (DataType::Int64, Some(Arc::new(b.finish())))
                }
                Some(Scalar::Bool) => {
                    let mut b = BooleanBuilder::with_capacity(n);
                    fill(
                        &mut b,
                        n,
                        values,
                        BooleanBuilder::append_null,
                        &mut json_push,
                        |b, leaf| {
                            let Leaf::Bool(v) = leaf else {
                                return Ok(false);
                            };
                            b.append_value(*v);
                            Ok(true)
                        },
                    )?;
                    (DataType::Boolean, Some(Arc::new(b.finish())))
                }
                Some(Scalar::Str) => {
                    // The dictionary in first-seen order, every string once.
                    let mut b = StringDictionaryBuilder::<Int32Type>::new();
                    let null = StringDictionaryBuilder::<Int32Type>::append_null;
                    fill(&mut b, n, values, null, &mut json_push, |b, leaf| {
                        let Leaf::Str(id) = leaf else {
                            return Ok(false);
                        };
                        b.append(&values.strings[*id as usize]).map_err(arrow_err)?;
                        Ok(true)
                    })?;
                    (dict_type(), Some(Arc::new(b.finish())))
                }
                Some(s @ (Scalar::NaiveTime | Scalar::AwareTime)) => {
                    let aware = s == Scalar::AwareTime;
                    let mut b = TimestampMicrosecondBuilder::with_capacity(n);
                    let null = TimestampMicrosecondBuilder::append_null;
                    fill(
                        &mut b,
                        n,
                        values,
                        null,
                        &mut json_push,
                        |b, leaf| match leaf {
                            Leaf::Time { micros, aware: a } if *a == aware => {
                                b.append_value(*micros);
                                Ok(true)
                            }
                            _ => Ok(false),
                        },
                    )?;
                    let mut b = if aware { b.with_timezone(UTC) } else { b };
                    let array: ArrayRef = Arc::new(b.finish());
                    (array.data_type().clone(), Some(array))
                }
            };
            if let Some(array) = array {
                let mut meta = field_meta(&Kind::Meta(path.clone()));
                marks.add_to(&mut meta);
                fields.push(Field::new(&name, data_type, true).with_metadata(meta));
                arrays.push(array);
            }
            if json_rows > 0 {
                while next < n {
                    json.append_null();
                    next += 1;
                }
                fields.push(
                    Field::new(&name, DataType::Utf8, true)
                        .with_metadata(field_meta(&Kind::Json(path.clone()))),
                );
                arrays.push(Arc::new(json.finish()));
            }
        }

        for (name, values) in self.arrays.iter().take(max_arrays) {
            let mut shape = ListBuilder::new(UInt64Builder::new());
            let mut dtype = StringDictionaryBuilder::<Int32Type>::new();
            let mut descr = StringDictionaryBuilder::<Int32Type>::new();
            let mut nbytes = UInt64Builder::with_capacity(n);
            let mut at = 0usize;
            for (row, dims, dt, de, nb) in &values.rows {
                while at < *row as usize {
                    shape.append_null();
                    dtype.append_null();
                    descr.append_null();
                    nbytes.append_null();
                    at += 1;
                }
                shape.values().append_slice(dims);
                shape.append(true);
                dtype
                    .append(&values.strings[*dt as usize])
                    .map_err(arrow_err)?;
                descr
                    .append(&values.strings[*de as usize])
                    .map_err(arrow_err)?;
                nbytes.append_value(*nb);
                at += 1;
            }
            while at < n {
                shape.append_null();
                dtype.append_null();
                descr.append_null();
                nbytes.append_null();
                at += 1;
            }
            let shape = shape.finish();
            for (fact, array) in [
                (FactName::Shape, Arc::new(shape) as ArrayRef),
                (FactName::Dtype, Arc::new(dtype.finish()) as ArrayRef),
                (FactName::Descr, Arc::new(descr.finish()) as ArrayRef),
                (FactName::Nbytes, Arc::new(nbytes.finish()) as ArrayRef),
            ] {
                fields.push(
                    Field::new(
                        format!("{name}.{}", fact.as_str()),
                        array.data_type().clone(),
                        true,
                    )
                    .with_metadata(field_meta(&Kind::Fact {
                        array: name.clone(),
                        fact,
                    })),
                );
                arrays.push(array);
            }
        }
        let mut schema_meta = std::collections::HashMap::new();
        if !paths_complete {
            schema_meta.insert(super::PATHS_COMPLETE.to_owned(), "false".to_owned());
        }
        if !facts_complete {
            schema_meta.insert(super::FACTS_COMPLETE.to_owned(), "false".to_owned());
        }
        let schema = Arc::new(Schema::new_with_metadata(fields, schema_meta));
        let batch = RecordBatch::try_new(schema, arrays).map_err(arrow_err)?;
        Columns::new(batch)
    }
}

/// What one tagged leaf says of how it was written (see [`Marks`]).
enum Mark {
    /// A `$numpy` scalar of this dtype.
    Numpy(String),
    /// A `$date`.
    Date,
    /// Another tag.
    None,
}

impl Mark {
    /// The mark of the tagged object `map` (its first member decides).
    fn of(map: &Map<String, Value>) -> Mark {
        match map.iter().next() {
            Some((tag, Value::Array(pair))) if tag == "$numpy" => match pair.first() {
                Some(Value::String(dtype)) => Mark::Numpy(dtype.clone()),
                _ => Mark::None,
            },
            Some((tag, Value::String(_))) if tag == "$date" => Mark::Date,
            _ => Mark::None,
        }
    }
}

/// What the values of a typed column were written as, when all agree:
/// `$numpy` scalars of one dtype, or `$date`s (field metadata
/// `lazyvault.numpy` / `lazyvault.date`, so that Python gives them back as
/// they were: a float32, a date).
#[derive(Default)]
struct Marks {
    rows: usize,
    numpy: Option<String>,
    numpy_rows: usize,
    date_rows: usize,
}

impl Marks {
    fn note(&mut self, mark: Option<&Mark>) {
        self.rows += 1;
        match mark {
            Some(Mark::Numpy(dtype)) => {
                if self.numpy.get_or_insert_with(|| dtype.clone()) == dtype {
                    self.numpy_rows += 1;
                }
            }
            Some(Mark::Date) => self.date_rows += 1,
            Some(Mark::None) | None => {}
        }
    }

    fn add_to(&self, meta: &mut arrow_schema::Metadata) {
        if self.rows == 0 {
            return;
        }
        if self.numpy_rows == self.rows {
            if let Some(dtype) = &self.numpy {
                meta.insert(super::NUMPY_MARK, dtype.clone());
            }
        }
        if self.date_rows == self.rows {
            meta.insert(super::DATE_MARK, "true");
        }
    }
}

/// Fills the typed column `b` of a path's `n` rows from its sparse leaves:
/// `take` appends a leaf the column holds and says so; other leaves get a
/// null there and their JSON text in the sibling (`json_push(row, text)`,
/// `None` for a row the typed column holds); rows without the path, nulls.
fn fill<B>(
    b: &mut B,
    n: usize,
    values: &PathValues,
    append_null: fn(&mut B),
    json_push: &mut impl FnMut(u32, Option<String>),
    mut take: impl FnMut(&mut B, &Leaf) -> Result<bool>,
) -> Result<()> {
    let mut at = 0usize;
    for (row, leaf) in &values.rows {
        while at < *row as usize {
            append_null(b);
            at += 1;
        }
        if take(b, leaf)? {
            json_push(*row, None);
        } else {
            append_null(b);
            json_push(*row, Some(other_text(*row, leaf, values)));
        }
        at += 1;
    }
    while at < n {
        append_null(b);
        at += 1;
    }
    Ok(())
}

/// The JSON text of a leaf the typed column does not hold: the record's
/// own text for a tagged value, else the value written as JSON.
fn other_text(row: u32, leaf: &Leaf, values: &PathValues) -> String {
    if let Some((raw, _)) = values.raw(row) {
        return raw.clone();
    }
    match leaf {
        Leaf::Int(i) => i.to_string(),
        Leaf::Float(f) => Value::from(*f).to_string(),
        Leaf::Bool(b) => b.to_string(),
        Leaf::Str(id) => Value::String(values.strings[*id as usize].clone()).to_string(),
        // Times always come from tagged values (kept in `raw`).
        Leaf::Time { micros, .. } => micros.to_string(),
        Leaf::Other(t) => t.clone(),
    }
}

fn dict_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

pub(super) fn arrow_err(e: arrow_schema::ArrowError) -> Error {
    Error::corrupt("columns", e)
}

#[cfg(test)]
mod fast_tests {
    use super::ColumnBuilder;

    /// Records as stored, byte for byte: escapes, a name twice, `$` names
    /// and the `$dict` escape, nested objects and tags, lists, extreme
    /// numbers, fields in another order, whitespace, and records that do
    /// not decode.
    fn records() -> Vec<Option<String>> {
        let mut many: String = (0..20).map(|i| format!("\"f{i}\":{i},")).collect();
        many.push_str("\"f3\":\"again\"");
        [
            r#"{"meta":{"temperature":277.097,"material":"GaAs","step":815817,"ok":true,"started":{"$datetime":"2026-01-01T00:00:00+00:00"}},"arrays":{"x":{"id":"0123456789abcdef0123456789abcdef","descr":"'<f8'","dtype":"float64","shape":[64],"fortran_order":false,"nbytes":512,"data_offset":128}},"layout":{"fields":null}}"#.to_owned(),
            r#"{"meta":{"na\u006de":"S\u00e9","material":"a\"b","step":"x"},"arrays":{},"layout":null}"#.to_owned(),
            r#"{"meta":{"a":1,"b":2,"a":"x"},"arrays":{},"layout":null}"#.to_owned(),
            r#"{"meta":{"$dict":{"$a":1,"b":2}},"arrays":{},"layout":null}"#.to_owned(),
            r#"{"meta":{"\u0024a":1,"b":"two"},"arrays":{},"layout":null}"#.to_owned(),
            r#"{"meta":{"p":{"lr":0.1,"w":{"$numpy":["<f4",1.5]}},"d":{"$date":"2024-01-02"},"started":{"$datetime":"2026-01-01T00:00:00"},"f":{"$float":"nan"},"e":{},"q":{"$dict":{"$x":1}}},"arrays":{},"layout":null}"#.to_owned(),
            r#"{"meta":{"l":[1,{"a":2}],"n":null,"ok":false,"u":18446744073709551615,"i":-9223372036854775808,"x":1e300,"y":-0.0,"z":123456789012345678901234567890,"step":2.5},"arrays":{},"layout":null}"#.to_owned(),
            r#"{"layout":null,"arrays":{"x":{"id":"0123456789abcdef0123456789abcdef","descr":"'<i4'","dtype":"int32","shape":[2,3],"fortran_order":true,"nbytes":24,"data_offset":64}},"pickle":true,"meta":{"a":1}}"#.to_owned(),
            " { \"meta\" : { \"a\" : 1 , \"material\" : \"Si\" } , \"arrays\" : { } } ".to_owned(),
            format!(r#"{{"meta":{{{many}}},"arrays":{{}}}}"#),
            r#"{"meta":{"started":{"$datetime":"2026-01-01T00:00:00+01:00"},"w":{"$numpy":["<f4",2.5]}},"arrays":{}}"#.to_owned(),
            r#"{"meta":{},"arrays":{"x":{"dtype":"int32","descr":"'<i4'","shape":[1],"nbytes":4},"y":{"dtype":"float64","descr":"'<f8'","shape":[],"nbytes":8},"x":{"dtype":"uint8","descr":"'|u1'","shape":[3],"nbytes":3}}}"#.to_owned(),
            r#"{"meta":{"a":1},"arrays":{"\u0078":{"dtype":"flo\u0061t64","descr":"'<f8'","shape":[2],"nbytes":16,"extra":[1,{"b":2}]},"z":{"dtype":"float64","descr":"'<f8'","shape":[2,2],"nbytes":32}}}"#.to_owned(),
            r#"{"meta":{"a":2},"arrays":{"y":{"dtype":"<f8","descr":"'<f8'","shape":[1],"nbytes":8},"x":{"dtype":"float64","descr":"'<f8'","shape":[64],"nbytes":512}}}"#.to_owned(),
        ]
        .into_iter()
        .map(Some)
        .chain([None])
        .collect()
    }

    fn build(records: &[Option<String>], fast: bool) -> super::Columns {
        let mut b = ColumnBuilder::default();
        for (i, r) in records.iter().enumerate() {
            b.push_read(&format!("k{i}"), r.as_deref().map(str::as_bytes), fast)
                .unwrap();
        }
        b.finish().unwrap()
    }

    fn assert_same(a: &super::Columns, b: &super::Columns) {
        assert_eq!(a.schema(), b.schema());
        assert_eq!(
            a.paths.keys().collect::<Vec<_>>(),
            b.paths.keys().collect::<Vec<_>>()
        );
        for i in 0..a.schema().fields().len() {
            assert_eq!(
                a.column(i).unwrap().to_data(),
                b.column(i).unwrap().to_data(),
                "column {}",
                a.schema().field(i).name()
            );
        }
    }

    /// The fast reading of a record gives the columns the full one gives,
    /// whatever the record, and refuses what it refuses.
    #[test]
    fn reading_records_fast_gives_the_same_columns() {
        let records = records();
        assert_same(&build(&records, true), &build(&records, false));
        // each alone too (the first rows decide path order and kinds)
        for r in &records {
            let one = [r.clone()];
            assert_same(&build(&one, true), &build(&one, false));
        }
        assert!(super::fast_parse(records[0].as_deref().unwrap().as_bytes()).is_some());
        for bad in [
            r#"{"meta":{"a":1},"meta":{"a":2}}"#,
            r#"{"meta":[1,2]}"#,
            r#"{"arrays":{}}"#,
            r#"{"meta":{"a":1}} x"#,
            r#"[{"a":1},{}]"#,
            r#"{"meta":{"a":1},"arrays":{"x":{"id":3}}}"#,
            r#"{"meta":{"a":1},"arrays":null}"#,
            r#"{"meta":{"a":1},"arrays":{"x":{"dtype":"u1","descr":"'|u1'","shape":[1]}}}"#,
            r#"{"meta":{"a":1},"arrays":{"x":{"dtype":"u1","dtype":"u1","descr":"'|u1'","shape":[1],"nbytes":1}}}"#,
            r#"{"meta":{"a":1},"arrays":{},"arrays":{}}"#,
        ] {
            let read = |fast| {
                ColumnBuilder::default()
                    .push_read("k", Some(bad.as_bytes()), fast)
                    .is_ok()
            };
            assert_eq!(read(true), read(false), "{bad}");
        }
    }
}
