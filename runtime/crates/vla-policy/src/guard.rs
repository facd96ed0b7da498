//! The non-finite scans of the contexts' outputs, off the critical path.
//!
//! Each scan runs on a helper thread while the next context executes (the pipeline hands
//! it the output right after the context that wrote it), and its verdict is collected
//! before anything that must not see NaN/Inf depends on it: at the latest before the
//! chunk is handed out, which is discarded when a scan found any (still fail closed). A
//! scan carries a tag the pipeline maps back to the component and tensor it names.
//!
//! The inference thread waits on the helper's verdicts, so the helper must run with the
//! same scheduling (a device runs the inference thread SCHED_FIFO, pinned): whoever loads
//! the policy passes a [`HelperSetup`] the helper runs first ([`crate::LoadOptions`]);
//! this crate itself knows nothing of real-time set-up.
//!
//! One scan is outstanding at a time. The buffers are shared by `Arc`: the helper drops
//! its clones before it answers, so after a verdict the pipeline again owns them alone
//! and writes them in place (`Arc::get_mut`). A scanned buffer is anything that reads as
//! f32 values ([`Scanned`]): host memory, or a region of registered NPU memory that the
//! context running meanwhile only reads. Two `vla_fork::Mailbox`es
//! carry a job there and a verdict back: a scan allocates nothing, and neither does a
//! wait.

use crate::exec::count_non_finite;
use std::sync::Arc;
use vla_fork::Mailbox;
use vla_tensor::AlignedBuf;

/// What a scan reads: f32 values that nobody writes while the scan holds them.
pub(crate) trait Scanned: Send + Sync {
    /// The values.
    fn values(&self) -> &[f32];
}

impl Scanned for AlignedBuf {
    fn values(&self) -> &[f32] {
        self.as_f32()
    }
}

type Job = (usize, Arc<dyn Scanned>, Option<Arc<dyn Scanned>>);

/// Run first on every helper thread a policy starts (pinning, priority), given its name.
pub type HelperSetup = Arc<dyn Fn(&str) + Send + Sync>;

/// The result of one scan: the caller's tag and how many NaN/Inf values it found
/// (`usize::MAX` when the helper died mid-scan: counted as failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub tag: usize,
    pub bad: usize,
}

/// A job there, a verdict back ([`Mailbox`]: waiting on it never allocates).
#[derive(Default)]
struct Mailboxes {
    jobs: Mailbox<Job>,
    verdicts: Mailbox<usize>,
}

/// Closes both mailboxes when the helper ends, also by unwinding mid-scan: the pipeline
/// then sees no verdict (counted as failed) and scans inline from then on. A job left
/// behind is dropped (outside the lock): it would keep its buffers' clones, and the
/// pipeline's next `Arc::make_mut` would copy the buffer.
struct CloseOnExit(Arc<Mailboxes>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        drop(self.0.jobs.close_taking());
        self.0.verdicts.close();
    }
}

pub(crate) struct ScanGuard {
    mail: Arc<Mailboxes>,
    /// False once the helper is gone: scans run inline.
    helper_alive: bool,
    /// The tag of the scan handed out and not yet collected.
    pending: Option<usize>,
    /// The verdict when the helper is gone and the scan ran inline.
    inline: Option<Verdict>,
    helper: Option<std::thread::JoinHandle<()>>,
}

fn scan_now(a: &dyn Scanned, b: Option<&dyn Scanned>) -> usize {
    count_non_finite(a.values()) + b.map_or(0, |b| count_non_finite(b.values()))
}

impl ScanGuard {
    pub fn start(setup: Option<HelperSetup>) -> std::io::Result<Self> {
        let mail = Arc::new(Mailboxes::default());
        let theirs = mail.clone();
        let helper = std::thread::Builder::new()
            .name("vla-guard".into())
            .spawn(move || {
                let mail = CloseOnExit(theirs);
                if let Some(setup) = setup {
                    setup("vla-guard");
                }
                while let Some((_, a, b)) = mail.0.jobs.take() {
                    let bad = scan_now(&*a, b.as_deref());
                    drop((a, b));
                    if mail.0.verdicts.put(bad).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Self {
            mail,
            helper_alive: true,
            pending: None,
            inline: None,
            helper: Some(helper),
        })
    }

    /// Starts the scan of `a` (and `b`) under `tag`. A scan still outstanding is
    /// collected first and returned: the caller must not lose its verdict.
    #[must_use]
    pub fn scan<T: Scanned + 'static>(
        &mut self,
        tag: usize,
        a: &Arc<T>,
        b: Option<&Arc<T>>,
    ) -> Option<Verdict> {
        let previous = self.verdict();
        // Unsized clones of the caller's `Arc`s: no allocation.
        let job: Job = (tag, a.clone(), b.map(|b| b.clone() as Arc<dyn Scanned>));
        let sent = self.helper_alive && self.mail.jobs.put(job).is_ok();
        if sent {
            self.pending = Some(tag);
        } else {
            // No helper (it died): scan here rather than not at all.
            self.helper_alive = false;
            self.inline = Some(Verdict {
                tag,
                bad: scan_now(&**a, b.map(|b| &**b as &dyn Scanned)),
            });
        }
        previous
    }

    /// Waits for the outstanding scan, if any. Afterwards the helper holds no clone of
    /// the buffers.
    pub fn verdict(&mut self) -> Option<Verdict> {
        if let Some(v) = self.inline.take() {
            return Some(v);
        }
        let tag = self.pending.take()?;
        let bad = match self.mail.verdicts.take() {
            Some(bad) => bad,
            // The helper died mid-scan (its clones were dropped while unwinding): count
            // the scan as failed, fail closed, and scan inline from now on.
            None => {
                self.helper_alive = false;
                usize::MAX
            }
        };
        Some(Verdict { tag, bad })
    }
}

impl Drop for ScanGuard {
    fn drop(&mut self) {
        drop(self.mail.jobs.close_taking());
        if let Some(h) = self.helper.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ScanGuard, Verdict};
    use std::sync::Arc;
    use vla_tensor::AlignedBuf;

