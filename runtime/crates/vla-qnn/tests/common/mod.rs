//! What the binding's emulator tests share: where the QNN libraries are (a loud skip, a
//! failure under `VLA_REQUIRE_QNN=1`).
#![allow(dead_code)]

use std::path::PathBuf;

/// `VLA_QNN_LIB_DIR`, or `None` after saying the test is skipped; under
/// `VLA_REQUIRE_QNN=1` (CI) a missing directory fails the test instead.
pub fn lib_dir() -> Option<PathBuf> {
    match std::env::var_os("VLA_QNN_LIB_DIR") {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => {
            assert!(
                std::env::var("VLA_REQUIRE_QNN").as_deref() != Ok("1"),
                "VLA_REQUIRE_QNN=1 but VLA_QNN_LIB_DIR is not set"
            );
            eprintln!("skipped: VLA_QNN_LIB_DIR is not set");
            None
        }
    }
}
