//! Writers and readers of ring segments: creating, re-opening after a crash, validating,
//! publishing and copying slots into caller-owned buffers.

use core::marker::PhantomData;
use core::mem::offset_of;
use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::error::{ConfigError, CreateError, OpenError, PublishError, ReadError};
use crate::layout::{
    ActionSlotFixed, Geometry, ObservationSlotFixed, RingHeader, RingKind, RingLayout,
    ABI_LOWEST_COMPATIBLE, ABI_MAJOR, ABI_VERSION, HEADER_SIZE, STATE_INITIALIZING, STATE_READY,
};
use crate::seqlock::{LatestMiss, PayloadReader, PayloadWriter, RingCore, SlotMiss, MAX_SEQ};
use crate::shm::SharedMapping;

/// How many times a read retries while the writer is inside the slot. A slot write is a
/// memcpy of at most a few hundred KiB, so a reader that still loses after this many
/// attempts is being lapped (too few slots) or facing a dead writer's odd slot.
pub const READ_ATTEMPTS: u32 = 16;

/// Segment files are readable by everyone (readers map read-only) and writable by the
/// writer's user.
const SEGMENT_MODE: u32 = 0o644;

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
    pub capture_time_ns: u64,
    pub seed: u64,
    pub instruction_id: u32,
    /// `state_dims` values.
    pub state: Vec<f32>,
    /// `cameras` frames one after another, each `height * width * channels` bytes, HWC.
    pub frames: Vec<u8>,
}

impl Observation {
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
    pub source_obs_seq: u64,
    pub made_time_ns: u64,
    pub valid_until_ns: u64,
    pub chunk_id: u64,
    pub step_index: u32,
    pub status: ActionStatus,
    /// `action_dims` values.
    pub values: Vec<f32>,
}

impl Action {
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

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Observation {}
    impl Sealed for super::Action {}
}

/// The two slot payloads, [`Observation`] and [`Action`].
pub trait SlotItem: sealed::Sealed {
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

fn raw_geometry_fields(h: &RingHeader) -> [&AtomicU32; 7] {
    let g = &h.geometry;
    [
        &g.cameras,
        &g.height,
        &g.width,
        &g.channels,
        &g.state_dims,
        &g.action_dims,
        &g.chunk_len,
    ]
}

/// Checks a mapped header against what the caller expects and returns the segment's
/// layout. `slot_count` is `None` for readers (the writer chooses it). A writer taking
/// over a segment passes `during_takeover` to look past a predecessor that died with
/// `initializing` set.
fn check_header(
    h: &RingHeader,
    path: &Path,
    kind: RingKind,
    geometry: &Geometry,
    slot_count: Option<u32>,
    file_len: u64,
    during_takeover: bool,
) -> Result<RingLayout, OpenError> {
    let path_buf = || path.to_path_buf();
    let initializing = h.initializing.load(Ordering::Acquire);
    let magic = h.magic.load(Ordering::Relaxed);
    if !during_takeover && (magic == 0 || initializing != STATE_READY) {
        return Err(OpenError::Initializing { path: path_buf() });
    }
    if magic != kind.magic() {
        return Err(match RingKind::from_magic(magic) {
            Some(found) => OpenError::WrongKind {
                path: path_buf(),
                expected: kind,
                found,
            },
            None => OpenError::BadMagic {
                path: path_buf(),
                expected: kind.magic(),
                found: magic,
            },
        });
    }
    let abi_major = h.abi_major.load(Ordering::Relaxed);
    if abi_major != ABI_MAJOR {
        return Err(OpenError::AbiMajor {
            path: path_buf(),
            expected: ABI_MAJOR,
            found: abi_major,
        });
    }
    let lowest_compatible = h.abi_lowest_compatible.load(Ordering::Relaxed);
    if ABI_VERSION < lowest_compatible {
        return Err(OpenError::AbiTooOld {
            path: path_buf(),
            reader_version: ABI_VERSION,
            lowest_compatible,
        });
    }
    let mismatch = |field: &'static str, expected: u64, found: u64| OpenError::Mismatch {
        path: path_buf(),
        field,
        expected,
        found,
    };
    let header_size = h.header_size.load(Ordering::Relaxed);
    if header_size as usize != HEADER_SIZE {
        return Err(mismatch(
            "header_size",
            HEADER_SIZE as u64,
            header_size as u64,
        ));
    }
    for ((field, expected), raw) in geometry.fields().into_iter().zip(raw_geometry_fields(h)) {
        let found = raw.load(Ordering::Relaxed);
        if found != expected {
            return Err(mismatch(field, expected as u64, found as u64));
        }
    }
    let found_slots = h.slot_count.load(Ordering::Relaxed);
    if let Some(expected) = slot_count {
        if found_slots != expected {
            return Err(mismatch("slot_count", expected as u64, found_slots as u64));
        }
    }
    let layout =
        RingLayout::new(kind, *geometry, found_slots).map_err(|source| OpenError::Config {
            path: path_buf(),
            source,
        })?;
    let slot_size = h.slot_size.load(Ordering::Relaxed);
    if slot_size as usize != layout.slot_size {
        return Err(mismatch(
            "slot_size",
            layout.slot_size as u64,
            slot_size as u64,
        ));
    }
    let total_size = h.total_size.load(Ordering::Relaxed);
    if total_size != layout.total_size as u64 {
        return Err(mismatch("total_size", layout.total_size as u64, total_size));
    }
    if file_len < total_size {
        return Err(OpenError::Truncated {
            path: path_buf(),
            expected: total_size,
            found: file_len,
        });
    }
    Ok(layout)
}

