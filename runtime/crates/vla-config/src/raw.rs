//! The JSON shape of the configuration, as serde reads it, before any rule is checked,
//! and the value types that keep the path of what is being read (see [`crate::read`]).
//!
//! Numbers are read as `f64` so that `20.5` in a millisecond field or `-1` in a priority
//! reaches the validation pass and gets a message with the value, instead of a bare
//! parser error. Strings and lists are bounded here, with their own messages; every
//! object rejects unknown keys and is read through [`Section`], which enters each key
//! into the path; [`List`] enters each index. Each value type notes what it expects
//! before the parser reads it, for the message when the parser refuses the value: a new
//! field is a [`Number`], [`Flag`], [`Text`], [`List`] or [`Section`], never a bare
//! `f64` or `bool` (whose wrong value would be reported as "expected a value").

use core::fmt;
use core::marker::PhantomData;

use serde::de::value::StrDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::error::{bounded, Expected, Found};
use crate::read;

/// A JSON number; the parser reads `null` here as NaN, which validation reports as `null`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Number(pub(crate) f64);

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        read::expecting("a number");
        f64::deserialize(deserializer).map(Number)
    }
}

/// `true` or `false`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Flag(pub(crate) bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        read::expecting("true or false");
        bool::deserialize(deserializer).map(Flag)
    }
}

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
                    return Err(read::invalid(
                        format_args!("a string of at most {N} bytes"),
                        Found::Other(bounded(format_args!("a string of {} bytes", value.len()))),
                    ));
                }
                Ok(Text(text))
            }
        }

        read::expecting("a string");
        deserializer.deserialize_str(TextVisitor::<N>)
    }
}

/// A JSON array of at most `N` items, each item's index in the path while it is read.
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
                let depth = read::depth();
                let mut items = heapless::Vec::new();
                for index in 0.. {
                    read::enter_index(depth, index);
                    read::expecting("a value");
                    let item = seq.next_element::<T>()?;
                    // Once an item is read, whatever fails next (the bound, a missing
                    // comma) is about the array itself.
                    read::truncate(depth);
                    let Some(item) = item else { break };
                    if items.push(item).is_err() {
                        // Not counting the rest: skipping arbitrary values can recurse deeply.
                        return Err(read::invalid(
                            format_args!("an array of at most {N} items"),
                            Found::Other(bounded(format_args!("an array of more than {N} items"))),
                        ));
                    }
                }
                Ok(List(items))
            }
        }

        read::expecting("an array");
        deserializer.deserialize_seq(ListVisitor::<T, N>(PhantomData))
    }
}

/// A JSON object read into the derived struct `T`, each key entered into the path.
#[derive(Debug)]
pub(crate) struct Section<T>(pub(crate) T);

impl<T> core::ops::Deref for Section<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Section<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SectionVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for SectionVisitor<T> {
            type Value = Section<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Section<T>, A::Error> {
                let depth = read::depth();
                let value = T::deserialize(Keys { map, depth }).map_err(SchemaError::lift)?;
                read::truncate(depth);
                Ok(Section(value))
            }
        }

        read::expecting("an object");
        deserializer.deserialize_map(SectionVisitor(PhantomData))
    }
}

/// An error inside an object: the parser's own, or one of the derived struct's, kept
/// whole here because the parser's error type holds at most 64 bytes of message (and
/// panics on more).
#[derive(Debug)]
pub(crate) enum SchemaError<E> {
    Parser(E),
    UnknownField(&'static [&'static str]),
    MissingField(&'static str),
    DuplicateField(&'static str),
    Custom(Expected),
}

impl<E: de::Error> SchemaError<E> {
    /// Back into the parser's error type, the schema's errors left with [`read`].
    fn lift(self) -> E {
        match self {
            SchemaError::Parser(error) => error,
            SchemaError::UnknownField(allowed) => read::unknown_field(allowed),
            SchemaError::MissingField(name) => read::missing_field(name),
            SchemaError::DuplicateField(_) => read::duplicate_field(),
            SchemaError::Custom(message) => read::custom(message),
        }
    }
}

impl<E: fmt::Display> fmt::Display for SchemaError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::Parser(error) => error.fmt(f),
            SchemaError::UnknownField(_) => f.write_str("unknown field"),
            SchemaError::MissingField(name) => write!(f, "missing field {name}"),
            SchemaError::DuplicateField(name) => write!(f, "duplicate field {name}"),
            SchemaError::Custom(message) => f.write_str(message),
        }
    }
}

impl<E: de::Error> de::StdError for SchemaError<E> {}

impl<E: de::Error> de::Error for SchemaError<E> {
    fn custom<T: fmt::Display>(message: T) -> Self {
        SchemaError::Custom(bounded(format_args!("{message}")))
    }

