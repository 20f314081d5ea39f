//! Staged puts: payload files streamed from readers (an import copying or
//! inflating a file's members), then committed as records in one step.
//!
//! [`Store::put`] takes every array's bytes in memory; an import of a
//! deflated `.npz` member of a gigabyte must not hold it there. A staged put
//! writes each payload from a [`Read`] through one bounded buffer (the
//! checksum computed on the way), then commits the records that reference
//! those payloads exactly as [`Store::put_many`] does: payloads durable
//! first (one barrier), then the journal, then the index, all or nothing.
//! A payload may also be another store's file taken by hard link
//! ([`Stage::link_from`], for [`Store::merge`]). Until the commit nothing
//! references the staged files; on any error, or if the filling closure
//! panics, they are removed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use lazyvault_schema::ArrayEntry;
use serde_json::{Map, Value};

use super::{check_key, NewRecord, Store};
use crate::error::{Error, Result};
use crate::fsio;
use crate::npy;
use crate::payload::{self, ArraySource, PayloadWriter};

/// The payload files of one staged put, being written (see
/// [`Store::put_staged`]).
pub struct Stage<'s> {
    /// `None` once committed or aborted.
    payloads: Option<PayloadWriter<'s>>,
    /// The copy buffer every streamed payload goes through.
    buf: Vec<u8>,
    /// The payloads written here, not yet claimed by a record (see
    /// [`member_key`]).
    ids: HashSet<String>,
    /// Packs of other stores linked here: source path → the pack id here
    /// (each source pack is linked once, whatever the number of its
    /// members taken).
    linked_packs: HashMap<PathBuf, String>,
    /// The store's root (where linked payloads go).
    root: &'s Path,
    /// Payload files made by [`Stage::link_from`] (hard links), removed
    /// unless the stage commits.
    linked: Vec<PathBuf>,
    /// The `arrays/<xx>` directories those links are in.
    link_dirs: BTreeSet<PathBuf>,
}

/// One record of a staged put: its arrays are payloads written by the
/// same [`Stage`] (each referenced once).
#[derive(Debug, Clone)]
pub struct StagedRecord {
    /// The key (any non-empty string).
    pub key: String,
    /// The JSON-able metadata (FORMAT.md, "Meta").
    pub meta: Map<String, Value>,
    /// How to rebuild the object (FORMAT.md, "Layout").
    pub layout: Value,
    /// Array path → the entry [`Stage::write_from`], [`Stage::write`] or
    /// [`Stage::link_from`] returned.
    pub arrays: IndexMap<String, ArrayEntry>,
    /// The pickled remainder, if the object has one.
    pub pickle: Option<Vec<u8>>,
}

/// What tells the payloads of a stage apart: the id of a payload file,
/// `<pack>/<id>` for a pack member (a linked pack keeps its members' ids).
fn member_key(entry: &ArrayEntry) -> String {
    match &entry.pack {
        Some(pack) => format!("{pack}/{}", entry.id),
        None => entry.id.clone(),
    }
}

/// Size of the buffer streamed payloads are copied through: one
/// [`fsio::WRITE_CHUNK`] (4 MiB), so that pieces end on its multiples in
/// the file as for in-memory puts.
const STAGE_BUFFER: usize = fsio::WRITE_CHUNK;

