//! Writer and reader behaviour in one process: round trips, restarts, and every kind of
//! bad segment a reader or a restarting writer can meet.
#![cfg(not(loom))]

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::{small_geometry, Scratch};
use vla_ring::*;

fn poke(path: &Path, offset: u64, bytes: &[u8]) {
    let file = OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

fn slot_offset(layout: &RingLayout, seq: u64) -> u64 {
    (HEADER_SIZE + (seq % layout.slot_count as u64) as usize * layout.slot_size) as u64
}

fn sample_action(geometry: &Geometry, k: u32) -> Action {
    let mut a = Action::for_geometry(geometry);
    a.source_obs_seq = 100 + k as u64;
    a.made_time_ns = 1_000 * k as u64;
    a.valid_until_ns = 1_000 * k as u64 + 500;
    a.chunk_id = k as u64 / 4;
    a.step_index = k % 4;
    a.status = ActionStatus::Ok;
    for (i, v) in a.values.iter_mut().enumerate() {
        *v = k as f32 * 100.0 + i as f32;
    }
    a
}

fn sample_observation(geometry: &Geometry, k: u32) -> Observation {
    let mut o = Observation::for_geometry(geometry).unwrap();
    o.capture_time_ns = 42 + k as u64;
    o.seed = 0xDEAD_0000 + k as u64;
    o.instruction_id = k * 3;
    for (i, v) in o.state.iter_mut().enumerate() {
        *v = -(k as f32) - i as f32 / 8.0;
    }
    for (j, b) in o.frames.iter_mut().enumerate() {
        *b = (j as u32 * 31 + k) as u8;
    }
    o
}

#[test]
fn observations_and_actions_round_trip() {
    let scratch = Scratch::new("round-trip");
    let g = small_geometry();
    let mut obs_writer = ObservationWriter::create(scratch.path("obs"), g, 3).unwrap();
    let mut act_writer = ActionWriter::create(scratch.path("act"), g, 4).unwrap();
    assert!(matches!(obs_writer.origin(), Origin::Created));
    let obs_reader = ObservationReader::open(scratch.path("obs"), g).unwrap();
    let act_reader = ActionReader::open(scratch.path("act"), g).unwrap();
    let mut obs = Observation::for_geometry(&g).unwrap();
    let mut act = Action::for_geometry(&g);
    assert_eq!(obs_reader.read_latest(&mut obs), Err(ReadError::Empty));
    assert_eq!(act_reader.read_latest(&mut act), Err(ReadError::Empty));

    for k in 1..=5 {
        assert_eq!(
            obs_writer.publish(&sample_observation(&g, k)).unwrap(),
            k as u64
        );
        assert_eq!(act_writer.publish(&sample_action(&g, k)).unwrap(), k as u64);
    }
    assert_eq!(obs_reader.read_latest(&mut obs).unwrap(), 5);
    let mut expected = sample_observation(&g, 5);
    expected.seq = 5;
    expected.writer_epoch = 1;
    assert_eq!(obs, expected);

    act_reader.read_seq(4, &mut act).unwrap();
    let mut expected = sample_action(&g, 4);
    expected.seq = 4;
    expected.writer_epoch = 1;
    assert_eq!(act, expected);
    assert!(act.applicable_at(act.valid_until_ns - 1));
    assert!(!act.applicable_at(act.valid_until_ns));

    assert_eq!(
        act_reader.read_seq(9, &mut act),
        Err(ReadError::NotYetWritten {
            seq: 9,
            published: 5
        })
    );
    assert_eq!(
        act_reader.read_seq(1, &mut act),
        Err(ReadError::Overwritten { seq: 1, by: 5 })
    );
    assert_eq!(
        obs_reader.read_seq(2, &mut obs),
        Err(ReadError::Overwritten { seq: 2, by: 5 })
    );
    assert_eq!(act_reader.published(), 5);
    assert_eq!(act_reader.writer_pid(), std::process::id());
    assert!(act_reader.writer_heartbeat_ns() > 0);
    assert!(!act_reader.is_initializing());
    assert!(!act_reader.is_replaced().unwrap());
}

#[test]
fn restarted_writer_keeps_data_bumps_epoch_and_continues_seqs() {
    let scratch = Scratch::new("restart");
    let g = small_geometry();
    let path = scratch.path("act");
    let mut writer = ActionWriter::create(&path, g, 4).unwrap();
    for k in 1..=3 {
        writer.publish(&sample_action(&g, k)).unwrap();
    }
    let reader = ActionReader::open(&path, g).unwrap();
    assert_eq!(reader.writer_epoch(), 1);
    drop(writer);

    let mut writer = ActionWriter::create(&path, g, 4).unwrap();
    assert!(
        matches!(writer.origin(), Origin::Reopened),
        "{:?}",
        writer.origin()
    );
    assert_eq!((writer.epoch(), writer.next_seq()), (2, 4));
    assert_eq!(reader.writer_epoch(), 2);
    let mut act = Action::for_geometry(&g);
    assert_eq!(
        reader.read_latest(&mut act).unwrap(),
        3,
        "old data stays readable"
    );
    assert_eq!(act.writer_epoch, 1);

    assert_eq!(writer.publish(&sample_action(&g, 4)).unwrap(), 4);
    assert_eq!(reader.read_latest(&mut act).unwrap(), 4);
    assert_eq!(act.writer_epoch, 2);
}

#[test]
fn a_second_live_writer_is_refused_naming_the_holder() {
    let scratch = Scratch::new("two-writers");
    let g = small_geometry();
    let path = scratch.path("act");
    let _first = ActionWriter::create(&path, g, 4).unwrap();
    match ActionWriter::create(&path, g, 4) {
        Err(CreateError::WriterActive { pid, path: p }) => {
            assert_eq!(pid, std::process::id());
            assert_eq!(p, path);
        }
        other => panic!("expected WriterActive, got {:?}", other.map(|w| w.epoch())),
    }
}

/// A writer that opened the file just before another writer replaced it (rename over the
/// path) and let go of the old file's lock must not become the writer of the orphaned
/// file: after locking, `create` checks the path still names the locked inode.
#[test]
fn a_writer_whose_file_was_replaced_before_it_locked_it_is_not_a_second_writer() {
    let scratch = Scratch::new("replaced-before-lock");
    let g = small_geometry();
    let other = Geometry {
        action_dims: g.action_dims + 1,
        ..g
    };
    let path = scratch.path("act");
    drop(ActionWriter::create(&path, g, 4).unwrap());
    let mut rival = None;
    let result = ActionWriter::create_with_pause(&path, g, 4, || {
        if rival.is_none() {
            // Between our open and our lock: a writer of another geometry replaces the
            // file (new inode, renamed over the path) and keeps the new file's lock.
            let w = ActionWriter::create(&path, other, 4).unwrap();
            assert!(matches!(w.origin(), Origin::Replaced(_)));
            rival = Some(w);
        }
    });
    match result {
        Err(CreateError::WriterActive { pid, .. }) => assert_eq!(pid, std::process::id()),
        Err(e) => panic!("expected WriterActive, got {e}"),
        Ok(w) => panic!(
            "a second writer (epoch {}) of a file the path no longer names",
            w.epoch()
        ),
    }
    // The rival is the one writer the path's readers see.
    let reader = ActionReader::open(&path, other).unwrap();
    assert_eq!(reader.writer_epoch(), rival.as_ref().unwrap().epoch());
}

#[test]
fn dead_writers_odd_slot_is_skipped_and_the_next_writer_moves_past_it() {
    let scratch = Scratch::new("odd-slot");
    let g = small_geometry();
    let path = scratch.path("obs");
    let mut writer = ObservationWriter::create(&path, g, 4).unwrap();
    for k in 1..=5 {
        writer.publish(&sample_observation(&g, k)).unwrap();
    }
    let layout = *writer.layout();
    drop(writer);
    // What a writer killed while writing seq 6 leaves: an odd seqlock word, half-new
    // payload, `published` still at 5.
    let slot6 = slot_offset(&layout, 6);
    poke(&path, slot6, &11u64.to_ne_bytes());
    poke(&path, slot6 + 8, &6u64.to_ne_bytes());
    poke(&path, slot6 + layout.frames_offset as u64, &[0xEE; 9]);

    let reader = ObservationReader::open(&path, g).unwrap();
    let mut obs = Observation::for_geometry(&g).unwrap();
    assert_eq!(reader.read_latest(&mut obs).unwrap(), 5);
    assert_eq!(obs.frames, sample_observation(&g, 5).frames);
    assert_eq!(
        reader.read_seq(6, &mut obs),
        Err(ReadError::InProgress { seq: 6 })
    );

    let mut writer = ObservationWriter::create(&path, g, 4).unwrap();
    assert_eq!(
        writer.next_seq(),
        7,
        "seq 6 was started, so it is never reused"
    );
    writer.publish(&sample_observation(&g, 7)).unwrap();
    assert_eq!(reader.read_latest(&mut obs).unwrap(), 7);
    assert_eq!(reader.writer_epoch(), 2);
}

fn open_err(path: &Path, g: Geometry) -> OpenError {
    match ActionReader::open(path, g) {
        Ok(_) => panic!("{} opened despite a bad segment", path.display()),
        Err(e) => e,
    }
}

#[test]
fn wrong_magic_kind_and_abi_are_rejected_naming_the_field() {
    let scratch = Scratch::new("bad-header");
    let g = small_geometry();
    let path = scratch.path("act");
    let mut writer = ActionWriter::create(&path, g, 4).unwrap();
    writer.publish(&sample_action(&g, 1)).unwrap();
    drop(writer);

    poke(&path, 0, &0x1234_5678u64.to_ne_bytes());
    let e = open_err(&path, g);
    assert!(
        matches!(e, OpenError::BadMagic { found: 0x1234_5678, expected, .. } if expected == ACTION_MAGIC),
        "{e}"
    );
    assert!(e.to_string().contains("field magic"), "{e}");
    assert!(!e.is_retryable());

    poke(&path, 0, &OBS_MAGIC.to_ne_bytes());
    let e = open_err(&path, g);
    assert!(
        matches!(
            e,
            OpenError::WrongKind {
                expected: RingKind::Action,
                found: RingKind::Observation,
                ..
            }
        ),
        "{e}"
    );
    poke(&path, 0, &ACTION_MAGIC.to_ne_bytes());

    poke(&path, 8, &2u32.to_ne_bytes());
    let e = open_err(&path, g);
    assert!(
        matches!(
            e,
            OpenError::AbiMajor {
                expected: 1,
                found: 2,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        format!("{}: field abi_major: expected 1, found 2", path.display())
    );
    poke(&path, 8, &1u32.to_ne_bytes());

    poke(&path, 16, &(ABI_VERSION + 1).to_ne_bytes());
    let e = open_err(&path, g);
    assert!(
        matches!(e, OpenError::AbiTooOld { lowest_compatible, .. } if lowest_compatible == ABI_VERSION + 1),
        "{e}"
    );
    // A newer writer version that old readers can still read is accepted.
    poke(&path, 12, &(ABI_VERSION + 3).to_ne_bytes());
    poke(&path, 16, &ABI_VERSION.to_ne_bytes());
    ActionReader::open(&path, g).unwrap();

    poke(&path, 72, &STATE_INITIALIZING.to_ne_bytes());
    let e = open_err(&path, g);
    assert!(matches!(e, OpenError::Initializing { .. }), "{e}");
    assert!(e.is_retryable());
}

#[test]
fn every_geometry_field_mismatch_is_named_with_expected_and_found() {
    let scratch = Scratch::new("geometry");
    let g = small_geometry();
    let path = scratch.path("act");
    let _writer = ActionWriter::create(&path, g, 4).unwrap();
    let names = g.fields().map(|(name, _)| name);
    for (i, name) in names.iter().enumerate() {
        let mut values = g.fields().map(|(_, v)| v);
        values[i] += 1;
        let expected = Geometry {
            cameras: values[0],
            height: values[1],
            width: values[2],
            channels: values[3],
            state_dims: values[4],
            action_dims: values[5],
            chunk_len: values[6],
        };
        match open_err(&path, expected) {
            OpenError::Mismatch {
                field,
                expected: e,
                found: f,
                ..
            } => {
                assert_eq!(field, *name);
                assert_eq!((e, f), (values[i] as u64, values[i] as u64 - 1));
            }
            other => panic!("{name}: expected Mismatch, got {other}"),
        }
    }
}

#[test]
fn truncated_and_empty_files_are_rejected() {
    let scratch = Scratch::new("truncated");
    let g = small_geometry();
    let path = scratch.path("act");
    let writer = ActionWriter::create(&path, g, 4).unwrap();
    let total = writer.layout().total_size as u64;
    drop(writer);

    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(total - 64).unwrap();
    let e = open_err(&path, g);
    assert!(
        matches!(e, OpenError::Truncated { expected, found, .. } if expected == total && found == total - 64),
        "{e}"
    );
    file.set_len(50).unwrap();
    let e = open_err(&path, g);
    assert!(
        matches!(
            e,
            OpenError::Truncated {
                expected: 128,
                found: 50,
                ..
            }
        ),
        "{e}"
    );
    file.set_len(0).unwrap();
    assert!(
        open_err(&path, g).is_retryable(),
        "an empty file is a writer starting"
    );

    let missing = open_err(&scratch.path("nothing-here"), g);
    assert!(matches!(missing, OpenError::NotFound { .. }) && missing.is_retryable());

    // A writer restarting on the truncated file rebuilds it.
    file.set_len(50).unwrap();
    let writer = ActionWriter::create(&path, g, 4).unwrap();
    assert!(
        matches!(
            writer.origin(),
            Origin::Replaced(OpenError::Truncated { .. })
        ),
        "{:?}",
        writer.origin()
    );
    ActionReader::open(&path, g).unwrap();
}

#[test]
fn writer_replaces_a_foreign_or_differently_shaped_file_without_breaking_old_readers() {
    let scratch = Scratch::new("replace");
    let g = small_geometry();
    let path = scratch.path("act");

    std::fs::write(&path, vec![b'x'; 4096]).unwrap();
    let writer = ActionWriter::create(&path, g, 4).unwrap();
    assert!(
        matches!(
            writer.origin(),
            Origin::Replaced(OpenError::BadMagic { .. })
        ),
        "{:?}",
        writer.origin()
    );
    let mut writer = writer;
    writer.publish(&sample_action(&g, 1)).unwrap();
    let old_reader = ActionReader::open(&path, g).unwrap();
    drop(writer);

    let wider = Geometry {
        action_dims: 12,
        ..g
    };
    let mut writer = ActionWriter::create(&path, wider, 4).unwrap();
    assert!(
        matches!(
            writer.origin(),
            Origin::Replaced(OpenError::Mismatch {
                field: "action_dims",
                ..
            })
        ),
        "{:?}",
        writer.origin()
    );
    assert_eq!(writer.epoch(), 1, "a new segment starts a new epoch count");
    writer.publish(&sample_action(&wider, 2)).unwrap();

    assert!(old_reader.is_replaced().unwrap());
    let mut act = Action::for_geometry(&g);
    assert_eq!(
        old_reader.read_latest(&mut act).unwrap(),
        1,
        "old mapping intact"
    );
    let new_reader = ActionReader::open(&path, wider).unwrap();
    let mut wide = Action::for_geometry(&wider);
    assert_eq!(new_reader.read_latest(&mut wide).unwrap(), 1);
    assert_eq!(wide.values, sample_action(&wider, 2).values);

    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temporary files left: {leftovers:?}");
}

#[test]
fn wrong_buffers_and_invalid_status_are_typed_errors() {
    let scratch = Scratch::new("buffers");
    let g = small_geometry();
    let path = scratch.path("act");
    let mut writer = ActionWriter::create(&path, g, 4).unwrap();
    let mut short = sample_action(&g, 1);
    short.values.pop();
    assert_eq!(
        writer.publish(&short),
        Err(PublishError::Length {
            field: "values",
            expected: 7,
            found: 6
        })
    );
    assert_eq!(writer.next_seq(), 1, "a refused publish consumes no seq");
    writer.publish(&sample_action(&g, 1)).unwrap();

    let reader = ActionReader::open(&path, g).unwrap();
    let mut wrong = Action::for_geometry(&Geometry {
        action_dims: 3,
        ..g
    });
    assert_eq!(
        reader.read_latest(&mut wrong),
        Err(ReadError::BufferMismatch {
            field: "values",
            expected: 7,
            found: 3
        })
    );

    let mut obs_writer = ObservationWriter::create(scratch.path("obs"), g, 2).unwrap();
    let mut no_frames = sample_observation(&g, 1);
    no_frames.frames.clear();
    assert!(matches!(
        obs_writer.publish(&no_frames),
        Err(PublishError::Length {
            field: "frames",
            found: 0,
            ..
        })
    ));

    let status_offset = slot_offset(writer.layout(), 1) + 60;
    poke(&path, status_offset, &7u32.to_ne_bytes());
    let mut act = Action::for_geometry(&g);
    let e = reader.read_latest(&mut act).unwrap_err();
    assert_eq!(e, ReadError::InvalidStatus { seq: 1, found: 7 });
    assert!(e.to_string().contains("field status"), "{e}");
}

#[test]
fn unusable_configurations_are_refused_before_touching_the_file() {
    let scratch = Scratch::new("config");
    let path = scratch.path("act");
    let bad = Geometry {
        chunk_len: 0,
        ..small_geometry()
    };
    let e = ActionWriter::create(&path, bad, 4).err().expect("refused");
    assert!(matches!(
        e,
        CreateError::Config {
            source: ConfigError::Zero { field: "chunk_len" },
            ..
        }
    ));
    assert!(e.to_string().contains("chunk_len"), "{e}");
    assert!(!path.exists());
    let e = ActionWriter::create(&path, small_geometry(), 1)
        .err()
        .expect("refused");
    assert!(matches!(
        e,
        CreateError::Config {
            source: ConfigError::SlotCount { found: 1 },
            ..
        }
    ));
}

#[test]
fn heartbeat_moves_forward() {
    let scratch = Scratch::new("heartbeat");
    let g = small_geometry();
    let writer = ActionWriter::create(scratch.path("act"), g, 2).unwrap();
    let reader = ActionReader::open(scratch.path("act"), g).unwrap();
    let before = reader.writer_heartbeat_ns();
    std::thread::sleep(std::time::Duration::from_millis(2));
    writer.heartbeat();
    assert!(reader.writer_heartbeat_ns() > before);
    assert!(reader.heartbeat_age() < std::time::Duration::from_secs(3600));
}
