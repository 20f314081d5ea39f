//! `StoreCore`: the engine's `Store` as a Python object. The Python class
//! `lazyvault.Store` wraps it with the mapping API and the object splitting.

use std::path::Path;
use std::sync::{Arc, Mutex};

use lazyvault_store::query::Query;
use lazyvault_store::{schema, Mode, NewRecordJson, Store};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::array::RecordArrays;
use crate::arrow::ArrowStream;
use crate::convert::{self, ArrayArg};
use crate::encode::Encoded;
use crate::errors::IntoPy;
use crate::keys::{KeyArray, KeysArg};
use crate::progress;

/// Parses `expr` and raises `QueryError` if it is not a valid query.
#[pyfunction]
pub fn check_query(expr: &str) -> PyResult<()> {
    Query::parse(expr)
        .map_err(lazyvault_store::Error::from)
        .py_err()?;
    Ok(())
}

/// One record for `put_many`: `(key, meta_json, layout_json, arrays,
/// pickle or None)`, or `(key, Encoded)` (a dict split in Rust,
/// `encode::encode_flat`), told apart by their length.
/// The strings are borrowed from the Python objects (UTF-8 cached by
/// CPython), not copied.
enum RecordArg {
    Parts {
        key: PyBackedStr,
        meta_json: PyBackedStr,
        layout_json: PyBackedStr,
        arrays: Vec<ArrayArg>,
        pickle: Option<Py<PyBytes>>,
    },
    Encoded {
        key: PyBackedStr,
        encoded: Py<Encoded>,
    },
}

impl<'a, 'py> FromPyObject<'a, 'py> for RecordArg {
    type Error = PyErr;
    fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let t = ob.cast::<PyTuple>()?;
        if t.len() == 2 {
            let (key, encoded) = t.extract()?;
            return Ok(RecordArg::Encoded { key, encoded });
        }
        let (key, meta_json, layout_json, arrays, pickle) = t.extract()?;
        Ok(RecordArg::Parts {
            key,
            meta_json,
            layout_json,
            arrays,
            pickle,
        })
    }
}

/// An open store: a reader's snapshot until the first write, then the
/// writer role (the sled index and the store's lock).
#[pyclass(module = "lazyvault._lazyvault", frozen)]
pub struct StoreCore {
    pub(crate) inner: Store,
    /// `inner.root()`, shared with the `RecordArrays` of its records.
    root: Arc<Path>,
    /// The array paths of the last record read, and their tuple.
    last_names: Mutex<Option<(Vec<String>, Py<PyTuple>)>>,
}

impl StoreCore {
    /// The engine's store, for the other binding modules (export).
    pub(crate) fn store(&self) -> &Store {
        &self.inner
    }

    /// `names` as a tuple of str: the last one made when equal (records of
    /// a store mostly share their array paths, and one tuple object is one
    /// allocation fewer per record read, and a cheap key for the Python
    /// layer's per-names class cache).
    fn names_tuple(&self, py: Python<'_>, names: &[&str]) -> PyResult<Py<PyTuple>> {
        let mut last = self.last_names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((strings, tuple)) = &*last {
            if strings.len() == names.len() && strings.iter().zip(names).all(|(a, b)| a == b) {
                return Ok(tuple.clone_ref(py));
            }
        }
        let tuple = PyTuple::new(py, names)?.unbind();
        let strings = names.iter().map(|n| (*n).to_owned()).collect();
        *last = Some((strings, tuple.clone_ref(py)));
        Ok(tuple)
    }
}

