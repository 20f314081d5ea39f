//! The metadata of selected records as one Arrow table ([`Store::to_arrow`]'s
//! output shaping): column batches of the column builder (one or more, each
//! with the rows selected from it) become one table of the columns a user
//! sees, rows in key order.
//!
//! Input conventions (store/src/columns): every field carries
//! `lazyvault.kind` (`key`, `live`, `meta`, `json`, `fact`); meta and json
//! columns `lazyvault.path` (a JSON array of the path's segments), facts
//! `lazyvault.array` and `lazyvault.fact` (`shape`, `dtype`, `descr`,
//! `nbytes`). A path has at most one typed (`meta`) column and one `json`
//! column (values of another kind, as JSON text) per batch.
//!
//! Output: `key` (Utf8, non-null) first; then one column per metadata path
//! in first-seen order, named by its dotted path: the typed column's type
//! when every selected value has it in every batch (Int64 and Float64 make
//! Float64 when every int is exact as f64; aware timestamps of different
//! zones make UTC), else Utf8 JSON text of each value, typed values
//! rendered as JSON too (`lazyvault.json = "true"` on the field). A path
//! with a selected value in a batch's JSON-text column (of a kind other
//! than that batch's most common one) is built again from the selected
//! values alone, so that its type does not depend on the batches the
//! values came from (only an int held as Float64 beside floats stays so);
//! then
//! `<array>.shape` (`List<UInt64>`) and `<array>.dtype`
//! (`Dictionary<Int32, Utf8>`) per array path in first-seen order. Columns with no value in the
//! selected rows are left out; `$live`, `descr`, `nbytes` and unknown kinds
//! too. With one batch whose every row is selected, the batch's arrays go
//! out as they are (no copy: a mapped column file stays mapped).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use arrow_array::builder::StringBuilder;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{
    Array, ArrayRef, RecordBatch, RecordBatchOptions, StringArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::{Keys, Store};
use crate::columns::ColumnBuilder;
use crate::error::{Error, Result};
use crate::query::Query;

/// An Arrow table: its schema and record batches (each of that schema).
pub(crate) type Table = (SchemaRef, Vec<RecordBatch>);

impl Store {
    /// The metadata of the records matching `query` (every record with
    /// `None`) as an Arrow table, rows in key order; no payload is read.
    ///
    /// Columns (field metadata `lazyvault.kind` says which is which):
    /// - `key`: Utf8, non-null;
    /// - one per metadata path, in first-seen order, named by its segments
    ///   joined with "." (`params.lr`; nested objects are walked, a list
    ///   or an empty object is a value), `lazyvault.path` the segments as a
    ///   JSON array: Int64, Float64 (ints and floats together), Boolean,
    ///   `Dictionary<Int32, Utf8>` (strings), Timestamp(Microsecond) naive or
    ///   `+00:00` (aware datetimes as instants in UTC), null where a record
    ///   lacks the path; a path holding values of several kinds, nulls,
    ///   lists or other tagged values (schema/FORMAT.md) is Utf8: each
    ///   value's compact JSON text, field metadata `lazyvault.json` = `"true"`;
    /// - per array path, `<path>.shape` (`List<UInt64>`) and `<path>.dtype`
    ///   (`Dictionary<Int32, Utf8>`, numpy's dtype name), null where a record
    ///   lacks the array.
    ///
    /// Paths no matching record has are left out. When the columns of one
    /// checkpoint run are the whole answer, its mapped buffers are the
    /// table's (no copy).
    ///
    /// # Errors
    /// [`Error::Corrupt`] (naming the key) for a record that does not
    /// decode; those of every method (see [`Store`]).
    pub fn to_arrow(&self, query: Option<&Query>) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        table_of_parts(&self.select(query)?)
    }

    /// [`Store::to_arrow_keys`] of `keys` (what [`Store::find_keys`]
    /// returned). Keys a `find` of this handle's view left in its key
    /// column are read from the columns without a look-up, as long as
    /// nothing changed since.
    ///
    /// # Errors
    /// As [`Store::to_arrow_keys`].
    pub fn to_arrow_of_keys(&self, keys: &Keys) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        if let (Some((column, rows)), Some(layered)) = (keys.rows(), self.layered()?) {
            if let Some(parts) = layered
                .parts_of_rows(column, rows)
                .filter(|_| layered.whole())
            {
                return table_of_parts(&parts);
            }
        }
        self.to_arrow_keys(keys.iter())
    }

    /// [`Store::to_arrow`] of the records of `keys`, in the order given;
    /// keys the store does not hold are left out. The table is the one
    /// `to_arrow` gives for a query matching exactly those records (the same
    /// columns and types), its rows in the order of `keys`, a key given
    /// twice giving its row twice.
    ///
    /// # Errors
    /// As [`Store::to_arrow`]; [`UsageError::EmptyKey`](crate::UsageError::EmptyKey) for an empty key.
    pub fn to_arrow_keys<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str>,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let keys: Vec<&str> = keys.into_iter().collect();
        for key in &keys {
            super::check_key(key)?;
        }
        let in_order = keys.windows(2).all(|w| w[0] < w[1]);
        let mut set = keys.clone();
        if !in_order {
            set.sort_unstable();
            set.dedup();
        }
        let parts = match self.layered()? {
            Some(layered) if layered.whole() => layered.parts_of_keys(&set)?,
            _ => None,
        };
        let (schema, batches) = match parts {
            Some(parts) => table_of_parts(&parts)?,
            None => {
                let view = self.view()?;
                let mut builder = ColumnBuilder::unlimited();
                for key in &set {
                    if let Some(bytes) = view.index().get(key)? {
                        builder.push(key, Some(&bytes))?;
                    }
                }
                table_of(builder)?
            }
        };
        if in_order {
            return Ok((schema, batches));
        }
        in_given_order((schema, batches), &keys)
    }
}

