//! [`Keys`]: the keys a query matched, packed in one buffer.

/// Keys in key order, packed end to end in one UTF-8 buffer with the end
/// offset of each (the layout of an Arrow string array): what
/// [`Store::find_keys`](crate::Store::find_keys) returns, so that a caller
/// that makes its own strings from them (a Python binding making `str`
/// objects) copies each key once, with no `String` allocated per key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys {
    bytes: String,
    ends: Vec<usize>,
}

impl Keys {
    /// Number of keys.
    #[must_use]
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there is no key.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The `i`-th key, or `None` past the end.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.bytes[start..end])
    }

    /// The keys, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let key = &self.bytes[start..end];
            start = end;
            key
        })
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
        Keys { bytes, ends }
    }

    /// Appends `key`.
    pub fn push(&mut self, key: &str) {
        self.bytes.push_str(key);
        self.ends.push(self.bytes.len());
    }
}

impl<'a> FromIterator<&'a str> for Keys {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut keys = Keys {
            bytes: String::new(),
            ends: Vec::with_capacity(iter.size_hint().0),
        };
        for key in iter {
            keys.push(key);
        }
        keys
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
}
