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
