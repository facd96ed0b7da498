//! `vlad run` on the tiny upstream Fast-WAM bundle under OTA, with instruction packs
//! installed beside it, on the real QNN emulator: the daemon attaches the packs at start,
//! the robot selects a pack instruction by its text (written by the C firmware stand-in
//! over the instruction segment), a text in no pack is refused in one log line and an id
//! no pack holds is not run while the daemon holds, and a pack installed while the daemon
//! runs (`vlad ota install` sends SIGUSR2) is attached without a reload (the bundle is
//! gated and its contexts created once) and drives by its id and its text, while a pack
//! the bundle refuses is one warning line and attaches nothing.

mod common;

use common::text::{
    build_c_peer, ok, text_daemon_config, write_text, Actions, Firmware, RingPaths,
};
use common::{hash_in, qnn_dir, running, vlad_ok, write_config, Drained, OtaScratch, HANG_GUARD};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use vla_npz::Npz;
use vla_ring::{text_instruction_id, ActionStatus, Geometry, PACK_ID_FLAG};
use vla_test_support::{copy_dir, repo_root, InstructionPack};

const BUNDLE: &str = "golden/bundles/fastwam-upstream";

/// Writes, packs and signs a pack of `items` (id, text, fixed instruction whose rows it
/// reuses) for the bundle in `bundle`.
fn signed_pack(dir: &Path, bundle: &Path, label: &str, key: &Path, items: &[(u32, &str, usize)]) {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("bundle.json")).unwrap()).unwrap();
    let chain = &manifest["fastwam"]["chain"];
    let (m, e) = (
        chain["text_tokens"].as_u64().unwrap() as usize,
        chain["context_width"].as_u64().unwrap() as usize,
    );
    let tables = Npz::open(bundle.join(chain["tables"].as_str().unwrap())).unwrap();
    let fixed = tables.array("text_rows").unwrap().to_f32().unwrap();
    let rows: Vec<f32> = items
        .iter()
        .flat_map(|i| fixed[i.2 * m * e..(i.2 + 1) * m * e].iter().copied())
        .collect();
    let instructions: Vec<(u32, &str)> = items.iter().map(|i| (i.0, i.1)).collect();
    let field = |k: &str| manifest[k].as_str().unwrap();
    InstructionPack {
        label,
        name: field("name"),
        version: field("version"),
        min_runtime_version: field("min_runtime_version"),
        shape: [m, e],
        instructions: &instructions,
        rows: &rows,
    }
    .write(dir);
    let d = dir.to_str().unwrap();
    vlad_ok(&["bundle", "pack", d]);
    vlad_ok(&["bundle", "sign", d, "--key", key.to_str().unwrap()]);
}

