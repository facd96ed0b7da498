//! How chunks follow one another: the delay in steps, when the next inference starts,
//! how a landing chunk merges with the one in play, and the prefix a conditioned
//! inference starts from. Pure arithmetic, no clocks. (What share of the time that
//! holds the arm is `operating.rs`.)
//!
//! Notation: chunk step period `dt` (the publish period, or `1 / chunk_rate_hz` on the
//! slower time base), latency `L` (capture -> chunk ready), delay `d = ceil(L / dt)`,
//! horizon `H`. `config/README.md` describes the modes for users.

/// How a landing chunk takes over from the one in play.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MergeMode {
    /// The new chunk replaces the old; the steps its latency consumed are skipped.
    #[default]
    Skip,
    /// Steps present in both chunks (by time) are blended, the new chunk's weight
    /// ramping from near 0 at the seam to 1 at the end of the overlap.
    Crossfade,
    /// The engine conditions the new chunk on the old one's remaining steps inside its
    /// flow loop (GR00T's velocity mask); it then lands like `Skip`.
    Prefix,
    /// As `Prefix`, conditioned by inpainting the noised remaining steps instead.
    Inpaint,
}

impl MergeMode {
    /// The accepted spellings (`control.merge`), in declaration order.
    pub const NAMES: [&'static str; 4] = ["skip", "crossfade", "prefix", "inpaint"];

    /// The mode spelled as in the config; `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "skip" => Some(MergeMode::Skip),
            "crossfade" => Some(MergeMode::Crossfade),
            "prefix" => Some(MergeMode::Prefix),
            "inpaint" => Some(MergeMode::Inpaint),
            _ => None,
        }
    }

    /// Whether the engine conditions each inference on the chunk in play.
    pub fn conditions_on_prefix(self) -> bool {
        matches!(self, MergeMode::Prefix | MergeMode::Inpaint)
    }

    /// The mode's spelling in the config, one of [`Self::NAMES`].
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// When the inference thread starts the next inference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Trigger {
    /// As soon as the previous one finished (the NPU never idles).
    #[default]
    BackToBack,
    /// When the chunk in play has `d + margin` steps left: the NPU idles when it can.
    Remaining {
        /// Extra steps of slack beyond `d` (`control.trigger_margin_steps`).
        margin_steps: u32,
    },
    /// Upstream's evaluation protocol (the LIBERO evals): each chunk starts at its first
    /// row when it lands, whatever its latency; after `execute_steps` rows (0: all of
    /// them) the arm holds while the next inference runs, on an observation captured
    /// after the last executed row's period. Reproduces how a policy was scored, at the
    /// price of a pause per chunk.
    Synchronous {
        /// Rows executed per chunk; 0: all of them.
        execute_steps: u32,
    },
}

impl Trigger {
    /// Rows executed per chunk of `horizon` under [`Trigger::Synchronous`]; `None` for the
    /// real-time triggers.
    pub fn synchronous_rows(self, horizon: usize) -> Option<usize> {
        match self {
            Trigger::Synchronous { execute_steps: 0 } => Some(horizon),
            Trigger::Synchronous { execute_steps } => Some((execute_steps as usize).min(horizon)),
            _ => None,
        }
    }
}

/// `d = ceil(latency / step period)`.
pub fn delay_steps(latency_ns: u64, step_period_ns: u64) -> u64 {
    latency_ns.div_ceil(step_period_ns.max(1))
}

/// When to start the next inference under `trigger`: `None` means now. `chunk_end_ns` is
/// when the chunk in play runs out (0: none in play). Under [`Trigger::Synchronous`] it is
/// the end of the last executed row's period, and the observation must be captured at or
/// after it too ([`observation_in_time`]).
pub fn trigger_at(
    trigger: Trigger,
    chunk_end_ns: u64,
    latency_ns: u64,
    step_period_ns: u64,
) -> Option<u64> {
    let margin_steps = match trigger {
        Trigger::BackToBack => return None,
        Trigger::Synchronous { .. } if chunk_end_ns == 0 => return None,
        Trigger::Synchronous { .. } => return Some(chunk_end_ns + step_period_ns),
        Trigger::Remaining { margin_steps } => margin_steps,
    };
    if chunk_end_ns == 0 || latency_ns == 0 {
        return None;
    }
    let lead = (delay_steps(latency_ns, step_period_ns) + u64::from(margin_steps))
        .saturating_mul(step_period_ns);
    Some(chunk_end_ns.saturating_sub(lead))
}

