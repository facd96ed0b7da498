//! `vlad simulate --config FILE`: the robot simulator (`vla-sim`) on the rings, the
//! control limits and the bundle a daemon configuration names.

use crate::cli;
use crate::cli::Common;
use crate::Failure;
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;
use vla_policy::{Bundle, ObservationFile};
use vla_sim::Gaps;

const HELP: &str = "usage: vlad simulate --config FILE [--bundle DIR] [--duration SECONDS] [--camera-hz HZ] [--obs FILE.npz]
                     [--gap-every SECONDS --gap-length SECONDS] [--json FILE] [--timeline FILE.csv]
Writes observations (default: the bundle's golden/end_to_end.npz) at --camera-hz (default 10)
into the observation ring and reads the action ring for --duration seconds (default 20).
--gap-every S --gap-length L  every S seconds go silent for L seconds (L < S): no observation
                             and no heartbeat, like a stalled camera or firmware
--json FILE                  also write the report as JSON, rewritten every second and at the end
--timeline FILE.csv          every received action: t_s,status,chunk_id,step,v0..vN (for the plot)";

/// The command line.
struct Args {
    common: Common,
    config: PathBuf,
    bundle: Option<PathBuf>,
    obs: Option<PathBuf>,
    json: Option<PathBuf>,
    timeline: Option<PathBuf>,
    duration: f64,
    camera_hz: f64,
    gaps: Gaps,
}

/// Parses and checks the command line; `None` when it asked for the help text.
fn parse_args(args: Vec<OsString>) -> Result<Option<Args>, Failure> {
    let (mut config_path, mut bundle_dir, mut obs_path, mut json_path): (
        Option<PathBuf>,
        Option<PathBuf>,
        Option<PathBuf>,
        Option<PathBuf>,
    ) = (None, None, None, None);
    let mut timeline_path: Option<PathBuf> = None;
    let (mut duration, mut camera_hz) = (20.0f64, 10.0f64);
    let (mut gap_every, mut gap_length): (Option<f64>, Option<f64>) = (None, None);
    let mut p = cli::Parser::new(args, HELP);
    while let Some(arg) = p.next()? {
        match arg {
            Long("config") => config_path = Some(p.path()?),
            Long("bundle") => bundle_dir = Some(p.path()?),
            Long("obs") => obs_path = Some(p.path()?),
            Long("json") => json_path = Some(p.path()?),
            Long("timeline") => timeline_path = Some(p.path()?),
            Long("duration") => duration = p.number("--duration")?,
            Long("camera-hz") => camera_hz = p.number("--camera-hz")?,
            Long("gap-every") => gap_every = Some(p.number("--gap-every")?),
            Long("gap-length") => gap_length = Some(p.number("--gap-length")?),
            other => return Err(cli::unexpected(other)),
        }
    }
    let Some(common) = p.finish() else {
        return Ok(None);
    };
    let valid = (0.0..=1000.0).contains(&camera_hz)
        && camera_hz > 0.0
        && duration.is_finite()
        && duration > 0.0;
    if !valid {
        return Err(Failure::Usage(
            "--camera-hz must be in (0, 1000] and --duration positive".into(),
        ));
    }
    let gaps = match (gap_every, gap_length) {
        (None, None) => Gaps::default(),
        (Some(every), Some(length))
            if every.is_finite() && length.is_finite() && length > 0.0 && length < every =>
        {
            Gaps {
                every_ns: (every * 1e9) as u64,
                length_ns: (length * 1e9) as u64,
            }
        }
        (Some(_), Some(_)) => {
            return Err(Failure::Usage(
                "--gap-length must be positive and shorter than --gap-every".into(),
            ))
        }
        _ => {
            return Err(Failure::Usage(
                "--gap-every and --gap-length go together".into(),
            ))
        }
    };
    let config =
        config_path.ok_or_else(|| Failure::Usage("simulate needs --config FILE".into()))?;
    Ok(Some(Args {
        common,
        config,
        bundle: bundle_dir,
        obs: obs_path,
        json: json_path,
        timeline: timeline_path,
        duration,
        camera_hz,
        gaps,
    }))
}

/// Parses the command line, resolves the simulator's settings and runs it.
pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let Some(args) = parse_args(args)? else {
        return Ok(());
    };
    args.common.init_logging();
    let settings = settings(&args)?;
    vla_sim::run(&settings)?;
    Ok(())
}

/// The config, the bundle and the observation source as the simulator's settings.
fn settings(args: &Args) -> Result<vla_sim::Settings, Failure> {
    let config = vla_config::Config::load(&args.config)?;
    let bundle = Bundle::open(
        args.bundle
            .clone()
            .unwrap_or_else(|| PathBuf::from(config.bundle.path.as_str())),
    )?;
    let m = &bundle.manifest;
    let geometry = crate::daemon::ring_geometry(&m.geometry());
    let file = ObservationFile::load(
        &args
            .obs
            .clone()
            .unwrap_or_else(|| bundle.path(&m.end_to_end)),
    )?;
    let source = vla_ring::Observation {
        seed: file.seed,
        instruction_id: file.instruction_id,
        state: file.state,
        frames: file.frames,
        ..vla_ring::Observation::for_geometry(&geometry)?
    };
    Ok(vla_sim::Settings {
        geometry,
        source,
        observation_ring: PathBuf::from(config.rings.observation_path.as_str()),
        action_ring: PathBuf::from(config.rings.action_path.as_str()),
        action_valid: config.control.action_valid(),
        writer_heartbeat_timeout: config.control.writer_heartbeat_timeout(),
        camera_hz: args.camera_hz,
        duration: args.duration,
        gaps: args.gaps,
        json: args.json.clone(),
        timeline: args.timeline.clone(),
    })
}
