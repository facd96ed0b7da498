//! The Fast-WAM host glue against goldens made by running the public Fast-WAM code itself
//! (golden/upstream-fastwam/, `tools/goldens/vla_goldens/upstream_fastwam.py`) and Pillow itself
//! (`tools/goldens/vla_goldens/pillow_goldens.py`, Pillow 12.0.0 = upstream's pin and 13.0.0 = ours): all bit
//! for bit, since every step does the same integer or f32 operations as upstream.

use std::path::PathBuf;
use vla_npz::Npz;
use vla_policy::manifest::{GripperMap, NormMode, Normalization};
use vla_policy::{
    center_crop_geometry, wan_actions, FastWamImage, FastWamNormalizer, PassOrder, PillowBilinear,
};

fn golden(name: &str) -> Npz {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../golden/upstream-fastwam")
        .join(name);
    Npz::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(npz: &Npz, name: &str) -> Vec<f32> {
    npz.array(name).unwrap().to_f32().unwrap()
}

fn u8s(npz: &Npz, name: &str) -> Vec<u8> {
    npz.array(name).unwrap().to_u8().unwrap()
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&i) = bad.first() {
        panic!(
            "{what}: {} of {} values differ, first {i}: {} vs upstream {}",
            bad.len(),
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// `"out_{h}x{w}_to_{oh}x{ow}"` -> ((h, w), (oh, ow)).
fn dims_of(key: &str) -> ((usize, usize), (usize, usize)) {
    let pair = |s: &str| {
        let (a, b) = s.split_once('x').unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    };
    let (a, b) = key.trim_start_matches("out_").split_once("_to_").unwrap();
    (pair(a), pair(b))
}

fn resize(src: &[u8], (h, w): (usize, usize), (oh, ow): (usize, usize), o: PassOrder) -> Vec<u8> {
    let mut r = PillowBilinear::new(h, w, oh, ow, (0, 0, oh, ow), o);
    let mut out = vec![0u8; oh * ow * 3];
    r.run(src, false, |y, row| {
        out[y * ow * 3..][..ow * 3].copy_from_slice(row)
    });
    out
}

/// Both pass orders against the Pillow release that uses them, LIBERO's 256 -> 224 included.
/// The other order is checked to differ where Pillow 13 goes vertical first, so the order
/// really is what makes the match.
#[test]
fn resize_matches_pillow_in_both_pass_orders() {
    for (file, order) in [
        ("pillow_resize_12.0.0.npz", PassOrder::HorizontalFirst),
        ("pillow_resize_13.0.0.npz", PassOrder::Pillow13),
    ] {
        let g = golden(file);
        let keys: Vec<String> = g
            .names()
            .filter(|k| k.starts_with("out_"))
            .map(str::to_string)
            .collect();
        assert_eq!(keys.len(), 7, "{file}");
        let mut vertical = 0;
        for key in &keys {
            let ((h, w), (oh, ow)) = dims_of(key);
            let src = u8s(&g, &format!("src_{h}x{w}"));
            let want = u8s(&g, key);
            assert_eq!(resize(&src, (h, w), (oh, ow), order), want, "{file} {key}");
            let r = PillowBilinear::new(h, w, oh, ow, (0, 0, oh, ow), order);
            if r.vertical_first() {
                vertical += 1;
                let other = resize(&src, (h, w), (oh, ow), PassOrder::HorizontalFirst);
                assert_ne!(
                    other, want,
                    "{file} {key}: the pass order should matter here"
                );
            }
        }
        let expect = if order == PassOrder::Pillow13 { 3 } else { 0 };
        assert_eq!(vertical, expect, "{file}: vertical-first cases");
    }
}

/// Upstream `_center_crop_resize` (aspect-preserving scale, Python round, centre crop) on
/// non-square frames, through the crop window of [`PillowBilinear`].
#[test]
fn center_crop_resize_matches_upstream() {
    let g = golden("center_crop.npz");
    let keys: Vec<String> = g
        .names()
        .filter(|k| k.starts_with("out_"))
        .map(str::to_string)
        .collect();
    assert_eq!(keys.len(), 4);
    for key in &keys {
        let ((h, w), (ch, cw)) = dims_of(key);
        let (rh, rw, top, left) = center_crop_geometry(h, w, ch, cw);
        let mut r = PillowBilinear::new(
            h,
            w,
            rh,
            rw,
            (top, left, ch, cw),
            PassOrder::HorizontalFirst,
        );
        let mut out = vec![0u8; ch * cw * 3];
        r.run(&u8s(&g, &format!("src_{h}x{w}")), false, |y, row| {
            out[y * cw * 3..][..cw * 3].copy_from_slice(row)
        });
        assert_eq!(out, u8s(&g, key), "{key}");
    }
}

fn norm(g: &Npz, part: &str, mode: NormMode) -> Normalization {
    let get = |k: &str| Some(f32s(g, &format!("{part}_{k}")));
    let (low, high, mean, std) = match mode {
        NormMode::MinMax => (get("min"), get("max"), None, None),
        NormMode::Quantile => (get("q01"), get("q99"), None, None),
        _ => (None, None, get("mean"), get("std")),
    };
    Normalization {
        mode,
        follows: Default::default(),
        eps: None,
        low,
        high,
        mean,
        std,
        passthrough: None,
        constant: None,
    }
}

/// Upstream `SingleFieldLinearNormalizer` through the eval's `_normalize_proprio` (state,
/// clamped) and `_denormalize_action` (actions, not clamped), every LIBERO mode, with dims
/// whose range is below 1e-4 and a zero std.
#[test]
fn normalizer_matches_upstream_in_every_mode() {
    let g = golden("normalizer.npz");
    let states = f32s(&g, "state_raw");
    let actions = f32s(&g, "action_normalized");
    for (name, mode) in [
        ("min_max", NormMode::MinMax),
        ("quantile", NormMode::Quantile),
        ("mean_std", NormMode::MeanStd),
    ] {
        let n = FastWamNormalizer::new(&norm(&g, "state", mode), 8);
        let got: Vec<f32> = states
            .iter()
            .enumerate()
            .map(|(j, &x)| n.forward(x, j % 8))
            .collect();
        assert_bits(&got, &f32s(&g, &format!("{name}_state")), name);
        let n = FastWamNormalizer::new(&norm(&g, "action", mode), 7);
        let mut got = vec![0f32; actions.len()];
        n.backward_into(&actions, &mut got);
        assert_bits(&got, &f32s(&g, &format!("{name}_action")), name);
    }
}

/// One LIBERO observation through upstream `_predict_action_chunk` (the model replaced by a
/// stand-in that records its inputs): the image input (both cameras turned, resized,
/// side by side, scaled), the normalized state and the action chunk after de-normalizing
/// and the gripper mapping, with and without `binarize_gripper`.
#[test]
fn libero_eval_observation_and_actions_match_upstream() {
    let g = golden("libero_eval.npz");
    let n = golden("normalizer.npz");
    let mut frames = u8s(&g, "agentview_image");
    frames.extend(u8s(&g, "wrist_image"));
    let mut im = FastWamImage::new(2, (256, 256), (224, 224), &[true, true]);
    let mut image = vec![0f32; im.output_len()];
    im.run(&frames, &mut image);
    let levels = f32s(&g, "image_levels");
    let want: Vec<f32> = u8s(&g, "image_index")
        .iter()
        .map(|&i| levels[usize::from(i)])
        .collect();
    assert_eq!(image.len(), 3 * 224 * 448);
    assert_bits(&image, &want, "image [1,3,224,448]");

    let state_norm = FastWamNormalizer::new(&norm(&n, "state", NormMode::MinMax), 8);
    let proprio: Vec<f32> = f32s(&g, "state")
        .iter()
        .enumerate()
        .map(|(i, &x)| state_norm.forward(x, i))
        .collect();
    assert_bits(&proprio, &f32s(&g, "proprio"), "proprio");

    let action_norm = FastWamNormalizer::new(&norm(&n, "action", NormMode::MinMax), 7);
    let latents = f32s(&g, "action_normalized");
    for (key, binarize) in [("actions", false), ("actions_binarized", true)] {
        let mut actions = vec![0f32; latents.len()];
        wan_actions(
            &action_norm,
            &latents,
            &mut actions,
            7,
            GripperMap::Libero,
            binarize,
        );
        assert_bits(&actions, &f32s(&g, key), key);
    }
}

/// Upstream's `_extract_sim_state` (eef_pos + its `quat2axisangle` copied from robosuite +
/// gripper_qpos, cast to f32) on the eval's observation, against the axis-angle vlad
/// computes from the quaternion as the ring carries it (f32; upstream's was f64, so the
/// axis-angle is compared to within f32 rounding of the input, the rest bit for bit).
#[test]
fn libero_state_from_the_eef_quaternion_matches_upstream() {
    let g = golden("libero_eval.npz");
    let (pos, quat, grip) = (
        f32s(&g, "eef_pos"),
        f32s(&g, "eef_quat"),
        f32s(&g, "gripper_qpos"),
    );
    let want = f32s(&g, "state");
    let aa = vla_policy::quat2axisangle([quat[0], quat[1], quat[2], quat[3]]);
    assert_bits(&pos, &want[..3], "eef_pos");
    assert_bits(&grip, &want[6..], "gripper_qpos");
    for (d, (a, w)) in aa.iter().zip(&want[3..6]).enumerate() {
        assert!(
            (a - w).abs() <= 2e-6 * w.abs().max(1.0),
            "axis-angle[{d}]: {a} vs upstream {w}"
        );
    }
}
