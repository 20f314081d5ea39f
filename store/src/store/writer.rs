//! The writer role: the store's lock, the sled index, the journal writer,
//! checkpoints and the removal of what readers no longer need.
//!
//! A `Store` handle reads through a [`crate::snapshot::Snapshot`] until its
//! first write, then takes this role (as SQLite takes its write lock). All
//! handles of one store in one process share one `Writer`, so re-opening a
//! store in a notebook never conflicts with an earlier handle.

use std::collections::{BTreeSet, HashSet};
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use crate::checkpoint::base::Base;
use crate::checkpoint::run::{merge_runs, Run, RunValue, RunWriter};
use crate::checkpoint::{self, CheckpointDoc, RunDoc, CHECKPOINT_DIR};
use crate::columns::Columns;
use crate::error::{Error, Result};
use crate::fsio;
use crate::index::Index;
use crate::journal::{self, JournalWriter, Position};

use super::columnar::Layered;
use super::{INDEX_DIR, LOCK_FILE};

/// A checkpoint is written at a flush once the journal has grown this much
/// since the last one: readers replay at most about this much at open.
pub(crate) const CHECKPOINT_TAIL_BYTES: u64 = 4 << 20;
/// The writer holds the records it changed since its last checkpoint in
/// memory (see FORMAT.md, "Index"); once they pass this many bytes, a put
/// commits (as `flush()` does) and so writes a checkpoint, which frees them:
/// a bulk load without `flush()` keeps bounded memory.
pub(crate) const MAX_PENDING_BYTES: u64 = 256 << 20;

/// [`MAX_PENDING_BYTES`], or what a test set.
pub(crate) fn max_pending_bytes() -> u64 {
    match PENDING_LIMIT.load(std::sync::atomic::Ordering::Relaxed) {
        0 => MAX_PENDING_BYTES,
        n => n,
    }
}

