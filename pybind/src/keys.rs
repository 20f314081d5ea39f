//! `KeyArray`: the keys a query matched, held packed in Rust (the engine's
//! [`Keys`]: one UTF-8 buffer and the end of each key) and made Python `str`
//! objects only when asked for, one per key read. `find` over a million
//! records matches about a hundred thousand keys; making a `str` of each
//! costs more than the query, and a caller that counts them, slices them or
//! hands them back to `to_arrow` needs none of those objects.

use lazyvault_store::Keys;
use pyo3::exceptions::{PyIndexError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PySlice, PyString, PyTuple, PyType};

/// Keys a long `repr` shows before eliding the rest.
const REPR_SHOWN: usize = 5;

/// The keys a query matched, in key order (archive order for an archive): an
/// immutable sequence of `str` held packed in Rust, each `str` made when it
/// is read (indexing, iteration, `to_list()`).
#[pyclass(module = "lazyvault._lazyvault", frozen, sequence)]
pub struct KeyArray {
    pub(crate) keys: Keys,
}

impl KeyArray {
    /// The array of `keys`.
    pub(crate) fn new(keys: Keys) -> KeyArray {
        KeyArray { keys }
    }

    /// The `i`-th key (`i` in range) as a `str`.
    fn key<'py>(&self, py: Python<'py>, i: usize) -> Bound<'py, PyString> {
        PyString::new(py, self.keys.get(i).unwrap_or_default())
    }

    /// `i` (negative from the end) as an index in range, or `IndexError`.
    fn position(&self, i: isize) -> PyResult<usize> {
        let len = self.keys.len() as isize;
        let j = if i < 0 { i + len } else { i };
        if (0..len).contains(&j) {
            Ok(j as usize)
        } else {
            Err(PyIndexError::new_err("KeyArray index out of range"))
        }
    }

    /// Whether key `i` equals `value` as `key == value` would say (the
    /// packed bytes compared for a `str`; anything else asked in Python).
    fn key_eq(&self, py: Python<'_>, i: usize, value: &Bound<'_, PyAny>) -> PyResult<bool> {
        if let Ok(s) = value.cast_exact::<PyString>() {
            // a str that is not valid UTF-8 (lone surrogates) equals no key
            return Ok(s.to_str().is_ok_and(|s| Some(s) == self.keys.get(i)));
        }
        PyAnyMethods::eq(self.key(py, i).as_any(), value)
    }

    /// The positions of the keys equal to `value` within `range`, only
    /// the first with `first`.
    fn positions(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        range: std::ops::Range<usize>,
        first: bool,
    ) -> PyResult<Vec<usize>> {
        let mut found = Vec::new();
        // a str: compared with the packed keys, no str made
        let exact = value.cast_exact::<PyString>().ok().map(|s| s.to_str().ok());
        for i in range {
            let equal = match &exact {
                Some(s) => s.is_some() && *s == self.keys.get(i),
                None => self.key_eq(py, i, value)?,
            };
            if equal {
                found.push(i);
                if first {
                    break;
                }
            }
        }
        Ok(found)
    }

    /// Whether the keys equal the items of `items` (a list or tuple), in
    /// order.
    fn eq_items(&self, py: Python<'_>, items: &[Bound<'_, PyAny>]) -> PyResult<bool> {
        if items.len() != self.keys.len() {
            return Ok(false);
        }
        for (i, item) in items.iter().enumerate() {
            if !self.key_eq(py, i, item)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[pymethods]
impl KeyArray {
    /// The keys of `keys` (an iterable of str), in that order.
    #[new]
    fn py_new(keys: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(other) = keys.cast::<KeyArray>() {
            return Ok(KeyArray::new(other.get().keys.clone()));
        }
        if keys.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "KeyArray takes an iterable of str, not a str",
            ));
        }
        let mut packed = Keys::default();
        for item in keys.try_iter()? {
            let item = item?;
            let s = item.cast::<PyString>().map_err(|_| {
                let name = item
                    .get_type()
                    .name()
                    .map_or_else(|_| "?".to_owned(), |n| n.to_string());
                PyTypeError::new_err(format!("KeyArray holds str, not {name}"))
            })?;
            packed.push(s.to_str()?);
        }
        Ok(KeyArray::new(packed))
    }

    /// Number of keys.
    fn __len__(&self) -> usize {
        self.keys.len()
    }

    /// Key `index` as a new `str` (negative from the end; `IndexError` out
    /// of range), or for a slice (any step) a new `KeyArray` of those keys.
    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(slice) = index.cast::<PySlice>() {
            let s = slice.indices(self.keys.len() as isize)?;
            let picked: Keys = (0..s.slicelength as isize)
                .filter_map(|j| self.keys.get((s.start + j * s.step) as usize))
                .collect();
            return Ok(Bound::new(py, KeyArray::new(picked))?.into_any());
        }
        let i = match index.extract::<isize>() {
            Ok(i) => i,
            Err(e) if e.is_instance_of::<PyOverflowError>(py) => {
                return Err(PyIndexError::new_err(
                    "cannot fit 'int' into an index-sized integer",
                ))
            }
            Err(_) => {
                let name = index.get_type().name()?;
                return Err(PyTypeError::new_err(format!(
                    "KeyArray indices must be integers or slices, not {name}"
                )));
            }
        };
        let i = self.position(i)?;
        Ok(self.key(py, i).into_any())
    }

    /// The keys in order, a new `str` each step.
    fn __iter__(slf: Bound<'_, Self>) -> KeyArrayIterator {
        KeyArrayIterator {
            array: slf.unbind(),
            next: 0,
        }
    }

    /// Whether `value` is one of the keys (a `str` is compared with the
    /// packed keys: no `str` made).
    fn __contains__(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(!self
            .positions(py, value, 0..self.keys.len(), true)?
            .is_empty())
    }

    /// Position of the first key equal to `value` in `[start, stop)`
    /// (bounds as for a list's `index`); `ValueError` when there is none.
    #[pyo3(signature = (value, start=0, stop=isize::MAX))]
    fn index(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        start: isize,
        stop: isize,
    ) -> PyResult<usize> {
        let s = PySlice::new(py, start, stop, 1).indices(self.keys.len() as isize)?;
        let (start, stop) = (s.start as usize, (s.start.max(s.stop)) as usize);
        match self.positions(py, value, start..stop, true)?.first() {
            Some(&i) => Ok(i),
            None => Err(PyValueError::new_err(format!(
                "{} is not in KeyArray",
                value.repr()?
            ))),
        }
    }

    /// Number of keys equal to `value`.
    fn count(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<usize> {
        Ok(self.positions(py, value, 0..self.keys.len(), false)?.len())
    }

    /// Equal to another `KeyArray`, or a list or tuple, of the same keys in
    /// the same order.
    fn __eq__<'py>(&self, py: Python<'py>, other: &Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        let equal = if let Ok(other) = other.cast::<KeyArray>() {
            self.keys == other.get().keys
        } else if let Ok(list) = other.cast::<PyList>() {
            // a snapshot of the items: comparing may run Python code
            let items: Vec<_> = list.iter().collect();
            self.eq_items(py, &items)?
        } else if let Ok(tuple) = other.cast::<PyTuple>() {
            let items: Vec<_> = tuple.iter().collect();
            self.eq_items(py, &items)?
        } else {
            return Ok(py.NotImplemented());
        };
        Ok(pyo3::types::PyBool::new(py, equal)
            .to_owned()
            .into_any()
            .unbind())
    }

    /// Unhashable, as a list is.
    #[classattr]
    const __hash__: Option<Py<PyAny>> = None;

    /// `KeyArray(['a', 'b'])`; past a few keys, the first ones, `...` and
    /// the number of keys.
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let n = self.keys.len();
        let shown = if n <= 2 * REPR_SHOWN { n } else { REPR_SHOWN };
        let mut parts = Vec::with_capacity(shown + 1);
        for i in 0..shown {
            parts.push(self.key(py, i).repr()?.to_string());
        }
        if shown < n {
            parts.push("...".to_owned());
            return Ok(format!("KeyArray([{}], {n} keys)", parts.join(", ")));
        }
        Ok(format!("KeyArray([{}])", parts.join(", ")))
    }

    /// Pickles as its keys (a list of str), unpickled as a `KeyArray`.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyType>, (Bound<'py, PyList>,))> {
        let py = slf.py();
        Ok((slf.get_type(), (slf.get().to_list(py)?,)))
    }

    /// The keys as a list of new `str` objects.
    fn to_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.keys.iter().map(|k| PyString::new(py, k)))
    }
}

/// Iterator over a [`KeyArray`]: a new `str` per step.
#[pyclass(module = "lazyvault._lazyvault")]
pub struct KeyArrayIterator {
    array: Py<KeyArray>,
    next: usize,
}

#[pymethods]
impl KeyArrayIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> Option<Bound<'py, PyString>> {
        let key = self.array.get().keys.get(self.next)?;
        self.next += 1;
        Some(PyString::new(py, key))
    }

    fn __length_hint__(&self) -> usize {
        self.array.get().keys.len().saturating_sub(self.next)
    }
}

/// The keys of `to_arrow_keys`: a [`KeyArray`], read in place (no `str`
/// made), or any sequence of str.
#[derive(FromPyObject)]
pub enum KeysArg {
    /// A `KeyArray`.
    Packed(Py<KeyArray>),
    /// A list (any sequence) of str.
    Strings(Vec<String>),
}

impl KeysArg {
    /// The keys, in order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        match self {
            KeysArg::Packed(a) => Box::new(a.get().keys.iter()),
            KeysArg::Strings(v) => Box::new(v.iter().map(String::as_str)),
        }
    }
}
