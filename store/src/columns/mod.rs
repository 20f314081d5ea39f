//! Columns of metadata: the records of a checkpoint run (or of any set of
//! records) as one Arrow record batch, so that queries run over typed,
//! contiguous values instead of parsing each record's JSON, and so that
//! `to_arrow` hands the same buffers to pyarrow, polars or DuckDB.
//!
//! Row `i` is the `i`-th `(key, record)` pair given to the builder, in key
//! order. The columns, each tagged by its Arrow field metadata
//! (`lazyvault.kind`; FORMAT.md, "Column files"):
//!
//! - `key` (Utf8) and `$live` (Boolean: false for a deleted key's row);
//! - per metadata path (objects are walked, `$dict` ones too; every other
//!   value is a leaf), one *typed* column (Int64, Float64, Boolean,
//!   `Dictionary<Int32, Utf8>`, or Timestamp in microseconds, naive or UTC)
//!   holding the leaves of the path's most common scalar kind, and, where
//!   the path holds anything else (null, lists, other tagged values, a
//!   second kind), a *json* sibling column of the same path holding those
//!   values' JSON text;
//! - per array name, its facts: `shape` (`List<UInt64>`), `dtype` and
//!   `descr` (`Dictionary<Int32, Utf8>`), `nbytes` (`UInt64`).
//!
//! A typed cell is null where the path is absent or holds another kind;
//! the json cell says which.

mod build;
mod file;
pub(crate) mod merge;

use std::collections::HashMap;

use std::sync::OnceLock;

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;

pub(crate) use self::build::ColumnBuilder;
#[allow(unused_imports)]
pub(crate) use self::file::{ColumnsInfo, COLUMNS_SUFFIX};
use crate::error::{Error, Result};

/// The time zone of aware datetime columns: instants in UTC.
pub(crate) const UTC: &str = "+00:00";

/// Schema metadata: `"false"` when some metadata paths, or some arrays'
/// facts, have no columns (too many in one batch, see `build`).
pub(crate) const PATHS_COMPLETE: &str = "lazyvault.paths_complete";
pub(crate) const FACTS_COMPLETE: &str = "lazyvault.facts_complete";

/// Field metadata of a typed column whose every value was a `$numpy`
/// scalar of one dtype: that dtype's `str` (`"<f4"`); and of one whose every
/// value was a `$date`: `"true"` (FORMAT.md, "Column files").
pub(crate) const NUMPY_MARK: &str = "lazyvault.numpy";
pub(crate) const DATE_MARK: &str = "lazyvault.date";

/// Field metadata keys.
const KIND: &str = "lazyvault.kind";
const PATH: &str = "lazyvault.path";
const ARRAY: &str = "lazyvault.array";
const FACT: &str = "lazyvault.fact";

/// An array fact kept as a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum FactName {
    Shape,
    Dtype,
    Descr,
    Nbytes,
}

impl FactName {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FactName::Shape => "shape",
            FactName::Dtype => "dtype",
            FactName::Descr => "descr",
            FactName::Nbytes => "nbytes",
        }
    }

    fn parse(s: &str) -> Option<FactName> {
        Some(match s {
            "shape" => FactName::Shape,
            "dtype" => FactName::Dtype,
            "descr" => FactName::Descr,
            "nbytes" => FactName::Nbytes,
            _ => return None,
        })
    }
}

/// What a column holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Key,
    Live,
    /// The typed column of a metadata path.
    Meta(Vec<String>),
    /// The JSON text of a path's values the typed column does not hold.
    Json(Vec<String>),
    Fact {
        array: String,
        fact: FactName,
    },
}

/// The Arrow field metadata that says what a column holds.
pub(crate) fn field_meta(kind: &Kind) -> arrow_schema::Metadata {
    let path = |p: &Vec<String>| serde_json::to_string(p).expect("strings serialize");
    let mut m = arrow_schema::Metadata::new();
    match kind {
        Kind::Key => {
            m.insert(KIND, "key");
        }
        Kind::Live => {
            m.insert(KIND, "live");
        }
        Kind::Meta(p) => {
            m.insert(KIND, "meta");
            m.insert(PATH, path(p));
        }
        Kind::Json(p) => {
            m.insert(KIND, "json");
            m.insert(PATH, path(p));
        }
        Kind::Fact { array, fact } => {
            m.insert(KIND, "fact");
            m.insert(ARRAY, array.clone());
            m.insert(FACT, fact.as_str());
        }
    }
    m
}

/// What a column holds, from its field metadata; `None` when it says
/// nothing we know (a column another writer added: ignored).
fn kind_of(meta: &arrow_schema::Metadata) -> Option<Kind> {
    let path = || -> Option<Vec<String>> { serde_json::from_str(meta.get(PATH)?).ok() };
    Some(match meta.get(KIND)?.as_str() {
        "key" => Kind::Key,
        "live" => Kind::Live,
        "meta" => Kind::Meta(path()?),
        "json" => Kind::Json(path()?),
        "fact" => Kind::Fact {
            array: meta.get(ARRAY)?.clone(),
            fact: FactName::parse(meta.get(FACT)?)?,
        },
        _ => return None,
    })
}

