//! Parsing an archive's bytes into an [`ArchiveIndex`]: the zip's central
//! directory, each member's local header and data range, the manifest,
//! the records; then checking arrays against their members on demand.

use std::collections::HashMap;
use std::io::Cursor;
use std::ops::Range;
use std::path::PathBuf;

use lazyvault_schema::{ArrayEntry, Manifest, Record};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use zip::read::ZipFileEntry;
use zip::{CompressionMethod, ZipArchive};

use super::{
    base64_decode, corrupt, too_short, ArchiveManifest, ARCHIVE_KIND, ARRAYS_PREFIX,
    MANIFEST_MEMBER, MIN_ZIP_LEN, RECORDS_MEMBER, ZIP_MAGIC,
};
use crate::error::{Error, Result};
use crate::npy;
use crate::query::{ArrayFacts, Query, RecordView};
use crate::Keys;

/// Fixed part of a zip local file header.
const LOCAL_HEADER_LEN: usize = 30;
/// The signature that starts a zip local file header.
const LOCAL_HEADER_SIG: u32 = 0x0403_4b50;

/// One record of an archive.
#[derive(Debug)]
pub struct ArchiveRecord {
    /// The record's key: non-empty, unique within the archive.
    pub key: String,
    /// The record JSON, compact, as the writer stored it (UTF-8; FORMAT.md,
    /// "Record").
    pub json: Vec<u8>,
    /// The decoded record (parsed from `json`, validated by the schema).
    pub record: Record,
    /// The pickled remainder, when the record has one (decoded from the
    /// line's base64 `pickle` field).
    pub pickle: Option<Vec<u8>>,
}

impl RecordView for ArchiveRecord {
    fn key(&self) -> &str {
        &self.key
    }
    fn meta(&self) -> &Map<String, Value> {
        &self.record.meta
    }
    fn array(&self, name: &str) -> Option<ArrayFacts<'_>> {
        self.record.arrays.get(name).map(ArrayFacts::from)
    }
}

/// What an archive holds, parsed from its bytes: the records and where each
/// payload member's bytes are. Holds offsets only, no borrow of the bytes:
/// the caller keeps the bytes alive and passes them back to
/// [`ArchiveIndex::array_range`].
#[derive(Debug)]
pub struct ArchiveIndex {
    what: String,
    len: usize,
    records: Vec<ArchiveRecord>,
    by_key: HashMap<String, usize>,
    /// Payload id → where the member's data are.
    members: HashMap<String, Member>,
}

/// Where a member's data are (the whole file it holds) and the CRC-32 the
/// central directory gives them.
#[derive(Debug, Clone)]
struct Member {
    range: Range<usize>,
    crc: u32,
}

/// The members lazyvault reads, found in the central directory.
#[derive(Default)]
struct Members {
    manifest: Option<Member>,
    records: Option<Member>,
    /// Payload id → its `arrays/<id>.npy` member.
    arrays: HashMap<String, Member>,
}

/// The part of the archive a member name says it is.
enum MemberKind<'a> {
    Manifest,
    Records,
    /// A payload member, with its id.
    Array(&'a str),
}

impl<'a> MemberKind<'a> {
    /// What the member `name` is to lazyvault; `None` for a member it
    /// ignores (a newer minor version may add some).
    fn of(name: &'a str) -> Option<Self> {
        match name {
            MANIFEST_MEMBER => Some(MemberKind::Manifest),
            RECORDS_MEMBER => Some(MemberKind::Records),
            _ => name
                .strip_prefix(ARRAYS_PREFIX)
                .and_then(|n| n.strip_suffix(".npy"))
                .filter(|id| is_payload_id(id))
                .map(MemberKind::Array),
        }
    }
}

/// One line of `lazyvault/records.jsonl`, as read.
#[derive(Deserialize)]
struct RecordLineIn<'a> {
    key: String,
    #[serde(borrow)]
    record: &'a RawValue,
    #[serde(default)]
    pickle: Option<String>,
}

/// Checks a member's bytes against the CRC-32 the zip recorded for it.
fn check_crc(data: &[u8], expected: u32, what: &str) -> Result<()> {
    let found = crc32fast::hash(data);
    if found != expected {
        return Err(corrupt(
            what,
            format!("CRC-32 mismatch (zip says {expected:08x}, data gives {found:08x})"),
        ));
    }
    Ok(())
}

