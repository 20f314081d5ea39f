//! Importing the array files users already have: `.npy`, `.npz`,
//! `.safetensors` and lazyvault's `.lvz` archives (read with
//! [`crate::archive`]; their records are copied at record level, metadata,
//! layout, arrays and pickled remainder as bytes, so importing never
//! unpickles). The format is detected from the content ([`detect_format`]),
//! not the name. Each format's byte layout and checks are in its module:
//! [`npy`], [`npz`] (with [`zip`]), [`safetensors`]; what export writes is
//! in [`export`].
//!
//! An import of one file or of many ([`import_files`], a directory in the
//! Python layer) runs in two phases:
//!
//! 1. **Plan** (nothing written): every file is opened and checked whole,
//!    one after the other — the `.npy` headers of a file or of every `.npz`
//!    member (with [`crate::npy`]), the zip directory and each member's
//!    declared sizes against what its header implies and against a
//!    decompression-ratio cap, lazyvault's own `.npz` manifest, a
//!    `.safetensors` header whole, an `.lvz` archive's directory, records,
//!    array headers and CRC-32s; shapes numpy cannot hold
//!    ([`crate::npy::numpy_refuses`]); then the keys of all files together (two
//!    files giving one key:
//!    [`InteropError::KeyCollision`](crate::InteropError::KeyCollision)).
//!    The result is a list of records whose arrays say where their bytes
//!    are.
//! 2. **Stage and commit**: each array is streamed from its file straight
//!    into a payload file of one [`Store::put_staged`]: a stored member, an
//!    archive member or a `.npy`/`.safetensors` range is copied, a deflated
//!    member inflated, through one 4 MiB buffer whatever the size, checking
//!    the zip's CRC-32 and stopping at once when a member inflates past its
//!    declared size. The records of every file are committed together; a
//!    failure (a CRC mismatch found while copying, a file changed since it
//!    was checked, a full disk) removes every staged file, so a rejected
//!    import leaves the store as it was, whatever the number of files.
//!
//! So an import holds one descriptor for the file being copied (whatever
//! the number of members) plus the payload being written, and memory
//! bounded by a few MiB plus the zip directories and the records' metadata
//! (an `.lvz` is memory-mapped); staged payloads are files on disk.
//!
//! What each format becomes (the record the Python layer's splitting of the
//! same dict would give, see `flat_record`): a `.npy` is one record
//! `{"data": array}`; a foreign `.npz` one record `{member name without
//! ".npy": array}`; lazyvault's `.npz` (with the [`NPZ_MANIFEST`] member) a
//! record per manifest entry under its own key; a `.safetensors` file one
//! record `{tensor name: array}` plus its `"__metadata__"` map (when not
//! empty) and, for raw-bit tensors (BF16, F8), `"safetensors_dtypes"`, or,
//! when lazyvault exported it from several records, those records under
//! their own keys; an `.lvz` its records under their own keys.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use lazyvault_schema::ArrayEntry;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::payload::source_error;
use crate::{ArraySource, Stage, StagedRecord, Store};

pub mod export;
pub(crate) mod json;
mod lvz;
pub mod npy;
pub mod npz;
pub mod safetensors;
pub mod zip;

/// Largest `.npy` header read by default, in bytes (numpy's own
/// `max_header_size` default, [`crate::npy::NUMPY_MAX_HEADER_LEN`]).
pub const DEFAULT_MAX_HEADER_SIZE: usize = crate::npy::NUMPY_MAX_HEADER_LEN;

/// Largest expansion accepted from a deflated member, uncompressed size
/// over compressed size: deflate cannot expand more than about 1032:1, so a
/// member declaring more lies (a decompression bomb).
pub const DEFAULT_MAX_DEFLATE_RATIO: u64 = 1100;

/// The `.npz` member holding lazyvault's record metadata: a JSON object
/// `{"format": "lazyvault-npz", "version": 1, "records": [...]}`, each
/// record giving its key, metadata, layout and `{array path: member name}`
/// (see [`npz`]).
pub const NPZ_MANIFEST: &str = "__lazyvault__.json";

