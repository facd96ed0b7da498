//! Taps: what the loop threads tell an observer (a flight recorder, metrics) about every
//! inference and every tick, by reference and as it happens.
//!
//! The loop calls a [`Tap`] on its hot paths, so an implementation must neither allocate,
//! block, log nor do I/O: copy into preallocated memory, drop (and count) when full.
//! The loop does not know what is behind a tap; the daemon provides it.

use crate::Decision;
use vla_ring::{Action, Observation};

/// One finished (or failed) inference, from the inference thread.
pub struct InferenceEvent<'a> {
    /// The loop's id of the chunk; 0 when the inference failed.
    pub chunk_id: u64,
    /// The observation it ran on (frames, state, seed, instruction: enough to replay it).
    pub observation: &'a Observation,
    /// Seq of that observation in its ring.
    pub observation_seq: u64,
    /// CLOCK_MONOTONIC ns when the engine was called.
    pub started_ns: u64,
    /// CLOCK_MONOTONIC ns when it returned.
    pub done_ns: u64,
    /// Per-component latencies of this inference, in the order of the engine's
    /// [`crate::Engine::component_names`] (empty when the engine keeps none).
    pub components_ns: &'a [u64],
    /// `chunk_len x action_dims`; meaningless when `ok` is false.
    pub actions: &'a [f32],
    /// Whether the inference succeeded.
    pub ok: bool,
    /// Conditioned on the chunk in play (`merge: prefix`): not replayable from the
    /// observation alone.
    pub prefixed: bool,
}

/// One publisher tick: what was published and why.
pub struct TickEvent<'a> {
    /// CLOCK_MONOTONIC ns when the tick woke.
    pub now_ns: u64,
    /// Why the tick published what it did.
    pub decision: Decision,
    /// The action as published to the ring.
    pub action: &'a Action,
    /// Whether the robot's heartbeat was seen within `writer_heartbeat_timeout`.
    pub robot_alive: bool,
    /// Deadlines skipped before this tick (overrun).
    pub missed: u64,
}

/// An observer of the loop. Called on the inference thread ([`Tap::inference`]) and the
/// publisher thread ([`Tap::tick`]): see the module comment for what it may not do.
pub trait Tap: Send + Sync + 'static {
    /// Called once per inference, successful or not, right after it returns.
    fn inference(&self, event: &InferenceEvent<'_>);
    /// Called once per publisher tick, after the action was published.
    fn tick(&self, event: &TickEvent<'_>);
}
