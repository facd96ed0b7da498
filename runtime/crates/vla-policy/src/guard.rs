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
//! and writes them in place (`Arc::make_mut` without a copy). Channels of capacity one
//! are preallocated: a steady-state scan allocates nothing.

use crate::exec::count_non_finite;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use vla_tensor::AlignedBuf;

type Job = (usize, Arc<AlignedBuf>, Option<Arc<AlignedBuf>>);

/// Run first on every helper thread a policy starts (pinning, priority), given its name.
pub type HelperSetup = Arc<dyn Fn(&str) + Send + Sync>;

/// The result of one scan: the caller's tag and how many NaN/Inf values it found
/// (`usize::MAX` when the helper died mid-scan: counted as failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub tag: usize,
    pub bad: usize,
}

pub(crate) struct ScanGuard {
    to_helper: Option<SyncSender<Job>>,
    verdicts: Receiver<usize>,
    /// The tag of the scan handed out and not yet collected.
    pending: Option<usize>,
    /// The verdict when the helper is gone and the scan ran inline.
    inline: Option<Verdict>,
    helper: Option<std::thread::JoinHandle<()>>,
}

fn scan_now(a: &AlignedBuf, b: Option<&AlignedBuf>) -> usize {
    count_non_finite(a.as_f32()) + b.map_or(0, |b| count_non_finite(b.as_f32()))
}

impl ScanGuard {
    pub fn start(setup: Option<HelperSetup>) -> std::io::Result<Self> {
        let (to_helper, jobs) = sync_channel::<Job>(1);
        let (answer, verdicts) = sync_channel::<usize>(1);
        let helper = std::thread::Builder::new()
            .name("vla-guard".into())
            .spawn(move || {
                if let Some(setup) = setup {
                    setup("vla-guard");
                }
                while let Ok((_, a, b)) = jobs.recv() {
                    let bad = scan_now(&a, b.as_deref());
                    drop((a, b));
                    if answer.send(bad).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Self {
            to_helper: Some(to_helper),
            verdicts,
            pending: None,
            inline: None,
            helper: Some(helper),
        })
    }

    /// Starts the scan of `a` (and `b`) under `tag`. A scan still outstanding is
    /// collected first and returned: the caller must not lose its verdict.
    #[must_use]
    pub fn scan(
        &mut self,
        tag: usize,
        a: &Arc<AlignedBuf>,
        b: Option<&Arc<AlignedBuf>>,
    ) -> Option<Verdict> {
        let previous = self.verdict();
        let sent = match &self.to_helper {
            Some(tx) => tx.send((tag, a.clone(), b.cloned())).is_ok(),
            None => false,
        };
        if sent {
            self.pending = Some(tag);
        } else {
            // No helper (it died): scan here rather than not at all.
            self.to_helper = None;
            self.inline = Some(Verdict {
                tag,
                bad: scan_now(a, b.map(|b| &**b)),
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
        let bad = match self.verdicts.recv() {
            Ok(bad) => bad,
            // The helper died mid-scan (its clones were dropped while unwinding): count
            // the scan as failed, fail closed, and scan inline from now on.
            Err(_) => {
                self.to_helper = None;
                usize::MAX
            }
        };
        Some(Verdict { tag, bad })
    }
}

impl Drop for ScanGuard {
    fn drop(&mut self) {
        self.to_helper = None;
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
