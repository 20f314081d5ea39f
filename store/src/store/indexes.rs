//! Secondary indexes on metadata fields: created, dropped and listed here,
//! kept current by the index on every put and delete. Their names are also
//! listed in `indexes.json` (outside sled) so that `repair` rebuilds them.

use super::{write_file_durably, Store, INDEXES_FILE};
use crate::error::{Error, Result};

impl Store {
    /// Creates a secondary index on the metadata field `field` (a dotted
    /// path: `"temperature"`, `"params.lr"`), built from every record now
    /// and kept current by every put and delete. Equality, `in [...]` and
    /// range queries on the field then read only the matching records.
    /// Creating an existing index does nothing. Scalar values (null,
    /// booleans, numbers, strings) are indexed; lists and objects are not
    /// (no indexable condition can match them).
    ///
    /// # Errors
    /// [`UsageError::InvalidField`](crate::UsageError::InvalidField) for a name that is not a dotted field path,
    /// [`UsageError::ReadOnly`](crate::UsageError::ReadOnly), I/O errors.
    pub fn create_index(&self, field: &str) -> Result<()> {
        let segs = crate::secondary::parse_field(field).map_err(Error::invalid_field)?;
        let (_view, w) = self.writer()?;
        let index = w.index();
        // Its entries: about a key and a value per record.
        w.check_space_for(0, index.len()?.saturating_mul(256))?;
        let _writer = w.lock();
        if index.indexes().iter().any(|n| n == field) {
            return Ok(());
        }
        // Listed before it is built: a crash in between leaves an entry
        // that repair builds and open ignores (the index's own record in
        // sled is written last).
        let mut names = index.indexes();
        names.push(field.to_owned());
        self.write_index_list(&names)?;
        index.create_index(field, segs)?;
        index.flush()
    }

    /// Removes the secondary index on `field`; returns whether it existed.
    ///
    /// # Errors
    /// [`UsageError::ReadOnly`](crate::UsageError::ReadOnly), as a first
    /// write ([`OpenError::Locked`](crate::OpenError::Locked)), I/O errors.
    pub fn drop_index(&self, field: &str) -> Result<bool> {
        let (_view, w) = self.writer()?;
        let index = w.index();
        let _writer = w.lock();
        let existed = index.drop_index(field)?;
        index.flush()?;
        self.write_index_list(&index.indexes())?;
        Ok(existed)
    }

    /// The fields that have a secondary index, sorted (dotted paths, as
    /// given to [`Store::create_index`]).
    ///
    /// # Errors
    /// Only those of every method (see [`Store`]).
    pub fn indexes(&self) -> Result<Vec<String>> {
        Ok(self.view()?.index().indexes())
    }

    /// Writes `indexes.json` listing `names`, sorted, durably (renamed
    /// into place, directory fsynced).
    fn write_index_list(&self, names: &[String]) -> Result<()> {
        let mut sorted = names.to_vec();
        sorted.sort();
        let mut text = serde_json::to_vec_pretty(&serde_json::json!({ "indexes": sorted }))
            .expect("serializes");
        text.push(b'\n');
        write_file_durably(&self.root.join(INDEXES_FILE), &text)
    }
}
