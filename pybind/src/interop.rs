//! Importing `.npy`, `.npz`, `.safetensors` and `.lvz` files: the engine's
//! `lazyvault_store::interop` for the Python layer (`lazyvault._interop`),
//! which keeps only the glue (directories, default keys, argument checks,
//! progress bars).

use std::path::PathBuf;
use std::sync::Mutex;

use lazyvault_store::interop::{
    self, safetensors, ImportHooks, ImportOptions, ImportSource, PickledArray,
    DEFAULT_MAX_DEFLATE_RATIO, DEFAULT_MAX_HEADER_SIZE,
};
use lazyvault_store::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::errors::IntoPy;
use crate::progress;
use crate::store::StoreCore;

/// `"npy"`, `"npz"`, `"safetensors"` or `"lvz"`: the format of the file at
/// `path`, from its content. Raises `UnknownFormatError`,
/// `InvalidFileError` (a safetensors length past the end), `StorageError`.
#[pyfunction]
pub fn detect_format(py: Python<'_>, path: PathBuf) -> PyResult<&'static str> {
    py.detach(|| interop::detect_format(&path))
        .map(interop::Format::name)
        .py_err()
}

/// Whether the zip at `path` holds lazyvault's npz manifest (its records
/// then carry their own keys). Raises `InvalidFileError` for an unreadable
/// zip.
#[pyfunction]
pub fn npz_has_manifest(py: Python<'_>, path: PathBuf) -> PyResult<bool> {
    py.detach(|| interop::npz::has_manifest(&path)).py_err()
}

/// `(__metadata__ or None, [{"name", "dtype", "shape", "data_offsets"}],
/// data section offset)` of the safetensors file at `path`, every entry
/// checked; reads the header only. Raises `InvalidFileError`.
#[pyfunction]
pub fn read_safetensors_header<'py>(
    py: Python<'py>,
    path: PathBuf,
) -> PyResult<(Option<Bound<'py, PyDict>>, Bound<'py, PyList>, u64)> {
    let header = py
        .detach(|| safetensors::read_file_header(&path))
        .py_err()?;
    let metadata = match &header.metadata {
        None => None,
        Some(m) => {
            let d = PyDict::new(py);
            for (k, v) in m {
                d.set_item(k, v)?;
            }
            Some(d)
        }
    };
    let tensors = PyList::empty(py);
    for t in &header.tensors {
        let d = PyDict::new(py);
        d.set_item("name", &t.name)?;
        d.set_item("dtype", &t.tag)?;
        d.set_item("shape", &t.shape)?;
        d.set_item("data_offsets", (t.begin, t.end))?;
        tensors.append(d)?;
    }
    Ok((metadata, tensors, header.data_start))
}

/// `(version, descr, fortran_order, shape, data offset)`.
type NpyHeaderTuple = ((u8, u8), String, bool, Vec<u64>, u64);

/// What `repickle` returns: `(descr, dtype_name, shape, fortran_order,
/// pickle)`.
type PickleArgs = (String, String, Vec<u64>, bool, Vec<u8>);

fn lock(m: &Mutex<Raised>) -> std::sync::MutexGuard<'_, Raised> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `(version, descr, fortran_order, shape, data offset)` of the `.npy`
/// header at the start of `data` (the file or member `what`), with the
/// engine's parser; the header text at most `max_header_size` bytes.
/// Raises `InvalidFileError` naming `what`.
#[pyfunction]
#[pyo3(signature = (data, what, max_header_size=None))]
pub fn parse_npy_header(
    data: &[u8],
    what: &str,
    max_header_size: Option<usize>,
) -> PyResult<NpyHeaderTuple> {
    let limit = max_header_size.unwrap_or(DEFAULT_MAX_HEADER_SIZE);
    let h = interop::npy::parse_header(data, limit, what).py_err()?;
    Ok((h.version, h.descr, h.fortran_order, h.shape, h.data_offset))
}

/// The Python exception a callback raised, kept while the import unwinds.
#[derive(Default)]
struct Raised(Option<PyErr>);

impl Raised {
    /// Keeps `e` and returns the error that stops the import.
    fn keep(&mut self, e: PyErr) -> Error {
        self.0 = Some(e);
        Error::from(lazyvault_store::UsageError::Cancelled)
    }
}

