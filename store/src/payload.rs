//! Payload files: writing a `.npy` file crash-safely, and mapping one back
//! after checking that it is what its record says (FORMAT.md, "Payload files").

use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use lazyvault_schema::{ArrayEntry, PAYLOAD_DIR};
use memmap2::{Mmap, MmapOptions};

use crate::error::{Error, Result};
use crate::fsio;
use crate::interop::export::zipfile::{StoredZipWriter, ZipLimits};
use crate::npy;
use crate::open_packs;

/// An array to be written as a payload: its description and its bytes.
#[derive(Debug, Clone)]
pub struct ArraySource<'a> {
    /// Path name in the record (`"image"`, `"frames/0"`).
    pub name: String,
    /// Python-literal descr, as `repr(numpy.lib.format.dtype_to_descr(dt))`.
    pub descr: String,
    /// numpy's `dtype.name`.
    pub dtype: String,
    /// numpy's `shape`: the length of each axis in elements, outermost
    /// first; `[]` for a 0-d array. Unless `pickled`, the product times the
    /// descr's itemsize must equal `data.len()` in bytes (else
    /// [`UsageError::InvalidArray`](crate::UsageError::InvalidArray)).
    pub shape: Vec<u64>,
    /// numpy's `fortran_order` (NEP 1): `true` when `data` holds the
    /// elements in column-major order, `false` for row-major (C) order.
    pub fortran_order: bool,
    /// The array's bytes in `fortran_order` (or C) order; for a pickled
    /// (`object`) array, the pickle of the array.
    pub data: &'a [u8],
    /// Whether `data` is a pickle of an `object` array.
    pub pickled: bool,
}

/// Suffix of a payload being written; such files are orphans after a crash.
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// Checks `src` (name, descr, byte count) and builds its `.npy` header and
/// its array entry (with an empty id, for the caller to fill in).
pub(crate) fn prepare_payload(src: &ArraySource<'_>) -> Result<(Vec<u8>, ArrayEntry)> {
    prepare_payload_of(src, src.data.len() as u64)
}

/// [`prepare_payload`] for a payload of `nbytes` data bytes that are not in
/// `src.data` (they are streamed from a reader by [`PayloadWriter::write_from`]).
fn prepare_payload_of(src: &ArraySource<'_>, nbytes: u64) -> Result<(Vec<u8>, ArrayEntry)> {
    let invalid = |detail: String| {
        crate::UsageError::InvalidArray {
            name: src.name.clone(),
            detail,
        }
        .into()
    };
    if src.name.is_empty() {
        return Err(invalid("array names must be non-empty".into()));
    }
    if let Some(problem) = npy::numpy_refuses(&src.descr, &src.shape) {
        return Err(invalid(problem));
    }
    // Any header numpy itself writes: a dtype of hundreds of fields is
    // stored, and read back under the entry's own data offset (see
    // `header_limit`).
    let header = npy::write_header_with_limit(
        &src.descr,
        src.fortran_order,
        &src.shape,
        npy::FORMAT_MAX_HEADER_LEN,
    )
    .map_err(|e| invalid(e.to_string()))?;
    let len = src
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| invalid("shape overflows".into()))?;
    if !src.pickled {
        let itemsize = npy::descr_itemsize(&src.descr)
            .ok_or_else(|| invalid(format!("unsupported descr {}", src.descr)))?;
        let expected = itemsize.checked_mul(len);
        if expected != Some(nbytes) {
            return Err(invalid(format!(
                "{} data bytes given, dtype {} and shape {:?} need {}",
                nbytes,
                src.descr,
                src.shape,
                expected.map_or("more than 2^64".to_owned(), |n| n.to_string())
            )));
        }
    }
    let entry = ArrayEntry {
        id: String::new(),
        descr: npy::parse_header(&header, header.len())?.descr,
        dtype: src.dtype.clone(),
        shape: src.shape.clone(),
        fortran_order: src.fortran_order,
        nbytes,
        data_offset: header.len() as u64,
        pickled: src.pickled,
        checksum: None,
        pack: None,
        pack_offset: None,
    };
    Ok((header, entry))
}

/// A put that writes more payload files than this makes them durable with
/// one `syncfs(2)` barrier instead of one fsync each (Linux only; see
/// [`PayloadWriter`]). Below it, per-file fsyncs are as fast and touch only
/// the files written.
pub(crate) const BARRIER_MIN_FILES: usize = 9;

/// Writes the payload files of one put (or one batch of puts) crash-safely
/// (invariant 3): every file goes to `<id>.npy.tmp` and is made durable
/// before it is renamed to `<id>.npy`; nothing is written after the rename.
///
/// Two ways to make the files durable, same guarantee:
/// - per file: fsync each temporary file, then rename it at once;
/// - barrier (Linux, [`BARRIER_MIN_FILES`] files or more): write every
///   temporary file without fsync, then one `syncfs(2)` on the store's file
///   system, then rename them all. The descriptor used for `syncfs` is
///   opened before the first file is written, so write-back errors of these
///   files are reported by it.
///
/// The caller then fsyncs [`PayloadWriter::dirs`] (the renames) and, only
/// after that, lets a record reference the files. On error (or if the
/// record is not committed) [`PayloadWriter::abort`] removes every file
/// this writer made.
pub(crate) struct PayloadWriter<'r> {
    root: &'r Path,
    /// The store root, open for `syncfs`, in barrier mode.
    barrier: Option<File>,
    /// `arrays/<xx>` directories created or checked by this writer.
    made: HashSet<PathBuf>,
    /// Directories holding the renamed files.
    pub(crate) dirs: BTreeSet<PathBuf>,
    /// Whether a second barrier after the renames already made `dirs` (and
    /// `arrays/`) durable: no directory fsync is needed.
    pub(crate) dirs_durable: bool,
    /// Temporary files written, not yet durable and renamed: (tmp, final).
    pending: Vec<(PathBuf, PathBuf)>,
    /// Files renamed into place.
    renamed: Vec<PathBuf>,
    /// The pack small payloads go into, once one was written.
    pack: Option<PackOut>,
    /// Where the ids of its payloads and packs come from.
    ids: Ids,
    /// The last payload prepared: its `ArraySource::descr` as given, its
    /// header and its entry (no id), reused for the next payload of the
    /// same description and size (see [`PayloadWriter::prepare`]).
    last: Option<(String, Vec<u8>, ArrayEntry)>,
}

/// The ids of the payloads and packs one writer makes (FORMAT.md, "Name
/// and id"): the 122 random bits of a UUID v4 drawn once (one
/// `getrandom`, where a UUID per payload cost a system call each) as two
/// seeds `a` and `b`, then for the `n`th id `mix(a + n)` and `mix(b + n)`
/// in 32 lowercase hex digits. `mix` is a bijection of `u64` (SplitMix64's
/// finalizer), so the first 16 digits of one source's ids never repeat
/// (nor do its pack member names, their first 24), and they spread over
/// the `arrays/<xx>` fan-out as random ids do; two sources of `n` ids
/// share one only if both their seeds differ by the same amount, less
/// than `n` (a chance of the order of `n` × 2^-120).
pub(crate) struct Ids {
    seed: (u64, u64),
    next: u64,
}

