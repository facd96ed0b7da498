//! The publisher thread: wakes on absolute `clock_nanosleep` deadlines (SCHED_FIFO when
//! allowed) and publishes one action per tick to the action ring, skipping missed ticks
//! (counted), never allocating, never blocking on a lock: the chunk hand-over is a
//! `try_lock` that simply waits for the next tick when contended.

use crate::rt::{pin_current_thread, prefault_stack, set_fifo_priority};
use crate::scheduler::{Chunk, Decision, Scheduler};
use crate::stats::{Health, Histogram};
use crate::tap::{Tap, TickEvent};
use crate::{block_signals, sleep_until, Event, Histograms, LoopSettings, Shared};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use vla_ring::{monotonic_ns, Action, RingWriter};

/// The thread's body: set-up, one tick per period until the loop stops, then one last
/// `hold`.
pub(crate) fn run(
    settings: LoopSettings,
    writer: RingWriter<Action>,
    shared: Shared,
    robot_heartbeat: Arc<AtomicU64>,
    tap: Option<Arc<dyn Tap>>,
    discrete: Vec<bool>,
) -> Histograms {
    block_signals();
    pin_current_thread("publisher", &settings.publisher_cpus);
    set_fifo_priority("publisher", settings.publisher_priority);
    prefault_stack();
    let mut publisher = Publisher::new(&settings, writer, shared, robot_heartbeat, tap);
    publisher.scheduler.set_discrete(&discrete);
    loop {
        let missed = publisher.wait_for_tick();
        if publisher.shared.stop.load(Ordering::Acquire) {
            break;
        }
        publisher.take_posted();
        publisher.publish(missed);
    }
    publisher.finish()
}

/// The publisher's state, all of it allocated before the first tick.
struct Publisher {
    shared: Shared,
    writer: RingWriter<Action>,
    robot_heartbeat: Arc<AtomicU64>,
    tap: Option<Arc<dyn Tap>>,
    scheduler: Scheduler,
    action: Action,
    /// The chunk copied out of the mailbox, landed from here.
    landed: Chunk,
    histograms: Histograms,
    fault: bool,
    capture_of_current: u64,
    /// The instruction the chunk in play was computed for.
    instruction_in_play: u32,
    period_ns: u64,
    heartbeat_timeout_ns: u64,
    /// The next tick's deadline.
    next: u64,
    /// When the current tick woke up.
    now: u64,
}

impl Publisher {
    fn new(
        settings: &LoopSettings,
        writer: RingWriter<Action>,
        shared: Shared,
        robot_heartbeat: Arc<AtomicU64>,
        tap: Option<Arc<dyn Tap>>,
    ) -> Self {
        let geometry = settings.geometry;
        let period_ns = settings.limits.period_ns;
        let limits = settings.limits;
        let steps = geometry.chunk_len as usize;
        let dims = geometry.action_dims as usize;
        // On the grid the inference thread plans prefixes with; a late thread start joins
        // it at its next tick rather than counting the ticks before it as missed.
        let next = shared.grid.next_tick(monotonic_ns());
        Self {
            writer,
            robot_heartbeat,
            tap,
            scheduler: Scheduler::new(limits, steps, dims),
            action: Action::for_geometry(&geometry),
            landed: Chunk {
                actions: vec![0.0; steps * dims],
                ..Chunk::default()
            },
            histograms: Histograms {
                jitter: Histogram::default(),
                freshness: Histogram::default(),
            },
            fault: false,
            capture_of_current: 0,
            instruction_in_play: 0,
            period_ns,
            heartbeat_timeout_ns: settings.writer_heartbeat_timeout.as_nanos() as u64,
            next,
            now: 0,
            shared,
        }
    }

    /// Sleeps until the next deadline; returns how many ticks before it were missed (an
    /// overrun: their deadlines had passed, their steps are gone, not delayed).
    fn wait_for_tick(&mut self) -> u64 {
        sleep_until(self.next);
        self.now = monotonic_ns();
        let late = self.now.saturating_sub(self.next);
        self.histograms.jitter.record(late);
        Health::set(&self.shared.health.last_jitter_ns, late);
        if late < self.period_ns {
            return 0;
        }
        let missed = late / self.period_ns;
        self.next += missed * self.period_ns;
        self.shared
            .health
            .missed_ticks
            .fetch_add(missed, Ordering::Relaxed);
        // Steps stay on their times: the missed ticks' steps are gone, not delayed.
        self.scheduler.skip_ticks(missed);
        missed
    }

