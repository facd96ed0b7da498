//! Parsing the example configs, and one test per kind of error, each asserting that the
//! one-line message names the field, what was expected and what was found.

// `ConfigError` is large on purpose (heap-free); see the crate root.
#![allow(clippy::result_large_err)]

mod common;

use std::ffi::OsString;

use common::{dev_json, device_json, edit};
use vla_config::{
    Config, ConfigError, FieldPath, LogLevel, Origin, TrustedKey, MAX_CONFIG_BYTES, QNN_LIB_DIR_ENV,
};

fn parse(json: &str) -> Result<Config, ConfigError> {
    Config::from_json(json.as_bytes())
}

/// Parses `json`, expects an error, checks it is one line and returns its message.
fn error_of(json: &str) -> (ConfigError, String) {
    let error = parse(json).expect_err("config should be rejected");
    let message = error.to_string();
    assert!(!message.contains('\n'), "multi-line message: {message}");
    (error, message)
}

fn assert_mentions(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            message.contains(part),
            "{message:?} should mention {part:?}"
        );
    }
}

fn path_of(error: &ConfigError) -> String {
    error.path().expect("error names a field").to_string()
}

#[test]
fn device_config_parses_to_the_documented_values() {
    let config = parse(&device_json()).unwrap();
    assert_eq!(config.qnn.lib_dir, "/usr/lib");
    assert_eq!(config.qnn.backend_lib, "libQnnHtp.so");
    assert_eq!(config.qnn.system_lib, "libQnnSystem.so");
    assert_eq!(config.qnn.log_level, LogLevel::Warn);
    assert_eq!(config.bundle.path, "/var/lib/vla/current");
    assert_eq!(config.rings.observation_path, "/dev/shm/vla-obs");
    assert_eq!(config.rings.action_path, "/dev/shm/vla-act");
    assert_eq!(config.rings.action_slots, 64);
    assert_eq!(config.control.publish_hz, 20.0);
    assert_eq!(config.control.max_observation_age_ms, 200);
    assert_eq!(config.control.max_chunk_age_ms, 1500);
    assert_eq!(config.control.hold_after_chunk_end_ms, 100);
    assert_eq!(config.control.action_valid_ms, 100);
    assert_eq!(config.control.writer_heartbeat_timeout_ms, 500);
    assert_eq!(config.control.chunk_rate_hz, Some(7.0));
    assert!(!config.control.emulator_age_limits);
    assert_eq!(
        config.control.publish_period(),
        std::time::Duration::from_millis(50)
    );
    assert_eq!(config.realtime.publisher_priority, 50);
    assert_eq!(config.realtime.inference_priority, 0);
    assert_eq!(config.realtime.publisher_cpu, Some(3));
    assert_eq!(config.realtime.inference_cpus.as_slice(), &[4, 5, 6, 7]);
    assert!(config.realtime.mlockall);
    assert!(config.systemd.notify && config.systemd.watchdog);
    assert_eq!(config.ota.root, "/var/lib/vla");
    assert!(config.ota.trusted_keys.is_empty());
    assert_eq!(config.ota.trial_inferences, 20);
    assert_eq!(config.ota.max_trial_starts, 3);
    assert_eq!(config.log.level, LogLevel::Info);
}

#[test]
fn dev_config_parses_to_the_documented_values() {
    let config = parse(&dev_json()).unwrap();
    assert_eq!(
        config.bundle.path,
        "golden/bundles/molmoact2-upstream-original"
    );
    assert_eq!(config.rings.observation_path, "/dev/shm/vla-dev-obs");
    assert_eq!(config.rings.action_path, "/dev/shm/vla-dev-act");
    assert_eq!(config.realtime.publisher_priority, 0);
    assert_eq!(config.realtime.inference_priority, 0);
    assert_eq!(config.realtime.publisher_cpu, None);
    assert!(config.realtime.inference_cpus.is_empty());
    assert!(!config.realtime.mlockall);
    assert!(!config.systemd.notify && !config.systemd.watchdog);
    assert_eq!(config.log.level, LogLevel::Debug);
    // No key: a development daemon refuses every update (a published test key would let
    // anyone sign one; vlad refuses those at start).
    assert!(config.ota.trusted_keys.is_empty());
    assert_eq!(config.ota.signature_threshold, 1);
}

#[test]
fn the_signature_threshold_is_at_most_the_number_of_keys() {
    let a = "00".repeat(31) + "01";
    let b = "ff".repeat(32);
    let keys = format!("\"trusted_keys\": [\"{a}\", \"{b}\"], \"signature_threshold\": 2");
    let config = parse(&edit(&device_json(), "\"trusted_keys\": []", &keys)).unwrap();
    assert_eq!(config.ota.signature_threshold, 2);
    let keys = format!("\"trusted_keys\": [\"{a}\", \"{b}\"], \"signature_threshold\": 3");
    let (error, message) = error_of(&edit(&device_json(), "\"trusted_keys\": []", &keys));
    assert_eq!(path_of(&error), "ota.signature_threshold", "{message}");
    assert_mentions(&message, &["1..=2"]);
}

