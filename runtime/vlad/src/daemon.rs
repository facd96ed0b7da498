//! `vlad run`: the daemon. Wires config, QNN, the policy, the rings, the control loop and
//! systemd together; owns nothing else.
//!
//! Start-up order: config -> real-time set-up -> QNN -> bundle -> every context resident
//! -> the bundle's parity gate (which also warms every context) -> rings and loop ->
//! `READY=1`, with the loop's operating point (latency in steps against the horizon) in
//! the log and in `STATUS=`; a latency that leaves every chunk spent on arrival is a
//! warning at start-up. SIGHUP reloads the bundle (the publisher holds meanwhile; a bundle that
//! fails to load or to pass its gate is replaced by the previous one); SIGTERM stops
//! after a final `hold`.

use crate::cli::{self, Common};
use crate::gate::{load_gated, InferError, LoadError, Recovery, ReloadError};
use crate::notify::{watchdog_interval, Notifier};
use crate::Failure;
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vla_control::{ControlLoop, Engine, EngineError, Health, LoopReport, LoopSettings, Measured};
use vla_ota::Store;
use vla_policy::{Bundle, Policy};
use vla_qnn::Backend;

const HELP: &str = "usage: vlad run --config FILE [--bundle DIR] [--duration SECONDS] [--lib-dir DIR] [--log-level LVL]
Runs the control loop until SIGTERM (or for --duration). SIGHUP reloads the bundle.";

/// The ring geometry a policy needs.
pub fn ring_geometry(g: &vla_policy::Geometry) -> vla_ring::Geometry {
    vla_ring::Geometry {
        cameras: g.cameras as u32,
        height: g.height as u32,
        width: g.width as u32,
        channels: 3,
        state_dims: g.state_dims as u32,
        action_dims: g.action_dims as u32,
        chunk_len: g.chunk_len as u32,
    }
}

/// The OTA store's view of the running bundle (when `bundle.path` is `<ota.root>/current`).
struct OtaLink {
    store: Arc<Store>,
    /// The running bundle's hash and its trial: healthy inferences are counted in memory
    /// and recorded in the store by the recorder's own (non-real-time) thread, so the
    /// inference thread never waits for the store's lock (an installer holds it while it
    /// copies and hashes gigabytes) and does no file I/O.
    trial: vla_ota::TrialRecorder,
}

impl OtaLink {
    fn start(store: &Arc<Store>, hash: String, on_trial: bool) -> Result<Self, Failure> {
        let trial = vla_ota::TrialRecorder::start(store.clone(), hash, on_trial)
            .map_err(|e| Failure::Error(format!("starting the OTA trial recorder: {e}")))?;
        Ok(Self {
            store: store.clone(),
            trial,
        })
    }
}

/// The policy as the control loop's engine.
pub struct PolicyEngine {
    backend: Backend,
    ota: Option<OtaLink>,
    /// The configured path (often the OTA `current` symlink), re-resolved on reload.
    configured: PathBuf,
    /// The directory that passed its gate last.
    good: PathBuf,
    policy: Option<Policy>,
    /// The running policy's bundle, held so the OTA store sees it in use (its manifest
    /// stays open; the context binaries are unmapped once loaded).
    bundle: Option<Bundle>,
    geometry: vla_ring::Geometry,
    /// HTP performance votes (None: `qnn.performance` off, or refused at start).
    votes: Option<vla_qnn::PerfGovernor>,
    /// `control.extra_latency_ms` (tests and benchmarks only).
    extra_latency: Duration,
    /// How a prefix conditions the flow loop (`control.merge` prefix or inpaint).
    prefix_method: vla_policy::PrefixMethod,
    /// Reloads start the policy's helper threads as the first load did.
    load_options: vla_policy::LoadOptions,
}

impl PolicyEngine {
    fn try_load(&mut self, dir: &Path) -> Result<(), LoadError> {
        let (bundle, policy, _) = load_gated(&self.backend, dir, &self.load_options)?;
        let needs = ring_geometry(&policy.geometry());
        if needs != self.geometry {
            return Err(LoadError::Geometry {
                dir: dir.to_owned(),
                needs,
                rings: self.geometry,
            });
        }
        self.policy = Some(policy);
        self.bundle = Some(bundle);
        self.good = dir.to_owned();
        Ok(())
    }
}

