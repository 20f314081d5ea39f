//! Checkpoints: immutable, checksummed pictures of the committed records
//! that readers open in constant time (FORMAT.md, "Checkpoints").
//!
//! A checkpoint is a small file `checkpoints/<version>.ckpt` naming the
//! journal position it covers, the record count, and a list of *runs*
//! (`checkpoints/<id>.run`, see [`run`]): sorted tables of records and
//! deletions, newest first. A reader maps the runs of the newest checkpoint
//! and replays only the committed journal after its position. The writer
//! adds one small run per checkpoint holding what changed since the last
//! one and merges runs of similar size (an LSM's levels), so its cost stays
//! proportional to what changed.
//!
//! Readers pin the checkpoint they opened with a shared `flock` on its
//! file, held as long as their snapshot; the writer removes a superseded
//! checkpoint (and the payloads retired after it) only when it can take an
//! exclusive lock on it and the retention period has passed.

pub(crate) mod base;
pub(crate) mod run;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::columns::ColumnsInfo;
use crate::error::{Error, Result};
use crate::fsio;
use crate::journal::Position;
use crate::payload::TMP_SUFFIX;

/// Directory (relative to the store root) of checkpoints and their runs.
pub const CHECKPOINT_DIR: &str = "checkpoints";
/// Value of a checkpoint document's `format` field.
const FORMAT: &str = "lazyvault-checkpoint";
/// Major version of the checkpoint document this crate reads and writes.
const DOC_MAJOR: u32 = 1;
const MAGIC: &[u8; 8] = b"LVCKPT\0\x01";
/// A checkpoint document larger than this is refused unread (thousands of
/// runs would be needed to reach it).
const MAX_DOC: u64 = 16 << 20;
/// How long a reader waits for a writer holding a checkpoint's lock while
/// it decides whether to remove it (a few file operations).
const PIN_WAIT: Duration = Duration::from_secs(5);

/// One run of a checkpoint, as its document lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunDoc {
    /// File name in `checkpoints/`.
    pub file: String,
    /// Entries (records and deletions).
    pub entries: u64,
    /// Length of the file in bytes.
    pub bytes: u64,
    /// `xxh3-64:<16 hex>` of the file before its last 8 bytes.
    pub checksum: String,
    /// Its column file (FORMAT.md, "Column files"); absent for runs
    /// written before columns existed, or whose records did not decode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<ColumnsDoc>,
    /// Entries (by position in the run) that a newer run of this
    /// checkpoint replaces or deletes, ascending: what a columnar scan of
    /// this run skips. Meaningful only with `columns`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shadowed: Vec<u64>,
}

/// A run's column file, as its checkpoint lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ColumnsDoc {
    /// File name in `checkpoints/` (`<run id>.arrow`).
    pub file: String,
    /// Length in bytes.
    pub bytes: u64,
    /// `xxh3-64:<16 hex>` of the whole file.
    pub checksum: String,
    /// `xxh3-64:<16 hex>` of the file's footer (its schema), checked at open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub footer: Option<String>,
    /// Per column, in schema order, 16 hex digits: the XXH3-64 of its
    /// decoded buffers, checked at the column's first use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub column_checksums: Vec<String>,
}

impl ColumnsDoc {
    /// The file's length and checksum as [`ColumnsInfo`], when the
    /// checksum is well formed.
    pub(crate) fn info(&self) -> Option<ColumnsInfo> {
        let hex = self.checksum.strip_prefix("xxh3-64:")?;
        let footer = match &self.footer {
            None => None,
            Some(f) => Some(u64::from_str_radix(f.strip_prefix("xxh3-64:")?, 16).ok()?),
        };
        let columns = self
            .column_checksums
            .iter()
            .map(|c| u64::from_str_radix(c, 16).ok())
            .collect::<Option<Vec<u64>>>()?;
        Some(ColumnsInfo {
            file: self.file.clone(),
            bytes: self.bytes,
            checksum: u64::from_str_radix(hex, 16).ok()?,
            footer,
            columns,
        })
    }
}

impl RunDoc {
    pub(crate) fn from_info(info: &run::RunInfo) -> RunDoc {
        RunDoc {
            file: info.file.clone(),
            entries: info.entries,
            bytes: info.bytes,
            checksum: format!("xxh3-64:{:016x}", info.checksum),
            columns: info.columns.as_ref().map(|c| ColumnsDoc {
                file: c.file.clone(),
                bytes: c.bytes,
                checksum: format!("xxh3-64:{:016x}", c.checksum),
                footer: c.footer.map(|f| format!("xxh3-64:{f:016x}")),
                column_checksums: c.columns.iter().map(|x| format!("{x:016x}")).collect(),
            }),
            shadowed: Vec::new(),
        }
    }
}

