//! What the QNN libraries print on standard output while they load. The HTP emulator's
//! libQnnHtp.so prints ` # LIBNATIVE: No alternate configuration present ...` from its
//! initializer, at `dlopen`, straight to fd 1 (not through QNN's log callback, which does
//! not exist yet), so it landed in the middle of a command's report. [`capture`] runs the
//! load with fd 1 pointed at an in-memory file; afterwards those banner lines go to the
//! `qnn` log target (debug) and every other byte is written to the real standard output
//! unchanged, so no other message of the library is hidden.

// FFI: fd and C stdio calls around the load, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use std::io::{Read, Seek, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Mutex;

/// The emulator's banner lines (`libnative`'s thread-local-storage configuration notes).
const BANNER: &str = "# LIBNATIVE: ";

/// fd 1 is process-wide: two loads capturing at once would restore each other's files.
static REDIRECT: Mutex<()> = Mutex::new(());

/// Runs `load` with standard output captured (see the module doc). If fd 1 cannot be
/// redirected (closed, no memfd), `load` runs as it would have and prints what it prints.
pub(crate) fn capture<T>(load: impl FnOnce() -> T) -> T {
    let _one_at_a_time = REDIRECT.lock().unwrap_or_else(|p| p.into_inner());
    flush_stdout();
    let Some(redirect) = Redirect::start() else {
        return load();
    };
    let out = load();
    if let Some(bytes) = redirect.finish() {
        route(&bytes);
    }
    out
}

/// What was printed during the load: banner lines to the log, the rest to stdout.
fn route(bytes: &[u8]) {
    let (banner, rest) = split(bytes);
    for line in banner {
        log::debug!(target: "qnn", "{line}");
    }
    if !rest.is_empty() {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(&rest);
        let _ = stdout.flush();
    }
}

/// The banner lines (trimmed) and every other byte, in order.
fn split(bytes: &[u8]) -> (Vec<String>, Vec<u8>) {
    let (mut banner, mut rest) = (Vec::new(), Vec::new());
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        let text = String::from_utf8_lossy(line);
        if text.trim_start().starts_with(BANNER) {
            banner.push(text.trim().to_owned());
        } else {
            rest.extend_from_slice(line);
        }
    }
    (banner, rest)
}

/// Rust's and C's buffered standard output, written out to whatever fd 1 is now.
fn flush_stdout() {
    let _ = std::io::stdout().flush();
    // SAFETY: fflush(NULL) flushes every C stdio output stream; it takes no pointer of ours.
    unsafe { libc::fflush(core::ptr::null_mut()) };
}

/// fd 1 pointed at a memfd, and the original fd 1 kept to put back.
struct Redirect {
    saved: OwnedFd,
    memfd: OwnedFd,
}

impl Redirect {
    fn start() -> Option<Self> {
        // SAFETY: the name is a NUL-terminated literal; the result is checked.
        let memfd =
            unsafe { libc::memfd_create(c"vla-qnn-load-stdout".as_ptr(), libc::MFD_CLOEXEC) };
        if memfd < 0 {
            return None;
        }
        // SAFETY: `memfd` was just created and is owned by nothing else.
        let memfd = unsafe { OwnedFd::from_raw_fd(memfd) };
        // SAFETY: duplicates fd 1 (no pointers); the result is checked.
        let saved = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
        if saved < 0 {
            return None;
        }
        // SAFETY: `saved` was just created and is owned by nothing else.
        let saved = unsafe { OwnedFd::from_raw_fd(saved) };
        use std::os::fd::AsRawFd;
        // SAFETY: both fds are open; dup2 atomically repoints fd 1.
        if unsafe { libc::dup2(memfd.as_raw_fd(), 1) } < 0 {
            return None;
        }
        Some(Self { saved, memfd })
    }

    /// Puts the original fd 1 back and returns what was written meanwhile.
    fn finish(self) -> Option<Vec<u8>> {
        use std::os::fd::AsRawFd;
        flush_stdout();
        // SAFETY: both fds are open; dup2 atomically repoints fd 1 at the original file.
        unsafe { libc::dup2(self.saved.as_raw_fd(), 1) };
        let mut file = std::fs::File::from(self.memfd);
        file.rewind().ok()?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).ok()?;
        Some(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn only_the_banner_is_taken_out_of_what_the_library_printed() {
        let printed = b" # LIBNATIVE: No alternate configuration present in libnative_tls.conf - using default thread-local behavior.\n\
LIBNATIVE - Error: malloc failed for thread_t.\n\
 # LIBNATIVE: config file detected - enabling thread local storage\n\
something else\n\
no newline at the end";
        let (banner, rest) = split(printed);
        assert_eq!(banner.len(), 2, "{banner:?}");
        assert!(banner.iter().all(|l| l.starts_with("# LIBNATIVE: ")));
        assert_eq!(
            String::from_utf8(rest).unwrap(),
            "LIBNATIVE - Error: malloc failed for thread_t.\nsomething else\nno newline at the end"
        );
    }
}
