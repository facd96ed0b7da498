//! Loading a bundle and holding it to its parity gate (`vlad run`, at start and on
//! SIGHUP), and the typed errors of loading, reloading and inferring. Each names the
//! bundle and its cause in its own line, so `source()` hands out only causes the line does
//! not name; the QNN error under a failed load or inference, which the NPU fault handling
//! classifies, is handed out typed ([`QnnCause`]).

use std::path::{Path, PathBuf};
use vla_ota::{OtaError, RolledBack};
use vla_policy::{Bundle, Policy, PolicyError};
use vla_qnn::Backend;

/// Why a bundle could not be brought into service.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// The configured path does not resolve (a dangling link, a missing directory).
    Resolve {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The bundle does not open, does not load, or cannot run its goldens.
    Policy(PolicyError),
    /// It ran its goldens and missed the parity gate.
    Gate { dir: PathBuf, why: String },
    /// Its contexts do not fit the DSP sessions as placed (nothing was created).
    Placement { dir: PathBuf, why: String },
    /// The QNN backend could not be (re-)created to load it on.
    Backend(vla_qnn::QnnError),
    /// Under OTA, it does not verify against the daemon's own keys and device (signatures,
    /// every file's hash) at the moment it is loaded.
    Unverified {
        dir: PathBuf,
        /// The store's error, or the policy's refusal of a context binary whose bytes
        /// did not hash to the manifest's digest as they were read.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `npu.shared_buffers` is on and the policy cannot run on shared buffers.
    Npu { dir: PathBuf, why: String },
    /// It needs other rings than the ones the loop runs on.
    Geometry {
        dir: PathBuf,
        needs: vla_ring::Geometry,
        rings: vla_ring::Geometry,
    },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Resolve { path, source } => {
                write!(f, "bundle {}: {source}", path.display())
            }
            LoadError::Policy(e) => e.fmt(f),
            LoadError::Placement { dir, why } => write!(f, "bundle {}: {why}", dir.display()),
            LoadError::Backend(e) => write!(f, "re-creating the QNN backend: {e}"),
            LoadError::Gate { dir, why } => {
                write!(f, "bundle {} failed its parity gate: {why}", dir.display())
            }
            LoadError::Unverified { dir, source } => write!(
                f,
                "bundle {} does not verify with this daemon's keys: {source}",
                dir.display()
            ),
            LoadError::Npu { dir, why } => write!(f, "bundle {}: {why}", dir.display()),
            LoadError::Geometry { dir, needs, rings } => write!(
                f,
                "bundle {} needs ring geometry {needs:?}, the rings are {rings:?}",
                dir.display()
            ),
        }
    }
}

// Each names its cause in its message, so `source()` leaves it out: `Policy` is the
// policy's error's own message and `Backend` names the backend's, so their causes are
// those errors' own.
impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Policy(e) => e.source(),
            LoadError::Backend(e) => e.source(),
            LoadError::Resolve { .. }
            | LoadError::Unverified { .. }
            | LoadError::Gate { .. }
            | LoadError::Npu { .. }
            | LoadError::Geometry { .. }
            | LoadError::Placement { .. } => None,
        }
    }
}

/// An error that may have a failed QNN step under it (a failed load or inference): what
/// the NPU fault handling classifies.
pub trait QnnCause {
    /// The QNN binding's error under this one, if a QNN step failed.
    fn qnn_error(&self) -> Option<&vla_qnn::QnnError>;
}

impl QnnCause for PolicyError {
    fn qnn_error(&self) -> Option<&vla_qnn::QnnError> {
        PolicyError::qnn_error(self)
    }
}

impl QnnCause for LoadError {
    fn qnn_error(&self) -> Option<&vla_qnn::QnnError> {
        match self {
            LoadError::Policy(e) => e.qnn_error(),
            LoadError::Backend(e) => Some(e),
            _ => None,
        }
    }
}

impl QnnCause for InferError {
    fn qnn_error(&self) -> Option<&vla_qnn::QnnError> {
        match self {
            InferError::Policy(e) => e.qnn_error(),
            InferError::NoPolicy | InferError::NpuHeld { .. } => None,
        }
    }
}

impl From<PolicyError> for LoadError {
    fn from(e: PolicyError) -> Self {
        LoadError::Policy(e)
    }
}

/// What runs after a new bundle was refused.
#[derive(Debug)]
pub enum Recovery {
    /// The bundle that ran before, loaded again.
    RunningAgain(PathBuf),
    /// The OTA store rolled back (and the rollback target passed its gate).
    RolledBack(RolledBack),
    /// The store's rollback failed; what ran before was loaded again.
    RollbackFailed(OtaError),
}