/// Whether an observation captured at `capture_ns` may start the next inference: under
/// [`Trigger::Synchronous`] only one captured after the executed rows (it sees what they
/// did, as the eval's `env.step` returns it); any fresh one otherwise.
pub fn observation_in_time(
    trigger: Trigger,
    chunk_end_ns: u64,
    step_period_ns: u64,
    capture_ns: u64,
) -> bool {
    match trigger {
        Trigger::Synchronous { .. } => {
            trigger_at(trigger, chunk_end_ns, 0, step_period_ns).is_none_or(|at| capture_ns >= at)
        }
        _ => true,
    }
}

/// Row `pos` (fractional) of a `[steps, dims]` chunk, linearly interpolated; positions
/// past the last row give the last row (the last real action, never zeros). A dim marked
/// in `discrete` (a binarized gripper: open or close, nothing between) takes the nearer
/// row instead; an empty mask marks none.
pub fn sample_row(chunk: &[f32], dims: usize, pos: f64, discrete: &[bool], out: &mut [f32]) {
    let steps = chunk.len() / dims;
    let last = steps - 1;
    let pos = pos.max(0.0);
    let i = (pos.floor() as usize).min(last);
    let frac = if i == last {
        0.0
    } else {
        (pos - i as f64) as f32
    };
    let a = &chunk[i * dims..(i + 1) * dims];
    if frac == 0.0 {
        out.copy_from_slice(a);
        return;
    }
    let b = &chunk[(i + 1) * dims..(i + 2) * dims];
    for (k, ((o, &x), &y)) in out.iter_mut().zip(a).zip(b).enumerate() {
        *o = if discrete.get(k).copied().unwrap_or(false) {
            if frac >= 0.5 {
                y
            } else {
                x
            }
        } else {
            x + (y - x) * frac
        };
    }
}

/// The prefix a conditioned inference starts from, de-normalized, `[steps, dims]`.
#[derive(Clone, Copy, Debug)]
pub struct Prefix<'a> {
    /// The previous chunk's actions re-indexed to the new observation's time (row `j` is
    /// for `capture + j * dt`), padded with its last real action.
    pub actions: &'a [f32],
    /// Rows `< frozen` are executed before the new chunk can land: kept as they are.
    pub frozen: usize,
    /// Rows `< overlap` exist in the previous chunk; beyond, the prefix is padding.
    pub overlap: usize,
}

/// Fills `out` (`[steps, dims]`) with `prev` shifted by `offset_steps` (the old chunk's
/// position at the new chunk's step 0, [`TickGrid::offset_steps`]); returns `(frozen,
/// overlap)` with `frozen` ([`TickGrid::frozen_rows`]) capped at the overlap. `None`
/// when the previous chunk has no step left at the new capture.
pub fn build_prefix(
    prev: &[f32],
    dims: usize,
    discrete: &[bool],
    offset_steps: f64,
    frozen: usize,
    out: &mut [f32],
) -> Option<(usize, usize)> {
    let steps = prev.len() / dims;
    let last = (steps - 1) as f64;
    if !(0.0..=last).contains(&offset_steps) {
        return None;
    }
    let overlap = ((last - offset_steps).floor() as usize + 1).min(steps);
    for (j, row) in out.chunks_exact_mut(dims).enumerate() {
        sample_row(prev, dims, j as f64 + offset_steps, discrete, row);
    }
    Some((frozen.min(overlap), overlap))
}

/// The publisher's tick grid: ticks at `origin + n * period` (absolute deadlines, so the
/// phase never drifts), and on each tick a chunk's position is the whole ticks since its
/// capture times `advance` (chunk steps per tick; 1 unless on the slower time base).
/// Merging two chunks by this grid, not by their capture times, lines up exactly the
/// values the publisher plays at the same tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TickGrid {
    /// CLOCK_MONOTONIC ns of tick 0.
    pub origin_ns: u64,
    /// Publish period in ns.
    pub period_ns: u64,
    /// Chunk step period (`>= period_ns`).
    pub step_ns: u64,
}