/// The format of a file to import, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `\x93NUMPY`: one `.npy` array.
    Npy,
    /// A zip without lazyvault's archive manifest: `np.savez` output (or
    /// lazyvault's own `.npz` export).
    Npz,
    /// An 8-byte little-endian header length, then a JSON object.
    Safetensors,
    /// A zip holding [`crate::archive::MANIFEST_MEMBER`]: a lazyvault archive.
    Lvz,
}

impl Format {
    /// `"npy"`, `"npz"`, `"safetensors"` or `"lvz"`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Npy => "npy",
            Format::Npz => "npz",
            Format::Safetensors => "safetensors",
            Format::Lvz => "lvz",
        }
    }
}

const NPY_MAGIC: &[u8] = b"\x93NUMPY";
/// A zip's first local header, or the end record of an empty zip.
const ZIP_MAGICS: [&[u8; 4]; 2] = [b"PK\x03\x04", b"PK\x05\x06"];

/// The format of the file at `path`, from its content (not its name).
///
/// # Errors
/// [`StorageError::Io`](crate::StorageError::Io) when it cannot be opened or read; [`InteropError::InvalidFile`](crate::InteropError::InvalidFile)
/// for a file that starts like a safetensors file but whose header length
/// exceeds it; [`InteropError::UnknownFormat`](crate::InteropError::UnknownFormat) for anything else.
pub fn detect_format(path: &Path) -> Result<Format> {
    let mut file = File::open(path).map_err(Error::io(path))?;
    let size = file.metadata().map_err(Error::io(path))?.len();
    let mut head = Vec::with_capacity(9);
    (&mut file)
        .take(9)
        .read_to_end(&mut head)
        .map_err(Error::io(path))?;
    if head.starts_with(NPY_MAGIC) {
        return Ok(Format::Npy);
    }
    if head.len() >= 4 && ZIP_MAGICS.iter().any(|m| head[..4] == m[..]) {
        let lvz = head[..4] == ZIP_MAGICS[0][..]
            && zip::has_member(BufReader::new(file), crate::archive::MANIFEST_MEMBER);
        return Ok(if lvz { Format::Lvz } else { Format::Npz });
    }
    if head.len() == 9 && head[8] == b'{' {
        let n = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        if n <= size - 8 {
            return Ok(Format::Safetensors);
        }
        return Err(Error::invalid_file(
            path.display().to_string(),
            format!(
                "starts like a safetensors file but its header length {n} exceeds the file \
                 ({size} bytes): truncated or not safetensors"
            ),
        ));
    }
    Err(Error::from(crate::InteropError::UnknownFormat {
        path: path.to_owned(),
        detail: format!(
            "not a .npy, .npz, .safetensors or .lvz file (starts with {})",
            python_bytes(&head[..head.len().min(8)])
        ),
    }))
}

/// `bytes` as Python's `repr(bytes)` shows them (`b'PK\x03\x04'`).
fn python_bytes(bytes: &[u8]) -> String {
    let mut out = String::from("b'");
    for &b in bytes {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'\'' => out.push_str("\\'"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('\'');
    out
}

/// An `object` array read from a file, re-encoded for the store by
/// [`ImportHooks::repickle`] (what the Python layer's `payload_args` gives).
#[derive(Debug, Clone)]
pub struct PickledArray {
    /// Python-literal descr (`"'|O'"`).
    pub descr: String,
    /// numpy's `dtype.name` (`"object"`).
    pub dtype: String,
    /// numpy's `shape`: elements per axis, outermost first (`[]`: 0-d).
    pub shape: Vec<u64>,
    /// numpy's `fortran_order` (NEP 1); it tells how the array was laid out
    /// before pickling, the pickle itself carries the elements.
    pub fortran_order: bool,
    /// The pickle of the array, as the store keeps it (a payload with
    /// `pickled` set).
    pub data: Vec<u8>,
}

/// How an import reads its file.
#[derive(Debug, Clone, Copy)]
pub struct ImportOptions {
    /// Whether `object` arrays (pickles) may be imported; without it they
    /// are refused with [`InteropError::PickleNotAllowed`](crate::InteropError::PickleNotAllowed).
    pub allow_pickle: bool,
    /// Largest `.npy` header text read, in bytes (numpy's
    /// `max_header_size`): for a `.npy` file and every `.npz` member.
    pub max_header_size: usize,
    /// Largest uncompressed-over-compressed size ratio a deflated member may
    /// declare ([`DEFAULT_MAX_DEFLATE_RATIO`]).
    pub max_deflate_ratio: u64,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            allow_pickle: false,
            max_header_size: DEFAULT_MAX_HEADER_SIZE,
            max_deflate_ratio: DEFAULT_MAX_DEFLATE_RATIO,
        }
    }
}

