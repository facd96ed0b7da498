//! What a slot carries: the [`Observation`] and [`Action`] records callers own and reuse,
//! and how each is stored into and loaded from a slot ([`SlotItem`]).

use crate::error::ConfigError;
use crate::layout::{
    ActionSlotFixed, Geometry, InstructionSlotFixed, ObservationSlotFixed, RingKind, RingLayout,
    MAX_TEXT_BYTES, SLOT_FIXED_SIZE, TEXT_ID_FLAG,
};
use crate::seqlock::{PayloadReader, PayloadWriter};
use core::mem::offset_of;

/// What the firmware should do with an action step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ActionStatus {
    /// Apply the values.
    Ok = 0,
    /// Hold the current position (e.g. the policy is not ready).
    Hold = 1,
    /// The runtime failed: stop safely.
    Fault = 2,
}

impl ActionStatus {
    /// The status a raw slot word encodes, or `None` for anything but 0, 1, 2.
    pub fn from_raw(raw: u32) -> Option<ActionStatus> {
        match raw {
            0 => Some(ActionStatus::Ok),
            1 => Some(ActionStatus::Hold),
            2 => Some(ActionStatus::Fault),
            _ => None,
        }
    }
}

/// One observation. Allocate once with [`Observation::for_geometry`] and reuse: reads copy
/// into it and publishes copy out of it without allocating.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// Set by the writer on publish, by the reader on read.
    pub seq: u64,
    /// Set by the writer on publish, by the reader on read.
    pub writer_epoch: u64,
    /// CLOCK_MONOTONIC ns when the frames were captured (the firmware's clock).
    pub capture_time_ns: u64,
    /// Seed for reproducible sampling of the policy on this observation.
    pub seed: u64,
    /// Index of the instruction (prompt) the robot is following.
    pub instruction_id: u32,
    /// `state_dims` values.
    pub state: Vec<f32>,
    /// `cameras` frames one after another, each `height * width * channels` bytes, HWC.
    pub frames: Vec<u8>,
}

impl Observation {
    /// A zeroed observation with buffers sized for `geometry`; fails if the frame size
    /// overflows.
    pub fn for_geometry(geometry: &Geometry) -> Result<Self, ConfigError> {
        Ok(Observation {
            seq: 0,
            writer_epoch: 0,
            capture_time_ns: 0,
            seed: 0,
            instruction_id: 0,
            state: vec![0.0; geometry.state_dims as usize],
            frames: vec![0; geometry.frame_bytes()?],
        })
    }
}

/// One step of an action chunk. Allocate once with [`Action::for_geometry`] and reuse.
#[derive(Clone, Debug, PartialEq)]
pub struct Action {
    /// Set by the writer on publish, by the reader on read.
    pub seq: u64,
    /// Set by the writer on publish, by the reader on read.
    pub writer_epoch: u64,
    /// Seq of the observation the chunk was computed from.
    pub source_obs_seq: u64,
    /// CLOCK_MONOTONIC ns when the action was made.
    pub made_time_ns: u64,
    /// CLOCK_MONOTONIC ns after which the firmware must not apply the step (fail closed).
    pub valid_until_ns: u64,
    /// Identifies the chunk; every step of one chunk carries the same id.
    pub chunk_id: u64,
    /// Position of this step in its chunk, `< chunk_len`.
    pub step_index: u32,
    /// Whether the firmware applies, holds or stops; only [`ActionStatus::Ok`] is applied.
    pub status: ActionStatus,
    /// `action_dims` values.
    pub values: Vec<f32>,
}

impl Action {
    /// A zeroed [`ActionStatus::Hold`] step with `values` sized for `geometry`.
    pub fn for_geometry(geometry: &Geometry) -> Self {
        Action {
            seq: 0,
            writer_epoch: 0,
            source_obs_seq: 0,
            made_time_ns: 0,
            valid_until_ns: 0,
            chunk_id: 0,
            step_index: 0,
            status: ActionStatus::Hold,
            values: vec![0.0; geometry.action_dims as usize],
        }
    }

    /// Fail closed: only an `Ok` step that has not expired may be applied.
    pub fn applicable_at(&self, now_ns: u64) -> bool {
        self.status == ActionStatus::Ok && now_ns < self.valid_until_ns
    }
}

