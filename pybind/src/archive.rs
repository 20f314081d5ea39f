//! `.lvz` archives for Python: `ArchiveCore` (an archive file mapped once,
//! or caller-provided bytes for `lazyvault.loads`), `ArchiveBuffer` (the
//! zero-copy, read-only bytes of one array inside it) and the writers behind
//! `Store.export(".lvz")` and `lazyvault.dumps`.

use std::ffi::c_int;
use std::path::PathBuf;

use lazyvault_store::archive::{self, Archive, ArchiveIndex};
use lazyvault_store::query::Query;
use lazyvault_store::schema;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::arrow::ArrowStream;
use crate::convert::{self, ArrayArg};
use crate::entry::ArrayEntry;
use crate::errors::IntoPy;
use crate::keys::{KeyArray, KeysArg};

/// Where an archive's bytes live.
enum Backing {
    /// A file, memory-mapped read-only.
    File(Archive),
    /// Bytes exported by a Python object (bytes, bytearray, memoryview,
    /// mmap, ndarray...), held (and so kept alive and unresizable) for as
    /// long as this archive lives.
    Buffer {
        buffer: PyUntypedBuffer,
        index: ArchiveIndex,
    },
}

/// A `.lvz` archive opened for reading: its records, and its arrays as
/// zero-copy ranges of its bytes.
#[pyclass(module = "lazyvault._lazyvault", frozen)]
pub struct ArchiveCore {
    backing: Backing,
}

fn buffer_bytes(buffer: &PyUntypedBuffer) -> &[u8] {
    let len = buffer.len_bytes();
    if len == 0 {
        return &[];
    }
    // SAFETY: a C-contiguous buffer (checked in from_buffer) of len bytes,
    // exported for as long as `buffer` lives; the exporter cannot resize or
    // free it while the export is held.
    unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, len) }
}

impl ArchiveCore {
    fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::File(a) => a.bytes(),
            Backing::Buffer { buffer, .. } => buffer_bytes(buffer),
        }
    }

    fn index(&self) -> &ArchiveIndex {
        match &self.backing {
            Backing::File(a) => a.index(),
            Backing::Buffer { index, .. } => index,
        }
    }

    fn record(&self, key: &str) -> Option<&archive::ArchiveRecord> {
        self.index().get(key)
    }

    /// The checked byte range of the array described by `entry`.
    fn range(&self, entry: &schema::ArrayEntry) -> PyResult<std::ops::Range<usize>> {
        // the caller names the record and array (not known here)
        entry
            .check()
            .map_err(|p| lazyvault_store::Error::corrupt("array entry", p))
            .py_err()?;
        self.index().array_range(self.bytes(), entry).py_err()
    }
}

fn parse_query(expr: &str) -> PyResult<Query> {
    Query::parse(expr)
        .map_err(lazyvault_store::Error::from)
        .py_err()
}

#[pymethods]
impl ArchiveCore {
    /// Maps the archive file at `path` and reads its records.
    #[staticmethod]
    fn open(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let archive = py.detach(|| Archive::open(&path)).py_err()?;
        Ok(ArchiveCore {
            backing: Backing::File(archive),
        })
    }

    /// Reads the archive held in `buffer` (any object exporting a
    /// C-contiguous buffer; never written to).
    #[staticmethod]
    fn from_buffer(py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<Self> {
        let buffer = PyUntypedBuffer::get(buffer)?;
        if !buffer.is_c_contiguous() {
            return Err(PyValueError::new_err(
                "loads() needs a contiguous buffer (bytes, bytearray, memoryview, mmap, uint8 array)",
            ));
        }
        let index = {
            let bytes = buffer_bytes(&buffer);
            py.detach(|| ArchiveIndex::parse(bytes, "archive buffer"))
                .py_err()?
        };
        Ok(ArchiveCore {
            backing: Backing::Buffer { buffer, index },
        })
    }

    /// The archive's path (`None` for an archive in a buffer).
    #[getter]
    fn path(&self) -> Option<String> {
        match &self.backing {
            Backing::File(a) => Some(a.path().to_string_lossy().into_owned()),
            Backing::Buffer { .. } => None,
        }
    }

    /// Size of the archive in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.bytes().len()
    }

    /// Keys in archive order.
    fn keys(&self) -> Vec<String> {
        self.index().keys()
    }

    /// Number of records.
    fn __len__(&self) -> usize {
        self.index().len()
    }

    /// Whether the archive has a record under `key`.
    fn contains(&self, key: &str) -> bool {
        self.record(key).is_some()
    }

