//! Bundle-level tools: `vlad parity --bundle DIR` and `vlad run-once --bundle DIR --obs FILE`.

use crate::cli::{self, Common};
use crate::{qnn_setup, Failure};
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;
use vla_policy::{Bundle, BundleParity, ObservationFile, Policy};

pub(crate) fn load(common: &Common, dir: &Path) -> Result<(Bundle, Policy, f64), Failure> {
    let bundle = Bundle::open(dir)?;
    let (_, backend) = qnn_setup::load_backend(common)?;
    let t = Instant::now();
    let policy = Policy::load(&bundle, &backend)?;
    crate::gate::note_upstream_deviations(&bundle);
    Ok((bundle, policy, t.elapsed().as_secs_f64() * 1e3))
}

pub fn parity(common: &Common, dir: &Path, json: Option<&Path>) -> Result<(), Failure> {
    let (bundle, mut policy, load_ms) = load(common, dir)?;
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
        "policy": format!("{:?}", bundle.manifest.policy).to_lowercase(),
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

const RUN_ONCE_HELP: &str =
    "usage: vlad run-once --bundle DIR --obs FILE.npz [--seed N] [--instruction N | --instruction-text TEXT]
                      [--out FILE.npz] [--stages FILE.npz] [--lib-dir DIR]
The observation npz holds frames (uint8 [cameras,H,W,3]), state (f32), instruction_id and seed,
like a bundle's golden/end_to_end.npz. --instruction-text renders an instruction the bundle
does not list (MolmoAct2 bundles with a molmoact2.text block; refused in one line otherwise).
--out writes the chunk (f32 `actions` [H, A]) and, for KeyStone, `keystone_choice` (i32 [1]),
for comparing against a reference. --stages writes the host glue's intermediates of the
inference (f32, flat, by the end-to-end golden's names: the image input the first context was
fed, ...), for comparing vlad's own preprocessing with upstream's.";

/// The chunk of `run-once --out` as an npz (`actions`, and `keystone_choice` when chosen).
fn write_chunk(
    path: &Path,
    actions: &[f32],
    rows: usize,
    dims: usize,
    choice: Option<usize>,
) -> Result<(), Failure> {
    let failed =
        |e: vla_npz::NpzError| Failure::Error(format!("cannot write {}: {e}", path.display()));
    let mut arrays =
        vec![vla_npz::Array::from_f32("actions", &[rows, dims], actions).map_err(failed)?];
    if let Some(c) = choice {
        let c = i32::try_from(c)
            .map_err(|_| Failure::Error(format!("KeyStone choice {c} out of range")))?;
        arrays.push(vla_npz::Array::from_i32("keystone_choice", &[1], &[c]).map_err(failed)?);
    }
    let refs: Vec<&vla_npz::Array> = arrays.iter().collect();
    vla_npz::write_npz(path, &refs).map_err(failed)
}

/// The host glue's intermediates of `run-once --stages` as an npz of flat f32 arrays.
fn write_stages(path: &Path, stages: &[(String, Vec<f32>)]) -> Result<(), Failure> {
    let failed =
        |e: vla_npz::NpzError| Failure::Error(format!("cannot write {}: {e}", path.display()));
    let arrays = stages
        .iter()
        .map(|(name, v)| vla_npz::Array::from_f32(name, &[v.len()], v).map_err(failed))
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&vla_npz::Array> = arrays.iter().collect();
    vla_npz::write_npz(path, &refs).map_err(failed)
}

pub fn run_once(args: Vec<OsString>) -> Result<(), Failure> {
    let mut common = Common::default();
    let (mut dir, mut obs_path): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let (mut seed, mut instruction): (Option<u64>, Option<u32>) = (None, None);
    let (mut out, mut stages): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let mut text: Option<OsString> = None;
    let mut p = cli::parser(args);
    while let Some(arg) = p.next().map_err(cli::usage)? {
        match arg {
            Long(name) if Common::OPTIONS.contains(&name) => {
                let name = name.to_owned();
                common.take(&name, &mut p)?;
            }
            Long("bundle") => dir = Some(cli::value(&mut p)?.into()),
            Long("obs") => obs_path = Some(cli::value(&mut p)?.into()),
            Long("seed") => seed = Some(cli::number(&mut p, "--seed")?),
            Long("instruction") => instruction = Some(cli::number(&mut p, "--instruction")?),
            Long("instruction-text") => text = Some(cli::value(&mut p)?),
            Long("out") => out = Some(cli::value(&mut p)?.into()),
            Long("stages") => stages = Some(cli::value(&mut p)?.into()),
            Short('h') | Long("help") => {
                println!("{RUN_ONCE_HELP}");
                return Ok(());
            }
            other => return Err(cli::unexpected(other)),
        }
    }
    let dir = dir.ok_or_else(|| Failure::Usage("run-once needs --bundle DIR".into()))?;
    let obs_path = obs_path.ok_or_else(|| Failure::Usage("run-once needs --obs FILE".into()))?;
    common.init_logging();
    let mut obs = ObservationFile::load(&obs_path)?;
    if let Some(s) = seed {
        obs.seed = s;
    }
    if let Some(i) = instruction {
        obs.instruction_id = i;
    }
    let (_bundle, mut policy, load_ms) = load(&common, &dir)?;
    if let Some(text) = &text {
        if instruction.is_some() {
            return Err(Failure::Usage(
                "run-once takes --instruction or --instruction-text, not both".into(),
            ));
        }
        obs.instruction_id = policy.instruction_from_text(text.as_encoded_bytes())?;
    }
    let g = policy.geometry();
    let mut actions = vec![0f32; g.chunk_len * g.action_dims];
    // The first inference pays the backend's warm-up; report the second as steady state.
    let t = Instant::now();
    policy.infer(&obs.observation(), &mut actions)?;
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    policy.infer(&obs.observation(), &mut actions)?;
    println!("contexts loaded in {load_ms:.1} ms; first inference {first_ms:.1} ms (warm-up)");
    println!(
        "action chunk [{} x {}] (seed {}, instruction {}):",
        g.chunk_len, g.action_dims, obs.seed, obs.instruction_id
    );
    for row in actions.chunks(g.action_dims) {
        let cells: Vec<String> = row.iter().map(|v| format!("{v:>9.5}")).collect();
        println!("  {}", cells.join(" "));
    }
    if let Some(c) = policy.keystone_choice() {
        println!("KeyStone chose candidate {c}");
    }
    if let Some(path) = &out {
        write_chunk(
            path,
            &actions,
            g.chunk_len,
            g.action_dims,
            policy.keystone_choice(),
        )?;
    }
    if let Some(path) = &stages {
        write_stages(path, &policy.stages(&obs.observation()))?;
    }
    let t = policy.timings();
    println!("latency (second inference):");
    for (name, d) in &t.components {
        println!("  {name:<16} {:>9.3} ms", d.as_secs_f64() * 1e3);
    }
    println!(
        "  {:<16} {:>9.3} ms",
        "host glue",
        t.host().as_secs_f64() * 1e3
    );
    println!("  {:<16} {:>9.3} ms", "total", t.total.as_secs_f64() * 1e3);
    Ok(())
}
