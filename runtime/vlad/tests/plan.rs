//! `vlad plan`: the operating point of a config at stated latencies, and the device config
//! (config/vlad.json) consistent with the bundle the image ships: the MolmoAct2 bundle
//! (H = 10) at the NPU's expected 0.65 s moves continuously, no limit refusing its rows.

use std::process::{Command, Output};
use vla_test_support::repo_root;

fn plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vlad"))
        .arg("plan")
        .args(args)
        .output()
        .expect("run vlad plan")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn config(name: &str) -> String {
    repo_root().join("config").join(name).display().to_string()
}

#[test]
fn the_device_config_moves_the_shipped_molmoact2_bundle_continuously() {
    let bundle = repo_root().join("golden/bundles/molmoact2-upstream-drift-keystone");
    let o = plan(&[
        "--config",
        &config("vlad.json"),
        "--bundle",
        bundle.to_str().unwrap(),
        "--latency-ms",
        "650",
        "--observation-hz",
        "20",
    ]);
    let line = stdout(&o);
    assert!(
        o.status.success(),
        "{line}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(line.contains("of H 10 steps"), "{line}");
    assert!(line.contains("expected hold 0%"), "{line}");
    assert!(
        !line.contains("held by") && !line.contains("WARNING"),
        "{line}"
    );
}

#[test]
fn the_line_names_the_limit_that_holds_and_the_value_that_removes_it() {
    let dir = std::env::temp_dir().join(format!("vlad-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A reported case (READY said 33% hold, the robot measured 84%): 20 Hz, chunk_rate_hz 4,
    // max_chunk_age_ms 1500, 1.5 s, H = 10.
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(config("vlad.json")).unwrap()).unwrap();
    v["control"]["chunk_rate_hz"] = 4.0.into();
    let cfg = dir.join("age.json");
    std::fs::write(&cfg, serde_json::to_vec(&v).unwrap()).unwrap();
    let o = plan(&[
        "--config",
        cfg.to_str().unwrap(),
        "--horizon",
        "10",
        "--latency-ms",
        "1500",
    ]);
    let line = stdout(&o);
    assert!(o.status.success(), "{line}");
    assert!(line.contains("expected hold 100%"), "{line}");
    assert!(
        line.contains("held by control.max_chunk_age_ms 1500") && line.contains("raise it to 2600"),
        "{line}"
    );
    // Raised as it says: the age limit is gone, the schedule is what is left.
    v["control"]["max_chunk_age_ms"] = 2600.into();
    std::fs::write(&cfg, serde_json::to_vec(&v).unwrap()).unwrap();
    let o = plan(&[
        "--config",
        cfg.to_str().unwrap(),
        "--horizon",
        "10",
        "--latency-ms",
        "1500",
    ]);
    let line = stdout(&o);
    assert!(line.contains("expected hold 28%"), "{line}");
    assert!(line.contains("held by the schedule"), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_one_line_naming_it() {
    let cases: [(&[&str], i32, &str); 4] = [
        (
            &["--horizon", "10", "--latency-ms", "100"],
            2,
            "plan needs --config FILE",
        ),
        (
            &[
                "--config",
                "/nonexistent/vlad.json",
                "--horizon",
                "10",
                "--latency-ms",
                "100",
            ],
            1,
            "/nonexistent/vlad.json",
        ),
        (
            &[
                "--config",
                &config("vlad.json"),
                "--horizon",
                "0",
                "--latency-ms",
                "100",
            ],
            2,
            "--horizon H (H > 0)",
        ),
        (
            &[
                "--config",
                &config("vlad.json"),
                "--horizon",
                "10",
                "--latency-ms",
                "-3",
            ],
            2,
            "--latency-ms: expected a positive number, found -3",
        ),
    ];
    for (args, code, says) in cases {
        let o = plan(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

/// `config/vlad.json` with its `npu` section replaced by `npu` (JSON), in a fresh file.
fn config_with_npu(tag: &str, npu: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("vlad-plan-npu-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(config("vlad.json")).unwrap()).unwrap();
    v["npu"] = serde_json::from_str(npu).unwrap();
    let cfg = dir.join("npu.json");
    std::fs::write(&cfg, serde_json::to_vec(&v).unwrap()).unwrap();
    let path = cfg.display().to_string();
    (dir, path)
}

#[test]
fn the_memory_plan_of_every_golden_bundle_is_printed() {
    let root = repo_root().join("golden/bundles");
    let mut seen = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("bundle.json").is_file() {
            continue;
        }
        let o = plan(&["--bundle", dir.to_str().unwrap()]);
        let out = stdout(&o);
        assert!(
            o.status.success(),
            "{}: {out}{}",
            dir.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.contains("memory plan of bundle"), "{out}");
        assert!(out.contains("session 0 on NSP 0: "), "{out}");
        assert!(out.contains("action_step"), "{out}");
        // The fixtures are kilobytes: one session holds them all.
        assert!(!out.contains("session 1 on"), "{out}");
        seen += 1;
    }
    assert!(seen >= 10, "found {seen} bundles under {}", root.display());
}

#[test]
fn the_published_releases_need_four_sessions_across_both_nsps() {
    let sizes = repo_root().join("golden/releases/context-sizes.json");
    let o = plan(&["--sizes", sizes.to_str().unwrap()]);
    let out = stdout(&o);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for line in [
        "session 0 on NSP 0: vision + llm_split0 = 2802.9 MiB of 3584.0 MiB (78%)",
        "session 1 on NSP 1: llm_split1 = 1869.8 MiB of 3584.0 MiB",
        "session 2 on NSP 1: llm_split2 = 1869.8 MiB of 3584.0 MiB",
        "session 3 on NSP 0: llm_split3 + action_context + action_step = 3380.9 MiB of 3584.0 MiB (94%)",
        "session 0 on NSP 0: vision + llm_split0 = 2283.3 MiB of 3584.0 MiB",
        "session 0 on NSP 0: action_step = 2180.9 MiB of 3584.0 MiB",
    ] {
        assert!(out.contains(line), "missing `{line}` in:\n{out}");
    }
    assert_eq!(out.matches("memory plan of release").count(), 4, "{out}");
    // All seven in one session, as vlad loaded them before: refused with its sum.
    let (dir, cfg) = config_with_npu(
        "one",
        r#"{"placement": "groups", "groups": [{"nsp": 0, "contexts": ["vision", "llm_split0",
            "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step"]}]}"#,
    );
    let o = plan(&["--sizes", sizes.to_str().unwrap(), "--config", &cfg]);
    let out = stdout(&o);
    assert!(
        out.contains("placement refused: session 0 (NSP 0: vision + llm_split0 + llm_split1 + llm_split2 + llm_split3 + action_context + action_step) needs 9923.2 MiB, over the per-session budget of 3584.0 MiB"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_placement_that_cannot_fit_is_refused_in_one_line() {
    let bundle = repo_root().join("golden/bundles/molmoact2-original");
    let all = r#"["vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step"]"#;
    let cases = [
        (
            format!(r#"{{"placement": "groups", "session_mb": 2, "reserve_mb": 1, "groups": [{{"nsp": 0, "contexts": {all}}}]}}"#),
            "over the per-session budget of 1.0 MiB",
        ),
        (
            r#"{"placement": "groups", "groups": [{"nsp": 0, "contexts": ["vision", "llm_spilt0"]}]}"#.to_string(),
            "session 0 names context `llm_spilt0`, which is not one of vision, llm_split0",
        ),
        (
            format!(r#"{{"placement": "groups", "groups": [{{"nsp": 2, "contexts": {all}}}]}}"#),
            "session 0 is on NSP 2, but the platform has 2 (ids 0..1)",
        ),
        (
            r#"{"placement": "groups", "groups": [{"nsp": 1, "contexts": ["vision"]}]}"#.to_string(),
            "context `llm_split0` is in no session of the placement",
        ),
    ];
    for (i, (npu, says)) in cases.iter().enumerate() {
        let (dir, cfg) = config_with_npu(&format!("bad{i}"), npu);
        let o = plan(&["--bundle", bundle.to_str().unwrap(), "--config", &cfg]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{npu}: {err}");
        assert!(err.contains("placement refused: "), "{err}");
        assert!(err.contains(says), "{npu}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
