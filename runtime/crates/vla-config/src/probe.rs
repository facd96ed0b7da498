//! Describes the value at a path after the parser rejected it with a bare "invalid type".
//!
//! `serde-json-core` cannot parse "any" value and reports type mismatches before looking
//! at the value, so to say what was *found* the document is walked again to the failing
//! path once per JSON kind until one reading succeeds. This runs only on the error path.
//! Objects and arrays are recognised by their opening bracket alone (the walk stops
//! there), so a deeply nested value cannot drive the walk into deep recursion.

use core::cell::Cell;
use core::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::error::{FieldPath, Found, Segment};

#[derive(Clone, Copy)]
enum Kind {
    Text,
    Bool,
    Null,
    Object,
    Array,
    Number,
}

/// What was at `path` in `json`; [`Found::Malformed`] when no JSON reading fits.
pub(crate) fn describe(json: &[u8], path: &FieldPath) -> Found {
    // Null before Number: the parser reads `null` as NaN for float fields.
    const KINDS: [Kind; 6] = [
        Kind::Text,
        Kind::Bool,
        Kind::Null,
        Kind::Object,
        Kind::Array,
        Kind::Number,
    ];
    for kind in KINDS {
        let mut unescape = [0u8; crate::UNESCAPE_BYTES];
        let mut deserializer = serde_json_core::de::Deserializer::new(json, Some(&mut unescape));
        let found = Cell::new(None);
        // The walk is abandoned as soon as the leaf is read; its result is in `found`.
        let _ = Walk {
            rest: path.segments(),
            kind,
            found: &found,
        }
        .deserialize(&mut deserializer);
        if let Some(found) = found.take() {
            return found;
        }
    }
    Found::Malformed
}

/// Message for abandoning a walk: ASCII and short, as the parser requires.
const DONE: &str = "probe done";

struct Walk<'p> {
    rest: &'p [Segment],
    kind: Kind,
    found: &'p Cell<Option<Found>>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        let leaf = Leaf { found: self.found };
        match self.rest.split_first() {
            None => match self.kind {
                Kind::Text => deserializer.deserialize_str(leaf),
                Kind::Bool => deserializer.deserialize_bool(leaf),
                Kind::Null => deserializer.deserialize_unit(leaf),
                Kind::Object => deserializer.deserialize_map(leaf),
                Kind::Array => deserializer.deserialize_seq(leaf),
                Kind::Number => deserializer.deserialize_f64(leaf),
            },
            Some((Segment::Key(key), rest)) => deserializer.deserialize_map(IntoKey {
                key,
                next: Walk { rest, ..self },
            }),
            Some((Segment::Index(index), rest)) => deserializer.deserialize_seq(IntoIndex {
                index: *index,
                next: Walk { rest, ..self },
            }),
        }
    }
}

struct Leaf<'p> {
    found: &'p Cell<Option<Found>>,
}

impl Leaf<'_> {
    fn done<E: de::Error>(self, found: Found) -> Result<(), E> {
        self.found.set(Some(found));
        Ok(())
    }
}

impl<'de> Visitor<'de> for Leaf<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<(), E> {
        self.done(Found::Bool(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<(), E> {
        self.done(Found::number(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<(), E> {
        self.done(Found::text(value))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.done(Found::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<(), A::Error> {
        self.found.set(Some(Found::Array));
        Err(de::Error::custom(DONE))
    }

    fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<(), A::Error> {
        self.found.set(Some(Found::Object));
        Err(de::Error::custom(DONE))
    }
}

struct IntoKey<'p> {
    key: &'p str,
    next: Walk<'p>,
}

impl<'de> Visitor<'de> for IntoKey<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(matches) = map.next_key_seed(KeyIs(self.key))? {
            if matches {
                map.next_value_seed(self.next)?;
                // Stop here: the rest of the document does not matter.
                return Err(de::Error::custom(DONE));
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

struct IntoIndex<'p> {
    index: usize,
    next: Walk<'p>,
}

impl<'de> Visitor<'de> for IntoIndex<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        for _ in 0..self.index {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        seq.next_element_seed(self.next)?;
        Err(de::Error::custom(DONE))
    }
}

struct KeyIs<'p>(&'p str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        // Keys are only ever read as strings (the parser's key reader supports no more).
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}
