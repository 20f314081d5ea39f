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
        /// Operations seen since the plan was set.
        seen: u64,
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
        *PLAN.lock().unwrap_or_else(|p| p.into_inner()) = Some(Plan {
            seen: 0,
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

    /// Every operation from the `n`th on fails with `errno` (a full disk).
    pub fn fail_from(n: u64, errno: i32) {
        set(n, errno, true);
    }

    /// Counts operations without failing any (to learn how many a call makes).
    pub fn count() {
        set(u64::MAX, 0, false);
    }

    /// Ends the plan; returns how many operations ran under it and which
    /// ones failed.
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
        plan.seen += 1;
        let fails = if plan.sticky {
            plan.seen >= plan.first
        } else {
            plan.seen == plan.first
        };
        if fails {
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

/// Renames `from` to `to` atomically (replacing `to` if present).
pub(crate) fn rename(from: &Path, to: &Path) -> io::Result<()> {
    fault::check("rename", to)?;
    fs::rename(from, to)
}

/// Removes a file.
pub(crate) fn remove_file(path: &Path) -> io::Result<()> {
    fault::check("unlink", path)?;
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
