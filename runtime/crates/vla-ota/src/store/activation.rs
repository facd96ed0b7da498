//! Activation and rollback: making an installed bundle current (state first, then the
//! links, then the gate), and returning to the previous bundle when a gate refuses or an
//! operator asks.

use super::Store;
use crate::durable;
use crate::error::OtaError;
use crate::state::{OtaState, RollbackRecord};
use crate::Activation;
use std::path::PathBuf;

/// A successful activation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Activated {
    /// Content hash of the activated bundle.
    pub hash: String,
    /// Its directory under `bundles/`.
    pub dir: PathBuf,
    /// It was already the current bundle; nothing changed.
    pub already_current: bool,
    /// The rollback target now kept in `previous`.
    pub previous: Option<String>,
}

/// A rollback that was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolledBack {
    /// Content hash of the bundle that was left.
    pub from: String,
    /// `None`: there was nothing to return to, so no bundle is current.
    pub to: Option<String>,
    /// Why, as one line.
    pub reason: String,
    /// The gate's refusal of the bundle rolled back to (its one line), if it was called
    /// and failed.
    pub gate_error: Option<String>,
}

impl Store {
    /// Makes the installed bundle `hash` (or a unique prefix) current and puts it on
    /// trial: verifies it again, records the new roles in the state, swaps the links,
    /// then calls `gate`. If the gate refuses, rolls back to the previous bundle, calls
    /// the gate for it, and returns [`OtaError::GateFailed`].
    pub fn activate(
        &self,
        hash_or_prefix: &str,
        gate: &mut dyn Activation,
    ) -> Result<Activated, OtaError> {
        let _lock = self.lock()?;
        let hash = self.resolve(hash_or_prefix)?;
        let mut repairs = Vec::new();
        let state = self.load_state(&mut repairs)?;
        self.apply_links(&state)?;
        if state.current.is_none() {
            if let Some(target) = durable::read_link(&self.current_link())? {
                // Replacing a link the store does not manage would lose the only way back.
                return Err(OtaError::State {
                    path: self.current_link(),
                    reason: format!(
                        "points at {}, outside the store: provision that bundle with `vlad ota install` and `activate`, or remove the link",
                        target.display()
                    ),
                });
            }
        }
        let dir = self.bundle_dir(&hash);
        if state.current.as_deref() == Some(hash.as_str()) {
            return Ok(Activated {
                hash,
                dir,
                already_current: true,
                previous: state.previous,
            });
        }
        let verified = self.verify(&dir)?;
        if verified.content_hash != hash {
            return Err(OtaError::InUseCorrupt {
                hash,
                reason: "its manifest hash does not match its directory name".into(),
            });
        }
        self.check_floor_and_expiry(&verified)?;
        // The rollback target is the last committed bundle: replacing a bundle still on
        // trial keeps the one before it.
        let previous = if state.trial.is_some() {
            state.previous.clone()
        } else {
            state.current.clone()
        };
        let next = OtaState {
            current: Some(hash.clone()),
            previous: previous.clone(),
            trial: Some(hash.clone()),
            trial_starts: 1,
            healthy_inferences: 0,
            ..state
        };
        self.step("activate: before state write");
        self.write_state(&next)?;
        self.apply_links(&next)?;
        self.step("activate: before gate");
        match gate.reload_and_gate(&dir) {
            Ok(()) => {
                self.step("activate: gate passed");
                Ok(Activated {
                    hash,
                    dir,
                    already_current: false,
                    previous,
                })
            }
            Err(refusal) => {
                self.step("activate: gate failed");
                let reason = refusal.to_string();
                let rolled = self.roll_back_locked(next, &reason, Some(gate), true)?;
                Err(OtaError::GateFailed {
                    hash,
                    reason,
                    rolled_back_to: rolled.to,
                    rollback_error: rolled.gate_error,
                    refusal,
                })
            }
        }
    }

    /// Leaves the current bundle for `state.previous`. `automatic` (a failed trial): the
    /// bundle left is not kept as a rollback target. Manual rollback of a committed
    /// bundle swaps the two, so it can be undone. A previous bundle that no longer
    /// verifies is not returned to: nothing is made current instead (fail closed).
    pub(super) fn roll_back_locked(
        &self,
        state: OtaState,
        reason: &str,
        gate: Option<&mut dyn Activation>,
        automatic: bool,
    ) -> Result<RolledBack, OtaError> {
        let from = state.current.clone().unwrap_or_default();
        let mut to = state.previous.clone();
        let mut why = reason.to_owned();
        if let Some(p) = &to {
            if let Err(e) = self.verify(&self.bundle_dir(p)) {
                why = format!("{reason}; previous bundle {p} unusable: {e}");
                to = None;
            }
        }
        let keep_left = !automatic && state.trial.is_none();
        let next = OtaState {
            current: to.clone(),
            previous: if keep_left {
                state.current.clone()
            } else {
                None
            },
            trial: None,
            trial_starts: 0,
            healthy_inferences: 0,
            last_rollback: Some(RollbackRecord {
                from: from.clone(),
                to: to.clone(),
                reason: why.clone(),
            }),
            ..state
        };
        self.step("rollback: before state write");
        self.write_state(&next)?;
        self.apply_links(&next)?;
        self.step("rollback: links moved");
        log::warn!(
            "rolled back from bundle {from} to {}: {why}",
            to.as_deref().unwrap_or("nothing")
        );
        let gate_error = match (gate, &to) {
            (Some(gate), Some(p)) => gate
                .reload_and_gate(&self.bundle_dir(p))
                .err()
                .map(|refusal| refusal.to_string()),
            _ => None,
        };
        self.step("rollback: done");
        Ok(RolledBack {
            from,
            to,
            reason: why,
            gate_error,
        })
    }

    /// Operator rollback to the previous bundle, calling `gate` for it. During a trial
    /// the trial bundle is abandoned; after a commit the two bundles swap roles.
    pub fn rollback(
        &self,
        reason: &str,
        gate: &mut dyn Activation,
    ) -> Result<RolledBack, OtaError> {
        let _lock = self.lock()?;
        let state = self.load_state(&mut Vec::new())?;
        self.apply_links(&state)?;
        if state.previous.is_none() || state.current.is_none() {
            return Err(OtaError::NoPrevious);
        }
        self.roll_back_locked(state, reason, Some(gate), false)
    }

    /// The daemon's verdict on a trial bundle that failed at run time (its gate after a
    /// restart or reload): rolls back like a failed activation.
    pub fn fail_trial(
        &self,
        reason: &str,
        gate: &mut dyn Activation,
    ) -> Result<Option<RolledBack>, OtaError> {
        let _lock = self.lock()?;
        let state = self.load_state(&mut Vec::new())?;
        if state.trial.is_none() {
            return Ok(None);
        }
        self.roll_back_locked(state, reason, Some(gate), true)
            .map(Some)
    }
}