fn is_payload_id(id: &str) -> bool {
    id.len() == lazyvault_schema::PAYLOAD_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether a member name could escape a directory if extracted (absolute,
/// `..`, backslashes, drive letters, NUL): lazyvault never extracts, but
/// such an archive was not written by lazyvault and is refused.
fn unsafe_member_name(name: &str) -> bool {
    name.is_empty()
        || name.starts_with('/')
        || name.contains('\\')
        || name.contains('\0')
        || name.as_bytes().get(1) == Some(&b':')
        || name.split('/').any(|part| part == "..")
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The zip in `bytes`, after checking that it is one: long enough, starting
/// with a local file header, a central directory (zip64 or not, found by
/// the zip crate from the end of central directory record) inside the file
/// and no member name twice. Also returns where the central directory
/// starts: every member's header and data must end before it.
fn open_zip<'b>(bytes: &'b [u8], what: &str) -> Result<(ZipArchive<Cursor<&'b [u8]>>, usize)> {
    let len = bytes.len();
    if (len as u64) < MIN_ZIP_LEN {
        return Err(too_short(what, len as u64));
    }
    if bytes[..4] != ZIP_MAGIC[..] {
        return Err(corrupt(
            what,
            "not a .lvz archive: it does not start with a zip local file header (PK\\x03\\x04)",
        ));
    }
    let zip = ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| corrupt(what, format!("not a readable zip archive: {e}")))?;
    if zip.has_duplicate_names() {
        let start = zip.central_directory_start();
        let name = crate::interop::zip::duplicate_member(Cursor::new(bytes), start);
        return Err(corrupt(
            what,
            format!("the zip lists member {:?} twice", name.unwrap_or_default()),
        ));
    }
    let cd_start = usize::try_from(zip.central_directory_start())
        .ok()
        .filter(|&s| s <= len)
        .ok_or_else(|| corrupt(what, "central directory lies outside the file"))?;
    Ok((zip, cd_start))
}

/// Walks the central directory: every member name checked, the members
/// lazyvault reads located (see [`member_data`]), the others ignored.
fn read_central_directory(
    zip: &ZipArchive<Cursor<&[u8]>>,
    bytes: &[u8],
    cd_start: usize,
    what: &str,
) -> Result<Members> {
    let mut members = Members::default();
    for i in 0..zip.len() {
        let file = zip
            .by_index_data(i)
            .map_err(|e| corrupt(what, format!("zip member {i}: {e}")))?;
        let name = std::str::from_utf8(file.name_raw())
            .map_err(|_| corrupt(what, format!("zip member {i}: name is not UTF-8")))?;
        let mwhat = format!("{what}: member {name:?}");
        if unsafe_member_name(name) {
            return Err(corrupt(
                &mwhat,
                "unsafe member name (absolute, '..', backslash or drive): not a lazyvault archive",
            ));
        }
        let Some(kind) = MemberKind::of(name) else {
            continue;
        };
        let member = member_data(&file, name, bytes, cd_start, &mwhat)?;
        match kind {
            MemberKind::Manifest => members.manifest = Some(member),
            MemberKind::Records => members.records = Some(member),
            MemberKind::Array(id) => {
                members.arrays.insert(id.to_owned(), member);
            }
        }
    }
    Ok(members)
}

/// Where the data of the member `name` are in `bytes`, after checking it:
/// stored (uncompressed, not encrypted), its local header before the
/// central directory (at `cd_start`) and naming the same member, its data
/// ending before the central directory.
fn member_data(
    file: &ZipFileEntry<'_>,
    name: &str,
    bytes: &[u8],
    cd_start: usize,
    mwhat: &str,
) -> Result<Member> {
    if file.encrypted() {
        return Err(corrupt(mwhat, "encrypted members are not supported"));
    }
    if file.compression() != CompressionMethod::Stored {
        return Err(corrupt(
            mwhat,
            format!(
                "compressed with {:?}; lazyvault archives store members uncompressed \
                 (Stored) so that arrays can be memory-mapped",
                file.compression()
            ),
        ));
    }
    if file.compressed_size() != file.size() {
        return Err(corrupt(
            mwhat,
            "stored member whose compressed and uncompressed sizes differ",
        ));
    }
    let header_start = usize::try_from(file.header_start())
        .ok()
        .filter(|&h| {
            h.checked_add(LOCAL_HEADER_LEN)
                .is_some_and(|end| end <= cd_start)
        })
        .ok_or_else(|| corrupt(mwhat, "local header lies outside the file"))?;
    let local = &bytes[header_start..header_start + LOCAL_HEADER_LEN];
    if u32::from_le_bytes([local[0], local[1], local[2], local[3]]) != LOCAL_HEADER_SIG {
        return Err(corrupt(mwhat, "bad local file header signature"));
    }
    let name_len = usize::from(u16_at(local, 26));
    let extra_len = usize::from(u16_at(local, 28));
    let name_start = header_start + LOCAL_HEADER_LEN;
    if bytes.get(name_start..name_start + name_len) != Some(name.as_bytes()) {
        return Err(corrupt(
            mwhat,
            "local header names another member than the central directory",
        ));
    }
    let data_start = name_start + name_len + extra_len;
    let size = file.size();
    let data_end = usize::try_from(size)
        .ok()
        .and_then(|n| data_start.checked_add(n))
        .filter(|&end| end <= cd_start)
        .ok_or_else(|| {
            corrupt(
                mwhat,
                format!("its {size} bytes of data do not fit in the file (truncated archive?)"),
            )
        })?;
    Ok(Member {
        range: data_start..data_end,
        crc: file.crc32(),
    })
}

/// The bytes of a small member (the manifest, the records), checked in
/// full against their CRC-32: they drive keys, metadata and unpickling.
/// Array members are checked by `verify` and before unpickling (a full read
/// would defeat the memory map).
fn small_member<'b>(bytes: &'b [u8], member: &Member, what: &str) -> Result<&'b [u8]> {
    let data = &bytes[member.range.clone()];
    check_crc(data, member.crc, what)?;
    Ok(data)
}

