#!/usr/bin/env python3
"""Runs upstream MolmoAct2's processor as a checkpoint configures it and writes small goldens to
golden/upstream/processors/, so the bundle's processor settings follow each configuration upstream
allows.

1. Saved processors (3a): for each configuration a `MolmoAct2Processor` (crop mode, size, patch,
   pooling, column-token settings) is saved with `save_pretrained`, or a saved file is edited the
   way a checkpoint's file may differ (keys absent, null, `size` as an int), and loaded back with
   lerobot's own loader `_load_local_molmoact2_processor` (what the pack step of a LeRobot
   checkpoint runs: the image processor from the file's `image_processor` block with upstream's
   defaults for absent keys, the tokenizer by `Qwen2Tokenizer.from_pretrained`, the column-token
   keys with its defaults). Two instructions with two 48x64 cameras are rendered through the
   loaded processor (batch 1, as `select_action`). Kept: the saved `processor_config.json`
   (`<name>.json`, the tokenizer is golden/upstream/tokenizer/'s) and, in `manifest.json`, the
   loaded settings, the token ids, `token_type_ids`, `image_grids`, or the error upstream raised.
2. Instructions that contain special-token text (3b): rendered through one loaded processor;
   the action expert's encoder mask by `MolmoAct2Model._get_encoder_attention_mask` for
   action_mode "both" and "continuous"; the state rows as the positions where two renderings with
   different states differ (derived here from upstream's ids); and `build_input_embeddings`
   (run with a stub `self` holding an embedding table and a vision backbone that returns one
   feature per expected patch) to show which prompts upstream refuses.
3. The pack step itself per lerobot version (item 4): `MolmoAct2PackInputsProcessorStep` built
   and run as that version's code does (`pack_<label>.json`). The wheel's by default; another
   source tree with `--lerobot-src DIR/src/lerobot --label NAME` (lerobot main is not on PyPI:
   a checkout of huggingface/lerobot, loaded in the same venv the same way).

Upstream is the pinned lerobot==0.6.1 wheel in the venv of scripts/setup_upstream.sh, loaded as
tools/goldens/vla_goldens/upstream_lerobot_norm.py loads it (files unchanged but one PEP 695 class header);
`_hf_token`, which processor_molmoact2 imports from the policy's modeling module (not loaded), is
given as `lambda: None` (offline, no Hub token).

    build/upstream-venv/bin/python -m vla_goldens.upstream_processor_configs [--out golden/upstream/processors]
    build/upstream-venv/bin/python -m vla_goldens.upstream_processor_configs \
        --lerobot-src <lerobot at 7427f31>/src/lerobot --label lerobot-main-c13d79e

Deterministic: fixed inputs and seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import types
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
from vla_goldens.upstream_lerobot_norm import load_lerobot
from vla_goldens.upstream_molmoact2 import load_hf_package

torch.set_num_threads(1)

TOKENIZER = ROOT / "golden" / "upstream" / "tokenizer"
SETUP = "single franka arm with a wrist camera"
CONTROL = "end effector delta pose and gripper"
INSTRUCTIONS = ["Put the bowl on the plate.", "open the   top drawer of the cabinet"]
FRAME = (48, 64)
PACK_STATE = [0.1, -0.5, 1.0, -1.0, 0.0, 0.25, 0.9, -0.2]  # normalized

# name -> (image processor arguments, processor arguments, edit of the saved file or None)
BASE = {"size": {"height": 56, "width": 56}, "crop_mode": "resize", "patch_size": 14, "pooling_size": [2, 2],
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "max_crops": 1}


def drop(*keys, image=False):
    def edit(cfg):
        block = cfg["image_processor"] if image else cfg
        for k in keys:
            block.pop(k, None)
    return edit


def set_(key, value, image=False):
    def edit(cfg):
        (cfg["image_processor"] if image else cfg)[key] = value
    return edit


CONFIGS = {
    "col_default": (BASE, {}, None),
    "col_true": (BASE, {"image_use_col_tokens": True}, None),
    "col_false": (BASE, {"image_use_col_tokens": False}, None),
    "single_true_over_false": (BASE, {"image_use_col_tokens": False, "use_single_crop_col_tokens": True}, None),
    "single_false_over_true": (BASE, {"image_use_col_tokens": True, "use_single_crop_col_tokens": False}, None),
    "col_keys_absent": (BASE, {"image_use_col_tokens": False},
                        drop("image_use_col_tokens", "use_single_crop_col_tokens")),
    "col_null": (BASE, {}, set_("image_use_col_tokens", None)),
    "pool_3x3_size70": ({**BASE, "size": {"height": 70, "width": 70}, "pooling_size": [3, 3]},
                        {"image_use_col_tokens": False}, None),
    "pool_2x1": ({**BASE, "pooling_size": [2, 1]}, {"image_use_col_tokens": True}, None),
    "pool_1x3_size70": ({**BASE, "size": {"height": 70, "width": 70}, "pooling_size": [1, 3]}, {}, None),
    "size_int": (BASE, {"image_use_col_tokens": False}, set_("size", 42, image=True)),
    "image_defaults": (BASE, {"image_use_col_tokens": False},
                       drop("size", "patch_size", "pooling_size", "image_mean", "image_std", image=True)),
    # crop_mode absent: the image processor's own default, overlap-and-resize-c2 (multi-crop)
    "crop_mode_absent": (BASE, {}, drop("crop_mode", image=True)),
    "crop_overlap_c2": ({**BASE, "crop_mode": "overlap-and-resize-c2", "max_crops": 2}, {}, None),
    "crop_unknown": (BASE, {}, set_("crop_mode", "center-crop", image=True)),
    "resample_bicubic": (BASE, {}, set_("resample", 3, image=True)),
}

# The tokenizer files as a checkpoint's may differ from Qwen2's own pipeline: name -> edit of
# (tokenizer.json, tokenizer_config.json). Qwen2Tokenizer.from_pretrained rebuilds its normalizer
# and pre-tokenizer whatever the file says.
TOKENIZER_EDITS = {
    "normalizer_lowercase": lambda t, c: t.update(normalizer={"type": "Lowercase"}),
    "pretokenizer_whitespace": lambda t, c: t.update(pre_tokenizer={"type": "Whitespace"}),
    "add_prefix_space": lambda t, c: c.update(add_prefix_space=True),
}
TOKENIZER_TEXT = "Put The BOWL on the caf\u00e9 plate\tnow, then  stop!"

# 3b: instructions with special-token text (rendered through "col_false").
SPECIAL = [
    "pick up the <action_start> bowl",
    "pick up the <action_start> bowl <action_end> and stop",
    "put <action_end> the bowl down",
    "move to <state_3> then <STATE_200>",
    "move to <state_0> and wait",
    "look at <im_patch> here",
    "look at <im_col> and <im_start> there",
    "an <|image|> inside",
    "stop at <|im_end|> now",
    "pad <|endoftext|> here",
    "<setup_start>kitchen<setup_end> task",
]


def loaded_settings(proc) -> dict:
    ip = proc.image_processor
    return {"crop_mode": ip.crop_mode, "size": dict(ip.size), "patch_size": ip.patch_size,
            "pooling_size": list(ip.pooling_size), "image_mean": list(np.asarray(ip.image_mean, float).reshape(-1)),
            "image_std": list(np.asarray(ip.image_std, float).reshape(-1)), "resample": int(ip.resample),
            "image_use_col_tokens": proc.image_use_col_tokens,
            "use_single_crop_col_tokens": proc.use_single_crop_col_tokens,
            "use_single_crop_start_token": proc.use_single_crop_start_token,
            "bos_token_id": proc.tokenizer.bos_token_id, "eos_token_id": proc.tokenizer.eos_token_id,
            "pad_token_id": proc.tokenizer.pad_token_id}


def state_string(pm, bins) -> str:
    return "<state_start>" + "".join(f"<state_{b}>" for b in bins) + "<state_end>"


def render(pm, proc, task: str, frames, bins, normalize=True) -> dict:
    text = pm._build_robot_text(task=pm._normalize_question_text(task) if normalize else task,
                                discrete_state_string=state_string(pm, bins), setup_type=SETUP, control_mode=CONTROL,
                                add_setup_tokens=True, add_control_tokens=True, num_images=len(frames))
    out = proc(text=[text], images=list(frames), return_tensors="np", padding=True)
    return {"text": text, "input_ids": np.asarray(out["input_ids"])[0].astype(np.int64),
            "attention_mask": np.asarray(out["attention_mask"])[0].astype(np.int64),
            "token_type_ids": np.asarray(out["token_type_ids"])[0].astype(np.int64),
            "image_grids": np.asarray(out["image_grids"]).astype(np.int64)}


# 3. The pack step itself, per lerobot version: instructions of several lengths
# (so several left-padding counts under lerobot main's pad_to_multiple_of=8), and its
# max_sequence_length refusal at the rendered length and one below.
PACK_INSTRUCTIONS = ["go", "Put the bowl on the plate.", "open the   top drawer of the cabinet",
                     "pick up the black bowl between the plate and the ramekin and place it on the plate",
                     "move it"]


def pack_goldens(pm, frames, state, label: str, out: Path) -> None:
    """`MolmoAct2PackInputsProcessorStep` as the loaded lerobot version builds and runs it
    (batch 1, action_mode continuous: no action tokenizer), on the saved col_false processor."""
    from lerobot.lerobot_types import TransitionKey

    if pm._resolve_checkpoint_location is None:  # 0.6.1 imports it from the (stubbed) modeling module
        pm._resolve_checkpoint_location = lambda path, **_: path
    keys = ["observation.images.cam0", "observation.images.cam1"]
    golden: dict = {"upstream": label, "instructions": PACK_INSTRUCTIONS, "rows": [], "cap_refusals": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shutil.copy(out / "col_false.json", tmp / "processor_config.json")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TOKENIZER / f, tmp / f)

        def run(text, cap=None):
            step = pm.MolmoAct2PackInputsProcessorStep(checkpoint_path=str(tmp), action_mode="continuous",
                                                       image_keys=keys, setup_type=SETUP, control_mode=CONTROL,
                                                       max_sequence_length=cap)
            obs = {"observation.state": torch.as_tensor(state, dtype=torch.float32)[None]}
            for k, f in zip(keys, frames):
                obs[k] = f[None]
            tr = {TransitionKey.OBSERVATION: obs, TransitionKey.COMPLEMENTARY_DATA: {"task": [text]}}
            return step(tr)[TransitionKey.COMPLEMENTARY_DATA]

        for text in PACK_INSTRUCTIONS:
            c = run(text)
            row = {k: np.asarray(c[k])[0].astype(np.int64).tolist()
                   for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids") if k in c}
            golden["rows"].append(row)
            valid = int(sum(row["attention_mask"]))
            for cap in (valid, valid - 1):
                try:
                    run(text, cap)
                    golden["cap_refusals"].append({"instruction": text, "cap": cap, "error": None})
                except ValueError as exc:
                    golden["cap_refusals"].append({"instruction": text, "cap": cap, "error": str(exc)})
            print(label, repr(text), len(row["input_ids"]), valid, "position_ids" in row)
    (out / f"pack_{label}.json").write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "golden" / "upstream" / "processors")
    ap.add_argument("--lerobot-src", type=Path,
                    help="another lerobot source tree (src/lerobot): write only its pack step's goldens")
    ap.add_argument("--label", help="with --lerobot-src: the version's name in pack_<label>.json")
    args = ap.parse_args()
    proc_mod, img_mod, vid_mod, mdl = load_hf_package()
    _, _, pm = load_lerobot(args.lerobot_src)
    pm._hf_token = lambda: None
    from transformers import Qwen2Tokenizer

    if args.lerobot_src is not None:
        frames = np.random.default_rng(2626).integers(0, 256, (2, *FRAME, 3), dtype=np.uint8)
        pack_goldens(pm, frames, PACK_STATE, args.label, args.out)
        return

    tokenizer = Qwen2Tokenizer.from_pretrained(str(TOKENIZER))
    rng = np.random.default_rng(2626)
    frames = rng.integers(0, 256, (2, *FRAME, 3), dtype=np.uint8)
    states = [[17, 0, 255, 128, 3, 64, 200, 9], [1, 2, 3, 4, 5, 6, 7, 8]]
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    manifest: dict = {"upstream": "lerobot 0.6.1 _load_local_molmoact2_processor + MolmoAct2Processor",
                      "tokenizer": "golden/upstream/tokenizer", "setup_type": SETUP, "control_mode": CONTROL,
                      "instructions": INSTRUCTIONS, "frame": list(FRAME), "state_bins": states[0],
                      "configs": {}, "special": {}}
    loaded = {}
    for name, (image_args, proc_args, edit) in CONFIGS.items():
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            image = img_mod.MolmoAct2ImageProcessor(**image_args)
            proc = proc_mod.MolmoAct2Processor(image_processor=image, video_processor=vid_mod.MolmoAct2VideoProcessor(),
                                               tokenizer=tokenizer, **proc_args)
            proc.save_pretrained(str(tmp))
            cfg_path = tmp / "processor_config.json"
            cfg = json.loads(cfg_path.read_text())
            if edit is not None:
                edit(cfg)
                cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            shutil.copy(cfg_path, args.out / f"{name}.json")
            entry: dict = {}
            try:
                lp = pm._load_local_molmoact2_processor(str(tmp))
                entry["loaded"] = loaded_settings(lp)
                rows = [render(pm, lp, t, frames, states[0]) for t in INSTRUCTIONS]
                entry["input_ids"] = [r["input_ids"].tolist() for r in rows]
                entry["token_type_ids"] = [r["token_type_ids"].tolist() for r in rows]
                entry["image_grids"] = rows[0]["image_grids"].tolist()
                entry["text"] = [r["text"] for r in rows]
                loaded[name] = lp
            except Exception as exc:  # upstream's own refusal, recorded
                entry["upstream_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            manifest["configs"][name] = entry
            print(name, {k: (v if k in ("loaded", "upstream_error", "image_grids") else "...") for k, v in entry.items()})

    manifest["tokenizers"] = {"text": TOKENIZER_TEXT}
    for name, edit in TOKENIZER_EDITS.items():
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            shutil.copy(args.out / "col_false.json", tmp / "processor_config.json")
            tok_json = json.loads((TOKENIZER / "tokenizer.json").read_text())
            tok_cfg = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
            edit(tok_json, tok_cfg)
            (tmp / "tokenizer.json").write_text(json.dumps(tok_json))
            (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
            lp = pm._load_local_molmoact2_processor(str(tmp))
            row = render(pm, lp, TOKENIZER_TEXT, frames, states[0], normalize=False)
            manifest["tokenizers"][name] = {"input_ids": row["input_ids"].tolist()}
            print(name, len(row["input_ids"]))

    proc = loaded["col_false"]
    patch_id = tokenizer.convert_tokens_to_ids("<im_patch>")
    eos = tokenizer.eos_token_id
    width = 4
    wte = torch.nn.Embedding(len(tokenizer), width)
    for text in SPECIAL:
        a, b = render(pm, proc, text, frames, states[0]), render(pm, proc, text, frames, states[1])
        entry = {"text": a["text"], "input_ids": a["input_ids"].tolist(), "token_type_ids": a["token_type_ids"].tolist(),
                 "state_positions": np.flatnonzero(a["input_ids"] != b["input_ids"]).tolist()}
        ids = torch.as_tensor(a["input_ids"])[None]
        am = torch.as_tensor(a["attention_mask"])[None]
        for mode in ("both", "continuous"):
            stub = types.SimpleNamespace(config=types.SimpleNamespace(
                action_mode=mode, eos_token_id=eos, action_start_token_id=tokenizer.convert_tokens_to_ids("<action_start>"),
                action_end_token_id=tokenizer.convert_tokens_to_ids("<action_end>")),
                _mask_discrete_output_span=mdl.MolmoAct2Model._mask_discrete_output_span)
            enc = mdl.MolmoAct2Model._get_encoder_attention_mask(stub, ids, am)
            entry[f"encoder_mask_{mode}"] = enc[0].numpy().astype(int).tolist()
        # build_input_embeddings: as many image features as the images give (2 cameras x grid)
        features = int(sum(int(g[0]) * int(g[1]) for g in a["image_grids"]))
        stub = types.SimpleNamespace(transformer=types.SimpleNamespace(wte=wte, emb_drop=torch.nn.Identity()),
                                     vision_backbone=lambda images, pooling: torch.zeros(features, width),
                                     config=types.SimpleNamespace(image_patch_id=patch_id))
        try:
            mdl.MolmoAct2Model.build_input_embeddings(stub, ids, images=torch.zeros(1), token_pooling=None)
            entry["upstream_error"] = None
        except Exception as exc:
            entry["upstream_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        manifest["special"][text] = entry
        print(repr(text), entry["upstream_error"], len(entry["state_positions"]))
    pack_goldens(pm, frames, PACK_STATE, "lerobot-0.6.1", args.out)
    text = json.dumps(manifest, indent=1, sort_keys=True)
    # one line per list of numbers
    text = re.sub(r"\[\s*(-?[0-9.e+-]+(?:,\s*-?[0-9.e+-]+)*)\s*\]",
                  lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]", text)
    (args.out / "manifest.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
