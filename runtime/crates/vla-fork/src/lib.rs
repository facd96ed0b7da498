//! Fork-join onto one preallocated helper thread.
//!
//! The inference thread's host steps between contexts (the preprocess, the prompt rows)
//! are loops that split into two halves writing disjoint parts of one buffer.
//! [`Fork::join`] runs one half on the calling thread and the other on the helper and
//! returns when both are done. Like `std::thread::scope`, the halves borrow the caller's
//! data; unlike it, the thread is started once (at load), so a join spawns nothing and
//! allocates nothing: one slot under a mutex carries a pointer there and a verdict back.
//!
//! The caller waits on the helper, so the helper must run like the caller (a device runs
//! the inference thread SCHED_FIFO, pinned): [`Fork::start`] runs the owner's set-up on
//! the helper before anything else. This crate knows nothing of real-time set-up. If the
//! helper is gone, both halves run on the caller.
//!
//! The one unsafe idea, in one place: the helper is handed a pointer to a closure on the
//! caller's stack with its lifetime erased. `join` neither returns nor unwinds before the
//! helper has reported that it is done with the closure, so the closure and what it
//! borrows outlive every use the helper makes of them.

#![deny(unsafe_code)]

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the caller polls for the helper's answer before it sleeps on it.
const POLL_ANSWER: Duration = Duration::from_millis(1);

/// The helper's half of a join: a closure on the caller's stack, lifetime erased.
struct Job(*mut (dyn FnMut() + Send + 'static));

// SAFETY: the pointee is `Send` (its type says so), and `Fork::join` does not touch it
// while the helper holds the pointer, so handing the pointer to the helper is handing it
// the closure.
#[allow(unsafe_code)]
unsafe impl Send for Job {}

impl Job {
    /// Erases the lifetime of `f`. The caller must keep `f` alive and untouched until the
    /// helper has answered for this job ([`Fork::join`] does).
    fn erase<'a>(f: &'a mut (dyn FnMut() + Send + 'a)) -> Self {
        let f: *mut (dyn FnMut() + Send + 'a) = f;
        // SAFETY: only the lifetime bound of the trait object changes; the fat pointer's
        // layout does not. The pointer is dereferenced only inside `join`'s wait, while
        // `'a` is still live (see the module doc).
        #[allow(unsafe_code)]
        let f = unsafe {
            std::mem::transmute::<*mut (dyn FnMut() + Send + 'a), *mut (dyn FnMut() + Send + 'static)>(
                f,
            )
        };
        Job(f)
    }
}

/// The helper's half panicked (or the helper died during it): its work is not done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelperFailed {
    /// The helper thread's name.
    pub thread: &'static str,
}

impl fmt::Display for HelperFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "helper thread {} failed in its half of the work",
            self.thread
        )
    }
}

impl std::error::Error for HelperFailed {}

/// What the one slot between the caller and the helper holds.
enum State {
    Idle,
    /// Handed out by `join`, not yet taken by the helper.
    Job(Job),
    Running,
    /// The helper's answer: true when the half ran to completion.
    Done(bool),
    /// The helper ended before it took the job handed out: the caller runs it.
    Returned,
    /// The `Fork` is dropped: the helper ends.
    Closed,
}

/// The slot's state, and whether the helper thread has ended (for good: every later
/// join runs both halves on the caller).
struct Inner {
    state: State,
    gone: bool,
}

/// What the caller learns about its job.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The helper ran it: to completion (true) or it panicked (false).
    Ran(bool),
    /// The helper ended without taking it: the closure is untouched.
    Returned,
}

/// A mutex and two condition variables rather than channels: waiting on them never
/// allocates, where a channel's first blocking wait on a thread or a channel does (so a
/// join that waits for the first time late, e.g. under load, would allocate on the
/// critical path). Only the caller and the helper lock it, each for a few instructions;
/// both run with the same set-up.
struct Slot {
    inner: Mutex<Inner>,
    to_helper: Condvar,
    to_caller: Condvar,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding the lock: a poisoned lock holds a valid state.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the answer from `inner` if there is one.
    fn take(inner: &mut Inner) -> Option<Answer> {
        let answer = match inner.state {
            State::Done(ran) => Answer::Ran(ran),
            State::Returned => Answer::Returned,
            _ => return None,
        };
        inner.state = State::Idle;
        Some(answer)
    }

