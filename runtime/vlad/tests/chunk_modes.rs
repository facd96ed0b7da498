//! Chunk execution through the daemon on the HTP emulator (Fast-WAM fixture, 20 Hz):
//! the operating point at READY and the loud warning when `d >= H`, and every merge
//! mode driving the moving simulator with real actions (figures printed, not gated:
//! the sweep in `scripts/bench.sh` compares them), the slower time base publishing
//! its steps and the interpolated values between them, the operating point's expected
//! hold against what the robot measured, and the synchronous trigger.

mod common;

use common::{notified, qnn, wait_while_running, Drained};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use vla_test_support::repo_root;

fn config(dir: &Path, tag: &str, merge: &str, extra_ms: u32) -> PathBuf {
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo_root().join("config/dev.json")).unwrap())
            .unwrap();
    v["bundle"]["path"] = repo_root()
        .join("golden/bundles/fastwam")
        .to_str()
        .unwrap()
        .into();
    let pid = std::process::id();
    v["rings"]["observation_path"] = format!("/dev/shm/vlad-chunks-{pid}-{tag}-obs").into();
    v["rings"]["action_path"] = format!("/dev/shm/vlad-chunks-{pid}-{tag}-act").into();
    let c = &mut v["control"];
    c["publish_hz"] = 20.0.into();
    c["max_observation_age_ms"] = 1000.into();
    c["max_chunk_age_ms"] = 10000.into();
    c["action_valid_ms"] = 200.into();
    c["writer_heartbeat_timeout_ms"] = 1000.into();
    c["merge"] = merge.into();
    c["extra_latency_ms"] = extra_ms.into();
    v["systemd"]["notify"] = true.into();
    v["log"]["level"] = "info".into();
    let p = dir.join(format!("{tag}.json"));
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    p
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vlad-chunks-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the daemon on `config` and, once it is READY (however long it takes to gate
/// here), `vlad simulate` (6 s, camera at 30 Hz, plus `extra` arguments) against it, then
/// stops the daemon: the simulator's output and the daemon's stderr.
fn drive(config: &Path, extra: &[&str]) -> (std::process::Output, String) {
    let (sim, _, err) = drive_for(config, 6, extra);
    (sim, err)
}

/// [`drive`] for `seconds` of simulation: also the daemon's stdout (its end-of-run report).
fn drive_for(
    config: &Path,
    seconds: u32,
    extra: &[&str],
) -> (std::process::Output, String, String) {
    let sock_path = config.with_extension("notify.sock");
    let _ = std::fs::remove_file(&sock_path);
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let daemon = Drained::spawn(
        Command::new(env!("CARGO_BIN_EXE_vlad"))
            .args(["run", "--config", config.to_str().unwrap()])
            .env("NOTIFY_SOCKET", &sock_path),
    );
    if let Err(e) = notified(&sock, daemon.id(), "READY=1") {
        let (_, _, err) = daemon.finish();
        panic!("{e}\n{err}");
    }
    let sim = Command::new(env!("CARGO_BIN_EXE_vlad"))
        .args(["simulate", "--config", config.to_str().unwrap()])
        .args(["--duration", &seconds.to_string(), "--camera-hz", "30"])
        .args(extra)
        .output()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (_, out, err) = daemon.finish();
    (sim, out, err)
}

/// The `expected hold N%` of an operating point line, as a share.
fn expected_hold(line: &str) -> f64 {
    let n = line
        .split("expected hold ")
        .nth(1)
        .and_then(|rest| rest.split('%').next())
        .unwrap_or_else(|| panic!("no expected hold in {line:?}"));
    n.parse::<f64>().unwrap() / 100.0
}

/// The operating point's expected hold against what the simulated robot saw, in cells
/// whose outcome is not near a boundary: the schedule holding about 60% (1.2 s
/// at 20 Hz, H = 32), `max_chunk_age_ms` refusing about 60% of the ticks on the slower time
/// base, and a continuous cell on it. The prediction compared is the one the daemon prints at the
/// end of the run, from the latency spread and observation period it measured: the
/// emulator's latency moves with the machine's load, which the READY line (from the gate's
/// one inference) cannot know; the READY line is compared in the sweep
/// (docs/benchmarks.md). Margin: 0.2 of the ticks, the sweep's largest disagreement
/// between the end-of-run prediction and the measurement on a heavily loaded machine (18
/// points, a 10 s cell of about 8 cycles at 1.2 s).
#[test]
fn the_expected_hold_matches_what_the_robot_measures() {
    if !qnn() {
        return;
    }
    let dir = scratch("predict");
    struct Cell {
        tag: &'static str,
        extra_ms: u32,
        chunk_rate_hz: Option<f64>,
        max_chunk_age_ms: u32,
        limit: Option<&'static str>,
    }
    let cells = [
        Cell {
            tag: "schedule",
            extra_ms: 1050,
            chunk_rate_hz: None,
            max_chunk_age_ms: 10000,
            limit: Some("held by the schedule"),
        },
        Cell {
            tag: "chunk-age",
            extra_ms: 550,
            chunk_rate_hz: Some(10.0),
            max_chunk_age_ms: 1000,
            limit: Some("held by control.max_chunk_age_ms 1000"),
        },
        Cell {
            // 200 ms steps: rows for 6.4 s, continuous up to about 3 s of latency however
            // busy the machine.
            tag: "continuous",
            extra_ms: 0,
            chunk_rate_hz: Some(5.0),
            max_chunk_age_ms: 10000,
            limit: None,
        },
    ];
    for cell in cells {
        let cfg = config(&dir, cell.tag, "skip", cell.extra_ms);
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
        v["control"]["max_chunk_age_ms"] = cell.max_chunk_age_ms.into();
        v["control"]["hold_after_chunk_end_ms"] = 100.into();
        if let Some(hz) = cell.chunk_rate_hz {
            v["control"]["chunk_rate_hz"] = hz.into();
        }
        std::fs::write(&cfg, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
        let report = dir.join(format!("{}.sim.json", cell.tag));
        let (sim, out, err) = drive_for(&cfg, 10, &["--json", report.to_str().unwrap()]);
        assert!(
            sim.status.success(),
            "{}: {}",
            cell.tag,
            String::from_utf8_lossy(&sim.stdout)
        );
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        // From the first ok action on; a run with none (every chunk refused: a busy
        // machine can push the age-limited cell there) is all hold, as the sweep counts it.
        let measured = if r["ok_applied"].as_u64().unwrap() > 0 {
            r["hold_share_since_first_ok"].as_f64().unwrap()
        } else {
            r["hold_share"].as_f64().unwrap()
        };
        let run_line = out
            .lines()
            .find(|l| l.contains("operating point"))
            .unwrap_or_else(|| panic!("{}: no operating point in the report: {out}", cell.tag));
        let ready_line = err
            .lines()
            .find(|l| l.contains("operating point"))
            .unwrap_or_default();
        let predicted = expected_hold(run_line);
        eprintln!(
            "{}: measured hold {measured:.3}, predicted {predicted:.2} at the end of the run              (READY: {:.2}); {run_line}",
            cell.tag,
            if ready_line.is_empty() {
                f64::NAN
            } else {
                expected_hold(ready_line)
            }
        );
        assert!(
            (predicted - measured).abs() <= 0.2,
            "{}: predicted {predicted:.2}, measured {measured:.3}: {run_line}",
            cell.tag
        );
        match cell.limit {
            Some(limit) => assert!(run_line.contains(limit), "{}: {run_line}", cell.tag),
            None => assert!(!run_line.contains("held by"), "{}: {run_line}", cell.tag),
        }
        cleanup(&cfg);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn cleanup(config: &Path) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(config).unwrap()).unwrap();
    for k in ["observation_path", "action_path"] {
        let _ = std::fs::remove_file(v["rings"][k].as_str().unwrap());
    }
}

#[test]
fn a_latency_beyond_the_horizon_warns_at_start_up_and_ready_states_the_operating_point() {
    if !qnn() {
        return;
    }
    let dir = scratch("warn");
    // ~150 ms of emulator + 1700 ms: d = 37 or more 50 ms steps against H = 32.
    let cfg = config(&dir, "warn", "skip", 1700);
    let sock_path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let daemon = Drained::spawn(
        Command::new(env!("CARGO_BIN_EXE_vlad"))
            .args(["run", "--config", cfg.to_str().unwrap(), "--duration", "1"])
            .env("NOTIFY_SOCKET", &sock_path),
    );
    let ready = notified(&sock, daemon.id(), "READY=1").unwrap_or_else(|e| e);
    let (_, _, err) = daemon.finish();
    assert!(
        ready.contains("operating point: latency p95") && ready.contains("of H 32 steps"),
        "READY: {ready:?}"
    );
    assert!(ready.contains("expected hold 100%"), "{ready:?}");
    let warning = err
        .lines()
        .find(|l| l.contains("WARNING: d >= H"))
        .unwrap_or_else(|| panic!("no start-up warning: {err}"));
    assert!(warning.contains("WARN"), "logged as a warning: {warning}");
    cleanup(&cfg);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_merge_mode_moves_the_simulated_arm_with_real_actions() {
    if !qnn() {
        return;
    }
    let dir = scratch("modes");
    for merge in ["skip", "crossfade", "prefix", "inpaint"] {
        let cfg = config(&dir, merge, merge, 150);
        // Chunk steps at 5 Hz (the slower time base, interpolated to the 20 Hz ticks):
        // a chunk then spans 6.4 s, so a loaded machine's slower inference still leaves
        // rows to play (the bound below).
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
        v["control"]["chunk_rate_hz"] = 5.0.into();
        std::fs::write(&cfg, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
        let report = dir.join(format!("{merge}.sim.json"));
        let (sim, _, err) = drive_for(&cfg, 12, &["--json", report.to_str().unwrap()]);
        let out = String::from_utf8_lossy(&sim.stdout);
        assert!(sim.status.success(), "{merge}: {out}");
        assert!(err.contains(&format!("merge {merge}")), "{merge}: {err}");
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        // A true timing requirement (class T in docs/testing.md), not a wait: the robot
        // runs 12 s (240 ticks at 20 Hz) after READY, and a 32-step chunk at 5 Hz (6.4 s)
        // that lands after L (its latency, the 150 ms injected included) plays 6.4 - L s
        // of ok ticks before it runs out, while the next lands L later: an ok share of
        // min(1, (6.4 - L) / L) of the ticks. More than 20 of 240 (what "moves the arm with
        // real actions" needs over a few chunks) therefore needs L < 6.4 / (1 + 1/12) =
        // 5.9 s, and two chunks (a seam) in 12 s need L below about 6 s: more than ten
        // times the emulator's quiet latency here (~0.5 s plus the injection); at 20 Hz
        // steps the bound was 1.37 s, which a machine at load 30 exceeded (3.4 s). No longer
        // robot run helps a slower machine (the share does not grow with time), so the
        // failure names the daemon's own measured operating point.
        let ok = r["ok_applied"].as_u64().unwrap();
        let point = err
            .lines()
            .rev()
            .find(|l| l.contains("operating point"))
            .unwrap_or("(no operating point line)");
        assert!(
            ok > 20,
            "{merge}: {ok} ok of ~240 ticks; needs an inference below ~5.9 s, the daemon \
             measured: {point}\n{out}"
        );
        assert_eq!(r["all_zero_applied"], 0, "{merge}");
        assert!(
            r["motion"]["seams"].as_u64().unwrap() > 0,
            "{merge}: chunks follow one another"
        );
        assert!(
            r["motion"]["path_length"].as_f64().unwrap() > 0.0,
            "{merge}: the arm moved"
        );
        eprintln!(
            "{merge}: hold {:.3} since the first ok, seam jump max {:.3} mean {:.3}, inside max {:.3}",
            r["hold_share_since_first_ok"], r["motion"]["seam_jump_max"],
            r["motion"]["seam_jump_mean"], r["motion"]["inside_jump_max"]
        );
        cleanup(&cfg);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_slower_time_base_publishes_the_steps_and_their_midpoints() {
    if !qnn() {
        return;
    }
    let dir = scratch("slow");
    let cfg = config(&dir, "slow", "skip", 150);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    // 20 Hz publishing, chunk steps at 10 Hz: every other tick falls half way.
    v["control"]["chunk_rate_hz"] = 10.0.into();
    std::fs::write(&cfg, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let timeline = dir.join("slow.csv");
    let (sim, err) = drive(&cfg, &["--timeline", timeline.to_str().unwrap()]);
    assert!(
        sim.status.success(),
        "{}",
        String::from_utf8_lossy(&sim.stdout)
    );
    // t_s,status,chunk_id,step,v0..vN (the last dim is the binarized gripper: switched).
    let rows: Vec<(String, u64, u64, Vec<f64>)> = std::fs::read_to_string(&timeline)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let values: Vec<f64> = f[4..f.len() - 1]
                .iter()
                .map(|x| x.parse().unwrap())
                .collect();
            (
                f[1].to_owned(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                values,
            )
        })
        .collect();
    // Three ticks of one chunk where the first two share a step index: chunk positions
    // i, i + 0.5, i + 1, so the middle value is the mean of its neighbours.
    let mut midpoints = 0;
    for w in rows.windows(3) {
        let [(sa, ca, ka, a), (sb, cb, kb, b), (sc, cc, kc, c)] = w else {
            unreachable!()
        };
        let ok = [sa, sb, sc].iter().all(|s| *s == "ok");
        if ok && ca == cb && cb == cc && ka == kb && *kc == ka + 1 {
            for ((x, y), z) in a.iter().zip(b).zip(c) {
                assert!(
                    (y - (x + z) / 2.0).abs() <= 1e-4 * (1.0 + y.abs()),
                    "chunk {ca} step {ka}: {y} is not half way between {x} and {z}"
                );
            }
            midpoints += 1;
        }
    }
    assert!(
        midpoints >= 10,
        "only {midpoints} interpolated steps in {} actions; daemon: {err}",
        rows.len()
    );
    cleanup(&cfg);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Cpus_allowed_list` of each thread of `pid`, by thread name.
fn thread_affinities(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if let Some(cpus) = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        {
            out.push((comm.trim().to_owned(), cpus.trim().to_owned()));
        }
    }
    out
}

#[test]
fn the_helpers_the_inference_thread_waits_on_are_set_up_like_it() {
    if !qnn() {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = cpus - 1;
    let dir = scratch("helper");
    let cfg = config(&dir, "helper", "skip", 0);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    // MolmoAct2 runs its non-finite scans on a helper thread (`vla-guard`) and half of
    // the preprocess and prompt rows on another (`vla-fork`).
    v["bundle"]["path"] = repo_root()
        .join("golden/bundles/molmoact2-lp-vtp-sd")
        .to_str()
        .unwrap()
        .into();
    v["realtime"]["inference_cpus"] = serde_json::json!([cpu]);
    std::fs::write(&cfg, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let sock_path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let daemon = Drained::spawn(
        Command::new(env!("CARGO_BIN_EXE_vlad"))
            .args(["run", "--config", cfg.to_str().unwrap()])
            .env("NOTIFY_SOCKET", &sock_path),
    );
    let pid = nix::unistd::Pid::from_raw(daemon.id() as i32);
    // Until READY, while the daemon lives.
    let ready = notified(&sock, daemon.id(), "READY=1").is_ok();
    // A thread takes its name (and pins itself) once it runs, which can be just after
    // READY: read again, while the daemon lives, until every named thread is there and
    // the inference thread is pinned (the assertions below say what was missing).
    let named = ["vla-inference", "vla-guard", "vla-fork"];
    let mut threads = thread_affinities(daemon.id());
    let _ = wait_while_running("the named threads", &[daemon.id()], || {
        threads = thread_affinities(daemon.id());
        let pinned = threads
            .iter()
            .any(|(t, c)| t == "vla-inference" && *c == cpu.to_string());
        ready && pinned && named.iter().all(|n| threads.iter().any(|(t, _)| t == n))
    });
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let (_, _, err) = daemon.finish();
    assert!(ready, "no READY: {err}");
    let of = |name: &str| {
        threads
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.clone())
            .unwrap_or_else(|| panic!("no {name} thread in {threads:?}"))
    };
    assert_eq!(of("vla-inference"), cpu.to_string(), "{threads:?}");
    for helper in ["vla-guard", "vla-fork"] {
        assert_eq!(
            of(helper),
            of("vla-inference"),
            "{helper} is pinned as the inference thread: {threads:?}"
        );
    }
    cleanup(&cfg);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `trigger: synchronous` through the daemon (upstream's LIBERO eval protocol, Fast-WAM's
/// 10 of 32 rows): every chunk the simulated robot applies starts at its first row, plays
/// at most its 10 executed rows in order, and the robot holds between chunks while the
/// next inference runs.
#[test]
fn the_synchronous_trigger_executes_ten_rows_from_the_first_then_holds() {
    if !qnn() {
        return;
    }
    let dir = scratch("sync");
    let cfg = config(&dir, "sync", "skip", 100);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["control"]["trigger"] = "synchronous".into();
    v["control"]["execute_steps"] = 10.into();
    std::fs::write(&cfg, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let timeline = dir.join("sync.csv");
    let (sim, out, err) = drive_for(&cfg, 8, &["--timeline", timeline.to_str().unwrap()]);
    assert!(
        sim.status.success(),
        "{}",
        String::from_utf8_lossy(&sim.stdout)
    );
    assert!(
        err.contains("Synchronous"),
        "the daemon says which trigger: {err}"
    );
    // t_s,status,chunk_id,step,...
    let mut chunks: Vec<(u64, Vec<u64>)> = Vec::new();
    let mut holds_between = Vec::new();
    let mut holds = 0u32;
    for line in std::fs::read_to_string(&timeline).unwrap().lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[1] != "ok" {
            holds += 1;
            continue;
        }
        let (id, step): (u64, u64) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        if chunks.last().map(|c| c.0) != Some(id) {
            if !chunks.is_empty() {
                holds_between.push(holds);
            }
            chunks.push((id, Vec::new()));
        }
        chunks.last_mut().unwrap().1.push(step);
        holds = 0;
    }
    assert!(
        chunks.len() >= 3,
        "chunks applied: {chunks:?}; daemon: {out}"
    );
    for (id, steps) in &chunks {
        assert_eq!(steps[0], 0, "chunk {id} starts at its first row: {steps:?}");
        assert!(
            steps.windows(2).all(|w| w[0] < w[1]) && steps.iter().all(|&k| k < 10),
            "chunk {id}: rows 0..10 in order and nothing after: {steps:?}"
        );
    }
    assert!(
        holds_between.iter().sum::<u32>() as usize >= holds_between.len(),
        "the robot holds between chunks: {holds_between:?}"
    );
    assert!(
        out.contains("synchronous: the arm holds while each inference runs"),
        "{out}"
    );
    cleanup(&cfg);
    let _ = std::fs::remove_dir_all(&dir);
}
