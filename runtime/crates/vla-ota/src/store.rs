//! The bundle store under the OTA root: install (verify, stage, rename), activate (state,
//! links, gate), trial bookkeeping, rollback, start-up recovery, status and garbage
//! collection.
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

use crate::durable;
use crate::error::{OtaError, SignalError};
use crate::hex;
use crate::manifest::{OtaManifest, MANIFEST_FILE, SIGNATURE_FILE};
use crate::maps;
use crate::state::{OtaState, RollbackRecord};
use crate::verify::{verify, VerifiedBundle};
use crate::{Activation, GateError, OtaSettings};
use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::io::Write;
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

/// The OTA store rooted at [`OtaSettings::root`].
pub struct Store {
    settings: OtaSettings,
    step_hook: Option<StepHook>,
    free_space: Option<SpaceProbe>,
    proc_root: PathBuf,
}

/// How [`Store::install_with`] places the verified files under `bundles/<hash>/`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Copy every file: the source may be changed or removed afterwards.
    #[default]
    Copy,
    /// Hard-link each file that lies on the store's filesystem and copy the rest. For
    /// sources that are themselves read-only and content-addressed (a RAUC artifact
    /// repository), so gigabytes of context binaries are not stored twice. Every linked
    /// file is hashed again through its new name and fsynced, and the store verifies the
    /// bundle at every start, so a source changed in place later is caught there. The
    /// daemon never maps a file whose inode has more than one link (vla-qnn
    /// `ContextBinary::open` reads a private copy of it), so the source store writing
    /// or truncating its file in place cannot fault or change what QNN reads.
    HardLink,
}

/// A bundle placed under `bundles/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    pub hash: String,
    pub dir: PathBuf,
    /// The identical bundle was already installed; nothing was written.
    pub already_installed: bool,
    /// Files hard-linked from the source instead of copied ([`Placement::HardLink`]).
    pub linked_files: usize,
}

/// A successful activation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Activated {
    pub hash: String,
    pub dir: PathBuf,
    /// It was already the current bundle; nothing changed.
    pub already_current: bool,
    /// The rollback target now kept in `previous`.
    pub previous: Option<String>,
}

/// A rollback that was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolledBack {
    pub from: String,
    /// `None`: there was nothing to return to, so no bundle is current.
    pub to: Option<String>,
    pub reason: String,
    /// The gate's refusal of the bundle rolled back to (its one line), if it was called
    /// and failed.
    pub gate_error: Option<String>,
}

/// Progress of the trial after [`Store::record_healthy`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrialProgress {
    /// The running bundle is not on trial (already committed, or not the current one).
    NotOnTrial,
    OnTrial {
        healthy: u64,
        needed: u64,
    },
    /// This call reached the threshold: the bundle is now committed.
    Committed(String),
}

/// What the daemon has made of an activated bundle so far, as the state file records it
/// ([`Store::verdict`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not run yet: the daemon has not reloaded, or has run no inference since.
    Pending,
    /// It passed the daemon's parity gate and has run `healthy` of the `needed` healthy
    /// inferences of its trial.
    Running { healthy: u64, needed: u64 },
    /// Its trial is over: committed, the rollback target of the next update.
    Committed,
    /// It was rolled back (its gate failed, or it crash-looped).
    RolledBack { to: Option<String>, reason: String },
    /// Another bundle was made current since.
    Superseded { current: Option<String> },
}

/// What [`Store::on_start`] found and did.
#[derive(Clone, Debug, Default)]
pub struct StartReport {
    /// Content hash and directory of the bundle to load; `None`: nothing to run.
    pub current: Option<(String, PathBuf)>,
    /// The current bundle is on trial; this is its start number (activation was 1).
    pub trial_start: Option<u32>,
    /// A rollback made before anything was loaded (crash loop, or a bundle that no longer
    /// verifies).
    pub rolled_back: Option<RolledBack>,
    /// Leftovers of interrupted operations that were removed.
    pub cleaned: Vec<PathBuf>,
    /// Repairs made, one line each (links moved to match the state, state rebuilt).
    pub repairs: Vec<String>,
}

/// One installed bundle as `status` shows it.
#[derive(Clone, Debug)]
pub struct BundleInfo {
    pub hash: String,
    pub name: String,
    pub version: String,
    pub bytes: u64,
    pub mapped: bool,
}

