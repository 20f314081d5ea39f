//! The common object, a `dict` of JSON scalars, datetimes and plain numpy
//! arrays, split in Rust ([`encode_flat`]): what the Python layer's
//! `_layout.encode` gives for it, without a Python step per value. Anything
//! else (nested containers, numpy scalars, arrays of other dtypes or
//! layouts, lone surrogates...) returns `None` and takes the Python walk,
//! which stays the one definition: tests check that both give the same
//! record, value for value and byte for byte.

use std::collections::HashSet;
use std::fmt::Write as _;

use lazyvault_store::interop::export::pyjson;
use lazyvault_store::{ArraySource, JsonText};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString, PyType};

/// One array of an [`Encoded`] record: a C-contiguous buffer of a plain
/// numeric dtype.
struct FlatArray {
    name: String,
    descr: &'static str,
    dtype: &'static str,
    shape: Vec<u64>,
    data: PyUntypedBuffer,
}

/// A record split in Rust by [`encode_flat`]: its metadata and layout as
/// compact JSON text, and its arrays (held exported: their buffers stay
/// valid and unresized while this object lives). `put_many` takes it in
/// place of `(meta_json, layout_json, arrays, pickle)`.
#[pyclass(module = "lazyvault._lazyvault", frozen)]
pub struct Encoded {
    meta: JsonText,
    layout: JsonText,
    arrays: Vec<FlatArray>,
    nbytes: usize,
}

#[pymethods]
impl Encoded {
    /// The metadata, a compact JSON object (FORMAT.md, "Meta").
    #[getter]
    fn meta_json(&self) -> &str {
        self.meta.as_str()
    }

    /// The layout, compact JSON (FORMAT.md, "Layout").
    #[getter]
    fn layout_json(&self) -> &str {
        self.layout.as_str()
    }

    /// `(name, descr, dtype_name, shape, fortran_order)` of each array, in
    /// the dict's order.
    #[getter]
    fn arrays(&self) -> Vec<(String, &'static str, &'static str, Vec<u64>, bool)> {
        self.arrays
            .iter()
            .map(|a| (a.name.clone(), a.descr, a.dtype, a.shape.clone(), false))
            .collect()
    }

    /// The bytes of all its arrays.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }
}

impl Encoded {
    /// The metadata JSON.
    pub fn meta(&self) -> &JsonText {
        &self.meta
    }

    /// The layout JSON.
    pub fn layout(&self) -> &JsonText {
        &self.layout
    }

    /// The arrays as the engine writes them.
    pub fn sources(&self) -> Vec<ArraySource<'_>> {
        self.arrays
            .iter()
            .map(|a| ArraySource {
                name: a.name.clone(),
                descr: a.descr.to_owned(),
                dtype: a.dtype.to_owned(),
                shape: a.shape.clone(),
                fortran_order: false,
                // SAFETY: a C-contiguous buffer of len_bytes() bytes, kept
                // exported by self (checked in encode_flat).
                data: unsafe {
                    std::slice::from_raw_parts(a.data.buf_ptr() as *const u8, a.data.len_bytes())
                },
                pickled: false,
            })
            .collect()
    }
}

/// The types the encoder recognizes by identity (exact type, as the
/// Python fast path does: subclasses take the generic walk).
struct Types {
    datetime: Py<PyType>,
    date: Py<PyType>,
    utc: Py<PyAny>,
    ndarray: Py<PyType>,
    memmap: Py<PyType>,
}

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

fn types(py: Python<'_>) -> PyResult<&Types> {
    TYPES.get_or_try_init(py, || {
        let datetime = py.import("datetime")?;
        let numpy = py.import("numpy")?;
        Ok(Types {
            datetime: datetime
                .getattr("datetime")?
                .cast_into::<PyType>()?
                .unbind(),
            date: datetime.getattr("date")?.cast_into::<PyType>()?.unbind(),
            utc: datetime.getattr("timezone")?.getattr("utc")?.unbind(),
            ndarray: numpy.getattr("ndarray")?.cast_into::<PyType>()?.unbind(),
            memmap: numpy.getattr("memmap")?.cast_into::<PyType>()?.unbind(),
        })
    })
}

