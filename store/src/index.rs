//! The index: the only module that knows sled (DESIGN.md invariant 7).
//!
//! One sled tree holds, under one-byte prefixes, the record JSON of each key
//! (`r`), the pickled remainder of the keys that have one (`p`), and the
//! record count (`#count`), so that a put or delete changes all three in one
//! atomic batch and `len()` costs no scan.

use std::path::Path;

use crate::error::{Error, Result};

const RECORD: u8 = b'r';
const PICKLE: u8 = b'p';
const COUNT: &[u8] = b"#count";

fn prefixed(prefix: u8, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(prefix);
    k.extend_from_slice(key.as_bytes());
    k
}

fn index_err(e: sled::Error) -> Error {
    match e {
        sled::Error::Corruption { .. } => Error::corrupt("index", e),
        other => Error::Index(other.to_string()),
    }
}

/// The sled-backed index of one store. Not `Clone` on purpose: sled's file
/// lock is released only when the last handle drops, so exactly one owner
/// holds it.
pub(crate) struct Index {
    db: sled::Db,
    tree: sled::Tree,
}

impl Index {
    /// Opens or creates the index in `dir`.
    pub(crate) fn open(dir: &Path) -> Result<Index> {
        // The caller holds the store's own exclusive lock, so a sled lock
        // still held here belongs to this process's previous Db, whose
        // threads may release it a moment after close(): retry briefly.
        // (sled's error text is the only way to recognise it, NOTES.md.)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let opened = loop {
            match sled::Config::new().path(dir).open() {
                Err(sled::Error::Io(io))
                    if io.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => break other,
            }
        };
        let db = opened.map_err(|e| match e {
            sled::Error::Io(io) => Error::Io {
                path: dir.to_owned(),
                source: io,
            },
            e @ sled::Error::Corruption { .. } => {
                Error::corrupt(format!("index {}", dir.display()), e)
            }
            other => Error::Index(format!("{}: {other}", dir.display())),
        })?;
        let tree = db.open_tree("lazyvault").map_err(index_err)?;
        Ok(Index { db, tree })
    }

    /// The record JSON of `key`.
    pub(crate) fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .tree
            .get(prefixed(RECORD, key))
            .map_err(index_err)?
            .map(|v| v.to_vec()))
    }

    /// The pickled remainder of `key`.
    pub(crate) fn get_pickle(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .tree
            .get(prefixed(PICKLE, key))
            .map_err(index_err)?
            .map(|v| v.to_vec()))
    }

    pub(crate) fn contains(&self, key: &str) -> Result<bool> {
        self.tree
            .contains_key(prefixed(RECORD, key))
            .map_err(index_err)
    }

    pub(crate) fn len(&self) -> Result<u64> {
        Ok(match self.tree.get(COUNT).map_err(index_err)? {
            Some(v) => {
                let bytes: [u8; 8] = v
                    .as_ref()
                    .try_into()
                    .map_err(|_| Error::corrupt("index", "record count is not 8 bytes"))?;
                u64::from_le_bytes(bytes)
            }
            None => 0,
        })
    }

    /// Sets `key` to `record` (and its pickle, or none) in one atomic batch.
    /// Returns the record it replaced. The caller serialises writers.
    pub(crate) fn put(
        &self,
        key: &str,
        record: &[u8],
        pickle: Option<&[u8]>,
    ) -> Result<Option<Vec<u8>>> {
        let rkey = prefixed(RECORD, key);
        let old = self.tree.get(&rkey).map_err(index_err)?;
        let mut batch = sled::Batch::default();
        batch.insert(rkey, record);
        match pickle {
            Some(p) => batch.insert(prefixed(PICKLE, key), p),
            None => batch.remove(prefixed(PICKLE, key)),
        }
        if old.is_none() {
            batch.insert(COUNT, &(self.len()? + 1).to_le_bytes());
        }
        self.tree.apply_batch(batch).map_err(index_err)?;
        Ok(old.map(|v| v.to_vec()))
    }

    /// Removes `key`; returns its record if it was there.
    pub(crate) fn remove(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let rkey = prefixed(RECORD, key);
        let Some(old) = self.tree.get(&rkey).map_err(index_err)? else {
            return Ok(None);
        };
        let mut batch = sled::Batch::default();
        batch.remove(rkey);
        batch.remove(prefixed(PICKLE, key));
        batch.insert(COUNT, &self.len()?.saturating_sub(1).to_le_bytes());
        self.tree.apply_batch(batch).map_err(index_err)?;
        Ok(Some(old.to_vec()))
    }

    /// Calls `f(key, record_json)` for every record in key order (UTF-8 byte
    /// order, which is Unicode code point order). Stops at the first error.
    pub(crate) fn scan(&self, mut f: impl FnMut(&str, &[u8]) -> Result<()>) -> Result<()> {
        for item in self.tree.scan_prefix([RECORD]) {
            let (k, v) = item.map_err(index_err)?;
            let key = std::str::from_utf8(&k[1..])
                .map_err(|_| Error::corrupt("index", "a key is not UTF-8"))?;
            f(key, &v)?;
        }
        Ok(())
    }

    /// Makes every change so far durable.
    pub(crate) fn flush(&self) -> Result<()> {
        self.db.flush().map_err(index_err)?;
        Ok(())
    }
}
