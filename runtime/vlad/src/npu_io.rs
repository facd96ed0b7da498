//! `npu.shared_buffers` resolved at start: how the NPU's inputs and outputs are handed
//! over, said once in the log and carried by STATUS, the metrics and the recordings.
//!
//! Shared buffers need rpcmem (libcdsprpc.so, opened at run time: absent on the emulator
//! and in CI) and a policy that runs on them. The binding has them (`vla_qnn::SharedBuffer`,
//! `Graph::bind_shared`) and so does Fast-WAM's open-loop form
//! (`Policy::use_shared_buffers`), but the daemon does not move its policies onto them yet
//! (MolmoAct2 cannot, and a reload would have to do it again), so today every mode
//! resolves to client buffers and `on` is refused at start, naming what is missing, rather
//! than run on something it did not ask for.

use std::sync::Arc;
use vla_config::SharedBuffers;
use vla_qnn::{QnnError, RpcMem};

/// Whether the daemon runs its policies on shared buffers. Not yet (docs/shared-buffers.md).
const DAEMON_USES_SHARED_BUFFERS: bool = false;

/// What `npu.shared_buffers` resolved to.
#[derive(Debug)]
pub enum NpuIo {
    /// Client buffers (QNN copies them to and from DSP-visible memory around each
    /// execute), and why.
    Client {
        /// Why not shared buffers, in a few words.
        reason: String,
    },
    /// HTP shared buffers from this rpcmem.
    Shared {
        /// libcdsprpc's rpcmem, loaded.
        rpcmem: Arc<RpcMem>,
    },
}

impl NpuIo {
    /// `shared` or `client`: the metrics label and the recordings' `npu_io`.
    pub fn label(&self) -> &'static str {
        match self {
            NpuIo::Client { .. } => "client",
            NpuIo::Shared { .. } => "shared",
        }
    }

    /// One line for the log, STATUS and the recordings.
    pub fn describe(&self) -> String {
        match self {
            NpuIo::Client { reason } => format!("NPU I/O in client buffers ({reason})"),
            NpuIo::Shared { rpcmem } => format!(
                "NPU I/O in HTP shared buffers (rpcmem from {})",
                rpcmem.origin().display()
            ),
        }
    }
}

/// Resolves `mode` with `load_rpcmem` (libcdsprpc by its standard names in the daemon):
/// `off` never loads it; `auto` falls back to client buffers with the reason; `on` without
/// everything shared buffers need is an error, one line.
pub fn resolve(
    mode: SharedBuffers,
    load_rpcmem: impl FnOnce() -> Result<Arc<RpcMem>, QnnError>,
) -> Result<NpuIo, String> {
    if mode == SharedBuffers::Off {
        return Ok(NpuIo::Client {
            reason: "npu.shared_buffers is off".into(),
        });
    }
    let missing = match load_rpcmem() {
        Err(e) => format!("no rpcmem: {e}"),
        Ok(rpcmem) if DAEMON_USES_SHARED_BUFFERS => return Ok(NpuIo::Shared { rpcmem }),
        Ok(rpcmem) => format!(
            "rpcmem found in {}, but vlad does not run its policies on shared buffers yet",
            rpcmem.origin().display()
        ),
    };
    match mode {
        SharedBuffers::On => Err(format!(
            "npu.shared_buffers is on, but shared buffers cannot be used here: {missing}"
        )),
        _ => Ok(NpuIo::Client {
            reason: format!("npu.shared_buffers is auto; {missing}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn absent() -> Result<Arc<RpcMem>, QnnError> {
        RpcMem::load("/nonexistent/libcdsprpc.so")
    }

    #[test]
    fn off_never_looks_for_rpcmem() {
        let io = resolve(SharedBuffers::Off, || panic!("loaded")).unwrap();
        assert_eq!(io.label(), "client");
        assert_eq!(
            io.describe(),
            "NPU I/O in client buffers (npu.shared_buffers is off)"
        );
    }

    #[test]
    fn auto_falls_back_naming_why_and_on_is_refused_in_one_line() {
        let io = resolve(SharedBuffers::Auto, absent).unwrap();
        assert_eq!(io.label(), "client");
        let line = io.describe();
        assert!(
            line.starts_with("NPU I/O in client buffers (npu.shared_buffers is auto; no rpcmem: cannot load QNN library /nonexistent/libcdsprpc.so: dlopen failed"),
            "{line}"
        );
        let e = resolve(SharedBuffers::On, absent).unwrap_err();
        assert!(!e.contains('\n'), "{e}");
        assert!(
            e.starts_with("npu.shared_buffers is on, but shared buffers cannot be used here: no rpcmem: cannot load QNN library /nonexistent/libcdsprpc.so"),
            "{e}"
        );
    }

    #[test]
    fn with_rpcmem_the_missing_daemon_support_is_said() {
        let Some(dir) = tmp() else { return };
        let Some(lib) = vla_test_support::rpcmem_standin(&dir) else {
            return;
        };
        let io = resolve(SharedBuffers::Auto, || RpcMem::load(&lib)).unwrap();
        assert!(
            io.describe()
                .ends_with("but vlad does not run its policies on shared buffers yet)"),
            "{}",
            io.describe()
        );
        let e = resolve(SharedBuffers::On, || RpcMem::load(&lib)).unwrap_err();
        assert!(
            e.contains("does not run its policies on shared buffers yet"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tmp() -> Option<PathBuf> {
        let d = std::env::temp_dir().join(format!("vlad-npu-io-{}", std::process::id()));
        std::fs::create_dir_all(&d).ok()?;
        Some(d)
    }
}
