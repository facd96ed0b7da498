//! The fixed-rate control loop between the robot's rings and a policy.
//!
//! Threads only, no async runtime:
//! - the **inference thread** waits for its [`Trigger`], takes the newest observation
//!   from the observation ring, skips it when too old, runs the [`Engine`] (in `prefix`
//!   mode conditioned on the chunk in play) and hands the chunk over; it keeps the rolling
//!   latency estimate behind the [`OperatingPoint`];
//! - the **publisher thread** (SCHED_FIFO when allowed) wakes on absolute
//!   `clock_nanosleep` deadlines and publishes one action per tick to the action ring,
//!   skipping missed ticks (counted), never allocating, never blocking on a lock: the
//!   chunk hand-over is a `try_lock` that simply waits for the next tick when contended;
//! - a **watch thread** follows the robot's heartbeat so a dead firmware makes the
//!   publisher hold within one tick, even while inference is busy.
//!
//! This crate knows the rings, not QNN or policies: the daemon provides the [`Engine`].

// `unsafe` only in `rt.rs`, the real-time set-up.
#![deny(unsafe_code)]

mod operating;
mod plan;
mod rt;
mod scheduler;
mod stats;
mod tap;

pub use operating::{Limit, Measured, OperatingPoint, PointSettings, SPREAD_LEN, SPREAD_QUANTILES};
pub use plan::{
    build_prefix, crossfade_weight, delay_steps, observation_in_time, sample_row, trigger_at,
    MergeMode, Prefix, TickGrid, Trigger,
};
pub use rt::{
    fix_large_allocations, lock_memory, lock_memory_on_fault, pin_current_thread, prefault_stack,
    set_fifo_priority,
};
pub use scheduler::{Chunk, Decision, ScheduleLimits, Scheduler};
pub use stats::{nearest_rank, quantile, quantile_sorted, Health, Histogram, LatencyWindow};
pub use tap::{InferenceEvent, Tap, TickEvent};

/// Inferences in the rolling latency window (LeRobot's RTC engine uses the last 100).
pub const LATENCY_WINDOW: usize = 64;
/// The quantile of that window taken as the latency `d` is computed from.
pub const LATENCY_QUANTILE: f64 = 0.95;

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};
use nix::time::{clock_nanosleep, ClockId, ClockNanosleepFlags};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use vla_ring::{monotonic_ns, Action, Geometry, Observation, RingReader, RingWriter};

/// An engine's failure: the engine's own typed error, boxed so the loop needs to know
/// nothing of policies; its `source()` chain is kept for whoever reports it. Built only
/// when an inference or a reload fails, never on a good tick.
pub type EngineError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What runs a policy for the loop (implemented by the daemon).
pub trait Engine: Send + 'static {
    /// One inference: `actions` is `chunk_len x action_dims`, preallocated.
    fn infer(&mut self, obs: &Observation, actions: &mut [f32]) -> Result<(), EngineError>;
    /// Whether [`Engine::infer_with_prefix`] really conditions on the prefix; the loop
    /// refuses `prefix` mode otherwise.
    fn conditions_on_prefix(&self) -> bool {
        false
    }
    /// One inference whose first steps continue `prefix` (the chunk in play, re-indexed
    /// to this observation's time). Only called when [`Engine::conditions_on_prefix`].
    fn infer_with_prefix(
        &mut self,
        obs: &Observation,
        prefix: &Prefix<'_>,
        actions: &mut [f32],
    ) -> Result<(), EngineError> {
        let _ = prefix;
        self.infer(obs, actions)
    }
    /// Reloads the policy (SIGHUP); returns a description of what now runs. On error the
    /// engine must still be able to infer (it fell back), or return `Err` from `infer`.
    fn reload(&mut self) -> Result<String, EngineError>;
    /// Names of the components whose latencies [`Engine::component_latencies`] reports
    /// (called once, before the loop starts).
    /// The action dims whose values are discrete commands (a binarized gripper), which
    /// the loop must never interpolate or blend; asked once at start. Default: none.
    fn discrete_dims(&self) -> Vec<bool> {
        Vec::new()
    }

    fn component_names(&self) -> Vec<String> {
        Vec::new()
    }
    /// The last inference's per-component latencies into `out` (preallocated, one per
    /// name); returns how many were written. Must not allocate.
    fn component_latencies(&self, out: &mut [u64]) -> usize {
        let _ = out;
        0
    }
}

