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
//! `inference.rs` and `publisher.rs` hold the two busy threads, each as a struct of its
//! state with a method per step; this file the types they share and the start and stop.
//!
//! This crate knows the rings, not QNN or policies: the daemon provides the [`Engine`].

// `unsafe` only in `rt.rs`, the real-time set-up.
#![deny(unsafe_code)]

mod inference;
mod limits;
mod operating;
mod plan;
mod publisher;
mod rt;
mod scheduler;
mod stats;
mod tap;

pub use limits::Limits;
pub use operating::{Limit, Measured, OperatingPoint, SPREAD_LEN, SPREAD_QUANTILES};
pub use plan::{
    build_prefix, crossfade_weight, delay_steps, observation_in_time, sample_row, trigger_at,
    MergeMode, Prefix, TickGrid, Trigger,
};
pub use rt::{
    fix_large_allocations, lock_memory, lock_memory_on_fault, pin_current_thread, prefault_stack,
    set_fifo_priority,
};
pub use scheduler::{Chunk, Decision, Scheduler};
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
    /// Called on the inference thread after a failed inference has been handed to the
    /// publisher (which holds from its next tick): where an engine repairs itself (the
    /// NPU re-created after a DSP restart) without delaying the hold. Default: nothing.
    fn after_failure(&mut self) {}
    /// Whether an instruction the observation names is ready to infer with (an
    /// instruction given as text may still be rendering, or was refused). Called on the
    /// inference thread before each inference: must not allocate or block. While it says
    /// no, the loop holds and publishes nothing computed for another instruction.
    /// Default: always ready.
    fn instruction_ready(&mut self, obs: &Observation) -> bool {
        let _ = obs;
        true
    }
    /// Reloads the policy (SIGHUP); returns a description of what now runs. On error the
    /// engine must still be able to infer (it fell back), or return `Err` from `infer`.
    fn reload(&mut self) -> Result<String, EngineError>;
    /// The action dims whose values are discrete commands (a binarized gripper), which
    /// the loop must never interpolate or blend; asked once at start. Default: none.
    fn discrete_dims(&self) -> Vec<bool> {
        Vec::new()
    }

    /// Names of the components whose latencies [`Engine::component_latencies`] reports, in its
    /// order (called once, before the loop starts). Default: none.
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

/// Everything the loop needs to know, resolved from the config and the bundle. Built one
/// way: [`LoopSettings::new`] with the rings and the device's defaults, then struct
/// update for what differs (`LoopSettings { action_slots, ..LoopSettings::new(g, obs, act) }`).
#[derive(Clone, Debug)]
pub struct LoopSettings {
    /// The robot link's shape: ring geometry and the chunk's `chunk_len x action_dims`.
    pub geometry: Geometry,
    /// Observation ring file (written by the robot); the inference thread opens and reopens it.
    pub observation_path: PathBuf,
    /// Action ring file, created by [`ControlLoop::start`].
    pub action_path: PathBuf,
    /// Slots of the action ring (`rings.action_slots`).
    pub action_slots: u32,
    /// The timing limits: publish period, chunk steps, ages, validity, merge and trigger
    /// (`limits.horizon` is `geometry.chunk_len`).
    pub limits: Limits,
    /// A robot (observation writer) silent this long is treated as dead: the publisher holds.
    pub writer_heartbeat_timeout: Duration,
    /// `SCHED_FIFO` priority of the publisher thread; 0: `SCHED_OTHER`.
    pub publisher_priority: u8,
    /// CPUs the publisher thread is pinned to; empty: not pinned.
    pub publisher_cpus: Vec<usize>,
    /// `SCHED_FIFO` priority of the inference thread; 0: `SCHED_OTHER`. Keep it below the
    /// publisher's.
    pub inference_priority: u8,
    /// CPUs the inference thread is pinned to; empty: not pinned.
    pub inference_cpus: Vec<usize>,
    /// Consecutive failed inferences before the loop publishes `fault` instead of `hold`.
    pub fault_after_failures: u32,
    /// Latency (capture -> chunk ready) known before the loop starts, e.g. from the warm
    /// parity-gate inference; seeds the estimate so the first chunks are planned too.
    pub initial_latency: Option<Duration>,
}

/// Why the loop could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum ControlError {
    /// The action ring could not be created (its file, lock or mapping).
    ActionRing(vla_ring::CreateError),
    /// A loop thread could not be spawned.
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

// Each message names its cause, so `source()` hands out only that cause's own causes.
impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControlError::ActionRing(e) => e.source(),
            ControlError::Thread(e) => e.source(),
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
    /// The instruction of the observation the chunk was computed from.
    instruction_id: u32,
}

