//! The configuration error type and its parts: where the configuration came from
//! ([`Origin`]), which field is wrong ([`FieldPath`]), and what was there ([`Found`]).
//!
//! Everything here is heap-free and bounded: text taken from the input (keys, string
//! values, file names) is cut to a fixed size and control characters are escaped, so a
//! hostile file can neither grow an error nor break it over several lines.

use core::fmt::{self, Write};
use std::io;

/// Longest key kept per path segment; longer keys are cut (and can then never match).
pub const MAX_KEY_BYTES: usize = 48;
/// Deepest path kept; the schema is three levels deep, so this only bounds garbage.
pub const MAX_PATH_DEPTH: usize = 6;

const SNIPPET_BYTES: usize = 48;
const EXPECTED_BYTES: usize = 192;
const FILE_NAME_BYTES: usize = 256;

/// Bounded text that is cut (at a character boundary, marked with `…`) instead of failing.
pub type Snippet = heapless::String<SNIPPET_BYTES>;
/// What a field should have held, as a sentence fragment ("a number in (0, 1000]").
pub type Expected = heapless::String<EXPECTED_BYTES>;
/// A file name as given to [`crate::Config::load`], possibly cut.
pub type FileName = heapless::String<FILE_NAME_BYTES>;

/// Writes into a heapless string and silently stops, marking the cut with `…`, when full.
pub(crate) struct Truncating<'a, const N: usize> {
    out: &'a mut heapless::String<N>,
    full: bool,
}

impl<'a, const N: usize> Truncating<'a, N> {
    pub(crate) fn new(out: &'a mut heapless::String<N>) -> Self {
        Self { out, full: false }
    }
}

impl<const N: usize> Write for Truncating<'_, N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        const ELLIPSIS: char = '…';
        for c in s.chars() {
            if self.full {
                break;
            }
            let room = N - self.out.len();
            // Keep space for the ellipsis so a cut is always visible.
            if c.len_utf8() + ELLIPSIS.len_utf8() > room {
                let _ = self.out.push(ELLIPSIS);
                self.full = true;
                break;
            }
            let _ = self.out.push(c);
        }
        Ok(())
    }
}

/// Renders `args` into a bounded string, cutting instead of failing.
pub(crate) fn bounded<const N: usize>(args: fmt::Arguments<'_>) -> heapless::String<N> {
    let mut out = heapless::String::new();
    let _ = Truncating::new(&mut out).write_fmt(args);
    out
}

/// Writes `s` with control characters, quotes and backslashes escaped (one line, always).
fn write_escaped(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    for c in s.chars() {
        if c.is_control() || c == '"' || c == '\\' {
            write!(f, "{}", c.escape_debug())?;
        } else {
            f.write_char(c)?;
        }
    }
    Ok(())
}

/// Where the configuration being parsed came from.
// The file name is kept inline (no heap), hence the size difference between variants.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Bytes handed to [`crate::Config::from_json`].
    Bytes,
    /// A file read by [`crate::Config::load`].
    File(FileName),
    /// An environment variable applied by [`crate::Config::apply_overrides`].
    Env(&'static str),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Bytes => f.write_str("config"),
            Origin::File(name) => {
                f.write_str("config file ")?;
                write_escaped(f, name)
            }
            Origin::Env(var) => write!(f, "environment variable {var}"),
        }
    }
}

/// One step of a [`FieldPath`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// An object key (cut to 48 bytes).
    Key(heapless::String<MAX_KEY_BYTES>),
    /// An array position.
    Index(usize),
}

/// The dotted path of a field, e.g. `control.publish_hz` or `ota.trusted_keys[1]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldPath {
    segments: heapless::Vec<Segment, MAX_PATH_DEPTH>,
    /// Set when segments were dropped because the input nested deeper than we keep.
    cut: bool,
}

impl FieldPath {
    /// The document root.
    pub fn root() -> Self {
        Self::default()
    }

    /// A path made of plain keys, e.g. `FieldPath::of(&["control", "publish_hz"])`.
    pub fn of(keys: &[&str]) -> Self {
        let mut path = Self::root();
        for key in keys {
            path.push_key(key);
        }
        path
    }

    /// This path extended by `key`.
    pub fn key(mut self, key: &str) -> Self {
        self.push_key(key);
        self
    }

    /// This path extended by array position `index`.
    pub fn index(mut self, index: usize) -> Self {
        self.push_index(index);
        self
    }

    /// The steps from the document root, outermost first.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// True for the document root itself (an error about the whole document), false once any
    /// segment was pushed, even if it was cut.
    pub fn is_root(&self) -> bool {
        self.segments.is_empty() && !self.cut
    }