/// The store's state, links and bundles.
#[derive(Clone, Debug)]
pub struct Status {
    pub root: PathBuf,
    pub state: OtaState,
    pub current_link: Option<PathBuf>,
    pub previous_link: Option<PathBuf>,
    pub bundles: Vec<BundleInfo>,
    /// Staging or trash directories present (an operation in progress or interrupted).
    pub leftovers: Vec<String>,
    pub trial_inferences: u32,
    pub max_trial_starts: u32,
}

/// What `gc` removed and why it kept the rest.
#[derive(Clone, Debug, Default)]
pub struct GcReport {
    pub removed: Vec<String>,
    pub freed_bytes: u64,
    /// (hash, reason) for bundles kept although unreferenced.
    pub kept: Vec<(String, String)>,
    pub cleaned: Vec<PathBuf>,
    /// Processes whose maps could not be read (permission), so not checked.
    pub unchecked_processes: usize,
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

    pub fn settings(&self) -> &OtaSettings {
        &self.settings
    }

    pub fn root(&self) -> &Path {
        &self.settings.root
    }

    pub fn bundles_dir(&self) -> PathBuf {
        self.root().join("bundles")
    }

    /// `<root>/bundles/<hash>`.
    pub fn bundle_dir(&self, hash: &str) -> PathBuf {
        self.bundles_dir().join(hash)
    }

    pub fn current_link(&self) -> PathBuf {
        self.root().join("current")
    }

    pub fn previous_link(&self) -> PathBuf {
        self.root().join("previous")
    }

    pub fn state_path(&self) -> PathBuf {
        self.root().join(STATE_FILE)
    }

    fn step(&self, name: &str) {
        if let Some(hook) = &self.step_hook {
            hook(name);
        }
    }

    /// Full verification of `dir` against this store's keys and device.
    pub fn verify(&self, dir: &Path) -> Result<VerifiedBundle, OtaError> {
        verify(dir, &self.settings.trusted_keys, &self.settings.target)
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
        let bundles = self.bundles_dir();
        let trash = bundles.join(format!("{TRASH_PREFIX}{label}-{}", std::process::id()));
        let bytes = dir_bytes(dir);
        std::fs::rename(dir, &trash).map_err(|e| OtaError::io("moving to trash", dir, e))?;
        durable::fsync_dir(&bundles)?;
        self.step("discard: moved to trash");
        std::fs::remove_dir_all(&trash).map_err(|e| OtaError::io("removing", &trash, e))?;
        Ok(bytes)
    }

    // ---- install ---------------------------------------------------------------------

    /// Verifies the bundle at `source` (signature, target, every file) and, only if it
    /// passes, copies it durably to `bundles/<content-hash>/`. Installing an identical
    /// bundle again is a no-op. Nothing is activated.
    pub fn install(&self, source: &Path) -> Result<Installed, OtaError> {
        self.install_with(source, Placement::Copy)
    }

