//! A serde deserializer wrapper that remembers which field is being read, so that an
//! error from deep inside `serde-json-core` can be reported as `control.publish_hz`.
//!
//! `serde-json-core` reports bare errors ("Invalid type") without a position, and its own
//! error type can carry at most 64 bytes of message. So every layer here is wrapped: the
//! wrapper keeps the current path in a [`Tracker`], and errors raised by the schema's
//! visitors (unknown field, missing field, value out of bounds) are captured as a
//! structured [`TrackError`] in that tracker while the parser only sees a short
//! placeholder. On the way out each wrapper takes the stashed error back, so the caller
//! receives the structured error plus the path where it happened.
//!
//! Only `deserialize_str` is ever called on object keys: `serde-json-core`'s key
//! deserializer panics (`unreachable!`) on anything else.

use core::cell::RefCell;
use core::fmt::{self, Display};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json_core::de::Error as JsonError;

use crate::error::{bounded, Expected, FieldPath, Found, Snippet};

/// The short message handed to the parser in place of a stashed error. ASCII and under
/// 64 bytes: `serde-json-core` panics when a custom message does not fit.
const STASHED: &str = "see stashed config error";

/// An error in terms of the schema, captured while deserializing.
#[derive(Debug)]
pub(crate) enum TrackError {
    /// The parser itself failed; `expected` is what the innermost reader asked for.
    Parser {
        error: Option<JsonError>,
        message: Snippet,
        expected: &'static str,
    },
    UnknownField {
        allowed: &'static [&'static str],
    },
    MissingField(&'static str),
    DuplicateField(&'static str),
    Mismatch {
        expected: Expected,
        found: Found,
    },
    Custom(Expected),
}

impl Display for TrackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrackError::Parser { message, .. } => f.write_str(message),
            TrackError::UnknownField { .. } => f.write_str("unknown field"),
            TrackError::MissingField(name) => write!(f, "missing field {name}"),
            TrackError::DuplicateField(name) => write!(f, "duplicate field {name}"),
            TrackError::Mismatch { expected, found } => {
                write!(f, "expected {expected}, found {found}")
            }
            TrackError::Custom(message) => f.write_str(message),
        }
    }
}

impl de::StdError for TrackError {}

fn found_from(unexpected: de::Unexpected<'_>) -> Found {
    use de::Unexpected as U;
    match unexpected {
        U::Bool(value) => Found::Bool(value),
        U::Unsigned(value) => Found::Number(value as f64),
        U::Signed(value) => Found::Number(value as f64),
        U::Float(value) => Found::number(value),
        U::Str(value) => Found::text(value),
        U::Char(value) => Found::text(value.encode_utf8(&mut [0; 4])),
        U::Unit | U::Option => Found::Null,
        U::Seq => Found::Array,
        U::Map => Found::Object,
        other => Found::Other(bounded(format_args!("{other}"))),
    }
}

impl de::Error for TrackError {
    fn custom<T: Display>(message: T) -> Self {
        TrackError::Custom(bounded(format_args!("{message}")))
    }

    fn invalid_type(unexpected: de::Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        TrackError::Mismatch {
            expected: bounded(format_args!("{expected}")),
            found: found_from(unexpected),
        }
    }

    fn invalid_value(unexpected: de::Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        Self::invalid_type(unexpected, expected)
    }

    fn invalid_length(len: usize, expected: &dyn de::Expected) -> Self {
        TrackError::Mismatch {
            expected: bounded(format_args!("{expected}")),
            found: Found::Other(bounded(format_args!("length {len}"))),
        }
    }

    fn unknown_field(_field: &str, allowed: &'static [&'static str]) -> Self {
        // The key itself is already the last segment of the tracked path.
        TrackError::UnknownField { allowed }
    }

    fn missing_field(field: &'static str) -> Self {
        TrackError::MissingField(field)
    }

    fn duplicate_field(field: &'static str) -> Self {
        TrackError::DuplicateField(field)
    }
}

