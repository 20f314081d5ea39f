//! The writer's index: its records, and the only module that knows sled
//! (derived data: FORMAT.md, "Index").
//!
//! The records are those of the newest checkpoint (its runs, mapped) under
//! the changes made since (in memory), as a reader's snapshot holds them
//! ([`Layers`]): each record is written once, to the journal, and again
//! only into checkpoint runs. sled holds the secondary indexes (`#idx:`,
//! `i`) and the journal position they reflect (`#pos`); a store without
//! secondary indexes writes nothing to it. Stores written before 1.6 also
//! have the records there (`r`, `p`, `#count`): read when no checkpoint
//! can be, and removed once one holds them.

use std::fs;
use std::path::Path;

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::RwLock;

use crate::checkpoint::run::Run;
use crate::checkpoint::{self, CheckpointDoc, RunDoc};
use crate::error::{Error, Result};
use crate::fsio::fault;
use crate::journal::{self, CommittedTail, Position, Put};
use crate::query::IndexLookup;
use crate::secondary;

use super::layers::Layers;
use super::{meta_of, RecordIndex};

const RECORD: u8 = b'r';
const PICKLE: u8 = b'p';
const COUNT: &[u8] = b"#count";
/// The committed journal position (segment u64 LE, offset u64 LE) the
/// secondary indexes reflect; removed by every change until its commit.
const JOURNAL_POS: &[u8] = b"#pos";
/// `#idx:` + field name: a secondary index on that field exists.
const INDEX_DEF: &[u8] = b"#idx:";
/// Entries written per batch while building a secondary index.
const BUILD_BATCH: usize = 10_000;

/// One secondary index: its dotted name and the path segments.
#[derive(Debug, Clone)]
struct IndexDef {
    name: String,
    segs: Vec<String>,
}

fn decode_u64(v: &[u8], what: &str) -> Result<u64> {
    let bytes: [u8; 8] = v
        .try_into()
        .map_err(|_| Error::corrupt("index", format!("{what} is not 8 bytes")))?;
    Ok(u64::from_le_bytes(bytes))
}

fn encode_pos((segment, offset): Position) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&segment.to_le_bytes());
    b[8..].copy_from_slice(&offset.to_le_bytes());
    b
}

fn injected(dir: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| {
        Error::from(crate::StorageError::Io {
            path: dir.to_owned(),
            source,
        })
    }
}

/// Maps sled's errors for the index in `dir`.
fn index_err(dir: &Path) -> impl Fn(sled::Error) -> Error + '_ {
    move |e| match e {
        sled::Error::Corruption { .. } => Error::corrupt(
            format!("index {}", dir.display()),
            format!("{e}; `lazyvault repair PATH` rebuilds it from the record journal"),
        ),
        // Keep the errno (ENOSPC, EIO) for the caller.
        sled::Error::Io(source) => Error::from(crate::StorageError::Io {
            path: dir.to_owned(),
            source,
        }),
        other => Error::index(format!("{}: {other}", dir.display())),
    }
}

/// Removes the `snap.<lsn>.generating` files a killed sled left in `dir`.
///
/// sled 0.34.7 writes a snapshot to that name, fsyncs it and renames it to
/// `snap.<lsn>`, removing older snapshots only after the rename; but at open
/// it reads the snapshot file whose name sorts last, a `.generating` one
/// included (sled issue 1527), and refuses to open ("Read corrupted data")
/// when a kill cut it short. Such a file is never needed: until the rename,
/// the previous snapshot and the log hold everything. Done only while no
/// sled handle has the directory open (its `flock` on `db`, which a
/// previous handle of this process may hold for a moment after close):
/// otherwise that handle may be writing the file.
fn drop_unfinished_snapshots(dir: &Path) -> Result<()> {
    let db = dir.join("db");
    let file = match fs::File::open(&db) {
        Ok(file) => file,
        // a new index: nothing to clean
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(&db)(e)),
    };
    if crate::fsio::try_lock(&file, &db, false).is_err() {
        return Ok(());
    }
    for entry in fs::read_dir(dir).map_err(Error::io(dir))? {
        let entry = entry.map_err(Error::io(dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            let path = entry.path();
            fs::remove_file(&path).map_err(Error::io(&path))?;
        }
    }
    Ok(())
}

