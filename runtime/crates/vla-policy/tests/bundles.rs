//! Every fixture bundle end to end on the HTP emulator: each context against its golden,
//! then observation -> actions against the independent reference (and KeyStone's choice).

mod common;

use vla_policy::{Bundle, Policy};

fn gate(name: &str) {
    gate_at(name, &common::fixture(name));
}

fn gate_at(name: &str, dir: &std::path::Path) {
    let Some(backend) = common::backend() else {
        return;
    };
    let bundle = Bundle::open(dir).unwrap();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    let report = bundle.parity(&mut policy).unwrap();
    assert!(report.passed(), "{name}: {:?}", report.failure_summary());
    let e = &report.end_to_end;
    eprintln!(
        "{name}: end-to-end actions cosine {:.8}, max abs {:.3e}, keystone {:?}",
        e.comparison.cosine, e.comparison.max_abs_diff, e.keystone
    );
    assert!(e.comparison.cosine >= 0.999);
    if name.contains("keystone") {
        let (want, got) = e.keystone.expect("KeyStone bundle reports its choice");
        assert_eq!(want, got, "KeyStone picks the reference's candidate");
    }
}

#[test]
fn molmoact2_original() {
    gate("molmoact2-original");
}

#[test]
fn molmoact2_lp_vtp_sd() {
    gate("molmoact2-lp-vtp-sd");
}

#[test]
fn molmoact2_drift_keystone() {
    gate("molmoact2-drift-keystone");
}

#[test]
fn molmoact2_operator_fused() {
    gate("molmoact2-operator-fused");
}

/// The bundles imported from the tiny release built from upstream's own MolmoAct2 code
/// (golden/upstream-molmoact2; runtime/vlad/tests/upstream_molmoact2.rs checks their
/// actions against upstream's predict_action).
#[test]
fn molmoact2_upstream_original() {
    gate("molmoact2-upstream-original");
}

#[test]
fn molmoact2_upstream_sd() {
    gate("molmoact2-upstream-sd");
}

#[test]
fn molmoact2_upstream_drift_keystone() {
    gate("molmoact2-upstream-drift-keystone");
}

#[test]
fn fastwam() {
    gate("fastwam");
}

#[test]
fn fastwam_closed_loop() {
    gate("fastwam-closed-loop");
}

/// Closed loop: an observation that differs from the golden's only in the camera frames,
/// and one that differs only in the state, each give different actions, each matching the
/// reference's actions for that observation (golden/observation_{camera,state}.npz).
/// The robot writes position, quaternion and gripper (9 values); the host converts the
/// quaternion as robosuite does and the whole chain still matches the reference.
#[test]
fn fastwam_closed_loop_with_the_state_as_libero_writes_it() {
    let dir = common::quaternion_state_fixture("quat-gate");
    let manifest = Bundle::open(&dir).unwrap().manifest;
    assert_eq!(
        manifest.geometry().state_dims,
        9,
        "the ring carries 9 state values"
    );
    gate_at("fastwam-closed-loop (eef_pos_quat_gripper)", &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fastwam_closed_loop_actions_follow_the_camera_and_the_state() {
    let Some(backend) = common::backend() else {
        return;
    };
    let bundle = Bundle::open(common::fixture("fastwam-closed-loop")).unwrap();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    assert!(!policy.open_loop());
    let base = vla_policy::ObservationFile::load(&bundle.path("golden/end_to_end.npz")).unwrap();
    let g = policy.geometry();
    let mut base_actions = vec![0f32; g.chunk_len * g.action_dims];
    policy
        .infer(&base.observation(), &mut base_actions)
        .unwrap();
    for tag in ["camera", "state"] {
        let path = bundle.path(&format!("golden/observation_{tag}.npz"));
        let obs = vla_policy::ObservationFile::load(&path).unwrap();
        match tag {
            "camera" => assert!(obs.frames != base.frames && obs.state == base.state),
            _ => assert!(obs.frames == base.frames && obs.state != base.state),
        }
        let want = vla_npz::Npz::open(&path)
            .unwrap()
            .array("actions")
            .unwrap()
            .to_f32()
            .unwrap();
        let mut actions = vec![0f32; want.len()];
        policy.infer(&obs.observation(), &mut actions).unwrap();
        let moved = vla_tensor::compare(&actions, &base_actions, 1e-3, 1e-2);
        let c = vla_tensor::compare(&actions, &want, 1e-3, 1e-2);
        eprintln!(
            "{tag}-only change: actions move by max {:.3e}; vs reference cosine {:.8}",
            moved.max_abs_diff, c.cosine
        );
        assert!(
            moved.max_abs_diff > 1e-2,
            "{tag}: the actions must follow the {tag}"
        );
        assert!(
            c.cosine >= 0.999,
            "{tag}: cosine {} vs the reference",
            c.cosine
        );
    }
}

#[test]
fn constant_world_model_bundle_says_it_is_open_loop() {
    let Some(backend) = common::backend() else {
        return;
    };
    let bundle = Bundle::open(common::fixture("fastwam")).unwrap();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    assert!(policy.open_loop());
    let report = bundle.parity(&mut policy).unwrap();
    assert!(report.open_loop && report.passed());
}

/// Parity by stage names the first stage that diverges: a golden whose context rows are
/// perturbed (as a wrong proprio row would be) is reported at `context`, not at the actions.
#[test]
fn stage_parity_names_the_first_diverging_stage() {
    let Some(backend) = common::backend() else {
        return;
    };
    let dir = common::copy_fixture("fastwam-closed-loop", "stage");
    let path = dir.join("golden/end_to_end.npz");
    let npz = vla_npz::Npz::open(&path).unwrap();
    let mut arrays: Vec<vla_npz::Array> = npz.names().map(|n| npz.array(n).unwrap()).collect();
    for a in arrays.iter_mut() {
        if a.name() == "context" {
            let mut v = a.to_f32().unwrap();
            let n = v.len();
            v[n - 5..].iter_mut().for_each(|x| *x = -*x * 3.0);
            *a = vla_npz::Array::from_f32("context", a.shape(), &v).unwrap();
        }
    }
    drop(npz);
    vla_npz::write_npz(&path, &arrays.iter().collect::<Vec<_>>()).unwrap();
    let bundle = Bundle::open(&dir).unwrap();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    let report = bundle.parity(&mut policy).unwrap();
    let first = report.first_diverging_stage().expect("a stage diverges");
    assert_eq!(first.name, "context");
    assert!(
        report
            .stages
            .iter()
            .find(|s| s.name == "image")
            .unwrap()
            .passed
    );
    let why = report.failure_summary().unwrap();
    assert!(why.contains("first diverging stage `context`"), "{why}");
    let _ = std::fs::remove_dir_all(&dir);
}