/// A writer continues after the newest seq the segment holds; a segment where no seq can
/// follow (corrupt: seqlock words would overflow) is replaced instead.
fn check_seqs(mapping: &SharedMapping, layout: &RingLayout, path: &Path) -> Result<(), OpenError> {
    let Some(words) = mapping.slot_words(layout.total_size) else {
        return Err(OpenError::Truncated {
            path: path.to_path_buf(),
            expected: layout.total_size as u64,
            found: mapping.len() as u64,
        });
    };
    let newest =
        RingCore::new(&mapping.header().published, words, layout.slot_words()).newest_seq();
    if newest >= MAX_SEQ {
        return Err(OpenError::SeqOutOfRange {
            path: path.to_path_buf(),
            found: newest,
        });
    }
    Ok(())
}

/// Writes every static header field for `layout` (the same values on every start).
fn write_static_header(h: &RingHeader, layout: &RingLayout) {
    h.abi_major.store(ABI_MAJOR, Ordering::Relaxed);
    h.abi_version.store(ABI_VERSION, Ordering::Relaxed);
    h.abi_lowest_compatible
        .store(ABI_LOWEST_COMPATIBLE, Ordering::Relaxed);
    h.header_size.store(HEADER_SIZE as u32, Ordering::Relaxed);
    h.total_size
        .store(layout.total_size as u64, Ordering::Relaxed);
    h.slot_count.store(layout.slot_count, Ordering::Relaxed);
    h.slot_size
        .store(layout.slot_size as u32, Ordering::Relaxed);
    for ((_, value), raw) in layout
        .geometry
        .fields()
        .into_iter()
        .zip(raw_geometry_fields(h))
    {
        raw.store(value, Ordering::Relaxed);
    }
    h.geometry.reserved.store(0, Ordering::Relaxed);
}

/// How [`RingWriter::create`] came by its segment.
#[derive(Debug)]
pub enum Origin {
    /// No usable file existed; a fresh segment was made.
    Created,
    /// A segment of the same kind, ABI and geometry was kept (e.g. after a crash):
    /// published data stays readable, seqs continue, the epoch was bumped.
    Reopened,
    /// A segment existed but did not fit (reason inside); it was replaced by a fresh file
    /// under the same path. Readers still mapping the old file see
    /// [`RingReader::is_replaced`].
    Replaced(OpenError),
}