/// The rows of `table` (one per key it holds, its `key` column first) taken
/// in the order of `keys`, a key given twice twice, keys it lacks left out.
///
/// # Errors
/// [`Error::Corrupt`] when the first column is not the key text.
pub(crate) fn in_given_order((schema, batches): Table, keys: &[&str]) -> Result<Table> {
    let table = arrow_select::concat::concat_batches(&schema, &batches).map_err(arrow_error)?;
    let held = table
        .column(0)
        .as_string_opt::<i32>()
        .ok_or_else(|| Error::corrupt("columns", "the key column is not text"))?;
    if held.len() == keys.len() && held.iter().zip(keys).all(|(h, k)| h == Some(*k)) {
        return Ok((schema, vec![table]));
    }
    let row_of: HashMap<&str, u32> = held
        .iter()
        .enumerate()
        .filter_map(|(i, k)| Some((k?, i as u32)))
        .collect();
    let order: arrow_array::UInt32Array =
        keys.iter().filter_map(|k| row_of.get(k).copied()).collect();
    let taken = arrow_select::take::take_record_batch(&table, &order).map_err(arrow_error)?;
    Ok((schema, vec![taken]))
}

/// The table of `parts` (as [`Store::select`] gives them).
fn table_of_parts(parts: &[super::columnar::Part]) -> Result<Table> {
    let batches = parts
        .iter()
        .map(|p| p.columns.batch())
        .collect::<Result<Vec<_>>>()?;
    let rows: Vec<Rows<'_>> = parts
        .iter()
        .zip(&batches)
        .map(|(p, batch)| Rows {
            batch,
            rows: &p.rows,
        })
        .collect();
    shape(&rows)
}

/// The table of every row a builder was given (in its order).
pub(crate) fn table_of(builder: ColumnBuilder) -> Result<Table> {
    let columns = builder.finish()?;
    let rows: Vec<u32> = (0..columns.len() as u32).collect();
    shape(&[Rows {
        batch: &columns.batch()?,
        rows: &rows,
    }])
}

/// Field metadata: what a column is (`key`, `live`, `meta`, `json`, `fact`).
pub(crate) const KIND: &str = "lazyvault.kind";
/// Field metadata of meta and json columns: the path, a JSON array of str.
pub(crate) const PATH: &str = "lazyvault.path";
/// Field metadata of fact columns: the array's path name.
pub(crate) const ARRAY: &str = "lazyvault.array";
/// Field metadata of fact columns: `shape`, `dtype`, `descr` or `nbytes`.
pub(crate) const FACT: &str = "lazyvault.fact";
/// Field metadata of output columns holding JSON text (tagged values as in
/// schema/FORMAT.md): `"true"`.
pub(crate) const JSON: &str = "lazyvault.json";
/// Field metadata of a typed column whose every value was a `$numpy`
/// scalar of one dtype: its descr (`"<f4"`), so that Python can give the
/// values back with their dtype. Passed through when every batch agrees.
pub(crate) const NUMPY: &str = "lazyvault.numpy";
/// Field metadata of a typed (timestamp) column whose every value was a
/// `$date`: `"true"`. Passed through when every batch agrees.
pub(crate) const DATE: &str = "lazyvault.date";

/// Ints beyond this magnitude are not all exact as f64: a path mixing them
/// with floats goes out as JSON text rather than rounded.
const EXACT_INT: i64 = 1 << 53;

/// One column batch and the rows selected from it (ascending, no repeats).
pub(crate) struct Rows<'a> {
    /// The builder's batch.
    pub batch: &'a RecordBatch,
    /// The selected rows, ascending.
    pub rows: &'a [u32],
}

