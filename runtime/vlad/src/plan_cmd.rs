//! `vlad plan`: the operating point a config would run at, for latencies the operator
//! names (a board's measured p50/p95, or the ones being planned for), without a bundle
//! loaded or an NPU: the same estimate the daemon states at READY and in STATUS.

use crate::cli;
use crate::Failure;
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;
use vla_control::{Measured, OperatingPoint};

pub const HELP: &str = "\
vlad plan --config FILE (--horizon H | --bundle DIR) --latency-ms L [--latency-ms L ...]
          [--p50-ms L] [--observation-hz F]

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
    let mut p = cli::parser(args);
    while let Some(arg) = p.next().map_err(cli::usage)? {
        match arg {
            Long("config") => config = Some(cli::value(&mut p)?.into()),
            Long("horizon") => horizon = Some(cli::number(&mut p, "--horizon")?),
            Long("bundle") => bundle = Some(cli::value(&mut p)?.into()),
            Long("latency-ms") => latencies.push(cli::number(&mut p, "--latency-ms")?),
            Long("p50-ms") => p50 = Some(cli::number(&mut p, "--p50-ms")?),
            Long("observation-hz") => {
                observation_hz = Some(cli::number(&mut p, "--observation-hz")?)
            }
            Short('h') | Long("help") => {
                println!("{HELP}");
                return Ok(());
            }
            other => return Err(cli::unexpected(other)),
        }
    }
    let config = config.ok_or_else(|| Failure::Usage("plan needs --config FILE".into()))?;
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
    let settings = crate::daemon::loop_settings(&cfg, geometry, None).point_settings();
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
