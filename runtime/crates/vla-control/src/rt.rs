//! Real-time set-up of a thread and the process: SCHED_FIFO, CPU affinity, mlockall.
//!
//! Each step is optional and falls back with one clear log line when the system refuses
//! it (no CAP_SYS_NICE, RLIMIT_RTPRIO 0, RT group scheduling, a container): the loop
//! still runs, with worse jitter, and says so.

// Real-time set-up: the SCHED_FIFO syscall nix does not wrap.
#![allow(unsafe_code)]

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Locks current and future pages so the loop never page-faults on its buffers.
pub fn lock_memory() -> bool {
    use nix::sys::mman::{mlockall, MlockAllFlags};
    match mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("mlockall refused ({e}); pages may be swapped or faulted in on the hot path (raise LimitMEMLOCK)");
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
