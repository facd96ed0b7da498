//! The NPU's faults as the engine meets them, and what it does about each (the policy
//! docs/reliability.md states): which failed QNN calls mean the DSP restarted, when the
//! QNN session (backend, device, contexts) is re-created from the running bundle and
//! gated again, when the engine gives up and holds, and the counters the metrics textfile
//! and `STATUS=` show. A failed inference is already handed to the publisher (which
//! holds) before anything here runs (`Engine::after_failure`).

use super::engine::PolicyEngine;
use crate::gate::{LoadError, QnnCause};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vla_qnn::{Backend, PerformanceMode, QnnError, QnnLibrary};

/// `QNN_COMMON_ERROR_SYSTEM_COMMUNICATION` (QnnCommon.h 1000 + 7): the cDSP crashed and
/// QNN reconnected; contexts and graphs made before are invalid (QNN's SSR page).
pub(super) const SYSTEM_COMMUNICATION: u64 = 1007;
/// `QNN_COMMON_ERROR_SYSTEM_COMMUNICATION_FATAL` (1000 + 11): QNN's own recovery failed.
pub(super) const SYSTEM_COMMUNICATION_FATAL: u64 = 1011;
/// Consecutive inferences failed by another QNN error before the session is re-created
/// (each failed inference holds the arm; the next observation is the retry).
pub(super) const TRANSIENT_LIMIT: u32 = 3;
/// Re-creations without a healthy inference between them before the engine holds.
pub(super) const MAX_REBUILDS: u32 = 3;

const OK: u8 = 0;
const RECOVERING: u8 = 1;
const HELD: u8 = 2;

/// The NPU's state and counters, shared with the main thread (textfile, STATUS).
#[derive(Clone, Default)]
pub struct NpuStatus(Arc<Counters>);

#[derive(Default)]
struct Counters {
    state: AtomicU8,
    failed_calls: AtomicU64,
    restarts: AtomicU64,
    recoveries: AtomicU64,
    last_code: AtomicU64,
    last_recovery_ns: AtomicU64,
    /// 0 no recovery yet, 1 the recovered session's golden chunk was bit-identical, 2 not.
    identical: AtomicU8,
    /// Re-creations that failed, were refused (the files no longer verify) or gated a
    /// golden chunk not bit-identical to the one before.
    failed_recoveries: AtomicU64,
}

impl NpuStatus {
    fn set(&self, state: u8) {
        self.0.state.store(state, Ordering::Relaxed);
    }

