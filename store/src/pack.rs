//! Packs seen from the writer: which packs lost every member this session
//! (then the pack is retired like a payload file, FORMAT.md "Packs").

use std::collections::{HashMap, HashSet};
use std::path::Path;

use lazyvault_schema::ArrayEntry;

/// The zip "end of central directory" record of a pack: 22 bytes, last in
/// the file (packs have no zip comment).
const EOCD_LEN: u64 = 22;
const EOCD_SIG: u32 = 0x0605_4b50;

/// The number of members of the pack at `path`, from its end of central
/// directory; `None` when it cannot be read or needs zip64 (more than
/// 65,534 members): such a pack is left to `gc()`.
#[cfg(unix)]
pub(crate) fn member_count(path: &Path) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let mut eocd = [0u8; EOCD_LEN as usize];
    file.read_exact_at(&mut eocd, len.checked_sub(EOCD_LEN)?)
        .ok()?;
    let u16_at = |at: usize| u16::from_le_bytes([eocd[at], eocd[at + 1]]);
    if u32::from_le_bytes(eocd[..4].try_into().ok()?) != EOCD_SIG {
        return None;
    }
    let total = u16_at(10);
    (total != u16::MAX).then_some(u64::from(total))
}

#[cfg(not(unix))]
pub(crate) fn member_count(_path: &Path) -> Option<u64> {
    None
}

/// The zip64 end of central directory locator (20 bytes, just before the
/// end record) and the zip64 end record it points to (56 bytes at least).
const ZIP64_LOCATOR_LEN: u64 = 20;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
const ZIP64_EOCD_LEN: usize = 56;
/// The first bytes of a central directory header.
const CENTRAL_SIG: u32 = 0x0201_4b50;

/// What keeps the pack at `path` (of `len` bytes) from being read as a zip
/// (`np.load(pack)`, FORMAT.md "Packs"), judged from its tail only: the end
/// of central directory record last in the file (zip64 ones where CPython
/// writes them), and the central directory it points to lying within the
/// file, right before the end record(s), starting with a central header.
/// `None` when all that holds. Members are not read: lazyvault reads them
/// by offset, and `verify` checks each against its record anyway.
pub(crate) fn zip_end_problem(path: &Path, len: u64) -> std::io::Result<Option<String>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let mut read_at = |at: u64, buf: &mut [u8]| -> std::io::Result<()> {
        file.seek(SeekFrom::Start(at))?;
        file.read_exact(buf)
    };
    let u16_at = |b: &[u8], at: usize| u64::from(u16::from_le_bytes([b[at], b[at + 1]]));
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let u64_at =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let Some(eocd_at) = len.checked_sub(EOCD_LEN) else {
        return Ok(Some(format!(
            "{len} bytes, shorter than a zip end of central directory record ({EOCD_LEN} bytes)"
        )));
    };
    let mut eocd = [0u8; EOCD_LEN as usize];
    read_at(eocd_at, &mut eocd)?;
    if u32_at(&eocd, 0) != EOCD_SIG {
        return Ok(Some(format!(
            "no zip end of central directory record in its last {EOCD_LEN} bytes \
             (the file, {len} bytes, was cut short or overwritten at its end)"
        )));
    }
    let (mut entries, mut cd_size, mut cd_offset) = (
        u16_at(&eocd, 10),
        u64::from(u32_at(&eocd, 12)),
        u64::from(u32_at(&eocd, 16)),
    );
    let mut cd_end = eocd_at;
    let mut locator = [0u8; ZIP64_LOCATOR_LEN as usize];
    let zip64 = match eocd_at.checked_sub(ZIP64_LOCATOR_LEN) {
        Some(at) => {
            read_at(at, &mut locator)?;
            (u32_at(&locator, 0) == ZIP64_LOCATOR_SIG).then_some(at)
        }
        None => None,
    };
    if let Some(locator_at) = zip64 {
        let record_at = u64_at(&locator, 8);
        let mut record = [0u8; ZIP64_EOCD_LEN];
        let fits = record_at
            .checked_add(ZIP64_EOCD_LEN as u64)
            .is_some_and(|end| end <= locator_at);
        if !fits || read_at(record_at, &mut record).is_err() || u32_at(&record, 0) != ZIP64_EOCD_SIG
        {
            return Ok(Some(format!(
                "its zip64 end of central directory record (at offset {record_at}, as its \
                 locator says) is missing or damaged"
            )));
        }
        (entries, cd_size, cd_offset) = (
            u64_at(&record, 32),
            u64_at(&record, 40),
            u64_at(&record, 48),
        );
        cd_end = record_at;
    }
    if cd_offset.checked_add(cd_size) != Some(cd_end) {
        return Ok(Some(format!(
            "its zip end record puts the central directory at offset {cd_offset}, {cd_size} bytes \
             long, which does not end where the end record starts (offset {cd_end}; the file is \
             {len} bytes)"
        )));
    }
    if entries > 0 {
        let mut sig = [0u8; 4];
        read_at(cd_offset, &mut sig)?;
        if u32_at(&sig, 0) != CENTRAL_SIG {
            return Ok(Some(format!(
                "no central directory header at offset {cd_offset}, where its zip end record \
                 says the central directory starts"
            )));
        }
    }
    // Each central header names a member whose local header must be where
    // it says, with the same name (what a zip reader checks when it opens
    // a member).
    let Ok(cd_len) = usize::try_from(cd_size) else {
        return Ok(Some(format!("a central directory of {cd_size} bytes")));
    };
    let mut cd = vec![0u8; cd_len];
    read_at(cd_offset, &mut cd)?;
    let mut at = 0usize;
    for n in 0..entries {
        let bad = |detail: &str| Some(format!("central directory entry {n}: {detail}"));
        if at + 46 > cd.len() || u32_at(&cd, at) != CENTRAL_SIG {
            return Ok(bad(
                "missing or damaged (no central header where it should start)",
            ));
        }
        let name_len = u16_at(&cd, at + 28) as usize;
        let extra_len = u16_at(&cd, at + 30) as usize;
        let comment_len = u16_at(&cd, at + 32) as usize;
        let local = u64::from(u32_at(&cd, at + 42));
        let Some(name) = cd.get(at + 46..at + 46 + name_len) else {
            return Ok(bad("its name runs past the central directory"));
        };
        // 0xFFFFFFFF: the offset is in a zip64 extra field (packs past
        // 4 GiB never hold members there: lazyvault writes none)
        if local != u64::from(u32::MAX) {
            let mut header = vec![0u8; 30 + name_len];
            let found = read_at(local, &mut header).is_ok()
                && u32_at(&header, 0) == 0x0403_4b50
                && u16_at(&header, 26) as usize == name_len
                && &header[30..] == name;
            if !found {
                return Ok(bad(&format!(
                    "member {:?} points at offset {local}, where there is no local header of \
                     that name",
                    String::from_utf8_lossy(name)
                )));
            }
            // stored (method 0), sizes equal, and the same method, CRC-32
            // and sizes in both headers (FORMAT.md, "Packs")
            let (method, crc) = (u16_at(&cd, at + 10), u32_at(&cd, at + 16));
            let (csize, usize_) = (u32_at(&cd, at + 20), u32_at(&cd, at + 24));
            let agree = method == 0
                && csize == usize_
                && u16_at(&header, 8) == method
                && u32_at(&header, 14) == crc
                && u32_at(&header, 18) == csize
                && u32_at(&header, 22) == usize_;
            if !agree {
                return Ok(bad(&format!(
                    "member {:?}: its central and local headers disagree on, or do not say, \
                     stored (method 0) with equal sizes and one CRC-32",
                    String::from_utf8_lossy(name)
                )));
            }
        }
        at += 46 + name_len + extra_len + comment_len;
    }
    Ok(None)
}

