//! Pack files kept open between reads of their members.
//!
//! Reading a small array is one `pread` of its pack; opening and closing
//! the pack around it cost as much again. Packs are immutable and never
//! renamed once in place, and their names are random ids never reused
//! (FORMAT.md, "Packs"), so a descriptor opened for a path reads the bytes
//! that path will hold for as long as it exists, and the same bytes after
//! it was removed. The process keeps a few recently read packs open, by
//! path, and every check of a read (header against the record, length)
//! still runs on each read.
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

use std::collections::HashMap;
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

#[derive(Default)]
struct OpenPacks {
    /// path → (the open pack, the tick of its last use).
    files: HashMap<PathBuf, (Arc<File>, u64)>,
    tick: u64,
}

fn cache() -> &'static Mutex<OpenPacks> {
    static CACHE: OnceLock<Mutex<OpenPacks>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

/// The pack at `path` (absolute), open for reading: a kept descriptor, or
/// one `open` makes (with the error `open` gives), kept for the next reads.
pub(crate) fn open(
    path: &Path,
    open: impl FnOnce(&Path) -> crate::Result<File>,
) -> crate::Result<Arc<File>> {
    let keep = path.is_absolute() && capacity() > 0;
    if keep {
        if let Ok(mut packs) = cache().try_lock() {
            packs.tick += 1;
            let tick = packs.tick;
            if let Some((file, used)) = packs.files.get_mut(path) {
                *used = tick;
                return Ok(Arc::clone(file));
            }
        }
    }
    let file = Arc::new(open(path)?);
    if keep {
        if let Ok(mut packs) = cache().try_lock() {
            if packs.files.len() >= capacity() {
                let oldest = packs
                    .files
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(p, _)| p.clone());
                if let Some(oldest) = oldest {
                    packs.files.remove(&oldest);
                }
            }
            let tick = packs.tick;
            packs
                .files
                .insert(path.to_owned(), (Arc::clone(&file), tick));
        }
    }
    Ok(file)
}

/// Closes the kept descriptor of `path`, if any (before lazyvault removes
/// the file, so that removing it frees its space).
pub(crate) fn forget(path: &Path) {
    forget_where(|p| p == path);
}

/// Closes the kept descriptors of every pack under `root` (a store's
/// directory: when its reader moves to a newer snapshot or closes).
pub(crate) fn forget_under(root: &Path) {
    forget_where(|p| p.starts_with(root));
}

fn forget_where(matches: impl Fn(&Path) -> bool) {
    // Not on the read path: waits briefly for the lock, but never blocks
    // for good (a lock a forked child inherited locked stays locked).
    for _ in 0..100 {
        match cache().try_lock() {
            Ok(mut packs) => {
                packs.files.retain(|p, _| !matches(p));
                return;
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                p.into_inner().files.retain(|p, _| !matches(p));
                return;
            }
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
}