    /// Counts a re-created and gated session: a recovery when its golden chunk is
    /// bit-identical to the one before the fault, else a failed one.
    fn recovered(&self, identical: bool, took: Duration) {
        let c = &self.0;
        c.last_recovery_ns
            .store(took.as_nanos() as u64, Ordering::Relaxed);
        c.identical
            .store(if identical { 1 } else { 2 }, Ordering::Relaxed);
        let count = if identical {
            &c.recoveries
        } else {
            &c.failed_recoveries
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// `ok`, `recovering` or `held`.
    pub fn state(&self) -> &'static str {
        match self.0.state.load(Ordering::Relaxed) {
            OK => "ok",
            RECOVERING => "recovering",
            _ => "held",
        }
    }

    /// The short form for `STATUS=`.
    pub fn status(&self) -> String {
        let c = &self.0;
        format!(
            "npu {} ({} failed calls, {} restarts, {} recoveries)",
            self.state(),
            c.failed_calls.load(Ordering::Relaxed),
            c.restarts.load(Ordering::Relaxed),
            c.recoveries.load(Ordering::Relaxed)
        )
    }

    /// The Prometheus lines for the metrics textfile.
    pub fn render(&self) -> String {
        let c = &self.0;
        let mut o = String::from(
            "# HELP vlad_npu_state The NPU as the engine sees it: ok, recovering (re-creating the QNN session) or held (failed past the recovery limit).\n# TYPE vlad_npu_state gauge\n",
        );
        for s in ["ok", "recovering", "held"] {
            o += &format!(
                "vlad_npu_state{{state=\"{s}\"}} {}\n",
                u8::from(self.state() == s)
            );
        }
        let counters = [
            (
                "vlad_npu_failed_calls_total",
                "QNN calls that failed during inference.",
                &c.failed_calls,
            ),
            (
                "vlad_npu_restarts_total",
                "DSP subsystem restarts seen (QNN error 1007 or 1011).",
                &c.restarts,
            ),
            (
                "vlad_npu_recoveries_total",
                "QNN sessions re-created and gated again, the golden chunk bit-identical.",
                &c.recoveries,
            ),
            (
                "vlad_npu_failed_recoveries_total",
                "QNN session re-creations that failed, were refused (the bundle no longer verifies) or gated a golden chunk not bit-identical to the one before (the engine then holds).",
                &c.failed_recoveries,
            ),
        ];
        for (name, help, v) in counters {
            o += &format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                v.load(Ordering::Relaxed)
            );
        }
        o += &format!(
            "# HELP vlad_npu_last_error_code The last failed QNN call's code (0: none).\n# TYPE vlad_npu_last_error_code gauge\nvlad_npu_last_error_code {}\n",
            c.last_code.load(Ordering::Relaxed)
        );
        o += &format!(
            "# HELP vlad_npu_last_recovery_seconds How long the last re-creation took.\n# TYPE vlad_npu_last_recovery_seconds gauge\nvlad_npu_last_recovery_seconds {:.3}\n",
            c.last_recovery_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        if let v @ 1..=2 = c.identical.load(Ordering::Relaxed) {
            o += &format!(
                "# HELP vlad_npu_recovered_identical 1: the re-created session's golden chunk was bit-identical to the one before.\n# TYPE vlad_npu_recovered_identical gauge\nvlad_npu_recovered_identical {}\n",
                u8::from(v == 1)
            );
        }
        o
    }
}

/// Why a re-creation is due.
#[derive(Clone, Copy, Debug)]
enum Why {
    Restart { op: &'static str, code: u64 },
    Repeated { op: &'static str, code: u64, n: u32 },
    RebuildFailed,
    NothingLoaded,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Restart { op, code } => write!(f, "DSP subsystem restart ({op} returned {code})"),
            Why::Repeated { op, code, n } => {
                write!(f, "{n} inferences in a row failed ({op} returned {code})")
            }
            Why::RebuildFailed => write!(f, "the last re-creation failed"),
            Why::NothingLoaded => write!(f, "no bundle loaded after a reload"),
        }
    }
}

/// The performance votes the daemon started with, to start again on a re-created backend.
pub(super) struct VoteSettings {
    /// The NSPs voted on (every one a plan may place contexts on).
    pub(super) devices: Vec<u32>,
    /// The configured performance mode.
    pub(super) mode: PerformanceMode,
    /// How long after the last inference the vote is relaxed.
    pub(super) idle: Duration,
}

/// The engine's NPU bookkeeping.
pub(super) struct Npu {
    pub(super) status: NpuStatus,
    /// The library the backend is re-created from (kept loaded for the process).
    pub(super) lib: Arc<QnnLibrary>,
    /// The performance vote to start again on a new backend.
    pub(super) votes: Option<VoteSettings>,
    /// The running bundle's gated golden chunk.
    pub(super) reference: Vec<f32>,
    consecutive: u32,
    rebuilds: u32,
    due: Option<Why>,
}

/// The QNN call and code at the root of a failure, if a QNN call failed.
pub(super) fn failed_call(e: &dyn QnnCause) -> Option<(&'static str, u64)> {
    match e.qnn_error()? {
        QnnError::Call {
            operation, code, ..
        } => Some((operation, *code)),
        _ => None,
    }
}

impl Npu {
    pub(super) fn new(
        lib: Arc<QnnLibrary>,
        votes: Option<VoteSettings>,
        reference: Vec<f32>,
    ) -> Self {
        Self {
            status: NpuStatus::default(),
            lib,
            votes,
            reference,
            consecutive: 0,
            rebuilds: 0,
            due: None,
        }
    }

    /// Whether the engine gave up: inferences fail at once, without QNN.
    pub(super) fn held(&self) -> Option<u32> {
        (self.status.0.state.load(Ordering::Relaxed) == HELD).then_some(self.rebuilds)
    }

    /// A failed inference: counts a failed QNN call and decides whether the session is
    /// to be re-created (on the inference thread: no allocation, no logging here).
    pub(super) fn failed(&mut self, e: &dyn QnnCause) {
        let Some((op, code)) = failed_call(e) else {
            return;
        };
        let c = &self.status.0;
        c.failed_calls.fetch_add(1, Ordering::Relaxed);
        c.last_code.store(code, Ordering::Relaxed);
        if code == SYSTEM_COMMUNICATION || code == SYSTEM_COMMUNICATION_FATAL {
            c.restarts.fetch_add(1, Ordering::Relaxed);
            self.due = Some(Why::Restart { op, code });
            return;
        }
        self.consecutive += 1;
        if self.consecutive >= TRANSIENT_LIMIT {
            self.due = Some(Why::Repeated {
                op,
                code,
                n: self.consecutive,
            });
        }
    }

