"""A MolmoAct2 checkpoint: the Hugging Face layout (config.json, processor_config.json, the
tokenizer, the text embedding from safetensors, norm_stats.json), or a LeRobot policy checkpoint
(`lerobot`) on top of the Hugging Face checkpoint its config names."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from vla_host import safetensors_f32

from .errors import ImportRefused, expect

WTE = "model.transformer.wte.embedding"
NEW = "model.transformer.wte.new_embedding"
PREFIXES = ("", "model.", "model.base_model.model.")  # HF, LeRobot, LeRobot under LoRA


def read_json(path: Path) -> dict:
    expect(path.is_file(), str(path), "expected this file, found none")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ImportRefused(str(path), f"not JSON: {exc}") from exc


_header = safetensors_f32.header  # the name the importer's modules and tests call it by


def read_tensor(path: Path, key: str) -> np.ndarray:
    """One tensor as f32 (vla_host.safetensors_f32); another dtype is refused naming it."""
    try:
        return safetensors_f32.read_tensor(path, key)
    except safetensors_f32.DtypeRefused as exc:
        raise ImportRefused(f"{path} {key}", str(exc)) from None


def _locate(root: Path) -> dict:
    """tensor name -> the safetensors file holding it (sharded through the index file)."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        expect(isinstance(weight_map, dict), f"{index} weight_map", "expected an object")
        return {k: root / v for k, v in weight_map.items()}
    single = root / "model.safetensors"
    expect(single.is_file(), str(single), "expected model.safetensors or model.safetensors.index.json")
    return {k: single for k in _header(single)[0] if k != "__metadata__"}


def _find(where: dict, name: str):
    for prefix in PREFIXES:
        if prefix + name in where:
            return prefix + name, prefix
    return None, None


def has_embedding(root: Path) -> bool:
    """Whether `root` holds both wte tensors (under any of the prefixes)."""
    where = _locate(root)
    return all(_find(where, name)[0] for name in (WTE, NEW))


def embedding_table(roots: list) -> tuple[np.ndarray, str, list]:
    """wte = embedding then new_embedding, f32. Each tensor is taken from the first root that
    has it (a LeRobot checkpoint before the Hugging Face one it was trained from, so its
    fine-tuned `new_embedding` wins). Returns the table, the key prefix and "file key" of each."""
    located = {}  # read lazily: a base checkpoint is opened only for a tensor the first lacks

    def where_of(i):
        if i not in located:
            located[i] = _locate(roots[i])
        return located[i]

    parts, prefixes = [], []
    for name in (WTE, NEW):
        hit = next(((where_of(i), key, prefix) for i in range(len(roots))
                    for key, prefix in [_find(where_of(i), name)] if key), None)
        if hit is None:
            raise ImportRefused(" + ".join(str(r) for r in roots),
                                f"expected a tensor {name} (with prefix {', '.join(repr(p) for p in PREFIXES[1:])} "
                                "or none), found none")
        where, key, prefix = hit
        parts.append((where[key], key, read_tensor(where[key], key)))
        prefixes.append(prefix)
    (fa, ka, a), (fb, kb, b) = parts
    expect(a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[1], f"{fa} {ka}",
           f"expected [V, D] and [A, D] ({fb} {kb}), found {list(a.shape)} and {list(b.shape)}")
    prefix = prefixes[0] if prefixes[0] == prefixes[1] else f"{prefixes[0]!r} / {prefixes[1]!r}"
    return np.concatenate([a, b]).astype(np.float32), prefix, [f"{fa} {ka}", f"{fb} {kb}"]


def embedding_dtype(roots: list) -> str:
    """The safetensors dtype of the wte tensors (`embedding_table` takes each from the first root
    that has it): the dtype the bundle's embedding table keeps; F32 when the two differ."""
    dtypes = set()
    for name in (WTE, NEW):
        for root in roots:
            where = _locate(root)
            key, _ = _find(where, name)
            if key:
                dtypes.add(_header(where[key])[0][key]["dtype"])
                break
    return dtypes.pop() if len(dtypes) == 1 else "F32"


