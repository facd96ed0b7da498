//! The bundle store under the OTA root: the [`Store`] itself, its lock, its paths, and the
//! state file and links every operation goes through. The operations live in the
//! submodules, one concern each: `install` (verify, stage, rename), `activation`
//! (activate, rollback), `trial` (healthy counts, commit, verdict), `recovery` (start-up),
//! `gc` (status, garbage collection) and `signal` (the CLI's gate).
//!
//! Crash safety rests on three rules:
//! 1. a directory named `bundles/<hash>` only ever appears by renaming a fully written,
//!    fsynced and re-verified staging directory, so it is always complete;
//! 2. every change of roles writes `ota-state.json` first (atomically, durably), then moves
//!    the `current` / `previous` links, each by an atomic rename and a directory fsync;
//! 3. [`Store::on_start`] removes leftovers and points the links where the state says,
//!    so whatever step a crash interrupts, the next start runs a complete bundle that the
//!    state knows about.
//!
//! Every operation that changes anything holds an exclusive `flock` on `ota.lock`.

mod activation;
mod floor;
mod gc;
mod install;
mod packs;
mod recovery;
mod signal;
mod trial;

pub use activation::{Activated, RolledBack};
pub use floor::{Floor, FLOOR_FILE};
pub use gc::{BundleInfo, GcReport, Status};
pub use install::{Installed, Placement};
pub use packs::PackScan;
pub use recovery::StartReport;
pub use signal::{Daemon, Gated, SignalDaemon};
pub use trial::{TrialProgress, Verdict};

use crate::durable;
use crate::error::OtaError;
use crate::hex;
use crate::keylist::{KeyList, STORED_KEY_LIST_FILE};
use crate::signing::PublicKey;
use crate::state::OtaState;
use crate::verify::{verify_threshold, VerifiedBundle};
use crate::OtaSettings;
use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The state file name under the OTA root.
pub const STATE_FILE: &str = "ota-state.json";
/// The daemon's pid file under the OTA root (read by [`SignalDaemon`]).
pub const PID_FILE: &str = "vlad.pid";
const LOCK_FILE: &str = "ota.lock";
const STAGING_PREFIX: &str = ".staging-";
const TRASH_PREFIX: &str = ".trash-";

type StepHook = Box<dyn Fn(&str) + Send + Sync>;
type SpaceProbe = Box<dyn Fn(&Path) -> std::io::Result<u64> + Send + Sync>;
type Clock = Box<dyn Fn() -> u64 + Send + Sync>;

/// The OTA store rooted at [`OtaSettings::root`].
pub struct Store {
    settings: OtaSettings,
    step_hook: Option<StepHook>,
    free_space: Option<SpaceProbe>,
    clock: Option<Clock>,
    proc_root: PathBuf,
}

/// An exclusive lock on `ota.lock`, released on drop.
struct LockGuard {
    _lock: Flock<File>,
}

impl Store {
    /// A store over `settings.root`; nothing is read or created until an operation runs.
    pub fn new(settings: OtaSettings) -> Self {
        Store {
            settings,
            step_hook: None,
            free_space: None,
            clock: None,
            proc_root: PathBuf::from("/proc"),
        }
    }

    /// Calls `hook` with a stable name at every step boundary of every operation (after
    /// each staged file, before and after each fsync and rename, around the gate). For
    /// fault-injection tests and tracing; the default does nothing.
    pub fn set_step_hook(&mut self, hook: impl Fn(&str) + Send + Sync + 'static) {
        self.step_hook = Some(Box::new(hook));
    }

    /// Replaces the `statvfs` free-space probe (tests simulate a full disk with it).
    pub fn set_free_space_probe(
        &mut self,
        probe: impl Fn(&Path) -> std::io::Result<u64> + Send + Sync + 'static,
    ) {
        self.free_space = Some(Box::new(probe));
    }

    /// Where `gc` and `status` look for process maps (tests use a fake tree).
    pub fn set_proc_root(&mut self, proc_root: impl Into<PathBuf>) {
        self.proc_root = proc_root.into();
    }

