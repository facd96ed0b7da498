//! `vla-ring`: the two fixed shared-memory rings between the robot firmware and the
//! runtime, with a stable C ABI (`runtime/include/vla_ring.h`).
//!
//! - The **observation ring** is written by the firmware (camera frames, robot state) and
//!   read by the runtime.
//! - The **action ring** is written by the runtime (one action step per slot) and read by
//!   the firmware's control loop.
//! - The **instruction segment** (magic `"VLA-TXT\0"`, a small ring of its own beside the
//!   observation ring, whose layout it leaves unchanged) is written by the firmware: one
//!   instruction as UTF-8 text per slot, `u64 seqlock, seq, writer_epoch,
//!   written_time_ns`, `u32 text_id, len`, `u64 reserved[3]`, then [`MAX_TEXT_BYTES`] of
//!   text at 64. An observation follows that text by carrying `instruction_id =
//!   TEXT_ID_FLAG | text_id` ([`TEXT_ID_FLAG`] = 1 << 31; ids without it stay the bundle's
//!   fixed instructions). Same header, seqlock, writer start and reader checks as the
//!   rings; its geometry fields carry the robot link's, so a skewed firmware is caught.
//!
//! The crate knows nothing of policies or the NPU: it is a building block that moves
//! fixed-size records between exactly one writer and any number of readers, lock-free.
//!
//! # Layout
//!
//! A segment is one file (usually in `/dev/shm`, any path works), mapped `MAP_SHARED`:
//!
//! ```text
//! [ header: 128 bytes ][ slot 0 ][ slot 1 ] ... [ slot N-1 ]
//! ```
//!
//! All integers are native-endian; every slot is `slot_size` bytes, a multiple of 64 so
//! no two slots share a cache line.
//!
//! | header offset | field | |
//! |---:|---|---|
//! | 0 | `u64 magic` | `"VLA-OBS\0"` / `"VLA-ACT\0"` as a little-endian u64 |
//! | 8 | `u32 abi_major` | reader needs equality |
//! | 12 | `u32 abi_version` | the writer's version |
//! | 16 | `u32 abi_lowest_compatible` | reader needs `its version >= this` |
//! | 20 | `u32 header_size` | 128; slots start here |
//! | 24 | `u64 total_size` | `header_size + slot_count * slot_size` |
//! | 32 | `u32 slot_count`, `u32 slot_size` | |
//! | 40 | geometry, 8 x `u32` | cameras, height, width, channels, state_dims, action_dims, chunk_len, reserved |
//! | 72 | `u32 initializing` | 1 while a writer (re)writes the header |
//! | 76 | `u32 writer_pid` | |
//! | 80 | `u64 writer_epoch` | bumped at every writer start |
//! | 88 | `u64 writer_heartbeat_ns` | CLOCK_MONOTONIC of the last publish/heartbeat |
//! | 96 | `u64 published` | seq of the newest complete slot (0 = none) |
//! | 104 | `u64 reserved[3]` | |
//!
//! Observation slot: `u64 seqlock, seq, writer_epoch, capture_time_ns, seed`,
//! `u32 instruction_id, reserved`, `u64 reserved[2]` (64 bytes), then
//! `f32 state[state_dims]` at 64, then the frames (`cameras` x HWC `u8`) at the next
//! multiple of 64. Action slot: `u64 seqlock, seq, writer_epoch, source_obs_seq,
//! made_time_ns, valid_until_ns, chunk_id`, `u32 step_index, status` (64 bytes), then
//! `f32 values[action_dims]` at 64. Status is 0 ok, 1 hold, 2 fault. For 2 cameras of
//! 224x224 RGB, 7 state dims and 7 action dims: observation slots are 301 184 bytes
//! (frames at 128), action slots 128 bytes.
//!
//! # Protocol
//!
//! Each slot is a seqlock ([`seqlock`]): the writer stores `2*seq - 1` (odd) into the
//! slot's seqlock word, a release fence, the payload with relaxed atomic word stores,
//! then `2*seq` with release, then `published = seq` with release. A reader loads the word
//! (acquire), copies the payload with relaxed atomic word loads, issues an acquire fence
//! and reloads the word: the copy counts only if both loads equal `2*seq`. Torn copies
//! are retried ([`READ_ATTEMPTS`] times, then [`ReadError::Contended`] /
//! [`ReadError::InProgress`]); readers never block or slow the writer. Seqs start at 1
//! and never repeat, also across writer restarts, so `published` always leads to the
//! newest complete slot and a slot left odd by a killed writer is simply skipped.
//!
//! Writer start ([`RingWriter::create`]): take an `flock` on the file (released by the
//! kernel whatever way the holder dies, so nothing stale blocks a restart), then either
//! size and initialize a fresh file, or, for an existing segment of the same kind, ABI
//! major and geometry, set `initializing`, rewrite the header, bump `writer_epoch`,
//! continue after the highest seq any slot holds, and clear `initializing`. An existing
//! file that does not fit is replaced by a new file renamed over the path (never resized
//! under readers that map it). After taking the lock, the path must still name the
//! locked inode (another writer may have renamed a replacement over it meanwhile); else
//! the file is opened again. Every writer start bumps `writer_epoch`, including the C
//! header's in-place re-initialization of a same-size segment of another geometry.
//!
//! Reader start ([`RingReader::open`]): validates magic (and ring kind), ABI
//! (`abi_major` equal, [`ABI_VERSION`] `>= abi_lowest_compatible`), header size,
//! geometry, slot size, total size and file length; each mismatch is an [`OpenError`]
//! naming the field with expected and found values. Reads copy into caller-allocated
//! [`Observation`] / [`Action`] buffers and never allocate. Every read compares the
//! writer epoch with the one the header was last checked for; when it changed, the header
//! is checked again against the reader's layout ([`ReadError::Incompatible`] names the
//! field that no longer fits: reopen), and a copy made while a writer was starting is
//! dropped ([`ReadError::WriterStarting`]: retry).
//!
//! # C firmware
//!
//! `runtime/include/vla_ring.h` is self-contained C11 (`<stdatomic.h>`), with
//! `_Static_assert`s pinning every size and offset above. A firmware:
//! - **reads actions**: `open` + `mmap(PROT_READ, MAP_SHARED)` the action ring, call
//!   `vla_ring_check()` once with its geometry, then each control tick
//!   `vla_ring_action_read_latest()`; apply the step only if `status == VLA_RING_STATUS_OK`
//!   and `now < valid_until_ns` (fail closed), and watch `writer_heartbeat_ns`;
//! - **writes observations**: `open(O_RDWR|O_CREAT)` + `flock(LOCK_EX|LOCK_NB)` +
//!   `ftruncate(vla_ring_total_size())` (fresh file only) + `mmap(PROT_READ|PROT_WRITE,
//!   MAP_SHARED)`, then `vla_ring_writer_start()` (fresh or restarted), and per frame
//!   `vla_ring_obs_publish()`.
//!
//! # Tests
//!
//! - `cargo test -p vla-ring`: unit tests, ABI offsets, bad input, the C reader/writer
//!   built with the system `cc` against the header alone, and a multi-process test that
//!   SIGKILLs the writer mid-write again and again while a reader checks every copy.
//! - `RUSTFLAGS="--cfg loom" cargo test -p vla-ring --release --test loom`: model-checks
//!   the seqlock code of [`seqlock`] with loom (a few seconds).
//! - aarch64 under qemu: `CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
//!   CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
//!   cargo test -p vla-ring --target aarch64-unknown-linux-gnu` (the C test then skips:
//!   the host `cc` cannot build for the target).