fn create_io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> CreateError + 'a {
    move |source| CreateError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// Takes the writer lock; the kernel drops it when the holder dies, however it dies.
fn lock_writer(file: File, path: &Path) -> Result<Flock<File>, CreateError> {
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => Ok(locked),
        Err((file, Errno::EWOULDBLOCK)) => {
            let mut header = [0u8; HEADER_SIZE];
            let pid_offset = offset_of!(RingHeader, writer_pid);
            let pid = match file.read_exact_at(&mut header, 0) {
                Ok(()) => u32::from_ne_bytes([
                    header[pid_offset],
                    header[pid_offset + 1],
                    header[pid_offset + 2],
                    header[pid_offset + 3],
                ]),
                Err(_) => 0,
            };
            Err(CreateError::WriterActive {
                path: path.to_path_buf(),
                pid,
            })
        }
        Err((_, errno)) => Err(CreateError::Io {
            path: path.to_path_buf(),
            op: "flock",
            source: errno.into(),
        }),
    }
}

/// The single writer of one ring. Holds an exclusive flock on the segment for its lifetime.
pub struct RingWriter<T: SlotItem> {
    mapping: SharedMapping,
    layout: RingLayout,
    path: PathBuf,
    origin: Origin,
    epoch: u64,
    next_seq: u64,
    _lock: Flock<File>,
    _item: PhantomData<fn(&T)>,
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

impl<T: SlotItem> RingWriter<T> {
    /// Creates the segment at `path` (e.g. `/dev/shm/vla-actions`), or takes over an
    /// existing one of the same kind, ABI and geometry, keeping its data and bumping the
    /// writer epoch; an unusable existing file is replaced by a fresh one.
    pub fn create(
        path: impl AsRef<Path>,
        geometry: Geometry,
        slot_count: u32,
    ) -> Result<Self, CreateError> {
        Self::create_with_pause(path, geometry, slot_count, || {})
    }

    /// [`RingWriter::create`] calling `between` after opening the file and before locking
    /// it: lets a test replace the file in that window. Not for other uses.
    #[doc(hidden)]
    pub fn create_with_pause(
        path: impl AsRef<Path>,
        geometry: Geometry,
        slot_count: u32,
        mut between: impl FnMut(),
    ) -> Result<Self, CreateError> {
        let path = path.as_ref();
        let layout = RingLayout::new(T::KIND, geometry, slot_count).map_err(|source| {
            CreateError::Config {
                path: path.to_path_buf(),
                source,
            }
        })?;
        // The lock guards the file we opened, which another writer may have renamed away
        // (replacing it) or a cleanup unlinked between our open and our lock: then we
        // would be the writer of a file nobody can reach, beside the real one. After
        // locking, the path must still name the locked inode; else open it again.
        let mut attempts = 0;
        let locked = loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(SEGMENT_MODE)
                .open(path)
                .map_err(create_io(path, "open"))?;
            between();
            let locked = lock_writer(file, path)?;
            let held = locked.metadata().map_err(create_io(path, "stat"))?;
            match std::fs::metadata(path) {
                Ok(now) if (now.dev(), now.ino()) == (held.dev(), held.ino()) => break locked,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(create_io(path, "stat")(e)),
            }
            attempts += 1;
            if attempts == 8 {
                return Err(create_io(path, "lock")(io::Error::other(
                    "the path named another file after each of 8 locks",
                )));
            }
        };
        let file_len = locked.metadata().map_err(create_io(path, "stat"))?.len();

        if file_len == 0 {
            // A file no reader can have mapped (readers refuse empty files): size it and
            // initialize in place.
            locked
                .set_len(layout.total_size as u64)
                .map_err(create_io(path, "resize"))?;
            let mapping = SharedMapping::map_read_write(&locked, layout.total_size)
                .map_err(create_io(path, "mmap"))?;
            return Ok(Self::initialize_fresh(
                mapping,
                layout,
                path,
                locked,
                Origin::Created,
            ));
        }

