//! A reader's view of a store: the newest checkpoint, mapped, plus the
//! committed journal after it (FORMAT.md, "Reading beside a writer").
//! Never opens sled, takes no exclusive lock, writes nothing.

use std::fs;
use std::path::{Path, PathBuf};

use std::sync::{Arc, OnceLock};

use crate::checkpoint::base::Base;
use crate::checkpoint::run::Run;
use crate::checkpoint::{self, CheckpointDoc, Pin, RunDoc};
use crate::error::{Error, Result};
use crate::index::layers::Layers;
use crate::index::RecordIndex;
use crate::journal::{self, Committed, Position};
use crate::query::IndexLookup;
use crate::store::columnar::Layered;

/// How many times opening retries when a writer removes the checkpoint or
/// the journal segment it was about to read (each retry sees a newer one).
const OPEN_ATTEMPTS: usize = 20;

/// The store as of one commit.
pub(crate) struct Snapshot {
    root: PathBuf,
    /// The checkpoint's version and path (`None`: the store has none yet,
    /// the whole journal is replayed).
    base: Option<(u64, PathBuf)>,
    /// The checkpoint's runs and the committed changes after it.
    layers: Layers,
    /// Where the next refresh resumes reading the journal.
    end: Position,
    version: u64,
    /// The secondary indexes the writer keeps (readers answer their
    /// queries by scanning, with the same results).
    indexes: Vec<String>,
    /// The checkpoint's runs as its document lists them (column files).
    run_docs: Vec<RunDoc>,
    /// The columnar view, built at the first query after opening or
    /// refreshing (see [`Snapshot::layered`]).
    layered: OnceLock<Option<Arc<Layered>>>,
    _pin: Option<Pin>,
}

impl Snapshot {
    /// Opens the store at `root` as of its latest commit, or as of commit
    /// `at` when given (a pickled store reopening at its version).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a damaged checkpoint or run; with `at`, when
    /// that version is no longer available (older than every checkpoint
    /// kept, or newer than the latest commit); I/O errors.
    pub(crate) fn open(root: &Path, at: Option<u64>) -> Result<Snapshot> {
        let mut last_err = None;
        for _ in 0..OPEN_ATTEMPTS {
            match Self::try_open(root, at) {
                Ok(Some(s)) => return Ok(s),
                Ok(None) => continue,
                Err(e @ Error::Corrupt(_)) if at.is_none() => {
                    // A journal segment removed under us: a newer
                    // checkpoint exists, try again from it.
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            Error::corrupt(
                format!("store {}", root.display()),
                "the checkpoints kept changing while opening; try again",
            )
        }))
    }

    /// One attempt: the newest usable checkpoint (at most version `at`)
    /// plus the journal after it. A checkpoint that cannot be used (damaged,
    /// a run missing, not a file) gives way to the next older one, and
    /// finally to the whole journal while it still starts at its first
    /// segment (`verify` reports the damage, `repair` writes a new
    /// checkpoint); once covered segments were removed, the checkpoints'
    /// error. `Ok(None)`: a checkpoint was removed under us, try
    /// again.
    fn try_open(root: &Path, at: Option<u64>) -> Result<Option<Snapshot>> {
        let all = checkpoint::list(root)?;
        let candidates: Vec<&(u64, PathBuf)> = all
            .iter()
            .rev()
            .filter(|(v, _)| at.is_none_or(|a| *v <= a))
            .collect();
        if let (Some(v), true) = (at, candidates.is_empty() && !all.is_empty()) {
            return Err(Self::gone(root, v));
        }
        let mut first_err = None;
        let mut spare_pin = None;
        for (version, path) in candidates {
            let pin = match checkpoint::pin(path) {
                Ok(Some(pin)) => pin,
                Ok(None) if fs::symlink_metadata(path).is_err() => return Ok(None),
                Ok(None) => {
                    first_err.get_or_insert_with(|| {
                        Error::corrupt(
                            format!("checkpoint {}", path.display()),
                            "cannot be opened as a file",
                        )
                    });
                    continue;
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                    continue;
                }
            };
            match Self::from_checkpoint(root, Some((*version, path)), at) {
                Ok(mut snap) => {
                    snap._pin = Some(pin);
                    return Ok(Some(snap));
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                    // Unusable, but still a pin: it tells the writer a
                    // reader may see anything committed after its version.
                    spare_pin.get_or_insert(pin);
                }
            }
        }
        if all.is_empty() {
            if let Some(why) = checkpoint::missing_checkpoint(root)? {
                return Err(Error::corrupt(format!("store {}", root.display()), why));
            }
        }
        if !all.is_empty() && !journal::is_whole(root)? {
            // The journal alone no longer holds what the checkpoints did.
            let why = first_err.map_or_else(String::new, |e| format!(" ({e})"));
            return Err(Error::corrupt(
                format!("store {}", root.display()),
                format!(
                    "no checkpoint can be read{why}, and the journal no longer holds the \
                     records written before its first segment; `lazyvault repair` keeps what \
                     can be read, a backup restores the rest"
                ),
            ));
        }
        match Self::from_checkpoint(root, None, at) {
            Ok(mut snap) => {
                snap._pin = spare_pin;
                Ok(Some(snap))
            }
            Err(e) => Err(first_err.unwrap_or(e)),
        }
    }

