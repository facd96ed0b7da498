//! What vlad's integration tests share: the repository root and whether the QNN HTP
//! emulator is there (both from `vla-test-support`), and a child process whose
//! stdout and stderr are drained from the moment it starts, each by its own thread.
//! Reading one pipe to EOF before the other deadlocks once the child fills the other
//! pipe's buffer (64 KiB on Linux) and blocks writing it; a pipe nobody reads while the
//! child runs (a daemon logging for a minute) stalls the child the same way.
#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;

/// The QNN library directory as text for configs and `--lib-dir`, or `None` after saying
/// the test is skipped (`vla_test_support::qnn_lib_dir`'s rule).
pub fn qnn_dir() -> Option<String> {
    vla_test_support::qnn_lib_dir().map(|dir| dir.display().to_string())
}

/// [`qnn_dir`] as a yes/no.
pub fn qnn() -> bool {
    qnn_dir().is_some()
}

pub struct Drained {
    pub child: Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

impl Drained {
    pub fn spawn(command: &mut Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {command:?}: {e}"));
        let out = drain(child.stdout.take().unwrap());
        let err = drain(child.stderr.take().unwrap());
        Self {
            child,
            out: Some(out),
            err: Some(err),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the child; returns its status, stdout and stderr.
    pub fn finish(mut self) -> (ExitStatus, String, String) {
        let status = self.child.wait().unwrap();
        let out = self.out.take().unwrap().join().unwrap();
        let err = self.err.take().unwrap().join().unwrap();
        (status, out, err)
    }
}

impl Drop for Drained {
    /// A test that fails midway leaves no daemon running behind it.
    fn drop(&mut self) {
        if self.out.is_some() && matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
