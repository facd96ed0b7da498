//! Instruction packs in the store: verified exactly as bundles (signature, floor, every
//! file), installed under `packs/` beside the bundle they name, listed by `status`, taken
//! by `packs_for` only for that bundle, and never activated.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use vla_ota::{OtaError, Store};

/// Writes, packs and signs a pack for bundle `name` `version`; returns its directory.
fn build_pack(parent: &Path, label: &str, name: &str, version: &str, secret: &str) -> PathBuf {
    let dir = parent.join(label);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(vla_ota::PACK_FILE),
        format!(
            r#"{{
  "format": 1,
  "kind": "instruction-pack",
  "label": "{label}",
  "name": "{name}",
  "version": "{version}",
  "policy": "molmoact2",
  "soc_model": 77,
  "htp_arch": 73,
  "min_runtime_version": "0.1.0",
  "rows": "rows.npy",
  "instructions": []
}}
"#
        ),
    )
    .unwrap();
    std::fs::write(dir.join("rows.npy"), format!("rows of {label}")).unwrap();
    vla_ota::pack_until(&dir, 4_102_444_800).unwrap();
    let key = key_file(parent, &format!("{label}.key"), secret);
    vla_ota::sign(&dir, &key).unwrap();
    dir
}

/// A store with bundle `synthetic-a` 0.1.0 committed; returns it and its manifest.
fn with_a(root: &Path, sources: &Path) -> (Store, vla_ota::OtaManifest) {
    let store = store(root);
    let a = Spec::new("a").build_signed(sources, DEV_SECRET);
    let installed = store.install(&a).unwrap();
    store.activate(&installed.hash, &mut pass).unwrap();
    store.commit().unwrap();
    let manifest = store.verify(&installed.dir).unwrap().manifest;
    (store, manifest)
}

#[test]
fn a_pack_installs_beside_its_bundle_is_listed_and_found_only_for_it() {
    let tmp = TempDir::new("packs-install");
    let root = tmp.join("root");
    let (store, a) = with_a(&root, &tmp.join("src"));
    let state_before = store.status().unwrap().state;

    let pack = build_pack(
        &tmp.join("src"),
        "extra",
        "synthetic-a",
        "0.1.0",
        DEV_SECRET,
    );
    let installed = store.install(&pack).unwrap();
    assert!(!installed.already_installed);
    assert_eq!(installed.dir, store.packs_dir().join(&installed.hash));
    assert!(!store.bundle_dir(&installed.hash).exists());
    assert!(store.install(&pack).unwrap().already_installed);

    // Listed as a pack of synthetic-a; the bundles and their roles are as they were.
    let status = store.status().unwrap();
    assert_eq!(status.packs.len(), 1);
    assert_eq!(status.packs[0].hash, installed.hash);
    assert_eq!(
        (
            status.packs[0].name.as_str(),
            status.packs[0].version.as_str()
        ),
        ("synthetic-a", "0.1.0")
    );
    assert_eq!(status.bundles.len(), 1);
    assert_eq!(status.state, state_before);

    // Taken for its bundle (verified again), not for another; never activated.
    let scan = store.packs_for(a.names()).unwrap();
    assert_eq!(scan.packs.len(), 1);
    assert!(scan.refused.is_empty());
    assert_eq!(scan.packs[0].content_hash, installed.hash);
    assert!(store
        .packs_for(("synthetic-a", "0.2.0", "molmoact2"))
        .unwrap()
        .packs
        .is_empty());
    assert!(matches!(
        store.activate(&installed.hash, &mut pass),
        Err(OtaError::NotInstalled { .. })
    ));

    // A pack changed after install is refused when the daemon takes the packs, naming it.
    let rows = installed.dir.join("rows.npy");
    let mut perms = std::fs::metadata(&rows).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&rows, perms).unwrap();
    std::fs::write(&rows, "rows of extrb").unwrap();
    let scan = store.packs_for(a.names()).unwrap();
    assert!(scan.packs.is_empty());
    let msg = scan.refused[0].to_string();
    assert!(msg.contains("rows.npy") && !msg.contains('\n'), "{msg}");
}

