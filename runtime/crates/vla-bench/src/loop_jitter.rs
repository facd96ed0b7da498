//! `vla-bench loop`: publish-time jitter, missed ticks and allocations per tick of the
//! real control loop (`vla_control::ControlLoop`, not a copy), one rate after another.
//!
//! Per rate, the set-up a robot gives the daemon: a camera thread publishes observations
//! (two 256x256 RGB frames and a 7-dim state, MolmoAct2's inputs) to a real observation
//! ring in `/dev/shm` at camera rate; the loop reads them, runs a synthetic [`Engine`]
//! whose inference sleeps a fixed time and fills the 10x7 chunk from the observation, and
//! publishes one action per tick to a real action ring. What is reported:
//!
//! - jitter: the loop's own `LoopReport::jitter` (wake-up lateness against the absolute
//!   deadline, 1 us buckets, quantile = upper bucket edge), over every tick of the run;
//! - missed ticks: `LoopReport::missed_ticks`;
//! - allocations per tick on the publisher thread after warm-up. `vla-control` hands out
//!   no thread handle, so the publisher is found by name: after `ControlLoop::start`, the
//!   one entry of `/proc/self/task/*/comm` reading `vla-publisher` (the name the loop gives
//!   its thread) is its kernel tid, and the counting allocator counts the allocations whose
//!   caller's `gettid()` is that tid ([`vla_alloc_count`]);
//! - allocations per tick of the whole process after warm-up, for information (the
//!   inference and watch threads may allocate on error and retry paths);
//! - the scheduling policy the publisher actually got (from `/proc/self/task/TID/stat`),
//!   and whether `mlockall` and `/dev/cpu_dma_latency` = 0 took effect, as cyclictest
//!   `-m` does both.

use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use vla_alloc_count as counting;
use vla_control::{
    sleep_until, ControlLoop, Engine, EngineError, Health, LoopReport, LoopSettings,
};
use vla_ring::{monotonic_ns, Geometry, Observation, RingWriter};

/// The name `vla-control` gives its publisher thread.
const PUBLISHER_THREAD: &str = "vla-publisher";

/// MolmoAct2's observation and chunk: two 256x256 RGB frames, 7-dim state, 10x7 actions.
pub const GEOMETRY: Geometry = Geometry {
    cameras: 2,
    height: 256,
    width: 256,
    channels: 3,
    state_dims: 7,
    action_dims: 7,
    chunk_len: 10,
};

/// What one run measures and how.
#[derive(Clone, Debug)]
pub struct LoopBenchSettings {
    pub rates_hz: Vec<u32>,
    /// Measured window per rate, after warm-up.
    pub seconds: f64,
    /// Ticks before the allocation count starts (at least until the first chunk landed).
    pub warmup_seconds: f64,
    pub inference: Duration,
    pub camera_hz: u32,
    /// SCHED_FIFO priority of the publisher (0: SCHED_OTHER); cyclictest's `-p`.
    pub priority: u8,
}

impl Default for LoopBenchSettings {
    fn default() -> Self {
        Self {
            rates_hz: vec![10, 20, 50],
            seconds: 60.0,
            warmup_seconds: 2.0,
            inference: Duration::from_millis(100),
            camera_hz: 30,
            priority: 80,
        }
    }
}

/// Errors of the loop benchmark, each naming what failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoopBenchError {
    ObservationRing {
        path: PathBuf,
        reason: String,
    },
    Control {
        hz: u32,
        reason: String,
    },
    Thread {
        what: &'static str,
        source: std::io::Error,
    },
    Proc {
        path: PathBuf,
        reason: String,
    },
    Publisher {
        hz: u32,
        found: Vec<i32>,
    },
    NoChunk {
        hz: u32,
        waited: Duration,
    },
    Broken {
        hz: u32,
    },
}

