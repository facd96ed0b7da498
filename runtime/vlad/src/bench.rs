//! `vlad bench-context <ctx.bin>`: how long one context takes to load and to run.
//!
//! Prints figures only; nothing here asserts a timing. Inputs come from `--inputs io.npz`
//! when given (realistic data paths), else zeros.

use crate::cli::{self, Common};
use crate::{qnn_setup, Failure};
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vla_control::quantile_sorted;
use vla_qnn::{Context, ContextBinary};

const HELP: &str = "usage: vlad bench-context <ctx.bin> [--inputs io.npz] [--graph NAME] [--warmup 3] [--iterations 50] [--performance burst|high_performance|balanced|power_saver|off] [--lib-dir DIR]";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Idle time before the benchmarks' vote is released (the config's default).
pub const IDLE_RELEASE: Duration =
    Duration::from_millis(vla_config::QnnConfig::DEFAULT_IDLE_RELEASE_MS as u64);

/// `burst (id 1: 51 votes, 0 releases, 0 refused)`, or why there were none.
pub fn vote_summary(
    mode: vla_qnn::PerformanceMode,
    votes: Option<&vla_qnn::PerfGovernor>,
) -> String {
    match votes {
        Some(g) => {
            let s = g.stats();
            format!(
                "{mode} (power config id {}: {} votes accepted, {} idle releases, {} refused)",
                g.power_config_id(),
                s.votes,
                s.releases,
                s.refused
            )
        }
        None if mode == vla_qnn::PerformanceMode::Off => "off (no vote)".into(),
        None => format!("{mode} refused by the backend (see the log): no vote"),
    }
}

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let mut common = Common::default();
    let mut ctx: Option<PathBuf> = None;
    let mut inputs: Option<PathBuf> = None;
    let mut graph_name: Option<String> = None;
    let (mut warmup, mut iterations) = (3usize, 50usize);
    let mut performance = vla_qnn::PerformanceMode::Burst;
    let mut p = cli::parser(args);
    while let Some(arg) = p.next().map_err(cli::usage)? {
        match arg {
            Long(name) if Common::OPTIONS.contains(&name) => {
                let name = name.to_owned();
                common.take(&name, &mut p)?;
            }
            Long("inputs") => inputs = Some(cli::value(&mut p)?.into()),
            Long("graph") => graph_name = Some(cli::string(&mut p)?),
            Long("warmup") => warmup = cli::number(&mut p, "--warmup")?,
            Long("iterations") => iterations = cli::number(&mut p, "--iterations")?,
            Long("performance") => {
                performance = qnn_setup::performance_mode(&cli::string(&mut p)?)?
            }
            Short('h') | Long("help") => {
                println!("{HELP}");
                return Ok(());
            }
            Value(v) if ctx.is_none() => ctx = Some(v.into()),
            other => return Err(cli::unexpected(other)),
        }
    }
    let ctx =
        ctx.ok_or_else(|| Failure::Usage("bench-context needs a context binary path".into()))?;
    if iterations == 0 {
        return Err(Failure::Usage("--iterations must be at least 1".into()));
    }
    common.init_logging();
    let npz = inputs.as_ref().map(vla_npz::Npz::open).transpose()?;

    let t0 = Instant::now();
    let (lib, backend) = qnn_setup::load_backend(&common)?;
    let t_lib = t0.elapsed();
    let votes = qnn_setup::start_votes(&backend, &[0], performance, IDLE_RELEASE);
    let t1 = Instant::now();
    let binary = ContextBinary::open(&lib, &ctx)?;
    let size = binary.size();
    let t_open = t1.elapsed();
    let t2 = Instant::now();
    let context = Context::create(&backend, binary)?;
    let mut graph = context.graph(graph_name.as_deref())?;
    let t_create = t2.elapsed();

    let mut io = graph.allocate_io();
    if let Some(npz) = &npz {
        vla_parity::fill_inputs(&graph, npz, &mut io)?;
    }
    let mut first = Vec::new();
    for _ in 0..warmup {
        let t = Instant::now();
        let _vote = votes.as_ref().map(|v| v.inference());
        graph.execute_io(&mut io)?;
        first.push(t.elapsed());
    }
    let mut steady = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        let _vote = votes.as_ref().map(|v| v.inference());
        graph.execute_io(&mut io)?;
        steady.push(t.elapsed());
    }
    steady.sort();
    println!("context {} ({} bytes)", ctx.display(), size);
    println!(
        "  performance vote               {}",
        vote_summary(performance, votes.as_ref())
    );
    println!("  load QNN libraries + backend   {:>9.2} ms", ms(t_lib));
    println!("  map binary + read metadata     {:>9.2} ms", ms(t_open));
    println!("  create context + graph         {:>9.2} ms", ms(t_create));
    let firsts: Vec<String> = first.iter().map(|d| format!("{:.2}", ms(*d))).collect();
    println!(
        "  first {} executes (ms)          {}",
        warmup,
        firsts.join(", ")
    );
    println!(
        "  steady over {iterations}: p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
        ms(quantile_sorted(&steady, 0.5).unwrap_or_default()),
        ms(quantile_sorted(&steady, 0.99).unwrap_or_default()),
        ms(*steady.last().expect("iterations >= 1"))
    );
    Ok(())
}