/// Recognises which parser error a generic `D::Error` is by comparing its text with the
/// text of each known variant (generic code cannot downcast it). `None` when the text is
/// not unique: the parser prints "Invalid JSON" for both a bad escape sequence and an
/// escaped string too long for the unescape buffer.
fn classify(error: &dyn Display) -> (Option<JsonError>, Snippet) {
    const KNOWN: [JsonError; 20] = [
        JsonError::AnyIsUnsupported,
        JsonError::BytesIsUnsupported,
        JsonError::EofWhileParsingList,
        JsonError::EofWhileParsingObject,
        JsonError::EofWhileParsingString,
        JsonError::EofWhileParsingNumber,
        JsonError::EofWhileParsingValue,
        JsonError::ExpectedColon,
        JsonError::ExpectedListCommaOrEnd,
        JsonError::ExpectedObjectCommaOrEnd,
        JsonError::ExpectedSomeIdent,
        JsonError::ExpectedSomeValue,
        JsonError::InvalidNumber,
        JsonError::InvalidType,
        JsonError::InvalidUnicodeCodePoint,
        JsonError::InvalidEscapeSequence,
        JsonError::EscapedStringIsTooLong,
        JsonError::KeyMustBeAString,
        JsonError::TrailingCharacters,
        JsonError::TrailingComma,
    ];
    // Long enough for every known message whole: several share their first 48 bytes.
    type Whole = heapless::String<160>;
    let message: Whole = bounded(format_args!("{error}"));
    let mut matching = KNOWN.into_iter().filter(|known| {
        let text: Whole = bounded(format_args!("{known}"));
        text == message
    });
    // Some variants share one text ("Invalid JSON"): then the variant stays unknown.
    let matched = match (matching.next(), matching.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    };
    (matched, bounded(format_args!("{message}")))
}

#[derive(Default)]
struct TrackState {
    path: FieldPath,
    stash: Option<TrackError>,
}

/// The shared state of one deserialization: the current path and a stashed error.
#[derive(Default)]
pub(crate) struct Tracker {
    state: RefCell<TrackState>,
}

impl Tracker {
    /// The path at which deserialization stopped (meaningful after an error).
    pub(crate) fn path(&self) -> FieldPath {
        self.state.borrow().path.clone()
    }

    fn depth(&self) -> usize {
        self.state.borrow().path.depth()
    }

    fn truncate(&self, depth: usize) {
        self.state.borrow_mut().path.truncate(depth);
    }

    fn enter_key(&self, depth: usize, key: &str) {
        let mut state = self.state.borrow_mut();
        state.path.truncate(depth);
        state.path.push_key(key);
    }

    fn enter_index(&self, depth: usize, index: usize) {
        let mut state = self.state.borrow_mut();
        state.path.truncate(depth);
        state.path.push_index(index);
    }

    /// Keeps `error` for the way out and gives the parser a placeholder to propagate.
    fn stash<E: de::Error>(&self, error: TrackError) -> E {
        self.state.borrow_mut().stash = Some(error);
        E::custom(STASHED)
    }

    /// Turns an error coming out of the parser back into the structured one.
    fn lift<E: Display>(&self, error: E, expected: &'static str) -> TrackError {
        if let Some(stashed) = self.state.borrow_mut().stash.take() {
            return stashed;
        }
        let (error, message) = classify(&error);
        TrackError::Parser {
            error,
            message,
            expected,
        }
    }
}

/// A deserializer that records the path of what it reads into `tracker`.
pub(crate) struct Tracked<'t, D> {
    pub(crate) inner: D,
    pub(crate) tracker: &'t Tracker,
}

struct Wrap<'t, V> {
    inner: V,
    tracker: &'t Tracker,
}

