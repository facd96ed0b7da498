//! `vlad prompt`: renders instructions with the device's own renderer (`vla_text`) for the
//! importer, so the prompt tables of a bundle and the prompts vlad renders at run time come
//! from one implementation. Prints JSON: per instruction its unpadded ids, image block,
//! encoder mask, image and state rows and the left padding of the `upstream` layout, or the
//! refusal (`error`, `kind`).

use crate::cli;
use crate::Failure;
use lexopt::prelude::*;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::path::PathBuf;
use vla_text::molmoact2::{ActionMode, RenderError, Template, Upstream};
use vla_text::Tokenizer;

const HELP: &str =
    "usage: vlad prompt --tokenizer tokenizer.json [--tokenizer-config tokenizer_config.json]
    --cameras N --grid ROWSxCOLS [--no-col-tokens] --state-dims N [--setup TEXT] [--control TEXT]
    [--no-setup-tokens] [--no-control-tokens] [--no-normalize-language]
    --upstream lerobot-0.6.1|lerobot-main-c13d79e [--max-sequence-length N]
    --action-mode continuous|both --instructions FILE.json
Renders each instruction of FILE.json (a list of strings) as upstream's processor does and prints
JSON {\"instructions\": [{ids, image_block, encoder_mask, image_positions, state_positions, pad}
or {error, kind}]}. The tokenizer is read as transformers 5's Qwen2Tokenizer reads it.";

/// Runs the subcommand.
pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let (mut tokenizer, mut config, mut instructions): (
        Option<PathBuf>,
        Option<PathBuf>,
        Option<PathBuf>,
    ) = (None, None, None);
    // Options not given keep the LIBERO checkpoints' settings.
    let mut t = Template::libero(0, (0, 0), 0);
    let (mut cameras, mut grid, mut dims, mut upstream, mut mode) = (None, None, None, None, None);
    let mut p = cli::Parser::without_common(args, HELP);
    while let Some(arg) = p.next()? {
        match arg {
            Long("tokenizer") => tokenizer = Some(p.path()?),
            Long("tokenizer-config") => config = Some(p.path()?),
            Long("instructions") => instructions = Some(p.path()?),
            Long("cameras") => cameras = Some(p.number("--cameras")?),
            Long("grid") => {
                let g = p.string()?;
                let parsed = g
                    .to_lowercase()
                    .split_once('x')
                    .and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?)))
                    .filter(|&(r, c): &(usize, usize)| r > 0 && c > 0);
                grid = Some(parsed.ok_or_else(|| {
                    Failure::Usage(format!("--grid {g:?}: expected ROWSxCOLS, e.g. 14x14"))
                })?);
            }
            Long("no-col-tokens") => t.col_tokens = false,
            Long("state-dims") => dims = Some(p.number("--state-dims")?),
            Long("setup") => t.setup = p.string()?,
            Long("control") => t.control = p.string()?,
            Long("no-setup-tokens") => t.add_setup_tokens = false,
            Long("no-control-tokens") => t.add_control_tokens = false,
            Long("no-normalize-language") => t.normalize_language = false,
            Long("upstream") => upstream = Some(p.string()?),
            Long("max-sequence-length") => {
                t.max_sequence_length = Some(p.number("--max-sequence-length")?)
            }
            Long("action-mode") => mode = Some(p.string()?),
            other => return Err(cli::unexpected(other)),
        }
    }
    if p.finish().is_none() {
        return Ok(());
    }
    let need = |what: &str| Failure::Usage(format!("prompt needs {what}"));
    let tokenizer = tokenizer.ok_or_else(|| need("--tokenizer"))?;
    let instructions = instructions.ok_or_else(|| need("--instructions"))?;
    t.cameras = cameras.ok_or_else(|| need("--cameras"))?;
    t.grid = grid.ok_or_else(|| need("--grid"))?;
    t.state_dims = dims.ok_or_else(|| need("--state-dims"))?;
    let upstream = upstream.ok_or_else(|| need("--upstream"))?;
    t.upstream = Upstream::from_name(&upstream).ok_or_else(|| {
        Failure::Usage(format!(
            "--upstream {upstream:?}: expected one of {}",
            Upstream::NAMES.join(", ")
        ))
    })?;
    t.action_mode = match mode.ok_or_else(|| need("--action-mode"))?.as_str() {
        "continuous" => ActionMode::Continuous,
        "both" => ActionMode::Both,
        other => {
            return Err(Failure::Usage(format!(
                "--action-mode {other:?}: expected continuous or both"
            )))
        }
    };
    let tok = Tokenizer::from_files(&tokenizer, config.as_deref())?;
    let list: Value = serde_json::from_slice(
        &std::fs::read(&instructions)
            .map_err(|e| Failure::Error(format!("{}: {e}", instructions.display())))?,
    )
    .map_err(|e| Failure::Error(format!("{}: not JSON: {e}", instructions.display())))?;
    let texts = list
        .as_array()
        .filter(|a| a.iter().all(|v| v.is_string()))
        .ok_or_else(|| {
            Failure::Error(format!(
                "{}: expected a list of strings",
                instructions.display()
            ))
        })?;
    let rendered: Vec<Value> = texts
        .iter()
        .map(
            |text| match t.render(&tok, text.as_str().unwrap_or_default()) {
                Ok(r) => json!({
                    "ids": r.ids,
                    "image_block": r.image_block,
                    "encoder_mask": r.encoder_mask,
                    "image_positions": r.image_positions,
                    "state_positions": r.state_positions,
                    "pad": r.pad,
                }),
                Err(e) => json!({"error": e.to_string(), "kind": kind(&e)}),
            },
        )
        .collect();
    println!("{}", json!({ "instructions": rendered }));
    Ok(())
}

fn kind(e: &RenderError) -> &'static str {
    match e {
        RenderError::MissingToken(_) => "missing_token",
        RenderError::PatchText { .. } => "patch_text",
        RenderError::StateRows { .. } => "state_rows",
        RenderError::OverCap(_) => "over_cap",
        RenderError::Length { .. } => "length",
    }
}