impl Engine for PolicyEngine {
    fn infer(
        &mut self,
        obs: &vla_ring::Observation,
        actions: &mut [f32],
    ) -> Result<(), EngineError> {
        Ok(self.run(obs, None, actions)?)
    }

    fn conditions_on_prefix(&self) -> bool {
        true
    }

    fn discrete_dims(&self) -> Vec<bool> {
        self.policy
            .as_ref()
            .map(Policy::discrete_dims)
            .unwrap_or_default()
    }

    fn infer_with_prefix(
        &mut self,
        obs: &vla_ring::Observation,
        prefix: &vla_control::Prefix<'_>,
        actions: &mut [f32],
    ) -> Result<(), EngineError> {
        let p = vla_policy::ActionPrefix {
            actions: prefix.actions,
            frozen: prefix.frozen,
            overlap: prefix.overlap,
            method: self.prefix_method,
        };
        Ok(self.run(obs, Some(&p), actions)?)
    }

    fn reload(&mut self) -> Result<String, EngineError> {
        Ok(self.reload_policy()?)
    }

    fn component_names(&self) -> Vec<String> {
        self.policy.as_ref().map_or_else(Vec::new, |p| {
            p.timings().components.iter().map(|c| c.0.clone()).collect()
        })
    }

    fn component_latencies(&self, out: &mut [u64]) -> usize {
        let Some(p) = &self.policy else { return 0 };
        let mut n = 0;
        for (slot, c) in out.iter_mut().zip(&p.timings().components) {
            *slot = c.1.as_nanos() as u64;
            n += 1;
        }
        n
    }
}

impl PolicyEngine {
    fn run(
        &mut self,
        obs: &vla_ring::Observation,
        prefix: Option<&vla_policy::ActionPrefix<'_>>,
        actions: &mut [f32],
    ) -> Result<(), InferError> {
        let policy = self.policy.as_mut().ok_or(InferError::NoPolicy)?;
        let g = self.geometry;
        let o = vla_policy::Observation {
            cameras: g.cameras as usize,
            height: g.height as usize,
            width: g.width as usize,
            frames: &obs.frames,
            state: &obs.state,
            instruction_id: obs.instruction_id,
            seed: obs.seed,
        };
        let vote = self.votes.as_ref().map(|v| v.inference());
        match prefix {
            Some(p) => policy.infer_with_prefix(&o, p, actions),
            None => policy.infer(&o, actions),
        }
        .map_err(InferError::Policy)?;
        drop(vote);
        if !self.extra_latency.is_zero() {
            // Reproduces a slower NPU's operating point on the emulator (tests, benchmarks).
            std::thread::sleep(self.extra_latency);
        }
        if let Some(ota) = &self.ota {
            ota.trial.healthy();
        }
        Ok(())
    }

    fn reload_policy(&mut self) -> Result<String, ReloadError> {
        if let Some(store) = self.ota.as_ref().map(|o| o.store.clone()) {
            return self.reload_from_store(&store);
        }
        let target = std::fs::canonicalize(&self.configured).map_err(|source| {
            ReloadError::Target(LoadError::Resolve {
                path: self.configured.clone(),
                source,
            })
        })?;
        let previous = self.good.clone();
        // The NPU cannot hold two sets of contexts: free the old ones first.
        self.policy = None;
        match self.try_load(&target) {
            Ok(()) => Ok(format!("bundle {}", target.display())),
            Err(rejected) => {
                log::error!(
                    "new bundle rejected: {rejected}; reloading {}",
                    previous.display()
                );
                match self.try_load(&previous) {
                    Ok(()) => Err(ReloadError::Rejected {
                        rejected: Box::new(rejected),
                        recovery: Box::new(Recovery::RunningAgain(previous)),
                    }),
                    Err(again) => Err(ReloadError::PreviousFailed {
                        rejected: Box::new(rejected),
                        previous: Box::new(again),
                    }),
                }
            }
        }
    }
}

