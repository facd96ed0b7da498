//! The byte layout of a ring segment: header, slot fixed parts, geometry and the sizes
//! derived from it. This is the ABI shared with `runtime/include/vla_ring.h`; every number
//! here is pinned there by `_Static_assert` and here by const asserts and `tests/abi.rs`.
//!
//! All shared fields are atomics because another process writes them while we read; the
//! structs are never constructed by value, only viewed in the mapping (see `shm.rs`).

use core::mem::{align_of, offset_of, size_of};
use core::sync::atomic::{AtomicU32, AtomicU64};

use crate::error::ConfigError;

/// `magic` of an observation ring: the bytes `"VLA-OBS\0"` read as a little-endian u64.
/// Stored as a native-endian number, compared as a number.
pub const OBS_MAGIC: u64 = u64::from_le_bytes(*b"VLA-OBS\0");
/// `magic` of an action ring: the bytes `"VLA-ACT\0"` read as a little-endian u64.
pub const ACTION_MAGIC: u64 = u64::from_le_bytes(*b"VLA-ACT\0");
/// Header `magic` of the instruction segment: `"VLA-TXT\0"`.
pub const TEXT_MAGIC: u64 = u64::from_le_bytes(*b"VLA-TXT\0");
/// Most UTF-8 bytes one instruction text slot carries.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Set in an observation's `instruction_id`: the low 31 bits are the `text_id` of a text
/// written to the instruction segment; clear, the id is one of the bundle's fixed
/// instructions (so every id in use before stays valid).
pub const TEXT_ID_FLAG: u32 = 1 << 31;
/// Set (with [`TEXT_ID_FLAG`] clear) in an observation's `instruction_id`: a Fast-WAM
/// instruction pack's instruction, by the id its pack lists; the ring carries it as any id.
pub const PACK_ID_FLAG: u32 = 1 << 30;

/// Layout-breaking changes bump the major; a reader accepts only its own major.
pub const ABI_MAJOR: u32 = 1;
/// Compatible additions (fields carved out of `reserved`) bump the version.
pub const ABI_VERSION: u32 = 0;
/// The oldest reader version that can still read what this writer writes
/// (perf_event's `compat_version`): a reader needs `ABI_VERSION >= abi_lowest_compatible`.
pub const ABI_LOWEST_COMPATIBLE: u32 = 0;

/// Bytes before the first slot.
pub const HEADER_SIZE: usize = 128;
/// Slots start and end on a cache line so that the writer filling one slot does not
/// invalidate the line a reader is copying from the neighbour.
pub const SLOT_ALIGN: usize = 64;
/// Bytes of the fixed part of either slot kind; the variable part follows.
pub const SLOT_FIXED_SIZE: usize = 64;

/// `initializing` while the header is being (re)written by a starting writer.
pub const STATE_INITIALIZING: u32 = 1;
/// `initializing` once the header is complete.
pub const STATE_READY: u32 = 0;

/// Which of the two rings a segment is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingKind {
    /// Firmware -> runtime: camera frames and robot state.
    Observation,
    /// Runtime -> firmware: one action step per slot.
    Action,
    /// Firmware -> runtime: instructions as UTF-8 text, one per slot, named by `text_id`.
    Instruction,
}

impl RingKind {
    /// The header `magic` of this ring kind.
    pub const fn magic(self) -> u64 {
        match self {
            RingKind::Observation => OBS_MAGIC,
            RingKind::Action => ACTION_MAGIC,
            RingKind::Instruction => TEXT_MAGIC,
        }
    }

    /// Lower-case name for messages: `"observation"`, `"action"` or `"instruction"`.
    pub const fn name(self) -> &'static str {
        match self {
            RingKind::Observation => "observation",
            RingKind::Action => "action",
            RingKind::Instruction => "instruction",
        }
    }

    /// The kind a header `magic` names, or `None` for anything that is not a ring magic.
    pub fn from_magic(magic: u64) -> Option<RingKind> {
        match magic {
            OBS_MAGIC => Some(RingKind::Observation),
            ACTION_MAGIC => Some(RingKind::Action),
            TEXT_MAGIC => Some(RingKind::Instruction),
            _ => None,
        }
    }
}