impl std::fmt::Display for LoopBenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoopBenchError::ObservationRing { path, reason } => {
                write!(f, "observation ring {}: {reason}", path.display())
            }
            LoopBenchError::Control { hz, reason } => {
                write!(f, "control loop at {hz} Hz: {reason}")
            }
            LoopBenchError::Thread { what, source } => {
                write!(f, "cannot start the {what} thread: {source}")
            }
            LoopBenchError::Proc { path, reason } => write!(f, "{}: {reason}", path.display()),
            LoopBenchError::Publisher { hz, found } => write!(
                f,
                "control loop at {hz} Hz: expected one `{PUBLISHER_THREAD}` thread in /proc/self/task, found tids {found:?}"
            ),
            LoopBenchError::NoChunk { hz, waited } => write!(
                f,
                "control loop at {hz} Hz: no action chunk published within {:.1} s of warm-up",
                waited.as_secs_f64()
            ),
            LoopBenchError::Broken { hz } => {
                write!(f, "control loop at {hz} Hz: a loop thread ended on its own")
            }
        }
    }
}

impl std::error::Error for LoopBenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Named in the message: only its own causes come next.
            LoopBenchError::Thread { source, .. } => source.source(),
            _ => None,
        }
    }
}

/// Stands in for a policy: sleeps a fixed inference time, then derives the chunk from
/// the observation (state plus a ramp per step), without allocating.
struct SleepingEngine {
    latency: Duration,
    action_dims: usize,
}

impl Engine for SleepingEngine {
    fn infer(&mut self, obs: &Observation, actions: &mut [f32]) -> Result<(), EngineError> {
        std::thread::sleep(self.latency);
        let pixel = obs.frames.first().copied().unwrap_or(0) as f32 / 255.0;
        for (i, a) in actions.iter_mut().enumerate() {
            let step = (i / self.action_dims) as f32;
            let state = obs.state.get(i % self.action_dims).copied().unwrap_or(0.0);
            *a = state + pixel + step * 1e-3;
        }
        Ok(())
    }

    fn reload(&mut self) -> Result<String, EngineError> {
        Ok("synthetic engine (sleeps, fills the chunk)".into())
    }
}

/// The robot's side: publishes a new observation every camera period until stopped,
/// returns how many it published.
fn camera(
    mut writer: RingWriter<Observation>,
    mut obs: Observation,
    period_ns: u64,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut frames = 0u64;
    let mut next = monotonic_ns();
    while !stop.load(Ordering::Acquire) {
        // A new exposure: every byte changes, as a camera's DMA rewrites the frame.
        obs.frames.fill(frames as u8);
        for (i, s) in obs.state.iter_mut().enumerate() {
            *s = (frames as f32 * 0.01 + i as f32).sin();
        }
        obs.capture_time_ns = monotonic_ns();
        if writer.publish(&obs).is_ok() {
            frames += 1;
        }
        next += period_ns;
        sleep_until(next);
    }
    frames
}

/// Kernel tids of this process's threads whose name (`comm`) is `name`.
pub fn threads_named(name: &str) -> Result<Vec<i32>, LoopBenchError> {
    let dir = Path::new("/proc/self/task");
    let entries = std::fs::read_dir(dir).map_err(|e| LoopBenchError::Proc {
        path: dir.into(),
        reason: e.to_string(),
    })?;
    let mut tids = Vec::new();
    for entry in entries.flatten() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // A thread that ended between read_dir and here has no comm: not ours to find.
        if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) {
            if comm.trim_end_matches('\n') == name {
                tids.push(tid);
            }
        }
    }
    tids.sort_unstable();
    Ok(tids)
}

/// Scheduling policy and real-time priority from the text of `/proc/.../stat`
/// (fields 41 and 40; the command name in parentheses may hold spaces and parentheses).
pub fn parse_policy(stat: &str) -> Option<(u32, u32)> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // `fields[0]` is field 3 (state).
    let rt_priority = fields.get(40 - 3)?.parse().ok()?;
    let policy = fields.get(41 - 3)?.parse().ok()?;
    Some((policy, rt_priority))
}