/// Where one path's columns are in the batch.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PathColumns {
    pub typed: Option<usize>,
    pub json: Option<usize>,
}

/// A batch of columns and where each kind of column is in it. Columns
/// built in memory are all there; those of a mapped column file are
/// decoded (zero-copy, validated by Arrow) one at a time, at first use, so
/// that a query reads and checks only the columns it names.
pub(crate) struct Columns {
    schema: SchemaRef,
    rows: usize,
    /// Each column, once decoded (`None`: it could not be).
    cells: Vec<OnceLock<Option<ArrayRef>>>,
    /// Where undecoded columns come from.
    source: Option<file::Mapped>,
    pub key: usize,
    pub live: usize,
    /// Metadata paths, in column order.
    pub paths: indexmap::IndexMap<Vec<String>, PathColumns>,
    /// Array facts by array name, then fact.
    pub facts: HashMap<String, HashMap<FactName, usize>>,
    /// Every metadata path of the rows has its columns (else a path
    /// without columns may still be in a record).
    pub paths_complete: bool,
    /// Every array of the rows has its fact columns.
    pub facts_complete: bool,
    /// Each column's checksum ([`file::column_checksum`]), checked when it
    /// is decoded; empty: not checked (built in memory).
    checksums: Vec<u64>,
}

impl std::fmt::Debug for Columns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Columns")
            .field("rows", &self.rows)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl Columns {
    /// Columns of `batch` (all decoded).
    ///
    /// # Errors
    /// As [`Columns::layout`].
    pub(crate) fn new(batch: RecordBatch) -> Result<Columns> {
        let mut c = Columns::layout(batch.schema(), batch.num_rows(), None)?;
        for (cell, array) in c.cells.iter_mut().zip(batch.columns()) {
            *cell = OnceLock::from(Some(array.clone()));
        }
        let (key, live) = (c.column(c.key), c.column(c.live));
        if key.is_none_or(|a| a.null_count() > 0) || live.is_none_or(|a| a.null_count() > 0) {
            return Err(Error::corrupt("columns", "null in the key or live column"));
        }
        Ok(c)
    }

    /// The layout of columns of `schema` (what each holds, from its field
    /// metadata), none decoded yet.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the key or live column is missing or of the
    /// wrong type, or a column's type does not fit its kind.
    fn layout(schema: SchemaRef, rows: usize, source: Option<file::Mapped>) -> Result<Columns> {
        use arrow_schema::DataType as T;
        let bad = |what: String| Error::corrupt("columns", what);
        let (mut key, mut live) = (None, None);
        let mut paths: indexmap::IndexMap<Vec<String>, PathColumns> = indexmap::IndexMap::new();
        let mut facts: HashMap<String, HashMap<FactName, usize>> = HashMap::new();
        for (i, field) in schema.fields().iter().enumerate() {
            let Some(kind) = kind_of(field.metadata()) else {
                continue;
            };
            let dt = field.data_type();
            let dict_utf8 = matches!(dt, T::Dictionary(k, v) if **k == T::Int32 && **v == T::Utf8);
            let fits = match &kind {
                Kind::Key => *dt == T::Utf8,
                Kind::Live => *dt == T::Boolean,
                Kind::Meta(_) => {
                    matches!(dt, T::Int64 | T::Float64 | T::Boolean)
                        || dict_utf8
                        || matches!(dt, T::Timestamp(arrow_schema::TimeUnit::Microsecond, tz)
                            if tz.as_deref().is_none_or(|z| z == UTC))
                }
                Kind::Json(_) => *dt == T::Utf8,
                Kind::Fact { fact, .. } => match fact {
                    FactName::Shape => matches!(dt, T::List(f) if *f.data_type() == T::UInt64),
                    FactName::Dtype | FactName::Descr => dict_utf8,
                    FactName::Nbytes => *dt == T::UInt64,
                },
            };
            if !fits {
                return Err(bad(format!(
                    "column {:?} has type {dt}, which does not fit what it holds",
                    field.name()
                )));
            }
            match kind {
                Kind::Key => key = Some(i),
                Kind::Live => live = Some(i),
                Kind::Meta(p) => paths.entry(p).or_default().typed = Some(i),
                Kind::Json(p) => paths.entry(p).or_default().json = Some(i),
                Kind::Fact { array, fact } => {
                    facts.entry(array).or_default().insert(fact, i);
                }
            }
        }
        let (Some(key), Some(live)) = (key, live) else {
            return Err(bad("no key or live column".into()));
        };
        let complete = |key: &str| schema.metadata().get(key).is_none_or(|v| v != "false");
        let (paths_complete, facts_complete) = (complete(PATHS_COMPLETE), complete(FACTS_COMPLETE));
        Ok(Columns {
            checksums: Vec::new(),
            paths_complete,
            facts_complete,
            cells: (0..schema.fields().len())
                .map(|_| OnceLock::new())
                .collect(),
            schema,
            rows,
            source,
            key,
            live,
            paths,
            facts,
        })
    }

    /// The checksums each column must have when decoded.
    pub(crate) fn set_checksums(&mut self, checksums: Vec<u64>) {
        self.checksums = checksums;
    }

    /// The schema of every column.
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Column `i`, decoded at first use; `None` when it cannot be (a
    /// damaged file: the caller reads the records instead).
    pub(crate) fn column(&self, i: usize) -> Option<&ArrayRef> {
        self.cells
            .get(i)?
            .get_or_init(|| {
                let array = self.source.as_ref()?.decode_column(&self.schema, i).ok()?;
                if let Some(&expected) = self.checksums.get(i) {
                    if file::column_checksum(array.as_ref()) != expected {
                        return None; // damaged: the records decide instead
                    }
                }
                (array.len() == self.rows).then_some(array)
            })
            .as_ref()
    }

    /// Decodes the columns `wanted` that are not decoded yet, two or more
    /// at a time where the machine has the cores: decoding a mapped column
    /// checks it (Arrow's validation, its checksum), a pass over its bytes,
    /// and a query's first use names a few columns at once. Each column is
    /// decoded and checked exactly as [`Columns::column`] does; a thread
    /// that cannot be started leaves its share to the caller's.
    pub(crate) fn prefetch(&self, wanted: &[usize]) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        if self.source.is_none() {
            return;
        }
        let mut todo: Vec<usize> = wanted
            .iter()
            .copied()
            .filter(|&i| self.cells.get(i).is_some_and(|c| c.get().is_none()))
            .collect();
        todo.sort_unstable();
        todo.dedup();
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(todo.len())
            .min(4);
        if threads < 2 {
            return; // decoded at first use, on this thread
        }
        let next = AtomicUsize::new(0);
        let work = || {
            while let Some(&i) = todo.get(next.fetch_add(1, Ordering::Relaxed)) {
                let _ = self.column(i);
            }
        };
        std::thread::scope(|scope| {
            for _ in 1..threads {
                let _ = std::thread::Builder::new().spawn_scoped(scope, work);
            }
            work();
        });
    }

    /// Every column as one record batch (decoding those not yet decoded).
    ///
    /// # Errors
    /// [`Error::Corrupt`] when a column cannot be decoded.
    pub(crate) fn batch(&self) -> Result<RecordBatch> {
        let mut arrays = Vec::with_capacity(self.cells.len());
        for (i, field) in self.schema.fields().iter().enumerate() {
            arrays.push(self.column(i).cloned().ok_or_else(|| {
                Error::corrupt(
                    "column file",
                    format!("column {:?} cannot be read", field.name()),
                )
            })?);
        }
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(build::arrow_err)
    }

    /// Builds the columns of `pairs` (key, record JSON or `None` for a
    /// deleted key), in the order given.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the key of a record that does not decode.
    #[cfg(test)]
    pub(crate) fn build<'a>(
        pairs: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    ) -> Result<Columns> {
        let mut b = ColumnBuilder::default();
        for (key, record) in pairs {
            b.push(key, record)?;
        }
        b.finish()
    }

    /// Rows.
    pub(crate) fn len(&self) -> usize {
        self.rows
    }

    /// The key column (`None`: it cannot be decoded).
    pub(crate) fn keys(&self) -> Option<&arrow_array::StringArray> {
        use arrow_array::cast::AsArray;
        self.column(self.key)
            .filter(|a| a.null_count() == 0)
            .and_then(|a| a.as_string_opt::<i32>())
    }

    /// The live column, false for a deleted key's row (`None`: it cannot
    /// be decoded).
    pub(crate) fn live(&self) -> Option<&arrow_array::BooleanArray> {
        use arrow_array::cast::AsArray;
        self.column(self.live)
            .filter(|a| a.null_count() == 0)
            .and_then(|a| a.as_boolean_opt())
    }
}

/// [`crate::read_column_file`].
pub(crate) fn read_file_bytes(bytes: &[u8]) -> std::result::Result<usize, String> {
    let buffer = arrow_buffer::Buffer::from_vec(bytes.to_vec());
    let columns = Columns::decode_caught(&buffer)?;
    for (i, field) in columns.schema().fields().iter().enumerate() {
        if columns.column(i).is_none() {
            return Err(format!("column {:?} cannot be read", field.name()));
        }
    }
    Ok(columns.len())
}

#[cfg(test)]
mod tests;
