//! The robot simulator (`vlad simulate`): a robot stand-in for development, the demo and
//! the soak. It plays the firmware: writes observations (golden camera frames and state)
//! into the observation ring at camera rate and reads the action ring the way a firmware
//! would, then reports what it received: rate, status counts, how fresh the applied
//! actions were. It reads no configuration: [`Settings`] come from its caller.
//!
//! The robot moves: a point arm whose pose is the integral of the actions it applies.
//! Every applied `ok` action moves pose dim `i` by `action[i]` (a delta per control step,
//! as LIBERO's actions are), for every action dim but the last (the gripper, binary in
//! both policies); a `hold` or an expired action moves nothing. The pose is added to the
//! source observation's state (its first dims), so the policy sees the arm where it is.
//! Smoothness is measured on what is applied: the jump between consecutive applied
//! actions (Euclidean, gripper excluded) at a chunk seam (the chunk id changed) and
//! inside a chunk, next to the share of received actions that were `hold`/`fault`.
//! `--timeline FILE.csv` keeps every received action (time, status, chunk, step,
//! values) for `scripts/plot_timeline.py`.
//!
//! For the soak (`scripts/soak.sh`) it can also go silent on a schedule (`--gap-every`,
//! `--gap-length`: no observation and no heartbeat, like a stalled camera) and keep a
//! machine-readable report (`--json`) that it rewrites every second, so a simulator killed
//! with SIGKILL to play a firmware restart still leaves its figures behind. The JSON adds
//! the checks a soak needs: `ok` actions made while the robot was silent, `ok` windows
//! longer than `action_valid_ms`, `ok` actions that arrived already expired (and why),
//! the age of the action in force, and actions computed from a previous writer's
//! observations.

#![forbid(unsafe_code)]

mod error;
mod motion;

pub use error::SimError;
use motion::Motion;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vla_control::Histogram;
use vla_ring::{
    monotonic_ns, Action, ActionStatus, Geometry, Observation, Origin, RingReader, RingWriter,
};

/// What the simulator runs with: the robot link and the camera, resolved by its caller
/// (vlad reads them from its configuration and the bundle).
pub struct Settings {
    /// The rings' geometry (the bundle's).
    pub geometry: Geometry,
    /// The observation written at camera rate: its frames, its state (the arm's pose is
    /// added to the first dims), its seed (plus the number of observations written before)
    /// and its instruction.
    pub source: Observation,
    /// The observation ring this simulator writes (`rings.observation_path`).
    pub observation_ring: PathBuf,
    /// The action ring the daemon creates (`rings.action_path`).
    pub action_ring: PathBuf,
    /// `control.action_valid`: the longest window an `ok` action may have.
    pub action_valid: Duration,
    /// `control.writer_heartbeat_timeout`: how long a silence may last before every action
    /// made in it must not be `ok`.
    pub writer_heartbeat_timeout: Duration,
    /// Observations per second.
    pub camera_hz: f64,
    /// How long to run, in seconds.
    pub duration: f64,
    /// Scheduled silent periods.
    pub gaps: Gaps,
    /// The JSON report, rewritten every second and at the end.
    pub json: Option<PathBuf>,
    /// Every received action as CSV.
    pub timeline: Option<PathBuf>,
}

/// Slots of the capture-time table (by observation seq); far more than any chunk can lag.
const CAPTURE_SLOTS: usize = 4096;
/// An `ok` action whose window (`valid_until - made`) is shorter than this cannot outlive
/// the ring's delivery: the chunk tail's grace period clipped it.
const SHORT_WINDOW_NS: u64 = 2_000_000;
/// Poll interval of the firmware loop.
const POLL: Duration = Duration::from_micros(500);

/// Scheduled silent periods: the `k`-th (k >= 1) starts `k * every` after the start. No
/// observation and no heartbeat during one, like a stalled camera or firmware.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gaps {
    /// Time between the starts of two gaps; 0: no gaps.
    pub every_ns: u64,
    /// How long each gap lasts (shorter than `every_ns`).
    pub length_ns: u64,
}

impl Gaps {
    fn silent_at(&self, since_start_ns: u64) -> bool {
        self.every_ns > 0
            && since_start_ns >= self.every_ns
            && since_start_ns % self.every_ns < self.length_ns
    }
}

