//! What the instruction-text tests share: the C firmware stand-in that writes texts to
//! the instruction segment, and the action ring read in order.

use super::{running, HANG_GUARD};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use vla_ring::{Action, ActionStatus, Geometry, RingReader};
use vla_test_support::repo_root;

/// Builds the C firmware stand-in of vla-ring's tests against the C ring client library,
/// or says why not (loudly in CI).
pub fn build_c_peer(dir: &Path) -> Option<PathBuf> {
    let source = repo_root().join("runtime/crates/vla-ring/tests/c/ring_peer.c");
    vla_test_support::compile_ring_client_program(&source, &dir.join("ring_peer"))
}

/// The C firmware writes one text; returns the CLOCK_MONOTONIC ns it was written at.
pub fn write_text(peer: &Path, path: &Path, g: &Geometry, text_id: u32, text: &[u8]) -> u64 {
    let hex: String = text.iter().map(|b| format!("{b:02x}")).collect();
    let mut args = vec!["write-text".to_string(), path.display().to_string()];
    args.extend(g.fields().iter().map(|(_, v)| v.to_string()));
    args.extend(["4".to_string(), text_id.to_string(), hex]);
    let out = Command::new(peer).args(&args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "write-text: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .split_whitespace()
        .find_map(|f| f.strip_prefix("written_ns="))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

/// Every action published so far, read in order by seq.
pub struct Actions {
    pub ring: RingReader<Action>,
    pub buf: Action,
    pub last: u64,
    pub all: Vec<Action>,
}

impl Actions {
    pub fn poll(&mut self) {
        let p = self.ring.published();
        for seq in self.last + 1..=p {
            if self.ring.read_seq(seq, &mut self.buf).is_ok() {
                self.all.push(self.buf.clone());
            }
        }
        self.last = p;
    }

    /// Polls until `done(actions from index from)` or the daemon ends / the hang guard.
    pub fn until(&mut self, what: &str, pid: u32, from: usize, done: impl Fn(&[Action]) -> bool) {
        let end = Instant::now() + HANG_GUARD;
        loop {
            self.poll();
            if done(&self.all[from..]) {
                return;
            }
            assert!(running(pid), "{what}: vlad ended first");
            assert!(Instant::now() < end, "{what}: not within {HANG_GUARD:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

pub fn ok(a: &Action) -> bool {
    a.status == ActionStatus::Ok
}