/// `obj` split as `_layout.encode` splits it, or `None` when it is not a
/// `dict` the Rust encoder covers (the caller then takes the Python walk).
/// Covered: `str` keys (not empty, no lone surrogate) whose values are
/// `None`, `bool`, `int` in [-2^63, 2^64), `float`, `str`, naive or UTC
/// `datetime.datetime`, `datetime.date`, and `numpy.ndarray`/`memmap`
/// objects (each once) of a native-order bool, integer, float16/32/64 or
/// complex64/128 dtype, C-contiguous.
///
/// # Errors
/// Only a failing `numpy` or `datetime` import.
#[pyfunction]
pub fn encode_flat(obj: &Bound<'_, PyAny>) -> PyResult<Option<Encoded>> {
    let py = obj.py();
    let Ok(dict) = obj.cast_exact::<PyDict>() else {
        return Ok(None);
    };
    if !cfg!(target_endian = "little") {
        return Ok(None); // the dtype table below names little-endian descrs
    }
    let t = types(py)?;
    let mut meta = String::with_capacity(128);
    let mut names: Vec<Bound<'_, PyString>> = Vec::with_capacity(dict.len());
    let mut arrays: Vec<FlatArray> = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new();
    let (mut fields, mut first_field) = (0usize, None::<String>);
    let mut interleaved = false;
    let mut nbytes = 0usize;
    meta.push('{');
    for (k, v) in dict.iter() {
        let Ok(k) = k.cast_into_exact::<PyString>() else {
            return Ok(None);
        };
        let Ok(key) = k.to_str() else {
            return Ok(None); // lone surrogates: the Python walk says why
        };
        if key.is_empty() {
            return Ok(None);
        }
        let ty = v.get_type();
        if ty.is(t.ndarray.bind(py)) || ty.is(t.memmap.bind(py)) {
            if !seen.insert(v.as_ptr() as usize) {
                return Ok(None); // one array under two names: the full layout
            }
            let Some(array) = flat_array(key, &v)? else {
                return Ok(None);
            };
            nbytes += array.data.len_bytes();
            arrays.push(array);
            names.push(k);
            continue;
        }
        if fields > 0 {
            meta.push(',');
        }
        write_json_str(&mut meta, key);
        meta.push(':');
        if !write_value(&mut meta, &v, t)? {
            return Ok(None);
        }
        if fields == 0 {
            first_field = Some(key.to_owned());
        }
        fields += 1;
        interleaved |= !arrays.is_empty();
        names.push(k);
    }
    meta.push('}');
    if fields == 1 && first_field.is_some_and(|f| f.starts_with('$')) {
        // a lone "$..." key would read as a tagged value: wrap it (FORMAT.md, "Meta")
        meta = format!("{{\"$dict\":{meta}}}");
    }
    let layout = if interleaved {
        let mut l = String::from("{\"fields\":[");
        for (i, n) in names.iter().enumerate() {
            if i > 0 {
                l.push(',');
            }
            write_json_str(&mut l, n.to_str()?);
        }
        l.push_str("]}");
        l
    } else {
        "{\"fields\":null}".to_owned()
    };
    Ok(Some(Encoded {
        meta: JsonText::trusted(meta),
        layout: JsonText::trusted(layout),
        arrays,
        nbytes,
    }))
}

/// Writes the JSON of one metadata value; `false` for a value the encoder
/// does not cover.
fn write_value(out: &mut String, v: &Bound<'_, PyAny>, t: &Types) -> PyResult<bool> {
    let py = v.py();
    if v.is_none() {
        out.push_str("null");
    } else if v.is_exact_instance_of::<PyBool>() {
        out.push_str(if v.is_truthy()? { "true" } else { "false" });
    } else if v.is_exact_instance_of::<PyString>() {
        let Ok(s) = v.cast::<PyString>()?.to_str() else {
            return Ok(false);
        };
        write_json_str(out, s);
    } else if v.is_exact_instance_of::<PyFloat>() {
        let x = v.cast::<PyFloat>()?.value();
        if x.is_finite() && !pyjson::shortest_is_unique(x) {
            // two strings as short read back as x: Python's repr says which
            out.push_str(v.repr()?.to_str()?);
        } else if x.is_finite() {
            pyjson::push_float(out, x);
        } else {
            // Python's repr: the tag FORMAT.md names for non-finite floats
            let text = if x.is_nan() {
                "nan"
            } else if x > 0.0 {
                "inf"
            } else {
                "-inf"
            };
            let _ = write!(out, "{{\"$float\":\"{text}\"}}");
        }
    } else if v.is_exact_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            let _ = write!(out, "{i}");
        } else if let Ok(u) = v.extract::<u64>() {
            let _ = write!(out, "{u}");
        } else {
            return Ok(false); // the {"$int": ...} tag: the Python walk
        }
    } else {
        let ty = v.get_type();
        if ty.is(t.datetime.bind(py)) {
            return write_datetime(out, v, t);
        }
        if ty.is(t.date.bind(py)) {
            let (y, m, d) = ymd(v)?;
            let _ = write!(out, "{{\"$date\":\"{y:04}-{m:02}-{d:02}\"}}");
            return Ok(true);
        }
        return Ok(false);
    }
    Ok(true)
}

