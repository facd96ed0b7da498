//! Bundle verification: signature first, then target, then that the directory holds
//! exactly the listed files with the listed sizes and SHA-256.
//!
//! The order is deliberate: nothing unsigned is interpreted beyond parsing, cheap checks
//! (target, file set, sizes) come before hashing gigabytes of context binaries, and
//! `bundle.json` is cross-checked against the manifest only once its hash is proven.
//!
//! A file about to be used can have its hash left to the reader that takes its bytes
//! into memory ([`verify_deferring`], [`DeferredDigests`]): hashed there, in one pass,
//! the bytes checked are the bytes used, and a writer of the file after that changes
//! nothing. Everything else is checked here as for [`verify`].

use crate::durable;
use crate::error::OtaError;
use crate::hex;
use crate::manifest::{
    hash_reader, BundleIdentity, FileEntry, OtaManifest, MANIFEST_FILE, MAX_MANIFEST_BYTES,
    SIGNATURE_FILE,
};
use crate::signing::{parse_signatures, signers, PublicKey, MAX_SIGNATURE_BYTES};
use crate::version::Version;
use crate::DeviceTarget;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

/// A bundle whose signature, target and every file were checked.
#[derive(Clone, Debug)]
pub struct VerifiedBundle {
    /// The bundle directory that was checked.
    pub dir: PathBuf,
    /// The parsed, signature-checked manifest.
    pub manifest: OtaManifest,
    /// The exact manifest bytes the signature covers.
    pub manifest_bytes: Vec<u8>,
    /// Lowercase hex SHA-256 of `manifest_bytes`: the bundle's name on the device.
    pub content_hash: String,
    /// The first trusted key a signature verified against.
    pub signed_by: PublicKey,
    /// Every distinct trusted key whose signature verified (at least the threshold).
    pub signers: Vec<PublicKey>,
}

/// Regular files and directories under a bundle, relative with `/` separators.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub files: Vec<String>,
    pub dirs: Vec<String>,
}

/// Lists `dir` recursively without following links; a symbolic link or special file is
/// an error naming it.
pub(crate) fn walk(dir: &Path) -> Result<Listing, OtaError> {
    let mut listing = Listing::default();
    let mut pending = vec![String::new()];
    while let Some(rel) = pending.pop() {
        let here = if rel.is_empty() {
            dir.to_owned()
        } else {
            dir.join(&rel)
        };
        let entries = std::fs::read_dir(&here).map_err(|e| OtaError::io("listing", &here, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| OtaError::io("listing", &here, e))?;
            let name = entry.file_name();
            let name = name.to_str().ok_or_else(|| OtaError::UnsafePath {
                bundle: dir.to_owned(),
                path: format!("{rel}/{}", name.to_string_lossy()),
                reason: "is not valid UTF-8",
            })?;
            let child = if rel.is_empty() {
                name.to_owned()
            } else {
                format!("{rel}/{name}")
            };
            let kind = entry
                .file_type()
                .map_err(|e| OtaError::io("reading", entry.path(), e))?;
            if kind.is_symlink() {
                return Err(OtaError::Symlink {
                    bundle: dir.to_owned(),
                    path: child,
                });
            } else if kind.is_dir() {
                listing.dirs.push(child.clone());
                pending.push(child);
            } else if kind.is_file() {
                listing.files.push(child);
            } else {
                return Err(OtaError::NotRegular {
                    bundle: dir.to_owned(),
                    path: child,
                });
            }
        }
    }
    listing.files.sort();
    listing.dirs.sort();
    Ok(listing)
}

/// Reads at most `limit` bytes of regular file `path` (a link or a longer file is refused).
pub(crate) fn read_small(
    path: &Path,
    limit: u64,
    bundle: &Path,
    rel: &str,
) -> Result<Vec<u8>, OtaError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(OtaError::MissingFile {
                bundle: bundle.to_owned(),
                path: rel.to_owned(),
            })
        }
        Err(e) => return Err(OtaError::io("reading", path, e)),
        Ok(m) if m.file_type().is_symlink() => {
            return Err(OtaError::Symlink {
                bundle: bundle.to_owned(),
                path: rel.to_owned(),
            })
        }
        Ok(m) if !m.is_file() => {
            return Err(OtaError::NotRegular {
                bundle: bundle.to_owned(),
                path: rel.to_owned(),
            })
        }
        Ok(m) if m.len() > limit => {
            return Err(OtaError::SizeMismatch {
                bundle: bundle.to_owned(),
                path: rel.to_owned(),
                expected: limit,
                found: m.len(),
            })
        }
        Ok(_) => {}
    }
    let mut bytes = Vec::new();
    durable::open_no_follow(path)?
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| OtaError::io("reading", path, e))?;
    Ok(bytes)
}

