#!/usr/bin/env python3
"""Runs the public Fast-WAM code itself on synthetic inputs and writes small goldens to
golden/upstream-fastwam/ for the Rust host glue and tools/vla_host/vla_host/reference.py.

Upstream = github yuantianyuan01/FastWAM at the commit of the checkout passed with
`--fastwam-src DIR` (recorded in manifest.json; never copied into this repo). Every golden
array is the output of an upstream function; nothing here re-implements its math:

- `experiments/libero/eval_libero_single.py` `_predict_action_chunk` with the real
  `FastWAMProcessor` (instantiated by hydra from `configs/data/libero_2cam.yaml`, its
  normalizer from `load_dataset_stats_from_json`) and a stand-in for the model (the part
  that runs on the NPU): it records `input_image` and `proprio` and returns a given
  normalized chunk, so the golden covers the 180-degree turn (`get_libero_image`), the
  centre-crop resize, the side-by-side layout, the `x*2/255-1` scaling, the state
  normalizer (forward) and the action post-processing (normalizer backward, `g*2-1`,
  `invert_gripper_action`, `np.sign` when `binarize_gripper`).
- `SingleFieldLinearNormalizer` through `_normalize_proprio` / `_denormalize_action` for
  every mode the LIBERO config can select (`min/max`, `q01/q99`, `z-score`).
- `_center_crop_resize` on non-square frames, and Pillow's `Image.resize(BILINEAR)` (what it
  calls; upstream pins pillow==12.0.0, checked here) on tools/goldens/vla_goldens/pillow_goldens.py's cases.

Imports the called functions do not use are stubbed, and only those: `libero` (robosuite /
MuJoCo; used by `get_libero_env` and `benchmark`) and
`fastwam.datasets.lerobot.robot_video_dataset` (the LeRobot dataset stack; the eval imports
just its `DEFAULT_PROMPT`, which the stub reads from that file's source with `ast`).

    TORCH_VENV=<venv with torch 2.11.0> scripts/setup_upstream_fastwam.sh
    build/fastwam-venv/bin/python -m vla_goldens.upstream_fastwam --fastwam-src DIR

Deterministic: seeded inputs, one torch thread, npz written by tools/vla_host/vla_host/det_npz.py.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import PIL  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
from vla_host.det_npz import save_npz
from vla_goldens import pillow_goldens
from vla_goldens.pillow_goldens import frame

torch.set_num_threads(1)


def _unused(name: str):
    def fail(*_a, **_k):
        raise RuntimeError(f"{name} is a stub: the goldens must not reach it")

    return fail


def install_stubs(src: Path) -> list[str]:
    """Stubs for imports the called functions do not use; returns what was stubbed."""
    libero = types.ModuleType("libero")
    libero_libero = types.ModuleType("libero.libero")
    libero_libero.get_libero_path = _unused("libero.libero.get_libero_path")
    libero_libero.benchmark = types.SimpleNamespace(get_benchmark_dict=_unused("libero benchmark"))
    envs = types.ModuleType("libero.libero.envs")
    envs.OffScreenRenderEnv = _unused("OffScreenRenderEnv")
    envs.SubprocVectorEnv = _unused("SubprocVectorEnv")
    libero.libero, libero_libero.envs = libero_libero, envs
    sys.modules.update({"libero": libero, "libero.libero": libero_libero, "libero.libero.envs": envs})

    # DEFAULT_PROMPT from the real file, without executing its dataset imports.
    rvd_path = src / "src/fastwam/datasets/lerobot/robot_video_dataset.py"
    tree = ast.parse(rvd_path.read_text())
    prompt = next(
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "DEFAULT_PROMPT" for t in n.targets)
    )
    rvd = types.ModuleType("fastwam.datasets.lerobot.robot_video_dataset")
    rvd.DEFAULT_PROMPT = prompt
    sys.modules[rvd.__name__] = rvd
    return ["libero", "libero.libero", "libero.libero.envs", rvd.__name__ + " (DEFAULT_PROMPT read by ast)"]


def import_upstream(src: Path):
    for p in (src / "src", src, src / "experiments" / "libero"):
        sys.path.insert(0, str(p))
    stubbed = install_stubs(src)
    import experiments.libero.eval_libero_single as ev  # noqa: E402
    import experiments.libero.libero_utils as lu  # noqa: E402
    from fastwam.datasets.lerobot.utils import normalizer as nz  # noqa: E402

    return ev, lu, nz, stubbed


# ---------------------------------------------------------------------------------------
# Synthetic inputs (seeded)
# ---------------------------------------------------------------------------------------


def synthetic_stats(rng: np.random.Generator, dims: int) -> dict:
    lo = rng.uniform(-2.0, 0.5, dims)
    hi = lo + rng.uniform(0.05, 3.0, dims)
    lo[2], hi[2] = 0.731, 0.731 + 5e-5  # range below upstream's 1e-4: the "ignore" branch
    q01 = lo + (hi - lo) * 0.01
    q99 = hi - (hi - lo) * 0.01
    q01[3], q99[3] = -0.25, -0.25 + 3e-5
    mean = (lo + hi) / 2 + rng.uniform(-0.1, 0.1, dims)
    std = rng.uniform(0.01, 1.0, dims)
    std[4] = 0.0  # a constant dim: divided by 1e-8
    return {f"global_{k}": v.tolist() for k, v in
            {"min": lo, "max": hi, "q01": q01, "q99": q99, "mean": mean, "std": std}.items()}


def state_rows(rng: np.random.Generator, st: dict, n: int) -> np.ndarray:
    lo, hi = np.array(st["global_min"]), np.array(st["global_max"])
    t = rng.uniform(-4.0, 5.0, (n, lo.size))  # far outside [low, high] too: the [-5, 5] clamp
    t[0], t[1] = 0.0, 1.0  # exactly low / high
    return (lo + t * (hi - lo)).astype(np.float32)


# ---------------------------------------------------------------------------------------
# Upstream calls
# ---------------------------------------------------------------------------------------


class ModelStandIn(torch.nn.Module):
    """Replaces the Fast-WAM model (on the device: the NPU contexts): records what the eval
    feeds it and returns a given normalized action chunk."""

    torch_dtype = torch.float32  # the runtime feeds the contexts f32 (eval's default is bf16)

    def __init__(self, chunk: np.ndarray):
        super().__init__()
        self.chunk = torch.from_numpy(chunk)
        self.seen = {}

    def infer_action(self, prompt, input_image, action_horizon, negative_prompt, text_cfg_scale,
                     num_inference_steps, proprio, sigma_shift, seed, rand_device, tiled):
        self.seen = {"prompt": prompt, "input_image": input_image.clone(), "proprio": proprio.clone(),
                     "action_horizon": action_horizon}
        return {"action": self.chunk.clone()}


def make_cfg(src: Path, mode: str, binarize: bool):
    from omegaconf import OmegaConf

    data = OmegaConf.load(src / "configs/data/libero_2cam.yaml")
    sim = OmegaConf.load(src / "configs/sim_libero.yaml")
    cfg = OmegaConf.create({"data": data, "EVALUATION": sim.EVALUATION, "eval_num_inference_steps": 10})
    cfg.data.train.processor.norm_default_mode = mode
    cfg.EVALUATION.binarize_gripper = binarize
    return cfg


def make_processor(ev, cfg, stats_json: Path):
    from hydra.utils import instantiate

    stats = ev.load_dataset_stats_from_json(str(stats_json))
    processor = instantiate(cfg.data.train.processor).eval()
    processor.set_normalizer_from_stats(stats)
    return processor


def libero_eval(ev, lu, src: Path, stats_json: Path, rng) -> dict:
    """`_predict_action_chunk` on one synthetic LIBERO observation, both gripper settings."""
    obs = {
        "agentview_image": frame(rng, 256, 256),
        "robot0_eye_in_hand_image": frame(rng, 256, 256),
        "robot0_eef_pos": rng.uniform(-0.5, 0.5, 3),
        "robot0_eef_quat": (lambda q: q / np.linalg.norm(q))(rng.normal(size=4)),
        "robot0_gripper_qpos": rng.uniform(0.0, 0.04, 2),
    }
    chunk = rng.uniform(-1.3, 1.3, (32, 7)).astype(np.float32)
    chunk[:4, -1] = [-1.0, 1.0, 0.0, 1.0 / 3.0]  # g = 0.5 after denorm: sign(0) cases
    out = {"agentview_image": obs["agentview_image"], "wrist_image": obs["robot0_eye_in_hand_image"],
           "eef_pos": obs["robot0_eef_pos"].astype(np.float32), "eef_quat": obs["robot0_eef_quat"].astype(np.float32),
           "gripper_qpos": obs["robot0_gripper_qpos"].astype(np.float32), "action_normalized": chunk}
    for binarize in (True, False):
        cfg = make_cfg(src, "min/max", binarize)
        processor = make_processor(ev, cfg, stats_json)
        model = ModelStandIn(chunk)
        action, imgs, _ = ev._predict_action_chunk(
            obs=dict(obs), task_description="put the bowl on the plate", model=model, processor=processor,
            cfg=cfg, action_horizon=32, input_w=448, input_h=224, model_device="cpu")
        out["actions_binarized" if binarize else "actions"] = np.asarray(action, np.float32)
    x = model.seen["input_image"].numpy()
    assert x.shape == (1, 3, 224, 448) and x.dtype == np.float32
    # x (1.2 MB of f32) stored losslessly as a codebook: levels[index] == x bit for bit.
    levels, index = np.unique(x, return_inverse=True)
    assert levels.size <= 256
    index = index.reshape(x.shape).astype(np.uint8)
    assert np.array_equal(levels[index].view(np.uint32), x.view(np.uint32))
    out.update({"image_levels": levels.astype(np.float32), "image_index": index,
                "state": ev._extract_sim_state(dict(obs)),
                "proprio": model.seen["proprio"].numpy().astype(np.float32)})
    prompt = model.seen["prompt"]
    return out, prompt


def normalizer_goldens(ev, src: Path, stats_json: Path, stats: dict, rng) -> dict:
    """Forward (state, `_normalize_proprio`) and backward (actions, `_denormalize_action`)
    per mode, through the processor the eval builds."""
    states = state_rows(rng, stats["state"]["default"], 24)
    actions = rng.uniform(-1.6, 1.6, (24, 7)).astype(np.float32)  # beyond +-1: no clamp
    actions[0], actions[1] = -1.0, 1.0
    out = {"state_raw": states, "action_normalized": actions}
    for name, mode in (("min_max", "min/max"), ("quantile", "q01/q99"), ("mean_std", "z-score")):
        processor = make_processor(ev, make_cfg(src, mode, True), stats_json)
        out[f"{name}_state"] = ev._normalize_proprio(states, processor).numpy()[0].astype(np.float32)
        out[f"{name}_action"] = ev._denormalize_action(torch.from_numpy(actions), processor)[0].astype(np.float32)
    for part in ("state", "action"):
        for k, v in stats[part]["default"].items():
            out[f"{part}_{k.removeprefix('global_')}"] = np.asarray(v, np.float32)
    return out


def center_crop_goldens(ev, rng) -> dict:
    """`_center_crop_resize` on non-square frames (aspect-preserving scale + centre crop)."""
    out = {}
    for (h, w), (ch, cw) in (((240, 320), (224, 224)), ((40, 48), (32, 32)), ((90, 50), (32, 40)),
                             ((64, 48), (96, 80))):
        src = frame(rng, h, w)
        out[f"src_{h}x{w}"] = src
        out[f"out_{h}x{w}_to_{ch}x{cw}"] = ev._center_crop_resize(src, width=cw, height=ch)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fastwam-src", type=Path, required=True, help="checkout of github yuantianyuan01/FastWAM")
    ap.add_argument("--commit", help="the checkout's commit, when DIR is not a git work tree (git archive)")
    ap.add_argument("--out", type=Path, default=ROOT / "golden" / "upstream-fastwam")
    args = ap.parse_args()
    src = args.fastwam_src.resolve()
    commit = args.commit
    if commit is None:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()
    if PIL.__version__ != "12.0.0":
        raise SystemExit(f"upstream Fast-WAM pins pillow==12.0.0, this venv has {PIL.__version__}")
    ev, lu, nz, stubbed = import_upstream(src)

    rng = np.random.default_rng(20260515)
    stats = {"state": {"default": synthetic_stats(rng, 8)}, "action": {"default": synthetic_stats(rng, 7)}}
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        stats_json = Path(tmp) / "dataset_stats.json"
        nz.save_dataset_stats_to_json(stats, str(stats_json))
        norm = normalizer_goldens(ev, src, stats_json, stats, rng)
        libero, prompt = libero_eval(ev, lu, src, stats_json, rng)
    files = {"normalizer.npz": norm, "libero_eval.npz": libero,
             "center_crop.npz": center_crop_goldens(ev, rng),
             f"pillow_resize_{PIL.__version__}.npz": pillow_goldens.resize_goldens()}
    for name, arrays in files.items():
        save_npz(args.out / name, arrays)
    manifest = {
        "upstream": "github.com/yuantianyuan01/FastWAM",
        "commit": commit,
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "pillow": PIL.__version__},
        "stubbed_imports": stubbed,
        "prompt_for_task": {"task": "put the bowl on the plate", "prompt": prompt},
        "files": {name: {k: [str(v.dtype), list(v.shape)] for k, v in arrays.items()} for name, arrays in files.items()},
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for name in files:
        print(f"{name}: {(args.out / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()