/// A checkpoint document (the JSON inside a `.ckpt` file). Unknown fields
/// are ignored, so a later minor version may add some (the planned
/// metadata columns); `doc_version`'s major must be ours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CheckpointDoc {
    /// Always `"lazyvault-checkpoint"`.
    pub format: String,
    /// `MAJOR.MINOR` of this document's layout.
    pub doc_version: String,
    /// The store version (commits since creation) it shows.
    pub version: u64,
    /// Journal position (segment, offset) just after the last commit it
    /// covers; `[0, 0]` for the start of the journal.
    pub journal: [u64; 2],
    /// Records it holds.
    pub records: u64,
    /// Runs, newest first: for a key in several, the first one decides.
    pub runs: Vec<RunDoc>,
    /// Reserved for columns of metadata (a later format version); empty.
    #[serde(default)]
    pub columns: Vec<serde_json::Value>,
}

impl CheckpointDoc {
    pub(crate) fn new(version: u64, journal: Position, records: u64, runs: Vec<RunDoc>) -> Self {
        CheckpointDoc {
            format: FORMAT.to_owned(),
            doc_version: format!("{DOC_MAJOR}.1"),
            version,
            journal: [journal.0, journal.1],
            records,
            runs,
            columns: Vec::new(),
        }
    }

    pub(crate) fn position(&self) -> Position {
        (self.journal[0], self.journal[1])
    }

    /// Encodes the file: magic, u32 length, JSON, CRC-32 of all before.
    fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("serializes");
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks a checkpoint file's bytes.
    pub(crate) fn decode(bytes: &[u8], name: &str) -> Result<CheckpointDoc> {
        let bad = |detail: String| Error::corrupt(format!("checkpoint {name}"), detail);
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return Err(bad("not a checkpoint file (bad magic or too short)".into()));
        }
        let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
        if bytes.len() != 12 + len + 4 {
            return Err(bad(format!(
                "{} bytes, the header says {}",
                bytes.len(),
                12 + len + 4
            )));
        }
        let crc = u32::from_le_bytes(bytes[12 + len..].try_into().expect("4 bytes"));
        if crc32fast::hash(&bytes[..12 + len]) != crc {
            return Err(bad("CRC-32 mismatch: the file is damaged".into()));
        }
        Self::decode_body(&bytes[12..12 + len], name)
    }

    /// The document of a checkpoint file whose CRC-32 does not match but
    /// whose JSON still decodes and checks (a flipped bit outside what it
    /// says, or in a checksum): what `repair` salvages, checking each run
    /// it names on its own. `None` when nothing can be read.
    pub(crate) fn decode_damaged(bytes: &[u8], name: &str) -> Option<CheckpointDoc> {
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return None;
        }
        let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
        let body = bytes.get(12..12usize.checked_add(len)?)?;
        Self::decode_body(body, name).ok()
    }

    /// The checks of the document's JSON (see [`CheckpointDoc::decode`]).
    fn decode_body(body: &[u8], name: &str) -> Result<CheckpointDoc> {
        let bad = |detail: String| Error::corrupt(format!("checkpoint {name}"), detail);
        let doc: CheckpointDoc = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        if doc.format != FORMAT {
            return Err(bad(format!("format is {:?}, not {FORMAT:?}", doc.format)));
        }
        let major = doc.doc_version.split('.').next().unwrap_or_default();
        if major != DOC_MAJOR.to_string() {
            return Err(bad(format!(
                "checkpoint version {} is not {DOC_MAJOR}.x: written by a newer lazyvault",
                doc.doc_version
            )));
        }
        for r in &doc.runs {
            if !valid_run_name(&r.file) {
                return Err(bad(format!("bad run file name {:?}", r.file)));
            }
        }
        Ok(doc)
    }
}

/// Why the store at `root`, which lists no checkpoint, must have had one:
/// a journal that no longer starts at segment 1, or no journal at all
/// beside run files holding records (since 2.0 the segments a checkpoint
/// covers are removed once it is published, so both mean a published
/// checkpoint was lost). Read alone, its journal would show a store with
/// records missing. `None`: a store that never published a checkpoint (one
/// whose creation a crash cut short leaves an empty run; one last written
/// by lazyvault 1.1 has its whole journal).
///
/// # Errors
/// I/O errors listing `checkpoints/` or `journal/`.
pub(crate) fn missing_checkpoint(root: &Path) -> Result<Option<String>> {
    let dir = root.join(CHECKPOINT_DIR);
    let segments = crate::journal::segments(root)?;
    let why = match segments.first() {
        Some((1, _)) => return Ok(None),
        Some(_) => "no checkpoint file, and the journal no longer starts at segment 1".to_owned(),
        None => {
            let runs: Vec<PathBuf> = match fs::read_dir(&dir) {
                Ok(entries) => entries
                    .flatten()
                    .filter(|e| e.file_name().to_str().is_some_and(valid_run_name))
                    .map(|e| e.path())
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(Error::io(&dir)(e)),
            };
            // a run that does not open counts as holding records: damage
            let holding = runs
                .iter()
                .filter(|p| run::Run::open(p).map_or(true, |r| r.len() > 0))
                .count();
            if holding == 0 {
                return Ok(None);
            }
            format!("{holding} checkpoint run file(s) holding records but no checkpoint file")
        }
    };
    Ok(Some(format!(
        "{why} in {}: the checkpoint holding the records was removed or lost; \
         `lazyvault repair` keeps what its runs and the journal still hold",
        dir.display()
    )))
}