    /// [`Store::install`] with the files placed as `placement` says.
    pub fn install_with(&self, source: &Path, placement: Placement) -> Result<Installed, OtaError> {
        let verified = self.verify(source)?;
        let _lock = self.lock()?;
        let bundles = self.bundles_dir();
        if !bundles.is_dir() {
            std::fs::create_dir_all(&bundles).map_err(|e| OtaError::io("creating", &bundles, e))?;
            durable::adopt(&bundles, self.root())?;
            durable::fsync_dir(self.root())?;
        }
        let hash = verified.content_hash.clone();
        let dir = self.bundle_dir(&hash);
        if dir.exists() {
            match self.verify(&dir) {
                Ok(existing) if existing.content_hash == hash => {
                    return Ok(Installed {
                        hash,
                        dir,
                        already_installed: true,
                        linked_files: 0,
                    })
                }
                outcome => {
                    let reason = match outcome {
                        Ok(_) => "its manifest does not match its name".to_owned(),
                        Err(e) => e.to_string(),
                    };
                    let state = self.load_state(&mut Vec::new())?;
                    if state.referenced().any(|h| h == hash) {
                        return Err(OtaError::InUseCorrupt { hash, reason });
                    }
                    log::warn!("replacing damaged installed bundle {hash}: {reason}");
                    self.discard(&dir, &hash)?;
                }
            }
        }

        let block = durable::block_size(&bundles);
        let round = |n: u64| n.div_ceil(block).max(1) * block;
        let directories = verified
            .manifest
            .files
            .iter()
            .filter(|f| f.path.contains('/'))
            .count() as u64
            + 1;
        // Files that will be hard-linked take no data blocks.
        let linkable = placement == Placement::HardLink && same_filesystem(source, &bundles);
        let needed = verified
            .manifest
            .files
            .iter()
            .map(|f| if linkable { 0 } else { round(f.size) })
            .sum::<u64>()
            + round(verified.manifest_bytes.len() as u64)
            + round(256)
            + directories * block;
        let free = match &self.free_space {
            Some(probe) => probe(&bundles),
            None => durable::free_bytes(&bundles),
        }
        .map_err(|e| OtaError::io("reading free space of", &bundles, e))?;
        if needed > free {
            return Err(OtaError::InsufficientSpace {
                dir: bundles,
                needed,
                free,
            });
        }

        let staging = bundles.join(format!("{STAGING_PREFIX}{hash}-{}", std::process::id()));
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(|e| OtaError::io("removing", &staging, e))?;
        }
        let linked_files = match self.stage(&verified, &staging, placement) {
            Ok(n) => n,
            Err(e) => {
                // Best effort: the next start removes any staging directory left behind.
                let _ = std::fs::remove_dir_all(&staging);
                return Err(e);
            }
        };
        self.step("install: before rename of staging");
        std::fs::rename(&staging, &dir)
            .map_err(|e| OtaError::io("renaming staging to", &dir, e))?;
        self.step("install: before fsync of bundles");
        durable::fsync_dir(&bundles)?;
        self.step("install: done");
        Ok(Installed {
            hash,
            dir,
            already_installed: false,
            linked_files,
        })
    }

    /// Copies (or hard-links) every listed file, hashing it through its new name, writes
    /// the manifest and the signature into `staging`, fsyncs files and directories, and
    /// verifies the copy. Returns how many files were linked.
    fn stage(
        &self,
        verified: &VerifiedBundle,
        staging: &Path,
        placement: Placement,
    ) -> Result<usize, OtaError> {
        let mut linked = 0;
        std::fs::create_dir(staging).map_err(|e| OtaError::io("creating", staging, e))?;
        // Looked up once: every file and directory staged gets the same owner.
        let owner = durable::owner_for(self.root())?;
        durable::give(staging, owner)?;
        self.step("stage: directory created");
        let mut directories = vec![staging.to_owned()];
        for entry in &verified.manifest.files {
            let target = staging.join(&entry.path);
            let parent = durable::parent_of(&target);
            if !parent.is_dir() {
                std::fs::create_dir_all(&parent)
                    .map_err(|e| OtaError::io("creating", &parent, e))?;
                let mut d = parent.clone();
                while d != staging && !directories.contains(&d) {
                    durable::give(&d, owner)?;
                    directories.push(d.clone());
                    d = durable::parent_of(&d);
                }
            }
            let source = verified.dir.join(&entry.path);
            let (size, digest) = match placement {
                Placement::Copy => {
                    let copied = copy_file(&source, &target)?;
                    durable::give(&target, owner)?;
                    copied
                }
                Placement::HardLink => match std::fs::hard_link(&source, &target) {
                    Ok(()) => {
                        linked += 1;
                        hash_file(&target)?
                    }
                    // Another filesystem, or a file the kernel will not let this user
                    // link (fs.protected_hardlinks): copy it.
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(nix::libc::EXDEV) | Some(nix::libc::EPERM)
                        ) =>
                    {
                        let copied = copy_file(&source, &target)?;
                        durable::give(&target, owner)?;
                        copied
                    }
                    Err(e) => return Err(OtaError::io("hard-linking", &target, e)),
                },
            };
            let found = hex::encode(&digest);
            if size != entry.size || found != entry.sha256 {
                // The source changed after it was verified.
                return Err(OtaError::HashMismatch {
                    bundle: verified.dir.clone(),
                    path: entry.path.clone(),
                    expected: entry.sha256.clone(),
                    found: format!("{found} ({size} bytes) while copying"),
                });
            }
            self.step(&format!("stage {}: written", entry.path));
            fsync_path(&target)?;
            self.step(&format!("stage {}: fsynced", entry.path));
        }
        let manifest = staging.join(MANIFEST_FILE);
        write_new(&manifest, &verified.manifest_bytes)?;
        durable::give(&manifest, owner)?;
        let signature_source = verified.dir.join(SIGNATURE_FILE);
        let signature = std::fs::read(&signature_source)
            .map_err(|e| OtaError::io("reading", &signature_source, e))?;
        let signature_copy = staging.join(SIGNATURE_FILE);
        write_new(&signature_copy, &signature)?;
        durable::give(&signature_copy, owner)?;
        self.step("stage: manifest and signature fsynced");
        // Deepest first, so each directory's entries are durable before its parent's.
        directories.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in &directories {
            durable::fsync_dir(d)?;
            let rel = d.strip_prefix(staging).unwrap_or(d);
            self.step(&format!("stage directory /{}: fsynced", rel.display()));
        }
        self.step("stage: directories fsynced");
        let copy = self.verify(staging)?;
        if copy.content_hash != verified.content_hash {
            return Err(OtaError::HashMismatch {
                bundle: staging.to_owned(),
                path: MANIFEST_FILE.into(),
                expected: verified.content_hash.clone(),
                found: copy.content_hash,
            });
        }
        self.step("stage: copy verified");
        Ok(linked)
    }

    // ---- activation, trial, rollback -------------------------------------------------

    /// Makes the installed bundle `hash` (or a unique prefix) current and puts it on
    /// trial: verifies it again, records the new roles in the state, swaps the links,
    /// then calls `gate`. If the gate refuses, rolls back to the previous bundle, calls
    /// the gate for it, and returns [`OtaError::GateFailed`].
    pub fn activate(
        &self,
        hash_or_prefix: &str,
        gate: &mut dyn Activation,
    ) -> Result<Activated, OtaError> {
        let _lock = self.lock()?;
        let hash = self.resolve(hash_or_prefix)?;
        let mut repairs = Vec::new();
        let state = self.load_state(&mut repairs)?;
        self.apply_links(&state)?;
        if state.current.is_none() {
            if let Some(target) = durable::read_link(&self.current_link())? {
                // Replacing a link the store does not manage would lose the only way back.
                return Err(OtaError::State {
                    path: self.current_link(),
                    reason: format!(
                        "points at {}, outside the store: provision that bundle with `vlad ota install` and `activate`, or remove the link",
                        target.display()
                    ),
                });
            }
        }
        let dir = self.bundle_dir(&hash);
        if state.current.as_deref() == Some(hash.as_str()) {
            return Ok(Activated {
                hash,
                dir,
                already_current: true,
                previous: state.previous,
            });
        }
        let verified = self.verify(&dir)?;
        if verified.content_hash != hash {
            return Err(OtaError::InUseCorrupt {
                hash,
                reason: "its manifest hash does not match its directory name".into(),
            });
        }
        // The rollback target is the last committed bundle: replacing a bundle still on
        // trial keeps the one before it.
        let previous = if state.trial.is_some() {
            state.previous.clone()
        } else {
            state.current.clone()
        };
        let next = OtaState {
            current: Some(hash.clone()),
            previous: previous.clone(),
            trial: Some(hash.clone()),
            trial_starts: 1,
            healthy_inferences: 0,
            ..state
        };
        self.step("activate: before state write");
        self.write_state(&next)?;
        self.apply_links(&next)?;
        self.step("activate: before gate");
        match gate.reload_and_gate(&dir) {
            Ok(()) => {
                self.step("activate: gate passed");
                Ok(Activated {
                    hash,
                    dir,
                    already_current: false,
                    previous,
                })
            }
            Err(refusal) => {
                self.step("activate: gate failed");
                let reason = refusal.to_string();
                let rolled = self.roll_back_locked(next, &reason, Some(gate), true)?;
                Err(OtaError::GateFailed {
                    hash,
                    reason,
                    rolled_back_to: rolled.to,
                    rollback_error: rolled.gate_error,
                    refusal,
                })
            }
        }
    }

    /// Leaves the current bundle for `state.previous`. `automatic` (a failed trial): the
    /// bundle left is not kept as a rollback target. Manual rollback of a committed
    /// bundle swaps the two, so it can be undone. A previous bundle that no longer
    /// verifies is not returned to: nothing is made current instead (fail closed).
    fn roll_back_locked(
        &self,
        state: OtaState,
        reason: &str,
        gate: Option<&mut dyn Activation>,
        automatic: bool,
    ) -> Result<RolledBack, OtaError> {
        let from = state.current.clone().unwrap_or_default();
        let mut to = state.previous.clone();
        let mut why = reason.to_owned();
        if let Some(p) = &to {
            if let Err(e) = self.verify(&self.bundle_dir(p)) {
                why = format!("{reason}; previous bundle {p} unusable: {e}");
                to = None;
            }
        }
        let keep_left = !automatic && state.trial.is_none();
        let next = OtaState {
            current: to.clone(),
            previous: if keep_left {
                state.current.clone()
            } else {
                None
            },
            trial: None,
            trial_starts: 0,
            healthy_inferences: 0,
            last_rollback: Some(RollbackRecord {
                from: from.clone(),
                to: to.clone(),
                reason: why.clone(),
            }),
            ..state
        };
        self.step("rollback: before state write");
        self.write_state(&next)?;
        self.apply_links(&next)?;
        self.step("rollback: links moved");
        log::warn!(
            "rolled back from bundle {from} to {}: {why}",
            to.as_deref().unwrap_or("nothing")
        );
        let gate_error = match (gate, &to) {
            (Some(gate), Some(p)) => gate
                .reload_and_gate(&self.bundle_dir(p))
                .err()
                .map(|refusal| refusal.to_string()),
            _ => None,
        };
        self.step("rollback: done");
        Ok(RolledBack {
            from,
            to,
            reason: why,
            gate_error,
        })
    }

    /// Operator rollback to the previous bundle, calling `gate` for it. During a trial
    /// the trial bundle is abandoned; after a commit the two bundles swap roles.
    pub fn rollback(
        &self,
        reason: &str,
        gate: &mut dyn Activation,
    ) -> Result<RolledBack, OtaError> {
        let _lock = self.lock()?;
        let state = self.load_state(&mut Vec::new())?;
        self.apply_links(&state)?;
        if state.previous.is_none() || state.current.is_none() {
            return Err(OtaError::NoPrevious);
        }
        self.roll_back_locked(state, reason, Some(gate), false)
    }

    /// The daemon's verdict on a trial bundle that failed at run time (its gate after a
    /// restart or reload): rolls back like a failed activation.
    pub fn fail_trial(
        &self,
        reason: &str,
        gate: &mut dyn Activation,
    ) -> Result<Option<RolledBack>, OtaError> {
        let _lock = self.lock()?;
        let state = self.load_state(&mut Vec::new())?;
        if state.trial.is_none() {
            return Ok(None);
        }
        self.roll_back_locked(state, reason, Some(gate), true)
            .map(Some)
    }

    /// Marks the trial bundle good: it stays current and becomes the rollback target of
    /// the next update. Returns the committed hash, `None` if nothing was on trial.
    pub fn commit(&self) -> Result<Option<String>, OtaError> {
        let _lock = self.lock()?;
        let state = self.load_state(&mut Vec::new())?;
        self.commit_locked(state)
    }

    fn commit_locked(&self, state: OtaState) -> Result<Option<String>, OtaError> {
        let Some(hash) = state.trial.clone() else {
            return Ok(None);
        };
        let next = OtaState {
            trial: None,
            trial_starts: 0,
            healthy_inferences: 0,
            ..state
        };
        self.step("commit: before state write");
        self.write_state(&next)?;
        log::info!("bundle {hash} committed");
        Ok(Some(hash))
    }

    /// Counts `n` healthy inferences of the running bundle `running` (its content hash,
    /// as [`Store::current`] returned when it was loaded). Reaching `trial_inferences`
    /// commits it. Counts nothing if `running` is not the bundle on trial, so a daemon
    /// still running an older bundle can never commit one it has not run.
    pub fn record_healthy(&self, running: &str, n: u64) -> Result<TrialProgress, OtaError> {
        // Cheap check without the lock: the common case (committed) writes nothing.
        match self.read_state()? {
            Some(s) if s.trial.as_deref() == Some(running) => {}
            _ => return Ok(TrialProgress::NotOnTrial),
        }
        let _lock = self.lock()?;
        let state = self.load_state(&mut Vec::new())?;
        if state.trial.as_deref() != Some(running) {
            return Ok(TrialProgress::NotOnTrial);
        }
        let needed = u64::from(self.settings.trial_inferences);
        let healthy = state.healthy_inferences.saturating_add(n);
        if healthy >= needed {
            return Ok(self
                .commit_locked(state)?
                .map_or(TrialProgress::NotOnTrial, TrialProgress::Committed));
        }
        self.write_state(&OtaState {
            healthy_inferences: healthy,
            ..state
        })?;
        Ok(TrialProgress::OnTrial { healthy, needed })
    }

    /// The daemon's verdict so far on the activated bundle `hash`. Reads the state file
    /// only (every write of it is an atomic rename), so it may be polled while the daemon
    /// and other OTA commands run.
    pub fn verdict(&self, hash: &str) -> Result<Verdict, OtaError> {
        let Some(state) = self.read_state()? else {
            return Ok(Verdict::Pending);
        };
        if state.current.as_deref() == Some(hash) {
            return Ok(match state.trial.as_deref() {
                Some(_) if state.healthy_inferences == 0 => Verdict::Pending,
                Some(_) => Verdict::Running {
                    healthy: state.healthy_inferences,
                    needed: u64::from(self.settings.trial_inferences),
                },
                None => Verdict::Committed,
            });
        }
        Ok(match state.last_rollback {
            Some(r) if r.from == hash => Verdict::RolledBack {
                to: r.to,
                reason: r.reason,
            },
            _ => Verdict::Superseded {
                current: state.current,
            },
        })
    }

    /// The current bundle's content hash and directory, read from the `current` link.
    /// The daemon loads that directory (not the link, which may move) and passes the hash
    /// to [`Store::record_healthy`].
    pub fn current(&self) -> Result<Option<(String, PathBuf)>, OtaError> {
        Ok(self
            .link_hash(&self.current_link())?
            .map(|h| (h.clone(), self.bundle_dir(&h))))
    }

    /// Start-up recovery, before the daemon loads anything: removes leftovers of
    /// interrupted operations, repairs the links to match the state, verifies the current
    /// bundle (rolling back if it no longer verifies), and counts a start of a trial
    /// bundle, rolling back when the trial has used its `max_trial_starts` (crash loop).
    pub fn on_start(&self) -> Result<StartReport, OtaError> {
        let _lock = self.lock()?;
        let mut report = StartReport {
            cleaned: self.clean_leftovers()?,
            ..StartReport::default()
        };
        let rebuilt = !matches!(self.read_state(), Ok(Some(_)));
        let mut state = self.load_state(&mut report.repairs)?;
        if rebuilt && state.current.is_some() {
            // Adopts links provisioned without a state (a factory image) as committed.
            self.write_state(&state)?;
        }
        if state
            .previous
            .as_deref()
            .is_some_and(|p| !self.bundle_dir(p).is_dir())
        {
            report.repairs.push(format!(
                "previous bundle {} is not installed: no rollback target",
                state.previous.as_deref().unwrap_or_default()
            ));
            state.previous = None;
            self.write_state(&state)?;
        }
        if let Some(current) = state.current.clone() {
            let problem = match self.verify(&self.bundle_dir(&current)) {
                Ok(v) if v.content_hash == current => None,
                Ok(_) => Some("its manifest hash does not match its directory name".to_owned()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(problem) = problem {
                let reason = format!("current bundle {current} does not verify: {problem}");
                report.rolled_back = Some(self.roll_back_locked(state, &reason, None, true)?);
                report
                    .repairs
                    .extend(self.apply_links(&self.load_state(&mut Vec::new())?)?);
                report.current = self.current()?;
                return Ok(report);
            }
        }
        if state.trial.is_some() {
            if state.trial_starts >= self.settings.max_trial_starts {
                let reason = format!(
                    "crash loop: {} starts on trial without {} healthy inferences ({} done)",
                    state.trial_starts, self.settings.trial_inferences, state.healthy_inferences
                );
                report.rolled_back = Some(self.roll_back_locked(state, &reason, None, true)?);
            } else {
                state.trial_starts += 1;
                self.step("start: before counting a trial start");
                self.write_state(&state)?;
                report.trial_start = Some(state.trial_starts);
                report.repairs.extend(self.apply_links(&state)?);
            }
        } else {
            report.repairs.extend(self.apply_links(&state)?);
        }
        report.current = self.current()?;
        Ok(report)
    }

    /// Removes staging and trash directories and temporary files of interrupted
    /// operations. Only called with the lock held, so none of them is in use.
    fn clean_leftovers(&self) -> Result<Vec<PathBuf>, OtaError> {
        let mut cleaned = Vec::new();
        let bundles = self.bundles_dir();
        if let Ok(entries) = std::fs::read_dir(&bundles) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(STAGING_PREFIX) || name.starts_with(TRASH_PREFIX) {
                    let path = entry.path();
                    std::fs::remove_dir_all(&path)
                        .map_err(|e| OtaError::io("removing", &path, e))?;
                    cleaned.push(path);
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(self.root()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') && name.contains(".tmp-") {
                    let path = entry.path();
                    std::fs::remove_file(&path).map_err(|e| OtaError::io("removing", &path, e))?;
                    cleaned.push(path);
                }
            }
        }
        if !cleaned.is_empty() {
            if bundles.is_dir() {
                durable::fsync_dir(&bundles)?;
            }
            durable::fsync_dir(self.root())?;
        }
        Ok(cleaned)
    }

    // ---- status and gc ---------------------------------------------------------------

    /// State, links, installed bundles (name, version, size, whether mapped) and
    /// leftovers. Takes no lock, so it never waits behind a long install.
    pub fn status(&self) -> Result<Status, OtaError> {
        let state = self.load_state(&mut Vec::new())?;
        let scan = self.scan_maps();
        let mut bundles = Vec::new();
        for hash in self.installed_hashes()? {
            let dir = self.bundle_dir(&hash);
            let manifest_path = dir.join(MANIFEST_FILE);
            let (name, version) = match std::fs::read(&manifest_path)
                .ok()
                .and_then(|b| OtaManifest::parse(&manifest_path, &b).ok())
            {
                Some(m) => (m.name, m.version),
                None => ("(unreadable manifest)".into(), String::new()),
            };
            bundles.push(BundleInfo {
                mapped: scan.mapped.contains(&hash),
                hash,
                name,
                version,
                bytes: dir_bytes(&dir),
            });
        }
        let mut leftovers = Vec::new();
        if let Ok(entries) = std::fs::read_dir(self.bundles_dir()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(STAGING_PREFIX) || name.starts_with(TRASH_PREFIX) {
                    leftovers.push(name);
                }
            }
        }
        Ok(Status {
            root: self.root().to_owned(),
            state,
            current_link: durable::read_link(&self.current_link())?,
            previous_link: durable::read_link(&self.previous_link())?,
            bundles,
            leftovers,
            trial_inferences: self.settings.trial_inferences,
            max_trial_starts: self.settings.max_trial_starts,
        })
    }

    fn scan_maps(&self) -> maps::MapsScan {
        let bundles = self.bundles_dir();
        let canonical = std::fs::canonicalize(&bundles).unwrap_or(bundles);
        maps::scan(&self.proc_root, &canonical)
    }

    /// Deletes installed bundles that are not current, previous or on trial and that no
    /// process maps. Processes whose maps cannot be read (another user's without root, or
    /// a container's init) are counted in [`GcReport::unchecked_processes`]: run gc as
    /// the daemon's user or root so that the daemon is always among the checked ones.
    pub fn gc(&self) -> Result<GcReport, OtaError> {
        let _lock = self.lock()?;
        let mut report = GcReport {
            cleaned: self.clean_leftovers()?,
            ..GcReport::default()
        };
        let state = self.load_state(&mut Vec::new())?;
        let scan = self.scan_maps();
        report.unchecked_processes = scan.unreadable;
        for hash in self.installed_hashes()? {
            if state.referenced().any(|h| h == hash) {
                continue;
            }
            if scan.mapped.contains(&hash) {
                report
                    .kept
                    .push((hash, "still mapped by a running process".into()));
                continue;
            }
            report.freed_bytes += self.discard(&self.bundle_dir(&hash), &hash)?;
            report.removed.push(hash);
        }
        Ok(report)
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

/// Copies `source` to the new file `target` (mode 0444), hashing what is written.
fn copy_file(source: &Path, target: &Path) -> Result<(u64, [u8; 32]), OtaError> {
    let mut output = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(target)
        .map_err(|e| OtaError::io("creating", target, e))?;
    hash_through(source, |chunk| {
        output
            .write_all(chunk)
            .map_err(|e| OtaError::io("writing", target, e))
    })
}

/// Size and SHA-256 of the regular file `path` (not followed if it is a symbolic link).
fn hash_file(path: &Path) -> Result<(u64, [u8; 32]), OtaError> {
    hash_through(path, |_| Ok(()))
}

/// Reads `path` once, hashing every chunk and handing it to `sink`.
fn hash_through(
    path: &Path,
    mut sink: impl FnMut(&[u8]) -> Result<(), OtaError>,
) -> Result<(u64, [u8; 32]), OtaError> {
    let mut input = durable::open_no_follow(path)?;
    let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match std::io::Read::read(&mut input, &mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(OtaError::io("reading", path, e)),
        };
        sha2::Digest::update(&mut hasher, &buffer[..n]);
        sink(&buffer[..n])?;
        total += n as u64;
    }
    Ok((total, sha2::Digest::finalize(hasher).into()))
}

