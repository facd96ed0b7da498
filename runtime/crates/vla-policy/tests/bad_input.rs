//! Broken bundles and observations: each is refused with an error naming the part, and
//! nothing non-finite ever comes out as an action.

mod common;

use vla_npz::{write_npz, Array, Npz};
use vla_policy::{Bundle, Observation, ObservationFile, Policy, PolicyError};

fn open_err(dir: &std::path::Path) -> String {
    match Bundle::open(dir) {
        Ok(_) => panic!("{} must be refused", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_context_or_golden_is_named() {
    let dir = common::copy_fixture("molmoact2-original", "missing");
    std::fs::remove_file(dir.join("ctx/llm_split2_socid77_archv73.bin")).unwrap();
    let msg = open_err(&dir);
    assert!(
        msg.contains("context `llm_split2`") && msg.contains("llm_split2_socid77_archv73.bin"),
        "{msg}"
    );
    std::fs::copy(
        common::fixture("molmoact2-original").join("ctx/llm_split2_socid77_archv73.bin"),
        dir.join("ctx/llm_split2_socid77_archv73.bin"),
    )
    .unwrap();
    std::fs::remove_file(dir.join("golden/action_step_io.npz")).unwrap();
    let msg = open_err(&dir);
    assert!(msg.contains("golden of `action_step`"), "{msg}");
    std::fs::remove_file(dir.join("bundle.json")).unwrap();
    assert!(open_err(&dir).contains("manifest"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn manifest_rules_name_the_field() {
    let dir = common::copy_fixture("molmoact2-drift-keystone", "manifest");
    common::edit_manifest(&dir, |v| v["molmoact2"]["keystone"]["k"] = 0.into());
    let msg = open_err(&dir);
    assert!(
        msg.contains("`molmoact2.keystone.k` must be at least 1"),
        "{msg}"
    );

    common::edit_manifest(&dir, |v| {
        v["molmoact2"]["keystone"]["k"] = 5.into();
        v["molmoact2"]["keystone"]["num_clusters"] = 0.into();
    });
    let msg = open_err(&dir);
    assert!(
        msg.contains("`molmoact2.keystone.num_clusters` 0 is not in 1..=64"),
        "{msg}"
    );
    common::edit_manifest(&dir, |v| {
        v["molmoact2"]["keystone"]["num_clusters"] = 2.into();
        v["molmoact2"]["keystone"]["selector"] = "cluster_mean".into();
    });
    let msg = open_err(&dir);
    assert!(
        msg.contains("unknown variant `cluster_mean`, expected one of `medoid`, `guarded_medoid`, `cluster_medoid`"),
        "{msg}"
    );
    common::edit_manifest(&dir, |v| {
        v["molmoact2"]["keystone"]["selector"] = "cluster_medoid".into();
        v["molmoact2"]["frobnicate"] = 1.into();
    });
    let msg = open_err(&dir);
    assert!(msg.contains("unknown field `frobnicate`"), "{msg}");

    common::edit_manifest(&dir, |v| {
        v["molmoact2"].as_object_mut().unwrap().remove("frobnicate");
        v["soc_model"] = 69.into();
    });
    let msg = open_err(&dir);
    assert!(
        msg.contains("built for soc_model 69, this device needs 77"),
        "{msg}"
    );

    common::edit_manifest(&dir, |v| {
        v["soc_model"] = 77.into();
        v["molmoact2"]["action_norm"]["std"] = serde_json::json!([1.0]);
        v["molmoact2"]["action_norm"]["mode"] = "mean_std".into();
    });
    let msg = open_err(&dir);
    assert!(
        msg.contains("`molmoact2.action_norm.mean` required"),
        "{msg}"
    );

    // Which normalizer the checkpoint is run with: one for both blocks, LeRobot's eps only
    // with LeRobot's, no zero mask with LeRobot's.
    common::edit_manifest(&dir, |v| {
        v["molmoact2"]["action_norm"] = serde_json::json!({"mode": "identity"});
        v["molmoact2"]["action_norm"]["follows"] = "lerobot_pipeline".into();
    });
    let msg = open_err(&dir);
    assert!(
        msg.contains("`molmoact2.action_norm.follows` is lerobot_pipeline while state_norm follows hf_feature_normalizer"),
        "{msg}"
    );
    common::edit_manifest(&dir, |v| {
        v["molmoact2"]["action_norm"]["follows"] = "hf_feature_normalizer".into();
        v["molmoact2"]["action_norm"]["eps"] = 1e-8.into();
    });
    let msg = open_err(&dir);
    assert!(
        msg.contains("`molmoact2.action_norm.eps` is LeRobot's normalizer setting"),
        "{msg}"
    );
    common::edit_manifest(&dir, |v| {
        for n in ["state_norm", "action_norm"] {
            v["molmoact2"][n]["follows"] = "lerobot_pipeline".into();
        }
        let dims = v["molmoact2"]["state_norm"]["low"]
            .as_array()
            .unwrap()
            .len();
        let mut constant = vec![false; dims];
        constant[1] = true;
        v["molmoact2"]["state_norm"]["constant"] = serde_json::json!(constant);
    });
    let msg = open_err(&dir);
    assert!(
        msg.contains(
            "`molmoact2.state_norm.constant[1]` is true, but LeRobot's pipeline has no zero mask"
        ),
        "{msg}"
    );
    common::edit_manifest(&dir, |v| {
        v["molmoact2"]["state_norm"]
            .as_object_mut()
            .unwrap()
            .remove("constant");
        v["molmoact2"]["state_norm"]["eps"] = 0.0.into();
    });
    let msg = open_err(&dir);
    assert!(
        msg.contains("`molmoact2.state_norm.eps` 0 is not a positive finite value"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bundle that follows LeRobot's pipeline refuses a pass-through gripper outside [-1, 1]
/// as that pipeline does (no action: the loop holds), where the HF normalizer clips it.
#[test]
fn a_gripper_lerobot_refuses_is_refused_not_clipped() {
    let Some(backend) = common::backend() else {
        return;
    };
    let dir = common::copy_fixture("molmoact2-lp-vtp-sd", "lerobot-gripper");
    common::edit_manifest(&dir, |v| {
        let dims = v["molmoact2"]["state_dims"].as_u64().unwrap() as usize;
        let mut passthrough = vec![false; dims];
        passthrough[dims - 1] = true;
        v["molmoact2"]["state_norm"]["passthrough"] = serde_json::json!(passthrough);
        for n in ["state_norm", "action_norm"] {
            v["molmoact2"][n]["follows"] = "lerobot_pipeline".into();
        }
    });
    let bundle = Bundle::open(&dir).unwrap();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    let obs = ObservationFile::load(&bundle.path("golden/end_to_end.npz")).unwrap();
    let g = policy.geometry();
    let mut actions = vec![0f32; g.chunk_len * g.action_dims];
    let last = g.state_dims - 1;
    for (gripper, refused) in [
        (1.5f32, true),
        (-1.0000001, true),
        (1.0, false),
        (-0.25, false),
    ] {
        let mut state = obs.state.clone();
        state[last] = gripper;
        let o = Observation {
            state: &state,
            ..obs.observation()
        };
        match policy.infer(&o, &mut actions) {
            Err(e) => {
                let msg = e.to_string();
                assert!(refused, "gripper {gripper}: {msg}");
                assert_eq!(
                    msg,
                    format!("observation state: expected pass-through (gripper) values in [-1, 1], as LeRobot's pipeline demands, found {gripper} at index {last}")
                );
            }
            Ok(()) => assert!(!refused, "gripper {gripper} must be refused"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn manifest_and_context_contract_mismatch_names_component_and_tensor() {
    let Some(backend) = common::backend() else {
        return;
    };
    let dir = common::copy_fixture("molmoact2-lp-vtp-sd", "contract");
    let s = serde_json::from_slice::<serde_json::Value>(
        &std::fs::read(dir.join("bundle.json")).unwrap(),
    )
    .unwrap()["molmoact2"]["seq_len"]
        .as_u64()
        .unwrap();
    common::edit_manifest(&dir, |v| v["molmoact2"]["seq_len"] = (s + 8).into());
    let bundle = Bundle::open(&dir).unwrap();
    let err = Policy::load(&bundle, &backend)
        .err()
        .expect("contract mismatch");
    let msg = err.to_string();
    assert!(matches!(err, PolicyError::Contract { .. }), "{msg}");
    assert!(
        msg.contains("component `llm_split0` tensor `hidden_states`")
            && msg.contains(&format!("expected shape [1,{},", s + 8))
            && msg.contains(&format!("found shape [1,{s},")),
        "{msg}"
    );

    // A context swapped for another component's binary.
    common::edit_manifest(&dir, |v| v["molmoact2"]["seq_len"] = s.into());
    std::fs::copy(
        dir.join("ctx/vision_socid77_archv73.bin"),
        dir.join("ctx/action_context_socid77_archv73.bin"),
    )
    .unwrap();
    let bundle = Bundle::open(&dir).unwrap();
    let msg = Policy::load(&bundle, &backend)
        .err()
        .expect("wrong binary")
        .to_string();
    assert!(msg.contains("component `action_context`"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_observations_are_refused_before_any_context_runs() {
    let Some(backend) = common::backend() else {
        return;
    };
    let bundle = Bundle::open(common::fixture("molmoact2-lp-vtp-sd")).unwrap();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    let obs = ObservationFile::load(&bundle.path("golden/end_to_end.npz")).unwrap();
    let g = policy.geometry();
    let mut actions = vec![0f32; g.chunk_len * g.action_dims];
    let base = obs.observation();

    let wrong_id = Observation {
        instruction_id: g.instructions as u32,
        ..base
    };
    let msg = policy
        .infer(&wrong_id, &mut actions)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("observation instruction_id")
            && msg.contains(&format!("found {}", g.instructions)),
        "{msg}"
    );

    let short = &obs.frames[..obs.frames.len() / 2];
    let wrong_geometry = Observation {
        height: obs.height / 2,
        frames: short,
        ..base
    };
    let msg = policy
        .infer(&wrong_geometry, &mut actions)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("observation frames")
            && msg.contains(&format!("{}x{}", obs.height / 2, obs.width)),
        "{msg}"
    );

    let truncated = Observation {
        frames: short,
        ..base
    };
    assert!(policy
        .infer(&truncated, &mut actions)
        .unwrap_err()
        .to_string()
        .contains("bytes"));

    let mut nan_state = obs.state.clone();
    nan_state[2] = f32::NAN;
    let nan = Observation {
        state: &nan_state,
        ..base
    };
    let msg = policy.infer(&nan, &mut actions).unwrap_err().to_string();
    assert!(
        msg.contains("observation state") && msg.contains("index 2"),
        "{msg}"
    );
    assert!(
        actions.iter().all(|a| *a == 0.0),
        "no action written on refusal"
    );

    policy
        .infer(&base, &mut actions)
        .expect("the same policy still runs a good observation");
}

#[test]
fn non_finite_outputs_are_reported_with_the_component_never_as_actions() {
    // The HTP saturates rather than producing NaN/Inf (checked: huge inputs, Log/Sqrt of
    // negatives), so outputs are poisoned after real execution to drive the guards.
    let Some(backend) = common::backend() else {
        return;
    };
    for (name, components) in [
        (
            "molmoact2-lp-vtp-sd",
            // Each scan runs during the next context: split 0's during split 1, the
            // last split's (3) during action_context.
            &[
                "vision",
                "llm_split0",
                "llm_split1",
                "llm_split3",
                "action_context",
                "action_step",
            ][..],
        ),
        ("fastwam", &["action_step"][..]),
    ] {
        let bundle = Bundle::open(common::fixture(name)).unwrap();
        let mut policy = Policy::load(&bundle, &backend).unwrap();
        let obs = ObservationFile::load(&bundle.path("golden/end_to_end.npz")).unwrap();
        let g = policy.geometry();
        let mut actions = vec![0f32; g.chunk_len * g.action_dims];
        for component in components {
            policy.inject_non_finite(Some(component));
            actions.iter_mut().for_each(|a| *a = 0.0);
            let err = policy.infer(&obs.observation(), &mut actions).unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(&err, PolicyError::NonFinite { component: c, .. } if c == component),
                "{name}/{component}: {msg}"
            );
            assert!(msg.contains("no action published"), "{msg}");
            assert!(
                actions.iter().all(|a| *a == 0.0),
                "{name}/{component}: actions written despite NaN"
            );
        }
        policy.inject_non_finite(None);
        policy
            .infer(&obs.observation(), &mut actions)
            .expect("recovers on the next inference");
        assert!(actions.iter().all(|a| a.is_finite()));
    }
}

#[test]
fn non_finite_world_model_inputs_are_refused_at_load() {
    let Some(backend) = common::backend() else {
        return;
    };
    let dir = common::copy_fixture("fastwam", "inf");
    let path = dir.join("inputs/world_model.npz");
    let npz = Npz::open(&path).unwrap();
    let arrays: Vec<Array> = npz
        .names()
        .map(|n| {
            let a = npz.array(n).unwrap();
            if n == "context" {
                let mut v = a.to_f32().unwrap();
                v[3] = f32::INFINITY;
                Array::from_f32(n, a.shape(), &v).unwrap()
            } else {
                a
            }
        })
        .collect();
    write_npz(&path, &arrays.iter().collect::<Vec<_>>()).unwrap();
    let msg = Policy::load(&Bundle::open(&dir).unwrap(), &backend)
        .err()
        .expect("inf input")
        .to_string();
    assert!(
        msg.contains("world_model") && msg.contains("context[3]"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_instruction_padded_unlike_the_export_is_refused() {
    // The fixture contexts bake RoPE positions for 3 rows of left padding; claiming 2 makes
    // every instruction's padding disagree with the export.
    let dir = common::copy_fixture("molmoact2-original", "rope-pad");
    common::edit_manifest(&dir, |v| v["molmoact2"]["rope_left_pad"] = 99.into());
    let msg = open_err(&dir);
    assert!(
        msg.contains("molmoact2.rope_left_pad") && msg.contains("below seq_len 99"),
        "{msg}"
    );
    let Some(backend) = common::backend() else {
        return;
    };
    common::edit_manifest(&dir, |v| v["molmoact2"]["rope_left_pad"] = 2.into());
    let bundle = Bundle::open(&dir).unwrap();
    let msg = Policy::load(&bundle, &backend)
        .err()
        .expect("shifted positions")
        .to_string();
    assert!(
        msg.contains("instruction 0 has 96 tokens after 3 rows of padding")
            && msg.contains("for 97 tokens after 2 rows (molmoact2.rope_left_pad)"),
        "{msg}"
    );
}

/// Fast-WAM closed loop: each broken bundle or observation is refused with one line
/// naming the thing, before anything runs.
#[test]
fn fastwam_chain_bad_input_is_named() {
    // Split layer counts that do not add up to action_step's (4).
    let dir = common::copy_fixture("fastwam-closed-loop", "layers");
    let Some(backend) = common::backend() else {
        return;
    };
    common::edit_manifest(&dir, |v| {
        v["fastwam"]["chain"]["prefill_layers"] = serde_json::json!([1, 2, 2])
    });
    let bundle = Bundle::open(&dir).unwrap();
    let msg = Policy::load(&bundle, &backend)
        .err()
        .expect("layer sum")
        .to_string();
    assert!(
        msg.contains("component `action_step` tensor `video_keys`")
            && msg.contains("add up to 5 layers")
            && msg.contains("found shape [4,1,32,32]"),
        "{msg}"
    );
    // A context whose tensors disagree with the manifest.
    common::edit_manifest(&dir, |v| {
        v["fastwam"]["chain"]["prefill_layers"] = serde_json::json!([1, 2, 1]);
        v["fastwam"]["chain"]["latent_channels"] = 5.into();
    });
    let bundle = Bundle::open(&dir).unwrap();
    let msg = Policy::load(&bundle, &backend)
        .err()
        .expect("contract")
        .to_string();
    assert!(
        msg.contains("component `wm_vae_enc` tensor `latents`")
            && msg.contains("expected shape [1,5,8,16]"),
        "{msg}"
    );
    // An instruction without text rows.
    common::edit_manifest(&dir, |v| {
        v["fastwam"]["chain"]["latent_channels"] = 4.into();
        v["fastwam"]["chain"]["instructions"]
            .as_array_mut()
            .unwrap()
            .push("pick up the soup".into());
    });
    let bundle = Bundle::open(&dir).unwrap();
    let msg = Policy::load(&bundle, &backend)
        .err()
        .expect("text rows")
        .to_string();
    assert!(msg.contains("instruction 2 has no text rows"), "{msg}");
    // Manifest rules: rotate_180 per camera, no world_model with a chain.
    common::edit_manifest(&dir, |v| {
        v["fastwam"]["chain"]["instructions"]
            .as_array_mut()
            .unwrap()
            .pop();
        v["fastwam"]["chain"]["rotate_180"] = serde_json::json!([true]);
    });
    assert!(open_err(&dir).contains("`fastwam.chain.rotate_180` has 1 values, expected 2"));
    let _ = std::fs::remove_dir_all(&dir);

    // Wrong image size and wrong state length.
    let bundle = Bundle::open(common::fixture("fastwam-closed-loop")).unwrap();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    let obs = ObservationFile::load(&bundle.path("golden/end_to_end.npz")).unwrap();
    let g = policy.geometry();
    let mut actions = vec![0f32; g.chunk_len * g.action_dims];
    let base = obs.observation();
    let small = Observation {
        height: base.height - 1,
        frames: &base.frames[..base.frames.len() - 2 * base.width * 3],
        ..base
    };
    let msg = policy.infer(&small, &mut actions).unwrap_err().to_string();
    assert!(
        msg.starts_with("observation frames: expected 2 cameras of 40x48 RGB8")
            && msg.contains("found 2 cameras of 39x48"),
        "{msg}"
    );
    let short = Observation {
        state: &base.state[..7],
        ..base
    };
    let msg = policy.infer(&short, &mut actions).unwrap_err().to_string();
    assert_eq!(msg, "observation state: expected 8 values, found 7 values");
    let bad_instr = Observation {
        instruction_id: 2,
        ..base
    };
    let msg = policy
        .infer(&bad_instr, &mut actions)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("observation instruction_id: expected 0..2"),
        "{msg}"
    );
    assert!(actions.iter().all(|a| *a == 0.0), "nothing is published");
}

/// `state_input: eef_pos_quat_gripper`: a quaternion with a non-finite value, or one whose
/// axis-angle overflows f32, is refused before any context runs (the loop then publishes
/// hold), naming the state; nothing is written; the ring's 8-value state of the default
/// input is refused by length; the same policy then runs a good observation.
#[test]
fn a_quaternion_that_does_not_convert_is_refused_never_converted() {
    let Some(backend) = common::backend() else {
        return;
    };
    let dir = common::quaternion_state_fixture("quat-bad");
    let bundle = Bundle::open(&dir).unwrap();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    let file = ObservationFile::load(&bundle.path(&bundle.manifest.end_to_end)).unwrap();
    let base = file.observation();
    assert_eq!(base.state.len(), 9);
    let g = policy.geometry();
    let mut actions = vec![0f32; g.chunk_len * g.action_dims];
    for (index, value) in [
        (3, f32::NAN),
        (6, f32::NAN),
        (4, f32::INFINITY),
        (5, f32::NEG_INFINITY),
    ] {
        let mut state = base.state.to_vec();
        state[index] = value;
        let obs = Observation {
            state: &state,
            ..base
        };
        let msg = policy.infer(&obs, &mut actions).unwrap_err().to_string();
        assert!(
            msg.contains("observation state") && msg.contains(&format!("index {index}")),
            "{msg}"
        );
    }
    // Finite, but x * 2 * acos(w) / sqrt(1 - w^2) is past f32's range.
    let mut state = base.state.to_vec();
    state[3..7].copy_from_slice(&[3e38, 0.0, 0.0, 0.5]);
    let obs = Observation {
        state: &state,
        ..base
    };
    let msg = policy.infer(&obs, &mut actions).unwrap_err().to_string();
    assert!(
        msg.contains("observation state") && msg.contains("quaternion"),
        "{msg}"
    );
    // The converted 8-vector, as a robot of the default input would write it.
    let eight = [&base.state[..3], &[3.1, 0.2, -0.1], &base.state[7..]].concat();
    let obs = Observation {
        state: &eight,
        ..base
    };
    let msg = policy.infer(&obs, &mut actions).unwrap_err().to_string();
    assert!(
        msg.contains("expected 9 values") && msg.contains("found 8 values"),
        "{msg}"
    );
    assert!(
        actions.iter().all(|a| *a == 0.0),
        "no action written on refusal"
    );
    policy
        .infer(&base, &mut actions)
        .expect("the same policy still runs a good observation");
    let want = Npz::open(bundle.path(&bundle.manifest.end_to_end))
        .unwrap()
        .array("actions")
        .unwrap()
        .to_f32()
        .unwrap();
    let c = vla_tensor::compare(&actions, &want, 0.0, 0.0).cosine;
    assert!(c >= 0.999, "actions cosine {c} against the golden");
    let _ = std::fs::remove_dir_all(&dir);
}
