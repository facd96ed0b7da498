//! A segment shrunk under its mappings (anyone who may write the file can `ftruncate` it):
//! readers and writers keep running, see nothing new, and report the segment truncated,
//! where the mapped pages used to fault (SIGBUS) and kill the process.
#![cfg(not(loom))]

mod common;

use std::fs::OpenOptions;

use common::Scratch;
use vla_ring::*;

fn shrink(path: &std::path::Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn a_shrunk_segment_reads_as_empty_instead_of_killing_the_process() {
    // Slots of a few pages each, so that every cut below leaves the newest slot (4 of 8)
    // outside the file.
    let geometry = Geometry {
        cameras: 1,
        height: 64,
        width: 64,
        channels: 3,
        state_dims: 5,
        action_dims: 7,
        chunk_len: 8,
    };
    for len in [0, HEADER_SIZE as u64, 4096, 3 * 4096] {
        let scratch = Scratch::new(&format!("trunc-{len}"));
        let path = scratch.path("obs");
        let mut writer = ObservationWriter::create(&path, geometry, 8).unwrap();
        let mut obs = Observation::for_geometry(&geometry).unwrap();
        for _ in 0..20 {
            obs.capture_time_ns = monotonic_ns();
            writer.publish(&obs).unwrap();
        }
        let reader = ObservationReader::open(&path, geometry).unwrap();
        let mut buf = Observation::for_geometry(&geometry).unwrap();
        assert_eq!(reader.read_latest(&mut buf).unwrap(), 20);
        assert!(!reader.is_truncated() && !writer.is_truncated());

        shrink(&path, len);
        // Every page past the new end faults; the process survives each access.
        let read = reader.read_latest(&mut buf);
        assert!(read.is_err(), "{len}: {read:?}");
        assert!(reader.is_truncated(), "{len}");
        obs.capture_time_ns = monotonic_ns();
        let _ = writer.publish(&obs);
        assert!(writer.is_truncated(), "{len}");
        // Reading again survives too (what it yields is the writer's latest or nothing).
        let _ = reader.read_latest(&mut buf);
        // A reader opened now refuses the short file instead of mapping it.
        assert!(ObservationReader::open(&path, geometry).is_err());
        drop(reader);
        drop(writer);
        // The next writer makes the segment whole again.
        let mut again = ObservationWriter::create(&path, geometry, 8).unwrap();
        again.publish(&obs).unwrap();
        let reader = ObservationReader::open(&path, geometry).unwrap();
        assert!(reader.read_latest(&mut buf).is_ok());
        assert!(!reader.is_truncated());
    }
}
