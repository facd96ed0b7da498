//! `vlad simulate`: a robot stand-in for development and the demo. It plays the firmware:
//! writes observations (golden camera frames and state) into the observation ring at
//! camera rate and reads the action ring the way a firmware would, then reports what it
//! received: rate, status counts, how fresh the applied actions were.

use crate::cli::{self, Common};
use crate::Failure;
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;
use vla_control::Histogram;
use vla_policy::{Bundle, ObservationFile, PolicyKind};
use vla_ring::{monotonic_ns, Action, ActionStatus, Observation, RingReader, RingWriter};

const HELP: &str = "usage: vlad simulate --config FILE [--bundle DIR] [--duration SECONDS] [--camera-hz HZ] [--obs FILE.npz]
Writes observations (default: the bundle's golden/end_to_end.npz) at --camera-hz (default 10)
into the observation ring and reads the action ring for --duration seconds (default 20).";

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let mut common = Common::default();
    let (mut config_path, mut bundle_dir, mut obs_path): (
        Option<PathBuf>,
        Option<PathBuf>,
        Option<PathBuf>,
    ) = (None, None, None);
    let (mut duration, mut camera_hz) = (20.0f64, 10.0f64);
    let mut p = cli::parser(args);
    while let Some(arg) = p.next().map_err(cli::usage)? {
        match arg {
            Long(name) if Common::OPTIONS.contains(&name) => {
                let name = name.to_owned();
                common.take(&name, &mut p)?;
            }
            Long("config") => config_path = Some(cli::value(&mut p)?.into()),
            Long("bundle") => bundle_dir = Some(cli::value(&mut p)?.into()),
            Long("obs") => obs_path = Some(cli::value(&mut p)?.into()),
            Long("duration") => duration = cli::number(&mut p, "--duration")?,
            Long("camera-hz") => camera_hz = cli::number(&mut p, "--camera-hz")?,
            Short('h') | Long("help") => {
                println!("{HELP}");
                return Ok(());
            }
            other => return Err(cli::unexpected(other)),
        }
    }
    let valid = (0.0..=1000.0).contains(&camera_hz)
        && camera_hz > 0.0
        && duration.is_finite()
        && duration > 0.0;
    if !valid {
        return Err(Failure::Usage(
            "--camera-hz must be in (0, 1000] and --duration positive".into(),
        ));
    }
    let config_path =
        config_path.ok_or_else(|| Failure::Usage("simulate needs --config FILE".into()))?;
    common.init_logging();
    let config =
        vla_config::Config::load(&config_path).map_err(|e| Failure::Error(e.to_string()))?;
    let bundle =
        Bundle::open(bundle_dir.unwrap_or_else(|| PathBuf::from(config.bundle.path.as_str())))?;
    let m = &bundle.manifest;
    let geometry = match m.policy {
        PolicyKind::Molmoact2 => {
            let s = m.molmoact2.as_ref().expect("validated");
            vla_ring::Geometry {
                cameras: s.cameras as u32,
                height: s.frame_height as u32,
                width: s.frame_width as u32,
                channels: 3,
                state_dims: s.state_dims as u32,
                action_dims: s.action_dims as u32,
                chunk_len: s.action_horizon as u32,
            }
        }
        PolicyKind::Fastwam => {
            let s = m.fastwam.as_ref().expect("validated");
            vla_ring::Geometry {
                cameras: 0,
                height: 0,
                width: 0,
                channels: 3,
                state_dims: 0,
                action_dims: s.action_dims as u32,
                chunk_len: s.action_horizon as u32,
            }
        }
    };
    let source = ObservationFile::load(&obs_path.unwrap_or_else(|| bundle.path(&m.end_to_end)))?;
    let mut obs =
        Observation::for_geometry(&geometry).map_err(|e| Failure::Error(e.to_string()))?;
    if obs.frames.len() != source.frames.len() || obs.state.len() != source.state.len() {
        return Err(Failure::Error(format!(
            "observation file has {} frame bytes and {} state values; the bundle needs {} and {}",
            source.frames.len(),
            source.state.len(),
            obs.frames.len(),
            obs.state.len()
        )));
    }
    obs.frames.copy_from_slice(&source.frames);
    obs.state.copy_from_slice(&source.state);
    obs.instruction_id = source.instruction_id;

    let obs_ring = PathBuf::from(config.rings.observation_path.as_str());
    let act_ring = PathBuf::from(config.rings.action_path.as_str());
    let mut writer = RingWriter::<Observation>::create(&obs_ring, geometry, 8)
        .map_err(|e| Failure::Error(e.to_string()))?;
    println!(
        "simulator: writing observations to {} at {camera_hz} Hz for {duration} s",
        obs_ring.display()
    );

    let period = (1e9 / camera_hz) as u64;
    let start = monotonic_ns();
    let end = start + (duration * 1e9) as u64;
    let mut next_obs = start;
    let mut captures = vec![0u64; 4096];
    let mut written = 0u64;
    let mut reader: Option<RingReader<Action>> = None;
    let mut action = Action::for_geometry(&geometry);
    let mut last_seq = 0u64;
    let (mut ok, mut hold, mut fault, mut applied_zero) = (0u64, 0u64, 0u64, 0u64);
    let (mut visible, mut age) = (Histogram::default(), Histogram::default());
    let mut first_ok: Option<u64> = None;
    while monotonic_ns() < end {
        let now = monotonic_ns();
        if now >= next_obs {
            obs.capture_time_ns = now;
            obs.seed = source.seed.wrapping_add(written);
            let seq = writer
                .publish(&obs)
                .map_err(|e| Failure::Error(e.to_string()))?;
            captures[(seq % 4096) as usize] = now;
            written += 1;
            next_obs += period;
        } else {
            writer.heartbeat();
        }
        if reader.is_none() {
            reader = RingReader::<Action>::open(&act_ring, geometry).ok();
            if let Some(r) = &reader {
                last_seq = r.published();
            }
        }
        if let Some(r) = &reader {
            let published = r.published();
            for seq in last_seq + 1..=published {
                if r.read_seq(seq, &mut action).is_err() {
                    continue;
                }
                let seen = monotonic_ns();
                visible.record(seen.saturating_sub(action.made_time_ns));
                match action.status {
                    ActionStatus::Ok if action.applicable_at(seen) => {
                        ok += 1;
                        first_ok.get_or_insert(seen);
                        if action.values.iter().all(|v| *v == 0.0) {
                            applied_zero += 1;
                        }
                        let capture = captures[(action.source_obs_seq % 4096) as usize];
                        if capture != 0 {
                            age.record(seen.saturating_sub(capture));
                        }
                    }
                    ActionStatus::Ok | ActionStatus::Hold => hold += 1,
                    ActionStatus::Fault => fault += 1,
                }
            }
            last_seq = published.max(last_seq);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let secs = duration;
    let ms = |ns: u64| ns as f64 / 1e6;
    println!("simulator report ({secs:.1} s):");
    println!(
        "  observations    {written} written ({:.1} Hz)",
        written as f64 / secs
    );
    let total = ok + hold + fault;
    println!("  actions         {total} received ({:.2} Hz): {ok} applied (ok), {hold} hold, {fault} fault", total as f64 / secs);
    if let Some(t) = first_ok {
        println!(
            "  first action    {:.2} s after start",
            (t - start) as f64 / 1e9
        );
    }
    println!(
        "  ring visibility made->seen p50 {:.3} ms  p99 {:.3} ms",
        ms(visible.quantile_ns(0.5)),
        ms(visible.quantile_ns(0.99))
    );
    println!(
        "  action age      observation capture->applied p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        ms(age.quantile_ns(0.5)),
        ms(age.quantile_ns(0.99)),
        ms(age.max_ns())
    );
    println!("  all-zero actions applied: {applied_zero}");
    if reader.is_none() {
        return Err(Failure::Error(format!(
            "no action ring appeared at {} (is `vlad run` up?)",
            act_ring.display()
        )));
    }
    Ok(())
}
