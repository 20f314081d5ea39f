//! Every file operation the store performs on its own files goes through
//! here, so a test can make the Nth one fail ([`fault`]) and check that the
//! store reports it, stays usable and loses nothing committed.
//!
//! sled's own file I/O is not routed here; the index operations that can
//! fail are injected at the same counter by `index.rs` (op `"index"`).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Fault injection for tests: make the Nth store file operation fail with
/// a chosen `errno` (`ENOSPC`, `EIO`, ...). Process-wide: tests that use it
/// must not run store operations concurrently with each other.
#[doc(hidden)]
pub mod fault {
    use std::io;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    struct Plan {
        /// Operations seen since the plan was set (only those named `only`,
        /// if set).
        seen: u64,
        only: Option<String>,
        /// 1-based number of the first operation to fail.
        first: u64,
        /// Fail every operation from `first` on (a full disk), or only it.
        sticky: bool,
        errno: i32,
        /// Operations that failed, as `"op path"`.
        failed: Vec<String>,
    }

    static ACTIVE: AtomicBool = AtomicBool::new(false);
    static PLAN: Mutex<Option<Plan>> = Mutex::new(None);

    fn set(first: u64, errno: i32, sticky: bool) {
        set_only(None, first, errno, sticky);
    }

    fn set_only(only: Option<String>, first: u64, errno: i32, sticky: bool) {
        *PLAN.lock().unwrap_or_else(|p| p.into_inner()) = Some(Plan {
            seen: 0,
            only,
            first,
            sticky,
            errno,
            failed: Vec::new(),
        });
        ACTIVE.store(true, Ordering::SeqCst);
    }

    /// The `n`th operation from now (1-based) fails with `errno`; the others
    /// succeed.
    pub fn fail_nth(n: u64, errno: i32) {
        set(n, errno, false);
    }

    /// The `n`th operation named `op` from now (`"create"`, `"write"`,
    /// `"fsync"`, `"syncfs"`, `"rename"`, `"index"`, ...) fails with `errno`;
    /// all others succeed. Unlike [`fail_nth`], this reaches every
    /// operation of a kind even when the number of other operations varies
    /// from run to run (directories created or not for random payload ids).
    pub fn fail_nth_of(op: &str, n: u64, errno: i32) {
        set_only(Some(op.to_owned()), n, errno, false);
    }

    /// Every operation from the `n`th on fails with `errno` (a full disk).
    pub fn fail_from(n: u64, errno: i32) {
        set(n, errno, true);
    }

    /// Every operation named `op` fails with `errno` from now on (a file
    /// system without locks: `fail_all_of("flock", ENOLCK)`).
    pub fn fail_all_of(op: &str, errno: i32) {
        set_only(Some(op.to_owned()), 1, errno, true);
    }

    /// Counts operations without failing any (to learn how many a call
    /// makes); [`clear`] then lists them all as `"op path"`.
    pub fn count() {
        set(u64::MAX, 0, false);
    }

    /// Ends the plan; returns how many operations ran under it and which
    /// ones failed (all of them, under [`count`]).
    pub fn clear() -> (u64, Vec<String>) {
        ACTIVE.store(false, Ordering::SeqCst);
        match PLAN.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(p) => (p.seen, p.failed),
            None => (0, Vec::new()),
        }
    }

    /// Called before each operation: the injected error, if this one fails.
    pub(crate) fn check(op: &str, path: &std::path::Path) -> io::Result<()> {
        if !ACTIVE.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut guard = PLAN.lock().unwrap_or_else(|p| p.into_inner());
        let Some(plan) = guard.as_mut() else {
            return Ok(());
        };
        if plan.only.as_deref().is_some_and(|only| only != op) {
            return Ok(());
        }
        plan.seen += 1;
        let fails = if plan.sticky {
            plan.seen >= plan.first
        } else {
            plan.seen == plan.first
        };
        if plan.first == u64::MAX {
            plan.failed.push(format!("{op} {}", path.display()));
        } else if fails {
            plan.failed.push(format!("{op} {}", path.display()));
            return Err(io::Error::from_raw_os_error(plan.errno));
        }
        Ok(())
    }
}

/// Creates `path` for writing, emptying it if present (a temporary file
/// left by a crash is simply reused).
pub(crate) fn create(path: &Path) -> io::Result<File> {
    fault::check("create", path)?;
    File::create(path)
}

/// Writes all of `bytes` to `file` (named `path` for fault reports).
pub(crate) fn write_all(file: &mut File, path: &Path, bytes: &[u8]) -> io::Result<()> {
    fault::check("write", path)?;
    file.write_all(bytes)
}

/// Writes all of `bytes` to `file`, whose write position is `at`, in
/// pieces that end on multiples of [`WRITE_CHUNK`] in the file, calling
/// `each(piece)` just before each piece is written: a pass over the data (a
/// checksum) then reads it while it is still in the CPU cache, instead of
/// in a second sweep over memory. One operation for fault injection, like
/// [`write_all`].
pub(crate) fn write_all_with(
    file: &mut File,
    path: &Path,
    at: usize,
    bytes: &[u8],
    mut each: impl FnMut(&[u8]),
) -> io::Result<()> {
    fault::check("write", path)?;
    let mut rest = bytes;
    let mut at = at;
    while !rest.is_empty() {
        let (piece, tail) = rest.split_at(rest.len().min(WRITE_CHUNK - at % WRITE_CHUNK));
        each(piece);
        file.write_all(piece)?;
        at += piece.len();
        rest = tail;
    }
    Ok(())
}

