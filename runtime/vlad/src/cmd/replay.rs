//! `vlad replay FILE.mcap [--bundle DIR]`: a flight recording as a regression test.
//! Every recorded observation (full frames, state, seed, instruction) runs through the
//! bundle again and its chunk is compared with the recorded one (cosine and max abs,
//! per chunk). The noise is seeded from the observation, so the same bundle on the same
//! backend reproduces each chunk; a disagreement exits 3.

use crate::cli;
use crate::Failure;
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;

const HELP: &str = "usage: vlad replay FILE.mcap [--bundle DIR] [--min-cosine C] [--max-abs A]
Re-runs every recorded observation through the bundle (default: the recording's bundle_path)
and compares each chunk with the recorded one. Exit 3 when a chunk disagrees
(cosine below --min-cosine, default 0.9999, or max abs above --max-abs, default 1e-3).";

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let (mut file, mut bundle): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let (mut min_cosine, mut max_abs_limit) = (0.9999f64, 1e-3f64);
    let mut p = cli::Parser::new(args, HELP);
    while let Some(arg) = p.next()? {
        match arg {
            Long("bundle") => bundle = Some(p.path()?),
            Long("min-cosine") => min_cosine = p.number("--min-cosine")?,
            Long("max-abs") => max_abs_limit = p.number("--max-abs")?,
            Value(v) if file.is_none() => file = Some(v.into()),
            other => return Err(cli::unexpected(other)),
        }
    }
    let Some(common) = p.finish() else {
        return Ok(());
    };
    let file = file.ok_or_else(|| Failure::Usage("replay needs FILE.mcap".into()))?;
    common.init_logging();
    let rec = vla_recorder::read_recording(&file)?;
    let dir = match bundle {
        Some(d) => d,
        None => rec
            .metadata
            .get("bundle_path")
            .map(PathBuf::from)
            .ok_or_else(|| {
                Failure::Usage("the recording names no bundle_path: pass --bundle DIR".into())
            })?,
    };
    if rec.metadata.get("frames").map(String::as_str) != Some("full") {
        return Err(Failure::Error(format!(
            "{}: frames were recorded `{}`; replay needs `recorder.frames: full`",
            file.display(),
            rec.metadata.get("frames").map_or("?", String::as_str)
        )));
    }
    let super::Opened {
        bundle: b,
        mut policy,
        ..
    } = super::load(&common, &dir)?;
    let g = policy.geometry();
    println!(
        "replaying {} ({} trigger, recorded on bundle {} {} {}) on {} ({} {})",
        file.display(),
        rec.metadata.get("trigger").map_or("?", String::as_str),
        rec.metadata.get("bundle_name").map_or("?", String::as_str),
        rec.metadata
            .get("bundle_version")
            .map_or("?", String::as_str),
        rec.metadata.get("bundle_hash").map_or("?", String::as_str),
        dir.display(),
        b.manifest.name,
        b.manifest.version
    );
    let mut actions = vec![0f32; g.chunk_len * g.action_dims];
    let (mut compared, mut skipped, mut failed) = (0usize, 0usize, 0usize);
    let mut worst = (1.0f64, 0.0f64);
    for c in &rec.chunks {
        if !c.ok || c.prefixed {
            // A failed inference has no chunk; a prefixed one depended on the chunk in play.
            skipped += 1;
            continue;
        }
        let o = vla_policy::Observation {
            cameras: g.cameras,
            height: g.height,
            width: g.width,
            frames: &c.frames,
            state: &c.state,
            instruction_id: c.instruction_id,
            seed: c.seed,
        };
        if c.frames.len() != g.cameras * g.height * g.width * 3
            || c.state.len() != g.state_dims
            || c.actions.len() != actions.len()
        {
            return Err(Failure::Gate(format!(
                "chunk {}: the recording's geometry ({} frame bytes, {} state, {} actions) does not fit bundle {}",
                c.chunk_id,
                c.frames.len(),
                c.state.len(),
                c.actions.len(),
                dir.display()
            )));
        }
        policy.infer(&o, &mut actions)?;
        let m = vla_tensor::compare(&actions, &c.actions, 0.0, 0.0);
        let (cosine, max_abs) = (m.cosine, m.max_abs_diff);
        compared += 1;
        worst = (worst.0.min(cosine), worst.1.max(max_abs));
        let ok = cosine >= min_cosine && max_abs <= max_abs_limit;
        if !ok {
            failed += 1;
        }
        println!(
            "  chunk {:>5} (observation {:>6}, seed {:>20}): cosine {cosine:.6}  max abs {max_abs:.3e}  {}",
            c.chunk_id,
            c.observation_seq,
            c.seed,
            if ok { "ok" } else { "DIFFERS" }
        );
    }
    println!(
        "{compared} chunks compared, {failed} differ, {skipped} not replayable (failed or prefixed); worst cosine {:.6}, worst max abs {:.3e}",
        worst.0, worst.1
    );
    if compared == 0 {
        return Err(Failure::Error(format!(
            "{}: no replayable chunk",
            file.display()
        )));
    }
    if failed > 0 {
        return Err(Failure::Gate(format!(
            "{failed} of {compared} chunks differ from the recording (min cosine {min_cosine}, max abs {max_abs_limit})"
        )));
    }
    Ok(())
}