/// Run file names are ours (`<32 hex>.run`): never a path out of the store.
fn valid_run_name(name: &str) -> bool {
    name.strip_suffix(".run").is_some_and(hex_id)
}

/// Column file names are ours (`<32 hex>.arrow`).
pub(crate) fn valid_columns_name(name: &str) -> bool {
    name.strip_suffix(crate::columns::COLUMNS_SUFFIX)
        .is_some_and(hex_id)
}

fn hex_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A new unique run file name.
pub(crate) fn new_run_name() -> String {
    format!("{}.run", uuid::Uuid::new_v4().simple())
}

fn checkpoint_name(version: u64) -> String {
    format!("{version:016x}.ckpt")
}

/// The checkpoint files of the store at `root`, by version (oldest first).
pub(crate) fn list(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    crate::journal::numbered_files(&root.join(CHECKPOINT_DIR), ".ckpt")
}

/// Reads and checks the checkpoint file at `path`.
pub(crate) fn read(path: &Path) -> Result<CheckpointDoc> {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let len = fs::metadata(path).map_err(Error::io(path))?.len();
    if len > MAX_DOC {
        return Err(Error::corrupt(
            format!("checkpoint {name}"),
            format!("{len} bytes, larger than any checkpoint"),
        ));
    }
    let bytes = fs::read(path).map_err(Error::io(path))?;
    CheckpointDoc::decode(&bytes, &name)
}

/// Writes `doc` as the checkpoint of its version: temporary name, fsync,
/// rename, fsync of the directory (its runs must already be durable).
pub(crate) fn write(root: &Path, doc: &CheckpointDoc) -> Result<PathBuf> {
    let dir = root.join(CHECKPOINT_DIR);
    let path = dir.join(checkpoint_name(doc.version));
    let tmp = dir.join(format!("{}{TMP_SUFFIX}", checkpoint_name(doc.version)));
    fsio::write_new_file(&path, &tmp, &[&doc.encode()]).map_err(Error::io(&tmp))?;
    fsio::sync_dir(&dir).map_err(Error::io(&dir))?;
    Ok(path)
}

/// A reader's hold on one checkpoint: a shared `flock` on its file, so the
/// writer does not remove it, its runs, or payloads its snapshot may see.
/// Dropping it (or the process dying) releases it.
pub(crate) struct Pin {
    /// `None` on a file system without locks (ENOLCK): then only the
    /// retention period protects the snapshot.
    _file: Option<File>,
}

fn is_no_lock(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc_errno::ENOLCK) | Some(libc_errno::EOPNOTSUPP)
    )
}

/// errno values (Linux), without a libc dependency on other systems.
pub(crate) mod libc_errno {
    pub(crate) const ENOLCK: i32 = 37;
    pub(crate) const EOPNOTSUPP: i32 = 95;
}

/// Pins the checkpoint at `path`. `Ok(None)` when it was removed before the
/// pin took hold (the caller lists the checkpoints again).
pub(crate) fn pin(path: &Path) -> Result<Option<Pin>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path)(e)),
    };
    let deadline = std::time::Instant::now() + PIN_WAIT;
    loop {
        match fsio::try_lock(&file, path, true) {
            Ok(()) => break,
            Err(fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                // The writer holds it for a moment while deciding to remove it.
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(fs::TryLockError::WouldBlock) => {
                return Err(Error::io(path)(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "a writer held this checkpoint's lock for more than 5 s",
                )))
            }
            Err(fs::TryLockError::Error(e)) if is_no_lock(&e) => {
                return Ok(Some(Pin { _file: None }));
            }
            Err(fs::TryLockError::Error(e)) => return Err(Error::io(path)(e)),
        }
    }
    // The writer unlinks a checkpoint while it holds the exclusive lock: if
    // the name no longer leads to this file, it was removed under us.
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let ours = file.metadata().map_err(Error::io(path))?;
        match fs::metadata(path) {
            Ok(now) if now.ino() == ours.ino() && now.dev() == ours.dev() => {}
            _ => return Ok(None),
        }
    }
    Ok(Some(Pin { _file: Some(file) }))
}

