//! What to publish at each tick, given the current chunk: pure logic, no clocks or I/O.
//!
//! Step k of a chunk is meant for `capture + k * dt` of the observation it came from
//! (`dt` the publish period, or the slower chunk time base), counted in whole ticks of
//! the publisher's grid (its deadlines, not its wake-ups). When a chunk lands, the
//! steps whose time has passed by that inference's measured latency are skipped; in
//! `crossfade` mode the steps it shares with the chunk in play are blended first. After
//! that the position advances by `period / dt` chunk steps per tick (one, unless on the
//! slower time base, where it interpolates between steps). When the chunk runs out the
//! last real action is held (never zeros), and a chunk older than the staleness limit, a
//! chunk holding NaN/Inf or a silent robot publishes `hold`. Everything is preallocated
//! at start.

use crate::limits::Limits;
use crate::plan::{crossfade_weight, sample_row, MergeMode, TickGrid};
use vla_ring::{Action, ActionStatus};

/// A chunk as handed over by the inference thread.
#[derive(Clone, Debug, Default)]
pub struct Chunk {
    /// The loop's id of the chunk (1, 2, ...); 0: no chunk.
    pub id: u64,
    /// Seq of the observation it was computed from (copied into every action's
    /// `source_obs_seq`).
    pub source_obs_seq: u64,
    /// CLOCK_MONOTONIC ns when that observation was captured: step k is meant for
    /// `capture_ns + k * chunk period`.
    pub capture_ns: u64,
    /// CLOCK_MONOTONIC ns when the inference finished.
    pub done_ns: u64,
    /// `steps x action_dims`.
    pub actions: Vec<f32>,
}

/// Why the last tick published what it did (for counters and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A chunk step, fresh.
    Step(u32),
    /// The chunk ran out: last real action, still `ok` within the grace period.
    HoldLast,
    /// `hold`: no chunk yet, chunk stale, grace over, robot silent, or a reload.
    Hold,
    /// `fault`: inference keeps failing.
    Fault,
}

/// What the publisher sends at each tick: the chunk in play, its position on the tick grid,
/// merging, staleness and the hold rules. Pure logic on preallocated buffers: a tick never
/// allocates.
pub struct Scheduler {
    limits: Limits,
    steps: usize,
    dims: usize,
    chunk: Chunk,
    /// The chunk in play before a crossfade rewrites `chunk`.
    previous: Vec<f32>,
    row: Vec<f32>,
    have_chunk: bool,
    /// Position of the next tick within `chunk`, in chunk steps.
    pos: f64,
    /// Chunk steps per publish tick: `period / chunk_period` (1 without the time base).
    advance: f64,
    last_values: Vec<f32>,
    last_source_seq: u64,
    last_chunk_id: u64,
    /// When the robot was last seen silent: a chunk from an observation captured before
    /// that describes a world that may have changed meanwhile, so it is never resumed.
    robot_lost_ns: u64,
    /// Chunks refused because they held NaN/Inf.
    pub non_finite_refused: u64,
    /// Dims never interpolated or blended (see [`Scheduler::set_discrete`]).
    discrete: Vec<bool>,
    /// The tick the chunk in play landed on (synchronous execution counts from it).
    landed_ns: u64,
}

impl Scheduler {
    /// A scheduler for chunks of `steps x dims`, with every buffer allocated here.
    pub fn new(limits: Limits, steps: usize, dims: usize) -> Self {
        let chunk_period = limits.chunk_period_ns.max(limits.period_ns).max(1);
        Self {
            limits,
            steps,
            dims,
            chunk: Chunk {
                actions: vec![0.0; steps * dims],
                ..Chunk::default()
            },
            previous: vec![0.0; steps * dims],
            row: vec![0.0; dims],
            have_chunk: false,
            pos: 0.0,
            advance: limits.period_ns as f64 / chunk_period as f64,
            last_values: vec![0.0; dims],
            last_source_seq: 0,
            last_chunk_id: 0,
            robot_lost_ns: 0,
            non_finite_refused: 0,
            discrete: vec![false; dims],
            landed_ns: 0,
        }
    }

    /// Rows a chunk plays under synchronous execution (`None`: real time).
    fn synchronous_rows(&self) -> Option<usize> {
        self.limits
            .synchronous_rows()
            .map(|n| n.clamp(1, self.steps))
    }

