#!/usr/bin/env python3
"""Runs the two normalizers a MolmoAct2 checkpoint is really run with and writes small goldens to
golden/upstream/lerobot_norm/.

1. LeRobot's policy pipeline (what `select_action` runs for a LeRobot checkpoint): the steps
   `molmoact2_masked_normalizer` + `molmoact2_clamp_normalized` (state in) and
   `molmoact2_clamp_action` + `molmoact2_masked_unnormalizer` (action out) from
   lerobot/policies/molmoact2/processor_molmoact2.py on lerobot/processor/normalize_processor.py,
   built with the arguments `make_molmoact2_pre_post_processors` passes (statistics masked by its
   own `_add_gripper_masks_to_stats`, clamp masks by `_normalization_masks_from_stats`), saved with
   `PolicyProcessorPipeline.save_pretrained` and run as loaded back by `from_pretrained`, i.e. as a
   checkpoint's `policy_preprocessor.json` / `policy_postprocessor.json` run. The saved pipelines
   are kept next to the goldens: they are a real LeRobot checkpoint's processor files.
2. The Hugging Face `_FeatureNormalizer` (`predict_action`) on the same statistics and inputs.
4. The pack step's prompt text for every combination of add_setup_tokens, add_control_tokens,
   normalize_language, plain / already-wrapped / empty setup and control, 8 or 0 state dims, 1 or
   2 images (golden/upstream/prompt_text.json).
3. The sequence cap of the pack step (`infer_molmoact2_max_sequence_length`) for a few image and
   state counts (manifest.json), which a LeRobot checkpoint's prompts must not exceed.

Upstream is the pinned lerobot==0.6.1 wheel in the venv of scripts/setup_upstream.sh (CPython
3.11). lerobot's package `__init__`s pull in draccus and more that the venv lacks, so the modules
this needs are loaded from their files unchanged under shell packages; one line of
processor/pipeline.py, `class DataProcessorPipeline[TInput, TOutput](HubMixin):` (PEP 695, which
3.11 cannot compile), is loaded as `class DataProcessorPipeline(HubMixin, Generic[TInput,
TOutput]):` (its TypeVars are the module's own); nothing else is changed.

    build/upstream-venv/bin/python -m vla_goldens.upstream_lerobot_norm [--out golden/upstream/lerobot_norm]

Deterministic: fixed inputs, one torch thread, npz written by tools/vla_host/vla_host/det_npz.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import types
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
from vla_host.det_npz import save_npz
from vla_goldens.upstream_molmoact2 import load_hf_package, molmoact2_dir

torch.set_num_threads(1)

PEP695 = "class DataProcessorPipeline[TInput, TOutput](HubMixin):"
BACKPORT = "class DataProcessorPipeline(HubMixin, __import__('typing').Generic[TInput, TOutput]):"
PKG = "lerobot_molmoact2_policy"


def _shell(name: str, path: Path) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]  # type: ignore[attr-defined]
    sys.modules[name] = mod
    return mod


def _real(name: str, path: Path, replace: tuple[str, str] | None = None) -> types.ModuleType:
    source = path.read_text()
    if replace is not None:
        assert source.count(replace[0]) == 1, f"{path}: expected one {replace[0]!r}"
        source = source.replace(*replace)
    mod = types.ModuleType(name)
    mod.__file__ = str(path)
    sys.modules[name] = mod
    exec(compile(source, str(path), "exec"), mod.__dict__)
    return mod


def load_lerobot(lerobot_root: Path | None = None):
    """lerobot.processor's pipeline and normalizer and processor_molmoact2.py, from their files
    (`lerobot_root`: another lerobot source tree's `src/lerobot`; default: the installed wheel)."""
    pol = molmoact2_dir() if lerobot_root is None else Path(lerobot_root) / "policies" / "molmoact2"
    lr = pol.parent.parent
    _shell("lerobot", lr)
    configs = _shell("lerobot.configs", lr / "configs")
    utils = _shell("lerobot.utils", lr / "utils")
    processor = _shell("lerobot.processor", lr / "processor")
    cfg_types = _real("lerobot.configs.types", lr / "configs" / "types.py")
    for name in ("FeatureType", "NormalizationMode", "PipelineFeatureType", "PolicyFeature"):
        setattr(configs, name, getattr(cfg_types, name))
    _real("lerobot.lerobot_types", lr / "lerobot_types.py")
    utils.constants = _real("lerobot.utils.constants", lr / "utils" / "constants.py")
    _real("lerobot.utils.hub", lr / "utils" / "hub.py")
    _real("lerobot.utils.device_utils", lr / "utils" / "device_utils.py")
    # import_utils imports draccus; processor_molmoact2 only reads these three names from it.
    iu = types.ModuleType("lerobot.utils.import_utils")
    iu._scipy_available, iu._transformers_available = False, True
    iu.require_package = lambda *a, **k: None
    sys.modules[iu.__name__] = iu
    for sub in ("converters", "pipeline", "normalize_processor", "batch_processor", "device_processor",
                "rename_processor"):
        mod = _real(f"lerobot.processor.{sub}", lr / "processor" / f"{sub}.py",
                    (PEP695, BACKPORT) if sub == "pipeline" else None)
        for k, v in vars(mod).items():
            if not k.startswith("_"):
                setattr(processor, k, v)
    # processor_molmoact2's relative imports: the HF package (already loaded) and two names from
    # modules that need the whole policy stack; the normalization steps use neither.
    _shell(PKG, pol)
    cfg = types.ModuleType(f"{PKG}.configuration_molmoact2")
    cfg.MolmoAct2Config = object
    mdl = types.ModuleType(f"{PKG}.modeling_molmoact2")
    mdl._hf_token = mdl._resolve_checkpoint_location = None
    sys.modules[cfg.__name__], sys.modules[mdl.__name__] = cfg, mdl
    sys.modules[f"{PKG}.molmoact2_hf_model"] = sys.modules["lerobot_molmoact2_hf"]
    for sub in ("image_processing_molmoact2", "processing_molmoact2", "video_processing_molmoact2"):
        sys.modules[f"{PKG}.molmoact2_hf_model.{sub}"] = sys.modules[f"lerobot_molmoact2_hf.{sub}"]
    spec = importlib.util.spec_from_file_location(f"{PKG}.processor_molmoact2", pol / "processor_molmoact2.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return sys.modules["lerobot.processor"], cfg_types, mod


# ----------------------------------------------------------------------------------------------
# Inputs: 8 state dims, 7 action dims, each an edge case of one of the two normalizers
# ----------------------------------------------------------------------------------------------

STATE_NAMES = ["x", "y", "min_eq_max", "q_equal", "tiny_1e-7", "small_5e-7", "all_equal", "gripper"]
ACTION_NAMES = ["x", "y", "min_eq_max", "q_equal", "tiny_1e-7", "roll", "gripper"]


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def state_stats() -> dict:
    # dim 2: min == max while q01 != q99 (the HF zero mask fires, lerobot's formula does not);
    # dim 3: q01 == q99, min < max (lerobot divides by its eps 1e-8, HF by its floor 1e-6);
    # dims 4, 5: ranges 1e-7, 5e-7 (below HF's floor, above lerobot's eps); dim 6: everything equal;
    # dim 7: the gripper, passed through (its min/max inside [-1, 1], as lerobot demands).
    q01 = f32([-0.5, 0.1, -0.2, 0.25, 0.5, -0.75, 0.3, -1.0])
    q99 = f32([0.5, 2.3, 0.6, 0.25, 0.5 + 1e-7, -0.75 + 5e-7, 0.3, 1.0])
    mn = f32([-0.6, 0.0, 0.1, 0.2, 0.5, -0.75, 0.3, -1.0])
    mx = f32([0.6, 2.5, 0.1, 0.3, 0.5 + 2e-7, -0.75 + 6e-7, 0.3, 1.0])
    mean = f32([0.0, 1.2, 0.1, 0.25, 0.5, -0.75, 0.3, 0.0])
    std = f32([0.3, 0.7, 0.0, 1e-7, 5e-9, 4e-7, 0.0, 0.9])
    return {"q01": q01, "q99": q99, "min": mn, "max": mx, "mean": mean, "std": std}


def states(stats: dict) -> np.ndarray:
    """Rows of one state each: inside, at and outside the bounds, and just off the tiny ranges."""
    rng = np.random.default_rng(1261)
    q01, q99 = stats["q01"].astype(np.float64), stats["q99"].astype(np.float64)
    rows = []
    for i in range(24):
        span = np.where(q99 > q01, q99 - q01, 1e-6)
        u = rng.uniform(-0.3, 1.3, 8)
        row = q01 + u * span
        off = rng.choice([-3e-9, -1e-9, 0.0, 1e-9, 2.5e-9, 4e-8, 3e-7, -3e-7])
        row[3:7] = q01[3:7] + off * rng.choice([1, 2, 5], 4)
        row[7] = rng.uniform(-1.0, 1.0)
        rows.append(row)
    rows = f32(rows)
    rows[0] = stats["q01"]
    rows[1] = stats["q99"]
    rows[2, 7], rows[3, 7] = -1.0, 1.0
    return rows


def out_of_range_grippers() -> np.ndarray:
    """Gripper values lerobot refuses (outside [-1, 1]) and the edges it accepts."""
    return f32([1.0000001, -1.0000001, 1.5, -2.0, 1.0, -1.0, 0.999, 0.0])


def action_stats() -> dict:
    q01 = f32([-0.9, 0.05, -0.3, 0.4, 0.125, -3.1, -1.0])
    q99 = f32([0.9, 1.45, 0.7, 0.4, 0.125 + 1e-7, 3.1, 1.0])
    mn = f32([-1.0, 0.0, 0.2, 0.3, 0.125, -3.14, -1.0])
    mx = f32([1.0, 1.5, 0.2, 0.5, 0.125 + 2e-7, 3.14, 1.0])
    mean = f32([0.0, 0.7, 0.2, 0.4, 0.125, 0.0, 0.1])
    std = f32([0.4, 0.3, 0.0, 1e-7, 5e-9, 1.5, 0.95])
    return {"q01": q01, "q99": q99, "min": mn, "max": mx, "mean": mean, "std": std}


def normalized_actions() -> np.ndarray:
    """[4, 10, 7] model outputs, some outside [-1, 1] in every dim and the gripper."""
    rng = np.random.default_rng(1262)
    a = rng.uniform(-1.4, 1.4, (4, 10, 7))
    a[0, 0] = -1.0
    a[0, 1] = 1.0
    a[0, 2] = 0.0
    return f32(a)


def raw_actions(stats: dict) -> np.ndarray:
    """[4, 10, 7] robot-unit actions (an inpainting prefix is normalized the way the state is)."""
    rng = np.random.default_rng(1263)
    q01, q99 = stats["q01"].astype(np.float64), stats["q99"].astype(np.float64)
    span = np.where(q99 > q01, q99 - q01, 1e-6)
    a = q01 + rng.uniform(-0.2, 1.2, (4, 10, 7)) * span
    a[..., 6] = rng.uniform(-1.0, 1.0, (4, 10))
    return f32(a)


# ----------------------------------------------------------------------------------------------
# Running them
# ----------------------------------------------------------------------------------------------

LR_MODES = {"QUANTILES": "q01_q99", "MIN_MAX": "min_max", "MEAN_STD": "mean_std"}


def lerobot_pipelines(processor, cfg_types, pm, mode: str, sstats: dict, astats: dict, out: Path):
    """The state-in and action-out pipelines for `mode`, saved to `out` and loaded back."""
    FT, NM, PF = cfg_types.FeatureType, cfg_types.NormalizationMode, cfg_types.PolicyFeature
    features_in = {"observation.state": PF(type=FT.STATE, shape=(8,))}
    features_out = {"action": PF(type=FT.ACTION, shape=(7,))}
    norm_map = {FT.VISUAL: NM.IDENTITY, FT.STATE: NM[mode], FT.ACTION: NM[mode]}
    dataset_stats = {"observation.state": {k: torch.from_numpy(v) for k, v in sstats.items()},
                     "action": {k: torch.from_numpy(v) for k, v in astats.items()}}
    names = {"observation.state": STATE_NAMES, "action": ACTION_NAMES}
    masked = pm._add_gripper_masks_to_stats(dataset_stats, None, normalize_gripper=False,
                                            dataset_feature_names=names)
    masks = pm._normalization_masks_from_stats(masked)
    pre = processor.PolicyProcessorPipeline(
        steps=[pm.MolmoAct2MaskedNormalizerProcessorStep(features={**features_in, **features_out},
                                                          norm_map=norm_map, stats=masked),
               pm.MolmoAct2ClampNormalizedProcessorStep(normalization_masks=masks)],
        name="policy_preprocessor")
    post = processor.PolicyProcessorPipeline(
        steps=[pm.MolmoAct2ClampActionProcessorStep(),
               pm.MolmoAct2MaskedUnnormalizerProcessorStep(features=features_out, norm_map=norm_map,
                                                            stats=masked)],
        name="policy_postprocessor", to_transition=processor.policy_action_to_transition,
        to_output=processor.transition_to_policy_action)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    pre = processor.PolicyProcessorPipeline.from_pretrained(out, config_filename="policy_preprocessor.json")
    post = processor.PolicyProcessorPipeline.from_pretrained(
        out, config_filename="policy_postprocessor.json", to_transition=processor.policy_action_to_transition,
        to_output=processor.transition_to_policy_action)
    return pre, post


def run_state(pre, state: np.ndarray):
    """One `select_action` preprocessing of a batch-1 state: the normalized state or the refusal."""
    try:
        out = pre({"observation.state": torch.from_numpy(state[None].copy())})
    except ValueError as exc:
        if "gripper values are not under [-1, 1]" not in str(exc):
            raise
        return None, str(exc)
    return out["observation.state"][0].numpy(), None


def run_transform_action(pre, action: np.ndarray) -> np.ndarray:
    """The same steps on a raw action (the training path; vlad's inpainting prefix)."""
    out = pre({"action": torch.from_numpy(action.copy())})
    return out["action"].numpy()


PROMPT_TASKS = ["Put the bowl on the plate.", '"Task: Turn on the stove."', "open the   top drawer"]
PROMPT_SETUPS = [("single franka arm", "delta end effector"), ("<setup_start>wrapped arm<setup_end>",
                 "<control_start>wrapped control<control_end>"), ("", "")]


def write_prompt_texts(pm, path: Path) -> None:
    """The pack step's prompt text (`_normalize_question_text` when normalize_language, then
    `_build_discrete_state_string` and `_build_robot_text`, as MolmoAct2PackInputsProcessorStep
    calls them) for every combination of the settings vlad's builder takes from a checkpoint."""
    cases = []
    for add_setup in (True, False):
        for add_control in (True, False):
            for normalize in (True, False):
                for setup, control in PROMPT_SETUPS:
                    for state_dims in (8, 0):
                        for images in (1, 2):
                            for task in PROMPT_TASKS:
                                t = pm._normalize_question_text(task) if normalize else task
                                state = pm._build_discrete_state_string(np.full(state_dims, -1.0, np.float32), 256)
                                text = pm._build_robot_text(
                                    task=t, discrete_state_string=state, setup_type=setup, control_mode=control,
                                    add_setup_tokens=add_setup, add_control_tokens=add_control, num_images=images)
                                cases.append({"task": task, "setup": setup, "control": control,
                                              "add_setup_tokens": add_setup, "add_control_tokens": add_control,
                                              "normalize_language": normalize, "state_dims": state_dims,
                                              "images": images, "text": text})
    path.write_text(json.dumps({"producer": "lerobot 0.6.1 processor_molmoact2.py", "cases": cases}, indent=1)
                    + "\n")


def parse_state_tokens(text: str) -> list[int]:
    """The bins of an upstream `<state_start><state_K>...<state_end>` string (derived here)."""
    return [int(k) for k in re.findall(r"<state_(\d+)>", text)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "golden" / "upstream" / "lerobot_norm")
    args = ap.parse_args()
    _, _, _, hf = load_hf_package()
    processor, cfg_types, pm = load_lerobot()
    sstats, astats = state_stats(), action_stats()
    st, grip = states(sstats), out_of_range_grippers()
    norm_out, raw = normalized_actions(), raw_actions(astats)
    arrays: dict[str, np.ndarray] = {"states": st, "gripper_probe": grip, "actions_normalized": norm_out,
                                     "actions_raw": raw}
    for k, v in sstats.items():
        arrays[f"state_{k}"] = v
    for k, v in astats.items():
        arrays[f"action_{k}"] = v
    arrays["state_mask"] = np.array([n != "gripper" for n in STATE_NAMES])
    arrays["action_mask"] = np.array([n != "gripper" for n in ACTION_NAMES])
    meta: dict = {"lerobot": {}, "hf": {}}
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    for mode, hf_mode in LR_MODES.items():
        tag = mode.lower()
        ckpt = args.out / f"processor_{tag}"
        pre, post = lerobot_pipelines(processor, cfg_types, pm, mode, sstats, astats, ckpt)
        # LeRobot: state in, one observation at a time.
        normed, bins = [], []
        for row in st:
            n, refused = run_state(pre, row)
            assert refused is None, f"{mode}: an in-range state was refused: {refused}"
            normed.append(n)
            bins.append(parse_state_tokens(pm._build_discrete_state_string(n, 256)))
        arrays[f"lerobot_{tag}_state_normalized"] = f32(normed)
        arrays[f"lerobot_{tag}_state_bins"] = np.asarray(bins, np.int64)
        refused = []
        for g in grip:
            row = st[4].copy()
            row[7] = g
            n, why = run_state(pre, row)
            refused.append(why is not None)
            if why is not None:
                meta["lerobot"]["refusal_message"] = why
        arrays[f"lerobot_{tag}_gripper_refused"] = np.asarray(refused)
        # LeRobot: action out (clamp every dim, then the masked unnormalizer).
        arrays[f"lerobot_{tag}_actions"] = f32(np.stack([post(torch.from_numpy(a.copy())).numpy()
                                                         for a in norm_out]))
        arrays[f"lerobot_{tag}_actions_raw_normalized"] = f32(np.stack([run_transform_action(pre, a)
                                                                        for a in raw]))
        # Hugging Face _FeatureNormalizer on the same statistics (mask False = passthrough).
        s_hf = hf._FeatureNormalizer.from_stats({**sstats, "mask": arrays["state_mask"]}, hf_mode)
        a_hf = hf._FeatureNormalizer.from_stats({**astats, "mask": arrays["action_mask"]}, hf_mode)
        hn = f32(s_hf.normalize(st))
        arrays[f"hf_{tag}_state_normalized"] = hn
        arrays[f"hf_{tag}_state_bins"] = np.asarray(
            [parse_state_tokens(hf._build_discrete_state_string(r, 256)) for r in hn], np.int64)
        arrays[f"hf_{tag}_actions"] = f32(a_hf.unnormalize(norm_out))
        arrays[f"hf_{tag}_actions_raw_normalized"] = f32(a_hf.normalize(raw))
        cfg = json.loads((ckpt / "policy_preprocessor.json").read_text())
        meta["lerobot"][tag] = {"eps": cfg["steps"][0]["config"].get("eps"),
                                "files": sorted(p.name for p in ckpt.iterdir())}
    # The sequence cap the pack step enforces when its max_sequence_length is null (inference:
    # no discrete action labels), for image and state counts around LIBERO's 2 and 8.
    meta["inferred_max_sequence_length"] = [
        [n, s, pm.infer_molmoact2_max_sequence_length(num_images=n, state_dim=s, action_dim=7, action_horizon=10,
                                                      include_discrete_action=False)]
        for n in (0, 1, 2, 3) for s in (0, 7, 8, 64)]
    write_prompt_texts(pm, args.out.parent / "prompt_text.json")
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__}
    meta["versions"] = versions
    meta["state_names"], meta["action_names"] = STATE_NAMES, ACTION_NAMES
    save_npz(args.out / "norm.npz", arrays)
    (args.out / "manifest.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
