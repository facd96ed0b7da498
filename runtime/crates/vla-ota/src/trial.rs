//! Counting a trial's healthy inferences off the inference thread.
//!
//! [`Store::record_healthy`] reads and rewrites the state file under the store's `flock`,
//! which an installer holds while it copies and hashes a bundle (gigabytes: minutes). The
//! inference thread must never wait for that, nor do file I/O at all: it only bumps an
//! atomic counter ([`TrialRecorder::healthy`]); a thread of its own (not real-time) hands
//! the counts to the store every [`FLUSH_INTERVAL`] and commits the bundle when the trial
//! is complete. If that thread waits minutes for the lock, the inferences keep running and
//! the counts accumulate; the commit happens once the installer is done.

use crate::{Store, TrialProgress};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often counted inferences are handed to the store.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(250);

struct Shared {
    store: Arc<Store>,
    /// Healthy inferences not yet handed to the store (all of the bundle in `running`).
    healthy: AtomicU64,
    /// Whether the running bundle is still on trial (cleared once committed or superseded).
    on_trial: AtomicBool,
    /// The content hash of the running bundle. Taken only to swap bundles (reload, not the
    /// inference path) and, by the recorder, around its own reads: never across file I/O.
    running: Mutex<String>,
    stop: AtomicBool,
    /// Counts handed to the store so far (for tests and the log).
    recorded: AtomicU64,
}

impl Shared {
    fn on_trial(&self) -> bool {
        self.on_trial.load(Ordering::Acquire)
    }

    fn running_hash(&self) -> String {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// How long dropping the recorder waits for its last flush: an installer holding the
/// store's lock must not hold up the daemon's shutdown for minutes. Counts not recorded
/// then are lost, which only lengthens the trial after the next start.
pub const FINAL_FLUSH_WAIT: Duration = Duration::from_secs(2);

/// The trial's counter and the thread that records it.
pub struct TrialRecorder {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Closed by the thread once its last flush is done (in a mutex only to be `Sync`;
    /// taken by `drop` alone).
    finished: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl TrialRecorder {
    /// Starts the recording thread for bundle `running` (on trial or not).
    pub fn start(store: Arc<Store>, running: String, on_trial: bool) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            store,
            healthy: AtomicU64::new(0),
            on_trial: AtomicBool::new(on_trial),
            running: Mutex::new(running),
            stop: AtomicBool::new(false),
            recorded: AtomicU64::new(0),
        });
        let (finished_tx, finished) = std::sync::mpsc::channel::<()>();
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("vla-ota-trial".into())
                .spawn(move || {
                    let _finished = finished_tx; // dropped (closing the channel) at exit
                    while !shared.stop.load(Ordering::Acquire) {
                        std::thread::park_timeout(FLUSH_INTERVAL);
                        flush(&shared);
                    }
                    flush(&shared);
                })?
        };
        Ok(Self {
            shared,
            thread: Some(thread),
            finished: Mutex::new(finished),
        })
    }

    /// One healthy inference of the running bundle. Two atomic operations: no lock, no
    /// allocation, no I/O (called on the inference thread's critical path).
    pub fn healthy(&self) {
        if self.shared.on_trial.load(Ordering::Acquire) {
            self.shared.healthy.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the running bundle is still on trial.
    pub fn on_trial(&self) -> bool {
        self.shared.on_trial()
    }

    /// Another bundle runs now (after a reload). Counts not yet recorded belonged to the
    /// previous bundle, whose trial the activation ended: they are dropped.
    pub fn running(&self, hash: String, on_trial: bool) {
        let mut running = self
            .shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *running = hash;
        self.shared.healthy.store(0, Ordering::Relaxed);
        self.shared.on_trial.store(on_trial, Ordering::Release);
    }

    /// The running bundle's hash.
    pub fn running_hash(&self) -> String {
        self.shared.running_hash()
    }

    /// Healthy inferences handed to the store so far.
    pub fn recorded(&self) -> u64 {
        self.shared.recorded.load(Ordering::Acquire)
    }

    /// A handle another thread keeps to read the running bundle and whether it is still
    /// on trial (the daemon's metrics textfile, on its main thread).
    pub fn view(&self) -> TrialView {
        TrialView {
            shared: self.shared.clone(),
        }
    }

    /// Asks the thread to record now instead of at its next interval.
    pub fn flush_soon(&self) {
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

/// Read-only view of a [`TrialRecorder`]'s state, for a thread that does not own it.
#[derive(Clone)]
pub struct TrialView {
    shared: Arc<Shared>,
}

impl TrialView {
    /// Whether the running bundle is still on trial.
    pub fn on_trial(&self) -> bool {
        self.shared.on_trial()
    }

    /// The running bundle's hash.
    pub fn running_hash(&self) -> String {
        self.shared.running_hash()
    }
}

impl Drop for TrialRecorder {
    /// Records what is left, waiting at most [`FINAL_FLUSH_WAIT`] (an installer may hold
    /// the store's lock); a thread still waiting then is left to finish or to end with
    /// the process.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let finished = self.finished.get_mut().unwrap_or_else(|p| p.into_inner());
            match finished.recv_timeout(FINAL_FLUSH_WAIT) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    log::warn!("the OTA store is locked: the trial's last counts are not recorded");
                }
                _ => {
                    let _ = t.join();
                }
            }
        }
    }
}

/// Hands the counted inferences to the store (on the recorder's thread).
fn flush(shared: &Shared) {
    let (hash, n) = {
        let running = shared.running.lock().unwrap_or_else(|p| p.into_inner());
        // Under the lock: `running()` cannot swap the bundle between these two reads, so
        // the count belongs to `hash`.
        (running.clone(), shared.healthy.swap(0, Ordering::Relaxed))
    };
    if n == 0 {
        return;
    }
    let done = match shared.store.record_healthy(&hash, n) {
        Ok(TrialProgress::OnTrial { .. }) => false,
        Ok(TrialProgress::Committed(h)) => {
            log::info!("bundle {h} passed its trial and is committed");
            true
        }
        Ok(TrialProgress::NotOnTrial) => true,
        Err(e) => {
            log::warn!("cannot record the trial's progress (retried): {e}");
            let running = shared.running.lock().unwrap_or_else(|p| p.into_inner());
            if *running == hash {
                shared.healthy.fetch_add(n, Ordering::Relaxed);
            }
            return;
        }
    };
    shared.recorded.fetch_add(n, Ordering::AcqRel);
    if done {
        let running = shared.running.lock().unwrap_or_else(|p| p.into_inner());
        if *running == hash {
            shared.on_trial.store(false, Ordering::Release);
        }
    }
}
