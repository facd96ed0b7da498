//! The JSON shape of the configuration, as serde reads it, before any rule is checked.
//!
//! Numbers are read as `f64` so that `20.5` in a millisecond field or `-1` in a priority
//! reaches the validation pass and gets a message with the value, instead of a bare
//! parser error. Strings and lists are bounded here, with their own messages; every
//! object rejects unknown keys.

use core::fmt;
use core::marker::PhantomData;

use serde::de::{self, Deserializer, SeqAccess, Unexpected, Visitor};
use serde::Deserialize;

use crate::error::bounded;

/// A string of at most `N` bytes.
#[derive(Debug)]
pub(crate) struct Text<const N: usize>(pub(crate) heapless::String<N>);

impl<'de, const N: usize> Deserialize<'de> for Text<N> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor<const N: usize>;

        impl<const N: usize> Visitor<'_> for TextVisitor<N> {
            type Value = Text<N>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a string of at most {N} bytes")
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<Text<N>, E> {
                let mut text = heapless::String::new();
                if text.push_str(value).is_err() {
                    let found: heapless::String<48> =
                        bounded(format_args!("a string of {} bytes", value.len()));
                    return Err(E::invalid_value(Unexpected::Other(&found), &self));
                }
                Ok(Text(text))
            }
        }

        deserializer.deserialize_str(TextVisitor::<N>)
    }
}

/// A JSON array of at most `N` items.
#[derive(Debug)]
pub(crate) struct List<T, const N: usize>(pub(crate) heapless::Vec<T, N>);

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for List<T, N> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor<T, const N: usize>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for ListVisitor<T, N> {
            type Value = List<T, N>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an array of at most {N} items")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<List<T, N>, A::Error> {
                let mut items = heapless::Vec::new();
                while let Some(item) = seq.next_element::<T>()? {
                    if items.push(item).is_err() {
                        // Not counting the rest: skipping arbitrary values can recurse deeply.
                        let found: heapless::String<48> =
                            bounded(format_args!("an array of more than {N} items"));
                        return Err(de::Error::invalid_value(Unexpected::Other(&found), &self));
                    }
                }
                Ok(List(items))
            }
        }

        deserializer.deserialize_seq(ListVisitor::<T, N>(PhantomData))
    }
}

pub(crate) type PathText = Text<{ crate::MAX_PATH_BYTES }>;
pub(crate) type NameText = Text<{ crate::MAX_NAME_BYTES }>;
/// Far longer than any accepted word, so a wrong word is reported with the list of
/// accepted ones rather than as an over-long string.
pub(crate) type WordText = Text<64>;
/// Room for one hex-encoded key and a little more, so a 65-character key is reported by
/// the key check (with its length) rather than by the string bound.
pub(crate) type KeyText = Text<128>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub qnn: RawQnn,
    pub bundle: RawBundle,
    pub rings: RawRings,
    pub control: RawControl,
    pub realtime: RawRealtime,
    pub systemd: RawSystemd,
    pub ota: RawOta,
    pub log: RawLog,
    /// Absent or `null`: no flight recorder.
    pub recorder: Option<RawRecorder>,
    /// Absent or `null`: no metrics textfile.
    pub metrics: Option<RawMetrics>,
    /// Absent or `null`: the NPU defaults (`auto` placement under the default budget,
    /// `auto` shared buffers).
    pub npu: Option<RawNpu>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQnn {
    pub lib_dir: PathText,
    pub backend_lib: NameText,
    pub system_lib: NameText,
    pub log_level: WordText,
    pub performance: Option<WordText>,
    pub performance_idle_release_ms: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBundle {
    pub path: PathText,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRings {
    pub observation_path: PathText,
    pub action_path: PathText,
    pub action_slots: f64,
    pub instruction_path: Option<PathText>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawControl {
    pub publish_hz: f64,
    pub max_observation_age_ms: f64,
    pub max_chunk_age_ms: f64,
    pub hold_after_chunk_end_ms: f64,
    pub action_valid_ms: f64,
    pub writer_heartbeat_timeout_ms: f64,
    /// Absent and `null` mean the defaults (skip, back to back, no time base, none).
    pub merge: Option<WordText>,
    pub trigger: Option<WordText>,
    pub trigger_margin_steps: Option<f64>,
    pub execute_steps: Option<f64>,
    pub chunk_rate_hz: Option<f64>,
    pub extra_latency_ms: Option<f64>,
    /// Absent and `null` mean false.
    pub emulator_age_limits: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRealtime {
    pub publisher_priority: f64,
    pub inference_priority: f64,
    /// Absent and `null` both mean "not pinned".
    pub publisher_cpu: Option<f64>,
    pub inference_cpus: Option<List<f64, { crate::MAX_INFERENCE_CPUS }>>,
    pub mlockall: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSystemd {
    pub notify: bool,
    pub watchdog: bool,
    /// Absent: 30000.
    pub inference_deadline_ms: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOta {
    pub root: PathText,
    pub trusted_keys: List<KeyText, { crate::MAX_TRUSTED_KEYS }>,
    pub signature_threshold: Option<f64>,
    pub root_keys: Option<List<KeyText, { crate::MAX_TRUSTED_KEYS }>>,
    pub trial_inferences: f64,
    pub max_trial_starts: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLog {
    pub level: WordText,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRecorder {
    pub directory: PathText,
    pub history_s: Option<f64>,
    pub max_chunks: Option<f64>,
    pub frames: Option<WordText>,
    pub downscale: Option<f64>,
    pub max_mb: Option<f64>,
    pub on_fault: Option<bool>,
    pub hold_limit_ms: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    pub textfile: PathText,
    pub interval_ms: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNpu {
    pub placement: Option<WordText>,
    pub groups: Option<List<RawNpuGroup, { crate::MAX_NPU_GROUPS }>>,
    pub session_mb: Option<f64>,
    pub reserve_mb: Option<f64>,
    pub shared_buffers: Option<WordText>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNpuGroup {
    pub nsp: f64,
    pub contexts: List<NameText, { crate::MAX_NPU_GROUP_CONTEXTS }>,
}
