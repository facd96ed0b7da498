//! `vlad run` on the tiny upstream MolmoAct2 bundle (it carries the `text` block) with
//! instructions given as text by a C firmware stand-in (`ring_peer write-text`, built
//! against `vla_ring.h` and the C ring client library, `runtime/ring-c`) over the
//! instruction segment, on the real QNN emulator: the robot switches instructions
//! mid-run, no step computed for the old one is published once the switch shows, bad
//! texts are refused (one log line each, counted) while the daemon holds, and it drives
//! again on the next good text. Prints the switch latency
//! (text written -> first ok step computed for it) as a figure, not a bound.

mod common;

use common::text::{
    build_c_peer, ok, text_daemon_config, write_text, Actions, Firmware, RingPaths,
};
use common::{qnn_dir, write_config, Drained};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;
use vla_ring::{text_instruction_id, Action, ActionStatus, Geometry};
use vla_test_support::repo_root;

const BUNDLE: &str = "golden/bundles/molmoact2-upstream-original";

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vlad-text-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The ring geometry the bundle needs (as vlad derives it from the manifest).
fn geometry() -> Geometry {
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo_root().join(BUNDLE).join("bundle.json")).unwrap(),
    )
    .unwrap();
    let m = &v["molmoact2"];
    let n = |k: &str| m[k].as_u64().unwrap() as u32;
    Geometry {
        cameras: n("cameras"),
        height: n("frame_height"),
        width: n("frame_width"),
        channels: 3,
        state_dims: n("state_dims"),
        action_dims: n("action_dims"),
        chunk_len: n("action_horizon"),
    }
}

/// How long after the switch observation is in the ring a step computed for the old
/// instruction may still be made: vlad's watch thread looks at the ring every 2 ms (it
/// sleeps 2 ms between looks; a look is a few atomic loads and one stat, given 3 ms with
/// its wake-up), then the publisher drops the old chunk at its next tick, one period
/// (50 ms at publish_hz 20) later at most. Nothing here depends on the emulator's speed:
/// an old chunk that plays out instead (3 rows, 150 ms) runs past it.
const SWITCH_BOUND_NS: u64 = (2 + 3 + 50) * 1_000_000;

/// (source seq, ns after the switch) of the ok steps computed from observations before
/// `switch` (in the ring at `switch_ns`) made later than [`SWITCH_BOUND_NS`] after it.
fn stale_after_switch(actions: &[Action], (switch, switch_ns): (u64, u64)) -> Vec<(u64, u64)> {
    actions
        .iter()
        .filter(|a| ok(a) && a.source_obs_seq < switch)
        .filter(|a| a.made_time_ns > switch_ns + SWITCH_BOUND_NS)
        .map(|a| (a.source_obs_seq, a.made_time_ns - switch_ns))
        .collect()
}