/// What a previous writer of the observation ring left behind (a firmware restart).
struct PreviousWriter {
    epoch: u64,
    last_beat_ns: u64,
    /// `(seq, capture_time_ns)` of the slots still in the ring.
    captures: Vec<(u64, u64)>,
}

fn previous_writer(path: &Path, geometry: Geometry) -> Option<PreviousWriter> {
    let r = RingReader::<Observation>::open(path, geometry).ok()?;
    let published = r.published();
    let slots = u64::from(r.layout().slot_count);
    let mut obs = Observation::for_geometry(&geometry).ok()?;
    let mut captures = Vec::new();
    for seq in published.saturating_sub(slots - 1).max(1)..=published {
        if r.read_seq(seq, &mut obs).is_ok() {
            captures.push((seq, obs.capture_time_ns));
        }
    }
    Some(PreviousWriter {
        epoch: r.writer_epoch(),
        last_beat_ns: r.writer_heartbeat_ns(),
        captures,
    })
}

/// Why an `ok` action was already past its `valid_until` when the firmware saw it.
#[derive(Default)]
struct Expired {
    /// The firmware had not polled for the whole window (the robot side stalled).
    robot_late: u64,
    /// The window was shorter than [`SHORT_WINDOW_NS`] (clipped by the chunk's grace end).
    short_window: u64,
    /// Neither: the action became visible after its own `valid_until`, so a firmware
    /// trusting `status` alone would have applied it past its validity.
    published_late: u64,
}

/// Everything the firmware saw: the text report's counters and the soak's checks.
#[derive(Default)]
struct Seen {
    ok: u64,
    hold: u64,
    fault: u64,
    applied_zero: u64,
    first_ok: Option<u64>,
    /// All actions: `seen - made_time`.
    visible: Histogram,
    /// Applied `ok` actions: observation capture to applied.
    age: Histogram,
    /// Applied `ok` actions: `seen - made_time`.
    staleness: Histogram,
    expired: Expired,
    /// `ok` actions whose `valid_until` is not after `made_time`, or further than
    /// `action_valid_ms` after it.
    window_invalid: u64,
    /// `ok` actions made later than `writer_heartbeat_timeout_ms` into a silent period
    /// (a gap, or the firmware being dead across a restart).
    ok_while_silent: u64,
    /// `ok` actions applied whose observation a previous writer published.
    inherited_ok: u64,
    /// Age (`now - made_time`) of the `ok` action in force, sampled every poll.
    in_force_age_max_ns: u64,
    /// The action in force reached its full `valid_until` before a newer one arrived.
    robot_expiries: u64,
    /// Changes from applying an action to holding (hold/fault received, or expiry).
    hold_episodes: u64,
    longest_hold_ns: u64,
    /// Since when nothing applicable was in force (after the first `ok`).
    holding_since: Option<u64>,
    max_action_interval_ns: u64,
    longest_poll_gap_ns: u64,
    gaps: u64,
    /// From the start of a gap to the first action the firmware did not apply.
    gap_hold_latency_max_ns: u64,
    /// From the end of a silence (gap or restart) to the first applied `ok`.
    resume_latency_max_ns: u64,
    /// Applied `ok` actions, after a silence, from an observation captured before it.
    stale_resumes: u64,
    /// Oldest of those (capture to applied).
    stale_resume_age_max_ns: u64,
    motion: Motion,
    /// Received actions, and those `hold`/`fault`, from the first applied `ok` on: the
    /// schedule's holds, without the start-up before any chunk exists.
    received_since_first_ok: u64,
    held_since_first_ok: u64,
}

/// The latest silence as the firmware lives through it.
struct SilenceTrack {
    from_ns: u64,
    back_ns: Option<u64>,
    held: bool,
    resumed: bool,
}

/// What the JSON report needs besides [`Seen`].
struct Identity {
    start_ns: u64,
    writer_epoch: u64,
    previous_writer_epoch: Option<u64>,
    first_own_seq: u64,
    gaps: Gaps,
}

