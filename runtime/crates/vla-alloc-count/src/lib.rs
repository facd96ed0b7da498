//! A counting global allocator: every heap allocation of the process, and separately
//! those made by a few watched threads (by kernel thread id), so a benchmark or a test can
//! report allocations per inference or per control-loop tick (the target is zero after
//! warm-up) without instrumenting the code it measures. Linking this crate installs it
//! (`#[global_allocator]`): only benchmarks and tests depend on it.
//!
//! The watched thread is named by its tid (`gettid`), not by a handle, because the thread
//! to watch (the control loop's `vla-publisher`) is spawned inside `vla-control`, which
//! hands out no handle: the caller finds its tid in `/proc/self/task` (vla-bench's
//! `loop_jitter`, vla-recorder's publish-path test). `gettid` is a syscall, so it is only made while a thread is
//! watched.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// How many threads can be watched at once (a join's caller and helper need two).
pub const MAX_WATCHED: usize = 4;
/// Kernel tids of the watched threads; 0: a free slot. The first slot being 0 means none
/// is watched, so an unwatched process makes no syscall.
static WATCHED_TIDS: [AtomicI32; MAX_WATCHED] = [const { AtomicI32::new(0) }; MAX_WATCHED];
static WATCHED_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

#[inline]
fn count() {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    if WATCHED_TIDS[0].load(Ordering::Relaxed) == 0 {
        return;
    }
    let tid = current_tid();
    if WATCHED_TIDS
        .iter()
        .any(|watched| watched.load(Ordering::Relaxed) == tid)
    {
        WATCHED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Kernel thread id of the calling thread.
pub fn current_tid() -> i32 {
    // SAFETY: gettid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::gettid() }
}

// SAFETY: forwards to the system allocator unchanged; only counts calls (with atomics and
// a syscall, neither of which allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations (including reallocations) made by the whole process so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Starts counting the allocations of the thread with kernel id `tid` (0: stop watching).
/// The count is cumulative over every thread ever watched: take differences.
pub fn watch(tid: i32) {
    watch_all(&[tid]);
}

/// Counts the allocations of every thread in `tids` (at most [`MAX_WATCHED`]; empty: stop
/// watching), e.g. the two threads of a fork-join. Counting only named threads keeps a
/// test harness's own threads (libtest's main thread allocates on its first wait for a
/// result, which may fall inside a short measurement) out of the count.
pub fn watch_all(tids: &[i32]) {
    assert!(
        tids.len() <= MAX_WATCHED,
        "at most {MAX_WATCHED} watched threads"
    );
    // Slot 0 is the "anything watched" flag: cleared first and set last, so the other
    // slots never count for an earlier set while a new one is written.
    WATCHED_TIDS[0].store(0, Ordering::Relaxed);
    for (i, slot) in WATCHED_TIDS.iter().enumerate().skip(1) {
        slot.store(tids.get(i).copied().unwrap_or(0), Ordering::Relaxed);
    }
    WATCHED_TIDS[0].store(tids.first().copied().unwrap_or(0), Ordering::Relaxed);
}

/// Allocations made by watched threads while they were watched.
pub fn watched_allocations() -> u64 {
    WATCHED_ALLOCATIONS.load(Ordering::Relaxed)
}

/// Serializes the tests that watch a thread (there is one watched tid per process).
pub static WATCH_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::black_box;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn counts_the_watched_thread_only() {
        let _guard = WATCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let tid = Arc::new(AtomicI32::new(0));
        let go = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let worker = {
            let (tid, go, done) = (tid.clone(), go.clone(), done.clone());
            std::thread::spawn(move || {
                tid.store(current_tid(), Ordering::Release);
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                for i in 0..7u32 {
                    black_box(Box::new(i));
                }
                done.store(true, Ordering::Release);
            })
        };
        while tid.load(Ordering::Acquire) == 0 {
            std::hint::spin_loop();
        }
        let watched_tid = tid.load(Ordering::Acquire);
        assert_ne!(watched_tid, current_tid());
        watch(watched_tid);
        let before = watched_allocations();
        // This (unwatched) thread allocates while the worker waits: not counted.
        for i in 0..50u32 {
            black_box(vec![i; 4]);
        }
        assert_eq!(watched_allocations(), before);
        go.store(true, Ordering::Release);
        while !done.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        assert_eq!(watched_allocations() - before, 7);
        watch(0);
        worker.join().unwrap();
        black_box(Box::new(1u8));
        assert_eq!(watched_allocations() - before, 7);
    }
}
