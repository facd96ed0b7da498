//! `ota-manifest.json`: what a signed bundle is (name, version, target) and every file it
//! holds with its size and SHA-256; `pack` writes it from a bundle directory.
//!
//! The manifest bytes are what the signature covers and their SHA-256 is the bundle's
//! content hash (its directory name on the device), so `pack` writes a canonical form:
//! fields in a fixed order, files sorted by path, two-space indentation, final newline.

use crate::durable;
use crate::error::OtaError;
use crate::hex;
use crate::version::Version;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Component, Path};

/// The manifest file name inside a bundle directory.
pub const MANIFEST_FILE: &str = "ota-manifest.json";
/// The detached signature next to it (128 lowercase hex characters and a newline).
pub const SIGNATURE_FILE: &str = "ota-manifest.json.sig";
/// The identity file of a bundle: what the manifest's name, version and target repeat.
pub const BUNDLE_FILE: &str = "bundle.json";
/// The identity file of an instruction pack: a signed file set that goes with one bundle
/// (its `name`, `version` and `policy` are that bundle's) and is installed beside it under
/// `packs/`, never activated. A manifest lists exactly one of the two identity files.
pub const PACK_FILE: &str = "pack.json";
/// The only manifest format this runtime reads and writes.
pub const MANIFEST_FORMAT: u32 = 1;
/// Largest manifest accepted: a bundle lists tens of files, so 1 MiB is generous and
/// bounds what an unverified file can make us allocate.
pub const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;
/// How long a bundle [`pack`] writes stays installable unless told otherwise: 90 days, so a
/// fleet re-signs its current release at least quarterly.
pub const DEFAULT_VALIDITY_S: u64 = 90 * 24 * 3600;

/// One file of a bundle, relative to the bundle directory with `/` separators.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Path relative to the bundle directory, `/`-separated, never absolute or climbing out.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the file's bytes.
    pub sha256: String,
}

/// The parsed `ota-manifest.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtaManifest {
    /// Manifest format version; must equal [`MANIFEST_FORMAT`].
    pub format: u32,
    /// `bundle.json` `name`.
    pub name: String,
    /// `bundle.json` `version`.
    pub version: String,
    /// `bundle.json` `policy` (`molmoact2` or `fastwam`).
    pub policy: String,
    /// QNN SoC model the context binaries were built for (QCS9075: 77).
    pub soc_model: u32,
    /// Hexagon HTP architecture the context binaries were built for (v73: 73).
    pub htp_arch: u32,
    /// Oldest runtime version (`MAJOR.MINOR.PATCH`) that can run this bundle.
    pub min_runtime_version: String,
    /// When the signer's promise that this is a current release ends (Unix seconds, UTC):
    /// a device refuses to install or activate the bundle after it, so a server that
    /// withholds newer releases is noticed (a committed bundle keeps running and reports
    /// itself stale).
    pub expires: u64,
    /// Every file of the bundle except the manifest and its signature, sorted by path.
    pub files: Vec<FileEntry>,
}

/// The fields of `bundle.json` the OTA manifest repeats (and verification cross-checks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BundleIdentity {
    pub name: String,
    pub version: String,
    pub policy: String,
    pub soc_model: u32,
    pub htp_arch: u32,
    pub min_runtime_version: String,
}

impl BundleIdentity {
    /// Reads the identity fields of `<dir>/<file>` (`bundle.json` or `pack.json`); other
    /// fields are the policy's business and are not interpreted here.
    pub(crate) fn read(dir: &Path, file: &str) -> Result<Self, OtaError> {
        let path = dir.join(file);
        let bytes = crate::verify::read_small(&path, MAX_MANIFEST_BYTES, dir, file)?;
        Self::parse(&path, &bytes)
    }

