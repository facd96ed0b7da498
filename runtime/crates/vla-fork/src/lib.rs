//! Fork-join onto one preallocated helper thread, and the [`Mailbox`] such helpers are
//! handed their work through.
//!
//! The inference thread's host steps between contexts (the preprocess, the prompt rows)
//! are loops that split into two halves writing disjoint parts of one buffer.
//! [`Fork::join`] runs one half on the calling thread and the other on the helper and
//! returns when both are done. Like `std::thread::scope`, the halves borrow the caller's
//! data; unlike it, the thread is started once (at load), so a join spawns nothing and
//! allocates nothing: one [`Mailbox`] carries a pointer there, another the answer back.
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

/// A slot of capacity one between two threads: a mutex and a condition variable rather
/// than a channel, since waiting on them never allocates, where a std channel's first
/// blocking wait on a thread, or on a channel, does (on the inference thread that first
/// wait can come late, e.g. under load or after a reload, on the critical path). Only two
/// threads use one, each for a few instructions under the lock; it is closed when either
/// side is gone.
pub struct Mailbox<T> {
    slot: Mutex<(Option<T>, bool)>,
    changed: Condvar,
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Self {
            slot: Mutex::new((None, false)),
            changed: Condvar::new(),
        }
    }
}

impl<T> Mailbox<T> {
    fn lock(&self) -> MutexGuard<'_, (Option<T>, bool)> {
        // Nothing panics while holding the lock: a poisoned lock holds a valid slot.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `item` in the empty slot (one item at a time); gives it back when the
    /// mailbox is closed.
    pub fn put(&self, item: T) -> Result<(), T> {
        let mut slot = self.lock();
        if slot.1 {
            return Err(item);
        }
        debug_assert!(slot.0.is_none(), "one item at a time");
        slot.0 = Some(item);
        drop(slot);
        self.changed.notify_one();
        Ok(())
    }

    /// The item, if there is one now.
    pub fn try_take(&self) -> Option<T> {
        self.lock().0.take()
    }

    /// Waits for an item; `None` once the mailbox is closed and empty.
    pub fn take(&self) -> Option<T> {
        let mut slot = self.lock();
        loop {
            if let Some(item) = slot.0.take() {
                return Some(item);
            }
            if slot.1 {
                return None;
            }
            slot = self
                .changed
                .wait(slot)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Closes the mailbox; an item still in it can be taken.
    pub fn close(&self) {
        self.lock().1 = true;
        self.changed.notify_all();
    }

    /// Closes the mailbox and hands back an item still in it, which no one can take
    /// from it any more.
    pub fn close_taking(&self) -> Option<T> {
        let left = {
            let mut slot = self.lock();
            slot.1 = true;
            slot.0.take()
        };
        self.changed.notify_all();
        left
    }
}

/// What the caller learns about its job.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The helper ran it: to completion (true) or it panicked (false).
    Ran(bool),
    /// The helper ended before it took it: the closure is untouched.
    Returned,
}

/// The two mailboxes between a caller and its helper. When the helper ends, both are
/// closed and every later join runs both halves on the caller.
#[derive(Default)]
struct Slots {
    jobs: Mailbox<Job>,
    answers: Mailbox<Answer>,
}

/// One helper thread, started once, that runs half of each [`Fork::join`].
pub struct Fork {
    name: &'static str,
    slots: Arc<Slots>,
    thread: Option<JoinHandle<()>>,
}

/// Waits for the helper's answer when dropped before [`Wait::answer`]: a panic in the
/// caller's half must not unwind past what the helper still borrows.
struct Wait<'a> {
    slots: &'a Slots,
    pending: bool,
}

impl Wait<'_> {
    /// The answer; a helper that ended while running the job (its answers closed with
    /// none given) counts as failed.
    fn answer(mut self) -> Answer {
        self.pending = false;
        // The halves take about as long, so the answer is usually close: poll for it
        // (yielding, so that with one CPU the helper runs at once) rather than sleep,
        // since a sleeping caller's wake-up is one more scheduler round trip on the
        // critical path (~0.05-0.1 ms measured in a VM).
        let polled = Instant::now();
        while polled.elapsed() < POLL_ANSWER {
            if let Some(answer) = self.slots.answers.try_take() {
                return answer;
            }
            std::thread::yield_now();
        }
        self.slots.answers.take().unwrap_or(Answer::Ran(false))
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.pending {
            self.slots.answers.take();
        }
    }
}

/// Closes both mailboxes when the helper's thread ends, however it ends (a set-up or a
/// payload that panics outside the job's `catch_unwind` included). A job it never took
/// is answered as returned, so no caller waits for a thread that is not there, and no
/// job lands after it.
struct Gone<'a>(&'a Slots);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        if self.0.jobs.close_taking().is_some() {
            let _ = self.0.answers.put(Answer::Returned);
        }
        self.0.answers.close();
    }
}

fn helper(slots: &Slots) {
    while let Some(Job(f)) = slots.jobs.take() {
        let ran = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `join` keeps the closure alive and untouched until it has the
            // answer put below (or sees the answers closed by `Gone`); the closure is
            // `Send`, so running it on this thread is allowed, and nothing else runs it
            // meanwhile.
            #[allow(unsafe_code)]
            unsafe {
                (*f)()
            }
        }))
        .is_ok();
        if slots.answers.put(Answer::Ran(ran)).is_err() {
            return;
        }
    }
}

impl Fork {
    /// Starts the helper thread `name`; it runs `setup` first (pinning, priority).
    pub fn start(
        name: &'static str,
        setup: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Self> {
        let slots = Arc::new(Slots::default());
        let theirs = slots.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _gone = Gone(&theirs);
                setup();
                helper(&theirs);
            })?;
        Ok(Self {
            name,
            slots,
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
        // Refused once the helper has ended (`Gone` closed the jobs); a job put before
        // that is handed back as returned.
        let handed = self.slots.jobs.put(Job::erase(&mut call)).is_ok();
        let ran = if handed {
            let wait = Wait {
                slots: &self.slots,
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
        self.slots.jobs.close();
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
