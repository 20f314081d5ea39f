//! The store: a directory with a manifest, a sled index and payload files.
//!
//! This module holds the handle: opening and creating a store, the reader's
//! snapshot or the writer role it reads through, and the record operations
//! (get, put, replace_arrays, delete, flush, close). Its parts:
//!
//! - [`find`]: queries, by full scan or through a secondary index;
//! - [`indexes`]: creating and dropping secondary indexes;
//! - [`recovery`]: what a writing session does first with the journal;
//! - [`writer`]: the writer role (lock, index, journal, checkpoints);
//! - [`maintenance`]: verify, gc, repair;
//! - [`merge`]: other stores' records moved in, payloads hard-linked.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

use indexmap::IndexMap;
use lazyvault_schema::{ArrayEntry, Manifest, Record, MANIFEST_FILE, PAYLOAD_DIR};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::fsio;
use crate::index::{self, Index, RecordIndex};
use crate::journal::{self, JOURNAL_DIR};
use crate::payload::{self, ArraySource, PayloadWriter, TMP_SUFFIX};
use crate::snapshot::Snapshot;

pub(crate) mod arrow;
pub(crate) mod columnar;
mod find;
mod indexes;
mod json_text;
mod keys;
mod maintenance;
mod merge;
mod recovery;
mod staged;
pub(crate) mod writer;

use json_text::Pending;
pub use json_text::{JsonText, JsonTextError, NewRecordJson};
pub use keys::Keys;
pub use staged::{Stage, StagedRecord};

#[doc(hidden)]
pub use writer::set_max_pending_bytes;
use writer::{Writer, WriterState};

/// Directory of the sled index inside a store.
pub const INDEX_DIR: &str = "index";
/// The lock file naming the process that holds the store.
pub(crate) const LOCK_FILE: &str = "lazyvault.lock";
/// The list of secondary indexes, kept outside sled so `repair` can
/// rebuild them: `{"indexes": ["temperature", "params.lr"]}`.
pub(crate) const INDEXES_FILE: &str = "indexes.json";

/// The most one record may take in the index and the journal, not counting
/// its array entries: its JSON without the `arrays` member (metadata and
/// layout) plus its pickled remainder, 1 MiB (FORMAT.md, "Record size
/// cap"). Every scan reads every record, so a record beyond it is refused
/// ([`UsageError::RecordTooLarge`](crate::UsageError::RecordTooLarge)); big
/// data belongs in arrays, which are payload files read only on demand.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// Refuses (before anything is written) a record whose JSON `json` (of
/// `record`) plus pickled remainder `pickle`, without its array entries, is
/// over [`MAX_RECORD_BYTES`]; the error names `key`, the size, the cap and
/// the largest top-level metadata fields. Every record written into a store
/// ([`Store::put_many`], staged puts: imports) or an archive goes through
/// it.
pub(crate) fn check_record_size(
    key: &str,
    record: &Record,
    json: &[u8],
    pickle: Option<&[u8]>,
) -> Result<()> {
    let pickled = pickle.map_or(0, <[u8]>::len);
    if json.len() + pickled <= MAX_RECORD_BYTES {
        return Ok(()); // the common case: nothing more to measure
    }
    let entries = serde_json::to_vec(&record.arrays).map_or(0, |j| j.len());
    let size = (json.len() + pickled).saturating_sub(entries);
    if size <= MAX_RECORD_BYTES {
        return Ok(());
    }
    let mut fields: Vec<(usize, &String)> = record
        .meta
        .iter()
        .map(|(k, v)| (serde_json::to_vec(v).map_or(0, |j| j.len()), k))
        .collect();
    fields.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let parts: Vec<String> = fields
        .iter()
        .take(3)
        .map(|(n, k)| format!("{k:?} {n} bytes"))
        .collect();
    let mut detail = if parts.is_empty() {
        "it has no metadata fields".to_owned()
    } else {
        format!("its largest metadata fields: {}", parts.join(", "))
    };
    if pickle.is_some() {
        detail.push_str(&format!("; its pickled remainder {pickled} bytes"));
    }
    Err(crate::UsageError::RecordTooLarge {
        key: key.to_owned(),
        size: size as u64,
        cap: MAX_RECORD_BYTES as u64,
        detail,
    }
    .into())
}

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