    /// Nothing is loaded (a reload and its fallback failed): a re-creation is due.
    pub(super) fn rebuild_due(&mut self) {
        self.due = Some(Why::NothingLoaded);
    }

    /// A healthy inference: the counts of failures in a row start again.
    pub(super) fn healthy(&mut self) {
        self.consecutive = 0;
        self.rebuilds = 0;
    }
}

impl PolicyEngine {
    /// After a failed inference (the hold already posted): re-creates the QNN session
    /// when one is due, or holds for good past [`MAX_REBUILDS`].
    pub(super) fn recover_if_due(&mut self) {
        let Some(why) = self.npu.due.take() else {
            return;
        };
        if self.npu.rebuilds >= MAX_REBUILDS {
            self.npu.status.set(HELD);
            self.policy = None;
            log::error!(
                "NPU: {why} after {MAX_REBUILDS} re-creations without a healthy inference: holding the arm until SIGHUP or a restart"
            );
            self.roll_back_held_trial();
            return;
        }
        self.npu.rebuilds += 1;
        self.npu.status.set(RECOVERING);
        log::warn!(
            "NPU: {why}: re-creating backend, device and contexts of {} (attempt {} of {MAX_REBUILDS})",
            self.good.display(),
            self.npu.rebuilds
        );
        let t = Instant::now();
        let failed = match self.rebuild() {
            Ok(identical) => {
                let took = t.elapsed();
                self.npu.status.recovered(identical, took);
                if identical {
                    self.npu.status.set(OK);
                    self.npu.consecutive = 0;
                    log::info!(
                        "NPU: re-created and gated in {:.2} s; the golden chunk is bit-identical to the one before the fault; resuming",
                        took.as_secs_f64()
                    );
                    return;
                }
                format!(
                    "re-created and gated in {:.2} s, but the golden chunk is NOT bit-identical to the one before the fault",
                    took.as_secs_f64()
                )
            }
            Err(e @ LoadError::Unverified { .. }) => {
                self.npu
                    .status
                    .0
                    .failed_recoveries
                    .fetch_add(1, Ordering::Relaxed);
                format!("re-creation refused: {e}")
            }
            Err(e) => {
                self.npu
                    .status
                    .0
                    .failed_recoveries
                    .fetch_add(1, Ordering::Relaxed);
                log::error!("NPU: re-creation failed: {e}");
                self.npu.due = Some(Why::RebuildFailed);
                return;
            }
        };
        // The session computes other actions than the gate accepted before, or its files
        // no longer verify: nothing a retry repairs. Held until SIGHUP or a restart.
        self.npu.status.set(HELD);
        self.policy = None;
        log::error!("NPU: {failed}: holding the arm until SIGHUP or a restart");
        self.roll_back_held_trial();
    }

    /// Frees the contexts, the votes, the device and the backend (QNN's order), creates
    /// them again and loads and gates the running bundle from its directory (the files
    /// the running bundle was loaded from, held by the OTA store while in use, and under
    /// OTA verified again with the store's keys as it loads). Whether the
    /// gate's golden chunk is bit-identical to the one before.
    fn rebuild(&mut self) -> Result<bool, LoadError> {
        self.fresh_backend()?;
        let dir = self.good.clone();
        let before = std::mem::take(&mut self.npu.reference);
        match self.try_load(&dir) {
            Ok(()) => Ok(bits_equal(&before, &self.npu.reference)),
            Err(e) => {
                self.npu.reference = before;
                Err(e)
            }
        }
    }

    /// Frees everything made on the backend and the backend, and creates a new one with
    /// its device and votes.
    pub(super) fn fresh_backend(&mut self) -> Result<(), LoadError> {
        self.policy = None;
        self.votes = None;
        self.backend = None;
        let backend = Backend::new(self.npu.lib.clone()).map_err(LoadError::Backend)?;
        if let Some(v) = &self.npu.votes {
            self.votes = crate::qnn_setup::start_votes(&backend, &v.devices, v.mode, v.idle);
        }
        self.backend = Some(backend);
        Ok(())
    }

