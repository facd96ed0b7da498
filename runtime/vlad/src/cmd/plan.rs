//! `vlad plan`: the operating point a config would run at, for latencies the operator
//! names (a board's measured p50/p95, or the ones being planned for), without a bundle
//! loaded or an NPU: the same estimate the daemon states at READY and in STATUS. With a
//! bundle, or a table of published context sizes, also the DSP memory plan: which
//! contexts share a cDSP session, on which NSP, and each session's sum against the budget.

use crate::cli::{self, Common};
use crate::{dsp_plan, Failure};
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;
use vla_control::{Measured, OperatingPoint};

pub const HELP: &str = "\
vlad plan --config FILE (--horizon H | --bundle DIR) --latency-ms L [--latency-ms L ...]
          [--p50-ms L] [--observation-hz F]
vlad plan (--bundle DIR | --sizes FILE) [--config FILE] [--nsps N] [--lib-dir DIR]

The DSP memory plan of the bundle's contexts (their binaries' sizes, spill-fill and I/O,
read through libQnnSystem when it loads, else file sizes alone), or of each release of a
published sizes table (golden/releases/context-sizes.json), under the config's `npu`
section (default: auto, 3840 MiB sessions less 256 MiB reserve) on N NSPs (default 2, as
QCS9075 has).

The operating point the config's `control` section gives at each latency (capture to chunk
ready, p95; the expected hold uses --p50-ms when given, else the same latency): d against
the horizon H, the expected share of hold, and the limit that holds the arm most with the
value that removes it. --observation-hz is the robot's camera rate (default: not counted).";

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let mut config: Option<PathBuf> = None;
    let mut horizon: Option<u64> = None;
    let mut bundle: Option<PathBuf> = None;
    let mut latencies: Vec<f64> = Vec::new();
    let mut p50: Option<f64> = None;
    let mut observation_hz: Option<f64> = None;
    let mut sizes: Option<PathBuf> = None;
    let mut nsps: u32 = dsp_plan::BOARD_NSPS;
    let mut p = cli::Parser::new(args, HELP);
    while let Some(arg) = p.next()? {
        match arg {
            Long("sizes") => sizes = Some(p.path()?),
            Long("nsps") => nsps = p.number("--nsps")?,
            Long("config") => config = Some(p.path()?),
            Long("horizon") => horizon = Some(p.number("--horizon")?),
            Long("bundle") => bundle = Some(p.path()?),
            Long("latency-ms") => latencies.push(p.number("--latency-ms")?),
            Long("p50-ms") => p50 = Some(p.number("--p50-ms")?),
            Long("observation-hz") => observation_hz = Some(p.number("--observation-hz")?),
            other => return Err(cli::unexpected(other)),
        }
    }
    let Some(common) = p.finish() else {
        return Ok(());
    };
    if latencies.is_empty() && (bundle.is_some() || sizes.is_some()) {
        return memory_plans(&common, config, bundle, sizes, nsps);
    }
    let config = config.ok_or_else(|| Failure::Usage("plan needs --config FILE".into()))?;
    if let Some(dir) = &bundle {
        memory_plans(
            &common,
            Some(config.clone()),
            Some(dir.clone()),
            sizes,
            nsps,
        )?;
    }
    let geometry = match (horizon, bundle) {
        (Some(h), None) if h > 0 => vla_ring::Geometry {
            cameras: 0,
            height: 0,
            width: 0,
            channels: 3,
            state_dims: 0,
            action_dims: 1,
            chunk_len: u32::try_from(h)
                .map_err(|_| Failure::Usage(format!("--horizon {h} is too large")))?,
        },
        (None, Some(dir)) => {
            let b = vla_policy::Bundle::open(&dir)?;
            crate::daemon::ring_geometry(&b.manifest.geometry())
        }
        _ => {
            return Err(Failure::Usage(
                "plan needs one of --horizon H (H > 0) or --bundle DIR".into(),
            ))
        }
    };
    if latencies.is_empty() {
        return Err(Failure::Usage("plan needs --latency-ms L".into()));
    }
    let positive = |what: &str, x: f64| {
        if x.is_finite() && x > 0.0 {
            Ok(x)
        } else {
            Err(Failure::Usage(format!(
                "{what}: expected a positive number, found {x}"
            )))
        }
    };
    let observation_period_ns = match observation_hz {
        Some(hz) => (1e9 / positive("--observation-hz", hz)?) as u64,
        None => 0,
    };
    let cfg = vla_config::Config::load(&config)?;
    let settings = crate::daemon::loop_settings(&cfg, geometry, None).limits;
    for l in latencies {
        let p95 = (positive("--latency-ms", l)? * 1e6) as u64;
        let typical = match p50 {
            Some(x) => (positive("--p50-ms", x)? * 1e6) as u64,
            None => p95,
        };
        let measured = Measured {
            latency_p95_ns: p95,
            latency_spread_ns: [typical; vla_control::SPREAD_LEN],
            observation_period_ns,
        };
        if let Some(point) = OperatingPoint::estimate(&settings, &measured) {
            println!("{}", point.describe());
        }
    }
    Ok(())
}

/// Prints the memory plan of the bundle and of every release of the sizes table.
fn memory_plans(
    common: &Common,
    config: Option<PathBuf>,
    bundle: Option<PathBuf>,
    sizes: Option<PathBuf>,
    nsps: u32,
) -> Result<(), Failure> {
    if nsps == 0 {
        return Err(Failure::Usage("--nsps: expected at least 1".into()));
    }
    common.init_logging();
    let npu = match &config {
        Some(path) => vla_config::Config::load(path)?.npu,
        None => vla_config::NpuConfig::default(),
    };
    if let Some(dir) = bundle {
        let b = vla_policy::Bundle::open(&dir)?;
        // The system library states spill-fill and I/O; without it, file sizes only.
        let lib = match crate::qnn_setup::load_library(common) {
            Ok(lib) => Some(lib),
            Err(e) => {
                let why = dsp_plan::text(e);
                println!("(QNN system library not loaded, {why}: file sizes only)");
                None
            }
        };
        let footprints = dsp_plan::bundle_footprints(&b, lib.as_deref())?;
        let plan = dsp_plan::compute(&b.manifest.name, footprints, &npu, nsps)?;
        println!(
            "memory plan of bundle {} ({}) on {nsps} NSP(s):",
            b.manifest.name,
            dir.display()
        );
        print!("{}", plan.render());
    }
    if let Some(path) = sizes {
        for r in dsp_plan::read_sizes(&path)? {
            println!(
                "memory plan of release {} ({}) on {nsps} NSP(s):",
                r.name, r.source
            );
            match dsp_plan::compute(&r.name, r.footprints, &npu, nsps) {
                Ok(plan) => print!("{}", plan.render()),
                Err(Failure::Error(e)) => println!("{e}"),
                Err(other) => return Err(other),
            }
        }
    }
    Ok(())
}
