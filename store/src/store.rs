//! The store: a directory with a manifest, a sled index and payload files.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::fs::{self, File};
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

use indexmap::IndexMap;
use lazyvault_schema::{ArrayEntry, Manifest, Record, MANIFEST_FILE, PAYLOAD_DIR};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::fsio;
use crate::index::{self, Index, RecordIndex};
use crate::journal::{self, JOURNAL_DIR};
use crate::payload::{self, ArraySource, PayloadWriter, TMP_SUFFIX};
use crate::query::{ArrayFacts, Query, QueryNeeds, RecordView};
use crate::snapshot::Snapshot;

mod maintenance;
mod staged;
pub(crate) mod writer;

pub use staged::{Stage, StagedRecord};

use writer::{Writer, WriterState};

/// Directory of the sled index inside a store.
pub const INDEX_DIR: &str = "index";
/// The lock file naming the process that holds the store.
pub const LOCK_FILE: &str = "lazyvault.lock";
/// The list of secondary indexes, kept outside sled so `repair` can
/// rebuild them: `{"indexes": ["temperature", "params.lr"]}`.
pub const INDEXES_FILE: &str = "indexes.json";

/// One record for [`Store::put_many`]: what [`Store::put`] takes.
#[derive(Debug, Clone)]
pub struct NewRecord<'a> {
    /// The key (any non-empty string).
    pub key: &'a str,
    /// The JSON-able metadata (FORMAT.md, "Meta").
    pub meta: Map<String, Value>,
    /// How to rebuild the object (FORMAT.md, "Layout").
    pub layout: Value,
    /// The arrays, written as payloads; names unique within the record.
    pub arrays: &'a [ArraySource<'a>],
    /// The pickled remainder, if the object has one.
    pub pickle: Option<&'a [u8]>,
}

/// A record's JSON and its pickled remainder, if any, as stored.
pub type RecordBytes = (Vec<u8>, Option<Vec<u8>>);

/// How to open a store, as in Python's `open()` and h5py.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `"r"`: the store must exist; writes raise [`Error::ReadOnly`].
    ReadOnly,
    /// `"a"`: read and write, create the store if missing (the default).
    Append,
    /// `"w"`: create a new store; the path must not exist.
    Create,
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "r" => Ok(Mode::ReadOnly),
            "a" => Ok(Mode::Append),
            "w" => Ok(Mode::Create),
            other => Err(format!("mode must be 'r', 'a' or 'w', not {other:?}")),
        }
    }
}

/// What `gc()` removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Payload files (and leftover temporary files) removed.
    pub removed_files: u64,
    /// Their total size in bytes.
    pub removed_bytes: u64,
    /// Bytes the journal compaction freed (old segments' size minus the
    /// new segment's).
    pub journal_bytes_freed: u64,
}

/// What `verify()` found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Records checked.
    pub records: u64,
    /// Payloads checked.
    pub arrays: u64,
    /// Payloads whose data was hashed and matched the checksum recorded at
    /// write time (a mismatch is a problem instead).
    pub checksummed: u64,
    /// One line per damaged or missing payload, undecodable record, or
    /// disagreement between the index and the journal.
    pub problems: Vec<String>,
    /// Payload or temporary files that no record references (`gc()`
    /// removes them).
    pub orphans: Vec<PathBuf>,
}

/// What [`Store::repair`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// Records in the rebuilt index.
    pub records: u64,
    /// Journal entries replayed (puts and deletes).
    pub entries: u64,
    /// What was not used, one line each with the reason: a torn or damaged
    /// journal tail, a record version whose payloads are missing or
    /// damaged (an older version of the key is used instead).
    pub skipped: Vec<String>,
    /// Secondary indexes rebuilt (from `indexes.json`).
    pub indexes: Vec<String>,
    /// Where the old index directory was moved, if there was one; nothing
    /// reads it again, remove it once the store checks out.
    pub moved_index: Option<PathBuf>,
}

impl VerifyReport {
    /// Whether every record and payload checked out.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// A lazyvault store opened by this process.
///
/// All methods take `&self`. A handle reads a snapshot (the newest
/// checkpoint plus the committed journal after it, no lock) until its first
/// write; then it takes the writer role, shared by every handle of the
/// store in this process, and reads the writer's index (its own changes
/// included). Writers are serialised internally, readers run concurrently.
pub struct Store {
    root: PathBuf,
    mode: Mode,
    opener_pid: u32,
    state: RwLock<State>,
    /// `None`: [`writer::default_retention`] of the store's file system.
    retention: Mutex<Option<Duration>>,
}

/// What a handle reads through.
enum State {
    Closed,
    Reading(Snapshot),
    Writing(Arc<Writer>),
}

impl State {
    fn index(&self) -> Result<&dyn RecordIndex> {
        match self {
            State::Closed => Err(Error::Closed),
            State::Reading(s) => Ok(s),
            State::Writing(w) => Ok(w.index()),
        }
    }
}

/// Record as decoded for scans: only the metadata fields the query reads
/// (see [`QueryNeeds`]), array facts only if it reads them, everything else
/// (layout, ids, other fields) skipped without building values.
struct ScanRecord<'a> {
    meta: Map<String, Value>,
    arrays: Vec<(String, ScanArray<'a>)>,
}

/// Decodes a [`ScanRecord`] keeping what `needs` names.
struct ScanSeed<'n> {
    needs: &'n QueryNeeds,
}

