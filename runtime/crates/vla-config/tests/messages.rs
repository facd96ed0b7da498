//! The exact line of each kind of error, so a change of parser or of the path keeping
//! shows up as a changed line: the wording, the path (an array's missing comma is reported
//! at the next index, a bad value after a key at that key) and what was found.

mod common;

use common::{device_json, edit};
use vla_config::Config;

fn line(json: &str) -> String {
    match Config::from_json(json.as_bytes()) {
        Ok(_) => "accepted".into(),
        Err(error) => error.to_string(),
    }
}

#[test]
fn each_kind_of_error_prints_its_established_line() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "    \"action_valid_ms\": 100,\n",
            "",
            "config: missing field `control.action_valid_ms`: expected it to be present, found nothing",
        ),
        (
            "\"publish_hz\": 20.0,",
            "\"publish_hz\": 20.0, \"publish_hz\": 30.0,",
            "config: duplicate field `control.publish_hz`: expected it once, found it again",
        ),
        (
            "\"log\": {",
            "\"npu\": {\"groups\": [{\"nsp\": 0, \"contexts\": [\"v\"], \"x\": 1}]}, \"log\": {",
            "config: unknown field `npu.groups[0].x`: expected one of nsp, contexts",
        ),
        (
            "\"publish_hz\": 20.0",
            "\"publish_hz\": \"fast\"",
            "config: `control.publish_hz`: expected a number, found the string \"fast\"",
        ),
        (
            "\"publish_hz\": 20.0",
            "\"publish_hz\": 2.0.0",
            "config: `control.publish_hz`: expected a number, found a malformed value",
        ),
        (
            "\"publish_hz\": 20.0",
            "\"publish_hz\": nul",
            "config: malformed JSON near `control.publish_hz`: expected true, false or null",
        ),
        (
            "\"mlockall\": true",
            "\"mlockall\": 1",
            "config: `realtime.mlockall`: expected true or false, found 1",
        ),
        (
            "\"lib_dir\": \"/usr/lib\"",
            "\"lib_dir\": [\"/usr/lib\"]",
            "config: `qnn.lib_dir`: expected a string, found an array",
        ),
        (
            "\"lib_dir\": \"/usr/lib\"",
            "\"lib_dir\": \"/usr\\qlib\"",
            "config: malformed JSON near `qnn.lib_dir`: invalid escape sequence, or string too long once unescaped",
        ),
        (
            "\"lib_dir\": \"/usr/lib\"",
            "\"lib_dir\": \"/usr/lib\" \"x\"",
            "config: malformed JSON near `qnn.lib_dir`: expected ',' or '}'",
        ),
        (
            "[4, 5, 6, 7]",
            "[4, true]",
            "config: `realtime.inference_cpus[1]`: expected a number, found true",
        ),
        (
            "[4, 5, 6, 7]",
            "[4 5]",
            "config: malformed JSON near `realtime.inference_cpus[1]`: expected ',' or ']'",
        ),
        (
            "[4, 5, 6, 7]",
            "[4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]",
            "config: `realtime.inference_cpus`: expected an array of at most 16 items, found an array of more than 16 items",
        ),
        (
            "\"max_trial_starts\": 3",
            "\"max_trial_starts\": null",
            "config: `ota.max_trial_starts`: expected a whole number in 1..=100, found null",
        ),
        (
            "\"bundle\": {",
            "\"bundle\": [{",
            "config: `bundle`: expected an object, found an array",
        ),
    ];
    for (old, new, expected) in cases {
        assert_eq!(line(&edit(&device_json(), old, new)), *expected);
    }
    assert_eq!(
        line(&format!("{} {{}}", device_json())),
        "config: malformed JSON near `(top level)`: unexpected characters after the top-level object"
    );
}