    fn try_answer(&self) -> Option<Answer> {
        Self::take(&mut self.lock())
    }

    /// Waits for the answer.
    fn answer(&self) -> Answer {
        let mut inner = self.lock();
        loop {
            if let Some(answer) = Self::take(&mut inner) {
                return answer;
            }
            inner = self
                .to_caller
                .wait(inner)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// One helper thread, started once, that runs half of each [`Fork::join`].
pub struct Fork {
    name: &'static str,
    slot: Arc<Slot>,
    thread: Option<JoinHandle<()>>,
}

/// Waits for the helper's answer when dropped before [`Wait::answer`]: a panic in the
/// caller's half must not unwind past what the helper still borrows.
struct Wait<'a> {
    slot: &'a Slot,
    pending: bool,
}

impl Wait<'_> {
    fn answer(mut self) -> Answer {
        self.pending = false;
        // The halves take about as long, so the answer is usually close: poll for it
        // (yielding, so that with one CPU the helper runs at once) rather than sleep,
        // since a sleeping caller's wake-up is one more scheduler round trip on the
        // critical path (~0.05-0.1 ms measured in a VM).
        let polled = Instant::now();
        while polled.elapsed() < POLL_ANSWER {
            if let Some(answer) = self.slot.try_answer() {
                return answer;
            }
            std::thread::yield_now();
        }
        self.slot.answer()
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.pending {
            self.slot.answer();
        }
    }
}

/// Marks the helper gone when its thread ends, however it ends (a set-up or a payload
/// that panics outside the job's `catch_unwind` included), and answers a job left in
/// the slot, so no caller waits for a thread that is not there.
struct Gone<'a>(&'a Slot);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        inner.gone = true;
        inner.state = match std::mem::replace(&mut inner.state, State::Idle) {
            State::Job(_) => State::Returned,
            State::Running => State::Done(false),
            other => other,
        };
        drop(inner);
        self.0.to_caller.notify_one();
    }
}

fn helper(slot: &Slot) {
    loop {
        let job = {
            let mut inner = slot.lock();
            loop {
                match std::mem::replace(&mut inner.state, State::Running) {
                    State::Job(job) => break job,
                    State::Closed => return,
                    other => inner.state = other,
                }
                inner = slot
                    .to_helper
                    .wait(inner)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        let Job(f) = job;
        let ran = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `join` keeps the closure alive and untouched until it has taken the
            // answer stored below (or by `Gone`); the closure is `Send`, so running it on
            // this thread is allowed, and nothing else runs it meanwhile.
            #[allow(unsafe_code)]
            unsafe {
                (*f)()
            }
        }))
        .is_ok();
        slot.lock().state = State::Done(ran);
        slot.to_caller.notify_one();
    }
}

impl Fork {
    /// Starts the helper thread `name`; it runs `setup` first (pinning, priority).
    pub fn start(
        name: &'static str,
        setup: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Self> {
        let slot = Arc::new(Slot {
            inner: Mutex::new(Inner {
                state: State::Idle,
                gone: false,
            }),
            to_helper: Condvar::new(),
            to_caller: Condvar::new(),
        });
        let theirs = slot.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _gone = Gone(&theirs);
                setup();
                helper(&theirs);
            })?;
        Ok(Self {
            name,
            slot,
            thread: Some(thread),
        })
    }

    /// Runs `there` on the helper and `here` on the calling thread, and returns both
    /// results once both are done. If `here` panics, the panic continues only after
    /// `there` has finished. If the helper is gone, `there` runs here first.
    pub fn join<A, B>(
        &mut self,
        here: impl FnOnce() -> A,
        there: impl FnOnce() -> B + Send,
    ) -> Result<(A, B), HelperFailed>
    where
        B: Send,
    {
        let mut there = Some(there);
        let mut result = None;
        let mut call = || {
            if let Some(f) = there.take() {
                result = Some(f());
            }
        };
        // Handed out under the lock that `Gone` takes: a job is either seen by the
        // helper's exit (and returned) or never handed out.
        let handed = {
            let mut inner = self.slot.lock();
            if inner.gone {
                false
            } else {
                inner.state = State::Job(Job::erase(&mut call));
                true
            }
        };
        let ran = if handed {
            self.slot.to_helper.notify_one();
            let wait = Wait {
                slot: &self.slot,
                pending: true,
            };
            let a = here();
            // `call` (and what it borrows) lives on this frame until the function
            // returns, after this answer.
            match wait.answer() {
                Answer::Ran(ran) => (a, ran),
                Answer::Returned => {
                    call();
                    (a, true)
                }
            }
        } else {
            call();
            (here(), true)
        };
        match (ran, result) {
            ((a, true), Some(b)) => Ok((a, b)),
            _ => Err(HelperFailed { thread: self.name }),
        }
    }
}

