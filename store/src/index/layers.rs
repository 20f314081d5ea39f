//! The records of a store as layers: the runs of one checkpoint (mapped,
//! newest first) under the changes made since (a map by key). A reader's
//! snapshot holds the committed changes; the writer's index holds its own
//! changes too, committed or not. One place for looking a key up and for
//! the merged, key-ordered scan (FORMAT.md, "Looking up a key").

use std::collections::BTreeMap;

use memmap2::Mmap;

use crate::checkpoint::run::{Run, RunValue};
use crate::error::Result;
use crate::journal::Committed;

/// A record JSON and its pickled remainder, borrowed.
pub(crate) type Stored<'a> = (&'a [u8], Option<&'a [u8]>);

/// What a scan calls per record: key, record JSON, pickled remainder.
pub(crate) type ScanFn<'f> = dyn FnMut(&str, &[u8], Option<&[u8]>) -> Result<()> + 'f;

/// Checkpoint runs plus the changes since.
#[derive(Default)]
pub(crate) struct Layers {
    /// Runs of the checkpoint, newest first: for a key in several, the
    /// first decides.
    pub runs: Vec<Run<Mmap>>,
    /// Changes after the checkpoint, by key (`None`: deleted). They hide
    /// the runs' entries of the same key.
    pub tail: BTreeMap<String, Committed>,
    /// Number of records.
    pub len: u64,
    /// The journal position of the checkpoint the runs come from (`[0,
    /// 0]`: none, the changes are the whole journal).
    pub base: crate::journal::Position,
    /// Bytes of record JSON and pickles in `tail` (what it holds in memory;
    /// overwritten ones count too, until the next checkpoint clears it).
    pub tail_bytes: u64,
}

impl Layers {
    /// The runs of a checkpoint at journal position `base` holding `len`
    /// records, with no change yet.
    pub(crate) fn new(runs: Vec<Run<Mmap>>, len: u64, base: crate::journal::Position) -> Layers {
        Layers {
            runs,
            tail: BTreeMap::new(),
            len,
            base,
            tail_bytes: 0,
        }
    }

    /// The value of `key`: from the changes, else the newest run that has
    /// it.
    pub(crate) fn value(&self, key: &str) -> Result<Option<Stored<'_>>> {
        if let Some(c) = self.tail.get(key) {
            return Ok(c.as_ref().map(|(r, p)| (&r[..], p.as_deref())));
        }
        self.checkpointed(key)
    }

    /// The value of `key` in the runs alone (as the checkpoint holds it).
    pub(crate) fn checkpointed(&self, key: &str) -> Result<Option<Stored<'_>>> {
        for run in &self.runs {
            if let Some(v) = run.get(key)? {
                return Ok(match v {
                    RunValue::Put { record, pickle } => Some((record, pickle)),
                    RunValue::Deleted => None,
                });
            }
        }
        Ok(None)
    }

    /// Applies one change (a put, or `None`: a delete), keeping `len`.
    pub(crate) fn apply(&mut self, key: String, change: Committed) -> Result<()> {
        let before = self.value(&key)?.is_some();
        self.len = match (before, change.is_some()) {
            (false, true) => self.len + 1,
            (true, false) => self.len.saturating_sub(1),
            _ => self.len,
        };
        let size = change
            .as_ref()
            .map_or(0, |(r, p)| r.len() + p.as_ref().map_or(0, Vec::len));
        self.tail_bytes += (key.len() + size) as u64;
        self.tail.insert(key, change);
        Ok(())
    }

    /// Calls `f(key, record, pickle)` for every record whose key (as bytes)
    /// is in `[from, to)`, in key order: a k-way merge of the changes and
    /// the runs, the first source holding a key deciding.
    pub(crate) fn scan_range(
        &self,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        f: &mut ScanFn<'_>,
    ) -> Result<()> {
        let mut cursors = Vec::with_capacity(self.runs.len() + 1);
        // The changes are few next to the runs (a checkpoint bounds them):
        // filter them.
        let in_range = |k: &[u8]| from.is_none_or(|f| k >= f) && to.is_none_or(|t| k < t);
        let tail: Vec<Item<'_>> = self
            .tail
            .iter()
            .filter(|(k, _)| in_range(k.as_bytes()))
            .map(|(k, c)| (k.as_str(), c.as_ref().map(|(r, p)| (&r[..], p.as_deref()))))
            .collect();
        cursors.push(Cursor::Tail(tail.into_iter()));
        for run in &self.runs {
            let at = from.map_or(Ok(0), |b| run.lower_bound(b))?;
            let end = to.map_or(Ok(run.len()), |b| run.lower_bound(b))?;
            cursors.push(Cursor::Run { run, at, end });
        }
        let mut heads: Vec<Option<Item<'_>>> = Vec::with_capacity(cursors.len());
        for c in &mut cursors {
            heads.push(c.next()?);
        }
        loop {
            let mut best: Option<usize> = None;
            for (i, h) in heads.iter().enumerate() {
                if let Some((k, _)) = h {
                    if best.is_none_or(|b| k.as_bytes() < heads[b].expect("set").0.as_bytes()) {
                        best = Some(i);
                    }
                }
            }
            let Some(b) = best else { return Ok(()) };
            let (key, value) = heads[b].expect("set");
            for i in b..heads.len() {
                if heads[i].is_some_and(|(k, _)| k == key) {
                    heads[i] = cursors[i].next()?;
                }
            }
            if let Some((record, pickle)) = value {
                f(key, record, pickle)?;
            }
        }
    }

    /// The smallest and largest keys of every source (deleted keys
    /// included: only a split point is derived from them).
    pub(crate) fn key_bounds(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut first: Option<Vec<u8>> = None;
        let mut last: Option<Vec<u8>> = None;
        let mut note = |k: &[u8]| {
            if first.as_deref().is_none_or(|f| k < f) {
                first = Some(k.to_vec());
            }
            if last.as_deref().is_none_or(|l| k > l) {
                last = Some(k.to_vec());
            }
        };
        if let (Some((a, _)), Some((b, _))) =
            (self.tail.first_key_value(), self.tail.last_key_value())
        {
            note(a.as_bytes());
            note(b.as_bytes());
        }
        for run in &self.runs {
            if run.len() > 0 {
                note(run.entry(0)?.0.as_bytes());
                note(run.entry(run.len() - 1)?.0.as_bytes());
            }
        }
        Ok(first.zip(last))
    }
}

/// One sorted source of a merged scan.
enum Cursor<'a> {
    Run {
        run: &'a Run<Mmap>,
        at: u64,
        end: u64,
    },
    Tail(std::vec::IntoIter<Item<'a>>),
}

type Item<'a> = (&'a str, Option<Stored<'a>>);

impl<'a> Cursor<'a> {
    fn next(&mut self) -> Result<Option<Item<'a>>> {
        match self {
            Cursor::Run { run, at, end } => {
                if *at >= *end {
                    return Ok(None);
                }
                let (key, value) = run.entry(*at)?;
                *at += 1;
                Ok(Some((
                    key,
                    match value {
                        RunValue::Put { record, pickle } => Some((record, pickle)),
                        RunValue::Deleted => None,
                    },
                )))
            }
            Cursor::Tail(items) => Ok(items.next()),
        }
    }
}
