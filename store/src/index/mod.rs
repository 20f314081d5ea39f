//! The index interface (FORMAT.md, "Index": derived data): what the store reads
//! records through. Two implementations: the writer's sled index
//! ([`sled::Index`], the only module that knows sled) and a reader's
//! checkpoint-plus-journal view ([`crate::snapshot::Snapshot`]). Queries,
//! displays, verification and exports go through this trait alone, so they
//! behave the same in both.

pub(crate) mod layers;
pub(crate) mod sled;

use serde_json::{Map, Value};

use crate::error::Result;
use crate::journal::Position;
use crate::query::IndexLookup;

pub(crate) use self::sled::Index;

/// Read access to the records of a store at one state.
pub(crate) trait RecordIndex: Sync {
    /// The record JSON of `key`.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
    /// The pickled remainder of `key`.
    fn get_pickle(&self, key: &str) -> Result<Option<Vec<u8>>>;
    /// Whether `key` has a record.
    fn contains(&self, key: &str) -> Result<bool>;
    /// Number of records, O(1).
    fn len(&self) -> Result<u64>;
    /// Calls `f(key, record JSON)` for every record whose key (as bytes) is
    /// in `[from, to)` (unbounded where `None`), in key order (UTF-8 byte
    /// order, which is code point order). Stops at the first error.
    fn scan_range(
        &self,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        f: &mut dyn FnMut(&str, &[u8]) -> Result<()>,
    ) -> Result<()>;
    /// The smallest and largest keys (as bytes) it may hold, to split scans.
    fn key_bounds(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>>;
    /// Keys whose `field` value falls in `lookup`, sorted, deduplicated.
    fn lookup(&self, field: &str, lookup: &IndexLookup) -> Result<Vec<String>>;
    /// Whether `segs` (a dotted path) has a secondary index to look up.
    fn is_indexed(&self, segs: &[String]) -> bool;
    /// Names of the secondary indexes, sorted.
    fn indexes(&self) -> Vec<String>;
    /// The journal position this state reflects.
    fn journal_pos(&self) -> Result<Option<Position>>;
    /// The journal position of the checkpoint its records start from
    /// (`[0, 0]`: none, the whole journal): the journal before it may be
    /// gone, the checkpoint's runs hold its records.
    fn base_pos(&self) -> Position;
    /// The record JSON and pickled remainder of `key` as the checkpoint its
    /// records start from holds them (not its changes since).
    fn checkpointed(&self, key: &str) -> Result<crate::journal::Committed>;
}

/// Every record in key order (see [`RecordIndex::scan_range`]).
pub(crate) fn scan(
    index: &dyn RecordIndex,
    mut f: impl FnMut(&str, &[u8]) -> Result<()>,
) -> Result<()> {
    index.scan_range(None, None, &mut f)
}

/// Like [`scan`], on two threads when there are two cores: the records are
/// split by key in two ranges (at the midpoint of the first and last keys,
/// which needs no pass over the data), `f(key, json, acc)` runs over each
/// range in key order with its own accumulator, and the accumulators come
/// back in key order. On an error, the one of the lower range wins, as in a
/// sequential scan.
pub(crate) fn scan_split<T: Default + Send>(
    index: &dyn RecordIndex,
    f: impl Fn(&str, &[u8], &mut T) -> Result<()> + Sync,
) -> Result<Vec<T>> {
    let run = |from: Option<&[u8]>, to: Option<&[u8]>| -> Result<T> {
        let mut acc = T::default();
        index.scan_range(from, to, &mut |k, v| f(k, v, &mut acc))?;
        Ok(acc)
    };
    let two_cores = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    let split = if two_cores {
        index.key_bounds()?.and_then(|(a, b)| midpoint(&a, &b))
    } else {
        None
    };
    let Some(mid) = split else {
        return Ok(vec![run(None, None)?]);
    };
    let (low, high) = std::thread::scope(|s| {
        let high = s.spawn(|| run(Some(&mid), None));
        let low = run(None, Some(&mid));
        let high = high
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (low, high)
    });
    Ok(vec![low?, high?])
}

/// The metadata of a record JSON, for index maintenance (other members are
/// skipped unparsed); a record that does not decode has none.
pub(crate) fn meta_of(record: &[u8]) -> Map<String, Value> {
    #[derive(serde::Deserialize)]
    struct MetaOnly {
        meta: Map<String, Value>,
    }
    serde_json::from_slice::<MetaOnly>(record)
        .map(|m| m.meta)
        .unwrap_or_default()
}

/// A byte string `m` with `a < m <= b` near the middle of the two (the
/// eight bytes after their common prefix, averaged as a number), or `None`
/// when there is none that way (`a >= b`).
fn midpoint(a: &[u8], b: &[u8]) -> Option<Vec<u8>> {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let word = |s: &[u8]| {
        let mut w = [0u8; 8];
        for (d, c) in w.iter_mut().zip(&s[common..]) {
            *d = *c;
        }
        u64::from_be_bytes(w)
    };
    let (x, y) = (word(a), word(b));
    if x >= y {
        return None;
    }
    let mut mid = b[..common].to_vec();
    mid.extend_from_slice(&(x + (y - x) / 2 + 1).to_be_bytes());
    (a < mid.as_slice() && mid.as_slice() <= b).then_some(mid)
}

#[cfg(test)]
mod tests {
    use super::midpoint;

    #[test]
    fn midpoint_lies_between_its_ends() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"run-0000000", b"run-0099999"),
            (b"a", b"b"),
            (b"a", b"ab"),
            (b"", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff"),
            (b"abcdefghij1", b"abcdefghij2"),
            ("🦀".as_bytes(), "🦀🦀".as_bytes()),
            (
                b"\xff\xff\xff\xff\xff\xff\xff\xfe",
                b"\xff\xff\xff\xff\xff\xff\xff\xff",
            ),
        ];
        for &(a, b) in cases {
            let m = midpoint(a, b).unwrap_or_else(|| panic!("{a:?} {b:?}"));
            assert!(a < m.as_slice() && m.as_slice() <= b, "{a:?} {m:?} {b:?}");
        }
        assert_eq!(midpoint(b"b", b"a"), None);
        assert_eq!(midpoint(b"a", b"a"), None);
        // Nothing lies strictly between: the scan is not split.
        assert_eq!(midpoint(b"a", b"a\x00"), None);
        // Evenly spread keys split near the middle.
        let m = midpoint(b"run-0000000", b"run-0099999").unwrap();
        assert!(
            m.as_slice() > b"run-0049999".as_slice() && m.as_slice() <= b"run-0050000".as_slice()
        );
    }
}