    /// Marks the dims whose values are discrete commands (a binarized gripper): they are
    /// never interpolated between steps nor blended at a seam, only switched.
    pub fn set_discrete(&mut self, mask: &[bool]) {
        for (d, &m) in self.discrete.iter_mut().zip(mask) {
            *d = m;
        }
    }

    fn chunk_period(&self) -> u64 {
        self.limits
            .chunk_period_ns
            .max(self.limits.period_ns)
            .max(1)
    }

    /// When the chunk in play runs out (the time of its last step to publish: under
    /// synchronous execution the last executed row, counted from its landing); 0 when
    /// none is.
    pub fn end_ns(&self) -> u64 {
        if !self.have_chunk {
            return 0;
        }
        match self.synchronous_rows() {
            Some(n) => self.landed_ns + (n as u64 - 1) * self.chunk_period(),
            None => self.chunk.capture_ns + (self.steps as u64 - 1) * self.chunk_period(),
        }
    }

    /// Id of the chunk in play; 0 when none is.
    pub fn chunk_id(&self) -> u64 {
        if self.have_chunk {
            self.chunk.id
        } else {
            0
        }
    }

    /// The publisher missed `n` ticks (an overrun): their steps are gone, the position
    /// moves on so that every step keeps its time. Under synchronous execution the rows
    /// are delayed instead, never dropped: upstream's protocol executes every one of them,
    /// and a robot in lockstep (a simulator slower than real time) steps once per row.
    pub fn skip_ticks(&mut self, n: u64) {
        if self.synchronous_rows().is_some() {
            if self.have_chunk {
                self.landed_ns += n * self.chunk_period();
            }
            return;
        }
        self.pos += n as f64 * self.advance;
    }

    /// Takes a new chunk at the tick `now_ns` (its deadline on the publisher's grid);
    /// returns how many steps were skipped. A chunk
    /// whose observation predates the robot's last silence is refused (the next one,
    /// from a fresh observation, lands instead), and so is one holding NaN/Inf.
    pub fn land(&mut self, chunk: &Chunk, now_ns: u64) -> u64 {
        if self.robot_lost_ns != 0 && chunk.capture_ns <= self.robot_lost_ns {
            self.have_chunk = false;
            return 0;
        }
        if chunk.actions.iter().any(|v| !v.is_finite()) {
            self.non_finite_refused += 1;
            self.have_chunk = false;
            return 0;
        }
        if self.synchronous_rows().is_some() {
            // Upstream's protocol: the chunk's first row now, whatever its latency.
            self.chunk.id = chunk.id;
            self.chunk.source_obs_seq = chunk.source_obs_seq;
            self.chunk.capture_ns = chunk.capture_ns;
            self.chunk.done_ns = chunk.done_ns;
            self.chunk.actions.copy_from_slice(&chunk.actions);
            self.have_chunk = true;
            self.pos = 0.0;
            self.landed_ns = now_ns;
            return 0;
        }
        let grid = TickGrid {
            origin_ns: now_ns,
            period_ns: self.limits.period_ns,
            step_ns: self.chunk_period(),
        };
        // Whole ticks since the capture, in chunk steps: the same count a tick-by-tick
        // advance reaches. Negative when the chunk is newer than this tick's deadline
        // (ready between it and a late wake-up): it plays row 0 until the grid gets there,
        // so it stays where the inference thread's prefixes expect it.
        let pos = grid.position(chunk.capture_ns, now_ns);
        let blend = self.limits.merge == MergeMode::Crossfade
            && self.have_chunk
            && chunk.capture_ns >= self.chunk.capture_ns
            && now_ns.saturating_sub(self.chunk.capture_ns) <= self.limits.max_chunk_age_ns;
        // The old chunk's position at the new one's step 0, counted in whole ticks as the
        // publisher advances both: the blend then starts from the old value of this tick.
        let offset = grid.offset_steps(self.chunk.capture_ns, chunk.capture_ns);
        if blend {
            self.previous.copy_from_slice(&self.chunk.actions);
        }
        self.chunk.id = chunk.id;
        self.chunk.source_obs_seq = chunk.source_obs_seq;
        self.chunk.capture_ns = chunk.capture_ns;
        self.chunk.done_ns = chunk.done_ns;
        self.chunk.actions.copy_from_slice(&chunk.actions);
        if blend {
            // New step j is the old chunk's position j + offset: blend the steps both
            // have, from the first one still to be published.
            let last_old = (self.steps - 1) as f64;
            // On a slower time base `pos` can fall between rows: the first sample
            // published interpolates rows floor(pos) and floor(pos) + 1, so the blend
            // starts at floor(pos), not one row late.
            let first = pos.max(0.0).floor() as usize;
            let n = (first..self.steps)
                .take_while(|&j| j as f64 + offset <= last_old)
                .count();
            for k in 0..n {
                let j = first + k;
                let w = crossfade_weight(k, n);
                sample_row(
                    &self.previous,
                    self.dims,
                    j as f64 + offset,
                    &self.discrete,
                    &mut self.row,
                );
                let new = &mut self.chunk.actions[j * self.dims..(j + 1) * self.dims];
                for ((v, &old), &discrete) in new.iter_mut().zip(&self.row).zip(&self.discrete) {
                    *v = if discrete {
                        // Open or close, never half: the new command from mid-ramp on.
                        if w >= 0.5 {
                            *v
                        } else {
                            old
                        }
                    } else {
                        old + (*v - old) * w
                    };
                }
            }
        }
        self.have_chunk = true;
        self.pos = pos;
        pos.max(0.0).floor() as u64
    }