/// One instruction as text, written by the firmware to the instruction segment. Allocate
/// once with [`InstructionText::new`] and reuse: reads copy into its fixed buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct InstructionText {
    /// Set by the writer on publish, by the reader on read.
    pub seq: u64,
    /// Set by the writer on publish, by the reader on read.
    pub writer_epoch: u64,
    /// CLOCK_MONOTONIC ns when the firmware wrote the text.
    pub written_time_ns: u64,
    /// The firmware's id of the text, below [`TEXT_ID_FLAG`]; an observation following
    /// it carries `instruction_id = TEXT_ID_FLAG | text_id`.
    pub text_id: u32,
    len: usize,
    bytes: Box<[u8; MAX_TEXT_BYTES]>,
}

impl Default for InstructionText {
    fn default() -> Self {
        Self::new()
    }
}

impl InstructionText {
    /// An empty text.
    pub fn new() -> Self {
        InstructionText {
            seq: 0,
            writer_epoch: 0,
            written_time_ns: 0,
            text_id: 0,
            len: 0,
            bytes: Box::new([0; MAX_TEXT_BYTES]),
        }
    }

    /// The text's bytes as written (UTF-8 is the firmware's promise, not checked here).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Sets the text; `Err` with its length if it has more than [`MAX_TEXT_BYTES`] bytes.
    pub fn set_bytes(&mut self, text: &[u8]) -> Result<(), usize> {
        if text.len() > MAX_TEXT_BYTES {
            return Err(text.len());
        }
        self.bytes[..text.len()].copy_from_slice(text);
        self.bytes[text.len()..].fill(0);
        self.len = text.len();
        Ok(())
    }
}

/// The observation `instruction_id` naming text `text_id` of the instruction segment, or
/// `None` when `text_id` does not fit below [`TEXT_ID_FLAG`].
pub fn text_instruction_id(text_id: u32) -> Option<u32> {
    (text_id < TEXT_ID_FLAG).then_some(TEXT_ID_FLAG | text_id)
}

/// The `text_id` an observation's `instruction_id` names, or `None` for a fixed instruction.
pub fn text_id_of(instruction_id: u32) -> Option<u32> {
    (instruction_id & TEXT_ID_FLAG != 0).then_some(instruction_id & !TEXT_ID_FLAG)
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Observation {}
    impl Sealed for super::Action {}
    impl Sealed for super::InstructionText {}
}