#[test]
fn instructions_switch_over_the_c_channel_with_no_stale_step_and_bad_texts_hold() {
    let Some(lib) = qnn_dir() else { return };
    let dir = scratch("switch");
    let Some(peer) = build_c_peer(&dir) else {
        return;
    };
    let g = geometry();
    let rings = RingPaths::new("vlad-text");
    let txt_path = &rings.txt;
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo_root().join("config/dev.json")).unwrap())
            .unwrap();
    v["bundle"]["path"] = repo_root().join(BUNDLE).to_str().unwrap().into();
    text_daemon_config(&mut v, lib, &rings);
    let config = write_config(&dir, &v);

    // The firmware: observations at 20 Hz naming `instruction`; its first text before
    // vlad starts (the segment is the C writer's).
    write_text(&peer, txt_path, &g, 90, b"warm up the text path");
    let firmware = Firmware::start(&rings.obs, g, 0, 0.1);

    let mut c = Command::new(env!("CARGO_BIN_EXE_vlad"));
    c.args(["run", "--config", config.to_str().unwrap()]);
    let daemon = Drained::spawn(&mut c);
    let pid = daemon.id();
    let mut actions = Actions::open(&rings.act, g, pid);
    // A fixed instruction first.
    actions.until("ok steps of fixed instruction 0", pid, 0, |a| {
        a.iter().any(ok)
    });

    // A text not in the bundle, then a second one: each switch mid-run.
    let mut latencies = Vec::new();
    for (text_id, text) in [
        // Texts the tiny export takes (its contexts bake RoPE for one prompt length).
        (1u32, &b"put the cup on the plate"[..]),
        (2, &b"put the plate on the stove"[..]),
    ] {
        let written = write_text(&peer, txt_path, &g, text_id, text);
        let sw = firmware.switch(text_instruction_id(text_id).unwrap());
        let at = sw.0;
        let from = actions.all.len();
        actions.until("an ok step computed for the new text", pid, from, |a| {
            a.iter().any(|x| ok(x) && x.source_obs_seq >= at)
        });
        let stale = stale_after_switch(&actions.all[from..], sw);
        assert!(
            stale.is_empty(),
            "text {text_id}: old steps after the switch: {stale:?}"
        );
        let first = actions.all[from..]
            .iter()
            .find(|x| ok(x) && x.source_obs_seq >= at)
            .unwrap();
        latencies.push((first.made_time_ns - written) as f64 / 1e6);
    }

    // Bad texts: each refused in one log line; the daemon holds, publishing nothing
    // computed for them nor for the instruction before.
    for (text_id, text) in [
        (3u32, b"put the \xff bowl".to_vec()),
        (4, b"pick up the alphabet soup and the cream cheese box and put both of them in the basket next to the plate".to_vec()),
        (5, b"put the <im_patch> on the stove".to_vec()),
    ] {
        write_text(&peer, txt_path, &g, text_id, &text);
        let sw = firmware.switch(text_instruction_id(text_id).unwrap());
        let at = sw.0;
        let from = actions.all.len();
        // Holds for well over one emulator inference's worth of observations.
        let observations = firmware.newest_seq.load(Ordering::Acquire);
        actions.until("holds while the text is refused", pid, from, |a| {
            a.iter().filter(|x| x.status == ActionStatus::Hold).count() > 20
        });
        while firmware.newest_seq.load(Ordering::Acquire) < observations + 20 {
            std::thread::sleep(Duration::from_millis(10));
        }
        actions.poll();
        let after = &actions.all[from..];
        assert!(
            stale_after_switch(after, sw).is_empty(),
            "text {text_id}: old steps"
        );
        assert!(
            !after.iter().any(|x| ok(x) && x.source_obs_seq >= at),
            "text {text_id} was refused: nothing may be computed for it"
        );
    }

    // A good text again: the daemon drives.
    let written = write_text(&peer, txt_path, &g, 6, b"put the bowl on the cup");
    let sw = firmware.switch(text_instruction_id(6).unwrap());
    let at = sw.0;
    let from = actions.all.len();
    actions.until("ok steps again after the refusals", pid, from, |a| {
        a.iter().any(|x| ok(x) && x.source_obs_seq >= at)
    });
    let first = actions.all[from..]
        .iter()
        .find(|x| ok(x) && x.source_obs_seq >= at)
        .unwrap();
    latencies.push((first.made_time_ns - written) as f64 / 1e6);
    assert!(stale_after_switch(&actions.all[from..], sw).is_empty());

    let (_, out, err) = daemon.terminate();
    firmware.stop();
    for (id, reason) in [
        (3, "invalid UTF-8"),
        (4, "too many tokens"),
        (5, "im_patch"),
    ] {
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.contains(&format!("instruction text {id}:")))
            .collect();
        assert_eq!(lines.len(), 1, "one line for text {id}: {lines:?}\n{err}");
        assert!(lines[0].contains(reason), "{}", lines[0]);
    }
    assert!(err.contains("instruction text 6 rendered"), "{err}");
    assert!(out.contains("control loop report"), "{out}");
    println!(
        "switch latency (text written by the C firmware -> first ok step computed for it, HTP emulator): {}",
        latencies
            .iter()
            .map(|l| format!("{l:.0} ms"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Of which the text thread's render (the rest: the inference in flight on the old
    // instruction, then the first one on the new).
    for line in err.lines().filter(|l| l.contains(" rendered in ")) {
        println!("{}", line.split("] ").nth(1).unwrap_or(line));
    }
    rings.remove();
    let _ = std::fs::remove_dir_all(&dir);
}