        let existing = if file_len >= HEADER_SIZE as u64 {
            let mapping = SharedMapping::map_read_write(&locked, file_len as usize)
                .map_err(create_io(path, "mmap"))?;
            check_header(
                mapping.header(),
                path,
                T::KIND,
                &geometry,
                Some(slot_count),
                file_len,
                true,
            )
            .and_then(|layout| check_seqs(&mapping, &layout, path))
            .map(|_| mapping)
        } else {
            Err(OpenError::Truncated {
                path: path.to_path_buf(),
                expected: HEADER_SIZE as u64,
                found: file_len,
            })
        };
        match existing {
            Ok(mapping) => Ok(Self::take_over(mapping, layout, path, locked)),
            // The old file may be mapped by readers of another geometry: never resize it
            // under them, build a new file and rename it over the path.
            Err(reason) => Self::replace(path, layout, reason),
        }
    }

    fn initialize_fresh(
        mapping: SharedMapping,
        layout: RingLayout,
        path: &Path,
        lock: Flock<File>,
        origin: Origin,
    ) -> Self {
        debug_assert!(mapping.is_writable());
        let h = mapping.header();
        h.initializing.store(STATE_INITIALIZING, Ordering::Relaxed);
        fence(Ordering::Release);
        write_static_header(h, &layout);
        h.writer_pid.store(std::process::id(), Ordering::Relaxed);
        h.writer_epoch.store(1, Ordering::Relaxed);
        h.writer_heartbeat_ns
            .store(monotonic_ns(), Ordering::Relaxed);
        h.published.store(0, Ordering::Relaxed);
        h.magic.store(layout.kind.magic(), Ordering::Relaxed);
        h.initializing.store(STATE_READY, Ordering::Release);
        RingWriter {
            mapping,
            layout,
            path: path.to_path_buf(),
            origin,
            epoch: 1,
            next_seq: 1,
            _lock: lock,
            _item: PhantomData,
        }
    }

    fn take_over(
        mapping: SharedMapping,
        layout: RingLayout,
        path: &Path,
        lock: Flock<File>,
    ) -> Self {
        let h = mapping.header();
        h.initializing.store(STATE_INITIALIZING, Ordering::Relaxed);
        fence(Ordering::Release);
        // A newer writer of the same major may change abi_version; the rest is identical.
        write_static_header(h, &layout);
        let epoch = h.writer_epoch.load(Ordering::Relaxed).wrapping_add(1);
        h.writer_epoch.store(epoch, Ordering::Relaxed);
        h.writer_pid.store(std::process::id(), Ordering::Relaxed);
        h.writer_heartbeat_ns
            .store(monotonic_ns(), Ordering::Relaxed);
        let mut writer = RingWriter {
            mapping,
            layout,
            path: path.to_path_buf(),
            origin: Origin::Reopened,
            epoch,
            next_seq: 0,
            _lock: lock,
            _item: PhantomData,
        };
        writer.next_seq = writer.core().next_seq_after_restart();
        writer
            .mapping
            .header()
            .initializing
            .store(STATE_READY, Ordering::Release);
        writer
    }

