//! The CLI's activation gate: verify the bundle again and ask the running daemon to
//! reload it (SIGHUP), which runs the real parity gate; and the pid file that names the
//! daemon to it. An instruction pack installed for the running bundle is announced with
//! SIGUSR2 instead (the daemon attaches it without a reload), but only to a daemon that
//! catches SIGUSR2 (`SigCgt` in `/proc/<pid>/status`): its default action ends a process,
//! so an older daemon gets SIGHUP (a reload, which attaches the pack too).
//!
//! The pid file lives under the OTA root, on storage that survives reboots, and SIGHUP
//! ends most programs, so a pid is only signalled when it provably still is the daemon
//! that wrote it: the file holds the pid, the boot id and the process's start time
//! (`pid boot_id start_ticks`), and it is replaced by a rename, so a power cut leaves the
//! old file or the new one, never a partial one. A file from an earlier boot, or a pid
//! now held by a process started later (pid reuse: after a reboot the pid of a `vlad
//! simulate` or of this very CLI may match), is stale and not signalled, as is a pid
//! whose `comm` is not the daemon's. A file with the pid alone (older daemons) gets the
//! `comm` check only.
//!
//! Once a bundle has passed its gate, the daemon rewrites the file with that bundle's
//! hash and its gate's inference time (`pid boot_id start_ticks hash inference_ns`, `-`
//! for what it cannot read): [`Store::daemon`] hands that to `vlad ota verdict --wait`,
//! which waits while the daemon is alive and loading, and then for as long as the first
//! inference can take on this machine, instead of for a guess of the machine's speed.

use super::{Store, PID_FILE};
use crate::durable;
use crate::error::{OtaError, SignalError};
use crate::{Activation, GateError};
use std::path::Path;
use std::time::Duration;

/// What `<root>/vlad.pid` says of the daemon, checked against `/proc` ([`Store::daemon`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Daemon {
    /// No pid file: no daemon has started on this store, or the last one stopped cleanly.
    Absent,
    /// The file names no running daemon; `why` says so in words, naming the file.
    Gone {
        /// The pid the file names.
        pid: i32,
        /// Why it is not a running daemon, naming the file.
        why: String,
    },
    /// The daemon runs. `gated`: the bundle it has gated and runs, once it has one.
    Alive {
        /// The daemon's pid.
        pid: i32,
        /// The bundle it has gated and runs; `None` before its first gate passes.
        gated: Option<Gated>,
    },
}

/// The bundle a running daemon has gated, from its pid file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gated {
    /// Content hash of the gated bundle.
    pub hash: String,
    /// How long the gate's end-to-end inference took (warm, on this machine, under its
    /// load at the time): what the first inference of the loop takes.
    pub inference: Duration,
}

/// This boot's id (`<proc_root>/sys/kernel/random/boot_id`).
fn boot_id(proc_root: &Path) -> Option<String> {
    let boot = std::fs::read_to_string(proc_root.join("sys/kernel/random/boot_id")).ok()?;
    Some(boot.trim().to_owned())
}

/// When process `pid` started (clock ticks after boot, field 22 of its `stat`).
fn start_ticks(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    // Fields after `comm`, which is in parentheses and may itself hold spaces or `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3.
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl Store {
    /// Names the calling process as the running daemon in `<root>/vlad.pid` (see the
    /// module doc), written to a temporary file, made durable and renamed over the old
    /// one. `gated`: the bundle it has loaded and gated, and its gate's inference time
    /// (`None` while it is still loading).
    pub fn record_daemon(&self, gated: Option<(&str, Duration)>) -> Result<(), OtaError> {
        let pid = std::process::id();
        let mut line = match (boot_id(&self.proc_root), start_ticks(&self.proc_root, pid)) {
            (Some(boot), Some(start)) => format!("{pid} {boot} {start}"),
            _ if gated.is_some() => format!("{pid} - -"),
            _ => format!("{pid}"),
        };
        if let Some((hash, inference)) = gated {
            line.push_str(&format!(" {hash} {}", inference.as_nanos()));
        }
        line.push('\n');
        durable::write_atomic(&self.root().join(PID_FILE), line.as_bytes(), &mut |s| {
            self.step(s)
        })
    }

    /// Whether the daemon named in `<root>/vlad.pid` runs, checked as before a signal
    /// (boot id, start time, `comm` = `expected_comm`), and what it has gated.
    pub fn daemon(&self, expected_comm: &str) -> Result<Daemon, SignalError> {
        let pid_path = self.root().join(PID_FILE);
        let text = match std::fs::read_to_string(&pid_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Daemon::Absent),
            Err(source) => {
                return Err(SignalError::ReadPid {
                    path: pid_path,
                    source,
                })
            }
        };
        let mut fields = text.split_whitespace();
        let pid: i32 = fields
            .next()
            .and_then(|p| p.parse().ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| SignalError::NotAPid {
                path: pid_path.clone(),
                text: text.trim().to_owned(),
            })?;
        let gone = |why: String| Ok(Daemon::Gone { pid, why });
        if let (Some(boot), Some(start)) = (fields.next(), fields.next()) {
            let stale = |why: &str| {
                gone(format!(
                    "pid {pid} from {} {why}: stale pid file",
                    pid_path.display()
                ))
            };
            // What this process cannot read is not judged: the comm check below still is.
            if boot != "-" && boot_id(&self.proc_root).is_some_and(|now| now != boot) {
                return stale("was written in an earlier boot");
            }
            match start_ticks(&self.proc_root, pid as u32) {
                Some(started) if start != "-" && start.parse() != Ok(started) => {
                    return stale("now names a process started after the daemon that wrote it")
                }
                _ => {}
            }
        }
        let comm_path = self.proc_root.join(pid.to_string()).join("comm");
        match std::fs::read_to_string(&comm_path) {
            Ok(comm) if comm.trim() == expected_comm => {}
            Ok(comm) => {
                return gone(format!(
                    "pid {pid} from {} is `{}`, not {expected_comm}: stale pid file",
                    pid_path.display(),
                    comm.trim(),
                ))
            }
            Err(_) => {
                return gone(format!(
                    "pid {pid} from {} is not running",
                    pid_path.display()
                ))
            }
        }
        let gated = match (fields.next(), fields.next().and_then(|n| n.parse().ok())) {
            (Some(hash), Some(ns)) => Some(Gated {
                hash: hash.to_owned(),
                inference: Duration::from_nanos(ns),
            }),
            _ => None,
        };
        Ok(Daemon::Alive { pid, gated })
    }
}

