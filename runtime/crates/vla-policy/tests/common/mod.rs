//! Shared set-up of the policy tests: the QNN backend and copies of fixture bundles.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use vla_qnn::{Backend, LoadOptions, QnnLibrary};

pub fn backend() -> Option<Backend> {
    match std::env::var_os("VLA_QNN_LIB_DIR") {
        Some(d) if !d.is_empty() => {
            let lib =
                Arc::new(QnnLibrary::load(&LoadOptions::htp(PathBuf::from(d))).expect("load QNN"));
            Some(Backend::new(lib).expect("QNN backend"))
        }
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

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../golden/bundles")
        .join(name)
}

/// A private copy of fixture bundle `name` that a test may break.
pub fn copy_fixture(name: &str, tag: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("vla-policy-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    copy_dir(&fixture(name), &dst);
    dst
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), to).unwrap();
        }
    }
}

/// Rewrites `bundle.json` of `dir` through `edit`.
pub fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("bundle.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}
