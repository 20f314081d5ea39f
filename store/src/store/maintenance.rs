//! Maintenance of a store: `gc` (orphan payloads, packs, a full checkpoint),
//! `verify` (records against payloads and the journal) and `repair`
//! (rebuilding the index and a checkpoint from checkpoints and the journal).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use lazyvault_schema::{ArrayEntry, Record, MANIFEST_FILE, PAYLOAD_DIR};
use serde_json::Value;

use super::writer::WriterState;
use super::{GcReport, RepairReport, Store, VerifyReport, INDEXES_FILE, INDEX_DIR};
use crate::checkpoint::run::{Run, RunValue};
use crate::checkpoint::{self, CHECKPOINT_DIR};
use crate::error::{Error, Result};
use crate::fsio;
use crate::index::{self, Index, RecordIndex};
use crate::journal::{self, Change, Position, JOURNAL_DIR};
use crate::payload::{self, TMP_SUFFIX};

/// One version of a key in the journal.
type Version = Change;

/// The journal replayed: every version of every key, oldest first.
#[derive(Default)]
struct Replay {
    versions: HashMap<String, Vec<Version>>,
    entries: u64,
    /// Torn or damaged segment tails (replay of that segment stops there).
    torn: Vec<String>,
    /// The end of the last entry replayed.
    end: Option<Position>,
}

/// Replays the journal of `root` from `from` (the position of the
/// checkpoint the records start from: earlier segments may be gone) up to
/// `to` (every segment after its segment is ignored, and that segment is
/// read up to its offset); to the end when `None`.
fn replay(root: &Path, from: Position, to: Option<Position>) -> Result<Replay> {
    let mut out = Replay::default();
    for (number, path) in journal::segments(root)? {
        if number < from.0 {
            continue;
        }
        let limit = match to {
            Some((segment, _)) if number > segment => continue,
            Some((segment, end)) if number == segment => Some(end),
            _ => None,
        };
        let read = journal::read_segment(&path, number, limit)?;
        for (entry, end) in read.entries {
            if number == from.0 && end <= from.1 {
                continue; // before the checkpoint: its runs hold it
            }
            out.end = Some((number, end));
            if entry.change != Change::Commit {
                out.entries += 1;
                out.versions
                    .entry(entry.key)
                    .or_default()
                    .push(entry.change);
            }
        }
        out.torn.extend(read.torn);
        if out.end.is_none_or(|(n, _)| n != number) {
            // A segment with no entry still counts as the end (its header).
            out.end = Some((number, journal::SEGMENT_HEADER_LEN));
        }
    }
    Ok(out)
}

/// The bytes of every journal segment of the store at `root`.
fn journal_size(root: &Path) -> Result<u64> {
    Ok(journal::segments(root)?
        .iter()
        .map(|(_, p)| fs::metadata(p).map_or(0, |m| m.len()))
        .sum())
}

/// Calls `f(path, file_name, size)` for every file in the subdirectories of
/// `dir` (the `<2 hex>/` fan-out of `arrays/`); a missing `dir` has none.
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

/// The pack file of pack id `pack` under `root`.
fn path_of(root: &Path, pack: &str) -> PathBuf {
    root.join(lazyvault_schema::pack_relpath(pack))
}

/// `len` bytes of the file at `path` from offset `at`.
fn read_at(path: &Path, at: u64, len: usize) -> Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = fs::File::open(path).map_err(Error::io(path))?;
    let mut buf = vec![0u8; len];
    file.seek(SeekFrom::Start(at))
        .and_then(|_| file.read_exact(&mut buf))
        .map_err(Error::io(path))?;
    Ok(buf)
}

/// The bytes of every member of the pack at `path` (its `.npy` bytes, zip
/// headers excluded), from its central directory; `None` when it cannot be
/// read as a zip.
fn pack_member_bytes(path: &Path) -> Option<u64> {
    let file = fs::File::open(path).ok()?;
    let mut zip = zip::ZipArchive::new(file).ok()?;
    let mut total = 0u64;
    for i in 0..zip.len() {
        total = total.saturating_add(zip.by_index_raw(i).ok()?.size());
    }
    Some(total)
}

/// What [`Store::verify_with`] found hashing one payload.
enum Hashed {
    /// No checksum was recorded, or one of an algorithm this version does
    /// not know: nothing compared.
    NotCompared,
    /// The data's checksum is the recorded one.
    Match,
    /// It is not: the problem to report.
    Mismatch(Error),
}

/// The index checked against the journal replayed up to the index's
/// position: shared by `verify` (which reports each disagreement) and `gc`
/// (which refuses to run on any).
struct JournalCheck {
    /// Each key's latest journal version, removed as the index is scanned.
    latest: HashMap<String, Version>,
}

impl JournalCheck {
    fn new(root: &Path, index: &dyn RecordIndex) -> Result<JournalCheck> {
        // What the index has seen after its checkpoint (whose runs `verify`
        // checks on their own): without a position, nothing.
        let committed = index.journal_pos()?.unwrap_or((0, 0));
        let latest = replay(root, index.base_pos(), Some(committed))?
            .versions
            .into_iter()
            .filter_map(|(k, mut v)| v.pop().map(|last| (k, last)))
            .collect();
        Ok(JournalCheck { latest })
    }

    /// How the index's `record` and `pickle` of `key` disagree with the
    /// journal after its checkpoint or, for a key the journal does not
    /// name there, with the checkpoint, if they do.
    fn record(
        &mut self,
        index: &dyn RecordIndex,
        key: &str,
        record: &[u8],
        pickle: Option<Vec<u8>>,
    ) -> Result<Option<String>> {
        Ok(match self.latest.remove(key) {
            Some(Change::Put {
                record: r,
                pickle: p,
            }) if r == record && p == pickle => None,
            Some(Change::Put { .. }) => Some(format!(
                "record {key:?}: the journal's latest entry holds a different record \
                 (`lazyvault repair` rebuilds the index from the journal)"
            )),
            Some(Change::Delete) => {
                Some(format!("record {key:?}: the journal says it was deleted"))
            }
            Some(Change::Commit) => unreachable!("replay keeps no commits"),
            None => match index.checkpointed(key)? {
                Some((r, p)) if r == record && p == pickle => None,
                _ => Some(format!(
                    "record {key:?}: not in the journal after the checkpoint, nor in the \
                     checkpoint"
                )),
            },
        })
    }

