//! Ed25519 keys and the detached manifest signature.
//!
//! File formats (all text, so they survive copy-paste and show in a terminal):
//! - secret key file: the 32-byte RFC 8032 secret key as 64 hex characters and a newline,
//!   mode 0600; a file readable by group or others is refused, like ssh does;
//! - public key: 64 lowercase hex characters (the form `ota.trusted_keys` holds);
//! - `ota-manifest.json.sig`: the 64-byte signature over the exact bytes of
//!   `ota-manifest.json` as 128 lowercase hex characters and a newline.

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
}

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

/// Signs `<bundle_dir>/ota-manifest.json` with the key in `secret_key_file`, writing
/// `ota-manifest.json.sig`. Returns the public key that verifies it.
pub fn sign(bundle_dir: &Path, secret_key_file: &Path) -> Result<PublicKey, OtaError> {
    let key = read_secret_key(secret_key_file)?;
    let manifest_path = bundle_dir.join(MANIFEST_FILE);
    let bytes =
        std::fs::read(&manifest_path).map_err(|e| OtaError::io("reading", &manifest_path, e))?;
    // Refuse to sign something verification would refuse anyway.
    crate::manifest::OtaManifest::parse(&manifest_path, &bytes)?;
    let signature = key.sign(&bytes);
    let mut text = hex::encode(&signature.to_bytes());
    text.push('\n');
    durable::write_atomic(
        &bundle_dir.join(SIGNATURE_FILE),
        text.as_bytes(),
        &mut |_| {},
    )?;
    Ok(PublicKey(key.verifying_key().to_bytes()))
}

/// Parses signature file text (128 hex characters, surrounding whitespace ignored).
pub(crate) fn parse_signature(path: &Path, text: &[u8]) -> Result<Signature, OtaError> {
    let err = |reason: String| OtaError::SignatureFormat {
        path: path.to_owned(),
        reason,
    };
    let text = std::str::from_utf8(text).map_err(|_| err("not text".into()))?;
    let bytes = hex::decode::<64>(text.trim()).map_err(err)?;
    Ok(Signature::from_bytes(&bytes))
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
