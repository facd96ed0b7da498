//! `vlad run` on the closed-loop Fast-WAM fixture whose robot writes upstream LIBERO's raw
//! state (`state_input: eef_pos_quat_gripper`: position, quaternion, gripper = 9 values),
//! on the QNN emulator, with this test as the robot: a ring with the 8-value state is
//! refused by its `state_dims`; on the 9-value ring, observations whose quaternion is not
//! finite fail their inference: `hold` is published, then `fault` once 3 failed in a row
//! (the loop's rule), never an `ok` action from them; good ones drive `ok` before and after.

mod common;

use common::{qnn_dir, Drained};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use vla_npz::Npz;
use vla_ring::{monotonic_ns, Action, ActionStatus, Geometry, Observation, RingReader, RingWriter};
use vla_test_support::copy_dir;
use vla_test_support::repo_root;

/// The fixture with `state_input: eef_pos_quat_gripper`, gated by its quaternion golden.
fn quaternion_bundle(dir: &Path) -> PathBuf {
    let bundle = dir.join("bundle");
    copy_dir(
        &repo_root().join("golden/bundles/fastwam-closed-loop"),
        &bundle,
    );
    let path = bundle.join("bundle.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    v["fastwam"]["chain"]["state_input"] = "eef_pos_quat_gripper".into();
    v["end_to_end"] = "golden/end_to_end_quat.npz".into();
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    bundle
}

fn config(dir: &Path, bundle: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo_root().join("config/dev.json")).unwrap())
            .unwrap();
    let pid = std::process::id();
    let (obs, act) = (
        PathBuf::from(format!("/dev/shm/vlad-test-{pid}-quat-obs")),
        PathBuf::from(format!("/dev/shm/vlad-test-{pid}-quat-act")),
    );
    v["bundle"]["path"] = bundle.to_str().unwrap().into();
    v["rings"]["observation_path"] = obs.to_str().unwrap().into();
    v["rings"]["action_path"] = act.to_str().unwrap().into();
    v["control"]["publish_hz"] = 20.0.into();
    v["control"]["max_chunk_age_ms"] = 60000.into();
    v["control"]["max_observation_age_ms"] = 5000.into();
    v["control"]["action_valid_ms"] = 1000.into();
    v["control"]["writer_heartbeat_timeout_ms"] = 5000.into();
    v["log"]["level"] = "info".into();
    let p = dir.join("config.json");
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    (p, obs, act)
}

/// The test's side of the rings: publishes observations, watches the actions.
struct Robot {
    writer: RingWriter<Observation>,
    obs: Observation,
    actions: RingReader<Action>,
    action: Action,
    last_seq: u64,
}

impl Robot {
    /// Publishes the current observation with a fresh capture time; returns its seq.
    fn publish(&mut self) -> u64 {
        self.obs.capture_time_ns = monotonic_ns();
        self.writer.publish(&self.obs).unwrap()
    }

