//! The non-finite scan of action_context's outputs, off the critical path.
//!
//! k_ctx/v_ctx are the largest outputs of a MolmoAct2 inference (108 MB at full dims)
//! and action_step only reads them, so their scan runs on a helper thread while the flow
//! loop executes; the inference collects the verdict before it hands out a chunk and
//! discards the chunk when the scan found NaN/Inf (still fail closed). The buffers are
//! shared by `Arc`: the helper drops its clones before it answers, so after a verdict the
//! pipeline again owns them alone and writes them in place. Channels of capacity one are
//! preallocated: a steady-state scan allocates nothing.

use crate::exec::count_non_finite;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use vla_tensor::AlignedBuf;

type Job = (Arc<AlignedBuf>, Arc<AlignedBuf>);

pub(crate) struct KvGuard {
    to_helper: Option<SyncSender<Job>>,
    verdicts: Receiver<usize>,
    /// A scan was handed out and its verdict not yet collected.
    pending: bool,
    /// The verdict when the helper is gone and the scan ran inline.
    inline: Option<usize>,
    helper: Option<std::thread::JoinHandle<()>>,
}

impl KvGuard {
    pub fn start() -> std::io::Result<Self> {
        let (to_helper, jobs) = sync_channel::<Job>(1);
        let (answer, verdicts) = sync_channel::<usize>(1);
        let helper = std::thread::Builder::new()
            .name("vla-kv-guard".into())
            .spawn(move || {
                while let Ok((k, v)) = jobs.recv() {
                    let bad = count_non_finite(k.as_f32()) + count_non_finite(v.as_f32());
                    drop((k, v));
                    if answer.send(bad).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Self {
            to_helper: Some(to_helper),
            verdicts,
            pending: false,
            inline: None,
            helper: Some(helper),
        })
    }

    /// Starts the scan of `k` and `v` (collect it with [`KvGuard::verdict`]).
    pub fn scan(&mut self, k: &Arc<AlignedBuf>, v: &Arc<AlignedBuf>) {
        self.verdict();
        let sent = match &self.to_helper {
            Some(tx) => tx.send((k.clone(), v.clone())).is_ok(),
            None => false,
        };
        if sent {
            self.pending = true;
        } else {
            // No helper (it died): scan here rather than not at all.
            self.to_helper = None;
            self.inline = Some(count_non_finite(k.as_f32()) + count_non_finite(v.as_f32()));
        }
    }

    /// Waits for the outstanding scan: how many non-finite values it found (0 when none
    /// was outstanding). Afterwards the helper holds no clone of the buffers.
    pub fn verdict(&mut self) -> usize {
        if let Some(bad) = self.inline.take() {
            return bad;
        }
        if !std::mem::take(&mut self.pending) {
            return 0;
        }
        match self.verdicts.recv() {
            Ok(bad) => bad,
            // The helper died mid-scan (its clones were dropped while unwinding): count
            // the scan as failed, fail closed, and scan inline from now on.
            Err(_) => {
                self.to_helper = None;
                usize::MAX
            }
        }
    }
}

impl Drop for KvGuard {
    fn drop(&mut self) {
        self.to_helper = None;
        if let Some(h) = self.helper.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KvGuard;
    use std::sync::Arc;
    use vla_tensor::AlignedBuf;

    fn buf(values: &[f32]) -> Arc<AlignedBuf> {
        let mut b = AlignedBuf::zeroed(values.len() * 4);
        b.as_f32_mut().copy_from_slice(values);
        Arc::new(b)
    }

    #[test]
    fn scans_beside_the_caller_and_returns_the_buffers() {
        let mut g = KvGuard::start().unwrap();
        assert_eq!(g.verdict(), 0, "nothing outstanding");
        let (mut k, v) = (buf(&[1.0, 2.0]), buf(&[3.0, f32::NAN, f32::INFINITY]));
        g.scan(&k, &v);
        assert_eq!(g.verdict(), 2);
        assert!(Arc::get_mut(&mut k).is_some(), "the helper let go of k");
        let clean = buf(&[0.0; 4]);
        g.scan(&k, &clean);
        g.scan(&clean, &clean); // collects the previous verdict first
        assert_eq!(g.verdict(), 0);
    }
}
