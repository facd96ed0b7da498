//! Multi-process stress: a writer child process (this test binary re-executed) publishes
//! observations as fast as it can and is SIGKILLed again and again, mid-write as often as
//! not, while readers in this process copy slots the whole time. Every accepted copy must
//! match the pattern its seq and epoch dictate; after each restart the readers must see
//! the new epoch and fresh data.
#![cfg(not(loom))]

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::Scratch;
use vla_ring::*;

/// Set (to the ring path) only in the re-executed child.
const CHILD_ENV: &str = "VLA_RING_STRESS_WRITER_PATH";
/// Optional command prefix for the child (e.g. `qemu-aarch64`) when this binary cannot
/// be executed directly; found automatically for qemu-user.
const RUNNER_ENV: &str = "VLA_RING_TEST_RUNNER";
const WRITER_RESTARTS: u64 = 12;
const SLOTS: u32 = 8;
/// Guards against a hang only; never reached in a passing run.
const PATIENCE: Duration = vla_test_support::HANG_GUARD;

fn geometry() -> Geometry {
    Geometry {
        cameras: 2,
        height: 96,
        width: 128,
        channels: 3,
        state_dims: 9,
        action_dims: 7,
        chunk_len: 8,
    }
}

fn frame_byte(seq: u64, epoch: u64, j: usize) -> u8 {
    (seq.wrapping_mul(131) ^ epoch.wrapping_mul(29)).wrapping_add(j as u64 * 7) as u8
}

fn fill(obs: &mut Observation, seq: u64, epoch: u64) {
    obs.capture_time_ns = seq * 1000 + epoch;
    obs.seed = !seq;
    obs.instruction_id = (seq % 97) as u32;
    for (i, v) in obs.state.iter_mut().enumerate() {
        *v = (seq % 4096) as f32 + i as f32 * 0.5 + epoch as f32 * 8192.0;
    }
    for (j, b) in obs.frames.iter_mut().enumerate() {
        *b = frame_byte(seq, epoch, j);
    }
}

/// The copy must be exactly what `fill` made for its own seq and epoch.
fn verify(obs: &Observation) -> Result<(), String> {
    let mut expected = obs.clone();
    fill(&mut expected, obs.seq, obs.writer_epoch);
    if *obs == expected {
        return Ok(());
    }
    let first_bad = obs
        .frames
        .iter()
        .zip(&expected.frames)
        .position(|(a, b)| a != b);
    Err(format!(
        "torn observation accepted: seq {} epoch {}, first differing frame byte {first_bad:?}",
        obs.seq, obs.writer_epoch
    ))
}

/// The child's whole life: take over the ring and publish until killed. Not a test of its
/// own: ignored in ordinary runs (so it never "passes" without doing anything) and started
/// by the stress test with `--ignored`; run by hand without the ring path, it fails.
#[test]
#[ignore = "the stress test's writer child; started by it with --ignored"]
fn stress_writer_child() {
    let path = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!("stress_writer_child is started by the stress test, which sets {CHILD_ENV}")
    });
    let started = Instant::now();
    let mut writer = loop {
        match ObservationWriter::create(&path, geometry(), SLOTS) {
            Ok(writer) => break writer,
            Err(CreateError::WriterActive { .. }) if started.elapsed() < PATIENCE => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("stress writer: {e}"),
        }
    };
    println!("{CHILD_READY}");
    let mut obs = Observation::for_geometry(&geometry()).unwrap();
    loop {
        fill(&mut obs, writer.next_seq(), writer.epoch());
        writer.publish(&obs).unwrap();
    }
}

/// Printed by the child once running, so the parent can tell a child that started from
/// one whose exec failed silently (qemu-user reports a failed exec as exit 127).
const CHILD_READY: &str = "vla-ring-stress-writer-ready";

