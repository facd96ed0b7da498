//! A trial's healthy inferences are counted on the inference thread without ever waiting
//! for the store's lock, which an installer holds for as long as it copies and hashes a
//! bundle. The installer is played by this test holding the real `flock` on `ota.lock`
//! (as long as it likes: a deterministic stand-in for minutes of copying), then by a real
//! install running alongside.

mod common;

use common::*;
use nix::fcntl::{Flock, FlockArg};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vla_ota::{TrialRecorder, Verdict};

/// Generous bound for work that takes microseconds: only turns a thread stuck behind the
/// lock into a failure instead of a hang. Nothing is timed against it.
const PATIENCE: Duration = vla_test_support::HANG_GUARD;

/// Inferences the "inference thread" reports while the installer holds the lock.
const INFERENCES: u64 = 10_000;

#[test]
fn inferences_on_trial_never_wait_for_an_installer_holding_the_lock() {
    let tmp = TempDir::new("trial-lock");
    let root = tmp.join("root");
    let store = Arc::new(store(&root));
    let install = |tag: &str| {
        store
            .install(&Spec::new(tag).build_signed(&tmp.join("src"), DEV_SECRET))
            .unwrap()
            .hash
    };
    let a = install("a");
    store.activate(&a, &mut pass).unwrap();
    store.commit().unwrap();
    let b = install("b");
    store.activate(&b, &mut pass).unwrap();
    assert_eq!(store.verdict(&b).unwrap(), Verdict::Pending);

    let recorder = Arc::new(TrialRecorder::start(store.clone(), b.clone(), true).unwrap());

    // The installer takes the lock and keeps it.
    let lock_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(root.join("ota.lock"))
        .unwrap();
    let installer = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .unwrap();

    // The inference thread: every inference reports itself healthy.
    let (done_tx, done_rx) = mpsc::channel();
    let inference = {
        let recorder = recorder.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            for _ in 0..INFERENCES {
                recorder.healthy();
            }
            done_tx.send(started.elapsed()).unwrap();
        })
    };
    // It finishes while the lock is still held: it never waited for it.
    let took = done_rx
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("the inference thread is stuck behind the installer's lock"));
    println!("{INFERENCES} healthy() calls with the store locked: {took:?}");
    inference.join().unwrap();
    // The recorder thread is waiting for the lock meanwhile: nothing was recorded yet,
    // the bundle is still on trial, and the state file is untouched.
    recorder.flush_soon();
    std::thread::sleep(vla_ota::FLUSH_INTERVAL * 2);
    assert_eq!(recorder.recorded(), 0);
    assert!(recorder.on_trial());
    assert_eq!(store.verdict(&b).unwrap(), Verdict::Pending);

    // The installer finishes (a real install runs now too): the counts land, the trial
    // commits, and the recorder stops counting.
    drop(installer);
    let c = install("c");
    let end = Instant::now() + PATIENCE;
    while store.verdict(&b).unwrap() != Verdict::Committed {
        assert!(Instant::now() < end, "the trial never committed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(recorder.recorded(), INFERENCES);
    while recorder.on_trial() {
        assert!(
            Instant::now() < end,
            "the recorder still counts after the commit"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(store.bundle_dir(&c).exists());
}

#[test]
fn counts_of_a_replaced_bundle_never_commit_the_next_one() {
    let tmp = TempDir::new("trial-swap");
    let root = tmp.join("root");
    let store = Arc::new(store(&root));
    let install = |tag: &str| {
        store
            .install(&Spec::new(tag).build_signed(&tmp.join("src"), DEV_SECRET))
            .unwrap()
            .hash
    };
    let a = install("a");
    store.activate(&a, &mut pass).unwrap();
    store.commit().unwrap();
    let b = install("b");
    store.activate(&b, &mut pass).unwrap();
    // The daemon still runs `a` (not reloaded yet): its inferences never count for `b`.
    let recorder = TrialRecorder::start(store.clone(), a.clone(), true).unwrap();
    for _ in 0..10 {
        recorder.healthy();
    }
    recorder.flush_soon();
    let end = Instant::now() + PATIENCE;
    while recorder.on_trial() {
        assert!(Instant::now() < end, "a's counts were never handed over");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(store.verdict(&b).unwrap(), Verdict::Pending);
    // Reloaded: now `b` runs on trial, and two inferences are not yet three.
    recorder.running(b.clone(), true);
    recorder.healthy();
    recorder.healthy();
    drop(recorder);
    assert_eq!(
        store.verdict(&b).unwrap(),
        Verdict::Running {
            healthy: 2,
            needed: 3
        }
    );
}

/// Stopping the daemon while an installer holds the lock does not wait for the install:
/// dropping the recorder returns (after its bounded wait) with the lock still held.
#[test]
fn dropping_the_recorder_never_waits_for_the_installer() {
    let tmp = TempDir::new("trial-drop");
    let root = tmp.join("root");
    let store = Arc::new(store(&root));
    let install = |tag: &str| {
        store
            .install(&Spec::new(tag).build_signed(&tmp.join("src"), DEV_SECRET))
            .unwrap()
            .hash
    };
    let a = install("a");
    store.activate(&a, &mut pass).unwrap();
    store.commit().unwrap();
    let b = install("b");
    store.activate(&b, &mut pass).unwrap();
    let recorder = TrialRecorder::start(store.clone(), b.clone(), true).unwrap();
    let lock_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(root.join("ota.lock"))
        .unwrap();
    let installer = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .unwrap();
    recorder.healthy();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(recorder);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(PATIENCE)
        .expect("dropping the recorder waited for the installer's lock");
    // Still locked when the drop returned: nothing could have been recorded.
    assert_eq!(store.verdict(&b).unwrap(), Verdict::Pending);
    drop(installer);
}
