"""Each policy's LIBERO conventions at the ring, as its upstream eval has them (`UPSTREAM`,
one table with the upstream file and line of each setting), and the bundle facts the robot
needs (ring geometry, instructions).

Fast-WAM's eval feeds `img[::-1, ::-1]` of both cameras and converts the raw state itself;
its bundle turns the frames (`rotate_180`) and converts the state (`state_input:
eef_pos_quat_gripper`) in vlad, and maps the gripper (`gripper_map: libero`, binarized), so
the robot writes raw frames and state and applies ring values as they are. MolmoAct2 is
evaluated through LeRobot's LIBERO env (`LiberoProcessorStep`: both cameras flipped in H and
W, state eef_pos + its own f32 quat2axisangle + gripper_qpos); its bundle takes them as that
processing hands them on, so the robot does that processing before the ring."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .ring import Geometry

# Each policy's upstream LIBERO evaluation, as its eval code has it: one entry per setting,
# each with the upstream file and line it follows (FastWAM at 45d8e14; huggingface/lerobot at
# 7427f31). Written into every report; tests/test_conventions.py holds it to the copy in
# golden/libero/upstream-settings.json, taken from those files separately.
UPSTREAM = {
    "fastwam": {
        "stack": {"value": {"libero": "official LIBERO (Lifelong-Robot-Learning/LIBERO)", "mujoco": "3.3.2",
                            "robosuite": "1.4.0"},
                  "source": "yuantianyuan01/FastWAM README.md:176-184 (official LIBERO, then pip install mujoco==3.3.2)"},
        "render": {"value": [256, 256],
                   "source": "experiments/libero/libero_utils.py:16 LIBERO_ENV_RESOLUTION = 256, "
                             "eval_libero_single.py:598 get_libero_env(task, LIBERO_ENV_RESOLUTION, cfg.get('seed'))"},
        "num_steps_wait": {"value": 30, "source": "configs/sim_libero.yaml:24 num_steps_wait: 30; "
                                                  "eval_libero_single.py:485-488"},
        "seed": {"value": 42, "source": "configs/train.yaml:29 seed: 42 (sim_libero.yaml's defaults)"},
        "seed_rule": {"value": "once_per_task",
                      "source": "libero_utils.py:36-38 env.seed(seed) in get_libero_env, called once per task "
                                "(eval_libero_single.py:598); episodes reset the same env (:466)"},
        "init_state": {"value": "episode", "source": "eval_libero_single.py:613 initial_states[trial_idx]"},
        "max_steps": {"value": {"libero_spatial": 400, "libero_object": 400, "libero_goal": 400, "libero_10": 700,
                                "libero_90": 700},
                      "source": "eval_libero_single.py:432-442 _get_max_steps, :483 t < max_steps + num_steps_wait"},
        "replan_steps": {"value": 10, "source": "configs/sim_libero.yaml:25 replan_steps: 10; "
                                                "eval_libero_single.py:516 action_chunk[:replan_steps]"},
    },
    "molmoact2": {
        "stack": {"value": {"libero": "hf-libero 0.1.4", "mujoco": "3.8.1", "robosuite": "1.4.0"},
                  "source": "lerobot pyproject.toml:271 libero = [hf-libero>=0.1.4,<0.2.0]; uv.lock:1945-1946 "
                            "hf-libero 0.1.4, :3961-3962 mujoco 3.8.1, :5948-5949 robosuite 1.4.0"},
        "render": {"value": [360, 360], "source": "src/lerobot/envs/configs.py:333-334 observation_height/width: 360"},
        "num_steps_wait": {"value": 50,
                           "source": "docs/source/molmoact2.mdx:319-321 'All LIBERO evaluation results reported "
                                     "here use num_steps_wait=50' (LiberoEnv's default is 10, envs/libero.py:127)"},
        "seed": {"value": 1000, "source": "src/lerobot/configs/eval.py:39 seed: 1000; molmoact2.mdx:347 --seed=1000"},
        "seed_rule": {"value": "seed_plus_episode_at_each_reset",
                      "source": "scripts/lerobot_eval.py:531-532 seeds = start_seed + batch_ix * num_envs, :223 "
                                "env.reset(seed=seeds); envs/libero.py:339-342 reset(seed) calls env.seed(seed)"},
        "init_state": {"value": "episode", "source": "envs/libero.py:175 init_state_id = episode_index, :345-346 "
                                                     "+ reset stride at each reset"},
        "max_steps": {"value": {"libero_spatial": 280, "libero_object": 280, "libero_goal": 300, "libero_10": 520,
                                "libero_90": 400},
                      "source": "src/lerobot/envs/libero.py:98-104 TASK_SUITE_MAX_STEPS"},
        "replan_steps": {"value": 10, "source": "docs/source/molmoact2.mdx:200-204 chunk_size 10 for LIBERO, "
                                                "n_action_steps = chunk_size"},
    },
}

# The success rates each policy's authors publish per suite, with where.
PUBLISHED = {
    "fastwam": {"source": "Fast-WAM project page (github yuantianyuan01/FastWAM, index.html at 44c8a1c, "
                          "'LIBERO' table, 'Fast-WAM (Ours)' row; the paper is arXiv 2603.16666)",
                "rates": {"libero_spatial": 98.2, "libero_object": 100.0, "libero_goal": 97.0,
                          "libero_10": 95.2}},
    "molmoact2": {"source": "lerobot docs/source/molmoact2.mdx:437-440, 'MolmoAct2 Original' column",
                  "rates": {"libero_spatial": 97.8, "libero_object": 100.0, "libero_goal": 97.8,
                            "libero_10": 93.2}},
}

NOOP_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)


def setting(policy: str, name: str):
    return UPSTREAM[policy][name]["value"]


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

    def setting(self, name: str):
        """Upstream's value of a setting for this policy (`UPSTREAM`)."""
        return setting(self.policy, name)

    def max_steps(self, suite: str) -> int:
        return self.setting("max_steps")[suite]

    def env_seed(self, episode: int) -> tuple[int | None, int | None]:
        """(seed at env creation, seed at this episode's reset), upstream's rule."""
        seed, rule = self.setting("seed"), self.setting("seed_rule")
        return (seed, None) if rule == "once_per_task" else (None, seed + episode)

    def differences(self) -> list[str]:
        """What this run does otherwise than upstream (the bundle's doing, e.g. a tiny
        fixture's frame size): empty for a run as upstream."""
        out = []
        up = self.setting("render")
        if [self.geometry.height, self.geometry.width] != up:
            out.append(f"render size {self.geometry.height}x{self.geometry.width} (the bundle's frame_height x "
                       f"frame_width), upstream renders {up[0]}x{up[1]}")
        if self.chunk_len < self.execute_steps:
            out.append(f"chunk of {self.chunk_len} rows, shorter than upstream's replan_steps {self.execute_steps}")
        return out

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
    return Conventions(policy="fastwam", num_steps_wait=setting("fastwam", "num_steps_wait"),
                       execute_steps=setting("fastwam", "replan_steps"), chunk_len=f["action_horizon"],
                       geometry=geometry, instructions=tuple(c["instructions"]), state_input=state_input, chain=c)