static PENDING_LIMIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Lowers [`MAX_PENDING_BYTES`] for this process (tests; 0 restores it).
#[doc(hidden)]
pub fn set_max_pending_bytes(bytes: u64) {
    PENDING_LIMIT.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// At most this many runs in a checkpoint; more are merged.
const MAX_RUNS: usize = 12;
/// How long superseded checkpoints and retired payloads are kept for
/// readers on other machines (whose locks this machine cannot see), unless
/// the store is told otherwise (`Store::set_retention`).
pub(crate) const DEFAULT_RETENTION: Duration = Duration::from_secs(15 * 60);

/// Free space a write must leave on the store's file system, so that the
/// index (sled), the journal and a checkpoint can always finish what was
/// admitted: sled 0.34 does not recover from a failed write in the same
/// session, so a write is refused before it could fail there.
pub(crate) const FREE_SPACE_MARGIN: u64 = 1 << 20;
/// What a record's metadata is assumed to cost in the journal, the index
/// and a checkpoint run, for the free-space check.
const RECORD_ESTIMATE: u64 = 3 * 4096;

/// A payload file no longer referenced from `version` on.
#[derive(Debug, Clone)]
pub(crate) struct Retired {
    /// The commit that dropped its last reference.
    pub version: u64,
    /// When that commit was made.
    pub at: SystemTime,
    /// The file, relative to the store root.
    pub relpath: String,
}

/// The writer's mutable state, behind one mutex: writes are serialised.
pub(crate) struct WriterState {
    /// Payload files of records replaced or deleted since the last commit
    /// (unlinked only after a commit and once no reader may see them,
    /// invariants 2 and 3).
    pub retiring: Vec<String>,
    /// Payload files retired by a commit, waiting for readers and the
    /// retention period.
    pub retired: Vec<Retired>,
    /// Packs whose members died this session (a pack joins `retiring`
    /// when its last member dies).
    pub pack_deaths: crate::pack::PackDeaths,
    /// Appends every change to the record journal.
    pub journal: JournalWriter,
    /// `arrays/<xx>` directories whose entry in `arrays/` this session has
    /// already fsynced.
    pub durable_dirs: HashSet<PathBuf>,
    /// The version of the last commit.
    pub version: u64,
    /// The journal position just after the last commit.
    pub committed_pos: Position,
    /// Keys changed since the last checkpoint.
    pub dirty: BTreeSet<String>,
    /// Counts changes to `dirty` (puts and deletes), so that a columnar
    /// view built at one count is reused until the next change.
    pub changes: u64,
    /// [`JournalWriter::appended`] at the last checkpoint.
    pub checkpointed_bytes: u64,
    /// The runs of the newest checkpoint, newest first; `None` when the
    /// store has no checkpoint yet (the next one holds every record).
    pub runs: Option<Vec<RunDoc>>,
    /// A run of the newest checkpoint has no column file (written before
    /// columns existed): the next checkpoint is a full one, with columns.
    pub columns_missing: bool,
}

/// The writer role of one store in this process.
pub(crate) struct Writer {
    pub root: PathBuf,
    pub opener_pid: u32,
    /// `Option` only so that a forked child can leak it (see `Drop`).
    index: Option<Index>,
    state: Mutex<WriterState>,
    /// The last columnar view built: reused while the runs and the
    /// changes count are the same.
    layered: Mutex<Option<LayeredCache>>,
    lock_file: Mutex<Option<File>>,
}

/// A columnar view of the writer's state (see [`Writer::layered`]).
struct LayeredCache {
    runs: Vec<String>,
    changes: u64,
    layered: Arc<Layered>,
}

impl Writer {
    /// The writer's state as columns: the newest checkpoint's runs and the
    /// keys changed since (read from the index, uncommitted changes
    /// included, as every read of the writer's handle sees them). `None`
    /// when a run has no column file.
    ///
    /// # Errors
    /// Those of reading the index.
    pub(crate) fn layered(&self) -> Result<Option<Arc<Layered>>> {
        let w = self.lock();
        let Some(docs) = w.runs.as_ref().filter(|_| !w.columns_missing) else {
            return Ok(None);
        };
        let names: Vec<String> = docs.iter().map(|d| d.file.clone()).collect();
        let mut cache = self.layered.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.as_ref() {
            if c.runs == names && c.changes == w.changes {
                return Ok(Some(c.layered.clone()));
            }
        }
        let base = match cache.as_ref().filter(|c| c.runs == names) {
            Some(c) => c.layered.base.clone(),
            None => match Base::open(&self.root, docs) {
                Ok(Some(base)) => Arc::new(base),
                // Columns are derived data: damaged ones (verify reports
                // them) leave scans to the records.
                Ok(None) | Err(_) => return Ok(None),
            },
        };
        let index = self.index();
        let mut changed = Vec::with_capacity(w.dirty.len());
        for key in &w.dirty {
            changed.push((key.clone(), index.get(key)?));
        }
        let Some(layered) = Layered::new(base, changed).map(Arc::new) else {
            return Ok(None);
        };
        *cache = Some(LayeredCache {
            runs: names,
            changes: w.changes,
            layered: layered.clone(),
        });
        Ok(Some(layered))
    }
}

/// The writers of this process, by canonical store path.
static WRITERS: Mutex<Vec<(PathBuf, Weak<Writer>)>> = Mutex::new(Vec::new());

impl Writer {
    pub(crate) fn index(&self) -> &Index {
        self.index.as_ref().expect("present until drop")
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, WriterState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The writer of the store at `root` (which must exist with its
    /// manifest): this process's, or a new one taking the store's lock.
    ///
    /// # Errors
    /// [`OpenError::Locked`](crate::OpenError::Locked) naming the holder when another process writes,
    /// [`StorageError::NoLocks`](crate::StorageError::NoLocks) on a file system without locks, [`Error::Corrupt`]
    /// when the index is missing or behind the journal, I/O errors
    /// (`EROFS`, `EACCES` when the store cannot be written).
    pub(crate) fn acquire(root: &Path) -> Result<Arc<Writer>> {
        let key = fs::canonicalize(root).map_err(Error::io(root))?;
        let mut writers = WRITERS.lock().unwrap_or_else(|p| p.into_inner());
        writers.retain(|(_, w)| w.strong_count() > 0);
        if let Some(w) = writers
            .iter()
            .find(|(p, _)| *p == key)
            .and_then(|(_, w)| w.upgrade())
        {
            if w.opener_pid == std::process::id() {
                return Ok(w);
            }
        }
        let writer = Arc::new(Self::take(root, None)?);
        writers.push((key, Arc::downgrade(&writer)));
        Ok(writer)
    }

    /// Registers a writer made while creating a store.
    pub(crate) fn register(root: &Path, writer: Writer) -> Result<Arc<Writer>> {
        let key = fs::canonicalize(root).map_err(Error::io(root))?;
        let writer = Arc::new(writer);
        let mut writers = WRITERS.lock().unwrap_or_else(|p| p.into_inner());
        writers.retain(|(_, w)| w.strong_count() > 0);
        writers.push((key, Arc::downgrade(&writer)));
        Ok(writer)
    }

    /// Takes the lock, opens the index (`created`: the one just made) and
    /// reads where the last checkpoint and commit are.
    pub(crate) fn take(root: &Path, created: Option<(File, Index)>) -> Result<Writer> {
        let (lock_file, index) = match created {
            Some(made) => made,
            None => {
                let lock_file = lock(root)?;
                let index_dir = root.join(INDEX_DIR);
                if !index_dir.is_dir() {
                    // Never recreate it silently: an empty index would make
                    // gc() delete every payload.
                    return Err(Error::corrupt(
                        format!("store {}", root.display()),
                        format!(
                            "the index directory {} is missing; `lazyvault repair {}` rebuilds \
                             it from the record journal",
                            index_dir.display(),
                            root.display()
                        ),
                    ));
                }
                (lock_file, Index::open(&index_dir)?)
            }
        };
        upgrade_manifest(root)?;
        // The newest checkpoint that can be read (readers skip damaged
        // ones the same way); none: the next checkpoint is a full one.
        let usable = |doc: &CheckpointDoc| {
            doc.runs
                .iter()
                .all(|r| Run::open(&root.join(CHECKPOINT_DIR).join(&r.file)).is_ok())
        };
        let base = checkpoint::list(root)?
            .iter()
            .rev()
            .filter_map(|(_, path)| checkpoint::read(path).ok())
            .find(usable);
        if base.is_none() && !checkpoint::list(root)?.is_empty() && !journal::is_whole(root)? {
            // Every checkpoint is damaged, and the journal no longer holds
            // what they did: starting from it alone would lose records.
            return Err(Error::corrupt(
                format!("store {}", root.display()),
                "no checkpoint can be read (`lazyvault verify` names the damage) and the \
                 journal no longer holds the records written before its first segment; \
                 `lazyvault repair` keeps what can be read, a backup restores the rest",
            ));
        }
        if base.is_none() && checkpoint::list(root)?.is_empty() {
            if let Some(why) = checkpoint::missing_checkpoint(root)? {
                return Err(Error::corrupt(format!("store {}", root.display()), why));
            }
        }
        let from = base.as_ref().map_or((0, 0), CheckpointDoc::position);
        // Never cut acknowledged changes that damage hides: refuse instead.
        if let Some(why) = journal::damaged_commits(root, from)? {
            return Err(Error::corrupt(format!("store {}", root.display()), why));
        }
        let next_segment = super::Store::recover_journal(root, from)?;
        // The records: that checkpoint plus the committed journal after it,
        // exactly what a reader opening now sees.
        let tail = index.load(root, base.as_ref())?;
        if !index.secondary_current(tail.end)? {
            index.rebuild_secondary(tail.end)?;
        }
        let dirty: BTreeSet<String> = index.changed_keys().into_iter().collect();
        let state = WriterState {
            retiring: Vec::new(),
            retired: Vec::new(),
            pack_deaths: Default::default(),
            journal: JournalWriter::new(root, next_segment),
            durable_dirs: HashSet::new(),
            version: base.as_ref().map_or(0, |b| b.version) + tail.commits,
            committed_pos: tail.end,
            dirty,
            changes: 0,
            checkpointed_bytes: 0,
            columns_missing: base
                .as_ref()
                .is_some_and(|b| b.runs.iter().any(|r| r.columns.is_none())),
            runs: base.map(|b| b.runs),
        };
        let writer = Writer {
            root: root.to_owned(),
            opener_pid: std::process::id(),
            index: Some(index),
            state: Mutex::new(state),
            layered: Mutex::new(None),
            lock_file: Mutex::new(Some(lock_file)),
        };
        // Readers pin a checkpoint to keep what they see: a store must have
        // one before the writer removes anything (a new store gets an empty
        // one; a store written by lazyvault 1.1, a full one, once).
        {
            let mut w = writer.lock();
            if w.runs.is_none() {
                writer.checkpoint(&mut w, true, Duration::MAX)?;
            }
        }
        // A store written before 1.6 keeps its records in sled too: a
        // checkpoint holds them now, so they go.
        if writer.index().has_legacy_records()? {
            writer.index().drop_legacy_records()?;
        }
        Ok(writer)
    }

    /// Refuses a write of about `bytes` (payloads and records) when it
    /// would leave less than [`FREE_SPACE_MARGIN`] free.
    ///
    /// # Errors
    /// [`StorageError::Io`](crate::StorageError::Io) with `ENOSPC` saying how much is free and needed.
    pub(crate) fn check_space(&self, bytes: u64) -> Result<()> {
        let free = fsio::free_space(&self.root).map_err(Error::io(&self.root))?;
        let needed = bytes.saturating_add(FREE_SPACE_MARGIN);
        if free >= needed {
            return Ok(());
        }
        Err(crate::StorageError::Io {
            path: self.root.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "not enough free space: {free} bytes free, this write needs about {bytes} \
                     plus {FREE_SPACE_MARGIN} kept free so the index and the journal can always \
                     finish; nothing was written (free some space and retry; the store stays \
                     usable)"
                ),
            ),
        }
        .into())
    }

    /// [`Writer::check_space`] for `records` records holding `payload`
    /// bytes of arrays.
    pub(crate) fn check_space_for(&self, records: usize, payload: u64) -> Result<()> {
        self.check_space(payload.saturating_add(records as u64 * RECORD_ESTIMATE))
    }

    /// Makes every change so far durable (the journal first, one fsync,
    /// then the index), commits, then removes the retired payloads no
    /// reader may still see, and writes a checkpoint when the journal grew
    /// past [`CHECKPOINT_TAIL_BYTES`] since the last.
    pub(crate) fn flush(&self, w: &mut WriterState, retention: Duration) -> Result<()> {
        self.commit(w, false)?;
        let tail = w.journal.appended().saturating_sub(w.checkpointed_bytes);
        // The changes are committed: a checkpoint that cannot be written
        // now (no space) is retried at the next flush or close.
        if tail >= CHECKPOINT_TAIL_BYTES && self.check_space(tail).is_ok() {
            let _ = self.checkpoint(w, false, retention);
        } else if !w.retired.is_empty() {
            let retained = checkpoint::cleanup(&self.root, retention)?;
            self.remove_retired(w, &retained, retention);
        }
        Ok(())
    }

    /// Makes the changes so far durable (the journal first, one fsync,
    /// then the secondary indexes) and commits them: a new version, which
    /// retires the payloads they replaced. With `new_version`, commits even
    /// when nothing changed. Returns whether it committed.
    pub(crate) fn commit(&self, w: &mut WriterState, new_version: bool) -> Result<bool> {
        let index = self.index();
        // The journal first: after a power loss the index may lose what its
        // flush reported durable, the journal may not.
        w.journal.sync()?;
        if index.io_failed() {
            return Err(index.stuck_error());
        }
        index.flush()?;
        // Only now are the changes acknowledged: say so in the journal.
        let committed = if new_version {
            w.journal.commit_version()?;
            true
        } else {
            w.journal.commit()?
        };
        if committed {
            w.version += 1;
            w.committed_pos = w.journal.position().expect("just appended");
            index.mark_committed(w.committed_pos)?;
            let now = SystemTime::now();
            let version = w.version;
            let retiring = std::mem::take(&mut w.retiring);
            w.retired
                .extend(retiring.into_iter().map(|relpath| Retired {
                    version,
                    at: now,
                    relpath,
                }));
        }
        Ok(committed)
    }

    /// Unlinks the retired payloads that no reader on this machine may see
    /// (`retained.oldest_pinned`) and that were retired more than
    /// `retention` ago. Failures leave orphans that `gc()` removes.
    fn remove_retired(
        &self,
        w: &mut WriterState,
        retained: &checkpoint::Retained,
        retention: Duration,
    ) {
        let now = SystemTime::now();
        w.retired.retain(|r| {
            let seen = retained.oldest_pinned.is_some_and(|c| c < r.version);
            let young = now.duration_since(r.at).unwrap_or_default() < retention;
            if seen || young {
                return true;
            }
            let _ = fsio::remove_file(&self.root.join(&r.relpath));
            false
        });
    }

    /// Publishes a checkpoint of the last commit (the caller has flushed):
    /// one new run with the keys changed since the last checkpoint (or,
    /// with `full` or when there is none, one run of every record), runs of
    /// similar size merged, then the checkpoint file. Then removes what no
    /// reader needs any more.
    pub(crate) fn checkpoint(
        &self,
        w: &mut WriterState,
        full: bool,
        retention: Duration,
    ) -> Result<()> {
        let index = self.index();
        let dir = self.root.join(CHECKPOINT_DIR);
        let full = full || w.columns_missing;
        let nothing_new = w.dirty.is_empty() && w.runs.is_some();
        if full || !nothing_new {
            // Only `checkpoints/` itself: never a store directory removed
            // under the writer.
            match fs::create_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(Error::io(&dir)(e))
                }
                _ => {}
            }
            // Runs that hold nothing (the empty checkpoint a new store
            // starts with) are replaced by one full run, read in key order
            // from the index: merging the changes into them would write
            // every record twice.
            let empty = w
                .runs
                .as_ref()
                .is_some_and(|runs| runs.iter().all(|doc| doc.entries == 0));
            let runs = match w.runs.clone() {
                Some(old) if !full && !empty => {
                    let mut run = RunWriter::create(&dir, &checkpoint::new_run_name())?;
                    let written = (|| {
                        for key in &w.dirty {
                            match index.get(key)? {
                                Some(record) => {
                                    let pickle = index.get_pickle(key)?;
                                    run.push(
                                        key,
                                        RunValue::Put {
                                            record: &record,
                                            pickle: pickle.as_deref(),
                                        },
                                    )?;
                                }
                                None => run.push(key, RunValue::Deleted)?,
                            }
                        }
                        Ok(())
                    })();
                    if let Err(e) = written {
                        run.abort();
                        return Err(e);
                    }
                    let mut runs = vec![RunDoc::from_info(&run.finish()?)];
                    // The changed keys shadow their entries in older runs:
                    // a columnar scan skips those (found by key, so the
                    // cost follows what changed, not the store's size).
                    for mut doc in old {
                        if doc.columns.is_some() {
                            let older = Run::open(&dir.join(&doc.file))?;
                            doc.shadowed =
                                checkpoint::base::add_shadowed(&older, &w.dirty, &doc.shadowed)?;
                        }
                        runs.push(doc);
                    }
                    merge_levels(&dir, runs)?
                }
                _ => vec![RunDoc::from_info(&write_full_run(index, &dir)?)],
            };
            fsio::sync_dir(&dir).map_err(Error::io(&dir))?;
            // Later changes go to a new segment, so that this checkpoint
            // covers whole segments: they go once no reader needs an older
            // checkpoint (the runs hold their records).
            w.journal.finish_segment();
            w.committed_pos = (w.journal.next_number(), 0);
            index.mark_committed(w.committed_pos)?;
            let doc = CheckpointDoc::new(w.version, w.committed_pos, index.len()?, runs.clone());
            checkpoint::write(&self.root, &doc)?;
            // Every change is in it (the caller flushed): the index reads
            // the new runs and drops the changes it held.
            index.rebase(&self.root, &runs, w.committed_pos);
            w.runs = Some(runs);
            w.columns_missing = false;
            w.dirty.clear();
            w.checkpointed_bytes = w.journal.appended();
        }
        let retained = checkpoint::cleanup(&self.root, retention)?;
        remove_covered_segments(&self.root, &retained)?;
        self.remove_retired(w, &retained, retention);
        Ok(())
    }

    /// Flushes, publishes a checkpoint, and removes what it can: what
    /// closing a handle does.
    pub(crate) fn finish(&self, retention: Duration) -> Result<()> {
        let mut w = self.lock();
        self.flush(&mut w, retention)?;
        self.checkpoint(&mut w, false, retention)
    }

    /// Releases the index and the lock (the last handle closing).
    pub(crate) fn shutdown(mut self) -> Result<()> {
        let index = self.index.take();
        let mut closed = Ok(());
        match index {
            Some(index) if index.io_failed() => {
                // After a failed write, dropping sled's Db (which flushes)
                // can block forever: drop it in a thread and stop waiting.
                let (done, wait) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    drop(index);
                    let _ = done.send(());
                });
                if wait.recv_timeout(STUCK_CLOSE_WAIT).is_err() {
                    closed = Err(Error::index(
                        "sled did not shut down after its failed write; its files stay locked \
                         until this process exits (everything flushed before is safe)"
                            .into(),
                    ));
                }
            }
            other => drop(other), // drops sled's Db: its file lock goes with it
        }
        if let Some(file) = self
            .lock_file
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = file.set_len(0);
        }
        closed
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if crate::pid::current() != self.opener_pid {
            // A forked child: dropping sled's Db would flush and wait forever
            // for a flusher thread fork() did not copy. Leak it; the parent
            // still owns the files and the lock.
            if let Some(index) = self.index.take() {
                std::mem::forget(index);
            }
        }
    }
}