#[test]
fn every_example_config_is_valid() {
    let mut checked = 0;
    for entry in std::fs::read_dir(common::config_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "json") {
            if let Err(error) = Config::load(&path) {
                panic!("{error}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 2, "found only {checked} example configs");
}

#[test]
fn optional_realtime_fields_accept_null() {
    let json = edit(
        &device_json(),
        "\"publisher_cpu\": 3",
        "\"publisher_cpu\": null",
    );
    let json = edit(&json, "[4, 5, 6, 7]", "null");
    let config = parse(&json).unwrap();
    assert_eq!(config.realtime.publisher_cpu, None);
    assert!(config.realtime.inference_cpus.is_empty());
}

#[test]
fn escaped_strings_and_a_byte_order_mark_are_accepted() {
    let json = edit(&device_json(), "\"/usr/lib\"", r#""\/usr\/lib""#);
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    bytes.extend_from_slice(json.as_bytes());
    let config = Config::from_json(&bytes).unwrap();
    assert_eq!(config.qnn.lib_dir, "/usr/lib");
}

#[test]
fn unknown_fields_are_named_with_the_known_ones() {
    let (error, message) = error_of(&edit(
        &device_json(),
        "\"publish_hz\": 20.0",
        "\"publish_hzz\": 20.0",
    ));
    assert!(matches!(error, ConfigError::UnknownField { .. }));
    assert_eq!(path_of(&error), "control.publish_hzz");
    assert_mentions(
        &message,
        &[
            "`control.publish_hzz`",
            "publish_hz, max_observation_age_ms",
        ],
    );

    let (error, message) = error_of(&edit(
        &device_json(),
        "\"log\": {",
        "\"colour\": 1, \"log\": {",
    ));
    assert_eq!(path_of(&error), "colour");
    assert_mentions(&message, &["unknown field `colour`", "qnn, bundle, rings"]);
}

#[test]
fn missing_fields_are_named() {
    let (error, message) = error_of(&edit(&device_json(), "    \"action_valid_ms\": 100,\n", ""));
    assert!(matches!(error, ConfigError::MissingField { .. }));
    assert_eq!(path_of(&error), "control.action_valid_ms");
    assert_mentions(&message, &["missing field `control.action_valid_ms`"]);

    let (error, _) = error_of(&edit(
        &device_json(),
        ",\n  \"log\": {\n    \"level\": \"info\"\n  }",
        "",
    ));
    assert_eq!(path_of(&error), "log");
}

#[test]
fn wrong_types_name_the_field_the_expected_and_the_found_type() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        (
            "\"publish_hz\": 20.0",
            "\"publish_hz\": \"fast\"",
            "control.publish_hz",
            &["expected a number", "found the string \"fast\""],
        ),
        (
            "\"mlockall\": true",
            "\"mlockall\": 1",
            "realtime.mlockall",
            &["expected true or false", "found 1"],
        ),
        (
            "\"lib_dir\": \"/usr/lib\"",
            "\"lib_dir\": 5",
            "qnn.lib_dir",
            &["expected a string", "found 5"],
        ),
        (
            "[4, 5, 6, 7]",
            "\"4-7\"",
            "realtime.inference_cpus",
            &["expected an array", "found the string \"4-7\""],
        ),
        (
            "[4, 5, 6, 7]",
            "[4, true]",
            "realtime.inference_cpus[1]",
            &["expected a number", "found true"],
        ),
        (
            "\"bundle\": {\n    \"path\": \"/var/lib/vla/current\"\n  }",
            "\"bundle\": [\"/var/lib/vla/current\"]",
            "bundle",
            &["expected an object", "found an array"],
        ),
        (
            "\"max_trial_starts\": 3",
            "\"max_trial_starts\": null",
            "ota.max_trial_starts",
            &["found null"],
        ),
    ];
    for (old, new, path, parts) in cases {
        let (error, message) = error_of(&edit(&device_json(), old, new));
        assert_eq!(&path_of(&error), path, "{message}");
        assert_mentions(&message, parts);
    }
}

#[test]
fn out_of_range_values_name_the_field_the_range_and_the_value() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        (
            "\"publish_hz\": 20.0",
            "\"publish_hz\": 0",
            "control.publish_hz",
            &["(0, 1000]", "found 0"],
        ),
        (
            "\"publish_hz\": 20.0",
            "\"publish_hz\": 1000.5",
            "control.publish_hz",
            &["(0, 1000]", "found 1000.5"],
        ),
        (
            "\"publisher_priority\": 50",
            "\"publisher_priority\": 100",
            "realtime.publisher_priority",
            &["0..=99", "found 100"],
        ),
        (
            "\"action_slots\": 64",
            "\"action_slots\": 48",
            "rings.action_slots",
            &["power of two", "found 48"],
        ),
        (
            "\"action_slots\": 64",
            "\"action_slots\": 8192",
            "rings.action_slots",
            &["2..=4096", "found 8192"],
        ),
        (
            "\"max_observation_age_ms\": 200",
            "\"max_observation_age_ms\": 0",
            "control.max_observation_age_ms",
            &["1..=60000", "found 0"],
        ),
        (
            "\"max_chunk_age_ms\": 1500",
            "\"max_chunk_age_ms\": 20.5",
            "control.max_chunk_age_ms",
            &["whole number", "found 20.5"],
        ),
        (
            "\"trial_inferences\": 20",
            "\"trial_inferences\": -1",
            "ota.trial_inferences",
            &["1..=1000000", "found -1"],
        ),
        (
            "\"level\": \"info\"",
            "\"level\": \"verbose\"",
            "log.level",
            &[
                "error, warn, info, debug, trace",
                "found the string \"verbose\"",
            ],
        ),
        (
            "\"lib_dir\": \"/usr/lib\"",
            "\"lib_dir\": \"usr/lib\"",
            "qnn.lib_dir",
            &["an absolute path", "\"usr/lib\""],
        ),
        (
            "\"path\": \"/var/lib/vla/current\"",
            "\"path\": \"\"",
            "bundle.path",
            &["a non-empty path"],
        ),
        (
            "\"action_path\": \"/dev/shm/vla-act\"",
            "\"action_path\": \"/dev/shm/vla\\u0000act\"",
            "rings.action_path",
            &["without NUL"],
        ),
        (
            "\"backend_lib\": \"libQnnHtp.so\"",
            "\"backend_lib\": \"/usr/lib/libQnnHtp.so\"",
            "qnn.backend_lib",
            &["a file name without '/'"],
        ),
        (
            "\"publisher_cpu\": 3",
            "\"publisher_cpu\": 1024",
            "realtime.publisher_cpu",
            &["0..=1023", "found 1024"],
        ),
    ];
    for (old, new, path, parts) in cases {
        let (error, message) = error_of(&edit(&device_json(), old, new));
        assert!(matches!(error, ConfigError::Invalid { .. }), "{message}");
        assert_eq!(&path_of(&error), path, "{message}");
        assert_mentions(&message, parts);
    }
}