def exact_table(wte: np.ndarray, dtype: str) -> tuple[np.ndarray, str | None]:
    """The f32 table `embedding_table` returns, back in the checkpoint's `dtype` (exact: f16 and
    bf16 widen to f32 without loss). bf16 as its u16 bit patterns, marked "bf16" (npy has no
    bf16)."""
    if dtype == "F16":
        return wte.astype(np.float16), None
    if dtype == "BF16":
        return (np.ascontiguousarray(wte, np.float32).view(np.uint32) >> 16).astype(np.uint16), "bf16"
    return np.ascontiguousarray(wte, np.float32), None


@dataclass
class Checkpoint:
    root: Path  # the checkpoint given (its weights)
    base: Path  # the Hugging Face checkpoint: model config, processor, tokenizer (= root for that layout)
    config: dict  # the Hugging Face model config.json
    processor: dict
    stats: dict | None  # norm_stats.json (Hugging Face layout)
    policy: dict | None  # the LeRobot policy config.json (LeRobot layout)


def load(root: Path, base: Path | None = None) -> Checkpoint:
    """`base` is the Hugging Face checkpoint a LeRobot checkpoint names (already resolved)."""
    config = read_json(root / "config.json")
    policy = None
    if base is not None:
        policy, config = config, read_json(base / "config.json")
    else:
        base = root
    processor = read_json(base / "processor_config.json")
    stats = read_json(root / "norm_stats.json") if policy is None else None
    expect((base / "tokenizer.json").is_file(), str(base / "tokenizer.json"), "expected the tokenizer, found none")
    return Checkpoint(root, base, config, processor, stats, policy)


def tag_metadata(ck: Checkpoint, tag: str) -> dict:
    tags = ck.stats.get("metadata_by_tag")
    where = str(ck.root / "norm_stats.json")
    expect(isinstance(tags, dict) and tags, f"{where} metadata_by_tag", "expected an object of tags")
    expect(tag in tags, f"{where} metadata_by_tag", f"tag {tag!r} not found; tags: {', '.join(sorted(tags))}")
    return tags[tag]


def normalization(stats: dict, mode: str, where: str) -> dict:
    """A bundle normalization block from upstream's `_FeatureNormalizer.from_stats` rules:
    mask False = passthrough, min == max = constant (zero_mask); the bundle says it follows that
    normalizer (`predict_action`'s), not LeRobot's pipeline."""
    def arr(key):
        expect(key in stats, f"{where} {key}", f"expected for norm_mode {mode!r}, found none")
        return [float(v) for v in stats[key]]

    mask = stats.get("mask")
    if mode == "q01_q99":
        block = {"mode": "quantile", "low": arr("q01"), "high": arr("q99")}
    elif mode == "min_max":
        block = {"mode": "min_max", "low": arr("min"), "high": arr("max")}
    elif mode == "q10_q90":
        block = {"mode": "quantile", "low": arr("q10"), "high": arr("q90")}
    elif mode == "mean_std":
        block = {"mode": "mean_std", "mean": arr("mean"), "std": arr("std")}
    elif mode == "none":
        block = {"mode": "identity"}
    else:
        raise ImportRefused(f"{where} norm_mode", f"expected q01_q99, q10_q90, min_max, mean_std or none, "
                            f"found {mode!r}")
    block = {"mode": block.pop("mode"), "follows": "hf_feature_normalizer", **block}
    n = len(next(iter(v for k, v in block.items() if k not in ("mode", "follows")), [])) or len(mask or [])
    if mask is not None:
        expect(len(mask) == n, f"{where} mask", f"length: expected {n}, found {len(mask)}")
        block["passthrough"] = [not bool(m) for m in mask]
    if mode in ("q01_q99", "q10_q90", "min_max") and "min" in stats and "max" in stats:
        block["constant"] = [a == b for a, b in zip(arr("min"), arr("max"))]
    return block