/// The manifest member, checked: a lazyvault manifest of a major version
/// this reader knows, of kind `archive`.
fn read_manifest(bytes: &[u8], member: Option<&Member>, what: &str) -> Result<ArchiveManifest> {
    let member = member.ok_or_else(|| {
        corrupt(
            what,
            format!("not a lazyvault archive: no {MANIFEST_MEMBER} member"),
        )
    })?;
    let mwhat = format!("{what}: {MANIFEST_MEMBER}");
    let data = small_member(bytes, member, &mwhat)?;
    let manifest: ArchiveManifest = serde_json::from_slice(data).map_err(|e| corrupt(&mwhat, e))?;
    Manifest {
        format: manifest.format.clone(),
        format_version: manifest.format_version.clone(),
        created_by: manifest.created_by.clone(),
    }
    .check()
    .map_err(|source| {
        Error::from(crate::OpenError::Format {
            path: PathBuf::from(what),
            source,
        })
    })?;
    if manifest.kind != ARCHIVE_KIND {
        return Err(corrupt(
            &mwhat,
            format!("kind is {:?}, expected {ARCHIVE_KIND:?}", manifest.kind),
        ));
    }
    Ok(manifest)
}

/// The records member, one record a non-blank line (see [`read_record`]),
/// each key once; returns the records in order and their index by key.
fn read_records(
    bytes: &[u8],
    member: Option<&Member>,
    arrays: &HashMap<String, Member>,
    what: &str,
) -> Result<(Vec<ArchiveRecord>, HashMap<String, usize>)> {
    let member = member.ok_or_else(|| corrupt(what, format!("no {RECORDS_MEMBER} member")))?;
    let rwhat = format!("{what}: {RECORDS_MEMBER}");
    let data = small_member(bytes, member, &rwhat)?;
    let text = std::str::from_utf8(data).map_err(|e| corrupt(&rwhat, e))?;
    let mut records = Vec::new();
    let mut by_key = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let lwhat = format!("{rwhat} line {}", n + 1);
        let record = read_record(line, arrays, &lwhat)?;
        if by_key.insert(record.key.clone(), records.len()).is_some() {
            return Err(corrupt(
                &lwhat,
                format!("key {:?} appears twice", record.key),
            ));
        }
        records.push(record);
    }
    Ok((records, by_key))
}

/// One line of the records member: a non-empty key, a valid record, a
/// pickled remainder exactly when the record says it has one (valid
/// base64), and every array's payload member present (see
/// [`check_members`]).
fn read_record(line: &str, arrays: &HashMap<String, Member>, lwhat: &str) -> Result<ArchiveRecord> {
    let parsed: RecordLineIn = serde_json::from_str(line).map_err(|e| corrupt(lwhat, e))?;
    if parsed.key.is_empty() {
        return Err(corrupt(lwhat, "empty key"));
    }
    let json = parsed.record.get().as_bytes().to_vec();
    let record = Record::from_json(&json)
        .map_err(|e| corrupt(&format!("{lwhat}: record {:?}", parsed.key), e))?;
    let pickle = match &parsed.pickle {
        None => None,
        Some(b64) => Some(
            base64_decode(b64)
                .ok_or_else(|| corrupt(lwhat, "the pickled remainder is not valid base64"))?,
        ),
    };
    if record.pickle != pickle.is_some() {
        return Err(corrupt(
            lwhat,
            "the record's pickle flag and its pickled remainder disagree",
        ));
    }
    check_members(&record, &parsed.key, arrays, lwhat)?;
    Ok(ArchiveRecord {
        key: parsed.key,
        json,
        record,
        pickle,
    })
}

