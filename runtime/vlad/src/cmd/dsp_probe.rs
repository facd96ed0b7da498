//! `vlad dsp-probe --bundle DIR`: the bring-up question of the DSP memory plan, answered
//! on the board. First every context of the bundle is created one by one on the default
//! device, as vlad did before the plan (one process, no placement): after each, the
//! process's RSS/PSS and the load time, and where loading fails, the context and QNN's
//! error. Then, in a fresh backend, the bundle as its memory plan places it (sessions on
//! their NSPs' devices). Each placement that loaded executes every context `--runs` times
//! (zero inputs), flagging a run far above the context's median (QNN unloading and
//! reloading graphs looks like that). One line of JSON per finding on stdout, for
//! scripts/bringup/report.py; QNN's own choice of process domain for each context is in
//! its verbose log (`--log-level debug`: "PD N chosen for context M").

use crate::cli;
use crate::memory::Memory;
use crate::{dsp_plan, qnn_setup, Failure};
use lexopt::prelude::*;
use serde_json::json;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Instant;
use vla_qnn::{create_contexts, Backend, Context, ContextBinary, MemoryPlan};

const HELP: &str = "\
vlad dsp-probe --bundle DIR [--config FILE] [--runs N] [--lib-dir DIR] [--log-level LVL]

Loads the bundle's contexts one by one into one process as before the memory plan, then as
the plan places them (the config's `npu` section, default auto), reporting per context the
load time, RSS and PSS, the first failure, and --runs executes (default 20) with any jump
that suggests graph switching. One JSON object per line.";

/// A run this many times the context's median (and at least 2 ms over it) is flagged.
const JUMP_FACTOR: f64 = 3.0;

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let mut bundle: Option<PathBuf> = None;
    let mut config: Option<PathBuf> = None;
    let mut runs: usize = 20;
    let mut p = cli::Parser::new(args, HELP);
    while let Some(arg) = p.next()? {
        match arg {
            Long("bundle") => bundle = Some(p.path()?),
            Long("config") => config = Some(p.path()?),
            Long("runs") => runs = p.number("--runs")?,
            other => return Err(cli::unexpected(other)),
        }
    }
    let Some(common) = p.finish() else {
        return Ok(());
    };
    let dir = bundle.ok_or_else(|| Failure::Usage("dsp-probe needs --bundle DIR".into()))?;
    common.init_logging();
    let npu = match &config {
        Some(path) => vla_config::Config::load(path)?.npu,
        None => vla_config::NpuConfig::default(),
    };
    let b = vla_policy::Bundle::open(&dir)?;
    let lib = qnn_setup::load_library(&common)?;
    let names = b.manifest.required_components();

    // One process, no placement: what vlad did before the plan.
    let outcome = {
        let backend = Backend::new(lib.clone())?;
        let nsps = platform(&backend);
        println!(
            "{}",
            json!({"probe": "platform", "nsps": nsps.0, "info": nsps.1})
        );
        let mut contexts = Vec::new();
        let mut failed = None;
        for (i, name) in names.iter().enumerate() {
            let path = b.path(&b.manifest.components[name].binary);
            let t = Instant::now();
            let made =
                ContextBinary::open(&lib, &path).and_then(|bin| Context::create(&backend, bin));
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let mem = Memory::read().unwrap_or_default();
            match made {
                Ok(c) => {
                    println!(
                        "{}",
                        json!({"probe": "load", "placement": "one-process", "index": i,
                               "context": name, "ok": true, "load_ms": ms,
                               "rss": mem.rss, "pss": mem.pss})
                    );
                    contexts.push((name.clone(), c));
                }
                Err(e) => {
                    println!(
                        "{}",
                        json!({"probe": "load", "placement": "one-process", "index": i,
                               "context": name, "ok": false, "load_ms": ms,
                               "rss": mem.rss, "pss": mem.pss, "error": e.to_string()})
                    );
                    failed = Some(name.clone());
                    break;
                }
            }
        }
        if failed.is_none() {
            execute_all("one-process", &contexts, runs)?;
        }
        failed
    };
    println!(
        "{}",
        json!({"probe": "outcome", "placement": "one-process", "all_loaded": outcome.is_none(),
               "failed_at": outcome})
    );

    // As the memory plan places it, in a fresh backend.
    let backend = Backend::new(lib.clone())?;
    let (nsps, _) = platform(&backend);
    let footprints = dsp_plan::bundle_footprints(&b, Some(&lib))?;
    let plan: MemoryPlan = dsp_plan::compute(&b.manifest.name, footprints, &npu, nsps)?;
    println!(
        "{}",
        json!({"probe": "plan", "summary": plan.summary(), "budget": plan.budget})
    );
    let placed = dsp_plan::place(&backend, &b, &plan).map_err(Failure::Error)?;
    let mut binaries = Vec::new();
    for name in &names {
        binaries.push(ContextBinary::open(
            &lib,
            b.path(&b.manifest.components[name].binary),
        )?);
    }
    let t = Instant::now();
    let made = create_contexts(&placed, binaries);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let mem = Memory::read().unwrap_or_default();
    match made {
        Ok(group) => {
            println!(
                "{}",
                json!({"probe": "load", "placement": "plan", "ok": true, "load_ms": ms,
                       "rss": mem.rss, "pss": mem.pss, "spill_fill": group.sharing.to_string()})
            );
            let contexts: Vec<(String, Context)> =
                names.iter().cloned().zip(group.contexts).collect();
            execute_all("plan", &contexts, runs)?;
            println!(
                "{}",
                json!({"probe": "outcome", "placement": "plan", "all_loaded": true,
                       "use": plan.summary()})
            );
        }
        Err((i, e)) => {
            println!(
                "{}",
                json!({"probe": "load", "placement": "plan", "ok": false, "load_ms": ms,
                       "rss": mem.rss, "pss": mem.pss, "context": names[i],
                       "error": e.to_string()})
            );
            println!(
                "{}",
                json!({"probe": "outcome", "placement": "plan", "all_loaded": false,
                       "failed_at": names[i]})
            );
        }
    }
    Ok(())
}

/// The NSPs the backend reports (1 when it reports none) and its one-line report.
fn platform(backend: &Backend) -> (u32, String) {
    match backend.platform_info() {
        Ok(Some(info)) if !info.devices.is_empty() => (info.devices.len() as u32, info.describe()),
        Ok(_) => (1, "no platform info".into()),
        Err(e) => (1, format!("platform info failed: {e}")),
    }
}

/// Executes each context's graph `runs` times on zero inputs; one line per context.
fn execute_all(
    placement: &str,
    contexts: &[(String, Context)],
    runs: usize,
) -> Result<(), Failure> {
    for (name, c) in contexts {
        let mut graph = c.graph(None)?;
        let mut io = graph.allocate_io();
        let mut ms = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            graph.execute_io(&mut io)?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mut sorted = ms.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
        // The first runs warm up; a jump after them is what graph switching looks like.
        let jumps: Vec<usize> = ms
            .iter()
            .enumerate()
            .skip(3)
            .filter(|(_, &x)| x > median * JUMP_FACTOR && x > median + 2.0)
            .map(|(i, _)| i)
            .collect();
        println!(
            "{}",
            json!({"probe": "execute", "placement": placement, "context": name,
                   "median_ms": median, "max_ms": sorted.last().copied().unwrap_or(0.0),
                   "runs_ms": ms, "jumps": jumps})
        );
    }
    Ok(())
}
