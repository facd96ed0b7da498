"""A MolmoAct2 checkpoint in the LeRobot layout (the retrained variants): the policy's
`config.json` (`type` molmoact2, `checkpoint_path` naming the Hugging Face checkpoint that
still supplies tokenizer, processor and model config), its `model.safetensors`, and the
statistics in the processor pipelines: `policy_preprocessor.json` / `policy_postprocessor.json`
list their steps, and the masked (un)normalizer step names its `state_file`, a safetensors of
flat `<feature>.<stat>` tensors (`observation.state.q01`, `action.mask`, ...). Step numbers
differ between lerobot versions and forks, so the steps are found by registry name.

What vlad computes is lerobot's policy pipeline (`processor_molmoact2.py`,
`processor/normalize_processor.py`): the masked normalizer, the masked clamp of the normalized
state, the clamp of every action dim, the masked unnormalizer. The bundle says so:
`follows: lerobot_pipeline` with the steps' own `eps` in both normalization blocks."""

import json
from pathlib import Path

import numpy as np

from .errors import ImportRefused, expect

PREPROCESSOR = "policy_preprocessor.json"
POSTPROCESSOR = "policy_postprocessor.json"
NORMALIZER = "molmoact2_masked_normalizer"
UNNORMALIZER = "molmoact2_masked_unnormalizer"
PACK = "molmoact2_pack_inputs"
STATE, ACTION = "observation.state", "action"
# lerobot NormalizationMode -> the bundle's mode and the stats it reads. QUANTILE10 is the same
# formula on q10/q90 (normalize_processor.py), so it is the quantile mode on those bounds.
MODES = {"QUANTILES": ("quantile", "q01", "q99"), "QUANTILE10": ("quantile", "q10", "q90"),
         "MIN_MAX": ("min_max", "min", "max"), "MEAN_STD": ("mean_std", "mean", "std"),
         "IDENTITY": ("identity", None, None)}
FOLLOWS = "lerobot_pipeline"
DEFAULT_EPS = 1e-8  # NormalizerProcessorStep's dataclass default, when a config omits it


def is_lerobot(config: dict) -> bool:
    """A LeRobot policy config (not a Hugging Face model config): it names the HF checkpoint."""
    return "checkpoint_path" in config and "text_config" not in config


def _pipeline(root: Path, name: str) -> tuple[Path, list]:
    path = root / name
    expect(path.is_file(), str(path), "expected the LeRobot processor pipeline (its statistics), found none")
    try:
        steps = json.loads(path.read_text()).get("steps")
    except json.JSONDecodeError as exc:
        raise ImportRefused(str(path), f"not JSON: {exc}") from exc
    expect(isinstance(steps, list), f"{path} steps", "expected a list of steps")
    return path, steps


def _step(path: Path, steps: list, registry: str) -> tuple[int, dict]:
    found = [(i, s) for i, s in enumerate(steps) if isinstance(s, dict) and s.get("registry_name") == registry]
    names = [s.get("registry_name") for s in steps if isinstance(s, dict)]
    expect(len(found) == 1, f"{path} steps", f"expected one {registry!r} step, found {len(found)} in {names}")
    return found[0]