/// Every array of `record` names a payload member the archive holds.
fn check_members(
    record: &Record,
    key: &str,
    arrays: &HashMap<String, Member>,
    lwhat: &str,
) -> Result<()> {
    for (name, entry) in &record.arrays {
        if !arrays.contains_key(&entry.id) {
            return Err(corrupt(
                &format!("{lwhat}: record {key:?} array {name:?}"),
                format!("member {ARRAYS_PREFIX}{}.npy is missing", entry.id),
            ));
        }
    }
    Ok(())
}

impl ArchiveIndex {
    /// Parses the archive in `bytes`: the central directory (with the zip
    /// crate), every member's local header, the manifest and the records.
    /// `what` names the archive in error messages (its path).
    ///
    /// # Errors
    /// Refuses, with [`Error::Corrupt`] (or [`OpenError::Format`](crate::OpenError::Format) for a newer
    /// major version): anything that is not a zip, a truncated file, a
    /// member whose header or data lie outside the file or overlap the
    /// central directory, compressed or encrypted members, unsafe or
    /// duplicate member names, a missing or foreign manifest, malformed
    /// records, duplicate keys, and records naming a payload the archive
    /// does not hold. Array headers are checked when an array is asked for.
    pub fn parse(bytes: &[u8], what: &str) -> Result<ArchiveIndex> {
        let (zip, cd_start) = open_zip(bytes, what)?;
        let members = read_central_directory(&zip, bytes, cd_start, what)?;
        drop(zip);
        let manifest = read_manifest(bytes, members.manifest.as_ref(), what)?;
        let (records, by_key) =
            read_records(bytes, members.records.as_ref(), &members.arrays, what)?;
        if manifest.records != records.len() as u64 {
            return Err(corrupt(
                what,
                format!(
                    "the manifest announces {} records, {RECORDS_MEMBER} holds {}",
                    manifest.records,
                    records.len()
                ),
            ));
        }
        Ok(ArchiveIndex {
            what: what.to_owned(),
            len: bytes.len(),
            records,
            by_key,
            members: members.arrays,
        })
    }

    /// Records in archive order.
    pub fn records(&self) -> &[ArchiveRecord] {
        &self.records
    }

    /// The record of `key`, or `None` when the archive has none.
    pub fn get(&self, key: &str) -> Option<&ArchiveRecord> {
        self.by_key.get(key).map(|&i| &self.records[i])
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the archive holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Keys in archive order.
    pub fn keys(&self) -> Vec<String> {
        self.records.iter().map(|r| r.key.clone()).collect()
    }

    /// Keys of the records matching `query`, in archive order.
    pub fn find(&self, query: &Query) -> Vec<String> {
        self.records
            .iter()
            .filter(|r| query.matches(*r))
            .map(|r| r.key.clone())
            .collect()
    }

    /// [`ArchiveIndex::find`] (every key with `None`: [`ArchiveIndex::keys`]),
    /// the keys packed in one buffer ([`Keys`]): no `String` allocated per
    /// key.
    pub fn find_keys(&self, query: Option<&Query>) -> Keys {
        self.records
            .iter()
            .filter(|r| query.is_none_or(|q| q.matches(*r)))
            .map(|r| r.key.as_str())
            .collect()
    }

    /// Number of records matching `query`.
    pub fn count(&self, query: &Query) -> usize {
        self.records.iter().filter(|r| query.matches(*r)).count()
    }

    /// The member of `entry`, after checking that `bytes` are (still) as
    /// long as the bytes parsed; `what` names it in errors.
    fn member(&self, bytes: &[u8], entry: &ArrayEntry, what: &str) -> Result<&Member> {
        if bytes.len() != self.len {
            return Err(corrupt(what, "the archive bytes changed size"));
        }
        self.members
            .get(&entry.id)
            .ok_or_else(|| corrupt(what, "member is missing"))
    }

    /// How errors name the member of `entry`.
    fn member_what(&self, entry: &ArrayEntry) -> String {
        format!("{}: member {ARRAYS_PREFIX}{}.npy", self.what, entry.id)
    }

    /// Byte range (within `bytes`, the same bytes [`ArchiveIndex::parse`]
    /// read) of the data of `entry`, after checking its member: present,
    /// its `.npy` header agrees with the entry, long enough, and the data
    /// 64-byte aligned within the archive.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the member and what is wrong.
    pub fn array_range(&self, bytes: &[u8], entry: &ArrayEntry) -> Result<Range<usize>> {
        let what = self.member_what(entry);
        let member = &self.member(bytes, entry, &what)?.range;
        let data = &bytes[member.clone()];
        let header = npy::parse_header(data, crate::payload::header_limit(entry))
            .map_err(|e| corrupt(&what, e))?;
        crate::payload::check_header_matches(&header, entry).map_err(|d| corrupt(&what, d))?;
        let start = usize::try_from(entry.data_offset)
            .ok()
            .and_then(|o| member.start.checked_add(o));
        let end = start.and_then(|s| usize::try_from(entry.nbytes).ok()?.checked_add(s));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(corrupt(&what, "size overflows"));
        };
        if end > member.end {
            return Err(corrupt(
                &what,
                format!(
                    "member is truncated: {} bytes, the array needs {}",
                    member.len(),
                    end - member.start
                ),
            ));
        }
        if !start.is_multiple_of(npy::ALIGNMENT) {
            return Err(corrupt(
                &what,
                format!("array data at archive offset {start}, not a multiple of 64"),
            ));
        }
        Ok(start..end)
    }

