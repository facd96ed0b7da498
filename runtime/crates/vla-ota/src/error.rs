//! [`OtaError`]: every way an update can be refused or fail, each naming the bundle, file
//! or field involved, displayed as one line.

use std::fmt;
use std::path::PathBuf;
use vla_oneline::OneLine;

/// Why an OTA operation stopped. Nothing is activated when one of these is returned,
/// except where a variant says so ([`OtaError::GateFailed`] reports the rollback it made).
#[derive(Debug)]
#[non_exhaustive]
pub enum OtaError {
    /// A file system call failed; `action` says what was being done ("reading", "fsync of").
    Io {
        /// What was being done, for the message (`"reading"`, `"fsync of"`, ...).
        action: &'static str,
        /// The file or directory the call was on.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// `ota-manifest.json` is not valid JSON of the expected shape.
    ManifestSyntax {
        /// The manifest file.
        path: PathBuf,
        /// The JSON parser's complaint.
        reason: String,
    },
    /// `ota-manifest.json` parses but a field breaks a rule.
    ManifestInvalid {
        /// The manifest file.
        path: PathBuf,
        /// The field that breaks the rule.
        field: String,
        /// The rule it breaks.
        reason: String,
    },
    /// `bundle.json` is missing, unreadable as JSON, or lacks a field `pack` needs.
    BundleJson {
        /// The `bundle.json` file.
        path: PathBuf,
        /// What is missing or unreadable.
        reason: String,
    },
    /// `bundle.json` and the signed OTA manifest disagree on a field.
    BundleJsonMismatch {
        /// The bundle directory.
        bundle: PathBuf,
        /// The field the two files disagree on.
        field: &'static str,
        /// The value in the signed OTA manifest.
        manifest: String,
        /// The value in `bundle.json`.
        bundle_json: String,
    },
    /// `ota-manifest.json.sig` is not 128 hex characters.
    SignatureFormat {
        /// The signature file.
        path: PathBuf,
        /// What is wrong with its text.
        reason: String,
    },
    /// No trusted key is configured: every update is refused (fail closed).
    NoTrustedKeys,
    /// The signature does not verify against any trusted key.
    BadSignature {
        /// The signature file.
        path: PathBuf,
        /// How many trusted keys were tried.
        keys: usize,
    },
    /// A secret key file is unreadable, malformed or readable by others.
    SecretKey {
        /// The secret key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A public key given as text is not 64 hex characters.
    PublicKey {
        /// The text given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A symbolic link inside a bundle (never followed, never accepted).
    Symlink {
        /// The bundle directory.
        bundle: PathBuf,
        /// The link's path relative to the bundle directory.
        path: String,
    },
    /// Something in a bundle that is neither a regular file nor a directory.
    NotRegular {
        /// The bundle directory.
        bundle: PathBuf,
        /// The entry's path relative to the bundle directory.
        path: String,
    },
    /// A manifest path that is absolute, climbs out, or is otherwise not a plain relative path.
    UnsafePath {
        /// The bundle directory.
        bundle: PathBuf,
        /// The path as the manifest lists it.
        path: String,
        /// What makes it unsafe.
        reason: &'static str,
    },
    /// A file in the bundle directory the manifest does not list.
    ExtraFile {
        /// The bundle directory.
        bundle: PathBuf,
        /// The unlisted file's path relative to the bundle directory.
        path: String,
    },
    /// A file the manifest lists that is not in the bundle directory.
    MissingFile {
        /// The bundle directory.
        bundle: PathBuf,
        /// The listed path that is absent.
        path: String,
    },
    /// The bundle has no `ota-manifest.json` (never packed) or no signature (never signed).
    Unsigned {
        /// The bundle directory.
        bundle: PathBuf,
        /// Which of the two files is absent (`ota-manifest.json` or its `.sig`).
        missing: &'static str,
    },
    /// A file whose size differs from the manifest (truncated or grown).
    SizeMismatch {
        /// The bundle directory.
        bundle: PathBuf,
        /// The file's path relative to the bundle directory.
        path: String,
        /// Size in bytes the manifest records.
        expected: u64,
        /// Size in bytes on disk.
        found: u64,
    },
    /// A file whose SHA-256 differs from the manifest.
    HashMismatch {
        /// The bundle directory.
        bundle: PathBuf,
        /// The file's path relative to the bundle directory.
        path: String,
        /// Lowercase hex SHA-256 the manifest records.
        expected: String,
        /// Lowercase hex SHA-256 of the bytes on disk.
        found: String,
    },
    /// The bundle targets another SoC or HTP architecture than this device.
    Target {
        /// The bundle directory.
        bundle: PathBuf,
        /// `"soc_model"` or `"htp_arch"`.
        field: &'static str,
        /// This device's value ([`crate::DeviceTarget`]).
        expected: u32,
        /// The manifest's value.
        found: u32,
    },
    /// The bundle needs a newer runtime than this one.
    RuntimeTooOld {
        /// The bundle directory.
        bundle: PathBuf,
        /// The manifest's `min_runtime_version`.
        required: String,
        /// This runtime's version.
        runtime: String,
    },
    /// A version string that is not `MAJOR.MINOR.PATCH[-pre][+build]`.
    Version {
        /// Which version it is, for the message (e.g. `"runtime version"`).
        what: String,
        /// The text that does not parse.
        value: String,
    },
    /// Not enough free space to stage a bundle.
    InsufficientSpace {
        /// The directory the bundle would be staged in.
        dir: PathBuf,
        /// Bytes the bundle needs.
        needed: u64,
        /// Bytes free on that file system.
        free: u64,
    },
    /// No installed bundle has this content hash (or prefix).
    NotInstalled {
        /// The hash or prefix asked for.
        hash: String,
    },
    /// An instruction pack names a bundle other than the one it was offered for (or, at
    /// install, than every installed bundle).
    PackForOtherBundle {
        /// The pack directory.
        pack: PathBuf,
        /// The bundle the pack names: `name version (policy)`.
        names: String,
        /// The bundle(s) it was offered for, the same way.
        bundle: String,
    },
    /// A pack where a bundle is needed, or a bundle where a pack is.
    WrongKind {
        /// The directory.
        dir: PathBuf,
        /// What it is: "an instruction pack" or "a bundle".
        is: &'static str,
        /// What was needed.
        needed: &'static str,
    },
    /// A hash prefix that matches more than one installed bundle.
    AmbiguousHash {
        /// The prefix asked for.
        prefix: String,
        /// How many installed bundles it matches.
        matches: usize,
    },
    /// The activation gate refused the new bundle; `rolled_back_to` says where the device
    /// is now (`None`: no previous bundle, nothing is active).
    GateFailed {
        /// Content hash of the refused bundle.
        hash: String,
        /// The gate's refusal as one line (what the state file records).
        reason: String,
        /// Content hash of the bundle now current after the rollback; `None`: nothing is active.
        rolled_back_to: Option<String>,
        /// The previous bundle's gate refusal, if it was called and failed too.
        rollback_error: Option<String>,
        /// The gate's own error, typed (its text is `reason`).
        refusal: crate::GateError,
    },
    /// `rollback` with no previous bundle to return to.
    NoPrevious,
    /// `ota-state.json` is unreadable or inconsistent.
    State {
        /// The state file.
        path: PathBuf,
        /// What is unreadable or inconsistent.
        reason: String,
    },
    /// The bundle's version is below the version floor (the highest version this device
    /// has committed): an older release, possibly with a known flaw, is not taken back
    /// except by the operator's `rollback` to the kept previous bundle.
    Rollback {
        /// The bundle directory.
        bundle: PathBuf,
        /// The bundle's version.
        version: String,
        /// The floor it is below.
        floor: String,
    },
    /// The bundle's signed expiry has passed: the signer no longer vouches that it is the
    /// current release, so it is not installed or activated.
    Expired {
        /// The bundle directory.
        bundle: PathBuf,
        /// Its signed expiry (Unix seconds).
        expires: u64,
        /// This device's time (Unix seconds): the clock, or the latest time recorded.
        now: u64,
    },
    /// The version floor file is unreadable: every install is refused until it is
    /// repaired (a lost floor would reopen rollbacks).
    Floor {
        /// The floor file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Fewer distinct trusted keys signed the manifest than the threshold asks for.
    TooFewSignatures {
        /// The signature file.
        path: PathBuf,
        /// Distinct trusted keys whose signature verified.
        valid: usize,
        /// Signatures required (`ota.signature_threshold`).
        threshold: usize,
    },
    /// A key list (`keys.json`) that is unsigned by the root keys, unreadable or invalid.
    KeyList {
        /// The key list file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A key offered as trusted whose secret is published (anyone can sign with it).
    PublishedKey {
        /// The key, 64 hex characters.
        key: String,
        /// Where its secret was published.
        published: &'static str,
    },
    /// A bundle that must not be replaced (current or previous) failed verification.
    InUseCorrupt {
        /// Content hash of the bundle in use.
        hash: String,
        /// Why its verification failed, as one line.
        reason: String,
    },
}

impl OtaError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        OtaError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Byte counts in the unit a person reads (`1.5 MiB (1572864 bytes)`).
fn bytes(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if n >= 1024 * 1024 {
        format!("{:.1} MiB ({n} bytes)", n as f64 / MIB)
    } else {
        format!("{n} bytes")
    }
}

impl fmt::Display for OtaError {
    // Field names, paths and versions come from manifests and bundles: a `\r` in one must
    // not break the one-line message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_message(&mut OneLine(f))
    }
}

impl OtaError {
    // Kept whole: one flat arm per variant, a table of messages that a split would scatter.
    fn write_message(&self, f: &mut impl fmt::Write) -> fmt::Result {
        use OtaError::*;
        match self {
            Io {
                action,
                path,
                source,
            } => write!(f, "{action} {}: {source}", path.display()),
            ManifestSyntax { path, reason } => {
                write!(f, "OTA manifest {}: {reason}", path.display())
            }
            ManifestInvalid {
                path,
                field,
                reason,
            } => write!(f, "OTA manifest {}: `{field}` {reason}", path.display()),
            BundleJson { path, reason } => write!(f, "{}: {reason}", path.display()),
            BundleJsonMismatch {
                bundle,
                field,
                manifest,
                bundle_json,
            } => write!(
                f,
                "bundle {}: `{field}` is {manifest} in ota-manifest.json but {bundle_json} in bundle.json",
                bundle.display()
            ),
            SignatureFormat { path, reason } => {
                write!(f, "signature {}: {reason}", path.display())
            }
            NoTrustedKeys => write!(
                f,
                "no trusted key is configured (ota.trusted_keys is empty): every update is refused"
            ),
            BadSignature { path, keys } => write!(
                f,
                "signature {} does not verify against any of the {keys} trusted key(s)",
                path.display()
            ),
            Rollback {
                bundle,
                version,
                floor,
            } => write!(
                f,
                "bundle {}: version {version} is below this device's version floor {floor} (no rollback except `vlad ota rollback` to the kept previous bundle)",
                bundle.display()
            ),
            Expired {
                bundle,
                expires,
                now,
            } => write!(
                f,
                "bundle {}: its signed expiry (Unix time {expires}) has passed (device time {now}): ask the fleet for a freshly signed release",
                bundle.display()
            ),
            Floor { path, reason } => write!(
                f,
                "version floor {}: {reason} (every install is refused until it is repaired)",
                path.display()
            ),
            TooFewSignatures {
                path,
                valid,
                threshold,
            } => write!(
                f,
                "signature file {}: {valid} distinct trusted key(s) signed, {threshold} required (ota.signature_threshold)",
                path.display()
            ),
            KeyList { path, reason } => write!(f, "key list {}: {reason}", path.display()),
            PublishedKey { key, published } => write!(
                f,
                "key {key} may not be trusted: its secret key is published ({published}); generate a fleet key with `vlad bundle keygen`"
            ),
            SecretKey { path, reason } => write!(f, "secret key {}: {reason}", path.display()),
            PublicKey { text, reason } => write!(f, "public key `{text}`: {reason}"),
            Symlink { bundle, path } => write!(
                f,
                "bundle {}: `{path}` is a symbolic link (not allowed in a bundle)",
                bundle.display()
            ),
            NotRegular { bundle, path } => write!(
                f,
                "bundle {}: `{path}` is neither a regular file nor a directory",
                bundle.display()
            ),
            UnsafePath {
                bundle,
                path,
                reason,
            } => write!(f, "bundle {}: manifest path `{path}` {reason}", bundle.display()),
            ExtraFile { bundle, path } => write!(
                f,
                "bundle {}: `{path}` is not listed in ota-manifest.json",
                bundle.display()
            ),
            MissingFile { bundle, path } => write!(
                f,
                "bundle {}: `{path}` is listed in ota-manifest.json but missing",
                bundle.display()
            ),
            Unsigned { bundle, missing } => write!(
                f,
                "bundle {} has no {missing}: pack and sign it first (vlad bundle pack / sign)",
                bundle.display()
            ),
            SizeMismatch {
                bundle,
                path,
                expected,
                found,
            } => write!(
                f,
                "bundle {}: `{path}` has {found} bytes, the manifest says {expected}{}",
                bundle.display(),
                if found < expected { " (truncated)" } else { "" }
            ),
            HashMismatch {
                bundle,
                path,
                expected,
                found,
            } => write!(
                f,
                "bundle {}: `{path}` has SHA-256 {found}, the manifest says {expected}",
                bundle.display()
            ),
            Target {
                bundle,
                field,
                expected,
                found,
            } => write!(
                f,
                "bundle {}: built for {field} {found}, this device is {field} {expected}",
                bundle.display()
            ),
            RuntimeTooOld {
                bundle,
                required,
                runtime,
            } => write!(
                f,
                "bundle {}: needs runtime {required} or newer, this runtime is {runtime}",
                bundle.display()
            ),
            Version { what, value } => write!(
                f,
                "{what}: `{value}` is not a version MAJOR.MINOR.PATCH[-pre][+build]"
            ),
            InsufficientSpace { dir, needed, free } => write!(
                f,
                "not enough space in {}: staging the bundle needs {}, {} free",
                dir.display(),
                bytes(*needed),
                bytes(*free)
            ),
            NotInstalled { hash } => write!(f, "no installed bundle matches `{hash}`"),
            PackForOtherBundle {
                pack,
                names,
                bundle,
            } => write!(
                f,
                "instruction pack {} is for bundle {names}, not for {bundle}",
                pack.display()
            ),
            WrongKind { dir, is, needed } => {
                write!(f, "{} is {is}, where {needed} is needed", dir.display())
            }
            AmbiguousHash { prefix, matches } => write!(
                f,
                "`{prefix}` matches {matches} installed bundles: give more of the hash"
            ),
            GateFailed {
                hash,
                reason,
                rolled_back_to,
                rollback_error,
                ..
            } => {
                write!(f, "bundle {hash} failed its activation gate ({reason}); ")?;
                match rolled_back_to {
                    Some(p) => write!(f, "rolled back to {p}")?,
                    None => write!(f, "no previous bundle: nothing is active")?,
                }
                if let Some(e) = rollback_error {
                    write!(f, ", but the previous bundle's gate failed too: {e}")?;
                }
                Ok(())
            }
            NoPrevious => write!(f, "there is no previous bundle to roll back to"),
            State { path, reason } => write!(f, "OTA state {}: {reason}", path.display()),
            InUseCorrupt { hash, reason } => write!(
                f,
                "installed bundle {hash} is in use (current or previous) and fails verification: {reason}"
            ),
        }
    }
}

// Each message names its cause: `Io` its OS error, `GateFailed` the refusal's text (the
// refusal itself is its `refusal` field), so `source()` hands out only what the refusal
// leaves out of its own message.
impl std::error::Error for OtaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OtaError::GateFailed { refusal, .. } => refusal.source(),
            _ => None,
        }
    }
}

/// Why [`crate::SignalDaemon`] could not ask the daemon to reload (its gate's refusal).
#[derive(Debug)]
#[non_exhaustive]
pub enum SignalError {
    /// The pid file exists but cannot be read.
    ReadPid {
        /// The pid file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The pid file does not hold a pid.
    NotAPid {
        /// The pid file.
        path: PathBuf,
        /// What the file holds (trimmed).
        text: String,
    },
    /// `kill(pid, signal)` failed.
    Kill {
        /// The pid signalled.
        pid: i32,
        /// The signal's name (SIGHUP, SIGUSR2).
        signal: &'static str,
        /// The error `kill` returned.
        source: nix::errno::Errno,
    },
}

impl fmt::Display for SignalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignalError::ReadPid { path, source } => {
                write!(f, "reading {}: {source}", path.display())
            }
            SignalError::NotAPid { path, text } => {
                write!(f, "{}: `{text}` is not a pid", path.display())
            }
            SignalError::Kill {
                pid,
                signal,
                source,
            } => write!(f, "sending {signal} to pid {pid}: {source}"),
        }
    }
}

// Each message names its cause (the `source` fields are written into it), so `source()`
// does not hand the cause out a second time for a printer to de-duplicate.
impl std::error::Error for SignalError {}
