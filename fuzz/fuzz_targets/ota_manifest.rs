//! OTA bundles (`vla_ota`): `ota-manifest.json` parsing (`OtaManifest::parse`) and the
//! verification a device runs before installing (`vla_ota::verify`: detached Ed25519
//! signature, manifest rules, file set, sizes, hashes, `bundle.json` cross-check). Any
//! bytes end in a one-line error or in a manifest that round-trips through its
//! canonical form; a signature file without the real signature never verifies.
//!
//! The first input byte picks what the rest is: even, the manifest of a bundle that is
//! then signed with the target's own key (so the fuzzer gets past the signature check);
//! odd, the signature file of a correctly packed and signed bundle.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use vla_ota::{
    pack, sign, verify, DeviceTarget, OtaError, OtaManifest, PublicKey, MANIFEST_FILE,
    SIGNATURE_FILE,
};

struct Fixture {
    key_file: PathBuf,
    public: PublicKey,
    /// A packed, signed bundle whose signature inputs replace.
    signed: PathBuf,
    /// The real signature text of `signed`.
    signature: Vec<u8>,
    /// A bundle directory whose manifest inputs replace.
    scratch: PathBuf,
    target: DeviceTarget,
}

const BUNDLE_JSON: &str = r#"{"format": 1, "name": "fuzz", "version": "0.1.0",
"policy": "fastwam", "soc_model": 77, "htp_arch": 73, "min_runtime_version": "0.1.0"}"#;

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let root = base.join(format!("vla-fuzz-ota-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (signed, scratch) = (root.join("signed"), root.join("scratch"));
        for dir in [&signed, &scratch] {
            std::fs::create_dir_all(dir.join("ctx")).unwrap();
            std::fs::write(dir.join("bundle.json"), BUNDLE_JSON).unwrap();
            std::fs::write(dir.join("ctx/a.bin"), b"context").unwrap();
        }
        // A fixed key: reproducible crashes need a reproducible signature.
        let key_file = root.join("fuzz.key");
        std::fs::write(&key_file, format!("{}\n", "5a".repeat(32))).unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let manifest = pack(&signed).unwrap();
        std::fs::write(signed.join(MANIFEST_FILE), manifest.to_bytes()).unwrap();
        let public = sign(&signed, &key_file).unwrap();
        let signature = std::fs::read(signed.join(SIGNATURE_FILE)).unwrap();
        let target = DeviceTarget {
            soc_model: 77,
            htp_arch: 73,
            runtime_version: "0.1.0".into(),
        };
        verify(&signed, &[public], &target).expect("the fixture bundle verifies");
        Fixture {
            key_file,
            public,
            signed,
            signature,
            scratch,
            target,
        }
    })
}

fn assert_one_line(error: &OtaError) {
    let message = error.to_string();
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "multi-line error: {message:?}"
    );
}

fn manifest_input(fx: &Fixture, bytes: &[u8]) {
    let path = fx.scratch.join(MANIFEST_FILE);
    match OtaManifest::parse(&path, bytes) {
        Ok(manifest) => {
            let _ = manifest.payload_bytes();
            let canonical = manifest.to_bytes();
            let again = OtaManifest::parse(&path, &canonical).expect("canonical form parses");
            assert_eq!(
                again, manifest,
                "manifest changed in a canonical round trip"
            );
        }
        Err(e) => return assert_one_line(&e),
    }
    std::fs::write(&path, bytes).unwrap();
    let _ = std::fs::remove_file(fx.scratch.join(SIGNATURE_FILE));
    if let Err(e) = sign(&fx.scratch, &fx.key_file) {
        return assert_one_line(&e);
    }
    match verify(&fx.scratch, &[fx.public], &fx.target) {
        Ok(verified) => assert_eq!(verified.manifest_bytes, bytes),
        Err(e) => assert_one_line(&e),
    }
}

fn signature_input(fx: &Fixture, text: &[u8]) {
    std::fs::write(fx.signed.join(SIGNATURE_FILE), text).unwrap();
    let result = verify(&fx.signed, &[fx.public], &fx.target);
    // One signature per line (k of n): the text verifies exactly when every non-blank
    // line is a well-formed signature, there are at most MAX_SIGNATURES, and one of them
    // is the genuine one.
    let real = std::str::from_utf8(&fx.signature).unwrap().trim();
    let genuine = std::str::from_utf8(text).is_ok_and(|t| {
        let lines: Vec<&str> = t.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        lines.len() <= vla_ota::MAX_SIGNATURES
            && lines.iter().all(|l| vla_ota::hex::decode::<64>(l).is_ok())
            && lines.contains(&real)
    });
    match result {
        Ok(_) => assert!(genuine, "a forged signature verified: {text:?}"),
        Err(e) => {
            assert!(!genuine, "the genuine signature was refused: {e}");
            assert_one_line(&e);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let fx = fixture();
    if selector % 2 == 0 {
        manifest_input(fx, rest);
    } else {
        signature_input(fx, rest);
    }
});
