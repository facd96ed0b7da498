//! Over-the-air updates through the real daemon: a signed bundle installed and activated
//! from the command line is reloaded by the running `vlad run` on SIGHUP and gated; a
//! bundle whose golden parity fails is rolled back to the previous one while the daemon
//! keeps running. Uses the real QNN emulator and fixture bundles.

mod common;

use common::{
    hash_in, qnn, vlad, vlad_ok, wait_while_running, write_config, Drained, OtaScratch, HANG_GUARD,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use vla_npz::{write_npz, Array, Npz};
use vla_test_support::copy_dir;
use vla_test_support::repo_root;

fn current_target(root: &Path) -> PathBuf {
    std::fs::read_link(root.join("current")).unwrap()
}

#[test]
fn sighup_reloads_a_new_bundle_and_a_failing_one_is_rolled_back() {
    if !qnn() {
        return;
    }
    // Config: OTA mode (bundle.path = <root>/current), the fleet key trusted.
    let store = OtaScratch::new("vlad-ota");
    let mut v = store.config();
    let OtaScratch { tmp, root, key, .. } = store;
    v["ota"]["trial_inferences"] = 1.into();
    v["rings"]["observation_path"] = format!("/dev/shm/vlad-ota-{}-obs", std::process::id()).into();
    v["rings"]["action_path"] = format!("/dev/shm/vlad-ota-{}-act", std::process::id()).into();
    v["control"]["publish_hz"] = 10.into();
    v["log"]["level"] = "info".into();
    let textfile = tmp.join("vlad.prom");
    v["metrics"] = serde_json::json!({"textfile": textfile.to_str().unwrap(), "interval_ms": 100});
    let config = write_config(&tmp, &v);
    let cfg = config.to_str().unwrap();
    // What a fleet's scrape sees: the running bundle's version and hash, and its OTA state.
    let metrics_name = |version: &str, hash: &str, state: &str| {
        let text = std::fs::read_to_string(&textfile).unwrap_or_default();
        text.lines().any(|l| {
            l.starts_with("vlad_bundle_info{")
                && l.contains(&format!("version=\"{version}\""))
                && l.contains(&format!("hash=\"{hash}\""))
        }) && text.contains(&format!("vlad_ota_state{{state=\"{state}\"}} 1"))
    };

    // Bundle A (the fixture) and B (same contexts, new version): both signed.
    let sign = |name: &str, edit: &dyn Fn(&Path)| {
        let dir = tmp.join(name);
        copy_dir(&repo_root().join("golden/bundles/fastwam"), &dir);
        edit(&dir);
        vlad_ok(&["bundle", "pack", dir.to_str().unwrap()]);
        vlad_ok(&[
            "bundle",
            "sign",
            dir.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ]);
        hash_in(&vlad_ok(&[
            "ota",
            "install",
            dir.to_str().unwrap(),
            "--config",
            cfg,
        ]))
    };
    let set_version = |dir: &Path, version: &str| {
        let p = dir.join("bundle.json");
        let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        m["version"] = version.into();
        std::fs::write(&p, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    };
    let a = sign("bundle-a", &|d| set_version(d, "1.0.0"));
    vlad_ok(&["ota", "activate", &a, "--config", cfg]);
    assert!(current_target(&root).ends_with(&a));

    // The daemon and the robot run until this test stops them: however slowly this
    // machine gates, each step below waits for what the daemon reports.
    let mut daemon =
        Drained::spawn(Command::new(env!("CARGO_BIN_EXE_vlad")).args(["run", "--config", cfg]));
    let pid_file = root.join("vlad.pid");
    wait_while_running("the daemon's pid file", &[daemon.id()], || {
        pid_file.exists()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let robot = Drained::spawn(Command::new(env!("CARGO_BIN_EXE_vlad")).args([
        "simulate",
        "--config",
        cfg,
        "--duration",
        &HANG_GUARD.as_secs().to_string(),
    ]));
    // A's trial (one inference) commits it once the daemon has gated it.
    let a_verdict = vlad(&["ota", "verdict", &a, "--config", cfg, "--wait", "30"]);
    assert!(
        a_verdict.status.success(),
        "{}{}",
        String::from_utf8_lossy(&a_verdict.stdout),
        String::from_utf8_lossy(&a_verdict.stderr)
    );

    // B: good. Activate from the CLI: the daemon gets SIGHUP, reloads and gates it.
    // B runs inferences for the robot meanwhile: its trial (1 inference here) commits it,
    // so B is the known-good bundle a later failure returns to. `--wait` returns once the
    // daemon has gated B and run it (it waits while the daemon gates; 30 s of slack).
    let b = sign("bundle-b", &|d| set_version(d, "1.1.0"));
    let waited = vlad(&["ota", "activate", &b, "--config", cfg, "--wait", "30"]);
    let out = String::from_utf8_lossy(&waited.stdout).into_owned();
    assert!(
        waited.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    assert!(current_target(&root).ends_with(&b), "{out}");
    assert!(
        out.contains(&format!("{b} passed the daemon's parity gate"))
            || out.contains(&format!("{b} passed its trial and is committed")),
        "{out}"
    );
    // The textfile follows the reload (it named A until the daemon restarted, once).
    wait_while_running("the textfile naming B, committed", &[daemon.id()], || {
        metrics_name("1.1.0", &b, "committed")
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {}",
            std::fs::read_to_string(&textfile).unwrap_or_default()
        )
    });

    // C: signed and intact, but its end-to-end golden disagrees with what the contexts
    // compute: the daemon's parity gate must refuse it and the store roll back to B.
    let c = sign("bundle-c", &|d| {
        set_version(d, "1.2.0");
        let p = d.join("golden/end_to_end.npz");
        let npz = Npz::open(&p).unwrap();
        let arrays: Vec<Array> = npz
            .names()
            .map(|n| {
                let a = npz.array(n).unwrap();
                if n == "actions" {
                    let v: Vec<f32> = a.to_f32().unwrap().iter().map(|x| -x - 0.5).collect();
                    Array::from_f32(n, a.shape(), &v).unwrap()
                } else {
                    a
                }
            })
            .collect();
        write_npz(&p, &arrays.iter().collect::<Vec<_>>()).unwrap();
    });
    // `--wait` sees the daemon's rollback: exit 3 with its reason.
    let refused = vlad(&["ota", "activate", &c, "--config", cfg, "--wait", "30"]);
    let refusal = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(3), "{refusal}");
    assert!(
        refusal.contains(&format!("the daemon rolled {c} back to {b}"))
            && refusal.contains("parity"),
        "{refusal}"
    );
    let rolled_back = wait_while_running("the rollback to B", &[daemon.id()], || {
        current_target(&root).ends_with(&b)
    })
    .is_ok();
    let metrics_back = wait_while_running("the textfile naming B again", &[daemon.id()], || {
        metrics_name("1.1.0", &b, "committed")
    })
    .is_ok();
    // An observation window, not a bound: a daemon that died of the rejection shows here.
    std::thread::sleep(Duration::from_secs(3));
    let running = daemon.child.try_wait().unwrap().is_none();
    drop(robot);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (_, _, err) = daemon.finish();
    let log: String = err
        .lines()
        .filter(|l| !l.contains(" qnn]"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        rolled_back,
        "the failing bundle was not rolled back; daemon log:\n{log}"
    );
    assert!(
        running,
        "the daemon keeps running after a rejected update:\n{log}"
    );
    assert!(
        metrics_back,
        "after the rollback the textfile names B: {}",
        std::fs::read_to_string(&textfile).unwrap_or_default()
    );
    assert!(
        err.contains(&format!("reloaded: bundle {b}")),
        "B was reloaded: {log}"
    );
    assert!(
        err.contains(&format!("bundle {b} passed its trial")),
        "B was committed: {log}"
    );
    assert!(
        err.contains(&format!("bundle {c} rejected")) && err.contains("parity gate"),
        "C was refused by its gate: {log}"
    );
    let status = vlad_ok(&["ota", "status", "--config", cfg]);
    assert!(status.contains(&b), "{status}");
    for p in [
        v["rings"]["observation_path"].as_str().unwrap(),
        v["rings"]["action_path"].as_str().unwrap(),
    ] {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Copies the fixture bundle to `tmp/name` as `version`, packs, signs and installs it.
fn signed_install(tmp: &Path, key: &Path, cfg: &str, name: &str, version: &str) -> String {
    let dir = tmp.join(name);
    copy_dir(&repo_root().join("golden/bundles/fastwam"), &dir);
    let p = dir.join("bundle.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    m["version"] = version.into();
    std::fs::write(&p, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    vlad_ok(&["bundle", "pack", dir.to_str().unwrap()]);
    vlad_ok(&[
        "bundle",
        "sign",
        dir.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    hash_in(&vlad_ok(&[
        "ota",
        "install",
        dir.to_str().unwrap(),
        "--config",
        cfg,
    ]))
}

/// New chunks keep landing while an installer holds the store's lock during a trial:
/// the inference thread never waits for it (it used to, in `record_healthy`, for as long
/// as the installer copied and hashed). The installer is this test holding the real
/// `flock` on `ota.lock` (a stand-in for minutes of copying gigabytes), then a real
/// `vlad ota install`, which waits for it. Nothing is timed: the assertion is that three
/// inferences complete with the lock held (a generous bound only turns a stall into a
/// failure), and that the trial's counts reach the store once the lock is free.
#[test]
fn an_install_during_a_trial_never_stalls_inference() {
    use nix::fcntl::{Flock, FlockArg};
    use vla_ring::{Action, ActionStatus, Geometry, RingReader};
    if !qnn() {
        return;
    }
    let pid = std::process::id();
    let store = OtaScratch::new("vlad-ota-trial");
    let mut v = store.config();
    let OtaScratch { tmp, root, key, .. } = store;
    // The trial never completes during the test: every inference is one on trial.
    v["ota"]["trial_inferences"] = 1_000_000.into();
    let act_path = format!("/dev/shm/vlad-ota-trial-{pid}-act");
    v["rings"]["observation_path"] = format!("/dev/shm/vlad-ota-trial-{pid}-obs").into();
    v["rings"]["action_path"] = act_path.clone().into();
    v["control"]["publish_hz"] = 10.into();
    v["log"]["level"] = "info".into();
    let config = write_config(&tmp, &v);
    let cfg = config.to_str().unwrap();

    // A is activated before the daemon starts: it starts on trial.
    let a = signed_install(&tmp, &key, cfg, "bundle-a", "1.0.0");
    vlad_ok(&["ota", "activate", &a, "--config", cfg]);
    // Both run until this test stops them; every wait below lasts while they run.
    let daemon =
        Drained::spawn(Command::new(env!("CARGO_BIN_EXE_vlad")).args(["run", "--config", cfg]));
    let robot = Drained::spawn(Command::new(env!("CARGO_BIN_EXE_vlad")).args([
        "simulate",
        "--config",
        cfg,
        "--duration",
        &HANG_GUARD.as_secs().to_string(),
    ]));
    let both = [daemon.id(), robot.id()];
    let g = Geometry {
        cameras: 0,
        height: 0,
        width: 0,
        channels: 3,
        state_dims: 0,
        action_dims: 7,
        chunk_len: 32,
    };
    let mut ring = None;
    wait_while_running("the action ring", &both, || {
        ring = RingReader::<Action>::open(&act_path, g).ok();
        ring.is_some()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let ring = ring.unwrap();
    // The chunks landing from now on, by the observation each came from.
    let mut next = ring.published() + 1;
    let mut buf = Action::for_geometry(&g);
    let mut read_new = |sources: &mut std::collections::BTreeSet<u64>| {
        for seq in next..=ring.published() {
            if ring.read_seq(seq, &mut buf).is_ok() && buf.status == ActionStatus::Ok {
                sources.insert(buf.source_obs_seq);
            }
        }
        next = ring.published() + 1;
    };
    let wait_for_chunks = |what: &str, n: usize, read_new: &mut dyn FnMut(&mut _)| {
        let mut seen = std::collections::BTreeSet::new();
        wait_while_running(what, &both, || {
            read_new(&mut seen);
            seen.len() >= n
        })
        .unwrap_or_else(|e| panic!("{e} ({} of {n} chunks)", seen.len()));
        seen
    };
    wait_for_chunks("before the install", 2, &mut read_new);

    // The installer takes the lock (and a real install queues behind it).
    let lock_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(root.join("ota.lock"))
        .unwrap();
    let installer = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .unwrap();
    let b_dir = tmp.join("bundle-b");
    copy_dir(&tmp.join("bundle-a"), &b_dir);
    let p = b_dir.join("bundle.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    m["version"] = "1.1.0".into();
    std::fs::write(&p, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    vlad_ok(&["bundle", "pack", b_dir.to_str().unwrap()]);
    vlad_ok(&[
        "bundle",
        "sign",
        b_dir.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    let install = Drained::spawn(Command::new(env!("CARGO_BIN_EXE_vlad")).args([
        "ota",
        "install",
        b_dir.to_str().unwrap(),
        "--config",
        cfg,
    ]));
    let during = wait_for_chunks("with the store locked by an installer", 3, &mut read_new);
    let healthy_before_release = state_healthy(&root);
    drop(installer);
    let (status, out, err) = install.finish();
    assert!(status.success(), "the queued install failed: {out}{err}");
    wait_while_running("the trial's counts in the store", &both, || {
        state_healthy(&root) > healthy_before_release
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for child in [&robot, &daemon] {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
    }
    let _ = robot.finish();
    let (_, _, log) = daemon.finish();
    println!(
        "{} chunks landed while the store was locked; healthy inferences recorded {}",
        during.len(),
        state_healthy(&root)
    );
    assert!(!log.contains("cannot record the trial's progress"), "{log}");
    let _ = std::fs::remove_file(&act_path);
    let _ = std::fs::remove_file(v["rings"]["observation_path"].as_str().unwrap());
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The healthy-inference count in the store's state file (0 if none yet).
fn state_healthy(root: &Path) -> u64 {
    std::fs::read(root.join("ota-state.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["healthy_inferences"].as_u64())
        .unwrap_or(0)
}

/// `vlad ota verdict --wait` is keyed on the daemon's progress, not on a guess of the
/// machine's speed: it waits for as long as the daemon named in the pid file is alive and
/// has not yet gated the bundle (however long loading and gating take), then for SECS plus
/// twice the gate's inference time, and ends SECS after the daemon is gone. The daemon is
/// a stand-in (`sleep` run under the name `vlad`, so its `comm` is the daemon's); no QNN.
/// Only lower bounds on time are asserted, and a bound that only ends a hang.
#[test]
fn the_verdict_wait_follows_the_daemon_named_in_the_pid_file() {
    let store = OtaScratch::new("vlad-ota-wait");
    let config = write_config(&store.tmp, &store.config());
    let OtaScratch { tmp, root, key, .. } = store;
    let cfg = config.to_str().unwrap();
    let a = signed_install(&tmp, &key, cfg, "bundle-a", "1.0.0");
    vlad_ok(&["ota", "activate", &a, "--config", cfg]);
    let pid_file = root.join("vlad.pid");
    let verdict = |secs: &str| {
        Drained::spawn(
            Command::new(env!("CARGO_BIN_EXE_vlad"))
                .args(["ota", "verdict", &a, "--config", cfg, "--wait", secs]),
        )
    };
    // Ends a hang of the command under test; no assertion depends on its length.
    let finish = |mut w: Drained| {
        let end = Instant::now() + HANG_GUARD;
        while w.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < end, "vlad ota verdict --wait hangs");
            std::thread::sleep(Duration::from_millis(50));
        }
        let (status, out, err) = w.finish();
        (status.code(), out + &err)
    };

    // No daemon has started: the wait is SECS.
    let (code, out) = finish(verdict("0.3"));
    assert_eq!(code, Some(4), "{out}");
    assert!(out.contains("no daemon runs on"), "{out}");

    // A live daemon that is still loading or gating: the wait goes on past SECS.
    let sleep = ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("no sleep binary");
    let fake = tmp.join("vlad");
    std::os::unix::fs::symlink(sleep, &fake).unwrap();
    let mut daemon = Command::new(&fake).arg("600").spawn().unwrap();
    std::fs::write(&pid_file, format!("{}\n", daemon.id())).unwrap();
    let mut waiting = verdict("0.3");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        waiting.child.try_wait().unwrap().is_none(),
        "the wait ended while the daemon was alive and had not gated the bundle"
    );

    // The daemon has gated the bundle, an inference takes 1 s here: the wait ends SECS
    // plus 2 s later at the earliest, saying the bundle runs but no inference came.
    let gated = Instant::now();
    std::fs::write(
        &pid_file,
        format!("{} - - {a} {}\n", daemon.id(), 1_000_000_000u64),
    )
    .unwrap();
    let (code, out) = finish(waiting);
    assert_eq!(code, Some(4), "{out}");
    assert!(
        gated.elapsed() >= Duration::from_millis(2300),
        "ended {:?} after the gate",
        gated.elapsed()
    );
    assert!(
        out.contains("passed its gate and runs it") && out.contains("robot"),
        "{out}"
    );

    // The daemon is gone (its pid file left behind, as after a crash): SECS.
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let (code, out) = finish(verdict("0.3"));
    assert_eq!(code, Some(4), "{out}");
    assert!(
        out.contains("the daemon is gone") && out.contains("not running"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Attacks on a running `vlad run` by the robot's group and by the daemon's own user:
/// - the robot's user (group vla-robot) opens the action ring for writing: EACCES, and
///   cannot shrink it either; it may shrink the observation ring, and vlad holds, stays up
///   and counts no trial start; the action ring shrunk by its owner does not kill vlad;
/// - a bundle signed by a key the daemon does not trust, installed and activated with
///   `--trusted-key` (SIGHUP): the daemon's reload refuses it and keeps the committed one;
/// - a byte of a context binary flipped after installation: the CLI's activation refuses
///   it, and a `current` link pointed at it by hand is refused at the daemon's reload.
///
/// The ring files are made as tmpfiles.d makes them on the device; the robot's user is an
/// unprivileged uid with the robot's group, so the test needs root to switch to it.
#[test]
fn local_attacks_on_a_running_daemon_leave_it_holding_or_driving_the_trusted_bundle() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    use vla_ring::{Action, ActionStatus, Geometry, RingReader};
    if !qnn() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("VLA_REQUIRE_ALL_TESTS").as_deref() != Ok("1"),
            "needs root to act as the robot's user (VLA_REQUIRE_ALL_TESTS=1)"
        );
        eprintln!("skipped: needs root to act as the robot's user");
        return;
    }
    const ROBOT_UID: u32 = 64_321;
    const ROBOT_GID: u32 = 64_322;
    let pid = std::process::id();
    let store = OtaScratch::new("vlad-attacks");
    let mut v = store.config();
    let OtaScratch { tmp, root, key, .. } = store;
    let obs_path = format!("/dev/shm/vlad-attacks-{pid}-obs");
    let act_path = format!("/dev/shm/vlad-attacks-{pid}-act");
    // As vla-tmpfiles.conf makes them: obs 0660 and act 0640, group the robot's.
    for (path, mode) in [(&obs_path, 0o660), (&act_path, 0o640)] {
        std::fs::write(path, b"").unwrap();
        std::os::unix::fs::chown(path, Some(0), Some(ROBOT_GID)).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    v["ota"]["trial_inferences"] = 1.into();
    v["rings"]["observation_path"] = obs_path.clone().into();
    v["rings"]["action_path"] = act_path.clone().into();
    v["control"]["publish_hz"] = 10.into();
    v["log"]["level"] = "info".into();
    let config = write_config(&tmp, &v);
    let cfg = config.to_str().unwrap();
    let a = signed_install(&tmp, &key, cfg, "bundle-a", "1.0.0");
    vlad_ok(&["ota", "activate", &a, "--config", cfg]);

    let mut daemon =
        Drained::spawn(Command::new(env!("CARGO_BIN_EXE_vlad")).args(["run", "--config", cfg]));
    let robot = Drained::spawn(Command::new(env!("CARGO_BIN_EXE_vlad")).args([
        "simulate",
        "--config",
        cfg,
        "--duration",
        &HANG_GUARD.as_secs().to_string(),
    ]));
    let committed = vlad(&["ota", "verdict", &a, "--config", cfg, "--wait", "30"]);
    assert!(
        committed.status.success(),
        "{}",
        String::from_utf8_lossy(&committed.stderr)
    );
    let state = || std::fs::read_to_string(root.join("ota-state.json")).unwrap();
    let state_before = state();
    let g = Geometry {
        cameras: 0,
        height: 0,
        width: 0,
        channels: 3,
        state_dims: 0,
        action_dims: 7,
        chunk_len: 32,
    };
    let ring = RingReader::<Action>::open(&act_path, g).unwrap();
    let mut buf = Action::for_geometry(&g);
    let latest_status = |buf: &mut Action| ring.read_latest(buf).ok().map(|_| buf.status);
    wait_while_running("an ok action", &[daemon.id(), robot.id()], || {
        latest_status(&mut buf) == Some(ActionStatus::Ok)
    })
    .unwrap_or_else(|e| panic!("{e}"));

    // What the robot's user may do, with the shell's own open and truncate.
    let as_robot = |script: &str, path: &str| {
        Command::new("sh")
            .args(["-c", script, "sh", path])
            .uid(ROBOT_UID)
            .gid(ROBOT_GID)
            .output()
            .unwrap()
    };
    let denied = |o: &Output| {
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("Permission denied")
    };
    let open_rw = r#"exec 3<>"$1""#;
    let shrink = r#"truncate -s 0 "$1""#;
    let act_rw = as_robot(open_rw, &act_path);
    assert!(
        denied(&act_rw),
        "the robot opened the action ring for writing: {act_rw:?}"
    );
    let act_cut = as_robot(shrink, &act_path);
    assert!(
        denied(&act_cut),
        "the robot shrank the action ring: {act_cut:?}"
    );
    let obs_rw = as_robot(open_rw, &obs_path);
    assert!(
        obs_rw.status.success(),
        "the robot must write observations: {obs_rw:?}"
    );

    // The robot's group shrinks the observation ring: no new observation, vlad holds.
    let obs_cut = as_robot(shrink, &obs_path);
    assert!(obs_cut.status.success(), "{obs_cut:?}");
    let held = wait_while_running(
        "a hold after the observation ring shrank",
        &[daemon.id()],
        || latest_status(&mut buf) == Some(ActionStatus::Hold),
    );
    if let Err(e) = held {
        drop(robot);
        let (status, _, log) = daemon.finish();
        panic!("{e}: vlad {status:?}:\n{log}");
    }
    // The action ring shrunk by its owner (vlad's user): vlad publishes into the void.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&act_path)
        .unwrap()
        .set_len(0)
        .unwrap();
    drop(ring);
    // An observation window, not a bound: a daemon killed by SIGBUS shows here.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "vlad died after the rings were shrunk"
    );
    assert_eq!(
        state(),
        state_before,
        "no trial start, nothing changed in the store"
    );

    // A bundle signed by a key the daemon does not trust, put on with --trusted-key.
    let rogue = tmp.join("rogue.key");
    let rogue_public = hash_in(&vlad_ok(&["bundle", "keygen", rogue.to_str().unwrap()]));
    // With the configuration, --trusted-key may only narrow what it trusts.
    let widen = vlad(&[
        "ota",
        "status",
        "--config",
        cfg,
        "--trusted-key",
        &rogue_public,
    ]);
    assert_eq!(widen.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&widen.stderr).contains("may only narrow"));
    let root_arg = root.to_str().unwrap();
    let b_dir = tmp.join("bundle-b");
    copy_dir(&tmp.join("bundle-a"), &b_dir);
    let p = b_dir.join("bundle.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    m["version"] = "1.1.0".into();
    std::fs::write(&p, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    vlad_ok(&["bundle", "pack", b_dir.to_str().unwrap()]);
    vlad_ok(&[
        "bundle",
        "sign",
        b_dir.to_str().unwrap(),
        "--key",
        rogue.to_str().unwrap(),
    ]);
    let b = hash_in(&vlad_ok(&[
        "ota",
        "install",
        b_dir.to_str().unwrap(),
        "--root",
        root_arg,
        "--trusted-key",
        &rogue_public,
    ]));
    let refused = vlad(&[
        "ota",
        "activate",
        &b,
        "--root",
        root_arg,
        "--trusted-key",
        &rogue_public,
        "--wait",
        "30",
    ]);
    let refusal = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(3), "{refusal}");
    assert!(
        refusal.contains(&format!("rolled {b} back to {a}")),
        "{refusal}"
    );
    // The state says so first; the link follows it.
    wait_while_running("the link back to A", &[daemon.id()], || {
        current_target(&root).ends_with(&a)
    })
    .unwrap_or_else(|e| panic!("{e}"));

    // A byte of a context binary flipped after the install verified it.
    let c = signed_install(&tmp, &key, cfg, "bundle-c", "1.2.0");
    let bin = root
        .join("bundles")
        .join(&c)
        .join("ctx/action_step_socid77_archv73.bin");
    let mut bytes = std::fs::read(&bin).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&bin, &bytes).unwrap();
    let flipped = vlad(&["ota", "activate", &c, "--config", cfg]);
    assert_eq!(flipped.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&flipped.stderr).contains("SHA-256"));
    assert!(current_target(&root).ends_with(&a));
    // Past the CLI: `current` pointed at it by hand, then SIGHUP. The daemon verifies.
    let link = root.join(".current-attack");
    std::os::unix::fs::symlink(Path::new("bundles").join(&c), &link).unwrap();
    std::fs::rename(&link, root.join("current")).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_while_running(
        "the daemon's refusal of the flipped bundle",
        &[daemon.id()],
        || {
            daemon
                .stderr_so_far()
                .contains(&format!("bundle {c} rejected"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}:\n{}", daemon.stderr_so_far()));
    // The refusal and the rollback that follows it leave the daemon running.
    std::thread::sleep(Duration::from_secs(3));
    let alive = daemon.child.try_wait().unwrap().is_none();
    drop(robot);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (_, _, log) = daemon.finish();
    let log: String = log
        .lines()
        .filter(|l| !l.contains(" qnn]"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        alive,
        "vlad keeps running after the refused reloads:\n{log}"
    );
    for (hash, what) in [(&b, "untrusted key"), (&c, "flipped byte")] {
        assert!(
            log.contains(&format!("bundle {hash} rejected"))
                && log.contains("does not verify with this daemon's keys"),
            "the {what} bundle was not refused at the daemon's own verification:\n{log}"
        );
        assert!(
            !log.contains(&format!("reloaded: bundle {hash}")),
            "the {what} bundle was loaded:\n{log}"
        );
    }
    let _ = std::fs::remove_file(&act_path);
    let _ = std::fs::remove_file(&obs_path);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A configuration that trusts a key whose secret is published (RFC 8032's first test
/// vector) stops vlad at start, before anything is loaded, and so does `--trusted-key`
/// with such a key on the OTA commands. No QNN needed: nothing gets that far.
#[test]
fn a_published_key_is_refused_at_start_and_on_the_command_line() {
    const RFC8032_TEST_1: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    let tmp = std::env::temp_dir().join(format!("vlad-published-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo_root().join("config/dev.json")).unwrap())
            .unwrap();
    v["ota"]["trusted_keys"] = serde_json::json!([RFC8032_TEST_1]);
    let config = write_config(&tmp, &v);
    let run = vlad(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--duration",
        "1",
    ]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(
        err.contains("secret key is published") && err.contains("RFC 8032"),
        "{err}"
    );
    let root = tmp.join("ota");
    let cli = vlad(&[
        "ota",
        "status",
        "--root",
        root.to_str().unwrap(),
        "--trusted-key",
        RFC8032_TEST_1,
    ]);
    assert_eq!(cli.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&cli.stderr).contains("secret key is published"));
    let _ = std::fs::remove_dir_all(&tmp);
}