    fn unknown_field(_field: &str, allowed: &'static [&'static str]) -> Self {
        // The key itself is already the last segment of the path.
        SchemaError::UnknownField(allowed)
    }

    fn missing_field(field: &'static str) -> Self {
        SchemaError::MissingField(field)
    }

    fn duplicate_field(field: &'static str) -> Self {
        SchemaError::DuplicateField(field)
    }
}

/// Hands an object to a derived struct key by key, entering each key into the path.
struct Keys<A> {
    map: A,
    /// Path depth of the object itself; its keys live one level below.
    depth: usize,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for Keys<A> {
    type Error = SchemaError<A::Error>;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_map(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Keys<A> {
    type Error = SchemaError<A::Error>;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        read::expecting("a field name");
        let key = self.map.next_key_seed(Key {
            seed,
            depth: self.depth,
        });
        let key = key.map_err(SchemaError::Parser)?;
        if key.is_none() {
            // Missing-field errors come after the last key: report them on the object.
            read::truncate(self.depth);
        }
        Ok(key)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, Self::Error> {
        read::expecting("a value");
        self.map.next_value_seed(seed).map_err(SchemaError::Parser)
    }
}

/// Reads one key (always as a string: the parser's key reader panics on anything else),
/// enters it into the path, and hands it to the derived struct's field seed.
struct Key<S> {
    seed: S,
    depth: usize,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Key<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for Key<S> {
    type Value = S::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<S::Value, E> {
        read::enter_key(self.depth, key);
        self.seed
            .deserialize(StrDeserializer::<SchemaError<E>>::new(key))
            .map_err(SchemaError::lift)
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
    pub qnn: Section<RawQnn>,
    pub bundle: Section<RawBundle>,
    pub rings: Section<RawRings>,
    pub control: Section<RawControl>,
    pub realtime: Section<RawRealtime>,
    pub systemd: Section<RawSystemd>,
    pub ota: Section<RawOta>,
    pub log: Section<RawLog>,
    /// Absent or `null`: no flight recorder.
    pub recorder: Option<Section<RawRecorder>>,
    /// Absent or `null`: no metrics textfile.
    pub metrics: Option<Section<RawMetrics>>,
    /// Absent or `null`: the NPU defaults (`auto` placement under the default budget,
    /// `auto` shared buffers).
    pub npu: Option<Section<RawNpu>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQnn {
    pub lib_dir: PathText,
    pub backend_lib: NameText,
    pub system_lib: NameText,
    pub log_level: WordText,
    pub performance: Option<WordText>,
    pub performance_idle_release_ms: Option<Number>,
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
    pub action_slots: Number,
    pub instruction_path: Option<PathText>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawControl {
    pub publish_hz: Number,
    pub max_observation_age_ms: Number,
    pub max_chunk_age_ms: Number,
    pub hold_after_chunk_end_ms: Number,
    pub action_valid_ms: Number,
    pub writer_heartbeat_timeout_ms: Number,
    /// Absent and `null` mean the defaults (skip, back to back, no time base, none).
    pub merge: Option<WordText>,
    pub trigger: Option<WordText>,
    pub trigger_margin_steps: Option<Number>,
    pub execute_steps: Option<Number>,
    pub chunk_rate_hz: Option<Number>,
    pub extra_latency_ms: Option<Number>,
    /// Absent and `null` mean false.
    pub emulator_age_limits: Option<Flag>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRealtime {
    pub publisher_priority: Number,
    pub inference_priority: Number,
    /// Absent and `null` both mean "not pinned".
    pub publisher_cpu: Option<Number>,
    pub inference_cpus: Option<List<Number, { crate::MAX_INFERENCE_CPUS }>>,
    pub mlockall: Flag,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSystemd {
    pub notify: Flag,
    pub watchdog: Flag,
    /// Absent: 30000.
    pub inference_deadline_ms: Option<Number>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOta {
    pub root: PathText,
    pub trusted_keys: List<KeyText, { crate::MAX_TRUSTED_KEYS }>,
    pub signature_threshold: Option<Number>,
    pub root_keys: Option<List<KeyText, { crate::MAX_TRUSTED_KEYS }>>,
    pub trial_inferences: Number,
    pub max_trial_starts: Number,
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
    pub history_s: Option<Number>,
    pub max_chunks: Option<Number>,
    pub frames: Option<WordText>,
    pub downscale: Option<Number>,
    pub max_mb: Option<Number>,
    pub on_fault: Option<Flag>,
    pub hold_limit_ms: Option<Number>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    pub textfile: PathText,
    pub interval_ms: Option<Number>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNpu {
    pub placement: Option<WordText>,
    pub groups: Option<List<Section<RawNpuGroup>, { crate::MAX_NPU_GROUPS }>>,
    pub session_mb: Option<Number>,
    pub reserve_mb: Option<Number>,
    pub shared_buffers: Option<WordText>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNpuGroup {
    pub nsp: Number,
    pub contexts: List<NameText, { crate::MAX_NPU_GROUP_CONTEXTS }>,
}
