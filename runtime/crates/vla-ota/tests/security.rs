//! The store against the update-security attacks: rollback to an older signed release,
//! an expired (frozen) release, too few signers, published keys, and files that grow
//! while they are read.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use vla_ota::{OtaError, Placement, PublicKey, Store};

/// RFC 8032 section 7.1 test 3's secret key (a third distinct signer for threshold tests).
const THIRD_SECRET: &str = "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn public_of(secret_hex: &str) -> PublicKey {
    let bytes: [u8; 32] = (0..32)
        .map(|i| u8::from_str_radix(&secret_hex[2 * i..2 * i + 2], 16).unwrap())
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    PublicKey(
        ed25519_dalek::SigningKey::from_bytes(&bytes)
            .verifying_key()
            .to_bytes(),
    )
}

/// `spec` written under `parent/<name>-<version>`, packed to expire at `expires`, signed by
/// every key in `secrets` in turn.
fn build(parent: &Path, spec: &Spec, expires: u64, secrets: &[&str]) -> PathBuf {
    let dir = parent.join(format!("{}-{}", spec.name, spec.version));
    spec.write(&dir);
    vla_ota::pack_until(&dir, expires).unwrap();
    for (i, secret) in secrets.iter().enumerate() {
        let key = key_file(
            parent,
            &format!("{}-{}.key{i}", spec.name, spec.version),
            secret,
        );
        vla_ota::sign(&dir, &key).unwrap();
    }
    dir
}

fn versioned(tag: &str, version: &str) -> Spec {
    Spec {
        version: version.into(),
        ..Spec::new(tag)
    }
}

#[test]
fn committing_1_1_then_installing_a_signed_1_0_is_refused_and_changes_nothing() {
    let tmp = TempDir::new("sec-rollback");
    let root = tmp.join("root");
    let src = tmp.join("src");
    let store = store(&root);
    let later = now() + 3600;
    let old = build(&src, &versioned("a", "1.0.0"), later, &[DEV_SECRET]);
    let new = build(&src, &versioned("b", "1.1.0"), later, &[DEV_SECRET]);
    // 1.0.0 before the floor exists: installable (and installed, kept for the test below).
    let old_installed = store.install(&old).unwrap();
    let installed = store.install(&new).unwrap();
    store.activate(&installed.hash, &mut pass).unwrap();
    // On trial: the floor has not risen, a failed trial could not have raised it.
    assert_eq!(store.floor().unwrap().version, None);
    store.commit().unwrap();
    assert_eq!(store.floor().unwrap().version.as_deref(), Some("1.1.0"));

    // A second, different signed 1.0.0 (what a compromised server would push).
    let older = build(&src, &versioned("c", "1.0.0"), later, &[DEV_SECRET]);
    let before = snapshot(&root);
    for placement in [Placement::Copy, Placement::HardLink] {
        let e = store.install_with(&older, placement).unwrap_err();
        assert!(matches!(e, OtaError::Rollback { .. }), "{e}");
        assert!(e.to_string().contains("version floor 1.1.0"), "{e}");
    }
    assert!(matches!(
        store.verify_offered(&older).unwrap_err(),
        OtaError::Rollback { .. }
    ));
    // The 1.0.0 installed before the floor cannot be activated either.
    let e = store.activate(&old_installed.hash, &mut pass).unwrap_err();
    assert!(matches!(e, OtaError::Rollback { .. }), "{e}");
    assert_eq!(
        snapshot(&root),
        before,
        "a refused rollback changes nothing"
    );
    assert_eq!(
        current_hash(&root).as_deref(),
        Some(installed.hash.as_str())
    );

    // The floor is a file of its own: a lost state file (rebuilt from the links) keeps it.
    std::fs::remove_file(root.join("ota-state.json")).unwrap();
    let e = store.install(&older).unwrap_err();
    assert!(matches!(e, OtaError::Rollback { .. }), "{e}");
}

#[test]
fn the_operator_rollback_to_previous_is_the_one_way_back() {
    let tmp = TempDir::new("sec-rollback-op");
    let root = tmp.join("root");
    let src = tmp.join("src");
    let store = store(&root);
    let later = now() + 3600;
    for spec in [versioned("a", "1.0.0"), versioned("b", "1.1.0")] {
        let hash = store
            .install(&build(&src, &spec, later, &[DEV_SECRET]))
            .unwrap()
            .hash;
        store.activate(&hash, &mut pass).unwrap();
        store.commit().unwrap();
    }
    let rolled = store.rollback("operator", &mut pass).unwrap();
    assert!(rolled.to.is_some());
    // The floor does not follow the operator back down.
    assert_eq!(store.floor().unwrap().version.as_deref(), Some("1.1.0"));
    // And a start with 1.0.0 committed and current does not lower it either.
    store.on_start().unwrap();
    assert_eq!(store.floor().unwrap().version.as_deref(), Some("1.1.0"));
}