/// How long `close()` waits for sled to shut down after it failed to write.
const STUCK_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Rewrites the manifest of a store of an older major (1.x) as
/// [`FORMAT_VERSION`](lazyvault_schema::FORMAT_VERSION), durably, before
/// this writer removes any journal segment: from then on a 1.x writer,
/// which would rebuild its index from a journal that no longer holds every
/// record, refuses the store. Its `created_by` stays.
///
/// # Errors
/// [`OpenError::Format`](crate::OpenError::Format) for a manifest that does
/// not check; I/O errors.
fn upgrade_manifest(root: &Path) -> Result<()> {
    use lazyvault_schema::{Manifest, FORMAT_VERSION, MANIFEST_FILE};
    let path = root.join(MANIFEST_FILE);
    let bytes = fs::read(&path).map_err(Error::io(&path))?;
    let mut manifest = Manifest::from_json(&bytes).map_err(|source| {
        Error::from(crate::OpenError::Format {
            path: path.clone(),
            source,
        })
    })?;
    let version = manifest.check().expect("checked by from_json");
    if version.major >= FORMAT_VERSION.major {
        return Ok(());
    }
    manifest.format_version = FORMAT_VERSION.to_string();
    super::write_file_durably(&path, &manifest.to_json())
}

/// Unlinks the journal segments numbered below the segment of the oldest
/// checkpoint kept (every reader starts from a kept checkpoint, whose runs
/// hold their records), then fsyncs `journal/`. Returns the bytes freed.
pub(crate) fn remove_covered_segments(root: &Path, retained: &checkpoint::Retained) -> Result<u64> {
    let Some((needed_from, _)) = retained.oldest_position else {
        return Ok(0);
    };
    let mut freed = 0u64;
    let mut removed_any = false;
    for (number, path) in journal::segments(root)? {
        if number < needed_from {
            freed += fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            fsio::remove_file(&path).map_err(Error::io(&path))?;
            removed_any = true;
        }
    }
    if removed_any {
        crate::payload::sync_dir(&root.join(journal::JOURNAL_DIR))?;
    }
    Ok(freed)
}