impl Drop for Fork {
    fn drop(&mut self) {
        self.slot.lock().state = State::Closed;
        self.slot.to_helper.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Fork, HelperFailed};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn fork() -> Fork {
        Fork::start("vla-fork-test", || {}).unwrap()
    }

    #[test]
    fn each_half_runs_on_its_own_thread_and_writes_its_part_of_one_buffer() {
        let mut f = fork();
        let mut buf = vec![0u32; 1000];
        for round in 1..=3u32 {
            let (lo, hi) = buf.split_at_mut(400);
            let (a, b) = f
                .join(
                    || {
                        lo.iter_mut().for_each(|v| *v = round);
                        std::thread::current().name().map(str::to_owned)
                    },
                    || {
                        hi.iter_mut().for_each(|v| *v = 10 * round);
                        std::thread::current().name().map(str::to_owned)
                    },
                )
                .unwrap();
            assert_eq!(b.as_deref(), Some("vla-fork-test"));
            assert_ne!(a, b, "the caller's half ran on the caller");
            assert!(buf[..400].iter().all(|&v| v == round));
            assert!(buf[400..].iter().all(|&v| v == 10 * round));
        }
    }

    #[test]
    fn a_panic_in_the_helpers_half_is_an_error_and_the_helper_keeps_serving() {
        let mut f = fork();
        let r = f.join(|| 1, || -> u8 { panic!("injected") });
        assert_eq!(
            r,
            Err(HelperFailed {
                thread: "vla-fork-test"
            })
        );
        assert_eq!(
            r.unwrap_err().to_string(),
            "helper thread vla-fork-test failed in its half of the work"
        );
        assert_eq!(f.join(|| 1, || 2).unwrap(), (1, 2));
    }

    #[test]
    fn a_panic_in_the_callers_half_waits_for_the_helpers_half() {
        let mut f = fork();
        let finished = AtomicBool::new(false);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            f.join(
                || panic!("caller's half"),
                || {
                    // Long enough that a join that did not wait would look first.
                    std::thread::sleep(Duration::from_millis(200));
                    finished.store(true, Ordering::SeqCst);
                },
            )
        }));
        assert!(r.is_err());
        assert!(
            finished.load(Ordering::SeqCst),
            "the panic unwound past a closure the helper was still running"
        );
        assert_eq!(f.join(|| 3, || 4).unwrap(), (3, 4));
    }

    #[test]
    fn a_helper_that_dies_before_taking_the_job_hands_it_back() {
        // The helper's set-up fails while a join waits on it (the job is in the slot),
        // and again after it is gone: both halves run on the caller, no one waits.
        let mut f = Fork::start("vla-fork-dies", || {
            std::thread::sleep(Duration::from_millis(100));
            panic!("set-up failed");
        })
        .unwrap();
        let caller = std::thread::current().id();
        let (a, b) = f.join(|| 1, || (2, std::thread::current().id())).unwrap();
        assert_eq!((a, b), (1, (2, caller)), "ran on the caller");
        assert_eq!(f.join(|| 3, || 4).unwrap(), (3, 4));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            f.join(|| panic!("caller's half"), || 5)
        }));
        assert!(r.is_err(), "the caller's panic still propagates");
    }

    #[test]
    fn the_setup_runs_first_on_the_helper() {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let record = seen.clone();
        let mut f = Fork::start("vla-fork-setup", move || {
            let name = std::thread::current().name().unwrap_or("?").to_owned();
            record.lock().unwrap().push(format!("setup on {name}"));
        })
        .unwrap();
        let log = seen.clone();
        f.join(|| (), move || log.lock().unwrap().push("job".into()))
            .unwrap();
        assert_eq!(*seen.lock().unwrap(), ["setup on vla-fork-setup", "job"]);
    }
}