#[test]
fn bounded_strings_and_lists_report_their_bound() {
    let long_dir = format!("\"lib_dir\": \"/{}\"", "d".repeat(299));
    let (error, message) = error_of(&edit(
        &device_json(),
        "\"lib_dir\": \"/usr/lib\"",
        &long_dir,
    ));
    assert_eq!(path_of(&error), "qnn.lib_dir");
    assert_mentions(&message, &["at most 256 bytes", "a string of 300 bytes"]);

    let cpus: Vec<String> = (4..21).map(|cpu| cpu.to_string()).collect();
    let list = format!("[{}]", cpus.join(", "));
    let (error, message) = error_of(&edit(&device_json(), "[4, 5, 6, 7]", &list));
    assert_eq!(path_of(&error), "realtime.inference_cpus");
    assert_mentions(&message, &["at most 16 items", "more than 16"]);
}

#[test]
fn cross_field_rules_name_the_dependent_field() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        (
            "\"notify\": true",
            "\"notify\": false",
            "systemd.watchdog",
            &["systemd.notify is false"],
        ),
        (
            "\"inference_priority\": 0",
            "\"inference_priority\": 50",
            "realtime.inference_priority",
            &["below realtime.publisher_priority (50)", "found 50"],
        ),
        (
            "[4, 5, 6, 7]",
            "[4, 3]",
            "realtime.inference_cpus[1]",
            &["other than realtime.publisher_cpu (3)"],
        ),
        (
            "[4, 5, 6, 7]",
            "[4, 5, 4]",
            "realtime.inference_cpus[2]",
            &["each CPU listed once", "found 4"],
        ),
        (
            "\"action_path\": \"/dev/shm/vla-act\"",
            "\"action_path\": \"/dev/shm/vla-obs\"",
            "rings.action_path",
            &["different from rings.observation_path"],
        ),
        (
            "\"action_valid_ms\": 100",
            "\"action_valid_ms\": 49",
            "control.action_valid_ms",
            &["at least one publish period (50 ms at 20 Hz)", "found 49"],
        ),
        (
            "\"writer_heartbeat_timeout_ms\": 500",
            "\"writer_heartbeat_timeout_ms\": 99",
            "control.writer_heartbeat_timeout_ms",
            &["two publish periods (100 ms", "found 99"],
        ),
    ];
    for (old, new, path, parts) in cases {
        let (error, message) = error_of(&edit(&device_json(), old, new));
        assert_eq!(&path_of(&error), path, "{message}");
        assert_mentions(&message, parts);
    }
}