    pub(crate) fn depth(&self) -> usize {
        self.segments.len()
    }

    pub(crate) fn truncate(&mut self, depth: usize) {
        if depth < self.segments.len() {
            self.segments.truncate(depth);
            self.cut = false;
        }
    }

    pub(crate) fn push_key(&mut self, key: &str) {
        let key = bounded::<MAX_KEY_BYTES>(format_args!("{key}"));
        self.push(Segment::Key(key));
    }

    pub(crate) fn push_index(&mut self, index: usize) {
        self.push(Segment::Index(index));
    }

    fn push(&mut self, segment: Segment) {
        if self.segments.push(segment).is_err() {
            self.cut = true;
        }
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            return f.write_str("(top level)");
        }
        for (i, segment) in self.segments.iter().enumerate() {
            match segment {
                Segment::Key(key) => {
                    if i > 0 {
                        f.write_char('.')?;
                    }
                    write_escaped(f, key)?;
                }
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        if self.cut {
            f.write_str(".…")?;
        }
        Ok(())
    }
}

/// What was found where something else was expected.
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    /// The field was not there at all.
    Absent,
    /// JSON `null` (also what the parser makes of `null` in a number field).
    Null,
    /// A JSON boolean.
    Bool(bool),
    /// A JSON number.
    Number(f64),
    /// A string: its first characters and its full length in bytes.
    Text {
        /// The string's first characters, cut to 48 bytes.
        start: Snippet,
        /// The whole string's length in bytes, shown when `start` was cut.
        len: usize,
    },
    /// A JSON object.
    Object,
    /// A JSON array.
    Array,
    /// Bytes that do not form a JSON value (e.g. `1.2.3`).
    Malformed,
    /// A free-form description ("an array of more than 8 items").
    Other(Snippet),
}

impl Found {
    pub(crate) fn text(value: &str) -> Self {
        Found::Text {
            start: bounded(format_args!("{value}")),
            len: value.len(),
        }
    }

    /// The JSON reading of a number: the parser reads `null` into a float field as NaN.
    pub(crate) fn number(value: f64) -> Self {
        if value.is_nan() {
            Found::Null
        } else {
            Found::Number(value)
        }
    }
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Absent => f.write_str("nothing"),
            Found::Null => f.write_str("null"),
            Found::Bool(value) => write!(f, "{value}"),
            Found::Number(value) => write!(f, "{value}"),
            Found::Text { start, len } => {
                f.write_str("the string \"")?;
                write_escaped(f, start)?;
                f.write_char('"')?;
                if *len > start.len() {
                    write!(f, " ({len} bytes)")?;
                }
                Ok(())
            }
            Found::Object => f.write_str("an object"),
            Found::Array => f.write_str("an array"),
            Found::Malformed => f.write_str("a malformed value"),
            Found::Other(text) => write_escaped(f, text),
        }
    }
}

/// Why a configuration was rejected. Display is one line naming the origin, the field,
/// what was expected and what was found.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be opened or read.
    Read {
        /// Where the configuration came from.
        origin: Origin,
        /// The operating system's error.
        source: io::Error,
    },
    /// The input is larger than [`crate::MAX_CONFIG_BYTES`].
    TooLarge {
        /// Where the configuration came from.
        origin: Origin,
        /// Size of the input in bytes.
        size: u64,
        /// The limit, [`crate::MAX_CONFIG_BYTES`].
        max: usize,
    },
    /// The input is not well-formed JSON; `path` is the field being read when it broke.
    Malformed {
        /// Where the configuration came from.
        origin: Origin,
        /// The field being read when the JSON broke.
        path: FieldPath,
        /// What the parser found wrong, e.g. `"expected ',' or '}'"`.
        problem: &'static str,
    },
    /// A key the schema does not know (often a typo); `allowed` lists the known ones.
    UnknownField {
        /// Where the configuration came from.
        origin: Origin,
        /// The unknown key, as a path from the root.
        path: FieldPath,
        /// The keys the schema accepts at that level.
        allowed: &'static [&'static str],
    },
    /// A required key is absent.
    MissingField {
        /// Where the configuration came from.
        origin: Origin,
        /// The absent field.
        path: FieldPath,
    },
    /// A key appears twice in the same object.
    DuplicateField {
        /// Where the configuration came from.
        origin: Origin,
        /// The repeated field.
        path: FieldPath,
    },
    /// The value has the wrong JSON type (e.g. a string where a number belongs).
    WrongType {
        /// Where the configuration came from.
        origin: Origin,
        /// The field with the wrong type.
        path: FieldPath,
        /// The type the field needs, as a sentence fragment.
        expected: Expected,
        /// What the input held instead.
        found: Found,
    },
    /// The value has the right type but breaks a range, format or cross-field rule.
    Invalid {
        /// Where the configuration came from.
        origin: Origin,
        /// The field that breaks the rule.
        path: FieldPath,
        /// The rule, as a sentence fragment ("a number in (0, 1000]").
        expected: Expected,
        /// What the input held instead.
        found: Found,
    },
}

