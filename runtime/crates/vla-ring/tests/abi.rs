//! The ABI seen from both sides: the Rust layout pinned to the numbers `vla_ring.h`
//! asserts, and a C program built with the system `cc` against the header and the C ring
//! client library (`runtime/ring-c`) that reads actions written by Rust and writes
//! observations Rust reads.
#![cfg(not(loom))]

mod common;

use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{small_geometry, Scratch};
use vla_ring::*;

#[test]
fn rust_layout_matches_the_numbers_the_c_header_asserts() {
    assert_eq!(size_of::<RingHeader>(), 128);
    let header = [
        (offset_of!(RingHeader, magic), 0),
        (offset_of!(RingHeader, abi_major), 8),
        (offset_of!(RingHeader, abi_version), 12),
        (offset_of!(RingHeader, abi_lowest_compatible), 16),
        (offset_of!(RingHeader, header_size), 20),
        (offset_of!(RingHeader, total_size), 24),
        (offset_of!(RingHeader, slot_count), 32),
        (offset_of!(RingHeader, slot_size), 36),
        (
            offset_of!(RingHeader, geometry) + offset_of!(RawGeometry, cameras),
            40,
        ),
        (
            offset_of!(RingHeader, geometry) + offset_of!(RawGeometry, height),
            44,
        ),
        (
            offset_of!(RingHeader, geometry) + offset_of!(RawGeometry, width),
            48,
        ),
        (
            offset_of!(RingHeader, geometry) + offset_of!(RawGeometry, channels),
            52,
        ),
        (
            offset_of!(RingHeader, geometry) + offset_of!(RawGeometry, state_dims),
            56,
        ),
        (
            offset_of!(RingHeader, geometry) + offset_of!(RawGeometry, action_dims),
            60,
        ),
        (
            offset_of!(RingHeader, geometry) + offset_of!(RawGeometry, chunk_len),
            64,
        ),
        (offset_of!(RingHeader, initializing), 72),
        (offset_of!(RingHeader, writer_pid), 76),
        (offset_of!(RingHeader, writer_epoch), 80),
        (offset_of!(RingHeader, writer_heartbeat_ns), 88),
        (offset_of!(RingHeader, published), 96),
        (offset_of!(RingHeader, reserved), 104),
    ];
    for (i, (found, expected)) in header.iter().enumerate() {
        assert_eq!(found, expected, "header field #{i}");
    }
    assert_eq!(size_of::<ObservationSlotFixed>(), 64);
    let obs = [
        (offset_of!(ObservationSlotFixed, seqlock), 0),
        (offset_of!(ObservationSlotFixed, seq), 8),
        (offset_of!(ObservationSlotFixed, writer_epoch), 16),
        (offset_of!(ObservationSlotFixed, capture_time_ns), 24),
        (offset_of!(ObservationSlotFixed, seed), 32),
        (offset_of!(ObservationSlotFixed, instruction_id), 40),
        (offset_of!(ObservationSlotFixed, reserved), 48),
    ];
    for (i, (found, expected)) in obs.iter().enumerate() {
        assert_eq!(found, expected, "observation slot field #{i}");
    }
    assert_eq!(size_of::<ActionSlotFixed>(), 64);
    let action = [
        (offset_of!(ActionSlotFixed, seqlock), 0),
        (offset_of!(ActionSlotFixed, seq), 8),
        (offset_of!(ActionSlotFixed, writer_epoch), 16),
        (offset_of!(ActionSlotFixed, source_obs_seq), 24),
        (offset_of!(ActionSlotFixed, made_time_ns), 32),
        (offset_of!(ActionSlotFixed, valid_until_ns), 40),
        (offset_of!(ActionSlotFixed, chunk_id), 48),
        (offset_of!(ActionSlotFixed, step_index), 56),
        (offset_of!(ActionSlotFixed, status), 60),
    ];
    for (i, (found, expected)) in action.iter().enumerate() {
        assert_eq!(found, expected, "action slot field #{i}");
    }
    assert_eq!(OBS_MAGIC, 0x0053_424F_2D41_4C56);
    assert_eq!(ACTION_MAGIC, 0x0054_4341_2D41_4C56);
    assert_eq!((ABI_MAJOR, ABI_VERSION, ABI_LOWEST_COMPATIBLE), (1, 0, 0));
    assert_eq!((HEADER_SIZE, SLOT_ALIGN, SLOT_FIXED_SIZE), (128, 64, 64));
}

