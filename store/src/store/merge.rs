//! Merging other stores into this one: their records in one staged batch,
//! their payload files taken by hard link (no byte copied) under new ids.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use lazyvault_schema::{ArrayEntry, Record};

use super::{check_record_size, Mode, StagedRecord, Store};
use crate::error::{Error, Result};
use crate::InteropError;

/// One record of a source, as read at the source's latest commit.
struct SourceRecord {
    key: String,
    record: Record,
    pickle: Option<Vec<u8>>,
}

impl Store {
    /// Moves the records of the stores at `sources` into this one, all or
    /// nothing, in one batch of [`Store::put_staged`]; returns their keys
    /// in source order (each source's in key order). A key this store has
    /// is replaced (its old payloads retired as by [`Store::put`]).
    ///
    /// Each source is read as a reader at its latest commit (a writer may
    /// be at work on it in another process; its unflushed changes are not
    /// seen) and stays unchanged. Sources are read one at a time (one
    /// reader open at a time, whatever their number): first all of them,
    /// to check them before anything is written, then each again while its
    /// payloads are linked (its reader's pin keeps them); a source that
    /// committed in between is taken as its new commit, checked again. Each payload of a source record is
    /// hard-linked into this store under a new id (across file systems,
    /// or where links are refused, copied; see [`Stage::link_from`](crate::Stage::link_from)), after
    /// its `.npy` header and length are checked against the record; the
    /// record's metadata, layout, checksums and pickled remainder are kept
    /// as the source has them, only the ids change. Like every put the
    /// records are visible to this process at once and committed by the
    /// next [`Store::flush`]. `progress(done, total)` is called with
    /// `(0, total)` once every source is read and checked (records), then
    /// after each record's payloads are taken; an error it returns stops
    /// the merge (nothing set).
    ///
    /// # Errors
    /// [`UsageError::ReadOnly`](crate::UsageError::ReadOnly) in mode `"r"`;
    /// what [`Store::open`] in mode `"r"` raises for a source that is
    /// missing or not a store; [`InteropError::Unsupported`] for a source
    /// that is this store or a source given twice;
    /// [`InteropError::KeyCollision`] for a key two sources have (naming
    /// it and both sources); [`Error::Corrupt`] naming the source, key and
    /// file when a source payload is missing, truncated or disagrees with
    /// its record, or a source record does not decode;
    /// [`UsageError::RecordTooLarge`](crate::UsageError::RecordTooLarge)
    /// for a source record over this store's cap; and those of
    /// [`Store::put_staged`]. On any error no record is set and no file
    /// is left in this store.
    pub fn merge(
        &self,
        sources: &[PathBuf],
        progress: &mut dyn FnMut(u64, u64) -> Result<()>,
    ) -> Result<Vec<String>> {
        self.check_fork()?;
        if self.mode == Mode::ReadOnly {
            return Err(Error::read_only());
        }
        if self.is_closed() {
            return Err(Error::closed());
        }
        let this = same_file_id(&self.root)?;
        // First pass: every source read (one reader at a time: a
        // descriptor each while open) and checked before anything is
        // written.
        let mut read: Vec<Source> = Vec::with_capacity(sources.len());
        let mut ids = Vec::with_capacity(sources.len());
        let mut owners: HashMap<String, usize> = HashMap::new();
        for (i, path) in sources.iter().enumerate() {
            let source = Store::open(path, Mode::ReadOnly)?;
            let id = same_file_id(source.root())?;
            if id == this {
                return Err(unsupported(format!(
                    "{}: a store cannot be merged into itself",
                    path.display()
                )));
            }
            if let Some(j) = ids.iter().position(|other| *other == id) {
                return Err(unsupported(format!(
                    "{} is given twice (as {} too): each source is merged once",
                    path.display(),
                    sources[j].display()
                )));
            }
            ids.push(id);
            let version = source.version()?;
            let records = read_records(&source)?;
            claim(&mut owners, sources, i, &records)?;
            check_sizes(&records)?;
            let same_fs = same_device(source.root(), &self.root)?;
            read.push(Source {
                root: source.root().to_owned(),
                version,
                same_fs,
                records,
            });
        }
        let mut total: usize = read.iter().map(|s| s.records.len()).sum();
        // Links take no room (and need no durability barrier); payloads of
        // a source on another file system are copied and must fit.
        let files: usize = read
            .iter()
            .filter(|s| !s.same_fs)
            .flat_map(|s| s.records.iter())
            .map(|r| r.record.arrays.len())
            .sum();
        let bytes: u64 = read
            .iter()
            .filter(|s| !s.same_fs)
            .flat_map(|s| s.records.iter())
            .flat_map(|r| r.record.arrays.values())
            .map(|e| e.data_offset.saturating_add(e.nbytes))
            .sum();
        progress(0, total as u64)?;
        let mut keys = Vec::with_capacity(total);
        self.put_staged(files, bytes, total, |stage| {
            let mut staged = Vec::with_capacity(total);
            let mut done = 0u64;
            for (i, mut src) in read.into_iter().enumerate() {
                // Second pass: a reader again, whose pin keeps the source's
                // payloads while they are linked. A commit since the first
                // pass (a writer elsewhere): read again, checked again.
                let source = Store::open(&sources[i], Mode::ReadOnly)?;
                if source.version()? != src.version {
                    let records = read_records(&source)?;
                    for r in &src.records {
                        if owners.get(&r.key) == Some(&i) {
                            owners.remove(&r.key);
                        }
                    }
                    claim(&mut owners, sources, i, &records)?;
                    check_sizes(&records)?;
                    total = total - src.records.len() + records.len();
                    src.records = records;
                }
                let root = &src.root;
                for r in src.records {
                    let mut arrays: IndexMap<String, ArrayEntry> =
                        IndexMap::with_capacity(r.record.arrays.len());
                    for (name, entry) in &r.record.arrays {
                        let file = root.join(entry.relpath());
                        let linked = stage
                            .link_from(&file, entry)
                            .map_err(|e| name_source(e, root, &r.key, name, &file))?;
                        arrays.insert(name.clone(), linked);
                    }
                    keys.push(r.key.clone());
                    staged.push(StagedRecord {
                        key: r.key,
                        meta: r.record.meta,
                        layout: r.record.layout,
                        arrays,
                        pickle: r.pickle,
                    });
                    done += 1;
                    progress(done, total as u64)?;
                }
                // every payload of this source is linked: its reader (and
                // its pin) can go
                drop(source);
            }
            Ok(staged)
        })?;
        Ok(keys)
    }
}