impl core::fmt::Display for RingKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// The robot link's shape. Both rings carry all of it, so a configuration skew between
/// firmware and runtime is caught whichever ring is opened first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Camera frames per observation (0 = state only).
    pub cameras: u32,
    /// Frame height in pixels.
    pub height: u32,
    /// Frame width in pixels.
    pub width: u32,
    /// Bytes per pixel (3 for RGB8).
    pub channels: u32,
    /// f32 values of robot state per observation.
    pub state_dims: u32,
    /// f32 values per action step.
    pub action_dims: u32,
    /// Steps per action chunk (slots carry `step_index < chunk_len`).
    pub chunk_len: u32,
}

impl Geometry {
    /// Field names and values in header order, for mismatch reports.
    pub fn fields(&self) -> [(&'static str, u32); 7] {
        [
            ("cameras", self.cameras),
            ("height", self.height),
            ("width", self.width),
            ("channels", self.channels),
            ("state_dims", self.state_dims),
            ("action_dims", self.action_dims),
            ("chunk_len", self.chunk_len),
        ]
    }

    /// Bytes of all camera frames of one observation, `cameras * height * width * channels`.
    pub fn frame_bytes(&self) -> Result<usize, ConfigError> {
        [self.height, self.width, self.channels]
            .iter()
            .try_fold(self.cameras as u64, |acc, &d| acc.checked_mul(d as u64))
            .filter(|&b| b <= u32::MAX as u64)
            .map(|b| b as usize)
            .ok_or(ConfigError::TooLarge {
                what: "camera frames",
            })
    }

    /// Bytes of one camera frame.
    pub fn bytes_per_frame(&self) -> usize {
        self.height as usize * self.width as usize * self.channels as usize
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.action_dims == 0 {
            return Err(ConfigError::Zero {
                field: "action_dims",
            });
        }
        if self.chunk_len == 0 {
            return Err(ConfigError::Zero { field: "chunk_len" });
        }
        if self.cameras > 0 {
            for (field, value) in [
                ("height", self.height),
                ("width", self.width),
                ("channels", self.channels),
            ] {
                if value == 0 {
                    return Err(ConfigError::Zero { field });
                }
            }
        }
        self.frame_bytes().map(|_| ())
    }
}

/// The geometry as stored in the header: seven u32 and one reserved word.
#[repr(C)]
pub struct RawGeometry {
    /// See [`Geometry::cameras`].
    pub cameras: AtomicU32,
    /// See [`Geometry::height`].
    pub height: AtomicU32,
    /// See [`Geometry::width`].
    pub width: AtomicU32,
    /// See [`Geometry::channels`].
    pub channels: AtomicU32,
    /// See [`Geometry::state_dims`].
    pub state_dims: AtomicU32,
    /// See [`Geometry::action_dims`].
    pub action_dims: AtomicU32,
    /// See [`Geometry::chunk_len`].
    pub chunk_len: AtomicU32,
    /// Written as 0; free for a compatible ABI addition.
    pub reserved: AtomicU32,
}

/// The segment header (128 bytes, two cache lines). The first line is written once per
/// writer start; the second holds what the writer touches while running.
#[repr(C)]
pub struct RingHeader {
    /// [`OBS_MAGIC`] or [`ACTION_MAGIC`]; 0 while a fresh file is being sized.
    pub magic: AtomicU64,
    /// [`ABI_MAJOR`] of the writer that last started; a reader needs it equal to its own.
    pub abi_major: AtomicU32,
    /// ABI version of the writer that last started.
    pub abi_version: AtomicU32,
    /// Oldest reader version that can read this segment.
    pub abi_lowest_compatible: AtomicU32,
    /// [`HEADER_SIZE`]: slots start here.
    pub header_size: AtomicU32,
    /// `header_size + slot_count * slot_size`.
    pub total_size: AtomicU64,
    /// Number of slots, `MIN_SLOTS..=MAX_SLOTS`.
    pub slot_count: AtomicU32,
    /// Bytes per slot, a multiple of [`SLOT_ALIGN`].
    pub slot_size: AtomicU32,
    /// The robot link's shape the slots are sized for.
    pub geometry: RawGeometry,
    /// [`STATE_INITIALIZING`] while a writer (re)writes the header, else [`STATE_READY`].
    pub initializing: AtomicU32,
    /// Process id of the writer that last started.
    pub writer_pid: AtomicU32,
    /// Bumped by every writer start; a reader seeing it change knows the writer restarted.
    pub writer_epoch: AtomicU64,
    /// CLOCK_MONOTONIC ns of the writer's last sign of life (publish or heartbeat).
    pub writer_heartbeat_ns: AtomicU64,
    /// Seq of the newest complete slot, 0 before the first publish.
    pub published: AtomicU64,
    /// Written as 0; free for compatible ABI additions.
    pub reserved: [AtomicU64; 3],
}

/// Fixed part of an observation slot; `state` (f32 x state_dims) follows at
/// [`SLOT_FIXED_SIZE`], then the camera frames (camera-major, HWC, u8) at the next
/// 64-byte boundary.
#[repr(C)]
pub struct ObservationSlotFixed {
    /// Seqlock word: `2*seq - 1` (odd) while seq is written, `2*seq` once complete.
    pub seqlock: AtomicU64,
    /// The seq this slot holds (valid only when the seqlock word is `2*seq`).
    pub seq: AtomicU64,
    /// Epoch of the writer that wrote this slot.
    pub writer_epoch: AtomicU64,
    /// CLOCK_MONOTONIC ns when the frames were captured.
    pub capture_time_ns: AtomicU64,
    /// Seed for reproducible sampling of the policy on this observation.
    pub seed: AtomicU64,
    /// Index of the instruction (prompt) the robot is following.
    pub instruction_id: AtomicU32,
    /// Written as 0; free for a compatible ABI addition.
    pub reserved32: AtomicU32,
    /// Written as 0; free for compatible ABI additions.
    pub reserved: [AtomicU64; 2],
}

/// Fixed part of an action slot (one step of a chunk); `values` (f32 x action_dims)
/// follow at [`SLOT_FIXED_SIZE`].
#[repr(C)]
pub struct ActionSlotFixed {
    /// Seqlock word: `2*seq - 1` (odd) while seq is written, `2*seq` once complete.
    pub seqlock: AtomicU64,
    /// The seq this slot holds (valid only when the seqlock word is `2*seq`).
    pub seq: AtomicU64,
    /// Epoch of the writer that wrote this slot.
    pub writer_epoch: AtomicU64,
    /// Seq of the observation the chunk was computed from.
    pub source_obs_seq: AtomicU64,
    /// CLOCK_MONOTONIC ns when the action was made.
    pub made_time_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns after which the reader must not apply it (fail closed).
    pub valid_until_ns: AtomicU64,
    /// Identifies the chunk the step belongs to; every step of one chunk carries the same id.
    pub chunk_id: AtomicU64,
    /// Position of this step in its chunk, `< chunk_len`.
    pub step_index: AtomicU32,
    /// [`crate::ActionStatus`] as u32: 0 ok, 1 hold, 2 fault.
    pub status: AtomicU32,
}

/// Fixed part of an instruction slot; the text (`len` UTF-8 bytes, not NUL-terminated)
/// follows at [`SLOT_FIXED_SIZE`], [`MAX_TEXT_BYTES`] reserved.
#[repr(C)]
pub struct InstructionSlotFixed {
    /// Seqlock word: `2*seq - 1` (odd) while seq is written, `2*seq` once complete.
    pub seqlock: AtomicU64,
    /// The seq this slot holds (valid only when the seqlock word is `2*seq`).
    pub seq: AtomicU64,
    /// Epoch of the writer that wrote this slot.
    pub writer_epoch: AtomicU64,
    /// CLOCK_MONOTONIC ns when the firmware wrote the text.
    pub written_time_ns: AtomicU64,
    /// The firmware's id for this text (< [`TEXT_ID_FLAG`]); observations name it as
    /// `TEXT_ID_FLAG | text_id`.
    pub text_id: AtomicU32,
    /// Bytes of text, `<= MAX_TEXT_BYTES`.
    pub len: AtomicU32,
    /// Written as 0; free for compatible ABI additions.
    pub reserved: [AtomicU64; 3],
}

const _: () = {
    assert!(size_of::<InstructionSlotFixed>() == SLOT_FIXED_SIZE);
    assert!(offset_of!(InstructionSlotFixed, seqlock) == 0);
    assert!(offset_of!(InstructionSlotFixed, written_time_ns) == 24);
    assert!(offset_of!(InstructionSlotFixed, text_id) == 32);
    assert!(offset_of!(InstructionSlotFixed, len) == 36);
    assert!(MAX_TEXT_BYTES % SLOT_ALIGN == 0);
};

const _: () = {
    assert!(size_of::<RawGeometry>() == 32);
    assert!(size_of::<RingHeader>() == HEADER_SIZE);
    assert!(align_of::<RingHeader>() == 8);
    assert!(offset_of!(RingHeader, geometry) == 40);
    assert!(offset_of!(RingHeader, initializing) == 72);
    assert!(offset_of!(RingHeader, published) == 96);
    assert!(size_of::<ObservationSlotFixed>() == SLOT_FIXED_SIZE);
    assert!(size_of::<ActionSlotFixed>() == SLOT_FIXED_SIZE);
    assert!(offset_of!(ObservationSlotFixed, seqlock) == 0);
    assert!(offset_of!(ActionSlotFixed, seqlock) == 0);
    assert!(HEADER_SIZE % SLOT_ALIGN == 0);
};

pub(crate) const fn round_up(value: usize, to: usize) -> usize {
    value.div_ceil(to) * to
}

/// Sizes and offsets of one ring, derived from kind, geometry and slot count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Which ring the layout is for.
    pub kind: RingKind,
    /// The robot link's shape.
    pub geometry: Geometry,
    /// Number of slots, `MIN_SLOTS..=MAX_SLOTS`.
    pub slot_count: u32,
    /// Bytes per slot, a multiple of [`SLOT_ALIGN`].
    pub slot_size: usize,
    /// `HEADER_SIZE + slot_count * slot_size`.
    pub total_size: usize,
    /// Offset of the f32 array in a slot (state or action values).
    pub values_offset: usize,
    /// Offset of the camera frames in an observation slot (equals `slot_size` for actions).
    pub frames_offset: usize,
    /// Bytes of camera frames per slot (0 for actions).
    pub frame_bytes: usize,
}

