//! Start-up recovery: leftovers of interrupted operations removed, links repaired to
//! match the state, the current bundle verified, and trial starts counted (rule 3 of the
//! store), before the daemon loads anything.

use super::{Store, STAGING_PREFIX, TRASH_PREFIX};
use crate::durable;
use crate::error::OtaError;
use crate::RolledBack;
use std::path::PathBuf;

/// What [`Store::on_start`] found and did.
#[derive(Clone, Debug, Default)]
pub struct StartReport {
    /// Content hash and directory of the bundle to load; `None`: nothing to run.
    pub current: Option<(String, PathBuf)>,
    /// The current bundle is on trial; this is its start number (activation was 1).
    pub trial_start: Option<u32>,
    /// A rollback made before anything was loaded (crash loop, or a bundle that no longer
    /// verifies).
    pub rolled_back: Option<RolledBack>,
    /// Leftovers of interrupted operations that were removed.
    pub cleaned: Vec<PathBuf>,
    /// Repairs made, one line each (links moved to match the state, state rebuilt).
    pub repairs: Vec<String>,
}

impl Store {
    /// Start-up recovery, before the daemon loads anything: removes leftovers of
    /// interrupted operations, repairs the links to match the state, verifies the current
    /// bundle (rolling back if it no longer verifies), and counts a start of a trial
    /// bundle, rolling back when the trial has used its `max_trial_starts` (crash loop).
    pub fn on_start(&self) -> Result<StartReport, OtaError> {
        let _lock = self.lock()?;
        let mut report = StartReport {
            cleaned: self.clean_leftovers()?,
            ..StartReport::default()
        };
        let rebuilt = !matches!(self.read_state(), Ok(Some(_)));
        let mut state = self.load_state(&mut report.repairs)?;
        if rebuilt && state.current.is_some() {
            // Adopts links provisioned without a state (a factory image) as committed.
            self.write_state(&state)?;
        }
        if state
            .previous
            .as_deref()
            .is_some_and(|p| !self.bundle_dir(p).is_dir())
        {
            report.repairs.push(format!(
                "previous bundle {} is not installed: no rollback target",
                state.previous.as_deref().unwrap_or_default()
            ));
            state.previous = None;
            self.write_state(&state)?;
        }
        if let Some(current) = state.current.clone() {
            let problem = match self.verify(&self.bundle_dir(&current)) {
                Ok(v) if v.content_hash == current => None,
                Ok(_) => Some("its manifest hash does not match its directory name".to_owned()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(problem) = problem {
                let reason = format!("current bundle {current} does not verify: {problem}");
                report.rolled_back = Some(self.roll_back_locked(state, &reason, None, true)?);
                report
                    .repairs
                    .extend(self.apply_links(&self.load_state(&mut Vec::new())?)?);
                report.current = self.current()?;
                return Ok(report);
            }
        }
        if state.trial.is_some() {
            if state.trial_starts >= self.settings.max_trial_starts {
                let reason = format!(
                    "crash loop: {} starts on trial without {} healthy inferences ({} done)",
                    state.trial_starts, self.settings.trial_inferences, state.healthy_inferences
                );
                report.rolled_back = Some(self.roll_back_locked(state, &reason, None, true)?);
            } else {
                state.trial_starts += 1;
                self.step("start: before counting a trial start");
                self.write_state(&state)?;
                report.trial_start = Some(state.trial_starts);
                report.repairs.extend(self.apply_links(&state)?);
            }
        } else {
            report.repairs.extend(self.apply_links(&state)?);
            // A committed current bundle: the floor reaches its version (repairs a crash
            // between a commit's state write and its floor write).
            if let Some(current) = &state.current {
                self.raise_floor(self.bundle_version(current).as_deref(), false)?;
            }
        }
        report.current = self.current()?;
        Ok(report)
    }

    /// Removes staging and trash directories and temporary files of interrupted
    /// operations. Only called with the lock held, so none of them is in use.
    pub(super) fn clean_leftovers(&self) -> Result<Vec<PathBuf>, OtaError> {
        let mut cleaned = Vec::new();
        let mut touched = Vec::new();
        for home in [self.bundles_dir(), self.packs_dir()] {
            let Ok(entries) = std::fs::read_dir(&home) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(STAGING_PREFIX) || name.starts_with(TRASH_PREFIX) {
                    let path = entry.path();
                    std::fs::remove_dir_all(&path)
                        .map_err(|e| OtaError::io("removing", &path, e))?;
                    cleaned.push(path);
                    touched.push(home.clone());
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(self.root()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') && name.contains(".tmp-") {
                    let path = entry.path();
                    std::fs::remove_file(&path).map_err(|e| OtaError::io("removing", &path, e))?;
                    cleaned.push(path);
                }
            }
        }
        if !cleaned.is_empty() {
            touched.dedup();
            for home in &touched {
                durable::fsync_dir(home)?;
            }
            durable::fsync_dir(self.root())?;
        }
        Ok(cleaned)
    }
}