impl<'de> serde::de::DeserializeSeed<'de> for ScanSeed<'_> {
    type Value = ScanRecord<'de>;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ScanSeed<'_> {
    type Value = ScanRecord<'de>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a record")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut record = ScanRecord {
            meta: Map::new(),
            arrays: Vec::new(),
        };
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match &*key {
                "meta" => record.meta = map.next_value_seed(MetaSeed { needs: self.needs })?,
                "arrays" if self.needs.arrays => record.arrays = map.next_value_seed(ArraysSeed)?,
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(record)
    }
}

/// A map key, borrowed from the input when it has no escapes.
struct KeySeed;

impl<'de> serde::de::DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

/// The metadata object, keeping only the fields `needs` names.
struct MetaSeed<'n> {
    needs: &'n QueryNeeds,
}

impl<'de> serde::de::DeserializeSeed<'de> for MetaSeed<'_> {
    type Value = Map<String, Value>;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for MetaSeed<'_> {
    type Value = Map<String, Value>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a metadata object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut meta = Map::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if self.needs.wants(&key) {
                meta.insert(key.into_owned(), map.next_value::<Value>()?);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(meta)
    }
}

/// The `arrays` object as scans see it.
struct ArraysSeed;

impl<'de> serde::de::DeserializeSeed<'de> for ArraysSeed {
    type Value = Vec<(String, ScanArray<'de>)>;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        deserialize_arrays(d)
    }
}

/// Decodes `bytes` for evaluating a query that needs `needs`.
///
/// Records as this writer stores them start `{"meta":{...},"arrays":{...},`
/// (compact, in that order); then only those two values are parsed, and the
/// layout after them, which repeats the metadata, is never tokenized.
/// Any other shape is decoded in full.
fn decode_for_scan<'a>(bytes: &'a [u8], needs: &QueryNeeds) -> serde_json::Result<ScanRecord<'a>> {
    use serde::de::DeserializeSeed;
    const META: &[u8] = br#"{"meta":"#;
    const ARRAYS: &[u8] = br#","arrays":"#;
    if needs.fields.is_empty() && !needs.arrays {
        return Ok(ScanRecord {
            meta: Map::new(),
            arrays: Vec::new(),
        });
    }
    if let Some(rest) = bytes.strip_prefix(META) {
        if !needs.arrays {
            // One pass over the metadata object; what follows it is never
            // read. The fast scanner hands anything unusual (escaped keys,
            // malformed input) to serde_json, which decodes or reports it.
            let meta = match crate::metascan::fast_meta(rest, needs) {
                Some(meta) => meta,
                None => MetaSeed { needs }
                    .deserialize(&mut serde_json::Deserializer::from_slice(rest))?,
            };
            return Ok(ScanRecord {
                meta,
                arrays: Vec::new(),
            });
        }
        // The extent of the metadata object, then its wanted fields.
        let mut values =
            serde_json::Deserializer::from_slice(rest).into_iter::<&serde_json::value::RawValue>();
        let Some(raw) = values.next().transpose()? else {
            return decode_whole(bytes, needs);
        };
        let after_meta = &rest[values.byte_offset()..];
        let meta =
            MetaSeed { needs }.deserialize(&mut serde_json::Deserializer::from_str(raw.get()))?;
        let arrays = if needs.arrays {
            let Some(rest) = after_meta.strip_prefix(ARRAYS) else {
                return decode_whole(bytes, needs);
            };
            let mut de = serde_json::Deserializer::from_slice(rest);
            ArraysSeed.deserialize(&mut de)?
        } else {
            Vec::new()
        };
        return Ok(ScanRecord { meta, arrays });
    }
    decode_whole(bytes, needs)
}

fn decode_whole<'a>(bytes: &'a [u8], needs: &QueryNeeds) -> serde_json::Result<ScanRecord<'a>> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let record = ScanSeed { needs }.deserialize(&mut de)?;
    de.end()?;
    Ok(record)
}

#[derive(Deserialize)]
struct ScanArray<'a> {
    #[serde(borrow)]
    descr: Cow<'a, str>,
    #[serde(borrow)]
    dtype: Cow<'a, str>,
    shape: Vec<u64>,
    nbytes: u64,
}

fn deserialize_arrays<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<(String, ScanArray<'de>)>, D::Error> {
    struct Arrays;
    impl<'de> serde::de::Visitor<'de> for Arrays {
        type Value = Vec<(String, ScanArray<'de>)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of array entries")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(map.size_hint().unwrap_or(1));
            while let Some((k, v)) = map.next_entry::<String, ScanArray<'de>>()? {
                out.push((k, v));
            }
            Ok(out)
        }
    }
    d.deserialize_map(Arrays)
}

struct ScanView<'a> {
    key: &'a str,
    record: &'a ScanRecord<'a>,
}

impl RecordView for ScanView<'_> {
    fn key(&self) -> &str {
        self.key
    }
    fn meta(&self) -> &Map<String, Value> {
        &self.record.meta
    }
    fn array(&self, name: &str) -> Option<ArrayFacts<'_>> {
        // Records hold few arrays: a linear search beats hashing here.
        self.record
            .arrays
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| ArrayFacts {
                shape: &a.shape,
                dtype: &a.dtype,
                descr: &a.descr,
                nbytes: a.nbytes,
            })
    }
}

fn write_file_durably(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("json{TMP_SUFFIX}"));
    fsio::write_new_file(path, &tmp, &[contents]).map_err(Error::io(&tmp))?;
    payload::sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// The journal after the index's position, as found at open.
