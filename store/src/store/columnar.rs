//! Queries over columns: the newest checkpoint's runs, each scanned
//! through its column file ([`Query::eval_columns`]), plus the records
//! changed after that checkpoint, checked one by one. Used by `find`,
//! `count`, `keys` and `to_arrow` whenever every run of the checkpoint has
//! its column file; otherwise (a checkpoint written before columns
//! existed) they scan the records as before.

use std::sync::Arc;

use super::{Keys, State, Store};
use crate::checkpoint::base::{find_row, Base};
use crate::columns::{ColumnBuilder, Columns};
use crate::error::Result;
use crate::query::columnar::{count, ones, Bits};
use crate::query::Query;
use crate::scan::ScanQuery;

/// A checkpoint's runs with their columns, and the changes after it.
pub(crate) struct Layered {
    pub base: Arc<Base>,
    /// Per run: rows a scan skips (replaced or deleted later).
    pub skipped: Vec<Bits>,
    /// Keys changed after the checkpoint, in key order, with their
    /// records (`None`: deleted).
    pub changed: Vec<(String, Option<Vec<u8>>)>,
}

/// Matching rows of one run, or of the changed records.
pub(crate) struct Part {
    pub columns: Arc<Columns>,
    /// Ascending rows of `columns`: live and matching.
    pub rows: Vec<u32>,
}

impl Layered {
    /// The columnar view of `base` and the keys `changed` after it (in key
    /// order, with their records): the rows those keys replace are
    /// skipped. `None` when a key column cannot be read.
    pub(crate) fn new(base: Arc<Base>, changed: Vec<(String, Option<Vec<u8>>)>) -> Option<Layered> {
        let skipped = base.skipped(changed.iter().map(|(k, _)| k.as_str()))?;
        Some(Layered {
            base,
            skipped,
            changed,
        })
    }

    /// Per run, the rows that hold a record the query matches (rows the
    /// columns cannot decide are checked against their records).
    fn matching(&self, query: &Query) -> Result<Vec<Bits>> {
        let scan = ScanQuery::new(query);
        self.base
            .runs
            .iter()
            .zip(&self.skipped)
            .map(|(r, skipped)| {
                let cols = &r.columns;
                // The first query of a reader decodes and checks its
                // columns: all of them at once.
                let mut wanted = query.columns_read(cols);
                wanted.push(cols.live);
                cols.prefetch(&wanted);
                let live = live_rows(cols, skipped);
                let mut verdict = query.eval_columns(cols);
                if cols.live().is_none() {
                    // Deletions unknown: every row's record decides.
                    verdict.unknown = vec![u64::MAX; verdict.yes.len()];
                    verdict.yes.iter_mut().for_each(|w| *w = 0);
                }
                let mut yes: Bits = verdict.yes.iter().zip(&live).map(|(a, b)| a & b).collect();
                let unknown: Bits = verdict
                    .unknown
                    .iter()
                    .zip(&live)
                    .map(|(a, b)| a & b)
                    .collect();
                for row in ones(&unknown) {
                    let (key, value) = r.run.entry(row as u64)?;
                    if let crate::checkpoint::run::RunValue::Put { record, .. } = value {
                        if scan.matches(key, record)? {
                            yes[row / 64] |= 1 << (row % 64);
                        }
                    }
                }
                Ok(yes)
            })
            .collect()
    }