#[test]
fn c_header_constants_match_rust() {
    let header = std::fs::read_to_string(header_dir().join("vla_ring.h")).expect("read vla_ring.h");
    let define = |name: &str| -> String {
        header
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("vla_ring.h lacks #define {name}"))
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        define("VLA_RING_OBS_MAGIC"),
        format!("UINT64_C({OBS_MAGIC:#018X})").replace("0X", "0x")
    );
    assert_eq!(
        define("VLA_RING_ACTION_MAGIC"),
        format!("UINT64_C({ACTION_MAGIC:#018X})").replace("0X", "0x")
    );
    assert_eq!(
        define("VLA_RING_TEXT_MAGIC"),
        format!("UINT64_C({TEXT_MAGIC:#018X})").replace("0X", "0x")
    );
    assert_eq!(
        define("VLA_RING_MAX_TEXT_BYTES"),
        format!("{MAX_TEXT_BYTES}u")
    );
    assert_eq!(
        define("VLA_RING_TEXT_ID_FLAG"),
        format!("{TEXT_ID_FLAG:#x}u")
    );
    assert_eq!(
        define("VLA_RING_PACK_ID_FLAG"),
        format!("{:#x}u", vla_ring::PACK_ID_FLAG)
    );
    assert_eq!(define("VLA_RING_ABI_MAJOR"), format!("{ABI_MAJOR}u"));
    assert_eq!(define("VLA_RING_ABI_VERSION"), format!("{ABI_VERSION}u"));
    assert_eq!(
        define("VLA_RING_ABI_LOWEST_COMPATIBLE"),
        format!("{ABI_LOWEST_COMPATIBLE}u")
    );
    assert_eq!(define("VLA_RING_HEADER_SIZE"), format!("{HEADER_SIZE}u"));
    assert_eq!(define("VLA_RING_SLOT_ALIGN"), format!("{SLOT_ALIGN}u"));
    assert_eq!(define("VLA_RING_MIN_SLOTS"), format!("{MIN_SLOTS}u"));
    assert_eq!(define("VLA_RING_MAX_SLOTS"), format!("{MAX_SLOTS}u"));
    assert_eq!(
        define("VLA_RING_READ_ATTEMPTS"),
        format!("{READ_ATTEMPTS}u")
    );
    assert_eq!(
        define("VLA_RING_STATUS_FAULT"),
        format!("{}u", ActionStatus::Fault as u32)
    );
}

fn header_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include")
}

fn ring_client_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ring-c")
}

/// Builds `tests/c/ring_peer.c` against the C ring client library, or explains why this
/// run cannot (cross target).
fn build_c_peer(scratch: &Scratch) -> Option<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/ring_peer.c");
    vla_test_support::compile_ring_client_program(&source, &scratch.path("ring_peer"))
}

fn geometry_args(g: &Geometry) -> Vec<String> {
    g.fields().iter().map(|(_, v)| v.to_string()).collect()
}