/// Re-encodes the pickle of an object array read from a file (`what` names
/// it) for the store; see [`ImportHooks::repickle`].
pub type Repickle<'a> = dyn FnMut(&str, Vec<u8>) -> Result<PickledArray> + 'a;

/// Called with `(arrays staged, arrays of the whole import)`: once with
/// `(0, total)` when every file has been checked, then after each array's
/// payload is written; returning `false` cancels the import.
pub type Progress<'a> = dyn FnMut(u64, u64) -> bool + 'a;

/// Callbacks of an import.
#[derive(Default)]
pub struct ImportHooks<'a> {
    /// Progress, counted in arrays over every file of the import; it runs
    /// while the store's writer lock is held, so it must not use the store.
    pub progress: Option<&'a mut Progress<'a>>,
    /// Turns the pickle stream of an `object` array, as numpy wrote it
    /// (perhaps by Python 2), into the payload the store keeps (the Python
    /// layer unpickles it with `encoding="latin1"` and pickles it again).
    /// Without it the pickle is kept as it is. Called only when
    /// [`ImportOptions::allow_pickle`] is set.
    pub repickle: Option<&'a mut Repickle<'a>>,
}

/// Imports the file at `path` (a `.npy`, `.npz`, `.safetensors` or `.lvz`,
/// format from its content) into `store`; returns the keys written, in
/// order. [`import_files`] with one file.
///
/// A single-record file is written under `key`, or `default_key` when
/// `key` is `None`; lazyvault's `.npz` and `.lvz` bring back every record
/// under its own key, or their only record under `key`.
///
/// # Errors
/// As [`import_files`].
pub fn import_file(
    store: &Store,
    path: &Path,
    key: Option<&str>,
    default_key: &str,
    options: &ImportOptions,
    hooks: &mut ImportHooks<'_>,
) -> Result<Vec<String>> {
    let source = ImportSource {
        path,
        key,
        default_key,
    };
    import_files(store, &[source], options, hooks)
}

/// One file of an import: its path, and the key of its record.
#[derive(Debug, Clone, Copy)]
pub struct ImportSource<'a> {
    /// The file (`.npy`, `.npz`, `.safetensors` or `.lvz`, from its content).
    pub path: &'a Path,
    /// The key of a single-record file, or the new key of the only record
    /// of an `.lvz` or lazyvault `.npz`; `None`: `default_key`, or their
    /// records' own keys.
    pub key: Option<&'a str>,
    /// The key of a single-record file when `key` is `None`.
    pub default_key: &'a str,
}