    /// The snapshot from one checkpoint (or none: the whole journal) plus
    /// the committed journal after it, up to version `at`; the caller pins.
    fn from_checkpoint(
        root: &Path,
        base: Option<(u64, &PathBuf)>,
        at: Option<u64>,
    ) -> Result<Snapshot> {
        let (doc, base) = match base {
            None => (None, None),
            Some((version, path)) => (Some(checkpoint::read(path)?), Some((version, path.clone()))),
        };
        let mut runs = Vec::new();
        if let Some(doc) = &doc {
            for r in &doc.runs {
                let path = root.join(checkpoint::CHECKPOINT_DIR).join(&r.file);
                runs.push(Run::open(&path)?);
            }
        }
        let mut snap = Snapshot {
            root: root.to_owned(),
            base,
            layers: Layers::new(
                runs,
                doc.as_ref().map_or(0, |d| d.records),
                doc.as_ref().map_or((0, 0), CheckpointDoc::position),
            ),
            end: doc.as_ref().map_or((0, 0), CheckpointDoc::position),
            version: doc.as_ref().map_or(0, |d| d.version),
            indexes: read_index_list(root),
            run_docs: doc.as_ref().map(|d| d.runs.clone()).unwrap_or_default(),
            layered: OnceLock::new(),
            _pin: None, // set by the caller
        };
        let limit = at.map(|v| v.saturating_sub(snap.version));
        snap.read_tail(limit)?;
        if let Some(v) = at {
            if snap.version != v {
                return Err(Self::gone(root, v));
            }
        }
        Ok(snap)
    }

    fn gone(root: &Path, version: u64) -> Error {
        Error::corrupt(
            format!("store {}", root.display()),
            format!(
                "version {version} is no longer available (removed by the writer, or never \
                 committed); open the store again to see its latest version"
            ),
        )
    }

    /// Applies the committed journal after `self.end` (at most `limit`
    /// commits), keeping `len` and `version` current.
    fn read_tail(&mut self, limit: Option<u64>) -> Result<()> {
        if limit == Some(0) {
            return Ok(());
        }
        let mut changes: Vec<(String, Committed)> = Vec::new();
        let read = journal::read_committed(&self.root, self.end, limit, |k, c| {
            changes.push((k, c));
        })?;
        for (key, change) in changes {
            self.layers.apply(key, change)?;
        }
        self.version += read.commits;
        self.end = read.end;
        if read.commits > 0 {
            self.layered = OnceLock::new();
        }
        Ok(())
    }

