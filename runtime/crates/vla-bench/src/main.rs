//! `vla-bench`: benchmarks that print figures (nothing here asserts a timing).
//!
//! - `vla-bench host`: host work per inference at the seeds' full dimensions (original
//!   488-token, LP-VTP-SD 130-token, Fast-WAM) through the `vla-policy` glue, with the
//!   memcpy bandwidth of this run and the floor it implies; allocations per inference.
//! - `vla-bench ring`: write-to-visible latency of the action ring across two processes,
//!   next to a plain pipe.
//! - `vla-bench loop`: publish jitter, missed ticks and allocations per tick of the real
//!   control loop (`vla-control`) at several rates, over real rings in `/dev/shm`.
//!
//! `scripts/bench.sh` runs these next to the numpy / ONNX Runtime side and `vlad
//! bench-bundle`, and renders one table.

#![forbid(unsafe_code)]

mod host;
mod loop_jitter;
mod ring;
mod stats;

use lexopt::prelude::*;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use vla_alloc_count::allocations;

const USAGE: &str = "\
usage: vla-bench <command> [options]

commands:
  host [--iterations N] [--json FILE]    host glue per inference at full dims, memcpy floor
  ring [--messages N] [--gap-us US] [--json FILE]
                                         action ring vs pipe, write-to-visible across processes
  loop [--rates 10,20,50] [--seconds S] [--warmup-seconds S] [--inference-ms MS]
       [--camera-hz HZ] [--priority P] [--json FILE]
                                         the real control loop: publish jitter, missed ticks,
                                         allocations per tick (defaults: 60 s per rate after
                                         2 s warm-up, 100 ms inference, 30 Hz camera, FIFO 80)
";

enum Command {
    Host,
    Ring,
    Loop,
}

fn run() -> Result<(), String> {
    let mut args = std::env::args_os().skip(1);
    let command = args
        .next()
        .and_then(|c| c.into_string().ok())
        .unwrap_or_default();
    let rest: Vec<_> = args.collect();
    let command = match command.as_str() {
        "host" => Command::Host,
        "ring" => Command::Ring,
        "loop" => Command::Loop,
        "ring-reader" | "pipe-reader" => return reader(&command, rest),
        "-h" | "--help" => {
            print!("{USAGE}");
            return Ok(());
        }
        other => return Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    let (mut iterations, mut messages, mut gap_us) = (20usize, 20_000usize, 50u64);
    let mut json_out: Option<PathBuf> = None;
    let mut looping = loop_jitter::LoopBenchSettings::default();
    let mut p = lexopt::Parser::from_args(rest);
    let number = |p: &mut lexopt::Parser, what: &str| -> Result<u64, String> {
        let v = p.value().map_err(|e| e.to_string())?;
        v.to_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("{what}: `{}` is not a number", v.to_string_lossy()))
    };
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        match arg {
            Long("iterations") => iterations = number(&mut p, "--iterations")?.max(1) as usize,
            Long("messages") => messages = number(&mut p, "--messages")?.max(1) as usize,
            Long("gap-us") => gap_us = number(&mut p, "--gap-us")?,
            Long("rates") => looping.rates_hz = rates(&mut p)?,
            Long("seconds") => looping.seconds = seconds(&mut p, "--seconds")?,
            Long("warmup-seconds") => looping.warmup_seconds = seconds(&mut p, "--warmup-seconds")?,
            Long("inference-ms") => {
                looping.inference = Duration::from_millis(number(&mut p, "--inference-ms")?)
            }
            Long("camera-hz") => {
                looping.camera_hz = number(&mut p, "--camera-hz")?.clamp(1, 1000) as u32
            }
            Long("priority") => looping.priority = number(&mut p, "--priority")?.min(99) as u8,
            Long("json") => json_out = Some(p.value().map_err(|e| e.to_string())?.into()),
            other => return Err(other.unexpected().to_string()),
        }
    }
    let doc = match command {
        Command::Host => {
            let mut mem = host::Memcpy::new();
            mem.sample(5);
            let mut variants = vec![
                host::molmoact2(&host::ORIGINAL, iterations, &mut mem, &allocations),
                host::molmoact2(&host::LP_VTP_SD, iterations, &mut mem, &allocations),
                host::fastwam(&host::FASTWAM, iterations, &mut mem, &allocations),
                host::fastwam_chain(iterations, &mut mem, &allocations),
            ];
            mem.sample(5);
            host::add_floors(&mut variants, mem.best());
            json!({
                "memcpy_bytes_per_s": mem.best(),
                "memcpy_bytes_per_s_median": mem.median(),
                "memcpy_samples": mem.rates.len(),
                "memcpy_two_threads_bytes_per_s": mem.best_two_threads(),
                "variants": variants,
            })
        }
        Command::Ring => {
            let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
            let ring = ring::ring(&exe, messages, gap_us).map_err(|e| e.to_string())?;
            let pipe = ring::pipe(&exe, messages, gap_us).map_err(|e| e.to_string())?;
            json!({"messages": messages, "gap_us": gap_us, "ring": ring, "pipe": pipe})
        }
        Command::Loop => loop_jitter::run(&looping).map_err(|e| e.to_string())?,
    };
    let text = serde_json::to_string_pretty(&doc).expect("JSON of plain values");
    println!("{text}");
    if let Some(path) = json_out {
        std::fs::write(&path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// `--rates 10,20,50`: publish rates in Hz, each 1..=1000.
fn rates(p: &mut lexopt::Parser) -> Result<Vec<u32>, String> {
    let v = p.value().map_err(|e| e.to_string())?;
    let text = v.to_string_lossy();
    let parsed: Option<Vec<u32>> = text
        .split(',')
        .map(|r| {
            r.trim()
                .parse::<u32>()
                .ok()
                .filter(|hz| (1..=1000).contains(hz))
        })
        .collect();
    parsed.filter(|r| !r.is_empty()).ok_or_else(|| {
        format!("--rates: `{text}` is not a list of rates in Hz (1-1000), e.g. 10,20,50")
    })
}

/// A non-negative number of seconds, fractions allowed.
fn seconds(p: &mut lexopt::Parser, what: &str) -> Result<f64, String> {
    let v = p.value().map_err(|e| e.to_string())?;
    v.to_str()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 86_400.0)
        .ok_or_else(|| {
            format!(
                "{what}: `{}` is not a number of seconds (0-86400)",
                v.to_string_lossy()
            )
        })
}

/// The child side of `ring`: `ring-reader PATH N` or `pipe-reader N`.
fn reader(command: &str, rest: Vec<std::ffi::OsString>) -> Result<(), String> {
    let count = |s: Option<&std::ffi::OsString>| -> Result<usize, String> {
        s.and_then(|s| s.to_str()?.parse().ok())
            .ok_or_else(|| format!("{command}: message count missing or not a number"))
    };
    match command {
        "ring-reader" => {
            let path = rest.first().ok_or("ring-reader: path missing")?;
            ring::ring_reader(path.as_ref(), count(rest.get(1))?).map_err(|e| e.to_string())
        }
        _ => ring::pipe_reader(count(rest.first())?).map_err(|e| e.to_string()),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vla-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