impl Rows<'_> {
    fn all(&self) -> bool {
        self.rows.len() == self.batch.num_rows()
    }

    /// How many selected rows of `array` (a column of this batch) are valid.
    fn valid(&self, array: &dyn Array) -> usize {
        if self.all() {
            return array.len() - array.logical_null_count();
        }
        match array.logical_nulls() {
            None => self.rows.len(),
            Some(nulls) => self
                .rows
                .iter()
                .filter(|&&r| nulls.is_valid(r as usize))
                .count(),
        }
    }
}

/// An output column being gathered: per input batch, the index of its
/// column(s) in that batch.
struct Gather {
    name: String,
    kind: Gathered,
    /// Per batch: the typed column (a meta path's `meta` column, a fact).
    typed: Vec<Option<usize>>,
    /// Per batch: a meta path's `json` column.
    json: Vec<Option<usize>>,
}

enum Gathered {
    Meta(String),
    Fact { array: String, fact: String },
}

/// What a column of an input batch is, from its field metadata.
enum Role {
    Key,
    Typed(Gathered),
    Json(String),
    Skip,
}

fn role(field: &Field) -> Result<Role> {
    let meta = field.metadata();
    let get = |name: &str| {
        meta.get(name).cloned().ok_or_else(|| {
            Error::corrupt(
                "column batch",
                format!("column {:?} lacks field metadata {name}", field.name()),
            )
        })
    };
    Ok(match meta.get(KIND).map(String::as_str) {
        Some("key") => Role::Key,
        Some("meta") => Role::Typed(Gathered::Meta(canonical_path(&get(PATH)?)?)),
        Some("json") => Role::Json(canonical_path(&get(PATH)?)?),
        Some("fact") => match get(FACT)?.as_str() {
            fact @ ("shape" | "dtype") => Role::Typed(Gathered::Fact {
                array: get(ARRAY)?,
                fact: fact.to_owned(),
            }),
            _ => Role::Skip,
        },
        _ => Role::Skip,
    })
}

/// A path's metadata as one spelling (batches written by different
/// builders may space it differently).
fn canonical_path(text: &str) -> Result<String> {
    let segments: Vec<String> = serde_json::from_str(text)
        .map_err(|e| Error::corrupt("column batch", format!("path {text:?}: {e}")))?;
    Ok(serde_json::to_string(&segments).expect("strings serialize"))
}

fn arrow_error(e: arrow_schema::ArrowError) -> Error {
    Error::corrupt("column batch", e)
}