#[test]
fn pack_instructions_by_text_and_id_drive_and_unknown_ones_hold() {
    let Some(lib) = qnn_dir() else { return };
    let store = OtaScratch::new("vlad-packs");
    let Some(peer) = build_c_peer(&store.tmp) else {
        return;
    };
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo_root().join(BUNDLE).join("bundle.json")).unwrap(),
    )
    .unwrap();
    let (f, c) = (&v["fastwam"], &v["fastwam"]["chain"]);
    let n = |x: &serde_json::Value| x.as_u64().unwrap() as u32;
    let g = Geometry {
        cameras: n(&c["cameras"]),
        height: n(&c["frame_height"]),
        width: n(&c["frame_width"]),
        channels: 3,
        state_dims: n(&c["state_dims"]),
        action_dims: n(&f["action_dims"]),
        chunk_len: n(&f["action_horizon"]),
    };

    // The store: the bundle installed and current, a pack of two instructions beside it.
    let rings = RingPaths::new("vlad-packs");
    let txt_path = &rings.txt;
    let mut cfg = store.config();
    cfg["ota"]["trial_inferences"] = 1.into();
    text_daemon_config(&mut cfg, lib, &rings);
    let config = write_config(&store.tmp, &cfg);
    let config = config.to_str().unwrap();
    let OtaScratch { tmp: dir, key, .. } = store;
    let bundle = dir.join("bundle");
    copy_dir(&repo_root().join(BUNDLE), &bundle);
    let b = bundle.to_str().unwrap();
    vlad_ok(&["bundle", "pack", b]);
    vlad_ok(&["bundle", "sign", b, "--key", key.to_str().unwrap()]);
    let hash = hash_in(&vlad_ok(&["ota", "install", b, "--config", config]));
    vlad_ok(&["ota", "activate", &hash, "--config", config]);
    let pack = dir.join("pack-extra");
    signed_pack(
        &pack,
        &bundle,
        "extra",
        &key,
        &[
            (PACK_ID_FLAG | 5, "open the drawer on top", 1),
            (PACK_ID_FLAG | 6, "put the bowl down", 0),
        ],
    );
    vlad_ok(&["ota", "install", pack.to_str().unwrap(), "--config", config]);

    // The firmware: observations at 20 Hz naming `instruction`.
    // The firmware names a pack instruction by its text (normalized as upstream's cleaning)
    // from the start; by id below, after the reload.
    write_text(&peer, txt_path, &g, 1, b"  open the drawer\ton top ");
    let firmware = Firmware::start(&rings.obs, g, text_instruction_id(1).unwrap(), 0.01);
    // The seq of the first observation naming `id`.
    let switch = |id: u32| firmware.switch(id).0;

    let mut c = Command::new(env!("CARGO_BIN_EXE_vlad"));
    c.args(["run", "--config", config]);
    let daemon = Drained::spawn(&mut c);
    let pid = daemon.id();
    let mut actions = Actions::open(&rings.act, g, pid);
    let end = Instant::now() + HANG_GUARD;
    actions.until(
        "ok steps of a pack instruction named by its text",
        pid,
        0,
        |a| a.iter().any(ok),
    );
    let drives = |actions: &mut Actions, what: &str, id: u32| {
        let at = switch(id);
        let from = actions.all.len();
        actions.until(what, pid, from, |a| {
            a.iter().any(|x| ok(x) && x.source_obs_seq >= at)
        });
    };
    let holds = |actions: &mut Actions, what: &str, id: u32| {
        let at = switch(id);
        let from = actions.all.len();
        let observations = firmware.newest_seq.load(Ordering::Acquire);
        actions.until(what, pid, from, |a| {
            a.iter().filter(|x| x.status == ActionStatus::Hold).count() > 20
        });
        while firmware.newest_seq.load(Ordering::Acquire) < observations + 20 {
            std::thread::sleep(Duration::from_millis(10));
        }
        actions.poll();
        assert!(
            !actions.all[from..]
                .iter()
                .any(|x| ok(x) && x.source_obs_seq >= at),
            "{what}: nothing may be computed for it"
        );
    };

    // A text in no pack, and an id no pack holds: the daemon holds.
    write_text(&peer, txt_path, &g, 2, b"fly to the moon");
    holds(
        &mut actions,
        "a text in no pack",
        text_instruction_id(2).unwrap(),
    );
    holds(&mut actions, "an id no pack holds", PACK_ID_FLAG | 7);

    // Packs installed while the daemon runs: the CLI sends SIGUSR2 and the daemon attaches
    // them without a reload. One reusing an attached id is refused in one line.
    let clash = dir.join("pack-clash");
    signed_pack(
        &clash,
        &bundle,
        "clash",
        &key,
        &[(PACK_ID_FLAG | 5, "pull the drawer", 0)],
    );
    let out = vlad_ok(&[
        "ota",
        "install",
        clash.to_str().unwrap(),
        "--config",
        config,
    ]);
    assert!(out.contains("sent SIGUSR2"), "{out}");
    while !daemon.stderr_so_far().contains("already taken") {
        assert!(
            running(pid) && Instant::now() < end,
            "no refusal of the clashing pack"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A text the robot sends before its pack is installed: refused (the robot still names
    // the pack id meanwhile); looked up again once the pack is attached.
    write_text(&peer, txt_path, &g, 3, b"close the drawer");
    while !daemon.stderr_so_far().contains("instruction text 3:") {
        assert!(running(pid) && Instant::now() < end, "text 3 never refused");
        std::thread::sleep(Duration::from_millis(20));
    }
    let more = dir.join("pack-more");
    signed_pack(
        &more,
        &bundle,
        "more",
        &key,
        &[(PACK_ID_FLAG | 7, "close the drawer", 1)],
    );
    let installing = Instant::now();
    let out = vlad_ok(&["ota", "install", more.to_str().unwrap(), "--config", config]);
    assert!(
        out.contains("sent SIGUSR2") && out.contains("without a reload"),
        "{out}"
    );
    drives(
        &mut actions,
        "the hot-attached pack's id (the observations named it before: they held)",
        PACK_ID_FLAG | 7,
    );
    // A figure, not a bound: install (verify, stage, signal) to the first ok step of the
    // new id, one inference included.
    eprintln!(
        "pack installed while running: first ok step of its id {:.2} s after `vlad ota install` began",
        installing.elapsed().as_secs_f64()
    );
    drives(
        &mut actions,
        "the hot-attached pack's text, sent before the install (not sent again)",
        text_instruction_id(3).unwrap(),
    );

    let (_, out, err) = daemon.terminate();
    firmware.stop();
    let attached: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("instruction pack "))
        .collect();
    assert!(
        attached
            .iter()
            .any(|l| l.contains("(extra): 2 instructions")),
        "{err}"
    );
    assert!(
        attached.iter().any(|l| l.contains("(more): 1 instructions")
            && l.contains("attached while running (no reload)")),
        "{err}"
    );
    // No reload: one load, one DSP plan (contexts created once), one gate.
    assert!(!err.contains("reloading"), "{err}");
    for once in ["DSP memory plan", ") gated: end-to-end cosine"] {
        assert_eq!(err.matches(once).count(), 1, "{once}: {err}");
    }
    // The clashing pack: one warning line, nothing of it attached (its id 5 still the
    // first pack's, its text unknown).
    let clashed: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("already taken"))
        .collect();
    assert_eq!(clashed.len(), 1, "{err}");
    assert!(
        clashed[0].contains("already taken") && clashed[0].contains("not attached"),
        "{}",
        clashed[0]
    );
    // One line for the refused text.
    let refused: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("instruction text 2:"))
        .collect();
    assert_eq!(refused.len(), 1, "{err}");
    assert!(refused[0].contains("instruction pack"), "{}", refused[0]);
    assert!(out.contains("control loop report"), "{out}");
    rings.remove();
    let _ = std::fs::remove_dir_all(&dir);
}
