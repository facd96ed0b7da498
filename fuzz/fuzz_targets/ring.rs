//! Ring segments (`vla_ring`): the segment file is shared memory that another process
//! writes, so whatever bytes it holds, opening it (`RingReader::open`: header, ABI,
//! geometry, sizes), reading slots (seqlock words, `published`, seq fields, status) and a
//! writer taking it over after a crash (`RingWriter::create`) end in a typed one-line
//! error or in correct data, never in a panic or an access outside the mapping.
//!
//! Each input is written to a file in a private directory under /dev/shm (tmpfs, as on
//! the device) and opened with the geometry its own header claims, so that the fuzzer
//! gets past the geometry check, and with a fixed geometry that it must match.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use vla_ring::{
    Action, ActionStatus, Geometry, Observation, RingKind, RingLayout, RingReader, RingWriter,
    SlotItem, MAX_SLOTS, MIN_SLOTS,
};

/// The geometry the seed segments (`examples/ring_seeds.rs`) are made with.
const FIXED: Geometry = Geometry {
    cameras: 1,
    height: 4,
    width: 6,
    channels: 3,
    state_dims: 7,
    action_dims: 7,
    chunk_len: 8,
};

/// A writer takes over only segments up to this size: a fresh segment is sized and
/// pre-faulted, and the fuzzer must not make us fault in gigabytes of tmpfs.
const MAX_WRITER_SEGMENT: usize = 1 << 20;

fn segment_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("vla-fuzz-ring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the fuzz segment directory");
        dir.join("segment")
    })
}

fn u32_at(data: &[u8], offset: usize) -> Option<u32> {
    let bytes = data.get(offset..offset + 4)?;
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

/// The geometry stored in the header (offset 40, seven u32), if the input is that long.
fn header_geometry(data: &[u8]) -> Option<Geometry> {
    let field = |i: usize| u32_at(data, 40 + 4 * i);
    Some(Geometry {
        cameras: field(0)?,
        height: field(1)?,
        width: field(2)?,
        channels: field(3)?,
        state_dims: field(4)?,
        action_dims: field(5)?,
        chunk_len: field(6)?,
    })
}

fn assert_one_line(message: String) {
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "multi-line error: {message:?}"
    );
}

/// Opens the segment as a `T` reader and reads what its header points at.
fn read_all<T: SlotItem>(path: &Path, geometry: Geometry, mut buffer: impl FnMut() -> T) {
    let reader = match RingReader::<T>::open(path, geometry) {
        Ok(reader) => reader,
        Err(e) => return assert_one_line(e.to_string()),
    };
    let layout = *reader.layout();
    assert!(layout.total_size <= std::fs::metadata(path).unwrap().len() as usize);
    let mut item = buffer();
    match reader.read_latest(&mut item) {
        Ok(seq) => assert_eq!(item.seq(), seq),
        Err(e) => assert_one_line(e.to_string()),
    }
    let published = reader.published();
    for seq in [
        published,
        published.wrapping_sub(1),
        published.wrapping_add(1),
        1,
    ] {
        match reader.read_seq(seq, &mut item) {
            Ok(()) => assert_eq!(item.seq(), seq),
            Err(e) => assert_one_line(e.to_string()),
        }
    }
    let _ = (
        reader.writer_epoch(),
        reader.heartbeat_age(),
        reader.is_initializing(),
    );
}

/// A writer restarting on this segment either takes it over or replaces it, and what it
/// publishes next is what a reader then reads.
fn take_over(path: &Path, geometry: Geometry, slot_count: u32) {
    let fits = RingLayout::new(RingKind::Action, geometry, slot_count)
        .is_ok_and(|layout| layout.total_size <= MAX_WRITER_SEGMENT);
    if !fits {
        return;
    }
    let mut writer = match RingWriter::<Action>::create(path, geometry, slot_count) {
        Ok(writer) => writer,
        Err(e) => return assert_one_line(e.to_string()),
    };
    let mut action = Action::for_geometry(&geometry);
    action.status = ActionStatus::Ok;
    action.step_index = geometry.chunk_len - 1;
    action.valid_until_ns = 42;
    for (i, value) in action.values.iter_mut().enumerate() {
        *value = i as f32 + 0.5;
    }
    let seq = match writer.publish(&action) {
        Ok(seq) => seq,
        Err(e) => return assert_one_line(e.to_string()),
    };
    let reader = RingReader::<Action>::open(path, geometry)
        .unwrap_or_else(|e| panic!("a segment its writer just published to must open: {e}"));
    let mut read = Action::for_geometry(&geometry);
    assert_eq!(reader.read_latest(&mut read).expect("read back"), seq);
    assert_eq!(read.writer_epoch, writer.epoch());
    assert_eq!(
        (read.values, read.step_index, read.valid_until_ns),
        (action.values, action.step_index, action.valid_until_ns)
    );
}

fuzz_target!(|data: &[u8]| {
    let path = segment_path();
    std::fs::write(path, data).expect("write the fuzz segment");
    let mut geometries = vec![FIXED];
    geometries.extend(header_geometry(data).filter(|g| *g != FIXED));
    for geometry in geometries {
        // Buffers are sized by the geometry only once `open` proved the segment holds
        // slots that large, so the fuzzer cannot make the harness allocate gigabytes.
        read_all::<Observation>(path, geometry, || {
            Observation::for_geometry(&geometry).expect("open validated the geometry")
        });
        read_all::<Action>(path, geometry, || Action::for_geometry(&geometry));
    }
    if let Some(geometry) = header_geometry(data) {
        let slots = u32_at(data, 32).unwrap_or(0).clamp(MIN_SLOTS, MAX_SLOTS);
        take_over(path, geometry, slots);
    }
});
