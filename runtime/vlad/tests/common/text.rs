//! What the instruction-text tests share: the rings' paths and the daemon's settings, the
//! firmware stand-ins (the C one that writes texts to the instruction segment, and the
//! thread that publishes observations), and the action ring read in order.

use super::{running, HANG_GUARD};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vla_ring::{monotonic_ns, Action, ActionStatus, Geometry, Observation, RingReader, RingWriter};
use vla_test_support::repo_root;

/// The rings' paths of a test, `/dev/shm/<tag>-<pid>-{obs,act,txt}`.
pub struct RingPaths {
    /// The observation ring.
    pub obs: PathBuf,
    /// The action ring.
    pub act: PathBuf,
    /// The instruction text segment.
    pub txt: PathBuf,
}

impl RingPaths {
    pub fn new(tag: &str) -> Self {
        let shm =
            |what: &str| PathBuf::from(format!("/dev/shm/{tag}-{}-{what}", std::process::id()));
        Self {
            obs: shm("obs"),
            act: shm("act"),
            txt: shm("txt"),
        }
    }

    /// Removes the three files.
    pub fn remove(&self) {
        for p in [&self.obs, &self.act, &self.txt] {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Sets config `v` for the text tests' daemon: QNN from `lib`, the rings at `rings` (1024
/// action slots), info logs, and lockstep control: each chunk plays its first rows
/// whatever the emulator's latency, then the daemon holds for an observation captured
/// after them (the lockstep eval's trigger).
pub fn text_daemon_config(v: &mut serde_json::Value, lib: String, rings: &RingPaths) {
    v["qnn"]["lib_dir"] = lib.into();
    v["rings"]["observation_path"] = rings.obs.to_str().unwrap().into();
    v["rings"]["action_path"] = rings.act.to_str().unwrap().into();
    v["rings"]["instruction_path"] = rings.txt.to_str().unwrap().into();
    v["rings"]["action_slots"] = 1024.into();
    v["control"] = serde_json::json!({
        "publish_hz": 20.0, "max_observation_age_ms": 60000, "max_chunk_age_ms": 60000,
        "hold_after_chunk_end_ms": 0, "action_valid_ms": 60000,
        "writer_heartbeat_timeout_ms": 60000, "merge": "skip",
        "trigger": "synchronous", "execute_steps": 3
    });
    v["log"]["level"] = "info".into();
}

/// The robot's observation side: one fixed observation (frames a byte pattern, state
/// `state_step * i`, seed 7) published at 20 Hz from its own thread, naming
/// `instruction`, until [`Firmware::stop`].
pub struct Firmware {
    /// The instruction id the next observations name.
    pub instruction: Arc<AtomicU32>,
    /// The seq of the newest observation published.
    pub newest_seq: Arc<AtomicU64>,
    /// When the newest observation was in the ring (stored before its seq).
    pub newest_ns: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Firmware {
    /// Creates the observation ring at `path` and starts publishing.
    pub fn start(path: &Path, g: Geometry, instruction: u32, state_step: f32) -> Self {
        let instruction = Arc::new(AtomicU32::new(instruction));
        let newest_seq = Arc::new(AtomicU64::new(0));
        let newest_ns = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (instruction, newest_seq, newest_ns, stop, path) = (
                instruction.clone(),
                newest_seq.clone(),
                newest_ns.clone(),
                stop.clone(),
                path.to_owned(),
            );
            std::thread::spawn(move || {
                let mut w = RingWriter::<Observation>::create(&path, g, 8).unwrap();
                let mut obs = Observation::for_geometry(&g).unwrap();
                for (i, b) in obs.frames.iter_mut().enumerate() {
                    *b = (i * 7 % 251) as u8;
                }
                for (i, s) in obs.state.iter_mut().enumerate() {
                    *s = state_step * i as f32;
                }
                while !stop.load(Ordering::Acquire) {
                    obs.instruction_id = instruction.load(Ordering::Acquire);
                    obs.capture_time_ns = monotonic_ns();
                    obs.seed = 7;
                    let seq = w.publish(&obs).unwrap();
                    newest_ns.store(monotonic_ns(), Ordering::Release);
                    newest_seq.store(seq, Ordering::Release);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Self {
            instruction,
            newest_seq,
            newest_ns,
            stop,
            thread,
        }
    }

    /// Switches to instruction `id`: the seq of the first observation naming it, and when
    /// it was in the ring (or a later one's time, if one followed already: a looser bound
    /// only).
    pub fn switch(&self, id: u32) -> (u64, u64) {
        self.instruction.store(id, Ordering::Release);
        let before = self.newest_seq.load(Ordering::Acquire);
        while self.newest_seq.load(Ordering::Acquire) <= before {
            std::thread::sleep(Duration::from_millis(1));
        }
        (before + 1, self.newest_ns.load(Ordering::Acquire))
    }

    /// Stops publishing and joins the thread.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap();
    }
}

/// Builds the C firmware stand-in of vla-ring's tests against the C ring client library,
/// or says why not (loudly in CI).
pub fn build_c_peer(dir: &Path) -> Option<PathBuf> {
    let source = repo_root().join("runtime/crates/vla-ring/tests/c/ring_peer.c");
    vla_test_support::compile_ring_client_program(&source, &dir.join("ring_peer"))
}

/// The C firmware writes one text; returns the CLOCK_MONOTONIC ns it was written at.
pub fn write_text(peer: &Path, path: &Path, g: &Geometry, text_id: u32, text: &[u8]) -> u64 {
    let hex: String = text.iter().map(|b| format!("{b:02x}")).collect();
    let mut args = vec!["write-text".to_string(), path.display().to_string()];
    args.extend(g.fields().iter().map(|(_, v)| v.to_string()));
    args.extend(["4".to_string(), text_id.to_string(), hex]);
    let out = Command::new(peer).args(&args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "write-text: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .split_whitespace()
        .find_map(|f| f.strip_prefix("written_ns="))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

/// Every action published so far, read in order by seq.
pub struct Actions {
    pub ring: RingReader<Action>,
    pub buf: Action,
    pub last: u64,
    pub all: Vec<Action>,
}

impl Actions {
    /// The action ring at `path` once the daemon `pid` has made it (it ending first, or
    /// the hang guard, fails the test), read from its start.
    pub fn open(path: &Path, g: Geometry, pid: u32) -> Self {
        let end = Instant::now() + HANG_GUARD;
        let ring = loop {
            if let Ok(r) = RingReader::<Action>::open(path, g) {
                break r;
            }
            assert!(running(pid) && Instant::now() < end, "no action ring");
            std::thread::sleep(Duration::from_millis(20));
        };
        Self {
            ring,
            buf: Action::for_geometry(&g),
            last: 0,
            all: Vec::new(),
        }
    }

    pub fn poll(&mut self) {
        let p = self.ring.published();
        for seq in self.last + 1..=p {
            if self.ring.read_seq(seq, &mut self.buf).is_ok() {
                self.all.push(self.buf.clone());
            }
        }
        self.last = p;
    }

    /// Polls until `done(actions from index from)` or the daemon ends / the hang guard.
    pub fn until(&mut self, what: &str, pid: u32, from: usize, done: impl Fn(&[Action]) -> bool) {
        let end = Instant::now() + HANG_GUARD;
        loop {
            self.poll();
            if done(&self.all[from..]) {
                return;
            }
            assert!(running(pid), "{what}: vlad ended first");
            assert!(Instant::now() < end, "{what}: not within {HANG_GUARD:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

pub fn ok(a: &Action) -> bool {
    a.status == ActionStatus::Ok
}
