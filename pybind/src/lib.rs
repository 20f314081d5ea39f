//! `lazyvault._lazyvault`: the compiled half of the Python package. This file
//! only registers; each concept lives in its own module, and every
//! conversion between Rust and Python values happens in `convert.rs`.

use pyo3::prelude::*;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod archive;
mod array;
mod arrow;
mod convert;
mod encode;
mod entry;
mod errors;
mod export;
mod interop;
mod keys;
mod progress;
mod store;

#[pymodule]
fn _lazyvault(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::add_classes(m)?;
    m.add_class::<store::StoreCore>()?;
    m.add_class::<entry::ArrayEntry>()?;
    m.add_class::<array::MappedBuffer>()?;
    m.add_class::<array::RecordArrays>()?;
    m.add_class::<archive::ArchiveCore>()?;
    m.add_class::<archive::ArchiveBuffer>()?;
    m.add_class::<arrow::ArrowStream>()?;
    m.add_class::<encode::Encoded>()?;
    m.add_function(wrap_pyfunction!(encode::encode_flat, m)?)?;
    m.add_class::<keys::KeyArray>()?;
    // a Sequence for isinstance checks (and typing), as list and tuple are
    pyo3::types::PySequence::register::<keys::KeyArray>(m.py())?;
    m.add_function(wrap_pyfunction!(arrow::_arrow_example, m)?)?;
    m.add_function(wrap_pyfunction!(archive::write_store_archive, m)?)?;
    m.add_function(wrap_pyfunction!(archive::dumps_archive, m)?)?;
    m.add_function(wrap_pyfunction!(array::map_array, m)?)?;
    m.add_function(wrap_pyfunction!(array::read_array_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(array::missing_payload_hint, m)?)?;
    m.add_function(wrap_pyfunction!(array::npy_header, m)?)?;
    m.add_function(wrap_pyfunction!(array::parse_descr, m)?)?;
    m.add_function(wrap_pyfunction!(store::check_query, m)?)?;
    m.add_function(wrap_pyfunction!(interop::import_files, m)?)?;
    m.add_function(wrap_pyfunction!(interop::detect_format, m)?)?;
    m.add_function(wrap_pyfunction!(interop::npz_has_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(interop::read_safetensors_header, m)?)?;
    m.add_function(wrap_pyfunction!(interop::parse_npy_header, m)?)?;
    m.add(
        "SAFETENSORS_MAX_HEADER",
        lazyvault_store::interop::safetensors::SAFETENSORS_MAX_HEADER,
    )?;
    m.add(
        "DEFAULT_MAX_DEFLATE_RATIO",
        lazyvault_store::interop::DEFAULT_MAX_DEFLATE_RATIO,
    )?;
    m.add(
        "NPY_MAX_HEADER_SIZE",
        lazyvault_store::interop::DEFAULT_MAX_HEADER_SIZE,
    )?;
    m.add_function(wrap_pyfunction!(export::export_npz, m)?)?;
    m.add_function(wrap_pyfunction!(export::export_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(export::npz_member_name, m)?)?;
    m.add(
        "FORMAT_VERSION",
        lazyvault_store::schema::FORMAT_VERSION.to_string(),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
