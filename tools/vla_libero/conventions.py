"""Each policy's LIBERO conventions at the ring, as its upstream eval has them, and the
bundle facts the robot needs (ring geometry, instructions).

Upstream Fast-WAM
(experiments/libero/eval_libero_single.py, libero_utils.py, configs/sim_libero.yaml):
cameras agent view then wrist, each turned 180 degrees (`img[::-1, ::-1]`), rendered at 256;
state `eef_pos + quat2axisangle(eef_quat) + gripper_qpos` (robosuite's function, f64 in, f32
out); 30 no-op steps `[0, 0, 0, 0, 0, 0, -1]` after the init state; 10 of the 32 actions per
inference; at most 400 policy steps (spatial, object, goal) or 700 (libero_10, libero_90);
the gripper mapped `-(2g - 1)` and binarized before `env.step` (vlad does that: the bundle's
`gripper_map: libero`, `gripper_binarize`), so the robot applies ring values as they are.

MolmoAct2 is evaluated through LeRobot (src/lerobot/envs/libero.py, processor/env_processor.py
`LiberoProcessorStep`, huggingface/lerobot 7427f31): `agentview_image` as
`observation.images.image`, `robot0_eye_in_hand_image` as `image2`, both flipped in H and W
by the processor; `observation.state` = eef_pos + its own f32 quat2axisangle (zeros unless
`sqrt(1 - w^2) > 1e-10`) + gripper_qpos; 10 no-op steps; at most 280 (spatial, object), 300
(goal), 520 (libero_10), 400 (libero_90) steps; actions to `env.step` as the policy outputs
them. A MolmoAct2 bundle takes the processed frames and the 8-value state (no turn, no
conversion in vlad), so the robot does LeRobot's processing before the ring."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .ring import Geometry

# Upstream's per-suite episode length (policy steps, after the no-op steps).
MAX_STEPS = {"libero_spatial": 400, "libero_object": 400, "libero_goal": 400, "libero_10": 700, "libero_90": 700}
LEROBOT_MAX_STEPS = {"libero_spatial": 280, "libero_object": 280, "libero_goal": 300, "libero_10": 520,
                     "libero_90": 400}
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
    max_steps_table: dict = None

    def max_steps(self, suite: str) -> int:
        return (self.max_steps_table or MAX_STEPS)[suite]

    def ring_frames(self, obs: dict) -> np.ndarray:
        """What the robot writes: Fast-WAM's bundle turns the frames itself (`rotate_180`),
        MolmoAct2's takes them as LeRobot's processor hands them on."""
        from .sim import raw_frames
        return upstream_images(obs) if self.policy == "molmoact2" else raw_frames(obs)

    def ring_state(self, obs: dict) -> np.ndarray:
        """Fast-WAM: the raw 9 values (vlad converts); MolmoAct2: LeRobot's 8."""
        from .sim import raw_state
        return lerobot_state(obs).astype(np.float64) if self.policy == "molmoact2" else raw_state(obs)


def from_bundle(bundle: Path) -> Conventions:
    """A closed-loop Fast-WAM bundle or a MolmoAct2 bundle."""
    path = Path(bundle) / "bundle.json"
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BundleError(f"bundle {path}: {e}") from e
    if m.get("policy") == "molmoact2" and isinstance(m.get("molmoact2"), dict):
        return _molmoact2(path, m["molmoact2"])
    if m.get("policy") != "fastwam" or not isinstance(m.get("fastwam", {}).get("chain"), dict):
        raise BundleError(f"bundle {path}: `policy` {m.get('policy')!r} without `fastwam.chain`: the LIBERO robot "
                          "drives closed-loop Fast-WAM and MolmoAct2 bundles")
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


def _molmoact2(path: Path, c: dict) -> Conventions:
    if c["cameras"] != 2 or c["state_dims"] != 8:
        raise BundleError(f"bundle {path}: `molmoact2` needs 2 cameras (image, image2) and state_dims 8 (LeRobot's "
                          f"LIBERO observation.state), found cameras {c['cameras']} state_dims {c['state_dims']}")
    geometry = Geometry(cameras=2, height=c["frame_height"], width=c["frame_width"], state_dims=8,
                        action_dims=c["action_dims"], chunk_len=c["action_horizon"])
    # Every row of a chunk: LeRobot's eval plays the policy's n_action_steps, which the
    # bundle does not carry (MolmoAct2's value is not verified here).
    return Conventions(policy="molmoact2", num_steps_wait=10, execute_steps=c["action_horizon"],
                       chunk_len=c["action_horizon"], geometry=geometry, instructions=tuple(c["instructions"]),
                       state_input="state", chain=c, max_steps_table=LEROBOT_MAX_STEPS)


def lerobot_state(obs: dict) -> np.ndarray:
    """LeRobot's `LiberoProcessorStep` state in f32: eef_pos, its quat2axisangle (w clamped,
    `den = sqrt(max(1 - w^2, 0))`, zeros unless den > 1e-10), gripper_qpos."""
    q = np.asarray(obs["robot0_eef_quat"], np.float32)
    w = np.clip(q[3], np.float32(-1), np.float32(1))
    den = np.sqrt(np.maximum(np.float32(1) - w * w, np.float32(0)))
    aa = (q[:3] / den) * (np.float32(2) * np.arccos(w)) if den > 1e-10 else np.zeros(3, np.float32)
    return np.concatenate([np.asarray(obs["robot0_eef_pos"], np.float32), aa.astype(np.float32),
                           np.asarray(obs["robot0_gripper_qpos"], np.float32)])


FIXTURE = Path(__file__).resolve().parents[2] / "golden" / "bundles" / "fastwam-closed-loop"
MOLMOACT2_FIXTURE = Path(__file__).resolve().parents[2] / "golden" / "bundles" / "molmoact2-upstream-sd"


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
