"""Fast-WAM's public QNN release -> an OPEN-LOOP bundle (docs/bundle-format.md, `fastwam`).

The release ships only `action_step` (`ctx/action_step_socid77_archv73.bin`,
`golden/action_step_io.npz`, beside `golden/video_prefill_io.npz` and `convert_report.json`):
its golden's `video_keys`, `video_values`, `context`, `context_mask` become the constant world
model, so the bundle's actions depend on the noise seed only (vlad says OPEN LOOP). The
checkpoint (upstream layout) gives the dataset statistics, `*_dataset_stats.json`
`{action: {default: {global_min, global_max, global_q01, global_q99, global_mean, global_std}}}`;
the settings are upstream's LIBERO eval (`train.yaml` `eval_num_inference_steps` 10, shift 5,
`libero_2cam.yaml` `norm_default_mode` min/max, `g*2 - 1` inverted, `binarize_gripper`) unless
overridden. A release with the world-model contexts (closed loop) is `fastwam_chain`'s."""

import numpy as np

from .errors import ImportRefused, expect

STEP_INPUTS = ["latents_action", "timestep", "video_keys", "video_values", "context", "context_mask"]
STEP_OUTPUTS = ["pred_noise"]
WORLD = ("video_keys", "video_values", "context", "context_mask")
LIBERO = {"flow_steps": 10, "shift": 5.0, "norm_mode": "min/max", "gripper_map": "libero", "gripper_binarize": True}
# upstream SingleFieldLinearNormalizer modes -> the bundle's mode and the stats it reads
NORM_MODES = {"min/max": ("min_max", "global_min", "global_max"), "q01/q99": ("quantile", "global_q01", "global_q99"),
              "z-score": ("mean_std", "global_mean", "global_std")}
GRIPPER_MARGIN = 0.05  # closer than this to the threshold: NPU and CPU may binarize the gripper differently
SEED_TRIES = 64


def is_fastwam(comps: dict) -> bool:
    return any(c.startswith("wm_") for c in comps) or (
        "action_step" in comps and "latents_action" in comps["action_step"].inputs)


def check_names(comps: dict) -> list:
    extra = sorted(c for c in comps if c != "action_step")
    expect(not extra, "release ctx/", f"expected only action_step (the open-loop release), found {extra}")
    c = comps["action_step"]
    for role, want, have in (("input", STEP_INPUTS, c.inputs), ("output", STEP_OUTPUTS, c.outputs)):
        expect(sorted(have) == sorted(want), f"{c.binary} {role}s", f"expected {want}, found {sorted(have)}")
    return ["action_step"]


def stats_file(root):
    found = sorted(root.glob("*_dataset_stats.json"))
    expect(len(found) == 1, f"{root}/*_dataset_stats.json",
           f"expected the checkpoint's one dataset statistics file, found {[p.name for p in found]}")
    return found[0]


def feature_norm(stats: dict, feature: str, tag: str, mode: str, dims: int, where: str, dims_from: str) -> dict:
    """`stats[feature][tag]` (upstream's `shape_meta` key: `default` for LIBERO) as the bundle's
    normalization in `mode` (upstream's `norm_default_mode`)."""
    expect(mode in NORM_MODES, "--norm-mode", f"expected one of {', '.join(NORM_MODES)}, found {mode!r}")
    name, low_key, high_key = NORM_MODES[mode]
    tags = stats.get(feature)
    expect(isinstance(tags, dict), f"{where} {feature}", f"expected the {feature} statistics, found none")
    expect(tag in tags, f"{where} {feature}", f"tag {tag!r} not found; tags: {', '.join(sorted(tags))}")
    stat = tags[tag]
    key0 = f"{where} {feature}.{tag}"
    expect(isinstance(stat, dict), key0, f"expected an object of statistics, found {type(stat).__name__}")

    def arr(key):
        expect(key in stat, f"{key0}.{key}", f"expected for {mode}, found keys {sorted(stat)}")
        a = np.asarray(stat[key], np.float64).reshape(-1)
        expect(len(a) == dims, f"{key0}.{key}", f"length: expected {dims} ({dims_from}), found {len(a)}")
        expect(np.isfinite(a).all(), f"{key0}.{key}", "expected finite values")
        return a.tolist()

    keys = ("mean", "std") if name == "mean_std" else ("low", "high")
    return {"mode": name, keys[0]: arr(low_key), keys[1]: arr(high_key)}


