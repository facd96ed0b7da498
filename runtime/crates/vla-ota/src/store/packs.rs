//! Instruction packs in the store: signed file sets (`pack.json`) that go with one bundle
//! (its name, version and policy) and live under `packs/<hash>/` beside it. They are
//! verified exactly as bundles are (the same signatures, key list, floor and expiry at
//! install, every file's size and hash); nothing activates them: the daemon takes the
//! packs of the bundle it runs.

use super::{dir_bytes, Store};
use crate::error::OtaError;
use crate::hex;
use crate::manifest::{OtaManifest, MANIFEST_FILE, MAX_MANIFEST_BYTES};
use crate::verify::{read_small, VerifiedBundle};
use std::path::{Path, PathBuf};

/// The packs of one bundle as [`Store::packs_for`] found them.
#[derive(Debug, Default)]
pub struct PackScan {
    /// Packs that name the bundle and verified, by content hash.
    pub packs: Vec<VerifiedBundle>,
    /// Packs that name the bundle but failed verification (each error names its pack).
    pub refused: Vec<OtaError>,
    /// With [`Store::packs_for_deferring`], each pack's files' digests, in the order of
    /// `packs`, for its reader to check as it reads them; else empty.
    pub digests: Vec<crate::DeferredDigests>,
}

/// `name version (policy)`, for messages.
fn names((name, version, policy): (&str, &str, &str)) -> String {
    format!("{name} {version} ({policy})")
}

impl Store {
    /// `<root>/packs`: one directory per installed instruction pack, named by its content hash.
    pub fn packs_dir(&self) -> PathBuf {
        self.root().join("packs")
    }

    /// Content hashes of the installed packs, sorted.
    pub fn installed_packs(&self) -> Result<Vec<String>, OtaError> {
        let dir = self.packs_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(OtaError::io("listing", &dir, e)),
        };
        let mut hashes: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|n| hex::is_content_hash(n))
            .collect();
        hashes.sort();
        Ok(hashes)
    }

    /// The manifest of installed directory `dir`, parsed but not verified (for listing).
    pub(super) fn read_manifest(dir: &Path) -> Result<OtaManifest, OtaError> {
        let path = dir.join(MANIFEST_FILE);
        let bytes = read_small(&path, MAX_MANIFEST_BYTES, dir, MANIFEST_FILE)?;
        OtaManifest::parse(&path, &bytes)
    }

    /// Full verification of the pack at `dir` (as [`Store::verify`]) and that it goes with
    /// `bundle` (`name, version, policy`): a bundle, or a pack for another bundle, is
    /// refused in one line.
    pub fn verify_pack_for(
        &self,
        dir: &Path,
        bundle: (&str, &str, &str),
    ) -> Result<VerifiedBundle, OtaError> {
        let (verified, _) = self.verify_pack_deferring(dir, bundle, &Default::default())?;
        Ok(verified)
    }

    /// [`Store::verify_pack_for`] leaving the SHA-256 of the files in `defer` to their
    /// reader (see [`crate::verify_deferring`]).
    fn verify_pack_deferring(
        &self,
        dir: &Path,
        bundle: (&str, &str, &str),
        defer: &std::collections::BTreeSet<String>,
    ) -> Result<(VerifiedBundle, crate::DeferredDigests), OtaError> {
        let (verified, digests) = self.verify_deferring(dir, defer)?;
        if !verified.manifest.is_pack() {
            return Err(OtaError::WrongKind {
                dir: dir.to_owned(),
                is: "a bundle",
                needed: "an instruction pack",
            });
        }
        if !verified.manifest.goes_with(bundle) {
            return Err(OtaError::PackForOtherBundle {
                pack: dir.to_owned(),
                names: names(verified.manifest.names()),
                bundle: names(bundle),
            });
        }
        Ok((verified, digests))
    }

    /// The installed packs that name `bundle` (`name, version, policy`), each verified again (signature, every
    /// file): what the daemon takes at start and at every reload. Packs of other bundles
    /// are skipped; a pack of this bundle that fails is returned in `refused`. Neither
    /// expiry nor the floor is judged here: they refuse installs, and a bundle that runs
    /// keeps running with the packs installed for it.
    pub fn packs_for(&self, bundle: (&str, &str, &str)) -> Result<PackScan, OtaError> {
        self.scan_packs(bundle, false)
    }

    /// [`Store::packs_for`] with the SHA-256 of every file a pack's manifest lists left to
    /// its reader ([`PackScan::digests`]): a reader that takes the bytes into memory checks
    /// them as it reads them, so what it uses is what was signed. A file no reader reads
    /// is then not hashed (and not used).
    pub fn packs_for_deferring(&self, bundle: (&str, &str, &str)) -> Result<PackScan, OtaError> {
        self.scan_packs(bundle, true)
    }

    fn scan_packs(
        &self,
        bundle: (&str, &str, &str),
        deferring: bool,
    ) -> Result<PackScan, OtaError> {
        let mut scan = PackScan::default();
        for hash in self.installed_packs()? {
            let dir = self.packs_dir().join(&hash);
            match Self::read_manifest(&dir) {
                Ok(m) if !m.goes_with(bundle) => continue,
                // The names come from an unverified read: verification refuses a
                // deferred name the signed manifest does not list.
                Ok(m) => match self.verify_pack_deferring(
                    &dir,
                    bundle,
                    &match deferring {
                        true => m.files.iter().map(|f| f.path.clone()).collect(),
                        false => Default::default(),
                    },
                ) {
                    Ok((v, digests)) if v.content_hash == hash => {
                        scan.packs.push(v);
                        if deferring {
                            scan.digests.push(digests);
                        }
                    }
                    Ok((v, _)) => scan.refused.push(OtaError::HashMismatch {
                        bundle: dir,
                        path: MANIFEST_FILE.into(),
                        expected: hash,
                        found: v.content_hash,
                    }),
                    Err(e) => scan.refused.push(e),
                },
                Err(e) => scan.refused.push(e),
            }
        }
        Ok(scan)
    }

    /// At install: a pack must name an installed bundle (else it is refused in one line,
    /// naming the bundles installed).
    pub(super) fn check_pack_has_bundle(&self, pack: &VerifiedBundle) -> Result<(), OtaError> {
        let mut installed = Vec::new();
        for hash in self.installed_hashes()? {
            if let Ok(m) = Self::read_manifest(&self.bundle_dir(&hash)) {
                if pack.manifest.goes_with(m.names()) {
                    return Ok(());
                }
                installed.push(names(m.names()));
            }
        }
        installed.sort();
        installed.dedup();
        Err(OtaError::PackForOtherBundle {
            pack: pack.dir.clone(),
            names: names(pack.manifest.names()),
            bundle: match installed.is_empty() {
                true => "any installed bundle (none is installed)".into(),
                false => format!("the installed {}", installed.join(", ")),
            },
        })
    }

    /// Bytes the files of the pack `hash` take (for `status`).
    pub(super) fn pack_bytes(&self, hash: &str) -> u64 {
        dir_bytes(&self.packs_dir().join(hash))
    }
}
