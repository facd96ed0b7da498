//! `vlad run` on the tiny upstream Fast-WAM bundle under OTA, with instruction packs
//! installed beside it, on the real QNN emulator: the daemon attaches the packs at start,
//! the robot selects a pack instruction by its text (written by the C firmware stand-in
//! over the instruction segment), a text in no pack is refused in one log line and an id
//! no pack holds is not run while the daemon holds, and a pack installed while the daemon
//! runs (`vlad ota install` signals a reload) is attached and drives by its id.

mod common;

use common::text::{build_c_peer, ok, write_text, Actions};
use common::{qnn_dir, running, Drained, HANG_GUARD};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vla_npz::{Array, Npz};
use vla_ring::{
    monotonic_ns, text_instruction_id, Action, ActionStatus, Geometry, Observation, RingReader,
    RingWriter, PACK_ID_FLAG,
};
use vla_test_support::{copy_dir, repo_root};

const BUNDLE: &str = "golden/bundles/fastwam-upstream";

fn vlad_ok(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_vlad"))
        .args(args)
        .output()
        .unwrap();
    let (out, err) = common::text(&o);
    assert!(o.status.success(), "vlad {args:?} failed: {out}{err}");
    out + &err
}

fn hash_in(out: &str) -> String {
    out.split(|c: char| !c.is_ascii_hexdigit())
        .find(|w| w.len() == 64)
        .unwrap_or_else(|| panic!("no hash in: {out}"))
        .to_owned()
}

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
    std::fs::create_dir_all(dir).unwrap();
    let array = Array::from_f32("rows", &[items.len(), m, e], &rows).unwrap();
    std::fs::write(dir.join("rows.npy"), vla_npz::write_npy(&array)).unwrap();
    let instructions: Vec<serde_json::Value> = items
        .iter()
        .map(|(id, text, _)| serde_json::json!({"id": id, "text": text, "normalized": text}))
        .collect();
    let pack = serde_json::json!({
        "format": 1, "kind": "instruction-pack", "label": label,
        "name": manifest["name"], "version": manifest["version"], "policy": "fastwam",
        "soc_model": 77, "htp_arch": 73, "min_runtime_version": manifest["min_runtime_version"],
        "rows": "rows.npy", "text_tokens": m, "context_width": e, "instructions": instructions,
    });
    std::fs::write(
        dir.join("pack.json"),
        serde_json::to_vec_pretty(&pack).unwrap(),
    )
    .unwrap();
    let d = dir.to_str().unwrap();
    vlad_ok(&["bundle", "pack", d]);
    vlad_ok(&["bundle", "sign", d, "--key", key.to_str().unwrap()]);
}

