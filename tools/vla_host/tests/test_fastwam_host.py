"""Fast-WAM host glue of the reference: the installed Pillow (the project pin, 13.0.0) is the
golden for the resize in Pillow 13's pass order, golden/upstream-fastwam/ (made by running
upstream Fast-WAM with its pin, Pillow 12.0.0) for everything upstream computes; the
text-row builder is hand-checked."""

import numpy as np
import pytest
from PIL import Image

from vla_host import build_umt5_rows as umt5
from vla_host import reference as ref


@pytest.mark.parametrize("seed", range(4))
def test_resize_is_bit_exact_against_pillow(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        h, w = rng.integers(1, 70, 2)
        oh, ow = rng.integers(1, 70, 2)
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = np.asarray(Image.fromarray(img).resize((int(ow), int(oh)), resample=Image.BILINEAR))
        np.testing.assert_array_equal(ref.pil_resize_bilinear(img, int(ow), int(oh), "pillow13"), want)


def test_libero_frame_geometry():
    img = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    want = np.asarray(Image.fromarray(img).resize((224, 224), resample=Image.BILINEAR))
    np.testing.assert_array_equal(ref.center_crop_resize(img, 224, 224), want)
    chain = {"rotate_180": [True, False], "camera_width": 224, "camera_height": 224}
    x = ref.fastwam_image(np.stack([img, img]), chain)
    assert x.shape == (1, 3, 224, 448)
    np.testing.assert_allclose(x[0, :, 0, 224:], want[0].T * np.float32(2 / 255) - 1)
    # the turned camera sees the unturned one's last row, reversed
    turned = np.asarray(Image.fromarray(np.ascontiguousarray(img[::-1, ::-1])).resize((224, 224), Image.BILINEAR))
    np.testing.assert_allclose(x[0, :, 0, :224], turned[0].T * np.float32(2 / 255) - 1)


def test_normalizer_clamps_state_not_actions_and_gripper_map():
    norm = {"mode": "min_max", "low": [-2.0, 0.5], "high": [2.0, 0.50005]}
    # a range below 1e-4 is only shifted by -low (upstream), not zeroed
    np.testing.assert_array_equal(ref.fastwam_normalize([30.0, 0.7], norm), [5.0, np.float32(0.7) - np.float32(0.5)])
    np.testing.assert_array_equal(ref.fastwam_denormalize([3.0, 0.0], norm)[:1], [6.0])
    a = np.array([[0.0, 0.8], [0.0, 0.1]], np.float32)
    np.testing.assert_allclose(ref.fastwam_gripper(a, {"gripper_map": "libero"})[:, 1], [-0.6, 0.8], atol=1e-6)
    np.testing.assert_array_equal(
        ref.fastwam_gripper(a, {"gripper_map": "libero", "gripper_binarize": True})[:, 1], [-1, 1])


def test_text_rows_are_zeroed_past_the_text_and_padded():
    rows, lengths = umt5.build_text_rows(["open the drawer"], umt5.byte_tokenize, umt5.fixture_encoder(6, 1), 128)
    n = len(umt5.render_prompt("open the drawer").encode()) + 1
    assert rows.shape == (1, 128, 6) and rows.dtype == np.float16 and lengths[0] == n
    assert np.all(rows[0, n:] == 0) and np.all(np.abs(rows[0, :n]).sum(axis=1) > 0)
    assert umt5.render_prompt("x").startswith("A video recorded from a robot's point of view")
    short, _ = umt5.build_text_rows(["open the drawer"], umt5.byte_tokenize, umt5.fixture_encoder(6, 1), 16)
    assert np.all(short[0] != 0)  # cut at 16 tokens, no zero rows


def test_quat2axisangle_equals_robosuites_own_outputs():
    """golden/robosuite/ is robosuite 1.4.0's quat2axisangle itself
    (tools/goldens/vla_goldens/robosuite_quat_goldens.py); the reference's must give the same f32 bits."""
    import json
    from pathlib import Path

    from vla_host.det_npz import load_npz

    root = Path(__file__).resolve().parents[3] / "golden" / "robosuite"
    g = load_npz(root / "quat2axisangle.npz")
    cases = json.loads((root / "quat2axisangle.json").read_text())["cases"]
    assert len(cases) == len(g["quat"]) >= 40
    for name, q, want in zip(cases, g["quat"], g["axisangle"]):
        np.testing.assert_array_equal(ref.quat2axisangle(q), want, err_msg=name)
    state = ref.fastwam_state(np.array([1, 2, 3, 0, 0.6, 0.8, 0, 0.01, -0.01], np.float32),
                              {"state_input": "eef_pos_quat_gripper"})
    np.testing.assert_allclose(state, [1, 2, 3, 0, 0.6 * np.pi, 0.8 * np.pi, 0.01, -0.01], rtol=1e-6)