impl Seen {
    fn hold_share_since_first_ok(&self) -> f64 {
        if self.received_since_first_ok == 0 {
            0.0
        } else {
            self.held_since_first_ok as f64 / self.received_since_first_ok as f64
        }
    }

    fn json(&self, id: &Identity, written: u64, now: u64, finished: bool) -> serde_json::Value {
        let ms = |ns: u64| ns as f64 / 1e6;
        let quantiles = |h: &Histogram| {
            serde_json::json!({
                "count": h.count(),
                "p50": ms(h.quantile_ns(0.5)),
                "p99": ms(h.quantile_ns(0.99)),
                "max": ms(h.max_ns()),
            })
        };
        let longest_hold = self
            .longest_hold_ns
            .max(self.holding_since.map_or(0, |t| now.saturating_sub(t)));
        let received = self.ok + self.hold + self.fault;
        serde_json::json!({
            "hold_share": if received == 0 { 0.0 } else { (self.hold + self.fault) as f64 / received as f64 },
            "hold_share_since_first_ok": self.hold_share_since_first_ok(),
            "motion": self.motion.json(),
            "pid": std::process::id(),
            "finished": finished,
            "seconds": now.saturating_sub(id.start_ns) as f64 / 1e9,
            "start_ns": id.start_ns,
            "now_ns": now,
            "writer_epoch": id.writer_epoch,
            "previous_writer_epoch": id.previous_writer_epoch,
            "first_own_seq": id.first_own_seq,
            "observations_written": written,
            "actions_received": self.ok + self.hold + self.fault,
            "ok_applied": self.ok,
            "hold": self.hold,
            "fault": self.fault,
            "all_zero_applied": self.applied_zero,
            "first_ok_s": self.first_ok.map(|t| t.saturating_sub(id.start_ns) as f64 / 1e9),
            "visibility_ms": quantiles(&self.visible),
            "capture_to_applied_ms": quantiles(&self.age),
            "made_to_applied_ms": quantiles(&self.staleness),
            "in_force_age_max_ms": ms(self.in_force_age_max_ns),
            "ok_expired_on_arrival": {
                "robot_late": self.expired.robot_late,
                "short_window": self.expired.short_window,
                "published_late": self.expired.published_late,
            },
            "ok_window_invalid": self.window_invalid,
            "ok_while_silent": self.ok_while_silent,
            "inherited_ok": self.inherited_ok,
            "robot_expiries": self.robot_expiries,
            "hold_episodes": self.hold_episodes,
            "longest_hold_ms": ms(longest_hold),
            "max_action_interval_ms": ms(self.max_action_interval_ns),
            "longest_poll_gap_ms": ms(self.longest_poll_gap_ns),
            "gaps": self.gaps,
            "gap_hold_latency_max_ms": ms(self.gap_hold_latency_max_ns),
            "resume_latency_max_ms": ms(self.resume_latency_max_ns),
            "stale_resumes": self.stale_resumes,
            "stale_resume_age_max_ms": ms(self.stale_resume_age_max_ns),
            "gap_every_s": id.gaps.every_ns as f64 / 1e9,
            "gap_length_s": id.gaps.length_ns as f64 / 1e9,
        })
    }
}

/// The `ok` action the firmware is executing.
struct InForce {
    made_ns: u64,
    valid_until_ns: u64,
    full_window: bool,
}

fn json_report(fields: &serde_json::Value, path: &Path) -> Result<(), SimError> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(fields).expect("JSON of plain values"),
    )
    .and_then(|()| std::fs::rename(&tmp, path))
    .map_err(|e| SimError::Write {
        path: path.to_owned(),
        source: e,
    })
}

/// Runs the simulator for `settings.duration` seconds, then prints its report (and
/// writes the JSON and the timeline when asked). An error if the daemon's action ring never
/// appeared.
pub fn run(settings: &Settings) -> Result<(), SimError> {
    let mut sim = Simulator::start(settings)?;
    while monotonic_ns() < sim.end_ns {
        let now = monotonic_ns();
        sim.camera(now)?;
        if sim.reader.is_none() {
            sim.open_action_ring();
        }
        sim.read_actions();
        sim.poll_done(settings.json.as_deref())?;
        std::thread::sleep(POLL);
    }
    sim.finish(settings)
}