/// Verifies `bundle_dir` for this device: the manifest signature against `trusted_keys`,
/// the manifest rules, SoC / HTP arch / runtime version against `target`, the exact file
/// set (no extra, no missing, no links), every size and every SHA-256, and that
/// `bundle.json` agrees with the manifest. One valid signature is enough; see
/// [`verify_threshold`] for k of n.
pub fn verify(
    bundle_dir: &Path,
    trusted_keys: &[PublicKey],
    target: &DeviceTarget,
) -> Result<VerifiedBundle, OtaError> {
    verify_threshold(bundle_dir, trusted_keys, 1, target)
}

/// [`verify`] needing signatures from `threshold` distinct keys of `trusted_keys`.
pub fn verify_threshold(
    bundle_dir: &Path,
    trusted_keys: &[PublicKey],
    threshold: usize,
    target: &DeviceTarget,
) -> Result<VerifiedBundle, OtaError> {
    let (verified, _none) = verify_deferring(
        bundle_dir,
        trusted_keys,
        threshold,
        target,
        &BTreeSet::new(),
    )?;
    Ok(verified)
}

/// [`verify_threshold`], except that the SHA-256 of the listed files named in `defer`
/// is not computed: it is returned, to be checked by whoever reads them
/// ([`DeferredDigests::open`]). Their sizes, the signature, the target, the file set,
/// every other hash and `bundle.json` are checked as usual. A name in `defer` that the
/// manifest does not list is refused (whoever reads it expects it to be checked).
pub fn verify_deferring(
    bundle_dir: &Path,
    trusted_keys: &[PublicKey],
    threshold: usize,
    target: &DeviceTarget,
    defer: &BTreeSet<String>,
) -> Result<(VerifiedBundle, DeferredDigests), OtaError> {
    if trusted_keys.is_empty() {
        return Err(OtaError::NoTrustedKeys);
    }
    let bundle = bundle_dir;
    let (manifest, manifest_bytes, signers) =
        signed_manifest(bundle, trusted_keys, threshold.max(1))?;
    let signed_by = signers[0];
    check_target(bundle, &manifest, target)?;
    check_file_set(bundle, &manifest)?;
    check_sizes(bundle, &manifest)?;
    let mut deferred = DeferredDigests {
        bundle: bundle.to_owned(),
        files: BTreeMap::new(),
    };
    for rel in defer {
        let entry = manifest
            .files
            .iter()
            .find(|f| &f.path == rel)
            .ok_or_else(|| OtaError::MissingFile {
                bundle: bundle.to_owned(),
                path: rel.clone(),
            })?;
        deferred.files.insert(rel.clone(), entry.clone());
    }
    check_hashes(bundle, &manifest, defer)?;
    check_identity(bundle, &manifest)?;
    let content_hash = hex::encode(&Sha256::digest(&manifest_bytes));
    let verified = VerifiedBundle {
        dir: bundle.to_owned(),
        manifest,
        manifest_bytes,
        content_hash,
        signed_by,
        signers,
    };
    Ok((verified, deferred))
}

impl VerifiedBundle {
    /// `bytes` are those the manifest lists for `rel` (e.g. a file parsed from what was
    /// read before or after this verification): the same error as a changed file.
    pub fn check_bytes(&self, rel: &str, bytes: &[u8]) -> Result<(), OtaError> {
        let entry = self
            .manifest
            .files
            .iter()
            .find(|f| f.path == rel)
            .ok_or_else(|| OtaError::MissingFile {
                bundle: self.dir.clone(),
                path: rel.to_owned(),
            })?;
        let mut check = DigestCheck::new(&self.dir, entry);
        check.update(bytes);
        check.finish()
    }
}

/// The files of a verified bundle whose SHA-256 [`verify_deferring`] left to their
/// reader, with what the signed manifest says of each.
#[derive(Clone, Debug)]
pub struct DeferredDigests {
    bundle: PathBuf,
    files: BTreeMap<String, FileEntry>,
}