    /// Takes what the inference thread posted, if the mailbox is free and holds something
    /// new, and lands it (or drops the chunk in play).
    fn take_posted(&mut self) {
        let Ok(mut posted) = self.shared.mailbox.try_lock() else {
            return;
        };
        if !posted.fresh {
            return;
        }
        posted.fresh = false;
        let health = &self.shared.health;
        let event = match (posted.event, health.robot_instruction()) {
            // Computed for an instruction the robot has left while it ran: never played.
            (Event::Chunk, Some(robot)) if robot != posted.instruction_id => {
                Health::bump(&health.instruction_switch_drops);
                Event::Drop
            }
            (event, _) => event,
        };
        match event {
            Event::Chunk => {
                self.instruction_in_play = posted.instruction_id;
                self.landed.id = posted.chunk.id;
                self.landed.source_obs_seq = posted.chunk.source_obs_seq;
                self.landed.capture_ns = posted.chunk.capture_ns;
                self.landed.done_ns = posted.chunk.done_ns;
                self.landed.actions.copy_from_slice(&posted.chunk.actions);
                self.fault = false;
            }
            Event::Drop => {
                self.landed.id = 0;
                self.fault = false;
            }
            Event::Fault => {
                self.landed.id = 0;
                self.fault = true;
            }
        }
        if self.landed.id != 0 {
            // The tick's deadline, not the wake-up time: positions on the grid do not
            // depend on wake-up jitter (and match the inference thread's plan).
            let skipped = self.scheduler.land(&self.landed, self.next);
            self.capture_of_current = self.landed.capture_ns;
            health.skipped_steps.fetch_add(skipped, Ordering::Relaxed);
            Health::set(&health.non_finite_chunks, self.scheduler.non_finite_refused);
        } else {
            self.scheduler.drop_chunk();
        }
        // Still under the mailbox lock: the inference thread reads "taken" and "in play"
        // together (prefix mode continues the chunk in play), so it never sees the chunk
        // taken but not yet in play and falls back to no prefix.
        Health::set(&health.chunk_in_play, self.scheduler.chunk_id());
        drop(posted);
    }

    /// Decides and publishes this tick's action, and counts it.
    fn publish(&mut self, missed: u64) {
        let now = self.now;
        let health = &self.shared.health;
        let beat = self.robot_heartbeat.load(Ordering::Relaxed);
        let robot_alive = beat != 0 && now.saturating_sub(beat) <= self.heartbeat_timeout_ns;
        if self.scheduler.chunk_id() != 0
            && health
                .robot_instruction()
                .is_some_and(|robot| robot != self.instruction_in_play)
        {
            // The robot switched instructions: the old chunk stops at this tick; the
            // robot holds until the first chunk computed for the new one lands.
            self.scheduler.drop_chunk();
            Health::bump(&health.instruction_switch_drops);
        }
        let decision = self
            .scheduler
            .tick(now, robot_alive, self.fault, &mut self.action);
        match decision {
            Decision::Step(_) => {
                Health::bump(&health.published_ok);
                let age = now.saturating_sub(self.capture_of_current);
                self.histograms.freshness.record(age);
                Health::set(&health.last_freshness_ns, age);
            }
            Decision::HoldLast => Health::bump(&health.published_ok),
            Decision::Hold => Health::bump(&health.published_hold),
            Decision::Fault => Health::bump(&health.published_fault),
        }
        Health::set(&health.chunk_end_ns, self.scheduler.end_ns());
        Health::set(&health.chunk_in_play, self.scheduler.chunk_id());
        // The layout was fixed from the same geometry, so a publish cannot fail on length.
        let _ = self.writer.publish(&self.action);
        if let Some(tap) = &self.tap {
            tap.tick(&TickEvent {
                now_ns: now,
                decision,
                action: &self.action,
                robot_alive,
                missed,
            });
        }
        Health::bump(&health.ticks);
        Health::set(&health.last_tick_ns, now);
        self.next += self.period_ns;
    }

    /// Leaves the robot holding: one last `hold` with the last real action.
    fn finish(mut self) -> Histograms {
        let health = &self.shared.health;
        self.scheduler.drop_chunk();
        Health::set(&health.chunk_end_ns, 0);
        Health::set(&health.chunk_in_play, 0);
        self.scheduler
            .tick(monotonic_ns(), false, false, &mut self.action);
        let _ = self.writer.publish(&self.action);
        Health::bump(&health.published_hold);
        self.histograms
    }
}