/// Reads the store manifest at `path` and checks that this build reads its
/// format.
///
/// Errors: [`StorageError::Io`](crate::StorageError::Io) when it cannot be
/// read; [`OpenError::Format`](crate::OpenError::Format) for a malformed
/// manifest or a newer major format version.
fn check_manifest(path: &Path) -> Result<()> {
    let bytes = fs::read(path).map_err(Error::io(path))?;
    Manifest::from_json(&bytes).map_err(|source| {
        Error::from(crate::OpenError::Format {
            path: path.to_owned(),
            source,
        })
    })?;
    Ok(())
}

/// A record's JSON and its pickled remainder, if any, as stored.
pub(crate) type RecordBytes = (Vec<u8>, Option<Vec<u8>>);

/// How to open a store, as in Python's `open()` and h5py.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `"r"`: the store must exist; writes raise [`UsageError::ReadOnly`](crate::UsageError::ReadOnly).
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

/// What [`Store::gc`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Payload files (and leftover temporary files) removed.
    pub removed_files: u64,
    /// Their total size in bytes.
    pub removed_bytes: u64,
    /// Bytes of journal segments removed (the full checkpoint gc writes
    /// holds their records).
    pub journal_bytes_freed: u64,
    /// Packs rewritten because more than half of their member bytes were
    /// no record's any more (FORMAT.md, "Packs"); each is retired, and
    /// removed once no reader may still see it.
    pub packs_compacted: u64,
    /// Packs that were due for that rewrite but left as they are because
    /// they are damaged: a live member that no longer reads or no longer
    /// matches its checksum, or no readable zip (nothing damaged is copied
    /// under a good checksum). [`Store::verify`] names them and their
    /// records.
    pub packs_damaged: u64,
}

/// What [`Store::verify`] or [`Store::verify_with`] found: damage is
/// reported here, one line per problem, rather than as an error.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Records checked.
    pub records: u64,
    /// Payloads checked.
    pub arrays: u64,
    /// Payloads whose data was hashed and compared with the checksum
    /// recorded at write time, matching or not.
    pub checksummed: u64,
    /// Of those, the payloads whose checksum did not match (each is also
    /// one of the `problems`).
    pub checksum_mismatches: u64,
    /// One line per damaged or missing payload, pack that is no readable
    /// zip, undecodable record, entry whose dtype disagrees with its descr,
    /// layout naming an array the record lacks, or disagreement between the
    /// index and the journal.
    pub problems: Vec<String>,
    /// Payload or temporary files that no record references, as paths under
    /// [`Store::root`] (not a problem: [`Store::gc`] removes them).
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
    /// Whether every record and payload checked out: `problems` is empty
    /// (orphans do not count).
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
///
/// # Errors
/// Every method returning a [`Result`](crate::Result) fails with
/// [`UsageError::Closed`](crate::UsageError::Closed) after [`Store::close`]
/// and with [`OpenError::Forked`](crate::OpenError::Forked) in a child
/// process forked after the store was opened. Reading the index may also
/// fail with [`Error::Corrupt`] (data the store did not write),
/// [`Error::Index`] (sled) or [`StorageError::Io`](crate::StorageError::Io);
/// each method's own section lists what it adds.
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
    Reading(Box<Snapshot>),
    Writing(Arc<Writer>),
}

impl State {
    fn index(&self) -> Result<&dyn RecordIndex> {
        match self {
            State::Closed => Err(Error::closed()),
            State::Reading(s) => Ok(&**s),
            State::Writing(w) => Ok(w.index()),
        }
    }
}

/// Writes `contents` to `path` durably: a temporary file, fsynced, renamed
/// into place, the directory fsynced.
fn write_file_durably(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("json{TMP_SUFFIX}"));
    fsio::write_new_file(path, &tmp, &[contents]).map_err(Error::io(&tmp))?;
    payload::sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Refuses the empty key (every other string is a key).
fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        Err(Error::empty_key())
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
    /// [`OpenError::Exists`](crate::OpenError::Exists) / [`OpenError::NotFound`](crate::OpenError::NotFound) / [`OpenError::NotAStore`](crate::OpenError::NotAStore) by
    /// mode, [`OpenError::Format`](crate::OpenError::Format) for a newer major format version,
    /// [`Error::Corrupt`] for a damaged checkpoint, [`OpenError::Locked`](crate::OpenError::Locked) when
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
            Mode::Create if exists => return Err(crate::OpenError::Exists(root).into()),
            Mode::ReadOnly if !exists => return Err(Error::not_found(root)),
            _ => {}
        }
        if exists && !root.is_dir() {
            return Err(Error::not_a_store(root));
        }
        let manifest_path = root.join(MANIFEST_FILE);
        let has_manifest = exists && manifest_path.exists();
        if !has_manifest && exists && !Self::is_empty_or_unfinished(&root)? {
            return Err(Error::not_a_store(root));
        }
        if !has_manifest && mode == Mode::ReadOnly {
            return Err(Error::not_found(root));
        }
        let state = if has_manifest {
            check_manifest(&manifest_path)?;
            State::Reading(Box::new(Snapshot::open(&root, at)?))
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

    /// The store's directory, made absolute when it was opened (a later
    /// `chdir` does not move it).
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
        let current = crate::pid::current();
        if current != self.opener_pid {
            return Err(crate::OpenError::Forked {
                opener: self.opener_pid,
                current,
            }
            .into());
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
    /// [`UsageError::ReadOnly`](crate::UsageError::ReadOnly) in mode `"r"`, [`OpenError::Locked`](crate::OpenError::Locked) while another
    /// process writes, [`UsageError::Closed`](crate::UsageError::Closed), and the errors of taking the role.
    fn writer(&self) -> Result<(View<'_>, Arc<Writer>)> {
        let view = self.view()?;
        if self.mode == Mode::ReadOnly {
            return Err(Error::read_only());
        }
        if let State::Writing(w) = &*view.0 {
            let w = w.clone();
            return Ok((view, w));
        }
        drop(view);
        {
            let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
            match &*state {
                State::Closed => return Err(Error::closed()),
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
            _ => Err(Error::closed()),
        }
    }

    /// Takes the writer role now rather than at the first write (as
    /// SQLite's `BEGIN IMMEDIATE`): recovers what a crashed writer left and
    /// shows the latest state, changes a crash left in the index included.
    ///
    /// # Errors
    /// As a first write: [`UsageError::ReadOnly`](crate::UsageError::ReadOnly), [`OpenError::Locked`](crate::OpenError::Locked), ...
    pub fn begin_write(&self) -> Result<()> {
        self.writer().map(drop)
    }

    /// How long superseded checkpoints and retired payloads are kept for
    /// readers on other machines, whose locks this machine cannot see.
    /// Unless set with [`Store::set_retention`]: 15 minutes when the store
    /// is on a network file system (NFS, SMB, Lustre, GPFS, CephFS, ...,
    /// told by `statfs(2)`), zero on a local one.
    pub fn retention(&self) -> Duration {
        let set = *self.retention.lock().unwrap_or_else(|p| p.into_inner());
        set.unwrap_or_else(|| writer::default_retention(&self.root))
    }

    /// Sets [`Store::retention`] for this handle's flushes, closes and
    /// [`Store::gc`] (a local disk exported over NFS needs one).
    pub fn set_retention(&self, retention: Duration) {
        *self.retention.lock().unwrap_or_else(|p| p.into_inner()) = Some(retention);
    }

    /// The version this handle shows: the number of commits (flushes and
    /// closes that changed something, `gc()`) since the store was created,
    /// as of its snapshot; for the writer, its last commit.
    ///
    /// # Errors
    /// Only those of every method (see [`Store`]).
    pub fn version(&self) -> Result<u64> {
        let view = self.view()?;
        Ok(match &*view.0 {
            State::Reading(s) => s.version(),
            State::Writing(w) => w.lock().version,
            State::Closed => unreachable!("checked open"),
        })
    }

    /// Whether this handle holds changes not yet committed (puts or
    /// deletes since the last [`Store::flush`]): what it shows differs from
    /// its [`Store::version`]. Always false for a reader.
    ///
    /// # Errors
    /// Only those of every method (see [`Store`]).
    pub fn has_uncommitted_changes(&self) -> Result<bool> {
        let view = self.view()?;
        Ok(match &*view.0 {
            State::Reading(_) => false,
            State::Writing(w) => w.lock().journal.has_uncommitted(),
            State::Closed => unreachable!("checked open"),
        })
    }

    /// Moves a reader's snapshot to the latest commit and returns its
    /// version; the writer already shows it.
    ///
    /// # Errors
    /// [`OpenError::NotFound`](crate::OpenError::NotFound) when the store was
    /// removed meanwhile; [`Error::Corrupt`] for a damaged checkpoint or
    /// journal; [`StorageError::Io`](crate::StorageError::Io). The snapshot is
    /// unchanged on error.
    pub fn refresh(&self) -> Result<u64> {
        self.check_fork()?;
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        match &mut *state {
            State::Closed => Err(Error::closed()),
            State::Reading(s) => {
                // packs the old snapshot kept may be removed from now on
                crate::open_packs::forget_under(&self.root);
                s.refresh()
            }
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
    /// [`UsageError::EmptyKey`](crate::UsageError::EmptyKey), [`UsageError::ReadOnly`](crate::UsageError::ReadOnly), [`OpenError::Locked`](crate::OpenError::Locked) when
    /// another process writes, [`UsageError::InvalidArray`](crate::UsageError::InvalidArray) for an array whose
    /// bytes do not match its dtype and shape, I/O errors (`ENOSPC`, `EIO`,
    /// ... kept in [`StorageError::Io`](crate::StorageError::Io)). On error the old record (if any) is
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
        self.put_batch(records)
    }

    /// [`Store::put_many`] with each record's metadata and layout as
    /// checked JSON text, copied into the record as it is: no
    /// `serde_json::Value` built and serialized again per record (what the
    /// Python binding hands over).
    ///
    /// # Errors
    /// As [`Store::put_many`].
    pub fn put_many_json(&self, records: Vec<NewRecordJson<'_>>) -> Result<()> {
        self.put_batch(records)
    }

    /// [`Store::put_many`] of records in either form.
    fn put_batch<'a, R: Pending<'a>>(&self, records: Vec<R>) -> Result<()> {
        for r in &records {
            check_key(r.key())?;
            payload::check_unique_names(r.arrays())?;
        }
        let (_view, w) = self.writer()?;
        let index = w.index();
        if index.io_failed() {
            return Err(index.stuck_error());
        }
        let payload: u64 = records
            .iter()
            .flat_map(|r| r.arrays().iter())
            .map(|a| a.data.len() as u64 + 4096)
            .sum();
        w.check_space_for(records.len(), payload)?;
        let mut state = w.lock();
        let records = records.into_iter().map(|r| (r, IndexMap::new())).collect();
        self.put_locked(index, &mut state, records)?;
        self.bound_pending(&w, &mut state)
    }

    /// Commits (as `flush()` does, which writes a checkpoint) once the
    /// writer holds more than [`writer::MAX_PENDING_BYTES`] of changed
    /// records in memory.
    fn bound_pending(&self, w: &Writer, state: &mut WriterState) -> Result<()> {
        let limit = writer::max_pending_bytes();
        if w.index().pending_bytes() < limit {
            return Ok(());
        }
        let retention = self.retention();
        w.flush(state, retention)?;
        if w.index().pending_bytes() >= limit {
            // less journal than a flush's checkpoint threshold: write it now
            w.checkpoint(state, false, retention)?;
        }
        Ok(())
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
    /// [`UsageError::InvalidArray`](crate::UsageError::InvalidArray) for a name the record has no array of (store
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
        let old = Record::from_json(&json)
            .map_err(|e| Error::corrupt(format!("record {key:?}"), e).with_key(key))?;
        let mut kept = old.arrays;
        for (i, src) in arrays.iter().enumerate() {
            let detail = if arrays[..i].iter().any(|a| a.name == src.name) {
                "two arrays with the same name"
            } else if !kept.contains_key(&src.name) {
                "the record has no array of this name (store the whole object to add one)"
            } else {
                continue;
            };
            return Err(crate::UsageError::InvalidArray {
                name: src.name.clone(),
                detail: detail.into(),
            }
            .into());
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
        self.bound_pending(&w, &mut state)?;
        Ok(true)
    }

    /// Writes `records` (each with the entries of arrays it keeps from the
    /// record it replaces) as [`Store::put_many`] describes; the caller
    /// holds the writer lock.
    fn put_locked<'a, R: Pending<'a>>(
        &self,
        index: &Index,
        writer: &mut WriterState,
        records: Vec<(R, IndexMap<String, ArrayEntry>)>,
    ) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let files = payload::files_for(records.iter().flat_map(|(r, _)| r.arrays().iter()));
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
                let mut e = IndexMap::with_capacity(kept.len() + r.arrays().len());
                e.extend(kept.iter().map(|(k, v)| (k.clone(), v.clone())));
                for src in r.arrays() {
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
                let (key, pickle) = (r.key(), r.pickle());
                jsons.push((key, r.into_json(arrays)?, pickle));
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
                writer.changes += 1;
                for (old, kept) in replaced.into_iter().zip(kept_ids) {
                    if let Some(old) = old {
                        self.retire(writer, &old, &kept);
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
    /// record leaves orphans for gc(), nothing worse. A packed payload
    /// queues its pack only once every member of the pack died in this
    /// session (other records may use it; `gc()` removes or compacts the
    /// others).
    fn retire(&self, writer: &mut WriterState, record: &[u8], kept: &HashSet<String>) {
        if let Ok(old) = Record::from_json(record) {
            for e in old.arrays.values().filter(|e| !kept.contains(&e.id)) {
                if e.is_packed() {
                    if let Some(pack) = writer.pack_deaths.died(&self.root, e) {
                        writer.retiring.push(pack);
                    }
                } else {
                    writer.retiring.push(e.relpath());
                }
            }
        }
    }

    /// The record JSON of `key` as stored (UTF-8 bytes, see FORMAT.md,
    /// "Record"), or `None`.
    ///
    /// # Errors
    /// [`UsageError::EmptyKey`](crate::UsageError::EmptyKey) for `""`, and
    /// those of every method (see [`Store`]).
    pub fn get_json(&self, key: &str) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        self.view()?.index().get(key)
    }

    /// What to say of the missing payload file of `entry`, an array of the
    /// record `key` as some handle read it (its file is gone): when the
    /// latest commit of the store at `root` (read as a new reader would)
    /// still references that payload, the store is damaged; when `key` was
    /// overwritten or deleted since, the record read was stale and its
    /// payload was removed once no snapshot needed it. Opens no payload;
    /// for error messages (a damaged checkpoint or journal makes it say
    /// neither).
    pub fn missing_payload_hint(root: &Path, key: &str, entry: &ArrayEntry) -> String {
        let latest = Store::open(root, Mode::ReadOnly).and_then(|s| s.get(key));
        match latest {
            Ok(record) => {
                let same = |e: &ArrayEntry| e.id == entry.id && e.pack == entry.pack;
                if record.is_some_and(|r| r.arrays.values().any(same)) {
                    "the store's latest commit still references it: the store is damaged \
                     (`lazyvault verify` lists every missing payload); restore the file from a \
                     backup, or put the record again"
                        .to_owned()
                } else {
                    "the record was overwritten or deleted since it was read, and no snapshot \
                     keeps it any more; call store.refresh() (a reader) and take store[key] again"
                        .to_owned()
                }
            }
            Err(e) => format!("`lazyvault verify` lists every missing payload ({e})"),
        }
    }

    /// The decoded, validated record of `key`, or `None`.
    ///
    /// # Errors
    /// As [`Store::get_json`]; [`Error::Corrupt`] (naming `key`) when the
    /// stored JSON is not a valid record.
    pub fn get(&self, key: &str) -> Result<Option<Record>> {
        match self.get_json(key)? {
            None => Ok(None),
            Some(bytes) => Record::from_json(&bytes)
                .map(Some)
                .map_err(|e| Error::corrupt(format!("record {key:?}"), e).with_key(key)),
        }
    }

    /// The record JSON of `key` and its pickled remainder, read together:
    /// writers are held off between the two reads, so the remainder always
    /// belongs to that record (never to a record that replaced it).
    /// Returns `(record JSON, pickled remainder)`, or `None` without a record.
    ///
    /// # Errors
    /// As [`Store::get_json`].
    pub fn get_with_pickle(&self, key: &str) -> Result<Option<RecordBytes>> {
        self.get_with_pickle_if(key, |_| true)
    }

    /// [`Store::get_with_pickle`], looking the remainder up only when
    /// `has_pickle` says the record JSON it is given has one (its `pickle`
    /// field; a reader that parses the record anyway saves a look-up).
    /// Returns `(record JSON, pickled remainder)` (`None` when `has_pickle`
    /// said no), or `None` without a record.
    ///
    /// # Errors
    /// As [`Store::get_json`].
    pub fn get_with_pickle_if(
        &self,
        key: &str,
        has_pickle: impl FnOnce(&[u8]) -> bool,
    ) -> Result<Option<RecordBytes>> {
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
        let pickle = match has_pickle(&record) {
            true => index.get_pickle(key)?,
            false => None,
        };
        Ok(Some((record, pickle)))
    }

    /// The pickled remainder of `key` (the bytes `pickle` was given to
    /// [`Store::put`]), if it has one.
    ///
    /// # Errors
    /// As [`Store::get_json`].
    pub fn get_pickle(&self, key: &str) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        self.view()?.index().get_pickle(key)
    }

    /// Whether `key` has a record.
    ///
    /// # Errors
    /// As [`Store::get_json`].
    pub fn contains(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        self.view()?.index().contains(key)
    }

    /// Number of records (O(1)).
    ///
    /// # Errors
    /// Only those of every method (see [`Store`]).
    pub fn len(&self) -> Result<u64> {
        self.view()?.index().len()
    }

    /// Whether the store has no records.
    ///
    /// # Errors
    /// As [`Store::len`].
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Removes `key`; returns whether it was there. Its payloads are removed
    /// as those of a replaced record (see [`Store::put`]).
    ///
    /// # Errors
    /// As [`Store::put`]: [`UsageError::EmptyKey`](crate::UsageError::EmptyKey),
    /// [`UsageError::ReadOnly`](crate::UsageError::ReadOnly),
    /// [`OpenError::Locked`](crate::OpenError::Locked), I/O errors (a disk
    /// too full to take the journal entry is refused before anything is
    /// written). On error the record stays.
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
                writer.changes += 1;
                if let Some(old) = old {
                    self.retire(&mut writer, &old, &HashSet::new());
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
    ///
    /// # Errors
    /// Only those of every method (see [`Store`]).
    pub fn keys(&self) -> Result<Vec<String>> {
        let view = self.view()?;
        let mut keys = Vec::new();
        index::scan(view.index(), |k, _| {
            keys.push(k.to_owned());
            Ok(())
        })?;
        Ok(keys)
    }

    /// [`Store::keys`], packed in one buffer ([`Keys`]): no `String`
    /// allocated per key.
    ///
    /// # Errors
    /// Only those of every method (see [`Store`]).
    pub fn all_keys(&self) -> Result<Keys> {
        let view = self.view()?;
        let mut keys = Keys::default();
        index::scan(view.index(), |k, _| {
            keys.push(k);
            Ok(())
        })?;
        Ok(keys)
    }

    /// Makes every change so far durable (the journal first, one fsync,
    /// then the index) and commits it: readers that open or `refresh()`
    /// from now on see it. Then removes the payloads of replaced records
    /// that no reader may still see. A reader, or a handle that has not
    /// written, has nothing to flush. If a flush fails, nothing is removed
    /// and the error is returned.
    ///
    /// # Errors
    /// [`StorageError::Io`](crate::StorageError::Io) when the journal or the
    /// index cannot be made durable (`ENOSPC`, `EIO`, ...; after sled failed
    /// to write, every later flush of this session fails until the store is
    /// reopened); [`Error::Index`].
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
    /// call afterwards raises [`UsageError::Closed`](crate::UsageError::Closed).
    ///
    /// # Errors
    /// Those of [`Store::flush`] and of writing the checkpoint or releasing
    /// the index; [`OpenError::Forked`](crate::OpenError::Forked) in a forked
    /// child. The handle is closed even then.
    pub fn close(&self) -> Result<()> {
        // Never touch sled in a forked child: flush would hang.
        self.check_fork()?;
        let retention = self.retention();
        let old = std::mem::replace(
            &mut *self.state.write().unwrap_or_else(|p| p.into_inner()),
            State::Closed,
        );
        if !matches!(old, State::Closed) {
            crate::open_packs::forget_under(&self.root);
        }
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