impl DeferredDigests {
    /// Opens deferred file `rel` (never through a link), refusing it unless it is a
    /// regular file of the size the manifest lists, with the check its bytes must pass
    /// as they are read: read the file once, [`DigestCheck::update`] with each chunk of
    /// what was read, [`DigestCheck::finish`] before using any of it.
    pub fn open(&self, rel: &str) -> Result<(std::fs::File, DigestCheck), OtaError> {
        let entry = self.files.get(rel).ok_or_else(|| OtaError::MissingFile {
            bundle: self.bundle.clone(),
            path: rel.to_owned(),
        })?;
        let path = self.bundle.join(rel);
        let file = durable::open_no_follow(&path)?;
        let meta = file
            .metadata()
            .map_err(|e| OtaError::io("reading", &path, e))?;
        if !meta.is_file() {
            return Err(OtaError::NotRegular {
                bundle: self.bundle.clone(),
                path: rel.to_owned(),
            });
        }
        if meta.len() != entry.size {
            return Err(OtaError::SizeMismatch {
                bundle: self.bundle.clone(),
                path: rel.to_owned(),
                expected: entry.size,
                found: meta.len(),
            });
        }
        Ok((file, DigestCheck::new(&self.bundle, entry)))
    }

    /// The deferred files, relative to the bundle directory.
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }
}

/// The SHA-256 of one file's bytes as they are read, against the signed manifest's.
pub struct DigestCheck {
    bundle: PathBuf,
    entry: FileEntry,
    hasher: Sha256,
    seen: u64,
}

impl core::fmt::Debug for DigestCheck {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DigestCheck")
            .field("path", &self.entry.path)
            .field("seen", &self.seen)
            .finish()
    }
}

impl DigestCheck {
    fn new(bundle: &Path, entry: &FileEntry) -> Self {
        Self {
            bundle: bundle.to_owned(),
            entry: entry.clone(),
            hasher: Sha256::new(),
            seen: 0,
        }
    }

    /// The size the manifest lists.
    pub fn size(&self) -> u64 {
        self.entry.size
    }

    /// Adds the next bytes read.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.seen = self.seen.saturating_add(bytes.len() as u64);
    }

    /// Whether the bytes given were exactly the manifest's: its size and its SHA-256.
    pub fn finish(self) -> Result<(), OtaError> {
        if self.seen != self.entry.size {
            return Err(OtaError::SizeMismatch {
                bundle: self.bundle,
                path: self.entry.path,
                expected: self.entry.size,
                found: self.seen,
            });
        }
        let found = hex::encode(&self.hasher.finalize());
        if found != self.entry.sha256 {
            return Err(OtaError::HashMismatch {
                bundle: self.bundle,
                path: self.entry.path,
                expected: self.entry.sha256,
                found,
            });
        }
        Ok(())
    }
}

/// The manifest, its bytes and the (at least `threshold`, never none) keys that signed
/// them: the signatures are checked before the manifest is parsed.
fn signed_manifest(
    bundle: &Path,
    trusted_keys: &[PublicKey],
    threshold: usize,
) -> Result<(OtaManifest, Vec<u8>, Vec<PublicKey>), OtaError> {
    let manifest_path = bundle.join(MANIFEST_FILE);
    let signature_path = bundle.join(SIGNATURE_FILE);
    let unsigned = |missing| {
        move |e: OtaError| match e {
            OtaError::MissingFile { bundle, .. } => OtaError::Unsigned { bundle, missing },
            other => other,
        }
    };
    let manifest_bytes = read_small(&manifest_path, MAX_MANIFEST_BYTES, bundle, MANIFEST_FILE)
        .map_err(unsigned(MANIFEST_FILE))?;
    let signature_text = read_small(&signature_path, MAX_SIGNATURE_BYTES, bundle, SIGNATURE_FILE)
        .map_err(unsigned(SIGNATURE_FILE))?;
    let signatures = parse_signatures(&signature_path, &signature_text)?;
    let signed = signers(trusted_keys, &manifest_bytes, &signatures);
    if signed.is_empty() {
        return Err(OtaError::BadSignature {
            path: signature_path,
            keys: trusted_keys.len(),
        });
    }
    if signed.len() < threshold {
        return Err(OtaError::TooFewSignatures {
            path: signature_path,
            valid: signed.len(),
            threshold,
        });
    }
    let manifest = OtaManifest::parse(&manifest_path, &manifest_bytes)?;
    Ok((manifest, manifest_bytes, signed))
}

/// The bundle is built for this SoC and HTP arch, and for this runtime or an older one.
fn check_target(
    bundle: &Path,
    manifest: &OtaManifest,
    target: &DeviceTarget,
) -> Result<(), OtaError> {
    for (field, expected, found) in [
        ("soc_model", target.soc_model, manifest.soc_model),
        ("htp_arch", target.htp_arch, manifest.htp_arch),
    ] {
        if expected != found {
            return Err(OtaError::Target {
                bundle: bundle.to_owned(),
                field,
                expected,
                found,
            });
        }
    }
    let runtime = Version::parse(&target.runtime_version).ok_or_else(|| OtaError::Version {
        what: "runtime version".into(),
        value: target.runtime_version.clone(),
    })?;
    let required = Version::parse(&manifest.min_runtime_version)
        .expect("OtaManifest::parse checked min_runtime_version");
    if required > runtime {
        return Err(OtaError::RuntimeTooOld {
            bundle: bundle.to_owned(),
            required: manifest.min_runtime_version.clone(),
            runtime: target.runtime_version.clone(),
        });
    }
    Ok(())
}