    fn buf(values: &[f32]) -> Arc<AlignedBuf> {
        let mut b = AlignedBuf::zeroed(values.len() * 4);
        b.as_f32_mut().copy_from_slice(values);
        Arc::new(b)
    }

    #[test]
    fn scans_beside_the_caller_and_returns_the_buffers() {
        let mut g = ScanGuard::start(None).unwrap();
        assert_eq!(g.verdict(), None, "nothing outstanding");
        let (mut k, v) = (buf(&[1.0, 2.0]), buf(&[3.0, f32::NAN, f32::INFINITY]));
        assert_eq!(g.scan(7, &k, Some(&v)), None);
        assert_eq!(g.verdict(), Some(Verdict { tag: 7, bad: 2 }));
        assert!(Arc::get_mut(&mut k).is_some(), "the helper let go of k");
        let clean = buf(&[0.0; 4]);
        assert_eq!(g.scan(1, &k, None), None);
        // A second scan hands back the first one's verdict rather than dropping it.
        assert_eq!(g.scan(2, &v, None), Some(Verdict { tag: 1, bad: 0 }));
        assert_eq!(g.verdict(), Some(Verdict { tag: 2, bad: 2 }));
        assert_eq!(g.scan(3, &clean, Some(&clean)), None);
        assert_eq!(g.verdict(), Some(Verdict { tag: 3, bad: 0 }));
        assert_eq!(g.verdict(), None);
    }

    #[test]
    fn waiting_for_a_verdict_allocates_nothing_on_the_inference_thread() {
        use vla_alloc_count::{current_tid, watch, watched_allocations, WATCH_LOCK};
        let _lock = WATCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let mut g = ScanGuard::start(None).unwrap();
        // 16 MB: each scan takes long enough that the next call waits for its verdict.
        let (big, other) = (buf(&vec![0.0; 1 << 22]), buf(&vec![1.0; 1 << 22]));
        // This test's thread is fresh: the waits below are its first.
        watch(current_tid());
        let before = watched_allocations();
        for tag in 0..6 {
            let b = if tag % 2 == 0 { &big } else { &other };
            let previous = g.scan(tag, b, None);
            assert_eq!(previous.map(|v| v.tag), tag.checked_sub(1));
        }
        assert_eq!(g.verdict(), Some(Verdict { tag: 5, bad: 0 }));
        let n = watched_allocations() - before;
        watch(0);
        assert_eq!(n, 0, "allocations on the waiting thread");
    }

    #[test]
    fn a_dead_helper_means_inline_scans_still_failing_closed() {
        let setup: super::HelperSetup = Arc::new(|_: &str| panic!("helper set-up failed"));
        let mut g = ScanGuard::start(Some(setup)).unwrap();
        while !g.helper.as_ref().unwrap().is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let bad = buf(&[f32::NAN, 1.0]);
        assert_eq!(g.scan(3, &bad, None), None);
        assert_eq!(g.verdict(), Some(Verdict { tag: 3, bad: 1 }));
        let clean = buf(&[0.0]);
        assert_eq!(g.scan(4, &clean, None), None);
        assert_eq!(g.verdict(), Some(Verdict { tag: 4, bad: 0 }));
    }

    #[test]
    fn a_helper_dying_with_a_job_waiting_fails_it_and_lets_go_of_the_buffer() {
        let setup: super::HelperSetup = Arc::new(|_: &str| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            panic!("helper set-up failed");
        });
        let mut g = ScanGuard::start(Some(setup)).unwrap();
        let mut k = buf(&[1.0, 2.0]);
        // Handed out while the helper is still in its set-up (or, if this thread was
        // slower than 100 ms, scanned inline: then the verdict is clean).
        assert_eq!(g.scan(7, &k, None), None);
        let v = g.verdict().unwrap();
        assert_eq!(v.tag, 7);
        assert!(v.bad == usize::MAX || v.bad == 0, "{v:?}");
        assert!(
            Arc::get_mut(&mut k).is_some(),
            "no clone of the buffer is left behind"
        );
        assert_eq!(g.scan(8, &k, None), None);
        assert_eq!(
            g.verdict(),
            Some(Verdict { tag: 8, bad: 0 }),
            "inline from now on"
        );
    }

    #[test]
    fn the_helper_runs_the_loaders_setup_on_itself_before_any_scan() {
        use std::sync::Mutex;
        // (the name the set-up was given, the thread it ran on)
        type Calls = Mutex<Vec<(String, Option<String>)>>;
        let seen: Arc<Calls> = Arc::default();
        let record = seen.clone();
        let setup: super::HelperSetup = Arc::new(move |name: &str| {
            let thread = std::thread::current().name().map(str::to_owned);
            record.lock().unwrap().push((name.to_owned(), thread));
        });
        let mut g = ScanGuard::start(Some(setup)).unwrap();
        let k = buf(&[1.0]);
        assert_eq!(g.scan(1, &k, None), None);
        assert_eq!(g.verdict(), Some(Verdict { tag: 1, bad: 0 }));
        assert_eq!(
            *seen.lock().unwrap(),
            [("vla-guard".to_owned(), Some("vla-guard".to_owned()))],
            "once, on the helper thread itself"
        );
    }
}
