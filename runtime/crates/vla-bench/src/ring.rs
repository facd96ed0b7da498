//! Write-to-visible latency across two processes: the action ring (seqlock in shared
//! memory, reader polling) next to a plain pipe (reader blocked in `read`), measured the
//! same way: the writer stamps CLOCK_MONOTONIC just before it writes, the reader takes
//! the difference the moment the message is visible to it.
//!
//! The writer is this process (pinned to CPU 0); the reader is a child running
//! `vla-bench ring-reader` / `pipe-reader` (pinned to CPU 1) that prints its summary as
//! one JSON line.

use crate::stats::summary;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use vla_ring::{monotonic_ns, Action, ActionReader, ActionStatus, ActionWriter, Geometry};

/// Marks the last message (chunk id for the ring, the stamp itself for the pipe).
const STOP: u64 = u64::MAX;

/// Action-ring geometry of a two-camera, 7-dim robot (the ring only moves actions here).
pub const GEOMETRY: Geometry = Geometry {
    cameras: 2,
    height: 224,
    width: 224,
    channels: 3,
    state_dims: 7,
    action_dims: 7,
    chunk_len: 10,
};

/// Errors of the ring benchmark, each naming what failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RingBenchError {
    Io {
        what: String,
        source: std::io::Error,
    },
    Ring {
        what: String,
        reason: String,
    },
    Child {
        what: String,
        reason: String,
    },
}

impl std::fmt::Display for RingBenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingBenchError::Io { what, source } => write!(f, "{what}: {source}"),
            RingBenchError::Ring { what, reason } => write!(f, "{what}: {reason}"),
            RingBenchError::Child { what, reason } => {
                write!(f, "reader process ({what}): {reason}")
            }
        }
    }
}

impl std::error::Error for RingBenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Named in the message: only its own causes come next.
            RingBenchError::Io { source, .. } => source.source(),
            _ => None,
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RingBenchError {
    let what = what.into();
    move |source| RingBenchError::Io { what, source }
}

/// Pins the calling thread to `cpu` when the machine has it (a hint; ignored otherwise),
/// and with `VLA_BENCH_FIFO=<priority>` (1..=99) in the environment makes it SCHED_FIFO,
/// with the runtime's own real-time set-up (`vla_control::rt`). Returns whether
/// SCHED_FIFO took effect.
pub fn pin(cpu: usize) -> bool {
    let _ = vla_control::pin_current_thread("ring benchmark", &[cpu]);
    let Some(priority) = std::env::var("VLA_BENCH_FIFO")
        .ok()
        .and_then(|v| v.parse::<u8>().ok())
        .filter(|&p| p > 0)
    else {
        return false;
    };
    vla_control::set_fifo_priority("ring benchmark", priority)
}

fn busy_wait_until(deadline_ns: u64) {
    while monotonic_ns() < deadline_ns {
        std::hint::spin_loop();
    }
}

fn latency_json(samples: &mut [f64], sent: usize, fifo: bool) -> Value {
    let received = samples.len();
    let (p50, p99, max) = summary(samples);
    json!({"sent": sent, "received": received, "p50_us": p50 / 1e3, "p99_us": p99 / 1e3,
           "max_us": max / 1e3, "reader_sched_fifo": fifo})
}

fn wait_ready(
    child: &mut Child,
    what: &str,
) -> Result<BufReader<std::process::ChildStdout>, RingBenchError> {
    let stdout = child.stdout.take().ok_or_else(|| RingBenchError::Child {
        what: what.into(),
        reason: "no stdout".into(),
    })?;
    let mut out = BufReader::new(stdout);
    let mut line = String::new();
    out.read_line(&mut line)
        .map_err(io(format!("{what} reader: ready line")))?;
    if line.trim() != "ready" {
        return Err(RingBenchError::Child {
            what: what.into(),
            reason: format!("expected `ready`, got `{}`", line.trim()),
        });
    }
    Ok(out)
}

fn finish(
    mut child: Child,
    mut out: BufReader<std::process::ChildStdout>,
    what: &str,
) -> Result<Value, RingBenchError> {
    let mut text = String::new();
    out.read_to_string(&mut text)
        .map_err(io(format!("{what} reader: result")))?;
    let status = child.wait().map_err(io(format!("{what} reader: wait")))?;
    if !status.success() {
        return Err(RingBenchError::Child {
            what: what.into(),
            reason: format!("exited with {status}"),
        });
    }
    serde_json::from_str(text.trim()).map_err(|e| RingBenchError::Child {
        what: what.into(),
        reason: format!("bad result `{}`: {e}", text.trim()),
    })
}

