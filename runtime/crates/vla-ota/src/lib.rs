//! Over-the-air policy bundle updates: signed manifests, atomic staging and activation,
//! a trial period, and automatic rollback.
//!
//! A bad or half-written bundle must never drive an arm, and a power cut at any moment
//! must leave a complete bundle running. This crate owns the files and the state machine;
//! the daemon plugs its parity gate in through [`Activation`].
//!
//! Device layout under the OTA root (`ota.root`, `/var/lib/vla` on the device):
//!
//! ```text
//! bundles/<content-hash>/          verified, complete bundles (never modified)
//! bundles/.staging-<hash>-<pid>/   a copy in progress (removed at the next start)
//! bundles/.trash-<hash>-<pid>/     a bundle being deleted (removed at the next start)
//! packs/<content-hash>/            verified instruction packs (`pack.json`), each naming the
//!                                  bundle it goes with; staged like bundles, never activated
//! current  -> bundles/<hash>       what the daemon loads (`bundle.path`)
//! previous -> bundles/<hash>       the rollback target
//! key-list.json                    the newest root-signed key list accepted (rotation)
//! ota-state.json                   current, previous, trial, trial_starts, healthy count
//! version-floor.json               highest committed version, latest time seen (anti-rollback)
//! ota.lock                         flock serializing OTA operations between processes
//! vlad.pid                         the daemon's pid (the CLI signals it to reload) and, once
//!                                  gated, its bundle and inference time (verdict waits)
//! ```
//!
//! The content hash is the SHA-256 of the signed `ota-manifest.json` bytes, which list
//! every file's size and SHA-256: the directory name identifies the whole bundle.
//!
//! ```no_run
//! use vla_ota::{DeviceTarget, OtaSettings, PublicKey, Store};
//! let settings = OtaSettings {
//!     root: "/var/lib/vla".into(),
//!     trusted_keys: vec![PublicKey::from_hex(
//!         "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
//!     )?],
//!     signature_threshold: 1,
//!     root_keys: Vec::new(),
//!     trial_inferences: 20,
//!     max_trial_starts: 3,
//!     target: DeviceTarget { soc_model: 77, htp_arch: 73, runtime_version: "0.1.0".into() },
//! };
//! let store = Store::new(settings);
//! let installed = store.install("/tmp/new-bundle".as_ref())?;
//! let mut gate = |dir: &std::path::Path| -> Result<(), String> {
//!     // the daemon: hold, free old contexts, load `dir`, run the golden parity gate
//!     Ok(())
//! };
//! store.activate(&installed.hash, &mut gate)?;
//! # Ok::<(), vla_ota::OtaError>(())
//! ```

#![forbid(unsafe_code)]

mod durable;
mod error;
pub mod hex;
mod keylist;
mod manifest;
pub mod maps;
mod signing;
mod state;
mod store;
mod trial;
mod verify;
pub mod version;

use std::path::{Path, PathBuf};

pub use error::{OtaError, SignalError};
pub use keylist::{KeyList, KEY_LIST_FILE, KEY_LIST_SIGNATURE_FILE, STORED_KEY_LIST_FILE};
pub use manifest::{
    pack, pack_until, FileEntry, OtaManifest, BUNDLE_FILE, DEFAULT_VALIDITY_S, MANIFEST_FILE,
    MANIFEST_FORMAT, MAX_MANIFEST_BYTES, PACK_FILE, SIGNATURE_FILE,
};
pub use signing::{
    keygen, read_secret_key, sign, sign_key_list, PublicKey, MAX_SIGNATURES, MAX_SIGNATURE_BYTES,
    PUBLISHED_KEYS,
};
pub use state::{OtaState, RollbackRecord, STATE_FORMAT};
pub use store::{
    Activated, BundleInfo, Daemon, Floor, Gated, GcReport, Installed, PackScan, Placement,
    RolledBack, SignalDaemon, StartReport, Status, Store, TrialProgress, Verdict, FLOOR_FILE,
    PID_FILE, STATE_FILE,
};
pub use trial::{TrialRecorder, TrialView, FLUSH_INTERVAL};
pub use verify::{
    verify, verify_deferring, verify_threshold, DeferredDigests, DigestCheck, VerifiedBundle,
};

/// What a bundle must be built for to run here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTarget {
    /// QNN SoC model (QCS9075: 77).
    pub soc_model: u32,
    /// Hexagon HTP architecture (v73: 73).
    pub htp_arch: u32,
    /// This runtime's version, compared with a bundle's `min_runtime_version`.
    pub runtime_version: String,
}

/// Everything the store needs: where it lives, whom it trusts, and the trial rules.
#[derive(Clone, Debug)]
pub struct OtaSettings {
    /// The store's directory: `bundles/`, the `current` and `previous` links and the state file.
    pub root: PathBuf,
    /// Keys a bundle signature may verify against; empty: every update is refused.
    pub trusted_keys: Vec<PublicKey>,
    /// Distinct trusted keys that must have signed a bundle (k of n; 1: any one key).
    pub signature_threshold: usize,
    /// The fleet's offline root keys: a key list (`keys.json`) they signed replaces
    /// `trusted_keys` and `signature_threshold` and revokes keys. Empty: no key list.
    pub root_keys: Vec<PublicKey>,
    /// Healthy inferences a new bundle must complete before it is committed.
    pub trial_inferences: u32,
    /// Starts a new bundle gets (its activation is the first) before it is rolled back.
    pub max_trial_starts: u32,
    /// What this device is, checked against every bundle's manifest.
    pub target: DeviceTarget,
}

/// Why a gate refused a bundle: the gate's own typed error (the daemon's load or parity
/// failure, [`SignalError`] for the CLI), boxed so the store needs to know nothing of
/// either. Its message is what the state file records; [`OtaError::GateFailed`] hands
/// the error itself back in its `refusal` field.
pub type GateError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How the daemon (or the CLI) brings a bundle into service and proves it works.
///
/// The daemon's implementation publishes a hold, frees the old contexts, loads the new
/// ones from `bundle_dir` and runs the golden parity gate; an `Err` makes the store roll
/// back and call the gate again for the previous bundle.
pub trait Activation {
    /// Makes `bundle_dir` the running bundle and proves it works (for the daemon: loads it and
    /// runs the parity gate). An `Err` refuses the bundle: the store rolls back.
    fn reload_and_gate(&mut self, bundle_dir: &Path) -> Result<(), GateError>;
}

/// A closure is a gate; its error may be any error type (or a `String`).
impl<F, E> Activation for F
where
    F: FnMut(&Path) -> Result<(), E>,
    E: Into<GateError>,
{
    fn reload_and_gate(&mut self, bundle_dir: &Path) -> Result<(), GateError> {
        self(bundle_dir).map_err(Into::into)
    }
}