/// Figures of a finished run.
#[derive(Clone, Debug, Default)]
pub struct LoopReport {
    /// Wall time from start to stop.
    pub duration: Duration,
    /// Publisher ticks that ran (missed ones are not counted).
    pub ticks: u64,
    /// Deadlines that passed before the publisher woke (overruns); their steps are gone.
    pub missed_ticks: u64,
    /// Ticks that published `ok`: chunk steps and the last action held within the grace period.
    pub published_ok: u64,
    /// Ticks that published `hold`.
    pub published_hold: u64,
    /// Ticks that published `fault`.
    pub published_fault: u64,
    /// Wake-up lateness against the absolute deadline.
    pub jitter: Histogram,
    /// Observation capture to publish, for `ok` chunk steps.
    pub freshness: Histogram,
    /// Engine time per successful inference (start of `infer` to its return).
    pub inference: Histogram,
    /// Successful inferences.
    pub inferences: u64,
    /// Failed inferences (the engine returned an error).
    pub inference_failures: u64,
    /// Observations skipped because they were older than `max_observation_age`.
    pub stale_observations: u64,
    /// Chunk steps skipped on landing because their time had passed.
    pub skipped_steps: u64,
    /// Chunks refused because they held NaN or infinity (never published).
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

/// Blocks every asynchronous signal in the calling thread: signals go to the daemon's main
/// thread, a loop thread must not be interrupted. The synchronous fault signals stay
/// unblocked: a fault while they are blocked kills the process outright, and the ring's
/// SIGBUS handler (a ring shrunk under its mapping) must run in the thread that faulted.
pub fn block_signals() {
    let mut set = SigSet::all();
    for fault in [
        nix::sys::signal::SIGBUS,
        nix::sys::signal::SIGSEGV,
        nix::sys::signal::SIGFPE,
        nix::sys::signal::SIGILL,
    ] {
        set.remove(fault);
    }
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None);
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
        if settings.limits.merge.conditions_on_prefix() && !engine.conditions_on_prefix() {
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
            instruction_id: 0,
        }));
        let period_ns = settings.limits.period_ns;
        let grid = TickGrid {
            origin_ns: monotonic_ns() + period_ns,
            period_ns,
            step_ns: settings.limits.step_ns(),
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
                .spawn(move || publisher::run(s, writer, shared, hb, tap, discrete))
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
                .spawn(move || inference::run(s, engine, shared, reload, tap, discrete))
                .map_err(ControlError::Thread)?
        };
        let watch = {
            let (s, stop, hb, h) = (
                settings.clone(),
                stop.clone(),
                robot_heartbeat.clone(),
                health.clone(),
            );
            std::thread::Builder::new()
                .name("vla-watch".into())
                .spawn(move || watch_thread(s, stop, hb, h))
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

    /// The counters the loop threads keep, readable while it runs (STATUS, metrics).
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The same counters, shared with a thread of the daemon's that adds to them.
    pub fn shared_health(&self) -> Arc<Health> {
        self.health.clone()
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
    OperatingPoint::estimate(&settings.limits, measured)
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
    /// The loop on these rings with the device's control values (`config/vlad.json`): 20 Hz
    /// and chunk steps at the same rate, observations up to 200 ms old, chunks up to
    /// 1500 ms, 100 ms of grace after a chunk and of validity per action, a writer silent
    /// for 500 ms is dead, 64 action slots; no real-time priority or pinning; `fault` after
    /// 3 failed inferences in a row; `skip` back to back; no latency known yet.
    pub fn new(geometry: Geometry, observation_path: PathBuf, action_path: PathBuf) -> Self {
        const MS: u64 = 1_000_000;
        Self {
            geometry,
            observation_path,
            action_path,
            action_slots: 64,
            limits: Limits {
                period_ns: 50 * MS,
                chunk_period_ns: 50 * MS,
                horizon: u64::from(geometry.chunk_len),
                merge: MergeMode::Skip,
                trigger: Trigger::BackToBack,
                max_chunk_age_ns: 1500 * MS,
                max_observation_age_ns: 200 * MS,
                action_valid_ns: 100 * MS,
                hold_after_chunk_end_ns: 100 * MS,
            },
            writer_heartbeat_timeout: Duration::from_millis(500),
            publisher_priority: 0,
            publisher_cpus: Vec::new(),
            inference_priority: 0,
            inference_cpus: Vec::new(),
            fault_after_failures: 3,
            initial_latency: None,
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

fn watch_thread(
    settings: LoopSettings,
    stop: Arc<AtomicBool>,
    heartbeat: Arc<std::sync::atomic::AtomicU64>,
    health: Arc<Health>,
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
                // The robot's instruction as its newest observation names it: the publisher
                // stops a chunk computed for another one within a few ms of the switch,
                // while the inference thread may still be busy with the old one.
                if let Ok((_, id)) = ring.latest_instruction_id() {
                    health.set_robot_instruction(id);
                }
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
                // Truncated, its pages read as zeros (heartbeat 0) until reopened.
                if matches!(ring.is_replaced(), Ok(true)) || ring.is_truncated() {
                    reader = None;
                    // Not the instruction of a ring no longer read: refuse no chunk for it.
                    health.clear_robot_instruction();
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