#[test]
fn bad_trusted_keys_name_the_key_position() {
    let good = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    let bad_keys = [
        good.to_uppercase(),
        good[..63].to_string(),
        format!("{good}0"),
        good.replacen('d', "g", 1),
    ];
    for bad in bad_keys {
        let keys = format!("\"trusted_keys\": [\"{good}\", \"{bad}\"]");
        let (error, message) = error_of(&edit(&device_json(), "\"trusted_keys\": []", &keys));
        assert_eq!(path_of(&error), "ota.trusted_keys[1]", "{message}");
        assert_mentions(&message, &["64 lowercase hex characters", &bad[..8]]);
    }
    let keys = format!("\"trusted_keys\": [\"{good}\", \"{good}\"]");
    let (error, message) = error_of(&edit(&device_json(), "\"trusted_keys\": []", &keys));
    assert_eq!(path_of(&error), "ota.trusted_keys[1]");
    assert_mentions(&message, &["each key listed once"]);
}

#[test]
fn two_distinct_keys_decode() {
    let a = "00".repeat(31) + "01";
    let b = "ff".repeat(32);
    let keys = format!("\"trusted_keys\": [\"{a}\", \"{b}\"]");
    let config = parse(&edit(&device_json(), "\"trusted_keys\": []", &keys)).unwrap();
    let mut one = [0u8; 32];
    one[31] = 1;
    assert_eq!(
        config.ota.trusted_keys.as_slice(),
        &[TrustedKey(one), TrustedKey([0xff; 32])]
    );
}

#[test]
fn duplicate_fields_are_rejected() {
    let (error, message) = error_of(&edit(
        &device_json(),
        "\"publish_hz\": 20.0,",
        "\"publish_hz\": 20.0, \"publish_hz\": 30.0,",
    ));
    assert!(matches!(error, ConfigError::DuplicateField { .. }));
    assert_mentions(&message, &["duplicate field `control.publish_hz`"]);
}

