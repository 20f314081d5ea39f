//! The store: a directory with a manifest, a sled index and payload files.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

use indexmap::IndexMap;
use lazyvault_schema::{ArrayEntry, Manifest, Record, MANIFEST_FILE, PAYLOAD_DIR};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::fsio;
use crate::index::{self, Index};
use crate::payload::{self, ArraySource, TMP_SUFFIX};
use crate::query::{ArrayFacts, Query, RecordView};
use crate::sidecar::{self, SIDECAR_DIR};

/// Directory of the sled index inside a store.
pub const INDEX_DIR: &str = "index";
/// The lock file naming the process that holds the store.
pub const LOCK_FILE: &str = "lazyvault.lock";
/// The list of secondary indexes, kept outside sled so `repair` can
/// rebuild them: `{"indexes": ["temperature", "params.lr"]}`.
pub const INDEXES_FILE: &str = "indexes.json";

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
}

/// What `verify()` found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Records checked.
    pub records: u64,
    /// Payloads checked.
    pub arrays: u64,
    /// Payloads whose data was hashed against the checksum recorded at
    /// write time.
    pub checksummed: u64,
    /// One line per damaged or missing payload or sidecar, or undecodable
    /// record.
    pub problems: Vec<String>,
    /// Payload, sidecar or temporary files that no record references
    /// (`gc()` removes them).
    pub orphans: Vec<PathBuf>,
}

/// What [`Store::repair`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// Records in the rebuilt index.
    pub records: u64,
    /// Sidecar files read.
    pub sidecars: u64,
    /// Older sidecars of a key that a newer one replaced (orphans for `gc()`).
    pub superseded: u64,
    /// Sidecars not used, one line each with the reason (damaged file,
    /// missing or damaged payload). Their files are left in place.
    pub skipped: Vec<String>,
    /// Secondary indexes rebuilt (from `indexes.json`).
    pub indexes: Vec<String>,
    /// Where the old index directory was moved, if there was one; nothing
    /// reads it again, remove it once the store checks out.
    pub moved_index: Option<PathBuf>,
}

/// The writer's state, behind the mutex that serialises writers.
struct WriterState {
    /// Files (relative to the root) of records replaced or deleted since the
    /// last flush: payloads and sidecars. They are unlinked only after the
    /// index change that dropped them is durable, so a crash never leaves a
    /// record whose files are gone (invariant 3).
    pending_removal: Vec<String>,
    /// The generation the next put's sidecar gets.
    next_generation: u64,
    /// Fan-out directories (`arrays/<xx>`, `records/<gg>`) whose entry in
    /// their parent this session has already fsynced: the parent need not
    /// be fsynced again for them.
    durable_dirs: HashSet<PathBuf>,
}

impl VerifyReport {
    /// Whether every record and payload checked out.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// A lazyvault store opened by this process.
///
/// All methods take `&self`; writers are serialised internally, readers run
/// concurrently. The sled index and the lock are held until [`Store::close`]
/// (or drop).
pub struct Store {
    root: PathBuf,
    mode: Mode,
    opener_pid: u32,
    index: RwLock<Option<Index>>,
    /// Serialises writers.
    writer: Mutex<WriterState>,
    lock_file: Mutex<Option<File>>,
}

/// Record as decoded for scans: borrows strings from the index's bytes
/// where it can, and skips the layout and payload ids without building them.
#[derive(Deserialize)]
struct ScanRecord<'a> {
    meta: Map<String, Value>,
    #[serde(borrow, deserialize_with = "deserialize_arrays")]
    arrays: Vec<(String, ScanArray<'a>)>,
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

/// Unlinks `relpaths` under `root`, ignoring failures: a file left behind
/// is an orphan that `gc()` removes, never a loss.
fn remove_quietly(root: &Path, relpaths: impl IntoIterator<Item = String>) {
    for rel in relpaths {
        let _ = fsio::remove_file(&root.join(rel));
    }
}

/// How many absent generations in a row end the search for sidecars left
/// by puts that a crash cut off before their index entry.
const UNCOMMITTED_PROBE: u64 = 64;

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        Err(Error::EmptyKey)
    } else {
        Ok(())
    }
}