def action_norm(stats: dict, mode: str, dims: int, where: str, tag: str = "default") -> dict:
    return feature_norm(stats, "action", tag, mode, dims, where, "latents_action's last dim")


def manifest(name: str, comps: dict, settings: dict, norm: dict, horizon: int, dims: int) -> dict:
    from .bundle import CONTEXT_COSINE, END_TO_END_COSINE, FORMAT

    return {
        "format": FORMAT, "name": name, "version": "0.1.0", "policy": "fastwam", "variant": "fastwam",
        "soc_model": 77, "htp_arch": 73, "min_runtime_version": "0.1.0",
        "components": {"action_step": {"binary": "ctx/action_step_socid77_archv73.bin",
                                       "golden": "golden/action_step_io.npz", "graph": comps["action_step"].graph}},
        "fastwam": {"action_horizon": horizon, "action_dims": dims, "flow_steps": settings["flow_steps"],
                    "shift": settings["shift"], "world_model": "inputs/world_model.npz", "action_norm": norm,
                    "gripper_map": settings["gripper_map"], "gripper_binarize": settings["gripper_binarize"]},
        "parity": {"context_cosine": CONTEXT_COSINE, "end_to_end_cosine": END_TO_END_COSINE},
        "end_to_end": "golden/end_to_end.npz",
    }


def end_to_end(stage, comps: dict, man: dict, world: dict, seed: int) -> dict:
    """The release's ONNX action_step on ONNX Runtime's CPU over the world model, with vlad's
    noise for the seed. With a binarized gripper, seeds whose pre-binarize gripper comes within
    GRIPPER_MARGIN of the threshold are skipped (a sign the NPU's fp16 could flip); the
    seed used is in the result."""
    from .bundle import cpu_runners

    from vla_host import reference as ref  # noqa: E402  (scripts/ is on the path: see __main__)

    runners = cpu_runners(comps, ["action_step"])
    f = man["fastwam"]
    for s in range(seed, seed + SEED_TRIES):
        result, _ = ref.run_bundle(stage, runners, {"seed": np.array([s], np.uint64)})
        if f["gripper_binarize"]:
            raw = dict(man, fastwam=dict(f, gripper_binarize=False))
            # the gripper as it goes into the sign: -(2g - 1) for `libero`, g for `none`
            g = ref.run_fastwam(raw, world, lambda c, feeds: runners[c](feeds), s)["actions"][:, -1]
            if np.abs(g).min() < GRIPPER_MARGIN:
                continue
        return {"seed": np.array([s], np.uint64), "actions": result["actions"], "noise": result["noise"]}
    raise ImportRefused("--seed", f"no seed in {seed}..{seed + SEED_TRIES - 1} keeps every gripper value "
                        f"{GRIPPER_MARGIN} away from the binarize threshold")


def world_model(comps: dict) -> dict:
    arrays = comps["action_step"].arrays
    return {k: np.asarray(arrays[k], np.float32) for k in WORLD}


def settings(a) -> dict:
    s = dict(LIBERO)
    for key in ("flow_steps", "shift", "norm_mode", "gripper_map", "gripper_binarize"):
        value = getattr(a, key, None)
        if value is not None:
            s[key] = value
    expect(s["flow_steps"] >= 1, "--flow-steps", f"expected >= 1, found {s['flow_steps']}")
    expect(s["shift"] > 0, "--shift", f"expected > 0, found {s['shift']}")
    return s
