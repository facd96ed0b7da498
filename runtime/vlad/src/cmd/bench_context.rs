//! `vlad bench-context <ctx.bin>`: how long one context takes to load and to run.
//!
//! Prints figures only; nothing here asserts a timing. Inputs come from `--inputs io.npz`
//! when given (realistic data paths), else zeros.

use crate::cli;
use crate::{qnn_setup, Failure};
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vla_control::quantile_sorted;
use vla_qnn::{Context, ContextBinary};

const HELP: &str = "usage: vlad bench-context <ctx.bin> [--inputs io.npz] [--graph NAME] [--warmup 3] [--iterations 50] [--performance burst|high_performance|balanced|power_saver|off] [--shared-buffers [--rpcmem LIB]] [--lib-dir DIR]

--shared-buffers runs the graph on an HTP shared buffer (rpcmem from libcdsprpc.so, or
LIB, registered with the context) instead of client buffers, after one client-buffer
execute whose outputs it must reproduce bit for bit; run it with and without to compare.";

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
    let mut ctx: Option<PathBuf> = None;
    let mut inputs: Option<PathBuf> = None;
    let mut graph_name: Option<String> = None;
    let (mut warmup, mut iterations) = (3usize, 50usize);
    let mut performance = vla_qnn::PerformanceMode::Burst;
    let (mut shared, mut rpcmem_lib) = (false, None::<PathBuf>);
    let mut p = cli::Parser::new(args, HELP);
    while let Some(arg) = p.next()? {
        match arg {
            Long("inputs") => inputs = Some(p.path()?),
            Long("graph") => graph_name = Some(p.string()?),
            Long("warmup") => warmup = p.number("--warmup")?,
            Long("iterations") => iterations = p.number("--iterations")?,
            Long("performance") => performance = qnn_setup::performance_mode(&p.string()?)?,
            Long("shared-buffers") => shared = true,
            Long("rpcmem") => rpcmem_lib = Some(p.path()?),
            Value(v) if ctx.is_none() => ctx = Some(v.into()),
            other => return Err(cli::unexpected(other)),
        }
    }
    let Some(common) = p.finish() else {
        return Ok(());
    };
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
    let mut on_shared = if shared {
        Some(SharedRun::start(
            &mut graph,
            &mut io,
            rpcmem_lib.as_deref(),
        )?)
    } else {
        None
    };
    let mut execute = |graph: &mut vla_qnn::Graph| match on_shared.as_mut() {
        Some(s) => graph.execute_shared(&mut s.buffer),
        None => graph.execute_io(&mut io),
    };
    let mut first = Vec::new();
    for _ in 0..warmup {
        let t = Instant::now();
        let _vote = votes.as_ref().map(|v| v.inference());
        execute(&mut graph)?;
        first.push(t.elapsed());
    }
    let mut steady = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        let _vote = votes.as_ref().map(|v| v.inference());
        execute(&mut graph)?;
        steady.push(t.elapsed());
    }
    steady.sort();
    println!("context {} ({} bytes)", ctx.display(), size);
    match &on_shared {
        Some(s) => println!(
            "  I/O                            HTP shared buffer, {} bytes (rpcmem from {}); outputs bit-identical to client buffers: {}",
            s.buffer.len(),
            s.origin,
            if s.identical(&graph) { "yes" } else { "NO" }
        ),
        None => println!("  I/O                            client buffers"),
    }
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

/// A graph moved onto an HTP shared buffer, with the client-buffer outputs it must match.
struct SharedRun {
    buffer: vla_qnn::SharedBuffer,
    origin: String,
    reference: Vec<Vec<u8>>,
}

impl SharedRun {
    /// One client-buffer execute for the reference outputs, then the inputs copied into a
    /// shared buffer registered with the graph's context.
    fn start(
        graph: &mut vla_qnn::Graph,
        io: &mut vla_qnn::IoBuffers,
        lib: Option<&std::path::Path>,
    ) -> Result<Self, Failure> {
        graph.execute_io(io)?;
        let reference = io.outputs.iter().map(|b| b.as_bytes().to_vec()).collect();
        let rpc = match lib {
            Some(path) => vla_qnn::RpcMem::load(path)?,
            None => vla_qnn::RpcMem::load_default()?,
        };
        let layout = graph.shared_layout(0);
        let mut buffer = vla_qnn::SharedBuffer::allocate(&rpc, layout.end)?;
        for (input, &offset) in io.inputs.iter().zip(&layout.inputs) {
            let bytes = input.as_bytes();
            buffer
                .bytes_mut(offset..offset + bytes.len())
                .expect("the layout fits the buffer")
                .copy_from_slice(bytes);
        }
        graph.bind_shared(&buffer, &layout)?;
        Ok(Self {
            buffer,
            origin: rpc.origin().display().to_string(),
            reference,
        })
    }

    /// Whether the last shared execute wrote the reference outputs, bit for bit.
    fn identical(&self, graph: &vla_qnn::Graph) -> bool {
        self.reference.iter().enumerate().all(|(i, want)| {
            graph
                .shared_output(i)
                .and_then(|r| self.buffer.bytes(r))
                .is_some_and(|got| got == want.as_slice())
        })
    }
}