/// One run of every record of `index` (a first checkpoint, or `gc()`).
pub(crate) fn write_full_run(index: &Index, dir: &Path) -> Result<checkpoint::run::RunInfo> {
    let mut run = RunWriter::create(dir, &checkpoint::new_run_name())?;
    let written = index
        .scan_with_pickles(|key, record, pickle| run.push(key, RunValue::Put { record, pickle }));
    match written {
        Ok(()) => run.finish(),
        Err(e) => {
            run.abort();
            Err(e)
        }
    }
}

/// Merges the newest run into the next while it is at least half that
/// one's size, or while there are more than [`MAX_RUNS`]: run sizes then
/// grow geometrically, so each record is rewritten O(log n) times and a
/// checkpoint after a small change writes a small run.
fn merge_levels(dir: &Path, mut runs: Vec<RunDoc>) -> Result<Vec<RunDoc>> {
    while runs.len() >= 2 && (runs[0].bytes * 2 >= runs[1].bytes || runs.len() > MAX_RUNS) {
        let newer = Run::open(&dir.join(&runs[0].file))?;
        let older = Run::open(&dir.join(&runs[1].file))?;
        // Deletions only matter while an older run may still hold the key.
        let bottom = runs.len() == 2;
        // Their columns, interleaved into the merged run's (else built
        // from the records).
        let columns: Option<Vec<Arc<Columns>>> = runs[..2]
            .iter()
            .map(|doc| {
                let c = doc.columns.as_ref()?;
                Columns::open(&dir.join(&c.file), &c.info()?)
                    .ok()
                    .map(Arc::new)
            })
            .collect();
        let merged = merge_runs(
            &[&newer, &older],
            bottom,
            dir,
            &checkpoint::new_run_name(),
            columns.as_deref(),
        )?;
        runs.splice(0..2, [RunDoc::from_info(&merged)]);
    }
    Ok(runs)
}