    /// The changed records that match (all, without a query), in key order.
    fn changed_matching<'a>(&'a self, query: Option<&Query>) -> Result<Vec<(&'a str, &'a [u8])>> {
        let scan = query.map(ScanQuery::new);
        let mut out = Vec::new();
        for (key, record) in &self.changed {
            let Some(record) = record else { continue };
            if scan.as_ref().map_or(Ok(true), |s| s.matches(key, record))? {
                out.push((key.as_str(), record.as_slice()));
            }
        }
        Ok(out)
    }

    /// Number of records matching `query`.
    pub(crate) fn count(&self, query: &Query) -> Result<u64> {
        let runs: u64 = self.matching(query)?.iter().map(count).sum();
        Ok(runs + self.changed_matching(Some(query))?.len() as u64)
    }

    /// Keys of the records matching `query`, in key order.
    pub(crate) fn find(&self, query: &Query) -> Result<Keys> {
        let matching = self.matching(query)?;
        let changed = self.changed_matching(Some(query))?;
        // Matches from one run only (a reader of a checkpoint, the common
        // case): the keys stay in that run's key column, as row numbers.
        let mut hit = self
            .base
            .runs
            .iter()
            .zip(&matching)
            .filter(|(_, yes)| yes.iter().any(|w| *w != 0));
        if let (true, Some((r, yes)), None) = (changed.is_empty(), hit.next(), hit.next()) {
            if let Some(keys) = r.columns.keys().and_then(|c| Keys::of_rows(c, ones(yes))) {
                return Ok(keys);
            }
        }
        let mut keys: Vec<&str> = Vec::new();
        // where each source (a run, then the changed records) starts in `keys`
        let mut starts = Vec::with_capacity(self.base.runs.len() + 1);
        for (r, yes) in self.base.runs.iter().zip(matching) {
            starts.push(keys.len());
            match r.columns.keys() {
                Some(column) => keys.extend(ones(&yes).map(|row| column.value(row))),
                None => {
                    for row in ones(&yes) {
                        keys.push(r.run.entry(row as u64)?.0);
                    }
                }
            }
        }
        starts.push(keys.len());
        keys.extend(changed.into_iter().map(|(k, _)| k));
        // Each source is in key order and no key is in two: the whole is in
        // order unless two sources interleave, which their first and last
        // keys tell (comparing every key costs as much as the query).
        let interleaved = starts
            .iter()
            .filter(|&&start| start > 0 && start < keys.len())
            .any(|&start| keys[start - 1] > keys[start]);
        if interleaved {
            keys.sort_unstable();
        }
        Ok(Keys::from_slice(&keys))
    }

    /// Whether the runs' columns make the whole table: column files that
    /// left some fields or arrays out (records with thousands of them) do
    /// not, nor do damaged ones (a column that fails its checksum).
    pub(crate) fn whole(&self) -> bool {
        self.base.runs.iter().all(|r| {
            r.columns.paths_complete && r.columns.facts_complete && r.columns.batch().is_ok()
        })
    }

    /// The records of `keys` (ascending, no repeats) as parts, as
    /// [`Layered::select`] gives those of a query matching exactly them:
    /// per run, the rows holding one of them (found by binary search of its
    /// key column), then those changed since as columns of their own. Keys
    /// this view does not hold are left out. `None` when a run's key
    /// column cannot be read.
    ///
    /// # Errors
    /// [`Error::Corrupt`](crate::Error::Corrupt) for a changed record that
    /// does not decode.
    pub(crate) fn parts_of_keys(&self, keys: &[&str]) -> Result<Option<Vec<Part>>> {
        let mut parts = Vec::with_capacity(self.base.runs.len() + 1);
        for (r, skipped) in self.base.runs.iter().zip(&self.skipped) {
            let (Some(column), Some(_)) = (r.columns.keys(), r.columns.live()) else {
                return Ok(None);
            };
            let live = live_rows(&r.columns, skipped);
            let rows = keys
                .iter()
                .filter_map(|key| find_row(column, key))
                .filter(|&row| live[row / 64] & (1 << (row % 64)) != 0)
                .map(|row| row as u32)
                .collect();
            parts.push(Part {
                columns: r.columns.clone(),
                rows,
            });
        }
        let changed: Vec<(&str, &[u8])> = keys
            .iter()
            .filter_map(|key| {
                let at = self
                    .changed
                    .binary_search_by(|(k, _)| k.as_str().cmp(key))
                    .ok()?;
                let (k, record) = &self.changed[at];
                Some((k.as_str(), record.as_deref()?))
            })
            .collect();
        if !changed.is_empty() {
            parts.push(built_part(&changed)?);
        }
        Ok(Some(parts))
    }

    /// [`Layered::parts_of_keys`] of keys a `find` of this view left in
    /// place: rows `rows` of the key column `column`, when `column` is the
    /// key column of one of its runs (the same mapped buffers) and nothing
    /// changed since the checkpoint, so that each row still holds its key's
    /// record when it is live and not replaced by a newer run; `None`
    /// otherwise.
    pub(crate) fn parts_of_rows(
        &self,
        column: &arrow_array::StringArray,
        rows: &[u32],
    ) -> Option<Vec<Part>> {
        use arrow_array::Array;
        if !self.changed.is_empty() {
            return None;
        }
        let same = |keys: &arrow_array::StringArray| {
            keys.len() == column.len()
                && keys.offset() == column.offset()
                && keys.values().as_ptr() == column.values().as_ptr()
                && keys.value_offsets().as_ptr() == column.value_offsets().as_ptr()
        };
        let at = self
            .base
            .runs
            .iter()
            .position(|r| r.columns.keys().is_some_and(same))?;
        self.base.runs[at].columns.live()?;
        let live = live_rows(&self.base.runs[at].columns, &self.skipped[at]);
        let held = rows.iter().all(|&row| {
            let row = row as usize;
            live.get(row / 64)
                .is_some_and(|w| w & (1 << (row % 64)) != 0)
        });
        let parts = self.base.runs.iter().enumerate().map(|(i, r)| Part {
            columns: r.columns.clone(),
            rows: if i == at { rows.to_vec() } else { Vec::new() },
        });
        held.then(|| parts.collect())
    }

    /// The matching rows of every run, and the matching changed records as
    /// columns of their own (`None`: every record).
    pub(crate) fn select(&self, query: Option<&Query>) -> Result<Vec<Part>> {
        let per_run = match query {
            Some(q) => self.matching(q)?,
            None => self
                .base
                .runs
                .iter()
                .zip(&self.skipped)
                .map(|(r, skipped)| live_rows(&r.columns, skipped))
                .collect(),
        };
        let mut parts: Vec<Part> = self
            .base
            .runs
            .iter()
            .zip(per_run)
            .map(|(r, yes)| Part {
                columns: r.columns.clone(),
                rows: ones(&yes).map(|i| i as u32).collect(),
            })
            .collect();
        let changed = self.changed_matching(query)?;
        if !changed.is_empty() {
            parts.push(built_part(&changed)?);
        }
        Ok(parts)
    }

    /// Records in the runs and changed after them.
    pub(crate) fn describe(&self) -> (u64, usize, usize) {
        let rows = self.base.runs.iter().map(|r| r.columns.len() as u64).sum();
        (rows, self.base.runs.len(), self.changed.len())
    }
}

