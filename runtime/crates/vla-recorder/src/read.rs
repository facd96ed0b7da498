//! Reading a recording back (for `vlad replay` and tests): the observations with their
//! full frames, and the chunks computed from them.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Why a recording could not be read back; each names the file.
#[derive(Debug)]
#[non_exhaustive]
pub enum RecordingError {
    /// The file could not be opened or read.
    Io {
        /// The recording file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is not a valid MCAP file.
    Mcap {
        /// The recording file.
        path: PathBuf,
        /// The MCAP reader's error.
        source: mcap::McapError,
    },
    /// A valid MCAP file without vlad's `vla.recording` metadata.
    NotARecording {
        /// The recording file.
        path: PathBuf,
    },
    /// A message whose payload is not the JSON vlad writes.
    Message {
        /// The recording file.
        path: PathBuf,
        /// The channel the message is on.
        topic: String,
        /// The message's MCAP sequence number.
        sequence: u32,
        /// The JSON parser's error.
        source: serde_json::Error,
    },
    /// A camera message whose frame is not valid base64.
    Frame {
        /// The recording file.
        path: PathBuf,
        /// The camera channel, `/vla/camera/<i>`.
        topic: String,
        /// The message's MCAP sequence number.
        sequence: u32,
        /// What is wrong with the base64.
        reason: String,
    },
    /// A chunk without the observation it was computed from.
    MissingObservation {
        /// The recording file.
        path: PathBuf,
        /// The chunk message's MCAP sequence number (its observation shares it).
        chunk: u32,
    },
    /// An observation without its noise seed (it cannot be run again).
    MissingSeed {
        /// The recording file.
        path: PathBuf,
        /// The observation message's MCAP sequence number.
        observation: u32,
    },
}

impl std::fmt::Display for RecordingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordingError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            RecordingError::Mcap { path, source } => {
                write!(f, "{}: not a valid MCAP file: {source}", path.display())
            }
            RecordingError::NotARecording { path } => write!(
                f,
                "{}: no vla.recording metadata: not a vlad recording",
                path.display()
            ),
            RecordingError::Message {
                path,
                topic,
                sequence,
                source,
            } => write!(
                f,
                "{}: {topic} message {sequence}: {source}",
                path.display()
            ),
            RecordingError::Frame {
                path,
                topic,
                sequence,
                reason,
            } => write!(
                f,
                "{}: {topic} message {sequence}: {reason}",
                path.display()
            ),
            RecordingError::MissingObservation { path, chunk } => {
                write!(f, "{}: chunk {chunk} has no observation", path.display())
            }
            RecordingError::MissingSeed { path, observation } => {
                write!(
                    f,
                    "{}: observation {observation} has no seed",
                    path.display()
                )
            }
        }
    }
}

// Each message names its cause, so `source()` hands out only that cause's own causes.
impl std::error::Error for RecordingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RecordingError::Io { source, .. } => source.source(),
            RecordingError::Mcap { source, .. } => source.source(),
            RecordingError::Message { source, .. } => source.source(),
            _ => None,
        }
    }
}

/// One recorded inference, with what is needed to run it again.
#[derive(Clone, Debug)]
pub struct RecordedChunk {
    /// The loop's id of the chunk; 0 when the inference failed.
    pub chunk_id: u64,
    /// Whether the inference succeeded; `actions` is empty otherwise.
    pub ok: bool,
    /// Conditioned on the chunk in play (`merge: prefix`/`inpaint`): not replayable from the
    /// observation alone.
    pub prefixed: bool,
    /// Seq of the observation in its ring.
    pub observation_seq: u64,
    /// The sampling seed the inference ran with.
    pub seed: u64,
    /// Index of the instruction (prompt) the robot followed.
    pub instruction_id: u32,
    /// The robot state (`state_dims` f32) the inference saw.
    pub state: Vec<f32>,
    /// Every camera's frame one after another (HWC), as recorded.
    pub frames: Vec<u8>,
    /// The chunk's actions, `chunk_len x action_dims` row-major; empty when not `ok`.
    pub actions: Vec<f32>,
    /// Inference start to chunk ready, in ms.
    pub latency_ms: f64,
}

/// A whole recording.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    /// The `vla.recording` metadata.
    pub metadata: BTreeMap<String, String>,
    /// The recorded inferences, in recording order.
    pub chunks: Vec<RecordedChunk>,
    /// Number of `/vla/action` messages (published ticks).
    pub actions: usize,
    /// Action messages by decision (`step`, `hold_last`, `hold`, `fault`).
    pub decisions: BTreeMap<String, usize>,
}

