//! The trial in the state file: healthy inferences counted towards the commit, the commit
//! itself, and the daemon's verdict as `vlad ota verdict` reads it. (The daemon's
//! in-memory counter that feeds it is [`crate::TrialRecorder`].)

use super::Store;
use crate::error::OtaError;
use crate::state::OtaState;

/// Progress of the trial after [`Store::record_healthy`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrialProgress {
    /// The running bundle is not on trial (already committed, or not the current one).
    NotOnTrial,
    /// The bundle is on trial and has not reached the threshold yet.
    OnTrial {
        /// Healthy inferences completed so far.
        healthy: u64,
        /// Healthy inferences the trial needs.
        needed: u64,
    },
    /// This call reached the threshold: the bundle is now committed.
    Committed(String),
}

/// What the daemon has made of an activated bundle so far, as the state file records it
/// ([`Store::verdict`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not run yet: the daemon has not reloaded, or has run no inference since.
    Pending,
    /// It passed the daemon's parity gate and has run `healthy` of the `needed` healthy
    /// inferences of its trial.
    Running {
        /// Healthy inferences completed so far.
        healthy: u64,
        /// Healthy inferences the trial needs.
        needed: u64,
    },
    /// Its trial is over: committed, the rollback target of the next update.
    Committed,
    /// It was rolled back (its gate failed, or it crash-looped).
    RolledBack {
        /// Content hash of the bundle returned to; `None`: nothing is active.
        to: Option<String>,
        /// Why, as one line.
        reason: String,
    },
    /// Another bundle was made current since.
    Superseded {
        /// The bundle now current, if any.
        current: Option<String>,
    },
}

impl Store {
    /// Marks the trial bundle good: it stays current and becomes the rollback target of
    /// the next update. Returns the committed hash, `None` if nothing was on trial.
    pub fn commit(&self) -> Result<Option<String>, OtaError> {
        let _lock = self.lock()?;
        let state = self.load_state(&mut Vec::new())?;
        self.commit_locked(state)
    }

    fn commit_locked(&self, state: OtaState) -> Result<Option<String>, OtaError> {
        let Some(hash) = state.trial.clone() else {
            return Ok(None);
        };
        let next = OtaState {
            trial: None,
            trial_starts: 0,
            healthy_inferences: 0,
            ..state
        };
        self.step("commit: before state write");
        self.write_state(&next)?;
        // After the state: a trial that has not committed never raises the floor. A crash
        // in between is repaired by `on_start`, which raises it to the committed bundle's.
        self.raise_floor(self.bundle_version(&hash).as_deref(), true)?;
        self.step("commit: floor raised");
        log::info!("bundle {hash} committed");
        Ok(Some(hash))
    }

    /// Counts `n` healthy inferences of the running bundle `running` (its content hash,
    /// as [`Store::current`] returned when it was loaded). Reaching `trial_inferences`
    /// commits it. Counts nothing if `running` is not the bundle on trial, so a daemon
    /// still running an older bundle can never commit one it has not run.
    pub fn record_healthy(&self, running: &str, n: u64) -> Result<TrialProgress, OtaError> {
        // Cheap check without the lock: the common case (committed) writes nothing.
        match self.read_state()? {
            Some(s) if s.trial.as_deref() == Some(running) => {}
            _ => return Ok(TrialProgress::NotOnTrial),
        }
        let _lock = self.lock()?;
        let state = self.load_state(&mut Vec::new())?;
        if state.trial.as_deref() != Some(running) {
            return Ok(TrialProgress::NotOnTrial);
        }
        let needed = u64::from(self.settings.trial_inferences);
        let healthy = state.healthy_inferences.saturating_add(n);
        if healthy >= needed {
            return Ok(self
                .commit_locked(state)?
                .map_or(TrialProgress::NotOnTrial, TrialProgress::Committed));
        }
        self.write_state(&OtaState {
            healthy_inferences: healthy,
            ..state
        })?;
        Ok(TrialProgress::OnTrial { healthy, needed })
    }

    /// The daemon's verdict so far on the activated bundle `hash`. Reads the state file
    /// only (every write of it is an atomic rename), so it may be polled while the daemon
    /// and other OTA commands run.
    pub fn verdict(&self, hash: &str) -> Result<Verdict, OtaError> {
        let Some(state) = self.read_state()? else {
            return Ok(Verdict::Pending);
        };
        if state.current.as_deref() == Some(hash) {
            return Ok(match state.trial.as_deref() {
                Some(_) if state.healthy_inferences == 0 => Verdict::Pending,
                Some(_) => Verdict::Running {
                    healthy: state.healthy_inferences,
                    needed: u64::from(self.settings.trial_inferences),
                },
                None => Verdict::Committed,
            });
        }
        Ok(match state.last_rollback {
            Some(r) if r.from == hash => Verdict::RolledBack {
                to: r.to,
                reason: r.reason,
            },
            _ => Verdict::Superseded {
                current: state.current,
            },
        })
    }
}
