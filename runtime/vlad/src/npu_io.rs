//! `npu.shared_buffers` resolved at start: how the NPU's inputs and outputs are handed
//! over, said once in the log and carried by STATUS, the metrics and the recordings.
//!
//! Shared buffers need rpcmem (libcdsprpc.so, opened at run time: absent on the emulator
//! and in CI) and a backend that registers them (`Policy::use_shared_buffers`: every
//! policy, each on one chained arena). [`resolve`] runs before anything loads: `off`, or no rpcmem
//! under `auto`, is client buffers; `on` without rpcmem is refused there. [`NpuPlan::apply`]
//! runs on every loaded policy before its parity gate (so the gate checks what will run):
//! a policy or backend that refuses is client buffers under `auto`, a failed load under
//! `on`.

use std::sync::Arc;
use vla_config::SharedBuffers;
use vla_qnn::{QnnError, RpcMem};

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

/// What the last loaded policy got: its label (`shared`/`client`) and line, shared with
/// whoever reports it (STATUS, the metrics) while the engine runs elsewhere.
#[derive(Clone, Debug)]
pub struct NpuStatus(Arc<std::sync::Mutex<(&'static str, String)>>);

impl NpuStatus {
    /// The label and the line.
    pub fn get(&self) -> (&'static str, String) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, io: &NpuIo) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = (io.label(), io.describe());
    }
}

/// What every loaded policy is asked to run on (see the module doc), and what the last one
/// got.
#[derive(Debug)]
pub struct NpuPlan {
    try_rpcmem: Option<Arc<RpcMem>>,
    required: bool,
    /// Client buffers' reason when no policy is even asked.
    reason: String,
    last: NpuStatus,
}

impl NpuPlan {
    fn new(try_rpcmem: Option<Arc<RpcMem>>, required: bool, reason: String) -> Self {
        let io = NpuIo::Client {
            reason: reason.clone(),
        };
        Self {
            try_rpcmem,
            required,
            reason,
            last: NpuStatus(Arc::new(std::sync::Mutex::new((io.label(), io.describe())))),
        }
    }

    /// Puts `policy`'s NPU I/O where the plan says; the error (one line) is a failed load.
    pub fn apply(&self, policy: &mut vla_policy::Policy) -> Result<NpuIo, String> {
        let io = match &self.try_rpcmem {
            None => NpuIo::Client {
                reason: self.reason.clone(),
            },
            Some(rpcmem) => match policy.use_shared_buffers(rpcmem) {
                Ok(()) => NpuIo::Shared {
                    rpcmem: rpcmem.clone(),
                },
                Err(e) if self.required => {
                    return Err(format!(
                        "npu.shared_buffers is on, but this policy cannot use shared buffers: {e}"
                    ))
                }
                Err(e) => NpuIo::Client {
                    reason: format!("npu.shared_buffers is auto; {e}"),
                },
            },
        };
        self.last.set(&io);
        Ok(io)
    }

    /// The plan in one line, for the log at start.
    pub fn describe(&self) -> String {
        match &self.try_rpcmem {
            None => self.status().get().1,
            Some(rpcmem) => format!(
                "NPU I/O: HTP shared buffers (rpcmem from {}) for every policy that can run on them{}",
                rpcmem.origin().display(),
                if self.required { "; npu.shared_buffers is on: the others are refused" } else { ", client buffers for the others" }
            ),
        }
    }

    /// What the last [`NpuPlan::apply`] gave (before any: client buffers), kept current.
    pub fn status(&self) -> NpuStatus {
        self.last.clone()
    }
}

/// Resolves `mode` with `load_rpcmem` (libcdsprpc by its standard names in the daemon)
/// before anything loads: `off` never loads it; `auto` without it is client buffers with
/// the reason; `on` without it is an error, one line.
pub fn resolve(
    mode: SharedBuffers,
    load_rpcmem: impl FnOnce() -> Result<Arc<RpcMem>, QnnError>,
) -> Result<NpuPlan, String> {
    if mode == SharedBuffers::Off {
        return Ok(NpuPlan::new(
            None,
            false,
            "npu.shared_buffers is off".into(),
        ));
    }
    match (load_rpcmem(), mode) {
        (Ok(rpcmem), _) => Ok(NpuPlan::new(
            Some(rpcmem),
            mode == SharedBuffers::On,
            String::new(),
        )),
        (Err(e), SharedBuffers::On) => Err(format!(
            "npu.shared_buffers is on, but shared buffers cannot be used here: no rpcmem: {e}"
        )),
        (Err(e), _) => Ok(NpuPlan::new(
            None,
            false,
            format!("npu.shared_buffers is auto; no rpcmem: {e}"),
        )),
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
        let plan = resolve(SharedBuffers::Off, || panic!("loaded")).unwrap();
        assert_eq!(
            plan.status().get(),
            (
                "client",
                "NPU I/O in client buffers (npu.shared_buffers is off)".to_string()
            )
        );
    }

    #[test]
    fn auto_falls_back_naming_why_and_on_is_refused_in_one_line() {
        let plan = resolve(SharedBuffers::Auto, absent).unwrap();
        let (label, line) = plan.status().get();
        assert_eq!(label, "client");
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
    fn with_rpcmem_the_policy_is_asked_and_on_is_required() {
        let Some(dir) = tmp() else { return };
        let Some(lib) = vla_test_support::rpcmem_standin(&dir) else {
            return;
        };
        let plan = resolve(SharedBuffers::Auto, || RpcMem::load(&lib)).unwrap();
        assert!(plan.try_rpcmem.is_some() && !plan.required);
        let plan = resolve(SharedBuffers::On, || RpcMem::load(&lib)).unwrap();
        assert!(plan.try_rpcmem.is_some() && plan.required);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tmp() -> Option<PathBuf> {
        let d = std::env::temp_dir().join(format!("vlad-npu-io-{}", std::process::id()));
        std::fs::create_dir_all(&d).ok()?;
        Some(d)
    }
}
