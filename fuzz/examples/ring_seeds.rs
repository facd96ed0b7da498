//! Writes seed segments for the `ring` fuzz target with the ring crate's own writer:
//! observation and action rings of the target's fixed geometry, empty, partly filled and
//! lapped. Usage: `ring_seeds <output dir>`.

use std::path::Path;
use vla_ring::{Action, ActionStatus, ActionWriter, Geometry, Observation, ObservationWriter};

/// Must equal `FIXED` in `fuzz_targets/ring.rs`.
const GEOMETRY: Geometry = Geometry {
    cameras: 1,
    height: 4,
    width: 6,
    channels: 3,
    state_dims: 7,
    action_dims: 7,
    chunk_len: 8,
};

fn actions(path: &Path, slots: u32, published: u32) -> Result<(), Box<dyn std::error::Error>> {
    let mut writer = ActionWriter::create(path, GEOMETRY, slots)?;
    let mut action = Action::for_geometry(&GEOMETRY);
    for n in 0..published {
        action.status = if n % 3 == 2 {
            ActionStatus::Hold
        } else {
            ActionStatus::Ok
        };
        action.step_index = n % GEOMETRY.chunk_len;
        action.chunk_id = u64::from(n / GEOMETRY.chunk_len);
        action.valid_until_ns = 1_000_000 * u64::from(n + 1);
        action
            .values
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = (n * 10 + i as u32) as f32);
        writer.publish(&action)?;
    }
    Ok(())
}

fn observations(path: &Path, slots: u32, published: u32) -> Result<(), Box<dyn std::error::Error>> {
    let mut writer = ObservationWriter::create(path, GEOMETRY, slots)?;
    let mut observation = Observation::for_geometry(&GEOMETRY)?;
    for n in 0..published {
        observation.capture_time_ns = u64::from(n) * 50_000_000;
        observation.seed = u64::from(n) * 7919;
        observation.instruction_id = n % 3;
        observation
            .state
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = i as f32 - 3.0);
        observation
            .frames
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i as u32 + n) as u8);
        writer.publish(&observation)?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args_os()
        .nth(1)
        .ok_or("usage: ring_seeds <output dir>")?;
    let out = Path::new(&out);
    std::fs::create_dir_all(out)?;
    actions(&out.join("actions-empty"), 2, 0)?;
    actions(&out.join("actions-3-of-4"), 4, 3)?;
    actions(&out.join("actions-lapped"), 4, 11)?;
    observations(&out.join("observations-empty"), 2, 0)?;
    observations(&out.join("observations-1-of-2"), 2, 1)?;
    observations(&out.join("observations-lapped"), 2, 5)?;
    Ok(())
}
