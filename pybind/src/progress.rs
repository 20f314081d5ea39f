//! Progress callbacks of the core's long operations (verify, import,
//! export), which run without the GIL and report from their own thread.

use pyo3::prelude::*;

/// Takes the GIL back to check for Ctrl-C, then calls `progress(done,
/// total)` when given; returns the exception either raised (the caller keeps
/// it and stops the operation).
pub fn report(progress: Option<&Py<PyAny>>, done: u64, total: u64) -> PyResult<()> {
    Python::attach(|py| {
        py.check_signals()?;
        if let Some(cb) = progress {
            cb.call1(py, (done, total))?;
        }
        Ok(())
    })
}
