//! `vlad ota status|install|activate|commit|rollback|gc|recover`: the OTA store from the
//! command line, outside the daemon.
//!
//! The store (`ota.root`), trusted keys and trial rules come from the `ota` section of the
//! configuration (`--config`, default `/etc/vla/vlad.json`); `--root` and `--trusted-key`
//! override them. `activate` and `rollback` cannot run the parity gate here (the daemon
//! owns the NPU): their gate verifies the bundle again and sends SIGHUP to the daemon
//! named in `<root>/vlad.pid`, which reloads, runs the golden parity gate and rolls back
//! by itself if it fails. Without a running daemon the bundle is gated at its next start.

use crate::cli;
use crate::Failure;
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vla_ota::{
    Daemon, DeviceTarget, OtaError, OtaSettings, Placement, PublicKey, SignalDaemon, Store, Verdict,
};

const HELP: &str = "usage: vlad ota <command> [--config FILE] [--root DIR] [--trusted-key HEX]...
commands:
  status                 state, links, installed bundles and instruction packs, leftovers
  install <bundle-dir> [--link]
                         verify (signature, target, every file) and stage into <root>/bundles/<hash>
                         (an instruction pack, pack.json: into <root>/packs/<hash>, only for an
                         installed bundle; for the current one the daemon is signalled to reload);
                         --link hard-links files on the same filesystem instead of copying
                         (for read-only, content-addressed sources such as a RAUC artifact)
  activate <hash> [--wait SECS]
                         make an installed bundle current, on trial; signal the daemon to reload;
                         --wait: wait for the daemon's verdict (parity gate passed and a healthy
                         inference run, or rolled back)
  verdict <hash> [--wait SECS]
                         what the daemon made of an activated bundle: pending, running
                         (gate passed), committed or rolled back; --wait: until not pending
--wait SECS is keyed on the daemon's progress (its pid file): it waits as long as the
daemon is alive and loading or gating the bundle, then SECS plus twice the gate's measured
inference time for the first healthy inference; SECS alone while no daemon runs.
  commit                 mark the bundle on trial good
  rollback [--reason T]  return to the previous bundle; signal the daemon to reload
  gc                     delete bundles that are not current, previous, on trial or mapped,
                         and instruction packs of no installed bundle
  recover                start-up recovery (what the daemon does before loading)
<hash> is a content hash or a unique prefix of one (at least 4 characters).
--config FILE       vlad configuration with the `ota` section (default /etc/vla/vlad.json)
--root DIR          OTA root instead of ota.root
--trusted-key HEX   trusted Ed25519 public key instead of ota.trusted_keys (repeatable)
Exit status: 0 done, 1 error, 2 usage, 3 the activation gate refused the bundle (or the
daemon rolled it back while --wait waited), 4 --wait ran out before the daemon's verdict.";

/// The configuration file read when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/vla/vlad.json";

