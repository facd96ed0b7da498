//! A join allocates nothing, whether the caller finds the answer while polling or has to
//! sleep on it, and whether the helper was busy or asleep: the pipelines join on the
//! inference thread's critical path.
//!
//! Only the join's two threads are counted (the caller and the helper, by tid): libtest's
//! own main thread allocates on its first wait for a test's result, and on a busy machine
//! that wait can fall inside this short measurement.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vla_alloc_count::{allocations, current_tid, watch, watch_all, watched_allocations};
use vla_fork::Fork;

#[test]
fn a_join_allocates_nothing_on_any_path() {
    let helper_tid = Arc::new(AtomicI32::new(0));
    let mut fork = Fork::start("vla-fork-alloc", {
        let helper_tid = helper_tid.clone();
        move || helper_tid.store(current_tid(), Ordering::Release)
    })
    .unwrap();
    let mut buf = vec![0f32; 1 << 16];
    let run = |fork: &mut Fork, buf: &mut [f32], slow_helper: bool| {
        let (lo, hi) = buf.split_at_mut(1 << 15);
        fork.join(
            || lo.iter_mut().for_each(|v| *v += 1.0),
            || {
                if slow_helper {
                    // Past the caller's polling: it sleeps on the answer.
                    std::thread::sleep(Duration::from_millis(3));
                }
                hi.iter_mut().for_each(|v| *v += 2.0);
            },
        )
        .unwrap();
    };
    run(&mut fork, &mut buf, false);
    // The set-up ran before the first job: the helper's tid is known now.
    let helper = helper_tid.load(Ordering::Acquire);
    assert_ne!(helper, 0, "the helper's set-up ran");
    assert_ne!(helper, current_tid(), "the helper is another thread");

    // The count sees both threads: an allocation in either half is counted.
    watch_all(&[current_tid(), helper]);
    let before = watched_allocations();
    let process_before = allocations();
    fork.join(
        || drop(std::hint::black_box(vec![1u8; 8])),
        || drop(std::hint::black_box(vec![2u8; 8])),
    )
    .unwrap();
    assert_eq!(
        watched_allocations() - before,
        2,
        "the probe's two allocations"
    );
    assert!(allocations() - process_before >= 2);

    let before = watched_allocations();
    for i in 0..40 {
        run(&mut fork, &mut buf, i % 4 == 1);
        if i % 4 == 2 {
            // The helper goes to sleep waiting for the next job.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let n = watched_allocations() - before;
    watch(0);
    assert_eq!(n, 0, "allocations by the caller and the helper in 40 joins");
    assert_eq!(buf[0], 41.0);
    assert_eq!(buf[1 << 15], 82.0);
}