/// The exact file set: nothing but the listed files (and the manifest and its
/// signature), no directory without a listed file, and no listed file missing.
fn check_file_set(bundle: &Path, manifest: &OtaManifest) -> Result<(), OtaError> {
    let listing = walk(bundle)?;
    let listed: BTreeSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    for file in &listing.files {
        let beside = [
            MANIFEST_FILE,
            SIGNATURE_FILE,
            crate::KEY_LIST_FILE,
            crate::KEY_LIST_SIGNATURE_FILE,
        ];
        if !beside.contains(&file.as_str()) && !listed.contains(file.as_str()) {
            return Err(OtaError::ExtraFile {
                bundle: bundle.to_owned(),
                path: file.clone(),
            });
        }
    }
    for dir in &listing.dirs {
        let prefix = format!("{dir}/");
        if !listed.iter().any(|p| p.starts_with(&prefix)) {
            return Err(OtaError::ExtraFile {
                bundle: bundle.to_owned(),
                path: prefix,
            });
        }
    }
    let present: BTreeSet<&str> = listing.files.iter().map(String::as_str).collect();
    for entry in &manifest.files {
        if !present.contains(entry.path.as_str()) {
            return Err(OtaError::MissingFile {
                bundle: bundle.to_owned(),
                path: entry.path.clone(),
            });
        }
    }
    Ok(())
}

/// Every size from the file system first: a truncated file is named before any hashing.
fn check_sizes(bundle: &Path, manifest: &OtaManifest) -> Result<(), OtaError> {
    for entry in &manifest.files {
        let path = bundle.join(&entry.path);
        let size = std::fs::symlink_metadata(&path)
            .map_err(|e| OtaError::io("reading", &path, e))?
            .len();
        if size != entry.size {
            return Err(OtaError::SizeMismatch {
                bundle: bundle.to_owned(),
                path: entry.path.clone(),
                expected: entry.size,
                found: size,
            });
        }
    }
    Ok(())
}

/// Every file's SHA-256 but those in `defer`, and its size as read (it may have changed
/// since it was listed).
fn check_hashes(
    bundle: &Path,
    manifest: &OtaManifest,
    defer: &BTreeSet<String>,
) -> Result<(), OtaError> {
    for entry in manifest.files.iter().filter(|f| !defer.contains(&f.path)) {
        let path = bundle.join(&entry.path);
        let (size, digest) = hash_reader(
            durable::open_no_follow(&path)?,
            &path,
            entry.size.saturating_add(1),
        )?;
        let found = hex::encode(&digest);
        if size != entry.size {
            return Err(OtaError::SizeMismatch {
                bundle: bundle.to_owned(),
                path: entry.path.clone(),
                expected: entry.size,
                found: size,
            });
        }
        if found != entry.sha256 {
            return Err(OtaError::HashMismatch {
                bundle: bundle.to_owned(),
                path: entry.path.clone(),
                expected: entry.sha256.clone(),
                found,
            });
        }
    }
    Ok(())
}

/// `bundle.json` (a pack's `pack.json`) says what the signed manifest says.
fn check_identity(bundle: &Path, manifest: &OtaManifest) -> Result<(), OtaError> {
    let identity = BundleIdentity::read(bundle, manifest.identity_file())?;
    let numbers = [
        ("soc_model", manifest.soc_model, identity.soc_model),
        ("htp_arch", manifest.htp_arch, identity.htp_arch),
    ];
    for (field, m, b) in numbers {
        if m != b {
            return Err(mismatch(bundle, field, m.to_string(), b.to_string()));
        }
    }
    let texts = [
        ("name", &manifest.name, &identity.name),
        ("version", &manifest.version, &identity.version),
        ("policy", &manifest.policy, &identity.policy),
        (
            "min_runtime_version",
            &manifest.min_runtime_version,
            &identity.min_runtime_version,
        ),
    ];
    for (field, m, b) in texts {
        if m != b {
            return Err(mismatch(bundle, field, format!("`{m}`"), format!("`{b}`")));
        }
    }
    Ok(())
}

fn mismatch(bundle: &Path, field: &'static str, manifest: String, bundle_json: String) -> OtaError {
    OtaError::BundleJsonMismatch {
        bundle: bundle.to_owned(),
        field,
        manifest,
        bundle_json,
    }
}