#[test]
fn malformed_json_names_where_it_broke() {
    let json = device_json();
    let cut = json.find("\"action_valid_ms\"").unwrap() + 10;
    let (error, message) = error_of(&json[..cut]);
    assert!(matches!(error, ConfigError::Malformed { .. }), "{message}");
    assert!(path_of(&error).starts_with("control"), "{message}");
    assert_mentions(&message, &["malformed JSON", "unexpected end of input"]);

    let (error, message) = error_of(&edit(
        &json,
        "\"max_chunk_age_ms\": 1500,",
        "\"max_chunk_age_ms\": 1500",
    ));
    assert_eq!(path_of(&error), "control.max_chunk_age_ms");
    assert_mentions(&message, &["expected ',' or '}'"]);

    let (error, message) = error_of(&format!("{json} {{}}"));
    assert!(matches!(error, ConfigError::Malformed { .. }));
    assert_mentions(&message, &["after the top-level object"]);

    let (error, message) = error_of("");
    assert_eq!(error.path(), Some(&FieldPath::root()));
    assert_mentions(&message, &["(top level)", "unexpected end of input"]);

    let (error, message) = error_of(&edit(&json, "\"/usr/lib\"", r#""/usr\qlib""#));
    assert_eq!(path_of(&error), "qnn.lib_dir");
    assert_mentions(&message, &["invalid escape sequence"]);

    let (error, message) = error_of(&edit(
        &json,
        "\"publish_hz\": 20.0",
        "\"publish_hz\": 2.0.0",
    ));
    assert_eq!(path_of(&error), "control.publish_hz");
    assert_mentions(&message, &["expected a number", "found a malformed value"]);

    let (_, message) = error_of("[]");
    assert_mentions(
        &message,
        &["(top level)", "expected an object", "found an array"],
    );
}

#[test]
fn oversized_input_is_rejected_before_parsing() {
    let mut json = device_json();
    json.push_str(&" ".repeat(MAX_CONFIG_BYTES));
    let (error, message) = error_of(&json);
    assert!(matches!(
        error,
        ConfigError::TooLarge {
            max: MAX_CONFIG_BYTES,
            ..
        }
    ));
    assert_mentions(
        &message,
        &[
            "at most 16384 bytes",
            &format!("found {} bytes", json.len()),
        ],
    );
}

#[test]
fn load_names_the_file_in_every_error() {
    let dir = std::env::temp_dir().join(format!("vla-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        edit(&device_json(), "\"publish_hz\": 20.0", "\"publish_hz\": -2"),
    )
    .unwrap();
    let error = Config::load(&bad).unwrap_err();
    assert!(matches!(error.origin(), Origin::File(_)));
    assert_mentions(
        &error.to_string(),
        &[
            &format!("config file {}", bad.display()),
            "`control.publish_hz`",
            "found -2",
        ],
    );

    let big = dir.join("big.json");
    std::fs::write(&big, vec![b' '; MAX_CONFIG_BYTES + 10]).unwrap();
    let message = Config::load(&big).unwrap_err().to_string();
    assert_mentions(&message, &[&big.display().to_string(), "found 16394 bytes"]);

    let exact = dir.join("exact.json");
    let mut padded = device_json();
    padded.push_str(&" ".repeat(MAX_CONFIG_BYTES - padded.len()));
    std::fs::write(&exact, padded).unwrap();
    Config::load(&exact).expect("a file of exactly the limit is accepted");

    let missing = dir.join("missing.json");
    let error = Config::load(&missing).unwrap_err();
    assert!(matches!(error, ConfigError::Read { .. }));
    assert_mentions(
        &error.to_string(),
        &[&missing.display().to_string(), "cannot read"],
    );
    // The OS error is named in the message once, not handed out again by `source()`.
    let os = std::fs::read(&missing).unwrap_err().to_string();
    assert_mentions(&error.to_string(), &[&os]);
    assert!(std::error::Error::source(&error).is_none());

    std::fs::remove_dir_all(&dir).unwrap();
}

fn env_table(value: Option<&str>) -> impl FnMut(&str) -> Option<OsString> + '_ {
    move |name| {
        (name == QNN_LIB_DIR_ENV)
            .then(|| value.map(OsString::from))
            .flatten()
    }
}

#[test]
fn qnn_lib_dir_override_replaces_the_placeholder() {
    let mut config = parse(&dev_json()).unwrap();
    let applied = config
        .apply_overrides(env_table(Some("/work/.venv/lib/onnxruntime_qnn")))
        .unwrap();
    assert_eq!(applied.as_slice(), &[QNN_LIB_DIR_ENV]);
    assert_eq!(config.qnn.lib_dir, "/work/.venv/lib/onnxruntime_qnn");

    let before = parse(&dev_json()).unwrap();
    let mut config = before.clone();
    let applied = config.apply_overrides(env_table(None)).unwrap();
    assert!(applied.is_empty());
    assert_eq!(config, before);
}

#[test]
fn bad_qnn_lib_dir_override_names_the_variable_and_keeps_the_config() {
    for bad in ["", "relative/lib"] {
        let before = parse(&dev_json()).unwrap();
        let mut config = before.clone();
        let error = config.apply_overrides(env_table(Some(bad))).unwrap_err();
        assert_eq!(error.origin(), &Origin::Env(QNN_LIB_DIR_ENV));
        assert_mentions(
            &error.to_string(),
            &["environment variable VLA_QNN_LIB_DIR", "`qnn.lib_dir`"],
        );
        assert_eq!(config, before);
    }

    use std::os::unix::ffi::OsStringExt;
    let mut config = parse(&dev_json()).unwrap();
    let error = config
        .apply_overrides(|_| Some(OsString::from_vec(b"/opt/\xff".to_vec())))
        .unwrap_err();
    assert_mentions(&error.to_string(), &["UTF-8", "VLA_QNN_LIB_DIR"]);
}

#[test]
fn publish_period_saturates_for_hand_built_rates() {
    let mut control = parse(&device_json()).unwrap().control;
    control.publish_hz = 0.0;
    assert_eq!(control.publish_period(), std::time::Duration::MAX);
    control.publish_hz = 1000.0;
    assert_eq!(
        control.publish_period(),
        std::time::Duration::from_millis(1)
    );
}

#[test]
fn performance_vote_fields_default_parse_and_name_bad_values() {
    use vla_config::{QnnConfig, QnnPerformance};
    let config = parse(&device_json()).unwrap();
    assert_eq!(config.qnn.performance, QnnPerformance::Burst);
    assert_eq!(config.qnn.performance_idle_release_ms, 300);
    let json = edit(
        &device_json(),
        "\"warn\",\n    \"performance\": \"burst\",\n    \"performance_idle_release_ms\": 300",
        "\"warn\"",
    );
    let config = parse(&json).unwrap();
    assert_eq!(config.qnn.performance, QnnPerformance::DEFAULT);
    assert_eq!(
        config.qnn.performance_idle_release_ms,
        QnnConfig::DEFAULT_IDLE_RELEASE_MS
    );
    for name in QnnPerformance::NAMES {
        let json = edit(&device_json(), "\"burst\"", &format!("\"{name}\""));
        assert_eq!(parse(&json).unwrap().qnn.performance.as_str(), name);
    }
    let (error, message) = error_of(&edit(&device_json(), "\"burst\"", "\"turbo\""));
    assert_eq!(path_of(&error), "qnn.performance");
    assert_mentions(&message, &["burst", "power_saver", "off", "turbo"]);
    let (error, _) = error_of(&edit(
        &device_json(),
        "\"performance_idle_release_ms\": 300",
        "\"performance_idle_release_ms\": 0",
    ));
    assert_eq!(path_of(&error), "qnn.performance_idle_release_ms");
}

#[test]
fn npu_shared_buffers_default_to_auto_parse_and_name_bad_values() {
    use vla_config::SharedBuffers;
    assert_eq!(
        parse(&device_json()).unwrap().npu.shared_buffers,
        SharedBuffers::Auto
    );
    let with = |value: &str| {
        edit(
            &device_json(),
            "\"log\": {",
            &format!("\"npu\": {{ \"shared_buffers\": {value} }},\n  \"log\": {{"),
        )
    };
    for name in SharedBuffers::NAMES {
        let config = parse(&with(&format!("\"{name}\""))).unwrap();
        assert_eq!(config.npu.shared_buffers.as_str(), name);
    }
    assert_eq!(
        parse(&with("null")).unwrap().npu.shared_buffers,
        SharedBuffers::DEFAULT
    );
    let (error, message) = error_of(&with("\"yes\""));
    assert_eq!(path_of(&error), "npu.shared_buffers");
    assert_mentions(&message, &["auto", "on", "off", "yes"]);
    let (error, _) = error_of(&edit(
        &device_json(),
        "\"log\": {",
        "\"npu\": { \"zero_copy\": true },\n  \"log\": {",
    ));
    assert_eq!(path_of(&error), "npu.zero_copy");
}

#[test]
fn log_levels_map_to_qnn_levels() {
    let levels: Vec<u32> = LogLevel::NAMES
        .iter()
        .map(|name| LogLevel::parse(name).unwrap().qnn_level())
        .collect();
    assert_eq!(levels, [1, 2, 3, 4, 5]);
    assert_eq!(LogLevel::parse("Info"), None);
    assert_eq!(LogLevel::Trace.as_str(), "trace");
}

#[test]
fn chunk_execution_fields_default_to_todays_behaviour_and_parse_when_given() {
    let config = parse(&dev_json()).unwrap();
    let c = &config.control;
    assert_eq!(c.merge, vla_config::Merge::Skip);
    assert_eq!(c.trigger, vla_config::TriggerMode::BackToBack);
    assert_eq!((c.trigger_margin_steps, c.chunk_rate_hz), (2, None));
    assert_eq!(c.extra_latency_ms, 0);
    assert_eq!(c.chunk_period(), c.publish_period());
    let json = edit(
        &dev_json(),
        "\"writer_heartbeat_timeout_ms\": 500",
        "\"writer_heartbeat_timeout_ms\": 500, \"merge\": \"prefix\", \"trigger\": \"remaining\", \
         \"trigger_margin_steps\": 3, \"chunk_rate_hz\": 5, \"extra_latency_ms\": 250",
    );
    let c = parse(&json).unwrap().control;
    assert_eq!(c.merge, vla_config::Merge::Prefix);
    assert_eq!(c.trigger, vla_config::TriggerMode::Remaining);
    assert_eq!((c.trigger_margin_steps, c.chunk_rate_hz), (3, Some(5.0)));
    assert_eq!(c.chunk_period(), std::time::Duration::from_millis(200));
    assert_eq!(c.extra_latency_ms, 250);
    assert_eq!(c.execute_steps, None);
    let json = edit(
        &dev_json(),
        "\"writer_heartbeat_timeout_ms\": 500",
        "\"writer_heartbeat_timeout_ms\": 500, \"trigger\": \"synchronous\", \"execute_steps\": 10",
    );
    let c = parse(&json).unwrap().control;
    assert_eq!(c.trigger, vla_config::TriggerMode::Synchronous);
    assert_eq!(c.execute_steps, Some(10));
}

/// The device ceiling of a minute on the age limits holds unless a config says it runs on
/// the emulator; even then an hour is the most, and only an x86_64 build (the emulator's)
/// accepts the setting (the refusal on other CPUs is validate.rs's unit test).
#[test]
fn age_limits_past_a_minute_need_the_emulator_setting() {
    let with = |ages: &str, rest: &str| {
        edit(
            &edit(
                &dev_json(),
                "\"writer_heartbeat_timeout_ms\": 500",
                &format!("\"writer_heartbeat_timeout_ms\": 500{rest}"),
            ),
            "\"max_chunk_age_ms\": 1500",
            &format!("\"max_chunk_age_ms\": {ages}"),
        )
    };
    assert!(!parse(&dev_json()).unwrap().control.emulator_age_limits);
    let (e, m) = error_of(&with("60001", ""));
    assert_eq!(path_of(&e), "control.max_chunk_age_ms");
    assert_mentions(&m, &["1..=60000", "60001"]);
    let json = edit(
        &dev_json(),
        "\"max_observation_age_ms\": 200",
        "\"max_observation_age_ms\": 60001",
    );
    assert_eq!(
        path_of(&error_of(&json).0),
        "control.max_observation_age_ms"
    );
    let (e, m) = error_of(&with("60001", ", \"emulator_age_limits\": false"));
    assert_eq!(path_of(&e), "control.max_chunk_age_ms");
    assert_mentions(&m, &["1..=60000"]);
    if cfg!(target_arch = "x86_64") {
        let c = parse(&with("3600000", ", \"emulator_age_limits\": true"))
            .unwrap()
            .control;
        assert!(c.emulator_age_limits);
        assert_eq!(c.max_chunk_age(), std::time::Duration::from_secs(3600));
        let (e, m) = error_of(&with("3600001", ", \"emulator_age_limits\": true"));
        assert_eq!(path_of(&e), "control.max_chunk_age_ms");
        assert_mentions(&m, &["1..=3600000", "3600001"]);
        // The other limits keep the device ceiling.
        let json = edit(
            &with("3600000", ", \"emulator_age_limits\": true"),
            "\"hold_after_chunk_end_ms\": 100",
            "\"hold_after_chunk_end_ms\": 60001",
        );
        let (e, m) = error_of(&json);
        assert_eq!(path_of(&e), "control.hold_after_chunk_end_ms");
        assert_mentions(&m, &["0..=60000"]);
        let json = edit(
            &with("1500", ", \"emulator_age_limits\": true"),
            "\"max_observation_age_ms\": 200",
            "\"max_observation_age_ms\": 3600000",
        );
        assert_eq!(
            parse(&json).unwrap().control.max_observation_age_ms,
            3_600_000
        );
    } else {
        let (e, m) = error_of(&with("1500", ", \"emulator_age_limits\": true"));
        assert_eq!(path_of(&e), "control.emulator_age_limits");
        assert_mentions(&m, &["x86_64"]);
    }
}

#[test]
fn bad_chunk_execution_fields_name_the_field() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "\"merge\": \"blend\"",
            "control.merge",
            &["skip, crossfade, prefix", "\"blend\""],
        ),
        (
            "\"trigger\": \"early\"",
            "control.trigger",
            &["back_to_back, remaining, synchronous"],
        ),
        (
            "\"trigger\": \"synchronous\", \"merge\": \"crossfade\"",
            "control.merge",
            &["skip with control.trigger synchronous", "\"crossfade\""],
        ),
        (
            "\"execute_steps\": 10",
            "control.execute_steps",
            &["null unless control.trigger is synchronous", "found 10"],
        ),
        (
            "\"trigger\": \"synchronous\", \"execute_steps\": 0",
            "control.execute_steps",
            &["1..=4096", "found 0"],
        ),
        (
            "\"trigger_margin_steps\": -1",
            "control.trigger_margin_steps",
            &["0..=1000"],
        ),
        (
            "\"chunk_rate_hz\": 40",
            "control.chunk_rate_hz",
            &["publish_hz = 20", "found 40"],
        ),
        ("\"chunk_rate_hz\": 0", "control.chunk_rate_hz", &["[0.1, "]),
        (
            "\"chunk_rate_hz\": 1e-12",
            "control.chunk_rate_hz",
            &["[0.1, ", "found 0.000000000001"],
        ),
        (
            "\"extra_latency_ms\": 0.5",
            "control.extra_latency_ms",
            &["0..=60000"],
        ),
    ];
    for (field, at, parts) in cases {
        let json = edit(
            &dev_json(),
            "\"writer_heartbeat_timeout_ms\": 500",
            &format!("\"writer_heartbeat_timeout_ms\": 500, {field}"),
        );
        let (error, message) = error_of(&json);
        assert_eq!(path_of(&error), *at, "{message}");
        assert_mentions(&message, parts);
    }
}