/// One source as its first read found it.
struct Source {
    /// Its directory, absolute.
    root: PathBuf,
    /// The commit read.
    version: u64,
    /// Whether it is on this store's file system (links, no copies).
    same_fs: bool,
    records: Vec<SourceRecord>,
}

/// Records the keys of `records` as source `i`'s in `owners`; refuses a key
/// another source has ([`InteropError::KeyCollision`], the earlier source
/// first).
fn claim(
    owners: &mut HashMap<String, usize>,
    sources: &[PathBuf],
    i: usize,
    records: &[SourceRecord],
) -> Result<()> {
    for r in records {
        if let Some(j) = owners.insert(r.key.clone(), i) {
            if j != i {
                let (first, second) = (j.min(i), j.max(i));
                return Err(InteropError::KeyCollision {
                    key: r.key.clone(),
                    first: sources[first].clone(),
                    second: sources[second].clone(),
                }
                .into());
            }
        }
    }
    Ok(())
}

/// Refuses a record over the cap before anything is written (the batch
/// would refuse it anyway, after the links).
fn check_sizes(records: &[SourceRecord]) -> Result<()> {
    for r in records {
        let json = r.record.to_json();
        check_record_size(&r.key, &r.record, &json, r.pickle.as_deref())?;
    }
    Ok(())
}

/// Every record of `source` (a reader), in key order, with its pickled
/// remainder.
fn read_records(source: &Store) -> Result<Vec<SourceRecord>> {
    let root = source.root();
    let mut out = Vec::new();
    for key in source.keys()? {
        let Some((json, pickle)) = source.get_with_pickle(&key)? else {
            continue; // unreachable for a snapshot; harmless
        };
        let record = Record::from_json(&json).map_err(|e| {
            Error::corrupt(format!("store {}: record {key:?}", root.display()), e).with_key(&key)
        })?;
        out.push(SourceRecord {
            key,
            record,
            pickle,
        });
    }
    Ok(out)
}

/// Names the source store, key and array in a [`Error::Corrupt`] about a
/// payload of the source; other errors pass.
fn name_source(e: Error, root: &Path, key: &str, name: &str, file: &Path) -> Error {
    match e {
        Error::Corrupt(c) => Error::corrupt(
            format!(
                "store {}: record {key:?}, array {name:?}: payload {}",
                root.display(),
                file.display()
            ),
            c.detail(),
        )
        .with_key(key)
        .with_array(name)
        .with_path(file),
        other => other,
    }
}

fn unsupported(text: String) -> Error {
    InteropError::Unsupported(text).into()
}

/// What tells two paths to the same directory apart from two others:
/// `(device, inode)` on Unix, the canonical path elsewhere.
#[cfg(unix)]
fn same_file_id(path: &Path) -> Result<(u64, u64, PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(Error::io(path))?;
    Ok((m.dev(), m.ino(), PathBuf::new()))
}

#[cfg(not(unix))]
fn same_file_id(path: &Path) -> Result<(u64, u64, PathBuf)> {
    let p = std::fs::canonicalize(path).map_err(Error::io(path))?;
    Ok((0, 0, p))
}

/// Whether `a` and `b` are on one file system (a hard link between them
/// may work).
fn same_device(a: &Path, b: &Path) -> Result<bool> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).map_err(Error::io(p));
        Ok(dev(a)? == dev(b)?)
    }
    #[cfg(not(unix))]
    {
        Ok(a.components().next() == b.components().next())
    }
}