def _read_state(root: Path, path: Path, index: int, step: dict) -> tuple[Path, dict]:
    name = step.get("state_file")
    expect(isinstance(name, str), f"{path} steps[{index}].state_file", "expected the statistics file, found none")
    state = root / name
    expect(state.is_file(), str(state), f"expected the statistics named by {path.name} steps[{index}], found none")
    from safetensors import safe_open

    try:
        with safe_open(str(state), framework="numpy") as f:
            return state, {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # a damaged file: one line with the cause
        raise ImportRefused(str(state), f"not a readable safetensors file: {exc}".splitlines()[0]) from exc


def _mode(path: Path, index: int, step: dict, feature_type: str) -> tuple[str, str | None, str | None]:
    norm_map = step.get("config", {}).get("norm_map")
    where = f"{path} steps[{index}].config.norm_map.{feature_type}"
    expect(isinstance(norm_map, dict), f"{path} steps[{index}].config.norm_map", "expected an object")
    mode = norm_map.get(feature_type, "IDENTITY")
    expect(mode in MODES, where, f"expected one of {', '.join(MODES)}, found {mode!r}")
    return MODES[mode]


def _eps(path: Path, index: int, step: dict) -> float:
    eps = step.get("config", {}).get("eps", DEFAULT_EPS)
    ok = isinstance(eps, (int, float)) and not isinstance(eps, bool) and np.isfinite(eps) and eps > 0
    expect(ok, f"{path} steps[{index}].config.eps", f"expected a positive number, found {eps!r}")
    return float(eps)


def _normalization(stats: dict, feature: str, mode: tuple, where: str, dims: int | None, eps: float) -> dict:
    """The bundle block for one feature, following lerobot's pipeline: no zero mask (a zero range
    divides by `eps`), every mode clamped, a pass-through value outside [-1, 1] refused."""
    name, low_key, high_key = mode

    def arr(stat):
        key = f"{feature}.{stat}"
        expect(key in stats, f"{where} {key}", f"expected for {name}, found keys {sorted(stats)}")
        a = np.asarray(stats[key], np.float64).reshape(-1)
        expect(np.isfinite(a).all(), f"{where} {key}", "expected finite values")
        return a

    if name == "identity":
        expect(dims is not None, f"{where} {feature}", "identity normalization: the dimension is not stated")
        block, n = {"mode": "identity"}, dims
    else:
        low, high = arr(low_key), arr(high_key)
        expect(len(low) == len(high), f"{where} {feature}.{high_key}",
               f"length: expected {len(low)} ({low_key}'s), found {len(high)}")
        keys = ("mean", "std") if name == "mean_std" else ("low", "high")
        block, n = {"mode": name, keys[0]: low.tolist(), keys[1]: high.tolist()}, len(low)
    block["follows"], block["eps"] = FOLLOWS, eps
    mask_key = f"{feature}.mask"
    if mask_key in stats:
        mask = np.asarray(stats[mask_key]).reshape(-1)
        expect(len(mask) == n, f"{where} {mask_key}", f"length: expected {n}, found {len(mask)}")
        block["passthrough"] = [not bool(m) for m in mask]
    return block, n


def normalization(root: Path, policy: dict) -> dict:
    """state_norm, action_norm, their dims and where they came from."""
    pre, pre_steps = _pipeline(root, PREPROCESSOR)
    post, post_steps = _pipeline(root, POSTPROCESSOR)
    i, step = _step(pre, pre_steps, NORMALIZER)
    state_file, state_stats = _read_state(root, pre, i, step)
    j, unstep = _step(post, post_steps, UNNORMALIZER)
    action_file, action_stats = _read_state(root, post, j, unstep)
    feats = policy.get("input_features", {}), policy.get("output_features", {})
    dims = {STATE: (feats[0].get(STATE) or {}).get("shape", [None])[0],
            ACTION: (feats[1].get(ACTION) or {}).get("shape", [None])[0]}
    state, state_dims = _normalization(state_stats, STATE, _mode(pre, i, step, "STATE"), str(state_file),
                                       dims[STATE], _eps(pre, i, step))
    action, action_dims = _normalization(action_stats, ACTION, _mode(post, j, unstep, "ACTION"), str(action_file),
                                         dims[ACTION], _eps(post, j, unstep))
    return {"state_norm": state, "action_norm": action, "state_dims": state_dims, "action_dims": action_dims,
            "from": [str(state_file), str(action_file)]}


def pack_settings(root: Path) -> dict:
    """The prompt settings the pipeline's pack step was saved with (setup and control text
    resolved from the statistics' tag at training time), or {}."""
    path, steps = _pipeline(root, PREPROCESSOR)
    found = [s for s in steps if isinstance(s, dict) and s.get("registry_name") == PACK]
    return dict(found[0].get("config") or {}) if found else {}


# processor_molmoact2.py's budget for the sequence cap its pack step infers when its
# max_sequence_length is null (inference: no discrete action labels).
IMAGE_TOKENS, FIXED, TASK, MARGIN, MULTIPLE, DEFAULT_IMAGES = 196, 80, 32, 32, 64, 2


def inferred_max_sequence_length(num_images: int, state_dim: int) -> int:
    """`infer_molmoact2_max_sequence_length(..., include_discrete_action=False)`."""
    num_images = num_images if num_images >= 1 else DEFAULT_IMAGES
    total = num_images * IMAGE_TOKENS + FIXED + TASK + max(state_dim, 0) + MARGIN
    return -(-total // MULTIPLE) * MULTIPLE


def sequence_cap(root: Path, policy: dict, cameras: int, state_dims: int) -> tuple[int, str]:
    """The longest prompt the pipeline's pack step accepts (it raises on a longer one): its
    `max_sequence_length`, else the policy config's, else the inferred budget; and where from."""
    pack = pack_settings(root)
    for value, where in ((pack.get("max_sequence_length"), f"{root / PREPROCESSOR} {PACK} max_sequence_length"),
                         (policy.get("max_sequence_length"), f"{root / 'config.json'} max_sequence_length")):
        if value is not None:
            ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
            expect(ok, where, f"expected a positive integer or null, found {value!r}")
            return value, where
    return (inferred_max_sequence_length(cameras, state_dims),
            f"{root / PREPROCESSOR} {PACK} max_sequence_length (null: lerobot's budget for {cameras} images, "
            f"{state_dims} state dims)")


def frame_size(policy: dict, image_keys: list, where: str):
    """(H, W) of the cameras from `input_features` (VISUAL, shape [3, H, W]); None when absent."""
    feats = policy.get("input_features") or {}
    shapes = {k: tuple(f.get("shape", ())) for k, f in feats.items() if isinstance(f, dict) and f.get("type") == "VISUAL"}
    if not shapes:
        return None
    keys = image_keys or sorted(shapes)
    missing = [k for k in keys if k not in shapes]
    expect(not missing, f"{where} input_features", f"expected the image keys {keys}, missing {missing}")
    sizes = {shapes[k] for k in keys}
    expect(len(sizes) == 1 and len(next(iter(sizes))) == 3, f"{where} input_features",
           f"expected one [3, H, W] shape for every camera, found {sorted(sizes)}")
    _, h, w = next(iter(sizes))
    return int(h), int(w)
