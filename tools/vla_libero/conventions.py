"""Each policy's LIBERO conventions at the ring, as its upstream eval has them, and the
bundle facts the robot needs (ring geometry, instructions). Upstream Fast-WAM
(experiments/libero/eval_libero_single.py, libero_utils.py, configs/sim_libero.yaml):
cameras agent view then wrist, each turned 180 degrees (`img[::-1, ::-1]`), rendered at 256;
state `eef_pos + quat2axisangle(eef_quat) + gripper_qpos` (robosuite's function, f64 in, f32
out); 30 no-op steps `[0, 0, 0, 0, 0, 0, -1]` after the init state; 10 of the 32 actions per
inference; at most 400 policy steps (spatial, object, goal) or 700 (libero_10, libero_90);
the gripper mapped `-(2g - 1)` and binarized before `env.step` (vlad does that: the bundle's
`gripper_map: libero`, `gripper_binarize`), so the robot applies ring values as they are."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .ring import Geometry

# Upstream's per-suite episode length (policy steps, after the no-op steps).
MAX_STEPS = {"libero_spatial": 400, "libero_object": 400, "libero_goal": 400, "libero_10": 700, "libero_90": 700}
NOOP_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
UPSTREAM_RESOLUTION = 256


class BundleError(Exception):
    """A bundle the LIBERO robot cannot drive; the message names the file and key."""


@dataclass(frozen=True)
class Conventions:
    policy: str
    num_steps_wait: int
    execute_steps: int
    chunk_len: int
    geometry: Geometry
    instructions: tuple[str, ...]
    state_input: str
    chain: dict

    def max_steps(self, suite: str) -> int:
        return MAX_STEPS[suite]


def from_bundle(bundle: Path) -> Conventions:
    """Fast-WAM closed loop: the only policy whose LIBERO robot side is done (MolmoAct2's
    LeRobot LIBERO processing is not yet checked here)."""
    path = Path(bundle) / "bundle.json"
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BundleError(f"bundle {path}: {e}") from e
    if m.get("policy") != "fastwam" or not isinstance(m.get("fastwam", {}).get("chain"), dict):
        raise BundleError(f"bundle {path}: `policy` {m.get('policy')!r} without `fastwam.chain`: the LIBERO robot "
                          "drives closed-loop Fast-WAM bundles (MolmoAct2 is not checked yet)")
    f = m["fastwam"]
    c = f["chain"]
    state_input = c.get("state_input", "state")
    if state_input != "eef_pos_quat_gripper":
        raise BundleError(f"bundle {path}: `fastwam.chain.state_input` is {state_input!r}: the LIBERO robot writes "
                          "the raw robot state, set it to \"eef_pos_quat_gripper\" (docs/bundle-format.md)")
    if c["cameras"] != 2 or list(c["rotate_180"]) != [True, True]:
        raise BundleError(f"bundle {path}: `fastwam.chain` needs 2 cameras turned 180 degrees (agent view, wrist), "
                          f"found cameras {c['cameras']} rotate_180 {c['rotate_180']}")
    geometry = Geometry(cameras=2, height=c["frame_height"], width=c["frame_width"], state_dims=9,
                        action_dims=f["action_dims"], chunk_len=f["action_horizon"])
    return Conventions(policy="fastwam", num_steps_wait=30, execute_steps=10, chunk_len=f["action_horizon"],
                       geometry=geometry, instructions=tuple(c["instructions"]), state_input=state_input, chain=c)


FIXTURE = Path(__file__).resolve().parents[2] / "golden" / "bundles" / "fastwam-closed-loop"


def fixture_bundle(dst: Path) -> Path:
    """The closed-loop Fast-WAM fixture as a LIBERO robot drives it: the raw 9-value state
    (`state_input: eef_pos_quat_gripper`), gated by its quaternion golden (the same
    observation with the quaternion, scripts/make_golden.py). Two cameras at 40 x 48, two
    instructions that are no LIBERO task's (hence `--instruction-id`)."""
    import shutil
    dst = Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(FIXTURE, dst)
    m = json.loads((dst / "bundle.json").read_text())
    m["fastwam"]["chain"]["state_input"] = "eef_pos_quat_gripper"
    m["end_to_end"] = "golden/end_to_end_quat.npz"
    (dst / "bundle.json").write_text(json.dumps(m, indent=1))
    return dst


def instruction_id(conv: Conventions, language: str, override: int | None) -> int:
    """The bundle's instruction for the task's language (or the override, for a fixture
    whose tiny prompt table has no LIBERO task)."""
    if override is not None:
        if not 0 <= override < len(conv.instructions):
            raise BundleError(f"--instruction-id {override}: the bundle has {len(conv.instructions)} instructions")
        return override
    if language not in conv.instructions:
        raise BundleError(f"task {language!r} is not among the bundle's instructions {list(conv.instructions)}")
    return conv.instructions.index(language)


def upstream_images(obs: dict) -> np.ndarray:
    """What upstream's `get_libero_image` hands the model: agent view, wrist, each turned."""
    return np.stack([np.ascontiguousarray(obs[k][::-1, ::-1])
                     for k in ("agentview_image", "robot0_eye_in_hand_image")])


def upstream_state(obs: dict) -> np.ndarray:
    """Upstream's `_extract_sim_state`: robosuite's own quat2axisangle on MuJoCo's f64."""
    from robosuite.utils.transform_utils import quat2axisangle
    return np.concatenate([obs["robot0_eef_pos"], quat2axisangle(np.array(obs["robot0_eef_quat"], np.float64)),
                           obs["robot0_gripper_qpos"]]).astype(np.float32)


def upstream_model_image(images: np.ndarray, width: int, height: int) -> np.ndarray:
    """Upstream's `_obs_to_model_input` image: per camera `_center_crop_resize` (Pillow
    BILINEAR to `round(src * max(w/src_w, h/src_h))`, centre crop), side by side,
    `x * 2/255 - 1`, NCHW f32."""
    from PIL import Image
    out = []
    for img in images:
        pil = Image.fromarray(img)
        src_w, src_h = pil.size
        scale = max(width / src_w, height / src_h)
        resized = pil.resize((round(src_w * scale), round(src_h * scale)), resample=Image.BILINEAR)
        left, top = max((resized.size[0] - width) // 2, 0), max((resized.size[1] - height) // 2, 0)
        out.append(np.asarray(resized.crop((left, top, left + width, top + height)), np.uint8))
    x = np.concatenate(out, axis=1).astype(np.float32)
    return (x * np.float32(2.0 / 255.0) - np.float32(1.0)).transpose(2, 0, 1)[None]
