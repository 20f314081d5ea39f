//! Pack files kept open between reads of their members.
//!
//! Reading a small array is one `pread` of its pack; opening and closing
//! the pack around it cost as much again. Packs are immutable and never
//! renamed once in place, and their names are random ids never reused
//! (FORMAT.md, "Packs"), so a descriptor opened for a path reads the bytes
//! that path will hold for as long as it exists, and the same bytes after
//! it was removed. The process keeps a few recently read packs open, by
//! store directory and pack id (the id as a number: a read formats no path
//! and hashes none), and every check of a read (header against the
//! record, length) still runs on each read.
//!
//! A kept descriptor holds the disk space of a pack another process
//! removed: lazyvault's own removals ([`crate::fsio::remove_file`]) drop
//! the descriptor first, and a reader drops those of its store when it
//! refreshes or closes ([`forget_under`]); until then its snapshot keeps
//! those packs anyway (same host). At most [`capacity`] are kept.
//!
//! The lock is only ever tried (`try_lock`) on the read path, never waited
//! for, and is never held across I/O: a contended or poisoned lock, or one
//! a forked child inherited locked, only means the pack is opened for this
//! read as before. After `fork()` a child shares the kept descriptors,
//! which is harmless: reads use `pread`, which has no file position.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The most packs kept open: 64, or one 32nd of the process's limit on
/// open files (`RLIMIT_NOFILE`, read at first use) when that is lower, so
/// that the cache never takes the descriptors a program needs.
pub(crate) fn capacity() -> usize {
    static CAPACITY: OnceLock<usize> = OnceLock::new();
    *CAPACITY.get_or_init(|| (nofile_limit() / 32).min(64) as usize)
}

#[cfg(unix)]
fn nofile_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not everywhere
    let current = limit.rlim_cur as u64;
    current
}

#[cfg(not(unix))]
fn nofile_limit() -> u64 {
    // Windows refuses to remove a file that is open: keep none.
    0
}

/// A kept pack: its store directory, id, descriptor and last use.
struct Kept {
    root: PathBuf,
    id: u128,
    file: Arc<File>,
    used: u64,
}

#[derive(Default)]
struct OpenPacks {
    /// At most [`capacity`] (64): a scan of the ids beats hashing a key.
    files: Vec<Kept>,
    tick: u64,
}

fn cache() -> &'static Mutex<OpenPacks> {
    static CACHE: OnceLock<Mutex<OpenPacks>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

/// A pack id (32 lowercase hex digits, checked by the caller) as a number;
/// `None` for anything else.
fn id_of(pack: &str) -> Option<u128> {
    if pack.len() != 32 || !pack.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u128::from_str_radix(pack, 16).ok()
}

/// The pack `pack` (its id) of the store at `root` (absolute), open for
/// reading: a kept descriptor, or one `open` makes (with the error `open`
/// gives), kept for the next reads.
pub(crate) fn open(
    root: &Path,
    pack: &str,
    open: impl FnOnce() -> crate::Result<File>,
) -> crate::Result<Arc<File>> {
    let id = id_of(pack).filter(|_| root.is_absolute() && capacity() > 0);
    let Some(id) = id else {
        return open().map(Arc::new);
    };
    if let Ok(mut packs) = cache().try_lock() {
        packs.tick += 1;
        let tick = packs.tick;
        if let Some(kept) = packs
            .files
            .iter_mut()
            .find(|k| k.id == id && k.root.as_os_str() == root.as_os_str())
        {
            kept.used = tick;
            return Ok(Arc::clone(&kept.file));
        }
    }
    let file = Arc::new(open()?);
    if let Ok(mut packs) = cache().try_lock() {
        // The same id under another directory (a copied store) is
        // replaced: one descriptor per id.
        packs.files.retain(|k| k.id != id);
        if packs.files.len() >= capacity() {
            let oldest = (0..packs.files.len()).min_by_key(|&i| packs.files[i].used);
            if let Some(oldest) = oldest {
                packs.files.swap_remove(oldest);
            }
        }
        let used = packs.tick;
        packs.files.push(Kept {
            root: root.to_owned(),
            id,
            file: Arc::clone(&file),
            used,
        });
    }
    Ok(file)
}

/// Closes the kept descriptor of the pack at `path`, if any (before
/// lazyvault removes the file, so that removing it frees its space).
pub(crate) fn forget(path: &Path) {
    let pack = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".npz"))
        .and_then(id_of);
    let Some(id) = pack else {
        return; // not a pack: none kept
    };
    forget_where(|k| {
        k.id == id
            && k.root
                .join(lazyvault_schema::pack_relpath(&format!("{id:032x}")))
                == path
    });
}

/// Closes the kept descriptors of every pack under `root` (a store's
/// directory: when its reader moves to a newer snapshot or closes).
pub(crate) fn forget_under(root: &Path) {
    forget_where(|k| k.root.starts_with(root));
}

fn forget_where(matches: impl Fn(&Kept) -> bool) {
    // Not on the read path: waits briefly for the lock, but never blocks
    // for good (a lock a forked child inherited locked stays locked).
    for _ in 0..100 {
        match cache().try_lock() {
            Ok(mut packs) => {
                packs.files.retain(|k| !matches(k));
                return;
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                p.into_inner().files.retain(|k| !matches(k));
                return;
            }
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
}