struct JournalTail {
    /// How many changes a flush acknowledged (a commit follows them) that
    /// the index does not reflect: the index is behind, not the journal.
    lost: Option<usize>,
    /// Where the journal can be cut: after the last commit past the
    /// index's position, or at that position.
    keep: journal::Position,
    /// Whether changes the index holds follow the last commit before its
    /// position (a crash after sled wrote them, before a flush): they need
    /// a commit so that readers see what the writer sees.
    uncommitted: bool,
}

/// Reads the journal past the index's position (all of it when the index
/// has none) and compares the acknowledged changes there with the index:
/// after a crash they are duplicates of what the index holds (sled wrote
/// the batch, or a compaction had not yet moved the position); after a
/// power loss that cost the index flushed changes, they are not.
fn journal_tail(root: &Path, index: &Index) -> Result<JournalTail> {
    let committed = index.journal_pos()?.unwrap_or((0, 0));
    let mut keep = committed;
    let mut pending: Vec<journal::Entry> = Vec::new();
    let mut lost = 0;
    // Whether the entry right after the index's position is a commit: a
    // flush appends one there once the index holds the changes before it.
    let mut commit_follows = None;
    for (number, path) in journal::segments(root)? {
        if number < committed.0 {
            continue;
        }
        // Only what follows the position is read: a bulk load's segment of
        // hundreds of MiB costs nothing at the next session's start.
        let start = if number == committed.0 {
            committed.1
        } else {
            0
        };
        let read = journal::read_segment_from(&path, number, start)?;
        for (entry, end) in read.entries {
            if number == committed.0 && commit_follows.is_none() {
                commit_follows = Some(entry.change == journal::Change::Commit);
            }
            if entry.change == journal::Change::Commit {
                for change in pending.drain(..) {
                    let reflected = match &change.change {
                        journal::Change::Put { record, pickle } => {
                            index.get(&change.key)?.as_deref() == Some(&record[..])
                                && index.get_pickle(&change.key)? == *pickle
                        }
                        journal::Change::Delete => !index.contains(&change.key)?,
                        journal::Change::Commit => true,
                    };
                    if !reflected {
                        lost += 1;
                    }
                }
                keep = (number, end);
            } else {
                pending.push(entry);
            }
        }
        // A torn tail ends the segment; the next one goes on.
    }
    Ok(JournalTail {
        lost: (lost > 0).then_some(lost),
        keep,
        // Without a commit right after it, what the index holds up to its
        // position may be uncommitted (a crash after sled wrote it): commit
        // it (an empty commit when it was committed already: harmless).
        uncommitted: committed != (0, 0) && commit_follows != Some(true) && keep == committed,
    })
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        Err(Error::EmptyKey)
    } else {
        Ok(())
    }
}

/// Read access to a handle's current view, held for one operation.
struct View<'a>(RwLockReadGuard<'a, State>);

impl View<'_> {
    fn index(&self) -> &dyn RecordIndex {
        self.0.index().expect("checked open")
    }
}

impl Store {
    /// Opens the store at `path` in `mode` (see [`Mode`]).
    ///
    /// An existing store opens as a reader in modes `"r"` and `"a"`: no
    /// lock, no file created or changed, read-only media fine. Mode `"a"`
    /// takes the writer role at its first write; creating a store (mode
    /// `"w"`, or `"a"` on a missing or empty directory) takes it at once.
    ///
    /// # Errors
    /// [`Error::Exists`] / [`Error::NotFound`] / [`Error::NotAStore`] by
    /// mode, [`Error::Format`] for a newer major format version,
    /// [`Error::Corrupt`] for a damaged checkpoint, [`Error::Locked`] when
    /// creating a store another process is creating.
    pub fn open(path: impl AsRef<Path>, mode: Mode) -> Result<Store> {
        Self::open_inner(path.as_ref(), mode, None)
    }

    /// Opens the store at `path` read-only as of commit `version` (see
    /// [`Store::version`]): how a pickled store comes back in another
    /// process. The checkpoint before that version must still be there
    /// (its sender's snapshot keeps it).
    ///
    /// # Errors
    /// As [`Store::open`]; [`Error::Corrupt`] when the version is no longer
    /// available.
    pub fn open_at(path: impl AsRef<Path>, version: u64) -> Result<Store> {
        Self::open_inner(path.as_ref(), Mode::ReadOnly, Some(version))
    }

    fn open_inner(root: &Path, mode: Mode, at: Option<u64>) -> Result<Store> {
        // Absolute: a later chdir must not move the store under the handle.
        let root = std::path::absolute(root).map_err(Error::io(root))?;
        let exists = root.exists();
        match mode {
            Mode::Create if exists => return Err(Error::Exists(root)),
            Mode::ReadOnly if !exists => return Err(Error::NotFound(root)),
            _ => {}
        }
        if exists && !root.is_dir() {
            return Err(Error::NotAStore(root));
        }
        let manifest_path = root.join(MANIFEST_FILE);
        let has_manifest = exists && manifest_path.exists();
        if !has_manifest && exists && !Self::is_empty_or_unfinished(&root)? {
            return Err(Error::NotAStore(root));
        }
        if !has_manifest && mode == Mode::ReadOnly {
            return Err(Error::NotFound(root));
        }
        let state = if has_manifest {
            let bytes = fs::read(&manifest_path).map_err(Error::io(&manifest_path))?;
            Manifest::from_json(&bytes).map_err(|source| Error::Format {
                path: manifest_path.clone(),
                source,
            })?;
            State::Reading(Snapshot::open(&root, at)?)
        } else {
            State::Writing(Self::create(&root)?)
        };
        Ok(Store {
            root,
            mode,
            opener_pid: std::process::id(),
            state: RwLock::new(state),
            retention: Mutex::new(None),
        })
    }