/// The columns built for `records` (key, record JSON; in key order), every
/// row selected.
fn built_part(records: &[(&str, &[u8])]) -> Result<Part> {
    let mut builder = ColumnBuilder::unlimited();
    for (key, record) in records {
        builder.push(key, Some(record))?;
    }
    let columns = builder.finish()?;
    Ok(Part {
        rows: (0..columns.len() as u32).collect(),
        columns: Arc::new(columns),
    })
}

/// Rows of `cols` holding a record that no later change replaced (every
/// row not replaced when the live column cannot be read: the records then
/// say which are deletions).
fn live_rows(cols: &Columns, skipped: &Bits) -> Bits {
    let n = cols.len();
    let mut bits: Bits = match cols.live() {
        Some(live) => {
            let chunks = live.values().bit_chunks();
            let mut words: Bits = chunks.iter().collect();
            if chunks.remainder_len() > 0 {
                words.push(chunks.remainder_bits());
            }
            words
        }
        None => {
            let mut words = vec![u64::MAX; n.div_ceil(64)];
            if !n.is_multiple_of(64) {
                if let Some(last) = words.last_mut() {
                    *last = (1u64 << (n % 64)) - 1;
                }
            }
            words
        }
    };
    for (word, skip) in bits.iter_mut().zip(skipped) {
        *word &= !skip;
    }
    bits
}

impl Store {
    /// The records matching `query` (all with `None`) as columns: the
    /// matching rows of each checkpoint run's column file (shared, not
    /// copied), and the matching records changed since the checkpoint as
    /// columns built for them. Each part's rows are in key order; parts
    /// may interleave. Without column files (a checkpoint written before
    /// them), one part built from the matching records.
    ///
    /// # Errors
    /// [`Error::Corrupt`](crate::Error::Corrupt) for a record that does not
    /// decode; those of every method (see [`Store`]).
    pub(crate) fn select(&self, query: Option<&Query>) -> Result<Vec<Part>> {
        if let Some(layered) = self.layered()? {
            if layered.whole() {
                return layered.select(query);
            }
        }
        let view = self.view()?;
        let scan = query.map(ScanQuery::new);
        let mut builder = ColumnBuilder::unlimited();
        crate::index::scan(view.index(), |key, record| {
            if scan.as_ref().map_or(Ok(true), |s| s.matches(key, record))? {
                builder.push(key, Some(record))?;
            }
            Ok(())
        })?;
        let columns = builder.finish()?;
        Ok(vec![Part {
            rows: (0..columns.len() as u32).collect(),
            columns: Arc::new(columns),
        }])
    }

    /// The columnar view of this handle's state, when every run of its
    /// checkpoint has a column file; `None` otherwise (scans then read the
    /// records).
    ///
    /// # Errors
    /// Those of reading the changed records from the index.
    pub(crate) fn layered(&self) -> Result<Option<Arc<Layered>>> {
        let view = self.view()?;
        match &*view.0 {
            State::Reading(snapshot) => Ok(snapshot.layered()),
            State::Writing(writer) => writer.layered(),
            State::Closed => Ok(None),
        }
    }
}
