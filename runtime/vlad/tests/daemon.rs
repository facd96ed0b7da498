//! `vlad run` with `vlad simulate` as the robot, on the real QNN emulator: systemd
//! notifications, SIGHUP reload, SIGTERM stop with a final hold, and a robot whose ring
//! does not fit the bundle.

mod common;

use common::{qnn_dir, wait_while_running, Drained};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use vla_ring::{Action, ActionStatus, Geometry, Observation, RingReader, RingWriter};
use vla_test_support::repo_root;

/// A config for `bundle` with rings and files private to this test.
fn write_config(dir: &Path, tag: &str, bundle: &str, hz: f64) -> PathBuf {
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo_root().join("config/dev.json")).unwrap())
            .unwrap();
    v["bundle"]["path"] = repo_root()
        .join("golden/bundles")
        .join(bundle)
        .to_str()
        .unwrap()
        .into();
    v["rings"]["observation_path"] =
        format!("/dev/shm/vlad-test-{}-{tag}-obs", std::process::id()).into();
    v["rings"]["action_path"] =
        format!("/dev/shm/vlad-test-{}-{tag}-act", std::process::id()).into();
    v["control"]["publish_hz"] = hz.into();
    v["control"]["max_chunk_age_ms"] = 60000.into();
    v["control"]["max_observation_age_ms"] = 5000.into();
    v["control"]["action_valid_ms"] = 1000.into();
    v["control"]["writer_heartbeat_timeout_ms"] = 2000.into();
    v["systemd"]["notify"] = true.into();
    v["systemd"]["watchdog"] = true.into();
    v["log"]["level"] = "info".into();
    let p = dir.join(format!("{tag}.json"));
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    p
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vlad-daemon-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn spawn(args: &[&str], notify: Option<&Path>) -> Drained {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vlad"));
    c.args(args);
    if let Some(sock) = notify {
        c.env("NOTIFY_SOCKET", sock).env("WATCHDOG_USEC", "400000");
    }
    Drained::spawn(&mut c)
}

fn finish(child: Drained) -> (String, String) {
    let (_, out, err) = child.finish();
    (out, err)
}

#[test]
fn finish_drains_stdout_and_stderr_together() {
    // More stderr than a pipe holds before the first byte of stdout: reading stdout to
    // EOF first would wait forever on a child blocked writing stderr.
    let mut c = Command::new("sh");
    c.args(["-c", "head -c 1000000 /dev/zero >&2; echo done"]);
    let (out, err) = finish(Drained::spawn(&mut c));
    assert_eq!(out, "done\n");
    assert_eq!(err.len(), 1_000_000);
}

