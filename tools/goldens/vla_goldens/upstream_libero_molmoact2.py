#!/usr/bin/env python3
"""LeRobot's own LIBERO observation processing for MolmoAct2, run on a saved LIBERO env
observation, written as a small golden (golden/libero/molmoact2-first-observation.npz).

The observation is the one vlad's first inference of the MolmoAct2 test episode takes
(`vla-libero demo --policy molmoact2`: the env after its reset and 50 no-op steps; point 0
of that episode's robot.npz: the frames as robosuite rendered them and the raw eef_pos,
eef_quat, gripper_qpos). It goes through the upstream functions unchanged, in LeRobot's
order (lerobot 0.6.1, the pinned wheel of scripts/setup_upstream.sh):

1. envs/libero.py LiberoEnv._format_raw_obs layout ({"pixels": {image, image2},
   "robot_state": {eef: {pos, quat}, gripper: {qpos}}}, built here from the saved arrays:
   the method needs a live env; it only renames);
2. envs/utils.py preprocess_observation (HWC uint8 -> CHW float / 255, nested state to tensors);
3. processor/env_processor.py LiberoProcessorStep._process_observation (flip H and W, state
   = eef_pos + _quat2axisangle + gripper_qpos in f32);
4. policies/molmoact2/processor_molmoact2.py MolmoAct2PackInputsProcessorStep's image path:
   sorted image keys, _normalize_image (float -> uint8) and the vendored
   MolmoAct2ImageProcessor (resize, normalize, patches) at the bundle's crop and patch size.

The lerobot package itself cannot be imported in this venv (lerobot/utils/__init__.py needs
draccus, gymnasium is absent); the files are loaded from the wheel unchanged with the lerobot
names they import at module level stood in (tools/goldens/vla_goldens/upstream_molmoact2.py's loaders).

    MUJOCO_GL=egl build/libero-molmoact2-venv/bin/vla-libero demo \
        --policy molmoact2 --out /tmp/mm-demo
    build/upstream-venv/bin/python -m vla_goldens.upstream_libero_molmoact2 --episode /tmp/mm-demo/episode
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[3]
from vla_host.det_npz import save_npz
from vla_goldens import upstream_molmoact2 as um

OUT = ROOT / "golden" / "libero" / "molmoact2-first-observation.npz"
BUNDLE = ROOT / "golden" / "bundles" / "molmoact2-upstream-sd"


class _Classes:
    """Stands in for the lerobot modules and gymnasium: a capitalized name is a fresh class
    (base classes, type hints, `gym.Env` as a singledispatch type; its `register` is the
    identity decorator), any other a namespace of them. Nothing here is called."""

    def __getattr__(self, name):
        if name[:1].islower():
            return _Classes()
        return type(name, (), {"register": staticmethod(lambda *a, **k: (lambda cls: cls))})


def load_lerobot_file(rel: str, name: str, constants: types.ModuleType):
    """lerobot/<rel> loaded unchanged; the lerobot modules it imports at top level stood in
    (their names only reach type hints, decorators and base classes), the constants real."""
    lerobot_dir = um.molmoact2_dir().parents[1]
    stubs = ["lerobot", "lerobot.configs", "lerobot.utils", "lerobot.utils.utils", "gymnasium",
             f"{name}_pkg", f"{name}_pkg.pipeline", f"{name}_pkg.configs"]
    saved = {n: sys.modules.get(n) for n in [*stubs, "lerobot.utils.constants"]}
    try:
        for s in stubs:
            mod = types.ModuleType(s)
            mod.__getattr__ = lambda attr: getattr(_Classes(), attr)  # type: ignore[attr-defined]
            mod.__path__ = []  # type: ignore[attr-defined]
            sys.modules[s] = mod
        sys.modules["lerobot.utils.constants"] = constants
        spec = importlib.util.spec_from_file_location(f"{name}_pkg.{name}", lerobot_dir / rel)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        for n, old in saved.items():
            if old is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episode", type=Path, required=True, help="a MolmoAct2 demo's episode directory")
    ap.add_argument("--point", type=int, default=0, help="observation point (0: the first inference's)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)

    log = np.load(args.episode / "robot.npz")
    rendered = log["point_rendered"][args.point]            # [2, H, W, 3] uint8, agentview, wrist
    env_state = log["point_env_state"][args.point]          # eef_pos 3, eef_quat 4, gripper_qpos 2, f64
    chain = json.loads((BUNDLE / "bundle.json").read_text())["molmoact2"]

    lerobot_dir = um.molmoact2_dir().parents[1]
    spec = importlib.util.spec_from_file_location("lerobot_constants", lerobot_dir / "utils" / "constants.py")
    constants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(constants)
    env_utils = load_lerobot_file("envs/utils.py", "lerobot_env_utils", constants)
    env_proc = load_lerobot_file("processor/env_processor.py", "lerobot_env_processor", constants)
    _, img_mod, _, _ = um.load_hf_package()
    lr_proc = um.load_lerobot_processor()
    if lr_proc is None:
        raise SystemExit("processor_molmoact2.py could not be loaded")

    # 1. LiberoEnv._format_raw_obs (camera_name_mapping: agentview_image -> image,
    #    robot0_eye_in_hand_image -> image2), obs_type pixels_agent_pos, batched by the
    #    vector env lerobot_eval steps (one env: a leading 1).
    raw = {
        "pixels": {"image": rendered[0][None].copy(), "image2": rendered[1][None].copy()},
        "robot_state": {"eef": {"pos": env_state[None, 0:3].copy(), "quat": env_state[None, 3:7].copy()},
                        "gripper": {"qpos": env_state[None, 7:9].copy()}},
    }
    # 2.-3. preprocess_observation, then LiberoProcessorStep.
    obs = env_utils.preprocess_observation(raw)
    obs = env_proc.LiberoProcessorStep()._process_observation(obs)
    state = obs[constants.OBS_STATE].numpy().astype(np.float32).reshape(-1)
    # 4. The pack step's image path, then the vendored image processor.
    keys = sorted(k for k in obs if k.startswith(f"{constants.OBS_IMAGES}."))
    images = [lr_proc._normalize_image(obs[k][0]) for k in keys]
    ip = img_mod.MolmoAct2ImageProcessor(
        size={"height": chain["crop_size"], "width": chain["crop_size"]}, image_mean=[0.5] * 3,
        image_std=[0.5] * 3, crop_mode="resize", max_crops=1, patch_size=chain["patch_size"], pooling_size=[2, 2])
    res = ip(images, return_tensors="np")
    pixel_values = np.asarray(res["pixel_values"], np.float32)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_npz(args.out, {
        "env_rendered": rendered.astype(np.uint8),
        "env_state": env_state.astype(np.float64),
        "image_keys": np.array(keys),
        "processor_images": np.stack(images).astype(np.uint8),
        "observation_state": state,
        "pixel_values": pixel_values,
        "crop_patch": np.array([chain["crop_size"], chain["patch_size"]], np.int64),
    })
    print(f"wrote {args.out}: pixel_values {pixel_values.shape}, state {state.tolist()}")


if __name__ == "__main__":
    main()