#[test]
fn a_pack_is_refused_for_a_bad_signature_another_bundle_or_below_the_floor() {
    let tmp = TempDir::new("packs-refused");
    let root = tmp.join("root");
    let src = tmp.join("src");
    let (store, a) = with_a(&root, &src);
    let untouched = snapshot(&root);

    // Signed by a key the device does not trust.
    let pack = build_pack(&src, "untrusted", "synthetic-a", "0.1.0", OTHER_SECRET);
    let e = store.install(&pack).unwrap_err();
    assert!(matches!(e, OtaError::BadSignature { .. }), "{e}");
    assert_eq!(snapshot(&root), untouched);

    // For another bundle: refused at install (no such bundle installed) and by
    // verify_pack_for, in one line naming both.
    let pack = build_pack(&src, "for-b", "synthetic-b", "0.1.0", DEV_SECRET);
    let e = store.install(&pack).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, OtaError::PackForOtherBundle { .. }), "{msg}");
    assert!(
        msg.contains("synthetic-b 0.1.0")
            && msg.contains("synthetic-a 0.1.0")
            && !msg.contains('\n'),
        "{msg}"
    );
    let e = store.verify_pack_for(&pack, a.names()).unwrap_err();
    assert!(matches!(e, OtaError::PackForOtherBundle { .. }), "{e}");
    assert_eq!(snapshot(&root), untouched);
    // A bundle is not a pack.
    let e = store
        .verify_pack_for(&src.join("synthetic-a"), a.names())
        .unwrap_err();
    assert!(matches!(e, OtaError::WrongKind { .. }), "{e}");

    // Below the floor: synthetic-a 0.2.0 committed, its 0.1.0 kept as previous; a pack for
    // 0.1.0 is refused as a bundle of 0.1.0 would be.
    let mut newer = Spec::new("a");
    newer.version = "0.2.0".into();
    newer.files[3].1 = b"prompt a 0.2.0".to_vec();
    let dir = src.join("a-0.2.0");
    std::fs::create_dir_all(&dir).unwrap();
    let built = newer.build_signed(&dir, DEV_SECRET);
    let installed = store.install(&built).unwrap();
    store.activate(&installed.hash, &mut pass).unwrap();
    store.commit().unwrap();
    assert_eq!(store.floor().unwrap().version.as_deref(), Some("0.2.0"));
    let pack = build_pack(&src, "old", "synthetic-a", "0.1.0", DEV_SECRET);
    let e = store.install(&pack).unwrap_err();
    assert!(matches!(e, OtaError::Rollback { .. }), "{e}");
    assert!(store.installed_packs().unwrap().is_empty());
    // One for 0.2.0 installs.
    let pack = build_pack(&src, "new", "synthetic-a", "0.2.0", DEV_SECRET);
    store.install(&pack).unwrap();
    assert_eq!(store.installed_packs().unwrap().len(), 1);
}

#[test]
fn a_directory_with_both_identity_files_is_neither() {
    let tmp = TempDir::new("packs-both");
    let dir = tmp.join("both");
    Spec::new("a").write(&dir);
    std::fs::write(dir.join(vla_ota::PACK_FILE), "{}").unwrap();
    let e = vla_ota::pack(&dir).unwrap_err();
    assert!(e.to_string().contains("not both"), "{e}");
}

#[test]
fn gc_removes_the_packs_of_bundles_it_removes_and_keeps_the_others() {
    let tmp = TempDir::new("packs-gc");
    let root = tmp.join("root");
    let src = tmp.join("src");
    let (store, _) = with_a(&root, &src);
    let b = Spec::new("b").build_signed(&src, DEV_SECRET);
    let b_hash = store.install(&b).unwrap().hash;
    let for_a = store
        .install(&build_pack(&src, "pa", "synthetic-a", "0.1.0", DEV_SECRET))
        .unwrap()
        .hash;
    let for_b = store
        .install(&build_pack(&src, "pb", "synthetic-b", "0.1.0", DEV_SECRET))
        .unwrap()
        .hash;
    let report = store.gc().unwrap();
    assert!(report.removed.contains(&b_hash), "{report:?}");
    assert!(report.removed.contains(&for_b), "{report:?}");
    assert_eq!(store.installed_packs().unwrap(), vec![for_a]);
}