/// `device_json()` with `sections` (JSON members, comma-separated) before `"log"`.
fn with_sections(sections: &str) -> String {
    edit(
        &device_json(),
        "\"log\": {",
        &format!("{sections}, \"log\": {{"),
    )
}

#[test]
fn recorder_and_metrics_are_off_by_default_and_take_their_defaults() {
    let config = parse(&device_json()).unwrap();
    assert!(config.recorder.is_none() && config.metrics.is_none());
    let config = parse(&with_sections(
        r#""recorder": {"directory": "/var/lib/vla/recordings"}, "metrics": {"textfile": "/var/lib/node_exporter/vlad.prom"}"#,
    ))
    .unwrap();
    let r = config.recorder.unwrap();
    assert_eq!(r.directory, "/var/lib/vla/recordings");
    assert_eq!(
        (r.history_s, r.max_chunks, r.max_mb, r.hold_limit_ms),
        (10.0, 64, 256, 2000)
    );
    assert_eq!(r.frames, vla_config::RecorderFrames::Full);
    assert!(r.on_fault);
    assert_eq!(config.metrics.unwrap().interval_ms, 5000);
}

#[test]
fn bad_recorder_and_metrics_fields_are_named() {
    for (sections, field, mention) in [
        (
            r#""recorder": {"directory": "rel"}"#,
            "recorder.directory",
            "absolute path",
        ),
        (
            r#""recorder": {"directory": "/r", "history_s": 0}"#,
            "recorder.history_s",
            "(0, 600]",
        ),
        (
            r#""recorder": {"directory": "/r", "frames": "half"}"#,
            "recorder.frames",
            "off, downscaled, full",
        ),
        (
            r#""recorder": {"directory": "/r", "downscale": 1}"#,
            "recorder.downscale",
            "2..=16",
        ),
        (
            r#""recorder": {"directory": "/r", "max_chunks": 0.5}"#,
            "recorder.max_chunks",
            "1..=10000",
        ),
        (
            r#""recorder": {"directory": "/r", "colour": 1}"#,
            "recorder.colour",
            "unknown field",
        ),
        (
            r#""metrics": {"textfile": "/m/vlad.txt"}"#,
            "metrics.textfile",
            ".prom",
        ),
        (
            r#""metrics": {"textfile": "/m/vlad.prom", "interval_ms": 10}"#,
            "metrics.interval_ms",
            "100..=60000",
        ),
    ] {
        let (error, message) = error_of(&with_sections(sections));
        assert_eq!(path_of(&error), field, "{message}");
        assert_mentions(&message, &[mention]);
    }
}