fn base64_decode(s: &str) -> Result<Vec<u8>, String> {
    let val = |c: u8| -> Result<u32, String> {
        Ok(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return Err(format!("bad base64 byte {c:#x}")),
        } as u32)
    };
    let b = s.as_bytes();
    if b.len() % 4 != 0 {
        return Err("base64 length is not a multiple of 4".into());
    }
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for q in b.chunks(4) {
        let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
        let mut n = 0u32;
        for &c in &q[..4 - pad] {
            n = n << 6 | val(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Ok(out)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_f64)
                .map(|x| x as f32)
                .collect()
        })
        .unwrap_or_default()
}

/// Reads and checks a recording: every observation's camera frames and chunk present.
pub fn read_recording(path: &Path) -> Result<Recording, RecordingError> {
    let bytes = std::fs::read(path).map_err(|source| RecordingError::Io {
        path: path.to_owned(),
        source,
    })?;
    let err = |source: mcap::McapError| RecordingError::Mcap {
        path: path.to_owned(),
        source,
    };
    let mut rec = Recording::default();
    for m in mcap::read::LinearReader::new(&bytes).map_err(err)? {
        if let mcap::records::Record::Metadata(md) = m.map_err(err)? {
            if md.name == "vla.recording" {
                rec.metadata = md.metadata;
            }
        }
    }
    if rec.metadata.is_empty() {
        return Err(RecordingError::NotARecording {
            path: path.to_owned(),
        });
    }
    // By MCAP sequence number (one per observation): observation, camera frames, chunk.
    let mut obs: HashMap<u32, Value> = HashMap::new();
    let mut cams: HashMap<u32, BTreeMap<String, Vec<u8>>> = HashMap::new();
    let mut chunks: Vec<(u32, Value)> = Vec::new();
    for m in mcap::MessageStream::new(&bytes).map_err(err)? {
        let m = m.map_err(err)?;
        let topic = m.channel.topic.as_str();
        let v: Value =
            serde_json::from_slice(&m.data).map_err(|source| RecordingError::Message {
                path: path.to_owned(),
                topic: topic.to_owned(),
                sequence: m.sequence,
                source,
            })?;
        match topic {
            "/vla/observation" => {
                obs.insert(m.sequence, v);
            }
            "/vla/chunk" => chunks.push((m.sequence, v)),
            "/vla/action" => {
                rec.actions += 1;
                let d = v["decision"].as_str().unwrap_or("?").to_owned();
                *rec.decisions.entry(d).or_default() += 1;
            }
            t if t.starts_with("/vla/camera/") => {
                let data = base64_decode(v["data"].as_str().unwrap_or("")).map_err(|reason| {
                    RecordingError::Frame {
                        path: path.to_owned(),
                        topic: t.to_owned(),
                        sequence: m.sequence,
                        reason,
                    }
                })?;
                cams.entry(m.sequence)
                    .or_default()
                    .insert(t.to_owned(), data);
            }
            _ => {}
        }
    }
    for (seq, c) in chunks {
        let o = obs
            .get(&seq)
            .ok_or_else(|| RecordingError::MissingObservation {
                path: path.to_owned(),
                chunk: seq,
            })?;
        let mut frames = Vec::new();
        if let Some(by_topic) = cams.get(&seq) {
            // BTreeMap: /vla/camera/0, /vla/camera/1, ... in order (fewer than 10 cameras).
            for f in by_topic.values() {
                frames.extend_from_slice(f);
            }
        }
        rec.chunks.push(RecordedChunk {
            chunk_id: c["chunk_id"].as_u64().unwrap_or(0),
            ok: c["ok"].as_bool().unwrap_or(false),
            prefixed: c["prefixed"].as_bool().unwrap_or(false),
            observation_seq: o["seq"].as_u64().unwrap_or(0),
            seed: o["seed"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| RecordingError::MissingSeed {
                    path: path.to_owned(),
                    observation: seq,
                })?,
            instruction_id: o["instruction_id"].as_u64().unwrap_or(0) as u32,
            state: floats(&o["state"]),
            frames,
            actions: c["actions"]
                .as_array()
                .map(|rows| rows.iter().flat_map(floats).collect())
                .unwrap_or_default(),
            latency_ms: c["latency_ms"]["total"].as_f64().unwrap_or(0.0),
        });
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_round_trips() {
        for n in 0..10u8 {
            let data: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37)).collect();
            assert_eq!(
                super::base64_decode(&crate::mcap_out::base64(&data)).unwrap(),
                data
            );
        }
    }
}
