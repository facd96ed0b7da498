//! Inputs found by the `npz` fuzz target (`fuzz/fuzz_targets/npz.rs`), replayed on every
//! `cargo test`: each file under `tests/fuzz_regressions/npz/` goes through every parser
//! path (`parse_for_fuzz`, with its round-trip checks) and every error it gives is one line.

use std::path::{Path, PathBuf};
use vla_npz::{parse_for_fuzz, read_npy, Npz, NpzError};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions/npz")
}

fn one_line(error: &NpzError) -> String {
    let message = error.to_string();
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "multi-line error: {message:?}"
    );
    message
}

/// Every error these bytes give, as the fuzz target collects them.
fn errors(bytes: &[u8]) -> Vec<String> {
    parse_for_fuzz(bytes);
    let mut messages = Vec::new();
    match Npz::from_bytes(bytes.to_vec(), "fuzz.npz") {
        Ok(npz) => {
            let names: Vec<String> = npz.names().map(str::to_string).collect();
            for name in names.iter().map(String::as_str).chain(["missing"]) {
                if let Err(e) = npz.array(name) {
                    messages.push(one_line(&e));
                }
            }
        }
        Err(e) => messages.push(one_line(&e)),
    }
    if let Err(e) = read_npy(bytes, "fuzz.npy") {
        messages.push(one_line(&e));
    }
    messages
}

#[test]
fn every_found_input_parses_or_fails_on_one_line() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        assert!(!errors(&bytes).is_empty(), "{}", file.display());
    }
}

/// A zip entry named `empty.\r\r\r` put carriage returns into the error message.
#[test]
fn control_characters_in_entry_names_are_escaped() {
    let bytes = std::fs::read(dir().join("control-chars-in-entry-name.npz")).unwrap();
    let messages = errors(&bytes);
    assert!(
        messages
            .iter()
            .any(|m| m.contains("entry `empty.\\r\\r\\r`")),
        "{messages:?}"
    );
}
