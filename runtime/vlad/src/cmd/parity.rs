//! `vlad parity <ctx.bin> <io.npz>`: run one context on golden inputs and gate its outputs.

use crate::cli::{self, Common};
use crate::{qnn_setup, Failure};
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;
use vla_npz::Npz;
use vla_parity::{check_context, ContextParity, GateOptions};
use vla_qnn::{Context, ContextBinary};

const HELP: &str = "usage: vlad parity <ctx.bin> <io.npz> [--graph NAME] [--min-cosine 0.9999] [--atol 1e-3] [--rtol 1e-2] [--lib-dir DIR]
       vlad parity --bundle DIR [--json FILE] [--lib-dir DIR]
Exit status: 0 all outputs pass, 3 an output is below the gate, 1 error, 2 usage.";

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let mut common = Common::default();
    let mut positional: Vec<PathBuf> = Vec::new();
    let mut graph_name: Option<String> = None;
    let mut gate = GateOptions::default();
    let mut bundle: Option<PathBuf> = None;
    let mut json: Option<PathBuf> = None;
    let mut p = cli::parser(args);
    while let Some(arg) = p.next().map_err(cli::usage)? {
        match arg {
            Long(name) if Common::OPTIONS.contains(&name) => {
                let name = name.to_owned();
                common.take(&name, &mut p)?;
            }
            Long("bundle") => bundle = Some(cli::value(&mut p)?.into()),
            Long("json") => json = Some(cli::value(&mut p)?.into()),
            Long("graph") => graph_name = Some(cli::string(&mut p)?),
            Long("min-cosine") => gate.min_cosine = cli::number(&mut p, "--min-cosine")?,
            Long("atol") => gate.atol = cli::number(&mut p, "--atol")?,
            Long("rtol") => gate.rtol = cli::number(&mut p, "--rtol")?,
            Short('h') | Long("help") => {
                println!("{HELP}");
                return Ok(());
            }
            Value(v) if positional.len() < 2 => positional.push(v.into()),
            other => return Err(cli::unexpected(other)),
        }
    }
    if let Some(dir) = bundle {
        if !positional.is_empty() {
            return Err(Failure::Usage(
                "parity takes either --bundle DIR or <ctx.bin> <io.npz>".into(),
            ));
        }
        common.init_logging();
        return crate::cmd::run_once::parity(&common, &dir, json.as_deref());
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
