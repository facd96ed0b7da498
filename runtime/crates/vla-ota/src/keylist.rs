//! The signed, versioned key list: which keys sign bundles, how many must, and which are
//! revoked, signed by the fleet's root key (kept offline). It travels next to a bundle's
//! manifest (`keys.json` and `keys.json.sig`, outside the manifest's file list, like the
//! manifest's own signature), so the signing keys rotate and are revoked over the air;
//! the store keeps the newest one it has accepted in its root (`key-list.json`: list and
//! signature in one file, replaced in one atomic step).
//!
//! Rules: a key list counts only if `root_keys` (the configuration's `ota.root_keys`)
//! signed it; its version never goes back (an older list is ignored, the stored one
//! stays); while one is stored its `keys` and `threshold` replace the configuration's
//! `trusted_keys` and `signature_threshold`; a key it revokes is refused even if the
//! configuration still lists it.
//!
//! ```text
//! {"format": 1, "version": 2, "keys": ["<hex>", ...], "threshold": 1, "revoked": ["<hex>", ...]}
//! ```

use crate::error::OtaError;
use crate::signing::{parse_signatures, signers, PublicKey, MAX_SIGNATURE_BYTES};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The key list file name, in a bundle directory and in the store's root.
pub const KEY_LIST_FILE: &str = "keys.json";
/// Its detached signature (one line per root signer).
pub const KEY_LIST_SIGNATURE_FILE: &str = "keys.json.sig";
/// The store's copy of the newest accepted list, under the OTA root.
pub const STORED_KEY_LIST_FILE: &str = "key-list.json";
const MAX_KEY_LIST_BYTES: u64 = 64 * 1024;

/// The store's copy: the list's exact text and its signature file's text, in one file.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    list: String,
    signature: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeyList {
    format: u32,
    version: u64,
    keys: Vec<String>,
    threshold: usize,
    #[serde(default)]
    revoked: Vec<String>,
}

/// A key list whose root signature verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyList {
    /// Only rises: a list with a lower version than the stored one is ignored.
    pub version: u64,
    /// The keys that may sign bundles.
    pub keys: Vec<PublicKey>,
    /// Distinct keys of `keys` a bundle needs.
    pub threshold: usize,
    /// Keys refused whatever else trusts them.
    pub revoked: Vec<PublicKey>,
    /// The exact bytes the root signed (what the store keeps).
    pub bytes: Vec<u8>,
    /// The signature file's bytes.
    pub signature: Vec<u8>,
}

impl KeyList {
    /// Reads `dir/keys.json` and its signature, `Ok(None)` if the directory has no key
    /// list. The root signature is checked before the list is parsed.
    pub fn read(dir: &Path, root_keys: &[PublicKey]) -> Result<Option<KeyList>, OtaError> {
        let path = dir.join(KEY_LIST_FILE);
        if std::fs::symlink_metadata(&path).is_err() {
            return Ok(None);
        }
        let bytes = crate::verify::read_small(&path, MAX_KEY_LIST_BYTES, dir, KEY_LIST_FILE)?;
        let sig_path = dir.join(KEY_LIST_SIGNATURE_FILE);
        let signature = crate::verify::read_small(
            &sig_path,
            MAX_SIGNATURE_BYTES,
            dir,
            KEY_LIST_SIGNATURE_FILE,
        )?;
        Self::check(&path, &sig_path, bytes, signature, root_keys).map(Some)
    }

    /// Reads the list the store keeps (`path`: both parts in one file, written in one
    /// atomic step), `Ok(None)` if there is none.
    pub(crate) fn read_stored(
        path: &Path,
        root_keys: &[PublicKey],
    ) -> Result<Option<KeyList>, OtaError> {
        let bytes = match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(OtaError::io("reading", path, e)),
            Ok(m) if m.len() > 4 * MAX_KEY_LIST_BYTES => {
                return Err(OtaError::KeyList {
                    path: path.to_owned(),
                    reason: format!("is {} bytes", m.len()),
                })
            }
            Ok(_) => std::fs::read(path).map_err(|e| OtaError::io("reading", path, e))?,
        };
        let stored: Stored = serde_json::from_slice(&bytes).map_err(|e| OtaError::KeyList {
            path: path.to_owned(),
            reason: format!("not a stored key list: {e}"),
        })?;
        Self::check(
            path,
            path,
            stored.list.into_bytes(),
            stored.signature.into_bytes(),
            root_keys,
        )
        .map(Some)
    }

    /// What the store writes for [`KeyList::read_stored`].
    pub(crate) fn stored_bytes(&self) -> Vec<u8> {
        let stored = Stored {
            list: String::from_utf8_lossy(&self.bytes).into_owned(),
            signature: String::from_utf8_lossy(&self.signature).into_owned(),
        };
        let mut bytes = serde_json::to_vec_pretty(&stored).expect("strings serialize");
        bytes.push(b'\n');
        bytes
    }

    /// The root signature over `bytes` (checked first), then the list's rules.
    fn check(
        path: &Path,
        sig_path: &Path,
        bytes: Vec<u8>,
        signature: Vec<u8>,
        root_keys: &[PublicKey],
    ) -> Result<KeyList, OtaError> {
        let err = |reason: String| OtaError::KeyList {
            path: path.to_owned(),
            reason,
        };
        if std::str::from_utf8(&bytes).is_err() {
            return Err(err("is not UTF-8 text".into()));
        }
        if root_keys.is_empty() {
            return Err(err(
                "no root key is configured (ota.root_keys): a key list cannot be trusted".into(),
            ));
        }
        let signatures = parse_signatures(sig_path, &signature)?;
        if signers(root_keys, &bytes, &signatures).is_empty() {
            return Err(err(format!(
                "its signature does not verify against any of the {} root key(s)",
                root_keys.len()
            )));
        }
        let raw: RawKeyList =
            serde_json::from_slice(&bytes).map_err(|e| err(format!("not a key list: {e}")))?;
        if raw.format != 1 {
            return Err(err(format!("format {} is not supported", raw.format)));
        }
        let parse = |texts: &[String]| -> Result<Vec<PublicKey>, OtaError> {
            texts.iter().map(|t| PublicKey::from_hex(t)).collect()
        };
        let keys = parse(&raw.keys)?;
        let revoked = parse(&raw.revoked)?;
        for key in &keys {
            key.check_not_published()?;
        }
        if raw.threshold == 0 || raw.threshold > keys.len() {
            return Err(err(format!(
                "threshold {} is not in 1..={}",
                raw.threshold,
                keys.len()
            )));
        }
        Ok(KeyList {
            version: raw.version,
            keys,
            threshold: raw.threshold,
            revoked,
            bytes,
            signature,
        })
    }

    /// The keys that verify bundles under this list, and how many must have signed.
    pub fn trust(&self) -> (Vec<PublicKey>, usize) {
        let keys = self
            .keys
            .iter()
            .filter(|k| !self.revoked.contains(k))
            .copied()
            .collect();
        (keys, self.threshold)
    }
}