/// Members of packs whose record was replaced or deleted in this writing
/// session, by pack: once every member of a pack is dead, nothing can
/// reference the pack any more (a member belongs to one record, and a
/// dead member is never referenced again), and it is retired as a payload
/// file is: unlinked once no reader may still see it. Members dead since
/// an earlier session are not known here: their packs wait for `gc()`.
#[derive(Debug, Default)]
pub(crate) struct PackDeaths {
    /// pack id → (its member count, or `None` when unreadable; the ids
    /// of its dead members).
    packs: HashMap<String, (Option<u64>, HashSet<String>)>,
}

impl PackDeaths {
    /// Records the death of the packed payload `entry` (its record was
    /// replaced or deleted, and no new record keeps it); returns the
    /// pack's path relative to `root` when that was its last live member.
    pub(crate) fn died(&mut self, root: &Path, entry: &ArrayEntry) -> Option<String> {
        let pack = entry.pack.as_ref()?;
        let relpath = entry.relpath();
        let (total, dead) = self
            .packs
            .entry(pack.clone())
            .or_insert_with(|| (member_count(&root.join(&relpath)), HashSet::new()));
        dead.insert(entry.id.clone());
        let all = total.is_some_and(|t| dead.len() as u64 >= t);
        if all {
            self.packs.remove(pack);
            return Some(relpath);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem_of(bytes: &[u8]) -> Option<String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.npz");
        std::fs::write(&path, bytes).unwrap();
        zip_end_problem(&path, bytes.len() as u64).unwrap()
    }

    /// A zip of `members` stored members, as the zip crate writes it.
    fn zip_of(members: usize) -> Vec<u8> {
        use std::io::Write;
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for i in 0..members {
            w.start_file(format!("{i}.npy"), opts).unwrap();
            w.write_all(&[i as u8; 100]).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    /// An empty zip ending as CPython's zipfile ends a zip64 one: zip64
    /// end record, its locator, then the end record with its fields maxed.
    fn empty_zip64(record_at: u64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(ZIP64_EOCD_SIG.to_le_bytes());
        b.extend(44u64.to_le_bytes());
        b.extend([45, 0, 45, 0]);
        b.extend([0u8; 8]); // disks
        b.extend([0u8; 32]); // entries twice, central directory size and offset
        b.extend(ZIP64_LOCATOR_SIG.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(record_at.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend(EOCD_SIG.to_le_bytes());
        b.extend([0u8; 4]);
        b.extend([0xff; 12]);
        b.extend([0u8; 2]);
        b
    }

    #[test]
    fn the_zip_end_is_judged_from_the_tail() {
        for members in [0, 1, 3] {
            let zip = zip_of(members);
            assert_eq!(problem_of(&zip), None, "{members}");
            // cut: the end record gone, or the central directory cut
            assert!(problem_of(&zip[..zip.len() - 1]).is_some());
            if members > 0 {
                assert!(problem_of(&zip[..zip.len() - 23]).is_some());
            }
        }
        assert!(problem_of(b"short").unwrap().contains("5 bytes"));
        let zip64 = empty_zip64(0);
        assert_eq!(problem_of(&zip64), None);
        assert!(problem_of(&empty_zip64(8)).unwrap().contains("zip64"));
        // a central directory that does not start with a central header
        let mut zip = zip_of(2);
        let n = zip.len();
        let at = u32::from_le_bytes(zip[n - 6..n - 2].try_into().unwrap()) as usize;
        zip[at] ^= 1;
        assert!(problem_of(&zip)
            .unwrap()
            .contains("central directory header"));
    }
}
