//! Reading the configuration with `serde-json-core`, and turning a failed read into a
//! [`ConfigError`] that names the field.
//!
//! The parser's errors are bare ("Invalid type"), with no position and at most 64 bytes
//! of message. So the schema's objects and arrays ([`Section`], [`crate::raw::List`])
//! keep the path of the value being read here, each value notes what it expects, and an
//! error of the schema's own (unknown field, a bound) is left here whole while the parser
//! carries a short placeholder out. [`parse`] builds the one-line error from that. The
//! state belongs to the thread and is reset by each [`parse`].

use core::cell::RefCell;
use core::fmt;

use serde::de::{self, Deserialize};
use serde_json_core::de::Error as JsonError;

use crate::error::{bounded, ConfigError, Expected, FieldPath, Found, Origin};
use crate::raw::{RawConfig, Section};

std::thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

#[derive(Default)]
struct State {
    /// The value being read.
    path: FieldPath,
    /// What the value being read should be, for when the parser refuses it.
    expected: &'static str,
    /// An error of the schema's own, already with its path.
    refused: Option<ConfigError>,
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|state| f(&mut state.borrow_mut()))
}

/// Reads `json` into the configuration's shape (no rule checked yet).
pub(crate) fn parse(json: &[u8]) -> Result<RawConfig, ConfigError> {
    with(|state| *state = State::default());
    let mut unescape = [0u8; crate::UNESCAPE_BYTES];
    let mut deserializer = serde_json_core::de::Deserializer::new(json, Some(&mut unescape));
    let result = Section::<RawConfig>::deserialize(&mut deserializer);
    let state = with(core::mem::take);
    let raw = result.map_err(|error| from_parser_error(json, state, error))?;
    deserializer.end().map_err(|_| ConfigError::Malformed {
        origin: Origin::Bytes,
        path: FieldPath::root(),
        problem: "unexpected characters after the top-level object",
    })?;
    Ok(raw.0)
}

pub(crate) fn depth() -> usize {
    with(|state| state.path.depth())
}

pub(crate) fn truncate(depth: usize) {
    with(|state| state.path.truncate(depth));
}

pub(crate) fn enter_key(depth: usize, key: &str) {
    with(|state| {
        state.path.truncate(depth);
        state.path.push_key(key);
    });
}

pub(crate) fn enter_index(depth: usize, index: usize) {
    with(|state| {
        state.path.truncate(depth);
        state.path.push_index(index);
    });
}

/// Notes what the value about to be read should be.
pub(crate) fn expecting(expected: &'static str) {
    with(|state| state.expected = expected);
}

/// The value being read breaks a bound of the schema.
pub(crate) fn invalid<E: de::Error>(expected: fmt::Arguments<'_>, found: Found) -> E {
    refuse(|path| ConfigError::invalid(path, expected, found))
}

/// The key being read is not one of `allowed` (the key is the path's last segment).
pub(crate) fn unknown_field<E: de::Error>(allowed: &'static [&'static str]) -> E {
    refuse(|path| ConfigError::UnknownField {
        origin: Origin::Bytes,
        path,
        allowed,
    })
}

/// The object being read ended without `name`.
pub(crate) fn missing_field<E: de::Error>(name: &str) -> E {
    refuse(|path| ConfigError::MissingField {
        origin: Origin::Bytes,
        path: path.key(name),
    })
}

/// The key just read was already read (the key is the path's last segment).
pub(crate) fn duplicate_field<E: de::Error>() -> E {
    refuse(|path| ConfigError::DuplicateField {
        origin: Origin::Bytes,
        path,
    })
}

/// Any other complaint of the schema.
pub(crate) fn custom<E: de::Error>(message: Expected) -> E {
    refuse(|path| ConfigError::Invalid {
        origin: Origin::Bytes,
        path,
        expected: message,
        found: Found::Malformed,
    })
}

/// Keeps the error for [`parse`]; the parser carries a placeholder (short and ASCII, as it
/// requires) out.
fn refuse<E: de::Error>(error: impl FnOnce(FieldPath) -> ConfigError) -> E {
    with(|state| {
        let path = state.path.clone();
        state.refused = Some(error(path));
    });
    E::custom("see the refused config error")
}

fn from_parser_error(json: &[u8], state: State, error: JsonError) -> ConfigError {
    if let Some(refused) = state.refused {
        return refused;
    }
    let origin = Origin::Bytes;
    let path = state.path;
    let problem = match error {
        // The parser looks at a value's first character only: say what is there.
        JsonError::InvalidType | JsonError::InvalidNumber => {
            let found = crate::probe::describe(json, &path);
            return ConfigError::WrongType {
                origin,
                path,
                expected: bounded(format_args!("{}", state.expected)),
                found,
            };
        }
        JsonError::EofWhileParsingList
        | JsonError::EofWhileParsingObject
        | JsonError::EofWhileParsingString
        | JsonError::EofWhileParsingValue => "unexpected end of input",
        JsonError::ExpectedColon => "expected ':' after the key",
        JsonError::ExpectedListCommaOrEnd => "expected ',' or ']'",
        JsonError::ExpectedObjectCommaOrEnd => "expected ',' or '}'",
        JsonError::ExpectedSomeIdent => "expected true, false or null",
        JsonError::ExpectedSomeValue => "expected a value",
        JsonError::InvalidUnicodeCodePoint => "invalid UTF-8 or unicode escape",
        JsonError::KeyMustBeAString => "expected a quoted key",
        JsonError::TrailingCharacters => "unexpected characters",
        JsonError::TrailingComma => "trailing comma",
        JsonError::CustomError => "not valid JSON",
        // Bad escapes and overlong escaped strings (a string or a key); the parser does
        // not tell the two apart.
        _ if matches!(state.expected, "a string" | "a field name") => {
            "invalid escape sequence, or string too long once unescaped"
        }
        other => {
            return ConfigError::Invalid {
                origin,
                path,
                expected: bounded(format_args!("{}", state.expected)),
                found: Found::Other(bounded(format_args!("{other}"))),
            }
        }
    };
    ConfigError::Malformed {
        origin,
        path,
        problem,
    }
}
