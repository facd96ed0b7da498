//! What vlad's integration tests share: the repository root and whether the QNN HTP
//! emulator is there (both from `vla-test-support`), and a child process whose
//! stdout and stderr are drained from the moment it starts, each by its own thread.
//! Reading one pipe to EOF before the other deadlocks once the child fills the other
//! pipe's buffer (64 KiB on Linux) and blocks writing it; a pipe nobody reads while the
//! child runs (a daemon logging for a minute) stalls the child the same way.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use vla_test_support::HANG_GUARD;

pub mod text;

/// Whether process `pid` (a child of this test) still runs: not exited, not a zombie.
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Polls `done` until it holds while every process in `pids` runs. The error names what
/// was awaited and whether a process ended first or the hang guard ran out.
pub fn wait_while_running(
    what: &str,
    pids: &[u32],
    mut done: impl FnMut() -> bool,
) -> Result<(), String> {
    let end = Instant::now() + HANG_GUARD;
    loop {
        if done() {
            return Ok(());
        }
        if let Some(pid) = pids.iter().find(|&&p| !running(p)) {
            return if done() {
                Ok(())
            } else {
                Err(format!("{what}: process {pid} ended first"))
            };
        }
        if Instant::now() >= end {
            return Err(format!(
                "{what}: still not there after the hang guard ({} s)",
                HANG_GUARD.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The QNN library directory as text for configs and `--lib-dir`, or `None` after saying
/// the test is skipped (`vla_test_support::qnn_lib_dir`'s rule).
pub fn qnn_dir() -> Option<String> {
    vla_test_support::qnn_lib_dir().map(|dir| dir.display().to_string())
}

/// [`qnn_dir`] as a yes/no.
pub fn qnn() -> bool {
    qnn_dir().is_some()
}

/// The first datagram on the notify socket `sock` that contains `needle`, read while
/// process `pid` runs (a daemon that exits first ends the wait, with the messages seen);
/// [`HANG_GUARD`] only ends a hang. Sets a short read timeout on `sock` to poll.
pub fn notified(
    sock: &std::os::unix::net::UnixDatagram,
    pid: u32,
    needle: &str,
) -> Result<String, String> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let end = Instant::now() + HANG_GUARD;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match sock.recv(&mut buf) {
            Ok(n) => {
                let m = String::from_utf8_lossy(&buf[..n]).into_owned();
                if m.contains(needle) {
                    return Ok(m);
                }
                seen.push(m);
            }
            // Nothing queued: a daemon that has exited sends nothing more.
            Err(_) if !running(pid) => {
                return Err(format!("no {needle}: the daemon ended first; saw {seen:?}"))
            }
            Err(_) if Instant::now() >= end => {
                return Err(format!("no {needle} within the hang guard; saw {seen:?}"))
            }
            Err(_) => {}
        }
    }
}

pub struct Drained {
    pub child: Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
    /// What the child wrote to stderr so far.
    err_so_far: Arc<Mutex<Vec<u8>>>,
}

/// Reads `pipe` to its end, appending to `sink` as it comes; returns the whole text.
fn drain(mut pipe: impl Read + Send + 'static, sink: Arc<Mutex<Vec<u8>>>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => sink.lock().unwrap().extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let bytes = sink.lock().unwrap();
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
        let err_so_far = Arc::new(Mutex::new(Vec::new()));
        let out = drain(child.stdout.take().unwrap(), Arc::default());
        let err = drain(child.stderr.take().unwrap(), err_so_far.clone());
        Self {
            child,
            out: Some(out),
            err: Some(err),
            err_so_far,
        }
    }

    /// What the child wrote to stderr (its log) so far, while it runs.
    pub fn stderr_so_far(&self) -> String {
        String::from_utf8_lossy(&self.err_so_far.lock().unwrap()).into_owned()
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends the child SIGTERM (a daemon's orderly stop) and [`Drained::finish`]es it.
    pub fn terminate(self) -> (ExitStatus, String, String) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        self.finish()
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

/// Runs the vlad under test to completion with `args`.
pub fn vlad(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vlad"))
        .args(args)
        .output()
        .expect("run vlad")
}

/// A finished process's stdout and stderr as text.
pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Runs vlad with `args`, which must succeed; returns its stdout then its stderr.
pub fn vlad_ok(args: &[&str]) -> String {
    let o = vlad(args);
    let (out, err) = text(&o);
    assert!(o.status.success(), "vlad {args:?} failed: {out}{err}");
    out + &err
}

/// The first 64-hex word of `out`: the public key `vlad bundle keygen` prints, the
/// content hash `vlad ota install` prints.
pub fn hash_in(out: &str) -> String {
    out.split(|c: char| !c.is_ascii_hexdigit())
        .find(|w| w.len() == 64)
        .unwrap_or_else(|| panic!("no hash in: {out}"))
        .to_owned()
}

/// A test's OTA store: a fresh scratch directory, the store under it and a fleet signing
/// key made by `vlad bundle keygen`.
pub struct OtaScratch {
    /// The scratch directory (`<temp>/<name>-<pid>`; the test removes it).
    pub tmp: PathBuf,
    /// The store's root, `<tmp>/ota`.
    pub root: PathBuf,
    /// The fleet's secret key file.
    pub key: PathBuf,
    /// Its public key, hex.
    pub public: String,
}

impl OtaScratch {
    /// The scratch directory `name` made afresh, with a new fleet key in it.
    pub fn new(name: &str) -> Self {
        let tmp = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        let key = tmp.join("fleet.key");
        let public = hash_in(&vlad_ok(&["bundle", "keygen", key.to_str().unwrap()]));
        Self {
            root: tmp.join("ota"),
            tmp,
            key,
            public,
        }
    }

    /// config/dev.json in OTA mode: the bundle is the store's current one, the fleet key
    /// trusted.
    pub fn config(&self) -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_slice(
            &std::fs::read(vla_test_support::repo_root().join("config/dev.json")).unwrap(),
        )
        .unwrap();
        v["bundle"]["path"] = self.root.join("current").to_str().unwrap().into();
        v["ota"]["root"] = self.root.to_str().unwrap().into();
        v["ota"]["trusted_keys"] = serde_json::json!([self.public]);
        v
    }

    /// `dir` packed and signed with the fleet key, as `vlad bundle pack|sign` do.
    pub fn sign(&self, dir: &Path) {
        let d = dir.to_str().unwrap();
        vlad_ok(&["bundle", "pack", d]);
        vlad_ok(&["bundle", "sign", d, "--key", self.key.to_str().unwrap()]);
    }
}

/// `v` written as `<dir>/vlad.json`; returns its path.
pub fn write_config(dir: &Path, v: &serde_json::Value) -> PathBuf {
    let config = dir.join("vlad.json");
    std::fs::write(&config, serde_json::to_vec_pretty(v).unwrap()).unwrap();
    config
}
