//! `vlad run-once --bundle DIR --obs FILE`: one inference on a bundle, its action chunk and
//! each component's latency.

use crate::cli;
use crate::Failure;
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;
use vla_policy::ObservationFile;

const HELP: &str =
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

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let (mut dir, mut obs_path): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let (mut seed, mut instruction): (Option<u64>, Option<u32>) = (None, None);
    let (mut out, mut stages): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let mut text: Option<OsString> = None;
    let mut p = cli::Parser::new(args, HELP);
    while let Some(arg) = p.next()? {
        match arg {
            Long("bundle") => dir = Some(p.path()?),
            Long("obs") => obs_path = Some(p.path()?),
            Long("seed") => seed = Some(p.number("--seed")?),
            Long("instruction") => instruction = Some(p.number("--instruction")?),
            Long("instruction-text") => text = Some(p.value()?),
            Long("out") => out = Some(p.path()?),
            Long("stages") => stages = Some(p.path()?),
            other => return Err(cli::unexpected(other)),
        }
    }
    let Some(common) = p.finish() else {
        return Ok(());
    };
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
    let super::Opened {
        bundle: _bundle,
        mut policy,
        load_ms,
    } = super::load(&common, &dir)?;
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