impl PolicyEngine {
    /// SIGHUP under OTA: load what `current` names now; a bundle that fails to load or
    /// to pass its gate is rolled back by the store (which reloads the previous one here).
    fn reload_from_store(&mut self, store: &Arc<Store>) -> Result<String, ReloadError> {
        let (hash, dir) = store
            .current()
            .map_err(ReloadError::Store)?
            .ok_or(ReloadError::NoCurrent)?;
        self.policy = None;
        match self.try_load(&dir) {
            Ok(()) => {
                if let Some(o) = &self.ota {
                    o.trial.running(hash.clone(), true);
                }
                self.record_gated(store);
                Ok(format!("bundle {hash}"))
            }
            Err(rejected) => {
                log::error!("bundle {hash} rejected: {rejected}");
                let rolled =
                    store.fail_trial(&rejected.to_string(), &mut |d: &Path| self.try_load(d));
                let running = store.current().ok().flatten();
                if let (Some(o), Some((h, _))) = (&self.ota, &running) {
                    o.trial.running(h.clone(), false);
                }
                if self.policy.is_none() {
                    // Not on trial (no rollback target) or the rollback failed: load what
                    // ran before, whatever the store says.
                    let good = self.good.clone();
                    if let Err(again) = self.try_load(&good) {
                        return Err(ReloadError::PreviousFailed {
                            rejected: Box::new(rejected),
                            previous: Box::new(again),
                        });
                    }
                }
                self.record_gated(store);
                let recovery = match rolled {
                    Ok(Some(r)) => Recovery::RolledBack(r),
                    Ok(None) => Recovery::RunningAgain(self.good.clone()),
                    Err(e) => Recovery::RollbackFailed(e),
                };
                Err(ReloadError::Rejected {
                    rejected: Box::new(rejected),
                    recovery: Box::new(recovery),
                })
            }
        }
    }
}

impl PolicyEngine {
    /// Names the bundle now running, and its gate's inference time, in the pid file.
    fn record_gated(&self, store: &Store) {
        if let (Some(o), Some(p)) = (&self.ota, &self.policy) {
            record_gated(
                store,
                &o.trial.running_hash(),
                p.timings().total + self.extra_latency,
            );
        }
    }
}

