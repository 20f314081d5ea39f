//! Conversions between Python values and the engine's types, in one place.

use lazyvault_store::{ArraySource, GcReport, JsonText, JsonTextError, RepairReport, VerifyReport};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use serde_json::{Map, Value};

/// One array handed over by the Python layer for writing:
/// `(name, descr, dtype_name, shape, fortran_order, data, pickled)` where
/// `data` is a C-contiguous byte buffer (a `uint8` view of the array, or the
/// pickle of an `object` array).
pub struct ArrayArg {
    name: String,
    descr: String,
    dtype: String,
    shape: Vec<u64>,
    fortran_order: bool,
    data: PyBuffer<u8>,
    pickled: bool,
}

impl<'a, 'py> FromPyObject<'a, 'py> for ArrayArg {
    type Error = PyErr;
    fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let t = ob.cast::<PyTuple>()?;
        let (name, descr, dtype, shape, fortran_order, data, pickled): (
            String,
            String,
            String,
            Vec<u64>,
            bool,
            Bound<'py, PyAny>,
            bool,
        ) = t.extract()?;
        let data = PyBuffer::<u8>::get(&data)?;
        if !data.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "array {name:?}: data buffer must be C-contiguous bytes"
            )));
        }
        Ok(ArrayArg {
            name,
            descr,
            dtype,
            shape,
            fortran_order,
            data,
            pickled,
        })
    }
}

impl ArrayArg {
    /// Borrows the buffer as an engine `ArraySource`. The buffer stays
    /// exported (and its owner alive) for as long as `self` lives.
    pub fn as_source(&self) -> ArraySource<'_> {
        // SAFETY: a C-contiguous buffer of len_bytes() bytes, held by self.
        let data = unsafe {
            std::slice::from_raw_parts(self.data.buf_ptr() as *const u8, self.data.len_bytes())
        };
        ArraySource {
            name: self.name.clone(),
            descr: self.descr.clone(),
            dtype: self.dtype.clone(),
            shape: self.shape.clone(),
            fortran_order: self.fortran_order,
            data,
            pickled: self.pickled,
        }
    }
}

/// Parses the JSON object of a record's metadata.
pub fn meta_from_json(text: &str) -> PyResult<Map<String, Value>> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(PyTypeError::new_err("metadata must be a JSON object")),
        Err(e) => Err(PyValueError::new_err(format!("metadata is not JSON: {e}"))),
    }
}

/// Checks and compacts the JSON object of a record's metadata, with the
/// errors of [`meta_from_json`].
pub fn meta_json_text(text: &str) -> PyResult<JsonText> {
    JsonText::object(text).map_err(|e| match e {
        JsonTextError::NotObject => PyTypeError::new_err("metadata must be a JSON object"),
        e @ JsonTextError::NotJson(_) => PyValueError::new_err(format!("metadata is {e}")),
    })
}

/// Checks and compacts the layout JSON, with the error of
/// [`layout_from_json`].
pub fn layout_json_text(text: &str) -> PyResult<JsonText> {
    JsonText::value(text).map_err(|e| PyValueError::new_err(format!("layout is {e}")))
}

/// Parses the layout JSON.
pub fn layout_from_json(text: &str) -> PyResult<Value> {
    serde_json::from_str(text)
        .map_err(|e| PyValueError::new_err(format!("layout is not JSON: {e}")))
}

/// `gc()` report as a dict.
pub fn gc_report<'py>(py: Python<'py>, r: &GcReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("removed_files", r.removed_files)?;
    d.set_item("removed_bytes", r.removed_bytes)?;
    d.set_item("journal_bytes_freed", r.journal_bytes_freed)?;
    d.set_item("packs_compacted", r.packs_compacted)?;
    d.set_item("packs_damaged", r.packs_damaged)?;
    Ok(d)
}

/// `verify()` report as a dict.
pub fn verify_report<'py>(py: Python<'py>, r: &VerifyReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("ok", r.is_ok())?;
    d.set_item("records", r.records)?;
    d.set_item("arrays", r.arrays)?;
    d.set_item("checksummed", r.checksummed)?;
    d.set_item("checksum_mismatches", r.checksum_mismatches)?;
    d.set_item("problems", &r.problems)?;
    let orphans: Vec<String> = r
        .orphans
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    d.set_item("orphans", orphans)?;
    Ok(d)
}

/// `repair()` report as a dict.
pub fn repair_report<'py>(py: Python<'py>, r: &RepairReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("records", r.records)?;
    d.set_item("entries", r.entries)?;
    d.set_item("skipped", &r.skipped)?;
    d.set_item("indexes", &r.indexes)?;
    d.set_item(
        "moved_index",
        r.moved_index
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned()),
    )?;
    Ok(d)
}
