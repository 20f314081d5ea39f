//! `lazyvault._lazyvault`: the compiled half of the Python package. This file
//! only registers; each concept lives in its own module, and every
//! conversion between Rust and Python values happens in `convert.rs`.

use pyo3::prelude::*;

mod archive;
mod array;
mod convert;
mod errors;
mod store;

#[pymodule]
fn _lazyvault(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::add_classes(m)?;
    m.add_class::<store::StoreCore>()?;
    m.add_class::<array::MappedBuffer>()?;
    m.add_class::<archive::ArchiveCore>()?;
    m.add_class::<archive::ArchiveBuffer>()?;
    m.add_function(wrap_pyfunction!(archive::write_store_archive, m)?)?;
    m.add_function(wrap_pyfunction!(archive::dumps_archive, m)?)?;
    m.add_function(wrap_pyfunction!(array::map_array, m)?)?;
    m.add_function(wrap_pyfunction!(array::read_array_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(array::npy_header, m)?)?;
    m.add_function(wrap_pyfunction!(store::check_query, m)?)?;
    m.add(
        "FORMAT_VERSION",
        lazyvault_store::schema::FORMAT_VERSION.to_string(),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
