//! Loop statistics: the nearest-rank quantile every report and benchmark of the project
//! uses, a fixed-size latency histogram (no growth, no allocation per sample), the rolling
//! latency window behind the operating point, and the shared health counters the daemon
//! reads for `STATUS=` and the watchdog.

use std::sync::atomic::{AtomicU64, Ordering};

/// The 1-based nearest rank of the `q`-quantile among `count` samples (`count` > 0):
/// `ceil(q * count)`, at least 1 and at most `count`. The one definition of a quantile in
/// the project: the histogram, the latency window, the daemon's reports and the
/// benchmarks all rank with it.
pub fn nearest_rank(q: f64, count: usize) -> usize {
    ((q * count as f64).ceil() as usize).clamp(1, count)
}

/// The nearest-rank `q`-quantile of samples already sorted ascending; `None` when empty.
pub fn quantile_sorted<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    (!sorted.is_empty()).then(|| sorted[nearest_rank(q, sorted.len()) - 1])
}

/// The nearest-rank `q`-quantile of timing samples, which it sorts in place (IEEE total
/// order); 0.0 when there are none.
pub fn quantile(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    quantile_sorted(samples, q).unwrap_or(0.0)
}

/// Log-linear buckets: 1 us resolution below 10 ms, then 10 us, 100 us, 1 ms and 10 ms
/// resolution per decade up to 100 s, one overflow bucket above; the exact maximum is kept.
/// Fixed size, so recording never allocates.
#[derive(Clone, Debug)]
pub struct Histogram {
    buckets: Vec<u64>,
    overflow: u64,
    count: u64,
    max_ns: u64,
}

const FIRST_TIER: u64 = 10_000;
const TIER: u64 = 9_000;
const TIERS: u64 = 4;
const BUCKETS: usize = (FIRST_TIER + TIERS * TIER) as usize;

/// Bucket of a duration in microseconds, `None` above 100 s.
fn bucket(us: u64) -> Option<usize> {
    if us < FIRST_TIER {
        return Some(us as usize);
    }
    let (mut lo, mut res) = (FIRST_TIER, 1u64);
    for tier in 0..TIERS {
        res *= 10;
        let hi = lo * 10;
        if us < hi {
            return Some((FIRST_TIER + tier * TIER + (us - lo) / res) as usize);
        }
        lo = hi;
    }
    None
}

/// Upper edge of bucket `b` in microseconds.
fn upper_edge_us(b: usize) -> u64 {
    let b = b as u64;
    if b < FIRST_TIER {
        return b + 1;
    }
    let tier = (b - FIRST_TIER) / TIER;
    let res = 10u64.pow(tier as u32 + 1);
    let lo = FIRST_TIER * 10u64.pow(tier as u32);
    lo + ((b - FIRST_TIER) % TIER + 1) * res
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: vec![0; BUCKETS],
            overflow: 0,
            count: 0,
            max_ns: 0,
        }
    }
}

impl Histogram {
    /// Adds one sample, in ns (bucketed by microseconds; above 100 s it counts as overflow).
    /// Never allocates.
    pub fn record(&mut self, ns: u64) {
        match bucket(ns / 1000) {
            Some(b) => self.buckets[b] += 1,
            None => self.overflow += 1,
        }
        self.count += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Largest sample recorded, in ns (0 when empty).
    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// The `q`-quantile in nanoseconds (upper edge of its bucket, at most the maximum).
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = nearest_rank(q, self.count as usize) as u64;
        let mut seen = 0;
        for (b, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return (upper_edge_us(b) * 1000).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

/// The last `N` inference latencies (capture -> chunk ready), for the operating point.
/// A histogram cannot forget old samples, so the window keeps them raw; its quantile is
/// exact over the window. Both buffers are allocated once, so recording and querying
/// never allocate.
#[derive(Clone, Debug)]
pub struct LatencyWindow {
    samples: Vec<u64>,
    scratch: Vec<u64>,
    next: usize,
    len: usize,
}

impl LatencyWindow {
    /// An empty window of `capacity` samples (at least 1), allocated here.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            samples: vec![0; capacity],
            scratch: vec![0; capacity],
            next: 0,
            len: 0,
        }
    }

    /// Adds a latency in ns, replacing the oldest once the window is full. Never allocates.
    pub fn record(&mut self, ns: u64) {
        self.samples[self.next] = ns;
        self.next = (self.next + 1) % self.samples.len();
        self.len = (self.len + 1).min(self.samples.len());
    }

    /// Samples in the window (at most its capacity).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first sample (and after [`Self::clear`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every sample (a reload: the new bundle's latency is another one).
    pub fn clear(&mut self) {
        self.next = 0;
        self.len = 0;
    }

    /// The `q`-quantile of the samples in the window (nearest rank), `None` when empty.
    pub fn quantile_ns(&mut self, q: f64) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let s = &mut self.scratch[..self.len];
        s.copy_from_slice(&self.samples[..self.len]);
        let rank = nearest_rank(q, self.len);
        Some(*s.select_nth_unstable(rank - 1).1)
    }
}