#[test]
fn an_expired_bundle_is_refused_at_install_and_activate() {
    let tmp = TempDir::new("sec-expiry");
    let root = tmp.join("root");
    let src = tmp.join("src");
    let store = store(&root);
    let expired = build(&src, &versioned("a", "1.0.0"), now() - 1, &[DEV_SECRET]);
    // RAUC's pre-install check (`vlad bundle verify --config`) refuses it already.
    let e = store.verify_offered(&expired).unwrap_err();
    assert!(matches!(e, OtaError::Expired { .. }), "{e}");
    let before = snapshot(&root);
    let e = store.install(&expired).unwrap_err();
    assert!(matches!(e, OtaError::Expired { .. }), "{e}");
    assert!(e.to_string().contains("signed expiry"), "{e}");
    assert_eq!(snapshot(&root), before);

    // Installed while fresh, then left until it expired: activation refuses it.
    let expires = now() + 3600;
    let fresh = build(&src, &versioned("b", "1.0.0"), expires, &[DEV_SECRET]);
    let hash = store.install(&fresh).unwrap().hash;
    let mut later = Store::new(settings(&root));
    later.set_clock(move || expires + 1);
    let e = later.activate(&hash, &mut pass).unwrap_err();
    assert!(matches!(e, OtaError::Expired { .. }), "{e}");
}

#[test]
fn a_clock_reset_to_1970_does_not_revive_an_expired_bundle() {
    let tmp = TempDir::new("sec-clock");
    let root = tmp.join("root");
    let src = tmp.join("src");
    let t = now();
    let a = build(&src, &versioned("a", "1.0.0"), t + 3600, &[DEV_SECRET]);
    let c = build(&src, &versioned("c", "1.2.0"), t + 86_400, &[DEV_SECRET]);
    // An install at t + 3650 (past a's expiry) records the time the device saw.
    let mut seen = Store::new(settings(&root));
    seen.set_clock(move || t + 3650);
    seen.install(&c).unwrap();
    // The board reboots without a real-time clock: the system clock reads 1970.
    let mut store = Store::new(settings(&root));
    store.set_clock(|| 0);
    assert_eq!(store.device_time().unwrap(), t + 3650);
    let e = store.install(&a).unwrap_err();
    assert!(
        matches!(e, OtaError::Expired { now, .. } if now == t + 3650),
        "{e}"
    );
}

#[test]
fn a_threshold_needs_that_many_distinct_trusted_signers() {
    let tmp = TempDir::new("sec-threshold");
    let src = tmp.join("src");
    let keys = vec![
        public_of(DEV_SECRET),
        public_of(OTHER_SECRET),
        public_of(THIRD_SECRET),
    ];
    let later = now() + 3600;
    let one = build(&src, &versioned("a", "1.0.0"), later, &[DEV_SECRET]);
    let twice = build(
        &src,
        &versioned("b", "1.0.0"),
        later,
        &[DEV_SECRET, DEV_SECRET],
    );
    let two = build(
        &src,
        &versioned("c", "1.0.0"),
        later,
        &[DEV_SECRET, THIRD_SECRET],
    );
    let check = |dir: &Path, threshold| vla_ota::verify_threshold(dir, &keys, threshold, &target());
    for dir in [&one, &twice] {
        let e = check(dir, 2).unwrap_err();
        assert!(
            matches!(
                e,
                OtaError::TooFewSignatures {
                    valid: 1,
                    threshold: 2,
                    ..
                }
            ),
            "{e}"
        );
    }
    // Signing again with the same key replaced its line instead of adding one.
    let lines = std::fs::read_to_string(twice.join("ota-manifest.json.sig")).unwrap();
    assert_eq!(lines.lines().count(), 1);
    let v = check(&two, 2).unwrap();
    assert_eq!(v.signers.len(), 2);
    assert!(check(&two, 3).is_err());
    // A signer outside the trusted set does not count.
    let e = vla_ota::verify_threshold(&two, &keys[..1], 2, &target()).unwrap_err();
    assert!(
        matches!(e, OtaError::TooFewSignatures { valid: 1, .. }),
        "{e}"
    );

    // The store applies its configured threshold.
    let root = tmp.join("root");
    let store = Store::new(vla_ota::OtaSettings {
        trusted_keys: keys.clone(),
        signature_threshold: 2,
        ..settings(&root)
    });
    assert!(matches!(
        store.install(&one).unwrap_err(),
        OtaError::TooFewSignatures { .. }
    ));
    store.install(&two).unwrap();
}

#[test]
fn rfc_8032_test_keys_are_known_as_published() {
    for secret in [
        DEV_SECRET,
        OTHER_SECRET,
        THIRD_SECRET,
        "f5e5767cf153319517630f226876b86c8160cc583bc013744c6bf255f5cc0ee5",
        "833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
    ] {
        let key = public_of(secret);
        let source = key.published();
        assert!(
            source.is_some_and(|s| s.contains("RFC 8032")),
            "{} should be listed as published",
            key.to_hex()
        );
    }
    let mut fresh = [7u8; 32];
    fresh[0] = 1;
    let fresh = PublicKey(
        ed25519_dalek::SigningKey::from_bytes(&fresh)
            .verifying_key()
            .to_bytes(),
    );
    assert_eq!(fresh.published(), None);
}

