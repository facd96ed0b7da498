//! Segments found by the `ring` fuzz target (`fuzz/fuzz_targets/ring.rs`), replayed on
//! every `cargo test`: each file under `tests/fuzz_regressions/ring/` is a segment's bytes.
//! Opening it, reading what its header points at and a writer taking it over must end in
//! correct data or a one-line error, never a panic (as the fuzz target checks).

mod common;

use std::path::{Path, PathBuf};

use vla_ring::{
    Action, ActionStatus, ActionWriter, Geometry, Observation, OpenError, Origin, ReadError,
    RingKind, RingLayout, RingReader, SlotItem, MAX_SLOTS, MIN_SLOTS,
};

/// The geometry of the fuzz target's seed segments.
const FIXED: Geometry = Geometry {
    cameras: 1,
    height: 4,
    width: 6,
    channels: 3,
    state_dims: 7,
    action_dims: 7,
    chunk_len: 8,
};

fn inputs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions/ring");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no inputs in {}", dir.display());
    files
}

fn u32_at(data: &[u8], offset: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(
        data.get(offset..offset + 4)?.try_into().ok()?,
    ))
}

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

fn one_line(what: &Path, message: String) {
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "{}: multi-line error: {message:?}",
        what.display()
    );
}

fn read_all<T: SlotItem>(input: &Path, segment: &Path, geometry: Geometry, buffer: impl Fn() -> T) {
    let reader = match RingReader::<T>::open(segment, geometry) {
        Ok(reader) => reader,
        Err(e) => return one_line(input, e.to_string()),
    };
    let mut item = buffer();
    match reader.read_latest(&mut item) {
        Ok(seq) => assert_eq!(item.seq(), seq),
        Err(e) => one_line(input, e.to_string()),
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
            Err(e) => one_line(input, e.to_string()),
        }
    }
}

/// Replays one input as the fuzz target does.
fn replay(input: &Path, segment: &Path) {
    let data = std::fs::read(input).unwrap();
    std::fs::write(segment, &data).unwrap();
    let mut geometries = vec![FIXED];
    geometries.extend(header_geometry(&data).filter(|g| *g != FIXED));
    for geometry in geometries {
        read_all::<Observation>(input, segment, geometry, || {
            Observation::for_geometry(&geometry).unwrap()
        });
        read_all::<Action>(input, segment, geometry, || Action::for_geometry(&geometry));
    }
    let Some(geometry) = header_geometry(&data) else {
        return;
    };
    let slots = u32_at(&data, 32).unwrap_or(0).clamp(MIN_SLOTS, MAX_SLOTS);
    let fits = RingLayout::new(RingKind::Action, geometry, slots)
        .is_ok_and(|layout| layout.total_size <= 1 << 20);
    if !fits {
        return;
    }
    let mut writer = match ActionWriter::create(segment, geometry, slots) {
        Ok(writer) => writer,
        Err(e) => return one_line(input, e.to_string()),
    };
    let mut action = Action::for_geometry(&geometry);
    action.status = ActionStatus::Ok;
    action.values.iter_mut().for_each(|v| *v = 2.5);
    let seq = writer.publish(&action).unwrap();
    let reader = RingReader::<Action>::open(segment, geometry).unwrap();
    let mut read = Action::for_geometry(&geometry);
    assert_eq!(
        reader.read_latest(&mut read).unwrap(),
        seq,
        "{}",
        input.display()
    );
    assert_eq!(read.values, action.values);
}

#[test]
fn every_found_segment_ends_in_data_or_a_one_line_error() {
    let scratch = common::Scratch::new("fuzz-regressions");
    for input in inputs() {
        replay(&input, &scratch.path("segment"));
    }
}

/// `published` at u64::MAX: `2 * seq` overflowed in the seqlock check (a panic in debug
/// builds, a wrapped comparison in release). Now the reader reports a corrupt ring.
#[test]
fn published_beyond_any_seqlock_word_is_reported_corrupt() {
    let scratch = common::Scratch::new("fuzz-published");
    let segment = scratch.path("segment");
    let input =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions/ring/published-u64-max");
    std::fs::copy(&input, &segment).unwrap();
    let reader = RingReader::<Action>::open(&segment, FIXED).unwrap();
    let mut action = Action::for_geometry(&FIXED);
    assert!(matches!(
        reader.read_latest(&mut action),
        Err(ReadError::Inconsistent {
            published: u64::MAX,
            ..
        })
    ));
    assert!(matches!(
        reader.read_seq(u64::MAX, &mut action),
        Err(ReadError::NotYetWritten { .. })
    ));
}

/// A slot word at u64::MAX: a writer taking over continued at seq 2^63 + 1, whose seqlock
/// word overflows on the first publish. Now the writer replaces the corrupt segment.
#[test]
fn writer_replaces_a_segment_whose_seqs_cannot_continue() {
    let scratch = common::Scratch::new("fuzz-takeover");
    for name in ["slot-word-u64-max", "published-u64-max"] {
        let input = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fuzz_regressions/ring")
            .join(name);
        let segment = scratch.path(name);
        std::fs::copy(&input, &segment).unwrap();
        let mut writer = ActionWriter::create(&segment, FIXED, 4).unwrap();
        match writer.origin() {
            Origin::Replaced(e @ OpenError::SeqOutOfRange { found, .. }) => {
                assert!(*found > u64::MAX / 2 - 1, "{name}: {e}");
                let message = e.to_string();
                assert!(message.contains("corrupt ring"), "{message}");
                one_line(&input, message);
            }
            other => panic!("{name}: writer must replace the segment, got {other:?}"),
        }
        let mut action = Action::for_geometry(&FIXED);
        action.status = ActionStatus::Ok;
        assert_eq!(
            writer.publish(&action).unwrap(),
            1,
            "{name}: a fresh segment starts at 1"
        );
    }
}
