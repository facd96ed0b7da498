//! Shared test fixtures: temporary directories, the development signing key, small
//! synthetic bundles (a bundle.json and a few files, no QNN) and store settings.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use vla_ota::{DeviceTarget, OtaSettings, PublicKey, Store};

/// RFC 8032 test vector 1: its secret key is public, so it is for tests only.
pub const DEV_SECRET: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
pub const DEV_PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
/// RFC 8032 test vector 2: a valid key that is not trusted.
pub const OTHER_SECRET: &str = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb";

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "ota-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a secret key file (mode 0600) and returns its path.
pub fn key_file(dir: &Path, name: &str, secret_hex: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{secret_hex}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// What a synthetic bundle is built for.
#[derive(Clone)]
pub struct Spec {
    pub name: String,
    pub version: String,
    pub soc_model: u32,
    pub htp_arch: u32,
    pub min_runtime_version: String,
    /// (relative path, content) besides bundle.json.
    pub files: Vec<(String, Vec<u8>)>,
}

impl Spec {
    /// A small MolmoAct2-shaped bundle whose contents depend on `tag`.
    pub fn new(tag: &str) -> Spec {
        let blob = |what: &str, len: usize| -> Vec<u8> {
            (0..len)
                .map(|i| (i as u8).wrapping_mul(31) ^ what.len() as u8 ^ tag.as_bytes()[0])
                .collect()
        };
        Spec {
            name: format!("synthetic-{tag}"),
            version: "0.1.0".into(),
            soc_model: 77,
            htp_arch: 73,
            min_runtime_version: "0.1.0".into(),
            files: vec![
                (
                    "ctx/vision_socid77_archv73.bin".into(),
                    blob("vision", 3000),
                ),
                (
                    "ctx/action_step_socid77_archv73.bin".into(),
                    blob("step", 5000),
                ),
                ("golden/end_to_end.npz".into(), blob("golden", 700)),
                (
                    "prompt/prompt_tables.npz".into(),
                    format!("prompt {tag}").into_bytes(),
                ),
            ],
        }
    }

    pub fn bundle_json(&self) -> String {
        format!(
            r#"{{
  "format": 1,
  "name": "{}",
  "version": "{}",
  "policy": "molmoact2",
  "variant": "original",
  "soc_model": {},
  "htp_arch": {},
  "min_runtime_version": "{}",
  "components": {{}},
  "parity": {{ "context_cosine": 0.9999, "end_to_end_cosine": 0.999 }},
  "end_to_end": "golden/end_to_end.npz"
}}
"#,
            self.name, self.version, self.soc_model, self.htp_arch, self.min_runtime_version
        )
    }

    /// Writes the bundle into `dir` (created), unsigned and unpacked.
    pub fn write(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("bundle.json"), self.bundle_json()).unwrap();
        for (rel, bytes) in &self.files {
            let path = dir.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
    }

    /// Writes, packs and signs the bundle with `secret_hex`; returns its directory.
    pub fn build_signed(&self, parent: &Path, secret_hex: &str) -> PathBuf {
        let dir = parent.join(&self.name);
        self.write(&dir);
        // A fixed expiry (2100-01-01): the same spec always packs to the same content hash.
        vla_ota::pack_until(&dir, 4_102_444_800).unwrap();
        let key = key_file(parent, &format!("{}.key", self.name), secret_hex);
        vla_ota::sign(&dir, &key).unwrap();
        dir
    }
}

pub fn target() -> DeviceTarget {
    DeviceTarget {
        soc_model: 77,
        htp_arch: 73,
        runtime_version: "0.1.0".into(),
    }
}

pub fn trusted() -> Vec<PublicKey> {
    vec![PublicKey::from_hex(DEV_PUBLIC).unwrap()]
}

/// Store settings: 3 healthy inferences commit a trial, 2 starts before a rollback.
pub fn settings(root: &Path) -> OtaSettings {
    OtaSettings {
        root: root.to_owned(),
        trusted_keys: trusted(),
        signature_threshold: 1,
        root_keys: Vec::new(),
        trial_inferences: 3,
        max_trial_starts: 2,
        target: target(),
    }
}

pub fn store(root: &Path) -> Store {
    Store::new(settings(root))
}

/// A gate that accepts every bundle.
pub fn pass(_: &Path) -> Result<(), String> {
    Ok(())
}

/// The content hash `current` points at.
pub fn current_hash(root: &Path) -> Option<String> {
    let target = std::fs::read_link(root.join("current")).ok()?;
    Some(target.file_name()?.to_str()?.to_owned())
}

/// Everything under `dir` as (relative path, bytes or link target), for "untouched" checks.
pub fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let kind = e.file_type().unwrap();
            if rel == "ota.lock" {
                continue;
            }
            if kind.is_symlink() {
                out.push((
                    rel,
                    std::fs::read_link(&p)
                        .unwrap()
                        .display()
                        .to_string()
                        .into_bytes(),
                ));
            } else if kind.is_dir() {
                out.push((format!("{rel}/"), Vec::new()));
                pending.push(p);
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Copies a store tree, recreating symbolic links as links (a cheap fresh copy of a
/// prepared root for each crash iteration).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let kind = e.file_type().unwrap();
        let target = to.join(e.file_name());
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path()).unwrap(), &target).unwrap();
        } else if kind.is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}