/// The simulated robot: the camera writing observations, the firmware reading actions,
/// and everything it saw.
struct Simulator {
    geometry: Geometry,
    source: Observation,
    obs: Observation,
    writer: RingWriter<Observation>,
    act_ring: PathBuf,
    action_valid_ns: u64,
    silence_limit_ns: u64,
    gaps: Gaps,
    camera_period_ns: u64,
    start_ns: u64,
    end_ns: u64,
    next_obs_ns: u64,
    written: u64,
    /// `(seq, capture_time_ns)`: seqs continue across writer restarts, so an action from
    /// a previous writer's observation is aged by the capture time that writer left.
    captures: Vec<(u64, u64)>,
    /// Silent periods `[last beat, back]` the daemon must hold through: a dead previous
    /// writer (until this take-over), then every gap.
    silences: Vec<(u64, u64)>,
    inherited: bool,
    id: Identity,
    /// Every received action as CSV rows, when `--timeline` asked for them.
    timeline: Option<String>,
    reader: Option<RingReader<Action>>,
    action: Action,
    last_seq: u64,
    seen: Seen,
    in_force: Option<InForce>,
    last_arrival: Option<u64>,
    last_beat_ns: u64,
    silent: bool,
    prev_poll_ns: u64,
    next_json_ns: u64,
    track: Option<SilenceTrack>,
}

impl Simulator {
    /// Takes the observation ring over.
    fn start(settings: &Settings) -> Result<Self, SimError> {
        let geometry = settings.geometry;
        let source = settings.source.clone();
        let mut obs = Observation::for_geometry(&geometry).map_err(SimError::Geometry)?;
        if obs.frames.len() != source.frames.len() || obs.state.len() != source.state.len() {
            return Err(SimError::SourceSize {
                frames: source.frames.len(),
                state: source.state.len(),
                needed_frames: obs.frames.len(),
                needed_state: obs.state.len(),
            });
        }
        obs.frames.copy_from_slice(&source.frames);
        obs.state.copy_from_slice(&source.state);
        obs.instruction_id = source.instruction_id;

        let obs_ring = settings.observation_ring.clone();
        // Read before taking the ring over: the take-over overwrites the heartbeat.
        let previous = previous_writer(&obs_ring, geometry);
        let writer = RingWriter::<Observation>::create(&obs_ring, geometry, 8)
            .map_err(SimError::ObservationRing)?;
        println!(
            "simulator: writing observations to {} at {} Hz for {} s",
            obs_ring.display(),
            settings.camera_hz,
            settings.duration
        );
        let start = monotonic_ns();
        let mut captures = vec![(0u64, 0u64); CAPTURE_SLOTS];
        let mut silences: Vec<(u64, u64)> = Vec::new();
        let inherited = matches!(writer.origin(), Origin::Reopened);
        if let (true, Some(prev)) = (inherited, &previous) {
            for &(seq, capture) in &prev.captures {
                captures[(seq % CAPTURE_SLOTS as u64) as usize] = (seq, capture);
            }
            silences.push((prev.last_beat_ns, start));
        }
        let id = Identity {
            start_ns: start,
            writer_epoch: writer.epoch(),
            previous_writer_epoch: previous.as_ref().filter(|_| inherited).map(|p| p.epoch),
            first_own_seq: writer.next_seq(),
            gaps: settings.gaps,
        };
        let track = silences.first().map(|&(from, back)| SilenceTrack {
            from_ns: from,
            back_ns: Some(back),
            // Nobody was reading actions while the previous writer was dead.
            held: true,
            resumed: false,
        });
        Ok(Self {
            geometry,
            source,
            obs,
            writer,
            act_ring: settings.action_ring.clone(),
            action_valid_ns: settings.action_valid.as_nanos() as u64,
            silence_limit_ns: settings.writer_heartbeat_timeout.as_nanos() as u64,
            gaps: settings.gaps,
            camera_period_ns: (1e9 / settings.camera_hz) as u64,
            start_ns: start,
            end_ns: start + (settings.duration * 1e9) as u64,
            next_obs_ns: start,
            written: 0,
            captures,
            silences,
            inherited,
            id,
            timeline: settings.timeline.as_ref().map(|_| String::new()),
            reader: None,
            action: Action::for_geometry(&geometry),
            last_seq: 0,
            seen: Seen::default(),
            in_force: None,
            last_arrival: None,
            last_beat_ns: start,
            silent: false,
            prev_poll_ns: start,
            next_json_ns: start,
            track,
        })
    }

