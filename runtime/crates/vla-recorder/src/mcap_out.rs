//! The recording file: MCAP, JSON message encoding, one JSON Schema per channel
//! (documented in `docs/observability.md`), camera frames as `foxglove.RawImage` so
//! Foxglove shows them as images.
//!
//! Topics: `/vla/observation` (`vla.Observation`), `/vla/camera/<i>`
//! (`foxglove.RawImage`, absent when frames are off), `/vla/chunk` (`vla.Chunk`),
//! `/vla/action` (`vla.Action`); metadata `vla.recording` (trigger, bundle, geometry,
//! drop counts). Log times are wall-clock nanoseconds (what Foxglove's timeline shows);
//! every message also carries the loop's own `CLOCK_MONOTONIC` times (`*_ns`).
//!
//! A file lands atomically: written to a dot-prefixed temporary name in the directory,
//! synced, then renamed to `vlad-<UTC time>-<n>-<trigger>.mcap`.

use crate::record::{decision_name, ChunkRecord, Frames, History, TickRecord};
use crate::{RecorderSettings, Trigger};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vla_ring::Geometry;

/// Schema name of the `/vla/observation` channel.
pub const SCHEMA_OBSERVATION: &str = "vla.Observation";
/// Schema name of the `/vla/chunk` channel.
pub const SCHEMA_CHUNK: &str = "vla.Chunk";
/// Schema name of the `/vla/action` channel.
pub const SCHEMA_ACTION: &str = "vla.Action";
const SCHEMA_RAW_IMAGE: &str = "foxglove.RawImage";

pub(crate) struct Meta<'a> {
    pub trigger: Trigger,
    pub geometry: Geometry,
    pub frames: Frames,
    pub components: &'a [String],
    pub extra: &'a BTreeMap<String, String>,
    pub history: Duration,
    pub dropped: (u64, u64),
}

fn observation_schema() -> Value {
    json!({
        "title": SCHEMA_OBSERVATION,
        "type": "object",
        "description": "The observation an inference ran on (frames on /vla/camera/<i>, same MCAP sequence number)",
        "properties": {
            "seq": {"type": "integer", "description": "observation ring sequence number"},
            "writer_epoch": {"type": "integer"},
            "capture_ns": {"type": "integer", "description": "CLOCK_MONOTONIC capture time"},
            "seed": {"type": "string", "description": "the noise seed (u64, decimal: JSON numbers lose precision above 2^53)"},
            "instruction_id": {"type": "integer"},
            "state": {"type": "array", "items": {"type": "number"}},
            "chunk_id": {"type": "integer", "description": "the chunk computed from it; 0: the inference failed"},
            "frames": {"type": "string", "enum": ["off", "downscaled", "full"]}
        }
    })
}

fn chunk_schema() -> Value {
    json!({
        "title": SCHEMA_CHUNK,
        "type": "object",
        "properties": {
            "chunk_id": {"type": "integer", "description": "0: the inference failed"},
            "ok": {"type": "boolean"},
            "prefixed": {"type": "boolean", "description": "conditioned on the chunk in play (merge: prefix); not replayable"},
            "observation_seq": {"type": "integer"},
            "started_ns": {"type": "integer"},
            "done_ns": {"type": "integer"},
            "latency_ms": {"type": "object", "description": "total and per component", "additionalProperties": {"type": "number"}},
            "chunk_len": {"type": "integer"},
            "action_dims": {"type": "integer"},
            "actions": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
        }
    })
}

fn action_schema() -> Value {
    json!({
        "title": SCHEMA_ACTION,
        "type": "object",
        "properties": {
            "tick_ns": {"type": "integer"},
            "decision": {"type": "string", "enum": ["step", "hold_last", "hold", "fault"]},
            "step": {"type": "integer"},
            "status": {"type": "string", "enum": ["ok", "hold", "fault"]},
            "chunk_id": {"type": "integer"},
            "source_obs_seq": {"type": "integer"},
            "made_time_ns": {"type": "integer"},
            "valid_until_ns": {"type": "integer"},
            "robot_alive": {"type": "boolean"},
            "missed_ticks": {"type": "integer"},
            "values": {"type": "array", "items": {"type": "number"}}
        }
    })
}