fn run_peer(exe: &Path, args: &[String]) -> (i32, String, String) {
    let out = Command::new(exe)
        .args(args)
        .output()
        .expect("run ring_peer");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn c_reader_reads_the_newest_action_written_by_rust() {
    let scratch = Scratch::new("c-reader");
    let Some(exe) = build_c_peer(&scratch) else {
        return;
    };
    let geometry = small_geometry();
    let path = scratch.path("actions");
    let mut writer = ActionWriter::create(&path, geometry, 4).unwrap();
    let mut action = Action::for_geometry(&geometry);
    for step in 0..6u32 {
        action.source_obs_seq = 77;
        action.made_time_ns = 1_000 + step as u64;
        action.valid_until_ns = 5_000 + step as u64;
        action.chunk_id = 9;
        action.step_index = step;
        action.status = if step == 5 {
            ActionStatus::Hold
        } else {
            ActionStatus::Ok
        };
        for (i, v) in action.values.iter_mut().enumerate() {
            *v = step as f32 + i as f32 * 0.25 - 1.5;
        }
        writer.publish(&action).unwrap();
    }
    let mut args = vec!["read-action".to_string(), path.display().to_string()];
    args.extend(geometry_args(&geometry));
    let (code, stdout, stderr) = run_peer(&exe, &args);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert_eq!(
        stdout.trim(),
        "seq=6 epoch=1 source_obs_seq=77 made_time_ns=1005 valid_until_ns=5005 chunk_id=9 \
         step_index=5 status=1 values=3.5,3.75,4,4.25,4.5,4.75,5"
    );

    // The C side rejects a geometry it does not expect, naming the field.
    let mut wrong = vec!["read-action".to_string(), path.display().to_string()];
    wrong.extend(geometry_args(&Geometry {
        action_dims: 6,
        ..geometry
    }));
    let (code, _, stderr) = run_peer(&exe, &wrong);
    assert_eq!(code, 4);
    assert!(stderr.contains("field action_dims"), "{stderr}");

    // And an observation ring is not an action ring.
    let obs_path = scratch.path("obs");
    let _obs = ObservationWriter::create(&obs_path, geometry, 2).unwrap();
    let mut args = vec!["read-action".to_string(), obs_path.display().to_string()];
    args.extend(geometry_args(&geometry));
    let (code, _, stderr) = run_peer(&exe, &args);
    assert_eq!(code, 4);
    assert!(stderr.contains("field magic"), "{stderr}");
}

fn check_c_observation(obs: &Observation, seq: u64, epoch: u64) {
    assert_eq!(obs.seq, seq);
    assert_eq!(obs.writer_epoch, epoch);
    assert_eq!(obs.seed, seq * 1000 + 1);
    assert_eq!(obs.instruction_id, 42);
    for (i, v) in obs.state.iter().enumerate() {
        assert_eq!(*v, seq as f32 * 10.0 + i as f32, "state[{i}] of seq {seq}");
    }
    for (j, b) in obs.frames.iter().enumerate() {
        assert_eq!(
            *b,
            (seq * 7 + j as u64) as u8,
            "frame byte {j} of seq {seq}"
        );
    }
}

#[test]
fn rust_reads_observations_written_by_the_c_helpers_across_a_c_restart() {
    let scratch = Scratch::new("c-writer");
    let Some(exe) = build_c_peer(&scratch) else {
        return;
    };
    let geometry = small_geometry();
    let path = scratch.path("obs");
    let mut args = vec!["write-obs".to_string(), path.display().to_string()];
    args.extend(geometry_args(&geometry));
    args.extend(["3".to_string(), "5".to_string()]);

    let (code, stdout, stderr) = run_peer(&exe, &args);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert_eq!(stdout.trim(), "epoch=1 next_seq=6");
    let reader = ObservationReader::open(&path, geometry).unwrap();
    let mut obs = Observation::for_geometry(&geometry).unwrap();
    assert_eq!(reader.read_latest(&mut obs).unwrap(), 5);
    check_c_observation(&obs, 5, 1);
    reader.read_seq(4, &mut obs).unwrap();
    check_c_observation(&obs, 4, 1);

    // A restarted C writer keeps the segment, bumps the epoch and continues the seqs.
    let (code, stdout, stderr) = run_peer(&exe, &args);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert_eq!(stdout.trim(), "epoch=2 next_seq=11");
    assert_eq!(reader.writer_epoch(), 2);
    assert_eq!(reader.read_latest(&mut obs).unwrap(), 10);
    check_c_observation(&obs, 10, 2);

    // A Rust writer takes over the C-made segment just as well.
    drop(reader);
    let writer = ObservationWriter::create(&path, geometry, 3).unwrap();
    assert!(
        matches!(writer.origin(), Origin::Reopened),
        "{:?}",
        writer.origin()
    );
    assert_eq!((writer.epoch(), writer.next_seq()), (3, 11));
}

/// The header's `_Static_assert`s must hold for the target these tests run as, also when
/// cross-built: then a `<arch>-linux-gnu-gcc` checks them if one is installed.
#[test]
fn c_header_static_asserts_hold_for_the_target_arch() {
    let arch = std::env::consts::ARCH;
    let candidates = [
        std::env::var("CC").unwrap_or_else(|_| "cc".to_string()),
        format!("{arch}-linux-gnu-gcc"),
    ];
    let compiler = candidates.iter().find(|cc| {
        Command::new(cc)
            .arg("-dumpmachine")
            .output()
            .is_ok_and(|out| out.status.success() && out.stdout.starts_with(arch.as_bytes()))
    });
    let Some(cc) = compiler else {
        eprintln!("skipping: no C compiler for {arch} (tried {candidates:?})");
        return;
    };
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/ring_peer.c");
    let out = Command::new(cc)
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-fsyntax-only",
            "-I",
        ])
        .arg(header_dir())
        .arg("-I")
        .arg(ring_client_dir())
        .arg(&source)
        .arg(ring_client_dir().join("vla_ring_client.c"))
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "{cc} rejects vla_ring.h for {arch}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A C writer that starts on a same-size segment of another geometry re-initializes it in
/// place: it must bump the epoch (it used to restart at 1), and a Rust reader of the old
/// geometry must notice the new epoch and refuse to read rather than misread the slots.
#[test]
fn a_c_writer_restart_with_another_geometry_bumps_the_epoch_and_rust_readers_recheck() {
    let scratch = Scratch::new("c-regeometry");
    let Some(exe) = build_c_peer(&scratch) else {
        return;
    };
    let a = small_geometry();
    // Height and width swapped: the same frame bytes, so the same segment size.
    let b = Geometry {
        height: a.width,
        width: a.height,
        ..a
    };
    let path = scratch.path("obs");
    let write = |g: &Geometry, count: &str| {
        let mut args = vec!["write-obs".to_string(), path.display().to_string()];
        args.extend(geometry_args(g));
        args.extend(["3".to_string(), count.to_string()]);
        let (code, stdout, stderr) = run_peer(&exe, &args);
        assert_eq!(code, 0, "stderr: {stderr}");
        stdout.trim().to_string()
    };
    assert_eq!(write(&a, "3"), "epoch=1 next_seq=4");
    let size = std::fs::metadata(&path).unwrap().len();
    let reader = ObservationReader::open(&path, a).unwrap();
    let mut obs = Observation::for_geometry(&a).unwrap();
    assert_eq!(reader.read_latest(&mut obs), Ok(3));

    assert_eq!(write(&b, "2"), "epoch=2 next_seq=3", "the epoch is bumped");
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        size,
        "same file, in place"
    );
    assert_eq!(
        reader.read_latest(&mut obs),
        Err(ReadError::Incompatible {
            epoch: 2,
            field: "height"
        })
    );
    assert!(matches!(
        reader.read_seq(2, &mut obs),
        Err(ReadError::Incompatible { .. })
    ));
    // Reopened with the new geometry, it reads B's observations.
    let reader = ObservationReader::open(&path, b).unwrap();
    let mut obs = Observation::for_geometry(&b).unwrap();
    assert_eq!(reader.read_latest(&mut obs), Ok(2));
    check_c_observation(&obs, 2, 2);
}