    /// The identity file of the directory a manifest will be written for: `pack.json` for
    /// a pack, else `bundle.json` (both present is refused: the kind would be ambiguous).
    pub(crate) fn file_of(dir: &Path) -> Result<&'static str, OtaError> {
        match (dir.join(BUNDLE_FILE).exists(), dir.join(PACK_FILE).exists()) {
            (true, true) => Err(OtaError::BundleJson {
                path: dir.join(PACK_FILE),
                reason: "a directory holds bundle.json or pack.json, not both".into(),
            }),
            (false, true) => Ok(PACK_FILE),
            _ => Ok(BUNDLE_FILE),
        }
    }

    pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Self, OtaError> {
        let err = |reason: String| OtaError::BundleJson {
            path: path.to_owned(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let text = |key: &str| -> Result<String, OtaError> {
            match value.get(key) {
                Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(other) => Err(err(format!(
                    "`{key}` must be a non-empty string, found {other}"
                ))),
                None => Err(err(format!("`{key}` is missing"))),
            }
        };
        let number = |key: &str| -> Result<u32, OtaError> {
            match value.get(key) {
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| err(format!("`{key}` must be a whole number, found {v}"))),
                None => Err(err(format!("`{key}` is missing"))),
            }
        };
        Ok(BundleIdentity {
            name: text("name")?,
            version: text("version")?,
            policy: text("policy")?,
            soc_model: number("soc_model")?,
            htp_arch: number("htp_arch")?,
            min_runtime_version: text("min_runtime_version")?,
        })
    }
}

impl OtaManifest {
    /// Parses manifest bytes and checks the rules that need no file system: format,
    /// versions, policy, and that every path is a plain relative path listed once.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, OtaError> {
        let manifest: OtaManifest =
            serde_json::from_slice(bytes).map_err(|e| OtaError::ManifestSyntax {
                path: path.to_owned(),
                reason: e.to_string(),
            })?;
        let invalid = |field: String, reason: String| OtaError::ManifestInvalid {
            path: path.to_owned(),
            field,
            reason,
        };
        if manifest.format != MANIFEST_FORMAT {
            return Err(invalid(
                "format".into(),
                format!(
                    "{} is not supported (this runtime reads format 1)",
                    manifest.format
                ),
            ));
        }
        for (field, value) in [
            ("version", &manifest.version),
            ("min_runtime_version", &manifest.min_runtime_version),
        ] {
            if Version::parse(value).is_none() {
                return Err(invalid(
                    field.into(),
                    format!("`{value}` is not a version MAJOR.MINOR.PATCH"),
                ));
            }
        }
        if !matches!(manifest.policy.as_str(), "molmoact2" | "fastwam") {
            return Err(invalid(
                "policy".into(),
                format!("`{}` is not molmoact2 or fastwam", manifest.policy),
            ));
        }
        let bundle = path.parent().unwrap_or(Path::new("")).to_owned();
        let mut seen = BTreeSet::new();
        for (i, f) in manifest.files.iter().enumerate() {
            check_relative(&bundle, &f.path)?;
            if f.path == MANIFEST_FILE || f.path == SIGNATURE_FILE {
                return Err(invalid(
                    format!("files[{i}].path"),
                    format!("`{}` may not list the manifest or its signature", f.path),
                ));
            }
            if !seen.insert(f.path.as_str()) {
                return Err(invalid(
                    format!("files[{i}].path"),
                    format!("`{}` is listed twice", f.path),
                ));
            }
            if !hex::is_content_hash(&f.sha256) {
                return Err(invalid(
                    format!("files[{i}].sha256"),
                    format!("`{}` is not 64 lowercase hex characters", f.sha256),
                ));
            }
        }
        if seen.contains(BUNDLE_FILE) == seen.contains(PACK_FILE) {
            return Err(invalid(
                "files".into(),
                "does not list exactly one of bundle.json and pack.json".into(),
            ));
        }
        Ok(manifest)
    }

    /// An instruction pack (lists `pack.json`), not a bundle.
    pub fn is_pack(&self) -> bool {
        self.files.iter().any(|f| f.path == PACK_FILE)
    }

    /// The identity file this manifest lists: `bundle.json` or `pack.json`.
    pub fn identity_file(&self) -> &'static str {
        if self.is_pack() {
            PACK_FILE
        } else {
            BUNDLE_FILE
        }
    }

    /// `(name, version, policy)`: what a pack names its bundle by.
    pub fn names(&self) -> (&str, &str, &str) {
        (&self.name, &self.version, &self.policy)
    }

    /// Whether this manifest (a pack's) names the bundle `(name, version, policy)`.
    pub fn goes_with(&self, bundle: (&str, &str, &str)) -> bool {
        self.names() == bundle
    }

    /// The canonical bytes `pack` writes (and signs over).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes =
            serde_json::to_vec_pretty(self).expect("a manifest of strings and numbers serializes");
        bytes.push(b'\n');
        bytes
    }

    /// Total bytes of the listed files.
    pub fn payload_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// A manifest path must be non-empty, relative, `/`-separated plain names: no `.`, `..`,
