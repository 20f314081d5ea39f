//! [`Keys`]: the keys a query matched, packed in one buffer or left in
//! the key column they were read from.

use arrow_array::{Array, StringArray};

/// Keys in key order: what [`Store::find_keys`](crate::Store::find_keys)
/// returns, so that a caller that makes its own strings from them (a Python
/// binding making `str` objects) copies each key once, with no `String`
/// allocated per key.
///
/// Held either packed end to end in one UTF-8 buffer with the end offset of
/// each (the layout of an Arrow string array), or, when every key comes from
/// one checkpoint run, as the matching row numbers of that run's key column
/// (mapped from its column file, which is immutable): a `find` then copies
/// no key at all, only four bytes per match.
#[derive(Debug, Clone)]
pub struct Keys {
    repr: Repr,
}

#[derive(Debug, Clone)]
enum Repr {
    Packed { bytes: String, ends: Vec<usize> },
    Rows { column: StringArray, rows: Vec<u32> },
}

impl Default for Keys {
    fn default() -> Self {
        Keys {
            repr: Repr::Packed {
                bytes: String::new(),
                ends: Vec::new(),
            },
        }
    }
}

impl PartialEq for Keys {
    fn eq(&self, other: &Keys) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Keys {}

impl Keys {
    /// Number of keys.
    #[must_use]
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Packed { ends, .. } => ends.len(),
            Repr::Rows { rows, .. } => rows.len(),
        }
    }

    /// Whether there is no key.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th key, or `None` past the end.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<&str> {
        match &self.repr {
            Repr::Packed { bytes, ends } => {
                let end = *ends.get(i)?;
                let start = if i == 0 { 0 } else { ends[i - 1] };
                Some(&bytes[start..end])
            }
            Repr::Rows { column, rows } => Some(column.value(*rows.get(i)? as usize)),
        }
    }

    /// The keys, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// One `String` per key, in order.
    #[must_use]
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }

    /// The keys of `keys`, in that order, in a buffer of the exact size
    /// (one allocation, no regrowth: a `find` may return a million keys).
    #[must_use]
    pub fn from_slice(keys: &[&str]) -> Keys {
        let mut bytes = String::with_capacity(keys.iter().map(|k| k.len()).sum());
        let mut ends = Vec::with_capacity(keys.len());
        for key in keys {
            bytes.push_str(key);
            ends.push(bytes.len());
        }
        Keys {
            repr: Repr::Packed { bytes, ends },
        }
    }

    /// The keys at `rows` (ascending, in range) of `column`, a key column
    /// without nulls, kept there; `None` when a row number exceeds `u32`.
    pub(crate) fn of_rows(column: &StringArray, rows: impl Iterator<Item = usize>) -> Option<Keys> {
        if column.len() > u32::MAX as usize || column.null_count() > 0 {
            return None;
        }
        let rows = rows.map(|r| r as u32).collect();
        Some(Keys {
            repr: Repr::Rows {
                column: column.clone(),
                rows,
            },
        })
    }

    /// The key column and its rows the keys are, when they were left in
    /// the column they were read from.
    pub(crate) fn rows(&self) -> Option<(&StringArray, &[u32])> {
        match &self.repr {
            Repr::Rows { column, rows } => Some((column, rows)),
            Repr::Packed { .. } => None,
        }
    }

    /// Appends `key`.
    pub fn push(&mut self, key: &str) {
        if let Repr::Rows { .. } = self.repr {
            *self = Keys::from_slice(&self.iter().collect::<Vec<_>>());
        }
        if let Repr::Packed { bytes, ends } = &mut self.repr {
            bytes.push_str(key);
            ends.push(bytes.len());
        }
    }
}

impl<'a> FromIterator<&'a str> for Keys {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut bytes = String::new();
        let mut ends = Vec::with_capacity(iter.size_hint().0);
        for key in iter {
            bytes.push_str(key);
            ends.push(bytes.len());
        }
        Keys {
            repr: Repr::Packed { bytes, ends },
        }
    }
}

impl<'a> IntoIterator for &'a Keys {
    type Item = &'a str;
    type IntoIter = Box<dyn ExactSizeIterator<Item = &'a str> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::Keys;

    #[test]
    fn keys_come_back_in_order_whatever_their_lengths() {
        let given = ["", "a", "ünï", "run-0001", "🦀/../x"];
        let keys: Keys = given.iter().copied().collect();
        assert_eq!(keys.len(), 5);
        assert!(!keys.is_empty());
        assert_eq!(keys.iter().collect::<Vec<_>>(), given);
        assert_eq!(keys.to_vec(), given.map(str::to_owned));
        for (i, k) in given.iter().enumerate() {
            assert_eq!(keys.get(i), Some(*k));
        }
        assert_eq!(keys.get(5), None);
        assert!(Keys::default().is_empty());
        assert_eq!(Keys::default().get(0), None);
    }

    #[test]
    fn keys_left_in_their_column_read_as_packed_ones() {
        let column = arrow_array::StringArray::from(vec!["a", "bb", "ünï", "", "run-9", "z"]);
        let rows = [0usize, 2, 3, 5];
        let mut keys = Keys::of_rows(&column, rows.iter().copied()).expect("fits");
        let packed: Keys = ["a", "ünï", "", "z"].into_iter().collect();
        assert_eq!(keys, packed);
        assert_eq!(keys.len(), 4);
        assert_eq!(keys.get(1), Some("ünï"));
        assert_eq!(keys.get(4), None);
        assert_eq!(keys.to_vec(), packed.to_vec());
        assert_eq!(keys.clone(), packed);
        keys.push("zz");
        assert_eq!(keys.iter().collect::<Vec<_>>(), ["a", "ünï", "", "z", "zz"]);
        assert_ne!(keys, packed);
        let empty = Keys::of_rows(&column, std::iter::empty()).expect("fits");
        assert!(empty.is_empty() && empty == Keys::default());
        let with_null = arrow_array::StringArray::from(vec![Some("a"), None]);
        assert!(Keys::of_rows(&with_null, [0].into_iter()).is_none());
    }
}