    fn replace(path: &Path, layout: RingLayout, reason: OpenError) -> Result<Self, CreateError> {
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let temp = path.with_file_name(format!(".{file_name}.new-{}", std::process::id()));
        match std::fs::remove_file(&temp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(create_io(&temp, "remove stale temporary")(e)),
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(SEGMENT_MODE)
            .open(&temp)
            .map_err(create_io(&temp, "create"))?;
        let locked = lock_writer(file, &temp)?;
        let result = locked
            .set_len(layout.total_size as u64)
            .map_err(create_io(&temp, "resize"))
            .and_then(|()| {
                SharedMapping::map_read_write(&locked, layout.total_size)
                    .map_err(create_io(&temp, "mmap"))
            });
        let mapping = match result {
            Ok(mapping) => mapping,
            Err(e) => {
                let _ = std::fs::remove_file(&temp);
                return Err(e);
            }
        };
        let writer =
            Self::initialize_fresh(mapping, layout, path, locked, Origin::Replaced(reason));
        // The old file's lock (still held by our caller's frame until it returns) keeps a
        // concurrent writer from racing this rename.
        if let Err(e) = std::fs::rename(&temp, path) {
            let _ = std::fs::remove_file(&temp);
            return Err(create_io(path, "rename")(e));
        }
        Ok(writer)
    }

    fn core(&self) -> RingCore<'_> {
        let words = self
            .mapping
            .slot_words(self.layout.total_size)
            .expect("mapping covers total_size: checked when created");
        RingCore::new(
            &self.mapping.header().published,
            words,
            self.layout.slot_words(),
        )
    }

    /// Publishes `item` as the next seq and returns that seq. `item.seq` and
    /// `item.writer_epoch` are ignored (the writer assigns them). Never allocates.
    pub fn publish(&mut self, item: &T) -> Result<u64, PublishError> {
        if let Some((field, expected, found)) = item.length_mismatch(&self.layout) {
            return Err(PublishError::Length {
                field,
                expected,
                found,
            });
        }
        let seq = self.next_seq;
        let (epoch, layout) = (self.epoch, self.layout);
        self.core()
            .publish(seq, |out| item.store(seq, epoch, &layout, out));
        self.heartbeat();
        self.next_seq += 1;
        Ok(seq)
    }

    /// Refreshes the heartbeat without publishing (call it while idle).
    pub fn heartbeat(&self) {
        self.mapping
            .header()
            .writer_heartbeat_ns
            .store(monotonic_ns(), Ordering::Relaxed);
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The seq the next publish will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A reader of one ring; any number may read concurrently, none ever blocks the writer.
pub struct RingReader<T: SlotItem> {
    mapping: SharedMapping,
    layout: RingLayout,
    path: PathBuf,
    identity: (u64, u64),
    /// The writer epoch whose header was last checked against `layout`. A writer that
    /// starts on the same segment bumps the epoch and may rewrite the header (a C writer
    /// re-initializes a same-size segment of another geometry in place): every read checks
    /// the epoch and re-checks the header when it changed.
    checked_epoch: AtomicU64,
    _item: PhantomData<fn(&mut T)>,
}

/// The first header field that differs from `layout`, if any (no allocation: read path).
fn header_differs(h: &RingHeader, layout: &RingLayout) -> Option<&'static str> {
    if h.magic.load(Ordering::Relaxed) != layout.kind.magic() {
        return Some("magic");
    }
    if h.abi_major.load(Ordering::Relaxed) != ABI_MAJOR {
        return Some("abi_major");
    }
    if ABI_VERSION < h.abi_lowest_compatible.load(Ordering::Relaxed) {
        return Some("abi_lowest_compatible");
    }
    if h.header_size.load(Ordering::Relaxed) as usize != HEADER_SIZE {
        return Some("header_size");
    }
    for ((field, expected), raw) in layout
        .geometry
        .fields()
        .into_iter()
        .zip(raw_geometry_fields(h))
    {
        if raw.load(Ordering::Relaxed) != expected {
            return Some(field);
        }
    }
    if h.slot_count.load(Ordering::Relaxed) != layout.slot_count {
        return Some("slot_count");
    }
    if h.slot_size.load(Ordering::Relaxed) as usize != layout.slot_size {
        return Some("slot_size");
    }
    if h.total_size.load(Ordering::Relaxed) != layout.total_size as u64 {
        return Some("total_size");
    }
    None
}

impl<T: SlotItem> RingReader<T> {
    /// Opens the segment at `path` read-only and validates it against `geometry`.
    /// [`OpenError::is_retryable`] tells whether to try again (writer starting up).
    pub fn open(path: impl AsRef<Path>, geometry: Geometry) -> Result<Self, OpenError> {
        let path = path.as_ref();
        let io_err = |op: &'static str| {
            move |source: io::Error| OpenError::Io {
                path: path.to_path_buf(),
                op,
                source,
            }
        };
        geometry.validate().map_err(|source| OpenError::Config {
            path: path.to_path_buf(),
            source,
        })?;
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(OpenError::NotFound {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(io_err("open")(e)),
        };
        let meta = file.metadata().map_err(io_err("stat"))?;
        let file_len = meta.len();
        if file_len == 0 {
            // A writer creates the file empty, then sizes it.
            return Err(OpenError::Initializing {
                path: path.to_path_buf(),
            });
        }
        if file_len < HEADER_SIZE as u64 {
            return Err(OpenError::Truncated {
                path: path.to_path_buf(),
                expected: HEADER_SIZE as u64,
                found: file_len,
            });
        }
        let mapping =
            SharedMapping::map_read_only(&file, file_len as usize).map_err(io_err("mmap"))?;
        let h = mapping.header();
        let epoch = h.writer_epoch.load(Ordering::Acquire);
        let layout = check_header(h, path, T::KIND, &geometry, None, file_len, false)?;
        // A writer that started over while we validated may have changed abi_version:
        // the header is itself seqlocked by `initializing` and the epoch.
        fence(Ordering::Acquire);
        if h.initializing.load(Ordering::Relaxed) != STATE_READY
            || h.writer_epoch.load(Ordering::Relaxed) != epoch
        {
            return Err(OpenError::Initializing {
                path: path.to_path_buf(),
            });
        }
        Ok(RingReader {
            mapping,
            layout,
            path: path.to_path_buf(),
            identity: (meta.dev(), meta.ino()),
            checked_epoch: AtomicU64::new(epoch),
            _item: PhantomData,
        })
    }