/// empty segments, backslashes or NUL, so it can only name something inside the bundle.
pub(crate) fn check_relative(bundle: &Path, path: &str) -> Result<(), OtaError> {
    let unsafe_path = |reason| OtaError::UnsafePath {
        bundle: bundle.to_owned(),
        path: path.to_owned(),
        reason,
    };
    if path.is_empty() {
        return Err(unsafe_path("is empty"));
    }
    if path.starts_with('/') {
        return Err(unsafe_path("is absolute"));
    }
    if path.contains('\\') || path.contains('\0') {
        return Err(unsafe_path("contains a backslash or NUL"));
    }
    for segment in path.split('/') {
        match segment {
            "" => return Err(unsafe_path("has an empty segment")),
            "." | ".." => return Err(unsafe_path("has a `.` or `..` segment")),
            _ => {}
        }
    }
    debug_assert!(Path::new(path)
        .components()
        .all(|c| matches!(c, Component::Normal(_))));
    Ok(())
}

/// SHA-256 and length of what `reader` yields, reading at most `limit` bytes: a caller
/// that knows the declared size passes one more than it, so a file that grows while it
/// is read (or never ends) shows as too long instead of being read forever.
pub(crate) fn hash_reader(
    reader: impl Read,
    path: &Path,
    limit: u64,
) -> Result<(u64, [u8; 32]), OtaError> {
    let mut reader = reader.take(limit);
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buffer[..n]);
                total += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(OtaError::io("reading", path, e)),
        }
    }
    Ok((total, hasher.finalize().into()))
}

/// Writes `<bundle_dir>/ota-manifest.json` listing every file of the bundle, with the
/// identity fields taken from `bundle.json` (or a pack's `pack.json`), and removes a signature left from an earlier
/// manifest (it would no longer match). Symbolic links and special files are refused.
pub fn pack(bundle_dir: &Path) -> Result<OtaManifest, OtaError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    pack_until(bundle_dir, now.saturating_add(DEFAULT_VALIDITY_S))
}

/// [`pack`] with an explicit expiry (Unix seconds, UTC) instead of [`DEFAULT_VALIDITY_S`].
pub fn pack_until(bundle_dir: &Path, expires: u64) -> Result<OtaManifest, OtaError> {
    let file = BundleIdentity::file_of(bundle_dir)?;
    let identity = BundleIdentity::read(bundle_dir, file)?;
    for (field, value) in [
        ("version", &identity.version),
        ("min_runtime_version", &identity.min_runtime_version),
    ] {
        if Version::parse(value).is_none() {
            return Err(OtaError::BundleJson {
                path: bundle_dir.join(file),
                reason: format!("`{field}` `{value}` is not a version MAJOR.MINOR.PATCH"),
            });
        }
    }
    let listing = crate::verify::walk(bundle_dir)?;
    let mut files = Vec::new();
    for rel in listing.files {
        if rel == MANIFEST_FILE || rel == SIGNATURE_FILE {
            continue;
        }
        let path = bundle_dir.join(&rel);
        let file = durable::open_no_follow(&path)?;
        let (size, digest) = hash_reader(file, &path, u64::MAX)?;
        files.push(FileEntry {
            path: rel,
            size,
            sha256: hex::encode(&digest),
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let manifest = OtaManifest {
        format: MANIFEST_FORMAT,
        name: identity.name,
        version: identity.version,
        policy: identity.policy,
        soc_model: identity.soc_model,
        htp_arch: identity.htp_arch,
        min_runtime_version: identity.min_runtime_version,
        expires,
        files,
    };
    let manifest_path = bundle_dir.join(MANIFEST_FILE);
    let bytes = manifest.to_bytes();
    // Checked before writing: a manifest `verify` would refuse must not be produced.
    OtaManifest::parse(&manifest_path, &bytes)?;
    let signature = bundle_dir.join(SIGNATURE_FILE);
    match std::fs::remove_file(&signature) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(OtaError::io("removing stale", signature, e)),
    }
    durable::write_atomic(&manifest_path, &bytes, &mut |_| {})?;
    Ok(manifest)
}
