//! `vlad bundle calibrate|pack|sign|verify|keygen`: preparing a bundle directory for OTA
//! delivery.
//!
//! `calibrate` writes the per-output parity gates a bring-up report proposes
//! (`bundle_calibrate`), before `pack`.
//! `pack` writes `ota-manifest.json` (identity from `bundle.json`, every file's size and
//! SHA-256), `sign` writes the detached Ed25519 signature `ota-manifest.json.sig`,
//! `verify` runs the device's own verification, and `keygen` makes a signing key for
//! development or fleet provisioning. File formats: `runtime/crates/vla-ota` docs.

mod calibrate;

use crate::cli;
use crate::cmd::ota::{device_target, StoreOptions};
use crate::Failure;
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;

const HELP: &str = "usage: vlad bundle <command>
commands:
  calibrate <dir> --from GATES.json
                              write the per-output parity gates a bring-up report proposes
                              into <dir>/bundle.json (before pack and sign)
  pack <dir> [--expires UNIX_SECONDS]
                              write <dir>/ota-manifest.json (removes stale signatures); devices
                              refuse to install it after its expiry (default: 90 days from now)
  sign <dir> --key FILE       add a signature with the secret key in FILE (mode 0600); each
                              signer of a k-of-n threshold (ota.signature_threshold) runs it
  verify <dir> [--trusted-key HEX]... [--config FILE]
                              verify as the device does: signature, SoC 77 / arch 73,
                              runtime version, every file's size and SHA-256
  sign-keys <dir> --key FILE  add a root-key signature to <dir>/keys.json (the key list:
                              signing keys, threshold, revoked keys; docs/security.md)
  keygen <file>               create a secret key file (0600, never overwritten), print the public key
Keys are 64 hex characters; a signature is 128 hex characters.
Exit status: 0 done, 1 error or refused, 2 usage.";

pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let mut options = StoreOptions::default();
    let mut command: Option<String> = None;
    let mut operand: Option<PathBuf> = None;
    let mut key: Option<PathBuf> = None;
    let mut from: Option<PathBuf> = None;
    let mut expires: Option<u64> = None;
    let mut p = cli::parser(args);
    while let Some(arg) = p.next().map_err(cli::usage)? {
        match arg {
            Long(name @ ("config" | "trusted-key")) => {
                let name = name.to_owned();
                options.take(&name, &mut p)?;
            }
            Long("key") => key = Some(cli::value(&mut p)?.into()),
            Long("from") => from = Some(cli::value(&mut p)?.into()),
            Long("expires") => {
                let text = cli::string(&mut p)?;
                expires = Some(text.parse().map_err(|_| {
                    Failure::Usage(format!("--expires: `{text}` is not Unix seconds"))
                })?);
            }
            Short('h') | Long("help") => {
                println!("{HELP}");
                return Ok(());
            }
            Value(v) if command.is_none() => {
                command = Some(v.into_string().map_err(|v| {
                    Failure::Usage(format!("unknown bundle command `{}`", v.to_string_lossy()))
                })?)
            }
            Value(v) if operand.is_none() => operand = Some(v.into()),
            other => return Err(cli::unexpected(other)),
        }
    }
    let command =
        command.ok_or_else(|| Failure::Usage(format!("bundle needs a command\n{HELP}")))?;
    let operand =
        operand.ok_or_else(|| Failure::Usage(format!("bundle {command} needs a path\n{HELP}")))?;
    if key.is_some() && command != "sign" && command != "sign-keys" {
        return Err(Failure::Usage(
            "--key is only for bundle sign and sign-keys".into(),
        ));
    }
    if expires.is_some() && command != "pack" {
        return Err(Failure::Usage("--expires is only for bundle pack".into()));
    }
    if from.is_some() != (command == "calibrate") {
        return Err(Failure::Usage(
            "bundle calibrate needs --from GATES.json, and only it takes --from".into(),
        ));
    }
    match command.as_str() {
        "calibrate" => calibrate::calibrate(&operand, from.as_deref().expect("checked above")),
        "pack" => {
            let manifest = match expires {
                Some(t) => vla_ota::pack_until(&operand, t)?,
                None => vla_ota::pack(&operand)?,
            };
            println!(
                "packed {} {} ({} files, {} bytes, expires at Unix time {}) into {}",
                manifest.name,
                manifest.version,
                manifest.files.len(),
                manifest.payload_bytes(),
                manifest.expires,
                operand.join(vla_ota::MANIFEST_FILE).display()
            );
            println!(
                "sign it with: vlad bundle sign {} --key FILE",
                operand.display()
            );
            Ok(())
        }
        "sign" => {
            let key = key.ok_or_else(|| Failure::Usage("bundle sign needs --key FILE".into()))?;
            let public = vla_ota::sign(&operand, &key)?;
            println!(
                "signed {} with key {}",
                operand.join(vla_ota::MANIFEST_FILE).display(),
                public.to_hex()
            );
            Ok(())
        }
        "verify" => {
            // Without a configuration, `--trusted-key` alone is enough off the device;
            // with one, as the device's store would: its key list (stored, or a newer
            // root-signed one beside the manifest) and its threshold.
            let v = if options.config.is_none() && !options.trusted_keys.is_empty() {
                vla_ota::verify(&operand, &options.trusted_keys, &device_target())?
            } else {
                vla_ota::Store::new(options.settings()?).verify_offered(&operand)?
            };
            println!(
                "verified {} {} ({}, soc {} arch {}, needs runtime {}): {} files, {} bytes",
                v.manifest.name,
                v.manifest.version,
                v.manifest.policy,
                v.manifest.soc_model,
                v.manifest.htp_arch,
                v.manifest.min_runtime_version,
                v.manifest.files.len(),
                v.manifest.payload_bytes()
            );
            for signer in &v.signers {
                println!("signed by {}", signer.to_hex());
            }
            println!("expires at Unix time {}", v.manifest.expires);
            println!("content hash {}", v.content_hash);
            Ok(())
        }
        "sign-keys" => {
            let key =
                key.ok_or_else(|| Failure::Usage("bundle sign-keys needs --key FILE".into()))?;
            let public = vla_ota::sign_key_list(&operand, &key)?;
            println!(
                "signed {} with root key {}",
                operand.join(vla_ota::KEY_LIST_FILE).display(),
                public.to_hex()
            );
            Ok(())
        }
        "keygen" => {
            let public = vla_ota::keygen(&operand)?;
            println!("secret key written to {} (mode 0600)", operand.display());
            println!("public key (add to ota.trusted_keys): {}", public.to_hex());
            Ok(())
        }
        other => Err(Failure::Usage(format!(
            "unknown bundle command `{other}`\n{HELP}"
        ))),
    }
}