impl TickGrid {
    fn advance(&self) -> f64 {
        self.period_ns as f64 / self.step_ns.max(self.period_ns).max(1) as f64
    }

    /// Whole ticks from `capture_ns` to the grid time `t_ns`, floored (negative before it).
    fn ticks_since(&self, capture_ns: u64, t_ns: u64) -> i128 {
        (i128::from(t_ns) - i128::from(capture_ns)).div_euclid(i128::from(self.period_ns.max(1)))
    }

    /// A chunk's position (chunk steps) at the grid time `t_ns`: what the publisher samples
    /// (row 0 while it is negative, at a tick before the capture: a chunk ready between a
    /// deadline and a late wake-up lands at that deadline, and stays on the grid).
    pub fn position(&self, capture_ns: u64, t_ns: u64) -> f64 {
        self.ticks_since(capture_ns, t_ns) as f64 * self.advance()
    }

    /// The first grid time at or after `t_ns`.
    pub fn next_tick(&self, t_ns: u64) -> u64 {
        let p = self.period_ns.max(1);
        if t_ns <= self.origin_ns {
            return self.origin_ns;
        }
        self.origin_ns + (t_ns - self.origin_ns).div_ceil(p) * p
    }

    /// Position in the old chunk (captured at `old_capture_ns`) of the new chunk's step 0
    /// (captured at `new_capture_ns`): on every tick, old position = new position + this.
    /// A whole number of ticks, so without the slower time base a whole number of rows.
    pub fn offset_steps(&self, old_capture_ns: u64, new_capture_ns: u64) -> f64 {
        let t = self.origin_ns;
        (self.ticks_since(old_capture_ns, t) - self.ticks_since(new_capture_ns, t)) as f64
            * self.advance()
    }

    /// Rows of a chunk captured at `capture_ns` that a prefix must keep as they are when
    /// the chunk is ready `latency_ns` after its capture: every row the old chunk plays
    /// before the landing, and the rows the landing tick samples. Without the slower
    /// time base the first value the new chunk publishes is then exactly the one the old
    /// chunk would have; on it (fractional offsets) the frozen rows are themselves
    /// interpolated from the old chunk, so the landing value is close, not exact.
    pub fn frozen_rows(&self, capture_ns: u64, latency_ns: u64) -> usize {
        let land = self.next_tick(capture_ns.saturating_add(latency_ns));
        let pos = self.position(capture_ns, land);
        // Row `pos` itself, or on the slower time base both rows a fractional `pos`
        // interpolates (floor and ceil).
        pos.ceil() as usize + 1
    }
}

