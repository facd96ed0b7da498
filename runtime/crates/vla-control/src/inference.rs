//! The inference thread: waits for its trigger, takes the newest observation from the
//! observation ring, skips it when too old, runs the engine (conditioned on the chunk in
//! play in the prefix modes) and posts the chunk to the publisher; keeps the rolling
//! latency window behind the operating point. Everything it needs per inference is
//! allocated when it starts.

use crate::plan::{build_prefix, observation_in_time, trigger_at, Prefix, Trigger};
use crate::rt::{pin_current_thread, prefault_stack, set_fifo_priority};
use crate::stats::{Health, Histogram, LatencyWindow};
use crate::tap::{InferenceEvent, Tap};
use crate::{
    block_signals, Engine, Event, LoopSettings, Shared, LATENCY_QUANTILE, LATENCY_WINDOW,
    SPREAD_QUANTILES,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vla_ring::{monotonic_ns, Observation, ReadError, RingReader};

/// The thread's body: set-up, then one step at a time until the loop stops.
pub(crate) fn run(
    settings: LoopSettings,
    engine: Box<dyn Engine>,
    shared: Shared,
    reload: Arc<AtomicBool>,
    tap: Option<Arc<dyn Tap>>,
    discrete: Vec<bool>,
) -> Histogram {
    block_signals();
    pin_current_thread("inference", &settings.inference_cpus);
    set_fifo_priority("inference", settings.inference_priority);
    prefault_stack();
    let geometry = settings.geometry;
    let obs = match Observation::for_geometry(&geometry) {
        Ok(buffer) => buffer,
        Err(error) => {
            log::error!("observation buffer for {geometry:?}: {error}");
            return Histogram::default();
        }
    };
    let mut thread = Inference::new(settings, engine, shared, reload, tap, discrete, obs);
    while !thread.shared.stop.load(Ordering::Acquire) {
        thread.step();
    }
    thread.latency
}

/// The chunk posted last, kept to condition the next inference on in the prefix modes.
struct Previous {
    actions: Vec<f32>,
    capture_ns: u64,
    /// The instruction it was computed for: a chunk of another one is never continued.
    instruction_id: Option<u32>,
    /// The prefix built from it: allocated once, reused.
    prefix: Vec<f32>,
}

/// The observation ring as the thread sees it: the reader once open, and what it read last.
struct Source {
    reader: Option<RingReader<Observation>>,
    /// (writer epoch, seq) of the last observation taken.
    last_seen: (u64, u64),
    last_capture_ns: u64,
    /// The last reason the ring could not be opened (logged once per change).
    last_open_error: String,
}

/// The inference thread's state.
struct Inference {
    settings: LoopSettings,
    engine: Box<dyn Engine>,
    shared: Shared,
    reload: Arc<AtomicBool>,
    tap: Option<Arc<dyn Tap>>,
    discrete: Vec<bool>,
    obs: Observation,
    actions: Vec<f32>,
    source: Source,
    previous: Previous,
    /// Per-component latencies for the tap, sized once from the engine's names.
    components: Vec<u64>,
    window: LatencyWindow,
    /// The first inference after a start or a reload is the cold one: not in the window.
    cold: bool,
    chunk_id: u64,
    consecutive_failures: u32,
    latency: Histogram,
    /// Chunk step period (the publish period, or the slower time base's).
    step_ns: u64,
}

impl Inference {
    fn new(
        settings: LoopSettings,
        engine: Box<dyn Engine>,
        shared: Shared,
        reload: Arc<AtomicBool>,
        tap: Option<Arc<dyn Tap>>,
        discrete: Vec<bool>,
        obs: Observation,
    ) -> Self {
        let g = settings.geometry;
        let len = (g.chunk_len * g.action_dims) as usize;
        let components = vec![0u64; engine.component_names().len()];
        let step_ns = settings.limits.step_ns();
        Self {
            settings,
            engine,
            shared,
            reload,
            tap,
            discrete,
            obs,
            actions: vec![0f32; len],
            source: Source {
                reader: None,
                last_seen: (0, 0),
                last_capture_ns: 0,
                last_open_error: String::new(),
            },
            previous: Previous {
                actions: vec![0f32; len],
                capture_ns: 0,
                instruction_id: None,
                prefix: vec![0f32; len],
            },
            components,
            window: LatencyWindow::new(LATENCY_WINDOW),
            cold: true,
            chunk_id: 0,
            consecutive_failures: 0,
            latency: Histogram::default(),
            step_ns,
        }
    }

    /// One pass: a reload, the ring's opening, a wait, or one observation's inference.
    fn step(&mut self) {
        let health = &self.shared.health;
        Health::set(&health.inference_alive_ns, monotonic_ns());
        if self.reload.swap(false, Ordering::AcqRel) {
            self.reload_engine();
            return;
        }
        if !self.ring_open() {
            return;
        }
        let estimate = Health::get(&self.shared.health.latency_estimate_ns);
        if self.must_wait(estimate) {
            std::thread::sleep(Duration::from_millis(1));
            return;
        }
        let Some(seq) = self.take_observation() else {
            return;
        };
        if self
            .previous
            .instruction_id
            .is_some_and(|id| id != self.obs.instruction_id)
        {
            // A new instruction: the chunk of the old one stops now (the publisher also
            // stops it as soon as its watch sees the switch), and nothing continues it.
            self.post(Event::Drop, None);
            self.previous.instruction_id = None;
        }
        if !self.engine.instruction_ready(&self.obs) {
            // Not rendered yet, or refused: hold, and infer nothing for it.
            Health::bump(&self.shared.health.instruction_waits);
            if self.previous.instruction_id.take().is_some() {
                self.post(Event::Drop, None);
            }
            return;
        }
        self.infer(seq, estimate);
    }

    fn reload_engine(&mut self) {
        self.post(Event::Drop, None);
        // Another bundle, another latency: the old samples would keep d (and the prefix's
        // frozen steps, the trigger's lead) wrong for a whole window.
        self.window.clear();
        self.cold = true;
        Health::bump(&self.shared.health.reloads);
        match self.repairing(|engine| engine.reload()) {
            Ok(what) => log::info!("reloaded: {what}"),
            Err(error) => log::error!("reload failed: {error}"),
        }
    }

    /// Runs `repair` (a reload, a re-creation after a failure) with
    /// `repairing_since_ns` set, so the supervisor tells a long load and gate from a
    /// blocked inference.
    fn repairing<T>(&mut self, repair: impl FnOnce(&mut dyn Engine) -> T) -> T {
        let health = &self.shared.health;
        Health::set(&health.repairing_since_ns, monotonic_ns());
        let done = repair(self.engine.as_mut());
        Health::set(&health.inference_alive_ns, monotonic_ns());
        Health::set(&health.repairing_since_ns, 0);
        done
    }

    /// Opens the observation ring if it is not yet; whether it is open.
    fn ring_open(&mut self) -> bool {
        if self.source.reader.is_some() {
            return true;
        }
        let path = &self.settings.observation_path;
        match RingReader::<Observation>::open(path, self.settings.geometry) {
            Ok(opened) => {
                log::info!(
                    "observation ring {} open (writer epoch {})",
                    path.display(),
                    opened.writer_epoch()
                );
                self.source.reader = Some(opened);
                self.source.last_open_error.clear();
            }
            Err(error) => {
                let msg = error.to_string();
                if msg != self.source.last_open_error {
                    if error.is_retryable() {
                        log::info!("waiting for the observation ring: {msg}");
                    } else {
                        log::error!("observation ring refused: {msg}");
                    }
                    self.source.last_open_error = msg;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        false
    }

    /// Whether the trigger says not yet. A chunk posted but not yet taken says nothing yet
    /// about the chunk in play; and a conditioned inference started now would continue a
    /// chunk the next post may replace before it ever plays (latency under a tick), so
    /// prefix modes wait for the take (at most a tick) even back to back.
    fn must_wait(&self, estimate: u64) -> bool {
        let untaken = || {
            self.shared
                .mailbox
                .try_lock()
                .map_or(true, |slot| slot.fresh)
        };
        match self.settings.limits.trigger {
            Trigger::BackToBack => self.settings.limits.merge.conditions_on_prefix() && untaken(),
            Trigger::Remaining { .. } | Trigger::Synchronous { .. } => {
                let end = Health::get(&self.shared.health.chunk_end_ns);
                untaken()
                    || trigger_at(self.settings.limits.trigger, end, estimate, self.step_ns)
                        .is_some_and(|at| monotonic_ns() < at)
            }
        }
    }

    /// Reads the newest observation into `obs` when there is one not yet taken, fresh
    /// enough and (synchronous) captured late enough; its seq.
    fn take_observation(&mut self) -> Option<u64> {
        let ring = self.source.reader.as_ref()?;
        let path = &self.settings.observation_path;
        let key = (ring.writer_epoch(), ring.published());
        if key.1 == 0 || key == self.source.last_seen {
            if matches!(ring.is_replaced(), Ok(true)) {
                log::warn!(
                    "observation ring {} was replaced; reopening",
                    path.display()
                );
                self.source.reader = None;
            } else if ring.is_truncated() {
                // Shrunk under our mapping (its pages read as zeros now): hold until the
                // robot's writer makes it whole again.
                log::warn!(
                    "observation ring {} was truncated; reopening",
                    path.display()
                );
                self.source.reader = None;
            }
            std::thread::sleep(Duration::from_millis(2));
            return None;
        }
        let seq = match ring.read_latest(&mut self.obs) {
            Ok(seq) => seq,
            Err(error @ ReadError::Incompatible { .. }) => {
                // A writer restarted the segment in place with another layout: the reopen
                // reports why it does not fit (or follows it, if it does).
                log::warn!("observation ring {}: {error}; reopening", path.display());
                self.source.reader = None;
                std::thread::sleep(Duration::from_millis(2));
                return None;
            }
            Err(error) => {
                log::debug!("observation read: {error}");
                std::thread::sleep(Duration::from_millis(2));
                return None;
            }
        };
        let health = &self.shared.health;
        if let Some(period) = observation_period(
            self.source.last_seen,
            self.source.last_capture_ns,
            &self.obs,
            seq,
        ) {
            Health::set(&health.observation_period_ns, period);
        }
        self.source.last_seen = (self.obs.writer_epoch, seq);
        self.source.last_capture_ns = self.obs.capture_time_ns;
        // The publisher learns a switch from here too, not only from the watch thread's
        // polls (normal priority, every few ms).
        health.set_robot_instruction(self.obs.instruction_id);
        let end = Health::get(&health.chunk_end_ns);
        if !observation_in_time(
            self.settings.limits.trigger,
            end,
            self.step_ns,
            self.obs.capture_time_ns,
        ) {
            // Synchronous: captured before the executed rows were done; wait for the next.
            return None;
        }
        if !fresh(
            monotonic_ns(),
            self.obs.capture_time_ns,
            self.settings.limits.max_observation_age_ns,
        ) {
            Health::bump(&health.stale_observations);
            return None;
        }
        Some(seq)
    }

    /// Prefix modes: the chunk posted last re-indexed to this observation's time, when the
    /// publisher plays it, or plays its predecessor and has not taken it yet (it drops
    /// chunks on a silent robot, a failure or a reload, and then there is nothing to
    /// continue). Both read under the mailbox lock, where the publisher takes a chunk and
    /// puts it in play in one step (it holds the lock for a copy and a landing,
    /// microseconds). `(frozen, overlap)` rows of `previous.prefix`.
    fn prefix(&mut self, estimate: u64) -> Option<(usize, usize)> {
        if !self.settings.limits.merge.conditions_on_prefix()
            || self.previous.instruction_id != Some(self.obs.instruction_id)
        {
            return None;
        }
        let continues = {
            let slot = self
                .shared
                .mailbox
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let in_play = Health::get(&self.shared.health.chunk_in_play);
            in_play != 0
                && (in_play == self.chunk_id || (in_play + 1 == self.chunk_id && slot.fresh))
        };
        if !continues {
            return None;
        }
        // Rows as the publisher plays them on its grid: the frozen rows are then exactly
        // what the old chunk would publish at those ticks, the landing tick included (at
        // the latency estimate), so the seam adds no jump.
        let grid = self.shared.grid;
        let offset = grid.offset_steps(self.previous.capture_ns, self.obs.capture_time_ns);
        let frozen = grid.frozen_rows(self.obs.capture_time_ns, estimate);
        build_prefix(
            &self.previous.actions,
            self.settings.geometry.action_dims as usize,
            &self.discrete,
            offset,
            frozen,
            &mut self.previous.prefix,
        )
    }

    /// One inference on the observation `seq` in `obs`, its chunk posted or its failure
    /// reported.
    fn infer(&mut self, seq: u64, estimate: u64) {
        let prefix = self.prefix(estimate);
        let t0 = monotonic_ns();
        let result = match prefix {
            Some((frozen, overlap)) => {
                let conditioning = Prefix {
                    actions: &self.previous.prefix,
                    frozen,
                    overlap,
                };
                self.engine
                    .infer_with_prefix(&self.obs, &conditioning, &mut self.actions)
            }
            None => self.engine.infer(&self.obs, &mut self.actions),
        };
        let t1 = monotonic_ns();
        if let Some(tap) = &self.tap {
            let filled = self.engine.component_latencies(&mut self.components);
            tap.inference(&InferenceEvent {
                chunk_id: if result.is_ok() { self.chunk_id + 1 } else { 0 },
                observation: &self.obs,
                observation_seq: seq,
                started_ns: t0,
                done_ns: t1,
                components_ns: &self.components[..filled.min(self.components.len())],
                actions: &self.actions,
                ok: result.is_ok(),
                prefixed: prefix.is_some(),
            });
        }
        match result {
            Ok(()) => self.succeeded(seq, t0, t1),
            Err(error) => {
                self.consecutive_failures += 1;
                Health::bump(&self.shared.health.inference_failures);
                log::error!("inference on observation {seq} failed: {error}");
                let event = if self.consecutive_failures >= self.settings.fault_after_failures {
                    Event::Fault
                } else {
                    Event::Drop
                };
                self.post(event, None);
                // The hold is posted: a repair that takes seconds delays nothing unsafe.
                self.repairing(|engine| engine.after_failure());
            }
        }
    }

    /// Records a good inference (latency window, health) and posts its chunk.
    fn succeeded(&mut self, seq: u64, t0: u64, t1: u64) {
        let health = &self.shared.health;
        self.consecutive_failures = 0;
        self.chunk_id += 1;
        self.latency.record(t1 - t0);
        if !self.cold {
            self.window
                .record(t1.saturating_sub(self.obs.capture_time_ns));
            if let Some(p95) = self.window.quantile_ns(LATENCY_QUANTILE) {
                Health::set(&health.latency_estimate_ns, p95);
            }
            for (slot, &q) in health.latency_spread_ns.iter().zip(&SPREAD_QUANTILES) {
                if let Some(l) = self.window.quantile_ns(q) {
                    Health::set(slot, l);
                }
            }
        }
        self.cold = false;
        Health::set(&health.last_inference_ns, t1 - t0);
        Health::set(&health.last_inference_done_ns, t1);
        Health::bump(&health.inferences);
        self.previous.actions.copy_from_slice(&self.actions);
        self.previous.capture_ns = self.obs.capture_time_ns;
        self.previous.instruction_id = Some(self.obs.instruction_id);
        self.post(Event::Chunk, Some(seq));
    }

    /// Hands an event (with the chunk in `actions` for observation `seq`) to the publisher.
    fn post(&self, event: Event, chunk_of: Option<u64>) {
        let mut slot = self
            .shared
            .mailbox
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.event = event;
        if let Some(seq) = chunk_of {
            slot.chunk.id = self.chunk_id;
            slot.chunk.source_obs_seq = seq;
            slot.chunk.capture_ns = self.obs.capture_time_ns;
            slot.chunk.done_ns = monotonic_ns();
            slot.chunk.actions.copy_from_slice(&self.actions);
            slot.instruction_id = self.obs.instruction_id;
        }
        slot.fresh = true;
    }
}

/// An observation captured at `capture_ns` may be used at `now_ns`: no older than
/// `max_age_ns`, and not from the future. Both are CLOCK_MONOTONIC of this machine, so a
/// capture time ahead of now is a writer's error or a forgery, and it would otherwise read
/// as age 0 and pass for fresh however old the frame is.
fn fresh(now_ns: u64, capture_ns: u64, max_age_ns: u64) -> bool {
    capture_ns <= now_ns && now_ns - capture_ns <= max_age_ns
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