fn signal(child: &Drained, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

#[test]
fn daemon_notifies_systemd_reloads_on_sighup_and_stops_holding() {
    let Some(_) = qnn_dir() else { return };
    let dir = scratch("main");
    let config = write_config(&dir, "main", "fastwam", 10.0);
    let sock_path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    // Runs until this test stops it, however long it takes to gate here.
    let daemon = spawn(
        &["run", "--config", config.to_str().unwrap()],
        Some(&sock_path),
    );
    // systemd drains its socket all the time; so does this thread.
    let messages = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    {
        let messages = messages.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok(n) = sock.recv(&mut buf) {
                messages
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        });
    }
    // Each message is awaited while the daemon runs (READY comes after loading and
    // gating, as slow as this machine is); STOPPING=1 is in the socket once it has exited.
    let wait_for = |what: &str, pids: &[u32]| {
        wait_while_running(what, pids, || {
            messages.lock().unwrap().iter().any(|m| m.contains(what))
        })
    };
    let daemon_pid = [daemon.id()];
    if let Err(e) = wait_for("READY=1", &daemon_pid) {
        panic!("{e}: {:?}", messages.lock().unwrap());
    }

    let sim = spawn(
        &[
            "simulate",
            "--config",
            config.to_str().unwrap(),
            "--duration",
            "12",
        ],
        None,
    );
    if let Err(e) = wait_for("WATCHDOG=1", &daemon_pid) {
        panic!("{e}: {:?}", messages.lock().unwrap());
    }
    std::thread::sleep(Duration::from_secs(4));
    signal(&daemon, nix::sys::signal::Signal::SIGHUP);
    let (sim_out, sim_err) = finish(sim);
    assert!(sim_out.contains("simulator report"), "{sim_out}{sim_err}");
    let received: u64 = sim_out
        .lines()
        .find(|l| l.trim_start().starts_with("actions"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(received > 10, "{sim_out}");
    assert!(sim_out.contains("all-zero actions applied: 0"), "{sim_out}");

    signal(&daemon, nix::sys::signal::Signal::SIGTERM);
    let (out, err) = finish(daemon);
    if let Err(e) = wait_for("STOPPING=1", &[]) {
        panic!("{e}: {:?}", messages.lock().unwrap());
    }
    assert!(messages
        .lock()
        .unwrap()
        .iter()
        .any(|m| m.starts_with("STATUS=")));
    // READY and STATUS carry the bundle's DSP memory plan.
    assert!(
        messages
            .lock()
            .unwrap()
            .iter()
            .any(|m| m.contains("READY=1") && m.contains("; dsp s0 nsp0 [action_step] ")),
        "{:?}",
        messages.lock().unwrap()
    );
    // No libcdsprpc.so here: `auto` (dev.json leaves npu out) falls back, said once in the
    // log and in every STATUS.
    assert!(
        err.contains("NPU I/O in client buffers (npu.shared_buffers is auto; no rpcmem: "),
        "{err}"
    );
    let said = |m: &&String| m.contains("NPU I/O in client buffers");
    let all = messages.lock().unwrap().clone();
    assert!(
        all.iter()
            .filter(|m| m.contains("READY=1"))
            .all(|m| said(&m)),
        "{all:?}"
    );
    assert!(
        all.iter()
            .any(|m| !m.contains("READY=1") && m.contains("STATUS=") && said(&m)),
        "{all:?}"
    );
    assert!(
        err.contains("SIGHUP: reloading") && err.contains("reloaded: bundle"),
        "{err}"
    );
    // dev.json leaves qnn.performance out: the default burst vote is made and logged.
    assert!(
        err.contains("HTP performance vote: burst accepted (NSP 0: power config id"),
        "{err}"
    );
    for needle in [
        "control loop report",
        "rate",
        "publish jitter  p50",
        "inference",
        "freshness",
    ] {
        assert!(out.contains(needle), "missing {needle}: {out}");
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    let act = PathBuf::from(v["rings"]["action_path"].as_str().unwrap());
    let g = Geometry {
        cameras: 0,
        height: 0,
        width: 0,
        channels: 3,
        state_dims: 0,
        action_dims: 7,
        chunk_len: 32,
    };
    let r = RingReader::<Action>::open(&act, g).unwrap();
    let mut last = Action::for_geometry(&g);
    r.read_latest(&mut last).unwrap();
    assert_eq!(
        last.status,
        ActionStatus::Hold,
        "SIGTERM leaves the robot holding"
    );
    let _ = std::fs::remove_file(&act);
    let _ = std::fs::remove_file(v["rings"]["observation_path"].as_str().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shared_buffers_on_where_they_cannot_be_used_is_refused_at_start_in_one_line() {
    let dir = scratch("shm-on");
    let config = write_config(&dir, "shm-on", "fastwam", 10.0);
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    v["npu"] = serde_json::json!({ "shared_buffers": "on" });
    std::fs::write(&config, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let (status, _, err) = spawn(&["run", "--config", config.to_str().unwrap()], None).finish();
    assert!(!status.success(), "{err}");
    let refusal: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("npu.shared_buffers is on"))
        .collect();
    assert_eq!(refusal.len(), 1, "{err}");
    assert!(
        refusal[0].contains("shared buffers cannot be used here: "),
        "{err}"
    );
    assert!(
        !err.contains("contexts resident"),
        "refused before loading: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `auto` with rpcmem (the memfd stand-in, found by its standard name through
/// LD_LIBRARY_PATH) and QNN through the memory shim: the open-loop Fast-WAM bundle is
/// gated and runs on shared buffers, said in the log and in READY's STATUS; under `on` a
/// MolmoAct2 bundle, which cannot, is refused in one line.
#[test]
fn shared_buffers_run_fastwam_under_auto_and_molmoact2_under_on() {
    let Some(real) = qnn_dir() else { return };
    let dir = scratch("shm-auto");
    let Some(rpcmem) = vla_test_support::rpcmem_standin(&dir) else {
        return;
    };
    let Some(shim) = vla_test_support::qnn_mem_shim(&dir.join("qnn"), Path::new(&real)) else {
        return;
    };
    let config = write_config(&dir, "shm-auto", "fastwam", 10.0);
    let sock_path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let daemon_cmd = |config: &Path, notify: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_vlad"));
        c.args(["run", "--config", config.to_str().unwrap()])
            .env("VLA_QNN_LIB_DIR", &shim)
            .env("LD_LIBRARY_PATH", rpcmem.parent().unwrap());
        if notify {
            c.env("NOTIFY_SOCKET", &sock_path);
        }
        c
    };
    let daemon = Drained::spawn(&mut daemon_cmd(&config, true));
    let mut ready = None;
    wait_while_running("READY=1", &[daemon.id()], || {
        let mut buf = [0u8; 512];
        while let Ok(n) = sock.recv(&mut buf) {
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            if m.contains("READY=1") {
                ready = Some(m);
            }
        }
        ready.is_some()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    signal(&daemon, nix::sys::signal::Signal::SIGTERM);
    let (_, _, err) = daemon.finish();
    let ready = ready.unwrap();
    assert!(
        ready.contains("NPU I/O in HTP shared buffers (rpcmem from libcdsprpc.so)"),
        "{ready}"
    );
    assert!(
        err.contains(": NPU I/O in HTP shared buffers (rpcmem from libcdsprpc.so)"),
        "{err}"
    );

    // MolmoAct2 under `on`: its whole chain moves into one registered arena, the gate
    // passes on it, and the loop drives the robot from it.
    let on = write_config(&dir, "shm-on-molmo", "molmoact2-original", 10.0);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&on).unwrap()).unwrap();
    v["npu"] = serde_json::json!({ "shared_buffers": "on" });
    // A step of 10 s: a chunk from the emulator's seconds-long inference lands with rows
    // left to play (d < H), so `ok` actions follow however slow this machine is.
    v["control"]["publish_hz"] = 0.1.into();
    v["control"]["action_valid_ms"] = 10000.into();
    v["control"]["writer_heartbeat_timeout_ms"] = 20000.into();
    std::fs::write(&on, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let daemon = Drained::spawn(&mut daemon_cmd(&on, true));
    let mut ready = None;
    wait_while_running("READY=1", &[daemon.id()], || {
        let mut buf = [0u8; 512];
        while let Ok(n) = sock.recv(&mut buf) {
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            if m.contains("READY=1") {
                ready = Some(m);
            }
        }
        ready.is_some()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let ready = ready.unwrap();
    assert!(
        ready.contains("NPU I/O in HTP shared buffers (rpcmem from libcdsprpc.so)"),
        "{ready}"
    );
    let sim = Drained::spawn(
        Command::new(env!("CARGO_BIN_EXE_vlad"))
            .args(["simulate", "--config", on.to_str().unwrap()])
            .args(["--duration", "600", "--camera-hz", "30"]),
    );
    let bundle =
        vla_policy::Bundle::open(repo_root().join("golden/bundles/molmoact2-original")).unwrap();
    let p = bundle.manifest.geometry();
    let g = Geometry {
        cameras: p.cameras as u32,
        height: p.height as u32,
        width: p.width as u32,
        channels: 3,
        state_dims: p.state_dims as u32,
        action_dims: p.action_dims as u32,
        chunk_len: p.chunk_len as u32,
    };
    let act = PathBuf::from(v["rings"]["action_path"].as_str().unwrap());
    let mut last = Action::for_geometry(&g);
    wait_while_running("an ok action", &[daemon.id(), sim.id()], || {
        let Ok(r) = RingReader::<Action>::open(&act, g) else {
            return false;
        };
        r.read_latest(&mut last).is_ok() && last.status == ActionStatus::Ok
    })
    .unwrap_or_else(|e| panic!("{e}"));
    signal(&sim, nix::sys::signal::Signal::SIGTERM);
    let _ = sim.finish();
    signal(&daemon, nix::sys::signal::Signal::SIGTERM);
    let (_, _, err) = daemon.finish();
    assert!(
        err.contains(": NPU I/O in HTP shared buffers (rpcmem from libcdsprpc.so)"),
        "{err}"
    );
    let _ = std::fs::remove_file(v["rings"]["observation_path"].as_str().unwrap());
    let _ = std::fs::remove_file(v["rings"]["action_path"].as_str().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_robot_ring_of_the_wrong_geometry_is_refused_and_only_hold_is_published() {
    let Some(_) = qnn_dir() else { return };
    let dir = scratch("geom");
    let config = write_config(&dir, "geom", "fastwam", 20.0);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    let obs_path = PathBuf::from(v["rings"]["observation_path"].as_str().unwrap());
    let act_path = PathBuf::from(v["rings"]["action_path"].as_str().unwrap());
    // Firmware configured for 6 action dims; the bundle needs 7.
    let wrong = Geometry {
        cameras: 0,
        height: 0,
        width: 0,
        channels: 3,
        state_dims: 0,
        action_dims: 6,
        chunk_len: 32,
    };
    let mut w = RingWriter::<Observation>::create(&obs_path, wrong, 8).unwrap();
    w.publish(&Observation::for_geometry(&wrong).unwrap())
        .unwrap();
    let daemon = spawn(
        &[
            "run",
            "--config",
            config.to_str().unwrap(),
            "--duration",
            "8",
        ],
        None,
    );
    let (out, err) = finish(daemon);
    assert!(
        err.contains("observation ring refused") && err.contains("action_dims"),
        "{err}"
    );
    assert!(out.contains(" 0 ok,"), "{out}");
    let _ = std::fs::remove_file(&obs_path);
    let _ = std::fs::remove_file(&act_path);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_placement_over_the_session_budget_is_refused_at_start_before_any_context_is_created() {
    let Some(_) = qnn_dir() else { return };
    let dir = scratch("placement");
    let config = write_config(&dir, "placement", "molmoact2-original", 10.0);
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    // The tiny fixtures need about 2.7 MiB together: a 2 MiB session less 1 MiB reserve
    // holds vision and llm_split0, not all seven in one group.
    v["npu"] = serde_json::json!({
        "placement": "groups",
        "session_mb": 2,
        "reserve_mb": 1,
        "groups": [
            {"nsp": 0, "contexts": ["vision", "llm_split0", "llm_split1", "llm_split2",
                                    "llm_split3", "action_context", "action_step"]}
        ]
    });
    std::fs::write(&config, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vlad"))
        .args(["run", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(
        last.contains("placement refused: session 0 (NSP 0: vision + llm_split0 + llm_split1 + llm_split2 + llm_split3 + action_context + action_step) needs")
            && last.contains("over the per-session budget of 1.0 MiB"),
        "{err}"
    );
    assert!(
        !err.contains("compiled by QNN"),
        "a context was created: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