    /// Before a read: the writer epoch, after re-checking the header against this
    /// reader's layout if a writer started since the last check.
    fn enter(&self) -> Result<u64, ReadError> {
        let h = self.mapping.header();
        let epoch = h.writer_epoch.load(Ordering::Acquire);
        if epoch == self.checked_epoch.load(Ordering::Relaxed) {
            return Ok(epoch);
        }
        self.recheck(epoch)
    }

    #[cold]
    fn recheck(&self, epoch: u64) -> Result<u64, ReadError> {
        let h = self.mapping.header();
        if h.initializing.load(Ordering::Acquire) != STATE_READY {
            return Err(ReadError::WriterStarting);
        }
        if let Some(field) = header_differs(h, &self.layout) {
            return Err(ReadError::Incompatible { epoch, field });
        }
        // The header is seqlocked by `initializing` and the epoch, as in `open`.
        fence(Ordering::Acquire);
        if h.initializing.load(Ordering::Relaxed) != STATE_READY
            || h.writer_epoch.load(Ordering::Relaxed) != epoch
        {
            return Err(ReadError::WriterStarting);
        }
        self.checked_epoch.store(epoch, Ordering::Relaxed);
        Ok(epoch)
    }

    /// After a read: the copy is only good if no writer started while it was made.
    fn leave(&self, epoch: u64) -> Result<(), ReadError> {
        let h = self.mapping.header();
        fence(Ordering::Acquire);
        if h.initializing.load(Ordering::Relaxed) != STATE_READY
            || h.writer_epoch.load(Ordering::Relaxed) != epoch
        {
            return Err(ReadError::WriterStarting);
        }
        Ok(())
    }

    fn core(&self) -> RingCore<'_> {
        let words = self
            .mapping
            .slot_words(self.layout.total_size)
            .expect("mapping covers total_size: checked when opened");
        RingCore::new(
            &self.mapping.header().published,
            words,
            self.layout.slot_words(),
        )
    }

    fn check_buffer(&self, buf: &T) -> Result<(), ReadError> {
        match buf.length_mismatch(&self.layout) {
            Some((field, expected, found)) => Err(ReadError::BufferMismatch {
                field,
                expected,
                found,
            }),
            None => Ok(()),
        }
    }