/// Why a reload (SIGHUP) did not bring the new bundle into service.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReloadError {
    /// The configured bundle path does not resolve; nothing changed.
    Target(LoadError),
    /// The OTA store cannot say what is current.
    Store(OtaError),
    /// The OTA store has no current bundle.
    NoCurrent,
    /// The new bundle was refused; `recovery` says what runs now.
    Rejected {
        rejected: Box<LoadError>,
        recovery: Box<Recovery>,
    },
    /// The new bundle was refused, and so was the one that ran before: nothing runs.
    PreviousFailed {
        rejected: Box<LoadError>,
        previous: Box<LoadError>,
    },
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReloadError::Target(e) => e.fmt(f),
            ReloadError::Store(e) => e.fmt(f),
            ReloadError::NoCurrent => write!(f, "the OTA store has no current bundle"),
            ReloadError::Rejected { rejected, recovery } => match recovery.as_ref() {
                Recovery::RunningAgain(dir) => {
                    write!(f, "{rejected} (running {} again)", dir.display())
                }
                Recovery::RolledBack(r) => write!(f, "{rejected} (rolled back: {r:?})"),
                Recovery::RollbackFailed(e) => write!(f, "{rejected}; rollback: {e}"),
            },
            ReloadError::PreviousFailed { rejected, previous } => {
                write!(f, "{rejected}; the previous bundle failed too: {previous}")
            }
        }
    }
}

// `Target` and `Store` are the carried error's own message, so its causes are theirs;
// `Rejected` and `PreviousFailed` name the refusals in their message.
impl std::error::Error for ReloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReloadError::Target(e) => e.source(),
            ReloadError::Store(e) => e.source(),
            ReloadError::NoCurrent
            | ReloadError::Rejected { .. }
            | ReloadError::PreviousFailed { .. } => None,
        }
    }
}

/// Why an inference failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum InferError {
    /// No policy is loaded: the last reload failed and so did the fallback.
    NoPolicy,
    Policy(PolicyError),
    /// The NPU failed past the recovery limit: nothing runs until SIGHUP or a restart.
    NpuHeld {
        /// Re-creations tried without a healthy inference between them.
        rebuilds: u32,
    },
}

impl std::fmt::Display for InferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InferError::NoPolicy => write!(f, "no policy loaded (the last reload failed)"),
            InferError::Policy(e) => e.fmt(f),
            InferError::NpuHeld { rebuilds } => write!(
                f,
                "the NPU failed again after {rebuilds} re-creations: holding until SIGHUP or a restart"
            ),
        }
    }
}

impl std::error::Error for InferError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            InferError::NoPolicy | InferError::NpuHeld { .. } => None,
            // The policy's error is this error's whole message: its causes are this one's.
            InferError::Policy(e) => e.source(),
        }
    }
}

/// Says in one log line which of a Fast-WAM bundle's settings differ from upstream's LIBERO
/// evaluation and what upstream uses (nothing for MolmoAct2 or a bundle that matches).
/// Called once the policy is loaded: a bundle that cannot even load (no NPU) gets its one
/// error line, not a note about its settings first.
pub(crate) fn note_upstream_deviations(bundle: &Bundle) {
    let deviations = bundle
        .manifest
        .fastwam()
        .and_then(|f| f.upstream_eval_deviations());
    if let Some(d) = deviations {
        log::warn!(
            "bundle {} deviates from upstream Fast-WAM's LIBERO eval settings: {d}",
            bundle.dir.display()
        );
    }
}

/// What a bundle's gate measured, kept for the running bundle.
#[derive(Clone, Debug, Default)]
pub struct Gated {
    /// The end-to-end cosine against the golden chunk.
    pub cosine: f64,
    /// The chunk this backend computed for the end-to-end golden observation: what a
    /// re-created NPU session must compute again, bit for bit.
    pub actions: Vec<f32>,
}

/// A bundle loaded and held to its gate: what [`load_gated`] returns.
pub struct Loaded {
    /// The bundle.
    pub bundle: Bundle,
    /// Its policy, every context resident and warm.
    pub policy: Policy,
    /// What its gate measured.
    pub gated: Gated,
}

/// How [`load_gated`] loads: the policy's own options and where its NPU I/O goes.
pub struct LoadSettings {
    /// The helper threads' set-up.
    pub policy: vla_policy::LoadOptions,
    /// `npu.shared_buffers`, resolved at start.
    pub npu: crate::npu_io::NpuPlan,
    /// The OTA store whose instruction packs of a loaded bundle are attached after its
    /// gate (`crate::packs`); `None`: none are.
    pub packs: Option<std::sync::Arc<vla_ota::Store>>,
    /// Under OTA, the store: every load verifies the bundle with its keys, each context
    /// binary hashed as QNN's copy of it is read ([`crate::verified`]).
    pub store: Option<std::sync::Arc<vla_ota::Store>>,
}