impl Store {
    /// Opens the store at `path` in `mode` (see [`Mode`]).
    ///
    /// # Errors
    /// [`Error::Locked`] when another `Store` holds it (naming its PID),
    /// [`Error::Exists`] / [`Error::NotFound`] / [`Error::NotAStore`] by
    /// mode, [`Error::Format`] for a newer major format version.
    pub fn open(path: impl AsRef<Path>, mode: Mode) -> Result<Store> {
        let root = path.as_ref().to_owned();
        let exists = root.exists();
        match mode {
            Mode::Create if exists => return Err(Error::Exists(root)),
            Mode::ReadOnly if !exists => return Err(Error::NotFound(root)),
            _ => {}
        }
        if !exists {
            fs::create_dir_all(&root).map_err(Error::io(&root))?;
        } else if !root.is_dir() {
            return Err(Error::NotAStore(root));
        }
        let manifest_path = root.join(MANIFEST_FILE);
        let has_manifest = manifest_path.exists();
        if !has_manifest {
            if !Self::is_empty_or_unfinished(&root)? {
                return Err(Error::NotAStore(root));
            }
            if mode == Mode::ReadOnly {
                return Err(Error::NotFound(root));
            }
        }
        let lock_file = Self::lock(&root)?;
        if has_manifest {
            let bytes = fs::read(&manifest_path).map_err(Error::io(&manifest_path))?;
            Manifest::from_json(&bytes).map_err(|source| Error::Format {
                path: manifest_path.clone(),
                source,
            })?;
        } else {
            for dir in [PAYLOAD_DIR, SIDECAR_DIR] {
                fs::create_dir_all(root.join(dir)).map_err(Error::io(&root))?;
            }
            let manifest = Manifest::new(format!("lazyvault {}", env!("CARGO_PKG_VERSION")));
            write_file_durably(&manifest_path, &manifest.to_json())?;
        }
        let index_dir = root.join(INDEX_DIR);
        if has_manifest && !index_dir.is_dir() {
            // Never recreate it silently: an empty index would make gc()
            // delete every payload.
            return Err(Error::corrupt(
                format!("store {}", root.display()),
                format!(
                    "the index directory {} is missing; `lazyvault repair {}` rebuilds it \
                     from the record sidecars",
                    index_dir.display(),
                    root.display()
                ),
            ));
        }
        let index = Index::open(&index_dir)?;
        let next_generation = if mode == Mode::ReadOnly {
            0
        } else {
            Self::prepare_writer(&root, &index)?
        };
        Ok(Store {
            root,
            mode,
            opener_pid: std::process::id(),
            index: RwLock::new(Some(index)),
            writer: Mutex::new(WriterState {
                pending_removal: Vec::new(),
                next_generation,
                durable_dirs: HashSet::new(),
            }),
            lock_file: Mutex::new(Some(lock_file)),
        })
    }

    /// Before the first write of a session: removes the sidecars of puts a
    /// crash cut off before their index entry. Their generations follow the
    /// last one the index holds; left in place, a repair would resurrect
    /// them (a record whose put failed, or that was deleted since).
    /// Returns the next generation.
    fn prepare_writer(root: &Path, index: &Index) -> Result<u64> {
        // An index from before sidecars existed counts from 0; verify()
        // reports its records as having no sidecar.
        let last = index.generation()?.unwrap_or(0);
        let mut misses = 0;
        let mut generation = last + 1;
        let mut removed = BTreeSet::new();
        while misses < UNCOMMITTED_PROBE {
            let path = root.join(sidecar::relpath(generation));
            if fs::symlink_metadata(&path).is_ok() {
                fsio::remove_file(&path).map_err(Error::io(&path))?;
                removed.insert(path.parent().expect("in a directory").to_owned());
                misses = 0;
            } else {
                misses += 1;
            }
            generation += 1;
        }
        for dir in &removed {
            payload::sync_dir(dir)?;
        }
        Ok(last + 1)
    }