impl<'s> Stage<'s> {
    fn writer(&mut self) -> &mut PayloadWriter<'s> {
        // Some until commit_or_abort, which consumes the stage.
        match self.payloads.as_mut() {
            Some(w) => w,
            None => unreachable!("a stage is used only before its commit"),
        }
    }

    /// Writes a payload whose data are in `src.data`; returns its entry,
    /// for a [`StagedRecord`].
    ///
    /// # Errors
    /// As [`Store::put`] for one array ([`UsageError::InvalidArray`](crate::UsageError::InvalidArray), I/O).
    pub fn write(&mut self, src: &ArraySource<'_>) -> Result<ArrayEntry> {
        let entry = self.writer().write(src)?;
        self.ids.insert(member_key(&entry));
        Ok(entry)
    }

    /// Writes a payload of `nbytes` data bytes read from `data` (`src.data`
    /// is ignored; `src.shape` and `src.descr` must need exactly `nbytes`
    /// unless `src.pickled`), through one 4 MiB buffer whatever `nbytes`;
    /// returns its entry, checksum included.
    ///
    /// # Errors
    /// [`UsageError::InvalidArray`](crate::UsageError::InvalidArray) when `nbytes` disagrees with the dtype and
    /// shape, or `data` gives fewer or more than `nbytes` bytes; an error
    /// `data` returns, as it is when it wraps an [`Error`]
    /// (`io::Error::other(Error::from(crate::InteropError::InvalidFile {..}))`), else as [`StorageError::Io`](crate::StorageError::Io)
    /// naming `source`; I/O errors writing the payload. The partial file is
    /// removed.
    pub fn write_from(
        &mut self,
        src: &ArraySource<'_>,
        nbytes: u64,
        data: &mut dyn Read,
        source: &Path,
    ) -> Result<ArrayEntry> {
        let mut buf = std::mem::take(&mut self.buf);
        if buf.is_empty() {
            buf = vec![0u8; STAGE_BUFFER];
        }
        let written = self
            .writer()
            .write_from(src, nbytes, data, source, &mut buf);
        self.buf = buf;
        let entry = written?;
        self.ids.insert(member_key(&entry));
        Ok(entry)
    }

    /// Takes the payload file at `source` (a payload of another store,
    /// described there by `entry`) into this store under a new id, without
    /// copying its bytes: a hard link (the file is immutable in both
    /// stores, so they may share it); across file systems (`EXDEV`), or
    /// where the file system refuses the link (`EPERM`, `ENOTSUP`,
    /// `EMLINK`), a streamed copy as [`Stage::write_from`] makes, whose
    /// checksum must then equal `entry`'s. Returns the entry with the new
    /// id (the rest as `entry`, checksum included; after a copy, as the
    /// copy wrote it).
    ///
    /// Before linking, the file's `.npy` header must agree with `entry`
    /// (dtype, shape, order, data offset, byte count) and the file must
    /// hold all the data; the data are not read (a link copies nothing).
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming `source` when the file is missing, its
    /// header disagrees with `entry`, it is truncated, or a copy's checksum
    /// differs from `entry`'s; [`StorageError::Io`](crate::StorageError::Io)
    /// for other I/O errors. Nothing is left behind on error.
    ///
    /// A packed payload (`entry.pack`; `source` is then its pack file)
    /// keeps its member id: the whole pack is linked, once per stage
    /// whatever the number of its members taken, under a new pack id (its
    /// other members are dead weight here until `gc()` compacts the pack).
    pub fn link_from(&mut self, source: &Path, entry: &ArrayEntry) -> Result<ArrayEntry> {
        let what = || format!("payload {}", source.display());
        entry
            .check()
            .map_err(|p| Error::corrupt(what(), p).with_path(source))?;
        let mut file = std::fs::File::open(source).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::corrupt(what(), "file is missing").with_path(source)
            } else {
                Error::io(source)(e)
            }
        })?;
        let start = entry.npy_start();
        file.seek(SeekFrom::Start(start))
            .map_err(Error::io(source))?;
        let header = npy::read_header(&mut file, payload::header_limit(entry))
            .map_err(|e| Error::npy(what(), e).with_path(source))?;
        payload::check_header_matches(&header, entry)
            .map_err(|detail| Error::corrupt(what(), detail).with_path(source))?;
        let len = file.metadata().map_err(Error::io(source))?.len();
        let needed = start
            .saturating_add(entry.data_offset)
            .saturating_add(entry.nbytes);
        if len < needed {
            return Err(Error::corrupt(
                what(),
                format!("file is truncated: {len} bytes, the array needs {needed}"),
            )
            .with_path(source));
        }
        if let Some(pack) = self.linked_packs.get(source) {
            let linked = ArrayEntry {
                pack: Some(pack.clone()),
                ..entry.clone()
            };
            self.ids.insert(member_key(&linked));
            return Ok(linked);
        }
        let id = self.writer().new_id();
        let dir = self.root.join(lazyvault_schema::PAYLOAD_DIR).join(&id[..2]);
        fsio::create_dir_all(&dir).map_err(Error::io(&dir))?;
        let ext = if entry.is_packed() { "npz" } else { "npy" };
        let path = dir.join(format!("{id}.{ext}"));
        let linked =
            fsio::fault::check("link", &path).and_then(|()| std::fs::hard_link(source, &path));
        match linked {
            Ok(()) => {
                self.linked.push(path);
                self.link_dirs.insert(dir);
                let linked = if entry.is_packed() {
                    self.linked_packs.insert(source.to_owned(), id.clone());
                    ArrayEntry {
                        pack: Some(id),
                        ..entry.clone()
                    }
                } else {
                    ArrayEntry {
                        id,
                        ..entry.clone()
                    }
                };
                self.ids.insert(member_key(&linked));
                Ok(linked)
            }
            Err(e) if link_refused(&e) => self.copy_from(&mut file, source, entry),
            Err(e) => Err(Error::io(&path)(e)),
        }
    }

    /// [`Stage::link_from`]'s copy: the data of `file` (checked against
    /// `entry`) streamed into a new payload, its checksum compared with
    /// `entry`'s.
    fn copy_from(
        &mut self,
        file: &mut std::fs::File,
        source: &Path,
        entry: &ArrayEntry,
    ) -> Result<ArrayEntry> {
        file.seek(SeekFrom::Start(entry.npy_start() + entry.data_offset))
            .map_err(Error::io(source))?;
        let src = ArraySource {
            name: "payload".into(),
            descr: entry.descr.clone(),
            dtype: entry.dtype.clone(),
            shape: entry.shape.clone(),
            fortran_order: entry.fortran_order,
            data: &[],
            pickled: entry.pickled,
        };
        // The source's payload disagreeing with its own entry is damage of
        // the source (the caller names its record and array), not a bad
        // array of the caller's.
        let copied = self
            .write_from(&src, entry.nbytes, &mut file.take(entry.nbytes), source)
            .map_err(|e| match e {
                Error::Usage(crate::UsageError::InvalidArray { detail, .. }) => {
                    Error::corrupt(format!("payload {}", source.display()), detail)
                        .with_path(source)
                }
                other => other,
            })?;
        if entry.checksum.is_some() && copied.checksum != entry.checksum {
            // the copy is named by no record: removed with the stage, or
            // after its commit
            return Err(Error::corrupt(
                format!("payload {}", source.display()),
                format!(
                    "checksum mismatch: the record says {}, the data hash to {}",
                    entry.checksum.as_deref().unwrap_or_default(),
                    copied.checksum.as_deref().unwrap_or_default()
                ),
            )
            .with_path(source));
        }
        Ok(ArrayEntry {
            checksum: copied.checksum.clone().or_else(|| entry.checksum.clone()),
            ..copied
        })
    }

    /// Removes every file written (see `PayloadWriter::abort`) or linked.
    fn abort(&mut self) {
        if let Some(w) = self.payloads.take() {
            w.abort();
        }
        for path in self.linked.drain(..) {
            let _ = fsio::remove_file(&path);
        }
    }
}

