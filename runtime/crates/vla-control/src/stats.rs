//! Loop statistics: a fixed-size latency histogram (no growth, no allocation per sample)
//! and the shared health counters the daemon reads for `STATUS=` and the watchdog.

use std::sync::atomic::{AtomicU64, Ordering};

/// Microsecond buckets up to 100 ms, then one overflow bucket; the exact maximum is kept.
#[derive(Clone, Debug)]
pub struct Histogram {
    buckets: Vec<u64>,
    overflow: u64,
    count: u64,
    max_ns: u64,
}

const BUCKETS: usize = 100_000;

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
    pub fn record(&mut self, ns: u64) {
        let us = (ns / 1000) as usize;
        match self.buckets.get_mut(us) {
            Some(b) => *b += 1,
            None => self.overflow += 1,
        }
        self.count += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// The `q`-quantile in nanoseconds (upper edge of its microsecond bucket).
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (us, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return ((us as u64 + 1) * 1000).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

/// Counters shared between the loop threads and the daemon (relaxed atomics: figures,
/// not synchronization).
#[derive(Debug, Default)]
pub struct Health {
    pub ticks: AtomicU64,
    pub missed_ticks: AtomicU64,
    pub published_ok: AtomicU64,
    pub published_hold: AtomicU64,
    pub published_fault: AtomicU64,
    pub skipped_steps: AtomicU64,
    pub last_tick_ns: AtomicU64,
    pub last_jitter_ns: AtomicU64,
    pub inferences: AtomicU64,
    pub inference_failures: AtomicU64,
    pub stale_observations: AtomicU64,
    pub last_inference_ns: AtomicU64,
    pub last_inference_done_ns: AtomicU64,
    /// Observation-to-publish age of the last `ok` step.
    pub last_freshness_ns: AtomicU64,
    pub reloads: AtomicU64,
    pub inference_alive_ns: AtomicU64,
}

impl Health {
    pub fn get(v: &AtomicU64) -> u64 {
        v.load(Ordering::Relaxed)
    }
    pub fn set(v: &AtomicU64, x: u64) {
        v.store(x, Ordering::Relaxed)
    }
    pub fn bump(v: &AtomicU64) {
        v.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_buckets() {
        let mut h = Histogram::default();
        for us in 1..=100u64 {
            h.record(us * 1000 - 500);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile_ns(0.5), 50_000);
        assert_eq!(h.quantile_ns(0.99), 99_000);
        h.record(5_000_000_000);
        assert_eq!(h.max_ns(), 5_000_000_000);
        assert_eq!(h.quantile_ns(1.0), 5_000_000_000);
    }
}