    /// Moves to the latest commit: resumes reading the journal when the
    /// checkpoint is still the newest, else opens the newest one. Returns
    /// the new version.
    pub(crate) fn refresh(&mut self) -> Result<u64> {
        // A store removed under a reader is gone, not empty.
        if !self.root.join(lazyvault_schema::MANIFEST_FILE).is_file() {
            return Err(Error::not_found(self.root.clone()));
        }
        let newest = checkpoint::list(&self.root)?.pop();
        let same = match (&newest, &self.base) {
            (None, None) => true,
            (Some((v, _)), Some((b, _))) => v == b,
            _ => false,
        };
        if same {
            match self.read_tail(None) {
                Ok(()) => return Ok(self.version),
                Err(Error::Corrupt(_)) => {} // compacted meanwhile: reopen
                Err(e) => return Err(e),
            }
        }
        *self = Snapshot::open(&self.root, None)?;
        Ok(self.version)
    }

    /// The snapshot as columns: its checkpoint's runs with their column
    /// files and the committed changes after the checkpoint; `None` when
    /// the store has no checkpoint or a run has no (usable) column file.
    pub(crate) fn layered(&self) -> Option<Arc<Layered>> {
        self.layered
            .get_or_init(|| {
                self.base.as_ref()?;
                // Columns are derived data: damaged ones (verify reports
                // them) leave scans to the records.
                let base = Arc::new(Base::open(&self.root, &self.run_docs).ok()??);
                let changed = self
                    .layers
                    .tail
                    .iter()
                    .map(|(k, c)| (k.clone(), c.as_ref().map(|(r, _)| r.to_vec())))
                    .collect();
                Layered::new(base, changed).map(Arc::new)
            })
            .clone()
    }

    /// The version (commits since the store was created) it shows.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }
}

/// The secondary indexes listed in `indexes.json` (none if unreadable).
fn read_index_list(root: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read(root.join(crate::INDEXES_FILE)) else {
        return Vec::new();
    };
    serde_json::from_slice::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| serde_json::from_value(v.get("indexes")?.clone()).ok())
        .unwrap_or_default()
}

impl RecordIndex for Snapshot {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.layers.value(key)?.map(|(r, _)| r.to_vec()))
    }

    fn get_pickle(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .layers
            .value(key)?
            .and_then(|(_, p)| p.map(<[u8]>::to_vec)))
    }

    fn contains(&self, key: &str) -> Result<bool> {
        Ok(self.layers.value(key)?.is_some())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.layers.len)
    }

    fn scan_range(
        &self,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        f: &mut dyn FnMut(&str, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.layers
            .scan_range(from, to, &mut |k, record, _| f(k, record))
    }

    fn key_bounds(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.layers.key_bounds()
    }

    fn lookup(&self, field: &str, lookup: &IndexLookup) -> Result<Vec<String>> {
        let segs = crate::secondary::parse_field(field).map_err(Error::invalid_field)?;
        let ranges = crate::secondary::ranges(field, lookup);
        let mut keys = Vec::new();
        self.scan_range(None, None, &mut |key, record| {
            let meta = crate::index::meta_of(record);
            if let Some(e) = crate::secondary::field_value(&meta, &segs)
                .and_then(|v| crate::secondary::entry(field, v, key))
            {
                if ranges
                    .iter()
                    .any(|(lo, hi)| e.as_slice() >= lo.as_slice() && e.as_slice() < hi.as_slice())
                {
                    keys.push(key.to_owned());
                }
            }
            Ok(())
        })?;
        Ok(keys)
    }

    fn is_indexed(&self, _segs: &[String]) -> bool {
        // Readers have no index entries: their queries scan (same results).
        false
    }

    fn indexes(&self) -> Vec<String> {
        self.indexes.clone()
    }

    fn journal_pos(&self) -> Result<Option<Position>> {
        Ok(Some(self.end))
    }

    fn base_pos(&self) -> Position {
        self.layers.base
    }

    fn checkpointed(&self, key: &str) -> Result<crate::journal::Committed> {
        Ok(self
            .layers
            .checkpointed(key)?
            .map(|(r, p)| (r.to_vec(), p.map(<[u8]>::to_vec))))
    }
}
