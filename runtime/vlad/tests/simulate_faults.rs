//! `vlad simulate`'s fault injection and soak checks, against a scripted action writer
//! standing in for the daemon (no QNN needed): a silent period stops observations and the
//! heartbeat, and the JSON report counts the `ok` actions a careless daemon made during
//! it, an over-long validity window, an all-zero action and one that arrived expired.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;
use vla_ring::{monotonic_ns, Action, ActionStatus, Geometry, RingWriter};
use vla_test_support::repo_root;

const MS: u64 = 1_000_000;

#[test]
fn a_silent_robot_and_bad_ok_actions_are_counted_in_the_json_report() {
    let tag = format!("vlad-simfault-{}", std::process::id());
    let dir = std::env::temp_dir().join(&tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let obs_ring = PathBuf::from(format!("/dev/shm/{tag}-obs"));
    let act_ring = PathBuf::from(format!("/dev/shm/{tag}-act"));
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo_root().join("config/dev.json")).unwrap())
            .unwrap();
    v["bundle"]["path"] = repo_root()
        .join("golden/bundles/fastwam")
        .to_str()
        .unwrap()
        .into();
    v["rings"]["observation_path"] = obs_ring.to_str().unwrap().into();
    v["rings"]["action_path"] = act_ring.to_str().unwrap().into();
    v["control"]["publish_hz"] = 20.0.into();
    v["control"]["action_valid_ms"] = 200.into();
    v["control"]["writer_heartbeat_timeout_ms"] = 500.into();
    let config = dir.join("sim.json");
    std::fs::write(&config, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let report = dir.join("report.json");

    let g = Geometry {
        cameras: 0,
        height: 0,
        width: 0,
        channels: 3,
        state_dims: 0,
        action_dims: 7,
        chunk_len: 32,
    };
    let mut writer = RingWriter::<Action>::create(&act_ring, g, 64).unwrap();
    let mut sim = Command::new(env!("CARGO_BIN_EXE_vlad"))
        .args(["simulate", "--config", config.to_str().unwrap()])
        .args(["--duration", "5", "--gap-every", "3", "--gap-length", "1.5"])
        .args(["--json", report.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    // A daemon that ignores the robot's silence and breaks three rules once each.
    let mut action = Action::for_geometry(&g);
    let mut i = 0u64;
    while sim.try_wait().unwrap().is_none() {
        let now = monotonic_ns();
        action.status = ActionStatus::Ok;
        action.values.fill(0.25);
        action.made_time_ns = now;
        action.valid_until_ns = now + 150 * MS;
        action.source_obs_seq = 1;
        match i {
            5 => action.valid_until_ns = now + 300 * MS,
            7 => action.values.fill(0.0),
            9 => {
                action.made_time_ns = now - 100 * MS;
                action.valid_until_ns = now - 50 * MS;
            }
            _ => {}
        }
        writer.publish(&action).unwrap();
        i += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = sim.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("simulator report"), "{stdout}");
    assert!(stdout.contains("all-zero actions applied: 1"), "{stdout}");

    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["finished"], true, "{r}");
    assert_eq!(r["gaps"], 1, "{r}");
    assert_eq!(r["all_zero_applied"], 1, "{r}");
    assert_eq!(r["ok_window_invalid"], 1, "{r}");
    assert!(
        r["ok_while_silent"].as_u64().unwrap() >= 1,
        "ok actions made more than 0.5 s into a 1.5 s silence: {r}"
    );
    let expired = &r["ok_expired_on_arrival"];
    assert!(
        expired["published_late"].as_u64().unwrap() + expired["robot_late"].as_u64().unwrap() >= 1,
        "{r}"
    );
    assert_eq!(expired["short_window"], 0, "{r}");
    assert!(r["ok_applied"].as_u64().unwrap() > 0, "{r}");
    // Every action names observation 1, captured before the silence: each `ok` applied
    // after the robot came back replays a stale chunk.
    assert!(r["stale_resumes"].as_u64().unwrap() >= 1, "{r}");
    let _ = std::fs::remove_file(&obs_ring);
    let _ = std::fs::remove_file(&act_ring);
    let _ = std::fs::remove_dir_all(&dir);
}