#[test]
fn a_file_that_grows_after_listing_is_read_only_to_its_declared_size() {
    let tmp = TempDir::new("sec-grow");
    let src = tmp.join("src");
    let dir = build(&src, &versioned("a", "1.0.0"), now() + 3600, &[DEV_SECRET]);
    // Grown after packing by far more than its declared size: refused without reading it
    // all (the size check names it; the hash read stops one byte past the declared size).
    let blob = dir.join("golden/end_to_end.npz");
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(&blob)
        .unwrap();
    f.set_len(1 << 40).unwrap(); // a sparse terabyte
    let e = vla_ota::verify(&dir, &trusted(), &target()).unwrap_err();
    assert!(matches!(e, OtaError::SizeMismatch { .. }), "{e}");
    let store = store(&tmp.join("root"));
    assert!(store.install(&dir).is_err());
}

/// A secret key whose secret is not published (a key list refuses published keys).
fn fresh(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

/// Writes `keys.json` into `dir` and signs it with each of `root_secrets`.
fn key_list(
    dir: &Path,
    version: u64,
    keys: &[&str],
    threshold: usize,
    revoked: &[&str],
    root_secrets: &[&str],
) {
    let hexes = |secrets: &[&str]| -> Vec<String> {
        secrets.iter().map(|s| public_of(s).to_hex()).collect()
    };
    let list = serde_json::json!({
        "format": 1, "version": version, "keys": hexes(keys), "threshold": threshold, "revoked": hexes(revoked),
    });
    std::fs::write(
        dir.join("keys.json"),
        serde_json::to_vec_pretty(&list).unwrap(),
    )
    .unwrap();
    let _ = std::fs::remove_file(dir.join("keys.json.sig"));
    for (i, secret) in root_secrets.iter().enumerate() {
        let key = key_file(
            dir.parent().unwrap(),
            &format!("root-{version}-{i}.key"),
            secret,
        );
        vla_ota::sign_key_list(dir, &key).unwrap();
    }
}

#[test]
fn a_root_signed_key_list_rotates_and_revokes_signing_keys_over_the_air() {
    let tmp = TempDir::new("sec-keylist");
    let root = tmp.join("root");
    let src = tmp.join("src");
    // The device trusts DEV by configuration and the root key for key lists.
    let (root_secret, new_secret, other_secret) = (fresh(0x51), fresh(0x52), fresh(0x53));
    let (root_key, new_key, other_key) = (&*root_secret, &*new_secret, &*other_secret);
    let store = Store::new(vla_ota::OtaSettings {
        root_keys: vec![public_of(root_key)],
        ..settings(&root)
    });
    let later = now() + 3600;
    // 1.1.0 is signed by the NEW key, and carries key list v1: keys [NEW], DEV revoked.
    let rotated = build(&src, &versioned("b", "1.1.0"), later, &[new_key]);
    assert!(matches!(
        store.install(&rotated).unwrap_err(),
        OtaError::BadSignature { .. }
    ));
    key_list(&rotated, 1, &[new_key], 1, &[DEV_SECRET], &[root_key]);
    store.verify_offered(&rotated).unwrap();
    store.install(&rotated).unwrap();
    assert_eq!(store.key_list().unwrap().unwrap().version, 1);
    assert!(root.join("key-list.json").is_file());

    // DEV is revoked: refused although the configuration still lists it.
    let by_dev = build(&src, &versioned("c", "1.2.0"), later, &[DEV_SECRET]);
    let e = store.install(&by_dev).unwrap_err();
    assert!(matches!(e, OtaError::BadSignature { .. }), "{e}");

    // A key list signed by anyone but the root key is refused with its bundle.
    let forged = build(&src, &versioned("d", "1.2.0"), later, &[DEV_SECRET]);
    key_list(&forged, 2, &[DEV_SECRET], 1, &[], &[other_key]);
    let e = store.install(&forged).unwrap_err();
    assert!(matches!(e, OtaError::KeyList { .. }), "{e}");
    assert!(e.to_string().contains("root key"), "{e}");

    // An older (root-signed) list does not bring DEV back: key lists never go back.
    let replayed = build(&src, &versioned("e", "1.2.0"), later, &[DEV_SECRET]);
    key_list(&replayed, 0, &[DEV_SECRET], 1, &[], &[root_key]);
    assert!(store.install(&replayed).is_err());
    assert_eq!(store.key_list().unwrap().unwrap().version, 1);

    // A published key in a key list is refused too.
    let published = build(&src, &versioned("f", "1.2.0"), later, &[new_key]);
    key_list(&published, 3, &[OTHER_SECRET], 1, &[], &[root_key]);
    assert!(matches!(
        store.install(&published).unwrap_err(),
        OtaError::PublishedKey { .. }
    ));
}