/// Whether a reader holds the checkpoint at `path` (a shared lock).
/// On a file system without locks, `false`: retention alone decides.
fn is_pinned(path: &Path) -> Result<bool> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(path)(e)),
    };
    match fsio::try_lock(&file, path, false) {
        Ok(()) => Ok(false),
        Err(fs::TryLockError::WouldBlock) => Ok(true),
        Err(fs::TryLockError::Error(e)) if is_no_lock(&e) => Ok(false),
        Err(fs::TryLockError::Error(e)) => Err(Error::io(path)(e)),
    }
}

/// What [`cleanup`] left in place.
#[derive(Debug, Default)]
pub(crate) struct Retained {
    /// The oldest version a reader on this machine may still show: the
    /// version of the oldest checkpoint a reader pins (`None`: no pin). A
    /// payload retired by commit `k` may be removed only when this is
    /// `None` or at least `k`.
    pub oldest_pinned: Option<u64>,
    /// The journal position of the oldest checkpoint kept: journal
    /// segments before its segment are no longer needed by any reader.
    pub oldest_position: Option<Position>,
    /// Checkpoint files kept (the newest, pinned ones, recent ones).
    pub kept: Vec<(u64, PathBuf)>,
}

/// Removes superseded checkpoints that no reader pins and that were
/// superseded more than `retention` ago, then the run files no remaining
/// checkpoint lists and leftover temporary files. The newest checkpoint is
/// always kept. Called by the writer only (it holds the store's lock).
pub(crate) fn cleanup(root: &Path, retention: Duration) -> Result<Retained> {
    let dir = root.join(CHECKPOINT_DIR);
    // A checkpoint that cannot be read (damaged, or not ours) serves no
    // reader: readers skip it for an older one. Remove it unless pinned.
    let mut all = Vec::new();
    let mut docs = std::collections::HashMap::new();
    for (version, path) in list(root)? {
        let doc = read(&path).ok();
        if doc.is_some() || is_pinned(&path)? {
            if let Some(doc) = doc {
                docs.insert(version, doc);
            }
            all.push((version, path));
        } else if fs::symlink_metadata(&path).is_ok_and(|m| !m.is_dir()) {
            fsio::remove_file(&path).map_err(Error::io(&path))?;
        }
    }
    let now = SystemTime::now();
    let mut out = Retained::default();
    for (i, (version, path)) in all.iter().enumerate() {
        let newest = i + 1 == all.len();
        let pinned = is_pinned(path)?;
        if pinned {
            out.oldest_pinned.get_or_insert(*version);
        }
        let keep = newest || pinned || {
            // Superseded when the next checkpoint was written.
            let next = &all[i + 1].1;
            let superseded = fs::metadata(next).and_then(|m| m.modified()).unwrap_or(now);
            now.duration_since(superseded).unwrap_or_default() < retention
        };
        if keep {
            out.kept.push((*version, path.clone()));
            continue;
        }
        // Remove it while holding its exclusive lock: a reader that opened
        // it meanwhile sees the name gone once it gets its shared lock.
        let file = File::open(path).map_err(Error::io(path))?;
        match fsio::try_lock(&file, path, false) {
            Ok(()) => {
                fsio::remove_file(path).map_err(Error::io(path))?;
                drop(file);
            }
            Err(fs::TryLockError::WouldBlock) => {
                out.oldest_pinned = Some(out.oldest_pinned.map_or(*version, |v| v.min(*version)));
                out.kept.push((*version, path.clone()));
            }
            Err(fs::TryLockError::Error(e)) if is_no_lock(&e) => {
                fsio::remove_file(path).map_err(Error::io(path))?;
            }
            Err(fs::TryLockError::Error(e)) => return Err(Error::io(path)(e)),
        }
    }
    out.kept.sort();
    let mut listed = std::collections::HashSet::new();
    for (version, _) in &out.kept {
        let Some(doc) = docs.remove(version) else {
            continue; // pinned but unreadable: its reader fell back to another
        };
        if out.oldest_position.is_none() {
            out.oldest_position = Some(doc.position());
        }
        for r in doc.runs {
            listed.extend(r.columns.map(|c| c.file));
            listed.insert(r.file);
        }
    }
    if let Ok(entries) = fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let stray_run =
                (valid_run_name(name) || valid_columns_name(name)) && !listed.contains(name);
            if stray_run || name.ends_with(TMP_SUFFIX) {
                let _ = fsio::remove_file(&entry.path());
            }
        }
    }
    Ok(out)
}
