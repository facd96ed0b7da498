//! Shared helpers: the example configs and a checked text substitution.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::path::PathBuf;

pub fn config_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../config")
}

pub fn device_json() -> String {
    std::fs::read_to_string(config_dir().join("vlad.json")).expect("config/vlad.json")
}

pub fn dev_json() -> String {
    std::fs::read_to_string(config_dir().join("dev.json")).expect("config/dev.json")
}

/// `json` with the single occurrence of `old` replaced by `new`; panics if `old` is not
/// there exactly once, so a test can never silently run on the unmodified file.
pub fn edit(json: &str, old: &str, new: &str) -> String {
    assert_eq!(
        json.matches(old).count(),
        1,
        "expected exactly one {old:?} in the example config"
    );
    json.replacen(old, new, 1)
}
