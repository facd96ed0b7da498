//! Per-output parity gates through `vlad parity --bundle` and `vlad bundle calibrate`, on the
//! LP-VTP-SD stand-in: golden/bundles/molmoact2-lp-vtp-sd with its vision context replaced by
//! one whose grid sampler interpolates more coarsely than torch's (golden/gate-standin, made by
//! tools/goldens/vla_goldens/make_gate_standin.py), which lands near the release card's 0.99843835.

mod common;

use common::{qnn as qnn_available, text, vlad};
use std::path::{Path, PathBuf};
use std::process::Output;

/// The LP-VTP-SD card's vision gate (docs/bundle-format.md, "Published releases").
const CARD_GATE: f64 = 0.9979;

fn golden(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../golden/bundles")
        .join(rel)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vlad-gates-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A stand-in bundle in its own scratch directory, removed when the test passes (kept for a
/// look when it fails).
struct Standin(PathBuf);

impl std::ops::Deref for Standin {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(self.0.parent().expect("scratch/bundle"));
        }
    }
}

/// The stand-in bundle in a scratch directory, its vision binary `vision_<which>`.
fn standin(name: &str, which: &str) -> Standin {
    let dir = scratch(name).join("bundle");
    vla_test_support::copy_dir(&golden("molmoact2-lp-vtp-sd"), &dir);
    std::fs::copy(
        golden("../gate-standin").join(format!("vision_{which}_socid77_archv73.bin")),
        dir.join("ctx/vision_socid77_archv73.bin"),
    )
    .unwrap();
    Standin(dir)
}

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("bundle.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

fn card_gate(dir: &Path) {
    edit_manifest(dir, |v| {
        v["parity"]["contexts"] = serde_json::json!({"vision": {"image_embeds": {
            "cosine": CARD_GATE,
            "reason": "card: vision cosine 0.99843835 on QNN CPU (GridSample)"
        }}})
    });
}

fn parity(dir: &Path) -> (Option<i32>, String, String) {
    let o = vlad(&["parity", "--bundle", dir.to_str().unwrap()]);
    let (out, err) = text(&o);
    (o.status.code(), out, err)
}

#[test]
fn the_standin_fails_the_default_gate_and_passes_with_the_cards() {
    if !qnn_available() {
        return;
    }
    let dir = standin("card", "gridsample");
    let (code, out, err) = parity(&dir);
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(
        err.contains("vision image_embeds cosine 0.998") && err.contains("< 0.9999"),
        "{err}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("image_embeds") && l.contains("FAIL") && l.ends_with("default")),
        "{out}"
    );

    card_gate(&dir);
    let (code, out, err) = parity(&dir);
    assert_eq!(code, Some(0), "{out}{err}");
    let line = out.lines().find(|l| l.contains("image_embeds")).unwrap();
    assert!(
        line.contains("0.9979")
            && line.contains("PASS")
            && line.contains("parity.contexts.vision.image_embeds: card: vision cosine 0.99843835"),
        "{line}"
    );
    // The other contexts stay at the default, and say so.
    let keys = out
        .lines()
        .find(|l| l.contains("llm_split1") && l.contains("keys"))
        .unwrap();
    assert!(
        keys.contains("0.9999") && keys.ends_with("default"),
        "{keys}"
    );
    assert!(out.contains("end to end (gate cosine >= 0.999)"), "{out}");
}

#[test]
fn the_cards_gate_still_catches_a_late_image_row_and_swapped_splits() {
    if !qnn_available() {
        return;
    }
    let late = standin("late", "row_late");
    card_gate(&late);
    let (code, out, err) = parity(&late);
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(err.contains("vision image_embeds cosine 0.2"), "{err}");

    let swapped = standin("swapped", "gridsample");
    card_gate(&swapped);
    edit_manifest(&swapped, |v| {
        let c = &mut v["components"];
        let one = c["llm_split1"]["binary"].clone();
        c["llm_split1"]["binary"] = c["llm_split2"]["binary"].clone();
        c["llm_split2"]["binary"] = one;
    });
    let (code, out, err) = parity(&swapped);
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(
        err.contains("llm_split1 hidden_out") && err.contains("llm_split2 hidden_out"),
        "{err}"
    );
}

#[test]
fn an_entry_for_an_output_the_context_lacks_is_refused_in_one_line() {
    if !qnn_available() {
        return;
    }
    let dir = standin("unknown-output", "gridsample");
    edit_manifest(&dir, |v| {
        v["parity"]["contexts"] = serde_json::json!({"vision": {"image_embed": {
            "cosine": 0.998, "reason": "misspelt"
        }}})
    });
    let (code, out, err) = parity(&dir);
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("parity.contexts.vision.image_embed")
            && err.contains("names no output of context `vision` (its outputs: image_embeds)"),
        "{err}"
    );
    edit_manifest(&dir, |v| {
        v["parity"]["contexts"] = serde_json::json!({});
        v["parity"]["stages"] = serde_json::json!({"hidden_state": {
            "cosine": 0.999, "reason": "misspelt"
        }});
    });
    let (code, out, err) = parity(&dir);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("parity.stages.hidden_state")
            && err.contains("names no stage of the end-to-end run that its golden stores"),
        "{err}"
    );
    // A stage the policy produces but the golden does not store is compared to nothing, so an
    // entry for it would gate nothing.
    let e2e = dir.join("golden/end_to_end.npz");
    let npz = vla_npz::Npz::open(&e2e).unwrap();
    let kept: Vec<_> = npz
        .names()
        .filter(|&n| n != "noise")
        .map(|n| npz.array(n).unwrap())
        .collect();
    drop(npz);
    vla_npz::write_npz(&e2e, &kept.iter().collect::<Vec<_>>()).unwrap();
    edit_manifest(&dir, |v| {
        v["parity"]["stages"] = serde_json::json!({"noise": {"cosine": 0.999, "reason": "r"}});
    });
    let (code, out, err) = parity(&dir);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("parity.stages.noise")
            && err.contains("(those: pixel_values, hidden_states, attention_bias, k_ctx, v_ctx)"),
        "{err}"
    );
}