    /// After the scan: the records only the journal holds.
    fn finish(self) -> Vec<String> {
        let mut missing: Vec<String> = self
            .latest
            .into_iter()
            .filter(|(_, v)| matches!(v, Change::Put { .. }))
            .map(|(k, _)| k)
            .collect();
        missing.sort();
        missing
            .into_iter()
            .map(|key| {
                format!(
                    "record {key:?}: in the journal but not in the index \
                     (`lazyvault repair` rebuilds the index from the journal)"
                )
            })
            .collect()
    }
}

/// Payload ids in the record JSON `bytes`, and the ids of the packs its
/// packed payloads are in (none if it does not decode).
fn ids_of(bytes: &[u8], ids: &mut HashSet<String>) {
    if let Ok(record) = Record::from_json(bytes) {
        ids.extend(record.arrays.into_values().flat_map(file_ids));
    }
}

/// The ids naming the files of a payload: its own, and its pack's. (Both
/// are random 32-digit ids: a `<id>.npy` file and a `<pack>.npz` file are
/// kept when their id is in a set of these.)
fn file_ids(entry: ArrayEntry) -> impl Iterator<Item = String> {
    std::iter::once(entry.id).chain(entry.pack)
}

/// The id in the name of a payload or pack file under `arrays/`
/// (`<id>.npy`, `<id>.npz`, or the relative path of one).
fn file_id(name: &str) -> Option<&str> {
    let name = name.rsplit('/').next().unwrap_or_default();
    name.strip_suffix(".npy")
        .or_else(|| name.strip_suffix(".npz"))
}