impl Ids {
    /// A new source, from fresh random bits.
    pub(crate) fn new() -> Ids {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        Ids::from_seed(a, b)
    }

    /// A source from the given draw (tests).
    pub(crate) fn from_seed(a: u64, b: u64) -> Ids {
        Ids {
            seed: (a, b),
            next: 0,
        }
    }

    /// The next id: 32 lowercase hex digits.
    pub(crate) fn next_id(&mut self) -> String {
        let n = self.next;
        self.next = self.next.wrapping_add(1);
        let (a, b) = self.seed;
        hex_id(mix64(a.wrapping_add(n)), mix64(b.wrapping_add(n)))
    }
}

/// SplitMix64's output function: a bijection of `u64` whose outputs for
/// consecutive inputs look independent.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `hi` then `lo` as 32 lowercase hex digits.
fn hex_id(hi: u64, lo: u64) -> String {
    let mut id = String::with_capacity(32);
    push_hex(&mut id, hi);
    push_hex(&mut id, lo);
    id
}

/// Appends `word` to `out` as 16 lowercase hex digits (what `{:016x}`
/// writes, without the formatting machinery).
fn push_hex(out: &mut String, word: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    for (i, digit) in digits.iter_mut().enumerate() {
        *digit = DIGITS[((word >> (60 - 4 * i)) & 0xf) as usize];
    }
    out.push_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"));
}

/// Payloads whose data take at most [`READ_MAX_BYTES`] and whose header is
/// an ordinary one (at most numpy's default length) go into a pack unless
/// pickled: what a reader reads into memory anyway, with one `pread`.
pub(crate) fn packable(entry: &ArrayEntry) -> bool {
    !entry.pickled && entry.nbytes <= READ_MAX_BYTES && entry.data_offset <= MAX_PACKED_HEADER
}

/// The longest `.npy` header of a pack member: numpy's default limit,
/// rounded up to the alignment. A reader of a pack member never allocates
/// more than this plus [`READ_MAX_BYTES`].
const MAX_PACKED_HEADER: u64 = (npy::NUMPY_MAX_HEADER_LEN + DATA_ALIGN) as u64;

/// A pack holding this many bytes is closed and the next small payload of
/// the same put starts another (an `update()` chunk holds at most 256 MiB
/// of array data, so it makes one pack).
pub(crate) const PACK_MAX_BYTES: u64 = 256 << 20;

/// A pack file being written: an uncompressed zip of `.npy` members, each
/// starting 64-byte aligned (FORMAT.md, "Packs").
struct PackOut {
    id: String,
    tmp: PathBuf,
    path: PathBuf,
    zip: StoredZipWriter<BufWriter<FaultFile>>,
    /// Its member names so far: a name is unique within a pack.
    names: HashSet<String>,
}

/// The pack's file, each write of which is one store file operation for
/// fault injection (see [`fsio::fault`]).
struct FaultFile {
    file: File,
    path: PathBuf,
}

impl Write for FaultFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        fsio::fault::check("write", &self.path)?;
        self.file.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Seek for FaultFile {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.file.seek(pos)
    }
}

/// How many files a put of `arrays` writes: one per array too large to
/// pack, plus one pack for the others (for choosing the durability mode).
pub(crate) fn files_for<'a>(arrays: impl IntoIterator<Item = &'a ArraySource<'a>>) -> usize {
    let (mut files, mut small) = (0, false);
    for src in arrays {
        if src.pickled || src.data.len() as u64 > READ_MAX_BYTES {
            files += 1;
        } else {
            small = true;
        }
    }
    files + usize::from(small)
}

/// Hex digits of the payload id in a pack member's name (since 2.0).
const MEMBER_ID_DIGITS: usize = 24;

/// The name of a packed payload's member: `<id[0:24]>.npy`, so that
/// `np.load` of the pack (an npz) names the array by the start of its
/// payload id. 28 bytes: with the 30-byte local header and the 6-byte
/// alignment field (`zipalign`'s, the smallest the `zip` crate accepts:
/// id, length and the alignment) a member starting 64-byte aligned has its
/// `.npy` bytes 64 bytes later (FORMAT.md, "Packs"). Packs written before
/// named members `<id>.npy`; nothing reads member names back, so both are
/// read alike.
pub(crate) fn member_name(id: &str) -> String {
    if legacy::names() {
        return format!("{id}.npy");
    }
    let start = id.get(..MEMBER_ID_DIGITS).unwrap_or(id);
    let mut name = String::with_capacity(start.len() + 4);
    name.push_str(start);
    name.push_str(".npy");
    name
}

/// The pack layout written before 2.0 (members named `<id>.npy`, their
/// alignment padding repeated in the central directory), for tests that
/// old packs are still read, verified, compacted and merged. Process-wide:
/// a test that sets it must be alone in its test binary.
#[doc(hidden)]
pub mod legacy {
    use std::sync::atomic::{AtomicBool, Ordering};

    static OLD_NAMES: AtomicBool = AtomicBool::new(false);

    /// Packs written from now on have the layout before 2.0 (`true`) or
    /// the current one.
    pub fn write_old_packs(old: bool) {
        OLD_NAMES.store(old, Ordering::SeqCst);
    }

    pub(crate) fn names() -> bool {
        OLD_NAMES.load(Ordering::Relaxed)
    }
}