    /// The settings the store was opened with.
    pub fn settings(&self) -> &OtaSettings {
        &self.settings
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.settings.root
    }

    /// `<root>/bundles`: one directory per installed bundle, named by its content hash.
    pub fn bundles_dir(&self) -> PathBuf {
        self.root().join("bundles")
    }

    /// `<root>/bundles/<hash>`.
    pub fn bundle_dir(&self, hash: &str) -> PathBuf {
        self.bundles_dir().join(hash)
    }

    /// `<root>/current`: the link to the running bundle (what `bundle.path` names on a device).
    pub fn current_link(&self) -> PathBuf {
        self.root().join("current")
    }

    /// `<root>/previous`: the link to the rollback target.
    pub fn previous_link(&self) -> PathBuf {
        self.root().join("previous")
    }

    /// `<root>/ota-state.json`: the roles of the bundles and the trial's progress.
    pub fn state_path(&self) -> PathBuf {
        self.root().join(STATE_FILE)
    }

    fn step(&self, name: &str) {
        if let Some(hook) = &self.step_hook {
            hook(name);
        }
    }

    /// Full verification of `dir` against this store's keys (the stored key list's, or the
    /// settings') and device.
    pub fn verify(&self, dir: &Path) -> Result<VerifiedBundle, OtaError> {
        let (keys, threshold) = self.trust()?;
        verify_threshold(dir, &keys, threshold, &self.settings.target)
    }

    /// [`Store::verify`] leaving the SHA-256 of the files in `defer` to their reader
    /// (see [`crate::verify_deferring`]): what a load that takes those files' bytes into
    /// memory checks as it reads them, in one pass.
    pub fn verify_deferring(
        &self,
        dir: &Path,
        defer: &std::collections::BTreeSet<String>,
    ) -> Result<(VerifiedBundle, crate::DeferredDigests), OtaError> {
        let (keys, threshold) = self.trust()?;
        crate::verify_deferring(dir, &keys, threshold, &self.settings.target, defer)
    }

    /// The keys bundles verify against and how many must have signed: the stored key
    /// list's (its revoked keys removed) when there is one, else the settings'.
    pub fn trust(&self) -> Result<(Vec<PublicKey>, usize), OtaError> {
        Ok(match self.key_list()? {
            Some(list) => list.trust(),
            None => (
                self.settings.trusted_keys.clone(),
                self.settings.signature_threshold,
            ),
        })
    }

    /// Verification of a bundle offered for install (what RAUC's pre-install handler
    /// asks): with the key list beside its manifest when that list is root-signed and
    /// newer than the stored one (install adopts it), else as [`Store::verify`]; and,
    /// as install, refused below the version floor or past its signed expiry.
    pub fn verify_offered(&self, dir: &Path) -> Result<VerifiedBundle, OtaError> {
        let offered = match self.settings.root_keys.is_empty() {
            true => None,
            false => KeyList::read(dir, &self.settings.root_keys)?,
        };
        let stored = self.key_list()?;
        let (keys, threshold) = match (offered, stored) {
            (Some(o), s) if s.as_ref().is_none_or(|s| o.version > s.version) => o.trust(),
            (_, Some(s)) => s.trust(),
            (_, None) => (
                self.settings.trusted_keys.clone(),
                self.settings.signature_threshold,
            ),
        };
        let verified = verify_threshold(dir, &keys, threshold, &self.settings.target)?;
        // What install would refuse next is refused here too, before anything is written.
        self.check_floor_and_expiry(&verified)?;
        Ok(verified)
    }

    /// The key list the store accepted last, if any (its root signature checked again).
    pub fn key_list(&self) -> Result<Option<KeyList>, OtaError> {
        if self.settings.root_keys.is_empty() {
            return Ok(None);
        }
        KeyList::read_stored(
            &self.root().join(STORED_KEY_LIST_FILE),
            &self.settings.root_keys,
        )
    }

