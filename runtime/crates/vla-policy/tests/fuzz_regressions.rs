//! Manifests found with the `bundle_manifest` fuzz target (`fuzz/fuzz_targets/`), replayed
//! on every `cargo test`: each file under `tests/fuzz_regressions/bundle_manifest/` is a
//! `bundle.json`. It must be refused with a one-line error naming the field, or be safe to
//! act on: every component the policy needs listed, every file it names inside the bundle.

use std::path::{Path, PathBuf};
use vla_policy::{PolicyError, RawManifest};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions/bundle_manifest")
}

fn input(name: &str) -> Vec<u8> {
    std::fs::read(dir().join(name)).unwrap()
}

fn inside_bundle(rel: &str) -> bool {
    !(rel.is_empty() || rel.starts_with('/') || rel.split('/').any(|p| p == ".."))
}

/// What `Bundle::open` would report for these bytes, or `None` if it accepts them.
fn check(bytes: &[u8]) -> Option<String> {
    let path = PathBuf::from("bundle.json");
    let error = match RawManifest::from_json(bytes) {
        Err(e) => PolicyError::ManifestSyntax {
            path,
            reason: e.to_string(),
        },
        Ok(manifest) => match manifest.validate() {
            Err(invalid) => PolicyError::ManifestInvalid { path, invalid },
            Ok(manifest) => {
                for name in manifest.required_components() {
                    assert!(manifest.components.contains_key(&name), "`{name}`");
                }
                let mut files = vec![manifest.end_to_end.as_str()];
                for c in manifest.components.values() {
                    files.extend([c.binary.as_str(), c.golden.as_str()]);
                }
                files.extend(manifest.molmoact2().map(|m| m.prompt.as_str()));
                files.extend(manifest.fastwam().and_then(|f| f.world_model.as_deref()));
                for rel in files {
                    assert!(inside_bundle(rel), "accepted `{rel}`");
                }
                return None;
            }
        },
    };
    let message = error.to_string();
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "multi-line error: {message:?}"
    );
    Some(message)
}

#[test]
fn every_found_manifest_is_refused_on_one_line_or_safe() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    for file in files {
        let message = check(&std::fs::read(&file).unwrap());
        // Every input here was a crash or an accepted bad manifest: now each is refused.
        assert!(message.is_some(), "{} is accepted", file.display());
    }
}

/// serde_json quotes an unknown field verbatim; a `\r` in it broke the one-line message.
#[test]
fn text_from_the_file_is_escaped_in_messages() {
    let message = check(&input("control-char-in-unknown-field")).unwrap();
    assert!(
        message.contains("unknown field `min\\runtime_version`"),
        "{message}"
    );
}

/// `llm_splits: 4e12` made `required_components` (called by `validate` itself) try to
/// allocate four trillion names: an abort, before any file was opened.
#[test]
fn llm_splits_is_bounded() {
    let message = check(&input("llm-splits-4e12.json")).unwrap();
    assert!(
        message.contains("`molmoact2.llm_splits` 4000000000000 is above the limit of 64"),
        "{message}"
    );
}

/// `seq_len: 2^40` passed `validate`, then `seq_len * seq_len` overflowed while the
/// pipeline sized its attention buffers.
#[test]
fn derived_tensor_sizes_must_be_addressable() {
    let message = check(&input("seq-len-squared-overflows.json")).unwrap();
    assert!(
        message.contains("`molmoact2.") && message.contains("too large to address"),
        "{message}"
    );
}

/// Only component paths were checked: `end_to_end`, `prompt` and `world_model` could name
/// any file on the device.
#[test]
fn every_file_the_manifest_names_stays_inside_the_bundle() {
    for (name, field) in [
        ("end-to-end-absolute.json", "`end_to_end` `/etc/shadow`"),
        ("prompt-escapes-bundle.json", "`molmoact2.prompt`"),
        (
            "world-model-escapes-bundle.json",
            "`fastwam.world_model` `../world.npz`",
        ),
    ] {
        let message = check(&input(name)).unwrap();
        assert!(
            message.contains(field) && message.contains("must be a relative path inside"),
            "{name}: {message}"
        );
    }
}