/// Runs `command` (this test binary, possibly behind a runner) as the writer child and
/// waits for its ready line.
fn start_child(mut command: Command, path: &Path) -> Option<Child> {
    let mut child = command
        .args([
            "--exact",
            "stress_writer_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    let stdout = BufReader::new(child.stdout.take().unwrap());
    for line in stdout.lines() {
        match line {
            // The harness prints "test stress_writer_child ... " on the same line.
            Ok(line) if line.trim_end().ends_with(CHILD_READY) => return Some(child),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn spawn_writer(path: &Path) -> Child {
    let exe = std::env::current_exe().unwrap();
    if let Ok(runner) = std::env::var(RUNNER_ENV) {
        let mut words = runner.split_whitespace();
        let mut command = Command::new(words.next().expect("VLA_RING_TEST_RUNNER is empty"));
        command.args(words).arg(&exe);
        return start_child(command, path)
            .unwrap_or_else(|| panic!("writer child did not start via {runner}"));
    }
    if let Some(child) = start_child(Command::new(&exe), path) {
        return child;
    }
    // Under qemu-user without binfmt_misc this binary cannot exec itself: run the child
    // the way we were run.
    let qemu = format!("qemu-{}", std::env::consts::ARCH);
    let mut command = Command::new(&qemu);
    command.arg(&exe);
    start_child(command, path).unwrap_or_else(|| {
        panic!("writer child did not start, neither directly nor via {qemu}; set {RUNNER_ENV}")
    })
}

/// Cheap deterministic jitter for kill times (timing is varied, never asserted).
struct Jitter(u64);

impl Jitter {
    fn next_millis(&mut self, max: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % max
    }
}

fn read_word(path: &Path, offset: u64) -> u64 {
    let file = std::fs::File::open(path).unwrap();
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, offset).unwrap();
    u64::from_ne_bytes(word)
}

#[test]
fn readers_never_accept_torn_data_while_the_writer_is_killed_mid_write() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let scratch = Scratch::new("stress");
    let path = scratch.path("obs");
    let g = geometry();
    let mut jitter = Jitter(0x9E37_79B9_7F4A_7C15 ^ std::process::id() as u64);

    let mut child = spawn_writer(&path);
    let started = Instant::now();
    let reader = loop {
        match ObservationReader::open(&path, g) {
            Ok(reader) => break reader,
            Err(e) if e.is_retryable() && started.elapsed() < PATIENCE => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => {
                let _ = child.kill();
                panic!("{e}");
            }
        }
    };
    let layout = *reader.layout();

    let stop = AtomicBool::new(false);
    let background_ok = AtomicU64::new(0);
    let background_contended = AtomicU64::new(0);
    let mut killed_mid_write = 0;
    let mut foreground_ok = 0u64;

    std::thread::scope(|scope| {
        // A reader that never pauses, across every kill and restart.
        let background = scope.spawn(|| {
            let mut obs = Observation::for_geometry(&g).unwrap();
            let mut newest = 0;
            while !stop.load(Ordering::Relaxed) {
                match reader.read_latest(&mut obs) {
                    Ok(seq) => {
                        verify(&obs)?;
                        if seq < newest {
                            return Err(format!("newest seq went back from {newest} to {seq}"));
                        }
                        newest = seq;
                        background_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    // A restarting writer: retried, like a contended read.
                    Err(ReadError::Empty | ReadError::WriterStarting) => {}
                    Err(ReadError::Contended { .. }) => {
                        background_contended.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return Err(format!("background reader: {e}")),
                }
            }
            Ok(())
        });

        let mut obs = Observation::for_geometry(&g).unwrap();
        let mut last_seq_before_kill = 0;
        for epoch in 1..=WRITER_RESTARTS {
            // The (re)started writer must become visible: new epoch, fresh seqs.
            let wait_start = Instant::now();
            loop {
                assert!(
                    wait_start.elapsed() < PATIENCE,
                    "writer epoch {epoch} never published (reader sees epoch {})",
                    reader.writer_epoch()
                );
                match reader.read_latest(&mut obs) {
                    Ok(seq) => {
                        verify(&obs).unwrap();
                        foreground_ok += 1;
                        if obs.writer_epoch == epoch {
                            assert!(seq > last_seq_before_kill, "seq reused after restart");
                            break;
                        }
                        assert!(obs.writer_epoch < epoch, "epoch from the future");
                    }
                    Err(
                        ReadError::Empty | ReadError::Contended { .. } | ReadError::WriterStarting,
                    ) => {}
                    Err(e) => panic!("{e}"),
                }
                std::thread::yield_now();
            }
            assert_eq!(reader.writer_epoch(), epoch);

            std::thread::sleep(Duration::from_millis(jitter.next_millis(25)));
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();

            // What the dead writer left: `published` complete, maybe the next slot odd.
            let published = reader.published();
            let next_slot =
                HEADER_SIZE as u64 + ((published + 1) % SLOTS as u64) * layout.slot_size as u64;
            if read_word(&path, next_slot) == 2 * (published + 1) - 1 {
                killed_mid_write += 1;
            }
            // The newest complete slot stays readable without a writer.
            assert_eq!(reader.read_latest(&mut obs).unwrap(), published);
            verify(&obs).unwrap();
            last_seq_before_kill = published;

            if epoch < WRITER_RESTARTS {
                child = spawn_writer(&path);
            }
        }
        stop.store(true, Ordering::Relaxed);
        background.join().unwrap().unwrap();
    });

    let background_ok = background_ok.into_inner();
    eprintln!(
        "stress: {WRITER_RESTARTS} writer lives, {killed_mid_write} killed mid-write, \
         {foreground_ok} + {background_ok} verified copies, {} reads gave up contended",
        background_contended.into_inner()
    );
    assert!(
        background_ok > 0,
        "the background reader never completed a read"
    );
    assert!(
        !reader.is_replaced().unwrap(),
        "restarts must keep the same segment"
    );
}
