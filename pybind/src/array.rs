//! Array payloads as read-only buffers: a memory map for large payloads, an
//! owned copy for small ones (see `lazyvault_store::load_payload`).
//!
//! `MappedBuffer` owns the bytes and exports them through the buffer
//! protocol, read-only: `numpy.frombuffer` builds a plain `ndarray` on it
//! whose `base` keeps them alive, and numpy refuses to make it writeable
//! because the exporter refuses `PyBUF_WRITABLE` (a write into a read-only
//! map would be a segfault, not an exception; a copy stays read-only too,
//! so every array of a record behaves the same).

use std::borrow::Cow;
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use lazyvault_store::schema;
use lazyvault_store::MappedPayload;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::entry::ArrayEntry;
use crate::errors::IntoPy;

/// The data of one `.npy` payload, read-only: copied into a 64-byte aligned
/// buffer when at most `READ_MAX_BYTES` (64 KiB), memory-mapped when larger.
#[pyclass(module = "lazyvault._lazyvault", frozen)]
pub struct MappedBuffer {
    payload: MappedPayload,
}

#[pymethods]
impl MappedBuffer {
    /// Number of data bytes.
    fn __len__(&self) -> usize {
        self.payload.as_bytes().len()
    }

    /// Whether the bytes are a memory map of the payload file (`False`: a
    /// copy in memory).
    #[getter]
    fn mapped(&self) -> bool {
        self.payload.is_mapped()
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let bytes = slf.get().payload.as_bytes();
        // SAFETY: `view` is the interpreter's; `bytes` is owned by the
        // payload of `slf`, which the view references (`obj`) until released.
        unsafe { export_read_only(slf.as_any(), bytes, view, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Fills `view` with a read-only, 1-d, `"B"` buffer over `bytes`, owned by
/// `owner` (which must keep `bytes` alive). Refuses `PyBUF_WRITABLE`: a write
/// from Python into a read-only map would be a segfault, not an exception.
///
/// # Safety
/// `view` comes from the interpreter's `__getbuffer__` call; `bytes` must
/// stay valid while `owner` lives.
pub unsafe fn export_read_only(
    owner: &Bound<'_, PyAny>,
    bytes: &[u8],
    view: *mut ffi::Py_buffer,
    flags: c_int,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("Py_buffer must not be null"));
    }
    if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
        return Err(PyBufferError::new_err(
            "lazyvault arrays are read-only (large ones view a memory map); copy the array to modify it",
        ));
    }
    // PyBuffer_FillInfo sets obj (with a new reference), len, readonly,
    // format "B" and the 1-d shape/strides as the flags ask.
    // SAFETY: `view` is non-null and the caller's contract keeps `bytes`
    // alive while `owner` lives; readonly = 1, so nothing writes through the
    // `*mut` pointer the C signature asks for.
    let rc = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            bytes.as_ptr() as *mut c_void,
            bytes.len() as ffi::Py_ssize_t,
            1,
            flags,
        )
    };
    if rc == -1 {
        return Err(PyErr::fetch(owner.py()));
    }
    Ok(())
}

/// The data of the payload of `entry` in the store at `root`, after checking
/// it against the entry (header, size): read into memory when at most 64 KiB
/// (`lazyvault_store::READ_MAX_BYTES`), memory-mapped when larger. Returns
/// `None` for a zero-size array (nothing to read).
///
/// Raises `CorruptError` for a missing, short or mismatched file.
#[pyfunction]
pub fn map_array<'py>(
    py: Python<'py>,
    root: &str,
    entry: PyRef<'_, ArrayEntry>,
) -> PyResult<Option<Bound<'py, MappedBuffer>>> {
    let entry = &entry.0;
    let payload = py
        .detach(|| lazyvault_store::load_payload(Path::new(root), entry))
        .py_err()?;
    if payload.as_bytes().is_empty() {
        return Ok(None);
    }
    Ok(Some(untracked(Bound::new(py, MappedBuffer { payload })?)))
}