/// Foxglove's `RawImage` as JSON Schema (bytes are base64 in JSON encoding).
fn raw_image_schema() -> Value {
    json!({
        "title": SCHEMA_RAW_IMAGE,
        "type": "object",
        "properties": {
            "timestamp": {"type": "object", "properties": {"sec": {"type": "integer"}, "nsec": {"type": "integer"}}},
            "frame_id": {"type": "string"},
            "width": {"type": "integer"},
            "height": {"type": "integer"},
            "encoding": {"type": "string"},
            "step": {"type": "integer"},
            "data": {"type": "string", "contentEncoding": "base64"}
        }
    })
}

pub(crate) fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if c.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if c.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

/// `CLOCK_REALTIME - CLOCK_MONOTONIC` now, to put monotonic times on the wall clock.
fn wall_offset_ns() -> i128 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    wall - i128::from(vla_ring::monotonic_ns())
}

/// `YYYYMMDDTHHMMSSZ` of a Unix time (civil-from-days, no time zone database).
fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[derive(Debug)]
pub(crate) enum WriteError {
    Io(PathBuf, std::io::Error),
    Mcap(mcap::McapError),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            WriteError::Mcap(e) => write!(f, "mcap: {e}"),
        }
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Named in the message: only its own causes come next.
            WriteError::Io(_, e) => e.source(),
            WriteError::Mcap(e) => e.source(),
        }
    }
}

impl From<mcap::McapError> for WriteError {
    fn from(e: mcap::McapError) -> Self {
        WriteError::Mcap(e)
    }
}

/// Writes the history newer than `from_ns` (monotonic) as one recording; returns its path
/// and size.
pub(crate) fn write_recording(
    r: &RecorderSettings,
    counter: u32,
    meta: &Meta<'_>,
    from_ns: u64,
    ticks: &History<TickRecord>,
    chunks: &History<ChunkRecord>,
) -> Result<(PathBuf, u64), WriteError> {
    let offset = wall_offset_ns();
    let now_wall = wall(offset, vla_ring::monotonic_ns());
    let name = format!(
        "vlad-{}-{counter:03}-{}.mcap",
        utc_stamp(now_wall / 1_000_000_000),
        meta.trigger.name()
    );
    let path = r.directory.join(&name);
    let tmp = r.directory.join(format!(".{name}.tmp"));
    let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    let mut w = mcap::WriteOptions::new()
        .compression(None)
        .profile("")
        .library(concat!("vlad ", env!("CARGO_PKG_VERSION")))
        .create(std::io::BufWriter::new(file))?;
    let channels = Channels::add(&mut w, meta)?;
    write_metadata(&mut w, meta)?;
    let mut out = Messages {
        w,
        offset,
        channels,
    };
    for (i, c) in chunks.iter().filter(|c| c.done_ns >= from_ns).enumerate() {
        out.chunk(i as u32 + 1, c, meta)?;
    }
    for (i, t) in ticks.iter().filter(|t| t.now_ns >= from_ns).enumerate() {
        out.tick(i as u32 + 1, t)?;
    }
    let bytes = finish(out.w, &tmp)?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    // The rename is durable once the directory is synced.
    if let Ok(d) = std::fs::File::open(&r.directory) {
        let _ = d.sync_all();
    }
    Ok((path, bytes))
}

type McapFile = mcap::Writer<std::io::BufWriter<std::fs::File>>;

fn io(p: &Path) -> impl FnOnce(std::io::Error) -> WriteError {
    let p = p.to_owned();
    move |e| WriteError::Io(p, e)
}