fn ymd(v: &Bound<'_, PyAny>) -> PyResult<(u16, u8, u8)> {
    let py = v.py();
    Ok((
        v.getattr(intern!(py, "year"))?.extract()?,
        v.getattr(intern!(py, "month"))?.extract()?,
        v.getattr(intern!(py, "day"))?.extract()?,
    ))
}

/// `{"$datetime": isoformat()}` of a naive or UTC datetime, as
/// `datetime.isoformat()` writes it; `false` for another time zone.
fn write_datetime(out: &mut String, v: &Bound<'_, PyAny>, t: &Types) -> PyResult<bool> {
    let py = v.py();
    let tz = v.getattr(intern!(py, "tzinfo"))?;
    let offset = if tz.is_none() {
        ""
    } else if tz.is(t.utc.bind(py)) {
        "+00:00"
    } else {
        return Ok(false);
    };
    let (y, mo, d) = ymd(v)?;
    let h: u8 = v.getattr(intern!(py, "hour"))?.extract()?;
    let mi: u8 = v.getattr(intern!(py, "minute"))?.extract()?;
    let s: u8 = v.getattr(intern!(py, "second"))?.extract()?;
    let us: u32 = v.getattr(intern!(py, "microsecond"))?.extract()?;
    let _ = write!(
        out,
        "{{\"$datetime\":\"{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}"
    );
    if us != 0 {
        let _ = write!(out, ".{us:06}");
    }
    let _ = write!(out, "{offset}\"}}");
    Ok(true)
}

/// `(descr, dtype.name)` of a native little-endian buffer format and item
/// size, as numpy writes them (`_arrays._dtype_texts`), for the dtypes the
/// encoder covers.
fn dtype_texts(format: &[u8], itemsize: usize) -> Option<(&'static str, &'static str)> {
    Some(match (format, itemsize) {
        (b"?", 1) => ("'|b1'", "bool"),
        (b"b", 1) => ("'|i1'", "int8"),
        (b"B", 1) => ("'|u1'", "uint8"),
        (b"h", 2) => ("'<i2'", "int16"),
        (b"H", 2) => ("'<u2'", "uint16"),
        (b"i" | b"l", 4) => ("'<i4'", "int32"),
        (b"I" | b"L", 4) => ("'<u4'", "uint32"),
        (b"l" | b"q", 8) => ("'<i8'", "int64"),
        (b"L" | b"Q", 8) => ("'<u8'", "uint64"),
        (b"e", 2) => ("'<f2'", "float16"),
        (b"f", 4) => ("'<f4'", "float32"),
        (b"d", 8) => ("'<f8'", "float64"),
        (b"Zf", 8) => ("'<c8'", "complex64"),
        (b"Zd", 16) => ("'<c16'", "complex128"),
        _ => return None,
    })
}

/// The array `v` under `name`, or `None` when the encoder does not cover
/// its dtype or layout.
fn flat_array(name: &str, v: &Bound<'_, PyAny>) -> PyResult<Option<FlatArray>> {
    let Ok(data) = PyUntypedBuffer::get(v) else {
        return Ok(None); // datetime64 and others export no buffer
    };
    let Some((descr, dtype)) = dtype_texts(data.format().to_bytes(), data.item_size()) else {
        return Ok(None);
    };
    if !data.is_c_contiguous() {
        return Ok(None);
    }
    let shape = data.shape().iter().map(|&n| n as u64).collect();
    Ok(Some(FlatArray {
        name: name.to_owned(),
        descr,
        dtype,
        shape,
        data,
    }))
}

/// `s` as Python's `json` writes it with `ensure_ascii=False`.
fn write_json_str(out: &mut String, s: &str) {
    pyjson::push_str(out, s, false);
}
