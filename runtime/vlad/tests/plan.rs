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
    // The report: 20 Hz, chunk_rate_hz 4, max_chunk_age_ms 1500, 1.5 s, H = 10.
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
