//! `ArrayEntry`: the entry of one array of a record (FORMAT.md, "Record"),
//! the one shape in which the Python layer hands an array to the core's
//! payload readers (`map_array`, `read_array_bytes` and their
//! `ArchiveCore` methods).

use lazyvault_store::schema;
use pyo3::conversion::FromPyObjectOwned;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

/// One array of a record, as its record JSON describes it
/// ([`schema::ArrayEntry`], whose docs say what each field holds):
/// immutable, compared field by field.
#[pyclass(module = "lazyvault._lazyvault", frozen, eq)]
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayEntry(pub schema::ArrayEntry);

#[pymethods]
impl ArrayEntry {
    /// `ArrayEntry(*, id, descr, dtype, shape, fortran_order, nbytes,
    /// data_offset, pickled=False, checksum=None, pack=None,
    /// pack_offset=None)`: the fields as the record
    /// JSON names them (so a record's entry dict can be passed as it is,
    /// `**entry`; keywords it does not know are ignored, as readers ignore
    /// fields a newer format version adds). Raises `TypeError` for no
    /// keywords, a missing field or a value of the wrong type.
    #[new]
    #[pyo3(signature = (**fields))]
    fn new(fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let Some(fields) = fields else {
            return Err(PyTypeError::new_err(
                "ArrayEntry() takes its fields as keywords",
            ));
        };
        Ok(ArrayEntry(schema::ArrayEntry {
            id: field(fields, "id", None)?,
            descr: field(fields, "descr", None)?,
            dtype: field(fields, "dtype", None)?,
            shape: field(fields, "shape", None)?,
            fortran_order: field(fields, "fortran_order", None)?,
            nbytes: field(fields, "nbytes", None)?,
            data_offset: field(fields, "data_offset", None)?,
            pickled: field(fields, "pickled", Some(false))?,
            checksum: field(fields, "checksum", Some(None))?,
            pack: field(fields, "pack", Some(None))?,
            pack_offset: field(fields, "pack_offset", Some(None))?,
        }))
    }

    /// Payload id: 32 lowercase hex digits.
    #[getter]
    fn id(&self) -> &str {
        &self.0.id
    }

    /// The dtype as the `.npy` header writes it.
    #[getter]
    fn descr(&self) -> &str {
        &self.0.descr
    }

    /// numpy's name of the dtype.
    #[getter]
    fn dtype(&self) -> &str {
        &self.0.dtype
    }

    /// Shape, one length per axis.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.0.shape)
    }

    /// Whether the data is in Fortran order.
    #[getter]
    fn fortran_order(&self) -> bool {
        self.0.fortran_order
    }

    /// Size of the data in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.0.nbytes
    }

    /// Offset of the data in the payload file, in bytes.
    #[getter]
    fn data_offset(&self) -> u64 {
        self.0.data_offset
    }

    /// Whether the payload is the pickle of an `object` array.
    #[getter]
    fn pickled(&self) -> bool {
        self.0.pickled
    }

    /// `"<algorithm>:<hex digest>"` of the data, or `None`.
    #[getter]
    fn checksum(&self) -> Option<&str> {
        self.0.checksum.as_deref()
    }

    /// `ArrayEntry(id='…', descr='<f8', …)`: the constructor call that makes
    /// an equal entry (strings as Python's `repr` writes them).
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let text = |s: &str| -> PyResult<String> { Ok(PyString::new(py, s).repr()?.to_string()) };
        let flag = |b: bool| if b { "True" } else { "False" };
        let e = &self.0;
        let shape: Vec<String> = e.shape.iter().map(u64::to_string).collect();
        let checksum = match &e.checksum {
            Some(c) => text(c)?,
            None => "None".to_owned(),
        };
        // packed payloads only (format 1.4): other entries repr as before
        let pack = match (&e.pack, e.pack_offset) {
            (Some(p), Some(o)) => format!(", pack={}, pack_offset={o}", text(p)?),
            (Some(p), None) => format!(", pack={}", text(p)?),
            (None, Some(o)) => format!(", pack_offset={o}"),
            (None, None) => String::new(),
        };
        Ok(format!(
            "ArrayEntry(id={}, descr={}, dtype={}, shape=({}{}), fortran_order={}, nbytes={}, \
             data_offset={}, pickled={}, checksum={checksum}{pack})",
            text(&e.id)?,
            text(&e.descr)?,
            text(&e.dtype)?,
            shape.join(", "),
            if shape.len() == 1 { "," } else { "" },
            flag(e.fortran_order),
            e.nbytes,
            e.data_offset,
            flag(e.pickled),
        ))
    }
}

/// The keyword `name` of `fields` as a `T`, or `default` when it is absent
/// (`None`: required); `TypeError` naming the field otherwise.
fn field<'py, T: FromPyObjectOwned<'py>>(
    fields: &Bound<'py, PyDict>,
    name: &str,
    default: Option<T>,
) -> PyResult<T>
where
    for<'a> <T as FromPyObject<'a, 'py>>::Error: Into<PyErr>,
{
    let bad =
        |detail: String| PyTypeError::new_err(format!("ArrayEntry(): field `{name}`: {detail}"));
    match (fields.get_item(name)?, default) {
        (Some(value), _) => value
            .extract()
            .map_err(|e| bad(Into::<PyErr>::into(e).to_string())),
        (None, Some(default)) => Ok(default),
        (None, None) => Err(bad("missing".to_owned())),
    }
}
