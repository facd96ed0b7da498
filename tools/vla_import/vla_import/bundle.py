"""Assembling a MolmoAct2 bundle (docs/bundle-format.md) from what the other modules read, and
writing it atomically: everything goes into a temporary sibling directory that is renamed onto
the output only when every check passed."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .errors import ImportRefused, expect

from vla_host import reference as ref
from vla_host.det_npz import save_npz

FORMAT = 1
CONTEXT_COSINE = 0.9999
END_TO_END_COSINE = 0.999


def manifest(name, variant, order, comps, m: dict) -> dict:
    return {
        "format": FORMAT, "name": name, "version": "0.1.0", "policy": "molmoact2", "variant": variant,
        "soc_model": 77, "htp_arch": 73, "min_runtime_version": "0.1.0",
        "components": {c: {"binary": f"ctx/{c}_socid77_archv73.bin", "golden": f"golden/{c}_io.npz",
                           "graph": comps[c].graph} for c in order},
        "molmoact2": m,
        "parity": {"context_cosine": CONTEXT_COSINE, "end_to_end_cosine": END_TO_END_COSINE},
        "end_to_end": "golden/end_to_end.npz",
    }


def synthetic_observation(m: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    norm = m["state_norm"]
    # Through f32 as vlad reads the bundle: the same statistics give the same observation
    # whether they came as JSON doubles or as a LeRobot checkpoint's f32 tensors.
    low = np.array(norm.get("low", norm.get("mean", [0.0] * m["state_dims"])), np.float32).astype(np.float64)
    high = np.array(norm.get("high", low), np.float32).astype(np.float64)
    state = low + (high - low) * rng.uniform(0, 1, m["state_dims"])
    if norm.get("follows") == "lerobot_pipeline":
        # lerobot refuses a pass-through (gripper) value outside [-1, 1]: draw one it accepts.
        state = np.where(norm.get("passthrough", False), np.clip(state, -1.0, 1.0), state)
    return {
        "frames": rng.integers(0, 256, (m["cameras"], m["frame_height"], m["frame_width"], 3), dtype=np.uint8),
        "state": state.astype(np.float32),
        "instruction_id": np.array([0], np.int32),
        "seed": np.array([seed], np.uint64),
    }


def check_observation(obs: dict, m: dict, where: str) -> dict:
    for key in ("frames", "state", "instruction_id", "seed"):
        expect(key in obs, f"{where} {key}", "expected this array, found none")
    want = (m["cameras"], m["frame_height"], m["frame_width"], 3)
    expect(obs["frames"].shape == want and obs["frames"].dtype == np.uint8, f"{where} frames",
           f"expected u8 {list(want)}, found {obs['frames'].dtype} {list(obs['frames'].shape)}")
    expect(obs["state"].shape == (m["state_dims"],), f"{where} state",
           f"expected {[m['state_dims']]}, found {list(obs['state'].shape)}")
    expect(0 <= int(obs["instruction_id"][0]) < len(m["instructions"]), f"{where} instruction_id",
           f"expected 0..{len(m['instructions']) - 1}, found {int(obs['instruction_id'][0])}")
    norm = m["state_norm"]
    if norm.get("follows") == "lerobot_pipeline":
        bad = [i for i, p in enumerate(norm.get("passthrough", [])) if p and abs(float(obs["state"][i])) > 1]
        expect(not bad, f"{where} state", f"pass-through (gripper) dims {bad} outside [-1, 1]: lerobot's "
               "pipeline refuses such a state")
    return {"frames": obs["frames"], "state": obs["state"].astype(np.float32),
            "instruction_id": obs["instruction_id"].astype(np.int32), "seed": obs["seed"].astype(np.uint64)}


def cpu_runners(comps: dict, order: list) -> dict:
    """The release's ONNX graphs on ONNX Runtime's CPU provider."""
    runners = {}
    for c in order:
        expect(comps[c].onnx is not None, f"onnx/{c}/{c}.onnx",
               "expected the release's ONNX graph (the end-to-end golden is computed from it), found none")
        runners[c] = ref.OrtCpuRunner(comps[c].onnx)
    return runners


def end_to_end(stage: Path, comps: dict, order: list, obs: dict) -> dict:
    """The release's ONNX graphs on ONNX Runtime's CPU provider through the reference pipeline."""
    result, _ = ref.run_bundle(stage, cpu_runners(comps, order), obs)
    order_keys = ["frames", "state", "instruction_id", "seed", "actions", "pixel_values", "hidden_states",
                  "attention_bias", "k_ctx", "v_ctx", "noise", "candidates", "keystone_choice"]
    arrays = {**obs, **result}
    return {k: arrays[k] for k in order_keys if k in arrays}


def write(out: Path, comps: dict, order: list, man: dict, files: dict, make_end_to_end, provenance: dict) -> None:
    """`files`: bundle-relative npz path -> arrays (the prompt tables, a world model), or .npy
    path -> one array, or path -> bytes;
    `make_end_to_end(stage)`: the end-to-end arrays, computed on the staged bundle."""
    out = Path(out)
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=parent))
    try:
        (stage / "ctx").mkdir()
        (stage / "golden").mkdir()
        for c in order:
            shutil.copyfile(comps[c].binary, stage / "ctx" / f"{c}_socid77_archv73.bin")
            save_npz(stage / "golden" / f"{c}_io.npz", {k: np.asarray(v) for k, v in comps[c].arrays.items()})
        for rel, arrays in files.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(arrays, bytes):  # a file copied as is (the tokenizer)
                (stage / rel).write_bytes(arrays)
            elif isinstance(arrays, np.ndarray):  # one array, memory-mapped by vlad
                np.save(stage / rel, arrays, allow_pickle=False)
            else:
                save_npz(stage / rel, arrays)
        (stage / "bundle.json").write_text(json.dumps(man, indent=2) + "\n")
        e2e = make_end_to_end(stage)
        save_npz(stage / "golden" / "end_to_end.npz", e2e)
        provenance["end_to_end_actions"] = e2e["actions"].tolist()
        (stage / "import.json").write_text(json.dumps(provenance, indent=2) + "\n")
        if out.exists():
            expect(out.is_dir() and (out / "bundle.json").is_file(), str(out),
                   "exists and is not a bundle: refusing to replace it")
            old = parent / f".{out.name}.replaced"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(out, old)
            os.rename(stage, out)
            shutil.rmtree(old)
        else:
            os.rename(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
