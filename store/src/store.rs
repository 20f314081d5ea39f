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
use crate::index::Index;
use crate::payload::{self, ArraySource, TMP_SUFFIX};
use crate::query::{ArrayFacts, Query, RecordView};

/// Directory of the sled index inside a store.
pub const INDEX_DIR: &str = "index";
/// The lock file naming the process that holds the store.
pub const LOCK_FILE: &str = "lazyvault.lock";

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
    /// One line per damaged or missing payload or undecodable record.
    pub problems: Vec<String>,
    /// Payload or temporary files that no record references (`gc()` removes them).
    pub orphans: Vec<PathBuf>,
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
    /// Serialises writers. Holds the payload ids replaced or deleted since the
    /// last flush: they are unlinked only after the index change that
    /// dropped them is durable, so a crash never leaves a record whose
    /// payload is gone (invariant 3).
    pending_removal: Mutex<Vec<ArrayEntry>>,
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
    let mut f = File::create(&tmp).map_err(Error::io(&tmp))?;
    f.write_all(contents)
        .and_then(|_| f.sync_all())
        .map_err(Error::io(&tmp))?;
    fs::rename(&tmp, path).map_err(Error::io(path))?;
    payload::sync_dir(path.parent().unwrap_or(Path::new(".")))
}

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
            fs::create_dir_all(root.join(PAYLOAD_DIR)).map_err(Error::io(&root))?;
            let manifest = Manifest::new(format!("lazyvault {}", env!("CARGO_PKG_VERSION")));
            write_file_durably(&manifest_path, &manifest.to_json())?;
        }
        let index_dir = root.join(INDEX_DIR);
        if has_manifest && !index_dir.is_dir() {
            // Never recreate it silently: an empty index would make gc()
            // delete every payload.
            return Err(Error::corrupt(
                format!("store {}", root.display()),
                format!("the index directory {} is missing", index_dir.display()),
            ));
        }
        let index = Index::open(&index_dir)?;
        Ok(Store {
            root,
            mode,
            opener_pid: std::process::id(),
            index: RwLock::new(Some(index)),
            pending_removal: Mutex::new(Vec::new()),
            lock_file: Mutex::new(Some(lock_file)),
        })
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
                Some(PAYLOAD_DIR) => fs::read_dir(entry.path())
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

    fn writer(&self) -> Result<MutexGuard<'_, Vec<ArrayEntry>>> {
        if self.mode == Mode::ReadOnly {
            return Err(Error::ReadOnly);
        }
        Ok(self
            .pending_removal
            .lock()
            .unwrap_or_else(|p| p.into_inner()))
    }

    /// Writes the payloads of `arrays`, then sets `key` to the record made of
    /// `meta`, `layout`, the new array entries and `pickle` (invariant 3:
    /// payloads durable first, then the index entry). The payloads of a record
    /// this replaces are removed at the next [`Store::flush`].
    ///
    /// # Errors
    /// [`Error::EmptyKey`], [`Error::ReadOnly`], [`Error::InvalidArray`] for
    /// an array whose bytes do not match its dtype and shape, I/O errors.
    /// On error the old record (if any) is untouched.
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
        let mut pending = self.writer()?;
        let mut entries = IndexMap::with_capacity(arrays.len());
        let mut dirs = BTreeSet::new();
        let written = (|| -> Result<()> {
            for src in arrays {
                if entries.contains_key(&src.name) {
                    return Err(Error::InvalidArray {
                        name: src.name.clone(),
                        detail: "two arrays with the same name".into(),
                    });
                }
                let (entry, dir) = payload::write_payload(&self.root, src)?;
                entries.insert(src.name.clone(), entry);
                dirs.insert(dir);
            }
            if !dirs.is_empty() {
                dirs.insert(self.root.join(PAYLOAD_DIR));
            }
            for dir in &dirs {
                payload::sync_dir(dir)?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            // Nothing references these payloads: remove them now.
            for entry in entries.values() {
                let _ = fs::remove_file(self.root.join(entry.relpath()));
            }
            return Err(e);
        }
        let record = Record {
            meta,
            arrays: entries,
            layout,
            pickle: pickle.is_some(),
        };
        let old = match index.put(key, &record.to_json(), pickle) {
            Ok(old) => old,
            Err(e) => {
                for entry in record.arrays.values() {
                    let _ = fs::remove_file(self.root.join(entry.relpath()));
                }
                return Err(e);
            }
        };
        if let Some(old) = old {
            // A damaged old record leaves orphans for gc(), nothing worse.
            if let Ok(old) = Record::from_json(&old) {
                pending.extend(old.arrays.into_values());
            }
        }
        Ok(())
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
        let _writers = self
            .pending_removal
            .lock()
            .unwrap_or_else(|p| p.into_inner());
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
        let mut pending = self.writer()?;
        match index.remove(key)? {
            None => Ok(false),
            Some(old) => {
                if let Ok(old) = Record::from_json(&old) {
                    pending.extend(old.arrays.into_values());
                }
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

    /// Calls `f(key, record)` for each record matching `query` (all records
    /// when `None`), in key order. Reads only the index, never a payload.
    pub fn scan_matching(
        &self,
        query: Option<&Query>,
        mut f: impl FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
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

    /// Makes every change so far durable, then removes the payloads that the
    /// durable index no longer references.
    pub fn flush(&self) -> Result<()> {
        let guard = self.index()?;
        let index = guard.as_ref().expect("checked open");
        if self.mode == Mode::ReadOnly {
            return Ok(());
        }
        let mut pending = self.writer()?;
        index.flush()?;
        for entry in pending.drain(..) {
            match fs::remove_file(self.root.join(entry.relpath())) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Left for gc(): an orphan is harmless.
                Err(_) => {}
            }
        }
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

    /// Ids of every payload referenced by a record.
    fn referenced_ids(&self) -> Result<HashSet<String>> {
        let guard = self.index()?;
        let mut ids = HashSet::new();
        guard.as_ref().expect("checked open").scan(|key, bytes| {
            let record = Record::from_json(bytes)
                .map_err(|e| Error::corrupt(format!("record {key:?}"), e))?;
            ids.extend(record.arrays.into_values().map(|a| a.id));
            Ok(())
        })?;
        Ok(ids)
    }

    /// Files under `arrays/` that no record references: payloads left by a
    /// crash or an unflushed overwrite, and temporary files.
    fn orphans(&self, referenced: &HashSet<String>) -> Result<Vec<(PathBuf, u64)>> {
        let mut out = Vec::new();
        let dir = self.root.join(PAYLOAD_DIR);
        let Ok(subdirs) = fs::read_dir(&dir) else {
            return Ok(out);
        };
        for sub in subdirs {
            let sub = sub.map_err(Error::io(&dir))?;
            if !sub.file_type().map_err(Error::io(sub.path()))?.is_dir() {
                continue;
            }
            for file in fs::read_dir(sub.path()).map_err(Error::io(sub.path()))? {
                let file = file.map_err(Error::io(sub.path()))?;
                let name = file.file_name();
                let Some(name) = name.to_str() else { continue };
                let id = name
                    .strip_suffix(TMP_SUFFIX)
                    .unwrap_or(name)
                    .strip_suffix(".npy");
                let Some(id) = id else { continue };
                if name.ends_with(TMP_SUFFIX) || !referenced.contains(id) {
                    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
                    out.push((file.path(), size));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes payload and temporary files that no record references. Flushes
    /// first, so nothing the durable index still references is removed.
    pub fn gc(&self) -> Result<GcReport> {
        if self.mode == Mode::ReadOnly {
            return Err(Error::ReadOnly);
        }
        self.flush()?;
        let _writer = self.writer()?;
        let referenced = self.referenced_ids()?;
        let mut report = GcReport::default();
        for (path, size) in self.orphans(&referenced)? {
            fs::remove_file(&path).map_err(Error::io(&path))?;
            report.removed_files += 1;
            report.removed_bytes += size;
        }
        Ok(report)
    }

    /// Checks every record against its payloads (present, header matching,
    /// long enough) and lists orphan files. Maps nothing.
    pub fn verify(&self) -> Result<VerifyReport> {
        let guard = self.index()?;
        let mut report = VerifyReport::default();
        let mut referenced = HashSet::new();
        guard.as_ref().expect("checked open").scan(|key, bytes| {
            report.records += 1;
            let record = match Record::from_json(bytes) {
                Ok(r) => r,
                Err(e) => {
                    report.problems.push(format!("record {key:?}: {e}"));
                    return Ok(());
                }
            };
            for (name, entry) in &record.arrays {
                report.arrays += 1;
                referenced.insert(entry.id.clone());
                if let Err(e) = payload::open_payload(&self.root, entry) {
                    report
                        .problems
                        .push(format!("record {key:?} array {name:?}: {e}"));
                }
            }
            Ok(())
        })?;
        drop(guard);
        let pending = self
            .pending_removal
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        referenced.extend(pending.iter().map(|e| e.id.clone()));
        drop(pending);
        report.orphans = self
            .orphans(&referenced)?
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        Ok(report)
    }
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