    /// Drops the current chunk (inference failed, bundle reloading, robot gone).
    pub fn drop_chunk(&mut self) {
        self.have_chunk = false;
    }

    /// Fills `out` with what to publish at `now_ns`. `robot_alive` is false when the
    /// observation writer stopped beating; `fault` when inference keeps failing.
    pub fn tick(
        &mut self,
        now_ns: u64,
        robot_alive: bool,
        fault: bool,
        out: &mut Action,
    ) -> Decision {
        let l = self.limits;
        out.made_time_ns = now_ns;
        out.values.copy_from_slice(&self.last_values);
        out.source_obs_seq = self.last_source_seq;
        out.chunk_id = self.last_chunk_id;
        out.step_index = 0;
        let hold = |out: &mut Action, status: ActionStatus| {
            out.status = status;
            out.valid_until_ns = now_ns;
        };
        if fault {
            self.have_chunk = false;
            hold(out, ActionStatus::Fault);
            return Decision::Fault;
        }
        if !robot_alive {
            // Fail closed and forget the plan: after the robot comes back only a chunk
            // from a new observation may drive it.
            self.have_chunk = false;
            self.robot_lost_ns = now_ns;
        }
        if !robot_alive
            || !self.have_chunk
            || now_ns.saturating_sub(self.chunk.capture_ns) > l.max_chunk_age_ns
        {
            hold(out, ActionStatus::Hold);
            return Decision::Hold;
        }
        if self
            .synchronous_rows()
            .is_some_and(|n| self.pos.floor() as usize >= n)
        {
            // The executed rows are done: hold (the last one's values) until the next
            // chunk, as the eval's robot waits for its inference.
            hold(out, ActionStatus::Hold);
            return Decision::Hold;
        }
        let pos = self.pos;
        self.pos += self.advance;
        let step = pos.floor() as usize;
        if step < self.steps {
            sample_row(
                &self.chunk.actions,
                self.dims,
                pos,
                &self.discrete,
                &mut self.last_values,
            );
            self.last_source_seq = self.chunk.source_obs_seq;
            self.last_chunk_id = self.chunk.id;
            out.values.copy_from_slice(&self.last_values);
            out.source_obs_seq = self.chunk.source_obs_seq;
            out.chunk_id = self.chunk.id;
            out.step_index = step as u32;
            out.status = ActionStatus::Ok;
            out.valid_until_ns = now_ns + l.action_valid_ns;
            return Decision::Step(step as u32);
        }
        // Chunk exhausted (or landed with every step already past): hold its last real
        // action, `ok` until the grace period after the chunk's end, then `hold`.
        let s = self.steps - 1;
        self.last_values
            .copy_from_slice(&self.chunk.actions[s * self.dims..]);
        self.last_source_seq = self.chunk.source_obs_seq;
        self.last_chunk_id = self.chunk.id;
        out.values.copy_from_slice(&self.last_values);
        out.source_obs_seq = self.chunk.source_obs_seq;
        out.chunk_id = self.chunk.id;
        out.step_index = s as u32;
        let grace_end = self.chunk.capture_ns
            + self.steps as u64 * self.chunk_period()
            + l.hold_after_chunk_end_ns;
        if now_ns < grace_end {
            out.status = ActionStatus::Ok;
            out.valid_until_ns = (now_ns + l.action_valid_ns).min(grace_end);
            Decision::HoldLast
        } else {
            hold(out, ActionStatus::Hold);
            Decision::Hold
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Trigger;
    use vla_ring::Geometry;

    const MS: u64 = 1_000_000;

    fn setup() -> (Scheduler, Action) {
        setup_with(MergeMode::Skip, 100 * MS)
    }

    fn setup_with(merge: MergeMode, chunk_period_ns: u64) -> (Scheduler, Action) {
        let limits = Limits {
            period_ns: 100 * MS,
            chunk_period_ns,
            max_chunk_age_ns: 2000 * MS,
            hold_after_chunk_end_ns: 150 * MS,
            action_valid_ns: 100 * MS,
            merge,
            horizon: 5,
            trigger: Trigger::BackToBack,
            max_observation_age_ns: 0,
        };
        let g = Geometry {
            cameras: 0,
            height: 0,
            width: 0,
            channels: 3,
            state_dims: 0,
            action_dims: 2,
            chunk_len: 5,
        };
        (Scheduler::new(limits, 5, 2), Action::for_geometry(&g))
    }

    fn chunk(id: u64, capture_ms: u64) -> Chunk {
        Chunk {
            id,
            source_obs_seq: id * 10,
            capture_ns: capture_ms * MS,
            done_ns: 0,
            actions: (0..10).map(|i| (id * 100 + i) as f32).collect(),
        }
    }

    #[test]
    fn holds_before_the_first_chunk() {
        let (mut s, mut a) = setup();
        assert_eq!(s.tick(0, true, false, &mut a), Decision::Hold);
        assert_eq!(a.status, ActionStatus::Hold);
        assert!(!a.applicable_at(0));
    }

    #[test]
    fn skips_the_steps_elapsed_by_the_measured_latency_then_one_per_tick() {
        let (mut s, mut a) = setup();
        // Observation captured at 1000 ms, chunk lands at 1250 ms: steps 0 and 1 are past.
        assert_eq!(s.land(&chunk(1, 1000), 1250 * MS), 2);
        assert_eq!(s.tick(1250 * MS, true, false, &mut a), Decision::Step(2));
        assert_eq!(a.values, vec![104.0, 105.0]);
        assert_eq!((a.source_obs_seq, a.chunk_id, a.step_index), (10, 1, 2));
        assert_eq!(a.valid_until_ns, 1350 * MS);
        assert!(a.applicable_at(1300 * MS) && !a.applicable_at(1350 * MS));
        assert_eq!(s.tick(1350 * MS, true, false, &mut a), Decision::Step(3));
        assert_eq!(s.tick(1450 * MS, true, false, &mut a), Decision::Step(4));
        assert_eq!(a.values, vec![108.0, 109.0]);
    }

    #[test]
    fn synchronous_execution_starts_at_row_0_plays_its_rows_then_holds() {
        let (mut s, mut a) = setup();
        s.limits.trigger = Trigger::Synchronous { execute_steps: 3 };
        // Captured at 1000 ms, landed at 1250 ms: no row skipped, row 0 now.
        assert_eq!(s.land(&chunk(1, 1000), 1250 * MS), 0);
        assert_eq!(s.end_ns(), 1450 * MS, "the third row's tick");
        for (k, t) in [1250, 1350, 1450].into_iter().enumerate() {
            assert_eq!(
                s.tick(t * MS, true, false, &mut a),
                Decision::Step(k as u32)
            );
            assert_eq!(a.status, ActionStatus::Ok);
        }
        assert_eq!(a.values, vec![104.0, 105.0]);
        // Rows 3 and 4 are not played: hold with the last executed values, no grace.
        assert_eq!(s.tick(1550 * MS, true, false, &mut a), Decision::Hold);
        assert_eq!(
            (a.status, a.values.clone()),
            (ActionStatus::Hold, vec![104.0, 105.0])
        );
        assert_eq!(s.tick(1650 * MS, true, false, &mut a), Decision::Hold);
        // The next chunk starts at its first row too.
        assert_eq!(s.land(&chunk(2, 1560), 1950 * MS), 0);
        assert_eq!(s.tick(1950 * MS, true, false, &mut a), Decision::Step(0));
        assert_eq!(a.values, vec![200.0, 201.0]);
        // The age limit still refuses: 2 s after the capture.
        assert_eq!(s.tick(3600 * MS, true, false, &mut a), Decision::Hold);
    }

    #[test]
    fn missed_ticks_drop_their_steps_and_the_rest_keep_their_times() {
        let (mut s, mut a) = setup();
        s.land(&chunk(1, 1000), 1000 * MS);
        assert_eq!(s.tick(1000 * MS, true, false, &mut a), Decision::Step(0));
        // The ticks at 1100 and 1200 ms were missed: at 1300 ms it is step 3's time.
        s.skip_ticks(2);
        assert_eq!(s.tick(1300 * MS, true, false, &mut a), Decision::Step(3));
    }

    #[test]
    fn synchronous_execution_delays_the_rows_of_missed_ticks_instead_of_dropping_them() {
        let (mut s, mut a) = setup();
        s.limits.trigger = Trigger::Synchronous { execute_steps: 3 };
        s.land(&chunk(1, 1000), 1250 * MS);
        assert_eq!(s.tick(1250 * MS, true, false, &mut a), Decision::Step(0));
        // The ticks at 1350 and 1450 ms were missed: row 1 comes at 1550 ms, and the
        // executed rows end two ticks later than planned.
        s.skip_ticks(2);
        assert_eq!(s.end_ns(), 1650 * MS);
        assert_eq!(s.tick(1550 * MS, true, false, &mut a), Decision::Step(1));
        assert_eq!(s.tick(1650 * MS, true, false, &mut a), Decision::Step(2));
        assert_eq!(s.tick(1750 * MS, true, false, &mut a), Decision::Hold);
    }

    #[test]
    fn a_chunk_newer_than_its_landing_deadline_stays_on_the_grid() {
        let (mut s, mut a) = setup();
        // Captured at 1150 ms, landed by the tick due at 1100 ms that woke late: row 0
        // at 1100 and at 1200 (50 ms after the capture), row 1 at 1300.
        assert_eq!(s.land(&chunk(1, 1150), 1100 * MS), 0);
        assert_eq!(s.tick(1180 * MS, true, false, &mut a), Decision::Step(0));
        assert_eq!(s.tick(1200 * MS, true, false, &mut a), Decision::Step(0));
        assert_eq!(s.tick(1300 * MS, true, false, &mut a), Decision::Step(1));
    }

    #[test]
    fn a_prefix_aligned_on_the_grid_continues_exactly_what_the_old_chunk_publishes() {
        use crate::plan::build_prefix;
        let (mut s, mut a) = setup_with(MergeMode::Prefix, 100 * MS);
        // Ticks at 1000 + 100 n ms; captures off the grid.
        let grid = TickGrid {
            origin_ns: 1000 * MS,
            period_ns: 100 * MS,
            step_ns: 100 * MS,
        };
        let old = chunk(1, 1030);
        s.land(&old, 1100 * MS);
        // A new observation at 1170 ms, ready 160 ms later (1330 ms): lands at 1400 ms.
        let (capture, latency) = (1170 * MS, 160 * MS);
        let offset = grid.offset_steps(old.capture_ns, capture);
        let frozen = grid.frozen_rows(capture, latency);
        let mut prefix = vec![0.0f32; 10];
        let (frozen, _) = build_prefix(&old.actions, 2, &[], offset, frozen, &mut prefix).unwrap();
        // What the old chunk alone would publish at 1100..=1400 ms.
        let mut alone = Scheduler::new(s.limits, 5, 2);
        alone.land(&old, 1100 * MS);
        let mut expected = Vec::new();
        for t in (1100..=1400).step_by(100) {
            alone.tick(t * MS, true, false, &mut a);
            expected.push(a.values.clone());
        }
        // The engine keeps the frozen rows; the rest is whatever it computed.
        let mut new = chunk(2, 1170);
        new.actions[..frozen * 2].copy_from_slice(&prefix[..frozen * 2]);
        for t in (1100..1400).step_by(100) {
            s.tick(t * MS, true, false, &mut a);
        }
        s.land(&new, 1400 * MS);
        assert_eq!(s.tick(1400 * MS, true, false, &mut a), Decision::Step(2));
        assert_eq!(
            a.values, expected[3],
            "the landing tick publishes the old chunk's value for that tick"
        );
    }

    #[test]
    fn runs_out_into_the_last_real_action_then_hold_never_zeros() {
        let (mut s, mut a) = setup();
        s.land(&chunk(2, 1000), 1000 * MS);
        for t in 0..5 {
            assert_eq!(
                s.tick((1000 + 100 * t) * MS, true, false, &mut a),
                Decision::Step(t as u32)
            );
        }
        // Chunk ends at 1500 ms; grace 150 ms.
        assert_eq!(s.tick(1500 * MS, true, false, &mut a), Decision::HoldLast);
        assert_eq!(
            (a.status, a.values.clone()),
            (ActionStatus::Ok, vec![208.0, 209.0])
        );
        assert!(a.valid_until_ns <= 1650 * MS);
        assert_eq!(s.tick(1700 * MS, true, false, &mut a), Decision::Hold);
        assert_eq!(
            a.values,
            vec![208.0, 209.0],
            "hold carries the last real action, not zeros"
        );
        assert_eq!(a.status, ActionStatus::Hold);
    }

    #[test]
    fn a_chunk_landing_entirely_in_the_past_holds_the_previous_action() {
        let (mut s, mut a) = setup();
        s.land(&chunk(1, 0), 0);
        assert_eq!(s.tick(0, true, false, &mut a), Decision::Step(0));
        // Captured at 1000 ms but lands at 1600 ms: all 5 steps already elapsed.
        assert_eq!(s.land(&chunk(3, 1000), 1600 * MS), 6);
        let d = s.tick(1600 * MS, true, false, &mut a);
        assert_eq!(
            d,
            Decision::HoldLast,
            "within the grace after the chunk's end (1650 ms)"
        );
        assert_eq!(
            a.values,
            vec![308.0, 309.0],
            "the newest chunk's last real action"
        );
        assert_eq!(s.tick(1700 * MS, true, false, &mut a), Decision::Hold);
    }

    #[test]
    fn a_silent_robot_drops_the_plan_and_old_chunks_never_resume() {
        let (mut s, mut a) = setup();
        s.land(&chunk(1, 1000), 1000 * MS);
        assert_eq!(s.tick(1000 * MS, true, false, &mut a), Decision::Step(0));
        assert_eq!(
            s.tick(1100 * MS, false, false, &mut a),
            Decision::Hold,
            "robot silent"
        );
        // The robot is back: the old chunk does not resume.
        assert_eq!(s.tick(1200 * MS, true, false, &mut a), Decision::Hold);
        // A chunk from an observation captured before the silence is refused...
        assert_eq!(s.land(&chunk(2, 1050), 1250 * MS), 0);
        assert_eq!(s.tick(1300 * MS, true, false, &mut a), Decision::Hold);
        // ...one from after it lands.
        s.land(&chunk(3, 1250), 1300 * MS);
        assert!(matches!(
            s.tick(1300 * MS, true, false, &mut a),
            Decision::Step(_)
        ));
        assert_eq!(a.source_obs_seq, 30);
    }

    #[test]
    fn stale_chunk_dead_robot_and_faults_fail_closed() {
        let (mut s, mut a) = setup();
        s.land(&chunk(4, 1000), 1000 * MS);
        assert_eq!(
            s.tick(1000 * MS, false, false, &mut a),
            Decision::Hold,
            "robot silent"
        );
        assert_eq!(
            s.tick(3100 * MS, true, false, &mut a),
            Decision::Hold,
            "observation too old"
        );
        s.land(&chunk(5, 4000), 4000 * MS);
        assert_eq!(s.tick(4000 * MS, true, true, &mut a), Decision::Fault);
        assert_eq!(a.status, ActionStatus::Fault);
        assert_eq!(
            s.tick(4100 * MS, true, false, &mut a),
            Decision::Hold,
            "a fault drops the chunk"
        );
    }

    const MODES: [MergeMode; 4] = [
        MergeMode::Skip,
        MergeMode::Crossfade,
        MergeMode::Prefix,
        MergeMode::Inpaint,
    ];

    #[test]
    fn crossfade_blends_the_shared_steps_with_a_ramp_and_keeps_the_rest() {
        let (mut s, mut a) = setup_with(MergeMode::Crossfade, 100 * MS);
        // Old chunk: captured at 1000 ms, values 100.. (dim 0: 100, 102, 104, 106, 108).
        s.land(&chunk(1, 1000), 1000 * MS);
        assert_eq!(s.tick(1000 * MS, true, false, &mut a), Decision::Step(0));
        assert_eq!(s.tick(1100 * MS, true, false, &mut a), Decision::Step(1));
        // New chunk captured at 1100 ms (offset 1 step), lands at 1200 ms: step 1 is next.
        // New step j is old step j + 1; shared: new steps 1..=3 (old 2..=4), n = 3.
        assert_eq!(s.land(&chunk(2, 1100), 1200 * MS), 1);
        let expected = |j: usize, w: f32| {
            let old = 100.0 + 2.0 * (j + 1) as f32;
            let new = 200.0 + 2.0 * j as f32;
            old + (new - old) * w
        };
        for (k, t) in [1200u64, 1300, 1400].into_iter().enumerate() {
            assert_eq!(
                s.tick(t * MS, true, false, &mut a),
                Decision::Step(k as u32 + 1)
            );
            let w = (k + 1) as f32 / 4.0;
            assert!(
                (a.values[0] - expected(k + 1, w)).abs() < 1e-4,
                "{:?}",
                a.values
            );
            assert_eq!(a.chunk_id, 2);
        }
        // Beyond the overlap: the new chunk as it is.
        assert_eq!(s.tick(1500 * MS, true, false, &mut a), Decision::Step(4));
        assert_eq!(a.values, vec![208.0, 209.0]);
    }

    #[test]
    fn crossfade_makes_a_smaller_seam_than_skip() {
        let jump = |mode| {
            let (mut s, mut a) = setup_with(mode, 100 * MS);
            s.land(&chunk(1, 1000), 1000 * MS);
            s.tick(1000 * MS, true, false, &mut a);
            s.tick(1100 * MS, true, false, &mut a);
            let before = a.values[0];
            s.land(&chunk(2, 1100), 1200 * MS);
            s.tick(1200 * MS, true, false, &mut a);
            (a.values[0] - before).abs()
        };
        let (skip, fade) = (jump(MergeMode::Skip), jump(MergeMode::Crossfade));
        assert!(fade < skip, "crossfade seam {fade} vs skip {skip}");
    }

    #[test]
    fn crossfade_on_a_slower_time_base_blends_from_the_row_being_sampled() {
        // Chunk steps every 400 ms, published every 100 ms. Old chunk 1 (dim 0: 100, 102,
        // ...) captured at 1000 ms; new chunk 2 (200, 202, ...) captured at 1200 ms (0.5
        // steps later) lands at 1500 ms, at position 0.75: between new rows 0 and 1.
        let (mut s, mut a) = setup_with(MergeMode::Crossfade, 400 * MS);
        s.land(&chunk(1, 1000), 1000 * MS);
        for t in 0..5u64 {
            s.tick((1000 + 100 * t) * MS, true, false, &mut a);
        }
        assert_eq!(a.values[0], 102.0);
        s.land(&chunk(2, 1200), 1500 * MS);
        s.tick(1500 * MS, true, false, &mut a);
        // Shared rows 0..=3 (old positions 0.5..=3.5), weights 1/5 .. 4/5: row 0 =
        // 101 + (200 - 101) / 5, row 1 = 103 + (202 - 103) * 2 / 5, sampled at 0.75.
        let (row0, row1) = (101.0 + 99.0 * 0.2, 103.0 + 99.0 * 0.4);
        let want = row0 * 0.25 + row1 * 0.75;
        assert!(
            (a.values[0] - want).abs() < 1e-3,
            "{} vs {want}",
            a.values[0]
        );
    }

    #[test]
    fn a_discrete_dim_is_switched_never_interpolated_or_blended() {
        // Dim 1 is a binarized gripper: -1 in the old chunk, +1 in the new one.
        let gripper = |id: u64, g: f32| Chunk {
            actions: (0..10)
                .map(|i| if i % 2 == 1 { g } else { (id * 100 + i) as f32 })
                .collect(),
            ..chunk(id, 1000)
        };
        // Slower time base (a quarter step per tick): dim 0 interpolates, dim 1 must not.
        let (mut s, mut a) = setup_with(MergeMode::Crossfade, 400 * MS);
        s.set_discrete(&[false, true]);
        let mut old = gripper(1, -1.0);
        old.actions[3] = 1.0; // step 1 closes
        s.land(&old, 1000 * MS);
        let mut g = vec![];
        for t in 0..6u64 {
            s.tick((1000 + 100 * t) * MS, true, false, &mut a);
            g.push(a.values[1]);
        }
        assert_eq!(
            g,
            vec![-1.0, -1.0, 1.0, 1.0, 1.0, 1.0],
            "nearest step, no -0.5/0/0.5"
        );
        // A crossfade seam: the gripper switches to the new chunk's command, never halfway.
        let mut new = gripper(2, 1.0);
        new.capture_ns = 1200 * MS;
        s.land(&new, 1500 * MS);
        for t in 0..12u64 {
            s.tick((1500 + 100 * t) * MS, true, false, &mut a);
            assert!(a.values[1] == -1.0 || a.values[1] == 1.0, "{:?}", a.values);
        }
        // Without the mark the same seam publishes values between the two commands.
        let (mut s, mut a) = setup_with(MergeMode::Crossfade, 400 * MS);
        s.land(&gripper(1, -1.0), 1000 * MS);
        s.tick(1000 * MS, true, false, &mut a);
        let mut new = gripper(2, 1.0);
        new.capture_ns = 1200 * MS;
        s.land(&new, 1500 * MS);
        s.tick(1500 * MS, true, false, &mut a);
        assert!(a.values[1] > -1.0 && a.values[1] < 1.0, "{:?}", a.values);
    }

    #[test]
    fn the_slower_time_base_interpolates_between_chunk_steps() {
        // Chunk steps every 400 ms, published every 100 ms: a quarter step per tick.
        let (mut s, mut a) = setup_with(MergeMode::Skip, 400 * MS);
        assert_eq!(s.land(&chunk(1, 1000), 1000 * MS), 0);
        let mut seen = vec![];
        for t in 0..6u64 {
            assert!(matches!(
                s.tick((1000 + 100 * t) * MS, true, false, &mut a),
                Decision::Step(_)
            ));
            seen.push(a.values[0]);
        }
        assert_eq!(seen, vec![100.0, 100.5, 101.0, 101.5, 102.0, 102.5]);
        // Landing 1 s after capture: 10 ticks = 2.5 steps consumed.
        assert_eq!(s.land(&chunk(2, 2000), 3000 * MS), 2);
        s.tick(3000 * MS, true, false, &mut a);
        assert_eq!(a.values[0], 205.0);
        // The chunk lasts 5 steps of 400 ms: its end is the last step's time.
        assert_eq!(s.end_ns(), 2000 * MS + 4 * 400 * MS);
    }

    #[test]
    fn every_mode_fails_closed_and_never_publishes_non_finite() {
        for mode in MODES {
            let (mut s, mut a) = setup_with(mode, 100 * MS);
            s.land(&chunk(1, 1000), 1000 * MS);
            assert!(matches!(
                s.tick(1000 * MS, true, false, &mut a),
                Decision::Step(0)
            ));
            // A chunk holding NaN is refused: hold, the last finite action, never NaN.
            let mut bad = chunk(2, 1050);
            bad.actions[3] = f32::NAN;
            assert_eq!(s.land(&bad, 1100 * MS), 0);
            assert_eq!(s.non_finite_refused, 1);
            assert_eq!(
                s.tick(1100 * MS, true, false, &mut a),
                Decision::Hold,
                "{mode:?}"
            );
            assert!(a.values.iter().all(|v| v.is_finite()), "{mode:?}");
            assert_eq!(a.values, vec![100.0, 101.0], "{mode:?}");
            // Stale chunk.
            s.land(&chunk(3, 1200), 1200 * MS);
            assert_eq!(
                s.tick(3300 * MS, true, false, &mut a),
                Decision::Hold,
                "{mode:?}"
            );
            // Silent robot, then an old chunk never resumes.
            s.land(&chunk(4, 3300), 3300 * MS);
            assert_eq!(
                s.tick(3400 * MS, false, false, &mut a),
                Decision::Hold,
                "{mode:?}"
            );
            assert_eq!(s.land(&chunk(5, 3350), 3500 * MS), 0);
            assert_eq!(
                s.tick(3500 * MS, true, false, &mut a),
                Decision::Hold,
                "{mode:?}"
            );
            // Reload / failed inference: the chunk is dropped.
            s.land(&chunk(6, 3600), 3600 * MS);
            s.drop_chunk();
            assert_eq!(
                s.tick(3600 * MS, true, false, &mut a),
                Decision::Hold,
                "{mode:?}"
            );
            assert_eq!(s.end_ns(), 0);
            // Repeated failures: fault.
            s.land(&chunk(7, 3700), 3700 * MS);
            assert_eq!(
                s.tick(3700 * MS, true, true, &mut a),
                Decision::Fault,
                "{mode:?}"
            );
            assert_eq!(a.status, ActionStatus::Fault);
        }
    }
}