/// The sled-backed index of one store. Not `Clone` on purpose: sled's file
/// lock is released only when the last handle drops, so exactly one owner
/// holds it.
pub(crate) struct Index {
    dir: std::path::PathBuf,
    /// sled reported an I/O error (a full disk): its state may be stuck,
    /// and its flush can block forever (see `Store::close`).
    io_failed: std::sync::atomic::AtomicBool,
    /// The errno of that error (0 if it had none).
    io_errno: std::sync::atomic::AtomicI32,
    db: sled::Db,
    tree: sled::Tree,
    /// The secondary indexes, loaded at open.
    defs: RwLock<Vec<IndexDef>>,
    /// The records: the newest checkpoint's runs and the changes since,
    /// flushed or not.
    records: parking_lot::RwLock<Layers>,
    /// The journal position after the last change applied.
    pos: std::sync::Mutex<Option<Position>>,
}

/// The process that first opened a sled database in this process image
/// (0: none yet); a forked child inherits it.
static SLED_PROCESS: AtomicU32 = AtomicU32::new(0);

impl Index {
    /// Opens or creates the index in `dir`. Refuses (`OpenError::ForkedIndex`)
    /// in a process forked from one that had opened a sled database: sled
    /// starts its I/O threads once per process, fork() copies none of them
    /// but copies sled's count of them, and the child's first flush would
    /// wait forever for a thread that does not exist.
    pub(crate) fn open(dir: &Path) -> Result<Index> {
        let me = crate::pid::current();
        if let Err(first) = SLED_PROCESS.compare_exchange(0, me, SeqCst, SeqCst) {
            if first != me {
                return Err(crate::OpenError::ForkedIndex {
                    parent: first,
                    current: me,
                }
                .into());
            }
        }
        drop_unfinished_snapshots(dir)?;
        // The caller holds the store's own exclusive lock, so a sled lock
        // still held here belongs to this process's previous Db, whose
        // threads may release it a moment after close(): retry briefly.
        // (sled's error text, "could not acquire lock", is the only way to
        // recognise it.)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let repair_hint = "; `lazyvault repair PATH` rebuilds the index from the record journal";
        let opened = loop {
            // sled panics on some damaged files instead of returning an error.
            let attempt = std::panic::catch_unwind(|| sled::Config::new().path(dir).open())
                .map_err(|panic| {
                    let text = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "sled panicked".to_owned());
                    Error::corrupt(
                        format!("index {}", dir.display()),
                        format!("cannot be opened ({text}){repair_hint}"),
                    )
                })?;
            match attempt {
                Err(sled::Error::Io(io))
                    if io.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => break other,
            }
        };
        let db = opened.map_err(|e| match e {
            sled::Error::Io(io) => Error::from(crate::StorageError::Io {
                path: dir.to_owned(),
                source: io,
            }),
            e @ sled::Error::Corruption { .. } => Error::corrupt(
                format!("index {}", dir.display()),
                format!("{e}{repair_hint}"),
            ),
            other => Error::index(format!("{}: {other}{repair_hint}", dir.display())),
        })?;
        let tree = db.open_tree("lazyvault").map_err(index_err(dir))?;
        let mut defs = Vec::new();
        for item in tree.scan_prefix(INDEX_DEF) {
            let (k, _) = item.map_err(index_err(dir))?;
            let name = std::str::from_utf8(&k[INDEX_DEF.len()..])
                .map_err(|_| Error::corrupt("index", "an index name is not UTF-8"))?;
            let segs = secondary::parse_field(name).map_err(|e| Error::corrupt("index", e))?;
            defs.push(IndexDef {
                name: name.to_owned(),
                segs,
            });
        }
        Ok(Index {
            dir: dir.to_owned(),
            io_failed: std::sync::atomic::AtomicBool::new(false),
            io_errno: std::sync::atomic::AtomicI32::new(0),
            db,
            tree,
            defs: RwLock::new(defs),
            records: parking_lot::RwLock::new(Layers::default()),
            pos: std::sync::Mutex::new(None),
        })
    }

    /// Loads the records: the runs of `base` (the newest usable checkpoint
    /// of the store at `root`; `None`: there is none, and the records a
    /// store written before 1.6 keeps in sled are the start) plus the
    /// committed journal after its position. Returns what was read of the
    /// journal.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a run that does not open; journal and I/O
    /// errors.
    pub(crate) fn load(&self, root: &Path, base: Option<&CheckpointDoc>) -> Result<CommittedTail> {
        let mut layers = match base {
            Some(doc) => Layers::new(open_runs(root, &doc.runs)?, doc.records, doc.position()),
            None => {
                let mut layers = Layers::default();
                let mut pickles = std::collections::HashMap::new();
                for item in self.tree.scan_prefix([PICKLE]) {
                    let (k, v) = item.map_err(self.err())?;
                    pickles.insert(k[1..].to_vec(), v.to_vec());
                }
                for item in self.tree.scan_prefix([RECORD]) {
                    let (k, v) = item.map_err(self.err())?;
                    let key = std::str::from_utf8(&k[1..])
                        .map_err(|_| Error::corrupt("index", "a key is not UTF-8"))?;
                    let pickle = pickles.remove(&k[1..]);
                    layers.apply(key.to_owned(), Some((v.to_vec(), pickle)))?;
                }
                layers
            }
        };
        let from = base.map_or((0, 0), CheckpointDoc::position);
        let mut changes = Vec::new();
        let tail = journal::read_committed(root, from, None, |k, c| changes.push((k, c)))?;
        for (key, change) in changes {
            layers.apply(key, change)?;
        }
        *self.records.write() = layers;
        *self.pos.lock().unwrap_or_else(|p| p.into_inner()) = Some(tail.end);
        Ok(tail)
    }

    /// After a checkpoint of every change so far was published (at
    /// journal position `at`): its runs replace the runs and changes held.
    /// If a run does not open, the records stay as they were (the same
    /// records).
    pub(crate) fn rebase(&self, root: &Path, runs: &[RunDoc], at: Position) {
        if let Ok(opened) = open_runs(root, runs) {
            let mut layers = self.records.write();
            let len = layers.len;
            *layers = Layers::new(opened, len, at);
        }
    }

    /// Starts the records from the runs of `doc` (a checkpoint of the
    /// store at `root`), with no change after it: what `repair` builds on.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a run that does not open.
    pub(crate) fn start_from(&self, root: &Path, doc: &CheckpointDoc) -> Result<()> {
        *self.records.write() =
            Layers::new(open_runs(root, &doc.runs)?, doc.records, doc.position());
        Ok(())
    }

    /// Bytes of records held in memory: the changes since the checkpoint
    /// loaded (or rebased on), see [`crate::store::writer::MAX_PENDING_BYTES`].
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.records.read_recursive().tail_bytes
    }

    /// The keys changed since the checkpoint loaded (or rebased on).
    pub(crate) fn changed_keys(&self) -> Vec<String> {
        self.records.read().tail.keys().cloned().collect()
    }

    /// Whether sled still holds records (a store written before 1.6).
    pub(crate) fn has_legacy_records(&self) -> Result<bool> {
        self.tree.contains_key(COUNT).map_err(self.err())
    }

    /// Removes the records a store written before 1.6 keeps in sled (the
    /// caller has published a checkpoint holding them), in bounded batches.
    pub(crate) fn drop_legacy_records(&self) -> Result<()> {
        for prefix in [RECORD, PICKLE] {
            let mut batch = sled::Batch::default();
            let mut pending = 0;
            for item in self.tree.scan_prefix([prefix]) {
                let (k, _) = item.map_err(self.err())?;
                batch.remove(k);
                self.apply_when_full(&mut batch, &mut pending)?;
            }
            self.tree.apply_batch(batch).map_err(self.err())?;
        }
        self.tree.remove(COUNT).map_err(self.err())?;
        self.flush()
    }

    /// Whether the secondary indexes reflect the committed journal up to
    /// `committed` exactly (none exist, or the last flush recorded that
    /// position and no change came after it).
    pub(crate) fn secondary_current(&self, committed: Position) -> Result<bool> {
        if self
            .defs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
        {
            return Ok(true);
        }
        Ok(self.stored_pos()? == Some(committed))
    }

    /// Builds every secondary index again from the records (after a crash
    /// that left them behind or ahead of the committed journal), then
    /// records `committed` as what they reflect.
    pub(crate) fn rebuild_secondary(&self, committed: Position) -> Result<()> {
        let defs = self.defs.read().unwrap_or_else(|p| p.into_inner()).clone();
        for def in defs {
            self.clear_entries(&def.name)?;
            self.build_entries(&def.name, &def.segs)?;
        }
        self.mark_committed(committed)?;
        self.flush()
    }

    /// Records that the secondary indexes reflect the journal up to the
    /// commit ending at `committed` (written by the next sled flush).
    pub(crate) fn mark_committed(&self, committed: Position) -> Result<()> {
        if self
            .defs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
        {
            return Ok(());
        }
        self.tree
            .insert(JOURNAL_POS, &encode_pos(committed))
            .map_err(self.err())?;
        Ok(())
    }

    /// Maps sled's errors, noting I/O failures.
    fn err(&self) -> impl Fn(sled::Error) -> Error + '_ {
        move |e| {
            if let sled::Error::Io(io) = &e {
                let errno = io.raw_os_error().unwrap_or(match io.kind() {
                    std::io::ErrorKind::StorageFull => 28,
                    _ => 5,
                });
                let _ = self.io_errno.compare_exchange(
                    0,
                    errno,
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                );
                self.io_failed
                    .store(true, std::sync::atomic::Ordering::SeqCst);
            }
            index_err(&self.dir)(e)
        }
    }

    /// The error for writes after sled failed to write (a full disk): sled
    /// 0.34 does not recover from it in the same session. An I/O error of
    /// the same kind as the first one, so callers see a storage error.
    pub(crate) fn stuck_error(&self) -> Error {
        let errno = self.io_errno.load(std::sync::atomic::Ordering::SeqCst);
        let kind = std::io::Error::from_raw_os_error(errno).kind();
        crate::StorageError::Io {
            path: self.dir.clone(),
            source: std::io::Error::new(
                kind,
                format!(
                    "an earlier index write failed ({}) and sled cannot recover from it in \
                     this session: close the store and open it again; everything flushed \
                     before is safe",
                    std::io::Error::from_raw_os_error(errno)
                ),
            ),
        }
        .into()
    }

    /// Whether sled has reported an I/O error since the index was opened.
    pub(crate) fn io_failed(&self) -> bool {
        self.io_failed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The record JSON of `key`.
    pub(crate) fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .records
            .read_recursive()
            .value(key)?
            .map(|(r, _)| r.to_vec()))
    }

    /// The pickled remainder of `key`.
    pub(crate) fn get_pickle(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .records
            .read_recursive()
            .value(key)?
            .and_then(|(_, p)| p.map(<[u8]>::to_vec)))
    }

    pub(crate) fn contains(&self, key: &str) -> Result<bool> {
        Ok(self.records.read_recursive().value(key)?.is_some())
    }

    pub(crate) fn len(&self) -> Result<u64> {
        Ok(self.records.read_recursive().len)
    }

    /// The journal position after the last change the records hold.
    pub(crate) fn journal_pos(&self) -> Result<Option<Position>> {
        Ok(*self.pos.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The position sled's `#pos` holds, if any.
    fn stored_pos(&self) -> Result<Option<Position>> {
        match self.tree.get(JOURNAL_POS).map_err(self.err())? {
            Some(v) if v.len() == 16 => Ok(Some((
                decode_u64(&v[..8], "the journal position")?,
                decode_u64(&v[8..], "the journal position")?,
            ))),
            Some(_) => Err(Error::corrupt(
                "index",
                "the journal position is not 16 bytes",
            )),
            None => Ok(None),
        }
    }

    /// Records the journal position (after a repair or a compaction).
    pub(crate) fn set_journal_pos(&self, pos: Position) -> Result<()> {
        *self.pos.lock().unwrap_or_else(|p| p.into_inner()) = Some(pos);
        Ok(())
    }

    /// Sets `key` to `record` (and its pickle, or none), whose journal
    /// entry ends at `pos`, in one atomic batch. Returns the record it
    /// replaced. The caller serialises writers.
    pub(crate) fn put(
        &self,
        key: &str,
        record: &[u8],
        pickle: Option<&[u8]>,
        pos: Position,
    ) -> Result<Option<Vec<u8>>> {
        Ok(self
            .put_many(&[(key, record, pickle)], pos)?
            .pop()
            .flatten())
    }

    /// Sets each `(key, record, pickle)` in order (a later one of the same
    /// key wins) in ONE atomic sled batch, with `#pos` := `pos` (the end of
    /// their journal entries). Returns, for each, the record it replaced (an
    /// earlier one of the same call, for a repeated key). The caller
    /// serialises writers.
    pub(crate) fn put_many(&self, puts: &[Put<'_>], pos: Position) -> Result<Vec<Option<Vec<u8>>>> {
        let first = puts.first().map_or("", |p| p.0);
        fault::check("index", std::path::Path::new(first)).map_err(injected(&self.dir))?;
        // Records set earlier in this batch, for repeated keys.
        let mut set: std::collections::HashMap<&str, &[u8]> = std::collections::HashMap::new();
        let mut replaced = Vec::with_capacity(puts.len());
        for &(key, record, _) in puts {
            let old = match set.get(key) {
                Some(earlier) => Some(earlier.to_vec()),
                None => self.get(key)?,
            };
            set.insert(key, record);
            replaced.push(old);
        }
        // sled first: if it fails, the records stay as they were.
        if self.has_indexes() {
            let mut batch = sled::Batch::default();
            for (&(key, record, _), old) in puts.iter().zip(&replaced) {
                // A sled batch keeps the last operation per key, so entries
                // inserted for an earlier version of the key and removed
                // here end up removed.
                self.update_entries(&mut batch, key, old.as_deref(), Some(record));
            }
            batch.remove(JOURNAL_POS);
            self.tree.apply_batch(batch).map_err(self.err())?;
        }
        let mut layers = self.records.write();
        for &(key, record, pickle) in puts {
            layers.apply(
                key.to_owned(),
                Some((record.to_vec(), pickle.map(<[u8]>::to_vec))),
            )?;
        }
        *self.pos.lock().unwrap_or_else(|p| p.into_inner()) = Some(pos);
        Ok(replaced)
    }

    /// Removes `key`, whose delete entry in the journal ends at `pos`;
    /// returns its record if it was there.
    pub(crate) fn remove(&self, key: &str, pos: Position) -> Result<Option<Vec<u8>>> {
        fault::check("index", std::path::Path::new(key)).map_err(injected(&self.dir))?;
        let Some(old) = self.get(key)? else {
            return Ok(None);
        };
        if self.has_indexes() {
            let mut batch = sled::Batch::default();
            self.update_entries(&mut batch, key, Some(&old), None);
            batch.remove(JOURNAL_POS);
            self.tree.apply_batch(batch).map_err(self.err())?;
        }
        self.records.write().apply(key.to_owned(), None)?;
        *self.pos.lock().unwrap_or_else(|p| p.into_inner()) = Some(pos);
        Ok(Some(old))
    }

    fn has_indexes(&self) -> bool {
        !self
            .defs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Adds to `batch` the secondary-index changes of `key` going from
    /// `old` to `new` (record JSON; `None` for absent).
    fn update_entries(
        &self,
        batch: &mut sled::Batch,
        key: &str,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) {
        let defs = self.defs.read().unwrap_or_else(|p| p.into_inner());
        if defs.is_empty() {
            return;
        }
        let old_meta = old.map(meta_of).unwrap_or_default();
        let new_meta = new.map(meta_of).unwrap_or_default();
        for def in defs.iter() {
            let before = secondary::field_value(&old_meta, &def.segs)
                .and_then(|v| secondary::entry(&def.name, v, key));
            let after = secondary::field_value(&new_meta, &def.segs)
                .and_then(|v| secondary::entry(&def.name, v, key));
            if before == after {
                continue;
            }
            if let Some(e) = before {
                batch.remove(e);
            }
            if let Some(e) = after {
                batch.insert(e, &[]);
            }
        }
    }

    /// Names of the secondary indexes, sorted.
    pub(crate) fn indexes(&self) -> Vec<String> {
        let defs = self.defs.read().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<String> = defs.iter().map(|d| d.name.clone()).collect();
        names.sort();
        names
    }

    /// Whether `segs` (a dotted path) has a secondary index.
    pub(crate) fn is_indexed(&self, segs: &[String]) -> bool {
        let defs = self.defs.read().unwrap_or_else(|p| p.into_inner());
        defs.iter().any(|d| d.segs == segs)
    }

    /// Counts one more change in `batch` (`pending` so far) and applies the
    /// batch once it holds [`BUILD_BATCH`]: building or clearing an index
    /// holds bounded memory.
    fn apply_when_full(&self, batch: &mut sled::Batch, pending: &mut usize) -> Result<()> {
        *pending += 1;
        if *pending == BUILD_BATCH {
            self.tree
                .apply_batch(std::mem::take(batch))
                .map_err(self.err())?;
            *pending = 0;
        }
        Ok(())
    }

    /// Builds a secondary index on `name` from every record, then records
    /// that it exists (so a crash while building leaves no index, only
    /// entries that the next build clears). The caller serialises writers.
    pub(crate) fn create_index(&self, name: &str, segs: Vec<String>) -> Result<()> {
        if self.indexes().iter().any(|n| n == name) {
            return Ok(());
        }
        self.clear_entries(name)?;
        self.build_entries(name, &segs)?;
        let mut batch = sled::Batch::default();
        batch.insert([INDEX_DEF, name.as_bytes()].concat(), &[]);
        // What they reflect is set at the next flush.
        batch.remove(JOURNAL_POS);
        self.tree.apply_batch(batch).map_err(self.err())?;
        self.defs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(IndexDef {
                name: name.to_owned(),
                segs,
            });
        Ok(())
    }

    /// Writes the entries of the secondary index `name` (on `segs`) for
    /// every record.
    fn build_entries(&self, name: &str, segs: &[String]) -> Result<()> {
        let mut batch = sled::Batch::default();
        let mut pending = 0;
        self.scan(|key, record| {
            let meta = meta_of(record);
            if let Some(e) =
                secondary::field_value(&meta, segs).and_then(|v| secondary::entry(name, v, key))
            {
                batch.insert(e, &[]);
                self.apply_when_full(&mut batch, &mut pending)?;
            }
            Ok(())
        })?;
        self.tree.apply_batch(batch).map_err(self.err())
    }

    /// Removes the secondary index `name`; returns whether it existed.
    pub(crate) fn drop_index(&self, name: &str) -> Result<bool> {
        let existed = {
            let mut defs = self.defs.write().unwrap_or_else(|p| p.into_inner());
            let before = defs.len();
            defs.retain(|d| d.name != name);
            defs.len() != before
        };
        self.tree
            .remove([INDEX_DEF, name.as_bytes()].concat())
            .map_err(self.err())?;
        self.clear_entries(name)?;
        Ok(existed)
    }

    fn clear_entries(&self, name: &str) -> Result<()> {
        let mut batch = sled::Batch::default();
        let mut pending = 0;
        for item in self.tree.scan_prefix(secondary::field_prefix(name)) {
            let (k, _) = item.map_err(self.err())?;
            batch.remove(k);
            self.apply_when_full(&mut batch, &mut pending)?;
        }
        self.tree.apply_batch(batch).map_err(self.err())
    }

    /// Keys whose `field` entry falls in `lookup`, sorted, without
    /// duplicates: candidates, to be checked against the whole query.
    pub(crate) fn lookup(&self, field: &str, lookup: &IndexLookup) -> Result<Vec<String>> {
        let skip = secondary::field_prefix(field).len();
        let mut keys = Vec::new();
        for (start, end) in secondary::ranges(field, lookup) {
            for item in self.tree.range(start..end) {
                let (k, _) = item.map_err(self.err())?;
                let key = secondary::entry_key(&k[skip..]).ok_or_else(|| {
                    Error::corrupt("index", "a secondary index entry is malformed")
                })?;
                keys.push(key.to_owned());
            }
        }
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
    }

    /// Calls `f(key, record_json)` for every record in key order (UTF-8 byte
    /// order, which is Unicode code point order). Stops at the first error.
    pub(crate) fn scan(&self, mut f: impl FnMut(&str, &[u8]) -> Result<()>) -> Result<()> {
        self.records
            .read_recursive()
            .scan_range(None, None, &mut |k, record, _| f(k, record))
    }

    /// As [`Index::scan`], with each record's pickled remainder (or
    /// `None`).
    pub(crate) fn scan_with_pickles(
        &self,
        mut f: impl FnMut(&str, &[u8], Option<&[u8]>) -> Result<()>,
    ) -> Result<()> {
        self.records
            .read_recursive()
            .scan_range(None, None, &mut |k, record, pickle| f(k, record, pickle))
    }

    /// Makes every change so far durable.
    pub(crate) fn flush(&self) -> Result<()> {
        fault::check("index-flush", std::path::Path::new("index")).map_err(injected(&self.dir))?;
        self.db.flush().map_err(self.err())?;
        Ok(())
    }
}

impl RecordIndex for Index {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Index::get(self, key)
    }

    fn get_pickle(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Index::get_pickle(self, key)
    }

    fn contains(&self, key: &str) -> Result<bool> {
        Index::contains(self, key)
    }

    fn len(&self) -> Result<u64> {
        Index::len(self)
    }

    fn scan_range(
        &self,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        f: &mut dyn FnMut(&str, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.records
            .read_recursive()
            .scan_range(from, to, &mut |k, record, _| f(k, record))
    }

    fn key_bounds(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.records.read_recursive().key_bounds()
    }

    fn lookup(&self, field: &str, lookup: &IndexLookup) -> Result<Vec<String>> {
        Index::lookup(self, field, lookup)
    }

    fn is_indexed(&self, segs: &[String]) -> bool {
        Index::is_indexed(self, segs)
    }

    fn indexes(&self) -> Vec<String> {
        Index::indexes(self)
    }

    fn journal_pos(&self) -> Result<Option<Position>> {
        Index::journal_pos(self)
    }

    fn base_pos(&self) -> Position {
        self.records.read_recursive().base
    }

    fn checkpointed(&self, key: &str) -> Result<crate::journal::Committed> {
        Ok(self
            .records
            .read_recursive()
            .checkpointed(key)?
            .map(|(r, p)| (r.to_vec(), p.map(<[u8]>::to_vec))))
    }
}

/// Opens and maps the runs `docs` of a checkpoint of the store at `root`.
fn open_runs(root: &Path, docs: &[RunDoc]) -> Result<Vec<Run<memmap2::Mmap>>> {
    docs.iter()
        .map(|r| Run::open(&root.join(checkpoint::CHECKPOINT_DIR).join(&r.file)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_with_pickles_pairs_each_record_with_its_own_pickle() {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open(&dir.path().join("index")).unwrap();
        let puts: Vec<Put<'_>> = vec![
            ("a", b"{}", None),
            ("b", b"{}", Some(b"pb")),
            ("c", b"{}", None),
            ("d", b"{}", Some(b"pd")),
            ("e", b"{}", None),
        ];
        index.put_many(&puts, (0, 0)).unwrap();
        let mut seen = Vec::new();
        index
            .scan_with_pickles(|key, _, pickle| {
                seen.push((key.to_owned(), pickle.map(<[u8]>::to_vec)));
                Ok(())
            })
            .unwrap();
        let want: Vec<(String, Option<Vec<u8>>)> = vec![
            ("a".into(), None),
            ("b".into(), Some(b"pb".to_vec())),
            ("c".into(), None),
            ("d".into(), Some(b"pd".to_vec())),
            ("e".into(), None),
        ];
        assert_eq!(seen, want);
        // Replacing a pickled record by one without removes its pickle.
        index.put_many(&[("b", b"{}", None)], (0, 1)).unwrap();
        assert_eq!(index.get_pickle("b").unwrap(), None);
    }

    #[test]
    fn records_are_not_written_to_sled_without_secondary_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open(&dir.path().join("index")).unwrap();
        index
            .put_many(
                &[("a", b"{\"meta\":{}}", None), ("b", b"{}", Some(b"p"))],
                (1, 99),
            )
            .unwrap();
        assert_eq!(index.len().unwrap(), 2);
        assert_eq!(index.get_pickle("b").unwrap().as_deref(), Some(&b"p"[..]));
        assert_eq!(index.tree.len(), 0, "sled holds nothing");
        assert_eq!(index.journal_pos().unwrap(), Some((1, 99)));
        assert_eq!(
            index.remove("a", (1, 120)).unwrap().as_deref(),
            Some(&b"{\"meta\":{}}"[..])
        );
        assert_eq!(index.len().unwrap(), 1);
        assert_eq!(index.tree.len(), 0);
    }

    #[test]
    fn records_a_store_before_1_6_kept_in_sled_are_read_then_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let index = Index::open(&root.join("index")).unwrap();
        // The 1.5 layout: r<key>, p<key>, #count.
        index
            .tree
            .insert(b"ra", &b"{\"meta\":{\"v\":1}}"[..])
            .unwrap();
        index.tree.insert(b"rb", &b"{\"meta\":{}}"[..]).unwrap();
        index.tree.insert(b"pb", &b"pickle"[..]).unwrap();
        index.tree.insert(COUNT, &2u64.to_le_bytes()).unwrap();
        assert!(index.has_legacy_records().unwrap());
        // No checkpoint and no journal: the records come from sled.
        index.load(root, None).unwrap();
        assert_eq!(index.len().unwrap(), 2);
        assert_eq!(
            index.get("a").unwrap().as_deref(),
            Some(&b"{\"meta\":{\"v\":1}}"[..])
        );
        assert_eq!(
            index.get_pickle("b").unwrap().as_deref(),
            Some(&b"pickle"[..])
        );
        index.drop_legacy_records().unwrap();
        assert!(!index.has_legacy_records().unwrap());
        assert_eq!(index.tree.len(), 0);
        // What was loaded stays.
        assert_eq!(index.len().unwrap(), 2);
    }
}
