//! One inference after warm-up allocates nothing on the Rust heap (a counting global
//! allocator proves it). The QNN backend's own C++ allocations are outside this count.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use vla_policy::{Bundle, ObservationFile, Policy};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs as one test so no other test thread allocates while counting.
#[test]
fn steady_state_inference_allocates_nothing() {
    // The counter itself works: an allocation while counting is seen.
    COUNTING.store(true, Ordering::SeqCst);
    let probe = std::hint::black_box(vec![1u8; 64]);
    COUNTING.store(false, Ordering::SeqCst);
    assert!(ALLOCATIONS.load(Ordering::SeqCst) >= 1 && probe.len() == 64);

    let Some(backend) = common::backend() else {
        return;
    };
    for name in [
        "molmoact2-drift-keystone",
        "molmoact2-lp-vtp-sd",
        "fastwam",
        "fastwam-closed-loop",
    ] {
        let bundle = Bundle::open(common::fixture(name)).unwrap();
        let mut policy = Policy::load(&bundle, &backend).unwrap();
        let obs = ObservationFile::load(&bundle.path("golden/end_to_end.npz")).unwrap();
        let g = policy.geometry();
        let mut actions = vec![0f32; g.chunk_len * g.action_dims];
        policy.infer(&obs.observation(), &mut actions).unwrap();
        let before = actions.clone();

        ALLOCATIONS.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
        let result = policy.infer(&obs.observation(), &mut actions);
        COUNTING.store(false, Ordering::SeqCst);
        result.unwrap();
        let n = ALLOCATIONS.load(Ordering::SeqCst);
        assert_eq!(
            n, 0,
            "{name}: {n} heap allocations in one steady-state inference"
        );
        assert_eq!(
            actions, before,
            "{name}: same observation and seed give the same actions"
        );
    }
}
