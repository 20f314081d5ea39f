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
    /// `$datetime`...), by row: what their JSON-text cell shows.
    raw: HashMap<u32, String>,
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
            (Some(Leaf::Str(_)), Value::String(text)) => {
                let next = self.strings.len() as u32;
                let id = *self.string_ids.entry(text.clone()).or_insert_with(|| {
                    self.strings.push(text.clone());
                    next
                });
                Leaf::Str(id)
            }
            (Some(Leaf::Str(_)), _) => Leaf::Other(value.to_string()),
            (Some(other), _) => {
                if value.is_object() {
                    self.raw.insert(row, value.to_string());
                }
                other
            }
        };
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

/// What the builder reads of a record: its metadata and array facts.
#[derive(Deserialize)]
struct Slim {
    meta: Map<String, Value>,
    #[serde(default)]
    arrays: IndexMap<String, SlimArray>,
}

#[derive(Deserialize)]
struct SlimArray {
    dtype: String,
    descr: String,
    shape: Vec<u64>,
    nbytes: u64,
}

/// Per-array facts of every row that has the array.
#[derive(Default)]
struct ArrayValues {
    rows: Vec<(u32, Vec<u64>, String, String, u64)>,
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
        let row = u32::try_from(self.keys.len())
            .map_err(|_| Error::corrupt("columns", "more than 2^32 rows in one batch"))?;
        self.keys.push(key.to_owned());
        self.live.push(record.is_some());
        let Some(bytes) = record else {
            return Ok(());
        };
        let slim: Slim = serde_json::from_slice(bytes)
            .map_err(|e| Error::corrupt(format!("record {key:?}"), e).with_key(key))?;
        let mut path = Vec::new();
        self.walk(row, crate::query::fields(&slim.meta), &mut path);
        for (name, a) in slim.arrays {
            self.arrays
                .entry(name)
                .or_default()
                .rows
                .push((row, a.shape, a.dtype, a.descr, a.nbytes));
        }
        Ok(())
    }

    fn walk(&mut self, row: u32, map: &Map<String, Value>, path: &mut Vec<String>) {
        for (name, value) in map {
            path.push(name.clone());
            match descend(value) {
                Some(inner) => self.walk(row, inner, path),
                None => match self.paths.get_mut(path.as_slice()) {
                    Some(values) => values.push(row, value),
                    None => {
                        let mut values = PathValues::default();
                        values.push(row, value);
                        self.paths.insert(path.clone(), values);
                    }
                },
            }
            path.pop();
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
                        marks.note(values.raw.get(&row));
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
                dtype.append(dt).map_err(arrow_err)?;
                descr.append(de).map_err(arrow_err)?;
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
    fn note(&mut self, raw: Option<&String>) {
        self.rows += 1;
        let Some(value) = raw.and_then(|r| serde_json::from_str::<Value>(r).ok()) else {
            return;
        };
        let Value::Object(map) = &value else { return };
        match map.iter().next() {
            Some((tag, Value::Array(pair))) if tag == "$numpy" => {
                if let Some(Value::String(dtype)) = pair.first() {
                    if self.numpy.get_or_insert_with(|| dtype.clone()) == dtype {
                        self.numpy_rows += 1;
                    }
                }
            }
            Some((tag, Value::String(_))) if tag == "$date" => self.date_rows += 1,
            _ => {}
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
    if let Some(raw) = values.raw.get(&row) {
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
