//! Writers and readers of ring segments: creating, re-opening after a crash, validating,
//! publishing and copying slots into caller-owned buffers. This module holds the ring
//! clock and the names of the four ring ends; the parts live in `item` (the records a
//! slot carries), `header` (checking and writing a segment's header), `writer` and
//! `reader`.

mod header;
mod item;
mod reader;
mod writer;

pub use item::{
    text_id_of, text_instruction_id, Action, ActionStatus, InstructionText, Observation, SlotItem,
};
pub use reader::{RingReader, READ_ATTEMPTS};
pub use writer::{Origin, RingWriter};

/// CLOCK_MONOTONIC in nanoseconds, the clock of every timestamp in the rings.
pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64),
        // CLOCK_MONOTONIC cannot fail on Linux; 0 reads as "no sign of life".
        Err(_) => 0,
    }
}

/// Writes the observation ring (the firmware's side; Rust writers serve tests and
/// simulators).
pub type ObservationWriter = RingWriter<Observation>;
/// Writes the action ring (the runtime's side).
pub type ActionWriter = RingWriter<Action>;
/// Reads the observation ring (the runtime's side).
pub type ObservationReader = RingReader<Observation>;
/// Reads the action ring (the firmware's side).
pub type ActionReader = RingReader<Action>;
/// Writes the instruction segment (the firmware's side; Rust writers serve tests).
pub type InstructionWriter = RingWriter<InstructionText>;
/// Reads the instruction segment (the runtime's side).
pub type InstructionReader = RingReader<InstructionText>;