    /// Reads new actions for up to `limit`, publishing every `every`, until `done` holds
    /// for one; each new action is also shown to `seen`.
    fn watch(
        &mut self,
        limit: Duration,
        every: Duration,
        mut seen: impl FnMut(&Action),
        done: impl Fn(&Action) -> bool,
    ) -> bool {
        let end = Instant::now() + limit;
        let mut next_publish = Instant::now();
        while Instant::now() < end {
            if Instant::now() >= next_publish {
                self.publish();
                next_publish += every;
            }
            if let Ok(seq) = self.actions.read_latest(&mut self.action) {
                if seq != self.last_seq {
                    self.last_seq = seq;
                    seen(&self.action);
                    if done(&self.action) {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

/// Through the daemon: the control loop turns a failed inference into `hold` (and, after
/// 3 failures in a row, `fault`: its fail-closed rule), and the bad observation never
/// yields an `ok` action.
#[test]
fn a_non_finite_quaternion_publishes_hold_and_an_eight_value_ring_is_refused() {
    let Some(_) = qnn_dir() else { return };
    let dir = std::env::temp_dir().join(format!("vlad-quat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bundle = quaternion_bundle(&dir);
    let (config, obs_path, act_path) = config(&dir, &bundle);
    let golden = Npz::open(bundle.join("golden/end_to_end_quat.npz")).unwrap();
    let state = golden.array("state").unwrap().to_f32().unwrap();
    assert_eq!(state.len(), 9);
    let geometry = Geometry {
        cameras: 2,
        height: 40,
        width: 48,
        channels: 3,
        state_dims: 9,
        action_dims: 7,
        chunk_len: 32,
    };
    // Firmware still writing the converted 8-vector.
    let eight = Geometry {
        state_dims: 8,
        ..geometry
    };
    let mut wrong = RingWriter::<Observation>::create(&obs_path, eight, 8).unwrap();
    wrong
        .publish(&Observation::for_geometry(&eight).unwrap())
        .unwrap();
    let daemon = Drained::spawn(Command::new(env!("CARGO_BIN_EXE_vlad")).args([
        "run",
        "--config",
        config.to_str().unwrap(),
        "--duration",
        "120",
    ]));
    // The action ring exists once the bundle passed its gate and the loop runs.
    let end = Instant::now() + Duration::from_secs(60);
    let actions = loop {
        match RingReader::<Action>::open(&act_path, geometry) {
            Ok(r) => break r,
            Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("the daemon never published actions: {e}"),
        }
    };
    // Give the loop time to try the 8-value ring, then replace it with the right one.
    std::thread::sleep(Duration::from_millis(500));
    drop(wrong);
    let mut obs = Observation::for_geometry(&geometry).unwrap();
    obs.frames = golden.array("frames").unwrap().to_u8().unwrap();
    obs.instruction_id = 1;
    obs.seed = golden.array("seed").unwrap().to_vec::<u64>().unwrap()[0];
    obs.state.copy_from_slice(&state);
    let mut robot = Robot {
        writer: RingWriter::<Observation>::create(&obs_path, geometry, 8).unwrap(),
        action: Action::for_geometry(&geometry),
        obs,
        actions,
        last_seq: 0,
    };
    // The 9-value ring refuses an 8-value observation from its writer.
    let short = Observation::for_geometry(&eight).unwrap();
    let e = robot.writer.publish(&short).unwrap_err().to_string();
    assert_eq!(e, "publish field state: expected 9 elements, found 8");
    let ok = |a: &Action| a.status == ActionStatus::Ok;
    let patience = Duration::from_secs(40);
    let fast = Duration::from_millis(50);
    // 1. Good observations drive `ok`.
    assert!(
        robot.watch(patience, fast, |_| {}, ok),
        "good observations never drove ok"
    );
    // 2. Observations with a NaN quaternion: each inference fails before any context runs,
    //    the chunk in play is dropped and `hold` is published; after 3 failures in a row the
    //    loop publishes `fault` (which also proves the failures happened). No `ok` action
    //    comes from a NaN observation.
    robot.obs.state[3] = f32::NAN;
    //    Published 300 ms apart, so that the publisher's 20 Hz ticks fall between failures.
    let first_bad = robot.publish();
    let mut statuses = Vec::new();
    let mut ok_from_bad = 0;
    let faulted = robot.watch(
        patience,
        Duration::from_millis(300),
        |a| {
            statuses.push(a.status);
            ok_from_bad += usize::from(ok(a) && a.source_obs_seq >= first_bad);
        },
        |a| a.status == ActionStatus::Fault,
    );
    assert!(faulted, "repeated failures never escalated: {statuses:?}");
    assert_eq!(ok_from_bad, 0, "an ok action from a NaN observation");
    let first_hold = statuses.iter().position(|s| *s == ActionStatus::Hold);
    let first_fault = statuses.iter().position(|s| *s == ActionStatus::Fault);
    assert!(
        first_hold.is_some() && first_hold < first_fault,
        "hold before fault: {statuses:?}"
    );
    // 4. Good observations again: `ok` again.
    robot.obs.state.copy_from_slice(&state);
    assert!(
        robot.watch(patience, fast, |_| {}, ok),
        "good observations never drove ok again"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (_, out, err) = daemon.finish();
    assert!(
        err.contains("observation ring refused") && err.contains("state_dims"),
        "{err}"
    );
    assert!(
        err.contains("failed: observation state: expected finite values, found NaN at index 3"),
        "{err}"
    );
    assert!(out.contains("control loop report"), "{out}");
    let _ = std::fs::remove_file(&obs_path);
    let _ = std::fs::remove_file(&act_path);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Fast-WAM bundle whose settings differ from upstream's LIBERO eval says which and what
/// upstream uses, in one line at load; the closed-loop fixture (upstream's settings) says
/// nothing.
#[test]
fn a_bundle_off_upstreams_eval_settings_says_so_in_one_line_at_load() {
    let Some(_) = qnn_dir() else { return };
    let parity = |dir: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_vlad"))
            .args(["parity", "--bundle", dir.to_str().unwrap()])
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let lines = |err: &str| {
        err.lines()
            .filter(|l| l.contains("deviates from upstream Fast-WAM's LIBERO eval settings"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let (code, err) = parity(&repo_root().join("golden/bundles/fastwam-closed-loop"));
    assert_eq!(code, Some(0), "{err}");
    assert!(lines(&err).is_empty(), "{err}");

    let (_, err) = parity(&repo_root().join("golden/bundles/fastwam"));
    let l = lines(&err);
    assert_eq!(l.len(), 1, "{err}");
    assert!(
        l[0].ends_with("settings: gripper_map none (upstream libero)"),
        "{}",
        l[0]
    );

    let dir = std::env::temp_dir().join(format!("vlad-deviation-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(
        &repo_root().join("golden/bundles/fastwam-closed-loop"),
        &dir,
    );
    let path = dir.join("bundle.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    v["fastwam"]["flow_steps"] = 4.into();
    v["fastwam"]["gripper_binarize"] = false.into();
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let (_, err) = parity(&dir);
    let l = lines(&err);
    assert_eq!(l.len(), 1, "{err}");
    assert!(
        l[0].ends_with(
            "settings: flow_steps 4 (upstream 10), gripper_binarize false (upstream true)"
        ),
        "{}",
        l[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
