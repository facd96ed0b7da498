//! Ed25519 keys and the detached manifest signature.
//!
//! File formats (all text, so they survive copy-paste and show in a terminal):
//! - secret key file: the 32-byte RFC 8032 secret key as 64 hex characters and a newline,
//!   mode 0600; a file readable by group or others is refused, like ssh does;
//! - public key: 64 lowercase hex characters (the form `ota.trusted_keys` holds);
//! - `ota-manifest.json.sig`: one line per signer, each the 64-byte signature over the
//!   exact bytes of `ota-manifest.json` as 128 lowercase hex characters; a device needs
//!   `signature_threshold` of them from distinct trusted keys (k of n), so one stolen key
//!   is not enough to sign a release.
//!
//! Keys whose secret is published (RFC 8032's test vectors) are listed in
//! [`PUBLISHED_KEYS`]; a device must refuse to trust them ([`PublicKey::published`]).

use crate::durable;
use crate::error::OtaError;
use crate::hex;
use crate::manifest::{MANIFEST_FILE, SIGNATURE_FILE};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// An Ed25519 public key trusted to sign bundles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    /// Parses 64 hex characters.
    pub fn from_hex(text: &str) -> Result<Self, OtaError> {
        hex::decode::<32>(text.trim())
            .map(PublicKey)
            .map_err(|reason| OtaError::PublicKey {
                text: text.to_owned(),
                reason,
            })
    }

    /// The key as 64 lowercase hex characters, as the config's `ota.trusted_keys` holds it.
    pub fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }

    /// Refuses a key whose secret is published ([`PublicKey::published`]).
    pub fn check_not_published(&self) -> Result<(), OtaError> {
        match self.published() {
            Some(published) => Err(OtaError::PublishedKey {
                key: self.to_hex(),
                published,
            }),
            None => Ok(()),
        }
    }

    /// Where this key's secret was published, if it is one of [`PUBLISHED_KEYS`]: anyone can
    /// sign with it, so a device must not trust it.
    pub fn published(&self) -> Option<&'static str> {
        let text = self.to_hex();
        PUBLISHED_KEYS
            .lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(key, _)| *key == text)
            .map(|(_, source)| source.trim())
    }
}

/// Ed25519 public keys whose secret keys are public, one per line: the key's 64 hex
/// characters, a space, where its secret was published. The meta-vla recipe reads the
/// same file, so the image build and the device refuse the same keys.
pub const PUBLISHED_KEYS: &str = include_str!("../published-keys.txt");

/// Most signature lines a signature file may hold.
pub const MAX_SIGNATURES: usize = 16;
/// Largest signature file accepted: [`MAX_SIGNATURES`] lines of 128 hex characters.
pub const MAX_SIGNATURE_BYTES: u64 = (MAX_SIGNATURES as u64) * 130;