/// Counters shared between the loop threads and the daemon (relaxed atomics: figures,
/// not synchronization).
#[derive(Debug, Default)]
pub struct Health {
    /// Publisher ticks that ran.
    pub ticks: AtomicU64,
    /// Deadlines that passed before the publisher woke (overruns).
    pub missed_ticks: AtomicU64,
    /// Ticks that published `ok`: chunk steps and the last action held within the grace period.
    pub published_ok: AtomicU64,
    /// Ticks that published `hold`.
    pub published_hold: AtomicU64,
    /// Ticks that published `fault`.
    pub published_fault: AtomicU64,
    /// Chunk steps skipped on landing because their time had passed.
    pub skipped_steps: AtomicU64,
    /// CLOCK_MONOTONIC ns of the last tick: a stalled publisher stops advancing it.
    pub last_tick_ns: AtomicU64,
    /// Wake-up lateness of the last tick against its deadline, in ns.
    pub last_jitter_ns: AtomicU64,
    /// Successful inferences.
    pub inferences: AtomicU64,
    /// Failed inferences.
    pub inference_failures: AtomicU64,
    /// Observations skipped as older than `max_observation_age`.
    pub stale_observations: AtomicU64,
    /// Engine time of the last successful inference, in ns.
    pub last_inference_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns when the last successful inference finished.
    pub last_inference_done_ns: AtomicU64,
    /// Observation-to-publish age of the last `ok` step.
    pub last_freshness_ns: AtomicU64,
    /// Reloads (SIGHUP) the inference thread has carried out.
    pub reloads: AtomicU64,
    /// CLOCK_MONOTONIC ns of the inference thread's last pass: a hung inference stops
    /// advancing it.
    pub inference_alive_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns when the inference thread began a repair (a reload, or the
    /// engine's re-creation of its session after a failure: loads and gates that may take
    /// far longer than an inference); 0: none in progress. The supervisor bounds a repair
    /// by its own, longer, limit instead of the inference deadline.
    pub repairing_since_ns: AtomicU64,
    /// p95 of the rolling latency window (capture -> chunk ready); 0 before any sample.
    pub latency_estimate_ns: AtomicU64,
    /// The same window at `SPREAD_QUANTILES` (its deciles' midpoints): the operating
    /// point's expected hold averages over them.
    pub latency_spread_ns: [AtomicU64; crate::operating::SPREAD_LEN],
    /// The robot's observation period, from the capture times and sequence numbers of the
    /// observations the inference thread took; 0 before two from one writer.
    pub observation_period_ns: AtomicU64,
    /// When the chunk in play runs out (its last step's time); 0: no chunk in play.
    pub chunk_end_ns: AtomicU64,
    /// Id of the chunk in play; 0: none.
    pub chunk_in_play: AtomicU64,
    /// Chunks refused because they held NaN/Inf (never published).
    pub non_finite_chunks: AtomicU64,
    /// The instruction the robot's newest observation names, as `1 << 32 | instruction_id`
    /// (the watch thread follows it every few ms); 0 before one is known.
    pub robot_instruction: AtomicU64,
    /// Chunks dropped (in play) or refused (landing) because they were computed for
    /// another instruction than the robot's newest observation names.
    pub instruction_switch_drops: AtomicU64,
    /// Observations not inferred because the engine had no instruction ready for them
    /// (a text still rendering, or refused); the publisher holds meanwhile.
    pub instruction_waits: AtomicU64,
    /// Instructions given as text that were rendered (by the daemon's text thread).
    pub instruction_texts_rendered: AtomicU64,
    /// Instructions given as text that were refused (invalid UTF-8, too many tokens, ...).
    pub instruction_texts_refused: AtomicU64,
}

impl Health {
    /// The instruction the robot's newest observation names, if known.
    pub fn robot_instruction(&self) -> Option<u32> {
        let v = self.robot_instruction.load(Ordering::Relaxed);
        (v >> 32 == 1).then_some(v as u32)
    }