/// Both paths exist on one filesystem (hard links between them are possible).
fn same_filesystem(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => false,
    }
}

fn fsync_path(path: &Path) -> Result<(), OtaError> {
    let file = File::open(path).map_err(|e| OtaError::io("opening", path, e))?;
    durable::fsync_file(&file, path)
}

/// Writes a new read-only file and fsyncs it.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), OtaError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)
        .map_err(|e| OtaError::io("creating", path, e))?;
    file.write_all(bytes)
        .map_err(|e| OtaError::io("writing", path, e))?;
    durable::fsync_file(&file, path)
}

/// The activation gate of the `vlad ota activate` command, which runs outside the
/// daemon: verifies the bundle again, then asks the running daemon to reload by sending
/// SIGHUP to the pid in `<root>/vlad.pid`. The real parity gate runs inside the daemon on
/// that reload; if it fails there, the daemon rolls back ([`Store::fail_trial`]). With no
/// daemon running the bundle is loaded (and gated) at its next start.
pub struct SignalDaemon<'a> {
    pub store: &'a Store,
    /// The daemon's process name (`/proc/<pid>/comm`): a stale pid file naming another
    /// process is never signalled (SIGHUP would terminate it).
    pub expected_comm: String,
    /// What happened, for the command's output.
    pub outcome: Option<String>,
}

