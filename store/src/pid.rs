//! This process's id for the fork checks every store call makes, without a
//! system call each time (`getpid` is one on Linux, and a record read makes
//! two store calls).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

/// The id read at first use, and read again in a child right after
/// `fork()` (a `pthread_atfork` handler); 0 until then, or when the
/// handler could not be registered (every call then asks the kernel).
static PID: AtomicU32 = AtomicU32::new(0);

/// This process's id, as `std::process::id()` gives it.
pub(crate) fn current() -> u32 {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        #[cfg(unix)]
        {
            extern "C" fn in_child() {
                // getpid is async-signal-safe: allowed after fork()
                PID.store(std::process::id(), Ordering::Relaxed);
            }
            // SAFETY: registers a handler that only stores an integer.
            if unsafe { libc::pthread_atfork(None, None, Some(in_child)) } == 0 {
                PID.store(std::process::id(), Ordering::Relaxed);
            }
        }
    });
    match PID.load(Ordering::Relaxed) {
        0 => std::process::id(),
        pid => pid,
    }
}

#[cfg(all(test, unix))]
mod tests {
    #[test]
    fn a_forked_child_sees_its_own_id() {
        let parent = super::current();
        assert_eq!(parent, std::process::id());
        // SAFETY: the child only compares two integers and exits.
        match unsafe { libc::fork() } {
            0 => {
                let ok = super::current() == std::process::id() && super::current() != parent;
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            child => {
                assert!(child > 0, "fork failed");
                let mut status = 0;
                // SAFETY: waits for the child just forked.
                assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
            }
        }
        assert_eq!(super::current(), parent);
    }
}