/// Imports every file of `files` into `store` as one commit: all of them
/// are checked (phase 1, see the module docs) before any array is written,
/// then every array is streamed into one staged put. Returns the keys
/// written, file by file, in order.
///
/// # Errors
/// [`StorageError::Io`](crate::StorageError::Io) when a file cannot be opened
/// or read (`NotFound` for a missing one);
/// [`InteropError::UnknownFormat`](crate::InteropError::UnknownFormat);
/// [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) for a
/// malformed, truncated, damaged or hostile file (its message names the file
/// and the member or tensor, its `path` the file; damage an `.lvz` shows is
/// reported so too, not as [`Error::Corrupt`]);
/// [`InteropError::PickleNotAllowed`](crate::InteropError::PickleNotAllowed)
/// for an `object` array of a `.npy`/`.npz` without
/// [`ImportOptions::allow_pickle`];
/// [`InteropError::Unsupported`](crate::InteropError::Unsupported) for `key`
/// given with a file of several records;
/// [`InteropError::KeyCollision`](crate::InteropError::KeyCollision) when two
/// files give the same key;
/// [`InteropError::Unsupported`](crate::InteropError::Unsupported) for a file
/// given twice; [`UsageError::Cancelled`](crate::UsageError::Cancelled);
/// and the errors of [`Store::put_staged`] (free space first). On any error
/// the store is as it was.
pub fn import_files(
    store: &Store,
    files: &[ImportSource<'_>],
    options: &ImportOptions,
    hooks: &mut ImportHooks<'_>,
) -> Result<Vec<String>> {
    let mut plans = Vec::with_capacity(files.len());
    for source in files {
        plans.push(plan_file(source, options).map_err(|e| e.in_input_file(source.path))?);
    }
    check_collisions(&plans)?;
    write_plans(store, plans, hooks)
}

/// What phase 1 found in one file.
struct FilePlan {
    path: PathBuf,
    format: Format,
    /// The file's length when checked: a file whose length changed before
    /// its bytes are copied is refused.
    len: u64,
    /// The archive, mapped, for an `.lvz`.
    archive: Option<crate::archive::Archive>,
    records: Vec<PlannedRecord>,
}

/// Phase 1 of one file.
fn plan_file(source: &ImportSource<'_>, options: &ImportOptions) -> Result<FilePlan> {
    let ImportSource {
        path,
        key,
        default_key,
    } = *source;
    let format = detect_format(path)?;
    let len = std::fs::metadata(path).map_err(Error::io(path))?.len();
    let mut archive = None;
    let records = match format {
        Format::Npy => npy::plan(path, key.unwrap_or(default_key), options)?,
        Format::Npz => npz::plan(path, key, default_key, options)?,
        Format::Safetensors => safetensors::plan(path, key, default_key)?,
        Format::Lvz => {
            let (mapped, records) = lvz::plan(path, key)?;
            archive = Some(mapped);
            records
        }
    };
    Ok(FilePlan {
        path: path.to_owned(),
        format,
        len,
        archive,
        records,
    })
}

/// Refuses a file given twice (the same file by two paths included), then
/// two files of one import that give the same key.
fn check_collisions(plans: &[FilePlan]) -> Result<()> {
    let mut files: HashMap<PathBuf, &Path> = HashMap::new();
    for plan in plans {
        let real = std::fs::canonicalize(&plan.path).map_err(Error::io(&plan.path))?;
        if let Some(first) = files.insert(real, &plan.path) {
            let again = if first == plan.path {
                String::new()
            } else {
                format!(" (as {})", plan.path.display())
            };
            return Err(Error::from(crate::InteropError::Unsupported(format!(
                "{} is given twice{again}: the same file, give it once",
                first.display()
            ))));
        }
    }
    let mut seen: HashMap<&str, &Path> = HashMap::new();
    for plan in plans {
        for r in &plan.records {
            if let Some(first) = seen.insert(&r.key, &plan.path) {
                return Err(Error::from(crate::InteropError::KeyCollision {
                    key: r.key.clone(),
                    first: first.to_owned(),
                    second: plan.path.clone(),
                }));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Plans: what phase 1 finds, phase 2 writes

/// Where an array's bytes are in the source file.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// `nbytes` bytes at this offset of the file.
    Range { offset: u64 },
    /// A zip member (its `.npy` header included), by index in the zip.
    Member(zip::MemberInfo),
    /// `nbytes` bytes at this offset of a mapped `.lvz` archive, already in
    /// the store's form (a pickled array's bytes are copied as they are).
    Mapped { start: usize },
}

/// One array of a planned record.
#[derive(Debug, Clone)]
pub(crate) struct PlannedArray {
    /// The file and member or tensor, for messages.
    pub what: String,
    /// Python-literal descr, canonical.
    pub descr: String,
    /// numpy's dtype name.
    pub dtype: String,
    pub shape: Vec<u64>,
    pub fortran_order: bool,
    /// Data bytes (for a pickled array: the pickle's, to the source's end).
    pub nbytes: u64,
    /// Bytes of `.npy` header before the data in a member.
    pub header_len: u64,
    /// An `object` array: its data are a pickle.
    pub pickled: bool,
    pub source: Source,
}

/// A record to write: metadata, layout and its arrays by path.
#[derive(Debug, Clone)]
pub(crate) struct PlannedRecord {
    pub key: String,
    pub meta: Map<String, Value>,
    pub layout: Value,
    pub arrays: IndexMap<String, PlannedArray>,
    /// The pickled remainder (records of an `.lvz` only).
    pub pickle: Option<Vec<u8>>,
}

/// A field of a flat dict to store: a JSON value or an array.
pub(crate) enum Field {
    Json(Value),
    Array(PlannedArray),
}

/// The record the Python layer's splitting gives for the flat dict
/// `fields` (`store[key] = {name: value}`): JSON values become metadata
/// (containers laid out as `{"dict": ...}` / `{"list": ...}`), arrays
/// payloads named by their field (`"data"` for an empty name, `~2`, `~3`...
/// on a clash), all in dict order. As there: the compact layout
/// `{"fields": ...}` (FORMAT.md, "Layout") when every array is at its own
/// name, `null` when no metadata field follows an array.
pub(crate) fn flat_record(key: &str, fields: Vec<(String, Field)>) -> PlannedRecord {
    let mut meta = Map::new();
    let mut nodes = Map::new();
    let mut arrays: IndexMap<String, PlannedArray> = IndexMap::new();
    let mut renamed = false; // an array not at its own name: the full layout
    let mut interleaved = false; // a metadata field after an array: names listed
    for (name, field) in fields {
        match field {
            Field::Json(value) => {
                interleaved |= !arrays.is_empty();
                nodes.insert(name.clone(), layout_of(&value));
                meta.insert(name, value);
            }
            Field::Array(array) => {
                let base = if name.is_empty() { "data" } else { &name };
                let mut path = base.to_owned();
                let mut n = 2;
                while arrays.contains_key(&path) {
                    path = format!("{base}~{n}");
                    n += 1;
                }
                renamed |= path != name;
                nodes.insert(name, serde_json::json!({ "array": path }));
                arrays.insert(path, array);
            }
        }
    }
    // a lone `$` field would read as a tagged value, not a field: not compact
    let lone_tag = meta.len() == 1 && meta.keys().all(|k| k.starts_with('$'));
    let layout = if renamed || lone_tag {
        serde_json::json!({ "dict": nodes })
    } else if interleaved {
        serde_json::json!({ "fields": nodes.keys().collect::<Vec<_>>() })
    } else {
        serde_json::json!({ "fields": null })
    };
    PlannedRecord {
        key: key.to_owned(),
        meta,
        layout,
        arrays,
        pickle: None,
    }
}

/// The layout node of a metadata value (FORMAT.md, "Layout"): a tagged
/// leaf (`{"$float": "nan"}`...) is its own node, `$tuple` a `tuple` node,
/// an escaped `$dict` the `dict` node of the object inside ("Tagged values").
fn layout_of(value: &Value) -> Value {
    use crate::query::tagged::{tag, Tag};
    let dict = |m: &Map<String, Value>| {
        serde_json::json!({
            "dict": m.iter().map(|(k, v)| (k.clone(), layout_of(v))).collect::<Map<_, _>>()
        })
    };
    match value {
        Value::Object(m) => match tag(m) {
            Some(Tag::Dict(inner)) => dict(inner),
            Some(Tag::Tuple(items)) => {
                serde_json::json!({ "tuple": items.iter().map(layout_of).collect::<Vec<_>>() })
            }
            Some(_) => value.clone(),
            None => dict(m),
        },
        Value::Array(a) => {
            serde_json::json!({ "list": a.iter().map(layout_of).collect::<Vec<_>>() })
        }
        leaf => leaf.clone(),
    }
}

/// `map` as a metadata value: escaped as `{"$dict": map}` when its only
/// key starts with `$`, so that a foreign object is never read as a tagged
/// value (FORMAT.md, "Tagged values").
pub(crate) fn escaped_object(map: Map<String, Value>) -> Value {
    if map.len() == 1 && map.keys().all(|k| k.starts_with('$')) {
        serde_json::json!({ "$dict": map })
    } else {
        Value::Object(map)
    }
}

/// What the records of a plan will write: (payload files, data bytes).
pub(crate) fn plan_size<'a>(records: impl Iterator<Item = &'a PlannedRecord>) -> (usize, u64) {
    let arrays = records.flat_map(|r| r.arrays.values());
    arrays.fold((0, 0), |(n, b), a| (n + 1, b.saturating_add(a.nbytes)))
}

/// Refuses the `object` arrays of `records` unless pickles are allowed.
pub(crate) fn check_pickles(records: &[PlannedRecord], options: &ImportOptions) -> Result<()> {
    if options.allow_pickle {
        return Ok(());
    }
    let pickled = records
        .iter()
        .flat_map(|r| r.arrays.values())
        .find(|a| a.pickled);
    match pickled {
        Some(a) => Err(Error::from(crate::InteropError::PickleNotAllowed {
            what: a.what.clone(),
        })),
        None => Ok(()),
    }
}

/// Reports progress; `Err(Cancelled)` when the callback says stop.
pub(crate) fn report(hooks: &mut ImportHooks<'_>, done: u64, total: u64) -> Result<()> {
    if let Some(progress) = hooks.progress.as_mut() {
        if !progress(done, total) {
            return Err(Error::cancelled());
        }
    }
    Ok(())
}

/// The error of a file: `what` names it (and the member or tensor).
pub(crate) fn invalid(what: &str, detail: impl ToString) -> Error {
    Error::invalid_file(what, detail)
}

/// `path` as messages show it.
pub(crate) fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// The [`Error`] an `io::Error` carries ([`io_wrap`]), or the `io::Error`.
pub(crate) fn unwrap_io(e: std::io::Error) -> std::result::Result<Error, std::io::Error> {
    if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
        return Ok(source_error(e, Path::new("")));
    }
    Err(e)
}

/// An [`Error`] carried through an `io::Error` (by a reader feeding a
/// payload; [`crate::Stage::write_from`] unwraps it).
pub(crate) fn io_wrap(e: Error) -> std::io::Error {
    std::io::Error::other(e)
}

// ---------------------------------------------------------------------------
// Phase 2: streaming the planned arrays into payloads

/// Gives the data bytes of a planned array, read from the source file.
pub(crate) trait ArrayBytes {
    /// A reader of `array`'s data (for a pickled array: its pickle, to the
    /// end of its source), which checks the source on the way (a zip
    /// member's CRC-32 and size) and carries such errors as
    /// [`io_wrap`]ped [`Error`]s.
    fn open(&mut self, array: &PlannedArray) -> Result<Box<dyn Read + '_>>;
}

/// Byte ranges of one open file (`.npy`, `.safetensors`).
pub(crate) struct FileRanges(pub File);

impl ArrayBytes for FileRanges {
    fn open(&mut self, array: &PlannedArray) -> Result<Box<dyn Read + '_>> {
        let Source::Range { offset } = array.source else {
            unreachable!("a .npy or .safetensors plan holds ranges only");
        };
        use std::io::{Seek, SeekFrom};
        let file = &mut self.0;
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| Error::invalid_file(&array.what, format!("cannot seek: {e}")))?;
        Ok(Box::new(file.take(array.nbytes)))
    }
}

