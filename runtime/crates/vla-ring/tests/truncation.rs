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

/// Set in the child of [`a_sigbus_sent_by_kill_ends_the_process_as_without_the_handler`].
const KILL_CHILD: &str = "VLA_RING_KILL_BUS_CHILD";

/// In the child only: maps a ring (installing the SIGBUS handler), sends itself SIGBUS
/// (no fault: a signal sent, as by `kill -BUS`) and says if it lived on.
#[test]
fn kill_bus_child() {
    let Some(dir) = std::env::var_os(KILL_CHILD) else {
        return;
    };
    let path = std::path::Path::new(&dir).join("obs");
    let geometry = Geometry {
        cameras: 1,
        height: 8,
        width: 8,
        channels: 3,
        state_dims: 5,
        action_dims: 7,
        chunk_len: 8,
    };
    let _writer = ObservationWriter::create(&path, geometry, 8).unwrap();
    // Sent to this thread (tgkill, as `kill -BUS` is to the process: no fault address),
    // so it is handled before raise returns and nothing below runs unless it lived on.
    nix::sys::signal::raise(nix::sys::signal::SIGBUS).unwrap();
    println!("survived a SIGBUS sent by kill");
}

#[test]
fn a_sigbus_sent_by_kill_ends_the_process_as_without_the_handler() {
    use std::os::unix::process::ExitStatusExt;
    let scratch = Scratch::new("kill-bus");
    let dir = scratch.path("child");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut command = match std::env::var("VLA_RING_TEST_RUNNER") {
        Ok(runner) => {
            let mut words = runner.split_whitespace();
            let mut c = std::process::Command::new(words.next().unwrap());
            c.args(words).arg(&exe);
            c
        }
        Err(_) => std::process::Command::new(&exe),
    };
    let out = command
        .args([
            "--exact",
            "kill_bus_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(KILL_CHILD, &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Not taken for a truncation, and the handler not quietly switched off: the default
    // action, as if no ring were mapped.
    assert!(!stdout.contains("survived"), "{stdout}");
    assert_eq!(
        out.status.signal(),
        Some(nix::sys::signal::SIGBUS as i32),
        "{:?}: {stdout}",
        out.status
    );
}