    /// Whether `root` holds nothing, or only what an interrupted creation
    /// leaves before the manifest is in place (lock file, empty payload
    /// directory, temporary manifest): then creating the store is safe.
    fn is_empty_or_unfinished(root: &Path) -> Result<bool> {
        let tmp_manifest = format!("{MANIFEST_FILE}{TMP_SUFFIX}");
        for entry in fs::read_dir(root).map_err(Error::io(root))? {
            let entry = entry.map_err(Error::io(root))?;
            let name = entry.file_name();
            let ours = match name.to_str() {
                Some(n) if n == LOCK_FILE || n == tmp_manifest => true,
                Some(PAYLOAD_DIR | SIDECAR_DIR) => fs::read_dir(entry.path())
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

    /// Takes the store's exclusive lock (`flock`) and writes our PID into the
    /// lock file, so a second opener can name the holder.
    fn lock(root: &Path) -> Result<File> {
        let path = root.join(LOCK_FILE);
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(Error::io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let pid = text.trim().parse::<u32>().ok();
                let holder = match pid {
                    Some(p) if p == std::process::id() => {
                        format!("this process (PID {p}): close the other Store first")
                    }
                    Some(p) => format!("process {p}"),
                    None => "another process".to_owned(),
                };
                return Err(Error::Locked {
                    path: root.to_owned(),
                    holder,
                    pid,
                });
            }
            Err(fs::TryLockError::Error(e)) => return Err(Error::io(&path)(e)),
        }
        // Overwrite in place, then cut: a reader never sees an empty file.
        let text = format!("{}\n", std::process::id());
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.write_all(text.as_bytes()))
            .and_then(|_| file.set_len(text.len() as u64))
            .map_err(Error::io(&path))?;
        Ok(file)
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The mode it was opened with.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn index(&self) -> Result<RwLockReadGuard<'_, Option<Index>>> {
        let current = std::process::id();
        if current != self.opener_pid {
            return Err(Error::Forked {
                opener: self.opener_pid,
                current,
            });
        }
        let guard = self.index.read().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            return Err(Error::Closed);
        }
        Ok(guard)
    }