/// Gives an `InvalidFileError` that `repickle` raised about `what` (a file
/// and member) that `what` and the `path` of that file, as the core's own
/// errors have them.
fn name_the_file(
    py: Python<'_>,
    e: &PyErr,
    what: &str,
    files: &[(PathBuf, Option<String>, String)],
) {
    let value = e.value(py);
    let Ok(class) = crate::errors::INVALID_FILE_ERROR.get(py) else {
        return;
    };
    if !value.is_instance(class).unwrap_or(false) {
        return;
    }
    // best effort: the exception raised matters more than its attributes
    if value.getattr("what").is_ok_and(|w| w.is_none()) {
        let _ = value.setattr("what", what);
    }
    if !value.getattr("path").is_ok_and(|p| p.is_none()) {
        return;
    }
    let file = files
        .iter()
        .map(|(path, ..)| path.display().to_string())
        .filter(|shown| what.starts_with(shown.as_str()))
        .max_by_key(String::len);
    if let Some(file) = file {
        let _ = value.setattr("path", file);
    }
}

/// Imports every file of `files`, `[(path, key or None, default key)]`,
/// into `store` as one commit, all checked before any array is written
/// (`lazyvault_store::interop::import_files`); returns the keys written.
/// `progress(done, total)` counts arrays over all the files, from
/// `(0, total)`; `repickle(what, data)` turns the pickle of an object array
/// read from a `.npy`/`.npz` into `(descr, dtype_name, shape,
/// fortran_order, pickle)` for the store. Exceptions they raise propagate
/// (the store is then unchanged). Raises `InvalidFileError` (with `path`),
/// `UnknownFormatError`, `InteropError`, `PickleNotAllowedError`,
/// `StorageError` (a `FileNotFoundError` for a missing file).
#[pyfunction]
#[pyo3(signature = (
    store, files, *, allow_pickle=false, max_header_size=None,
    max_deflate_ratio=None, progress=None, repickle=None
))]
#[allow(clippy::too_many_arguments)]
pub fn import_files(
    py: Python<'_>,
    store: &StoreCore,
    files: Vec<(PathBuf, Option<String>, String)>,
    allow_pickle: bool,
    max_header_size: Option<usize>,
    max_deflate_ratio: Option<u64>,
    progress: Option<Py<PyAny>>,
    repickle: Option<Py<PyAny>>,
) -> PyResult<Vec<String>> {
    let options = ImportOptions {
        allow_pickle,
        max_header_size: max_header_size.unwrap_or(DEFAULT_MAX_HEADER_SIZE),
        max_deflate_ratio: max_deflate_ratio.unwrap_or(DEFAULT_MAX_DEFLATE_RATIO),
    };
    let raised = Mutex::new(Raised::default());
    // The callbacks are made inside the detached closure (they are not
    // Send); each takes the GIL back for its call.
    let result = py.detach(|| {
        let mut on_progress = |done: u64, total: u64| -> bool {
            progress::report(progress.as_ref(), done, total)
                .map_err(|e| lock(&raised).keep(e))
                .is_ok()
        };
        let mut on_pickle = |what: &str, data: Vec<u8>| -> lazyvault_store::Result<PickledArray> {
            Python::attach(|py| {
                let cb = repickle.as_ref().expect("set when called");
                let called = cb
                    .call1(py, (what, PyBytes::new(py, &data)))
                    .and_then(|r| r.extract::<PickleArgs>(py));
                match called {
                    Ok((descr, dtype, shape, fortran_order, data)) => Ok(PickledArray {
                        descr,
                        dtype,
                        shape,
                        fortran_order,
                        data,
                    }),
                    Err(e) => {
                        name_the_file(py, &e, what, &files);
                        Err(lock(&raised).keep(e))
                    }
                }
            })
        };
        let mut hooks = ImportHooks {
            progress: Some(&mut on_progress),
            repickle: None,
        };
        if repickle.is_some() {
            hooks.repickle = Some(&mut on_pickle);
        }
        let sources: Vec<ImportSource<'_>> = files
            .iter()
            .map(|(path, key, default_key)| ImportSource {
                path,
                key: key.as_deref(),
                default_key,
            })
            .collect();
        interop::import_files(&store.inner, &sources, &options, &mut hooks)
    });
    if let Some(e) = lock(&raised).0.take() {
        return Err(e);
    }
    result.py_err()
}