/// The activation gate of the `vlad ota activate` command, which runs outside the
/// daemon: verifies the bundle again, then asks the running daemon to reload by sending
/// SIGHUP to the pid in `<root>/vlad.pid`. The real parity gate runs inside the daemon on
/// that reload; if it fails there, the daemon rolls back ([`Store::fail_trial`]). With no
/// daemon running the bundle is loaded (and gated) at its next start.
pub struct SignalDaemon<'a> {
    /// The store whose `vlad.pid` names the daemon.
    pub store: &'a Store,
    /// The daemon's process name (`/proc/<pid>/comm`): a stale pid file naming another
    /// process is never signalled (SIGHUP would terminate it).
    pub expected_comm: String,
    /// What happened, for the command's output.
    pub outcome: Option<String>,
}

impl<'a> SignalDaemon<'a> {
    /// A gate signalling the daemon that runs as `expected_comm`, with no outcome yet.
    pub fn new(store: &'a Store, expected_comm: impl Into<String>) -> Self {
        SignalDaemon {
            store,
            expected_comm: expected_comm.into(),
            outcome: None,
        }
    }

    /// Tells the running daemon that an instruction pack of its bundle was installed:
    /// SIGUSR2 (attached without a reload) when it catches that signal, SIGHUP (a full
    /// reload) otherwise; nothing when no daemon runs. The outcome says which.
    pub fn packs_changed(&mut self) -> Result<(), SignalError> {
        let Some(pid) = self.alive()? else {
            return Ok(());
        };
        let outcome = if catches(pid, nix::sys::signal::SIGUSR2) {
            self.kill(pid, nix::sys::signal::SIGUSR2)?;
            format!(
                "sent SIGUSR2 to {} (pid {pid}): it attaches the pack without a reload",
                self.expected_comm
            )
        } else {
            self.kill(pid, nix::sys::signal::SIGHUP)?;
            format!(
                "{} (pid {pid}) does not catch SIGUSR2 (an older daemon): sent SIGHUP, it reloads and attaches the pack",
                self.expected_comm
            )
        };
        self.outcome = Some(outcome);
        Ok(())
    }

    fn kill(&self, pid: i32, signal: nix::sys::signal::Signal) -> Result<(), SignalError> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).map_err(|source| {
            SignalError::Kill {
                pid,
                signal: signal.as_str(),
                source,
            }
        })
    }

    fn signal(&mut self) -> Result<String, SignalError> {
        let Some(pid) = self.alive()? else {
            return Ok(self.outcome.take().unwrap_or_default());
        };
        self.kill(pid, nix::sys::signal::SIGHUP)?;
        Ok(format!(
            "sent SIGHUP to {} (pid {pid}): it reloads and runs the parity gate",
            self.expected_comm
        ))
    }

    /// The daemon's pid when it provably runs; otherwise `None` with the outcome saying why.
    fn alive(&mut self) -> Result<Option<i32>, SignalError> {
        let none = match self.store.daemon(&self.expected_comm)? {
            Daemon::Absent => {
                format!(
                    "no {}: the daemon loads the bundle at its next start",
                    self.store.root().join(PID_FILE).display()
                )
            }
            Daemon::Gone { why, .. } if why.ends_with("stale pid file") => {
                format!("{why}, not signalled; the daemon loads the bundle at its next start")
            }
            Daemon::Gone { why, .. } => {
                format!("{why}: the daemon loads the bundle at its next start")
            }
            Daemon::Alive { pid, .. } => return Ok(Some(pid)),
        };
        self.outcome = Some(none);
        Ok(None)
    }
}

/// Whether process `pid` has a handler for `signal` (`SigCgt` of `/proc/<pid>/status`);
/// false when that cannot be read.
fn catches(pid: i32, signal: nix::sys::signal::Signal) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal as i32 - 1)) != 0)
}

impl Activation for SignalDaemon<'_> {
    fn reload_and_gate(&mut self, bundle_dir: &Path) -> Result<(), GateError> {
        self.store.verify(bundle_dir)?;
        let outcome = self.signal()?;
        self.outcome = Some(outcome);
        Ok(())
    }
}