/// Writer side of the ring measurement: `messages` publishes `gap_us` apart.
pub fn ring(exe: &Path, messages: usize, gap_us: u64) -> Result<Value, RingBenchError> {
    let path = PathBuf::from(format!("/dev/shm/vla-bench-{}.ring", std::process::id()));
    let ring_err = |what: &str, e: &dyn std::fmt::Display| RingBenchError::Ring {
        what: format!("{what} {}", path.display()),
        reason: e.to_string(),
    };
    let mut writer =
        ActionWriter::create(&path, GEOMETRY, 64).map_err(|e| ring_err("create", &e))?;
    let mut child = Command::new(exe)
        .arg("ring-reader")
        .arg(&path)
        .arg(messages.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(io(format!("spawn {}", exe.display())))?;
    let out = wait_ready(&mut child, "ring")?;
    let _ = pin(0);
    let mut action = Action::for_geometry(&GEOMETRY);
    action.status = ActionStatus::Ok;
    let mut next = monotonic_ns();
    for i in 0..messages {
        next += gap_us * 1000;
        busy_wait_until(next);
        action.chunk_id = i as u64;
        action.made_time_ns = monotonic_ns();
        writer
            .publish(&action)
            .map_err(|e| ring_err("publish", &e))?;
    }
    busy_wait_until(monotonic_ns() + gap_us * 1000);
    action.chunk_id = STOP;
    writer
        .publish(&action)
        .map_err(|e| ring_err("publish", &e))?;
    let result = finish(child, out, "ring");
    let _ = std::fs::remove_file(&path);
    result
}

/// Reader side of the ring measurement (the child process).
pub fn ring_reader(path: &Path, messages: usize) -> Result<(), RingBenchError> {
    let fifo = pin(1);
    let reader = ActionReader::open(path, GEOMETRY).map_err(|e| RingBenchError::Ring {
        what: format!("open {}", path.display()),
        reason: e.to_string(),
    })?;
    let mut action = Action::for_geometry(&GEOMETRY);
    let mut samples = Vec::with_capacity(messages);
    println!("ready");
    std::io::stdout().flush().map_err(io("stdout"))?;
    let mut seen = reader.published();
    let mut last_change = monotonic_ns();
    let mut spins = 0u32;
    loop {
        let published = reader.published();
        if published == seen {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            // A writer that died never sends STOP: give up after 10 s of silence.
            if spins % 4096 == 0 && monotonic_ns() - last_change > 10_000_000_000 {
                return Err(RingBenchError::Ring {
                    what: format!("read {}", path.display()),
                    reason: "no publish for 10 s (writer gone?)".into(),
                });
            }
            continue;
        }
        seen = published;
        last_change = monotonic_ns();
        if reader.read_latest(&mut action).is_err() {
            continue;
        }
        let now = monotonic_ns();
        if action.chunk_id == STOP {
            break;
        }
        samples.push(now.saturating_sub(action.made_time_ns) as f64);
    }
    println!("{}", latency_json(&mut samples, messages, fifo));
    Ok(())
}

/// Writer side of the pipe measurement.
pub fn pipe(exe: &Path, messages: usize, gap_us: u64) -> Result<Value, RingBenchError> {
    let mut child = Command::new(exe)
        .arg("pipe-reader")
        .arg(messages.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(io(format!("spawn {}", exe.display())))?;
    let mut to_child = child.stdin.take().ok_or_else(|| RingBenchError::Child {
        what: "pipe".into(),
        reason: "no stdin".into(),
    })?;
    let out = wait_ready(&mut child, "pipe")?;
    let _ = pin(0);
    let mut next = monotonic_ns();
    for _ in 0..messages {
        next += gap_us * 1000;
        busy_wait_until(next);
        to_child
            .write_all(&monotonic_ns().to_ne_bytes())
            .map_err(io("pipe write"))?;
    }
    to_child
        .write_all(&STOP.to_ne_bytes())
        .map_err(io("pipe write"))?;
    drop(to_child);
    finish(child, out, "pipe")
}

/// Reader side of the pipe measurement: blocking 8-byte reads from stdin.
pub fn pipe_reader(messages: usize) -> Result<(), RingBenchError> {
    let fifo = pin(1);
    let mut samples = Vec::with_capacity(messages);
    println!("ready");
    std::io::stdout().flush().map_err(io("stdout"))?;
    let mut input = std::io::stdin().lock();
    let mut word = [0u8; 8];
    loop {
        input.read_exact(&mut word).map_err(io("pipe read"))?;
        let now = monotonic_ns();
        let stamp = u64::from_ne_bytes(word);
        if stamp == STOP {
            break;
        }
        samples.push(now.saturating_sub(stamp) as f64);
    }
    println!("{}", latency_json(&mut samples, messages, fifo));
    Ok(())
}