/// Everything the loop needs to know, resolved from the config and the bundle.
#[derive(Clone, Debug)]
pub struct LoopSettings {
    pub geometry: Geometry,
    pub observation_path: PathBuf,
    pub action_path: PathBuf,
    pub action_slots: u32,
    pub period: Duration,
    pub max_observation_age: Duration,
    pub max_chunk_age: Duration,
    pub hold_after_chunk_end: Duration,
    pub action_valid: Duration,
    pub writer_heartbeat_timeout: Duration,
    pub publisher_priority: u8,
    pub publisher_cpus: Vec<usize>,
    pub inference_priority: u8,
    pub inference_cpus: Vec<usize>,
    /// Consecutive failed inferences before the loop publishes `fault` instead of `hold`.
    pub fault_after_failures: u32,
    pub merge: MergeMode,
    pub trigger: Trigger,
    /// Time between chunk steps: `period`, or longer on the slower time base.
    pub chunk_period: Duration,
    /// Latency (capture -> chunk ready) known before the loop starts, e.g. from the warm
    /// parity-gate inference; seeds the estimate so the first chunks are planned too.
    pub initial_latency: Option<Duration>,
}

#[derive(Debug)]
pub enum ControlError {
    ActionRing(vla_ring::CreateError),
    Thread(std::io::Error),
    /// `prefix` mode with an engine that cannot condition on a prefix.
    PrefixUnsupported,
}

impl core::fmt::Display for ControlError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ControlError::ActionRing(e) => write!(f, "action ring: {e}"),
            ControlError::Thread(e) => write!(f, "cannot start a loop thread: {e}"),
            ControlError::PrefixUnsupported => write!(
                f,
                "`control.merge` is prefix or inpaint but this engine cannot condition on a prefix"
            ),
        }
    }
}

impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControlError::ActionRing(e) => Some(e),
            ControlError::Thread(e) => Some(e),
            ControlError::PrefixUnsupported => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Chunk,
    Drop,
    Fault,
}

/// The chunk hand-over: the inference thread writes under the lock; the publisher only
/// ever `try_lock`s it.
struct Mailbox {
    fresh: bool,
    event: Event,
    chunk: Chunk,
}

/// Figures of a finished run.
#[derive(Clone, Debug, Default)]
pub struct LoopReport {
    pub duration: Duration,
    pub ticks: u64,
    pub missed_ticks: u64,
    pub published_ok: u64,
    pub published_hold: u64,
    pub published_fault: u64,
    /// Wake-up lateness against the absolute deadline.
    pub jitter: Histogram,
    /// Observation capture to publish, for `ok` chunk steps.
    pub freshness: Histogram,
    pub inference: Histogram,
    pub inferences: u64,
    pub inference_failures: u64,
    pub stale_observations: u64,
    pub skipped_steps: u64,
    pub non_finite_chunks: u64,
    /// What the loop measured by the end of the run (the operating point's inputs).
    pub measured: Measured,
}

/// A running loop. Dropping it without [`ControlLoop::stop`] leaves the threads running
/// until the process exits.
pub struct ControlLoop {
    health: Arc<Health>,
    stop: Arc<AtomicBool>,
    reload: Arc<AtomicBool>,
    started_ns: u64,
    publisher: JoinHandle<Histograms>,
    inference: JoinHandle<Histogram>,
    watch: JoinHandle<()>,
}

struct Histograms {
    jitter: Histogram,
    freshness: Histogram,
}

fn block_signals() {
    // Signals go to the daemon's main thread; a loop thread must not be interrupted.
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None);
}