/// Fewer than two slots would leave the newest complete slot unreadable while the next
/// one is written.
pub const MIN_SLOTS: u32 = 2;
/// Keeps a mistyped slot count from allocating gigabytes.
pub const MAX_SLOTS: u32 = 1 << 16;

impl RingLayout {
    /// Derives the layout. Fails with [`ConfigError`] when the geometry has a zero field it
    /// needs, the slot count is out of range, or a size overflows the ABI's fields.
    pub fn new(kind: RingKind, geometry: Geometry, slot_count: u32) -> Result<Self, ConfigError> {
        geometry.validate()?;
        if !(MIN_SLOTS..=MAX_SLOTS).contains(&slot_count) {
            return Err(ConfigError::SlotCount { found: slot_count });
        }
        let values_offset = SLOT_FIXED_SIZE;
        let (frames_offset, frame_bytes, slot_size) = match kind {
            RingKind::Observation => {
                let frames_offset =
                    round_up(values_offset + 4 * geometry.state_dims as usize, SLOT_ALIGN);
                let frame_bytes = geometry.frame_bytes()?;
                let end = frames_offset + frame_bytes;
                (frames_offset, frame_bytes, round_up(end, SLOT_ALIGN))
            }
            RingKind::Action => {
                let end = round_up(
                    values_offset + 4 * geometry.action_dims as usize,
                    SLOT_ALIGN,
                );
                (end, 0, end)
            }
            // The geometry is carried (and checked) only to catch a firmware configured
            // for another robot link; the text slot's size does not depend on it.
            RingKind::Instruction => {
                let end = SLOT_FIXED_SIZE + MAX_TEXT_BYTES;
                (end, 0, end)
            }
        };
        if slot_size > u32::MAX as usize {
            return Err(ConfigError::TooLarge { what: "slot" });
        }
        let total_size = (slot_count as usize)
            .checked_mul(slot_size)
            .and_then(|s| s.checked_add(HEADER_SIZE))
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or(ConfigError::TooLarge { what: "segment" })?;
        Ok(RingLayout {
            kind,
            geometry,
            slot_count,
            slot_size,
            total_size,
            values_offset,
            frames_offset,
            frame_bytes,
        })
    }