/// "SCHED_FIFO 80", "SCHED_OTHER", ... for thread `tid` of this process.
pub fn thread_policy(tid: i32) -> Result<String, LoopBenchError> {
    let path = PathBuf::from(format!("/proc/self/task/{tid}/stat"));
    let text = std::fs::read_to_string(&path).map_err(|e| LoopBenchError::Proc {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let (policy, priority) = parse_policy(&text).ok_or_else(|| LoopBenchError::Proc {
        path,
        reason: "no policy / rt_priority fields".into(),
    })?;
    Ok(match policy as i32 {
        libc::SCHED_FIFO => format!("SCHED_FIFO {priority}"),
        libc::SCHED_RR => format!("SCHED_RR {priority}"),
        libc::SCHED_OTHER => "SCHED_OTHER".into(),
        libc::SCHED_BATCH => "SCHED_BATCH".into(),
        libc::SCHED_IDLE => "SCHED_IDLE".into(),
        other => format!("policy {other}"),
    })
}

/// Holds `/dev/cpu_dma_latency` at 0 us while alive, as cyclictest does by default, so
/// both sides of the comparison run with the same C-state limit. `None` when refused.
pub fn hold_zero_dma_latency() -> Option<std::fs::File> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .ok()?;
    f.write_all(&0i32.to_ne_bytes()).ok()?;
    Some(f)
}

fn settings_for(hz: u32, tag: &str) -> LoopSettings {
    let base = format!(
        "/dev/shm/vla-bench-loop-{}-{hz}hz-{tag}",
        std::process::id()
    );
    let period_ns = 1_000_000_000 / u64::from(hz.max(1));
    // Otherwise config/vlad.json's control section (the constructor's defaults).
    let mut s = LoopSettings::new(
        GEOMETRY,
        PathBuf::from(format!("{base}-obs")),
        PathBuf::from(format!("{base}-act")),
    );
    s.limits.period_ns = period_ns;
    s.limits.chunk_period_ns = period_ns;
    s
}

/// Sleeps `d` in short steps, failing as soon as a loop thread has ended.
fn watch_for(lp: &ControlLoop, d: Duration, hz: u32) -> Result<(), LoopBenchError> {
    let end = monotonic_ns() + d.as_nanos() as u64;
    loop {
        if lp.is_broken() {
            return Err(LoopBenchError::Broken { hz });
        }
        let now = monotonic_ns();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep(Duration::from_nanos((end - now).min(100_000_000)));
    }
}

/// Counters at one instant, for differences over the measured window.
#[derive(Clone, Copy)]
struct Snapshot {
    ticks: u64,
    publisher_allocations: u64,
    process_allocations: u64,
}

fn snapshot(health: &Health) -> Snapshot {
    Snapshot {
        ticks: Health::get(&health.ticks),
        publisher_allocations: counting::watched_allocations(),
        process_allocations: counting::allocations(),
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// Runs the loop at `hz` for warm-up plus `s.seconds` and returns its table row.
pub fn run_rate(hz: u32, s: &LoopBenchSettings) -> Result<Value, LoopBenchError> {
    let mut settings = settings_for(hz, "run");
    settings.publisher_priority = s.priority;
    let obs_path = settings.observation_path.clone();
    let ring_err = |e: &dyn std::fmt::Display| LoopBenchError::ObservationRing {
        path: obs_path.clone(),
        reason: e.to_string(),
    };
    let writer =
        RingWriter::<Observation>::create(&obs_path, GEOMETRY, 8).map_err(|e| ring_err(&e))?;
    let obs = Observation::for_geometry(&GEOMETRY).map_err(|e| ring_err(&e))?;
    let stop_camera = Arc::new(AtomicBool::new(false));
    let camera_period = 1_000_000_000 / u64::from(s.camera_hz.max(1));
    let camera_thread: JoinHandle<u64> = {
        let stop = stop_camera.clone();
        std::thread::Builder::new()
            .name("vla-bench-camera".into())
            .spawn(move || camera(writer, obs, camera_period, stop))
            .map_err(|source| LoopBenchError::Thread {
                what: "camera",
                source,
            })?
    };
    let result = measure(hz, s, settings.clone());
    stop_camera.store(true, Ordering::Release);
    let frames = camera_thread.join().unwrap_or(0);
    let _ = std::fs::remove_file(&settings.observation_path);
    let _ = std::fs::remove_file(&settings.action_path);
    let mut row = result?;
    row["camera_frames"] = json!(frames);
    Ok(row)
}

fn measure(
    hz: u32,
    s: &LoopBenchSettings,
    settings: LoopSettings,
) -> Result<Value, LoopBenchError> {
    let engine = SleepingEngine {
        latency: s.inference,
        action_dims: GEOMETRY.action_dims as usize,
    };
    let lp =
        ControlLoop::start(settings, Box::new(engine)).map_err(|e| LoopBenchError::Control {
            hz,
            reason: e.to_string(),
        })?;
    let outcome = measure_running(hz, s, &lp);
    counting::watch(0);
    let report = lp.stop();
    let (publisher_tid, policy, warm, end) = outcome?;
    Ok(row(hz, s, &report, publisher_tid, &policy, warm, end))
}

type Measured = (i32, String, Snapshot, Snapshot);

fn measure_running(
    hz: u32,
    s: &LoopBenchSettings,
    lp: &ControlLoop,
) -> Result<Measured, LoopBenchError> {
    // The thread exists once `start` returns, but names itself when it first runs.
    let mut found = Vec::new();
    for _ in 0..200 {
        found = threads_named(PUBLISHER_THREAD)?;
        if !found.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let [publisher_tid] = found[..] else {
        return Err(LoopBenchError::Publisher { hz, found });
    };
    counting::watch(publisher_tid);
    let warmup = Duration::from_secs_f64(s.warmup_seconds.max(0.0));
    watch_for(lp, warmup, hz)?;
    // Warm-up lasts until the first chunk has landed, so the copy and scheduling paths of
    // a landing have run once before counting starts.
    let patience = Duration::from_secs(10) + s.inference * 10;
    let give_up = monotonic_ns() + patience.as_nanos() as u64;
    while Health::get(&lp.health().published_ok) == 0 {
        if monotonic_ns() > give_up {
            return Err(LoopBenchError::NoChunk {
                hz,
                waited: warmup + patience,
            });
        }
        watch_for(lp, Duration::from_millis(10), hz)?;
    }
    // Read after warm-up: the publisher sets its policy when it starts.
    let policy = thread_policy(publisher_tid)?;
    let warm = snapshot(lp.health());
    watch_for(lp, Duration::from_secs_f64(s.seconds.max(0.0)), hz)?;
    let end = snapshot(lp.health());
    Ok((publisher_tid, policy, warm, end))
}

fn row(
    hz: u32,
    s: &LoopBenchSettings,
    report: &LoopReport,
    publisher_tid: i32,
    policy: &str,
    warm: Snapshot,
    end: Snapshot,
) -> Value {
    let ticks = end.ticks - warm.ticks;
    let per_tick = |n: u64| {
        if ticks == 0 {
            Value::Null
        } else {
            json!(n as f64 / ticks as f64)
        }
    };
    let publisher_allocations = end.publisher_allocations - warm.publisher_allocations;
    let process_allocations = end.process_allocations - warm.process_allocations;
    let j = &report.jitter;
    json!({
        "hz": hz,
        "source": "vla-control",
        "samples": j.count(),
        "p50_us": us(j.quantile_ns(0.5)),
        "p99_us": us(j.quantile_ns(0.99)),
        "max_us": us(j.max_ns()),
        "misses": report.missed_ticks,
        "allocations_per_tick": per_tick(publisher_allocations),
        "publisher_allocations": publisher_allocations,
        "ticks_after_warmup": ticks,
        "process_allocations_per_tick": per_tick(process_allocations),
        "process_allocations": process_allocations,
        "publisher_tid": publisher_tid,
        "publisher_sched": policy,
        "requested_priority": s.priority,
        "seconds": s.seconds,
        "warmup_seconds": s.warmup_seconds,
        "ticks": report.ticks,
        "published_ok": report.published_ok,
        "published_hold": report.published_hold,
        "published_fault": report.published_fault,
        "inferences": report.inferences,
        "inference_failures": report.inference_failures,
        "stale_observations": report.stale_observations,
        "skipped_steps": report.skipped_steps,
        "inference_p50_ms": report.inference.quantile_ns(0.5) as f64 / 1e6,
        "freshness_p50_ms": report.freshness.quantile_ns(0.5) as f64 / 1e6,
        "freshness_p99_ms": report.freshness.quantile_ns(0.99) as f64 / 1e6,
    })
}

/// The whole benchmark: memory locked and C-states limited as cyclictest `-m` does, then
/// each rate in turn.
pub fn run(s: &LoopBenchSettings) -> Result<Value, LoopBenchError> {
    let mlockall = vla_control::lock_memory();
    let dma_latency = hold_zero_dma_latency();
    let mut rows = Vec::new();
    for &hz in &s.rates_hz {
        rows.push(run_rate(hz, s)?);
    }
    Ok(json!({
        "seconds": s.seconds,
        "warmup_seconds": s.warmup_seconds,
        "inference_ms": s.inference.as_secs_f64() * 1e3,
        "camera_hz": s.camera_hz,
        "geometry": {"cameras": GEOMETRY.cameras, "height": GEOMETRY.height, "width": GEOMETRY.width,
                     "state_dims": GEOMETRY.state_dims, "action_dims": GEOMETRY.action_dims,
                     "chunk_len": GEOMETRY.chunk_len},
        "mlockall": mlockall,
        "cpu_dma_latency_zero": dma_latency.is_some(),
        "rows": rows,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_comes_from_the_fields_after_the_command_name() {
        // A command name with spaces and a parenthesis must not shift the fields.
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[40 - 3] = "80".into();
        fields[41 - 3] = "1".into();
        let stat = format!("1234 (vla pub) (x) {}", fields.join(" "));
        assert_eq!(parse_policy(&stat), Some((1, 80)));
        assert_eq!(parse_policy("1234 (short) S 1 2"), None);
        assert_eq!(parse_policy("no parenthesis"), None);
    }

    #[test]
    fn finds_a_thread_by_name_and_reads_its_policy() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("vla-bench-probe".into())
            .spawn(move || {
                tx.send(counting::current_tid()).unwrap();
                let _ = wait.recv();
            })
            .unwrap();
        let tid = rx.recv().unwrap();
        // Listing /proc/self/task can miss a live task while other tests' threads exit at
        // the same moment (CI saw []): look again, bounded, before calling it missing.
        let mut seen = Vec::new();
        for _ in 0..200 {
            seen = threads_named("vla-bench-probe").unwrap();
            if seen == [tid] {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(seen, vec![tid]);
        // A new thread inherits its creator's policy, which this test inherited from
        // whoever started it (`chrt -b`, a real-time CI runner): compare with that, never
        // with a policy assumed.
        let inherited = thread_policy(counting::current_tid()).unwrap();
        assert_eq!(thread_policy(tid).unwrap(), inherited);
        release.send(()).unwrap();
        t.join().unwrap();
        // pthread_join returns once the kernel clears the thread's tid word, which is
        // before the task leaves /proc/self/task: give the kernel a moment to reap it.
        let gone = (0..200).any(|_| {
            let empty = threads_named("vla-bench-probe").unwrap().is_empty();
            if !empty {
                std::thread::sleep(Duration::from_millis(10));
            }
            empty
        });
        assert!(gone, "the joined probe thread is still listed after 2 s");
    }

    /// The real loop for a short window: it publishes chunks traced to the observations,
    /// the publisher is found, and it allocates nothing per tick after warm-up.
    #[test]
    fn real_loop_publishes_and_its_publisher_does_not_allocate() {
        let _guard = counting::WATCH_LOCK
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let s = LoopBenchSettings {
            rates_hz: vec![50],
            seconds: 1.0,
            warmup_seconds: 0.3,
            inference: Duration::from_millis(20),
            camera_hz: 30,
            priority: 0,
        };
        let row = run_rate(50, &s).unwrap();
        assert_eq!(row["source"], "vla-control");
        assert!(row["ticks_after_warmup"].as_u64().unwrap() > 0, "{row}");
        assert!(row["published_ok"].as_u64().unwrap() > 0, "{row}");
        assert!(row["inferences"].as_u64().unwrap() > 0, "{row}");
        assert!(row["camera_frames"].as_u64().unwrap() > 0, "{row}");
        assert!(row["samples"].as_u64() >= row["ticks"].as_u64(), "{row}");
        assert_eq!(row["publisher_allocations"], 0, "{row}");
        assert_eq!(row["allocations_per_tick"], 0.0, "{row}");
        // Priority 0 asks for no SCHED_FIFO: the publisher keeps the policy it inherited.
        let inherited = thread_policy(counting::current_tid()).unwrap();
        assert_eq!(row["publisher_sched"], inherited.as_str(), "{row}");
        assert!(!Path::new(&format!(
            "/dev/shm/vla-bench-loop-{}-50hz-run-obs",
            std::process::id()
        ))
        .exists());
    }
}