    /// The record JSON of `key`, or None.
    fn get<'py>(&self, py: Python<'py>, key: &str) -> Option<Bound<'py, PyBytes>> {
        self.record(key).map(|r| PyBytes::new(py, &r.json))
    }

    /// The pickled remainder of `key`, or None.
    fn get_pickle<'py>(&self, py: Python<'py>, key: &str) -> Option<Bound<'py, PyBytes>> {
        self.record(key)
            .and_then(|r| r.pickle.as_deref())
            .map(|p| PyBytes::new(py, p))
    }

    /// Keys of the records matching the query `expr` (every key with
    /// None), in archive order, as a `KeyArray`: held packed, no `str` made
    /// until one is read.
    fn find(&self, py: Python<'_>, expr: Option<&str>) -> PyResult<KeyArray> {
        let query = expr.map(parse_query).transpose()?;
        Ok(KeyArray::new(
            py.detach(|| self.index().find_keys(query.as_ref())),
        ))
    }

    /// Number of records matching the query `expr`.
    fn count(&self, py: Python<'_>, expr: &str) -> PyResult<usize> {
        let query = parse_query(expr)?;
        Ok(py.detach(|| self.index().count(&query)))
    }

    /// The metadata of the records matching `expr` (all with None) as an
    /// Arrow table (`ArchiveIndex::to_arrow`), rows in archive order.
    #[pyo3(signature = (expr=None))]
    fn to_arrow(&self, py: Python<'_>, expr: Option<&str>) -> PyResult<ArrowStream> {
        let query = expr.map(parse_query).transpose()?;
        let (schema, batches) = py
            .detach(|| self.index().to_arrow(query.as_ref()))
            .py_err()?;
        Ok(ArrowStream::new(schema, batches))
    }

    /// `to_arrow` of the records of `keys` (a `KeyArray`, read in place, or
    /// a sequence of str), in that order (keys the archive lacks are left
    /// out).
    fn to_arrow_keys(&self, py: Python<'_>, keys: KeysArg) -> PyResult<ArrowStream> {
        let (schema, batches) = py
            .detach(|| self.index().to_arrow_keys(keys.iter()))
            .py_err()?;
        Ok(ArrowStream::new(schema, batches))
    }

    /// Checks every array of every record against its member (header,
    /// size, alignment): `{"ok", "records", "arrays", "problems"}`.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (records, arrays, problems) = py.detach(|| self.index().verify_report(self.bytes()));
        let d = PyDict::new(py);
        d.set_item("ok", problems.is_empty())?;
        d.set_item("records", records)?;
        d.set_item("arrays", arrays)?;
        d.set_item("problems", problems)?;
        Ok(d)
    }

    /// The data of the array of `entry` (checked against it) as a read-only
    /// buffer viewing the archive's bytes; None for a zero-size array.
    fn map_array(
        slf: Bound<'_, Self>,
        entry: PyRef<'_, ArrayEntry>,
    ) -> PyResult<Option<ArchiveBuffer>> {
        let range = slf.get().range(&entry.0)?;
        if range.is_empty() {
            return Ok(None);
        }
        Ok(Some(ArchiveBuffer {
            owner: slf.unbind(),
            start: range.start,
            len: range.len(),
        }))
    }

    /// The data of the array of `entry` copied into bytes (the pickle of an
    /// `object` array), with the same checks as `map_array`.
    fn read_array_bytes<'py>(
        &self,
        py: Python<'py>,
        entry: PyRef<'_, ArrayEntry>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let entry = &entry.0;
        let range = self.range(entry)?;
        // these bytes are about to be unpickled: check them against the
        // zip's CRC-32 first (a flipped byte can crash numpy's unpickler)
        self.index()
            .check_member_crc(self.bytes(), entry)
            .py_err()?;
        Ok(PyBytes::new(py, &self.bytes()[range]))
    }
}

/// The bytes of one array inside an archive, exported read-only through the
/// buffer protocol; keeps the archive (its map or its source buffer) alive.
#[pyclass(module = "lazyvault._lazyvault", frozen)]
pub struct ArchiveBuffer {
    owner: Py<ArchiveCore>,
    start: usize,
    len: usize,
}

#[pymethods]
impl ArchiveBuffer {
    /// Number of data bytes.
    fn __len__(&self) -> usize {
        self.len
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let bytes = &this.owner.get().bytes()[this.start..this.start + this.len];
        // SAFETY: `view` is the interpreter's; `bytes` lie in the archive
        // that `slf` keeps alive (`owner`), and the view references `slf`.
        unsafe { crate::array::export_read_only(slf.as_any(), bytes, view, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Writes the archive `path` from records of the store at `root`: `items`
/// is a list of `(key, record_json, pickle_or_None)`; payload files are
/// copied as they are (streamed). Temporary file, fsync, verify, rename.
#[pyfunction]
pub fn write_store_archive(
    py: Python<'_>,
    path: PathBuf,
    root: PathBuf,
    items: Vec<(String, Vec<u8>, Option<Vec<u8>>)>,
) -> PyResult<()> {
    py.detach(|| {
        archive::write_archive_file(&path, |w| {
            for (key, json, pickle) in &items {
                w.add_store_record(&root, key, json, pickle.as_deref())?;
            }
            Ok(())
        })
    })
    .py_err()
}

/// One object as a one-record archive in memory (`lazyvault.dumps`): the
/// same arguments as `StoreCore.put`. `force_zip64` writes every payload
/// member with zip64 size fields, as members of 4 GiB or more get (for
/// tests of readers' zip64 path).
#[pyfunction]
#[pyo3(signature = (key, meta_json, layout_json, arrays, pickle=None, force_zip64=false))]
pub fn dumps_archive<'py>(
    py: Python<'py>,
    key: &str,
    meta_json: &str,
    layout_json: &str,
    arrays: Vec<ArrayArg>,
    pickle: Option<&[u8]>,
    force_zip64: bool,
) -> PyResult<Bound<'py, PyBytes>> {
    let meta = convert::meta_from_json(meta_json)?;
    let layout = convert::layout_from_json(layout_json)?;
    let sources: Vec<_> = arrays.iter().map(ArrayArg::as_source).collect();
    // Two passes (size, then bytes) so that the archive is written straight
    // into the bytes object: no second copy of the arrays.
    let fill = |w: &mut archive::ArchiveWriter<archive::MemorySink<'_>>| {
        w.force_zip64(force_zip64);
        w.add_record(key, meta.clone(), layout.clone(), &sources, pickle)
    };
    let size = py.detach(|| archive::archive_size(fill)).py_err()?;
    PyBytes::new_with(py, size, |buf| {
        py.detach(|| archive::write_archive_into(buf, fill))
            .py_err()
    })
}