/// Crossfade weight of the new chunk at overlap position `k` of `n`: `(k+1)/(n+1)`, so
/// the seam starts at the old chunk's value and the new one has taken over at the end.
pub fn crossfade_weight(k: usize, n: usize) -> f32 {
    (k + 1) as f32 / (n + 1) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_remaining_trigger_starts_d_plus_margin_steps_before_the_chunk_ends() {
        let t = Trigger::Remaining { margin_steps: 2 };
        // d = ceil(120 / 50) = 3, lead (3 + 2) * 50 ms.
        assert_eq!(
            trigger_at(t, 10_000 * MS, 120 * MS, 50 * MS),
            Some(9_750 * MS)
        );
        assert_eq!(trigger_at(t, 0, 120 * MS, 50 * MS), None, "no chunk: now");
        assert_eq!(
            trigger_at(t, 10_000 * MS, 0, 50 * MS),
            None,
            "no estimate: now"
        );
        assert_eq!(
            trigger_at(Trigger::BackToBack, 10_000 * MS, 120 * MS, 50 * MS),
            None
        );
    }

    #[test]
    fn the_synchronous_trigger_waits_for_the_executed_rows_and_an_observation_after_them() {
        let t = Trigger::Synchronous { execute_steps: 10 };
        assert_eq!(t.synchronous_rows(32), Some(10));
        assert_eq!(
            Trigger::Synchronous { execute_steps: 0 }.synchronous_rows(32),
            Some(32),
            "0: the whole chunk"
        );
        assert_eq!(
            Trigger::Synchronous { execute_steps: 40 }.synchronous_rows(32),
            Some(32)
        );
        assert_eq!(Trigger::BackToBack.synchronous_rows(32), None);
        // Last executed row at 10 s: its period ends at 10.05 s; latency does not matter.
        assert_eq!(trigger_at(t, 10_000 * MS, 0, 50 * MS), Some(10_050 * MS));
        assert_eq!(trigger_at(t, 0, 0, 50 * MS), None, "nothing in play: now");
        assert!(!observation_in_time(t, 10_000 * MS, 50 * MS, 10_049 * MS));
        assert!(observation_in_time(t, 10_000 * MS, 50 * MS, 10_050 * MS));
        assert!(observation_in_time(t, 0, 50 * MS, 1));
        assert!(observation_in_time(
            Trigger::BackToBack,
            10_000 * MS,
            50 * MS,
            1
        ));
    }

    #[test]
    fn rows_interpolate_and_pad_with_the_last_real_action() {
        let chunk = [0.0, 10.0, 1.0, 11.0, 2.0, 12.0];
        let mut out = [0.0f32; 2];
        sample_row(&chunk, 2, 0.5, &[], &mut out);
        assert_eq!(out, [0.5, 10.5]);
        sample_row(&chunk, 2, 7.0, &[], &mut out);
        assert_eq!(out, [2.0, 12.0], "past the end: the last row, never zeros");
    }

    #[test]
    fn the_prefix_is_the_previous_chunk_shifted_to_the_new_capture_and_padded() {
        let prev: Vec<f32> = (0..5).map(|i| i as f32).collect();
        let mut out = [f32::NAN; 5];
        // New capture 2 steps into the previous chunk; 1 row frozen.
        assert_eq!(build_prefix(&prev, 1, &[], 2.0, 1, &mut out), Some((1, 3)));
        assert_eq!(out, [2.0, 3.0, 4.0, 4.0, 4.0]);
        // Frozen rows beyond the overlap: only what exists.
        assert_eq!(build_prefix(&prev, 1, &[], 3.0, 9, &mut out), Some((2, 2)));
        assert_eq!(build_prefix(&prev, 1, &[], 4.5, 1, &mut out), None);
    }

    #[test]
    fn the_grid_lines_up_what_two_chunks_publish_at_the_same_tick() {
        // 50 ms ticks at 1000 + 50 n ms; chunks captured off the grid.
        let g = TickGrid {
            origin_ns: 1_000 * MS,
            period_ns: 50 * MS,
            step_ns: 50 * MS,
        };
        let (old, new) = (1_012 * MS, 1_118 * MS);
        let off = g.offset_steps(old, new);
        assert_eq!(
            off, 2.0,
            "a whole number of rows, not (118 - 12) / 50 = 2.12"
        );
        for tick in (1_150..1_600).step_by(50) {
            let t = tick * MS;
            assert_eq!(
                g.position(old, t),
                g.position(new, t) + off,
                "tick {tick} ms"
            );
        }
        // Ready 120 ms after capture (1238 ms): lands at 1250 ms, new position 2 (1250 - 1118
        // = 132 ms, 2 whole ticks), so rows 0..=2 are kept.
        assert_eq!(g.next_tick(1_238 * MS), 1_250 * MS);
        assert_eq!(g.next_tick(1_250 * MS), 1_250 * MS);
        assert_eq!(g.frozen_rows(new, 120 * MS), 3);
        // Slower time base (4 ticks per step): position 0.5 at 2 ticks interpolates rows 0
        // and 1, both kept.
        let slow = TickGrid {
            step_ns: 200 * MS,
            ..g
        };
        assert_eq!(slow.position(new, 1_250 * MS), 0.5);
        assert_eq!(slow.frozen_rows(new, 120 * MS), 2);
        assert_eq!(slow.offset_steps(old, new), 0.5);
    }

    #[test]
    fn crossfade_weights_ramp_from_the_old_to_the_new_chunk() {
        let w: Vec<f32> = (0..3).map(|k| crossfade_weight(k, 3)).collect();
        assert_eq!(w, [0.25, 0.5, 0.75]);
    }
}
