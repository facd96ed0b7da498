//! Packaging, signing and verification: the happy path and every way a bundle is refused.

mod common;

use common::*;
use sha2::{Digest, Sha256};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use vla_ota::{verify, OtaError, PublicKey, MANIFEST_FILE, SIGNATURE_FILE};

fn check(dir: &Path) -> Result<vla_ota::VerifiedBundle, OtaError> {
    verify(dir, &trusted(), &target())
}

/// Signs an edited manifest with the trusted key, to reach the checks behind the
/// signature (`vla_ota::sign` itself refuses manifests that break the rules).
fn resign(dir: &Path) {
    use ed25519_dalek::Signer;
    let secret = vla_ota::hex::decode::<32>(DEV_SECRET).unwrap();
    let key = ed25519_dalek::SigningKey::from_bytes(&secret);
    let bytes = std::fs::read(dir.join(MANIFEST_FILE)).unwrap();
    let sig = vla_ota::hex::encode(&key.sign(&bytes).to_bytes());
    std::fs::write(dir.join(SIGNATURE_FILE), format!("{sig}\n")).unwrap();
}

#[test]
fn pack_sign_verify_round_trip() {
    let tmp = TempDir::new("verify-ok");
    let dir = Spec::new("a").build_signed(tmp.path(), DEV_SECRET);
    let manifest_bytes = std::fs::read(dir.join(MANIFEST_FILE)).unwrap();
    let v = check(&dir).unwrap();
    assert_eq!(
        v.content_hash,
        vla_ota::hex::encode(&Sha256::digest(&manifest_bytes))
    );
    assert_eq!(v.signed_by.to_hex(), DEV_PUBLIC);
    assert_eq!(v.manifest.name, "synthetic-a");
    assert_eq!(v.manifest.policy, "molmoact2");
    assert_eq!((v.manifest.soc_model, v.manifest.htp_arch), (77, 73));
    let paths: Vec<&str> = v.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "bundle.json",
            "ctx/action_step_socid77_archv73.bin",
            "ctx/vision_socid77_archv73.bin",
            "golden/end_to_end.npz",
            "prompt/prompt_tables.npz"
        ]
    );
    let step = &v.manifest.files[1];
    assert_eq!(step.size, 5000);
    let bytes = std::fs::read(dir.join(&step.path)).unwrap();
    assert_eq!(step.sha256, vla_ota::hex::encode(&Sha256::digest(&bytes)));
    // The signature file is 128 hex characters and a newline.
    let sig = std::fs::read_to_string(dir.join(SIGNATURE_FILE)).unwrap();
    assert_eq!(sig.len(), 129);
    assert!(sig.ends_with('\n'));
    // Packing again with the same expiry is deterministic (same bytes, same content hash)
    // and drops the signature.
    vla_ota::pack_until(&dir, 4_102_444_800).unwrap();
    assert_eq!(
        std::fs::read(dir.join(MANIFEST_FILE)).unwrap(),
        manifest_bytes
    );
    assert!(!dir.join(SIGNATURE_FILE).exists());
}

