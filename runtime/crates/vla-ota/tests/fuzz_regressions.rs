//! Inputs found by the `ota_manifest` fuzz target (`fuzz/fuzz_targets/ota_manifest.rs`),
//! replayed on every `cargo test`. As in the target, the first byte picks what the rest
//! is; the files here are all manifest inputs (even first byte): `ota-manifest.json`
//! bytes that must parse into a manifest that round-trips through its canonical form, or
//! be refused with a one-line error.

use std::path::{Path, PathBuf};
use vla_ota::OtaManifest;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions/ota_manifest")
}

/// The error message for manifest bytes, or `None` if they parse.
fn check(bytes: &[u8]) -> Option<String> {
    let path = Path::new("/var/lib/vla/bundles/new/ota-manifest.json");
    match OtaManifest::parse(path, bytes) {
        Ok(manifest) => {
            let again = OtaManifest::parse(path, &manifest.to_bytes()).unwrap();
            assert_eq!(again, manifest);
            None
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                !message.contains('\n') && !message.contains('\r'),
                "multi-line error: {message:?}"
            );
            Some(message)
        }
    }
}

#[test]
fn every_found_manifest_parses_or_fails_on_one_line() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let input = std::fs::read(&file).unwrap();
        let (selector, manifest) = input.split_first().unwrap();
        assert_eq!(
            selector % 2,
            0,
            "{} is not a manifest input",
            file.display()
        );
        check(manifest);
    }
}

/// serde_json quotes an unknown field verbatim: a `\r` in it broke the one-line message.
#[test]
fn control_characters_from_the_manifest_are_escaped() {
    let input = std::fs::read(dir().join("control-char-in-unknown-field")).unwrap();
    let message = check(&input[1..]).expect("refused");
    assert!(message.contains("unknown field `htp_\\rch`"), "{message}");
}
