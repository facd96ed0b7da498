//! A join allocates nothing, whether the caller finds the answer while polling or has to
//! sleep on it, and whether the helper was busy or asleep: the pipelines join on the
//! inference thread's critical path.

use std::time::Duration;
use vla_alloc_count::allocations;
use vla_fork::Fork;

#[test]
fn a_join_allocates_nothing_on_any_path() {
    let mut fork = Fork::start("vla-fork-alloc", || {}).unwrap();
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
    let before = allocations();
    for i in 0..40 {
        run(&mut fork, &mut buf, i % 4 == 1);
        if i % 4 == 2 {
            // The helper goes to sleep waiting for the next job.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    assert_eq!(allocations() - before, 0, "allocations in 40 joins");
    assert_eq!(buf[0], 41.0);
    assert_eq!(buf[1 << 15], 82.0);
}
