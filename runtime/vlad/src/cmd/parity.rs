//! `vlad parity <ctx.bin> <io.npz>`: run one context on golden inputs and gate its outputs.
//! `vlad parity --bundle DIR`: every context of a bundle against its golden, and the
//! end-to-end golden.

use crate::cli::{self, Common};
use crate::{qnn_setup, Failure};
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use vla_npz::Npz;
use vla_parity::{check_context, ContextParity, GateOptions};
use vla_policy::{Bundle, BundleParity};
use vla_qnn::{Context, ContextBinary};

const HELP: &str = "usage: vlad parity <ctx.bin> <io.npz> [--graph NAME] [--min-cosine 0.9999] [--atol 1e-3] [--rtol 1e-2] [--lib-dir DIR]
       vlad parity --bundle DIR [--json FILE] [--lib-dir DIR]
Exit status: 0 all outputs pass, 3 an output is below the gate, 1 error, 2 usage.";

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let mut positional: Vec<PathBuf> = Vec::new();
    let mut graph_name: Option<String> = None;
    let mut gate = GateOptions::default();
    let mut bundle: Option<PathBuf> = None;
    let mut json: Option<PathBuf> = None;
    let mut p = cli::Parser::new(args, HELP);
    while let Some(arg) = p.next()? {
        match arg {
            Long("bundle") => bundle = Some(p.path()?),
            Long("json") => json = Some(p.path()?),
            Long("graph") => graph_name = Some(p.string()?),
            Long("min-cosine") => gate.min_cosine = p.number("--min-cosine")?,
            Long("atol") => gate.atol = p.number("--atol")?,
            Long("rtol") => gate.rtol = p.number("--rtol")?,
            Value(v) if positional.len() < 2 => positional.push(v.into()),
            other => return Err(cli::unexpected(other)),
        }
    }
    let Some(common) = p.finish() else {
        return Ok(());
    };
    if let Some(dir) = bundle {
        if !positional.is_empty() {
            return Err(Failure::Usage(
                "parity takes either --bundle DIR or <ctx.bin> <io.npz>".into(),
            ));
        }
        common.init_logging();
        return parity_bundle(&common, &dir, json.as_deref());
    }
    let [ctx, npz_path] = <[PathBuf; 2]>::try_from(positional)
        .map_err(|_| Failure::Usage("parity needs <ctx.bin> <io.npz>".into()))?;
    common.init_logging();
    // Open the golden first: a bad npz should not cost a context load.
    let npz = Npz::open(&npz_path)?;
    let (lib, backend) = qnn_setup::load_backend(&common)?;
    let binary = ContextBinary::open(&lib, &ctx)?;
    let mut graph = Context::create(&backend, binary)?.graph(graph_name.as_deref())?;
    let report = check_context(&mut graph, &npz, &gate)?;
    print!("{}", render(&report, &gate));
    if report.passed() {
        Ok(())
    } else {
        Err(Failure::Gate(format!(
            "{}: lowest cosine {:.8} < {}",
            report.label,
            report.min_cosine(),
            gate.min_cosine
        )))
    }
}

pub fn render(r: &ContextParity, gate: &GateOptions) -> String {
    let mut s = format!(
        "context {} (execute {:.2} ms), gate cosine >= {}\n",
        r.label,
        r.execute_time.as_secs_f64() * 1e3,
        gate.min_cosine
    );
    s += &format!(
        "  {:<20} {:<18} {:>12} {:>12} {:>10}  verdict\n",
        "output", "shape", "cosine", "max_abs", "within_tol"
    );
    for o in &r.outputs {
        let c = &o.comparison;
        s += &format!(
            "  {:<20} {:<18} {:>12.8} {:>12.3e} {:>10.4}  {}\n",
            o.name,
            format!("{:?}", o.shape).replace(' ', ""),
            c.cosine,
            c.max_abs_diff,
            c.within_tolerance,
            if o.passed {
                "PASS"
            } else if c.non_finite > 0 {
                "FAIL (non-finite)"
            } else {
                "FAIL"
            }
        );
    }
    s
}

fn parity_bundle(common: &Common, dir: &Path, json: Option<&Path>) -> Result<(), Failure> {
    let super::Opened {
        bundle,
        mut policy,
        load_ms,
    } = super::load(common, dir)?;
    let report = bundle.parity(&mut policy)?;
    print!("{}", render_parity(&bundle, &report, load_ms));
    if let Some(path) = json {
        let doc = parity_json(&bundle, &report, load_ms);
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&doc).expect("JSON of plain values"),
        )
        .map_err(|e| Failure::Error(format!("cannot write {}: {e}", path.display())))?;
    }
    match report.failure_summary() {
        None => Ok(()),
        Some(why) => Err(Failure::Gate(format!(
            "bundle {}: {why}",
            bundle.dir.display()
        ))),
    }
}

