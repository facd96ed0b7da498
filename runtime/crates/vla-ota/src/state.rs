//! `ota-state.json`: which bundle is current, which is the rollback target, and the trial.
//!
//! The state file is the source of truth; the `current` / `previous` links follow it. Every
//! change writes the new state first (atomically and durably), then moves the links, so a
//! crash between the two is repaired at the next start by pointing the links where the
//! state says.

use crate::error::OtaError;
use crate::hex;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The only state format this runtime reads and writes.
pub const STATE_FORMAT: u32 = 1;

/// Why the device last left a bundle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRecord {
    /// Content hash of the bundle that was left.
    pub from: String,
    /// Content hash of the bundle returned to (`None`: nothing left to run).
    pub to: Option<String>,
    /// Why, as one line (the gate's refusal, a crash loop, an operator's rollback).
    pub reason: String,
}

/// The OTA state. All bundle references are content hashes (directory names under
/// `<root>/bundles/`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtaState {
    /// State file format version; must be the one this runtime writes.
    pub format: u32,
    /// The bundle `current` points at.
    pub current: Option<String>,
    /// The last committed bundle before `current`, what a rollback returns to.
    pub previous: Option<String>,
    /// `current` while it is on trial (not yet committed), else `None`.
    pub trial: Option<String>,
    /// Times the trial bundle has been started (its activation counts as the first).
    pub trial_starts: u32,
    /// Healthy inferences the trial bundle has completed.
    pub healthy_inferences: u64,
    /// Why the device last left a bundle, if it ever did.
    pub last_rollback: Option<RollbackRecord>,
}

impl Default for OtaState {
    fn default() -> Self {
        OtaState {
            format: STATE_FORMAT,
            current: None,
            previous: None,
            trial: None,
            trial_starts: 0,
            healthy_inferences: 0,
            last_rollback: None,
        }
    }
}

impl OtaState {
    /// Parses and checks the invariants: known format, well-formed hashes, a trial only
    /// on the current bundle, previous distinct from current.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, OtaError> {
        let err = |reason: String| OtaError::State {
            path: path.to_owned(),
            reason,
        };
        let state: OtaState =
            serde_json::from_slice(bytes).map_err(|e| err(format!("not valid state JSON: {e}")))?;
        if state.format != STATE_FORMAT {
            return Err(err(format!("format {} is not supported", state.format)));
        }
        for (field, value) in [
            ("current", &state.current),
            ("previous", &state.previous),
            ("trial", &state.trial),
        ] {
            if let Some(h) = value {
                if !hex::is_content_hash(h) {
                    return Err(err(format!("`{field}` `{h}` is not a content hash")));
                }
            }
        }
        if state.trial.is_some() && state.trial != state.current {
            return Err(err("`trial` is not the current bundle".into()));
        }
        if state.previous.is_some() && state.previous == state.current {
            return Err(err("`previous` equals `current`".into()));
        }
        Ok(state)
    }

    /// The state as pretty JSON with a trailing newline, as the state file holds it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes =
            serde_json::to_vec_pretty(self).expect("a state of strings and numbers serializes");
        bytes.push(b'\n');
        bytes
    }

    /// Bundles the store must keep (current, previous, trial).
    pub fn referenced(&self) -> impl Iterator<Item = &str> {
        [&self.current, &self.previous, &self.trial]
            .into_iter()
            .filter_map(|h| h.as_deref())
    }
}