    /// Creates a store in `root` (missing, empty, or left by an
    /// interrupted creation) and returns its writer: everything else
    /// first, the manifest last, so that a crash at any point leaves a
    /// directory without a manifest, which is created again from scratch.
    fn create(root: &Path) -> Result<Arc<Writer>> {
        fs::create_dir_all(root).map_err(Error::io(root))?;
        let lock_file = writer::lock(root)?;
        let index_dir = root.join(INDEX_DIR);
        // An index left by such a crash may be torn (sled writes its files
        // without a temporary name).
        if fs::symlink_metadata(&index_dir).is_ok() {
            fs::remove_dir_all(&index_dir).map_err(Error::io(&index_dir))?;
        }
        for dir in [PAYLOAD_DIR, JOURNAL_DIR] {
            fs::create_dir_all(root.join(dir)).map_err(Error::io(root))?;
        }
        let index = Index::open(&index_dir)?;
        index.flush()?;
        let manifest = Manifest::new(format!("lazyvault {}", env!("CARGO_PKG_VERSION")));
        write_file_durably(&root.join(MANIFEST_FILE), &manifest.to_json())?;
        let writer = Writer::take(root, Some((lock_file, index)))?;
        Writer::register(root, writer)
    }

    /// Before the first write of a session: cuts the journal back to the
    /// position the index holds. Entries past it belong to changes a crash
    /// cut off before their index entry (never acknowledged by a flush);
    /// left in place, a later repair would bring them back. Changes the
    /// index holds but no commit covers get one, so readers see them too.
    /// Returns the number of the next segment.
    pub(crate) fn recover_journal(root: &Path, index: &Index) -> Result<u64> {
        let segments = journal::segments(root)?;
        let tail = journal_tail(root, index)?;
        if let Some(lost) = tail.lost {
            return Err(Error::corrupt(
                format!("store {}", root.display()),
                format!(
                    "the index is behind the journal: {lost} change(s) that flush() acknowledged \
                     are missing from it (a power loss, or a damaged index); `lazyvault repair \
                     {}` rebuilds it from the journal",
                    root.display()
                ),
            ));
        }
        // Cut the changes no flush acknowledged: a crash cut them off
        // before their index entry.
        let (keep_segment, keep_end) = tail.keep;
        let mut changed = false;
        for (number, path) in &segments {
            if *number > keep_segment {
                fsio::remove_file(path).map_err(Error::io(path))?;
                changed = true;
            } else if *number == keep_segment {
                let len = fs::metadata(path).map_err(Error::io(path))?.len();
                if len > keep_end || tail.uncommitted {
                    let mut file = File::options()
                        .write(true)
                        .open(path)
                        .map_err(Error::io(path))?;
                    fsio::truncate(&file, path, keep_end).map_err(Error::io(path))?;
                    if tail.uncommitted {
                        let commit = journal::encode(&journal::Entry {
                            key: String::new(),
                            change: journal::Change::Commit,
                        });
                        file.seek(SeekFrom::Start(keep_end))
                            .map_err(Error::io(path))?;
                        fsio::write_all(&mut file, path, &commit).map_err(Error::io(path))?;
                    }
                    fsio::sync_file(&file, path).map_err(Error::io(path))?;
                }
            }
        }
        if changed {
            payload::sync_dir(&root.join(JOURNAL_DIR))?;
        }
        // Right after the last segment kept: segment numbers stay
        // consecutive, which readers rely on to find them without listing.
        let kept = segments
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| *n <= keep_segment);
        Ok(kept.max().map_or(1, |n| n + 1).max(keep_segment + 1))
    }

    /// Whether `root` holds nothing, or only what an interrupted creation
    /// leaves before the manifest is in place (lock file, empty payload and
    /// journal directories, an index, a temporary manifest): then creating
    /// the store is safe. Payloads or journal entries mean a store that lost
    /// its manifest: refused, never overwritten.
    fn is_empty_or_unfinished(root: &Path) -> Result<bool> {
        let tmp_manifest = format!("{MANIFEST_FILE}{TMP_SUFFIX}");
        for entry in fs::read_dir(root).map_err(Error::io(root))? {
            let entry = entry.map_err(Error::io(root))?;
            let name = entry.file_name();
            let ours = match name.to_str() {
                Some(n) if n == LOCK_FILE || n == tmp_manifest || n == INDEX_DIR => true,
                Some(PAYLOAD_DIR | JOURNAL_DIR) => fs::read_dir(entry.path())
                    .map(|mut d| d.next().is_none())
                    .unwrap_or(false),
                _ => false,
            };
            if !ours {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The mode it was opened with.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether this handle holds the writer role (it has written).
    pub fn is_writer(&self) -> bool {
        matches!(*self.read_state(), State::Writing(_))
    }

    fn read_state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn check_fork(&self) -> Result<()> {
        let current = std::process::id();
        if current != self.opener_pid {
            return Err(Error::Forked {
                opener: self.opener_pid,
                current,
            });
        }
        Ok(())
    }

    /// The current view, for reading.
    fn view(&self) -> Result<View<'_>> {
        self.check_fork()?;
        let guard = self.read_state();
        guard.index()?;
        Ok(View(guard))
    }

    /// The writer role, taken now if this handle has not written yet (see
    /// [`Store::open`]).
    ///
    /// # Errors
    /// [`Error::ReadOnly`] in mode `"r"`, [`Error::Locked`] while another
    /// process writes, [`Error::Closed`], and the errors of taking the role.
    fn writer(&self) -> Result<(View<'_>, Arc<Writer>)> {
        let view = self.view()?;
        if self.mode == Mode::ReadOnly {
            return Err(Error::ReadOnly);
        }
        if let State::Writing(w) = &*view.0 {
            let w = w.clone();
            return Ok((view, w));
        }
        drop(view);
        {
            let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
            match &*state {
                State::Closed => return Err(Error::Closed),
                State::Writing(_) => {}
                State::Reading(_) => *state = State::Writing(Writer::acquire(&self.root)?),
            }
        }
        let view = self.view()?;
        match &*view.0 {
            State::Writing(w) => {
                let w = w.clone();
                Ok((view, w))
            }
            _ => Err(Error::Closed),
        }
    }

    /// Takes the writer role now rather than at the first write (as
    /// SQLite's `BEGIN IMMEDIATE`): recovers what a crashed writer left and
    /// shows the latest state, changes a crash left in the index included.
    ///
    /// # Errors
    /// As a first write: [`Error::ReadOnly`], [`Error::Locked`], ...
    pub fn begin_write(&self) -> Result<()> {
        self.writer().map(drop)
    }

    /// How long superseded checkpoints and retired payloads are kept for
    /// readers on other machines.
    pub fn retention(&self) -> Duration {
        let set = *self.retention.lock().unwrap_or_else(|p| p.into_inner());
        set.unwrap_or_else(|| writer::default_retention(&self.root))
    }

    /// Sets [`Store::retention`] for this handle's flushes, closes and
    /// `gc()`.
    pub fn set_retention(&self, retention: Duration) {
        *self.retention.lock().unwrap_or_else(|p| p.into_inner()) = Some(retention);
    }

    /// The version this handle shows: the number of commits (flushes and
    /// closes that changed something, `gc()`) since the store was created,
    /// as of its snapshot; for the writer, its last commit.
    pub fn version(&self) -> Result<u64> {
        let view = self.view()?;
        Ok(match &*view.0 {
            State::Reading(s) => s.version(),
            State::Writing(w) => w.lock().version,
            State::Closed => unreachable!("checked open"),
        })
    }

    /// Moves a reader's snapshot to the latest commit and returns its
    /// version; the writer already shows it.
    pub fn refresh(&self) -> Result<u64> {
        self.check_fork()?;
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        match &mut *state {
            State::Closed => Err(Error::Closed),
            State::Reading(s) => s.refresh(),
            State::Writing(w) => Ok(w.lock().version),
        }
    }

    /// Writes the payloads of `arrays`, appends the record to the journal,
    /// then sets `key` to the record made of `meta`, `layout`, the new array
    /// entries and `pickle` (invariant 3: payloads durable first, then the
    /// index entry; the journal is made durable by the next flush, before
    /// the index is). The payloads of a record this replaces are removed
    /// once a flush committed the change and no reader may still see them.
    /// Same as [`Store::put_many`] with one record.
    ///
    /// # Errors
    /// [`Error::EmptyKey`], [`Error::ReadOnly`], [`Error::Locked`] when
    /// another process writes, [`Error::InvalidArray`] for an array whose
    /// bytes do not match its dtype and shape, I/O errors (`ENOSPC`, `EIO`,
    /// ... kept in [`Error::Io`]). On error the old record (if any) is
    /// untouched, the payloads written for the new one are removed and its
    /// journal entry is cut off.
    pub fn put(
        &self,
        key: &str,
        meta: Map<String, Value>,
        layout: Value,
        arrays: &[ArraySource<'_>],
        pickle: Option<&[u8]>,
    ) -> Result<()> {
        self.put_many(vec![NewRecord {
            key,
            meta,
            layout,
            arrays,
            pickle,
        }])
    }

    /// Puts every record of `records`, in order (a later record of the same
    /// key replaces an earlier one), all or nothing: the payloads of all of
    /// them are written and made durable together (one `syncfs` barrier for
    /// many files, see FORMAT.md "Write protocol"), then their journal
    /// entries are appended with one write, then the index takes them in
    /// one atomic batch. Much faster than one [`Store::put`] each for many
    /// small records or arrays; durable after the next [`Store::flush`].
    ///
    /// # Errors
    /// As [`Store::put`]. On any error none of the records is set (the old
    /// records stay), every payload written for them is removed and their
    /// journal entries are cut off.
    pub fn put_many(&self, records: Vec<NewRecord<'_>>) -> Result<()> {
        for r in &records {
            check_key(r.key)?;
            let mut names = HashSet::with_capacity(r.arrays.len());
            for src in r.arrays {
                if !names.insert(&src.name) {
                    return Err(Error::InvalidArray {
                        name: src.name.clone(),
                        detail: "two arrays with the same name".into(),
                    });
                }
            }
        }
        let (_view, w) = self.writer()?;
        let index = w.index();
        if index.io_failed() {
            return Err(index.stuck_error());
        }
        let payload: u64 = records
            .iter()
            .flat_map(|r| r.arrays.iter())
            .map(|a| a.data.len() as u64 + 4096)
            .sum();
        w.check_space_for(records.len(), payload)?;
        let mut state = w.lock();
        let records = records.into_iter().map(|r| (r, IndexMap::new())).collect();
        self.put_locked(index, &mut state, records)
    }

    /// Replaces the arrays of the record under `key` named like those of
    /// `arrays` (dtype and shape may change), keeping its metadata, layout,
    /// pickled remainder and other arrays: only the new payloads are
    /// written, as h5py's `del group[name]; group[name] = ...`, instead of
    /// the whole object. The replaced payloads are removed as those of
    /// [`Store::put`]. Returns `false`, changing nothing, when there is no
    /// record under `key`.
    ///
    /// # Errors
    /// [`Error::InvalidArray`] for a name the record has no array of (store
    /// the whole object to add arrays) or given twice; otherwise as
    /// [`Store::put`].
    pub fn replace_arrays(&self, key: &str, arrays: &[ArraySource<'_>]) -> Result<bool> {
        check_key(key)?;
        let (_view, w) = self.writer()?;
        let index = w.index();
        if index.io_failed() {
            return Err(index.stuck_error());
        }
        let payload: u64 = arrays.iter().map(|a| a.data.len() as u64 + 4096).sum();
        w.check_space_for(1, payload)?;
        // Read under the writer lock: no put can retire these payloads
        // between this read and the new record.
        let mut state = w.lock();
        let Some(json) = index.get(key)? else {
            return Ok(false);
        };
        let old =
            Record::from_json(&json).map_err(|e| Error::corrupt(format!("record {key:?}"), e))?;
        let mut kept = old.arrays;
        for (i, src) in arrays.iter().enumerate() {
            let detail = if arrays[..i].iter().any(|a| a.name == src.name) {
                "two arrays with the same name"
            } else if !kept.contains_key(&src.name) {
                "the record has no array of this name (store the whole object to add one)"
            } else {
                continue;
            };
            return Err(Error::InvalidArray {
                name: src.name.clone(),
                detail: detail.into(),
            });
        }
        for src in arrays {
            kept.shift_remove(&src.name);
        }
        let pickle = if old.pickle {
            index.get_pickle(key)?
        } else {
            None
        };
        let record = NewRecord {
            key,
            meta: old.meta,
            layout: old.layout,
            arrays,
            pickle: pickle.as_deref(),
        };
        self.put_locked(index, &mut state, vec![(record, kept)])?;
        Ok(true)
    }

    /// Writes `records` (each with the entries of arrays it keeps from the
    /// record it replaces) as [`Store::put_many`] describes; the caller
    /// holds the writer lock.
    fn put_locked(
        &self,
        index: &Index,
        writer: &mut WriterState,
        records: Vec<(NewRecord<'_>, IndexMap<String, ArrayEntry>)>,
    ) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let files = records.iter().map(|(r, _)| r.arrays.len()).sum();
        // payloads the new records keep from the ones they replace
        let kept_ids: Vec<HashSet<String>> = records
            .iter()
            .map(|(_, kept)| kept.values().map(|e| e.id.clone()).collect())
            .collect();
        let mut payloads = PayloadWriter::new(&self.root, files)?;
        let before = writer.journal.position();
        let mut appended = false;
        // The keys set and, for each, the record it replaced.
        type Done = (Vec<String>, Vec<Option<Vec<u8>>>);
        let committed = (|| -> Result<Done> {
            let mut entries = Vec::with_capacity(records.len());
            for (r, kept) in &records {
                let mut e = kept.clone();
                for src in r.arrays {
                    e.insert(src.name.clone(), payloads.write(src)?);
                }
                entries.push(e);
            }
            payloads.finish()?;
            if payloads.dirs_durable {
                writer.durable_dirs.extend(payloads.dirs.iter().cloned());
            } else {
                Self::sync_payload_dirs(&self.root, writer, &payloads.dirs)?;
            }
            let mut jsons = Vec::with_capacity(records.len());
            for ((r, _), arrays) in records.into_iter().zip(entries) {
                let json = Record {
                    meta: r.meta,
                    arrays,
                    layout: r.layout,
                    pickle: r.pickle.is_some(),
                }
                .to_json();
                jsons.push((r.key, json, r.pickle));
            }
            let puts: Vec<journal::Put<'_>> =
                jsons.iter().map(|(k, j, p)| (*k, &j[..], *p)).collect();
            let pos = writer.journal.put_many(&puts)?;
            appended = true;
            let replaced = index.put_many(&puts, pos)?;
            Ok((
                jsons.iter().map(|(k, _, _)| (*k).to_owned()).collect(),
                replaced,
            ))
        })();
        match committed {
            Err(e) => {
                if appended {
                    writer.journal.undo_to(Some(
                        before.map_or(journal::SEGMENT_HEADER_LEN, |(_, end)| end),
                    ));
                }
                // Nothing references these payloads: remove them now.
                payloads.abort();
                Err(e)
            }
            Ok((keys, replaced)) => {
                writer.dirty.extend(keys);
                for (old, kept) in replaced.into_iter().zip(kept_ids) {
                    if let Some(old) = old {
                        Self::retire(writer, &old, &kept);
                    }
                }
                Ok(())
            }
        }
    }

    /// fsyncs the directories `dirs` that payloads were renamed into and,
    /// the first time this session uses one, `arrays/` (which may have just
    /// gained it; afterwards its entry is known durable).
    fn sync_payload_dirs(
        root: &Path,
        writer: &mut WriterState,
        dirs: &BTreeSet<PathBuf>,
    ) -> Result<()> {
        let new_dirs: Vec<&PathBuf> = dirs
            .iter()
            .filter(|d| !writer.durable_dirs.contains(*d))
            .collect();
        for dir in dirs {
            payload::sync_dir(dir)?;
        }
        if !new_dirs.is_empty() {
            payload::sync_dir(&root.join(PAYLOAD_DIR))?;
            writer.durable_dirs.extend(new_dirs.into_iter().cloned());
        }
        Ok(())
    }

    /// Queues the payloads of a replaced or deleted record, except those
    /// with an id in `kept` (still referenced), for removal once a commit
    /// covers the change and no reader may still see them. A damaged old
    /// record leaves orphans for gc(), nothing worse.
    fn retire(writer: &mut WriterState, record: &[u8], kept: &HashSet<String>) {
        if let Ok(old) = Record::from_json(record) {
            writer.retiring.extend(
                old.arrays
                    .values()
                    .filter(|e| !kept.contains(&e.id))
                    .map(ArrayEntry::relpath),
            );
        }
    }

    /// The record JSON of `key` as stored (see FORMAT.md), or `None`.
    pub fn get_json(&self, key: &str) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        self.view()?.index().get(key)
    }

    /// The decoded, validated record of `key`, or `None`.
    pub fn get(&self, key: &str) -> Result<Option<Record>> {
        match self.get_json(key)? {
            None => Ok(None),
            Some(bytes) => Record::from_json(&bytes)
                .map(Some)
                .map_err(|e| Error::corrupt(format!("record {key:?}"), e)),
        }
    }

    /// The record JSON of `key` and its pickled remainder, read together:
    /// writers are held off between the two reads, so the remainder always
    /// belongs to that record (never to a record that replaced it).
    pub fn get_with_pickle(&self, key: &str) -> Result<Option<RecordBytes>> {
        check_key(key)?;
        let view = self.view()?;
        let _writers = match &*view.0 {
            State::Writing(w) => Some(w.lock()),
            _ => None,
        };
        let index = view.index();
        let Some(record) = index.get(key)? else {
            return Ok(None);
        };
        let pickle = index.get_pickle(key)?;
        Ok(Some((record, pickle)))
    }

    /// The pickled remainder of `key`, if it has one.
    pub fn get_pickle(&self, key: &str) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        self.view()?.index().get_pickle(key)
    }

    /// Whether `key` has a record.
    pub fn contains(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        self.view()?.index().contains(key)
    }

    /// Number of records (O(1)).
    pub fn len(&self) -> Result<u64> {
        self.view()?.index().len()
    }

    /// Whether the store has no records.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Removes `key`; returns whether it was there. Its payloads are removed
    /// as those of a replaced record (see [`Store::put`]).
    pub fn delete(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        let (_view, w) = self.writer()?;
        let index = w.index();
        if index.io_failed() {
            return Err(index.stuck_error());
        }
        w.check_space_for(1, 0)?;
        let mut writer = w.lock();
        if !index.contains(key)? {
            return Ok(false);
        }
        let before = writer.journal.position();
        let pos = writer.journal.delete(key)?;
        match index.remove(key, pos) {
            Ok(old) => {
                writer.dirty.insert(key.to_owned());
                if let Some(old) = old {
                    Self::retire(&mut writer, &old, &HashSet::new());
                }
                Ok(true)
            }
            Err(e) => {
                writer.journal.undo_to(Some(
                    before.map_or(journal::SEGMENT_HEADER_LEN, |(_, end)| end),
                ));
                Err(e)
            }
        }
    }

    /// All keys, in Unicode code point order.
    pub fn keys(&self) -> Result<Vec<String>> {
        let view = self.view()?;
        let mut keys = Vec::new();
        index::scan(view.index(), |k, _| {
            keys.push(k.to_owned());
            Ok(())
        })?;
        Ok(keys)
    }

    /// Calls `f(key)` for each record matching `query` (all records when
    /// `None`), in key order. Reads only the index, never a payload. When a
    /// secondary index can narrow the query (see [`Store::explain`]), only
    /// its candidates are read, and the whole query is evaluated on each.
    pub fn scan_matching(
        &self,
        query: Option<&Query>,
        mut f: impl FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        let view = self.view()?;
        let index = view.index();
        let needs = query.map(Query::needs);
        if let Some(q) = query {
            let needs = needs.as_ref().expect("set with the query");
            if let Some(plan) = q.index_plan(&|segs| index.is_indexed(segs)) {
                for key in index.lookup(&plan.field.join("."), &plan.lookup)? {
                    let Some(bytes) = index.get(&key)? else {
                        continue;
                    };
                    let record = decode_for_scan(&bytes, needs)
                        .map_err(|e| Error::corrupt(format!("record {key:?}"), e))?;
                    if q.matches(&ScanView {
                        key: &key,
                        record: &record,
                    }) {
                        f(&key)?;
                    }
                }
                return Ok(());
            }
        }
        index::scan(index, |key, bytes| {
            let Some(query) = query else {
                return f(key);
            };
            let record = decode_for_scan(bytes, needs.as_ref().expect("set with the query"))
                .map_err(|e| Error::corrupt(format!("record {key:?}"), e))?;
            if query.matches(&ScanView {
                key,
                record: &record,
            }) {
                f(key)?;
            }
            Ok(())
        })
    }

    /// How [`Store::find`] would run `query`: `"index <field>: <lookup>,
    /// <n> candidates"` when a secondary index narrows it, else `"full scan
    /// of <n> records"` with the reason.
    pub fn explain(&self, query: &Query) -> Result<String> {
        let view = self.view()?;
        let index = view.index();
        match query.index_plan(&|segs| index.is_indexed(segs)) {
            Some(plan) => {
                let field = plan.field.join(".");
                let candidates = index.lookup(&field, &plan.lookup)?.len();
                let lookup = match &plan.lookup {
                    crate::query::IndexLookup::Points(values) => {
                        let shown: Vec<String> = values.iter().map(Value::to_string).collect();
                        format!("equal to one of [{}]", shown.join(", "))
                    }
                    crate::query::IndexLookup::Range { lower, upper } => {
                        let bound = |b: &Option<(Value, bool)>, incl: &str, excl: &str| {
                            b.as_ref().map(|(v, inclusive)| {
                                format!("{} {v}", if *inclusive { incl } else { excl })
                            })
                        };
                        [bound(lower, ">=", ">"), bound(upper, "<=", "<")]
                            .into_iter()
                            .flatten()
                            .collect::<Vec<_>>()
                            .join(" and ")
                    }
                };
                Ok(format!(
                    "index {field}: {lookup}, {candidates} candidate record(s), each checked \
                     against the whole query"
                ))
            }
            None => {
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
                Ok(format!("full scan of {} records ({why})", index.len()?))
            }
        }
    }

    /// Creates a secondary index on the metadata field `field` (a dotted
    /// path: `"temperature"`, `"params.lr"`), built from every record now
    /// and kept current by every put and delete. Equality, `in [...]` and
    /// range queries on the field then read only the matching records.
    /// Creating an existing index does nothing. Scalar values (null,
    /// booleans, numbers, strings) are indexed; lists and objects are not
    /// (no indexable condition can match them).
    ///
    /// # Errors
    /// [`Error::InvalidField`] for a name that is not a dotted field path,
    /// [`Error::ReadOnly`], I/O errors.
    pub fn create_index(&self, field: &str) -> Result<()> {
        let segs = crate::secondary::parse_field(field).map_err(Error::InvalidField)?;
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
    pub fn drop_index(&self, field: &str) -> Result<bool> {
        let (_view, w) = self.writer()?;
        let index = w.index();
        let _writer = w.lock();
        let existed = index.drop_index(field)?;
        index.flush()?;
        self.write_index_list(&index.indexes())?;
        Ok(existed)
    }

    /// The fields that have a secondary index, sorted.
    pub fn indexes(&self) -> Result<Vec<String>> {
        Ok(self.view()?.index().indexes())
    }

    fn write_index_list(&self, names: &[String]) -> Result<()> {
        let mut sorted = names.to_vec();
        sorted.sort();
        let mut text = serde_json::to_vec_pretty(&serde_json::json!({ "indexes": sorted }))
            .expect("serializes");
        text.push(b'\n');
        write_file_durably(&self.root.join(INDEXES_FILE), &text)
    }

    /// Keys of the records whose metadata match `query`, in key order.
    /// A full scan runs on two threads when there are two cores (see
    /// [`Store::explain`] for when a secondary index is used instead).
    pub fn find(&self, query: &Query) -> Result<Vec<String>> {
        if let Some(parts) = self.scan_split(query, |key, keys: &mut Vec<String>| {
            keys.push(key.to_owned())
        })? {
            return Ok(parts.concat());
        }
        let mut keys = Vec::new();
        self.scan_matching(Some(query), |k| {
            keys.push(k.to_owned());
            Ok(())
        })?;
        Ok(keys)
    }

    /// Number of records whose metadata match `query` (scanning as
    /// [`Store::find`] does).
    pub fn count(&self, query: &Query) -> Result<u64> {
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
        let needs = query.needs();
        index::scan_split(index, |key, bytes, acc| {
            let record = decode_for_scan(bytes, &needs)
                .map_err(|e| Error::corrupt(format!("record {key:?}"), e))?;
            if query.matches(&ScanView {
                key,
                record: &record,
            }) {
                add(key, acc);
            }
            Ok(())
        })
        .map(Some)
    }

    /// Makes every change so far durable (the journal first, one fsync,
    /// then the index) and commits it: readers that open or `refresh()`
    /// from now on see it. Then removes the payloads of replaced records
    /// that no reader may still see. A reader, or a handle that has not
    /// written, has nothing to flush. If a flush fails, nothing is removed
    /// and the error is returned.
    pub fn flush(&self) -> Result<()> {
        let view = self.view()?;
        let State::Writing(w) = &*view.0 else {
            return Ok(());
        };
        let retention = self.retention();
        let mut state = w.lock();
        w.flush(&mut state, retention)
    }

    /// Flushes, publishes a checkpoint (so readers open in constant time),
    /// and releases the snapshot, or the writer role when this is the last
    /// handle holding it (the index and the lock). Idempotent; any other
    /// call afterwards raises [`Error::Closed`].
    pub fn close(&self) -> Result<()> {
        // Never touch sled in a forked child: flush would hang.
        self.check_fork()?;
        let retention = self.retention();
        let old = std::mem::replace(
            &mut *self.state.write().unwrap_or_else(|p| p.into_inner()),
            State::Closed,
        );
        let State::Writing(w) = old else {
            return Ok(());
        };
        let finished = w.finish(retention);
        let released = match Arc::try_unwrap(w) {
            Ok(w) => w.shutdown(),
            Err(_shared) => Ok(()), // another handle of this process writes on
        };
        finished.and(released)
    }

    /// Whether [`Store::close`] was called.
    pub fn is_closed(&self) -> bool {
        matches!(*self.read_state(), State::Closed)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if std::process::id() == self.opener_pid {
            let _ = self.close();
        }
        // In a forked child the writer (if any) is leaked by its own Drop.
    }
}
