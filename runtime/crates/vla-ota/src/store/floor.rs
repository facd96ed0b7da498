//! The anti-rollback floor and the device's idea of the time, kept durably in
//! `version-floor.json`: the highest bundle version this device has committed, and the
//! latest time it has seen.
//!
//! The version floor rises when a trial commits, never at install, so a bundle that fails
//! its trial cannot raise it. Install and activate refuse a bundle below it; the one way
//! back to an older release is the operator's `rollback` to the kept `previous` bundle
//! (the store's explicit downgrade, which needs the device's own CLI, not the fleet).
//!
//! A board without a battery-backed clock may boot at 1970. The time used for expiry is
//! therefore the later of the system clock and the latest time recorded here (at every
//! install and commit), so a reset clock cannot make an expired bundle installable again
//! once the device has seen a later time. On a board with RPMB or a hardware monotonic
//! counter, this file's two numbers are what belongs there (docs/security.md).

use super::Store;
use crate::durable;
use crate::error::OtaError;
use crate::verify::VerifiedBundle;
use crate::version::Version;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The floor file name under the OTA root.
pub const FLOOR_FILE: &str = "version-floor.json";
const FLOOR_FORMAT: u32 = 1;
const MAX_FLOOR_BYTES: u64 = 4096;

/// What `version-floor.json` holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Floor {
    /// File format (1).
    pub format: u32,
    /// The highest version committed on this device; `None`: nothing committed yet.
    pub version: Option<String>,
    /// The latest time this device has seen (Unix seconds).
    pub clock: u64,
}

impl Store {
    /// `<root>/version-floor.json`.
    pub fn floor_path(&self) -> PathBuf {
        self.root().join(FLOOR_FILE)
    }

    /// Replaces the system clock (Unix seconds) for expiry checks; tests simulate a board
    /// that booted without a real-time clock with it.
    pub fn set_clock(&mut self, clock: impl Fn() -> u64 + Send + Sync + 'static) {
        self.clock = Some(Box::new(clock));
    }

    /// The system clock (or the test clock), Unix seconds; 0 if it is before 1970.
    fn system_time(&self) -> u64 {
        match &self.clock {
            Some(clock) => clock(),
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// The floor; the default (nothing committed, time 0) if there is no floor file.
    pub fn floor(&self) -> Result<Floor, OtaError> {
        let path = self.floor_path();
        let err = |reason: String| OtaError::Floor {
            path: path.clone(),
            reason,
        };
        let bytes = match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Floor::default()),
            Err(e) => return Err(OtaError::io("reading", &path, e)),
            Ok(m) if !m.is_file() => return Err(err("is not a regular file".into())),
            Ok(m) if m.len() > MAX_FLOOR_BYTES => {
                return Err(err(format!(
                    "is {} bytes, more than {MAX_FLOOR_BYTES}",
                    m.len()
                )))
            }
            Ok(_) => std::fs::read(&path).map_err(|e| OtaError::io("reading", &path, e))?,
        };
        let floor: Floor =
            serde_json::from_slice(&bytes).map_err(|e| err(format!("not valid JSON: {e}")))?;
        if floor.format != FLOOR_FORMAT {
            return Err(err(format!("format {} is not supported", floor.format)));
        }
        if let Some(v) = &floor.version {
            if Version::parse(v).is_none() {
                return Err(err(format!("`{v}` is not a version")));
            }
        }
        Ok(floor)
    }

    /// The time expiry is judged by: the later of the system clock and the floor's clock.
    pub fn device_time(&self) -> Result<u64, OtaError> {
        Ok(self.system_time().max(self.floor()?.clock))
    }

    /// Raises the floor to `version` (if higher) and, with `record_clock`, its clock to the
    /// device time. Writes when the version rose, and always with `record_clock` (so the
    /// steps an operation takes do not depend on whether a second has passed). Called with
    /// the lock held.
    pub(super) fn raise_floor(
        &self,
        version: Option<&str>,
        record_clock: bool,
    ) -> Result<(), OtaError> {
        let old = self.floor()?;
        let mut next = Floor {
            format: FLOOR_FORMAT,
            clock: if record_clock {
                old.clock.max(self.system_time())
            } else {
                old.clock
            },
            version: old.version.clone(),
        };
        if let Some(v) = version.and_then(Version::parse) {
            if old
                .version
                .as_deref()
                .and_then(Version::parse)
                .is_none_or(|floor| v > floor)
            {
                next.version = version.map(str::to_owned);
            }
        }
        if record_clock || next != old {
            let mut bytes = serde_json::to_vec_pretty(&next).expect("a floor serializes");
            bytes.push(b'\n');
            durable::write_atomic(&self.floor_path(), &bytes, &mut |s| self.step(s))?;
        }
        Ok(())
    }

    /// Refuses a bundle below the version floor, or whose signed expiry has passed.
    pub(crate) fn check_floor_and_expiry(&self, verified: &VerifiedBundle) -> Result<(), OtaError> {
        let floor = self.floor()?;
        let version = Version::parse(&verified.manifest.version)
            .expect("OtaManifest::parse checked the version");
        if let Some(f) = &floor.version {
            if Version::parse(f).is_some_and(|f| version < f) {
                return Err(OtaError::Rollback {
                    bundle: verified.dir.clone(),
                    version: verified.manifest.version.clone(),
                    floor: f.clone(),
                });
            }
        }
        let now = self.system_time().max(floor.clock);
        if verified.manifest.expires <= now {
            return Err(OtaError::Expired {
                bundle: verified.dir.clone(),
                expires: verified.manifest.expires,
                now,
            });
        }
        Ok(())
    }
}