    /// The camera at `now`: silent during a scheduled gap, else a new observation when one
    /// is due (the state is where the applied actions took the arm), else a heartbeat.
    fn camera(&mut self, now: u64) -> Result<(), SimError> {
        if self.gaps.silent_at(now - self.start_ns) {
            if !self.silent {
                self.silent = true;
                self.seen.gaps += 1;
                self.silences.push((self.last_beat_ns, u64::MAX));
                self.track = Some(SilenceTrack {
                    from_ns: self.last_beat_ns,
                    back_ns: None,
                    held: false,
                    resumed: false,
                });
            }
            return Ok(());
        }
        if self.silent {
            self.silent = false;
            if let Some(gap) = self.silences.last_mut() {
                gap.1 = now;
            }
            if let Some(t) = self.track.as_mut() {
                t.back_ns = Some(now);
            }
            // A stalled camera does not deliver the frames it missed.
            self.next_obs_ns = self.next_obs_ns.max(now);
        }
        if now >= self.next_obs_ns {
            for (s, (&base, &p)) in self
                .obs
                .state
                .iter_mut()
                .zip(self.source.state.iter().zip(&self.seen.motion.pose))
            {
                *s = base + p as f32;
            }
            self.obs.capture_time_ns = now;
            self.obs.seed = self.source.seed.wrapping_add(self.written);
            let seq = self.writer.publish(&self.obs).map_err(SimError::Publish)?;
            self.captures[(seq % CAPTURE_SLOTS as u64) as usize] = (seq, now);
            self.written += 1;
            self.next_obs_ns += self.camera_period_ns;
        } else {
            self.writer.heartbeat();
        }
        self.last_beat_ns = monotonic_ns();
        Ok(())
    }

    /// Opens the action ring once the daemon created it. The actions published while no
    /// firmware was alive are still in the ring: none of them may be `ok` once the
    /// silence outlasted the heartbeat timeout.
    fn open_action_ring(&mut self) {
        let Ok(r) = RingReader::<Action>::open(&self.act_ring, self.geometry) else {
            return;
        };
        self.last_seq = r.published();
        if let Some(&(silent_from, _)) = self.silences.first().filter(|_| self.inherited) {
            let slots = u64::from(r.layout().slot_count);
            for seq in self.last_seq.saturating_sub(slots - 1).max(1)..=self.last_seq {
                if r.read_seq(seq, &mut self.action).is_ok()
                    && self.action.status == ActionStatus::Ok
                    && self.action.made_time_ns > silent_from + self.silence_limit_ns
                {
                    self.seen.ok_while_silent += 1;
                }
            }
        }
        self.reader = Some(r);
    }

    /// Every action published since the last poll, in order.
    fn read_actions(&mut self) {
        let Some(r) = self.reader.as_ref() else {
            return;
        };
        let published = r.published();
        for seq in self.last_seq + 1..=published {
            let Some(r) = self.reader.as_ref() else {
                return;
            };
            if r.read_seq(seq, &mut self.action).is_err() {
                continue;
            }
            self.receive(monotonic_ns());
        }
        self.last_seq = published.max(self.last_seq);
    }

