//! `vla-bench`: benchmarks that print figures (nothing here asserts a timing).
//!
//! - `vla-bench host`: host work per inference at the seeds' full dimensions (original
//!   488-token, LP-VTP-SD 130-token, Fast-WAM) through the `vla-policy` glue, with the
//!   memcpy bandwidth of this run and the floor it implies; allocations per inference.
//! - `vla-bench ring`: write-to-visible latency of the action ring across two processes,
//!   next to a plain pipe.
//!
//! `scripts/bench.sh` runs these next to the numpy / ONNX Runtime side and `vlad
//! bench-bundle`, and renders one table.

mod host;
mod ring;
mod stats;

use lexopt::prelude::*;
use serde_json::json;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts every heap allocation of the process, so a benchmark can report how many one
/// inference makes (the target is zero after warm-up).
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

const USAGE: &str = "\
usage: vla-bench <command> [options]

commands:
  host [--iterations N] [--json FILE]    host glue per inference at full dims, memcpy floor
  ring [--messages N] [--gap-us US] [--json FILE]
                                         action ring vs pipe, write-to-visible across processes
";

enum Command {
    Host,
    Ring,
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
        "ring-reader" | "pipe-reader" => return reader(&command, rest),
        "-h" | "--help" => {
            print!("{USAGE}");
            return Ok(());
        }
        other => return Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    let (mut iterations, mut messages, mut gap_us) = (20usize, 20_000usize, 50u64);
    let mut json_out: Option<PathBuf> = None;
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
            ];
            mem.sample(5);
            host::add_floors(&mut variants, mem.best());
            json!({
                "memcpy_bytes_per_s": mem.best(),
                "memcpy_bytes_per_s_median": mem.median(),
                "memcpy_samples": mem.rates.len(),
                "variants": variants,
            })
        }
        Command::Ring => {
            let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
            let ring = ring::ring(&exe, messages, gap_us).map_err(|e| e.to_string())?;
            let pipe = ring::pipe(&exe, messages, gap_us).map_err(|e| e.to_string())?;
            json!({"messages": messages, "gap_us": gap_us, "ring": ring, "pipe": pipe})
        }
    };
    let text = serde_json::to_string_pretty(&doc).expect("JSON of plain values");
    println!("{text}");
    if let Some(path) = json_out {
        std::fs::write(&path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
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
