//! Finding records by their metadata: a full scan of the index (split over
//! two threads), or the candidates of a secondary index, each record
//! checked against the whole query (decoded as [`crate::scan`] does).

use serde_json::Value;

use super::columnar::Layered;
use super::{Keys, State, Store};
use crate::error::Result;
use crate::index;
use crate::query::{IndexLookup, Query};
use crate::scan::ScanQuery;

impl Store {
    /// Calls `f(key)` for each record matching `query` (all records when
    /// `None`), in key order. Reads only the index, never a payload. When a
    /// secondary index can narrow the query (see [`Store::explain`]), only
    /// its candidates are read, and the whole query is evaluated on each.
    ///
    /// # Errors
    /// [`Error::Corrupt`](crate::Error::Corrupt) (naming the key) for a
    /// record that does not decode; any error `f` returns, which stops the
    /// scan; those of every method (see [`Store`]).
    pub fn scan_matching(
        &self,
        query: Option<&Query>,
        mut f: impl FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        let view = self.view()?;
        let index = view.index();
        let Some(query) = query else {
            return index::scan(index, |key, _| f(key));
        };
        let scan = ScanQuery::new(query);
        let Some(plan) = query.index_plan(&|segs| index.is_indexed(segs)) else {
            drop(view);
            if let Some(layered) = self.layered()? {
                for key in &layered.find(query)? {
                    f(key)?;
                }
                return Ok(());
            }
            return self.scan_matching_records(query, f);
        };
        for key in index.lookup(&plan.field.join("."), &plan.lookup)? {
            let Some(bytes) = index.get(&key)? else {
                continue;
            };
            if scan.matches(&key, &bytes)? {
                f(&key)?;
            }
        }
        Ok(())
    }

    /// [`Store::scan_matching`] by reading every record (no column files).
    fn scan_matching_records(
        &self,
        query: &Query,
        mut f: impl FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        let view = self.view()?;
        let scan = ScanQuery::new(query);
        index::scan(view.index(), |key, bytes| {
            if scan.matches(key, bytes)? {
                f(key)?;
            }
            Ok(())
        })
    }

    /// How [`Store::find`] would run `query`: `"index <field>: <lookup>,
    /// <n> candidates"` when a secondary index narrows it, else `"full scan
    /// of <n> records"` with the reason. Counting the candidates reads the
    /// index but no record.
    ///
    /// # Errors
    /// Only those of every method (see [`Store`]).
    pub fn explain(&self, query: &Query) -> Result<String> {
        let view = self.view()?;
        let index = view.index();
        let Some(plan) = query.index_plan(&|segs| index.is_indexed(segs)) else {
            let indexes = index.indexes();
            let why = if indexes.is_empty() {
                "no secondary index".to_owned()
            } else if matches!(&*view.0, State::Reading(_)) {
                format!(
                    "a reader scans: secondary indexes ({}) are the writer's",
                    indexes.join(", ")
                )
            } else {
                format!(
                    "no condition every match must meet uses an indexed field ({}) with \
                     ==, in [...] or a range",
                    indexes.join(", ")
                )
            };
            let scan = format!("full scan of {} records ({why})", index.len()?);
            drop(view);
            return Ok(match self.layered()? {
                Some(layered) => format!("{scan}: {}", describe_columnar(&layered, query)),
                None => format!(
                    "{scan}, record by record (a run of the checkpoint has no usable column file: \
                     written before format 1.4, or damaged, which `verify` reports)"
                ),
            });
        };
        let field = plan.field.join(".");
        let candidates = index.lookup(&field, &plan.lookup)?.len();
        Ok(format!(
            "index {field}: {}, {candidates} candidate record(s), each checked against the \
             whole query",
            describe_lookup(&plan.lookup)
        ))
    }

    /// Keys of the records whose metadata match `query`, in key order.
    /// A full scan runs on two threads when there are two cores (see
    /// [`Store::explain`] for when a secondary index is used instead).
    ///
    /// # Errors
    /// As [`Store::scan_matching`].
    pub fn find(&self, query: &Query) -> Result<Vec<String>> {
        Ok(self.find_keys(query)?.to_vec())
    }