    /// One action as the firmware sees it at `seen`: counted, kept for the timeline, and
    /// applied when it is `ok` and still valid.
    fn receive(&mut self, seen: u64) {
        let s = &mut self.seen;
        let action = &self.action;
        s.visible.record(seen.saturating_sub(action.made_time_ns));
        if let Some(t) = self.last_arrival {
            s.max_action_interval_ns = s.max_action_interval_ns.max(seen - t);
        }
        self.last_arrival = Some(seen);
        let made = action.made_time_ns;
        let window = action.valid_until_ns.saturating_sub(made);
        if s.first_ok.is_some() || action.status == ActionStatus::Ok {
            s.received_since_first_ok += 1;
            if action.status != ActionStatus::Ok {
                s.held_since_first_ok += 1;
            }
        }
        if let Some(timeline) = self.timeline.as_mut() {
            use std::fmt::Write;
            let status = match action.status {
                ActionStatus::Ok if action.applicable_at(seen) => "ok",
                ActionStatus::Ok => "expired",
                ActionStatus::Hold => "hold",
                ActionStatus::Fault => "fault",
            };
            let _ = write!(
                timeline,
                "{:.4},{status},{},{}",
                seen.saturating_sub(self.start_ns) as f64 / 1e9,
                action.chunk_id,
                action.step_index
            );
            for v in &action.values {
                let _ = write!(timeline, ",{v}");
            }
            timeline.push('\n');
        }
        if action.status == ActionStatus::Ok {
            if window == 0 || window > self.action_valid_ns {
                s.window_invalid += 1;
            }
            let limit = self.silence_limit_ns;
            if self
                .silences
                .iter()
                .any(|&(from, back)| made > from + limit && made < back)
            {
                s.ok_while_silent += 1;
            }
        }
        if action.status == ActionStatus::Ok && action.applicable_at(seen) {
            self.apply(seen, window);
        } else {
            self.refuse(seen, window);
        }
    }

    /// An applicable `ok` action: the arm moves, and how old and how stale it was.
    fn apply(&mut self, seen: u64, window: u64) {
        let s = &mut self.seen;
        let action = &self.action;
        let made = action.made_time_ns;
        s.ok += 1;
        s.motion.apply(action.chunk_id, &action.values);
        s.first_ok.get_or_insert(seen);
        if action.values.iter().all(|v| *v == 0.0) {
            s.applied_zero += 1;
        }
        let (known_seq, capture) =
            self.captures[(action.source_obs_seq % CAPTURE_SLOTS as u64) as usize];
        let capture = (capture != 0 && known_seq == action.source_obs_seq).then_some(capture);
        if let Some(c) = capture {
            s.age.record(seen.saturating_sub(c));
        }
        if let Some(t) = self.track.as_mut() {
            if let Some(back) = t.back_ns.filter(|&b| seen >= b) {
                if !t.resumed {
                    t.resumed = true;
                    s.resume_latency_max_ns = s.resume_latency_max_ns.max(seen - back);
                }
                // Unknown capture: a seq older than the ring kept (stale too).
                let before = capture.is_none_or(|c| c < t.from_ns);
                if before {
                    s.stale_resumes += 1;
                    if let Some(c) = capture {
                        s.stale_resume_age_max_ns = s.stale_resume_age_max_ns.max(seen - c);
                    }
                }
            }
        }
        if action.source_obs_seq < self.id.first_own_seq {
            s.inherited_ok += 1;
        }
        s.staleness.record(seen.saturating_sub(made));
        if let Some(t) = s.holding_since.take() {
            s.longest_hold_ns = s.longest_hold_ns.max(seen.saturating_sub(t));
        }
        self.in_force = Some(InForce {
            made_ns: made,
            valid_until_ns: action.valid_until_ns,
            full_window: window >= self.action_valid_ns,
        });
    }

    /// An action the arm does not move on: `hold`, `fault`, or `ok` already expired (and
    /// why).
    fn refuse(&mut self, seen: u64, window: u64) {
        let s = &mut self.seen;
        match self.action.status {
            ActionStatus::Ok => {
                s.hold += 1;
                if seen.saturating_sub(self.prev_poll_ns) >= window {
                    s.expired.robot_late += 1;
                } else if window < SHORT_WINDOW_NS {
                    s.expired.short_window += 1;
                } else {
                    s.expired.published_late += 1;
                }
            }
            ActionStatus::Hold => s.hold += 1,
            ActionStatus::Fault => s.fault += 1,
        }
        if self.in_force.take().is_some() {
            s.hold_episodes += 1;
            s.holding_since = Some(seen);
        }
        if let Some(t) = self.track.as_mut().filter(|t| !t.held) {
            t.held = true;
            s.gap_hold_latency_max_ns = s
                .gap_hold_latency_max_ns
                .max(seen.saturating_sub(t.from_ns));
        }
    }

