//! What the store holds (`vlad ota status`) and garbage collection of the bundles
//! nothing references and no process maps.

use super::{dir_bytes, Store, STAGING_PREFIX, TRASH_PREFIX};
use crate::durable;
use crate::error::OtaError;
use crate::manifest::{OtaManifest, MANIFEST_FILE};
use crate::maps;
use crate::state::OtaState;
use std::path::PathBuf;

/// One installed bundle as `status` shows it.
#[derive(Clone, Debug)]
pub struct BundleInfo {
    /// Content hash (the directory name under `bundles/`).
    pub hash: String,
    /// `bundle.json` name, from the manifest.
    pub name: String,
    /// `bundle.json` version, from the manifest.
    pub version: String,
    /// Bytes the bundle's files take.
    pub bytes: u64,
    /// Some process maps a file of it (it cannot be removed).
    pub mapped: bool,
}

/// The store's state, links and bundles.
#[derive(Clone, Debug)]
pub struct Status {
    /// The store's root directory.
    pub root: PathBuf,
    /// The state file's contents.
    pub state: OtaState,
    /// Where the `current` link points; `None`: no link.
    pub current_link: Option<PathBuf>,
    /// Where the `previous` link points; `None`: no link.
    pub previous_link: Option<PathBuf>,
    /// Every installed bundle.
    pub bundles: Vec<BundleInfo>,
    /// Every installed instruction pack: `name` and `version` are the bundle it goes with.
    pub packs: Vec<BundleInfo>,
    /// Staging or trash directories present (an operation in progress or interrupted).
    pub leftovers: Vec<String>,
    /// Healthy inferences a trial needs (from the settings).
    pub trial_inferences: u32,
    /// Starts a trial gets before a rollback (from the settings).
    pub max_trial_starts: u32,
}

/// What `gc` removed and why it kept the rest.
#[derive(Clone, Debug, Default)]
pub struct GcReport {
    /// Content hashes of the bundles removed.
    pub removed: Vec<String>,
    /// Bytes the removed bundles took.
    pub freed_bytes: u64,
    /// (hash, reason) for bundles kept although unreferenced.
    pub kept: Vec<(String, String)>,
    /// Staging and trash directories removed.
    pub cleaned: Vec<PathBuf>,
    /// Processes whose maps could not be read (permission), so not checked.
    pub unchecked_processes: usize,
}

impl Store {
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
        let pack_scan = {
            let packs = self.packs_dir();
            maps::scan(
                &self.proc_root,
                &std::fs::canonicalize(&packs).unwrap_or(packs),
            )
        };
        let mut packs = Vec::new();
        for hash in self.installed_packs()? {
            let (name, version) = match Self::read_manifest(&self.packs_dir().join(&hash)) {
                Ok(m) => (m.name, m.version),
                Err(_) => ("(unreadable manifest)".into(), String::new()),
            };
            packs.push(BundleInfo {
                mapped: pack_scan.mapped.contains(&hash),
                bytes: self.pack_bytes(&hash),
                hash,
                name,
                version,
            });
        }
        let mut leftovers = Vec::new();
        for (home, dir) in [("bundles", self.bundles_dir()), ("packs", self.packs_dir())] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(STAGING_PREFIX) || name.starts_with(TRASH_PREFIX) {
                    leftovers.push(format!("{home}/{name}"));
                }
            }
        }
        Ok(Status {
            root: self.root().to_owned(),
            state,
            current_link: durable::read_link(&self.current_link())?,
            previous_link: durable::read_link(&self.previous_link())?,
            bundles,
            packs,
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
    /// process maps, then the instruction packs of no remaining bundle that no process maps. Processes whose maps cannot be read (another user's without root, or
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
        // Packs go with the bundles: those of no installed bundle go too (unless mapped).
        let names: Vec<(String, String, String)> = self
            .installed_hashes()?
            .iter()
            .filter_map(|h| Self::read_manifest(&self.bundle_dir(h)).ok())
            .map(|m| (m.name, m.version, m.policy))
            .collect();
        let packs = self.packs_dir();
        let pack_maps = maps::scan(
            &self.proc_root,
            &std::fs::canonicalize(&packs).unwrap_or(packs),
        );
        for hash in self.installed_packs()? {
            let dir = self.packs_dir().join(&hash);
            let wanted = Self::read_manifest(&dir).is_ok_and(|m| {
                names
                    .iter()
                    .any(|(n, v, p)| m.goes_with((n.as_str(), v.as_str(), p.as_str())))
            });
            if wanted {
                continue;
            }
            if pack_maps.mapped.contains(&hash) {
                report
                    .kept
                    .push((hash, "a pack still mapped by a running process".into()));
                continue;
            }
            report.freed_bytes += self.discard(&dir, &hash)?;
            report.removed.push(hash);
        }
        Ok(report)
    }
}