/// The C reader API re-checks the header when the epoch changes: a writer of another
/// same-size geometry starting on the segment makes the next read fail with
/// VLA_RING_READ_INCOMPATIBLE naming the field, where the base-pointer read trusts the
/// header and returns whatever the slots hold.
#[test]
fn the_c_reader_rechecks_the_geometry_when_a_writer_restarts() {
    let scratch = Scratch::new("c-reader-restart");
    let Some(exe) = build_c_peer(&scratch) else {
        return;
    };
    let a = small_geometry();
    let b = Geometry {
        chunk_len: a.chunk_len * 2, // not part of an action slot: the same size
        ..a
    };
    let path = scratch.path("actions");
    {
        let mut writer = ActionWriter::create(&path, a, 4).unwrap();
        writer.publish(&Action::for_geometry(&a)).unwrap();
    }
    let mut args = vec!["restart-action".to_string(), path.display().to_string()];
    args.extend(geometry_args(&a));
    args.extend(geometry_args(&b));
    let (code, stdout, stderr) = run_peer(&exe, &args);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert_eq!(
        stdout.trim(),
        "epoch_before=1 epoch_after=2 read_after=-9 field=chunk_len"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn c_writer_texts_are_read_by_rust_with_id_bytes_and_restarts() {
    let scratch = Scratch::new("c-text");
    let Some(exe) = build_c_peer(&scratch) else {
        return;
    };
    let geometry = small_geometry();
    let path = scratch.path("instructions");
    let write = |id: u32, text: &[u8]| {
        let mut args = vec!["write-text".to_string(), path.display().to_string()];
        args.extend(geometry_args(&geometry));
        args.extend(["4".to_string(), id.to_string(), hex(text)]);
        run_peer(&exe, &args)
    };
    let (code, stdout, stderr) = write(7, "put the bowl on the plate".as_bytes());
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stdout.starts_with("epoch=1 seq=1 "), "{stdout}");
    let reader = InstructionReader::open(&path, geometry).unwrap();
    let mut text = InstructionText::new();
    assert_eq!(reader.read_latest(&mut text), Ok(1));
    assert_eq!(
        (text.text_id, text.bytes()),
        (7, &b"put the bowl on the plate"[..])
    );
    assert_eq!(text.writer_epoch, 1);

    // Each C start takes the segment over: epoch bumped, seqs continue. Bytes are carried
    // as written (invalid UTF-8 too: refusing it is the runtime's business), a full slot
    // exactly, and a longer text is refused by the header's publish.
    let bad = [b'o', b'k', 0xff, 0xfe];
    let (code, _, stderr) = write(8, &bad);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert_eq!(reader.read_latest(&mut text), Ok(2));
    assert_eq!(
        (text.text_id, text.writer_epoch, text.bytes()),
        (8, 2, &bad[..])
    );
    let full = vec![b'a'; MAX_TEXT_BYTES];
    assert_eq!(write(9, &full).0, 0);
    assert_eq!(reader.read_latest(&mut text), Ok(3));
    assert_eq!(text.bytes(), &full[..]);
    let (code, _, _) = write(10, &vec![b'a'; MAX_TEXT_BYTES + 1]);
    assert_eq!(code, 2, "a text longer than a slot is refused");
    assert_eq!(
        reader.read_latest(&mut text),
        Ok(3),
        "nothing was published"
    );
    // A C writer of 4 slots and a Rust writer agree on the layout: the Rust one reopens it.
    drop(reader);
    let mut writer = InstructionWriter::create(&path, geometry, 4).unwrap();
    assert!(
        matches!(writer.origin(), Origin::Reopened),
        "{:?}",
        writer.origin()
    );
    text.text_id = 11;
    text.set_bytes("a".as_bytes()).unwrap();
    assert_eq!(
        writer.publish(&text).unwrap(),
        4,
        "seqs continue after the C writer's"
    );
    // The observation side names texts by the flag bit; fixed ids stay as they were.
    assert_eq!(text_instruction_id(7), Some(0x8000_0007));
    assert_eq!(text_id_of(0x8000_0007), Some(7));
    assert_eq!(text_id_of(3), None);
    assert_eq!(text_instruction_id(TEXT_ID_FLAG), None);
}