/// `buffer`, left out of the cycle collector's lists: it holds no Python
/// object, so it can be in no reference cycle, and every array of a
/// loader's batch keeps one alive (each collection would walk them all).
fn untracked(buffer: Bound<'_, MappedBuffer>) -> Bound<'_, MappedBuffer> {
    // SAFETY: a live object of a GC type (pyo3 classes are); its dealloc
    // untracks it again, which CPython allows.
    unsafe { pyo3::ffi::PyObject_GC_UnTrack(buffer.as_ptr().cast()) };
    buffer
}

/// The arrays of one record of a store directory (`StoreCore.get_record`):
/// its record JSON, where each array's entry is in it, and the directory
/// its payloads are in, so that reading one array decodes only that
/// array's entry, in Rust, never the record JSON in Python. Immutable.
#[pyclass(module = "lazyvault._lazyvault", frozen)]
pub struct RecordArrays {
    root: Arc<Path>,
    json: Py<PyBytes>,
    names: Py<PyTuple>,
    /// Per array, in stored order: its path (as a range of `json` when it
    /// has no escapes) and the range of its entry in `json`.
    entries: Vec<(EntryName, Range<usize>)>,
}

/// An array path of [`RecordArrays`].
enum EntryName {
    /// The bytes of `json` in this range (a path without escapes).
    In(Range<usize>),
    Owned(String),
}

impl RecordArrays {
    /// The arrays of the record JSON `json` (`bytes`, its content), as its
    /// `outline` says, their payloads under `root`; `names` is the tuple of
    /// the outline's paths.
    pub fn new(
        root: Arc<Path>,
        json: Py<PyBytes>,
        bytes: &[u8],
        outline: schema::RecordOutline<'_>,
        names: Py<PyTuple>,
    ) -> Self {
        let base = bytes.as_ptr() as usize;
        let entries = outline
            .arrays
            .into_iter()
            .map(|(name, range)| {
                let name = match name {
                    Cow::Borrowed(s) => {
                        let start = s.as_ptr() as usize - base;
                        EntryName::In(start..start + s.len())
                    }
                    Cow::Owned(s) => EntryName::Owned(s),
                };
                (name, range)
            })
            .collect();
        RecordArrays {
            root,
            json,
            names,
            entries,
        }
    }

    /// The JSON of the entry of the array at path `name` in `json`.
    fn entry_json<'j>(&self, json: &'j [u8], name: &str) -> Option<&'j [u8]> {
        self.entries.iter().find_map(|(n, range)| {
            let is = match n {
                EntryName::In(r) => &json[r.clone()] == name.as_bytes(),
                EntryName::Owned(s) => s == name,
            };
            is.then(|| &json[range.clone()])
        })
    }
}

#[pymethods]
impl RecordArrays {
    /// The array paths of the record (`"x"`, `"frames/0"`), in stored order:
    /// a tuple of str.
    #[getter]
    fn names(&self, py: Python<'_>) -> Py<PyTuple> {
        self.names.clone_ref(py)
    }

    /// `(data, descr, shape, fortran_order)` of the array at path `name`,
    /// read as [`map_array`] reads it (same checks; `data` a `MappedBuffer`,
    /// `None` for a zero-size array; `descr` the `.npy` descr text, `shape` a
    /// tuple of int); `None` when the record has no such array or it is a
    /// pickled `object` array (read those through `ArrayEntry`). Raises
    /// `CorruptError` for a malformed entry or a missing, short or
    /// mismatched payload.
    #[allow(clippy::type_complexity)]
    fn read<'py>(
        &self,
        py: Python<'py>,
        name: &str,
    ) -> PyResult<
        Option<(
            Option<Bound<'py, MappedBuffer>>,
            Bound<'py, PyString>,
            Bound<'py, PyTuple>,
            bool,
        )>,
    > {
        let Some(json) = self.entry_json(self.json.as_bytes(py), name) else {
            return Ok(None);
        };
        let entry = schema::ArrayEntry::from_json(json)
            .map_err(|e| lazyvault_store::Error::corrupt("record", e))
            .py_err()?;
        if entry.pickled {
            return Ok(None);
        }
        let payload = py
            .detach(|| lazyvault_store::load_payload(&self.root, &entry))
            .py_err()?;
        let data = if payload.as_bytes().is_empty() {
            None
        } else {
            Some(untracked(Bound::new(py, MappedBuffer { payload })?))
        };
        Ok(Some((
            data,
            PyString::new(py, &entry.descr),
            PyTuple::new(py, &entry.shape)?,
            entry.fortran_order,
        )))
    }
}