macro_rules! tracked_leaf {
    ($($method:ident => $expected:expr),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TrackError> {
            let tracker = self.tracker;
            self.inner
                .$method(Wrap { inner: visitor, tracker })
                .map_err(|e| tracker.lift(e, $expected))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Tracked<'_, D> {
    type Error = TrackError;

    tracked_leaf! {
        deserialize_any => "a value",
        deserialize_bool => "true or false",
        deserialize_i8 => "an integer",
        deserialize_i16 => "an integer",
        deserialize_i32 => "an integer",
        deserialize_i64 => "an integer",
        deserialize_u8 => "a non-negative integer",
        deserialize_u16 => "a non-negative integer",
        deserialize_u32 => "a non-negative integer",
        deserialize_u64 => "a non-negative integer",
        deserialize_f32 => "a number",
        deserialize_f64 => "a number",
        deserialize_char => "a string",
        deserialize_str => "a string",
        deserialize_string => "a string",
        deserialize_bytes => "a string",
        deserialize_byte_buf => "a string",
        deserialize_option => "a value or null",
        deserialize_unit => "null",
        deserialize_seq => "an array",
        deserialize_map => "an object",
        deserialize_identifier => "a field name",
        deserialize_ignored_any => "a value",
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TrackError> {
        let tracker = self.tracker;
        self.inner
            .deserialize_unit_struct(
                name,
                Wrap {
                    inner: visitor,
                    tracker,
                },
            )
            .map_err(|e| tracker.lift(e, "null"))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TrackError> {
        let tracker = self.tracker;
        self.inner
            .deserialize_newtype_struct(
                name,
                Wrap {
                    inner: visitor,
                    tracker,
                },
            )
            .map_err(|e| tracker.lift(e, "a value"))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, TrackError> {
        let tracker = self.tracker;
        self.inner
            .deserialize_tuple(
                len,
                Wrap {
                    inner: visitor,
                    tracker,
                },
            )
            .map_err(|e| tracker.lift(e, "an array"))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, TrackError> {
        let tracker = self.tracker;
        self.inner
            .deserialize_tuple_struct(
                name,
                len,
                Wrap {
                    inner: visitor,
                    tracker,
                },
            )
            .map_err(|e| tracker.lift(e, "an array"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TrackError> {
        let tracker = self.tracker;
        self.inner
            .deserialize_struct(
                name,
                fields,
                Wrap {
                    inner: visitor,
                    tracker,
                },
            )
            .map_err(|e| tracker.lift(e, "an object"))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TrackError> {
        let tracker = self.tracker;
        self.inner
            .deserialize_enum(
                name,
                variants,
                Wrap {
                    inner: visitor,
                    tracker,
                },
            )
            .map_err(|e| tracker.lift(e, "a string"))
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method<E: de::Error>(self, value: $ty) -> Result<V::Value, E> {
            let tracker = self.tracker;
            self.inner
                .$method::<TrackError>(value)
                .map_err(|e| tracker.stash(e))
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    forward_visit! {
        visit_bool(bool),
        visit_i8(i8),
        visit_i16(i16),
        visit_i32(i32),
        visit_i64(i64),
        visit_i128(i128),
        visit_u8(u8),
        visit_u16(u16),
        visit_u32(u32),
        visit_u64(u64),
        visit_u128(u128),
        visit_f32(f32),
        visit_f64(f64),
        visit_char(char),
        visit_str(&str),
        visit_borrowed_str(&'de str),
        visit_bytes(&[u8]),
        visit_borrowed_bytes(&'de [u8]),
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        let tracker = self.tracker;
        self.inner
            .visit_none::<TrackError>()
            .map_err(|e| tracker.stash(e))
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        let tracker = self.tracker;
        self.inner
            .visit_unit::<TrackError>()
            .map_err(|e| tracker.stash(e))
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        let tracker = self.tracker;
        self.inner
            .visit_some(Tracked {
                inner: deserializer,
                tracker,
            })
            .map_err(|e| tracker.stash(e))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<V::Value, D::Error> {
        let tracker = self.tracker;
        self.inner
            .visit_newtype_struct(Tracked {
                inner: deserializer,
                tracker,
            })
            .map_err(|e| tracker.stash(e))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        let tracker = self.tracker;
        let depth = tracker.depth();
        let value = self
            .inner
            .visit_seq(TrackedSeq {
                inner: seq,
                tracker,
                depth,
                next_index: 0,
            })
            .map_err(|e| tracker.stash(e))?;
        tracker.truncate(depth);
        Ok(value)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let tracker = self.tracker;
        let depth = tracker.depth();
        let value = self
            .inner
            .visit_map(TrackedMap {
                inner: map,
                tracker,
                depth,
            })
            .map_err(|e| tracker.stash(e))?;
        tracker.truncate(depth);
        Ok(value)
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _data: A) -> Result<V::Value, A::Error> {
        // The schema has no enums; refuse without building a long parser message.
        Err(self.tracker.stash(TrackError::Mismatch {
            expected: bounded(format_args!("{}", Expecting(&self.inner))),
            found: Found::Other(bounded(format_args!("an enum"))),
        }))
    }
}

/// Displays what a visitor expects.
struct Expecting<'a, V>(&'a V);

impl<'de, V: Visitor<'de>> Display for Expecting<'_, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }
}

struct TrackedMap<'t, A> {
    inner: A,
    tracker: &'t Tracker,
    /// Path depth of the object itself; its keys live one level below.
    depth: usize,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for TrackedMap<'_, A> {
    type Error = TrackError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, TrackError> {
        let tracker = self.tracker;
        let key = self
            .inner
            .next_key_seed(KeySeed {
                inner: seed,
                tracker,
                depth: self.depth,
            })
            .map_err(|e| tracker.lift(e, "a field name"))?;
        if key.is_none() {
            // Missing-field errors come after the last key: report them on the object.
            tracker.truncate(self.depth);
        }
        Ok(key)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, TrackError> {
        let tracker = self.tracker;
        self.inner
            .next_value_seed(ValueSeed {
                inner: seed,
                tracker,
            })
            .map_err(|e| tracker.lift(e, "a value"))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

struct TrackedSeq<'t, A> {
    inner: A,
    tracker: &'t Tracker,
    depth: usize,
    next_index: usize,
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for TrackedSeq<'_, A> {
    type Error = TrackError;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, TrackError> {
        let tracker = self.tracker;
        tracker.enter_index(self.depth, self.next_index);
        self.next_index += 1;
        let element = self
            .inner
            .next_element_seed(ValueSeed {
                inner: seed,
                tracker,
            })
            .map_err(|e| tracker.lift(e, "a value"))?;
        // Once an element is read, whatever fails next (a bound on the list, a missing
        // comma) is about the array itself.
        tracker.truncate(self.depth);
        Ok(element)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

struct ValueSeed<'t, S> {
    inner: S,
    tracker: &'t Tracker,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for ValueSeed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        let tracker = self.tracker;
        self.inner
            .deserialize(Tracked {
                inner: deserializer,
                tracker,
            })
            .map_err(|e| tracker.stash(e))
    }
}

struct KeySeed<'t, S> {
    inner: S,
    tracker: &'t Tracker,
    depth: usize,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        let tracker = self.tracker;
        self.inner
            .deserialize(KeyDeserializer {
                inner: deserializer,
                tracker,
                depth: self.depth,
            })
            .map_err(|e| tracker.stash(e))
    }
}

/// Reads an object key, always as a string (see the module doc), and records it.
struct KeyDeserializer<'t, D> {
    inner: D,
    tracker: &'t Tracker,
    depth: usize,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for KeyDeserializer<'_, D> {
    type Error = TrackError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TrackError> {
        let tracker = self.tracker;
        self.inner
            .deserialize_str(KeyVisitor {
                inner: visitor,
                tracker,
                depth: self.depth,
            })
            .map_err(|e| tracker.lift(e, "a field name"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

struct KeyVisitor<'t, V> {
    inner: V,
    tracker: &'t Tracker,
    depth: usize,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for KeyVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<V::Value, E> {
        let tracker = self.tracker;
        tracker.enter_key(self.depth, key);
        self.inner
            .visit_str::<TrackError>(key)
            .map_err(|e| tracker.stash(e))
    }

    fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<V::Value, E> {
        let tracker = self.tracker;
        tracker.enter_key(self.depth, key);
        self.inner
            .visit_borrowed_str::<TrackError>(key)
            .map_err(|e| tracker.stash(e))
    }
}