def _molmoact2(path: Path, c: dict) -> Conventions:
    if c["cameras"] != 2 or c["state_dims"] != 8:
        raise BundleError(f"bundle {path}: `molmoact2` needs 2 cameras (image, image2) and state_dims 8 (LeRobot's "
                          f"LIBERO observation.state), found cameras {c['cameras']} state_dims {c['state_dims']}")
    geometry = Geometry(cameras=2, height=c["frame_height"], width=c["frame_width"], state_dims=8,
                        action_dims=c["action_dims"], chunk_len=c["action_horizon"])
    # LeRobot plays n_action_steps rows of each chunk, chunk_size (10) for LIBERO.
    return Conventions(policy="molmoact2", num_steps_wait=setting("molmoact2", "num_steps_wait"),
                       execute_steps=min(setting("molmoact2", "replan_steps"), c["action_horizon"]),
                       chunk_len=c["action_horizon"], geometry=geometry, instructions=tuple(c["instructions"]),
                       state_input="state", chain=c)


def lerobot_state(obs: dict) -> np.ndarray:
    """LeRobot's `LiberoProcessorStep` state in f32: eef_pos, its quat2axisangle (w clamped,
    `den = sqrt(max(1 - w^2, 0))`, zeros unless den > 1e-10), gripper_qpos."""
    q = np.asarray(obs["robot0_eef_quat"], np.float32)
    w = np.clip(q[3], np.float32(-1), np.float32(1))
    den = np.sqrt(np.maximum(np.float32(1) - w * w, np.float32(0)))
    aa = (q[:3] / den) * (np.float32(2) * np.arccos(w)) if den > 1e-10 else np.zeros(3, np.float32)
    return np.concatenate([np.asarray(obs["robot0_eef_pos"], np.float32), aa.astype(np.float32),
                           np.asarray(obs["robot0_gripper_qpos"], np.float32)])


FIXTURE = Path(__file__).resolve().parents[3] / "golden" / "bundles" / "fastwam-closed-loop"
MOLMOACT2_FIXTURE = Path(__file__).resolve().parents[3] / "golden" / "bundles" / "molmoact2-upstream-sd"


def fixture_bundle(dst: Path) -> Path:
    """The closed-loop Fast-WAM fixture as a LIBERO robot drives it: the raw 9-value state
    (`state_input: eef_pos_quat_gripper`), gated by its quaternion golden (the same
    observation with the quaternion, tools/goldens/vla_goldens/make_golden.py). Two cameras at 40 x 48, two
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


def without_gripper_inversion(bundle: Path, run_once) -> Path:
    """Turns the Fast-WAM bundle at `bundle` (a copy) into one that leaves the gripper as the
    model gives it, its end-to-end golden made by the same code (as a mis-built bundle's
    would be, so vlad's gate takes it): the live path without upstream's inversion, for the
    test that watches the gripper check fail. `run_once(bundle, obs_npz)` is vlad's chunk."""
    import numpy as np
    bundle = Path(bundle)
    m = json.loads((bundle / "bundle.json").read_text())
    m["fastwam"]["gripper_map"] = "none"
    (bundle / "bundle.json").write_text(json.dumps(m, indent=1))
    golden = bundle / m["end_to_end"]
    g = dict(np.load(golden))
    g["actions"] = run_once(bundle, golden)
    np.savez(golden, **g)
    return bundle


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