    /// [`Store::find`], the keys packed in one buffer ([`Keys`]): from the
    /// columns, each matching key is copied once, straight from the mapped
    /// column file, with no `String` allocated per key.
    ///
    /// # Errors
    /// As [`Store::scan_matching`].
    pub fn find_keys(&self, query: &Query) -> Result<Keys> {
        if let Some(layered) = self.columnar_for(query)? {
            return layered.find(query);
        }
        if let Some(parts) = self.scan_split(query, |key, keys: &mut Keys| keys.push(key))? {
            return Ok(parts.iter().flatten().collect());
        }
        let mut keys = Keys::default();
        self.scan_matching(Some(query), |k| {
            keys.push(k);
            Ok(())
        })?;
        Ok(keys)
    }

    /// Number of records whose metadata match `query` (scanning as
    /// [`Store::find`] does).
    ///
    /// # Errors
    /// As [`Store::scan_matching`].
    pub fn count(&self, query: &Query) -> Result<u64> {
        if let Some(layered) = self.columnar_for(query)? {
            return layered.count(query);
        }
        if let Some(parts) = self.scan_split(query, |_, n: &mut u64| *n += 1)? {
            return Ok(parts.iter().sum());
        }
        let mut n = 0;
        self.scan_matching(Some(query), |_| {
            n += 1;
            Ok(())
        })?;
        Ok(n)
    }

    /// The columnar view, when it answers `query`: no secondary index
    /// narrows the query and every run has its column file.
    fn columnar_for(&self, query: &Query) -> Result<Option<std::sync::Arc<Layered>>> {
        {
            let view = self.view()?;
            let index = view.index();
            if query.index_plan(&|segs| index.is_indexed(segs)).is_some() {
                return Ok(None);
            }
        }
        self.layered()
    }

    /// A full scan for `query` split over two threads ([`index::scan_split`]),
    /// `add(key, acc)` called for each match; `None` when a secondary index
    /// narrows the query (the caller then uses [`Store::scan_matching`]).
    fn scan_split<T: Default + Send>(
        &self,
        query: &Query,
        add: impl Fn(&str, &mut T) + Sync,
    ) -> Result<Option<Vec<T>>> {
        let view = self.view()?;
        let index = view.index();
        if query.index_plan(&|segs| index.is_indexed(segs)).is_some() {
            return Ok(None);
        }
        let scan = ScanQuery::new(query);
        index::scan_split(index, |key, bytes, acc| {
            if scan.matches(key, bytes)? {
                add(key, acc);
            }
            Ok(())
        })
        .map(Some)
    }
}

/// How a columnar scan runs `query`, for [`Store::explain`].
fn describe_columnar(layered: &Layered, query: &Query) -> String {
    let (rows, runs, changed) = layered.describe();
    let mut reasons: Vec<String> = Vec::new();
    for r in &layered.base.runs {
        for why in query.eval_columns(&r.columns).reasons {
            if !reasons.contains(&why) {
                reasons.push(why);
            }
        }
    }
    let mut text = format!("{rows} rows of {runs} column file(s)");
    if reasons.is_empty() {
        text.push_str(", every condition answered by the columns");
    } else {
        text.push_str(&format!(
            ", the records deciding the rows where {}",
            reasons.join("; ")
        ));
    }
    if changed > 0 {
        text.push_str(&format!(
            ", and {changed} key(s) changed since the last checkpoint, read record by record"
        ));
    }
    text
}

/// A secondary index lookup in words: `equal to one of [1, 2]`,
/// `>= 1 and < 5`.
fn describe_lookup(lookup: &IndexLookup) -> String {
    match lookup {
        IndexLookup::Points(values) => {
            let shown: Vec<String> = values.iter().map(Value::to_string).collect();
            format!("equal to one of [{}]", shown.join(", "))
        }
        IndexLookup::Range { lower, upper } => {
            let bound = |b: &Option<(Value, bool)>, incl: &str, excl: &str| {
                b.as_ref()
                    .map(|(v, inclusive)| format!("{} {v}", if *inclusive { incl } else { excl }))
            };
            [bound(lower, ">=", ">"), bound(upper, "<=", "<")]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" and ")
        }
    }
}