#[test]
fn pack_instructions_by_text_and_id_drive_and_unknown_ones_hold() {
    let Some(lib) = qnn_dir() else { return };
    let dir = std::env::temp_dir().join(format!("vlad-packs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let Some(peer) = build_c_peer(&dir) else {
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
    let root = dir.join("ota");
    let key = dir.join("fleet.key");
    let public = hash_in(&vlad_ok(&["bundle", "keygen", key.to_str().unwrap()]));
    let shm =
        |what: &str| PathBuf::from(format!("/dev/shm/vlad-packs-{}-{what}", std::process::id()));
    let (obs_path, act_path, txt_path) = (shm("obs"), shm("act"), shm("txt"));
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo_root().join("config/dev.json")).unwrap())
            .unwrap();
    cfg["qnn"]["lib_dir"] = lib.into();
    cfg["bundle"]["path"] = root.join("current").to_str().unwrap().into();
    cfg["ota"]["root"] = root.to_str().unwrap().into();
    cfg["ota"]["trusted_keys"] = serde_json::json!([public]);
    cfg["ota"]["trial_inferences"] = 1.into();
    cfg["rings"]["observation_path"] = obs_path.to_str().unwrap().into();
    cfg["rings"]["action_path"] = act_path.to_str().unwrap().into();
    cfg["rings"]["instruction_path"] = txt_path.to_str().unwrap().into();
    cfg["rings"]["action_slots"] = 1024.into();
    cfg["control"] = serde_json::json!({
        "publish_hz": 20.0, "max_observation_age_ms": 60000, "max_chunk_age_ms": 60000,
        "hold_after_chunk_end_ms": 0, "action_valid_ms": 60000,
        "writer_heartbeat_timeout_ms": 60000, "merge": "skip",
        "trigger": "synchronous", "execute_steps": 3
    });
    cfg["log"]["level"] = "info".into();
    let config = dir.join("vlad.json");
    std::fs::write(&config, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    let config = config.to_str().unwrap();
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
    write_text(&peer, &txt_path, &g, 1, b"  open the drawer\ton top ");
    let instruction = Arc::new(AtomicU32::new(text_instruction_id(1).unwrap()));
    let newest_seq = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (instruction, newest_seq, stop, obs_path) = (
            instruction.clone(),
            newest_seq.clone(),
            stop.clone(),
            obs_path.clone(),
        );
        std::thread::spawn(move || {
            let mut w = RingWriter::<Observation>::create(&obs_path, g, 8).unwrap();
            let mut obs = Observation::for_geometry(&g).unwrap();
            for (i, b) in obs.frames.iter_mut().enumerate() {
                *b = (i * 7 % 251) as u8;
            }
            for (i, s) in obs.state.iter_mut().enumerate() {
                *s = 0.01 * i as f32;
            }
            while !stop.load(Ordering::Acquire) {
                obs.instruction_id = instruction.load(Ordering::Acquire);
                obs.capture_time_ns = monotonic_ns();
                obs.seed = 7;
                let seq = w.publish(&obs).unwrap();
                newest_seq.store(seq, Ordering::Release);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // The seq of the first observation naming `id`.
    let switch = |id: u32| {
        instruction.store(id, Ordering::Release);
        let before = newest_seq.load(Ordering::Acquire);
        while newest_seq.load(Ordering::Acquire) <= before {
            std::thread::sleep(Duration::from_millis(1));
        }
        before + 1
    };

    let mut c = Command::new(env!("CARGO_BIN_EXE_vlad"));
    c.args(["run", "--config", config]);
    let daemon = Drained::spawn(&mut c);
    let pid = daemon.id();
    let end = Instant::now() + HANG_GUARD;
    let ring = loop {
        if let Ok(r) = RingReader::<Action>::open(&act_path, g) {
            break r;
        }
        assert!(running(pid) && Instant::now() < end, "no action ring");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut actions = Actions {
        ring,
        buf: Action::for_geometry(&g),
        last: 0,
        all: Vec::new(),
    };
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
        let observations = newest_seq.load(Ordering::Acquire);
        actions.until(what, pid, from, |a| {
            a.iter().filter(|x| x.status == ActionStatus::Hold).count() > 20
        });
        while newest_seq.load(Ordering::Acquire) < observations + 20 {
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
    write_text(&peer, &txt_path, &g, 2, b"fly to the moon");
    holds(
        &mut actions,
        "a text in no pack",
        text_instruction_id(2).unwrap(),
    );
    holds(&mut actions, "an id no pack holds", PACK_ID_FLAG | 7);

    // A pack installed while the daemon runs: the CLI signals a reload, which attaches it.
    let more = dir.join("pack-more");
    signed_pack(
        &more,
        &bundle,
        "more",
        &key,
        &[(PACK_ID_FLAG | 7, "close the drawer", 1)],
    );
    let out = vlad_ok(&["ota", "install", more.to_str().unwrap(), "--config", config]);
    assert!(out.contains("sent SIGHUP"), "{out}");
    drives(
        &mut actions,
        "the new pack's id after the reload",
        PACK_ID_FLAG | 7,
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (_, out, err) = daemon.finish();
    stop.store(true, Ordering::Release);
    feeder.join().unwrap();
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
        attached
            .iter()
            .any(|l| l.contains("(more): 1 instructions")),
        "{err}"
    );
    // One line for the refusal (the reload renders the newest text again: its own line).
    let before_reload = err.split("SIGHUP: reloading").next().unwrap();
    let refused: Vec<&str> = before_reload
        .lines()
        .filter(|l| l.contains("instruction text 2:"))
        .collect();
    assert_eq!(refused.len(), 1, "{err}");
    assert!(refused[0].contains("instruction pack"), "{}", refused[0]);
    assert!(out.contains("control loop report"), "{out}");
    for p in [&obs_path, &act_path, &txt_path] {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
