//! Installing a bundle: verify it, stage a durable copy (or hard links) beside the
//! bundles, re-verify the copy, and rename it to `bundles/<hash>` (rule 1 of the store);
//! an instruction pack the same way to `packs/<hash>`.

use super::{Store, STAGING_PREFIX};
use crate::durable;
use crate::error::OtaError;
use crate::hex;
use crate::manifest::{MANIFEST_FILE, SIGNATURE_FILE};
use crate::verify::VerifiedBundle;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

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
    /// Content hash of the bundle.
    pub hash: String,
    /// Its directory under `bundles/`.
    pub dir: PathBuf,
    /// The identical bundle was already installed; nothing was written.
    pub already_installed: bool,
    /// Files hard-linked from the source instead of copied ([`Placement::HardLink`]).
    pub linked_files: usize,
}

impl Store {
    /// Verifies the bundle at `source` (signature, target, every file) and, only if it
    /// passes, copies it durably to `bundles/<content-hash>/`. Installing an identical
    /// bundle again is a no-op. Nothing is activated.
    pub fn install(&self, source: &Path) -> Result<Installed, OtaError> {
        self.install_with(source, Placement::Copy)
    }

    /// [`Store::install`] with the files placed as `placement` says.
    pub fn install_with(&self, source: &Path, placement: Placement) -> Result<Installed, OtaError> {
        // A newer root-signed key list beside the manifest is adopted first: the bundle
        // it travels with may be signed by the keys it introduces.
        // (Without root keys configured, a key list is not read at all.)
        let list = match self.settings.root_keys.is_empty() {
            true => None,
            false => crate::KeyList::read(source, &self.settings.root_keys)?,
        };
        if let Some(list) = list {
            let _lock = self.lock()?;
            self.adopt_key_list(&list)?;
        }
        let verified = self.verify(source)?;
        let _lock = self.lock()?;
        self.check_floor_and_expiry(&verified)?;
        // A pack goes beside the bundles, under `packs/`, and only with one of them.
        let bundles = if verified.manifest.is_pack() {
            self.check_pack_has_bundle(&verified)?;
            self.packs_dir()
        } else {
            self.bundles_dir()
        };
        if !bundles.is_dir() {
            std::fs::create_dir_all(&bundles).map_err(|e| OtaError::io("creating", &bundles, e))?;
            durable::adopt(&bundles, self.root())?;
            durable::fsync_dir(self.root())?;
        }
        let hash = verified.content_hash.clone();
        let dir = bundles.join(&hash);
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
        // The time seen now is remembered: a clock reset later cannot undo it.
        self.raise_floor(None, true)?;
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
            // One byte past the declared size: enough to see a file that grew, never more.
            let limit = entry.size.saturating_add(1);
            let (size, digest) = match placement {
                Placement::Copy => {
                    let copied = copy_file(&source, &target, limit)?;
                    durable::give(&target, owner)?;
                    copied
                }
                Placement::HardLink => match std::fs::hard_link(&source, &target) {
                    Ok(()) => {
                        linked += 1;
                        hash_file(&target, limit)?
                    }
                    // Another filesystem, or a file the kernel will not let this user
                    // link (fs.protected_hardlinks): copy it.
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(nix::libc::EXDEV) | Some(nix::libc::EPERM)
                        ) =>
                    {
                        let copied = copy_file(&source, &target, limit)?;
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
        let signature = crate::verify::read_small(
            &signature_source,
            crate::signing::MAX_SIGNATURE_BYTES,
            &verified.dir,
            SIGNATURE_FILE,
        )?;
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
}

/// Copies at most `limit` bytes of `source` to the new file `target` (mode 0444), hashing
/// what is written.
fn copy_file(source: &Path, target: &Path, limit: u64) -> Result<(u64, [u8; 32]), OtaError> {
    let mut output = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(target)
        .map_err(|e| OtaError::io("creating", target, e))?;
    hash_through(source, limit, |chunk| {
        output
            .write_all(chunk)
            .map_err(|e| OtaError::io("writing", target, e))
    })
}

/// Size and SHA-256 of at most `limit` bytes of the regular file `path` (not followed if
/// it is a symbolic link).
fn hash_file(path: &Path, limit: u64) -> Result<(u64, [u8; 32]), OtaError> {
    hash_through(path, limit, |_| Ok(()))
}

/// Reads at most `limit` bytes of `path` once, hashing every chunk and handing it to `sink`.
fn hash_through(
    path: &Path,
    limit: u64,
    mut sink: impl FnMut(&[u8]) -> Result<(), OtaError>,
) -> Result<(u64, [u8; 32]), OtaError> {
    let mut input = std::io::Read::take(durable::open_no_follow(path)?, limit);
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