/// What `vlad ota verdict --wait` keys its wait on: the bundle this daemon gated and how
/// long an inference takes here now (see `vla_ota::Daemon`).
fn record_gated(store: &Store, hash: &str, inference: Duration) {
    if let Err(e) = store.record_daemon(Some((hash, inference))) {
        log::warn!("cannot record the gated bundle in the pid file: {e}");
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

pub fn print_report(r: &LoopReport, settings: &LoopSettings) {
    let period = settings.period;
    let secs = r.duration.as_secs_f64().max(1e-9);
    println!("control loop report ({:.1} s):", secs);
    println!(
        "  rate            {:.2} Hz published (target {:.2} Hz), {} ticks, {} missed",
        r.ticks as f64 / secs,
        1.0 / period.as_secs_f64(),
        r.ticks,
        r.missed_ticks
    );
    println!(
        "  publish jitter  p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
        ms(r.jitter.quantile_ns(0.5)),
        ms(r.jitter.quantile_ns(0.99)),
        ms(r.jitter.max_ns())
    );
    println!(
        "  inference       {} runs, {} failed, p50 {:.1} ms  p99 {:.1} ms  ({} stale observations skipped)",
        r.inferences,
        r.inference_failures,
        ms(r.inference.quantile_ns(0.5)),
        ms(r.inference.quantile_ns(0.99)),
        r.stale_observations
    );
    println!(
        "  freshness       observation->publish p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms ({} steps skipped on landing)",
        ms(r.freshness.quantile_ns(0.5)),
        ms(r.freshness.quantile_ns(0.99)),
        ms(r.freshness.max_ns()),
        r.skipped_steps
    );
    println!(
        "  published       {} ok, {} hold, {} fault",
        r.published_ok, r.published_hold, r.published_fault
    );
    println!(
        "  latency         capture->chunk ready over the last {} inferences p5 {:.1} p25 {:.1} p50 {:.1} p75 {:.1} p95 {:.1} ms; robot observations every {:.1} ms; {} chunks refused for NaN/Inf",
        vla_control::LATENCY_WINDOW,
        ms(r.measured.latency_spread_ns[0]),
        ms(r.measured.latency_spread_ns[2]),
        ms(r.measured.p50_ns()),
        ms(r.measured.latency_spread_ns[7]),
        ms(r.measured.latency_p95_ns),
        ms(r.measured.observation_period_ns),
        r.non_finite_chunks
    );
    // What the measured latency and observation period predict, next to what was
    // published: an operator checks the estimate they tune by against the run.
    if let Some(p) = vla_control::operating_point(settings, &r.measured) {
        println!("  {}", p.describe());
    }
}

fn status_line(h: &Health, s: &LoopSettings, last: &mut (Instant, u64)) -> String {
    let ticks = Health::get(&h.ticks);
    let dt = last.0.elapsed().as_secs_f64().max(1e-9);
    let rate = (ticks - last.1) as f64 / dt;
    *last = (Instant::now(), ticks);
    let point = vla_control::operating_point(s, &vla_control::measured(h)).map_or_else(
        || "operating point: no latency yet".to_owned(),
        |p| p.describe(),
    );
    format!(
        "rate {rate:.1} Hz, inference {:.0} ms, freshness {:.0} ms, ok {}, hold {}, fault {}, missed {}; {point}",
        ms(Health::get(&h.last_inference_ns)),
        ms(Health::get(&h.last_freshness_ns)),
        Health::get(&h.published_ok),
        Health::get(&h.published_hold),
        Health::get(&h.published_fault),
        Health::get(&h.missed_ticks)
    )
}

/// The config's merge mode as the loop's.
pub(crate) fn merge_mode(c: &vla_config::ControlConfig) -> vla_control::MergeMode {
    match c.merge {
        vla_config::Merge::Skip => vla_control::MergeMode::Skip,
        vla_config::Merge::Crossfade => vla_control::MergeMode::Crossfade,
        vla_config::Merge::Prefix => vla_control::MergeMode::Prefix,
        vla_config::Merge::Inpaint => vla_control::MergeMode::Inpaint,
    }
}

/// The config's trigger as the loop's.
pub(crate) fn trigger(c: &vla_config::ControlConfig) -> vla_control::Trigger {
    match c.trigger {
        vla_config::TriggerMode::BackToBack => vla_control::Trigger::BackToBack,
        vla_config::TriggerMode::Remaining => vla_control::Trigger::Remaining {
            margin_steps: c.trigger_margin_steps,
        },
        vla_config::TriggerMode::Synchronous => vla_control::Trigger::Synchronous {
            execute_steps: c.execute_steps.unwrap_or(0),
        },
    }
}

/// The loop's settings from the config, for rings of `geometry`: the one conversion
/// (the daemon's loop and `vlad plan` both take theirs from here).
pub(crate) fn loop_settings(
    config: &vla_config::Config,
    geometry: vla_ring::Geometry,
    initial_latency: Option<Duration>,
) -> LoopSettings {
    let (c, rt) = (&config.control, &config.realtime);
    LoopSettings {
        action_slots: config.rings.action_slots,
        period: c.publish_period(),
        max_observation_age: c.max_observation_age(),
        max_chunk_age: c.max_chunk_age(),
        hold_after_chunk_end: c.hold_after_chunk_end(),
        action_valid: c.action_valid(),
        writer_heartbeat_timeout: c.writer_heartbeat_timeout(),
        publisher_priority: rt.publisher_priority,
        publisher_cpus: rt
            .publisher_cpu
            .map(|cpu| vec![cpu as usize])
            .unwrap_or_default(),
        inference_priority: rt.inference_priority,
        inference_cpus: rt.inference_cpus.iter().map(|&cpu| cpu as usize).collect(),
        merge: merge_mode(c),
        trigger: trigger(c),
        chunk_period: c.chunk_period(),
        initial_latency,
        ..LoopSettings::new(
            geometry,
            PathBuf::from(config.rings.observation_path.as_str()),
            PathBuf::from(config.rings.action_path.as_str()),
        )
    }
}

/// Logs the operating point at READY: a warning when chunks would arrive spent.
fn announce(settings: &LoopSettings) {
    let Some(l) = settings.initial_latency else {
        log::info!("operating point: no latency measured yet");
        return;
    };
    let Some(p) =
        vla_control::operating_point(settings, &Measured::from_latency(l.as_nanos() as u64))
    else {
        return;
    };
    if p.warrants_warning() {
        log::warn!("{}", p.describe());
    } else {
        log::info!("{}", p.describe());
    }
}

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let mut common = Common::default();
    let (mut config_path, mut bundle_override, mut duration): (
        Option<PathBuf>,
        Option<PathBuf>,
        Option<f64>,
    ) = (None, None, None);
    let mut p = cli::parser(args);
    while let Some(arg) = p.next().map_err(cli::usage)? {
        match arg {
            Long(name) if Common::OPTIONS.contains(&name) => {
                let name = name.to_owned();
                common.take(&name, &mut p)?;
            }
            Long("config") => config_path = Some(cli::value(&mut p)?.into()),
            Long("bundle") => bundle_override = Some(cli::value(&mut p)?.into()),
            Long("duration") => duration = Some(cli::number(&mut p, "--duration")?),
            Short('h') | Long("help") => {
                println!("{HELP}");
                return Ok(());
            }
            other => return Err(cli::unexpected(other)),
        }
    }
    let config_path =
        config_path.ok_or_else(|| Failure::Usage("run needs --config FILE".into()))?;
    let mut config = vla_config::Config::load(&config_path)?;
    config.apply_overrides(crate::qnn_setup::environment)?;
    if common.log_level.is_none() {
        common.log_level = Some(format!(
            "{},qnn={}",
            config.log.level.as_str(),
            config.qnn.log_level.as_str()
        ));
    }
    common.init_logging();
    if common.lib_dir.is_none() {
        common.lib_dir = Some(PathBuf::from(config.qnn.lib_dir.as_str()));
    }
    let notifier = if config.systemd.notify {
        Notifier::from_env()
    } else {
        None
    };
    let notify = |m: &str| {
        if let Some(n) = &notifier {
            // Dropped or failed messages are logged by `send`; the next one follows.
            let _ = n.send(m);
        }
    };

    let term = Arc::new(AtomicBool::new(false));
    let hup = Arc::new(AtomicBool::new(false));
    for (sig, flag) in [
        (signal_hook::consts::SIGTERM, &term),
        (signal_hook::consts::SIGINT, &term),
        (signal_hook::consts::SIGHUP, &hup),
    ] {
        signal_hook::flag::register(sig, flag.clone())
            .map_err(|e| Failure::Error(format!("signal handler: {e}")))?;
    }

    let rt = &config.realtime;
    // Before anything large is allocated: reloads then give their buffers back.
    vla_control::fix_large_allocations();
    if rt.mlockall {
        vla_control::lock_memory_on_fault();
    }
    let overridden = bundle_override.is_some();
    let bundle_dir = bundle_override.unwrap_or_else(|| PathBuf::from(config.bundle.path.as_str()));
    notify("STATUS=loading contexts");
    let opts = vla_qnn::LoadOptions {
        backend_lib: config.qnn.backend_lib.as_str().to_owned(),
        system_lib: config.qnn.system_lib.as_str().to_owned(),
        ..vla_qnn::LoadOptions::htp(crate::qnn_setup::lib_dir(&common)?)
    };
    let lib = Arc::new(vla_qnn::QnnLibrary::load(&opts)?);
    let backend = Backend::new(lib)?;
    let votes = crate::qnn_setup::start_votes(
        &backend,
        crate::qnn_setup::configured_mode(config.qnn.performance),
        config.qnn.performance_idle_release(),
    );
    // Under OTA (`bundle.path` is the store's `current` link) the store recovers first:
    // leftovers of an interrupted update, and a crash loop on a bundle on trial.
    let ota_root = PathBuf::from(config.ota.root.as_str());
    let store = (!overridden && bundle_dir == ota_root.join("current"))
        .then(|| Arc::new(Store::new(crate::ota_cmd::ota_settings(&config.ota))));
    // The inference thread waits on the policy's helper (the non-finite scans): it runs
    // pinned and prioritised as the inference thread, or it could be starved by anything
    // of normal priority while a SCHED_FIFO thread waits on it (priority inversion).
    let load_options = {
        let (cpus, priority): (Vec<usize>, u8) = (
            rt.inference_cpus.iter().map(|&c| c as usize).collect(),
            rt.inference_priority,
        );
        vla_policy::LoadOptions {
            helper_setup: Some(Arc::new(move |name: &str| {
                vla_control::pin_current_thread(name, &cpus);
                vla_control::set_fifo_priority(name, priority);
                vla_control::prefault_stack();
            })),
        }
    };
    let t = Instant::now();
    let (resolved, (bundle, policy, gate_cosine), ota) = match &store {
        None => {
            let resolved = std::fs::canonicalize(&bundle_dir)
                .map_err(|e| Failure::Error(format!("bundle {}: {e}", bundle_dir.display())))?;
            let loaded = load_gated(&backend, &resolved, &load_options)?;
            (resolved, loaded, None)
        }
        Some(store) => {
            let start = store.on_start()?;
            if let Some(r) = &start.rolled_back {
                log::warn!("OTA: rolled back before loading: {r:?}");
            }
            let (hash, dir) = start.current.clone().ok_or_else(|| {
                Failure::Error(format!("no bundle is installed in {}", ota_root.display()))
            })?;
            if let Err(e) = store.record_daemon(None) {
                log::warn!(
                    "cannot write {}: {e}; `vlad ota activate` cannot signal this daemon",
                    ota_root.join(vla_ota::PID_FILE).display()
                );
            }
            match load_gated(&backend, &dir, &load_options) {
                Ok(loaded) => (
                    dir,
                    loaded,
                    Some(OtaLink::start(store, hash, start.trial_start.is_some())?),
                ),
                Err(why) if start.trial_start.is_some() => {
                    log::error!("bundle {hash} on trial failed at start: {why}");
                    let mut loaded: Option<(PathBuf, (Bundle, Policy, f64))> = None;
                    store
                        .fail_trial(&why.to_string(), &mut |d: &Path| {
                            loaded = Some((d.to_owned(), load_gated(&backend, d, &load_options)?));
                            Ok::<(), LoadError>(())
                        })
                        .map_err(|e| Failure::Error(format!("{why}; rollback: {e}")))?;
                    let (dir, loaded) = loaded.ok_or_else(|| {
                        Failure::Error(format!("{why}; no previous bundle to roll back to"))
                    })?;
                    let hash = store
                        .current()
                        .ok()
                        .flatten()
                        .map(|c| c.0)
                        .unwrap_or_default();
                    (dir, loaded, Some(OtaLink::start(store, hash, false)?))
                }
                Err(why) => return Err(why.into()),
            }
        }
    };
    log::info!(
        "contexts resident and gated in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let geometry = ring_geometry(&policy.geometry());
    let c = &config.control;
    // The gate's end-to-end inference ran after every context had run its own golden, so
    // it is warm: the first latency estimate, before the loop has measured any.
    let gate_latency = policy.timings().total + c.extra_latency();
    if let (Some(store), Some(o)) = (&store, &ota) {
        record_gated(store, &o.trial.running_hash(), gate_latency);
    }

    let settings = loop_settings(&config, geometry, Some(gate_latency));
    let engine = PolicyEngine {
        backend,
        ota,
        configured: bundle_dir.clone(),
        good: resolved,
        policy: Some(policy),
        bundle: Some(bundle),
        geometry,
        votes,
        extra_latency: c.extra_latency(),
        load_options,
        prefix_method: match c.merge {
            vla_config::Merge::Inpaint => vla_policy::PrefixMethod::Inpaint,
            _ => vla_policy::PrefixMethod::VelocityMask,
        },
    };
    let period = settings.period;
    // --- observability (issue 19): flight recorder and metrics textfile, when configured.
    let manifest = engine
        .bundle
        .as_ref()
        .map(|b| (b.manifest.name.clone(), b.manifest.version.clone()))
        .unwrap_or_default();
    let ota_state = match &engine.ota {
        None => "none",
        Some(o) if o.trial.on_trial() => "trial",
        Some(_) => "committed",
    };
    let facts = crate::observe::BundleFacts {
        name: manifest.0,
        version: manifest.1,
        hash: match &engine.ota {
            Some(o) => o.trial.running_hash(),
            None => crate::observe::manifest_hash(&engine.good),
        },
        path: engine.good.clone(),
        parity_cosine: gate_cosine,
        ota_state,
    };
    let mut observability =
        crate::observe::start(&config, &settings, engine.component_names(), &facts)
            .map_err(Failure::Error)?;
    let usr1 = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, usr1.clone())
        .map_err(|e| Failure::Error(format!("signal handler: {e}")))?;
    let tap = observability.as_ref().map(|o| o.observer.tap());
    // --- end observability
    let lp = ControlLoop::start_with_tap(settings.clone(), Box::new(engine), tap)?;
    log::info!(
        "running: publishing at {:.1} Hz to {} (merge {}, trigger {:?}, chunk step {:.1} ms{})",
        1.0 / period.as_secs_f64(),
        config.rings.action_path.as_str(),
        settings.merge.as_str(),
        settings.trigger,
        settings.chunk_period.as_secs_f64() * 1e3,
        if c.extra_latency_ms > 0 {
            format!(
                ", {} ms extra latency injected: tests and benchmarks only",
                c.extra_latency_ms
            )
        } else {
            String::new()
        } + if c.emulator_age_limits {
            ", age limits past a minute allowed: HTP emulator only"
        } else {
            ""
        }
    );
    announce(&settings);
    let ready_point = vla_control::operating_point(
        &settings,
        &Measured::from_latency(gate_latency.as_nanos() as u64),
    )
    .map_or_else(String::new, |p| p.describe());
    notify(&format!("READY=1\nSTATUS=running; {ready_point}"));

    let watchdog = if config.systemd.watchdog {
        watchdog_interval()
    } else {
        None
    };
    let started = Instant::now();
    let (mut last_watchdog, mut last_status) = (Instant::now(), Instant::now());
    let mut rate_base = (Instant::now(), 0u64);
    let period_ns = period.as_nanos() as u64;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if term.load(Ordering::Relaxed)
            || duration.is_some_and(|d| started.elapsed().as_secs_f64() >= d)
        {
            break;
        }
        if usr1.swap(false, Ordering::Relaxed) {
            match &observability {
                Some(o) if config.recorder.is_some() => o.observer.request_recording(),
                _ => log::warn!("SIGUSR1: no flight recorder configured (config `recorder`)"),
            }
        }
        if let Some(o) = observability.as_mut() {
            o.tick(lp.health(), false);
        }
        if hup.swap(false, Ordering::Relaxed) {
            log::info!("SIGHUP: reloading bundle {}", bundle_dir.display());
            notify("STATUS=reloading bundle");
            lp.request_reload();
        }
        let h = lp.health();
        if let Some(every) = watchdog {
            let now = vla_ring::monotonic_ns();
            let ticking =
                now.saturating_sub(Health::get(&h.last_tick_ns)) < 5 * period_ns + 200_000_000;
            // An inference may take seconds on a slow backend; a wedged one for 30 s is not health.
            let inferring = now.saturating_sub(Health::get(&h.inference_alive_ns)) < 30_000_000_000;
            if ticking && inferring && !lp.is_broken() && last_watchdog.elapsed() >= every {
                notify("WATCHDOG=1");
                last_watchdog = Instant::now();
            }
        }
        if last_status.elapsed() >= Duration::from_secs(1) {
            let line = status_line(h, &settings, &mut rate_base);
            notify(&format!("STATUS={line}"));
            log::debug!("{line}");
            last_status = Instant::now();
        }
        if lp.is_broken() {
            log::error!("a control loop thread ended unexpectedly; stopping");
            break;
        }
    }
    notify("STOPPING=1");
    if let Some(o) = observability.as_mut() {
        o.tick(lp.health(), true);
    }
    let report = lp.stop();
    if let Some(o) = observability.take() {
        o.observer.stop();
    }
    if store.is_some() {
        let _ = std::fs::remove_file(ota_root.join("vlad.pid"));
    }
    print_report(&report, &settings);
    Ok(())
}