    /// Loads `dir`; a DSP restart during the load (the gate runs every context) is the
    /// NPU's, not the bundle's: the session is re-created and the load tried once more,
    /// so a good bundle on trial is not rolled back for it.
    pub(super) fn try_load_through_restart(&mut self, dir: &Path) -> Result<(), LoadError> {
        match self.try_load(dir) {
            Err(e)
                if failed_call(&e).is_some_and(|(_, code)| {
                    code == SYSTEM_COMMUNICATION || code == SYSTEM_COMMUNICATION_FATAL
                }) =>
            {
                self.npu.status.0.restarts.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "NPU: DSP subsystem restart while loading {}: {e}; re-creating the session and loading it again",
                    dir.display()
                );
                self.fresh_backend()?;
                self.try_load(dir)
            }
            other => other,
        }
    }

    /// Held while the running bundle is on its OTA trial: the trial fails (it never
    /// completed its healthy inferences) and the store rolls back to the previous bundle,
    /// loaded on a new session; if that fails too, the engine stays held.
    fn roll_back_held_trial(&mut self) {
        let Some(store) = self
            .ota
            .as_ref()
            .filter(|o| o.trial.on_trial())
            .map(|o| o.store.clone())
        else {
            return;
        };
        if let Err(e) = self.fresh_backend() {
            log::error!("NPU: cannot re-create the session to roll back: {e}");
            return;
        }
        let reason = format!("the NPU failed past {MAX_REBUILDS} re-creations during the trial");
        let rolled = store.fail_trial(&reason, &mut |d: &Path| self.try_load(d));
        let running = store.current().ok().flatten();
        if let (Some(o), Some((h, _))) = (&self.ota, &running) {
            o.trial.running(h.clone(), false);
        }
        match rolled {
            Ok(Some(r)) if self.policy.is_some() => {
                log::error!("NPU: {reason}: rolled back ({r:?}); driving the previous bundle");
                self.npu.rebuilds = 0;
                self.npu.consecutive = 0;
                self.npu.status.set(OK);
                self.record_gated(&store);
                self.running.post(self.facts(self.gate_cosine));
            }
            Ok(r) => log::error!(
                "NPU: {reason}: rolled back ({r:?}) but the previous bundle did not load: holding"
            ),
            Err(e) => log::error!("NPU: {reason}; rollback: {e}: holding"),
        }
    }

    /// SIGHUP: a held engine gets a new session and its counts start again.
    pub(super) fn unhold_for_reload(&mut self) -> Result<(), LoadError> {
        if self.npu.held().is_none() && self.backend.is_some() {
            return Ok(());
        }
        self.fresh_backend()?;
        self.npu.rebuilds = 0;
        self.npu.consecutive = 0;
        self.npu.due = None;
        self.npu.status.set(OK);
        Ok(())
    }
}

fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(code: u64) -> QnnError {
        QnnError::Call {
            operation: "graphExecute",
            subject: "graph g".into(),
            code,
            backend_message: None,
        }
    }

    #[test]
    fn a_recovery_whose_golden_chunk_differs_counts_as_failed() {
        let s = NpuStatus::default();
        s.recovered(true, Duration::from_millis(300));
        s.recovered(false, Duration::from_millis(400));
        let m = s.render();
        assert!(m.contains("\nvlad_npu_recoveries_total 1\n"), "{m}");
        assert!(m.contains("\nvlad_npu_failed_recoveries_total 1\n"), "{m}");
        assert!(m.contains("\nvlad_npu_recovered_identical 0\n"), "{m}");
    }

    #[test]
    fn the_failed_call_is_found_down_the_error_chain() {
        let e = crate::gate::LoadError::Backend(call(1007));
        assert_eq!(failed_call(&e), Some(("graphExecute", 1007)));
        let none = crate::gate::InferError::NoPolicy;
        assert_eq!(failed_call(&none), None);
    }

    #[test]
    fn bit_equality_is_exact() {
        assert!(bits_equal(&[1.0, -0.0], &[1.0, -0.0]));
        assert!(!bits_equal(&[0.0], &[-0.0]));
        assert!(!bits_equal(&[1.0], &[1.0, 2.0]));
    }

    #[test]
    fn the_textfile_names_the_state() {
        let s = NpuStatus::default();
        s.set(HELD);
        let text = s.render();
        assert!(text.contains("vlad_npu_state{state=\"held\"} 1"));
        assert!(text.contains("vlad_npu_state{state=\"ok\"} 0"));
        assert!(s.status().starts_with("npu held"));
    }
}
