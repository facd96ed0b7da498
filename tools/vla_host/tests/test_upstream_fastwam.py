"""tools/vla_host/vla_host/reference.py's Fast-WAM host glue against golden/upstream-fastwam/, the outputs of
the public Fast-WAM code itself (tools/goldens/vla_goldens/upstream_fastwam.py): bit for bit, everything
(uint8 images, the f32 scaling, normalizer, gripper post-processing)."""

from pathlib import Path

import numpy as np
import pytest

from vla_host import reference as ref
from vla_host.det_npz import load_npz

G = Path(__file__).resolve().parents[3] / "golden" / "upstream-fastwam"


def bits_equal(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    bad = a.view(np.uint32) != b.view(np.uint32)
    assert not bad.any(), f"{bad.sum()} of {bad.size} differ, first at {np.argwhere(bad)[0]}: {a[bad][0]} vs {b[bad][0]}"


def norm_of(g, part, mode):
    if mode == "min_max":
        return {"mode": mode, "low": g[f"{part}_min"], "high": g[f"{part}_max"]}
    if mode == "quantile":
        return {"mode": mode, "low": g[f"{part}_q01"], "high": g[f"{part}_q99"]}
    return {"mode": mode, "mean": g[f"{part}_mean"], "std": g[f"{part}_std"]}


@pytest.mark.parametrize("mode", ["min_max", "quantile", "mean_std"])
def test_normalizer_matches_upstream(mode):
    g = load_npz(G / "normalizer.npz")
    bits_equal(ref.fastwam_normalize(g["state_raw"], norm_of(g, "state", mode)), g[f"{mode}_state"])
    bits_equal(ref.fastwam_denormalize(g["action_normalized"], norm_of(g, "action", mode)), g[f"{mode}_action"])


def test_libero_eval_image_state_and_actions_match_upstream():
    g, n = load_npz(G / "libero_eval.npz"), load_npz(G / "normalizer.npz")
    chain = {"rotate_180": [True, True], "camera_width": 224, "camera_height": 224}
    bits_equal(ref.fastwam_image(np.stack([g["agentview_image"], g["wrist_image"]]), chain),
               g["image_levels"][g["image_index"]])
    bits_equal(ref.fastwam_normalize(g["state"], norm_of(n, "state", "min_max")), g["proprio"][0])
    actions = ref.fastwam_denormalize(g["action_normalized"], norm_of(n, "action", "min_max"))
    for key, binarize in (("actions", False), ("actions_binarized", True)):
        bits_equal(ref.fastwam_gripper(actions, {"gripper_map": "libero", "gripper_binarize": binarize}), g[key])


def test_center_crop_resize_matches_upstream():
    g = load_npz(G / "center_crop.npz")
    for key in (k for k in g if k.startswith("out_")):
        (h, w), (ch, cw) = [tuple(map(int, s.split("x"))) for s in key[4:].split("_to_")]
        np.testing.assert_array_equal(ref.center_crop_resize(g[f"src_{h}x{w}"], cw, ch), g[key], err_msg=key)


@pytest.mark.parametrize("version,order", [("12.0.0", "pillow12"), ("13.0.0", "pillow13")])
def test_resize_matches_each_pillow_release(version, order):
    g = load_npz(G / f"pillow_resize_{version}.npz")
    for key in (k for k in g if k.startswith("out_")):
        (h, w), (oh, ow) = [tuple(map(int, s.split("x"))) for s in key[4:].split("_to_")]
        np.testing.assert_array_equal(ref.pil_resize_bilinear(g[f"src_{h}x{w}"], ow, oh, order), g[key], err_msg=key)