impl<'a> SignalDaemon<'a> {
    pub fn new(store: &'a Store, expected_comm: impl Into<String>) -> Self {
        SignalDaemon {
            store,
            expected_comm: expected_comm.into(),
            outcome: None,
        }
    }

    fn signal(&self) -> Result<String, SignalError> {
        let pid_path = self.store.root().join(PID_FILE);
        let text = match std::fs::read_to_string(&pid_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(format!(
                    "no {}: the daemon loads the bundle at its next start",
                    pid_path.display()
                ))
            }
            Err(source) => {
                return Err(SignalError::ReadPid {
                    path: pid_path,
                    source,
                })
            }
        };
        let pid: i32 =
            text.trim()
                .parse()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| SignalError::NotAPid {
                    path: pid_path.clone(),
                    text: text.trim().to_owned(),
                })?;
        let comm_path = self.store.proc_root.join(pid.to_string()).join("comm");
        match std::fs::read_to_string(&comm_path) {
            Ok(comm) if comm.trim() == self.expected_comm => {}
            Ok(comm) => {
                return Ok(format!(
                    "pid {pid} from {} is `{}`, not {}: stale pid file, not signalled; the daemon loads the bundle at its next start",
                    pid_path.display(),
                    comm.trim(),
                    self.expected_comm
                ))
            }
            Err(_) => {
                return Ok(format!(
                    "pid {pid} from {} is not running: the daemon loads the bundle at its next start",
                    pid_path.display()
                ))
            }
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGHUP)
            .map_err(|source| SignalError::Kill { pid, source })?;
        Ok(format!(
            "sent SIGHUP to {} (pid {pid}): it reloads and runs the parity gate",
            self.expected_comm
        ))
    }
}

impl Activation for SignalDaemon<'_> {
    fn reload_and_gate(&mut self, bundle_dir: &Path) -> Result<(), GateError> {
        self.store.verify(bundle_dir)?;
        let outcome = self.signal()?;
        self.outcome = Some(outcome);
        Ok(())
    }
}