#[test]
fn bad_signatures_are_refused() {
    let tmp = TempDir::new("verify-sig");
    let dir = Spec::new("a").build_signed(tmp.path(), DEV_SECRET);

    // No trusted key: fail closed.
    let e = verify(&dir, &[], &target()).unwrap_err();
    assert!(matches!(e, OtaError::NoTrustedKeys), "{e}");
    assert!(e.to_string().contains("every update is refused"));

    // Signed by a valid but untrusted key.
    let other = Spec::new("a").build_signed(&tmp.join("other"), OTHER_SECRET);
    let e = check(&other).unwrap_err();
    assert!(matches!(e, OtaError::BadSignature { keys: 1, .. }), "{e}");

    // A flipped signature bit.
    let sig_path = dir.join(SIGNATURE_FILE);
    let mut sig = std::fs::read_to_string(&sig_path).unwrap();
    let flipped = if sig.starts_with('0') { "1" } else { "0" };
    sig.replace_range(0..1, flipped);
    std::fs::write(&sig_path, &sig).unwrap();
    let e = check(&dir).unwrap_err();
    assert!(matches!(e, OtaError::BadSignature { .. }), "{e}");
    assert!(e
        .to_string()
        .contains("does not verify against any of the 1 trusted key(s)"));

    // Not hex at all.
    std::fs::write(&sig_path, "not a signature\n").unwrap();
    let e = check(&dir).unwrap_err();
    assert!(matches!(e, OtaError::SignatureFormat { .. }), "{e}");

    // Missing.
    std::fs::remove_file(&sig_path).unwrap();
    let e = check(&dir).unwrap_err();
    assert!(
        matches!(
            e,
            OtaError::Unsigned {
                missing: SIGNATURE_FILE,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("has no ota-manifest.json.sig"),
        "{e}"
    );
}

#[test]
fn manifest_edited_after_signing_is_refused_by_the_signature() {
    let tmp = TempDir::new("verify-edit");
    let dir = Spec::new("a").build_signed(tmp.path(), DEV_SECRET);
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("\"soc_model\": 77", "\"soc_model\": 78"),
    )
    .unwrap();
    let e = check(&dir).unwrap_err();
    assert!(matches!(e, OtaError::BadSignature { .. }), "{e}");
}

#[test]
fn content_changes_are_refused() {
    let tmp = TempDir::new("verify-content");
    let rel = "ctx/vision_socid77_archv73.bin";

    // Same size, different bytes: hash mismatch naming the file.
    let dir = Spec::new("a").build_signed(&tmp.join("hash"), DEV_SECRET);
    let mut bytes = std::fs::read(dir.join(rel)).unwrap();
    bytes[1234] ^= 0x40;
    std::fs::write(dir.join(rel), &bytes).unwrap();
    let e = check(&dir).unwrap_err();
    assert!(
        matches!(e, OtaError::HashMismatch { ref path, .. } if path == rel),
        "{e}"
    );
    assert!(e.to_string().contains(rel));

    // Truncated.
    let dir = Spec::new("a").build_signed(&tmp.join("trunc"), DEV_SECRET);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(rel))
        .unwrap();
    f.set_len(1000).unwrap();
    let e = check(&dir).unwrap_err();
    assert!(
        matches!(
            e,
            OtaError::SizeMismatch {
                expected: 3000,
                found: 1000,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("(truncated)"), "{e}");

    // An extra file, and an extra (empty) directory.
    let dir = Spec::new("a").build_signed(&tmp.join("extra"), DEV_SECRET);
    std::fs::write(dir.join("ctx/evil.so"), b"x").unwrap();
    let e = check(&dir).unwrap_err();
    assert!(
        matches!(e, OtaError::ExtraFile { ref path, .. } if path == "ctx/evil.so"),
        "{e}"
    );
    std::fs::remove_file(dir.join("ctx/evil.so")).unwrap();
    check(&dir).unwrap();
    std::fs::create_dir(dir.join("hooks")).unwrap();
    let e = check(&dir).unwrap_err();
    assert!(
        matches!(e, OtaError::ExtraFile { ref path, .. } if path == "hooks/"),
        "{e}"
    );

    // A missing file.
    let dir = Spec::new("a").build_signed(&tmp.join("missing"), DEV_SECRET);
    std::fs::remove_file(dir.join("golden/end_to_end.npz")).unwrap();
    let e = check(&dir).unwrap_err();
    assert!(
        matches!(e, OtaError::MissingFile { ref path, .. } if path == "golden/end_to_end.npz"),
        "{e}"
    );

    // A listed file replaced by a symbolic link (to an identical copy elsewhere).
    let dir = Spec::new("a").build_signed(&tmp.join("link"), DEV_SECRET);
    let outside = tmp.join("outside.bin");
    std::fs::copy(dir.join(rel), &outside).unwrap();
    std::fs::remove_file(dir.join(rel)).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join(rel)).unwrap();
    let e = check(&dir).unwrap_err();
    assert!(
        matches!(e, OtaError::Symlink { ref path, .. } if path == rel),
        "{e}"
    );
}

#[test]
fn wrong_target_and_runtime_are_refused() {
    let tmp = TempDir::new("verify-target");
    let mut spec = Spec::new("a");
    spec.soc_model = 69;
    let dir = spec.build_signed(&tmp.join("soc"), DEV_SECRET);
    let e = check(&dir).unwrap_err();
    assert!(
        matches!(
            e,
            OtaError::Target {
                field: "soc_model",
                expected: 77,
                found: 69,
                ..
            }
        ),
        "{e}"
    );
    assert!(e
        .to_string()
        .contains("built for soc_model 69, this device is soc_model 77"));

    let mut spec = Spec::new("a");
    spec.htp_arch = 75;
    let dir = spec.build_signed(&tmp.join("arch"), DEV_SECRET);
    let e = check(&dir).unwrap_err();
    assert!(
        matches!(
            e,
            OtaError::Target {
                field: "htp_arch",
                found: 75,
                ..
            }
        ),
        "{e}"
    );

    let mut spec = Spec::new("a");
    spec.min_runtime_version = "0.10.0".into();
    let dir = spec.build_signed(&tmp.join("runtime"), DEV_SECRET);
    let e = check(&dir).unwrap_err();
    assert!(matches!(e, OtaError::RuntimeTooOld { .. }), "{e}");
    assert!(e
        .to_string()
        .contains("needs runtime 0.10.0 or newer, this runtime is 0.1.0"));
    // Accepted by a newer runtime (numeric, not string, comparison).
    let newer = vla_ota::DeviceTarget {
        runtime_version: "0.10.0".into(),
        ..target()
    };
    verify(&dir, &trusted(), &newer).unwrap();
}

#[test]
fn signed_but_unsafe_manifests_are_refused() {
    let tmp = TempDir::new("verify-unsafe");
    let dir = Spec::new("a").build_signed(tmp.path(), DEV_SECRET);
    let path = dir.join(MANIFEST_FILE);
    let original = std::fs::read_to_string(&path).unwrap();

    for (bad, expect) in [
        ("../escape.bin", "`.` or `..`"),
        ("/etc/passwd", "is absolute"),
        ("ctx//x.bin", "empty segment"),
    ] {
        std::fs::write(
            &path,
            original.replace("\"golden/end_to_end.npz\"", &format!("\"{bad}\"")),
        )
        .unwrap();
        let key = key_file(tmp.path(), "k", DEV_SECRET);
        let e = vla_ota::sign(&dir, &key).unwrap_err();
        assert!(
            matches!(e, OtaError::UnsafePath { .. }),
            "sign must refuse {bad}: {e}"
        );
        resign(&dir);
        let e = check(&dir).unwrap_err();
        assert!(matches!(e, OtaError::UnsafePath { .. }), "{bad}: {e}");
        assert!(e.to_string().contains(expect), "{e}");
    }

    // The manifest and bundle.json disagree on the name.
    std::fs::write(&path, original.replace("synthetic-a", "synthetic-z")).unwrap();
    resign(&dir);
    let e = check(&dir).unwrap_err();
    assert!(
        matches!(e, OtaError::BundleJsonMismatch { field: "name", .. }),
        "{e}"
    );

    // Unknown manifest fields are refused, not ignored.
    std::fs::write(
        &path,
        original.replacen("\"format\": 1,", "\"format\": 1, \"hook\": 1,", 1),
    )
    .unwrap();
    resign(&dir);
    let e = check(&dir).unwrap_err();
    assert!(matches!(e, OtaError::ManifestSyntax { .. }), "{e}");
}

#[test]
fn pack_refuses_symlinks_and_bad_bundle_json() {
    let tmp = TempDir::new("pack");
    let dir = tmp.join("b");
    Spec::new("a").write(&dir);
    std::os::unix::fs::symlink("/etc/hostname", dir.join("ctx/link.bin")).unwrap();
    let e = vla_ota::pack(&dir).unwrap_err();
    assert!(matches!(e, OtaError::Symlink { .. }), "{e}");
    std::fs::remove_file(dir.join("ctx/link.bin")).unwrap();

    std::fs::write(dir.join("bundle.json"), b"{\"name\": \"x\"}").unwrap();
    let e = vla_ota::pack(&dir).unwrap_err();
    assert!(e.to_string().contains("`version` is missing"), "{e}");
}

#[test]
fn keys_keygen_and_permissions() {
    let tmp = TempDir::new("keys");
    let key = tmp.join("fleet.key");
    let public = vla_ota::keygen(&key).unwrap();
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Never overwrites an existing key.
    let e = vla_ota::keygen(&key).unwrap_err();
    assert!(e.to_string().contains("File exists"), "{e}");

    // A bundle signed with the new key verifies only when that key is trusted.
    let dir = tmp.join("b");
    Spec::new("a").write(&dir);
    vla_ota::pack(&dir).unwrap();
    assert_eq!(vla_ota::sign(&dir, &key).unwrap(), public);
    verify(&dir, &[public], &target()).unwrap();
    assert!(matches!(
        check(&dir).unwrap_err(),
        OtaError::BadSignature { .. }
    ));
    // Two trusted keys: either may sign.
    verify(&dir, &[trusted()[0], public], &target()).unwrap();

    // A key file others can read is refused.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = vla_ota::sign(&dir, &key).unwrap_err();
    assert!(matches!(e, OtaError::SecretKey { .. }), "{e}");
    assert!(e.to_string().contains("chmod 600"), "{e}");

    // The RFC 8032 vector: secret 9d61... has public d75a....
    let dev = key_file(tmp.path(), "dev.key", DEV_SECRET);
    assert_eq!(
        vla_ota::sign(&dir, &dev).unwrap(),
        PublicKey::from_hex(DEV_PUBLIC).unwrap()
    );
    assert!(PublicKey::from_hex("abc").is_err());
}

/// A file whose hash is deferred is checked by its reader, over the bytes it read: the
/// verification passes with the file changed (it did not hash it), the reader's check
/// refuses it; every other file is still hashed; a deferred name the manifest does not
/// list is refused.
#[test]
fn a_deferred_file_is_hashed_by_its_reader_and_the_rest_as_before() {
    use std::collections::BTreeSet;
    use std::io::Read;
    let tmp = TempDir::new("verify-deferred");
    let rel = "ctx/vision_socid77_archv73.bin";
    let dir = Spec::new("a").build_signed(tmp.path(), DEV_SECRET);
    let defer = BTreeSet::from([rel.to_owned()]);
    let read_back = |digests: &vla_ota::DeferredDigests| {
        let (mut file, mut check) = digests.open(rel).unwrap();
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).unwrap();
        check.update(&bytes);
        check.finish()
    };
    let (_, digests) = vla_ota::verify_deferring(&dir, &trusted(), 1, &target(), &defer).unwrap();
    assert_eq!(digests.files().collect::<Vec<_>>(), [rel]);
    read_back(&digests).unwrap();

    let mut bytes = std::fs::read(dir.join(rel)).unwrap();
    bytes[1234] ^= 0x40;
    std::fs::write(dir.join(rel), &bytes).unwrap();
    let (_, digests) = vla_ota::verify_deferring(&dir, &trusted(), 1, &target(), &defer).unwrap();
    let e = read_back(&digests).unwrap_err();
    assert!(
        matches!(e, OtaError::HashMismatch { ref path, .. } if path == rel),
        "{e}"
    );
    // Not deferred: refused by the verification itself, as before.
    let e = check(&dir).unwrap_err();
    assert!(matches!(e, OtaError::HashMismatch { .. }), "{e}");
    let other = BTreeSet::from(["ctx/action_step_socid77_archv73.bin".to_owned()]);
    assert!(matches!(
        vla_ota::verify_deferring(&dir, &trusted(), 1, &target(), &other),
        Err(OtaError::HashMismatch { .. })
    ));
    let unlisted = BTreeSet::from(["ctx/missing.bin".to_owned()]);
    let e = vla_ota::verify_deferring(&dir, &trusted(), 1, &target(), &unlisted).unwrap_err();
    assert!(matches!(e, OtaError::MissingFile { .. }), "{e}");
}