    /// Keeps `list` if it is newer than the stored one (key lists never go back); called
    /// with the lock held. Returns whether it was kept.
    fn adopt_key_list(&self, list: &KeyList) -> Result<bool, OtaError> {
        if self
            .key_list()?
            .is_some_and(|stored| stored.version >= list.version)
        {
            return Ok(false);
        }
        durable::write_atomic(
            &self.root().join(STORED_KEY_LIST_FILE),
            &list.stored_bytes(),
            &mut |s| self.step(s),
        )?;
        log::info!("key list version {} adopted", list.version);
        Ok(true)
    }

    fn lock(&self) -> Result<LockGuard, OtaError> {
        let root = self.root();
        std::fs::create_dir_all(root).map_err(|e| OtaError::io("creating", root, e))?;
        let path = root.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)
            .map_err(|e| OtaError::io("opening", &path, e))?;
        durable::adopt(&path, root)?;
        let lock = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| OtaError::io("locking", &path, errno.into()))?;
        Ok(LockGuard { _lock: lock })
    }

    // ---- state and links -------------------------------------------------------------

    /// The content hash a link target names if it is one of ours (`bundles/<hash>`).
    fn managed_hash(target: &Path) -> Option<String> {
        let mut parts = target.iter();
        let first = parts.next()?;
        let second = parts.next()?;
        if parts.next().is_some() || first != "bundles" {
            return None;
        }
        let hash = second.to_str()?;
        hex::is_content_hash(hash).then(|| hash.to_owned())
    }

    fn link_hash(&self, link: &Path) -> Result<Option<String>, OtaError> {
        Ok(durable::read_link(link)?.and_then(|t| Self::managed_hash(&t)))
    }

    /// Reads the state; `Ok(None)` if there is no state file.
    fn read_state(&self) -> Result<Option<OtaState>, OtaError> {
        let path = self.state_path();
        match std::fs::read(&path) {
            Ok(bytes) => OtaState::parse(&path, &bytes).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(OtaError::io("reading", &path, e)),
        }
    }

    /// The state, or one rebuilt from the links when the file is missing or unreadable
    /// (a note is pushed to `repairs`). Rebuilding loses only trial bookkeeping.
    fn load_state(&self, repairs: &mut Vec<String>) -> Result<OtaState, OtaError> {
        let problem = match self.read_state() {
            Ok(Some(state)) => return Ok(state),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        };
        let mut state = OtaState {
            current: self.link_hash(&self.current_link())?,
            previous: self.link_hash(&self.previous_link())?,
            ..OtaState::default()
        };
        if state.previous == state.current {
            state.previous = None;
        }
        if let Some(p) = problem {
            repairs.push(format!("state rebuilt from the links ({p})"));
        } else if state.current.is_some() {
            repairs.push("no state file: state rebuilt from the links".into());
        }
        Ok(state)
    }

    fn write_state(&self, state: &OtaState) -> Result<(), OtaError> {
        durable::write_atomic(&self.state_path(), &state.to_bytes(), &mut |s| self.step(s))
    }

    /// Points `link` at `bundles/<hash>`, or removes it for `None` (only if it is one of
    /// ours: a link the image installed elsewhere is left alone).
    fn set_link(
        &self,
        link: &Path,
        hash: Option<&str>,
        repairs: &mut Vec<String>,
    ) -> Result<(), OtaError> {
        let existing = durable::read_link(link)?;
        let name = link.file_name().unwrap_or_default().to_string_lossy();
        match hash {
            Some(h) => {
                let target = Path::new("bundles").join(h);
                if existing.as_deref() != Some(target.as_path()) {
                    durable::replace_symlink(link, &target, &mut |s| self.step(s))?;
                    repairs.push(format!("`{name}` now points at bundles/{h}"));
                }
            }
            None => {
                if existing.as_deref().and_then(Self::managed_hash).is_some() {
                    durable::remove_symlink(link, &mut |s| self.step(s))?;
                    repairs.push(format!("`{name}` removed"));
                }
            }
        }
        Ok(())
    }

    /// Makes the links say what the state says (current first: it is what the daemon loads).
    fn apply_links(&self, state: &OtaState) -> Result<Vec<String>, OtaError> {
        let mut moved = Vec::new();
        self.set_link(&self.current_link(), state.current.as_deref(), &mut moved)?;
        self.set_link(&self.previous_link(), state.previous.as_deref(), &mut moved)?;
        Ok(moved)
    }

    /// Resolves a full content hash or a unique prefix (at least 4 characters) to an
    /// installed bundle's hash.
    pub fn resolve(&self, hash_or_prefix: &str) -> Result<String, OtaError> {
        let not_installed = || OtaError::NotInstalled {
            hash: hash_or_prefix.to_owned(),
        };
        if hex::is_content_hash(hash_or_prefix) {
            return if self.bundle_dir(hash_or_prefix).is_dir() {
                Ok(hash_or_prefix.to_owned())
            } else {
                Err(not_installed())
            };
        }
        if hash_or_prefix.len() < 4 {
            return Err(not_installed());
        }
        let matches: Vec<String> = self
            .installed_hashes()?
            .into_iter()
            .filter(|h| h.starts_with(hash_or_prefix))
            .collect();
        match matches.len() {
            0 => Err(not_installed()),
            1 => Ok(matches.into_iter().next().unwrap_or_default()),
            n => Err(OtaError::AmbiguousHash {
                prefix: hash_or_prefix.to_owned(),
                matches: n,
            }),
        }
    }

    /// Names of the complete bundle directories under `bundles/`.
    fn installed_hashes(&self) -> Result<Vec<String>, OtaError> {
        let dir = self.bundles_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(OtaError::io("listing", &dir, e)),
        };
        let mut hashes = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| OtaError::io("listing", &dir, e))?;
            if let Some(name) = entry.file_name().to_str() {
                if hex::is_content_hash(name) {
                    hashes.push(name.to_owned());
                }
            }
        }
        hashes.sort();
        Ok(hashes)
    }

    /// Renames `dir` out of the bundle namespace, durably, then deletes it: a crash mid-way
    /// leaves a `.trash-` directory for the next start, never a half-deleted `bundles/<hash>`.
    fn discard(&self, dir: &Path, label: &str) -> Result<u64, OtaError> {
        // Beside it: `bundles/` or `packs/`.
        let bundles = dir
            .parent()
            .map_or_else(|| self.bundles_dir(), Path::to_owned);
        let trash = bundles.join(format!("{TRASH_PREFIX}{label}-{}", std::process::id()));
        let bytes = dir_bytes(dir);
        std::fs::rename(dir, &trash).map_err(|e| OtaError::io("moving to trash", dir, e))?;
        durable::fsync_dir(&bundles)?;
        self.step("discard: moved to trash");
        std::fs::remove_dir_all(&trash).map_err(|e| OtaError::io("removing", &trash, e))?;
        Ok(bytes)
    }

    /// The version the installed bundle `hash`'s manifest names (`None`: unreadable).
    fn bundle_version(&self, hash: &str) -> Option<String> {
        let dir = self.bundle_dir(hash);
        let path = dir.join(crate::MANIFEST_FILE);
        let bytes =
            crate::verify::read_small(&path, crate::MAX_MANIFEST_BYTES, &dir, crate::MANIFEST_FILE)
                .ok()?;
        crate::OtaManifest::parse(&path, &bytes)
            .ok()
            .map(|m| m.version)
    }

    /// The current bundle's content hash and directory, read from the `current` link.
    /// The daemon loads that directory (not the link, which may move) and passes the hash
    /// to [`Store::record_healthy`].
    pub fn current(&self) -> Result<Option<(String, PathBuf)>, OtaError> {
        Ok(self
            .link_hash(&self.current_link())?
            .map(|h| (h.clone(), self.bundle_dir(&h))))
    }
}

/// Total size of the regular files under `dir` (0 for what cannot be read).
fn dir_bytes(dir: &Path) -> u64 {
    crate::verify::walk(dir)
        .map(|l| {
            l.files
                .iter()
                .filter_map(|f| std::fs::symlink_metadata(dir.join(f)).ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