/// Whether a hard link failed because the file systems cannot share the
/// file (another file system, links refused or not supported, too many
/// links): then the payload is copied instead.
fn link_refused(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::CrossesDevices | K::PermissionDenied | K::Unsupported | K::TooManyLinks
    )
}

impl Drop for Stage<'_> {
    fn drop(&mut self) {
        // An error or a panic before the commit: nothing references them.
        self.abort();
    }
}

impl Store {
    /// A put whose payloads are streamed: `fill` writes them with
    /// [`Stage::write_from`] (or [`Stage::write`], or links them with
    /// [`Stage::link_from`]) and returns the records
    /// that reference them; those records are then committed together as
    /// [`Store::put_many`] commits (payloads durable first, one barrier for
    /// many files; then the journal and the index, all or nothing).
    ///
    /// `files`, `bytes` and `records` announce what `fill` will write (for
    /// the durability mode and the free-space check, which refuses the put
    /// before anything is written when `bytes` plus a margin do not fit).
    /// The writer lock is held throughout: `fill` must not use this store.
    ///
    /// # Errors
    /// As [`Store::put_many`]; any error `fill` returns; and
    /// [`UsageError::InvalidArray`](crate::UsageError::InvalidArray) for a record naming an entry this stage did
    /// not write, or one entry twice. On error no record is set and every
    /// staged file is removed.
    pub fn put_staged(
        &self,
        files: usize,
        bytes: u64,
        records: usize,
        fill: impl FnOnce(&mut Stage<'_>) -> Result<Vec<StagedRecord>>,
    ) -> Result<()> {
        let (_view, w) = self.writer()?;
        let index = w.index();
        if index.io_failed() {
            return Err(index.stuck_error());
        }
        let payload = bytes.saturating_add(files as u64 * 4096);
        w.check_space_for(records, payload)?;
        let mut state = w.lock();
        let mut stage = Stage {
            payloads: Some(PayloadWriter::new(&self.root, files)?),
            buf: Vec::new(),
            ids: HashSet::new(),
            linked_packs: HashMap::new(),
            root: &self.root,
            linked: Vec::new(),
            link_dirs: BTreeSet::new(),
        };
        let staged = fill(&mut stage)?;
        for r in &staged {
            check_key(&r.key)?;
            for (name, entry) in &r.arrays {
                if !stage.ids.remove(&member_key(entry)) {
                    return Err(Error::from(crate::UsageError::InvalidArray {
                        name: name.clone(),
                        detail: "a staged record names a payload its stage did not write, \
                                 or one payload twice"
                            .into(),
                    }));
                }
            }
        }
        let link_dirs = std::mem::take(&mut stage.link_dirs);
        let payloads = stage.writer();
        payloads.finish()?;
        // The links were made before `finish`: its second barrier, if any,
        // covers them too.
        if payloads.dirs_durable {
            let dirs = payloads.dirs.clone();
            state.durable_dirs.extend(dirs);
            state.durable_dirs.extend(link_dirs);
        } else {
            let mut dirs = payloads.dirs.clone();
            if cfg!(target_os = "linux") && link_dirs.len() >= payload::BARRIER_MIN_FILES {
                // many directories of links: one barrier for all of them
                #[cfg(target_os = "linux")]
                {
                    let fs = fsio::open_dir(&self.root).map_err(Error::io(&self.root))?;
                    fsio::sync_fs(&fs, &self.root).map_err(Error::io(&self.root))?;
                }
                state.durable_dirs.extend(link_dirs);
            } else {
                dirs.extend(link_dirs);
            }
            Self::sync_payload_dirs(&self.root, &mut state, &dirs)?;
        }
        // Keys and pickles stay here (the batch borrows them); metadata,
        // layouts and entries move into it.
        let mut owned = Vec::with_capacity(staged.len());
        let mut parts = Vec::with_capacity(staged.len());
        for r in staged {
            owned.push((r.key, r.pickle));
            parts.push((r.meta, r.layout, r.arrays));
        }
        let batch: Vec<(NewRecord<'_>, IndexMap<String, ArrayEntry>)> = owned
            .iter()
            .zip(parts)
            .map(|((key, pickle), (meta, layout, arrays))| {
                let record = NewRecord {
                    key,
                    meta,
                    layout,
                    arrays: &[],
                    pickle: pickle.as_deref(),
                };
                (record, arrays)
            })
            .collect();
        self.put_locked(index, &mut state, batch)?;
        // Committed: the records own their payloads now. Files written but
        // named by no record are removed (best effort: gc() would).
        stage.payloads = None;
        stage.linked.clear();
        // (Unclaimed pack members stay: their pack is shared; gc() compacts.)
        for id in stage.ids.iter().filter(|k| !k.contains('/')) {
            let _ = fsio::remove_file(&self.root.join(lazyvault_schema::payload_relpath(id)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{map_payload, Mode};

    fn src(name: &str) -> ArraySource<'static> {
        ArraySource {
            name: name.into(),
            descr: "'|u1'".into(),
            dtype: "uint8".into(),
            shape: vec![10],
            fortran_order: false,
            data: &[],
            pickled: false,
        }
    }

    fn files(store: &Store) -> usize {
        let arrays = store.root().join(lazyvault_schema::PAYLOAD_DIR);
        let dirs = std::fs::read_dir(arrays).into_iter().flatten().flatten();
        dirs.flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .count()
    }

    fn record(key: &str, name: &str, entry: ArrayEntry) -> StagedRecord {
        StagedRecord {
            key: key.into(),
            meta: Map::new(),
            layout: Value::Null,
            arrays: [(name.to_owned(), entry)].into_iter().collect(),
            pickle: None,
        }
    }

    #[test]
    fn streamed_payloads_are_committed_or_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
        let data: Vec<u8> = (0..10).collect();
        let source = Path::new("source");
        // short and long streams are refused, nothing is left
        for bytes in [&data[..9], &[0u8; 11][..]] {
            let err = store
                .put_staged(1, 10, 1, |stage| {
                    let e = stage.write_from(&src("a"), 10, &mut &bytes[..], source)?;
                    Ok(vec![record("k", "a", e)])
                })
                .unwrap_err();
            assert!(
                matches!(err, Error::Usage(crate::UsageError::InvalidArray { .. })),
                "{err}"
            );
        }
        // an entry this stage did not write
        let err = store
            .put_staged(1, 10, 1, |stage| {
                let mut e = stage.write_from(&src("a"), 10, &mut &data[..], source)?;
                e.id = "0".repeat(32);
                Ok(vec![record("k", "a", e)])
            })
            .unwrap_err();
        assert!(err.to_string().contains("did not write"), "{err}");
        assert_eq!(files(&store), 0);
        assert!(store.keys().unwrap().is_empty());
        // committed; a payload no record names is removed
        store
            .put_staged(2, 20, 1, |stage| {
                let e = stage.write_from(&src("a"), 10, &mut &data[..], source)?;
                stage.write_from(&src("b"), 10, &mut &data[..], source)?;
                Ok(vec![record("k", "a", e)])
            })
            .unwrap();
        assert_eq!(files(&store), 1);
        let got = store.get("k").unwrap().unwrap();
        let entry = &got.arrays["a"];
        assert_eq!(
            entry.checksum.as_deref(),
            Some(&*crate::payload::checksum(&data))
        );
        assert_eq!(
            map_payload(store.root(), entry).unwrap().as_bytes(),
            &data[..]
        );
    }

    #[test]
    #[cfg(unix)]
    fn linked_payloads_are_committed_or_removed() {
        // a packed payload (its pack is linked) and a payload file
        for n in [10, crate::READ_MAX_BYTES as usize + 1] {
            linked_payloads_of(n);
        }
    }

    fn linked_payloads_of(n: usize) {
        let dir = tempfile::tempdir().unwrap();
        let other = Store::open(dir.path().join("o.lv"), Mode::Append).unwrap();
        let data: Vec<u8> = (0..n).map(|i| i as u8).collect();
        let arrays = [ArraySource {
            data: &data,
            shape: vec![n as u64],
            ..src("a")
        }];
        other
            .put("k", Map::new(), Value::Null, &arrays, None)
            .unwrap();
        let entry = other.get("k").unwrap().unwrap().arrays["a"].clone();
        let path = other.root().join(entry.relpath());
        let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
        // an error after the link: the link goes
        let err = store
            .put_staged(1, 0, 1, |stage| {
                stage.link_from(&path, &entry)?;
                Err(Error::corrupt("test", "stop"))
            })
            .unwrap_err();
        assert!(err.to_string().contains("stop"), "{err}");
        assert_eq!(files(&store), 0);
        // committed; a link no record names is removed
        store
            .put_staged(2, 0, 1, |stage| {
                let e = stage.link_from(&path, &entry)?;
                stage.link_from(&path, &entry)?;
                if entry.is_packed() {
                    // the pack is linked under a new id, members keep theirs
                    assert_ne!(e.pack, entry.pack);
                    assert_eq!(e.id, entry.id);
                } else {
                    assert_ne!(e.id, entry.id);
                }
                assert_eq!(e.checksum, entry.checksum);
                Ok(vec![record("k", "a", e)])
            })
            .unwrap();
        assert_eq!(files(&store), 1);
        let got = store.get("k").unwrap().unwrap();
        assert_eq!(
            map_payload(store.root(), &got.arrays["a"])
                .unwrap()
                .as_bytes(),
            &data[..]
        );
        // the same file under two names
        use std::os::unix::fs::MetadataExt;
        let ours = std::fs::metadata(store.root().join(got.arrays["a"].relpath())).unwrap();
        assert_eq!(ours.ino(), std::fs::metadata(&path).unwrap().ino());
        assert_eq!(ours.nlink(), 2);
        // an entry the file does not match is refused before linking
        let wrong = ArrayEntry {
            shape: vec![n as u64 + 1],
            nbytes: n as u64 + 1,
            ..entry.clone()
        };
        let err = store
            .put_staged(1, 0, 1, |stage| {
                let e = stage.link_from(&path, &wrong)?;
                Ok(vec![record("k2", "a", e)])
            })
            .unwrap_err();
        assert!(err.to_string().contains("does not match"), "{err}");
        assert_eq!(files(&store), 1);
    }
}