impl ConfigError {
    /// The field the error is about, when it is about one.
    pub fn path(&self) -> Option<&FieldPath> {
        match self {
            ConfigError::Read { .. } | ConfigError::TooLarge { .. } => None,
            ConfigError::Malformed { path, .. }
            | ConfigError::UnknownField { path, .. }
            | ConfigError::MissingField { path, .. }
            | ConfigError::DuplicateField { path, .. }
            | ConfigError::WrongType { path, .. }
            | ConfigError::Invalid { path, .. } => Some(path),
        }
    }

    /// Where the rejected configuration came from (file, bytes, or environment variable).
    pub fn origin(&self) -> &Origin {
        match self {
            ConfigError::Read { origin, .. }
            | ConfigError::TooLarge { origin, .. }
            | ConfigError::Malformed { origin, .. }
            | ConfigError::UnknownField { origin, .. }
            | ConfigError::MissingField { origin, .. }
            | ConfigError::DuplicateField { origin, .. }
            | ConfigError::WrongType { origin, .. }
            | ConfigError::Invalid { origin, .. } => origin,
        }
    }

    pub(crate) fn with_origin(mut self, new_origin: Origin) -> Self {
        match &mut self {
            ConfigError::Read { origin, .. }
            | ConfigError::TooLarge { origin, .. }
            | ConfigError::Malformed { origin, .. }
            | ConfigError::UnknownField { origin, .. }
            | ConfigError::MissingField { origin, .. }
            | ConfigError::DuplicateField { origin, .. }
            | ConfigError::WrongType { origin, .. }
            | ConfigError::Invalid { origin, .. } => *origin = new_origin,
        }
        self
    }

    pub(crate) fn invalid(path: FieldPath, expected: fmt::Arguments<'_>, found: Found) -> Self {
        ConfigError::Invalid {
            origin: Origin::Bytes,
            path,
            expected: bounded(expected),
            found,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.origin())?;
        match self {
            ConfigError::Read { source, .. } => write!(f, "cannot read: {source}"),
            ConfigError::TooLarge { size, max, .. } => write!(
                f,
                "expected at most {max} bytes of JSON, found {size} bytes"
            ),
            ConfigError::Malformed { path, problem, .. } => {
                write!(f, "malformed JSON near `{path}`: {problem}")
            }
            ConfigError::UnknownField { path, allowed, .. } => {
                write!(f, "unknown field `{path}`: expected one of ")?;
                for (i, name) in allowed.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(name)?;
                }
                Ok(())
            }
            ConfigError::MissingField { path, .. } => {
                write!(
                    f,
                    "missing field `{path}`: expected it to be present, found nothing"
                )
            }
            ConfigError::DuplicateField { path, .. } => {
                write!(
                    f,
                    "duplicate field `{path}`: expected it once, found it again"
                )
            }
            ConfigError::WrongType {
                path,
                expected,
                found,
                ..
            }
            | ConfigError::Invalid {
                path,
                expected,
                found,
                ..
            } => write!(f, "`{path}`: expected {expected}, found {found}"),
        }
    }
}

// Each message names its cause (the `source` fields are written into it), so `source()`
// does not hand the cause out a second time for a printer to de-duplicate.
impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutting_keeps_char_boundaries_and_marks_the_cut() {
        let cut: heapless::String<8> = bounded(format_args!("{}", "ééééé"));
        assert_eq!(cut.as_str(), "éé…");
        let whole: heapless::String<8> = bounded(format_args!("abc"));
        assert_eq!(whole.as_str(), "abc");
    }

    #[test]
    fn paths_display_dotted_with_indices_and_escaped_keys() {
        let path = FieldPath::of(&["ota", "trusted_keys"]).index(2);
        assert_eq!(path.to_string(), "ota.trusted_keys[2]");
        assert_eq!(FieldPath::of(&["a\nb"]).to_string(), "a\\nb");
        assert_eq!(FieldPath::root().to_string(), "(top level)");
        let mut deep = FieldPath::root();
        for _ in 0..MAX_PATH_DEPTH + 2 {
            deep.push_key("k");
        }
        assert!(deep.to_string().ends_with("k.k.…"));
        deep.truncate(1);
        assert_eq!(deep.to_string(), "k");
    }
}