/// A monotonic time as wall-clock time, `offset` being wall minus monotonic.
fn wall(offset: i128, mono: u64) -> u64 {
    (i128::from(mono) + offset).max(0) as u64
}

/// The recording's channels, each with its schema.
struct Channels {
    observation: u16,
    chunk: u16,
    action: u16,
    /// One per camera, none when frames are off.
    cameras: Vec<u16>,
}

impl Channels {
    fn add(w: &mut McapFile, meta: &Meta<'_>) -> Result<Self, WriteError> {
        let no_meta = BTreeMap::new();
        let schema = |w: &mut McapFile, name: &str, v: Value| {
            w.add_schema(name, "jsonschema", v.to_string().as_bytes())
        };
        let s_obs = schema(w, SCHEMA_OBSERVATION, observation_schema())?;
        let s_chunk = schema(w, SCHEMA_CHUNK, chunk_schema())?;
        let s_action = schema(w, SCHEMA_ACTION, action_schema())?;
        let observation = w.add_channel(s_obs, "/vla/observation", "json", &no_meta)?;
        let chunk = w.add_channel(s_chunk, "/vla/chunk", "json", &no_meta)?;
        let action = w.add_channel(s_action, "/vla/action", "json", &no_meta)?;
        let mut cameras = Vec::new();
        if meta.frames != Frames::Off {
            let s_img = schema(w, SCHEMA_RAW_IMAGE, raw_image_schema())?;
            for cam in 0..meta.geometry.cameras {
                let topic = format!("/vla/camera/{cam}");
                cameras.push(w.add_channel(s_img, &topic, "json", &no_meta)?);
            }
        }
        Ok(Self {
            observation,
            chunk,
            action,
            cameras,
        })
    }
}

/// The recording's `vla.recording` metadata record: what was recorded and how.
fn write_metadata(w: &mut McapFile, meta: &Meta<'_>) -> Result<(), WriteError> {
    let g = meta.geometry;
    let mut md = meta.extra.clone();
    md.insert("trigger".into(), meta.trigger.name().into());
    md.insert("frames".into(), meta.frames.name().into());
    md.insert("downscale".into(), meta.frames.factor().to_string());
    md.insert("history_s".into(), meta.history.as_secs_f64().to_string());
    md.insert("dropped_ticks".into(), meta.dropped.0.to_string());
    md.insert("dropped_chunks".into(), meta.dropped.1.to_string());
    md.insert("components".into(), json!(meta.components).to_string());
    md.insert(
        "geometry".into(),
        json!({"cameras": g.cameras, "height": g.height, "width": g.width, "channels": g.channels,
               "state_dims": g.state_dims, "action_dims": g.action_dims, "chunk_len": g.chunk_len})
        .to_string(),
    );
    w.write_metadata(&mcap::records::Metadata {
        name: "vla.recording".into(),
        metadata: md,
    })?;
    Ok(())
}

/// The recording's messages, stamped with wall-clock times.
struct Messages {
    w: McapFile,
    offset: i128,
    channels: Channels,
}

impl Messages {
    fn put(&mut self, channel_id: u16, seq: u32, t: u64, v: &Value) -> Result<(), WriteError> {
        let t = wall(self.offset, t);
        self.w.write_to_known_channel(
            &mcap::records::MessageHeader {
                channel_id,
                sequence: seq,
                log_time: t,
                publish_time: t,
            },
            v.to_string().as_bytes(),
        )?;
        Ok(())
    }