/// The device this runtime serves: QCS9075 / Hexagon v73 and this vlad's version.
pub fn device_target() -> DeviceTarget {
    DeviceTarget {
        soc_model: vla_policy::DEVICE_SOC_MODEL,
        htp_arch: vla_policy::DEVICE_HTP_ARCH,
        runtime_version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// The store's settings from the validated `ota` section of the configuration: the
/// daemon's job, so the store itself knows nothing of the config file. A trusted key whose
/// secret is published (RFC 8032's test vectors) is refused: the daemon does not start.
pub fn ota_settings(config: &vla_config::OtaConfig) -> Result<OtaSettings, OtaError> {
    let trusted_keys: Vec<PublicKey> = config.trusted_keys.iter().map(|k| PublicKey(k.0)).collect();
    let root_keys: Vec<PublicKey> = config.root_keys.iter().map(|k| PublicKey(k.0)).collect();
    for key in trusted_keys.iter().chain(&root_keys) {
        key.check_not_published()?;
    }
    Ok(OtaSettings {
        root: PathBuf::from(config.root.as_str()),
        trusted_keys,
        signature_threshold: config.signature_threshold as usize,
        root_keys,
        trial_inferences: config.trial_inferences,
        max_trial_starts: config.max_trial_starts,
        target: device_target(),
    })
}

/// `--config`, `--root` and `--trusted-key`, shared with `vlad bundle verify`.
#[derive(Default)]
pub struct StoreOptions {
    pub config: Option<PathBuf>,
    pub root: Option<PathBuf>,
    pub trusted_keys: Vec<PublicKey>,
}

impl StoreOptions {
    /// Long options this struct takes.
    pub const OPTIONS: [&'static str; 3] = ["config", "root", "trusted-key"];

    /// Reads the value of option `name` (one of [`StoreOptions::OPTIONS`]).
    pub fn take(&mut self, name: &str, parser: &mut lexopt::Parser) -> Result<(), Failure> {
        match name {
            "config" => self.config = Some(cli::value(parser)?.into()),
            "root" => self.root = Some(cli::value(parser)?.into()),
            "trusted-key" => {
                let text = cli::string(parser)?;
                let key = PublicKey::from_hex(&text)
                    .and_then(|k| k.check_not_published().map(|()| k))
                    .map_err(|e| Failure::Usage(format!("--trusted-key: {e}")))?;
                self.trusted_keys.push(key);
            }
            other => return Err(Failure::Usage(format!("unknown option --{other}"))),
        }
        Ok(())
    }

    /// Settings from the configuration, with the command-line overrides applied. The
    /// default configuration may be absent when `--root` is given.
    pub fn settings(&self) -> Result<OtaSettings, Failure> {
        let path = self.config.clone().unwrap_or_else(|| DEFAULT_CONFIG.into());
        let from_file = if self.config.is_some() || self.root.is_none() || Path::new(&path).exists()
        {
            let config = vla_config::Config::load(&path)?;
            Some(ota_settings(&config.ota)?)
        } else {
            None
        };
        let configured = from_file.is_some();
        let mut settings = from_file.unwrap_or_else(|| OtaSettings {
            root: PathBuf::new(),
            trusted_keys: Vec::new(),
            signature_threshold: 1,
            root_keys: Vec::new(),
            // The defaults of the shipped configuration (config/vlad.json).
            trial_inferences: 20,
            max_trial_starts: 3,
            target: device_target(),
        });
        if let Some(root) = &self.root {
            settings.root = root.clone();
        }
        if !self.trusted_keys.is_empty() {
            // With a configuration, `--trusted-key` may only narrow what it trusts: the
            // daemon verifies with its own keys at every load anyway, and a CLI that
            // accepted a bundle the daemon will refuse would only roll it back.
            if configured {
                if let Some(k) = self
                    .trusted_keys
                    .iter()
                    .find(|k| !settings.trusted_keys.contains(k))
                {
                    return Err(Failure::Usage(format!(
                        "--trusted-key {} is not in the configuration's ota.trusted_keys: it may only narrow them",
                        k.to_hex()
                    )));
                }
            }
            settings.trusted_keys = self.trusted_keys.clone();
        }
        Ok(settings)
    }
}

fn gate_failure(e: OtaError) -> Failure {
    match e {
        OtaError::GateFailed { .. } => Failure::Gate(crate::error_line(&e)),
        other => other.into(),
    }
}

/// Short form of a content hash for tables (the full hash is printed where it is acted on).
fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

/// `vlad ota`'s command line: the command, its operand and its options.
struct OtaArgs {
    options: StoreOptions,
    command: String,
    operand: Option<String>,
    reason: Option<String>,
    link: bool,
    wait: Option<Duration>,
}

impl OtaArgs {
    /// The arguments, or None when `--help` was asked for (and printed).
    fn parse(args: Vec<OsString>) -> Result<Option<Self>, Failure> {
        let mut options = StoreOptions::default();
        let mut command: Option<String> = None;
        let mut operand: Option<String> = None;
        let mut reason: Option<String> = None;
        let mut link = false;
        let mut wait: Option<Duration> = None;
        let mut p = cli::parser(args);
        while let Some(arg) = p.next().map_err(cli::usage)? {
            match arg {
                Long(name) if StoreOptions::OPTIONS.contains(&name) => {
                    let name = name.to_owned();
                    options.take(&name, &mut p)?;
                }
                Long("reason") => reason = Some(cli::string(&mut p)?),
                Long("link") => link = true,
                Long("wait") => wait = Some(wait_seconds(&mut p)?),
                Short('h') | Long("help") => {
                    println!("{HELP}");
                    return Ok(None);
                }
                Value(v) if command.is_none() => {
                    command = Some(v.into_string().map_err(|v| {
                        Failure::Usage(format!("unknown ota command `{}`", v.to_string_lossy()))
                    })?)
                }
                Value(v) if operand.is_none() => {
                    operand = Some(v.into_string().map_err(|v| {
                        Failure::Usage(format!("not valid UTF-8: {}", v.to_string_lossy()))
                    })?)
                }
                other => return Err(cli::unexpected(other)),
            }
        }
        let command =
            command.ok_or_else(|| Failure::Usage(format!("ota needs a command\n{HELP}")))?;
        let args = Self {
            options,
            command,
            operand,
            reason,
            link,
            wait,
        };
        args.check()?;
        Ok(Some(args))
    }

    /// Each command's operand, and each option only with the command it is for.
    fn check(&self) -> Result<(), Failure> {
        let command = self.command.as_str();
        let needs_operand = matches!(command, "install" | "activate" | "verdict");
        if needs_operand != self.operand.is_some() {
            return Err(Failure::Usage(match command {
                "install" => "ota install needs <bundle-dir>".into(),
                "activate" => "ota activate needs <hash>".into(),
                "verdict" => "ota verdict needs <hash>".into(),
                _ => format!("ota {command} takes no argument"),
            }));
        }
        if self.reason.is_some() && command != "rollback" {
            return Err(Failure::Usage("--reason is only for ota rollback".into()));
        }
        if self.link && command != "install" {
            return Err(Failure::Usage("--link is only for ota install".into()));
        }
        if self.wait.is_some() && !matches!(command, "activate" | "verdict") {
            return Err(Failure::Usage(
                "--wait is only for ota activate and ota verdict".into(),
            ));
        }
        Ok(())
    }

    fn operand(&self) -> &str {
        self.operand.as_deref().unwrap_or_default()
    }
}

/// `--wait`'s value: seconds, finite and not negative.
fn wait_seconds(p: &mut lexopt::Parser) -> Result<Duration, Failure> {
    let text = cli::string(p)?;
    let seconds: f64 = text
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s >= 0.0)
        .ok_or_else(|| Failure::Usage(format!("--wait: `{text}` is not seconds")))?;
    Ok(Duration::from_secs_f64(seconds))
}

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let Some(args) = OtaArgs::parse(args)? else {
        return Ok(());
    };
    let settings = args.options.settings()?;
    if settings.root.as_os_str().is_empty() {
        return Err(Failure::Usage(
            "no OTA root: give --config or --root".into(),
        ));
    }
    let store = Store::new(settings);
    match args.command.as_str() {
        "status" => status(&store),
        "install" => install(&store, Path::new(args.operand()), args.link),
        "activate" => activate(&store, args.operand(), args.wait),
        "verdict" => {
            let hash = store.resolve(args.operand())?;
            wait_for_verdict(&store, &hash, args.wait.unwrap_or_default())
        }
        "commit" => {
            match store.commit()? {
                Some(hash) => println!("committed {hash}"),
                None => println!("nothing is on trial"),
            }
            Ok(())
        }
        "rollback" => rollback(&store, args.reason),
        "gc" => gc(&store),
        "recover" => recover(&store),
        other => Err(Failure::Usage(format!(
            "unknown ota command `{other}`\n{HELP}"
        ))),
    }
}

/// `vlad ota install DIR [--link]`.
fn install(store: &Store, dir: &Path, link: bool) -> Result<(), Failure> {
    let placement = if link {
        Placement::HardLink
    } else {
        Placement::Copy
    };
    let installed = store.install_with(dir, placement)?;
    if installed.dir.starts_with(store.packs_dir()) {
        return crate::packs::installed(store, &installed);
    }
    if installed.already_installed {
        println!("already installed: {}", installed.hash);
    } else {
        println!(
            "installed {} in {}",
            installed.hash,
            installed.dir.display()
        );
        if link {
            println!("{} file(s) hard-linked", installed.linked_files);
        }
    }
    println!("activate it with: vlad ota activate {}", installed.hash);
    Ok(())
}

/// `vlad ota activate HASH [--wait S]`.
fn activate(store: &Store, hash: &str, wait: Option<Duration>) -> Result<(), Failure> {
    let mut gate = SignalDaemon::new(store, "vlad");
    let activated = store.activate(hash, &mut gate).map_err(gate_failure)?;
    if activated.already_current {
        println!("{} is already current", activated.hash);
    } else {
        println!(
            "{} is current, on trial ({} healthy inferences, {} starts); rollback target: {}",
            activated.hash,
            store.settings().trial_inferences,
            store.settings().max_trial_starts,
            activated.previous.as_deref().unwrap_or("none")
        );
    }
    if let Some(outcome) = gate.outcome {
        println!("{outcome}");
    }
    match wait {
        Some(limit) => wait_for_verdict(store, &activated.hash, limit),
        None => Ok(()),
    }
}

/// `vlad ota rollback [--reason TEXT]`.
fn rollback(store: &Store, reason: Option<String>) -> Result<(), Failure> {
    let mut gate = SignalDaemon::new(store, "vlad");
    let reason = reason.unwrap_or_else(|| "operator rollback (vlad ota rollback)".into());
    let rolled = store.rollback(&reason, &mut gate)?;
    println!(
        "rolled back from {} to {}",
        rolled.from,
        rolled.to.as_deref().unwrap_or("nothing")
    );
    if let Some(e) = rolled.gate_error {
        return Err(Failure::Gate(format!(
            "the bundle rolled back to was refused: {e}"
        )));
    }
    if let Some(outcome) = gate.outcome {
        println!("{outcome}");
    }
    Ok(())
}

/// `vlad ota gc`.
fn gc(store: &Store) -> Result<(), Failure> {
    let report = store.gc()?;
    for hash in &report.removed {
        println!("removed {hash}");
    }
    for (hash, why) in &report.kept {
        println!("kept {hash}: {why}");
    }
    for path in &report.cleaned {
        println!("cleaned {}", path.display());
    }
    if report.unchecked_processes > 0 {
        println!(
            "warning: the maps of {} process(es) could not be read; run as root or as the daemon's user",
            report.unchecked_processes
        );
    }
    println!("freed {} bytes", report.freed_bytes);
    Ok(())
}

/// `vlad ota recover`: what the daemon's start does to the store, by hand.
fn recover(store: &Store) -> Result<(), Failure> {
    let report = store.on_start()?;
    for path in &report.cleaned {
        println!("cleaned {}", path.display());
    }
    for repair in &report.repairs {
        println!("repaired: {repair}");
    }
    if let Some(r) = &report.rolled_back {
        println!(
            "rolled back from {} to {}: {}",
            r.from,
            r.to.as_deref().unwrap_or("nothing"),
            r.reason
        );
    }
    match (&report.current, report.trial_start) {
        (Some((hash, _)), Some(n)) => println!("current {hash} (on trial, start {n})"),
        (Some((hash, _)), None) => println!("current {hash}"),
        (None, _) => println!("no current bundle"),
    }
    Ok(())
}

/// Polls the state until the daemon has run the bundle healthily (after its parity
/// gate), committed it or rolled it back. How long it waits is keyed on what the daemon
/// reports in its pid file, not on a guess of the machine's speed (loading and gating take
/// seconds on the NPU, minutes on a loaded emulator):
/// - while the pid file names a live daemon that has not yet gated `hash` (it is loading
///   or gating it), the wait goes on: a wedged start is its supervisor's to end (systemd's
///   start timeout and watchdog), or the caller's own time limit;
/// - once the daemon has gated `hash`, its first healthy inference needs an observation
///   and one inference: the wait allows `limit` plus twice the gate's measured inference
///   time from then (a robot that sends nothing ends it there);
/// - while no live daemon is named, `limit` runs (a supervised daemon restarts within it).
///
/// `limit` zero: no wait, the verdict as it stands.
fn wait_for_verdict(store: &Store, hash: &str, limit: Duration) -> Result<(), Failure> {
    let start = Instant::now();
    let mut deadline = start + limit;
    let mut gated_seen = false;
    loop {
        match store.verdict(hash)? {
            Verdict::Pending => {
                let now = Instant::now();
                let daemon = store
                    .daemon("vlad")
                    .map_err(|e| Failure::Error(crate::error_line(&e)))?;
                match &daemon {
                    Daemon::Alive { gated: Some(g), .. } if g.hash == hash => {
                        if !gated_seen && !limit.is_zero() {
                            deadline = deadline.max(now + limit + 2 * g.inference);
                        }
                        gated_seen = true;
                    }
                    Daemon::Alive { .. } if !limit.is_zero() => {
                        gated_seen = false;
                        deadline = deadline.max(now + limit);
                    }
                    _ => gated_seen = false,
                }
                if now >= deadline {
                    return Err(Failure::Pending(pending_reason(
                        store,
                        hash,
                        &daemon,
                        now - start,
                    )));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Verdict::Running { healthy, needed } => {
                println!(
                    "{hash} passed the daemon's parity gate and ran {healthy} of {needed} healthy inferences of its trial"
                );
                return Ok(());
            }
            Verdict::Committed => {
                println!("{hash} passed its trial and is committed");
                return Ok(());
            }
            Verdict::RolledBack { to, reason } => {
                return Err(Failure::Gate(format!(
                    "the daemon rolled {hash} back to {}: {reason}",
                    to.as_deref().unwrap_or("nothing")
                )))
            }
            Verdict::Superseded { current } => {
                return Err(Failure::Error(format!(
                    "{hash} is no longer current ({} is): another OTA operation ran meanwhile",
                    current.as_deref().unwrap_or("nothing")
                )))
            }
        }
    }
}

/// Why the verdict on `hash` is still pending, from what the pid file says of the daemon.
fn pending_reason(store: &Store, hash: &str, daemon: &Daemon, waited: Duration) -> String {
    let waited = waited.as_secs_f64();
    match daemon {
        Daemon::Absent => format!(
            "no verdict on {hash} after {waited:.1} s: it is current and on trial, and no daemon runs on {} (no {}): it is gated at the daemon's next start",
            store.root().display(),
            vla_ota::PID_FILE
        ),
        Daemon::Gone { why, .. } => format!(
            "no verdict on {hash} after {waited:.1} s: it is current and on trial, and the daemon is gone ({why})"
        ),
        Daemon::Alive {
            pid,
            gated: Some(g),
        } if g.hash == hash => format!(
            "no verdict on {hash} after {waited:.1} s: the daemon (pid {pid}) passed its gate and runs it, but has completed no healthy inference (one takes {:.1} s here): is the robot sending observations?",
            g.inference.as_secs_f64()
        ),
        Daemon::Alive { pid, .. } => format!(
            "no verdict on {hash} after {waited:.1} s: it is current and on trial, and the daemon (pid {pid}) has not gated it yet"
        ),
    }
}

fn status(store: &Store) -> Result<(), Failure> {
    let s = store.status()?;
    let state = &s.state;
    println!("OTA root {}", s.root.display());
    let describe = |hash: &Option<String>| -> String {
        match hash {
            None => "none".into(),
            Some(h) => match s.bundles.iter().find(|b| &b.hash == h) {
                Some(b) => format!("{h} ({} {})", b.name, b.version),
                None => format!("{h} (not installed)"),
            },
        }
    };
    println!("current:  {}", describe(&state.current));
    if state.trial.is_some() {
        println!(
            "          on trial: start {} of {}, {} of {} healthy inferences",
            state.trial_starts, s.max_trial_starts, state.healthy_inferences, s.trial_inferences
        );
    }
    println!("previous: {}", describe(&state.previous));
    match store.floor() {
        Ok(floor) => println!(
            "version floor: {} (nothing older is installed or activated; latest time seen: Unix {})",
            floor.version.as_deref().unwrap_or("none yet"),
            floor.clock
        ),
        Err(e) => println!("version floor: {}", crate::error_line(&e)),
    }
    for (name, link) in [("current", &s.current_link), ("previous", &s.previous_link)] {
        let expected = match name {
            "current" => &state.current,
            _ => &state.previous,
        };
        let matches = match (link, expected) {
            (Some(l), Some(h)) => l == &Path::new("bundles").join(h),
            (None, None) => true,
            _ => false,
        };
        if !matches {
            println!(
                "warning: link `{name}` -> {} disagrees with the state (repaired at the next start or `vlad ota recover`)",
                link.as_ref().map_or("(none)".into(), |l| l.display().to_string())
            );
        }
    }
    if let Some(r) = &state.last_rollback {
        println!(
            "last rollback: {} -> {}: {}",
            short(&r.from),
            r.to.as_deref().map_or("nothing", short),
            r.reason
        );
    }
    println!("installed bundles:");
    if s.bundles.is_empty() {
        println!("  (none)");
    }
    for b in &s.bundles {
        let mut roles = Vec::new();
        if state.current.as_deref() == Some(b.hash.as_str()) {
            roles.push("current");
        }
        if state.previous.as_deref() == Some(b.hash.as_str()) {
            roles.push("previous");
        }
        if state.trial.as_deref() == Some(b.hash.as_str()) {
            roles.push("trial");
        }
        if b.mapped {
            roles.push("mapped");
        }
        println!(
            "  {}  {:<32} {:<10} {:>12} bytes  {}",
            short(&b.hash),
            b.name,
            b.version,
            b.bytes,
            roles.join(",")
        );
    }
    crate::packs::print_status(&s, state.current.as_deref());
    for l in &s.leftovers {
        println!("leftover: {l} (removed at the next start or `vlad ota recover`)");
    }
    Ok(())
}