    /// Records the instruction of the robot's newest observation.
    pub fn set_robot_instruction(&self, id: u32) {
        self.robot_instruction
            .store(1 << 32 | u64::from(id), Ordering::Relaxed);
    }

    /// Forgets the robot's instruction (its ring is gone): no chunk is refused for one.
    pub fn clear_robot_instruction(&self) {
        self.robot_instruction.store(0, Ordering::Relaxed);
    }
}

impl Health {
    /// Reads a counter (relaxed).
    pub fn get(v: &AtomicU64) -> u64 {
        v.load(Ordering::Relaxed)
    }
    /// Sets a counter (relaxed).
    pub fn set(v: &AtomicU64, x: u64) {
        v.store(x, Ordering::Relaxed)
    }
    /// Adds one to a counter (relaxed).
    pub fn bump(v: &AtomicU64) {
        v.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_rank_is_the_ceiling_clamped_to_the_samples() {
        assert_eq!(nearest_rank(0.5, 100), 50);
        assert_eq!(nearest_rank(0.99, 200), 198);
        assert_eq!(nearest_rank(0.0, 7), 1);
        assert_eq!(nearest_rank(1.0, 7), 7);
        assert_eq!(quantile_sorted::<u64>(&[], 0.5), None);
        assert_eq!(quantile_sorted(&[3u64, 5, 9], 0.5), Some(5));
        let mut v = [4.0, f64::NAN, 1.0, 2.0];
        assert_eq!(quantile(&mut v, 0.5), 2.0);
        assert!(
            quantile(&mut v, 1.0).is_nan(),
            "NaN sorts last in total order"
        );
        assert_eq!(quantile(&mut [], 0.5), 0.0);
    }

    #[test]
    fn quantiles_come_from_the_buckets() {
        let mut h = Histogram::default();
        for us in 1..=100u64 {
            h.record(us * 1000 - 500);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile_ns(0.5), 50_000);
        assert_eq!(h.quantile_ns(0.99), 99_000);
        h.record(500_000_000_000);
        assert_eq!(h.max_ns(), 500_000_000_000);
        assert_eq!(h.quantile_ns(1.0), 500_000_000_000);
    }

    #[test]
    fn the_window_forgets_old_samples_and_takes_its_quantile_exactly() {
        let mut w = LatencyWindow::new(4);
        assert_eq!(w.quantile_ns(0.95), None);
        for ns in [9_000, 1, 2, 3] {
            w.record(ns);
        }
        assert_eq!(w.quantile_ns(0.95), Some(9_000));
        w.record(4);
        assert_eq!(w.len(), 4);
        assert_eq!(
            w.quantile_ns(0.95),
            Some(4),
            "the 9000 sample left the window"
        );
        assert_eq!(w.quantile_ns(0.5), Some(2));
    }

    #[test]
    fn seconds_keep_three_significant_digits() {
        let mut h = Histogram::default();
        for ms in [1200u64, 3700, 4930, 4931, 45_000] {
            h.record(ms * 1_000_000);
        }
        assert_eq!(h.quantile_ns(0.5), 4_931_000_000);
        assert_eq!(h.quantile_ns(0.2), 1_201_000_000);
        assert_eq!(h.quantile_ns(0.8), 4_932_000_000.min(h.quantile_ns(0.8)));
        assert_eq!(h.quantile_ns(1.0), 45_000_000_000);
        for us in [
            0u64, 9_999, 10_000, 99_999, 100_000, 999_999, 1_000_000, 99_999_999,
        ] {
            let b = bucket(us).unwrap();
            assert!(
                upper_edge_us(b) > us,
                "{us} -> bucket {b} edge {}",
                upper_edge_us(b)
            );
        }
        assert_eq!(bucket(100_000_000), None);
    }
}