    fn writer(&self) -> Result<MutexGuard<'_, WriterState>> {
        if self.mode == Mode::ReadOnly {
            return Err(Error::ReadOnly);
        }
        Ok(self.writer_lock())
    }

    fn writer_lock(&self) -> MutexGuard<'_, WriterState> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the payloads of `arrays` and the record's sidecar, then sets
    /// `key` to the record made of `meta`, `layout`, the new array entries
    /// and `pickle` (invariant 3: files durable first, then the index entry).
    /// The files of a record this replaces are removed at the next
    /// [`Store::flush`].
    ///
    /// # Errors
    /// [`Error::EmptyKey`], [`Error::ReadOnly`], [`Error::InvalidArray`] for
    /// an array whose bytes do not match its dtype and shape, I/O errors
    /// (`ENOSPC`, `EIO`, ... kept in [`Error::Io`]). On error the old record
    /// (if any) is untouched and the files written for the new one are
    /// removed.
    pub fn put(
        &self,
        key: &str,
        meta: Map<String, Value>,
        layout: Value,
        arrays: &[ArraySource<'_>],
        pickle: Option<&[u8]>,
    ) -> Result<()> {
        check_key(key)?;
        let index_guard = self.index()?;
        let index = index_guard.as_ref().expect("checked open");
        let mut writer = self.writer()?;
        // A generation is used once even if this put fails.
        let generation = writer.next_generation;
        writer.next_generation += 1;
        let mut written: Vec<String> = Vec::with_capacity(arrays.len() + 1);
        let committed = (|| -> Result<Option<index::Replaced>> {
            let mut entries = IndexMap::with_capacity(arrays.len());
            let mut dirs = BTreeSet::new();
            for src in arrays {
                if entries.contains_key(&src.name) {
                    return Err(Error::InvalidArray {
                        name: src.name.clone(),
                        detail: "two arrays with the same name".into(),
                    });
                }
                let (entry, dir) = payload::write_payload(&self.root, src)?;
                written.push(entry.relpath());
                entries.insert(src.name.clone(), entry);
                dirs.insert(dir);
            }
            let record = Record {
                meta,
                arrays: entries,
                layout,
                pickle: pickle.is_some(),
            }
            .to_json();
            dirs.insert(sidecar::write(
                &self.root, generation, key, &record, pickle,
            )?);
            written.push(sidecar::relpath(generation));
            // The files' directories, and the first time this session uses
            // one, its parent (which may have just gained it).
            let new_dirs: Vec<PathBuf> = dirs
                .iter()
                .filter(|d| !writer.durable_dirs.contains(*d))
                .cloned()
                .collect();
            for dir in &new_dirs {
                dirs.insert(dir.parent().expect("a fan-out directory").to_owned());
            }
            for dir in &dirs {
                payload::sync_dir(dir)?;
            }
            writer.durable_dirs.extend(new_dirs);
            index.put(key, &record, pickle, generation)
        })();
        match committed {
            Err(e) => {
                // Nothing references these files: remove them now.
                remove_quietly(&self.root, written);
                Err(e)
            }
            Ok(old) => {
                if let Some(old) = old {
                    Self::retire(&mut writer, old);
                }
                Ok(())
            }
        }
    }

    /// Queues the files of a replaced or deleted record for removal after
    /// the next index flush. A damaged old record leaves orphans for gc(),
    /// nothing worse.
    fn retire(writer: &mut WriterState, (record, generation): index::Replaced) {
        if let Ok(old) = Record::from_json(&record) {
            writer
                .pending_removal
                .extend(old.arrays.values().map(ArrayEntry::relpath));
        }
        if let Some(g) = generation {
            writer.pending_removal.push(sidecar::relpath(g));
        }
    }

    /// The record JSON of `key` as stored (see FORMAT.md), or `None`.
    pub fn get_json(&self, key: &str) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let guard = self.index()?;
        guard.as_ref().expect("checked open").get(key)
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
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
        let _writers = self.writer_lock();
        let Some(record) = index.get(key)? else {
            return Ok(None);
        };
        let pickle = index.get_pickle(key)?;
        Ok(Some((record, pickle)))
    }

    /// The pickled remainder of `key`, if it has one.
    pub fn get_pickle(&self, key: &str) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let guard = self.index()?;
        guard.as_ref().expect("checked open").get_pickle(key)
    }

    /// Whether `key` has a record.
    pub fn contains(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        let guard = self.index()?;
        guard.as_ref().expect("checked open").contains(key)
    }

    /// Number of records (O(1)).
    pub fn len(&self) -> Result<u64> {
        let guard = self.index()?;
        guard.as_ref().expect("checked open").len()
    }

    /// Whether the store has no records.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Removes `key`; returns whether it was there. Its payloads are removed
    /// at the next [`Store::flush`].
    pub fn delete(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
        let mut writer = self.writer()?;
        match index.remove(key)? {
            None => Ok(false),
            Some(old) => {
                Self::retire(&mut writer, old);
                Ok(true)
            }
        }
    }

    /// All keys, in Unicode code point order.
    pub fn keys(&self) -> Result<Vec<String>> {
        let guard = self.index()?;
        let mut keys = Vec::new();
        guard.as_ref().expect("checked open").scan(|k, _| {
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
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
        if let Some(q) = query {
            if let Some(plan) = q.index_plan(&|segs| index.is_indexed(segs)) {
                for key in index.lookup(&plan.field.join("."), &plan.lookup)? {
                    let Some(bytes) = index.get(&key)? else {
                        continue;
                    };
                    let record: ScanRecord = serde_json::from_slice(&bytes)
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
        index.scan(|key, bytes| {
            let Some(query) = query else {
                return f(key);
            };
            let record: ScanRecord = serde_json::from_slice(bytes)
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
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
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
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
        let _writer = self.writer()?;
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
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
        let _writer = self.writer()?;
        let existed = index.drop_index(field)?;
        index.flush()?;
        self.write_index_list(&index.indexes())?;
        Ok(existed)
    }

    /// The fields that have a secondary index, sorted.
    pub fn indexes(&self) -> Result<Vec<String>> {
        let guard = self.index()?;
        Ok(guard.as_ref().expect("checked open").indexes())
    }

    fn write_index_list(&self, names: &[String]) -> Result<()> {
        let mut sorted = names.to_vec();
        sorted.sort();
        let mut text = serde_json::to_vec_pretty(&serde_json::json!({ "indexes": sorted }))
            .expect("serializes");
        text.push(b'\n');
        write_file_durably(&self.root.join(INDEXES_FILE), &text)
    }

    /// Keys of the records whose metadata match `query`.
    pub fn find(&self, query: &Query) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        self.scan_matching(Some(query), |k| {
            keys.push(k.to_owned());
            Ok(())
        })?;
        Ok(keys)
    }

    /// Number of records whose metadata match `query`.
    pub fn count(&self, query: &Query) -> Result<u64> {
        let mut n = 0;
        self.scan_matching(Some(query), |_| {
            n += 1;
            Ok(())
        })?;
        Ok(n)
    }

    /// Makes every change so far durable, then removes the payloads and
    /// sidecars that the durable index no longer references. If the index
    /// flush fails, nothing is removed and the error is returned.
    pub fn flush(&self) -> Result<()> {
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
        if self.mode == Mode::ReadOnly {
            return Ok(());
        }
        let mut writer = self.writer()?;
        index.flush()?;
        remove_quietly(&self.root, writer.pending_removal.drain(..));
        Ok(())
    }

    /// Flushes, then releases the index and the lock. Idempotent; any other
    /// call afterwards raises [`Error::Closed`].
    pub fn close(&self) -> Result<()> {
        if std::process::id() != self.opener_pid {
            // Never touch sled in a forked child: flush would hang.
            return Err(Error::Forked {
                opener: self.opener_pid,
                current: std::process::id(),
            });
        }
        if self
            .index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
        {
            return Ok(());
        }
        let flushed = self.flush();
        let mut guard = self.index.write().unwrap_or_else(|p| p.into_inner());
        *guard = None; // drops sled's Db: its file lock goes with it
        drop(guard);
        if let Some(file) = self
            .lock_file
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = file.set_len(0);
        }
        flushed
    }

    /// Whether [`Store::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Ids of every payload and generations of every sidecar referenced by
    /// a record.
    fn referenced(&self) -> Result<Referenced> {
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
        let mut refs = Referenced::default();
        index.scan(|key, bytes| {
            let record = Record::from_json(bytes)
                .map_err(|e| Error::corrupt(format!("record {key:?}"), e))?;
            refs.payloads
                .extend(record.arrays.into_values().map(|a| a.id));
            Ok(())
        })?;
        index.scan_sidecars(|_, g| {
            refs.sidecars.insert(g);
            Ok(())
        })?;
        Ok(refs)
    }

    /// Files under `records/` and `arrays/` that no record references:
    /// sidecars and payloads left by a crash or an unflushed overwrite, and
    /// temporary files. Sidecars come first, so that `gc()` interrupted
    /// half-way never leaves a sidecar whose payloads it removed.
    fn orphans(&self, refs: &Referenced) -> Result<Vec<(PathBuf, u64)>> {
        let mut sidecars = Vec::new();
        walk_two_levels(&self.root.join(SIDECAR_DIR), |path, name, size| {
            if !sidecar::parse_name(name).is_some_and(|g| refs.sidecars.contains(&g)) {
                sidecars.push((path, size));
            }
        })?;
        let mut payloads = Vec::new();
        walk_two_levels(&self.root.join(PAYLOAD_DIR), |path, name, size| {
            let id = name.strip_suffix(".npy");
            if !id.is_some_and(|id| refs.payloads.contains(id)) {
                payloads.push((path, size));
            }
        })?;
        sidecars.sort();
        payloads.sort();
        sidecars.extend(payloads);
        Ok(sidecars)
    }

    /// Removes payload, sidecar and temporary files that no record
    /// references. Flushes first, so nothing the durable index still
    /// references is removed.
    pub fn gc(&self) -> Result<GcReport> {
        if self.mode == Mode::ReadOnly {
            return Err(Error::ReadOnly);
        }
        self.flush()?;
        let _writer = self.writer()?;
        let refs = self.referenced()?;
        let mut report = GcReport::default();
        for (path, size) in self.orphans(&refs)? {
            fsio::remove_file(&path).map_err(Error::io(&path))?;
            report.removed_files += 1;
            report.removed_bytes += size;
        }
        Ok(report)
    }

    /// Checks every record against its payloads (present, header matching,
    /// long enough, and with `checksums` the data hashed against the
    /// checksum recorded at write time) and its sidecar (present, intact,
    /// the same record and pickle), and lists orphan files.
    /// `progress(done, total)` is called after each record; returning
    /// `false` stops the check with [`Error::Cancelled`].
    pub fn verify_with(
        &self,
        checksums: bool,
        progress: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Result<VerifyReport> {
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
        let total = index.len()?;
        let mut report = VerifyReport::default();
        let mut refs = Referenced::default();
        index.scan(|key, bytes| {
            report.records += 1;
            self.verify_sidecar(index, key, bytes, &mut refs, &mut report.problems)?;
            let record = match Record::from_json(bytes) {
                Ok(r) => r,
                Err(e) => {
                    report.problems.push(format!("record {key:?}: {e}"));
                    return Self::go_on(progress(report.records, total));
                }
            };
            for (name, entry) in &record.arrays {
                report.arrays += 1;
                refs.payloads.insert(entry.id.clone());
                let checked = if checksums {
                    self.verify_checksum(entry).map(|hashed| {
                        report.checksummed += u64::from(hashed);
                    })
                } else {
                    payload::open_payload(&self.root, entry).map(drop)
                };
                if let Err(e) = checked {
                    report
                        .problems
                        .push(format!("record {key:?} array {name:?}: {e}"));
                }
            }
            Self::go_on(progress(report.records, total))
        })?;
        drop(guard);
        let writer = self.writer_lock();
        for rel in &writer.pending_removal {
            // Files of replaced records, removed at the next flush.
            let name = rel.rsplit('/').next().unwrap_or_default();
            if let Some(g) = sidecar::parse_name(name) {
                refs.sidecars.insert(g);
            } else if let Some(id) = name.strip_suffix(".npy") {
                refs.payloads.insert(id.to_owned());
            }
        }
        drop(writer);
        report.orphans = self.orphans(&refs)?.into_iter().map(|(p, _)| p).collect();
        Ok(report)
    }

    /// [`Store::verify_with`] with checksums and no progress reports.
    pub fn verify(&self) -> Result<VerifyReport> {
        self.verify_with(true, &mut |_, _| true)
    }

    fn go_on(proceed: bool) -> Result<()> {
        if proceed {
            Ok(())
        } else {
            Err(Error::Cancelled)
        }
    }

    /// Checks that `key`'s sidecar exists and holds exactly `record` and
    /// the index's pickle.
    fn verify_sidecar(
        &self,
        index: &Index,
        key: &str,
        record: &[u8],
        refs: &mut Referenced,
        problems: &mut Vec<String>,
    ) -> Result<()> {
        let Some(generation) = index.sidecar_generation(key)? else {
            problems.push(format!("record {key:?}: no sidecar in the index"));
            return Ok(());
        };
        refs.sidecars.insert(generation);
        let path = self.root.join(sidecar::relpath(generation));
        let found = match sidecar::read(&path) {
            Ok(found) => found,
            Err(e) => {
                problems.push(format!("record {key:?}: {e}"));
                return Ok(());
            }
        };
        let pickle = index.get_pickle(key)?;
        if found.key != key
            || found.generation != generation
            || found.record != record
            || found.pickle != pickle
        {
            problems.push(format!(
                "record {key:?}: sidecar {} holds a different record (key {:?}, generation {})",
                path.display(),
                found.key,
                found.generation
            ));
        }
        Ok(())
    }

    /// Checks a payload and, if it has a recorded checksum, hashes its data;
    /// returns whether it hashed.
    fn verify_checksum(&self, entry: &ArrayEntry) -> Result<bool> {
        let mapped = payload::map_payload(&self.root, entry)?;
        let Some(expected) = entry.checksum.as_deref() else {
            return Ok(false);
        };
        if !expected.starts_with(payload::CHECKSUM_PREFIX) {
            // A newer writer's algorithm: not ours to judge.
            return Ok(false);
        }
        let actual = payload::checksum(mapped.as_bytes());
        if actual != expected {
            return Err(Error::corrupt(
                format!("payload {}", self.root.join(entry.relpath()).display()),
                format!("data checksum is {actual}, the record says {expected}"),
            ));
        }
        Ok(true)
    }

    /// Rebuilds the index of the store at `path` from its record sidecars
    /// and payloads (DESIGN.md invariant 7), for a lost or damaged index.
    ///
    /// Takes the store's lock; moves the old index directory aside (to
    /// `index.damaged-<n>`, never deleted); for each key keeps the newest
    /// sidecar (highest generation) that is intact and whose payloads are
    /// present with matching headers and sizes; writes and flushes a new
    /// index. Files it does not use stay in place: `gc()` removes them once
    /// the store checks out. Records whose put was cut off by a crash after
    /// the sidecar was written come back as if the put had finished.
    ///
    /// # Errors
    /// [`Error::NotFound`] / [`Error::NotAStore`] for a path that is not a
    /// store, [`Error::Locked`] while a `Store` holds it, I/O errors.
    pub fn repair(path: impl AsRef<Path>) -> Result<RepairReport> {
        let root = path.as_ref().to_owned();
        if !root.is_dir() {
            return Err(Error::NotFound(root));
        }
        let manifest_path = root.join(MANIFEST_FILE);
        if !manifest_path.is_file() {
            return Err(Error::NotAStore(root));
        }
        let bytes = fs::read(&manifest_path).map_err(Error::io(&manifest_path))?;
        Manifest::from_json(&bytes).map_err(|source| Error::Format {
            path: manifest_path.clone(),
            source,
        })?;
        let lock_file = Self::lock(&root)?;
        let mut report = RepairReport::default();
        let index_dir = root.join(INDEX_DIR);
        if fs::symlink_metadata(&index_dir).is_ok() {
            let moved = (1u32..)
                .map(|n| root.join(format!("{INDEX_DIR}.damaged-{n}")))
                .find(|p| fs::symlink_metadata(p).is_err())
                .expect("a free name");
            fs::rename(&index_dir, &moved).map_err(Error::io(&moved))?;
            payload::sync_dir(&root)?;
            report.moved_index = Some(moved);
        }
        // Pass 1: every sidecar's key and generation (records stay on disk,
        // so memory holds only keys).
        let mut by_key: std::collections::HashMap<String, Vec<(u64, PathBuf)>> =
            std::collections::HashMap::new();
        let mut newest = 0;
        walk_two_levels(&root.join(SIDECAR_DIR), |path, name, _| {
            if name.ends_with(TMP_SUFFIX) {
                return;
            }
            report.sidecars += 1;
            if let Some(g) = sidecar::parse_name(name) {
                newest = newest.max(g);
            }
            match sidecar::read(&path) {
                Ok(s) if sidecar::parse_name(name) == Some(s.generation) => {
                    by_key.entry(s.key).or_default().push((s.generation, path));
                }
                Ok(s) => report.skipped.push(format!(
                    "{}: holds generation {}, not the one its name says",
                    path.display(),
                    s.generation
                )),
                Err(e) => report.skipped.push(e.to_string()),
            }
        })?;
        // Pass 2: per key, the newest usable sidecar goes into a new index.
        let index = Index::open(&index_dir)?;
        let mut keys: Vec<_> = by_key.into_iter().collect();
        keys.sort();
        for (key, mut candidates) in keys {
            candidates.sort_by(|a, b| b.cmp(a));
            let mut chosen = false;
            for (generation, path) in candidates {
                if chosen {
                    report.superseded += 1;
                    continue;
                }
                match Self::usable_sidecar(&root, &path) {
                    Ok(s) => {
                        index.put(&key, &s.record, s.pickle.as_deref(), generation)?;
                        report.records += 1;
                        chosen = true;
                    }
                    Err(e) => report.skipped.push(e.to_string()),
                }
            }
        }
        // Secondary indexes listed in indexes.json are built again.
        let list_path = root.join(INDEXES_FILE);
        if let Ok(text) = fs::read(&list_path) {
            let names: Vec<String> = serde_json::from_slice::<Value>(&text)
                .ok()
                .and_then(|v| serde_json::from_value(v.get("indexes")?.clone()).ok())
                .ok_or_else(|| {
                    Error::corrupt(format!("{}", list_path.display()), "not a list of indexes")
                })?;
            for name in names {
                let segs = crate::secondary::parse_field(&name)
                    .map_err(|e| Error::corrupt(format!("{}", list_path.display()), e))?;
                index.create_index(&name, segs)?;
                report.indexes.push(name);
            }
        }
        // Sidecars it did not use stay orphans for gc(), not "uncommitted"
        // ones that the next open would remove unreported.
        index.raise_generation(newest)?;
        index.flush()?;
        drop(index);
        drop(lock_file);
        report.skipped.sort();
        Ok(report)
    }

    /// A sidecar whose record decodes and whose payloads all check out.
    fn usable_sidecar(root: &Path, path: &Path) -> Result<sidecar::Sidecar> {
        let s = sidecar::read(path)?;
        let record = Record::from_json(&s.record)
            .map_err(|e| Error::corrupt(format!("sidecar {}", path.display()), e))?;
        for (name, entry) in &record.arrays {
            payload::open_payload(root, entry).map_err(|e| {
                Error::corrupt(
                    format!(
                        "sidecar {} (key {:?}) array {name:?}",
                        path.display(),
                        s.key
                    ),
                    e,
                )
            })?;
        }
        Ok(s)
    }
}

/// What the index references, for telling orphans apart.
#[derive(Default)]
struct Referenced {
    payloads: HashSet<String>,
    sidecars: HashSet<u64>,
}

/// Calls `f(path, file_name, size)` for every file in the subdirectories of
/// `dir` (the `<2 hex>/` fan-out of `arrays/` and `records/`); a missing
/// `dir` has none.
fn walk_two_levels(dir: &Path, mut f: impl FnMut(PathBuf, &str, u64)) -> Result<()> {
    let Ok(subdirs) = fs::read_dir(dir) else {
        return Ok(());
    };
    for sub in subdirs {
        let sub = sub.map_err(Error::io(dir))?;
        if !sub.file_type().map_err(Error::io(sub.path()))?.is_dir() {
            continue;
        }
        for file in fs::read_dir(sub.path()).map_err(Error::io(sub.path()))? {
            let file = file.map_err(Error::io(sub.path()))?;
            let name = file.file_name();
            let Some(name) = name.to_str() else { continue };
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            f(file.path(), name, size);
        }
    }
    Ok(())
}

impl Drop for Store {
    fn drop(&mut self) {
        if std::process::id() == self.opener_pid {
            let _ = self.close();
        } else if let Some(index) = self
            .index
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            // A forked child: dropping sled's Db would flush and wait forever
            // for a flusher thread fork() did not copy. Leak it; the parent
            // still owns the files and the lock.
            std::mem::forget(index);
        }
    }
}
