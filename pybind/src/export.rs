//! `Store.export` to `.npz` and `.safetensors`: thin wrappers of the core's
//! writers (`lazyvault_store::interop::export`), which run without the GIL;
//! the progress callback (and Ctrl-C) is served from inside them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lazyvault_store::interop::export::{npz, safetensors, ZipLimits};
use lazyvault_store::Error;
use pyo3::prelude::*;

use crate::errors::IntoPy;
use crate::progress;
use crate::store::StoreCore;

/// How often Ctrl-C is checked when no callback is given.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// Runs `export` without the GIL, calling `progress(done, total)` (when
/// given) at every step and checking for Ctrl-C; an exception from either
/// stops the export (which then leaves nothing behind) and is raised.
fn with_progress(
    py: Python<'_>,
    progress: Option<Py<PyAny>>,
    export: impl FnOnce(
            &mut dyn FnMut(u64, u64) -> lazyvault_store::Result<()>,
        ) -> lazyvault_store::Result<()>
        + Send,
) -> PyResult<()> {
    let mut failure: Option<PyErr> = None;
    let mut last = Instant::now();
    let result = py.detach(|| {
        export(&mut |done, total| {
            if progress.is_none() && last.elapsed() < SIGNAL_CHECK {
                return Ok(());
            }
            last = Instant::now();
            progress::report(progress.as_ref(), done, total).map_err(|e| {
                failure = Some(e);
                Error::from(lazyvault_store::UsageError::Cancelled)
            })
        })
    });
    if let Some(e) = failure {
        return Err(e);
    }
    result.py_err()
}

/// Writes the records `keys` of `store` (in that order) to a new `.npz` at
/// `path` (temporary file, fsync, rename). `progress(done, total)` counts
/// arrays. `zip64_limits=(size, count)` lowers the sizes and member count
/// past which zip64 fields are written (tests of readers' zip64 path).
#[pyfunction]
#[pyo3(signature = (store, path, keys, progress=None, zip64_limits=None))]
pub fn export_npz(
    py: Python<'_>,
    store: &Bound<'_, StoreCore>,
    path: PathBuf,
    keys: Vec<String>,
    progress: Option<Py<PyAny>>,
    zip64_limits: Option<(u64, u64)>,
) -> PyResult<()> {
    let store = store.get().store();
    let limits = match zip64_limits {
        Some((size, count)) => ZipLimits { size, count },
        None => ZipLimits::default(),
    };
    with_progress(py, progress, |report| {
        npz::export_npz(store, &path, &keys, limits, report)
    })
}

/// Writes the records `keys` of `store` (in that order) to a new
/// `.safetensors` file at `path` (temporary file, fsync, rename).
/// `progress(done, total)` counts tensors.
#[pyfunction]
#[pyo3(signature = (store, path, keys, progress=None))]
pub fn export_safetensors(
    py: Python<'_>,
    store: &Bound<'_, StoreCore>,
    path: PathBuf,
    keys: Vec<String>,
    progress: Option<Py<PyAny>>,
) -> PyResult<()> {
    let store = store.get().store();
    with_progress(py, progress, |report| {
        safetensors::export_safetensors(store, &path, &keys, report)
    })
}

/// The `.npz` member name (without `.npy`) of array `array_path` of record
/// `key`: `<key>/<array path>` with every segment made safe.
#[pyfunction]
pub fn npz_member_name(key: &str, array_path: &str) -> String {
    npz::member_name(key, array_path)
}