/// The table of the selected rows of `parts` (see the module's doc):
/// its schema and its batches (one; with no row, one of no rows).
///
/// # Errors
/// [`Error::Corrupt`] for a batch that breaks the builder's conventions
/// (no key column, a column without its field metadata, a fact of two
/// types, a key column that is not Utf8).
pub(crate) fn shape(parts: &[Rows<'_>]) -> Result<Table> {
    shape_with(parts, true)
}

/// [`shape`]; a path whose selected values include JSON text is made again
/// from those values when `rebuild` (see [`Gather::rebuilt`]).
fn shape_with(parts: &[Rows<'_>], rebuild: bool) -> Result<Table> {
    let n = parts.len();
    let mut key_cols = Vec::with_capacity(n);
    let mut gathers: Vec<Gather> = Vec::new();
    let mut by_meta: HashMap<String, usize> = HashMap::new();
    let mut by_fact: HashMap<(String, String), usize> = HashMap::new();
    let mut facts: Vec<Gather> = Vec::new();
    for (p, part) in parts.iter().enumerate() {
        let mut key = None;
        for (c, field) in part.batch.schema().fields().iter().enumerate() {
            let (slot, typed) = match role(field)? {
                Role::Key => {
                    key = Some(c);
                    continue;
                }
                Role::Skip => continue,
                Role::Json(path) => (
                    *by_meta.entry(path.clone()).or_insert_with(|| {
                        gathers.push(Gather::new(field.name(), Gathered::Meta(path), n));
                        gathers.len() - 1
                    }),
                    false,
                ),
                Role::Typed(Gathered::Meta(path)) => (
                    *by_meta.entry(path.clone()).or_insert_with(|| {
                        gathers.push(Gather::new(field.name(), Gathered::Meta(path), n));
                        gathers.len() - 1
                    }),
                    true,
                ),
                Role::Typed(Gathered::Fact { array, fact }) => {
                    let at = *by_fact
                        .entry((array.clone(), fact.clone()))
                        .or_insert_with(|| {
                            facts.push(Gather::new(
                                field.name(),
                                Gathered::Fact { array, fact },
                                n,
                            ));
                            facts.len() - 1
                        });
                    facts[at].typed[p] = Some(c);
                    continue;
                }
            };
            if typed {
                gathers[slot].typed[p] = Some(c);
            } else {
                gathers[slot].json[p] = Some(c);
            }
        }
        let key = key.ok_or_else(|| Error::corrupt("column batch", "no key column"))?;
        if part.batch.column(key).data_type() != &DataType::Utf8 {
            return Err(Error::corrupt("column batch", "the key column is not Utf8"));
        }
        key_cols.push(key);
    }
    // facts after every metadata path; the builder writes an array's facts
    // together (shape before dtype), so first-seen order keeps them so
    gathers.extend(facts);

    let zero_copy = n == 1 && parts[0].all();
    let order = if zero_copy {
        Vec::new()
    } else {
        merge_order(parts, &key_cols)
    };
    let rows = if zero_copy {
        parts[0].rows.len()
    } else {
        order.len()
    };

    let key_arrays: Vec<&dyn Array> = parts
        .iter()
        .zip(&key_cols)
        .map(|(p, &c)| p.batch.column(c).as_ref())
        .collect();
    let mut fields = vec![Field::new("key", DataType::Utf8, false)
        .with_metadata(HashMap::from([(KIND.to_owned(), "key".to_owned())]))];
    let mut columns = vec![if zero_copy {
        parts[0].batch.column(key_cols[0]).clone()
    } else {
        arrow_select::interleave::interleave(&key_arrays, &order).map_err(arrow_error)?
    }];
    for gather in &gathers {
        if let Some((field, column)) = gather.output(parts, &order, zero_copy, rebuild)? {
            fields.push(field);
            columns.push(column);
        }
    }
    unique_names(&mut fields);
    let schema = Arc::new(Schema::new(fields));
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    let batch = RecordBatch::try_new_with_options(schema.clone(), columns, &options)
        .map_err(arrow_error)?;
    Ok((schema, vec![batch]))
}

/// Gives every column its own name (pandas, polars and DuckDB need that;
/// a fresh user's trial found `key`, `a.b` and `x.shape` repeated), by a
/// rule that does not depend on record order: the key and the array facts
/// keep theirs, then metadata paths whose field names hold no `.`, then
/// the others. A metadata column whose name is taken is renamed as a query
/// names it: `meta.key`, `meta.x.shape` (nested), `meta['a.b']` (a field
/// whose name holds a dot); a name still taken gets ` (2)`, ` (3)`...
fn unique_names(fields: &mut [Field]) {
    // No Arrow reader takes a NUL in a name (pyarrow refuses the whole
    // table): a field or array name holding one shows it as `\x00`, its
    // exact path staying in `lazyvault.path` / `lazyvault.array`.
    for f in fields.iter_mut() {
        if f.name().contains('\0') {
            let name = f.name().replace('\0', "\\x00");
            *f = f.clone().with_name(name);
        }
    }
    let path_of =
        |f: &Field| -> Option<Vec<String>> { serde_json::from_str(f.metadata().get(PATH)?).ok() };
    // 0: key and facts; 1: plain metadata paths; 2: paths with a dotted field.
    let rank = |f: &Field| match path_of(f) {
        None => 0,
        Some(p) if p.iter().any(|s| s.contains('.')) => 2,
        Some(_) => 1,
    };
    let mut used = std::collections::HashSet::new();
    for pass in 0..3 {
        for field in fields.iter_mut().filter(|f| rank(f) == pass) {
            let mut name = field.name().clone();
            if used.contains(&name) {
                let base = match path_of(field) {
                    Some(path) => query_spelling(&path),
                    None => name.clone(),
                };
                name = base.clone();
                let mut k = 2;
                while used.contains(&name) {
                    name = format!("{base} ({k})");
                    k += 1;
                }
                *field = field.clone().with_name(name.clone());
            }
            used.insert(name);
        }
    }
}

/// How a query names the metadata path `path`: `meta.a.b`, with a field
/// that is not a plain name in brackets (`meta['a.b']`).
fn query_spelling(path: &[String]) -> String {
    let mut out = String::from("meta");
    for seg in path {
        let plain = !seg.is_empty()
            && !seg.starts_with(|c: char| c.is_ascii_digit())
            && seg.chars().all(|c| c.is_alphanumeric() || c == '_');
        if plain {
            out.push('.');
            out.push_str(seg);
        } else if !seg.contains(['\'', '\\', '\0']) {
            out.push_str(&format!("['{seg}']"));
        } else {
            // a JSON string is a query string literal too
            out.push_str(&format!("[{}]", serde_json::Value::from(seg.as_str())));
        }
    }
    out
}

/// The selected rows of every part as `(part, row)` in key order: a k-way
/// merge of the parts (each in key order already; there are few parts).
fn merge_order(parts: &[Rows<'_>], key_cols: &[usize]) -> Vec<(usize, usize)> {
    let keys: Vec<&StringArray> = parts
        .iter()
        .zip(key_cols)
        .map(|(p, &c)| p.batch.column(c).as_string::<i32>())
        .collect();
    let total = parts.iter().map(|p| p.rows.len()).sum();
    let mut order = Vec::with_capacity(total);
    let mut at = vec![0usize; parts.len()];
    if parts.len() == 1 {
        order.extend(parts[0].rows.iter().map(|&r| (0, r as usize)));
        return order;
    }
    loop {
        let mut best: Option<(usize, &str)> = None;
        for (p, part) in parts.iter().enumerate() {
            let Some(&row) = part.rows.get(at[p]) else {
                continue;
            };
            let key = keys[p].value(row as usize);
            if best.is_none_or(|(_, b)| key.as_bytes() < b.as_bytes()) {
                best = Some((p, key));
            }
        }
        let Some((p, _)) = best else {
            return order;
        };
        order.push((p, parts[p].rows[at[p]] as usize));
        at[p] += 1;
    }
}

/// How the typed values of one output column come together.
enum Unified {
    /// Every contributing batch has this type.
    Same(DataType),
    /// Int64 and Float64: Float64, ints converted (every one exact).
    Float,
    /// Aware timestamps of different zones: the same instants, in UTC.
    Utc,
    /// Anything else: JSON text.
    Json,
}

impl Gather {
    fn new(name: &str, kind: Gathered, parts: usize) -> Gather {
        Gather {
            name: name.to_owned(),
            kind,
            typed: vec![None; parts],
            json: vec![None; parts],
        }
    }

    /// The output field and column, `None` when no selected row has a value.
    /// A path whose selected values include JSON text is made again from
    /// those values when `rebuild` (see [`Gather::rebuilt`]).
    fn output(
        &self,
        parts: &[Rows<'_>],
        order: &[(usize, usize)],
        zero_copy: bool,
        rebuild: bool,
    ) -> Result<Option<(Field, ArrayRef)>> {
        // the batches whose typed column has a selected value
        let mut typed: Vec<(usize, &ArrayRef)> = Vec::new();
        let mut json_values = 0;
        for (p, part) in parts.iter().enumerate() {
            if let Some(col) = self.typed[p].map(|c| part.batch.column(c)) {
                if part.valid(col.as_ref()) > 0 {
                    typed.push((p, col));
                }
            }
            if let Some(col) = self.json[p].map(|c| part.batch.column(c)) {
                json_values += part.valid(col.as_ref());
            }
        }
        if typed.is_empty() && json_values == 0 {
            return Ok(None);
        }
        if json_values > 0 && rebuild {
            // (even one batch with every row selected: a merged checkpoint
            // run's split is its inputs', not the builder's over its rows)
            let rows = selected(parts, order, zero_copy);
            if self.json_values_may_be_typed(parts, &rows) {
                return self.rebuilt(parts, &rows);
            }
        }
        let unified = if json_values > 0 {
            Unified::Json
        } else {
            unify(&typed, parts)
        };
        if let Gathered::Fact { .. } = self.kind {
            if !matches!(unified, Unified::Same(_)) {
                return Err(Error::corrupt(
                    "column batch",
                    format!("fact column {:?} has several types", self.name),
                ));
            }
        }
        let mut metadata = match &self.kind {
            Gathered::Meta(path) => HashMap::from([
                (KIND.to_owned(), "meta".to_owned()),
                (PATH.to_owned(), path.clone()),
            ]),
            Gathered::Fact { array, fact } => HashMap::from([
                (KIND.to_owned(), "fact".to_owned()),
                (ARRAY.to_owned(), array.clone()),
                (FACT.to_owned(), fact.clone()),
            ]),
        };
        if !matches!(unified, Unified::Json) {
            // what the values were, when every contributing batch says the same
            for name in [NUMPY, DATE] {
                let mut said = typed.iter().map(|&(p, _)| {
                    let c = self.typed[p].expect("a typed column");
                    parts[p]
                        .batch
                        .schema_ref()
                        .field(c)
                        .metadata()
                        .get(name)
                        .cloned()
                });
                let first = said.next().flatten();
                if let Some(value) = first.filter(|v| said.all(|s| s.as_ref() == Some(v))) {
                    metadata.insert(name.to_owned(), value);
                }
            }
        }
        let array: ArrayRef = match unified {
            Unified::Json => {
                metadata.insert(JSON.to_owned(), "true".to_owned());
                match self.json[0] {
                    // every value is JSON text already: the column as it is
                    Some(c) if zero_copy && typed.is_empty() => parts[0].batch.column(c).clone(),
                    _ => Arc::new(self.json_text(parts, order, zero_copy)?),
                }
            }
            Unified::Same(_) if zero_copy => typed[0].1.clone(),
            Unified::Same(data_type) => unique_dictionary(gather(&typed, order, &data_type)?),
            Unified::Float => {
                let floats: Vec<(usize, ArrayRef)> =
                    typed.iter().map(|&(p, col)| (p, as_float(col))).collect();
                let refs: Vec<(usize, &ArrayRef)> = floats.iter().map(|(p, c)| (*p, c)).collect();
                gather(&refs, order, &DataType::Float64)?
            }
            Unified::Utc => {
                let utc: Vec<(usize, ArrayRef)> = typed
                    .iter()
                    .map(|&(p, col)| {
                        let t = col.as_primitive::<TimestampMicrosecondType>().clone();
                        (p, Arc::new(t.with_timezone("+00:00")) as ArrayRef)
                    })
                    .collect();
                let refs: Vec<(usize, &ArrayRef)> = utc.iter().map(|(p, c)| (*p, c)).collect();
                let data_type = refs[0].1.data_type().clone();
                gather(&refs, order, &data_type)?
            }
        };
        let field = Field::new(&self.name, array.data_type().clone(), true).with_metadata(metadata);
        Ok(Some((field, array)))
    }

    /// Whether every selected JSON-text value of the path may be one a
    /// typed column holds (a string, a number, a boolean, a tagged value):
    /// only then can the builder make the path typed from the selected
    /// values. A null, a list or an object keeps it JSON text, and the
    /// values' own text then goes out as it is (no rebuild; a column of
    /// JSON text alone is not copied).
    fn json_values_may_be_typed(&self, parts: &[Rows<'_>], rows: &[(usize, usize)]) -> bool {
        let json: Vec<Option<&StringArray>> = (0..parts.len())
            .map(|p| self.json[p].and_then(|c| parts[p].batch.column(c).as_string_opt::<i32>()))
            .collect();
        rows.iter()
            .all(|&(p, r)| match json[p].filter(|j| j.is_valid(r)) {
                None => true,
                Some(j) => {
                    let text = j.value(r);
                    match text.as_bytes().first() {
                        Some(b'"' | b't' | b'f' | b'-' | b'0'..=b'9') => true,
                        // a tagged value ($float, $datetime, $date, $numpy...)
                        Some(b'{') => text.starts_with("{\"$"),
                        _ => false,
                    }
                }
            })
    }

    /// The path's column as the column builder makes it from the selected
    /// values alone: each typed value rendered as the JSON its record held,
    /// each JSON-text value as it is, given to a builder as the records of
    /// one path, whose column (typed, or JSON text when the values are of
    /// several kinds) then goes out. A batch's typed column holds the most
    /// common kind of all of its rows, and its JSON-text column the others:
    /// the same values would otherwise come out typed from one batch and as
    /// JSON text from another. `None` when no value is selected.
    fn rebuilt(
        &self,
        parts: &[Rows<'_>],
        order: &[(usize, usize)],
    ) -> Result<Option<(Field, ArrayRef)>> {
        let column_of = |which: &[Option<usize>], p: usize| {
            which[p].map(|c| {
                (
                    parts[p].batch.column(c),
                    parts[p].batch.schema_ref().field(c),
                )
            })
        };
        let mut builder = ColumnBuilder::unlimited();
        let (mut record, mut key) = (String::new(), String::new());
        for (i, &(p, r)) in order.iter().enumerate() {
            record.clear();
            record.push_str("{\"meta\":{");
            let json = column_of(&self.json, p).filter(|(j, _)| j.is_valid(r));
            if let Some((j, _)) = json {
                record.push_str("\"v\":");
                record.push_str(j.as_string::<i32>().value(r));
            } else if let Some((t, field)) =
                column_of(&self.typed, p).filter(|(t, _)| t.is_valid(r))
            {
                record.push_str("\"v\":");
                render_tagged(t.as_ref(), field, r, &mut record)?;
            }
            record.push_str("},\"arrays\":{}}");
            key.clear();
            write!(key, "{i:012}").expect("writing to a String");
            builder.push(&key, Some(record.as_bytes()))?;
        }
        let columns = builder.finish()?;
        let batch = columns.batch()?;
        let rows: Vec<u32> = (0..batch.num_rows() as u32).collect();
        let (schema, batches) = shape_with(
            &[Rows {
                batch: &batch,
                rows: &rows,
            }],
            false,
        )?;
        let v = serde_json::to_string(&["v"]).expect("strings serialize");
        let Some(at) = schema
            .fields()
            .iter()
            .position(|f| f.metadata().get(PATH) == Some(&v))
        else {
            return Ok(None);
        };
        let Gathered::Meta(path) = &self.kind else {
            return Ok(None);
        };
        let mut metadata = schema.field(at).metadata().clone();
        metadata.insert(PATH.to_owned(), path.clone());
        let array = batches[0].column(at).clone();
        let field = Field::new(&self.name, array.data_type().clone(), true).with_metadata(metadata);
        Ok(Some((field, array)))
    }

    /// The path's values as JSON text: a json column's text as it is, a
    /// typed value rendered as JSON (tagged values as schema/FORMAT.md).
    fn json_text(
        &self,
        parts: &[Rows<'_>],
        order: &[(usize, usize)],
        zero_copy: bool,
    ) -> Result<StringArray> {
        let order = selected(parts, order, zero_copy);
        let typed: Vec<Option<(&ArrayRef, &Field)>> = (0..parts.len())
            .map(|p| {
                self.typed[p].map(|c| {
                    (
                        parts[p].batch.column(c),
                        parts[p].batch.schema_ref().field(c),
                    )
                })
            })
            .collect();
        let json: Vec<Option<&StringArray>> = (0..parts.len())
            .map(|p| self.json[p].map(|c| parts[p].batch.column(c).as_string::<i32>()))
            .collect();
        let mut out = StringBuilder::with_capacity(order.len(), order.len() * 8);
        let mut text = String::new();
        for &(p, r) in order.iter() {
            if let Some(j) = json[p].filter(|j| j.is_valid(r)) {
                out.append_value(j.value(r));
            } else if let Some((t, field)) = typed[p].filter(|(t, _)| t.is_valid(r)) {
                text.clear();
                render_tagged(t.as_ref(), field, r, &mut text)?;
                out.append_value(&text);
            } else {
                out.append_null();
            }
        }
        Ok(out.finish())
    }
}

/// The selected rows as `(part, row)` in output order: `order`, or every
/// row of the one part when it goes out whole (`zero_copy`, where no order
/// is made).
fn selected<'a>(
    parts: &[Rows<'_>],
    order: &'a [(usize, usize)],
    zero_copy: bool,
) -> std::borrow::Cow<'a, [(usize, usize)]> {
    if zero_copy {
        (0..parts[0].batch.num_rows()).map(|r| (0, r)).collect()
    } else {
        std::borrow::Cow::Borrowed(order)
    }
}

/// How the typed columns `typed` (each with a selected value) come together.
fn unify(typed: &[(usize, &ArrayRef)], parts: &[Rows<'_>]) -> Unified {
    let first = typed[0].1.data_type();
    if typed.iter().all(|(_, c)| c.data_type() == first) {
        return Unified::Same(first.clone());
    }
    let is = |t: &DataType| typed.iter().all(|(_, c)| c.data_type() == t);
    let numeric = typed
        .iter()
        .all(|(_, c)| matches!(c.data_type(), DataType::Int64 | DataType::Float64));
    if numeric && !is(&DataType::Float64) {
        let exact = typed.iter().all(|&(p, c)| {
            let Some(ints) = c.as_primitive_opt::<Int64Type>() else {
                return true;
            };
            parts[p]
                .rows
                .iter()
                .map(|&r| r as usize)
                .filter(|&r| ints.is_valid(r))
                .all(|r| ints.value(r).unsigned_abs() <= EXACT_INT.unsigned_abs())
        });
        return if exact { Unified::Float } else { Unified::Json };
    }
    let aware = typed.iter().all(|(_, c)| {
        matches!(
            c.data_type(),
            DataType::Timestamp(TimeUnit::Microsecond, Some(_))
        )
    });
    if aware {
        Unified::Utc
    } else {
        Unified::Json
    }
}

/// Int64 (or Float64) values as Float64.
fn as_float(col: &ArrayRef) -> ArrayRef {
    match col.as_primitive_opt::<Int64Type>() {
        Some(ints) => Arc::new(ints.unary::<_, Float64Type>(|i| i as f64)) as ArrayRef,
        None => col.clone(),
    }
}

/// The rows `order` of the batches' columns `typed` (all of `data_type`);
/// batches absent from `typed` (no selected value) give nulls.
fn gather(
    typed: &[(usize, &ArrayRef)],
    order: &[(usize, usize)],
    data_type: &DataType,
) -> Result<ArrayRef> {
    let null = arrow_array::new_null_array(data_type, 1);
    let mut slot: HashMap<usize, usize> = HashMap::new();
    let mut arrays: Vec<&dyn Array> = Vec::with_capacity(typed.len() + 1);
    for (i, &(p, col)) in typed.iter().enumerate() {
        slot.insert(p, i);
        arrays.push(col.as_ref());
    }
    arrays.push(null.as_ref());
    let nulls = typed.len();
    let indices: Vec<(usize, usize)> = order
        .iter()
        .map(|&(p, r)| slot.get(&p).map_or((nulls, 0), |&i| (i, r)))
        .collect();
    arrow_select::interleave::interleave(&arrays, &indices).map_err(arrow_error)
}

/// `array` with each dictionary value once, when it is a dictionary of
/// strings gathered from several batches (Arrow's interleave keeps each
/// batch's dictionary, so a string two batches hold was listed twice:
/// pyarrow's `to_pandas` refuses such categories, `value_counts` splits
/// them); any other array as it is.
fn unique_dictionary(array: ArrayRef) -> ArrayRef {
    let Some(dict) = array.as_dictionary_opt::<Int32Type>() else {
        return array;
    };
    let Some(values) = dict.values().as_string_opt::<i32>() else {
        return array;
    };
    let mut seen = std::collections::HashSet::with_capacity(values.len());
    if values.iter().all(|v| seen.insert(v)) {
        return array; // already unique
    }
    let mut b = arrow_array::builder::StringDictionaryBuilder::<Int32Type>::new();
    for key in dict.keys() {
        match key {
            Some(k) => b.append_value(values.value(k as usize)),
            None => b.append_null(),
        }
    }
    Arc::new(b.finish())
}

/// Row `r` of the typed column `array` (of `field`) as JSON text, as the
/// tagged value it was when the field says so (`$date`, `$numpy`).
fn render_tagged(array: &dyn Array, field: &Field, r: usize, out: &mut String) -> Result<()> {
    let meta = field.metadata();
    if meta.get(DATE).map(String::as_str) == Some("true") {
        if let DataType::Timestamp(TimeUnit::Microsecond, None) = array.data_type() {
            let micros = array.as_primitive::<TimestampMicrosecondType>().value(r);
            let day = &iso_micros(micros, false)[..10];
            write!(out, "{}", serde_json::json!({ "$date": day })).expect("writing to a String");
            return Ok(());
        }
    }
    if let Some(descr) = meta.get(NUMPY) {
        if matches!(
            array.data_type(),
            DataType::Int64 | DataType::Float64 | DataType::Boolean
        ) {
            let mut plain = String::new();
            render(array, r, &mut plain)?;
            let descr = serde_json::Value::from(descr.as_str());
            write!(out, "{{\"$numpy\": [{descr}, {plain}]}}").expect("writing to a String");
            return Ok(());
        }
    }
    render(array, r, out)
}

/// Row `r` of the typed column `array` as JSON text (as the record holds
/// the value, up to float formatting).
fn render(array: &dyn Array, r: usize, out: &mut String) -> Result<()> {
    match array.data_type() {
        DataType::Int64 => write!(out, "{}", array.as_primitive::<Int64Type>().value(r)),
        DataType::Float64 => {
            let v = array.as_primitive::<Float64Type>().value(r);
            match serde_json::Number::from_f64(v) {
                Some(num) => write!(out, "{num}"),
                None => write!(out, "{{\"$float\": \"{}\"}}", float_word(v)),
            }
        }
        DataType::Boolean => write!(out, "{}", array.as_boolean().value(r)),
        DataType::Utf8 => {
            let s = array.as_string::<i32>().value(r);
            write!(out, "{}", serde_json::Value::from(s))
        }
        DataType::Dictionary(key, value)
            if key.as_ref() == &DataType::Int32 && value.as_ref() == &DataType::Utf8 =>
        {
            let dict = array.as_dictionary::<Int32Type>();
            let k = dict.keys().value(r);
            let s = dict.values().as_string::<i32>().value(k as usize);
            write!(out, "{}", serde_json::Value::from(s))
        }
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            let t: &TimestampMicrosecondArray = array.as_primitive();
            let text = iso_micros(t.value(r), tz.is_some());
            write!(out, "{}", serde_json::json!({ "$datetime": text }))
        }
        other => {
            return Err(Error::corrupt(
                "column batch",
                format!("a metadata column of type {other}"),
            ))
        }
    }
    .expect("writing to a String");
    Ok(())
}

fn float_word(v: f64) -> &'static str {
    if v.is_nan() {
        "nan"
    } else if v > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}

/// Microseconds since 1970-01-01 as Python's `datetime.isoformat()` writes
/// them (`2024-03-01T12:30:00`, `.ffffff` when not whole seconds), with
/// `+00:00` when `aware` (the instant in UTC).
fn iso_micros(micros: i64, aware: bool) -> String {
    let days = micros.div_euclid(86_400_000_000);
    let in_day = micros.rem_euclid(86_400_000_000);
    let (y, m, d) = civil_from_days(days);
    let (secs, frac) = (in_day / 1_000_000, in_day % 1_000_000);
    let mut text = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );
    if frac != 0 {
        write!(text, ".{frac:06}").expect("writing to a String");
    }
    if aware {
        text.push_str("+00:00");
    }
    text
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;
