#!/usr/bin/env python3
"""Upstream predict_action's actions for instruction texts the tiny upstream bundle was not
imported with (golden/upstream-molmoact2/upstream/text_actions.npz), for `vlad run-once
--instruction-text`.

The model is the tiny upstream MolmoAct2 of tools/goldens/vla_goldens/export_upstream_molmoact2.py, rebuilt the
same way (its `tiny_config`, seed and `randomize`; f32, as the release was exported from), and
checked first: on the bundle's observation 0 with its imported instruction it must give the
committed `original.npz` actions (max abs <= 1e-6; 2.4e-7 seen). Then each new text runs on the same observation with
vlad's noise for its seed. Texts are kept only if upstream's processor renders them to the
exported length (the contexts bake RoPE positions for it); one longer text is recorded with
its length, for the refusal.

    build/upstream-venv/bin/python -m vla_goldens.upstream_text_actions
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[3]
from vla_goldens import export_upstream_molmoact2 as ex
from vla_goldens import upstream_molmoact2 as um
from vla_host.det_npz import save_npz
from vla_host.reference import U64, gaussian_noise

UP = ROOT / "golden" / "upstream-molmoact2"
# Not among the bundle's instructions; upstream normalizes the messy ones.
CANDIDATES = [
    "put the cup on the plate",
    "put the plate on the stove",
    "Put the cup in the bowl!",
    "put the bowl on the cup",
    "put the mug on the stove",
]
TOO_LONG = "pick up the alphabet soup and the cream cheese box and put both of them in the basket next to the plate"


def main() -> None:
    proc_mod, img_mod, vid_mod, mdl = um.load_hf_package()
    cfg_mod = importlib.import_module(f"{um.HF_PKG}.configuration_molmoact2")
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer.from_pretrained(str(ROOT / "golden" / "upstream" / "tokenizer"))
    processor = ex.um.make_processor(proc_mod, img_mod, vid_mod, tok, ex.CROP, col_tokens=False)
    config = ex.tiny_config(cfg_mod, tok)
    torch.manual_seed(ex.WEIGHT_SEED)
    model = mdl.MolmoAct2ForConditionalGeneration(config).eval()
    ex.randomize(model, ex.WEIGHT_SEED)
    model.config._name_or_path = str(UP / "checkpoint")  # norm_stats.json

    golden = dict(np.load(UP / "upstream" / "original.npz"))
    bundle = json.loads((ROOT / "golden" / "bundles" / "molmoact2-upstream-original" / "bundle.json").read_text())
    imported = bundle["molmoact2"]["instructions"]
    seq_len = bundle["molmoact2"]["seq_len"]
    frames, state = golden["obs0_frames"], golden["obs0_state"]
    seed = int(golden["obs0_seed"][0])
    steps = ex.VARIANTS["original"][0]
    noise = gaussian_noise(seed & U64, (1, ex.HORIZON, ex.MAX_ACTION_DIM))
    noise[..., ex.ACTION_DIMS:] = 0.0

    def actions(text):
        return ex.predict(model, processor, frames, state, text, steps, noise)[0]

    want = golden["obs0_actions"]
    got = actions(imported[int(golden["obs0_instruction_id"][0])])
    # 2.4e-7 measured: the same model, the last bits of the float order.
    if np.abs(got - want).max() > 1e-6:
        raise SystemExit(f"the rebuilt model does not reproduce original.npz (max abs {np.abs(got - want).max():.3e})")

    robot = mdl._RobotStats(json.loads((UP / "checkpoint" / "norm_stats.json").read_text()))
    state_string = mdl._build_discrete_state_string(
        np.asarray(robot.normalize_state(state, ex.TAG), np.float32), 256)

    def length(text):
        rendered = ex.render(mdl, text, state_string)
        blank = [np.zeros((ex.FRAME_H, ex.FRAME_W, 3), np.uint8)] * ex.CAMERAS
        return int(processor(text=rendered, images=blank, return_tensors="pt")["input_ids"].shape[1])

    kept = [t for t in CANDIDATES if t not in imported and length(t) == seq_len]
    if len(kept) < 2:
        raise SystemExit(f"fewer than 2 candidates render to {seq_len} tokens")
    out = {"frames": frames, "state": state, "seed": np.array([seed], np.uint64),
           "texts": np.frombuffer("\n".join(kept).encode(), np.uint8),
           "too_long": np.frombuffer(TOO_LONG.encode(), np.uint8),
           "too_long_tokens": np.array([length(TOO_LONG)], np.int64)}
    for i, text in enumerate(kept):
        out[f"actions{i}"] = actions(text)
    save_npz(UP / "upstream" / "text_actions.npz", out)
    print(f"{len(kept)} new texts render to {seq_len} tokens: {kept}; '{TOO_LONG[:30]}...' to "
          f"{out['too_long_tokens'][0]}")


if __name__ == "__main__":
    main()