/// Takes the store's exclusive lock (`flock`) and writes our PID into the
/// lock file, so a second would-be writer can name the holder.
pub(crate) fn lock(root: &Path) -> Result<File> {
    let path = root.join(LOCK_FILE);
    let mut file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| {
            Error::from(crate::StorageError::Io {
                path: path.clone(),
                source: std::io::Error::new(
                    e.kind(),
                    format!(
                        "{e}: this store cannot be written here (the writer needs write access to \
                     its directory); reading needs none: open it with mode 'r'"
                    ),
                ),
            })
        })?;
    match fsio::try_lock(&file, &path, false) {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let pid = text.trim().parse::<u32>().ok();
            let holder = match pid {
                Some(p) if p == std::process::id() => format!(
                    "this process (PID {p}): close its Store handles first (or, in a forked \
                     child, the parent's)"
                ),
                Some(p) => format!("process {p}"),
                None => "another process".to_owned(),
            };
            return Err(crate::OpenError::Locked {
                path: root.to_owned(),
                holder,
                pid,
            }
            .into());
        }
        Err(fs::TryLockError::Error(e))
            if e.raw_os_error() == Some(checkpoint::libc_errno::ENOLCK) =>
        {
            return Err(crate::StorageError::NoLocks(path).into());
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

/// The retention a store gets unless told otherwise: [`DEFAULT_RETENTION`]
/// on a network file system, where readers on other machines hold no lock
/// this machine can see; zero on a local one, where every reader's lock is
/// visible (a local disk exported over NFS needs an explicit retention).
pub(crate) fn default_retention(root: &Path) -> Duration {
    if is_network_fs(root) {
        DEFAULT_RETENTION
    } else {
        Duration::ZERO
    }
}

/// Whether `root` is on a file system other machines may mount (NFS, SMB,
/// Lustre, GPFS, CephFS, BeeGFS, 9p, FUSE): by `statfs(2)`'s `f_type`.
#[cfg(target_os = "linux")]
fn is_network_fs(root: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const NETWORK: [i64; 10] = [
        0x6969,      // NFS
        0x517b,      // SMB
        0xff53_4d42, // CIFS
        0xfe53_4d42, // SMB2
        0x0bd0_0bd0, // Lustre
        0x4750_4653, // GPFS
        0x00c3_6400, // CephFS
        0x1983_0326, // BeeGFS
        0x0102_1997, // 9p
        0x6573_5546, // FUSE (sshfs, s3fs, ...)
    ];
    let Ok(path) = std::ffi::CString::new(root.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: statfs writes into the zeroed struct we own; path is a valid
    // NUL-terminated string.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut buf) } != 0 {
        return true; // unknown: protect remote readers
    }
    NETWORK.contains(&(buf.f_type as i64))
}

#[cfg(not(target_os = "linux"))]
fn is_network_fs(_root: &Path) -> bool {
    true
}