#[test]
fn npu_placement_defaults_to_auto_and_reads_explicit_groups() {
    let config = parse(&device_json()).unwrap();
    assert_eq!(config.npu, vla_config::NpuConfig::default());
    assert_eq!(config.npu.budget_mb(), 3840 - 256);
    let config = parse(&with_sections(
        r#""npu": {"placement": "groups", "session_mb": 3800, "reserve_mb": 300, "groups": [
            {"nsp": 0, "contexts": ["vision", "llm_split0"]},
            {"nsp": 1, "contexts": ["llm_split1"]}]}"#,
    ))
    .unwrap();
    assert_eq!(config.npu.budget_mb(), 3500);
    assert_eq!(config.npu.placement, vla_config::NpuPlacement::Groups);
    let groups = &config.npu.groups;
    assert_eq!(groups.len(), 2);
    assert_eq!((groups[0].nsp, groups[0].contexts.len()), (0, 2));
    assert_eq!(
        (groups[1].nsp, groups[1].contexts[0].as_str()),
        (1, "llm_split1")
    );
    let config = parse(&with_sections(r#""npu": {"placement": "auto"}"#)).unwrap();
    assert_eq!(config.npu.placement, vla_config::NpuPlacement::Auto);
}

#[test]
fn one_npu_section_holds_the_placement_and_the_shared_buffers() {
    let config = parse(&with_sections(
        r#""npu": {"placement": "groups", "session_mb": 3800, "reserve_mb": 300,
            "shared_buffers": "on", "groups": [{"nsp": 1, "contexts": ["vision"]}]}"#,
    ))
    .unwrap();
    assert_eq!(config.npu.placement, vla_config::NpuPlacement::Groups);
    assert_eq!(config.npu.budget_mb(), 3500);
    assert_eq!(config.npu.groups[0].nsp, 1);
    assert_eq!(config.npu.shared_buffers, vla_config::SharedBuffers::On);
    // Either half set leaves the other at its default.
    let config = parse(&with_sections(r#""npu": {"shared_buffers": "off"}"#)).unwrap();
    assert_eq!(config.npu.placement, vla_config::NpuPlacement::Auto);
    assert_eq!(
        config.npu.session_mb,
        vla_config::NpuConfig::DEFAULT_SESSION_MB
    );
    assert_eq!(config.npu.shared_buffers, vla_config::SharedBuffers::Off);
    let config = parse(&with_sections(r#""npu": {"session_mb": 2048}"#)).unwrap();
    assert_eq!(
        config.npu.shared_buffers,
        vla_config::SharedBuffers::DEFAULT
    );
    // A bad value in one half is named even when the other half is valid.
    let (error, message) = error_of(&with_sections(
        r#""npu": {"placement": "auto", "shared_buffers": "yes"}"#,
    ));
    assert_eq!(path_of(&error), "npu.shared_buffers");
    assert_mentions(&message, &["auto", "on", "off", "yes"]);
}

#[test]
fn bad_npu_fields_are_named() {
    for (sections, field, mention) in [
        (
            r#""npu": {"placement": "spread"}"#,
            "npu.placement",
            "auto, groups",
        ),
        (r#""npu": {"placement": "groups"}"#, "npu.groups", "nsp"),
        (
            r#""npu": {"placement": "groups", "groups": []}"#,
            "npu.groups",
            "at least one",
        ),
        (
            r#""npu": {"groups": [{"nsp": 0, "contexts": ["vision"]}]}"#,
            "npu.groups",
            "groups",
        ),
        (
            r#""npu": {"placement": "groups", "groups": [{"nsp": 8, "contexts": ["vision"]}]}"#,
            "npu.groups[0].nsp",
            "0..=7",
        ),
        (
            r#""npu": {"placement": "groups", "groups": [{"nsp": 0, "contexts": []}]}"#,
            "npu.groups[0].contexts",
            "at least one",
        ),
        (
            r#""npu": {"placement": "groups", "groups": [{"nsp": 0, "contexts": ["a", ""]}]}"#,
            "npu.groups[0].contexts[1]",
            "component",
        ),
        (
            r#""npu": {"session_mb": 5000}"#,
            "npu.session_mb",
            "1..=4096",
        ),
        (
            r#""npu": {"session_mb": 1000, "reserve_mb": 1000}"#,
            "npu.reserve_mb",
            "0..=999",
        ),
        (r#""npu": {"sessions": 2}"#, "npu.sessions", "unknown field"),
    ] {
        let (error, message) = error_of(&with_sections(sections));
        assert_eq!(path_of(&error), field, "{message}");
        assert_mentions(&message, &[mention]);
    }
}