    /// End of a poll: the action in force expires on its own when nothing newer came in
    /// time; the JSON report is rewritten once a second.
    fn poll_done(&mut self, json: Option<&Path>) -> Result<(), SimError> {
        let polled = monotonic_ns();
        let s = &mut self.seen;
        if let Some(f) = self.in_force.take_if(|f| polled >= f.valid_until_ns) {
            if f.full_window {
                s.robot_expiries += 1;
            }
            s.hold_episodes += 1;
            s.holding_since = Some(f.valid_until_ns);
            if let Some(t) = self.track.as_mut().filter(|t| !t.held) {
                t.held = true;
                s.gap_hold_latency_max_ns = s
                    .gap_hold_latency_max_ns
                    .max(f.valid_until_ns.saturating_sub(t.from_ns));
            }
        } else if let Some(f) = &self.in_force {
            s.in_force_age_max_ns = s.in_force_age_max_ns.max(polled - f.made_ns);
        }
        s.longest_poll_gap_ns = s.longest_poll_gap_ns.max(polled - self.prev_poll_ns);
        self.prev_poll_ns = polled;
        if let Some(path) = json.filter(|_| polled >= self.next_json_ns) {
            self.next_json_ns = polled + 1_000_000_000;
            json_report(&s.json(&self.id, self.written, polled, false), path)?;
        }
        Ok(())
    }

    /// The final JSON, the timeline and the text report.
    fn finish(self, settings: &Settings) -> Result<(), SimError> {
        let s = &self.seen;
        if let Some(path) = &settings.json {
            json_report(&s.json(&self.id, self.written, monotonic_ns(), true), path)?;
        }
        if let (Some(path), Some(timeline)) = (&settings.timeline, &self.timeline) {
            let header: String = (0..self.geometry.action_dims)
                .map(|i| format!(",v{i}"))
                .collect();
            std::fs::write(
                path,
                format!("t_s,status,chunk_id,step{header}\n{timeline}"),
            )
            .map_err(|e| SimError::Write {
                path: path.clone(),
                source: e,
            })?;
        }
        print_report(s, self.written, settings.duration, self.start_ns);
        if self.reader.is_none() {
            return Err(SimError::NoActionRing {
                path: self.act_ring.clone(),
            });
        }
        Ok(())
    }
}

/// The text report.
fn print_report(s: &Seen, written: u64, secs: f64, start: u64) {
    let (ok, hold, fault) = (s.ok, s.hold, s.fault);
    let ms = |ns: u64| ns as f64 / 1e6;
    println!("simulator report ({secs:.1} s):");
    println!(
        "  observations    {written} written ({:.1} Hz)",
        written as f64 / secs
    );
    let total = ok + hold + fault;
    println!("  actions         {total} received ({:.2} Hz): {ok} applied (ok), {hold} hold, {fault} fault", total as f64 / secs);
    if let Some(t) = s.first_ok {
        println!(
            "  first action    {:.2} s after start",
            (t - start) as f64 / 1e9
        );
    }
    println!(
        "  ring visibility made->seen p50 {:.3} ms  p99 {:.3} ms",
        ms(s.visible.quantile_ns(0.5)),
        ms(s.visible.quantile_ns(0.99))
    );
    println!(
        "  action age      observation capture->applied p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        ms(s.age.quantile_ns(0.5)),
        ms(s.age.quantile_ns(0.99)),
        ms(s.age.max_ns())
    );
    let m = &s.motion;
    println!(
        "  hold share      {:.1}% of received actions hold/fault, {:.1}% from the first ok action on",
        if total == 0 { 0.0 } else { (hold + fault) as f64 * 100.0 / total as f64 },
        s.hold_share_since_first_ok() * 100.0
    );
    m.print_report();
    println!("  all-zero actions applied: {}", s.applied_zero);
}

#[cfg(test)]
mod tests {
    use super::Gaps;

    #[test]
    fn a_gap_starts_every_period_after_the_first_and_lasts_its_length() {
        let g = Gaps {
            every_ns: 10,
            length_ns: 3,
        };
        let silent: Vec<u64> = (0..25).filter(|&t| g.silent_at(t)).collect();
        assert_eq!(silent, [10, 11, 12, 20, 21, 22]);
        assert!(!(0..100).any(|t| Gaps::default().silent_at(t)));
    }
}
