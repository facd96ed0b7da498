//! `vlad inspect <ctx.bin>`: what a context binary holds, read through libQnnSystem only
//! (no context is created, so it also works on a machine whose NPU is busy).

use crate::cli;
use crate::{qnn_setup, Failure};
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;
use vla_qnn::{data_type_name, BinaryInfo, ContextBinary, Coupling, TensorInfo, TensorKind};

const HELP: &str = "usage: vlad inspect <ctx.bin> [--json] [--lib-dir DIR]";

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let mut path: Option<PathBuf> = None;
    let mut json = false;
    let mut p = cli::Parser::new(args, HELP);
    while let Some(arg) = p.next()? {
        match arg {
            Long("json") => json = true,
            Value(v) if path.is_none() => path = Some(v.into()),
            other => return Err(cli::unexpected(other)),
        }
    }
    let Some(common) = p.finish() else {
        return Ok(());
    };
    let path = path.ok_or_else(|| Failure::Usage("inspect needs a context binary path".into()))?;
    common.init_logging();
    let lib = qnn_setup::load_library(&common)?;
    let binary = ContextBinary::open(&lib, &path)?;
    if json {
        println!(
            "{}",
            render_json(&binary, binary.info(), lib.build_id().as_deref())
        );
        return Ok(());
    }
    print!("{}", render(&binary, binary.info()));
    print!(
        "{}",
        render_coupling(binary.info(), lib.build_id().as_deref())
    );
    Ok(())
}

fn tensor_line(t: &TensorInfo) -> String {
    let dtype = match (t.element, &t.unsupported) {
        (Some(e), _) => e.to_string(),
        (None, Some(why)) => format!("{} (unsupported: {why})", data_type_name(t.data_type)),
        (None, None) => data_type_name(t.data_type).to_string(),
    };
    let kind = match t.kind {
        TensorKind::Input => "in ",
        TensorKind::Output => "out",
        TensorKind::Other(_) => "?  ",
    };
    format!(
        "    {kind} {:<28} id={:<4} {:<20} {}\n",
        t.name,
        t.id,
        t.shape_text(),
        dtype
    )
}

/// The loaded libraries' QNN build and what it means for this binary.
pub fn render_coupling(info: &BinaryInfo, library_build: Option<&str>) -> String {
    let coupling = Coupling::of(info.build_id.as_deref(), library_build);
    format!(
        "QAIRT libs:    {} ({})\n",
        library_build.unwrap_or("unknown"),
        coupling.describe()
    )
}

/// The same facts for programs (the release importer): one JSON object, tensors with their
/// dims and element type (`null` where this runtime cannot execute it).
pub fn render_json(
    binary: &ContextBinary,
    info: &BinaryInfo,
    library_build: Option<&str>,
) -> String {
    let tensors = |list: &[TensorInfo]| -> Vec<serde_json::Value> {
        list.iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name,
                    "shape": t.dims,
                    "dtype": t.element.map(|e| e.to_string()),
                    "qnn_data_type": data_type_name(t.data_type),
                })
            })
            .collect()
    };
    let graphs: Vec<serde_json::Value> = info
        .graphs
        .iter()
        .map(|g| {
            serde_json::json!({
                "name": g.name,
                "inputs": tensors(&g.inputs),
                "outputs": tensors(&g.outputs),
                "spill_fill_bytes": g.spill_fill_bytes,
            })
        })
        .collect();
    serde_json::json!({
        "file": binary.path().display().to_string(),
        "bytes": binary.size(),
        "soc_model": info.soc_model,
        "blob_version": info.blob_version.map(|v| v.to_string()),
        "build_id": info.build_id,
        "library_build": library_build,
        "graphs": graphs,
    })
    .to_string()
}

/// The human-readable report (also used by tests).
pub fn render(binary: &ContextBinary, info: &BinaryInfo) -> String {
    let mut s = String::new();
    s += &format!(
        "file:          {} ({} bytes)\n",
        binary.path().display(),
        binary.size()
    );
    s += &format!(
        "soc model:     {}\n",
        info.soc_model.map_or("not recorded".to_string(), |m| {
            if m == 77 {
                "77 (QCS9075 / QCS9100, Hexagon v73)".to_string()
            } else {
                m.to_string()
            }
        })
    );
    s += &format!(
        "blob version:  {}\n",
        info.blob_version
            .map_or("not recorded".to_string(), |v| v.to_string())
    );
    s += &format!(
        "QNN build:     {}\n",
        info.build_id.as_deref().unwrap_or("not recorded")
    );
    s += &format!(
        "core API:      {}   backend API: {}   binary info v{}\n",
        info.core_api, info.backend_api, info.info_version
    );
    s += &format!("graphs:        {}\n", info.graphs.len());
    for g in &info.graphs {
        s += &format!(
            "  graph {} ({} inputs, {} outputs, spill-fill {})\n",
            g.name,
            g.inputs.len(),
            g.outputs.len(),
            g.spill_fill_bytes
                .map_or("not reported".into(), |b| format!("{b} bytes"))
        );
        for t in g.inputs.iter().chain(&g.outputs) {
            s += &tensor_line(t);
        }
    }
    s
}