impl<'r> PayloadWriter<'r> {
    /// A writer for `files` payloads under `root`; chooses the barrier when
    /// there are enough files and the platform has `syncfs`.
    pub(crate) fn new(root: &'r Path, files: usize) -> Result<PayloadWriter<'r>> {
        let barrier = if cfg!(target_os = "linux") && files >= BARRIER_MIN_FILES {
            Some(fsio::open_dir(root).map_err(Error::io(root))?)
        } else {
            None
        };
        Ok(PayloadWriter {
            root,
            barrier,
            made: HashSet::new(),
            dirs: BTreeSet::new(),
            dirs_durable: false,
            pending: Vec::new(),
            renamed: Vec::new(),
            pack: None,
            ids: Ids::new(),
            last: None,
        })
    }

    /// A new payload or pack id from this writer's source (for a payload
    /// file taken in by another way than writing it: a hard link).
    pub(crate) fn new_id(&mut self) -> String {
        self.ids.next_id()
    }

    /// [`prepare_payload_of`], remembering the result: a payload whose
    /// descr (as given), order, shape, dtype name, `pickled` and byte count
    /// equal the last one's has the same header and entry (every check
    /// depends on those and on the name being non-empty alone), so a batch
    /// of like records parses and renders each descr once, not three times
    /// a record.
    fn prepare(&mut self, src: &ArraySource<'_>, nbytes: u64) -> Result<(Vec<u8>, ArrayEntry)> {
        if let Some((descr, header, entry)) = &self.last {
            if !src.name.is_empty()
                && *descr == src.descr
                && entry.fortran_order == src.fortran_order
                && entry.shape == src.shape
                && entry.dtype == src.dtype
                && entry.pickled == src.pickled
                && entry.nbytes == nbytes
            {
                return Ok((header.clone(), entry.clone()));
            }
        }
        let (header, entry) = prepare_payload_of(src, nbytes)?;
        self.last = Some((src.descr.clone(), header.clone(), entry.clone()));
        Ok((header, entry))
    }

    /// Writes `src` as a new payload file and returns its entry. In barrier
    /// mode the file is not durable (nor renamed) until [`Self::finish`].
    pub(crate) fn write(&mut self, src: &ArraySource<'_>) -> Result<ArrayEntry> {
        let (header, entry) = self.prepare(src, src.data.len() as u64)?;
        if packable(&entry) {
            return self.write_member(&header, entry, src.data);
        }
        self.write_file(&header, entry, &mut |f, tmp, hasher| {
            fsio::write_all_with(f, tmp, header.len(), src.data, |piece| hasher.update(piece))
                .map_err(Error::io(tmp))
        })
    }

    /// [`Self::write`] for a payload whose `nbytes` data bytes are read from
    /// `data` (`src.data` is ignored), through `buf` (any size; pieces end
    /// on multiples of [`fsio::WRITE_CHUNK`] in the file when it is that
    /// large), so memory stays bounded whatever `nbytes`. The checksum is
    /// computed on the way.
    ///
    /// # Errors
    /// [`UsageError::InvalidArray`](crate::UsageError::InvalidArray) when `data` ends before `nbytes` bytes or
    /// has more; an error `data` returns is passed on as it is when it wraps
    /// an [`Error`] (`io::Error::other(Error::from(crate::InteropError::InvalidFile {..}))`), else as
    /// [`StorageError::Io`](crate::StorageError::Io) naming `source`. The temporary file is removed.
    pub(crate) fn write_from(
        &mut self,
        src: &ArraySource<'_>,
        nbytes: u64,
        data: &mut dyn Read,
        source: &Path,
        buf: &mut [u8],
    ) -> Result<ArrayEntry> {
        let (header, entry) = self.prepare(src, nbytes)?;
        let name = &src.name;
        if packable(&entry) {
            // small: read whole (at most READ_MAX_BYTES), then packed
            let mut bytes = vec![0u8; nbytes as usize];
            let got = read_up_to(data, &mut bytes).map_err(|e| source_error(e, source))?;
            let mut probe = [0u8; 1];
            let detail = if got < bytes.len() {
                format!("the data ended after {got} of {nbytes} bytes")
            } else if read_up_to(data, &mut probe).map_err(|e| source_error(e, source))? != 0 {
                format!("the data hold more than the {nbytes} bytes expected")
            } else {
                return self.write_member(&header, entry, &bytes);
            };
            return Err(Error::from(crate::UsageError::InvalidArray {
                name: name.clone(),
                detail,
            }));
        }
        self.write_file(&header, entry, &mut |f, tmp, hasher| {
            let mut at = header.len() as u64;
            let end = at + nbytes;
            while at < end {
                let room = fsio::WRITE_CHUNK as u64 - at % fsio::WRITE_CHUNK as u64;
                let want = room.min(end - at).min(buf.len() as u64) as usize;
                let got =
                    read_up_to(data, &mut buf[..want]).map_err(|e| source_error(e, source))?;
                if got == 0 {
                    return Err(Error::from(crate::UsageError::InvalidArray {
                        name: name.clone(),
                        detail: format!(
                            "the data ended after {} of {nbytes} bytes",
                            at - header.len() as u64
                        ),
                    }));
                }
                hasher.update(&buf[..got]);
                fsio::write_all(f, tmp, &buf[..got]).map_err(Error::io(tmp))?;
                at += got as u64;
            }
            let mut probe = [0u8; 1];
            if read_up_to(data, &mut probe).map_err(|e| source_error(e, source))? != 0 {
                return Err(Error::from(crate::UsageError::InvalidArray {
                    name: name.clone(),
                    detail: format!("the data hold more than the {nbytes} bytes expected"),
                }));
            }
            Ok(())
        })
    }

    /// Creates the temporary file of a new payload, writes `header`, lets
    /// `body` write the data (and feed the hasher), then makes the file
    /// durable and renames it (per-file mode) or queues it for
    /// [`Self::finish`] (barrier mode). Removes the file on error.
    fn write_file(
        &mut self,
        header: &[u8],
        entry: ArrayEntry,
        body: &mut dyn FnMut(&mut File, &Path, &mut xxhash_rust::xxh3::Xxh3) -> Result<()>,
    ) -> Result<ArrayEntry> {
        let id = self.ids.next_id();
        let dir = self.root.join(PAYLOAD_DIR).join(&id[..2]);
        if !self.made.contains(&dir) {
            fsio::create_dir_all(&dir).map_err(Error::io(&dir))?;
            self.made.insert(dir.clone());
        }
        let path = dir.join(format!("{id}.npy"));
        let tmp = dir.join(format!("{id}.npy{TMP_SUFFIX}"));
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let durable = self.barrier.is_none();
        let written = (|| {
            let mut f = fsio::create(&tmp).map_err(Error::io(&tmp))?;
            fsio::write_all(&mut f, &tmp, header).map_err(Error::io(&tmp))?;
            body(&mut f, &tmp, &mut hasher)?;
            if durable {
                fsio::sync_file(&f, &tmp).map_err(Error::io(&tmp))?;
                fsio::rename(&tmp, &path).map_err(Error::io(&tmp))?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            let _ = fsio::remove_file(&tmp);
            return Err(e);
        }
        if durable {
            self.renamed.push(path);
            self.dirs.insert(dir);
        } else {
            self.pending.push((tmp, path));
        }
        Ok(ArrayEntry {
            id,
            checksum: Some(format_checksum(hasher.digest())),
            ..entry
        })
    }

    /// Appends the payload of `entry` (its `header` and `data`) to this
    /// writer's pack under the same member id (a new one in the rare case
    /// that the pack has a member of its name), for a compaction; returns
    /// the entry with its new `pack`, `pack_offset` and perhaps `id`
    /// (checksum kept).
    pub(crate) fn write_packed(
        &mut self,
        header: &[u8],
        entry: &ArrayEntry,
        data: &[u8],
    ) -> Result<ArrayEntry> {
        let written = self.write_member_as(&entry.id, header, entry.clone(), data)?;
        Ok(ArrayEntry {
            checksum: entry.checksum.clone(),
            ..written
        })
    }

    /// Appends a small payload (`header` and `data`, see [`packable`]) to
    /// this writer's pack as member [`member_name`], its data 64-byte aligned
    /// in the pack; returns its entry with `pack` and `pack_offset`. The
    /// pack is written to `<pack>.npz.tmp` and made durable and renamed by
    /// [`Self::finish`].
    fn write_member(
        &mut self,
        header: &[u8],
        entry: ArrayEntry,
        data: &[u8],
    ) -> Result<ArrayEntry> {
        let id = self.ids.next_id();
        self.write_member_as(&id, header, entry, data)
    }

    /// [`Self::write_member`] under the member id `id`, or under a new
    /// random id when the pack already has a member of `id`'s name (two
    /// ids that start alike: member names hold only the start of an id).
    fn write_member_as(
        &mut self,
        id: &str,
        header: &[u8],
        entry: ArrayEntry,
        data: &[u8],
    ) -> Result<ArrayEntry> {
        let size = (header.len() + data.len()) as u64;
        let full = self
            .pack
            .as_ref()
            .is_some_and(|p| p.zip.position().saturating_add(size) > PACK_MAX_BYTES);
        if full {
            self.close_pack()?;
        }
        if self.pack.is_none() {
            self.pack = Some(self.open_pack()?);
        }
        let pack = self.pack.as_mut().expect("opened above");
        let mut id = id.to_owned();
        let mut name = member_name(&id);
        while pack.names.contains(&name) {
            id = self.ids.next_id();
            name = member_name(&id);
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(header);
        crc.update(data);
        let tmp = &pack.tmp;
        let zip = &mut pack.zip;
        zip.begin(&name, size, true, Some(crc.finalize()))
            .map_err(Error::io(tmp))?;
        pack.names.insert(name);
        let offset = zip.position();
        zip.write(header)
            .and_then(|()| zip.write(data))
            .and_then(|()| zip.end())
            .map_err(Error::io(tmp))?;
        Ok(ArrayEntry {
            id,
            checksum: Some(checksum(data)),
            pack: Some(pack.id.clone()),
            pack_offset: Some(offset),
            ..entry
        })
    }

    /// Creates the temporary file of a new pack.
    fn open_pack(&mut self) -> Result<PackOut> {
        let id = self.ids.next_id();
        let dir = self.root.join(PAYLOAD_DIR).join(&id[..2]);
        if !self.made.contains(&dir) {
            fsio::create_dir_all(&dir).map_err(Error::io(&dir))?;
            self.made.insert(dir.clone());
        }
        let path = dir.join(format!("{id}.npz"));
        let tmp = dir.join(format!("{id}.npz{TMP_SUFFIX}"));
        let file = fsio::create(&tmp).map_err(Error::io(&tmp))?;
        let out = FaultFile {
            file,
            path: tmp.clone(),
        };
        let zip =
            StoredZipWriter::new(BufWriter::with_capacity(1 << 20, out), ZipLimits::default())
                .map(|zip| zip.central_padding(legacy::names()))
                .map_err(Error::io(&tmp));
        match zip {
            Ok(zip) => Ok(PackOut {
                id,
                tmp,
                path,
                zip,
                names: HashSet::new(),
            }),
            Err(e) => {
                let _ = fsio::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Writes the open pack's central directory; then, per file, fsyncs
    /// and renames it into place, or in barrier mode queues it for
    /// [`Self::finish`]'s `syncfs`. The temporary file is removed on error.
    fn close_pack(&mut self) -> Result<()> {
        let Some(pack) = self.pack.take() else {
            return Ok(());
        };
        let tmp = pack.tmp;
        let durable = self.barrier.is_none();
        let written = (|| {
            let buffered = pack.zip.finish().map_err(Error::io(&tmp))?;
            let file = buffered
                .into_inner()
                .map_err(|e| Error::io(&tmp)(e.into_error()))?
                .file;
            if durable {
                fsio::sync_file(&file, &tmp).map_err(Error::io(&tmp))?;
                fsio::rename(&tmp, &pack.path).map_err(Error::io(&tmp))?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            let _ = fsio::remove_file(&tmp);
            return Err(e);
        }
        let dir = pack
            .path
            .parent()
            .expect("a pack has a directory")
            .to_owned();
        if durable {
            self.renamed.push(pack.path);
            self.dirs.insert(dir);
        } else {
            self.pending.push((tmp, pack.path));
        }
        Ok(())
    }

    /// Makes the files written in barrier mode durable (one `syncfs`),
    /// renames them into place and, if they went into more than
    /// [`BARRIER_MIN_FILES`] directories, makes the renames durable with a
    /// second `syncfs` instead of one fsync per directory. Per-file mode has
    /// nothing left to do.
    pub(crate) fn finish(&mut self) -> Result<()> {
        self.close_pack()?;
        if self.pending.is_empty() {
            return Ok(());
        }
        self.barrier()?;
        while let Some((tmp, path)) = self.pending.pop() {
            if let Err(e) = fsio::rename(&tmp, &path) {
                self.pending.push((tmp.clone(), path));
                return Err(Error::io(&tmp)(e));
            }
            let dir = path.parent().expect("a payload path has a directory");
            self.dirs.insert(dir.to_owned());
            self.renamed.push(path);
        }
        if self.dirs.len() >= BARRIER_MIN_FILES {
            self.barrier()?;
            self.dirs_durable = true;
        }
        Ok(())
    }

    /// `syncfs` on the store's file system (barrier mode only).
    fn barrier(&self) -> Result<()> {
        #[cfg(target_os = "linux")]
        if let Some(fs) = &self.barrier {
            fsio::sync_fs(fs, self.root).map_err(Error::io(self.root))?;
        }
        Ok(())
    }

    /// Removes every file written (best effort: a file left behind is an
    /// orphan that `gc()` removes, never a loss).
    pub(crate) fn abort(self) {
        if let Some(pack) = self.pack {
            // the zip writer holds the file: dropped (closed) before the unlink
            let tmp = pack.tmp;
            drop(pack.zip);
            let _ = fsio::remove_file(&tmp);
        }
        for (tmp, _) in &self.pending {
            let _ = fsio::remove_file(tmp);
        }
        for path in &self.renamed {
            let _ = fsio::remove_file(path);
        }
    }
}

/// Refuses two arrays of the same name among `arrays` (a record's arrays
/// are keyed by name) with [`UsageError::InvalidArray`](crate::UsageError::InvalidArray).
pub(crate) fn check_unique_names(arrays: &[ArraySource<'_>]) -> Result<()> {
    let mut names = std::collections::HashSet::with_capacity(arrays.len());
    match arrays.iter().find(|src| !names.insert(&src.name)) {
        Some(src) => Err(crate::UsageError::InvalidArray {
            name: src.name.clone(),
            detail: "two arrays with the same name".into(),
        }
        .into()),
        None => Ok(()),
    }
}

/// Reads into `buf` until it is full or `r` ends; the count read.
fn read_up_to(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// An error of a payload's source reader: the [`Error`] it wraps, or an
/// I/O error on `source`.
pub(crate) fn source_error(e: std::io::Error, source: &Path) -> Error {
    if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
        if let Some(inner) = e.into_inner() {
            if let Ok(err) = inner.downcast::<Error>() {
                return *err;
            }
        }
        unreachable!("checked to wrap an Error");
    }
    Error::from(crate::StorageError::Io {
        path: source.to_owned(),
        source: e,
    })
}

/// The checksum recorded for a payload's data bytes: `"xxh3-64:"` and the
/// 64-bit XXH3 hash as 16 lowercase hex digits (FORMAT.md).
pub(crate) fn checksum(data: &[u8]) -> String {
    format_checksum(xxhash_rust::xxh3::xxh3_64(data))
}

fn format_checksum(hash: u64) -> String {
    let mut text = String::with_capacity(CHECKSUM_PREFIX.len() + 16);
    text.push_str(CHECKSUM_PREFIX);
    push_hex(&mut text, hash);
    text
}

/// The algorithm tag of [`checksum`].
pub(crate) const CHECKSUM_PREFIX: &str = "xxh3-64:";

/// fsyncs a directory so that the renames and creations in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    fsio::sync_dir(dir).map_err(Error::io(dir))
}

/// Payloads of at most this many data bytes are read into memory by
/// [`load_payload`]; larger ones are memory-mapped.
///
/// Measured (warm page cache, open + read + summing every byte): reading
/// is about 2x faster than mapping up to 64 KiB, about even from 128 to
/// 256 KiB, and mapping wins above. Copying small arrays also bounds the
/// number of mappings a process holds: the kernel refuses mappings past
/// `vm.max_map_count` (65,530 by default), so holding 100,000 mapped tiny
/// arrays would fail, whereas mapped arrays are each over 64 KiB (65,530
/// of them are over 4 GiB).
pub const READ_MAX_BYTES: u64 = 64 * 1024;

/// The alignment of the data of a payload read into memory, in bytes
/// (numpy's own `.npy` data alignment, and the alignment of a mapping's
/// data: its header is a multiple of 64 bytes).
pub(crate) const DATA_ALIGN: usize = 64;

/// Where the bytes of a [`MappedPayload`] live.
enum Bytes {
    /// A zero-size array: nothing read or mapped (POSIX cannot map 0 bytes).
    Empty,
    /// A small payload read into memory (its data starts `DATA_ALIGN`-aligned).
    Owned(Vec<u8>),
    /// A large payload, memory-mapped read-only.
    Mapped(Mmap),
}

/// The data bytes of one payload, read-only: read into an owned, 64-byte
/// aligned buffer when at most [`READ_MAX_BYTES`] long, memory-mapped
/// (shared with every process mapping the same file) when longer.
pub struct MappedPayload {
    bytes: Bytes,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for MappedPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedPayload")
            .field("len", &self.len)
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl MappedPayload {
    /// The array's bytes: `nbytes` of them.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Empty => &[],
            Bytes::Owned(v) => &v[self.offset..self.offset + self.len],
            Bytes::Mapped(m) => &m[self.offset..self.offset + self.len],
        }
    }

    /// Whether the bytes are a memory map of the payload file (`false`:
    /// copied into memory, or a zero-size array).
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped(_))
    }
}

/// A zeroed buffer for `total` bytes read from a file, and where they
/// start in it: `DATA_ALIGN`-aligned, so that data at a multiple of
/// `DATA_ALIGN` past the start is too. A plain allocation with room to
/// align in: an aligned one (`posix_memalign`) costs several times as much
/// per small read. The `Vec` is never grown, so the start never moves.
fn aligned_buffer(total: usize) -> (Vec<u8>, usize) {
    let buf = vec![0u8; total + DATA_ALIGN - 1];
    let start = (DATA_ALIGN - buf.as_ptr() as usize % DATA_ALIGN) % DATA_ALIGN;
    (buf, start)
}

/// Checks that a payload's `.npy` header says what its record says (dtype,
/// shape, order, data offset and, unless pickled, byte count); returns the
/// disagreement as text. Shared by payload files and archive members.
pub(crate) fn check_header_matches(
    header: &npy::NpyHeader,
    entry: &ArrayEntry,
) -> std::result::Result<(), String> {
    if header.descr != entry.descr
        || header.shape != entry.shape
        || header.fortran_order != entry.fortran_order
        || header.data_offset != entry.data_offset
    {
        return Err(format!(
            "header (descr {}, shape {:?}, fortran_order {}, data at {}) does not match \
             the record (descr {}, shape {:?}, fortran_order {}, data at {})",
            header.descr,
            header.shape,
            header.fortran_order,
            header.data_offset,
            entry.descr,
            entry.shape,
            entry.fortran_order,
            entry.data_offset
        ));
    }
    if !entry.pickled && header.nbytes() != Some(entry.nbytes) {
        let implied = header.nbytes().map_or_else(
            || "no size (an unknown itemsize, or over 2^64)".to_owned(),
            |n| n.to_string(),
        );
        return Err(format!(
            "record says {} bytes, header implies {implied}",
            entry.nbytes
        ));
    }
    Ok(())
}

/// The header-length limit for reading the payload of `entry`: numpy's
/// default, or more when the store wrote a longer header for the entry's
/// dtype (its data offset, recorded in the index, bounds the header). The
/// reader never sizes a buffer from it beyond what the file holds.
pub(crate) fn header_limit(entry: &ArrayEntry) -> usize {
    usize::try_from(entry.data_offset)
        .unwrap_or(usize::MAX)
        .max(npy::NUMPY_MAX_HEADER_LEN)
}

/// Opens the payload of `entry` under `root` and checks it before any
/// mapping: the id is well-formed, the `.npy` header agrees with the record,
/// and the file holds all the data (a short file is an error, never SIGBUS).
///
/// For a packed payload (a member of a pack, see
/// [`ArrayEntry::pack`]) the file is the pack; the returned file is then
/// positioned at the member's `.npy` bytes ([`ArrayEntry::npy_start`]),
/// otherwise after the header.
pub fn open_payload(root: &Path, entry: &ArrayEntry) -> Result<(File, PathBuf)> {
    let (mut file, path) = open_entry_file(root, entry)?;
    let start = entry.npy_start();
    if start > 0 {
        file.seek(SeekFrom::Start(start))
            .map_err(Error::io(&path))?;
    }
    check_header(
        npy::read_header(&mut file, header_limit(entry)),
        entry,
        &path,
    )?;
    let file_len = file.metadata().map_err(Error::io(&path))?.len();
    let end = entry
        .data_offset
        .checked_add(entry.nbytes)
        .and_then(|n| n.checked_add(start))
        .ok_or_else(|| {
            Error::corrupt(format!("payload {}", path.display()), "size overflows").with_path(&path)
        })?;
    check_length(file_len, end, &path)?;
    if start > 0 {
        file.seek(SeekFrom::Start(start))
            .map_err(Error::io(&path))?;
    }
    Ok((file, path))
}

/// Opens the payload file of `entry` under `root` once the entry's id (which
/// names the path) and data offset are checked.
fn open_entry_file(root: &Path, entry: &ArrayEntry) -> Result<(File, PathBuf)> {
    let path = entry_path(root, entry)?;
    let file = open_existing(&path)?;
    Ok((file, path))
}

/// The path of the payload file (or pack) of `entry` under `root`, once the
/// entry's id (which names the path) and data offset are checked.
fn entry_path(root: &Path, entry: &ArrayEntry) -> Result<PathBuf> {
    // The array's path is not known here: callers name it (with_array, or
    // the Python layer's "record 'k' array 'x': ...").
    entry
        .check()
        .map_err(|p| Error::corrupt("array entry", p))?;
    // numpy could not hold it (a record written before import refused such
    // shapes): a damaged record, not numpy's ValueError at the reader
    if let Some(problem) = npy::numpy_refuses(&entry.descr, &entry.shape) {
        return Err(Error::corrupt("array entry", problem));
    }
    Ok(root.join(entry.relpath()))
}

/// Checks the header read from the payload file at `path` against `entry`.
fn check_header(
    header: std::result::Result<npy::NpyHeader, npy::NpyError>,
    entry: &ArrayEntry,
    path: &Path,
) -> Result<()> {
    let what = || format!("payload {}", path.display());
    let header = header.map_err(|e| Error::npy(what(), e).with_path(path))?;
    check_header_matches(&header, entry)
        .map_err(|detail| Error::corrupt(what(), detail).with_path(path))
}

/// Refuses a payload file at `path` of `len` bytes when the array needs
/// `needed`: a short file is an error, never SIGBUS.
fn check_length(len: u64, needed: u64, path: &Path) -> Result<()> {
    if len < needed {
        return Err(Error::corrupt(
            format!("payload {}", path.display()),
            format!("file is truncated: {len} bytes, the array needs {needed}"),
        )
        .with_path(path));
    }
    Ok(())
}

/// The data of `entry` read-only, after [`open_payload`]'s checks: read
/// into memory when `nbytes` is at most [`READ_MAX_BYTES`], memory-mapped
/// otherwise. A payload file is closed before this returns in both cases
/// (a mapping does not need it), so holding many arrays holds no fds; a
/// pack (of a small payload) stays open for the next reads of its members,
/// a few at most per process (see `open_packs`).
///
/// Errors: [`Error::Corrupt`] for a bad id, a missing or short file or a
/// header that disagrees with the record; [`StorageError::Io`](crate::StorageError::Io) when the file
/// cannot be read or mapped.
pub fn load_payload(root: &Path, entry: &ArrayEntry) -> Result<MappedPayload> {
    if entry.is_packed() {
        return load_member(root, entry, true);
    }
    load_unpacked(root, entry)
}

/// [`load_payload`] from the file as it is on disk now: a pack is opened
/// for this read, never served by a descriptor kept open (see
/// `open_packs`) of a pack removed since (for `verify`).
pub(crate) fn load_payload_from_disk(root: &Path, entry: &ArrayEntry) -> Result<MappedPayload> {
    if entry.is_packed() {
        return load_member(root, entry, false);
    }
    load_unpacked(root, entry)
}

fn load_unpacked(root: &Path, entry: &ArrayEntry) -> Result<MappedPayload> {
    // A header past numpy's default (a dtype of hundreds of fields) goes
    // the mapped way, which checks the file's length before reading it.
    let long_header = entry.data_offset > (npy::NUMPY_MAX_HEADER_LEN + DATA_ALIGN) as u64;
    if entry.nbytes == 0 || entry.nbytes > READ_MAX_BYTES || long_header {
        return map_payload(root, entry);
    }
    let (mut file, path) = open_entry_file(root, entry)?;
    let too_big = || {
        Error::corrupt(format!("payload {}", path.display()), "header too large").with_path(&path)
    };
    // One read of header and data: the header is parsed from the buffer,
    // and the data lands DATA_ALIGN-aligned (`validate` checked that
    // data_offset is a multiple of 64).
    let offset = usize::try_from(entry.data_offset).map_err(|_| too_big())?;
    if offset > npy::NUMPY_MAX_HEADER_LEN + DATA_ALIGN {
        return Err(too_big());
    }
    let len = entry.nbytes as usize; // at most READ_MAX_BYTES
    let total = offset + len;
    let (mut owned, at) = aligned_buffer(total);
    let buf = &mut owned[at..at + total];
    let got = read_up_to(&mut file, buf).map_err(Error::io(&path))?;
    check_header(
        npy::read_header(&mut &buf[..got], npy::NUMPY_MAX_HEADER_LEN),
        entry,
        &path,
    )?;
    check_length(got as u64, total as u64, &path)?;
    Ok(MappedPayload {
        bytes: Bytes::Owned(owned),
        offset: at + offset,
        len,
    })
}

/// Memory-maps the data of `entry` read-only after [`open_payload`]'s
/// checks, whatever its size (see [`load_payload`], which copies small
/// payloads instead). The file descriptor is closed before this returns.
///
/// A packed payload is small: it is read into memory as
/// [`load_payload`] reads it (one `pread` of its header and data).
pub fn map_payload(root: &Path, entry: &ArrayEntry) -> Result<MappedPayload> {
    if entry.is_packed() {
        return load_member(root, entry, true);
    }
    let (file, path) = open_payload(root, entry)?;
    if entry.nbytes == 0 {
        return Ok(MappedPayload {
            bytes: Bytes::Empty,
            offset: 0,
            len: 0,
        });
    }
    let too_big = || {
        Error::corrupt(format!("payload {}", path.display()), "too large to map").with_path(&path)
    };
    let offset = usize::try_from(entry.data_offset).map_err(|_| too_big())?;
    let len = usize::try_from(entry.nbytes).map_err(|_| too_big())?;
    // SAFETY: payload files are immutable once renamed into place and never
    // truncated by lazyvault (invariant 2); the length was checked above.
    let map =
        unsafe { MmapOptions::new().len(offset + len).map(&file) }.map_err(Error::io(&path))?;
    Ok(MappedPayload {
        bytes: Bytes::Mapped(map),
        offset,
        len,
    })
}

/// Opens the payload file at `path`; a missing file is corruption. Whether
/// the record read was stale or the store is damaged is not known here
/// (see [`Store::missing_payload_hint`](crate::Store::missing_payload_hint)).
fn open_existing(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::corrupt(format!("payload {}", path.display()), "file is missing").with_path(path)
        } else {
            crate::StorageError::Io {
                path: path.to_owned(),
                source: e,
            }
            .into()
        }
    })
}

/// Reads the data of a payload into memory (used for pickled payloads,
/// which are unpickled anyway, so mapping them gains nothing).
pub fn read_payload(root: &Path, entry: &ArrayEntry) -> Result<Vec<u8>> {
    if entry.is_packed() {
        return load_member(root, entry, true).map(|m| m.as_bytes().to_vec());
    }
    let (mut file, path) = open_payload(root, entry)?;
    let len = usize::try_from(entry.nbytes).map_err(|_| {
        Error::corrupt(format!("payload {}", path.display()), "too large").with_path(&path)
    })?;
    let mut data = vec![0u8; len];
    file.seek(SeekFrom::Start(entry.data_offset))
        .and_then(|_| file.read_exact(&mut data))
        .map_err(Error::io(&path))?;
    Ok(data)
}

/// Reads a packed payload (a member of a pack) into memory: one `pread` of
/// the member's `.npy` bytes (`pack_offset .. pack_offset + data_offset +
/// nbytes`), header checked against the entry as for a payload file, data
/// landing 64-byte aligned. A member is never larger than
/// [`MAX_PACKED_HEADER`] plus [`READ_MAX_BYTES`]; an entry saying more is
/// damage (nothing is allocated from it). With `keep`, the pack is kept
/// open for the next reads, or read from a descriptor kept open (packs are
/// immutable, see `open_packs`).
fn load_member(root: &Path, entry: &ArrayEntry, keep: bool) -> Result<MappedPayload> {
    // The checks of `entry_path`; the path itself is made only to open
    // the pack or to name it in an error (a kept pack is found by id).
    entry
        .check()
        .map_err(|p| Error::corrupt("array entry", p))?;
    if let Some(problem) = npy::numpy_refuses(&entry.descr, &entry.shape) {
        return Err(Error::corrupt("array entry", problem));
    }
    let pack = entry.pack.as_deref().unwrap_or_default();
    let path = || root.join(entry.relpath());
    let file = if keep {
        open_packs::open(root, pack, || open_existing(&path()))?
    } else {
        std::sync::Arc::new(open_existing(&path())?)
    };
    if !packable(entry) {
        let path = path();
        return Err(Error::corrupt(
            format!("payload {}", path.display()),
            format!(
                "a packed payload is at most {READ_MAX_BYTES} data bytes after a header of at \
                 most {MAX_PACKED_HEADER}, not pickled; the record says {} after {}{}",
                entry.nbytes,
                entry.data_offset,
                if entry.pickled { ", pickled" } else { "" }
            ),
        )
        .with_path(&path));
    }
    let offset = entry.data_offset as usize; // at most MAX_PACKED_HEADER
    let len = entry.nbytes as usize; // at most READ_MAX_BYTES
    let total = offset + len;
    let (mut owned, at) = aligned_buffer(total);
    let buf = &mut owned[at..at + total];
    let start = entry.npy_start();
    let got = pread_up_to(&file, buf, start).map_err(|e| Error::io(path())(e))?;
    let whole = start.saturating_add(got as u64) >= start.saturating_add(total as u64);
    let fine = whole
        && (AcceptedHeader::is(&buf[..offset], entry) || {
            let header = npy::read_header(&mut &buf[..got], header_limit(entry));
            let ok = header.is_ok_and(|h| check_header_matches(&h, entry).is_ok());
            if ok {
                AcceptedHeader::remember(&buf[..offset], entry);
            }
            ok
        });
    if !fine {
        let path = path();
        if got < total {
            // the pack ends inside (or before) the member: say that, not
            // what the cut happened to leave of its .npy header
            let len = file
                .metadata()
                .map_or(start.saturating_add(got as u64), |m| m.len());
            return Err(Error::corrupt(
                format!("pack {}", path.display()),
                format!(
                    "the file is truncated: {len} bytes, but its member at offset {start} needs \
                     {} (its .npy header and data)",
                    start.saturating_add(total as u64)
                ),
            )
            .with_path(&path));
        }
        // The checks again, for their errors naming the pack.
        let header = npy::read_header(&mut &buf[..got], header_limit(entry));
        check_header(header, entry, &path)?;
        check_length(
            start.saturating_add(got as u64),
            start.saturating_add(total as u64),
            &path,
        )?;
    }
    Ok(MappedPayload {
        bytes: Bytes::Owned(owned),
        offset: at + offset,
        len,
    })
}

/// The last `.npy` header this thread's reads of pack members accepted
/// for an entry, and the fields of that entry it was checked against.
/// Checking a header is a pure function of its bytes (the first
/// `data_offset` of the member: a header that passes is exactly that long)
/// and of these fields, so the same bytes for the same fields pass again
/// without parsing: the members of a pack written together mostly share
/// one header.
struct AcceptedHeader {
    bytes: Vec<u8>,
    descr: String,
    shape: Vec<u64>,
    fortran_order: bool,
    nbytes: u64,
    pickled: bool,
}

thread_local! {
    static ACCEPTED: std::cell::RefCell<Option<AcceptedHeader>> =
        const { std::cell::RefCell::new(None) };
}

impl AcceptedHeader {
    /// Whether `header` (a member's first `entry.data_offset` bytes) was
    /// accepted last for an entry of the same fields.
    fn is(header: &[u8], entry: &ArrayEntry) -> bool {
        ACCEPTED
            .try_with(|a| {
                a.try_borrow().is_ok_and(|a| {
                    a.as_ref().is_some_and(|a| {
                        a.bytes == header
                            && a.descr == entry.descr
                            && a.shape == entry.shape
                            && a.fortran_order == entry.fortran_order
                            && a.nbytes == entry.nbytes
                            && a.pickled == entry.pickled
                    })
                })
            })
            .unwrap_or(false)
    }

    /// Remembers `header` as accepted for `entry` (after its checks).
    fn remember(header: &[u8], entry: &ArrayEntry) {
        let _ = ACCEPTED.try_with(|a| {
            if let Ok(mut a) = a.try_borrow_mut() {
                *a = Some(AcceptedHeader {
                    bytes: header.to_vec(),
                    descr: entry.descr.clone(),
                    shape: entry.shape.clone(),
                    fortran_order: entry.fortran_order,
                    nbytes: entry.nbytes,
                    pickled: entry.pickled,
                });
            }
        });
    }
}

/// Reads into `buf` from offset `at` of `file` until `buf` is full or the
/// file ends (one `pread` in the common case); the count read.
fn pread_up_to(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    #[cfg(unix)]
    use std::os::unix::fs::FileExt;
    #[cfg(not(unix))]
    let read_at = |buf: &mut [u8], at: u64| {
        let mut f = file;
        f.seek(SeekFrom::Start(at))?;
        f.read(buf)
    };
    #[cfg(unix)]
    let read_at = |buf: &mut [u8], at: u64| file.read_at(buf, at);
    let mut got = 0;
    while got < buf.len() {
        match read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::check_header_matches;
    use crate::npy::NpyHeader;
    use lazyvault_schema::ArrayEntry;

    #[test]
    fn a_size_mismatch_says_the_sizes_in_words() {
        let header = |shape: Vec<u64>| NpyHeader {
            version: (1, 0),
            descr: "'<f8'".into(),
            fortran_order: false,
            shape,
            data_offset: 128,
        };
        let entry = ArrayEntry {
            id: "abcdef00112233445566778899aabbcc".into(),
            descr: "'<f8'".into(),
            dtype: "float64".into(),
            shape: vec![4],
            fortran_order: false,
            nbytes: 8,
            data_offset: 128,
            checksum: None,
            pickled: false,
            pack: None,
            pack_offset: None,
        };
        let e = check_header_matches(&header(vec![4]), &entry).unwrap_err();
        assert!(e.ends_with("record says 8 bytes, header implies 32"), "{e}");
        // a size past u64: words, not Rust's `None` (a trial saw `Some(80)`)
        let mut huge = entry.clone();
        huge.shape = vec![u64::MAX / 2];
        let e = check_header_matches(&header(vec![u64::MAX / 2]), &huge).unwrap_err();
        assert!(e.contains("header implies no size"), "{e}");
        assert!(!e.contains("Some") && !e.contains("None"), "{e}");
    }
}

#[cfg(test)]
mod pack_names {
    use std::io::Read;

    use super::{prepare_payload, ArraySource, PayloadWriter};

    /// Two members whose ids start alike (the same first 24 digits, the
    /// part in a member name): the second gets a new id, and the pack
    /// names each member once.
    #[test]
    fn a_member_name_taken_in_the_pack_gets_a_new_id() {
        let dir = tempfile::tempdir().unwrap();
        let data = [7u8; 40];
        let src = ArraySource {
            name: "x".into(),
            descr: "'|u1'".into(),
            dtype: "uint8".into(),
            shape: vec![40],
            fortran_order: false,
            data: &data,
            pickled: false,
        };
        let (header, entry) = prepare_payload(&src).unwrap();
        let mut writer = PayloadWriter::new(dir.path(), 1).unwrap();
        let ids = [
            "0123456789abcdef01234567aaaaaaaa",
            "0123456789abcdef01234567bbbbbbbb",
        ];
        let written: Vec<_> = ids
            .iter()
            .map(|id| {
                let entry = lazyvault_schema::ArrayEntry {
                    id: (*id).into(),
                    ..entry.clone()
                };
                writer.write_packed(&header, &entry, &data).unwrap()
            })
            .collect();
        writer.finish().unwrap();
        assert_eq!(written[0].id, ids[0]);
        assert_ne!(written[1].id[..24], ids[0][..24]);
        assert_eq!(written[1].id.len(), 32);
        let pack = dir.path().join(written[0].relpath());
        let mut zip = zip::ZipArchive::new(std::fs::File::open(pack).unwrap()).unwrap();
        let names: Vec<String> = (0..zip.len())
            .map(|i| zip.by_index_raw(i).unwrap().name().unwrap().into_owned())
            .collect();
        let want: Vec<String> = written
            .iter()
            .map(|e| format!("{}.npy", &e.id[..24]))
            .collect();
        assert_eq!(names, want);
        for (i, e) in written.iter().enumerate() {
            let mut member = zip.by_index(i).unwrap();
            assert_eq!(member.data_start().unwrap(), e.pack_offset.unwrap());
            let mut bytes = Vec::new();
            member.read_to_end(&mut bytes).unwrap();
            assert_eq!(&bytes[e.data_offset as usize..], &data[..]);
        }
    }
}

#[cfg(test)]
mod ids {
    use std::collections::HashSet;

    use super::Ids;

    fn is_id(id: &str) -> bool {
        id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }

    /// The halves are `mix(a + n)` and `mix(b + n)` as 16 hex digits each
    /// (zero-padded): the same digits `format!` writes.
    #[test]
    fn ids_are_the_mixed_counter_in_hex() {
        let mut ids = Ids::from_seed(u64::MAX, 7);
        for n in 0..3u64 {
            let want = format!(
                "{:016x}{:016x}",
                super::mix64(u64::MAX.wrapping_add(n)),
                super::mix64(7 + n)
            );
            assert_eq!(ids.next_id(), want);
        }
        for hash in [0, 1, 0xabc, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(super::format_checksum(hash), format!("xxh3-64:{hash:016x}"));
        }
        assert_eq!(
            super::member_name("0123456789abcdef0123456789abcdef"),
            "0123456789abcdef01234567.npy"
        );
        // mix(0) is 0: the zero padding shows
        assert_eq!(
            super::hex_id(0, 1),
            "00000000000000000000000000000001".to_owned()
        );
    }

    /// One source's ids: the pattern, no repeated first 16 digits (so no
    /// two pack members of one writer share a name), every `arrays/<xx>`
    /// directory used; another source shares none of them.
    #[test]
    fn one_source_never_repeats_and_spreads_over_the_fan_out() {
        for (a, b) in [(0, 0), (u64::MAX - 10, 3), (0x0123_4567_89ab_cdef, 1)] {
            let mut ids = Ids::from_seed(a, b);
            let mut starts = HashSet::new();
            let mut dirs = HashSet::new();
            for _ in 0..100_000 {
                let id = ids.next_id();
                assert!(is_id(&id), "{id}");
                assert!(starts.insert(id[..16].to_owned()), "{id} repeats");
                dirs.insert(id[..2].to_owned());
            }
            assert_eq!(dirs.len(), 256);
        }
        let (mut x, mut y) = (Ids::new(), Ids::new());
        let xs: HashSet<String> = (0..1000).map(|_| x.next_id()).collect();
        assert!((0..1000).all(|_| !xs.contains(&y.next_id())));
    }
}

#[cfg(test)]
mod prepared {
    use super::{prepare_payload, ArraySource, PayloadWriter};

    /// A writer reuses the last header and entry only for a payload of the
    /// same description and size: each of these differs from the first in
    /// one thing, and gets what preparing it alone gives (or its error).
    #[test]
    fn the_last_header_is_reused_only_for_the_same_description() {
        let dir = tempfile::tempdir().unwrap();
        let data = [0u8; 64];
        let base = ArraySource {
            name: "x".into(),
            descr: "'<f8'".into(),
            dtype: "float64".into(),
            shape: vec![8],
            fortran_order: false,
            data: &data,
            pickled: false,
        };
        let variants = [
            base.clone(),
            ArraySource {
                name: "y".into(),
                ..base.clone()
            },
            ArraySource {
                descr: "'>f8'".into(),
                ..base.clone()
            },
            ArraySource {
                descr: "  '<f8'".into(),
                ..base.clone()
            },
            ArraySource {
                dtype: "something".into(),
                ..base.clone()
            },
            ArraySource {
                shape: vec![2, 4],
                ..base.clone()
            },
            ArraySource {
                shape: vec![2, 4],
                fortran_order: true,
                ..base.clone()
            },
            ArraySource {
                pickled: true,
                ..base.clone()
            },
            ArraySource {
                data: &data[..32],
                shape: vec![4],
                ..base.clone()
            },
            // errors: each after a success of the same description
            ArraySource {
                name: String::new(),
                ..base.clone()
            },
            base.clone(),
            ArraySource {
                data: &data[..32],
                ..base.clone()
            },
            base.clone(),
            ArraySource {
                shape: vec![4],
                ..base.clone()
            },
        ];
        let mut writer = PayloadWriter::new(dir.path(), 1).unwrap();
        for src in &variants {
            let alone = prepare_payload(src);
            let nbytes = src.data.len() as u64;
            match (writer.prepare(src, nbytes), alone) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{src:?}"),
                (Err(got), Err(want)) => assert_eq!(got.to_string(), want.to_string()),
                (got, want) => panic!("{src:?}: {got:?} but alone {want:?}"),
            }
        }
        writer.abort();
    }
}
