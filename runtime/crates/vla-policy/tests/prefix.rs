//! Prefix conditioning on the HTP emulator, for each kind of flow loop: Fast-WAM (Wan
//! Euler), MolmoAct2 with a velocity output, and Drift-KeyStone (next-trajectory output,
//! K candidates sharing the prefix). The frozen rows come out as the prefix, the overlap
//! stays nearer to it than an unconditioned chunk, and nothing non-finite comes out. The
//! closed-loop Fast-WAM fixture has `gripper_map: libero`: its frozen gripper values only
//! come back as the prefix's if the map (`-(2g - 1)`) is undone before normalizing.
//! Inpainting runs on the two kinds of update it must work after (Wan Euler, and
//! KeyStone's next-trajectory output with its candidates).

mod common;

use vla_policy::{ActionPrefix, Bundle, ObservationFile, Policy, PrefixMethod};

fn conditioned(name: &str, method: PrefixMethod) {
    conditioned_at(name, &common::fixture(name), method);
}

fn conditioned_at(name: &str, dir: &std::path::Path, method: PrefixMethod) {
    let Some(backend) = common::backend() else {
        return;
    };
    let bundle = Bundle::open(dir).unwrap();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    let g = policy.geometry();
    let (h, dims) = (g.chunk_len, g.action_dims);
    let file = ObservationFile::load(&bundle.path(&bundle.manifest.end_to_end)).unwrap();
    let obs = file.observation();
    let mut plain = vec![0f32; h * dims];
    policy.infer(&obs, &mut plain).unwrap();
    // The previous chunk: the plain one, captured 2 steps earlier, so the overlap is
    // H - 2 rows, padded with its last row; 3 rows frozen.
    let (shift, frozen) = (2, 3);
    let mut prefix = vec![0f32; h * dims];
    for j in 0..h {
        let src = (j + shift).min(h - 1);
        prefix[j * dims..(j + 1) * dims].copy_from_slice(&plain[src * dims..(src + 1) * dims]);
    }
    let p = ActionPrefix {
        actions: &prefix,
        frozen,
        overlap: h - shift,
        method,
    };
    let mut out = vec![0f32; h * dims];
    // Another seed, as the next observation would have.
    let mut next = obs;
    next.seed = obs.seed.wrapping_add(1);
    policy.infer_with_prefix(&next, &p, &mut out).unwrap();
    assert!(out.iter().all(|v| v.is_finite()), "{name}");
    for j in 0..frozen {
        for i in 0..dims {
            let (a, b) = (out[j * dims + i], prefix[j * dims + i]);
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{name}: frozen row {j} dim {i}: {a} vs prefix {b}"
            );
        }
    }
    let mut free = vec![0f32; h * dims];
    policy.infer(&next, &mut free).unwrap();
    let dist = |x: &[f32]| -> f32 {
        (frozen..h - shift)
            .flat_map(|j| (0..dims).map(move |i| j * dims + i))
            .map(|k| (x[k] - prefix[k]).powi(2))
            .sum()
    };
    eprintln!(
        "{name} ({method:?}): overlap distance to the prefix conditioned {:.4e}, unconditioned {:.4e}",
        dist(&out),
        dist(&free)
    );
    assert!(
        dist(&out) < dist(&free),
        "{name}: the overlap follows the prefix"
    );
}

#[test]
fn fastwam_continues_the_prefix() {
    conditioned("fastwam", PrefixMethod::VelocityMask);
}

#[test]
fn fastwam_inpainting_continues_the_prefix() {
    conditioned("fastwam", PrefixMethod::Inpaint);
}

#[test]
fn fastwam_closed_loop_with_the_libero_gripper_map_continues_the_prefix() {
    // The fixture binarizes as upstream's eval does, and a binarized gripper cannot be
    // continued exactly: this copy keeps the map and drops the binarization.
    let dir = common::copy_fixture("fastwam-closed-loop", "prefix-libero");
    common::edit_manifest(&dir, |v| v["fastwam"]["gripper_binarize"] = false.into());
    let bundle = Bundle::open(&dir).unwrap();
    let f = bundle.manifest.fastwam().unwrap();
    assert_eq!(f.gripper_map, vla_policy::manifest::GripperMap::Libero);
    assert!(!f.gripper_binarize);
    conditioned_at("fastwam-closed-loop", &dir, PrefixMethod::VelocityMask);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn molmoact2_velocity_continues_the_prefix() {
    conditioned("molmoact2-lp-vtp-sd", PrefixMethod::VelocityMask);
}

#[test]
fn drift_keystone_next_trajectory_continues_the_prefix() {
    conditioned("molmoact2-drift-keystone", PrefixMethod::VelocityMask);
}

#[test]
fn drift_keystone_inpainting_continues_the_prefix() {
    conditioned("molmoact2-drift-keystone", PrefixMethod::Inpaint);
}