/// Byte ranges of a mapped `.lvz` archive.
struct MappedRanges<'a>(&'a [u8]);

impl ArrayBytes for MappedRanges<'_> {
    fn open(&mut self, array: &PlannedArray) -> Result<Box<dyn Read + '_>> {
        let Source::Mapped { start } = array.source else {
            unreachable!("an .lvz plan holds mapped ranges only");
        };
        // checked against the map when planned
        let end = start + array.nbytes as usize;
        Ok(Box::new(&self.0[start..end]))
    }
}

/// The source of a planned file's bytes for phase 2: the file opened again
/// (one descriptor at a time, whatever the number of files), refused if its
/// length changed since it was checked.
fn open_bytes(plan: &FilePlan) -> Result<Box<dyn ArrayBytes + '_>> {
    if let Some(archive) = &plan.archive {
        return Ok(Box::new(MappedRanges(archive.bytes())));
    }
    let path = &plan.path;
    let file = File::open(path).map_err(Error::io(path))?;
    let len = file.metadata().map_err(Error::io(path))?.len();
    if len != plan.len {
        return Err(invalid(
            &shown(path),
            format!(
                "changed while being imported ({} bytes when checked, {len} now)",
                plan.len
            ),
        ));
    }
    Ok(match plan.format {
        Format::Npz => {
            let zip = zip::ZipIn::new(BufReader::with_capacity(64 << 10, file), &shown(path))?;
            Box::new(npz::Members(zip))
        }
        _ => Box::new(FileRanges(file)),
    })
}

