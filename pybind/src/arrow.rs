//! Arrow tables out to Python through the Arrow PyCapsule interface
//! (<https://arrow.apache.org/docs/format/CDataInterface/PyCapsuleInterface.html>):
//! an [`ArrowStream`] hands its record batches to any consumer of
//! `__arrow_c_stream__` (pyarrow >= 14: `pa.table(obj)`,
//! `pa.RecordBatchReader.from_stream(obj)`; polars: `pl.DataFrame(obj)`;
//! DuckDB) as an `ArrowArrayStream` of the C stream interface. The buffers
//! are shared, not copied: a mapped column file stays mapped, and lives as
//! long as the last array that uses it.

use std::ffi::CStr;

use arrow_array::ffi::FFI_ArrowSchema;
use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_array::{RecordBatch, RecordBatchIterator};
use arrow_schema::SchemaRef;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// The capsule names the PyCapsule interface fixes.
const STREAM: &CStr = c"arrow_array_stream";
const SCHEMA: &CStr = c"arrow_schema";

/// An Arrow table held in Rust: its schema and record batches, exported to
/// Python consumers through `__arrow_c_stream__` as often as asked (each
/// export is a new stream over the same buffers).
#[pyclass(module = "lazyvault._lazyvault", frozen)]
pub struct ArrowStream {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
}

impl ArrowStream {
    /// The table of `batches` (each of `schema`).
    pub(crate) fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> ArrowStream {
        ArrowStream { schema, batches }
    }
}

#[pymethods]
impl ArrowStream {
    /// A PyCapsule named "arrow_array_stream" holding an `ArrowArrayStream`
    /// of the table's batches. `requested_schema` is ignored, as the
    /// interface allows: the consumer casts if it wants another schema.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let batches = self.batches.clone().into_iter().map(Ok);
        let reader = RecordBatchIterator::new(batches, self.schema.clone());
        // The capsule owns the stream; a consumer moves it out (leaving a
        // released one behind), and dropping the capsule releases a stream
        // nobody took (FFI_ArrowArrayStream's Drop calls its release).
        PyCapsule::new_with_value(py, FFI_ArrowArrayStream::new(Box::new(reader)), STREAM)
    }

    /// A PyCapsule named "arrow_schema" holding the table's `ArrowSchema`.
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let schema = FFI_ArrowSchema::try_from(self.schema.as_ref())
            .map_err(|e| PyValueError::new_err(format!("Arrow schema export failed: {e}")))?;
        PyCapsule::new_with_value(py, schema, SCHEMA)
    }

    /// Number of rows.
    #[getter]
    fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }

    fn __repr__(&self) -> String {
        format!(
            "<lazyvault ArrowStream: {} rows, {} columns>",
            self.num_rows(),
            self.schema.fields().len()
        )
    }
}

/// A small table of every column type the metadata tables use (Utf8 keys,
/// Float64, Int64, Boolean, dictionary strings, naive and UTC timestamps,
/// List<UInt64> shapes, JSON text), with nulls and field metadata: the
/// export's own test, independent of any store.
#[pyfunction]
pub fn _arrow_example() -> PyResult<ArrowStream> {
    example::batch()
        .map(|b| ArrowStream::new(b.schema(), vec![b.clone(), b]))
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

mod example {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow_array::builder::{ListBuilder, StringDictionaryBuilder, UInt64Builder};
    use arrow_array::types::Int32Type;
    use arrow_array::{
        ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
        TimestampMicrosecondArray,
    };
    use arrow_schema::{ArrowError, Field, Schema};

    fn field(name: &str, array: &ArrayRef, meta: &[(&str, &str)]) -> Field {
        let metadata: HashMap<String, String> = meta
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Field::new(name, array.data_type().clone(), name != "key").with_metadata(metadata)
    }

    /// A column: name, values, field metadata.
    type Column<'a> = (&'a str, ArrayRef, Vec<(&'a str, &'a str)>);

    pub(super) fn batch() -> Result<RecordBatch, ArrowError> {
        let mut material = StringDictionaryBuilder::<Int32Type>::new();
        for m in [Some("Si"), None, Some("Ge")] {
            material.append_option(m);
        }
        let mut shape = ListBuilder::new(UInt64Builder::new());
        shape.values().append_slice(&[10, 3]);
        shape.append(true);
        shape.append(false);
        shape.values().append_slice(&[]);
        shape.append(true);
        let micros = 1_709_296_200_000_000; // 2024-03-01T12:30:00
        let columns: Vec<Column<'_>> = vec![
            (
                "key",
                Arc::new(StringArray::from(vec!["a", "b", "c"])),
                vec![("lazyvault.kind", "key")],
            ),
            (
                "temperature",
                Arc::new(Float64Array::from(vec![Some(300.0), None, Some(0.5)])),
                vec![("lazyvault.kind", "meta")],
            ),
            (
                "step",
                Arc::new(Int64Array::from(vec![Some(1), Some(-2), None])),
                vec![("lazyvault.kind", "meta")],
            ),
            (
                "ok",
                Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])),
                vec![("lazyvault.kind", "meta")],
            ),
            (
                "material",
                Arc::new(material.finish()),
                vec![("lazyvault.kind", "meta")],
            ),
            (
                "when",
                Arc::new(TimestampMicrosecondArray::from(vec![
                    Some(micros),
                    None,
                    Some(0),
                ])),
                vec![("lazyvault.kind", "meta")],
            ),
            (
                "at",
                Arc::new(
                    TimestampMicrosecondArray::from(vec![None, Some(micros), None])
                        .with_timezone("+00:00"),
                ),
                vec![("lazyvault.kind", "meta")],
            ),
            (
                "tags",
                Arc::new(StringArray::from(vec![
                    Some("[1, \"a\"]"),
                    Some("null"),
                    None,
                ])),
                vec![("lazyvault.kind", "meta"), ("lazyvault.json", "true")],
            ),
            (
                "positions.shape",
                Arc::new(shape.finish()),
                vec![("lazyvault.kind", "fact")],
            ),
        ];
        let fields: Vec<Field> = columns.iter().map(|(n, a, m)| field(n, a, m)).collect();
        let arrays = columns.into_iter().map(|(_, a, _)| a).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
    }
}