/// Reads a secret key file, refusing one that group or others can read.
pub fn read_secret_key(path: &Path) -> Result<SigningKey, OtaError> {
    let err = |reason: String| OtaError::SecretKey {
        path: path.to_owned(),
        reason,
    };
    let file = durable::open_no_follow(path)?;
    let mode = file
        .metadata()
        .map_err(|e| OtaError::io("reading", path, e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(err(format!(
            "mode {:04o} lets group or others read it; chmod 600 it",
            mode & 0o7777
        )));
    }
    let mut text = String::new();
    (&file)
        .take(256)
        .read_to_string(&mut text)
        .map_err(|e| err(format!("not readable as text: {e}")))?;
    let bytes = hex::decode::<32>(text.trim()).map_err(err)?;
    Ok(SigningKey::from_bytes(&bytes))
}

/// Creates a new secret key file (mode 0600, never overwriting) from the kernel's random
/// source and returns the matching public key. For development and fleet provisioning.
pub fn keygen(secret_key_file: &Path) -> Result<PublicKey, OtaError> {
    let mut seed = [0u8; 32];
    let random = Path::new("/dev/urandom");
    std::fs::File::open(random)
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(|e| OtaError::io("reading", random, e))?;
    let key = SigningKey::from_bytes(&seed);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(secret_key_file)
        .map_err(|e| OtaError::io("creating secret key file", secret_key_file, e))?;
    let mut text = hex::encode(&seed);
    text.push('\n');
    file.write_all(text.as_bytes())
        .map_err(|e| OtaError::io("writing", secret_key_file, e))?;
    durable::fsync_file(&file, secret_key_file)?;
    durable::fsync_dir(&durable::parent_of(secret_key_file))?;
    Ok(PublicKey(key.verifying_key().to_bytes()))
}

/// Signs `<bundle_dir>/ota-manifest.json` with the key in `secret_key_file`, adding a line
/// to `ota-manifest.json.sig` (each signer of a k-of-n threshold runs this in turn; `pack`
/// removes the signatures of an earlier manifest). Returns the public key that verifies it.
pub fn sign(bundle_dir: &Path, secret_key_file: &Path) -> Result<PublicKey, OtaError> {
    let manifest_path = bundle_dir.join(MANIFEST_FILE);
    let bytes =
        std::fs::read(&manifest_path).map_err(|e| OtaError::io("reading", &manifest_path, e))?;
    // Refuse to sign something verification would refuse anyway.
    crate::manifest::OtaManifest::parse(&manifest_path, &bytes)?;
    add_signature(bundle_dir, SIGNATURE_FILE, &bytes, secret_key_file)
}

/// Signs `<dir>/keys.json` (a key list) with the fleet's root key in `secret_key_file`,
/// adding a line to `keys.json.sig`. Run on the offline machine that holds the root key.
pub fn sign_key_list(dir: &Path, secret_key_file: &Path) -> Result<PublicKey, OtaError> {
    let path = dir.join(crate::KEY_LIST_FILE);
    let bytes = std::fs::read(&path).map_err(|e| OtaError::io("reading", &path, e))?;
    add_signature(dir, crate::KEY_LIST_SIGNATURE_FILE, &bytes, secret_key_file)
}

/// Adds the signature of `bytes` by the key in `secret_key_file` to `dir/signature_file`:
/// the other signers' lines are kept, this key's own is replaced, not doubled.
fn add_signature(
    dir: &Path,
    signature_file: &str,
    bytes: &[u8],
    secret_key_file: &Path,
) -> Result<PublicKey, OtaError> {
    let key = read_secret_key(secret_key_file)?;
    let signature = key.sign(bytes);
    let signature_path = dir.join(signature_file);
    let mut text = match std::fs::symlink_metadata(&signature_path) {
        Ok(_) => {
            let existing = crate::verify::read_small(
                &signature_path,
                MAX_SIGNATURE_BYTES,
                dir,
                signature_file,
            )?;
            let public = key.verifying_key();
            parse_signatures(&signature_path, &existing)?
                .into_iter()
                .filter(|s| public.verify_strict(bytes, s).is_err())
                .map(|s| format!("{}\n", hex::encode(&s.to_bytes())))
                .collect::<String>()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(OtaError::io("reading", &signature_path, e)),
    };
    text.push_str(&hex::encode(&signature.to_bytes()));
    text.push('\n');
    durable::write_atomic(&signature_path, text.as_bytes(), &mut |_| {})?;
    Ok(PublicKey(key.verifying_key().to_bytes()))
}

/// Parses signature file text: one signature of 128 hex characters per line (blank lines
/// and surrounding whitespace ignored), at least one and at most [`MAX_SIGNATURES`].
pub(crate) fn parse_signatures(path: &Path, text: &[u8]) -> Result<Vec<Signature>, OtaError> {
    let err = |reason: String| OtaError::SignatureFormat {
        path: path.to_owned(),
        reason,
    };
    let text = std::str::from_utf8(text).map_err(|_| err("not text".into()))?;
    let mut signatures = Vec::new();
    for (i, line) in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        if i == MAX_SIGNATURES {
            return Err(err(format!("more than {MAX_SIGNATURES} signatures")));
        }
        let bytes = hex::decode::<64>(line).map_err(|r| err(format!("line {}: {r}", i + 1)))?;
        signatures.push(Signature::from_bytes(&bytes));
    }
    if signatures.is_empty() {
        return Err(err("holds no signature".into()));
    }
    Ok(signatures)
}

/// The trusted key `signature` over `message` verifies against, if any. Strict
/// verification: rejects the malleable and small-order encodings RFC 8032 leaves open.
pub(crate) fn verify_with_any<'k>(
    keys: &'k [PublicKey],
    message: &[u8],
    signature: &Signature,
) -> Option<&'k PublicKey> {
    keys.iter().find(|k| {
        VerifyingKey::from_bytes(&k.0)
            .map(|vk| vk.verify_strict(message, signature).is_ok())
            .unwrap_or(false)
    })
}

/// The distinct trusted keys that signed `message` among `signatures`, in the order of
/// `keys`: a key that signed twice counts once.
pub(crate) fn signers(
    keys: &[PublicKey],
    message: &[u8],
    signatures: &[Signature],
) -> Vec<PublicKey> {
    let mut found: Vec<PublicKey> = Vec::new();
    for signature in signatures {
        if let Some(key) = verify_with_any(keys, message, signature) {
            if !found.contains(key) {
                found.push(*key);
            }
        }
    }
    found
}