/// Ids of every payload a reader may still see: those of the records in
/// every checkpoint on disk, and of every committed change after the oldest
/// one (so, with the writer's index, everything a snapshot kept for
/// readers references).
fn retained_ids(root: &Path) -> Result<HashSet<String>> {
    let mut ids = HashSet::new();
    let mut runs = HashSet::new();
    let mut oldest = None;
    // Damaged checkpoints and runs are skipped here: no reader can use
    // them (verify reports them).
    for (_, path) in checkpoint::list(root)? {
        let Ok(doc) = checkpoint::read(&path) else {
            continue;
        };
        oldest.get_or_insert(doc.position());
        runs.extend(doc.runs.into_iter().map(|r| r.file));
    }
    for file in runs {
        let Ok(run) = Run::open(&root.join(CHECKPOINT_DIR).join(&file)) else {
            continue;
        };
        for item in run.iter_from(0) {
            match item {
                Ok((_, RunValue::Put { record, .. })) => ids_of(record, &mut ids),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    journal::read_committed(root, oldest.unwrap_or((0, 0)), None, |_, change| {
        if let Some((record, _)) = change {
            ids_of(&record, &mut ids);
        }
    })?;
    Ok(ids)
}

impl Store {
    /// Ids of every payload a record of `index` references.
    fn referenced(index: &dyn RecordIndex) -> Result<HashSet<String>> {
        let mut ids = HashSet::new();
        index::scan(index, |key, bytes| {
            let record = Record::from_json(bytes)
                .map_err(|e| Error::corrupt(format!("record {key:?}"), e).with_key(key))?;
            ids.extend(record.arrays.into_values().flat_map(file_ids));
            Ok(())
        })?;
        Ok(ids)
    }

    /// Files under `arrays/` that nothing references: payloads left by a
    /// crash, and temporary files.
    fn orphans(&self, referenced: &HashSet<String>) -> Result<Vec<(PathBuf, u64)>> {
        let mut out = Vec::new();
        walk_two_levels(&self.root.join(PAYLOAD_DIR), |path, name, size| {
            let id = file_id(name);
            let temporary =
                name.ends_with(TMP_SUFFIX) && (name.contains(".npy") || name.contains(".npz"));
            if temporary || id.is_some_and(|id| !referenced.contains(id)) {
                out.push((path, size));
            }
        })?;
        out.sort();
        Ok(out)
    }

    /// Commits, publishes a checkpoint of one run (which holds every
    /// record, so the journal it covers goes), then removes what no reader
    /// may still see
    /// (see [`Store::retention`]): superseded checkpoints, journal segments
    /// before the oldest checkpoint kept, and payload and temporary files
    /// that neither the index nor a kept snapshot references.
    ///
    /// # Errors
    /// [`UsageError::ReadOnly`](crate::UsageError::ReadOnly) in mode `"r"`;
    /// as a first write ([`OpenError::Locked`](crate::OpenError::Locked));
    /// [`StorageError::Io`](crate::StorageError::Io) with `ENOSPC`, before
    /// anything is changed, when the disk cannot hold about the journal's
    /// size again (the checkpoint is written before the old files go); other
    /// I/O errors.
    pub fn gc(&self) -> Result<GcReport> {
        // One piece (about 80 lines): every step runs under the one writer
        // lock taken below and relies on the step before (flush, records and
        // journal agree, compact packs, commit, checkpoint, remove orphans).
        if self.mode == super::Mode::ReadOnly {
            return Err(Error::read_only());
        }
        let (_view, w) = self.writer()?;
        let retention = self.retention();
        // A full checkpoint: about the journal's records written anew
        // before the segments it covers go.
        let journal_bytes = journal_size(&self.root)?;
        w.check_space(journal_bytes)?;
        let mut state = w.lock();
        // Retired payloads that this gc may remove on the way (their
        // sizes now, to report them).
        let retired: Vec<(PathBuf, u64)> = state
            .retiring
            .iter()
            .chain(state.retired.iter().map(|r| &r.relpath))
            .map(|rel| self.root.join(rel))
            .filter_map(|p| fs::metadata(&p).ok().map(|m| (p, m.len())))
            .collect();
        w.flush(&mut state, retention)?;
        let index = w.index();
        // gc rewrites the journal from the index and deletes what the index
        // does not reference: never on an index that lost records.
        let disagreements = Self::index_journal_disagreements(&self.root, index)?;
        if disagreements > 0 {
            return Err(Error::corrupt(
                format!("store {}", self.root.display()),
                format!(
                    "gc refused: the index and the journal disagree on {disagreements} \
                     record(s); `lazyvault verify` lists them, `lazyvault repair` rebuilds \
                     the index from the journal"
                ),
            ));
        }
        // Packs mostly dead: live members rewritten into new packs, their
        // records put again. No commit of their own: gc's one commit below
        // covers them and retires the old packs.
        let (packs_compacted, packs_damaged) = self.compact_packs(&w, &mut state)?;
        let mut report = GcReport {
            packs_compacted,
            packs_damaged,
            ..GcReport::default()
        };
        // gc's one new version: it commits the rewritten records (or
        // nothing), and the full checkpoint below shows it.
        w.commit(&mut state, true)?;
        w.checkpoint(&mut state, true, retention)?;
        // The checkpoint's cleanup removed the journal segments it covers
        // (unless a reader still needs an older checkpoint).
        report.journal_bytes_freed = journal_bytes.saturating_sub(journal_size(&self.root)?);
        let mut live = Self::referenced(index)?;
        live.extend(retained_ids(&self.root)?);
        for rel in state
            .retiring
            .iter()
            .chain(state.retired.iter().map(|r| &r.relpath))
        {
            if let Some(id) = file_id(rel) {
                live.insert(id.to_owned());
            }
        }
        for (path, size) in self.orphans(&live)? {
            fsio::remove_file(&path).map_err(Error::io(&path))?;
            report.removed_files += 1;
            report.removed_bytes += size;
        }
        for (path, size) in retired {
            if !path.exists() {
                report.removed_files += 1;
                report.removed_bytes += size;
            }
        }
        Ok(report)
    }

    /// Rewrites the packs more than half of whose member bytes no record
    /// references (FORMAT.md, "Packs"): the live members of each go into a
    /// new pack (the same `.npy` bytes and member ids, but for a rare id
    /// whose short member name is taken there; one pack for all the packs
    /// compacted), the records using them are put again with the
    /// new `pack` and `pack_offset` (one batch), and the old packs are
    /// retired: unlinked once no reader may still see them. A pack with a
    /// member that no longer reads (header, length) or whose data no longer
    /// match its recorded checksum, or that is no readable zip, is left as
    /// it is and counted as damaged (`verify` reports it; nothing damaged
    /// is copied under a good checksum). Nothing is compacted when the disk
    /// has no room for the copies (gc then frees what it can without).
    /// Returns the numbers of packs compacted and of packs left because
    /// damaged. The caller holds the writer lock and commits (the old packs
    /// are in `retiring`).
    fn compact_packs(
        &self,
        w: &super::writer::Writer,
        state: &mut WriterState,
    ) -> Result<(u64, u64)> {
        let index = w.index();
        // pack id -> (key, array name, entry) of its live members
        let mut live: HashMap<String, Vec<(String, String, ArrayEntry)>> = HashMap::new();
        index::scan(index, |key, bytes| {
            let record = Record::from_json(bytes)
                .map_err(|e| Error::corrupt(format!("record {key:?}"), e).with_key(key))?;
            for (name, entry) in record.arrays {
                if let Some(pack) = entry.pack.clone() {
                    live.entry(pack)
                        .or_default()
                        .push((key.to_owned(), name, entry));
                }
            }
            Ok(())
        })?;
        let mut chosen = Vec::new();
        let mut damaged = 0u64;
        for (pack, members) in live {
            let path = self.root.join(lazyvault_schema::pack_relpath(&pack));
            // every member live (the common case): its 22-byte end record
            // says so, the central directory is not read
            if crate::pack::member_count(&path) == Some(members.len() as u64) {
                continue;
            }
            let Some(total) = pack_member_bytes(&path) else {
                damaged += 1; // no readable zip: verify names it
                continue;
            };
            let used: u64 = members
                .iter()
                .map(|(_, _, e)| e.data_offset.saturating_add(e.nbytes))
                .sum();
            if used.saturating_mul(2) < total {
                chosen.push((pack, members));
            }
        }
        if chosen.is_empty() {
            return Ok((0, damaged));
        }
        // The live members are written anew before the old packs go: on a
        // disk without room for them, gc frees what it can without this.
        let copied: u64 = chosen
            .iter()
            .flat_map(|(_, members)| members.iter())
            .map(|(_, _, e)| e.data_offset.saturating_add(e.nbytes).saturating_add(256))
            .sum();
        if w.check_space_for(chosen.iter().map(|(_, m)| m.len()).sum(), copied)
            .is_err()
        {
            return Ok((0, damaged));
        }
        chosen.sort_by(|a, b| a.0.cmp(&b.0));
        let mut writer = payload::PayloadWriter::new(&self.root, 1)?;
        let mut moved: HashMap<String, Vec<(String, ArrayEntry)>> = HashMap::new();
        let mut retired = Vec::new();
        let copied = (|| -> Result<()> {
            for (pack, members) in &chosen {
                let mut entries = Vec::with_capacity(members.len());
                let mut sound = true;
                for (key, name, entry) in members {
                    let data = match payload::load_payload(&self.root, entry) {
                        Ok(data) => data,
                        Err(Error::Corrupt(_)) => {
                            sound = false;
                            break;
                        }
                        Err(e) => return Err(e),
                    };
                    let intact = entry
                        .checksum
                        .as_deref()
                        .is_none_or(|c| c == payload::checksum(data.as_bytes()));
                    if !intact {
                        sound = false;
                        break;
                    }
                    // the member's own header bytes (checked by the load)
                    let header = read_at(&path_of(&self.root, pack), entry.npy_start(), {
                        entry.data_offset as usize
                    })?;
                    let new = writer.write_packed(&header, entry, data.as_bytes())?;
                    entries.push((key.clone(), name.clone(), new));
                }
                if !sound {
                    damaged += 1; // its members stay where they are
                    continue;
                }
                retired.push(lazyvault_schema::pack_relpath(pack));
                for (key, name, entry) in entries {
                    moved.entry(key).or_default().push((name, entry));
                }
            }
            writer.finish()?;
            if writer.dirs_durable {
                state.durable_dirs.extend(writer.dirs.iter().cloned());
            } else {
                Self::sync_payload_dirs(&self.root, state, &writer.dirs)?;
            }
            Ok(())
        })();
        if let Err(e) = copied {
            writer.abort();
            return Err(e);
        }
        if moved.is_empty() {
            writer.abort(); // an empty pack, if any
            return Ok((0, damaged));
        }
        // The records again, their moved entries pointing into the new pack.
        let mut keys: Vec<&String> = moved.keys().collect();
        keys.sort();
        let mut parts = Vec::with_capacity(keys.len());
        for key in keys {
            let Some(json) = index.get(key)? else {
                continue; // unreachable under the writer lock
            };
            let mut record = Record::from_json(&json)
                .map_err(|e| Error::corrupt(format!("record {key:?}"), e).with_key(key))?;
            for (name, entry) in &moved[key] {
                record.arrays.insert(name.clone(), entry.clone());
            }
            let pickle = if record.pickle {
                index.get_pickle(key)?
            } else {
                None
            };
            parts.push((key.clone(), record, pickle));
        }
        let batch: Vec<(super::NewRecord<'_>, indexmap::IndexMap<String, ArrayEntry>)> = parts
            .iter()
            .map(|(key, record, pickle)| {
                let new = super::NewRecord {
                    key,
                    meta: record.meta.clone(),
                    layout: record.layout.clone(),
                    arrays: &[],
                    pickle: pickle.as_deref(),
                };
                (new, record.arrays.clone())
            })
            .collect();
        if let Err(e) = self.put_locked(index, state, batch) {
            writer.abort();
            return Err(e);
        }
        let compacted = retired.len() as u64;
        state.retiring.extend(retired);
        Ok((compacted, damaged))
    }

    /// How many keys the index and the journal (replayed up to the index's
    /// position) disagree on, plus acknowledged changes past it.
    fn index_journal_disagreements(root: &Path, index: &Index) -> Result<usize> {
        let mut check = JournalCheck::new(root, index)?;
        let mut bad = 0;
        index.scan(|key, bytes| {
            bad += usize::from(
                check
                    .record(index, key, bytes, index.get_pickle(key)?)?
                    .is_some(),
            );
            Ok(())
        })?;
        Ok(bad + check.finish().len())
    }

    /// Checks every record against its payloads (present, header matching,
    /// long enough, and with `checksums` the data hashed against the
    /// checksum recorded at write time) and against the journal (the latest
    /// entry of each key is that record; no key is in the journal alone);
    /// checks that each entry's `dtype` is numpy's name of its `descr`, that
    /// the layout names no array path the record lacks, and that each pack
    /// is a readable zip (end record and central directory, from its tail);
    /// and lists orphan files. `progress(done, total)` is called with
    /// `(0, total)` first, then after each record; returning `false` stops
    /// the check with [`UsageError::Cancelled`](crate::UsageError::Cancelled).
    /// Writers of this process wait until it returns.
    ///
    /// # Errors
    /// [`UsageError::Cancelled`](crate::UsageError::Cancelled); those of
    /// every method (see [`Store`]) and I/O errors listing the store's
    /// directories. Damaged records and payloads are not errors: they are
    /// the report's `problems`.
    pub fn verify_with(
        &self,
        checksums: bool,
        progress: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Result<VerifyReport> {
        let view = self.view()?;
        let index = view.index();
        // Writers wait: a flush must not unlink a payload this scan has seen
        // in the index but not yet opened (a reader's pin does the same).
        let writer_state = match &*view.0 {
            super::State::Writing(w) => Some((w.index(), w.lock())),
            _ => None,
        };
        let total = index.len()?;
        Self::go_on(progress(0, total))?;
        let mut report = VerifyReport::default();
        let mut referenced = HashSet::new();
        let mut check = JournalCheck::new(&self.root, index)?;
        // pack id -> (the first key using it, how many entries do)
        let mut packs: HashMap<String, (String, u64)> = HashMap::new();
        let scanned = index::scan(index, |key, bytes| {
            report.records += 1;
            report
                .problems
                .extend(check.record(index, key, bytes, index.get_pickle(key)?)?);
            let record = match Record::from_json(bytes) {
                Ok(r) => r,
                Err(e) => {
                    report.problems.push(format!("record {key:?}: {e}"));
                    return Self::go_on(progress(report.records, total));
                }
            };
            report.problems.extend(layout_problems(key, &record));
            for (name, entry) in &record.arrays {
                report.arrays += 1;
                referenced.extend(file_ids(entry.clone()));
                if let Some(pack) = &entry.pack {
                    packs
                        .entry(pack.clone())
                        .or_insert_with(|| (key.to_owned(), 0))
                        .1 += 1;
                }
                if let Some(problem) = dtype_problem(entry) {
                    report
                        .problems
                        .push(format!("record {key:?} array {name:?}: {problem}"));
                }
                let checked = if checksums {
                    self.verify_checksum(entry).and_then(|hashed| {
                        report.checksummed += u64::from(!matches!(hashed, Hashed::NotCompared));
                        match hashed {
                            Hashed::Mismatch(problem) => {
                                report.checksum_mismatches += 1;
                                Err(problem)
                            }
                            _ => Ok(()),
                        }
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
        });
        match scanned {
            // A damaged checkpoint run stops the scan: a problem to report
            // (the records after it in key order are not checked), not a
            // failure of verify.
            Err(Error::Corrupt(c)) => report.problems.push(format!(
                "{c}; the records after it were not checked (`lazyvault repair` keeps every \
                 record the checkpoint still holds)"
            )),
            other => other?,
        }
        report.problems.extend(check.finish());
        report.problems.extend(self.pack_problems(packs)?);
        report.problems.extend(verify_checkpoints(&self.root)?);
        report
            .problems
            .extend(journal::damaged_commits(&self.root, index.base_pos())?);
        if let Some((_, state)) = &writer_state {
            // Payloads of replaced records, removed once no reader needs them.
            for rel in state
                .retiring
                .iter()
                .chain(state.retired.iter().map(|r| &r.relpath))
            {
                if let Some(id) = file_id(rel) {
                    referenced.insert(id.to_owned());
                }
            }
        }
        referenced.extend(retained_ids(&self.root)?);
        report.orphans = self
            .orphans(&referenced)?
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        drop(writer_state);
        drop(view);
        Ok(report)
    }

    /// One line per pack (of those `packs` names, with a key using each and
    /// the number of entries that do) that is no readable zip: its end
    /// record or central directory cut off or damaged. lazyvault reads
    /// members by offset, so nothing is lost, but `np.load(pack)` fails
    /// (FORMAT.md, "Packs"). A missing pack is left to its members' lines.
    fn pack_problems(&self, packs: HashMap<String, (String, u64)>) -> Result<Vec<String>> {
        let mut packs: Vec<_> = packs.into_iter().collect();
        packs.sort();
        let mut problems = Vec::new();
        for (pack, (key, uses)) in packs {
            let path = path_of(&self.root, &pack);
            let len = match fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(&path)(e)),
            };
            let problem = match crate::pack::zip_end_problem(&path, len) {
                Ok(None) => continue,
                Ok(Some(problem)) => problem,
                Err(e) => e.to_string(),
            };
            problems.push(format!(
                "pack {}: damaged, unreadable as a zip: {problem}; np.load cannot read it \
                 (lazyvault still reads its members by offset). {uses} array(s) use it, \
                 of record {key:?} among others: put those records again (their arrays go to a \
                 new pack) and gc() retires this one, or restore the file from a backup",
                path.display()
            ));
        }
        Ok(problems)
    }

    /// [`Store::verify_with`] with checksums and no progress reports.
    ///
    /// # Errors
    /// As [`Store::verify_with`], [`UsageError::Cancelled`](crate::UsageError::Cancelled) aside.
    pub fn verify(&self) -> Result<VerifyReport> {
        self.verify_with(true, &mut |_, _| true)
    }

    fn go_on(proceed: bool) -> Result<()> {
        if proceed {
            Ok(())
        } else {
            Err(Error::cancelled())
        }
    }

    /// Checks a payload and, if it has a recorded checksum of ours, hashes
    /// its data and compares the two. A payload that cannot be read is an
    /// error; a checksum that differs is [`Hashed::Mismatch`].
    fn verify_checksum(&self, entry: &ArrayEntry) -> Result<Hashed> {
        // the files as they are now, not a pack kept open since removed
        let mapped = payload::load_payload_from_disk(&self.root, entry)?;
        let Some(expected) = entry.checksum.as_deref() else {
            return Ok(Hashed::NotCompared);
        };
        if !expected.starts_with(payload::CHECKSUM_PREFIX) {
            // A newer writer's algorithm: not ours to judge.
            return Ok(Hashed::NotCompared);
        }
        let actual = payload::checksum(mapped.as_bytes());
        if actual != expected {
            return Ok(Hashed::Mismatch(Error::corrupt(
                format!("payload {}", self.root.join(entry.relpath()).display()),
                format!("data checksum is {actual}, the record says {expected}"),
            )));
        }
        Ok(Hashed::Match)
    }

    /// Rebuilds the index and a checkpoint of the store at `path`
    /// (FORMAT.md, "Repair"), for a lost or damaged index or checkpoint.
    ///
    /// Takes the store's lock; moves the old index directory aside (to
    /// `index.damaged-<n>`, never deleted); starts from the newest
    /// checkpoint whose runs check whole, or salvages what damaged ones
    /// still hold; replays the journal after it (each segment up to its
    /// first torn entry, past damaged ones that commits follow); for each key keeps
    /// its latest version, or none if that is a delete; a version whose
    /// payloads are missing or do not match their record is skipped for the
    /// key's previous one. Then writes and flushes a new index, with the
    /// secondary indexes `indexes.json` lists. Changes cut off by a crash
    /// after their journal entry was written come back as if they had
    /// finished (one of the two outcomes a crash may have).
    ///
    /// # Errors
    /// [`OpenError::NotFound`](crate::OpenError::NotFound) / [`OpenError::NotAStore`](crate::OpenError::NotAStore) for a path that is not a
    /// store, [`OpenError::Locked`](crate::OpenError::Locked) while a `Store` holds it, I/O errors.
    pub fn repair(path: impl AsRef<Path>) -> Result<RepairReport> {
        // One piece (about 150 lines): the order of its steps is the
        // crash-safety argument (check every input before anything moves,
        // build the index aside, swap it in, checkpoint last), all under the
        // lock taken here; split up, that order would hide across helpers.
        let root = path.as_ref().to_owned();
        if !root.exists() {
            return Err(Error::not_found(root));
        }
        if !root.is_dir() {
            return Err(Error::not_a_store(root));
        }
        let manifest_path = root.join(MANIFEST_FILE);
        if !manifest_path.is_file() {
            return Err(Error::not_a_store(root));
        }
        super::check_manifest(&manifest_path)?;
        let lock_file = super::writer::lock(&root)?;
        let mut report = RepairReport::default();
        let index_dir = root.join(INDEX_DIR);
        // Everything that can fail on bad input is read before anything
        // moves: a failed repair leaves the store as it found it.
        let journal_dir = root.join(JOURNAL_DIR);
        if fs::symlink_metadata(&journal_dir).is_ok_and(|m| !m.is_dir()) {
            return Err(Error::corrupt(
                format!("store {}", root.display()),
                format!("{} is not a directory", journal_dir.display()),
            ));
        }
        let list_path = root.join(INDEXES_FILE);
        let index_names: Vec<(String, Vec<String>)> = match fs::read(&list_path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(Error::io(&list_path)(e)),
            Ok(text) => {
                let names: Vec<String> = serde_json::from_slice::<Value>(&text)
                    .ok()
                    .and_then(|v| serde_json::from_value(v.get("indexes")?.clone()).ok())
                    .ok_or_else(|| {
                        Error::corrupt(list_path.display().to_string(), "not a list of indexes")
                    })?;
                names
                    .into_iter()
                    .map(|n| {
                        let segs = crate::secondary::parse_field(&n)
                            .map_err(|e| Error::corrupt(list_path.display().to_string(), e))?;
                        Ok((n, segs))
                    })
                    .collect::<Result<_>>()?
            }
        };
        // The records start from the newest checkpoint whose runs check
        // whole: the journal before it may be gone (since 1.6), its runs
        // hold those records. Without one, the whole journal.
        let base = intact_checkpoint(&root)?;
        // No checkpoint checks whole: what its runs still hold (entries
        // whose CRC-32 checks) is kept rather than lost with it.
        let salvaged = match &base {
            Some(_) => None,
            None => salvage_runs(&root, &mut report.skipped)?,
        };
        if base.is_none() && salvaged.is_none() && !journal::is_whole(&root)? {
            report.skipped.push(
                "no checkpoint can be read, and the journal no longer holds the records \
                 written before its first segment: only the journal's records are kept"
                    .to_owned(),
            );
        }
        let from = match (&base, &salvaged) {
            (Some(doc), _) => doc.position(),
            (None, Some(salvage)) => salvage.from,
            (None, None) => (0, 0),
        };
        let replayed = replay(&root, from, None)?;
        report.entries = replayed.entries;
        report.skipped.extend(replayed.torn);
        // The new index is built aside and swapped in only when complete: a
        // repair killed half-way leaves no half-built index in place.
        let building = root.join(format!("{INDEX_DIR}.repairing"));
        if fs::symlink_metadata(&building).is_ok() {
            fs::remove_dir_all(&building).map_err(Error::io(&building))?;
        }
        let index = Index::open(&building)?;
        if let Some(doc) = &base {
            index.start_from(&root, doc)?;
        }
        if let Some(salvage) = &salvaged {
            for (key, (record, pickle)) in &salvage.records {
                index.put(key, record, pickle.as_deref(), from)?;
            }
        }
        let mut keys: Vec<_> = replayed.versions.into_iter().collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        let in_journal: HashSet<String> = keys.iter().map(|(k, _)| k.clone()).collect();
        let end = replayed.end.unwrap_or(if from == (0, 0) {
            (0, journal::SEGMENT_HEADER_LEN)
        } else {
            from
        });
        for (key, versions) in keys {
            let mut fallback = None;
            let mut chosen = false;
            for version in versions.into_iter().rev() {
                let Change::Put { record, pickle } = version else {
                    break; // deleted: the key stays absent
                };
                match Self::payloads_usable(&root, &key, &record) {
                    Ok(()) => {
                        index.put(&key, &record, pickle.as_deref(), end)?;
                        chosen = true;
                        break;
                    }
                    Err(e) => {
                        report.skipped.push(e.to_string());
                        fallback.get_or_insert((record, pickle));
                    }
                }
            }
            if !chosen {
                if let Some((record, pickle)) = fallback {
                    // No version has intact payloads: keep the latest, its
                    // metadata and good arrays are still worth having
                    // (verify lists the damaged payloads).
                    report.skipped.push(format!(
                        "record {key:?}: kept in its latest version, whose payloads are damaged"
                    ));
                    index.put(&key, &record, pickle.as_deref(), end)?;
                } else {
                    // Deleted after the checkpoint, which may hold it.
                    index.remove(&key, end)?;
                }
            }
        }
        // The checkpoint's records that the journal does not name again:
        // the only version there is, kept, its damage reported.
        index.scan(|key, record| {
            if !in_journal.contains(key) {
                if let Err(e) = Self::payloads_usable(&root, key, record) {
                    report.skipped.push(format!(
                        "record {key:?}: kept in its latest version, whose payloads are \
                         damaged ({e})"
                    ));
                }
            }
            Ok(())
        })?;
        report.records = index.len()?;
        index.set_journal_pos(end)?;
        for (name, segs) in index_names {
            index.create_index(&name, segs)?;
            report.indexes.push(name);
        }
        // The checkpoint written below starts at `end`.
        index.mark_committed(end)?;
        index.flush()?;
        // Readers switch to what the rebuilt index holds: a checkpoint of
        // it, newer than any version they saw.
        // A version above any a reader saw: the highest checkpoint name,
        // the newest readable checkpoint's version plus the commits after
        // it, or the commits in the journal (damage must not stop repair).
        let listed = checkpoint::list(&root)?;
        let mut latest = listed.last().map_or(0, |(v, _)| *v);
        latest = latest.max(journal::read_committed(&root, (0, 0), None, |_, _| {})?.commits);
        if let Some(doc) = listed
            .iter()
            .rev()
            .find_map(|(_, p)| checkpoint::read(p).ok())
        {
            if let Ok(tail) = journal::read_committed(&root, doc.position(), None, |_, _| {}) {
                latest = latest.max(doc.version + tail.commits);
            }
        }
        let dir = root.join(CHECKPOINT_DIR);
        if !dir.is_dir() {
            fs::create_dir(&dir).map_err(Error::io(&dir))?;
        }
        let run = super::writer::write_full_run(&index, &dir)?;
        fsio::sync_dir(&dir).map_err(Error::io(&dir))?;
        let records = index.len()?;
        drop(index);
        if fs::symlink_metadata(&index_dir).is_ok() {
            let moved = (1u32..)
                .map(|n| root.join(format!("{INDEX_DIR}.damaged-{n}")))
                .find(|p| fs::symlink_metadata(p).is_err())
                .expect("a free name");
            fs::rename(&index_dir, &moved).map_err(Error::io(&moved))?;
            report.moved_index = Some(moved);
        }
        fs::rename(&building, &index_dir).map_err(Error::io(&index_dir))?;
        payload::sync_dir(&root)?;
        checkpoint::write(
            &root,
            &checkpoint::CheckpointDoc::new(
                latest.saturating_add(1),
                end,
                records,
                vec![checkpoint::RunDoc::from_info(&run)],
            ),
        )?;
        // The older checkpoints show states before the repair: remove
        // those no reader pins (failures leave them for a later cleanup).
        // Damaged ones stay: nothing repair could not read is deleted.
        if base.is_some() {
            let _ = checkpoint::cleanup(&root, std::time::Duration::ZERO);
        }
        drop(lock_file);
        Ok(report)
    }

    /// Checks that a record version decodes and that its payloads are all
    /// present with headers and sizes matching it.
    fn payloads_usable(root: &Path, key: &str, record: &[u8]) -> Result<()> {
        let record = Record::from_json(record)
            .map_err(|e| Error::corrupt(format!("journal record {key:?}"), e).with_key(key))?;
        for (name, entry) in &record.arrays {
            payload::open_payload(root, entry).map_err(|e| {
                Error::corrupt(format!("journal record {key:?} array {name:?}"), e)
                    .with_key(key)
                    .with_array(name)
            })?;
        }
        Ok(())
    }
}

/// Checks the run `r` of a checkpoint whole: its header, order, every
/// entry, and its checksum against the one the checkpoint names.
fn check_run(root: &Path, r: &checkpoint::RunDoc) -> Result<()> {
    let run = Run::open(&root.join(CHECKPOINT_DIR).join(&r.file))?;
    let sum = run.verify()?;
    let expected = format!("xxh3-64:{sum:016x}");
    if expected != r.checksum {
        return Err(Error::corrupt(
            format!("checkpoint run {}", r.file),
            format!("checksum is {expected}, the checkpoint says {}", r.checksum),
        ));
    }
    Ok(())
}

/// What `repair` could read of damaged checkpoints (see [`salvage_runs`]).
struct Salvage {
    /// The records, by key (deleted keys left out).
    records: BTreeMap<String, (Vec<u8>, Option<Vec<u8>>)>,
    /// Where the journal after them starts (`[0, 0]`: unknown, all of it).
    from: Position,
}

/// The records the damaged checkpoints of the store at `root` still hold:
/// the runs of the newest checkpoint document that still decodes (its
/// CRC-32 failed), or, with none, every run file in `checkpoints/` (newest
/// modification first: without a document their order is a guess, and the
/// report says so); of each run, every entry whose CRC-32 checks, the first
/// run holding a key deciding. Each problem goes to `notes`. `None` when
/// there is no run to read.
fn salvage_runs(root: &Path, notes: &mut Vec<String>) -> Result<Option<Salvage>> {
    let dir = root.join(CHECKPOINT_DIR);
    let doc = checkpoint::list(root)?.iter().rev().find_map(|(_, path)| {
        let bytes = fs::read(path).ok()?;
        let name = path.file_name()?.to_string_lossy().into_owned();
        checkpoint::CheckpointDoc::decode_damaged(&bytes, &name)
    });
    let (files, from) = match &doc {
        Some(doc) => {
            notes.push(format!(
                "checkpoint of version {} does not check whole (its document or a run is \
                 damaged): the records its runs still hold are kept",
                doc.version
            ));
            let files: Vec<PathBuf> = doc.runs.iter().map(|r| dir.join(&r.file)).collect();
            (files, doc.position())
        }
        None => {
            let mut runs: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "run"))
                .map(|p| {
                    (
                        fs::metadata(&p)
                            .and_then(|m| m.modified())
                            .unwrap_or(std::time::UNIX_EPOCH),
                        p,
                    )
                })
                .collect();
            if runs.is_empty() {
                return Ok(None);
            }
            runs.sort_by(|a, b| b.cmp(a));
            notes.push(format!(
                "no checkpoint document can be read: the records of its {} run file(s) are kept, \
                 newest file first (their order is a guess), with every journal change after",
                runs.len()
            ));
            (runs.into_iter().map(|(_, p)| p).collect(), (0, 0))
        }
    };
    let mut seen = HashSet::new();
    let mut records = BTreeMap::new();
    // Key ranges where a newer run has damaged entries: an older run's
    // entry there may have been replaced or deleted since.
    let mut gaps: Vec<(Option<String>, Option<String>)> = Vec::new();
    let mut suspect: Vec<String> = Vec::new();
    for path in files {
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) => {
                notes.push(format!(
                    "checkpoint run {}: {e}: its records are lost",
                    path.display()
                ));
                gaps.push((None, None));
                continue;
            }
        };
        let (mut damaged, mut prev, mut open_gap) = (0u64, None::<String>, false);
        let mut new_gaps = Vec::new();
        for item in crate::checkpoint::run::salvage(&bytes) {
            match item {
                crate::checkpoint::run::Salvaged::Entry(key, value) => {
                    if open_gap {
                        new_gaps.push((prev.clone(), Some(key.clone())));
                        open_gap = false;
                    }
                    if seen.insert(key.clone()) {
                        let in_gap = gaps.iter().any(|(lo, hi)| {
                            lo.as_ref().is_none_or(|l| key > *l)
                                && hi.as_ref().is_none_or(|h| key < *h)
                        });
                        if in_gap && value.is_some() {
                            suspect.push(key.clone());
                        }
                        if let Some(v) = value {
                            records.insert(key.clone(), v);
                        }
                    }
                    prev = Some(key);
                }
                crate::checkpoint::run::Salvaged::Damaged => {
                    damaged += 1;
                    open_gap = true;
                }
            }
        }
        if open_gap {
            new_gaps.push((prev, None));
        }
        gaps.extend(new_gaps);
        if damaged > 0 {
            notes.push(format!(
                "checkpoint run {}: {damaged} damaged span(s) of entries skipped (the records \
                 in them are lost; their keys are unknown)",
                path.display()
            ));
        }
    }
    if !suspect.is_empty() {
        let shown: Vec<&str> = suspect.iter().take(20).map(String::as_str).collect();
        notes.push(format!(
            "{} record(s) kept from an older checkpoint run where a newer run is damaged: each \
             may be an older version, or deleted since ({:?}{})",
            suspect.len(),
            shown,
            if suspect.len() > 20 { ", ..." } else { "" }
        ));
    }
    Ok(Some(Salvage { records, from }))
}

/// The newest checkpoint of the store at `root` that reads and whose runs
/// all check whole ([`check_run`]).
fn intact_checkpoint(root: &Path) -> Result<Option<checkpoint::CheckpointDoc>> {
    Ok(checkpoint::list(root)?
        .iter()
        .rev()
        .filter_map(|(_, path)| checkpoint::read(path).ok())
        .find(|doc| doc.runs.iter().all(|r| check_run(root, r).is_ok())))
}

/// How the array entry's `dtype` disagrees with its `descr`, if it does:
/// `dtype` must be numpy's name of the dtype the descr gives. A descr this
/// version does not know (no name for it) is not judged.
fn dtype_problem(entry: &ArrayEntry) -> Option<String> {
    let name = crate::npy::dtype_name(&entry.descr);
    if name == entry.descr || name == entry.dtype {
        return None;
    }
    Some(format!(
        "the entry's dtype {:?} disagrees with its descr {} (numpy's name for it is {name:?}); \
         the record is damaged: put it again with the array's true dtype",
        entry.dtype, entry.descr
    ))
}

/// One line per array path the layout of `record` (FORMAT.md, "Layout")
/// names that its `arrays` lack: loading the record would fail there.
fn layout_problems(key: &str, record: &Record) -> Vec<String> {
    let mut missing: Vec<&str> = Vec::new();
    let layout = &record.layout;
    let fields = layout
        .as_object()
        .filter(|m| m.len() == 1)
        .and_then(|m| m.get("fields"));
    if let Some(fields) = fields {
        // names neither a metadata field nor an array path
        for name in fields.as_array().into_iter().flatten() {
            if let Some(name) = name.as_str() {
                if !record.arrays.contains_key(name) && !record.meta.contains_key(name) {
                    missing.push(name);
                }
            }
        }
    } else {
        let mut stack = vec![layout];
        while let Some(node) = stack.pop() {
            let Some((kind, body)) = node
                .as_object()
                .filter(|m| m.len() == 1)
                .and_then(|m| m.iter().next())
            else {
                continue;
            };
            match (kind.as_str(), body) {
                ("dict", Value::Object(m)) => stack.extend(m.values()),
                ("list" | "tuple", Value::Array(items)) => stack.extend(items),
                ("array", Value::String(path)) if !record.arrays.contains_key(path) => {
                    missing.push(path);
                }
                ("masked", Value::Object(m)) => {
                    stack.extend(
                        ["data", "mask", "fill_value"]
                            .iter()
                            .filter_map(|f| m.get(*f)),
                    );
                }
                ("object", Value::Object(o)) => {
                    if let Some(Value::Object(state)) = o.get("state") {
                        stack.extend(state.values());
                    }
                }
                _ => {}
            }
        }
    }
    missing.sort_unstable();
    missing.dedup();
    missing
        .into_iter()
        .map(|path| {
            format!(
                "record {key:?}: its layout names the array {path:?}, which its arrays lack \
                 (loading the record fails; its metadata and other arrays stay readable): put \
                 the record again with that array"
            )
        })
        .collect()
}

/// Each run of each checkpoint checked whole (checksum, order, every
/// entry): one line per problem.
fn verify_checkpoints(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    for (_, path) in checkpoint::list(root)? {
        let doc = match checkpoint::read(&path) {
            Ok(doc) => doc,
            Err(Error::Storage(crate::StorageError::Io { source, .. }))
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                continue; // superseded and removed meanwhile
            }
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        for r in doc.runs {
            if !seen.insert(r.file.clone()) {
                continue;
            }
            if let Err(e) = check_run(root, &r) {
                problems.push(format!(
                    "{e} (`lazyvault repair` writes a new checkpoint from the journal)"
                ));
            }
            if let Some(c) = &r.columns {
                if let Some(problem) = verify_columns(root, c) {
                    problems.push(format!(
                        "column file {}: {problem} (queries read the records instead; \
                         `lazyvault repair` writes a new checkpoint with new column files)",
                        c.file
                    ));
                }
            }
        }
    }
    Ok(problems)
}

/// What is wrong with a checkpoint run's column file, if anything: its
/// checksum, then whether Arrow reads it as our column layout.
fn verify_columns(root: &Path, doc: &checkpoint::ColumnsDoc) -> Option<String> {
    let Some(info) = doc.info() else {
        return Some(format!(
            "malformed checksum {:?} in the checkpoint",
            doc.checksum
        ));
    };
    let path = root.join(CHECKPOINT_DIR).join(&doc.file);
    match crate::columns::Columns::check_file(&path, &info) {
        Ok(Some(problem)) => return Some(problem),
        Err(e) => return Some(e.to_string()),
        Ok(None) => {}
    }
    crate::columns::Columns::open(&path, &info)
        .err()
        .map(|e| e.to_string())
}