/// Piece size of [`write_all_with`]. Writes this large, aligned to it in
/// the file, let the kernel cache the file in large folios: a memory map of
/// it then takes one page fault per 2 MiB instead of one per 64-256 KiB
/// (measured: 128 against 1,028 faults for 256 MiB written in 256 KiB
/// pieces; a `.npy` header written first had misaligned every piece). Still
/// small enough to stay in the CPU's last-level cache for the checksum.
pub(crate) const WRITE_CHUNK: usize = 4 << 20;

/// fsyncs a file's data and metadata.
pub(crate) fn sync_file(file: &File, path: &Path) -> io::Result<()> {
    fault::check("fsync", path)?;
    file.sync_all()
}

/// fsyncs a directory, making the renames and creations in it durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    fault::check("fsync-dir", dir)?;
    File::open(dir)?.sync_all()
}

/// Opens a directory to use with [`sync_fs`]. Open it before writing the
/// files the barrier covers: `syncfs` reports the write-back errors that
/// happened since the descriptor was opened.
pub(crate) fn open_dir(dir: &Path) -> io::Result<File> {
    fault::check("open-dir", dir)?;
    File::open(dir)
}

/// `syncfs(2)`: makes everything written to the file system holding `dir`
/// durable (file data, inodes, directory entries) with one journal commit
/// and one cache flush, reporting write-back errors since `dir` was opened
/// (Linux 5.8 and later).
#[cfg(target_os = "linux")]
pub(crate) fn sync_fs(dir: &File, path: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    fault::check("syncfs", path)?;
    // SAFETY: syncfs only reads the descriptor, which `dir` keeps open.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes an unprivileged process may still write on the file system
/// holding `dir` (`statvfs(2)`: `f_bavail * f_frsize`).
#[cfg(target_os = "linux")]
pub(crate) fn free_space(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    fault::check("statvfs", dir)?;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs writes into the zeroed struct we own; path is a valid
    // NUL-terminated string.
    let mut buf: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut buf) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((buf.f_bavail as u64).saturating_mul(buf.f_frsize as u64))
}

/// Unknown elsewhere: no check.
#[cfg(not(target_os = "linux"))]
pub(crate) fn free_space(_dir: &Path) -> io::Result<u64> {
    Ok(u64::MAX)
}

/// `flock(LOCK_EX | LOCK_NB)`, or `LOCK_SH` with `shared` (Rust's
/// `File::try_lock`), through fault injection as operation `"flock"`.
pub(crate) fn try_lock(
    file: &File,
    path: &Path,
    shared: bool,
) -> std::result::Result<(), fs::TryLockError> {
    fault::check("flock", path).map_err(fs::TryLockError::Error)?;
    if shared {
        file.try_lock_shared()
    } else {
        file.try_lock()
    }
}

/// Renames `from` to `to` atomically (replacing `to` if present).
pub(crate) fn rename(from: &Path, to: &Path) -> io::Result<()> {
    fault::check("rename", to)?;
    fs::rename(from, to)
}

/// Removes a file.
pub(crate) fn remove_file(path: &Path) -> io::Result<()> {
    fault::check("unlink", path)?;
    // a pack kept open would keep its space after the unlink
    crate::open_packs::forget(path);
    fs::remove_file(path)
}

/// Cuts a file to `len` bytes.
pub(crate) fn truncate(file: &File, path: &Path, len: u64) -> io::Result<()> {
    fault::check("truncate", path)?;
    file.set_len(len)
}

/// Creates a directory and its parents.
pub(crate) fn create_dir_all(dir: &Path) -> io::Result<()> {
    fault::check("mkdir", dir)?;
    fs::create_dir_all(dir)
}

/// Writes `contents` to a new file `path` crash-safely: to `tmp`, fsync,
/// rename over `path`. The caller fsyncs the directory. On error the
/// temporary file is removed (best effort) and `path` is untouched.
pub(crate) fn write_new_file(path: &Path, tmp: &Path, parts: &[&[u8]]) -> io::Result<()> {
    let written = (|| {
        let mut f = create(tmp)?;
        for part in parts {
            write_all(&mut f, tmp, part)?;
        }
        sync_file(&f, tmp)?;
        rename(tmp, path)
    })();
    if written.is_err() {
        let _ = remove_file(tmp);
    }
    written
}

#[cfg(test)]
mod write_tests {
    use super::*;

    #[test]
    fn write_all_with_ends_pieces_on_chunk_multiples_of_the_file_and_writes_everything() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut file = File::create(&path).unwrap();
        let header = [7u8; 128];
        file.write_all(&header).unwrap();
        let data: Vec<u8> = (0..2 * WRITE_CHUNK + 1000)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut pieces = Vec::new();
        write_all_with(&mut file, &path, header.len(), &data, |p| {
            pieces.push(p.len())
        })
        .unwrap();
        assert_eq!(
            pieces,
            [WRITE_CHUNK - 128, WRITE_CHUNK, 1128],
            "pieces end where the file reaches a multiple of WRITE_CHUNK"
        );
        drop(file);
        let written = std::fs::read(&path).unwrap();
        assert_eq!(&written[..128], &header);
        assert_eq!(&written[128..], &data[..]);
    }
}