/// The parity report as JSON (for the board bring-up report and fleet tooling).
pub fn parity_json(bundle: &Bundle, r: &BundleParity, load_ms: f64) -> serde_json::Value {
    use serde_json::json;
    let finite = |x: f64| if x.is_finite() { json!(x) } else { json!(null) };
    let contexts: Vec<_> = r
        .contexts
        .iter()
        .map(|c| {
            json!({
                "component": c.label,
                "execute_ms": c.execute_time.as_secs_f64() * 1e3,
                "passed": c.passed(),
                "outputs": c.outputs.iter().map(|o| {
                    let t = bundle.manifest.parity.threshold(&c.label, &o.name);
                    json!({
                        "name": o.name,
                        "shape": o.shape,
                        "cosine": finite(o.comparison.cosine),
                        "max_abs_diff": finite(o.comparison.max_abs_diff),
                        "within_tolerance": o.comparison.within_tolerance,
                        "gate": o.min_cosine,
                        "gate_from": t.entry.as_ref().map_or("parity.context_cosine", |(k, _)| k.as_str()),
                        "gate_reason": t.entry.as_ref().map(|(_, r)| r.as_str()),
                        "passed": o.passed,
                    })
                }).collect::<Vec<_>>(),
            })
        })
        .collect();
    let e = &r.end_to_end;
    json!({
        "bundle": bundle.manifest.name,
        "version": bundle.manifest.version,
        "policy": bundle.manifest.policy.kind().name(),
        "load_ms": load_ms,
        "context_gate": r.context_gate,
        "end_to_end_gate": r.end_to_end_gate,
        "contexts": contexts,
        "open_loop": r.open_loop,
        "stages": r.stages.iter().map(|st| {
            let t = bundle.manifest.parity.stage_threshold(&st.name);
            json!({
                "name": st.name,
                "cosine": finite(st.comparison.cosine),
                "max_abs_diff": finite(st.comparison.max_abs_diff),
                "gate": st.min_cosine,
                "gate_from": t.entry.as_ref().map_or("parity.context_cosine", |(k, _)| k.as_str()),
                "gate_reason": t.entry.as_ref().map(|(_, r)| r.as_str()),
                "passed": st.passed,
            })
        }).collect::<Vec<_>>(),
        "first_diverging_stage": r.first_diverging_stage().map(|st| st.name.clone()),
        "end_to_end": {
            "cosine": finite(e.comparison.cosine),
            "max_abs_diff": finite(e.comparison.max_abs_diff),
            "keystone": e.keystone.map(|(golden, ours)| json!({"golden": golden, "ours": ours})),
            "passed": e.passed,
            "actions": e.actions,
            "expected": e.expected,
        },
        "passed": r.passed(),
    })
}

pub fn render_parity(bundle: &Bundle, r: &BundleParity, load_ms: f64) -> String {
    let mut s = format!(
        "bundle {} ({} {}), contexts loaded in {load_ms:.1} ms\n",
        bundle.dir.display(),
        bundle.manifest.name,
        bundle.manifest.version
    );
    s += &format!(
        "per context (default gate cosine >= {}, parity.context_cosine):\n",
        r.context_gate
    );
    s += &format!(
        "  {:<16} {:<16} {:>12} {:>11} {:>10}  verdict  gate from\n",
        "component", "output", "cosine", "max_abs", "gate"
    );
    for c in &r.contexts {
        for o in &c.outputs {
            let t = bundle.manifest.parity.threshold(&c.label, &o.name);
            let from = match &t.entry {
                None => "default".to_string(),
                Some((key, reason)) => format!("{key}: {reason}"),
            };
            s += &format!(
                "  {:<16} {:<16} {:>12.8} {:>11.3e} {:>10}  {:<7}  {from}\n",
                c.label,
                o.name,
                o.comparison.cosine,
                o.comparison.max_abs_diff,
                o.min_cosine,
                if o.passed { "PASS" } else { "FAIL" }
            );
        }
    }
    if !r.stages.is_empty() {
        s += &format!(
            "per stage of the end-to-end run (default gate cosine >= {}):\n",
            r.context_gate
        );
        for st in &r.stages {
            let from = match bundle.manifest.parity.stage_threshold(&st.name).entry {
                None => "default".to_string(),
                Some((key, reason)) => format!("{key}: {reason}"),
            };
            s += &format!(
                "  {:<33} {:>12.8} {:>11.3e} {:>10}  {:<7}  {from}\n",
                st.name,
                st.comparison.cosine,
                st.comparison.max_abs_diff,
                st.min_cosine,
                if st.passed { "PASS" } else { "FAIL" }
            );
        }
        if let Some(st) = r.first_diverging_stage() {
            s += &format!("  first diverging stage: {}\n", st.name);
        }
    }
    if r.open_loop {
        s += "OPEN LOOP: constant world model (fastwam.world_model); the actions depend only on the noise seed, not on the camera or the state\n";
    }
    let e = &r.end_to_end;
    s += &format!(
        "end to end (gate cosine >= {}): actions cosine {:.8}, max abs diff {:.3e}",
        r.end_to_end_gate, e.comparison.cosine, e.comparison.max_abs_diff
    );
    if let Some((want, got)) = e.keystone {
        s += &format!(", KeyStone choice {got} (golden {want})");
    }
    s += &format!("  {}\n", if e.passed { "PASS" } else { "FAIL" });
    s
}
