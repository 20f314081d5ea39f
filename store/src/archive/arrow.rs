//! The metadata of an archive's records as an Arrow table, as
//! [`Store::to_arrow`](crate::Store::to_arrow) gives a store's.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::ArchiveIndex;
use crate::columns::ColumnBuilder;
use crate::error::Result;
use crate::query::Query;
use crate::store::arrow::{in_given_order, table_of};

impl ArchiveIndex {
    /// The metadata of the records matching `query` (every record with
    /// `None`) as an Arrow table, rows in archive order; columns as
    /// [`Store::to_arrow`](crate::Store::to_arrow) says.
    ///
    /// # Errors
    /// [`Error::Corrupt`](crate::Error::Corrupt) (naming the key) for a
    /// record whose JSON does not decode.
    pub fn to_arrow(&self, query: Option<&Query>) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let mut builder = ColumnBuilder::default();
        for record in self.records() {
            if query.is_none_or(|q| q.matches(record)) {
                builder.push(&record.key, Some(&record.json))?;
            }
        }
        table_of(builder)
    }

    /// [`ArchiveIndex::to_arrow`] of the records of `keys`, in the order
    /// given; keys the archive does not hold are left out. The table is
    /// the one `to_arrow` gives for a query matching exactly those records
    /// (the same columns, in the same order), its rows in the order of
    /// `keys`, a key given twice giving its row twice.
    ///
    /// # Errors
    /// As [`ArchiveIndex::to_arrow`].
    pub fn to_arrow_keys<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str>,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let keys: Vec<&str> = keys.into_iter().collect();
        let wanted: std::collections::HashSet<&str> = keys.iter().copied().collect();
        // in archive order, as a query reads them: the columns follow
        let mut builder = ColumnBuilder::default();
        for record in self.records() {
            if wanted.contains(record.key.as_str()) {
                builder.push(&record.key, Some(&record.json))?;
            }
        }
        in_given_order(table_of(builder)?, &keys)
    }
}
