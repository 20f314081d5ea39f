//! The runs of a checkpoint opened with their column files, for columnar
//! scans (see `store::columnar`): each run's columns and the entries a
//! scan must skip because a newer run, or a change after the checkpoint,
//! replaces them.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{Array, StringArray};
use memmap2::Mmap;

use super::run::Run;
use super::{RunDoc, CHECKPOINT_DIR};
use crate::columns::Columns;
use crate::error::{Error, Result};
use crate::query::columnar::Bits;

/// `shadowed` (ascending entry positions of `run`) plus the entries of
/// `run` whose key is in `keys`, ascending, without repeats.
///
/// # Errors
/// [`Error::Corrupt`] for a damaged run.
pub(crate) fn add_shadowed(
    run: &Run<Mmap>,
    keys: &BTreeSet<String>,
    shadowed: &[u64],
) -> Result<Vec<u64>> {
    let mut found = BTreeSet::new();
    for key in keys {
        let at = run.lower_bound(key.as_bytes())?;
        if at < run.len() && run.entry(at)?.0 == key {
            found.insert(at);
        }
    }
    found.extend(shadowed.iter().copied());
    Ok(found.into_iter().collect())
}

/// The position of `key` in a sorted key column.
pub(crate) fn find_row(keys: &StringArray, key: &str) -> Option<usize> {
    let values = keys.values();
    let offsets = keys.value_offsets();
    let key_at = |i: usize| &values[offsets[i] as usize..offsets[i + 1] as usize];
    let at = partition_point(keys.len(), |i| key_at(i) < key.as_bytes());
    (at < keys.len() && key_at(at) == key.as_bytes()).then_some(at)
}

/// The first of `0..len` where `before` turns false (`before` true for a
/// prefix): a binary search over positions.
pub(crate) fn partition_point(len: usize, before: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if before(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// One run with its columns and the rows a scan skips.
pub(crate) struct BaseRun {
    pub run: Run<Mmap>,
    pub columns: Arc<Columns>,
    /// Rows replaced or deleted by a newer run (from the checkpoint).
    pub shadowed: Bits,
}

/// The runs of one checkpoint, newest first, each with its columns.
pub(crate) struct Base {
    pub runs: Vec<BaseRun>,
}

impl Base {
    /// Opens the runs `docs` (of the checkpoint in `root`) and their column
    /// files; `None` when a run has no column file (written before columns
    /// existed: scans then read the records).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a damaged run or column file, or a column
    /// file whose rows do not match its run; I/O errors.
    pub(crate) fn open(root: &Path, docs: &[RunDoc]) -> Result<Option<Base>> {
        let dir = root.join(CHECKPOINT_DIR);
        let mut runs = Vec::with_capacity(docs.len());
        for doc in docs {
            let Some(columns_doc) = &doc.columns else {
                return Ok(None);
            };
            let run = Run::open(&dir.join(&doc.file))?;
            let path = dir.join(&columns_doc.file);
            let info = columns_doc.info().ok_or_else(|| {
                Error::corrupt(
                    format!("checkpoint run {}", doc.file),
                    format!("malformed column file checksum {:?}", columns_doc.checksum),
                )
            })?;
            let columns = Columns::open(&path, &info)?;
            if columns.len() as u64 != run.len() {
                return Err(Error::corrupt(
                    format!("column file {}", path.display()),
                    format!("{} rows for a run of {} entries", columns.len(), run.len()),
                ));
            }
            let n = columns.len();
            let mut shadowed = vec![0u64; n.div_ceil(64)];
            for &row in &doc.shadowed {
                let row = usize::try_from(row)
                    .ok()
                    .filter(|r| *r < n)
                    .ok_or_else(|| {
                        Error::corrupt(
                            format!("checkpoint run {}", doc.file),
                            format!("shadowed entry {row} past its {n} entries"),
                        )
                    })?;
                shadowed[row / 64] |= 1 << (row % 64);
            }
            runs.push(BaseRun {
                run,
                columns: Arc::new(columns),
                shadowed,
            });
        }
        Ok(Some(Base { runs }))
    }

    /// Per run, the rows a scan skips: those shadowed by a newer run and
    /// those whose key is in `changed` (changes after the checkpoint).
    /// `None` when a key column cannot be read (scans then read records).
    pub(crate) fn skipped<'k>(
        &self,
        changed: impl Iterator<Item = &'k str> + Clone,
    ) -> Option<Vec<Bits>> {
        self.runs
            .iter()
            .map(|r| {
                let mut bits = r.shadowed.clone();
                let mut changed = changed.clone().peekable();
                if changed.peek().is_some() {
                    let keys = r.columns.keys()?;
                    for key in changed {
                        if let Some(row) = find_row(keys, key) {
                            bits[row / 64] |= 1 << (row % 64);
                        }
                    }
                }
                Some(bits)
            })
            .collect()
    }
}