#[pymethods]
impl StoreCore {
    /// Opens the store at `path` with `mode` "r", "a" or "w"; with
    /// `version`, read-only as of that commit (mode must be "r").
    #[new]
    #[pyo3(signature = (path, mode, version=None))]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        mode: &str,
        version: Option<u64>,
    ) -> PyResult<Self> {
        let mode: Mode = mode.parse().map_err(PyValueError::new_err)?;
        let inner = match version {
            None => py.detach(|| Store::open(&path, mode)),
            Some(_) if mode != Mode::ReadOnly => {
                return Err(PyValueError::new_err(
                    "a version opens a store with mode 'r'",
                ))
            }
            Some(v) => py.detach(|| Store::open_at(&path, v)),
        }
        .py_err()?;
        let root = Arc::from(inner.root());
        Ok(StoreCore {
            inner,
            root,
            last_names: Mutex::new(None),
        })
    }

    /// The commit this handle shows (commits since the store was created).
    #[getter]
    fn version(&self) -> PyResult<u64> {
        self.inner.version().py_err()
    }

    /// Whether this handle holds changes not yet committed (a writer's puts
    /// or deletes since its last flush); False for a reader.
    #[getter]
    fn has_uncommitted_changes(&self) -> PyResult<bool> {
        self.inner.has_uncommitted_changes().py_err()
    }

    /// Moves a reader to the latest commit; returns its version.
    fn refresh(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.inner.refresh()).py_err()
    }

    /// Takes the writer role now (`Store::begin_write`).
    fn begin_write(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.begin_write()).py_err()
    }

    /// Whether this handle holds the writer role.
    #[getter]
    fn is_writer(&self) -> bool {
        self.inner.is_writer()
    }

    /// Seconds superseded data is kept for readers on other machines.
    #[getter]
    fn retention(&self) -> f64 {
        self.inner.retention().as_secs_f64()
    }

    /// Sets the retention, in seconds (finite, >= 0; else `ValueError`).
    #[setter]
    fn set_retention(&self, seconds: f64) -> PyResult<()> {
        let d = std::time::Duration::try_from_secs_f64(seconds).map_err(|_| {
            PyValueError::new_err(format!(
                "retention must be a finite number of seconds >= 0, not {seconds}"
            ))
        })?;
        self.inner.set_retention(d);
        Ok(())
    }

    /// The store's directory.
    #[getter]
    fn root(&self) -> String {
        self.inner.root().to_string_lossy().into_owned()
    }

    /// The open mode: "r", "a" or "w".
    #[getter]
    fn mode(&self) -> &'static str {
        match self.inner.mode() {
            Mode::ReadOnly => "r",
            Mode::Append => "a",
            Mode::Create => "w",
        }
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Writes the arrays, then the record (see `Store::put` in the engine).
    #[pyo3(signature = (key, meta_json, layout_json, arrays, pickle=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &str,
        meta_json: &str,
        layout_json: &str,
        arrays: Vec<ArrayArg>,
        pickle: Option<&[u8]>,
    ) -> PyResult<()> {
        let meta = convert::meta_json_text(meta_json)?;
        let layout = convert::layout_json_text(layout_json)?;
        let sources: Vec<_> = arrays.iter().map(ArrayArg::as_source).collect();
        let record = NewRecordJson {
            key,
            meta,
            layout,
            arrays: &sources,
            pickle,
        };
        py.detach(|| self.inner.put_many_json(vec![record]))
            .py_err()
    }

    /// Puts `records`, each `(key, meta_json, layout_json, arrays, pickle
    /// or None)` (the arguments of `put`) or `(key, Encoded)`, all or
    /// nothing, with one durability barrier and one index batch
    /// (`Store::put_many`).
    fn put_many(&self, py: Python<'_>, records: Vec<RecordArg>) -> PyResult<()> {
        // The metadata and layout go in as checked JSON text, not parsed
        // (an Encoded's text was written compact by the encoder).
        let mut texts = Vec::with_capacity(records.len());
        for r in &records {
            texts.push(match r {
                RecordArg::Parts {
                    meta_json,
                    layout_json,
                    ..
                } => (
                    convert::meta_json_text(meta_json)?,
                    convert::layout_json_text(layout_json)?,
                ),
                RecordArg::Encoded { encoded, .. } => {
                    let e = encoded.get();
                    (e.meta().clone(), e.layout().clone())
                }
            });
        }
        let sources: Vec<Vec<_>> = records
            .iter()
            .map(|r| match r {
                RecordArg::Parts { arrays, .. } => arrays.iter().map(ArrayArg::as_source).collect(),
                RecordArg::Encoded { encoded, .. } => encoded.get().sources(),
            })
            .collect();
        let batch: Vec<NewRecordJson<'_>> = records
            .iter()
            .zip(texts)
            .zip(&sources)
            .map(|((r, (meta, layout)), sources)| {
                let (key, pickle) = match r {
                    RecordArg::Parts { key, pickle, .. } => (key, pickle.as_ref()),
                    RecordArg::Encoded { key, .. } => (key, None),
                };
                NewRecordJson {
                    key,
                    meta,
                    layout,
                    arrays: sources,
                    pickle: pickle.map(|p| p.as_bytes(py)),
                }
            })
            .collect();
        py.detach(|| self.inner.put_many_json(batch)).py_err()
    }

    /// Replaces the arrays of `key` named like those of `arrays` (tuples as
    /// for `put`), keeping everything else (`Store::replace_arrays`);
    /// False when there is no record under `key`.
    fn replace_arrays(&self, py: Python<'_>, key: &str, arrays: Vec<ArrayArg>) -> PyResult<bool> {
        let sources: Vec<_> = arrays.iter().map(ArrayArg::as_source).collect();
        py.detach(|| self.inner.replace_arrays(key, &sources))
            .py_err()
    }

    /// The record JSON of `key`, or None.
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let json = self.inner.get_json(key).py_err()?;
        Ok(json.map(|j| PyBytes::new(py, &j)))
    }

    /// `(record JSON, pickled remainder or None)` of `key`, read together,
    /// or None.
    #[allow(clippy::type_complexity)]
    fn get_full<'py>(
        &self,
        py: Python<'py>,
        key: &str,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>)>> {
        let got = self.inner.get_with_pickle(key).py_err()?;
        Ok(got.map(|(r, p)| (PyBytes::new(py, &r), p.map(|p| PyBytes::new(py, &p)))))
    }

    /// `(record JSON, pickled remainder or None, RecordArrays or None)` of
    /// `key`, read together, or None: the record outlined here (array paths,
    /// where each entry is), so that an array is read without decoding the
    /// record JSON in Python (`None` when it does not parse: the JSON is
    /// then the caller's to refuse).
    #[allow(clippy::type_complexity)]
    fn get_record<'py>(
        &self,
        py: Python<'py>,
        key: &str,
    ) -> PyResult<
        Option<(
            Bound<'py, PyBytes>,
            Option<Bound<'py, PyBytes>>,
            Option<RecordArrays>,
        )>,
    > {
        // the pickle is looked up only when the record may have one
        let got = self.inner.get_with_pickle_if(key, schema::may_have_pickle);
        let Some((record, pickle)) = got.py_err()? else {
            return Ok(None);
        };
        let json = PyBytes::new(py, &record);
        let arrays = match schema::RecordOutline::from_json(&record) {
            Ok(outline) => {
                let names: Vec<&str> = outline.arrays.iter().map(|(n, _)| n.as_ref()).collect();
                let names = self.names_tuple(py, &names)?;
                Some(RecordArrays::new(
                    Arc::clone(&self.root),
                    json.clone().unbind(),
                    &record,
                    outline,
                    names,
                ))
            }
            Err(_) => None,
        };
        Ok(Some((json, pickle.map(|p| PyBytes::new(py, &p)), arrays)))
    }

    /// The pickled remainder of `key`, or None.
    fn get_pickle<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let p = self.inner.get_pickle(key).py_err()?;
        Ok(p.map(|p| PyBytes::new(py, &p)))
    }

    /// Whether a record is stored under `key`.
    fn contains(&self, key: &str) -> PyResult<bool> {
        self.inner.contains(key).py_err()
    }

    /// Removes the record of `key` (its payloads go as those of a replaced
    /// record); whether there was one.
    fn delete(&self, key: &str) -> PyResult<bool> {
        self.inner.delete(key).py_err()
    }

    /// Number of records.
    fn __len__(&self) -> PyResult<usize> {
        Ok(self.inner.len().py_err()? as usize)
    }

    /// All keys in Unicode code point order.
    fn keys(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        py.detach(|| self.inner.keys()).py_err()
    }

    /// Keys of the records matching the query `expr` (evaluated in Rust,
    /// without the GIL; every key with None), in key order, as a
    /// `KeyArray`: held packed, no `str` made until one is read.
    fn find(&self, py: Python<'_>, expr: Option<&str>) -> PyResult<KeyArray> {
        let query = expr
            .map(Query::parse)
            .transpose()
            .map_err(lazyvault_store::Error::from)
            .py_err()?;
        let keys = py
            .detach(|| match &query {
                Some(query) => self.inner.find_keys(query),
                None => self.inner.all_keys(),
            })
            .py_err()?;
        Ok(KeyArray::new(keys))
    }

    /// Number of records matching the query `expr`.
    fn count(&self, py: Python<'_>, expr: &str) -> PyResult<u64> {
        let query = Query::parse(expr)
            .map_err(lazyvault_store::Error::from)
            .py_err()?;
        py.detach(|| self.inner.count(&query)).py_err()
    }

    /// The metadata of the records matching `expr` (all with None) as an
    /// Arrow table (`Store::to_arrow`), rows in key order.
    #[pyo3(signature = (expr=None))]
    fn to_arrow(&self, py: Python<'_>, expr: Option<&str>) -> PyResult<ArrowStream> {
        let query = expr
            .map(Query::parse)
            .transpose()
            .map_err(lazyvault_store::Error::from)
            .py_err()?;
        let (schema, batches) = py.detach(|| self.inner.to_arrow(query.as_ref())).py_err()?;
        Ok(ArrowStream::new(schema, batches))
    }

    /// `to_arrow` of the records of `keys` (a `KeyArray`, read in place, or
    /// a sequence of str), in that order (keys the store lacks are left
    /// out).
    fn to_arrow_keys(&self, py: Python<'_>, keys: KeysArg) -> PyResult<ArrowStream> {
        let (schema, batches) = py
            .detach(|| match &keys {
                KeysArg::Packed(a) => self.inner.to_arrow_of_keys(&a.get().keys),
                KeysArg::Strings(_) => self.inner.to_arrow_keys(keys.iter()),
            })
            .py_err()?;
        Ok(ArrowStream::new(schema, batches))
    }

    /// Creates a secondary index on the metadata field `field`.
    fn create_index(&self, py: Python<'_>, field: &str) -> PyResult<()> {
        py.detach(|| self.inner.create_index(field)).py_err()
    }

    /// Removes the secondary index on `field`; whether it existed.
    fn drop_index(&self, py: Python<'_>, field: &str) -> PyResult<bool> {
        py.detach(|| self.inner.drop_index(field)).py_err()
    }

    /// The indexed fields, sorted.
    fn indexes(&self) -> PyResult<Vec<String>> {
        self.inner.indexes().py_err()
    }

    /// How `find(expr)` runs (index lookup or full scan).
    fn explain(&self, expr: &str) -> PyResult<String> {
        let query = Query::parse(expr)
            .map_err(lazyvault_store::Error::from)
            .py_err()?;
        self.inner.explain(&query).py_err()
    }

    /// Makes every change so far durable and commits it (`Store::flush`).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.flush()).py_err()
    }

    /// Flushes, publishes a checkpoint, and releases the snapshot or the
    /// writer role; idempotent, any other call afterwards raises
    /// `ClosedError` (`Store::close`).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.close()).py_err()
    }

    /// Writes a full checkpoint and removes what no reader may still see
    /// (`Store::gc`): `{"removed_files", "removed_bytes",
    /// "journal_bytes_freed"}` (bytes).
    fn gc<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let report = py.detach(|| self.inner.gc()).py_err()?;
        convert::gc_report(py, &report)
    }

    /// Checks the store; `progress(done, total)` (records) is called at most
    /// about ten times a second and once at the end; an exception it raises
    /// (or Ctrl-C) stops the check and propagates.
    #[pyo3(signature = (checksums=true, progress=None))]
    fn verify<'py>(
        &self,
        py: Python<'py>,
        checksums: bool,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut failure: Option<PyErr> = None;
        let mut last = std::time::Instant::now();
        let report = py.detach(|| {
            self.inner.verify_with(checksums, &mut |done, total| {
                if last.elapsed() < std::time::Duration::from_millis(100)
                    && 0 < done
                    && done < total
                {
                    return true;
                }
                last = std::time::Instant::now();
                progress::report(progress.as_ref(), done, total)
                    .map_err(|e| failure = Some(e))
                    .is_ok()
            })
        });
        if let Some(e) = failure {
            return Err(e);
        }
        convert::verify_report(py, &report.py_err()?)
    }

    /// Moves the records of the stores at `sources` into this one in one
    /// batch, their payloads hard-linked under new ids (`Store::merge`);
    /// returns the keys merged. `progress(done, total)` (records) is called
    /// with `(0, total)`, then at most about ten times a second and once at
    /// the end; an exception it raises (or Ctrl-C) stops the merge, nothing
    /// set, and propagates.
    #[pyo3(signature = (sources, progress=None))]
    fn merge(
        &self,
        py: Python<'_>,
        sources: Vec<std::path::PathBuf>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Vec<String>> {
        let mut failure: Option<PyErr> = None;
        let mut last = std::time::Instant::now();
        let merged = py.detach(|| {
            self.inner.merge(&sources, &mut |done, total| {
                if last.elapsed() < std::time::Duration::from_millis(100)
                    && 0 < done
                    && done < total
                {
                    return Ok(());
                }
                last = std::time::Instant::now();
                progress::report(progress.as_ref(), done, total).map_err(|e| {
                    failure = Some(e);
                    lazyvault_store::Error::from(lazyvault_store::UsageError::Cancelled)
                })
            })
        });
        if let Some(e) = failure {
            return Err(e);
        }
        merged.py_err()
    }

    /// Rebuilds the index of the store at `path` from its record journal.
    #[staticmethod]
    fn repair<'py>(py: Python<'py>, path: std::path::PathBuf) -> PyResult<Bound<'py, PyDict>> {
        let report = py.detach(|| Store::repair(&path)).py_err()?;
        convert::repair_report(py, &report)
    }
}
