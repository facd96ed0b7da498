//! Shared set-up of the policy tests: the QNN backend and copies of fixture bundles.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use vla_qnn::{Backend, LoadOptions, QnnLibrary};
use vla_test_support::copy_dir;

/// The HTP emulator crashes (SIGSEGV) when several backends are created, used and freed at
/// once in one process, as parallel tests do: the tests of a binary take turns.
static TURN: Mutex<()> = Mutex::new(());

/// A QNN backend held for one test; the turn is released after the backend is freed.
pub struct Qnn {
    pub backend: Backend,
    _turn: MutexGuard<'static, ()>,
}

impl std::ops::Deref for Qnn {
    type Target = Backend;
    fn deref(&self) -> &Backend {
        &self.backend
    }
}

/// The QNN backend, or `None` when the library is not there (`vla_test_support`'s rule).
pub fn backend() -> Option<Qnn> {
    let dir = vla_test_support::qnn_lib_dir()?;
    let turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let lib = Arc::new(QnnLibrary::load(&LoadOptions::htp(dir)).expect("load QNN"));
    Some(Qnn {
        backend: Backend::new(lib).expect("QNN backend"),
        _turn: turn,
    })
}

pub fn fixture(name: &str) -> PathBuf {
    vla_test_support::repo_root()
        .join("golden/bundles")
        .join(name)
}

/// A private copy of fixture bundle `name` that a test may break.
pub fn copy_fixture(name: &str, tag: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("vla-policy-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    copy_dir(&fixture(name), &dst);
    dst
}

/// Rewrites `bundle.json` of `dir` through `edit`.
pub fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("bundle.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// A private copy of the closed-loop Fast-WAM fixture whose robot writes upstream LIBERO's
/// raw state (`state_input: eef_pos_quat_gripper`, 9 values), gated by the fixture's
/// `golden/end_to_end_quat.npz` (the same observation with the quaternion; make_golden.py).
pub fn quaternion_state_fixture(tag: &str) -> PathBuf {
    let dir = copy_fixture("fastwam-closed-loop", tag);
    edit_manifest(&dir, |v| {
        v["fastwam"]["chain"]["state_input"] = "eef_pos_quat_gripper".into();
        v["end_to_end"] = "golden/end_to_end_quat.npz".into();
    });
    dir
}
