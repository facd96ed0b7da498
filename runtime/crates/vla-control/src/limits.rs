//! The loop's limits: the one description of its timing that the publisher's schedule
//! runs on, the inference thread plans with and the operating point is computed from.

use crate::plan::{MergeMode, Trigger};
use std::time::Duration;

/// The loop's limits, in nanoseconds (a `0` age limit is none).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Publish period: one action per tick on absolute deadlines.
    pub period_ns: u64,
    /// Time between chunk steps: `period_ns`, or longer on the slower time base (a
    /// shorter one counts as `period_ns`).
    pub chunk_period_ns: u64,
    /// Steps per chunk (`H`, the geometry's `chunk_len`).
    pub horizon: u64,
    /// How a landing chunk takes over from the one in play (the prefix modes wait for the
    /// publisher).
    pub merge: MergeMode,
    /// When the next inference starts.
    pub trigger: Trigger,
    /// `max_chunk_age`: a chunk whose observation is older than this publishes `hold`.
    pub max_chunk_age_ns: u64,
    /// `max_observation_age`: an older observation (since capture) is not used for
    /// inference.
    pub max_observation_age_ns: u64,
    /// `action_valid`: every published action's `valid_until` is its publish time plus
    /// this.
    pub action_valid_ns: u64,
    /// `hold_after_chunk_end`: after a chunk's last step, its last action stays `ok` this
    /// long, then `hold`.
    pub hold_after_chunk_end_ns: u64,
}

impl Limits {
    /// The publish period.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    /// The chunk period as configured (see [`Limits::step_ns`] for the one the loop runs).
    pub fn chunk_period(&self) -> Duration {
        Duration::from_nanos(self.chunk_period_ns)
    }

    /// Time between chunk steps as the loop runs them: never shorter than the publish
    /// period.
    pub fn step_ns(&self) -> u64 {
        self.chunk_period_ns.max(self.period_ns)
    }

    /// `Some(n)`: synchronous execution (upstream's eval protocol): a chunk starts at its
    /// first row when it lands, plays `n` rows, then publishes `hold` until the next.
    pub fn synchronous_rows(&self) -> Option<usize> {
        self.trigger.synchronous_rows(self.horizon as usize)
    }
}
