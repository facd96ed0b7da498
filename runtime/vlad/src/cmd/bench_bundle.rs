//! `vlad bench-bundle --bundle DIR`: what a whole bundle costs on this machine.
//!
//! - Inference: end-to-end latency p50/p99 over `--iterations` after warm-up, the sum of
//!   pure `graphExecute` time, the host overhead (total minus execute) in microseconds
//!   and percent, and p50/p99 per component, all from the pipeline's own timings.
//! - Load: every context loaded in a fresh child process (so nothing else is resident),
//!   mapped, mapped under the daemon's mlockall, and read into anonymous memory: load
//!   time, the RSS/PSS it adds (`/proc/self/smaps_rollup`), VmLck and locked-resident
//!   after, and how many binaries are still mapped, next to the total size of the binaries.
//!
//! Prints figures only; nothing here asserts a timing.

use crate::cli::{self, Common};
use crate::memory::{self, Memory};
use crate::{qnn_setup, Failure};
use lexopt::prelude::*;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use vla_control::quantile;
use vla_policy::{Bundle, ObservationFile, Policy};
use vla_qnn::ContextBinary;

const HELP: &str = "\
usage: vlad bench-bundle --bundle DIR [--iterations 50] [--warmup 3] [--json FILE]
                         [--performance burst|high_performance|balanced|power_saver|off] [--lib-dir DIR]
                         [--shared-buffers [--rpcmem LIB]]
--shared-buffers moves the policy onto HTP shared buffers (rpcmem from libcdsprpc.so, or
LIB) before timing, as the daemon does under npu.shared_buffers: on.
The HTP performance vote of the run (default burst, the daemon's default); latency
p50/p99, execute sum, host overhead (us and %) and per-component times over the
bundle's golden observation; load time and RSS/PSS of every context, mapped and read into
memory, each in a fresh process.";

/// How the context binaries are brought into memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    Mmap,
    /// Mapped, in a process under the daemon's `mlockall` (MCL_ONFAULT).
    MmapLocked,
    Heap,
}

