//! Real-time set-up of a thread and the process: SCHED_FIFO, CPU affinity, mlockall, a
//! prefaulted stack, the allocator's large-allocation threshold. The
//! one implementation: the loop's threads, the daemon and the benchmarks all use it.
//!
//! Each step is optional and falls back with one clear log line when the system refuses
//! it (no CAP_SYS_NICE, RLIMIT_RTPRIO 0, RT group scheduling, a container): the loop
//! still runs, with worse jitter, and says so.

// Real-time set-up: the SCHED_FIFO syscall nix does not wrap.
#![allow(unsafe_code)]

use nix::sched::{sched_setaffinity, CpuSet};
use nix::sys::mman::{mlockall, MlockAllFlags};
use nix::unistd::Pid;

/// `MCL_ONFAULT` (Linux 4.4+; the same value on x86_64 and aarch64), which nix 0.29 lacks.
const MCL_ONFAULT: i32 = 4;

/// Large allocations (>= 128 KiB) each get their own mapping, returned to the system when
/// freed. glibc otherwise raises its mmap threshold after the first large free, so a
/// reload's multi-MB buffers (a bundle's contexts, a gate that fails and is dropped) come
/// from the heap and stay there as fragments: RSS that a fleet daemon never gives back.
/// Allocations happen at load and reload only, never on the hot path. False (and one
/// log line) when glibc refuses.
pub fn fix_large_allocations() -> bool {
    // SAFETY: mallopt only sets an allocator parameter; glibc serializes it with
    // allocations, and a valid option/value pair cannot corrupt its state.
    let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) } == 1;
    if !ok {
        log::warn!("mallopt(M_MMAP_THRESHOLD) refused; large buffers freed at a reload may stay in the heap");
    }
    ok
}

/// Locks current and future pages so the loop never page-faults on its buffers.
pub fn lock_memory() -> bool {
    lock(
        MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE,
        "mlockall",
    )
}

/// Locks current and future pages as they are faulted in (`MCL_ONFAULT`), for a process
/// that maps large files it must not pin.
///
/// `mlockall(MCL_CURRENT | MCL_FUTURE)` populates and pins every mapping, including
/// gigabytes of mapped context binaries on a real bundle. With `MCL_ONFAULT` a page is
/// locked only once touched: the buffers the loop uses (all touched by the parity gate
/// before the loop starts) stay locked, while the binaries, which `vla-qnn` unlocks when
/// it maps them and unmaps once their contexts exist, are never pinned.
pub fn lock_memory_on_fault() -> bool {
    lock(
        MlockAllFlags::MCL_CURRENT
            | MlockAllFlags::MCL_FUTURE
            | MlockAllFlags::from_bits_retain(MCL_ONFAULT),
        "mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)",
    )
}

fn lock(flags: MlockAllFlags, call: &str) -> bool {
    match mlockall(flags) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("{call} refused ({e}); pages may be swapped or faulted in on the hot path (raise LimitMEMLOCK)");
            false
        }
    }
}

/// Pins the calling thread to `cpus` (empty: leave as is).
pub fn pin_current_thread(what: &str, cpus: &[usize]) -> bool {
    if cpus.is_empty() {
        return true;
    }
    let mut set = CpuSet::new();
    for &c in cpus {
        if set.set(c).is_err() {
            log::warn!("{what}: CPU {c} is out of range; affinity left unchanged");
            return false;
        }
    }
    match sched_setaffinity(Pid::from_raw(0), &set) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("{what}: CPU affinity {cpus:?} refused ({e}); running unpinned");
            false
        }
    }
}

/// Bytes of stack [`prefault_stack`] touches: far more than the loop's threads use (a
/// few KiB) and far less than a thread's stack (2 MiB by default).
pub const STACK_PREFAULT: usize = 128 * 1024;

/// Touches [`STACK_PREFAULT`] bytes of the calling thread's stack now, so that under
/// `mlockall(MCL_FUTURE | MCL_ONFAULT)` ([`lock_memory_on_fault`]) those pages are faulted
/// in and locked at start-up rather than on the first deep call of the hot path (a page
/// fault there is microseconds, more with the page cache under pressure).
#[inline(never)]
pub fn prefault_stack() {
    let mut stack = [0u8; STACK_PREFAULT];
    for page in stack.chunks_mut(4096) {
        page[0] = 1;
    }
    std::hint::black_box(&mut stack);
}

/// Puts the calling thread under SCHED_FIFO at `priority` (0: leave SCHED_OTHER).
pub fn set_fifo_priority(what: &str, priority: u8) -> bool {
    if priority == 0 {
        return true;
    }
    let param = libc::sched_param {
        sched_priority: priority as libc::c_int,
    };
    // SAFETY: plain syscall wrapper; pid 0 is the calling thread and `param` outlives it.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc == 0 {
        true
    } else {
        let e = std::io::Error::last_os_error();
        log::warn!("{what}: SCHED_FIFO priority {priority} refused ({e}); running SCHED_OTHER (needs CAP_SYS_NICE or LimitRTPRIO)");
        false
    }
}

#[cfg(test)]
mod tests {
    /// Minor page faults of the calling thread so far (field 10 of its `stat`), read into
    /// a buffer on the stack: a heap allocation could fault in a page of the thread's
    /// malloc arena and be counted.
    fn minor_faults() -> u64 {
        use std::io::Read;
        let mut buf = [0u8; 1024];
        let mut f = std::fs::File::open("/proc/thread-self/stat").expect("/proc/thread-self/stat");
        let n = f.read(&mut buf).expect("read stat");
        let stat = std::str::from_utf8(&buf[..n]).expect("ASCII");
        let rest = &stat[stat.rfind(')').expect("comm") + 1..];
        rest.split_whitespace()
            .nth(7)
            .expect("minflt")
            .parse()
            .expect("a count")
    }

    /// Writes one byte per page of 96 KiB of stack (inside what the prefault touches).
    #[inline(never)]
    fn use_stack() {
        let mut deep = [0u8; 96 * 1024];
        for page in deep.chunks_mut(4096) {
            page[0] = 2;
        }
        std::hint::black_box(&mut deep);
    }

    #[test]
    fn a_prefaulted_stack_takes_no_page_faults_when_used() {
        let faults_after = |prefault: bool| {
            std::thread::spawn(move || {
                if prefault {
                    super::prefault_stack();
                }
                minor_faults();
                let before = minor_faults();
                use_stack();
                minor_faults() - before
            })
            .join()
            .unwrap()
        };
        // A fresh thread faults its stack pages in as it first uses them (unless the
        // kernel backed the stack with a huge page), a prefaulted one did so before.
        let fresh = faults_after(false);
        assert_eq!(
            faults_after(true),
            0,
            "faults after the prefault (fresh thread: {fresh})"
        );
    }
}