/// Phase 2: streams every array of every plan into payloads of one staged
/// put and commits all the records; returns their keys.
fn write_plans(
    store: &Store,
    plans: Vec<FilePlan>,
    hooks: &mut ImportHooks<'_>,
) -> Result<Vec<String>> {
    let records = || plans.iter().flat_map(|p| p.records.iter());
    let (files, nbytes) = plan_size(records());
    let count = records().count();
    let keys: Vec<String> = records().map(|r| r.key.clone()).collect();
    let total = files as u64;
    store.put_staged(files, nbytes, count, |stage| {
        report(hooks, 0, total)?;
        let mut done = 0;
        let mut staged = Vec::with_capacity(count);
        for plan in &plans {
            let in_file = |e: Error| e.in_input_file(&plan.path);
            let mut bytes = open_bytes(plan).map_err(in_file)?;
            for r in &plan.records {
                let mut arrays = IndexMap::with_capacity(r.arrays.len());
                for (name, array) in &r.arrays {
                    let entry = stage_array(stage, name, array, &mut *bytes, &plan.path, hooks)
                        .map_err(in_file)?;
                    arrays.insert(name.clone(), entry);
                    done += 1;
                    report(hooks, done, total)?;
                }
                staged.push(StagedRecord {
                    key: r.key.clone(),
                    meta: r.meta.clone(),
                    layout: r.layout.clone(),
                    arrays,
                    pickle: r.pickle.clone(),
                });
            }
        }
        Ok(staged)
    })?;
    Ok(keys)
}

