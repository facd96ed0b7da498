//! The CLI's activation gate: verify the bundle again and ask the running daemon to
//! reload it (SIGHUP), which runs the real parity gate.

use super::{Store, PID_FILE};
use crate::error::SignalError;
use crate::{Activation, GateError};
use std::path::Path;

/// The activation gate of the `vlad ota activate` command, which runs outside the
/// daemon: verifies the bundle again, then asks the running daemon to reload by sending
/// SIGHUP to the pid in `<root>/vlad.pid`. The real parity gate runs inside the daemon on
/// that reload; if it fails there, the daemon rolls back ([`Store::fail_trial`]). With no
/// daemon running the bundle is loaded (and gated) at its next start.
pub struct SignalDaemon<'a> {
    pub store: &'a Store,
    /// The daemon's process name (`/proc/<pid>/comm`): a stale pid file naming another
    /// process is never signalled (SIGHUP would terminate it).
    pub expected_comm: String,
    /// What happened, for the command's output.
    pub outcome: Option<String>,
}

impl<'a> SignalDaemon<'a> {
    pub fn new(store: &'a Store, expected_comm: impl Into<String>) -> Self {
        SignalDaemon {
            store,
            expected_comm: expected_comm.into(),
            outcome: None,
        }
    }

    fn signal(&self) -> Result<String, SignalError> {
        let pid_path = self.store.root().join(PID_FILE);
        let text = match std::fs::read_to_string(&pid_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(format!(
                    "no {}: the daemon loads the bundle at its next start",
                    pid_path.display()
                ))
            }
            Err(source) => {
                return Err(SignalError::ReadPid {
                    path: pid_path,
                    source,
                })
            }
        };
        let pid: i32 =
            text.trim()
                .parse()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| SignalError::NotAPid {
                    path: pid_path.clone(),
                    text: text.trim().to_owned(),
                })?;
        let comm_path = self.store.proc_root.join(pid.to_string()).join("comm");
        match std::fs::read_to_string(&comm_path) {
            Ok(comm) if comm.trim() == self.expected_comm => {}
            Ok(comm) => {
                return Ok(format!(
                    "pid {pid} from {} is `{}`, not {}: stale pid file, not signalled; the daemon loads the bundle at its next start",
                    pid_path.display(),
                    comm.trim(),
                    self.expected_comm
                ))
            }
            Err(_) => {
                return Ok(format!(
                    "pid {pid} from {} is not running: the daemon loads the bundle at its next start",
                    pid_path.display()
                ))
            }
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGHUP)
            .map_err(|source| SignalError::Kill { pid, source })?;
        Ok(format!(
            "sent SIGHUP to {} (pid {pid}): it reloads and runs the parity gate",
            self.expected_comm
        ))
    }
}

impl Activation for SignalDaemon<'_> {
    fn reload_and_gate(&mut self, bundle_dir: &Path) -> Result<(), GateError> {
        self.store.verify(bundle_dir)?;
        let outcome = self.signal()?;
        self.outcome = Some(outcome);
        Ok(())
    }
}