impl LoadMode {
    fn name(self) -> &'static str {
        match self {
            LoadMode::Mmap => "mmap",
            LoadMode::MmapLocked => "mmap+mlockall",
            LoadMode::Heap => "heap",
        }
    }

    fn parse(s: &str) -> Result<Self, Failure> {
        match s {
            "mmap" => Ok(LoadMode::Mmap),
            "mmap+mlockall" => Ok(LoadMode::MmapLocked),
            "heap" => Ok(LoadMode::Heap),
            other => Err(Failure::Usage(format!(
                "--load-probe: `{other}` is not mmap, mmap+mlockall or heap"
            ))),
        }
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

struct Options {
    common: Common,
    dir: PathBuf,
    iterations: usize,
    warmup: usize,
    json: Option<PathBuf>,
    probe: Option<LoadMode>,
    performance: vla_qnn::PerformanceMode,
    /// `--shared-buffers`, with `--rpcmem LIB` when given.
    shared: Option<Option<PathBuf>>,
}

fn parse(args: Vec<OsString>) -> Result<Option<Options>, Failure> {
    let (mut dir, mut json, mut probe) = (None, None, None);
    let (mut iterations, mut warmup) = (50usize, 3usize);
    let mut performance = vla_qnn::PerformanceMode::Burst;
    let (mut shared, mut rpcmem) = (false, None);
    let mut p = cli::Parser::new(args, HELP);
    while let Some(arg) = p.next()? {
        match arg {
            Long("bundle") => dir = Some(p.path()?),
            Long("iterations") => iterations = p.number("--iterations")?,
            Long("warmup") => warmup = p.number("--warmup")?,
            Long("json") => json = Some(p.path()?),
            Long("shared-buffers") => shared = true,
            Long("rpcmem") => rpcmem = Some(p.path()?),
            Long("load-probe") => probe = Some(LoadMode::parse(&p.string()?)?),
            Long("performance") => performance = qnn_setup::performance_mode(&p.string()?)?,
            other => return Err(cli::unexpected(other)),
        }
    }
    let Some(common) = p.finish() else {
        return Ok(None);
    };
    let dir = dir.ok_or_else(|| Failure::Usage("bench-bundle needs --bundle DIR".into()))?;
    if iterations == 0 {
        return Err(Failure::Usage("--iterations must be at least 1".into()));
    }
    Ok(Some(Options {
        common,
        dir,
        iterations,
        warmup,
        json,
        probe,
        performance,
        shared: shared.then_some(rpcmem),
    }))
}

/// The subcommand `vlad bench-bundle`.
pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let Some(o) = parse(args)? else {
        return Ok(());
    };
    o.common.init_logging();
    let bundle = Bundle::open(&o.dir)?;
    if let Some(mode) = o.probe {
        let probe = load_probe(&o.common, &bundle, mode)?;
        println!("{probe}");
        return Ok(());
    }
    // Before the load probes: without rpcmem the run stops at once.
    let rpc = match &o.shared {
        None => None,
        Some(Some(path)) => Some(vla_qnn::RpcMem::load(path)?),
        Some(None) => Some(vla_qnn::RpcMem::load_default()?),
    };
    let mut load = serde_json::Map::new();
    for mode in [LoadMode::Mmap, LoadMode::MmapLocked, LoadMode::Heap] {
        load.insert(mode.name().into(), spawn_probe(&o, mode)?);
    }
    let report = bench(&o, &bundle, Value::Object(load), rpc.as_ref())?;
    print!("{}", render(&report));
    if let Some(path) = &o.json {
        let text = serde_json::to_string_pretty(&report).expect("JSON of plain values");
        std::fs::write(path, text + "\n")
            .map_err(|e| Failure::Error(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}

/// Total bytes of the bundle's context binaries.
fn binaries_bytes(bundle: &Bundle) -> Result<u64, Failure> {
    let mut total = 0;
    for name in bundle.manifest.required_components() {
        let path = bundle.path(&bundle.manifest.components[&name].binary);
        total += std::fs::metadata(&path)
            .map_err(|e| Failure::Error(format!("{}: {e}", path.display())))?
            .len();
    }
    Ok(total)
}

/// Loads every context with `mode` and reports time and memory (run in a fresh child).
fn load_probe(common: &Common, bundle: &Bundle, mode: LoadMode) -> Result<Value, Failure> {
    let locked = mode == LoadMode::MmapLocked && vla_control::lock_memory_on_fault();
    let (lib, backend) = qnn_setup::load_backend(common)?;
    let before = Memory::read()?;
    let t = Instant::now();
    let (mut binaries, mut paths) = (Vec::new(), Vec::new());
    let names = bundle.manifest.required_components();
    for name in &names {
        let path = bundle.path(&bundle.manifest.components[name].binary);
        binaries.push(match mode {
            LoadMode::Mmap | LoadMode::MmapLocked => ContextBinary::open(&lib, &path)?,
            LoadMode::Heap => ContextBinary::read(&lib, &path)?,
        });
        paths.push(path);
    }
    // As the pipelines load them: together, one spill-fill group if the binaries need one.
    let group = vla_qnn::create_contexts(&backend, binaries).map_err(|(_, e)| e)?;
    let mut resident = Vec::new();
    for (name, context) in names.iter().zip(group.contexts) {
        let graph = context.graph(bundle.manifest.components[name].graph.as_deref())?;
        resident.push((context, graph));
    }
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let after = Memory::read()?;
    let delta = |a: u64, b: u64| a as i64 - b as i64;
    Ok(json!({
        "mode": mode.name(),
        "mlockall": locked,
        "contexts": resident.len(),
        "spill_fill": group.sharing.to_string(),
        "binaries_still_mapped": memory::mapped_count(&paths),
        "locked_after": after.locked,
        "locked_resident_after": after.locked_resident,
        "load_ms": load_ms,
        "rss_before": before.rss, "pss_before": before.pss,
        "rss_after": after.rss, "pss_after": after.pss,
        "rss_delta": delta(after.rss, before.rss),
        "pss_delta": delta(after.pss, before.pss),
        "anon_delta": delta(after.pss_anon, before.pss_anon),
        "file_delta": delta(after.pss_file, before.pss_file),
    }))
}

fn spawn_probe(o: &Options, mode: LoadMode) -> Result<Value, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Error(format!("cannot find this executable: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.arg("bench-bundle")
        .arg("--bundle")
        .arg(&o.dir)
        .args(["--load-probe", mode.name()]);
    if let Some(d) = &o.common.lib_dir {
        cmd.arg("--lib-dir").arg(d);
    }
    let out = cmd
        .output()
        .map_err(|e| Failure::Error(format!("load probe ({}): {e}", mode.name())))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The emulator prints its own lines on stdout; the probe's report is the JSON one.
    let line = stdout.lines().rev().find(|l| l.starts_with('{'));
    match (out.status.success(), line) {
        (true, Some(l)) => serde_json::from_str(l)
            .map_err(|e| Failure::Error(format!("load probe ({}): bad report: {e}", mode.name()))),
        _ => Err(Failure::Error(format!(
            "load probe ({}) failed ({}): {}",
            mode.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

fn bench(
    o: &Options,
    bundle: &Bundle,
    load: Value,
    rpc: Option<&std::sync::Arc<vla_qnn::RpcMem>>,
) -> Result<Value, Failure> {
    let (_, backend) = qnn_setup::load_backend(&o.common)?;
    let votes = qnn_setup::start_votes(
        &backend,
        &[0],
        o.performance,
        crate::cmd::bench_context::IDLE_RELEASE,
    );
    let t = Instant::now();
    let mut policy = Policy::load(bundle, &backend)?;
    if let Some(rpc) = rpc {
        policy.use_shared_buffers(rpc)?;
    }
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let memory = Memory::read()?;
    let obs = ObservationFile::load(&bundle.path(&bundle.manifest.end_to_end))?;
    let g = policy.geometry();
    let mut actions = vec![0f32; g.chunk_len * g.action_dims];
    for _ in 0..o.warmup {
        let _vote = votes.as_ref().map(|v| v.inference());
        policy.infer(&obs.observation(), &mut actions)?;
    }
    let names: Vec<String> = policy
        .timings()
        .components
        .iter()
        .map(|c| c.0.clone())
        .collect();
    let client_bytes = |p: &mut Policy| -> u64 {
        p.graphs_mut()
            .iter()
            .map(|g| g.graph.client_buffer_bytes())
            .sum()
    };
    let client_bytes_before = client_bytes(&mut policy);
    let host_bytes_before = policy.host_copy_bytes();
    let mut per_component = vec![Vec::with_capacity(o.iterations); names.len()];
    let (mut totals, mut executes, mut hosts) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.iterations {
        let vote = votes.as_ref().map(|v| v.inference());
        policy.infer(&obs.observation(), &mut actions)?;
        drop(vote);
        let t = policy.timings();
        let execute: Duration = t.components.iter().map(|c| c.1).sum();
        for (samples, c) in per_component.iter_mut().zip(&t.components) {
            samples.push(us(c.1));
        }
        totals.push(us(t.total));
        executes.push(us(execute));
        hosts.push(us(t.host()));
    }
    let client_bytes_per_inference =
        (client_bytes(&mut policy) - client_bytes_before) / o.iterations as u64;
    let host_bytes_per_inference =
        (policy.host_copy_bytes() - host_bytes_before) / o.iterations as u64;
    // Client buffers are touched (made resident) by the first inference, an arena at the
    // move: compare the modes here.
    let memory_after = Memory::read()?;
    let mut host_share: Vec<f64> = hosts
        .iter()
        .zip(&executes)
        .map(|(h, e)| 100.0 * h / e.max(1e-9))
        .collect();
    let components: Vec<Value> = names
        .iter()
        .zip(per_component.iter_mut())
        .map(|(n, s)| {
            let (p50, p99) = (quantile(s, 0.5), quantile(s, 0.99));
            // Per-iteration samples (sorted) for the bring-up report's histograms.
            json!({"component": n, "p50_us": p50, "p99_us": p99, "samples_us": s})
        })
        .collect();
    let policy_name = bundle.manifest.policy.kind().name();
    let vote_stats = votes.as_ref().map(|g| g.stats());
    Ok(json!({
        "performance": o.performance.as_str(),
        "performance_vote": crate::cmd::bench_context::vote_summary(o.performance, votes.as_ref()),
        "performance_votes_accepted": vote_stats.map(|s| s.votes),
        "performance_votes_refused": vote_stats.map(|s| s.refused),
        "bundle": bundle.dir.file_name().map(|n| n.to_string_lossy().into_owned()),
        "name": bundle.manifest.name,
        "policy": policy_name,
        "iterations": o.iterations,
        "warmup": o.warmup,
        "total_p50_us": quantile(&mut totals, 0.5),
        "total_p99_us": quantile(&mut totals, 0.99),
        "execute_p50_us": quantile(&mut executes, 0.5),
        "execute_p99_us": quantile(&mut executes, 0.99),
        "host_overhead_p50_us": quantile(&mut hosts, 0.5),
        "host_overhead_p99_us": quantile(&mut hosts, 0.99),
        "host_overhead_pct": quantile(&mut host_share, 0.5),
        "total_samples_us": totals,
        "execute_samples_us": executes,
        "host_overhead_samples_us": hosts,
        "components": components,
        "policy_load_ms": load_ms,
        "npu_io": if policy.on_shared_buffers() { "shared" } else { "client" },
        "npu_client_buffer_bytes_per_inference": client_bytes_per_inference,
        "host_copy_bytes_per_inference": host_bytes_per_inference,
        "rss_after_policy_load": memory.rss,
        "pss_after_policy_load": memory.pss,
        "rss_after_inferences": memory_after.rss,
        "pss_after_inferences": memory_after.pss,
        "binaries_bytes": binaries_bytes(bundle)?,
        "load": load,
    }))
}

fn render(r: &Value) -> String {
    let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    let mut s = format!(
        "bundle {} ({}), {} iterations after {} warm-up\n",
        r["bundle"].as_str().unwrap_or("?"),
        r["policy"].as_str().unwrap_or("?"),
        r["iterations"],
        r["warmup"]
    );
    s += &format!(
        "  performance     {}\n",
        r["performance_vote"].as_str().unwrap_or("?")
    );
    s += &format!(
        "  end to end      p50 {:>10.1} us  p99 {:>10.1} us\n",
        f("total_p50_us"),
        f("total_p99_us")
    );
    s += &format!(
        "  execute sum     p50 {:>10.1} us  p99 {:>10.1} us\n",
        f("execute_p50_us"),
        f("execute_p99_us")
    );
    s += &format!(
        "  host overhead   p50 {:>10.1} us  p99 {:>10.1} us  ({:.3}% of execute)\n",
        f("host_overhead_p50_us"),
        f("host_overhead_p99_us"),
        f("host_overhead_pct")
    );
    for c in r["components"].as_array().into_iter().flatten() {
        s += &format!(
            "  {:<15} p50 {:>10.1} us  p99 {:>10.1} us\n",
            c["component"].as_str().unwrap_or("?"),
            c["p50_us"].as_f64().unwrap_or(f64::NAN),
            c["p99_us"].as_f64().unwrap_or(f64::NAN)
        );
    }
    let mib = |v: &Value| v.as_f64().unwrap_or(f64::NAN) / 1048576.0;
    s += &format!(
        "  NPU I/O in client buffers per inference {} bytes ({:.1} MiB; QNN copies them to and from DSP-visible memory)\n",
        r["npu_client_buffer_bytes_per_inference"],
        mib(&r["npu_client_buffer_bytes_per_inference"])
    );
    s += &format!(
        "  host copies per inference {} bytes ({:.3} MiB; buffer to buffer in the host glue; NPU I/O in {} buffers)\n",
        r["host_copy_bytes_per_inference"],
        mib(&r["host_copy_bytes_per_inference"]),
        r["npu_io"].as_str().unwrap_or("?")
    );
    s += &format!(
        "  binaries {:.2} MiB; RSS after policy load {:.1} MiB, PSS {:.1} MiB; after the inferences RSS {:.1} MiB, PSS {:.1} MiB\n",
        mib(&r["binaries_bytes"]),
        mib(&r["rss_after_policy_load"]),
        mib(&r["pss_after_policy_load"]),
        mib(&r["rss_after_inferences"]),
        mib(&r["pss_after_inferences"])
    );
    for (mode, l) in r["load"].as_object().into_iter().flatten() {
        s += &format!(
            "  load ({mode:<13}) {:>8.1} ms  RSS +{:.2} MiB  PSS +{:.2} MiB (anon +{:.2}, file +{:.2})  after: RSS {:.1} MiB, PSS {:.1} MiB, VmLck {:.1} MiB (resident {:.1}); binaries still mapped {}\n",
            l["load_ms"].as_f64().unwrap_or(f64::NAN),
            mib(&l["rss_delta"]),
            mib(&l["pss_delta"]),
            mib(&l["anon_delta"]),
            mib(&l["file_delta"]),
            mib(&l["rss_after"]),
            mib(&l["pss_after"]),
            mib(&l["locked_after"]),
            mib(&l["locked_resident_after"]),
            l["binaries_still_mapped"]
        );
    }
    if let Some(sharing) = r["load"]["mmap"]["spill_fill"].as_str() {
        s += &format!("  spill-fill      {sharing}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use vla_qnn::Context;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.5), 100.0);
        assert_eq!(quantile(&mut v, 0.99), 198.0);
        assert_eq!(quantile(&mut [], 0.5), 0.0);
    }

    #[test]
    fn load_modes_parse_and_name_themselves() {
        assert_eq!(LoadMode::parse("mmap").ok(), Some(LoadMode::Mmap));
        assert_eq!(
            LoadMode::parse("heap").map(LoadMode::name).ok(),
            Some("heap")
        );
        assert!(matches!(LoadMode::parse("disk"), Err(Failure::Usage(_))));
    }

    #[test]
    fn heap_read_and_mapping_see_the_same_binary() {
        let Some(dir) = vla_test_support::qnn_lib_dir() else {
            return;
        };
        let common = Common {
            lib_dir: Some(dir),
            log_level: None,
        };
        let bin = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../golden/bundles/fastwam/ctx/action_step_socid77_archv73.bin");
        let (lib, backend) = qnn_setup::load_backend(&common).expect("QNN backend");
        let mapped = ContextBinary::open(&lib, &bin).expect("map");
        let read = ContextBinary::read(&lib, &bin).expect("read");
        assert_eq!(mapped.bytes(), read.bytes());
        assert_eq!(
            mapped.info().graphs.len(),
            read.info().graphs.len(),
            "same metadata"
        );
        let context = Context::create(&backend, read).expect("context from heap copy");
        let mut graph = context.graph(None).expect("graph");
        let mut io = graph.allocate_io();
        graph.execute_io(&mut io).expect("execute from heap copy");
        assert!(ContextBinary::read(&lib, bin.with_extension("missing")).is_err());
    }
}
