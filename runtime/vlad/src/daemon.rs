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

mod engine;
mod npu;
mod text;

pub use npu::NpuStatus;

use crate::cli::Common;
use crate::cmd::run::RunArgs;
use crate::gate::{load_gated, LoadError, Loaded};
use crate::notify::{watchdog_interval, Notifier};
use crate::Failure;
use engine::{record_gated, OtaLink, PolicyEngine};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vla_control::{ControlLoop, Engine, Health, LoopReport, LoopSettings, Measured};
use vla_ota::Store;
use vla_qnn::Backend;

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

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

pub fn print_report(r: &LoopReport, settings: &LoopSettings) {
    let period = settings.limits.period();
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

/// Where the publish rate `STATUS=` reports is measured from: the last status's time and
/// tick count.
struct RateBase {
    at: Instant,
    ticks: u64,
}

fn status_line(h: &Health, s: &LoopSettings, last: &mut RateBase) -> String {
    let ticks = Health::get(&h.ticks);
    let dt = last.at.elapsed().as_secs_f64().max(1e-9);
    let rate = (ticks - last.ticks) as f64 / dt;
    *last = RateBase {
        at: Instant::now(),
        ticks,
    };
    let point = vla_control::operating_point(s, &vla_control::measured(h)).map_or_else(
        || "operating point: no latency yet".to_owned(),
        |p| p.describe(),
    );
    format!(
        "rate {rate:.1} Hz, inference {:.0} ms, freshness {:.0} ms, ok {}, hold {}, fault {}, missed {}; texts rendered {}, refused {}; {point}",
        ms(Health::get(&h.last_inference_ns)),
        ms(Health::get(&h.last_freshness_ns)),
        Health::get(&h.published_ok),
        Health::get(&h.published_hold),
        Health::get(&h.published_fault),
        Health::get(&h.missed_ticks),
        Health::get(&h.instruction_texts_rendered),
        Health::get(&h.instruction_texts_refused)
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
    let ns = |d: Duration| d.as_nanos() as u64;
    LoopSettings {
        action_slots: config.rings.action_slots,
        limits: vla_control::Limits {
            period_ns: ns(c.publish_period()),
            chunk_period_ns: ns(c.chunk_period()),
            horizon: u64::from(geometry.chunk_len),
            merge: merge_mode(c),
            trigger: trigger(c),
            max_chunk_age_ns: ns(c.max_chunk_age()),
            max_observation_age_ns: ns(c.max_observation_age()),
            action_valid_ns: ns(c.action_valid()),
            hold_after_chunk_end_ns: ns(c.hold_after_chunk_end()),
        },
        writer_heartbeat_timeout: c.writer_heartbeat_timeout(),
        publisher_priority: rt.publisher_priority,
        publisher_cpus: rt
            .publisher_cpu
            .map(|cpu| vec![cpu as usize])
            .unwrap_or_default(),
        inference_priority: rt.inference_priority,
        inference_cpus: rt.inference_cpus.iter().map(|&cpu| cpu as usize).collect(),
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

/// systemd's notification socket, when the config asks for it and systemd gave one.
struct Systemd(Option<Notifier>);

impl Systemd {
    fn new(config: &vla_config::Config) -> Self {
        Self(config.systemd.notify.then(Notifier::from_env).flatten())
    }

    fn notify(&self, m: &str) {
        if let Some(n) = &self.0 {
            // Dropped or failed messages are logged by `send`; the next one follows.
            let _ = n.send(m);
        }
    }
}

/// A flag set by the handler of `sig`.
fn signal_flag(sig: i32) -> Result<Arc<AtomicBool>, Failure> {
    let flag = Arc::new(AtomicBool::new(false));
    register_flag(sig, &flag)?;
    Ok(flag)
}

fn register_flag(sig: i32, flag: &Arc<AtomicBool>) -> Result<(), Failure> {
    signal_hook::flag::register(sig, flag.clone())
        .map(drop)
        .map_err(|e| Failure::Error(format!("signal handler: {e}")))
}

/// The signals the daemon acts on: SIGTERM and SIGINT stop, SIGHUP reloads.
struct Signals {
    term: Arc<AtomicBool>,
    hup: Arc<AtomicBool>,
}

impl Signals {
    fn register() -> Result<Self, Failure> {
        let term = signal_flag(signal_hook::consts::SIGTERM)?;
        register_flag(signal_hook::consts::SIGINT, &term)?;
        let hup = signal_flag(signal_hook::consts::SIGHUP)?;
        Ok(Self { term, hup })
    }
}

/// Where the bundle comes from: the configured path (or `--bundle`), and the OTA store
/// when that path is the store's `current` link.
struct Source {
    bundle_dir: PathBuf,
    ota_root: PathBuf,
    store: Option<Arc<Store>>,
    /// The store over `ota.root` whose instruction packs of the loaded bundle are
    /// attached (OTA in use or not: a pack is verified with the configured keys).
    packs: Arc<Store>,
}

impl Source {
    fn new(
        config: &vla_config::Config,
        bundle_override: Option<PathBuf>,
    ) -> Result<Self, vla_ota::OtaError> {
        let overridden = bundle_override.is_some();
        let bundle_dir =
            bundle_override.unwrap_or_else(|| PathBuf::from(config.bundle.path.as_str()));
        // Under OTA (`bundle.path` is the store's `current` link) the store recovers first:
        // leftovers of an interrupted update, and a crash loop on a bundle on trial.
        let ota_root = PathBuf::from(config.ota.root.as_str());
        // The configured keys are checked at every start, with OTA in use or not.
        let settings = crate::cmd::ota::ota_settings(&config.ota)?;
        let packs = Arc::new(Store::new(settings));
        let store = (!overridden && bundle_dir == ota_root.join("current")).then(|| packs.clone());
        Ok(Self {
            bundle_dir,
            ota_root,
            store,
            packs,
        })
    }
}

/// A bundle loaded and gated at start.
struct Started {
    /// Its directory (resolved; under OTA, the store's).
    dir: PathBuf,
    /// The bundle, its policy and what its gate measured.
    loaded: Loaded,
    /// The OTA store's link to it, when it came from the store.
    ota: Option<OtaLink>,
}

/// The policy's helper threads set up as the inference thread is; under OTA, every load
/// verified with `store`'s keys.
fn load_options(
    rt: &vla_config::RealtimeConfig,
    npu: crate::npu_io::NpuPlan,
    packs: Arc<Store>,
    store: Option<Arc<Store>>,
) -> crate::gate::LoadSettings {
    // The inference thread waits on the policy's helper (the non-finite scans): it runs
    // pinned and prioritised as the inference thread, or it could be starved by anything
    // of normal priority while a SCHED_FIFO thread waits on it (priority inversion).
    let (cpus, priority): (Vec<usize>, u8) = (
        rt.inference_cpus.iter().map(|&c| c as usize).collect(),
        rt.inference_priority,
    );
    crate::gate::LoadSettings {
        policy: vla_policy::LoadOptions {
            helper_setup: Some(Arc::new(move |name: &str| {
                vla_control::pin_current_thread(name, &cpus);
                vla_control::set_fifo_priority(name, priority);
                vla_control::prefault_stack();
            })),
        },
        npu,
        packs: Some(packs),
        store,
    }
}

/// The initial load and gate: the configured bundle, or under OTA the store's current one
/// (a bundle on trial that fails here is rolled back and the previous one loaded).
fn load_initial(
    source: &Source,
    backend: &Backend,
    options: &crate::gate::LoadSettings,
) -> Result<Started, Failure> {
    let Some(store) = &source.store else {
        let dir = &source.bundle_dir;
        let resolved = std::fs::canonicalize(dir)
            .map_err(|e| Failure::Error(format!("bundle {}: {e}", dir.display())))?;
        let loaded = load_gated(backend, &resolved, options)?;
        return Ok(Started {
            dir: resolved,
            loaded,
            ota: None,
        });
    };
    let start = store.on_start()?;
    if let Some(r) = &start.rolled_back {
        log::warn!("OTA: rolled back before loading: {r:?}");
    }
    let (hash, dir) = start.current.clone().ok_or_else(|| {
        Failure::Error(format!(
            "no bundle is installed in {}",
            source.ota_root.display()
        ))
    })?;
    if let Err(e) = store.record_daemon(None) {
        log::warn!(
            "cannot write {}: {e}; `vlad ota activate` cannot signal this daemon",
            source.ota_root.join(vla_ota::PID_FILE).display()
        );
    }
    let on_trial = start.trial_start.is_some();
    match load_gated(backend, &dir, options) {
        Ok(loaded) => Ok(Started {
            dir,
            loaded,
            ota: Some(OtaLink::start(store, hash, on_trial)?),
        }),
        Err(why) if on_trial => {
            log::error!("bundle {hash} on trial failed at start: {why}");
            roll_back_at_start(store, why, backend, options)
        }
        Err(why) => Err(why.into()),
    }
}

/// A bundle on trial failed its load or gate at start: the store rolls back to the
/// previous bundle, loaded and gated here.
fn roll_back_at_start(
    store: &Arc<Store>,
    why: LoadError,
    backend: &Backend,
    options: &crate::gate::LoadSettings,
) -> Result<Started, Failure> {
    let mut started: Option<Started> = None;
    store
        .fail_trial(&why.to_string(), &mut |d: &Path| {
            started = Some(Started {
                dir: d.to_owned(),
                loaded: load_gated(backend, d, options)?,
                ota: None,
            });
            Ok::<(), LoadError>(())
        })
        .map_err(|e| Failure::Error(format!("{why}; rollback: {e}")))?;
    let mut started = started
        .ok_or_else(|| Failure::Error(format!("{why}; no previous bundle to roll back to")))?;
    let hash = store
        .current()
        .ok()
        .flatten()
        .map(|c| c.0)
        .unwrap_or_default();
    started.ota = Some(OtaLink::start(store, hash, false)?);
    Ok(started)
}

/// QNN, the performance votes and the first bundle resident and gated: the engine the
/// loop runs (holding its gate's cosine) and the gate's latency (the loop's first latency
/// estimate).
fn start_engine(
    config: &vla_config::Config,
    common: &Common,
    source: &Source,
    npu: crate::npu_io::NpuPlan,
) -> Result<(PolicyEngine, Duration), Failure> {
    let opts = vla_qnn::LoadOptions {
        backend_lib: config.qnn.backend_lib.as_str().to_owned(),
        system_lib: config.qnn.system_lib.as_str().to_owned(),
        ..vla_qnn::LoadOptions::htp(crate::qnn_setup::lib_dir(common)?)
    };
    let lib = Arc::new(vla_qnn::QnnLibrary::load(&opts)?);
    let backend = Backend::new(lib.clone())?;
    // The NSPs the memory plan may use: the devices the backend reports.
    let nsps = match backend.platform_info() {
        Ok(Some(info)) if !info.devices.is_empty() => {
            log::info!("HTP {}", info.describe());
            info.devices.len() as u32
        }
        Ok(_) => 1,
        Err(e) => {
            log::warn!("HTP platform info unavailable ({e}); planning on one NSP");
            1
        }
    };
    crate::dsp_plan::configure(config.npu.clone(), nsps);
    // Votes for every NSP a plan under this configuration can place contexts on, so
    // that a bundle loaded later (an update) is covered without voting again.
    let vote = npu::VoteSettings {
        devices: crate::dsp_plan::placeable_nsps(&config.npu, nsps),
        mode: crate::qnn_setup::configured_mode(config.qnn.performance),
        idle: config.qnn.performance_idle_release(),
    };
    let votes = crate::qnn_setup::start_votes(&backend, &vote.devices, vote.mode, vote.idle);
    let load_options = load_options(
        &config.realtime,
        npu,
        source.packs.clone(),
        source.store.clone(),
    );
    let t = Instant::now();
    let Started {
        dir: good,
        loaded,
        ota,
    } = load_initial(source, &backend, &load_options)?;
    log::info!(
        "contexts resident and gated in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let c = &config.control;
    // The gate's end-to-end inference ran after every context had run its own golden, so
    // it is warm: the first latency estimate, before the loop has measured any.
    let gate_latency = loaded.policy.timings().total + c.extra_latency();
    if let (Some(store), Some(o)) = (&source.store, &ota) {
        record_gated(store, &o.trial.running_hash(), gate_latency);
    }
    let engine = PolicyEngine {
        backend: Some(backend),
        ota,
        configured: source.bundle_dir.clone(),
        good,
        geometry: ring_geometry(&loaded.policy.geometry()),
        policy: Some(loaded.policy),
        bundle: Some(loaded.bundle),
        votes,
        extra_latency: c.extra_latency(),
        load_options,
        running: crate::observe::RunningBundle::default(),
        gate_cosine: loaded.gated.cosine,
        npu: npu::Npu::new(lib, Some(vote), loaded.gated.actions),
        text: None,
        prefix_method: match c.merge {
            vla_config::Merge::Inpaint => vla_policy::PrefixMethod::Inpaint,
            _ => vla_policy::PrefixMethod::VelocityMask,
        },
    };
    Ok((engine, gate_latency))
}

/// Observability: the flight recorder and the metrics textfile, when configured.
fn start_observability(
    config: &vla_config::Config,
    settings: &LoopSettings,
    engine: &PolicyEngine,
) -> Result<Option<crate::observe::Observability>, Failure> {
    let facts = engine.facts(engine.gate_cosine);
    crate::observe::start(
        config,
        settings,
        engine.component_names(),
        &facts,
        engine.running.clone(),
        engine.ota.as_ref().map(|o| o.trial.view()),
        engine.npu.status.clone(),
    )
    .map_err(Failure::Error)
}

/// Logs that the loop runs, and with what, and tells systemd READY with the operating point.
fn announce_running(
    config: &vla_config::Config,
    settings: &LoopSettings,
    gate_latency: Duration,
    systemd: &Systemd,
    npu_io: &str,
) {
    let c = &config.control;
    log::info!(
        "running: publishing at {:.1} Hz to {} (merge {}, trigger {:?}, chunk step {:.1} ms{})",
        1.0 / settings.limits.period().as_secs_f64(),
        config.rings.action_path.as_str(),
        settings.limits.merge.as_str(),
        settings.limits.trigger,
        settings.limits.chunk_period().as_secs_f64() * 1e3,
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
    announce(settings);
    let ready_point = vla_control::operating_point(
        settings,
        &Measured::from_latency(gate_latency.as_nanos() as u64),
    )
    .map_or_else(String::new, |p| p.describe());
    let dsp =
        crate::dsp_plan::running().map_or_else(String::new, |p| format!("; dsp {}", p.summary()));
    systemd.notify(&format!(
        "READY=1\nSTATUS=running; {ready_point}; {npu_io}{dsp}"
    ));
}

/// The main thread while the loop runs: signals, the recorder's trigger, the metrics
/// textfile, the watchdog and STATUS, until a stop, the end of `--duration`, or a loop
/// thread that ended.
struct Supervisor<'a> {
    lp: &'a ControlLoop,
    settings: &'a LoopSettings,
    systemd: &'a Systemd,
    observability: &'a mut Option<crate::observe::Observability>,
    recorder_configured: bool,
    bundle_dir: &'a Path,
    watchdog: Option<Duration>,
    last_watchdog: Instant,
    /// `systemd.inference_deadline_ms`: an inference thread away longer is stuck.
    inference_deadline: Duration,
    /// Said once per stall: the watchdog is withheld.
    stalled: bool,
    npu: NpuStatus,
    last_status: Instant,
    rate_base: RateBase,
    /// How the NPU's I/O is handed over (STATUS carries its line).
    npu_io: crate::npu_io::NpuStatus,
}

/// How many `systemd.inference_deadline_ms` a repair on the inference thread (a reload,
/// an NPU session re-creation) may take before the supervisor takes it for a blocked call.
const REPAIR_DEADLINES: u32 = 4;

/// How long the inference thread has been away, against which deadline.
struct Away {
    /// Nanoseconds since its last pass, or since the repair in progress began.
    ns: u64,
    /// The deadline that applies.
    deadline: Duration,
    /// What it has not done meanwhile (for the log line).
    what: &'static str,
}

/// How long the inference thread has been away at `now`: a repair in progress
/// (`repairing_since` not 0: a reload or an NPU session re-creation, loads and gates) is
/// bounded by [`REPAIR_DEADLINES`] deadlines from its start, anything else by the deadline
/// from the thread's last pass.
fn inference_away(now: u64, alive: u64, repairing_since: u64, deadline: Duration) -> Away {
    match repairing_since {
        0 => Away {
            ns: now.saturating_sub(alive),
            deadline,
            what: "come back",
        },
        since => Away {
            ns: now.saturating_sub(since),
            deadline: deadline * REPAIR_DEADLINES,
            what: "finished its reload or NPU session re-creation",
        },
    }
}

impl Supervisor<'_> {
    fn run(&mut self, signals: &Signals, usr1: &AtomicBool, duration: Option<f64>) {
        let started = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(20));
            if signals.term.load(Ordering::Relaxed)
                || duration.is_some_and(|d| started.elapsed().as_secs_f64() >= d)
            {
                break;
            }
            if usr1.swap(false, Ordering::Relaxed) {
                self.request_recording();
            }
            if let Some(o) = self.observability.as_mut() {
                o.tick(self.lp.health(), false);
            }
            if signals.hup.swap(false, Ordering::Relaxed) {
                log::info!("SIGHUP: reloading bundle {}", self.bundle_dir.display());
                self.systemd.notify("STATUS=reloading bundle");
                self.lp.request_reload();
            }
            self.feed_watchdog();
            self.post_status();
            if self.lp.is_broken() {
                log::error!("a control loop thread ended unexpectedly; stopping");
                break;
            }
        }
    }

    fn request_recording(&self) {
        match self.observability.as_ref() {
            Some(o) if self.recorder_configured => o.observer.request_recording(),
            _ => log::warn!("SIGUSR1: no flight recorder configured (config `recorder`)"),
        }
    }

    /// WATCHDOG=1 while the publisher ticks and the inference thread is alive.
    fn feed_watchdog(&mut self) {
        let Some(every) = self.watchdog else { return };
        let h = self.lp.health();
        let period_ns = self.settings.limits.period_ns;
        let now = vla_ring::monotonic_ns();
        let ticking =
            now.saturating_sub(Health::get(&h.last_tick_ns)) < 5 * period_ns + 200_000_000;
        // An inference may take seconds on a slow backend; one past the deadline is a
        // blocked QNN call. Its thread cannot be abandoned (QNN may still write into its
        // buffers, and its session is the process's): systemd restarts vlad instead.
        let Away {
            ns: away,
            deadline,
            what,
        } = inference_away(
            now,
            Health::get(&h.inference_alive_ns),
            Health::get(&h.repairing_since_ns),
            self.inference_deadline,
        );
        let inferring = away < deadline.as_nanos() as u64;
        if !inferring && !self.stalled {
            log::error!(
                "the inference thread has not {what} for {:.1} s (deadline {:.1} s; a QNN call blocks): withholding WATCHDOG=1 so that systemd restarts vlad; the arm holds meanwhile",
                away as f64 / 1e9,
                deadline.as_secs_f64()
            );
        }
        self.stalled = !inferring;
        if ticking && inferring && !self.lp.is_broken() && self.last_watchdog.elapsed() >= every {
            self.systemd.notify("WATCHDOG=1");
            self.last_watchdog = Instant::now();
        }
    }

    /// STATUS= once a second.
    fn post_status(&mut self) {
        if self.last_status.elapsed() < Duration::from_secs(1) {
            return;
        }
        let mut line = format!(
            "{}; {}; {}",
            status_line(self.lp.health(), self.settings, &mut self.rate_base),
            self.npu.status(),
            self.npu_io.get().1
        );
        if let Some(plan) = crate::dsp_plan::running() {
            line.push_str("; dsp ");
            line.push_str(&plan.summary());
        }
        if let Some(stale) = crate::observe::staleness() {
            line = format!("{stale}; {line}");
        }
        self.systemd.notify(&format!("STATUS={line}"));
        log::debug!("{line}");
        self.last_status = Instant::now();
    }
}

/// Runs the daemon until SIGTERM (or for `--duration`).
pub fn run(mut args: RunArgs) -> Result<(), Failure> {
    let config = args.load_config()?;
    let systemd = Systemd::new(&config);
    let signals = Signals::register()?;
    // Before anything large is allocated: reloads then give their buffers back.
    vla_control::fix_large_allocations();
    if config.realtime.mlockall {
        vla_control::lock_memory_on_fault();
    }
    let source = Source::new(&config, args.bundle.take())?;
    // Before any context is loaded: `on` without rpcmem is refused at once.
    let npu = crate::npu_io::resolve(config.npu.shared_buffers, vla_qnn::RpcMem::load_default)
        .map_err(Failure::Error)?;
    log::info!("{}", npu.describe());
    systemd.notify("STATUS=loading contexts");
    let (mut engine, gate_latency) = start_engine(&config, &args.common, &source, npu)?;
    let settings = loop_settings(&config, engine.geometry, Some(gate_latency));
    let npu_io = engine.load_options.npu.status();
    let text_thread = match (&config.rings.instruction_path, &engine.policy) {
        (Some(path), Some(policy)) => {
            let (link, thread) = text::link(PathBuf::from(path.as_str()), engine.geometry, policy);
            engine.text = Some(link);
            Some(thread)
        }
        _ => None,
    };
    let mut observability = start_observability(&config, &settings, &engine)?;
    let npu = engine.npu.status.clone();
    let usr1 = signal_flag(signal_hook::consts::SIGUSR1)?;
    let tap = observability.as_ref().map(|o| o.observer.tap());
    let lp = ControlLoop::start_with_tap(settings.clone(), Box::new(engine), tap)?;
    let text_stop = Arc::new(AtomicBool::new(false));
    let text_thread = match text_thread {
        Some(t) => Some(
            t.start(lp.shared_health(), text_stop.clone())
                .map_err(|e| Failure::Error(format!("cannot start the text thread: {e}")))?,
        ),
        None => None,
    };
    announce_running(&config, &settings, gate_latency, &systemd, &npu_io.get().1);

    let now = Instant::now();
    Supervisor {
        lp: &lp,
        settings: &settings,
        systemd: &systemd,
        observability: &mut observability,
        recorder_configured: config.recorder.is_some(),
        bundle_dir: &source.bundle_dir,
        watchdog: config.systemd.watchdog.then(watchdog_interval).flatten(),
        last_watchdog: now,
        inference_deadline: Duration::from_millis(config.systemd.inference_deadline_ms.into()),
        stalled: false,
        npu,
        last_status: now,
        rate_base: RateBase { at: now, ticks: 0 },
        npu_io,
    }
    .run(&signals, &usr1, args.duration);

    systemd.notify("STOPPING=1");
    if let Some(o) = observability.as_mut() {
        o.tick(lp.health(), true);
    }
    let report = lp.stop();
    text_stop.store(true, std::sync::atomic::Ordering::Release);
    if let Some(t) = text_thread {
        let _ = t.join();
    }
    if let Some(o) = observability.take() {
        o.observer.stop();
    }
    if source.store.is_some() {
        let _ = std::fs::remove_file(source.ota_root.join("vlad.pid"));
    }
    print_report(&report, &settings);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_repair_is_bounded_by_its_own_longer_deadline_from_its_start() {
        let deadline = Duration::from_secs(5);
        // No repair: the deadline from the last pass.
        let Away {
            ns: away,
            deadline: d,
            ..
        } = inference_away(100 * S, 94 * S, 0, deadline);
        assert_eq!((away, d), (6 * S, deadline));
        assert!(away >= d.as_nanos() as u64);
        // A repair that began 6 s ago (its last pass as old) is within its limit...
        let Away {
            ns: away,
            deadline: d,
            what,
        } = inference_away(100 * S, 94 * S, 94 * S, deadline);
        assert_eq!(d, deadline * REPAIR_DEADLINES);
        assert!(away < d.as_nanos() as u64, "{what}");
        // ...and one that went on past it is a blocked call.
        let Away {
            ns: away,
            deadline: d,
            ..
        } = inference_away(100 * S, 70 * S, 70 * S, deadline);
        assert!(away >= d.as_nanos() as u64);
    }
}