    /// Number of f32 in the slot's value array.
    pub fn value_count(&self) -> usize {
        match self.kind {
            RingKind::Observation => self.geometry.state_dims as usize,
            RingKind::Action => self.geometry.action_dims as usize,
            RingKind::Instruction => 0,
        }
    }

    /// Slot size in 8-byte words (the seqlock copies whole words).
    pub fn slot_words(&self) -> usize {
        self.slot_size / 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Geometry {
        Geometry {
            cameras: 2,
            height: 224,
            width: 224,
            channels: 3,
            state_dims: 7,
            action_dims: 7,
            chunk_len: 8,
        }
    }

    #[test]
    fn observation_layout_pads_state_and_slot_to_cache_lines() {
        let l = RingLayout::new(RingKind::Observation, sample(), 4).unwrap();
        assert_eq!(l.values_offset, 64);
        assert_eq!(
            l.frames_offset, 128,
            "7 f32 of state end at 92, next line is 128"
        );
        assert_eq!(l.slot_size, 128 + 2 * 224 * 224 * 3);
        assert_eq!(l.slot_size % SLOT_ALIGN, 0);
        assert_eq!(l.total_size, HEADER_SIZE + 4 * l.slot_size);
    }

    #[test]
    fn action_layout_is_fixed_part_plus_values() {
        let l = RingLayout::new(RingKind::Action, sample(), 16).unwrap();
        assert_eq!(l.slot_size, 128);
        let wide = Geometry {
            action_dims: 32,
            ..sample()
        };
        assert_eq!(
            RingLayout::new(RingKind::Action, wide, 16)
                .unwrap()
                .slot_size,
            192
        );
    }

    #[test]
    fn rejects_unusable_configurations() {
        let zero_actions = Geometry {
            action_dims: 0,
            ..sample()
        };
        assert_eq!(
            RingLayout::new(RingKind::Action, zero_actions, 4),
            Err(ConfigError::Zero {
                field: "action_dims"
            })
        );
        let no_width = Geometry {
            width: 0,
            ..sample()
        };
        assert_eq!(
            RingLayout::new(RingKind::Observation, no_width, 4),
            Err(ConfigError::Zero { field: "width" })
        );
        assert_eq!(
            RingLayout::new(RingKind::Action, sample(), 1),
            Err(ConfigError::SlotCount { found: 1 })
        );
        let huge = Geometry {
            height: 1 << 20,
            width: 1 << 20,
            ..sample()
        };
        assert_eq!(
            RingLayout::new(RingKind::Observation, huge, 4),
            Err(ConfigError::TooLarge {
                what: "camera frames"
            })
        );
    }

    #[test]
    fn magics_differ_and_read_as_ascii_on_little_endian() {
        assert_ne!(OBS_MAGIC, ACTION_MAGIC);
        assert_eq!(OBS_MAGIC, 0x0053_424F_2D41_4C56);
        assert_eq!(ACTION_MAGIC, 0x0054_4341_2D41_4C56);
        assert_eq!(RingKind::from_magic(OBS_MAGIC), Some(RingKind::Observation));
        assert_eq!(RingKind::from_magic(0), None);
        assert_eq!(TEXT_MAGIC, 0x0054_5854_2D41_4C56);
        assert_eq!(
            RingKind::from_magic(TEXT_MAGIC),
            Some(RingKind::Instruction)
        );
        let text = RingLayout::new(RingKind::Instruction, sample(), 4).unwrap();
        assert_eq!(text.slot_size, 64 + 1024);
        assert_eq!(text.total_size, HEADER_SIZE + 4 * 1088);
    }
}
