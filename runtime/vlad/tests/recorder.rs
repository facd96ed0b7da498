//! The flight recorder and the metrics textfile in `vlad run`, on the QNN emulator with
//! `vlad simulate` as the robot: SIGUSR1 writes a recording that is a valid, complete
//! MCAP file, `vlad replay` reproduces it on the same bundle and fails (exit 3) on
//! another, and the textfile carries the loop's counters.

mod common;

use common::qnn_dir;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use vla_test_support::repo_root;

fn bundle(name: &str) -> String {
    repo_root()
        .join("golden/bundles")
        .join(name)
        .to_str()
        .unwrap()
        .to_owned()
}

fn vlad(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vlad"));
    c.args(args);
    c
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l[name.len() + 1..].trim().parse().ok())
}

#[test]
fn sigusr1_records_a_replayable_mcap_and_the_textfile_carries_the_counters() {
    let Some(_) = qnn_dir() else { return };
    let dir = std::env::temp_dir().join(format!("vlad-recorder-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let recordings = dir.join("recordings");
    let textfile = dir.join("vlad.prom");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo_root().join("config/dev.json")).unwrap())
            .unwrap();
    v["bundle"]["path"] = bundle("fastwam").into();
    let tag = std::process::id();
    v["rings"]["observation_path"] = format!("/dev/shm/vlad-rec-{tag}-obs").into();
    v["rings"]["action_path"] = format!("/dev/shm/vlad-rec-{tag}-act").into();
    v["control"]["publish_hz"] = 20.0.into();
    v["control"]["max_chunk_age_ms"] = 60000.into();
    v["control"]["max_observation_age_ms"] = 5000.into();
    v["control"]["action_valid_ms"] = 1000.into();
    v["control"]["writer_heartbeat_timeout_ms"] = 2000.into();
    v["log"]["level"] = "info".into();
    v["recorder"] = serde_json::json!({
        "directory": recordings.to_str().unwrap(), "history_s": 30, "frames": "full",
        "max_chunks": 32, "hold_limit_ms": 0
    });
    v["metrics"] = serde_json::json!({"textfile": textfile.to_str().unwrap(), "interval_ms": 200});
    let config = dir.join("config.json");
    std::fs::write(&config, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let cfg = config.to_str().unwrap();

    // The daemon and the robot run until this test stops them; each wait below lasts
    // while both run, however slowly this machine gates and infers.
    let daemon = vlad(&["run", "--config", cfg])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(daemon.id() as i32);
    let mut sim: Child = vlad(&[
        "simulate",
        "--config",
        cfg,
        "--duration",
        &common::HANG_GUARD.as_secs().to_string(),
        "--camera-hz",
        "20",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let read_metrics = || std::fs::read_to_string(&textfile).unwrap_or_default();
    // A few chunks and enough ticks published (the history must hold >= 20 actions
    // however fast this machine runs inferences), then ask for a recording.
    let both = [daemon.id(), sim.id()];
    if let Err(e) = common::wait_while_running("5 inferences and 60 ticks", &both, || {
        let m = read_metrics();
        metric(&m, "vlad_inferences_total").is_some_and(|n| n >= 5.0)
            && metric(&m, "vlad_ticks_total").is_some_and(|n| n >= 60.0)
    }) {
        panic!("{e}: {}", read_metrics());
    }
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1).unwrap();
    let found = || -> Vec<PathBuf> {
        std::fs::read_dir(&recordings)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    common::wait_while_running("a recording", &both, || !found().is_empty())
        .unwrap_or_else(|e| panic!("{e}"));
    let text = read_metrics();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let _ = sim.kill();
    let _ = sim.wait();
    let out = daemon.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");

    // The file landed under its final name (no temporary left) and reads back complete.
    let files = found();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("vlad-") && name.ends_with("-signal.mcap"),
        "{name}"
    );
    let rec = vla_recorder::read_recording(file).unwrap();
    assert_eq!(rec.metadata["trigger"], "signal");
    assert_eq!(rec.metadata["bundle_name"], "fastwam-libero-tiny");
    // The DSP memory plan the bundle was loaded under: one session on NSP 0.
    assert!(
        rec.metadata["dsp_memory_plan"].starts_with("s0 nsp0 [action_step] "),
        "{:?}",
        rec.metadata.get("dsp_memory_plan")
    );
    assert_eq!(rec.metadata["dropped_ticks"], "0");
    assert_eq!(rec.metadata["dropped_chunks"], "0");
    // No libcdsprpc.so here: `auto` resolved to client buffers, and the recording says so.
    assert_eq!(rec.metadata["npu_io"], "client");
    assert!(
        rec.metadata["npu_io_detail"]
            .starts_with("NPU I/O in client buffers (npu.shared_buffers is auto"),
        "{}",
        rec.metadata["npu_io_detail"]
    );
    assert!(rec.chunks.len() >= 5, "{} chunks", rec.chunks.len());
    assert!(rec.actions >= 20, "{} actions", rec.actions);
    assert!(
        rec.decisions.get("step").copied().unwrap_or(0) > 0,
        "{:?}",
        rec.decisions
    );
    // The simulator writes the bundle's golden observation frames: recorded as written.
    let source = vla_policy::ObservationFile::load(Path::new(&format!(
        "{}/golden/end_to_end.npz",
        bundle("fastwam")
    )))
    .unwrap();
    for c in &rec.chunks {
        assert!(c.ok);
        assert_eq!(c.actions.len(), 32 * 7);
        assert!(
            c.frames == source.frames,
            "chunk {}: frames differ",
            c.chunk_id
        );
    }
    eprintln!(
        "recording {} bytes, {} chunks, {} actions",
        std::fs::metadata(file).unwrap().len(),
        rec.chunks.len(),
        rec.actions
    );

    // The textfile: counters from the loop, the bundle, the recording.
    assert!(metric(&text, "vlad_ticks_total").unwrap() > 0.0, "{text}");
    assert!(
        text.contains("vlad_bundle_info{name=\"fastwam-libero-tiny\",version=\"0.1.0\",hash=\"")
    );
    assert_eq!(metric(&text, "vlad_parity_passed"), Some(1.0));
    assert!(
        text.contains("vlad_dsp_session_bytes{session=\"0\",nsp=\"0\",contexts=\"action_step\"} "),
        "{text}"
    );
    assert_eq!(
        metric(&text, "vlad_dsp_session_budget_bytes"),
        Some((3840.0 - 256.0) * 1048576.0)
    );
    assert!(text.contains("vlad_ota_state{state=\"none\"} 1"));
    assert!(text.contains("vlad_npu_io{io=\"client\"} 1"), "{text}");
    assert!(text.contains("vlad_npu_io{io=\"shared\"} 0"), "{text}");

    // Replay: the same bundle reproduces every chunk; another one does not (exit 3).
    let same = vlad(&["replay", file.to_str().unwrap()]).output().unwrap();
    let same_out = String::from_utf8_lossy(&same.stdout);
    assert!(
        same.status.success(),
        "{same_out}{}",
        String::from_utf8_lossy(&same.stderr)
    );
    assert!(same_out.contains(" 0 differ"), "{same_out}");
    let summary = same_out
        .lines()
        .find(|l| l.contains("chunks compared"))
        .unwrap_or("");
    assert!(summary.contains("worst cosine 1.000000"), "{same_out}");
    eprintln!("{summary}");
    let other = vlad(&[
        "replay",
        file.to_str().unwrap(),
        "--bundle",
        &bundle("fastwam-closed-loop"),
    ])
    .output()
    .unwrap();
    assert_eq!(
        other.status.code(),
        Some(3),
        "{}{}",
        String::from_utf8_lossy(&other.stdout),
        String::from_utf8_lossy(&other.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