    /// One inference: its observation, the observation's frames and the chunk.
    fn chunk(&mut self, seq: u32, c: &ChunkRecord, meta: &Meta<'_>) -> Result<(), WriteError> {
        let g = meta.geometry;
        self.put(
            self.channels.observation,
            seq,
            c.capture_ns,
            &json!({
                "seq": c.obs_seq, "writer_epoch": c.writer_epoch, "capture_ns": c.capture_ns,
                "seed": c.seed.to_string(), "instruction_id": c.instruction_id,
                "state": c.state, "chunk_id": c.chunk_id, "frames": meta.frames.name(),
            }),
        )?;
        let (fh, fw) = meta.frames.size(&g);
        let frame_len = fh as usize * fw as usize * g.channels as usize;
        let t = wall(self.offset, c.capture_ns);
        for cam in 0..self.channels.cameras.len() {
            let frame = &c.frames[cam * frame_len..(cam + 1) * frame_len];
            self.put(
                self.channels.cameras[cam],
                seq,
                c.capture_ns,
                &json!({
                    "timestamp": {"sec": t / 1_000_000_000, "nsec": t % 1_000_000_000},
                    "frame_id": format!("camera{cam}"),
                    "width": fw, "height": fh, "encoding": "rgb8",
                    "step": fw * g.channels,
                    "data": base64(frame),
                }),
            )?;
        }
        let mut latency = serde_json::Map::new();
        latency.insert(
            "total".into(),
            json!(c.done_ns.saturating_sub(c.started_ns) as f64 / 1e6),
        );
        for (name, ns) in meta.components.iter().zip(&c.components_ns[..c.components]) {
            latency.insert(name.clone(), json!(*ns as f64 / 1e6));
        }
        let actions: Vec<&[f32]> = if c.ok {
            c.actions.chunks((g.action_dims as usize).max(1)).collect()
        } else {
            Vec::new()
        };
        self.put(
            self.channels.chunk,
            seq,
            c.done_ns,
            &json!({
                "chunk_id": c.chunk_id, "ok": c.ok, "prefixed": c.prefixed,
                "observation_seq": c.obs_seq, "started_ns": c.started_ns, "done_ns": c.done_ns,
                "latency_ms": latency, "chunk_len": g.chunk_len, "action_dims": g.action_dims,
                "actions": actions,
            }),
        )
    }

    /// One publisher tick: what the robot was given.
    fn tick(&mut self, seq: u32, t: &TickRecord) -> Result<(), WriteError> {
        let status = match t.status {
            0 => "ok",
            1 => "hold",
            _ => "fault",
        };
        self.put(
            self.channels.action,
            seq,
            t.now_ns,
            &json!({
                "tick_ns": t.now_ns, "decision": decision_name(t.decision), "step": t.step,
                "status": status, "chunk_id": t.chunk_id, "source_obs_seq": t.source_obs_seq,
                "made_time_ns": t.made_time_ns, "valid_until_ns": t.valid_until_ns,
                "robot_alive": t.robot_alive, "missed_ticks": t.missed, "values": t.values,
            }),
        )
    }
}

/// Ends the MCAP file and makes it durable; returns its size.
fn finish(mut w: McapFile, tmp: &Path) -> Result<u64, WriteError> {
    w.finish()?;
    let mut file = w
        .into_inner()
        .into_inner()
        .map_err(|e| WriteError::Io(tmp.to_owned(), e.into_error()))?;
    file.flush().map_err(io(tmp))?;
    file.sync_all().map_err(io(tmp))?;
    Ok(file.metadata().map_err(io(tmp))?.len())
}

/// Removes the oldest recordings (`vlad-*.mcap`, by modification time) until the
/// directory's recordings total at most `max_bytes`; the newest is always kept.
pub(crate) fn enforce_cap(dir: &Path, max_bytes: u64) -> std::io::Result<()> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("vlad-") && name.ends_with(".mcap") {
            let m = e.metadata()?;
            files.push((m.modified()?, e.path(), m.len()));
        }
    }
    files.sort();
    let mut total: u64 = files.iter().map(|f| f.2).sum();
    for (_, path, len) in &files[..files.len().saturating_sub(1)] {
        if total <= max_bytes {
            break;
        }
        std::fs::remove_file(path)?;
        log::info!("flight recorder: removed {} (size cap)", path.display());
        total -= len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn utc_stamps_are_civil_dates() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_700_000_000), "20231114T221320Z");
    }
}