/// The slot payloads: [`Observation`], [`Action`] and [`InstructionText`].
pub trait SlotItem: sealed::Sealed {
    /// Which ring carries this item.
    const KIND: RingKind;
    #[doc(hidden)]
    fn length_mismatch(&self, layout: &RingLayout) -> Option<(&'static str, usize, usize)>;
    #[doc(hidden)]
    fn store(&self, seq: u64, epoch: u64, layout: &RingLayout, out: &PayloadWriter<'_>);
    /// Fills `self`; `Err(raw)` if a status word is not a known status.
    #[doc(hidden)]
    fn load(&mut self, layout: &RingLayout, from: &PayloadReader<'_>) -> Result<(), u32>;
    #[doc(hidden)]
    fn seq(&self) -> u64;
}

fn check_len(
    field: &'static str,
    expected: usize,
    found: usize,
) -> Option<(&'static str, usize, usize)> {
    (expected != found).then_some((field, expected, found))
}

impl SlotItem for Observation {
    const KIND: RingKind = RingKind::Observation;

    fn length_mismatch(&self, layout: &RingLayout) -> Option<(&'static str, usize, usize)> {
        check_len("state", layout.value_count(), self.state.len())
            .or_else(|| check_len("frames", layout.frame_bytes, self.frames.len()))
    }

    fn store(&self, seq: u64, epoch: u64, layout: &RingLayout, out: &PayloadWriter<'_>) {
        out.store_u64(offset_of!(ObservationSlotFixed, seq), seq);
        out.store_u64(offset_of!(ObservationSlotFixed, writer_epoch), epoch);
        out.store_u64(
            offset_of!(ObservationSlotFixed, capture_time_ns),
            self.capture_time_ns,
        );
        out.store_u64(offset_of!(ObservationSlotFixed, seed), self.seed);
        out.store_u32_pair(
            offset_of!(ObservationSlotFixed, instruction_id),
            self.instruction_id,
            0,
        );
        out.store_f32s(layout.values_offset, &self.state);
        out.store_bytes(layout.frames_offset, &self.frames);
    }

    fn load(&mut self, layout: &RingLayout, from: &PayloadReader<'_>) -> Result<(), u32> {
        self.seq = from.load_u64(offset_of!(ObservationSlotFixed, seq));
        self.writer_epoch = from.load_u64(offset_of!(ObservationSlotFixed, writer_epoch));
        self.capture_time_ns = from.load_u64(offset_of!(ObservationSlotFixed, capture_time_ns));
        self.seed = from.load_u64(offset_of!(ObservationSlotFixed, seed));
        self.instruction_id = from
            .load_u32_pair(offset_of!(ObservationSlotFixed, instruction_id))
            .0;
        from.load_f32s(layout.values_offset, &mut self.state);
        from.load_bytes(layout.frames_offset, &mut self.frames);
        Ok(())
    }

    fn seq(&self) -> u64 {
        self.seq
    }
}

impl SlotItem for Action {
    const KIND: RingKind = RingKind::Action;

    fn length_mismatch(&self, layout: &RingLayout) -> Option<(&'static str, usize, usize)> {
        check_len("values", layout.value_count(), self.values.len())
    }

    fn store(&self, seq: u64, epoch: u64, layout: &RingLayout, out: &PayloadWriter<'_>) {
        out.store_u64(offset_of!(ActionSlotFixed, seq), seq);
        out.store_u64(offset_of!(ActionSlotFixed, writer_epoch), epoch);
        out.store_u64(
            offset_of!(ActionSlotFixed, source_obs_seq),
            self.source_obs_seq,
        );
        out.store_u64(offset_of!(ActionSlotFixed, made_time_ns), self.made_time_ns);
        out.store_u64(
            offset_of!(ActionSlotFixed, valid_until_ns),
            self.valid_until_ns,
        );
        out.store_u64(offset_of!(ActionSlotFixed, chunk_id), self.chunk_id);
        out.store_u32_pair(
            offset_of!(ActionSlotFixed, step_index),
            self.step_index,
            self.status as u32,
        );
        out.store_f32s(layout.values_offset, &self.values);
    }

    fn load(&mut self, layout: &RingLayout, from: &PayloadReader<'_>) -> Result<(), u32> {
        self.seq = from.load_u64(offset_of!(ActionSlotFixed, seq));
        self.writer_epoch = from.load_u64(offset_of!(ActionSlotFixed, writer_epoch));
        self.source_obs_seq = from.load_u64(offset_of!(ActionSlotFixed, source_obs_seq));
        self.made_time_ns = from.load_u64(offset_of!(ActionSlotFixed, made_time_ns));
        self.valid_until_ns = from.load_u64(offset_of!(ActionSlotFixed, valid_until_ns));
        self.chunk_id = from.load_u64(offset_of!(ActionSlotFixed, chunk_id));
        let (step_index, status) = from.load_u32_pair(offset_of!(ActionSlotFixed, step_index));
        self.step_index = step_index;
        from.load_f32s(layout.values_offset, &mut self.values);
        self.status = ActionStatus::from_raw(status).ok_or(status)?;
        Ok(())
    }

    fn seq(&self) -> u64 {
        self.seq
    }
}

impl SlotItem for InstructionText {
    const KIND: RingKind = RingKind::Instruction;

    fn length_mismatch(&self, _: &RingLayout) -> Option<(&'static str, usize, usize)> {
        // The buffer is fixed-size; `set_bytes` keeps `len` within it.
        None
    }

    fn store(&self, seq: u64, epoch: u64, _: &RingLayout, out: &PayloadWriter<'_>) {
        out.store_u64(offset_of!(InstructionSlotFixed, seq), seq);
        out.store_u64(offset_of!(InstructionSlotFixed, writer_epoch), epoch);
        out.store_u64(
            offset_of!(InstructionSlotFixed, written_time_ns),
            self.written_time_ns,
        );
        out.store_u32_pair(
            offset_of!(InstructionSlotFixed, text_id),
            self.text_id,
            self.len as u32,
        );
        for word in offset_of!(InstructionSlotFixed, reserved) / 8..SLOT_FIXED_SIZE / 8 {
            out.store_u64(word * 8, 0);
        }
        out.store_bytes(SLOT_FIXED_SIZE, &self.bytes[..]);
    }

    fn load(&mut self, _: &RingLayout, from: &PayloadReader<'_>) -> Result<(), u32> {
        self.seq = from.load_u64(offset_of!(InstructionSlotFixed, seq));
        self.writer_epoch = from.load_u64(offset_of!(InstructionSlotFixed, writer_epoch));
        self.written_time_ns = from.load_u64(offset_of!(InstructionSlotFixed, written_time_ns));
        let (text_id, len) = from.load_u32_pair(offset_of!(InstructionSlotFixed, text_id));
        self.text_id = text_id;
        if len as usize > MAX_TEXT_BYTES {
            self.len = 0;
            return Err(len);
        }
        self.len = len as usize;
        from.load_bytes(SLOT_FIXED_SIZE, &mut self.bytes[..self.len]);
        Ok(())
    }

    fn seq(&self) -> u64 {
        self.seq
    }
}