/// Loads a bundle and gates it: every context against its golden and the end-to-end
/// golden (which also warms up every context). Also returns what the gate measured.
pub fn load_gated(
    backend: &Backend,
    dir: &Path,
    options: &LoadSettings,
) -> Result<Loaded, LoadError> {
    let mut bundle = Bundle::open(dir)?;
    let digests = options
        .store
        .as_ref()
        .map(|store| crate::verified::verify_for_load(store, &bundle))
        .transpose()?;
    // Before any context is created: a bundle that cannot fit is refused with its sums.
    let plan = crate::dsp_plan::plan_bundle(&bundle, backend.library()).map_err(|why| {
        LoadError::Placement {
            dir: dir.to_owned(),
            why,
        }
    })?;
    log::info!(
        "bundle {} DSP memory plan: {}",
        dir.display(),
        plan.summary()
    );
    if let Some(digests) = digests {
        bundle = crate::verified::hashed(bundle, digests, plan.footprints.clone());
    }
    let placed =
        crate::dsp_plan::place(backend, &bundle, &plan).map_err(|why| LoadError::Placement {
            dir: dir.to_owned(),
            why,
        })?;
    // A file that changed since it was signed: refused as the bundle's verification, not
    // as a load failure (a retry does not repair it).
    let refused = |e| match e {
        e @ (PolicyError::Unverified { .. } | PolicyError::UnverifiedFile { .. }) => {
            LoadError::Unverified {
                dir: dir.to_owned(),
                source: Box::new(e),
            }
        }
        e => LoadError::Policy(e),
    };
    let mut policy = Policy::load_with(&bundle, &placed, &options.policy).map_err(refused)?;
    // Before the gate, so the gate checks the I/O the policy will run on.
    let io = options
        .npu
        .apply(&mut policy)
        .map_err(|why| LoadError::Npu {
            dir: dir.to_owned(),
            why,
        })?;
    log::info!("bundle {}: {}", dir.display(), io.describe());
    let report = bundle.parity(&mut policy).map_err(refused)?;
    if let Some(why) = report.failure_summary() {
        return Err(LoadError::Gate {
            dir: dir.to_owned(),
            why,
        });
    }
    log::info!(
        "bundle {} ({} {}) gated: end-to-end cosine {:.6}",
        dir.display(),
        bundle.manifest.name,
        bundle.manifest.version,
        report.end_to_end.comparison.cosine
    );
    note_upstream_deviations(&bundle);
    if report.open_loop {
        log::warn!(
            "bundle {} is OPEN LOOP: constant world model, its actions ignore the camera and the state",
            dir.display()
        );
    }
    crate::dsp_plan::set_running(plan);
    // After the gate, which proves the bundle as it was signed: packs add instructions.
    if let Some(store) = &options.packs {
        crate::packs::attach_installed(store, &bundle, &mut policy);
    }
    let gated = Gated {
        cosine: report.end_to_end.comparison.cosine,
        actions: report.end_to_end.actions,
    };
    Ok(Loaded {
        bundle,
        policy,
        gated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn a_cause_named_in_the_line_is_not_handed_out_again() {
        let gone = || std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = LoadError::Resolve {
            path: "/b".into(),
            source: gone(),
        };
        assert_eq!(e.to_string(), "bundle /b: gone");
        assert!(e.source().is_none());
        assert_eq!(crate::error_line(&e), "bundle /b: gone");
        let reload = ReloadError::Rejected {
            rejected: Box::new(e),
            recovery: Box::new(Recovery::RunningAgain("/a".into())),
        };
        assert_eq!(reload.to_string(), "bundle /b: gone (running /a again)");
        assert!(reload.source().is_none());
    }

    #[test]
    fn a_failed_qnn_call_is_named_once_and_handed_out_typed() {
        let failed = || PolicyError::Qnn {
            component: "vision".into(),
            error: vla_qnn::QnnError::Call {
                operation: "graphExecute",
                subject: "graph g".into(),
                code: 1007,
                backend_message: None,
            },
        };
        let load = LoadError::Policy(failed());
        let infer = InferError::Policy(failed());
        for e in [&load as &dyn QnnCause, &infer] {
            assert!(matches!(
                e.qnn_error(),
                Some(vla_qnn::QnnError::Call { code: 1007, .. })
            ));
        }
        for e in [&load as &(dyn Error + 'static), &infer] {
            let line = crate::error_line(e);
            assert_eq!(line, e.to_string());
            assert_eq!(line.matches("QNN error 1007").count(), 1, "{line}");
            assert!(e.source().is_none());
        }
    }
}