    fn finish(&self, seq: u64, buf: &T, load: Result<(), u32>) -> Result<(), ReadError> {
        load.map_err(|found| ReadError::InvalidStatus { seq, found })?;
        if buf.seq() != seq {
            // The seqlock word and the seq field disagree: a foreign writer broke the ABI.
            return Err(ReadError::Inconsistent {
                published: seq,
                lock_word: self.core().slot_for(seq).lock_word(),
            });
        }
        Ok(())
    }

    /// Copies the newest complete slot into `buf` and returns its seq. A slot the writer
    /// is in (or died in) is never returned.
    pub fn read_latest(&self, buf: &mut T) -> Result<u64, ReadError> {
        self.check_buffer(buf)?;
        let epoch = self.enter()?;
        let layout = self.layout;
        let (seq, load) = self
            .core()
            .read_latest(READ_ATTEMPTS, |from| buf.load(&layout, from))
            .map_err(|miss| match miss {
                LatestMiss::Empty => ReadError::Empty,
                LatestMiss::Contended => ReadError::Contended {
                    attempts: READ_ATTEMPTS,
                },
                LatestMiss::Inconsistent {
                    published,
                    lock_word,
                } => ReadError::Inconsistent {
                    published,
                    lock_word,
                },
            })?;
        self.leave(epoch)?;
        self.finish(seq, buf, load)?;
        Ok(seq)
    }

    /// Copies slot `seq` into `buf`.
    pub fn read_seq(&self, seq: u64, buf: &mut T) -> Result<(), ReadError> {
        self.check_buffer(buf)?;
        let epoch = self.enter()?;
        let layout = self.layout;
        let load = self
            .core()
            .read_seq(seq, READ_ATTEMPTS, |from| buf.load(&layout, from))
            .map_err(|miss| match miss {
                SlotMiss::NotYetWritten => ReadError::NotYetWritten {
                    seq,
                    published: self.published(),
                },
                SlotMiss::InProgress => ReadError::InProgress { seq },
                SlotMiss::Overwritten { by } => ReadError::Overwritten { seq, by },
                SlotMiss::Torn => ReadError::Contended {
                    attempts: READ_ATTEMPTS,
                },
            })?;
        self.leave(epoch)?;
        self.finish(seq, buf, load)
    }

    /// Seq of the newest complete slot (0 = none yet).
    pub fn published(&self) -> u64 {
        self.mapping.header().published.load(Ordering::Acquire)
    }

    /// Changes whenever a writer (re)starts on this segment.
    pub fn writer_epoch(&self) -> u64 {
        self.mapping.header().writer_epoch.load(Ordering::Acquire)
    }

    pub fn writer_pid(&self) -> u32 {
        self.mapping.header().writer_pid.load(Ordering::Relaxed)
    }

    /// CLOCK_MONOTONIC ns of the writer's last publish or heartbeat.
    pub fn writer_heartbeat_ns(&self) -> u64 {
        self.mapping
            .header()
            .writer_heartbeat_ns
            .load(Ordering::Relaxed)
    }

    /// Time since the writer's last sign of life; a dead writer's age grows without bound.
    pub fn heartbeat_age(&self) -> Duration {
        Duration::from_nanos(monotonic_ns().saturating_sub(self.writer_heartbeat_ns()))
    }

    /// True while a writer is (re)writing the header (or died doing so).
    pub fn is_initializing(&self) -> bool {
        self.mapping.header().initializing.load(Ordering::Acquire) != STATE_READY
    }

    /// True if `path` now names another file than the one mapped (a writer replaced the
    /// segment, e.g. after a geometry change): reopen to follow it.
    pub fn is_replaced(&self) -> io::Result<bool> {
        match std::fs::metadata(&self.path) {
            Ok(meta) => Ok((meta.dev(), meta.ino()) != self.identity),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(e),
        }
    }

    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}