/// A bring-up gates.json as scripts/bringup/report.py writes it.
fn gates_report(dir: &Path, outputs: serde_json::Value, stages: serde_json::Value) -> PathBuf {
    let path = dir.join("gates.json");
    let doc = serde_json::json!({
        "format": "vla-bringup-gates/1",
        "bundle": "molmoact2-lp-vtp-sd-libero-tiny",
        "version": "0.1.0",
        "margin": 0.0005,
        "outputs": outputs,
        "stages": stages,
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    path
}

fn calibrate(dir: &Path, report: &Path) -> Output {
    vlad(&[
        "bundle",
        "calibrate",
        dir.to_str().unwrap(),
        "--from",
        report.to_str().unwrap(),
    ])
}

#[test]
fn calibrate_refuses_bad_reports_and_writes_nothing() {
    let dir = standin("calibrate-refusals", "gridsample");
    let before = std::fs::read(dir.join("bundle.json")).unwrap();
    let one = |context: &str, output: &str, gate: f64| {
        serde_json::json!([{"context": context, "output": output, "observations": 1,
                            "min_cosine": gate + 0.0005, "proposed_gate": gate}])
    };
    let cases = [
        (
            one("vison", "image_embeds", 0.998),
            "context `vison` is no component",
        ),
        (
            one("vision", "image_embedz", 0.998),
            "output `image_embedz` of context `vision`",
        ),
        (
            one("vision", "image_embeds", 0.95),
            "parity.contexts.vision.image_embeds.cosine` 0.95 is not in (0.99, 1]",
        ),
        (
            serde_json::json!([{"context": "vision", "output": "image_embeds", "observations": 1,
                                "min_cosine": "high", "proposed_gate": 0.998}]),
            "outputs[0].min_cosine is not a number",
        ),
        (
            serde_json::json!([{"context": "vision", "output": "image_embeds", "observations": 1,
                                "min_cosine": 0.9985, "proposed_gate": 1.5}]),
            "outputs[0].proposed_gate 1.5 is not in (0, 1]",
        ),
        (
            serde_json::json!([{"context": "vision", "output": "image_embeds", "observations": 1,
                                "min_cosine": 0.9985, "proposed_gate": 0.999}]),
            "outputs[0].proposed_gate 0.999 is above its measured minimum 0.9985",
        ),
    ];
    let stage = |name: &str| {
        serde_json::json!([{"stage": name, "observations": 1,
                            "min_cosine": 0.9995, "proposed_gate": 0.999}])
    };
    let cases = cases
        .into_iter()
        .map(|(outputs, want)| (outputs, serde_json::json!([]), want))
        .chain([
            (
                serde_json::json!([]),
                stage("hidden_state"),
                "stage `hidden_state` is not an intermediate the end-to-end golden stores",
            ),
            // The end-to-end actions are no stage: their gate is never calibrated.
            (
                serde_json::json!([]),
                stage("actions"),
                "stage `actions` is not an intermediate",
            ),
        ]);
    for (outputs, stages, want) in cases {
        let report = gates_report(dir.parent().unwrap(), outputs, stages);
        let o = calibrate(&dir, &report);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{out}{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "want {want:?} in {err}");
        assert_eq!(std::fs::read(dir.join("bundle.json")).unwrap(), before);
    }
    // A gate above 1 in the bundle itself is refused when the bundle opens.
    edit_manifest(&dir, |v| {
        v["parity"]["contexts"] = serde_json::json!({"vision": {"image_embeds": {
            "cosine": 1.5, "reason": "typo"
        }}})
    });
    let o = vlad(&["parity", "--bundle", dir.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        err.contains("`parity.contexts.vision.image_embeds.cosine` 1.5 is not in (0.99, 1]"),
        "{err}"
    );
}

#[test]
fn calibrate_writes_the_proposals_below_the_default_with_the_reports_hash() {
    let dir = standin("calibrate", "gridsample");
    let report = gates_report(
        dir.parent().unwrap(),
        serde_json::json!([
            {"context": "vision", "output": "image_embeds", "observations": 3,
             "min_cosine": 0.99851954, "proposed_gate": 0.998019},
            {"context": "llm_split0", "output": "keys", "observations": 3,
             "min_cosine": 0.99999954, "proposed_gate": 0.9999},
        ]),
        serde_json::json!([
            {"stage": "hidden_states", "observations": 3,
             "min_cosine": 0.99985, "proposed_gate": 0.99935},
            {"stage": "k_ctx", "observations": 3,
             "min_cosine": 0.99999, "proposed_gate": 0.9999},
        ]),
    );
    let o = calibrate(&dir, &report);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    use sha2::Digest;
    let hash: String = sha2::Sha256::digest(std::fs::read(&report).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("bundle.json")).unwrap()).unwrap();
    let gates = &v["parity"]["contexts"];
    assert_eq!(gates["vision"]["image_embeds"]["cosine"], 0.998019);
    let reason = gates["vision"]["image_embeds"]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&hash) && reason.contains("over 3 observations"),
        "{reason}"
    );
    assert!(
        gates.get("llm_split0").is_none(),
        "the default holds: {gates}"
    );
    let stages = &v["parity"]["stages"];
    assert_eq!(stages["hidden_states"]["cosine"], 0.99935);
    assert!(
        stages["hidden_states"]["reason"]
            .as_str()
            .unwrap()
            .contains(&hash),
        "{stages}"
    );
    assert!(stages.get("k_ctx").is_none(), "the default holds: {stages}");
    assert_eq!(v["parity"]["end_to_end_cosine"], 0.999);

    // Packed: calibrating now would break the signed manifest.
    std::fs::write(dir.join("ota-manifest.json"), "{}").unwrap();
    let o = calibrate(&dir, &report);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("calibrate before pack and sign"), "{err}");
}