/// Sleeps until the absolute CLOCK_MONOTONIC time `deadline_ns` (restarting after
/// signals): absolute deadlines do not accumulate drift tick after tick.
pub fn sleep_until(deadline_ns: u64) {
    let ts = nix::sys::time::TimeSpec::new(
        (deadline_ns / 1_000_000_000) as i64,
        (deadline_ns % 1_000_000_000) as i64,
    );
    while let Err(nix::errno::Errno::EINTR) = clock_nanosleep(
        ClockId::CLOCK_MONOTONIC,
        ClockNanosleepFlags::TIMER_ABSTIME,
        &ts,
    ) {}
}

impl ControlLoop {
    /// Creates the action ring and starts the threads.
    pub fn start(settings: LoopSettings, engine: Box<dyn Engine>) -> Result<Self, ControlError> {
        Self::start_with_tap(settings, engine, None)
    }

    /// [`ControlLoop::start`] with an observer of every inference and tick.
    pub fn start_with_tap(
        settings: LoopSettings,
        engine: Box<dyn Engine>,
        tap: Option<Arc<dyn Tap>>,
    ) -> Result<Self, ControlError> {
        if settings.merge.conditions_on_prefix() && !engine.conditions_on_prefix() {
            return Err(ControlError::PrefixUnsupported);
        }
        let g = settings.geometry;
        let discrete = engine.discrete_dims();
        let writer = RingWriter::<Action>::create(&settings.action_path, g, settings.action_slots)
            .map_err(ControlError::ActionRing)?;
        let health = Arc::new(Health::default());
        if let Some(l) = settings.initial_latency {
            Health::set(&health.latency_estimate_ns, l.as_nanos() as u64);
            for q in &health.latency_spread_ns {
                Health::set(q, l.as_nanos() as u64);
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let reload = Arc::new(AtomicBool::new(false));
        let robot_heartbeat = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let steps = g.chunk_len as usize;
        let dims = g.action_dims as usize;
        let mailbox = Arc::new(Mutex::new(Mailbox {
            fresh: false,
            event: Event::Drop,
            chunk: Chunk {
                actions: vec![0.0; steps * dims],
                ..Chunk::default()
            },
        }));
        let period_ns = settings.period.as_nanos() as u64;
        let grid = TickGrid {
            origin_ns: monotonic_ns() + period_ns,
            period_ns,
            step_ns: settings.chunk_period.max(settings.period).as_nanos() as u64,
        };

        let publisher = {
            let (s, shared, hb, tap, discrete) = (
                settings.clone(),
                Shared {
                    health: health.clone(),
                    stop: stop.clone(),
                    mailbox: mailbox.clone(),
                    grid,
                },
                robot_heartbeat.clone(),
                tap.clone(),
                discrete.clone(),
            );
            std::thread::Builder::new()
                .name("vla-publisher".into())
                .spawn(move || publisher_thread(s, writer, shared, hb, tap, discrete))
                .map_err(ControlError::Thread)?
        };
        let inference = {
            let (s, shared, reload) = (
                settings.clone(),
                Shared {
                    health: health.clone(),
                    stop: stop.clone(),
                    mailbox: mailbox.clone(),
                    grid,
                },
                reload.clone(),
            );
            std::thread::Builder::new()
                .name("vla-inference".into())
                .spawn(move || inference_thread(s, engine, shared, reload, tap, discrete))
                .map_err(ControlError::Thread)?
        };
        let watch = {
            let (s, stop, hb) = (settings.clone(), stop.clone(), robot_heartbeat.clone());
            std::thread::Builder::new()
                .name("vla-watch".into())
                .spawn(move || watch_thread(s, stop, hb))
                .map_err(ControlError::Thread)?
        };
        Ok(Self {
            health,
            stop,
            reload,
            started_ns: monotonic_ns(),
            publisher,
            inference,
            watch,
        })
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The operating point from what the loop has measured so far (`None` before any
    /// latency).
    pub fn operating_point(&self, settings: &LoopSettings) -> Option<OperatingPoint> {
        operating_point(settings, &measured(&self.health))
    }

    /// Asks the inference thread to reload the policy; the publisher holds meanwhile.
    pub fn request_reload(&self) {
        self.reload.store(true, Ordering::Release);
    }

    /// Whether a loop thread has ended on its own (it should not).
    pub fn is_broken(&self) -> bool {
        self.publisher.is_finished() || self.inference.is_finished() || self.watch.is_finished()
    }

    /// Stops the loop: the publisher's last action is `hold`. Waits for an inference in
    /// flight to finish.
    pub fn stop(self) -> LoopReport {
        self.stop.store(true, Ordering::Release);
        let h = self.publisher.join().unwrap_or_else(|_| Histograms {
            jitter: Histogram::default(),
            freshness: Histogram::default(),
        });
        let inference = self.inference.join().unwrap_or_default();
        let _ = self.watch.join();
        let hl = &self.health;
        LoopReport {
            duration: Duration::from_nanos(monotonic_ns().saturating_sub(self.started_ns)),
            ticks: Health::get(&hl.ticks),
            missed_ticks: Health::get(&hl.missed_ticks),
            published_ok: Health::get(&hl.published_ok),
            published_hold: Health::get(&hl.published_hold),
            published_fault: Health::get(&hl.published_fault),
            jitter: h.jitter,
            freshness: h.freshness,
            inference,
            inferences: Health::get(&hl.inferences),
            inference_failures: Health::get(&hl.inference_failures),
            stale_observations: Health::get(&hl.stale_observations),
            skipped_steps: Health::get(&hl.skipped_steps),
            non_finite_chunks: Health::get(&hl.non_finite_chunks),
            measured: measured(hl),
        }
    }
}

/// The operating point of `settings` at `measured` (`None` without a latency).
pub fn operating_point(settings: &LoopSettings, measured: &Measured) -> Option<OperatingPoint> {
    OperatingPoint::estimate(&settings.point_settings(), measured)
}

/// What the loop has measured: the latency window's p95 and p50, the robot's period.
pub fn measured(health: &Health) -> Measured {
    Measured {
        latency_p95_ns: Health::get(&health.latency_estimate_ns),
        latency_spread_ns: health.latency_spread_ns.each_ref().map(Health::get),
        observation_period_ns: Health::get(&health.observation_period_ns),
    }
}

impl LoopSettings {
    /// The limits the operating point is computed from.
    pub fn point_settings(&self) -> PointSettings {
        let ns = |d: Duration| d.as_nanos() as u64;
        PointSettings {
            period_ns: ns(self.period),
            chunk_period_ns: ns(self.chunk_period.max(self.period)),
            horizon: u64::from(self.geometry.chunk_len),
            merge: self.merge,
            trigger: self.trigger,
            max_chunk_age_ns: ns(self.max_chunk_age),
            max_observation_age_ns: ns(self.max_observation_age),
            action_valid_ns: ns(self.action_valid),
            hold_after_chunk_end_ns: ns(self.hold_after_chunk_end),
        }
    }
}

/// What the publisher and inference threads share.
struct Shared {
    health: Arc<Health>,
    stop: Arc<AtomicBool>,
    mailbox: Arc<Mutex<Mailbox>>,
    /// The publisher's tick grid: the inference thread aligns a prefix with it.
    grid: TickGrid,
}

fn publisher_thread(
    settings: LoopSettings,
    mut writer: RingWriter<Action>,
    shared: Shared,
    robot_heartbeat: Arc<std::sync::atomic::AtomicU64>,
    tap: Option<Arc<dyn Tap>>,
    discrete: Vec<bool>,
) -> Histograms {
    let Shared {
        health,
        stop,
        mailbox,
        grid,
    } = shared;
    block_signals();
    pin_current_thread("publisher", &settings.publisher_cpus);
    set_fifo_priority("publisher", settings.publisher_priority);
    prefault_stack();
    let geometry = settings.geometry;
    let period = settings.period.as_nanos() as u64;
    let limits = ScheduleLimits {
        period_ns: period,
        max_chunk_age_ns: settings.max_chunk_age.as_nanos() as u64,
        hold_after_chunk_end_ns: settings.hold_after_chunk_end.as_nanos() as u64,
        action_valid_ns: settings.action_valid.as_nanos() as u64,
        chunk_period_ns: settings.chunk_period.as_nanos() as u64,
        merge: settings.merge,
        synchronous_rows: settings
            .trigger
            .synchronous_rows(geometry.chunk_len as usize),
    };
    let heartbeat_timeout = settings.writer_heartbeat_timeout.as_nanos() as u64;
    let mut scheduler = Scheduler::new(
        limits,
        geometry.chunk_len as usize,
        geometry.action_dims as usize,
    );
    scheduler.set_discrete(&discrete);
    let mut action = Action::for_geometry(&geometry);
    let mut landed = Chunk {
        actions: vec![0.0; (geometry.chunk_len * geometry.action_dims) as usize],
        ..Chunk::default()
    };
    let mut histograms = Histograms {
        jitter: Histogram::default(),
        freshness: Histogram::default(),
    };
    let mut fault = false;
    let mut capture_of_current = 0u64;
    // On the grid the inference thread plans prefixes with; a late thread start joins it
    // at its next tick rather than counting the ticks before it as missed.
    let mut next = grid.next_tick(monotonic_ns());
    loop {
        sleep_until(next);
        let now = monotonic_ns();
        let late = now.saturating_sub(next);
        histograms.jitter.record(late);
        Health::set(&health.last_jitter_ns, late);
        let mut missed = 0;
        if late >= period {
            // Overrun: skip the ticks whose deadlines already passed, and count them.
            missed = late / period;
            next += missed * period;
            health.missed_ticks.fetch_add(missed, Ordering::Relaxed);
            // Steps stay on their times: the missed ticks' steps are gone, not delayed.
            scheduler.skip_ticks(missed);
        }
        if stop.load(Ordering::Acquire) {
            break;
        }
        if let Ok(mut posted) = mailbox.try_lock() {
            if posted.fresh {
                posted.fresh = false;
                match posted.event {
                    Event::Chunk => {
                        landed.id = posted.chunk.id;
                        landed.source_obs_seq = posted.chunk.source_obs_seq;
                        landed.capture_ns = posted.chunk.capture_ns;
                        landed.done_ns = posted.chunk.done_ns;
                        landed.actions.copy_from_slice(&posted.chunk.actions);
                        fault = false;
                    }
                    Event::Drop => {
                        landed.id = 0;
                        fault = false;
                    }
                    Event::Fault => {
                        landed.id = 0;
                        fault = true;
                    }
                }
                if landed.id != 0 {
                    // The tick's deadline, not the wake-up time: positions on the grid do
                    // not depend on wake-up jitter (and match the inference thread's plan).
                    let skipped = scheduler.land(&landed, next);
                    capture_of_current = landed.capture_ns;
                    health.skipped_steps.fetch_add(skipped, Ordering::Relaxed);
                    Health::set(&health.non_finite_chunks, scheduler.non_finite_refused);
                } else {
                    scheduler.drop_chunk();
                }
                // Still under the mailbox lock: the inference thread reads "taken" and
                // "in play" together (prefix mode continues the chunk in play), so it never
                // sees the chunk taken but not yet in play and falls back to no prefix.
                Health::set(&health.chunk_in_play, scheduler.chunk_id());
                drop(posted);
            }
        }
        let beat = robot_heartbeat.load(Ordering::Relaxed);
        let robot_alive = beat != 0 && now.saturating_sub(beat) <= heartbeat_timeout;
        let decision = scheduler.tick(now, robot_alive, fault, &mut action);
        match decision {
            Decision::Step(_) => {
                Health::bump(&health.published_ok);
                let age = now.saturating_sub(capture_of_current);
                histograms.freshness.record(age);
                Health::set(&health.last_freshness_ns, age);
            }
            Decision::HoldLast => Health::bump(&health.published_ok),
            Decision::Hold => Health::bump(&health.published_hold),
            Decision::Fault => Health::bump(&health.published_fault),
        }
        Health::set(&health.chunk_end_ns, scheduler.end_ns());
        Health::set(&health.chunk_in_play, scheduler.chunk_id());
        // The layout was fixed from the same geometry, so a publish cannot fail on length.
        let _ = writer.publish(&action);
        if let Some(tap) = &tap {
            tap.tick(&TickEvent {
                now_ns: now,
                decision,
                action: &action,
                robot_alive,
                missed,
            });
        }
        Health::bump(&health.ticks);
        Health::set(&health.last_tick_ns, now);
        next += period;
    }
    // Leave the robot holding: one last `hold` with the last real action.
    scheduler.drop_chunk();
    Health::set(&health.chunk_end_ns, 0);
    Health::set(&health.chunk_in_play, 0);
    scheduler.tick(monotonic_ns(), false, false, &mut action);
    let _ = writer.publish(&action);
    Health::bump(&health.published_hold);
    histograms
}

fn inference_thread(
    settings: LoopSettings,
    mut engine: Box<dyn Engine>,
    shared: Shared,
    reload: Arc<AtomicBool>,
    tap: Option<Arc<dyn Tap>>,
    discrete: Vec<bool>,
) -> Histogram {
    let Shared {
        health,
        stop,
        mailbox,
        grid,
    } = shared;
    block_signals();
    pin_current_thread("inference", &settings.inference_cpus);
    set_fifo_priority("inference", settings.inference_priority);
    prefault_stack();
    let geometry = settings.geometry;
    let mut latency = Histogram::default();
    let mut obs = match Observation::for_geometry(&geometry) {
        Ok(buffer) => buffer,
        Err(error) => {
            log::error!("observation buffer for {geometry:?}: {error}");
            return latency;
        }
    };
    let mut actions = vec![0f32; (geometry.chunk_len * geometry.action_dims) as usize];
    let post = |event: Event, chunk: Option<(&Observation, u64, &[f32], u64)>| {
        let mut slot = mailbox
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.event = event;
        if let Some((obs, seq, actions, id)) = chunk {
            slot.chunk.id = id;
            slot.chunk.source_obs_seq = seq;
            slot.chunk.capture_ns = obs.capture_time_ns;
            slot.chunk.done_ns = monotonic_ns();
            slot.chunk.actions.copy_from_slice(actions);
        }
        slot.fresh = true;
    };
    let mut reader: Option<RingReader<Observation>> = None;
    let mut last_seen = (0u64, 0u64);
    let mut last_capture = 0u64;
    let mut chunk_id = 0u64;
    let mut consecutive_failures = 0u32;
    let mut last_open_error = String::new();
    let max_age = settings.max_observation_age.as_nanos() as u64;
    let step_ns = settings.chunk_period.max(settings.period).as_nanos() as u64;
    let dims = geometry.action_dims as usize;
    let mut window = LatencyWindow::new(LATENCY_WINDOW);
    // The first inference after a start or a reload is the cold one: not in the window.
    let mut cold = true;
    // The last chunk posted (what the publisher plays, unless it dropped it), and the
    // prefix built from it: allocated here, reused.
    let mut prev_actions = vec![0f32; actions.len()];
    let mut prev_capture = 0u64;
    let mut prefix_actions = vec![0f32; actions.len()];
    // Per-component latencies for the tap, sized once from the engine's names.
    let mut components = vec![0u64; engine.component_names().len()];
    while !stop.load(Ordering::Acquire) {
        Health::set(&health.inference_alive_ns, monotonic_ns());
        if reload.swap(false, Ordering::AcqRel) {
            post(Event::Drop, None);
            // Another bundle, another latency: the old samples would keep d (and the
            // prefix's frozen steps, the trigger's lead) wrong for a whole window.
            window.clear();
            cold = true;
            Health::bump(&health.reloads);
            match engine.reload() {
                Ok(what) => log::info!("reloaded: {what}"),
                Err(error) => log::error!("reload failed: {error}"),
            }
            continue;
        }
        let Some(ring) = reader.as_ref() else {
            match RingReader::<Observation>::open(&settings.observation_path, geometry) {
                Ok(opened) => {
                    log::info!(
                        "observation ring {} open (writer epoch {})",
                        settings.observation_path.display(),
                        opened.writer_epoch()
                    );
                    reader = Some(opened);
                    last_open_error.clear();
                }
                Err(error) => {
                    let msg = error.to_string();
                    if msg != last_open_error {
                        if error.is_retryable() {
                            log::info!("waiting for the observation ring: {msg}");
                        } else {
                            log::error!("observation ring refused: {msg}");
                        }
                        last_open_error = msg;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            continue;
        };
        let estimate = Health::get(&health.latency_estimate_ns);
        // A chunk posted but not yet taken says nothing yet about the chunk in play; and a
        // conditioned inference started now would continue a chunk the next post may
        // replace before it ever plays (latency under a tick), so prefix modes wait for
        // the take (at most a tick) even back to back.
        let untaken = || mailbox.try_lock().map_or(true, |slot| slot.fresh);
        let wait = match settings.trigger {
            Trigger::BackToBack => settings.merge.conditions_on_prefix() && untaken(),
            Trigger::Remaining { .. } | Trigger::Synchronous { .. } => {
                let end = Health::get(&health.chunk_end_ns);
                untaken()
                    || trigger_at(settings.trigger, end, estimate, step_ns)
                        .is_some_and(|at| monotonic_ns() < at)
            }
        };
        if wait {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let key = (ring.writer_epoch(), ring.published());
        if key.1 == 0 || key == last_seen {
            if matches!(ring.is_replaced(), Ok(true)) {
                log::warn!(
                    "observation ring {} was replaced; reopening",
                    settings.observation_path.display()
                );
                reader = None;
            }
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let seq = match ring.read_latest(&mut obs) {
            Ok(seq) => seq,
            Err(error @ vla_ring::ReadError::Incompatible { .. }) => {
                // A writer restarted the segment in place with another layout: the reopen
                // reports why it does not fit (or follows it, if it does).
                log::warn!(
                    "observation ring {}: {error}; reopening",
                    settings.observation_path.display()
                );
                reader = None;
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(error) => {
                log::debug!("observation read: {error}");
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
        };
        if let Some(period) = observation_period(last_seen, last_capture, &obs, seq) {
            Health::set(&health.observation_period_ns, period);
        }
        last_seen = (obs.writer_epoch, seq);
        last_capture = obs.capture_time_ns;
        let end = Health::get(&health.chunk_end_ns);
        if !observation_in_time(settings.trigger, end, step_ns, obs.capture_time_ns) {
            // Synchronous: captured before the executed rows were done; wait for the next.
            continue;
        }
        let now = monotonic_ns();
        if now.saturating_sub(obs.capture_time_ns) > max_age {
            Health::bump(&health.stale_observations);
            continue;
        }
        // Prefix modes: condition on the chunk posted last when the publisher plays it, or
        // plays its predecessor and has not taken it yet (it drops chunks on a silent
        // robot, a failure or a reload, and then there is nothing to continue).
        // Both read under the mailbox lock, where the publisher takes a chunk and puts it
        // in play in one step (it holds the lock for a copy and a landing, microseconds).
        let continues = {
            let slot = mailbox
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let in_play = Health::get(&health.chunk_in_play);
            in_play != 0 && (in_play == chunk_id || (in_play + 1 == chunk_id && slot.fresh))
        };
        let prefix = (settings.merge.conditions_on_prefix() && continues)
            .then(|| {
                // Rows as the publisher plays them on its grid: the frozen rows are then
                // exactly what the old chunk would publish at those ticks, the landing
                // tick included (at the latency estimate), so the seam adds no jump.
                let offset = grid.offset_steps(prev_capture, obs.capture_time_ns);
                let frozen = grid.frozen_rows(obs.capture_time_ns, estimate);
                build_prefix(
                    &prev_actions,
                    dims,
                    &discrete,
                    offset,
                    frozen,
                    &mut prefix_actions,
                )
            })
            .flatten();
        let prefixed_call = prefix.is_some();
        let t0 = monotonic_ns();
        let result = match prefix {
            Some((frozen, overlap)) => {
                let conditioning = Prefix {
                    actions: &prefix_actions,
                    frozen,
                    overlap,
                };
                engine.infer_with_prefix(&obs, &conditioning, &mut actions)
            }
            None => engine.infer(&obs, &mut actions),
        };
        let t1 = monotonic_ns();
        if let Some(tap) = &tap {
            let filled = engine.component_latencies(&mut components);
            tap.inference(&InferenceEvent {
                chunk_id: if result.is_ok() { chunk_id + 1 } else { 0 },
                observation: &obs,
                observation_seq: seq,
                started_ns: t0,
                done_ns: t1,
                components_ns: &components[..filled.min(components.len())],
                actions: &actions,
                ok: result.is_ok(),
                prefixed: prefixed_call,
            });
        }
        match result {
            Ok(()) => {
                consecutive_failures = 0;
                chunk_id += 1;
                latency.record(t1 - t0);
                if !cold {
                    window.record(t1.saturating_sub(obs.capture_time_ns));
                    if let Some(p95) = window.quantile_ns(LATENCY_QUANTILE) {
                        Health::set(&health.latency_estimate_ns, p95);
                    }
                    for (slot, &q) in health.latency_spread_ns.iter().zip(&SPREAD_QUANTILES) {
                        if let Some(l) = window.quantile_ns(q) {
                            Health::set(slot, l);
                        }
                    }
                }
                cold = false;
                Health::set(&health.last_inference_ns, t1 - t0);
                Health::set(&health.last_inference_done_ns, t1);
                Health::bump(&health.inferences);
                prev_actions.copy_from_slice(&actions);
                prev_capture = obs.capture_time_ns;
                post(Event::Chunk, Some((&obs, seq, &actions, chunk_id)));
            }
            Err(error) => {
                consecutive_failures += 1;
                Health::bump(&health.inference_failures);
                log::error!("inference on observation {seq} failed: {error}");
                let event = if consecutive_failures >= settings.fault_after_failures {
                    Event::Fault
                } else {
                    Event::Drop
                };
                post(event, None);
            }
        }
    }
    latency
}

/// The robot's observation period from two observations of one writer taken `n`
/// sequence numbers apart: `(capture - last capture) / n`.
fn observation_period(
    (last_epoch, last_seq): (u64, u64),
    last_capture_ns: u64,
    obs: &Observation,
    seq: u64,
) -> Option<u64> {
    let n = seq.checked_sub(last_seq).filter(|&n| n > 0)?;
    if last_seq == 0 || obs.writer_epoch != last_epoch || obs.capture_time_ns <= last_capture_ns {
        return None;
    }
    Some((obs.capture_time_ns - last_capture_ns) / n)
}

fn watch_thread(
    settings: LoopSettings,
    stop: Arc<AtomicBool>,
    heartbeat: Arc<std::sync::atomic::AtomicU64>,
) {
    block_signals();
    let mut reader: Option<RingReader<Observation>> = None;
    // What the journal last heard about the robot, so each change is logged once. This
    // thread is not on the hot path: it sleeps between looks and may log.
    let mut epoch = 0u64;
    let mut robot_alive: Option<bool> = None;
    while !stop.load(Ordering::Acquire) {
        match &reader {
            Some(ring) => {
                let beat = ring.writer_heartbeat_ns();
                heartbeat.store(beat, Ordering::Relaxed);
                let writer = ring.writer_epoch();
                if writer != epoch {
                    if epoch != 0 {
                        log::warn!(
                            "robot firmware restarted: observation ring writer epoch {epoch} -> {writer} (writer pid {})",
                            ring.writer_pid()
                        );
                    }
                    epoch = writer;
                }
                let age = ring.heartbeat_age();
                let alive = beat != 0 && age <= settings.writer_heartbeat_timeout;
                match (robot_alive, alive) {
                    (Some(true), false) => log::warn!(
                        "robot heartbeat lost: no observation or heartbeat for {} ms (limit {} ms); publishing hold",
                        age.as_millis(),
                        settings.writer_heartbeat_timeout.as_millis()
                    ),
                    (Some(false), true) => {
                        log::info!("robot alive: observations or heartbeat arriving (writer epoch {writer})")
                    }
                    _ => {}
                }
                robot_alive = Some(alive);
                if matches!(ring.is_replaced(), Ok(true)) {
                    reader = None;
                }
            }
            None => {
                reader =
                    RingReader::<Observation>::open(&settings.observation_path, settings.geometry)
                        .ok()
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