/// Writes one planned array as a payload of `stage`.
fn stage_array(
    stage: &mut Stage<'_>,
    name: &str,
    array: &PlannedArray,
    bytes: &mut dyn ArrayBytes,
    path: &Path,
    hooks: &mut ImportHooks<'_>,
) -> Result<ArrayEntry> {
    if array.pickled {
        if let Source::Mapped { .. } = array.source {
            // an archive's pickle is already the store's: copied as it is
            let mut data = Vec::new();
            bytes
                .open(array)?
                .read_to_end(&mut data)
                .map_err(|e| source_error(e, path))?;
            return stage.write(&ArraySource {
                name: name.to_owned(),
                descr: array.descr.clone(),
                dtype: array.dtype.clone(),
                shape: array.shape.clone(),
                fortran_order: array.fortran_order,
                data: &data,
                pickled: true,
            });
        }
        // Unpickled anyway when loaded: read whole (bounded by the source).
        let mut data = Vec::new();
        bytes
            .open(array)?
            .read_to_end(&mut data)
            .map_err(|e| source_error(e, path))?;
        let pickled = match hooks.repickle.as_mut() {
            Some(repickle) => repickle(&array.what, data)?,
            None => PickledArray {
                descr: array.descr.clone(),
                dtype: array.dtype.clone(),
                shape: array.shape.clone(),
                fortran_order: array.fortran_order,
                data,
            },
        };
        return stage.write(&ArraySource {
            name: name.to_owned(),
            descr: pickled.descr,
            dtype: pickled.dtype,
            shape: pickled.shape,
            fortran_order: pickled.fortran_order,
            data: &pickled.data,
            pickled: true,
        });
    }
    let src = ArraySource {
        name: name.to_owned(),
        descr: array.descr.clone(),
        dtype: array.dtype.clone(),
        shape: array.shape.clone(),
        fortran_order: array.fortran_order,
        data: &[],
        pickled: false,
    };
    let mut reader = bytes.open(array)?;
    stage
        .write_from(&src, array.nbytes, &mut reader, path)
        .map_err(|e| match e {
            // the message of the core names the array, not the file
            Error::Usage(crate::UsageError::InvalidArray { detail, .. }) => {
                invalid(&array.what, detail)
            }
            other => other,
        })
}
