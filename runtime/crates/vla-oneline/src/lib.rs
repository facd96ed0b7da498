//! Error text on one line. Errors quote names, paths and parser messages taken from files
//! (a bundle's entries, a manifest's fields); a `\n` or `\r` in one must not break the one
//! readable line a person or a log reads. [`OneLine`] escapes control characters in
//! everything written through it, so a `Display` impl writes its message once and passes
//! quoted text through unchanged otherwise.
#![no_std]

use core::fmt;

/// A writer that passes text through to the one it wraps, with control characters
/// escaped (`char::escape_default`: `\n`, `\r`, `\t`, `\u{1b}`, ...); everything else,
/// non-ASCII included, is written as it is.
pub struct OneLine<'a, W: fmt::Write + ?Sized>(pub &'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for OneLine<'_, W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        for c in text.chars() {
            if c.is_control() {
                write!(self.0, "{}", c.escape_default())?;
            } else {
                self.0.write_char(c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::OneLine;
    use core::fmt::Write;
    use std::string::String;

    fn one_line(text: &str) -> String {
        let mut out = String::new();
        write!(OneLine(&mut out), "{text}").unwrap();
        out
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            one_line("a\nb\rc\td\u{1b}[0m\0"),
            "a\\nb\\rc\\td\\u{1b}[0m\\u{0}"
        );
    }

    #[test]
    fn other_text_passes_unchanged() {
        let text = "bundle /tmp/ü é \"quoted\" \\ {braces} 🤖";
        assert_eq!(one_line(text), text);
    }

    #[test]
    fn a_message_spanning_several_writes_stays_on_one_line() {
        let mut out = String::new();
        let (file, entry) = ("f.npz", "x\ny");
        write!(OneLine(&mut out), "{file}: entry `{entry}`: {}", 3).unwrap();
        assert_eq!(out, "f.npz: entry `x\\ny`: 3");
        assert!(!out.contains('\n'));
    }
}