// `unsafe` only in `shm.rs`, the one module that touches raw shared memory.
#![deny(unsafe_code)]

pub mod seqlock;

#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
mod layout;
#[cfg(not(loom))]
mod ring;
#[cfg(not(loom))]
mod shm;

#[cfg(not(loom))]
pub use error::{ConfigError, CreateError, OpenError, PublishError, ReadError};
#[cfg(not(loom))]
pub use layout::{
    ActionSlotFixed, Geometry, InstructionSlotFixed, ObservationSlotFixed, RawGeometry, RingHeader,
    RingKind, RingLayout, ABI_LOWEST_COMPATIBLE, ABI_MAJOR, ABI_VERSION, ACTION_MAGIC, HEADER_SIZE,
    MAX_SLOTS, MAX_TEXT_BYTES, MIN_SLOTS, OBS_MAGIC, PACK_ID_FLAG, SLOT_ALIGN, SLOT_FIXED_SIZE,
    STATE_INITIALIZING, STATE_READY, TEXT_ID_FLAG, TEXT_MAGIC,
};
#[cfg(not(loom))]
pub use ring::{
    monotonic_ns, text_id_of, text_instruction_id, Action, ActionReader, ActionStatus,
    ActionWriter, InstructionReader, InstructionText, InstructionWriter, Observation,
    ObservationReader, ObservationWriter, Origin, RingReader, RingWriter, SlotItem, READ_ATTEMPTS,
};
