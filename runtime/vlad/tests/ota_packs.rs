//! Fast-WAM instruction packs through the command line: `vlad bundle pack|sign|verify`
//! make and check a pack as they do a bundle, `vlad ota install` places it under
//! `<root>/packs/` beside the bundle it names (refusing one for another bundle in one
//! line), and `vlad ota status` lists it. No NPU: nothing is loaded here.

mod common;

use common::{hash_in, text, vlad, vlad_ok, write_config, OtaScratch};
use std::path::{Path, PathBuf};
use vla_test_support::{copy_dir, repo_root, InstructionPack};

/// An unsigned pack of one instruction for bundle `name` `version` (24 x 32 rows, the
/// tiny upstream Fast-WAM's).
fn write_pack(dir: &Path, name: &str, version: &str) {
    let rows: Vec<f32> = (0..24 * 32).map(|i| (i as f32 * 0.01).sin()).collect();
    InstructionPack {
        label: "extra",
        name,
        version,
        min_runtime_version: "0.1.0",
        shape: [24, 32],
        instructions: &[(1 << 30, "wipe the table")],
        rows: &rows,
    }
    .write(dir);
}

#[test]
fn a_signed_pack_installs_beside_the_current_bundle_and_is_listed() {
    let store = OtaScratch::new("vlad-ota-packs");
    let (tmp, root) = (&store.tmp, &store.root);
    let config = write_config(tmp, &store.config());
    let cfg = config.to_str().unwrap();
    let sign = |dir: &Path| {
        store.sign(dir);
        vlad_ok(&["bundle", "verify", dir.to_str().unwrap(), "--config", cfg]);
    };

    // The bundle, installed and current (no daemon runs: it would load it at start).
    let bundle = tmp.join("bundle");
    copy_dir(
        &repo_root().join("golden/bundles/fastwam-upstream"),
        &bundle,
    );
    sign(&bundle);
    let b = hash_in(&vlad_ok(&[
        "ota",
        "install",
        bundle.to_str().unwrap(),
        "--config",
        cfg,
    ]));
    vlad_ok(&["ota", "activate", &b, "--config", cfg]);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("bundle.json")).unwrap()).unwrap();
    let (name, version) = (
        manifest["name"].as_str().unwrap(),
        manifest["version"].as_str().unwrap(),
    );

    // A pack for it: packed, signed and verified as a bundle is, installed under packs/.
    let pack = tmp.join("pack");
    write_pack(&pack, name, version);
    sign(&pack);
    let out = vlad_ok(&["ota", "install", pack.to_str().unwrap(), "--config", cfg]);
    let p = hash_in(&out);
    assert!(out.contains("installed instruction pack"), "{out}");
    assert!(out.contains("goes with the current bundle"), "{out}");
    assert!(root.join("packs").join(&p).join("rows.npy").is_file());
    assert!(!root.join("bundles").join(&p).exists());
    let again = vlad_ok(&["ota", "install", pack.to_str().unwrap(), "--config", cfg]);
    assert!(again.contains("already installed"), "{again}");

    // Listed, as a pack of the current bundle; the bundle's roles are unchanged.
    let status = vlad_ok(&["ota", "status", "--config", cfg]);
    let line = status
        .lines()
        .skip_while(|l| !l.starts_with("instruction packs:"))
        .find(|l| l.contains(&p[..12]))
        .unwrap_or_else(|| panic!("pack not listed: {status}"));
    assert!(
        line.contains(name) && line.contains(version) && line.contains("current"),
        "{line}"
    );
    assert!(status.contains(&format!("current:  {b}")), "{status}");

    // A pack for another bundle is refused in one line; nothing is placed.
    let other = tmp.join("other");
    write_pack(&other, "another-bundle", "9.9.9");
    sign(&other);
    let o = vlad(&["ota", "install", other.to_str().unwrap(), "--config", cfg]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}{err}");
    let refusal: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("another-bundle"))
        .collect();
    assert_eq!(refusal.len(), 1, "{err}");
    assert!(
        refusal[0].contains("is for bundle another-bundle 9.9.9"),
        "{err}"
    );
    let packs: Vec<PathBuf> = std::fs::read_dir(root.join("packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(packs.len(), 1, "{packs:?}");
    let _ = std::fs::remove_dir_all(tmp);
}