    /// Checks the whole member of `entry` against its CRC-32 (reads every
    /// byte: used before unpickling a payload and by verify).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a missing member, other bytes than those
    /// parsed, a CRC-32 mismatch.
    pub fn check_member_crc(&self, bytes: &[u8], entry: &ArrayEntry) -> Result<()> {
        let what = self.member_what(entry);
        let member = self.member(bytes, entry, &what)?;
        check_crc(&bytes[member.range.clone()], member.crc, &what)
    }

    /// Both checks of one array: [`ArchiveIndex::array_range`], then
    /// [`ArchiveIndex::check_member_crc`].
    fn check_array(&self, bytes: &[u8], entry: &ArrayEntry) -> Result<()> {
        self.array_range(bytes, entry)?;
        self.check_member_crc(bytes, entry)
    }

    /// Checks every array of every record like [`ArchiveIndex::verify_all`]
    /// but reports all problems: `(records, arrays, problems)`.
    pub fn verify_report(&self, bytes: &[u8]) -> (u64, u64, Vec<String>) {
        let mut arrays = 0;
        let mut problems = Vec::new();
        for record in &self.records {
            for (name, entry) in &record.record.arrays {
                arrays += 1;
                if let Err(e) = self.check_array(bytes, entry) {
                    problems.push(format!("record {:?} array {name:?}: {e}", record.key));
                }
            }
        }
        (self.records.len() as u64, arrays, problems)
    }

    /// Checks every array of every record (see [`ArchiveIndex::array_range`]).
    ///
    /// # Errors
    /// The first problem found, as [`ArchiveIndex::verify_report`] words it.
    pub fn verify_all(&self, bytes: &[u8]) -> Result<()> {
        for record in &self.records {
            for entry in record.record.arrays.values() {
                self.check_array(bytes, entry)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_names_are_detected() {
        for bad in [
            "../x.npy",
            "/etc/passwd",
            "a/../../b",
            "c:\\x",
            "a\\b",
            "",
            "C:/x",
        ] {
            assert!(unsafe_member_name(bad), "{bad}");
        }
        for ok in ["arrays/00.npy", "lazyvault/records.jsonl", "a..b/c"] {
            assert!(!unsafe_member_name(ok), "{ok}");
        }
    }

    #[test]
    fn member_names_say_what_they_hold() {
        let id = "0123456789abcdef0123456789abcdef";
        assert!(matches!(
            MemberKind::of(MANIFEST_MEMBER),
            Some(MemberKind::Manifest)
        ));
        assert!(matches!(
            MemberKind::of(RECORDS_MEMBER),
            Some(MemberKind::Records)
        ));
        let array = format!("{ARRAYS_PREFIX}{id}.npy");
        assert!(matches!(MemberKind::of(&array), Some(MemberKind::Array(i)) if i == id));
        for other in [
            format!("{ARRAYS_PREFIX}{}.npy", id.to_uppercase()),
            format!("{ARRAYS_PREFIX}{id}.npz"),
            format!("{ARRAYS_PREFIX}{}.npy", &id[1..]),
            "lazyvault/notes.txt".to_owned(),
        ] {
            assert!(MemberKind::of(&other).is_none(), "{other}");
        }
    }
}