/// What to say of the missing payload file of `entry`, an array of the
/// record `key` of the store at `root` as some handle read it: damage when
/// the store's latest commit still references it, else a record read before
/// it was overwritten or deleted (see `Store::missing_payload_hint`). Opens
/// no payload; for error messages.
#[pyfunction]
pub fn missing_payload_hint(
    py: Python<'_>,
    root: &str,
    key: &str,
    entry: PyRef<'_, ArrayEntry>,
) -> String {
    let entry = &entry.0;
    py.detach(|| lazyvault_store::Store::missing_payload_hint(Path::new(root), key, entry))
}

/// Reads the data of the payload of `entry` (the pickle of an `object`
/// array) as bytes, with the same checks as [`map_array`].
#[pyfunction]
pub fn read_array_bytes<'py>(
    py: Python<'py>,
    root: &str,
    entry: PyRef<'_, ArrayEntry>,
) -> PyResult<Bound<'py, PyBytes>> {
    let entry = &entry.0;
    let data = py
        .detach(|| lazyvault_store::read_payload(Path::new(root), entry))
        .py_err()?;
    Ok(PyBytes::new(py, &data))
}

/// The complete `.npy` header (magic to `'\n'`, a multiple of 64 bytes long)
/// that numpy writes for an array of `descr` (Python-literal text), order and
/// `shape`: version 1.0, or 3.0 when the descr needs characters outside
/// latin-1 (NEP 1). Raises `ValueError` for a descr that does not parse or a
/// header over numpy's default 10,000-byte read limit.
#[pyfunction]
pub fn npy_header<'py>(
    py: Python<'py>,
    descr: &str,
    fortran_order: bool,
    shape: Vec<u64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let header = lazyvault_store::npy::write_header(descr, fortran_order, &shape)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    Ok(PyBytes::new(py, &header))
}

/// The value of `.npy` descr text (`lazyvault_store::npy::parse_descr`), as
/// `ast.literal_eval` would make it and `numpy.lib.format.descr_to_dtype`
/// takes it: a type string, a list of `(name, descr)` or
/// `(name, descr, shape)` tuples (a name a string or a `(title, name)`
/// tuple), or a `(descr, shape)` pair for a subarray dtype; a shape is an
/// int or a tuple of ints. Raises `ValueError` for text that is not a descr.
#[pyfunction]
pub fn parse_descr<'py>(py: Python<'py>, descr: &str) -> PyResult<Bound<'py, PyAny>> {
    let value = lazyvault_store::npy::parse_descr(descr)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    descr_object(py, &value)
}

/// The Python object of a parsed descr (see [`parse_descr`]).
fn descr_object<'py>(
    py: Python<'py>,
    descr: &lazyvault_store::npy::Descr,
) -> PyResult<Bound<'py, PyAny>> {
    use lazyvault_store::npy::{Descr, SubarrayShape};
    let shape_object = |shape: &SubarrayShape| -> PyResult<Bound<'py, PyAny>> {
        Ok(match shape {
            SubarrayShape::Int(n) => n.into_pyobject(py)?.into_any(),
            SubarrayShape::Tuple(dims) => PyTuple::new(py, dims)?.into_any(),
        })
    };
    let fields = match descr {
        Descr::Type(s) => return Ok(PyString::new(py, s).into_any()),
        Descr::Subarray(base, shape) => {
            let items = [descr_object(py, base)?, shape_object(shape)?];
            return Ok(PyTuple::new(py, items)?.into_any());
        }
        Descr::Fields(fields) => fields,
    };
    let list = PyList::empty(py);
    for field in fields {
        let name = match &field.title {
            Some(title) => (title, &field.name).into_pyobject(py)?.into_any(),
            None => PyString::new(py, &field.name).into_any(),
        };
        let mut items = vec![name, descr_object(py, &field.descr)?];
        if let Some(shape) = &field.shape {
            items.push(shape_object(shape)?);
        }
        list.append(PyTuple::new(py, items)?)?;
    }
    Ok(list.into_any())
}
