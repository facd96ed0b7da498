#!/usr/bin/env python3
"""Builds a tiny MolmoAct2 from the real upstream model code, exports it like the releases and
captures upstream's own inference as goldens (phase 1 of 2: the torch side; phase 2 is
tools/goldens/vla_goldens/make_upstream_golden.py).

Upstream = the pinned PyPI wheel lerobot==0.6.1, its vendored Hugging Face remote code
`molmoact2_hf_model/` (`MolmoAct2ForConditionalGeneration`, `MolmoAct2Processor`,
`MolmoAct2ImageProcessor`) and KeyStone's `selection.py` (github dywsjtu/keystone, passed with
--keystone-src, never copied here). No model code is re-implemented: the model is the upstream
class with a tiny configuration of the real architecture (ViT with the real 2-D attention
pooling, 4 LLM layers cut into 2 splits, the real action expert with flow matching, 2 cameras,
the real special and state tokens) and seeded random weights.

Writes under --out (default build/upstream-molmoact2):
  checkpoint/         the Hugging Face layout: config.json, model.safetensors (real tensor names,
                      `model.transformer.wte.embedding` + `new_embedding`), processor_config.json,
                      tokenizer files, norm_stats.json (`metadata_by_tag`)
  release-<variant>/  the QNN release layout without ctx/ (phase 2 compiles it):
                      onnx/<c>/<c>.onnx, golden/<c>_io.npz (upstream fp32 at the boundaries),
                      golden/trace.json
  upstream/<variant>.npz  upstream predict_action on held-out observations, noise = vlad's
  export_report.json  each rewrite's max abs against the unmodified upstream forward

Each ONNX wrapper calls the upstream submodules; what it rewrites (fixed-shape index instead of
the boolean filter, RoPE cos/sin as constants, the velocity mask as a multiply) is checked in
torch against the unmodified upstream forward and the bound stated in export_report.json.
Phase 2 (`tools/goldens/vla_goldens/make_upstream_golden.py`, project venv) compiles the graphs to v73 / soc 77
contexts and imports the releases into bundles.

    scripts/setup_upstream.sh
    build/upstream-venv/bin/python -m vla_goldens.export_upstream_molmoact2 --keystone-src DIR

Deterministic: fixed seeds, one torch thread, stored npz (tools/vla_host/vla_host/det_npz.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[3]
from vla_goldens import upstream_molmoact2 as um  # noqa: E402  (loads the vendored HF package, no torch model)
from vla_host.det_npz import save_npz
from vla_host.export_contract import check_io
from vla_host.reference import U64, gaussian_noise  # noqa: E402  (vlad's noise, numpy only)

torch.set_num_threads(1)

TAG = "libero_tiny"
SETUP_TYPE = "single franka robotic arm in libero"
CONTROL_MODE = "delta end-effector pose"
FRAME_H, FRAME_W = 48, 64
CROP, PATCH = 56, 14
CAMERAS = 2
STATE_DIMS = 8
ACTION_DIMS = 7
HORIZON = 10
MAX_ACTION_DIM = 8
LLM_LAYERS, SPLITS = 4, 2
WEIGHT_SEED = 2301
OBS_SEED = 2302
# Instructions of one rendered length (the exported contexts are for one sequence length).
CANDIDATE_INSTRUCTIONS = [  # LIBERO-style tasks; messy forms on purpose (upstream normalizes them)
    "put the black bowl on the plate",
    "Put the bowl on the plate.",
    "open the top drawer of the cabinet",
    "Task: turn on the stove",
    "pick up the alphabet soup and place it in the basket",
    "put the cream cheese in the bowl",
    "close the microwave",
    "push the plate to the front of the stove",
    "put the wine bottle on top of the cabinet",
    "open the middle drawer of the cabinet",
    "put the bowl on the stove",
    "put the bowl on top of the cabinet",
    "pick up the ketchup and place it in the basket",
    "pick up the tomato sauce and place it in the basket",
    "pick up the butter and place it in the basket",
    "pick up the milk and place it in the basket",
    "pick up the orange juice and place it in the basket",
    "pick up the salad dressing and place it in the basket",
    "pick up the bbq sauce and place it in the basket",
    "pick up the cream cheese and place it in the basket",
    "'Close the top drawer.'",
    "turn off the stove",
    "put the white mug on the left plate",
    "put the yellow and white mug in the microwave",
    "pick up the book and place it in the back compartment of the caddy",
]
VARIANTS = {
    # name: (flow steps, step output, keystone)
    "original": (10, "velocity", None),
    # The step-decreased variant (2 steps) runs the original release's contexts: only the
    # flow loop differs (the importer's --flow-steps), so it has no release of its own, but
    # its own upstream goldens.
    "sd": (2, "velocity", None),
    "drift-keystone": (1, "next_trajectory",
                       {"k": 5, "selector": "guarded_medoid", "distance": "l2", "executed_steps": None,
                        "spread_threshold": 0.3}),
}
REWRITE_BOUND = 1e-4  # max abs of a wrapper against the unmodified upstream forward (fp32)
HELD_OUT = 3  # upstream end-to-end observations per variant besides the per-context one


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# The tiny upstream model
# ----------------------------------------------------------------------------------------------


def tiny_config(cfg_mod, tok) -> object:
    ids = tok.convert_tokens_to_ids
    vit = cfg_mod.MolmoAct2VitConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, image_default_input_size=(CROP, CROP),
        image_patch_size=PATCH, image_num_pos=(CROP // PATCH) ** 2, attn_implementation="sdpa")
    adapter = cfg_mod.MolmoAct2AdapterConfig(
        vit_layers=(-1, -2), hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
        intermediate_size=64, text_hidden_size=64, attn_implementation="sdpa")
    text = cfg_mod.MolmoAct2TextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=416,
        additional_vocab_size=len(tok) - 416, num_hidden_layers=LLM_LAYERS, intermediate_size=128,
        max_position_embeddings=256, use_qk_norm=True, qk_norm_type="qwen3", attn_implementation="sdpa")
    expert = cfg_mod.MolmoAct2ActionExpertConfig(
        max_action_horizon=HORIZON, max_action_dim=MAX_ACTION_DIM, hidden_size=64, num_layers=LLM_LAYERS,
        num_heads=4, timestep_embed_dim=32, ffn_multiple_of=32)
    return cfg_mod.MolmoAct2Config(
        vit_config=vit, adapter_config=adapter, text_config=text, action_expert_config=expert,
        image_start_token_id=ids("<im_start>"), low_res_image_start_token_id=ids("<low_res_im_start>"),
        image_end_token_id=ids("<im_end>"), image_low_res_id=ids("<im_low>"), image_patch_id=ids("<im_patch>"),
        image_col_id=ids("<im_col>"), frame_start_token_id=ids("<frame_start>"),
        frame_end_token_id=ids("<frame_end>"), max_action_dim=MAX_ACTION_DIM, max_action_horizon=HORIZON,
        n_obs_steps=1, action_mode="both", flow_matching_num_steps=10,
        action_output_token_id=ids("<action_output>"), action_start_token_id=ids("<action_start>"),
        action_end_token_id=ids("<action_end>"), state_start_token_id=ids("<state_start>"),
        state_end_token_id=ids("<state_end>"), state_token_start_id=ids("<state_0>"), num_state_tokens=256,
        eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"), bos_token_id=None,
        attn_implementation="sdpa")


def randomize(model: nn.Module, seed: int) -> None:
    """Seeded random weights for every parameter (post_init zero-inits the action expert's
    modulation and final layers, which would make the velocity 0). Norm weights around 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or ".norm." in name or name.endswith("_norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("positional_embedding"):
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            elif p.ndim >= 2:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(fan_in))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            # bf16-representable, so the checkpoint is stored in bf16 (as the released ones are)
            # without changing the weights upstream ran with.
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def stats(rng, dims: int, passthrough_last: bool) -> dict:
    q01 = rng.uniform(-1.0, -0.2, dims)
    q99 = q01 + rng.uniform(0.4, 1.6, dims)
    lo, hi = q01 - rng.uniform(0.0, 0.2, dims), q99 + rng.uniform(0.0, 0.2, dims)
    mean = (q01 + q99) / 2
    std = (q99 - q01) / 4
    mask = [True] * dims
    if passthrough_last:
        mask[-1] = False
    return {"q01": q01.tolist(), "q99": q99.tolist(), "min": lo.tolist(), "max": hi.tolist(),
            "mean": mean.tolist(), "std": std.tolist(), "mask": mask}


def norm_stats() -> dict:
    rng = np.random.default_rng(2303)
    return {
        "norm_mode": "q01_q99",
        "metadata_by_tag": {
            TAG: {
                "action_stats": stats(rng, ACTION_DIMS, passthrough_last=True),
                "state_stats": stats(rng, STATE_DIMS, passthrough_last=False),
                "setup_type": SETUP_TYPE,
                "control_mode": CONTROL_MODE,
                "action_horizon": HORIZON,
                "camera_keys": ["image", "wrist_image"],
            }
        },
    }


def observation(rng, stats_state: dict) -> tuple[np.ndarray, np.ndarray]:
    frames = rng.integers(0, 256, (CAMERAS, FRAME_H, FRAME_W, 3), dtype=np.uint8)
    lo, hi = np.array(stats_state["q01"]), np.array(stats_state["q99"])
    state = (lo + (hi - lo) * rng.uniform(-0.1, 1.1, STATE_DIMS)).astype(np.float32)
    return frames, state


# ----------------------------------------------------------------------------------------------
# Capturing upstream's own run
# ----------------------------------------------------------------------------------------------


class Capture:
    """Records what upstream computes at the contract's boundaries during predict_action."""

    def __init__(self, model):
        self.model = model
        self.data: dict = {}
        self.step_calls: list = []
        self.trajectory = None
        self._handles = []

    def __enter__(self):
        m = self.model.model
        self._handles.append(m.vision_backbone.register_forward_hook(self._vision, with_kwargs=True))
        for i, block in enumerate(m.transformer.blocks):
            self._handles.append(block.register_forward_hook(self._block(i), with_kwargs=True))
        self._orig_extract = m._extract_kv_states
        self._orig_prepare = m.action_expert.prepare_context
        self._orig_step = m.action_expert.forward_with_context
        self._orig_generate = m.generate_actions_from_inputs
        m._extract_kv_states = self._extract
        m.action_expert.prepare_context = self._prepare
        m.action_expert.forward_with_context = self._step
        m.generate_actions_from_inputs = self._generate
        return self

    def __exit__(self, *exc):
        m = self.model.model
        for h in self._handles:
            h.remove()
        m._extract_kv_states = self._orig_extract
        m.action_expert.prepare_context = self._orig_prepare
        m.action_expert.forward_with_context = self._orig_step
        m.generate_actions_from_inputs = self._orig_generate

    def _vision(self, module, args, kwargs, out):
        images = args[0] if args else kwargs["images"]
        idx = args[1] if len(args) > 1 else kwargs["pooled_patches_idx"]
        self.data["vision_images"] = images.detach().clone()
        self.data["vision_pooling"] = idx.detach().clone()
        self.data["image_embeds"] = out.detach().clone()

    def _block(self, i):
        def hook(module, args, kwargs, out):
            hidden = args[0] if args else kwargs["hidden_states"]
            self.data[f"block{i}_in"] = hidden.detach().clone()
            self.data[f"block{i}_out"] = out[0].detach().clone()
            self.data["attention_bias"] = kwargs["attention_mask"].detach().clone()
            self.data["position_embeddings"] = tuple(t.detach().clone() for t in kwargs["position_embeddings"])
        return hook

    def _extract(self, past):
        kv = self._orig_extract(past)
        self.data["kv"] = [(k.detach().clone(), v.detach().clone()) for k, v in kv]
        return kv

    def _prepare(self, **kwargs):
        ctx = self._orig_prepare(**kwargs)
        self.data["encoder_attention_mask"] = kwargs["encoder_attention_mask"].detach().clone()
        self.data["kv_contexts"] = [(k.detach().clone(), v.detach().clone()) for k, v in ctx.kv_contexts]
        self.data["rope_cache"] = ctx.rope_cache
        return ctx

    def _step(self, actions, timesteps, **kwargs):
        out = self._orig_step(actions, timesteps, **kwargs)
        self.step_calls.append((actions.detach().clone(), timesteps.detach().clone(), out.detach().clone()))
        return out

    def _generate(self, **kwargs):
        self.data["action_dim_is_pad"] = kwargs.get("action_dim_is_pad")
        traj = self._orig_generate(**kwargs)
        self.trajectory = traj.detach().clone()
        return traj


@contextlib.contextmanager
def noise_is(noise: np.ndarray):
    """Patches the one noise source of upstream's flow (torch.randn in
    generate_actions_from_inputs) to return exactly vlad's noise; nothing else is patched."""
    original = torch.randn
    calls = []

    def randn(*size, **kwargs):
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        if tuple(shape) != noise.shape:
            raise RuntimeError(f"upstream asked for noise {tuple(shape)}, vlad's is {noise.shape}")
        calls.append(shape)
        return torch.from_numpy(noise.copy()).to(kwargs.get("dtype") or torch.float32)

    torch.randn = randn
    try:
        yield calls
    finally:
        torch.randn = original
    if len(calls) != 1:
        raise RuntimeError(f"expected one noise draw in predict_action, saw {len(calls)}")


def predict(model, processor, frames, state, task, steps, noise):
    with noise_is(noise), Capture(model) as cap:
        out = model.predict_action(
            processor=processor, images=[f for f in frames], task=task, state=state, norm_tag=TAG,
            inference_action_mode="continuous", num_steps=steps, enable_cuda_graph=False)
    return out.actions.detach().cpu().numpy()[0].astype(np.float32), cap


# ----------------------------------------------------------------------------------------------
# Export wrappers (each calls upstream submodules)
# ----------------------------------------------------------------------------------------------


class DecomposedLayerNorm(nn.Module):
    """nn.LayerNorm as mean, variance and rsqrt (same parameters). HTP's fused LayerNorm op
    loses precision in fp16 here (cosine 0.99928 on one ViT norm vs 0.9999998 decomposed, on
    the emulator), so the export spells it out; checked against upstream's forward."""

    def __init__(self, ln: nn.LayerNorm):
        super().__init__()
        self.weight, self.bias, self.eps = ln.weight, ln.bias, ln.eps

    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        var = (centred * centred).mean(-1, keepdim=True)
        return centred * torch.rsqrt(var + self.eps) * self.weight + self.bias


def decompose_layer_norms(module: nn.Module) -> nn.Module:
    """A copy of `module` with every nn.LayerNorm replaced by DecomposedLayerNorm."""
    module = copy.deepcopy(module)
    for name, child in list(module.named_modules()):
        for attr, sub in list(child.named_children()):
            if isinstance(sub, nn.LayerNorm):
                setattr(child, attr, DecomposedLayerNorm(sub))
    return module


class Vision(nn.Module):
    """pixel_values [1, cams, patches, 588] -> image_embeds [tokens, D]: upstream's
    `encode_image`, `image_pooling_2d`, `image_projector`. Rewrites of
    `MolmoAct2VisionBackbone.forward`: the pooling gather on the traced (fixed) index as one
    index_select, the valid-token filter dropped (every token is valid at this fixed shape), and
    the float-input re-rounding to the uint8 grid left to the host (vlad's pixel_values are on
    that grid already), and the ViT's LayerNorms decomposed (DecomposedLayerNorm)."""

    def __init__(self, backbone, pooling: torch.Tensor):
        super().__init__()
        self.vb = decompose_layer_norms(backbone)
        if bool((pooling < 0).any()):
            raise RuntimeError("vision: the traced pooling index has padding; the fixed-shape export needs none")
        self.register_buffer("index", pooling.reshape(-1).clone())
        self.pool_shape = tuple(pooling.shape)  # [1, tokens, pool]

    def forward(self, pixel_values):
        feats = self.vb.encode_image(pixel_values)
        dim = feats.shape[-1]
        flat = feats.reshape(-1, dim)
        to_pool = flat.index_select(0, self.index).reshape(-1, self.pool_shape[-1], dim)
        query = to_pool.mean(-2, keepdim=True)
        pooled = self.vb.image_pooling_2d(query, to_pool, attn_mask=None)
        pooled = pooled.reshape(1, -1, pooled.shape[-1])
        return self.vb.image_projector(pooled).reshape(-1, self.vb.adapter_config.text_hidden_size)


class LlmSplit(nn.Module):
    """hidden_states, attention_bias -> hidden_out, keys, values [layers, 1, S, kv]: upstream's
    decoder blocks with `collect_layer_kv_states`; RoPE cos/sin at arange(S) are constants
    (upstream's rotary module has `.item()` and cache branches), taken from the upstream run."""

    def __init__(self, model, blocks, cos, sin, reverse=False):
        super().__init__()
        self.m = model
        self.blocks = nn.ModuleList(blocks[::-1] if reverse else blocks)
        self.register_buffer("cos", cos.clone())
        self.register_buffer("sin", sin.clone())

    def forward(self, hidden_states, attention_bias):
        h, ks, vs = hidden_states, [], []
        for block in self.blocks:
            h, k, v = block(h, position_embeddings=(self.cos, self.sin), attention_mask=attention_bias,
                            collect_layer_kv_states=True)
            ks.append(self.m._cache_to_sequence(k))
            vs.append(self.m._cache_to_sequence(v))
        return h, torch.stack(ks), torch.stack(vs)


class ActionContext(nn.Module):
    """keys, values [L, 1, S, kv] -> k_ctx, v_ctx [L, 1, S, hidden]: `_prepare_kv_context`."""

    def __init__(self, expert):
        super().__init__()
        self.ae = expert

    def forward(self, keys, values):
        kv = [(keys[i], values[i]) for i in range(keys.shape[0])]
        ctx = self.ae._prepare_kv_context(kv)
        k = torch.stack([c[0].reshape(c[0].shape[0], c[0].shape[1], -1) for c in ctx])
        v = torch.stack([c[1].reshape(c[1].shape[0], c[1].shape[1], -1) for c in ctx])
        return k, v


class ActionStep(nn.Module):
    """One flow step: `forward_with_context` with upstream's cross-attention mask
    (`_build_cross_attention_mask`) and time modulation in the graph, the RoPE cache of the
    horizon as a constant, then the velocity mask of `_run_action_flow_loop` as a multiply.
    `next_trajectory` bakes upstream's `x + dt * v`, masked again, for a fixed dt."""

    def __init__(self, hf, mdl, rope_cache, step_output: str, dt: float):
        super().__init__()
        self.hf = hf
        self.mdl = mdl
        self.register_buffer("rope_cos", rope_cache[0].clone())
        self.register_buffer("rope_sin", rope_cache[1].clone())
        self.step_output = step_output
        self.dt = dt

    def forward(self, trajectory, timestep, k_ctx, v_ctx, encoder_attention_mask, action_dim_is_pad):
        ae = self.hf.model.action_expert
        heads = ae.config.num_heads
        kv = [(k_ctx[i].reshape(k_ctx.shape[1], k_ctx.shape[2], heads, -1),
               v_ctx[i].reshape(v_ctx.shape[1], v_ctx.shape[2], heads, -1)) for i in range(k_ctx.shape[0])]
        cross = ae._build_cross_attention_mask(encoder_attention_mask, trajectory.shape[0], trajectory.dtype)
        context = self.mdl.ActionExpertContext(kv_contexts=kv, cross_mask=cross, self_mask=None,
                                               valid_action=None, rope_cache=(self.rope_cos, self.rope_sin))
        keep = (1.0 - action_dim_is_pad)[:, None, :]
        velocity = ae.forward_with_context(trajectory, timestep, context=context) * keep
        if self.step_output == "velocity":
            return velocity
        return (trajectory + self.dt * velocity) * keep


# ----------------------------------------------------------------------------------------------


def keystone_clear(cands: np.ndarray, tau: float) -> bool:
    """No KeyStone decision near a tie: the medoid's row sum 2% below the next, the spread
    0.05 away from the threshold (HTP's fp16 candidates must pick what upstream's fp32 picks)."""
    k = len(cands)
    pts = cands.reshape(k, -1).astype(np.float64)
    dist = np.linalg.norm(pts[:, None] - pts[None], axis=2)
    sums = np.sort(dist.sum(axis=1))
    medoid = int(np.argmin(dist.sum(axis=1)))
    pair = np.sort(dist[np.triu_indices(k, 1)])
    spread = np.linalg.norm(pts.mean(0) - pts[medoid]) / (pair[(len(pair) - 1) // 2] + 1e-8)
    return (sums[1] - sums[0]) / sums[0] >= 0.02 and abs(spread - tau) >= 0.05


def np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


def max_abs(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


def export(module: nn.Module, args: tuple, names_in, names_out, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(module, args, str(path), input_names=list(names_in), output_names=list(names_out),
                      opset_version=17, dynamo=False, do_constant_folding=True)


def select_instructions(processor, tok, mdl, state) -> tuple[list[str], int]:
    """Three candidates that render to one length (with this state), in list order."""
    lengths = []
    for text in CANDIDATE_INSTRUCTIONS:
        rendered = render(mdl, text, state)
        ids = processor(text=rendered, images=[np.zeros((FRAME_H, FRAME_W, 3), np.uint8)] * CAMERAS,
                        return_tensors="pt")["input_ids"]
        lengths.append(int(ids.shape[1]))
    target = max(sorted(set(lengths)), key=lengths.count)  # the most common length
    chosen = [t for t, n in zip(CANDIDATE_INSTRUCTIONS, lengths) if n == target]
    if len(chosen) < 3:
        raise SystemExit(f"fewer than 3 instructions render to one length: {lengths}")
    return chosen[:3], target


def render(mdl, task: str, normalized_state_string: str) -> str:
    return mdl._build_robot_text(
        task=mdl._normalize_question_text(task), style="robot_action",
        discrete_state_string=normalized_state_string, setup_type=SETUP_TYPE, control_mode=CONTROL_MODE,
        add_setup_tokens=True, add_control_tokens=True, num_images=CAMERAS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keystone-src", type=Path, required=True, help="checkout of github dywsjtu/keystone")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "upstream-molmoact2")
    ap.add_argument("--mistake", choices=["none", "split-order", "rope-offset"],
                    default="none", help="export a deliberate mistake (for the end-to-end check's own test)")
    args = ap.parse_args()

    proc_mod, img_mod, vid_mod, mdl = um.load_hf_package()
    cfg_mod = importlib.import_module(f"{um.HF_PKG}.configuration_molmoact2")
    selection, _ = um.load_keystone(args.keystone_src)
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer.from_pretrained(str(ROOT / "golden" / "upstream" / "tokenizer"))
    processor = um.make_processor(proc_mod, img_mod, vid_mod, tok, CROP, col_tokens=False)

    out = args.out
    if out.exists():
        shutil.rmtree(out)
    ckpt = out / "checkpoint"
    ckpt.mkdir(parents=True)

    config = tiny_config(cfg_mod, tok)
    torch.manual_seed(WEIGHT_SEED)
    model = mdl.MolmoAct2ForConditionalGeneration(config).eval()
    randomize(model, WEIGHT_SEED)
    # A bf16 copy is saved; the f32 model runs (its RoPE buffers stay f32).
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(str(ckpt), safe_serialization=True)
    processor.save_pretrained(str(ckpt))
    for code in ckpt.glob("*.py"):  # upstream's remote code, copied by save_pretrained: not ours to ship
        code.unlink()
    stats_payload = norm_stats()
    (ckpt / "norm_stats.json").write_text(json.dumps(stats_payload, indent=2) + "\n")
    model.config._name_or_path = str(ckpt)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"tiny upstream MolmoAct2: {n_params} parameters, checkpoint {ckpt}")

    meta = stats_payload["metadata_by_tag"][TAG]
    robot = mdl._RobotStats(stats_payload)
    rng = np.random.default_rng(OBS_SEED)
    observations = [observation(rng, meta["state_stats"]) for _ in range(1 + HELD_OUT)]
    state0 = np.asarray(robot.normalize_state(observations[0][1], TAG), np.float32)
    instructions, seq_len = select_instructions(
        processor, tok, mdl, mdl._build_discrete_state_string(state0, 256))
    log(f"instructions {instructions} render to {seq_len} tokens")

    report = {"parameters": n_params, "seq_len": seq_len, "instructions": instructions, "rewrites": {},
              "mistake": args.mistake}
    keystone_mod = selection

    for variant, (steps, step_output, keystone) in VARIANTS.items():
        release = out / f"release-{variant}"
        if variant != "sd":
            (release / "golden").mkdir(parents=True)
        k = keystone["k"] if keystone else 1
        width = MAX_ACTION_DIM
        shape = (1, HORIZON, width)
        obs_records = []
        for o, (frames, state) in enumerate(observations):
            instr = o % len(instructions)
            seed = 1000 + 17 * o + (100 if keystone else 0)
            while True:
                cands, caps, actions_k = [], [], []
                for c in range(k):
                    noise = gaussian_noise((seed + c) & U64, shape)
                    noise[..., ACTION_DIMS:] = 0.0
                    acts, cap = predict(model, processor, frames, state, instructions[instr], steps, noise)
                    actions_k.append(acts)
                    cands.append(np32(cap.trajectory)[0, :, :ACTION_DIMS])
                    caps.append(cap)
                if not keystone or keystone_clear(np.stack(cands), keystone["spread_threshold"]):
                    break
                seed += 1  # a near-tie would let fp16 pick another candidate: not a test of the glue
            record = {"frames": frames, "state": state, "instruction_id": np.array([instr], np.int32),
                      "seed": np.array([seed], np.uint64)}
            if keystone:
                stack = torch.from_numpy(np.stack(cands)[:, None])  # [K, 1, T, D]
                chosen_traj = keystone_mod._cluster_medoid_guarded_aggregation(
                    stack, "l2", ACTION_DIMS, 2, keystone["spread_threshold"])
                chosen_traj = chosen_traj.reshape(HORIZON, ACTION_DIMS).numpy()
                matches = [i for i in range(k) if np.array_equal(np.stack(cands)[i], chosen_traj)]
                if len(matches) != 1:
                    raise SystemExit(f"keystone: the selection is not exactly one candidate ({matches})")
                choice = matches[0]
                record["candidates"] = np.stack(cands).astype(np.float32)
                record["keystone_choice"] = np.array([choice], np.int32)
                record["actions"] = actions_k[choice]
            else:
                record["actions"] = actions_k[0]
            obs_records.append((record, caps[0]))

        # Per-context goldens and the export from observation 0's upstream run.
        rec0, cap = obs_records[0]
        d = cap.data
        S = d["block0_in"].shape[1]
        if S != seq_len:
            raise SystemExit(f"llm: traced sequence length {S} != rendered {seq_len}")
        hf = model
        m = hf.model
        pixel = d["vision_images"].to(torch.float32)
        vision = Vision(m.vision_backbone, d["vision_pooling"]).eval()
        cos, sin = d["position_embeddings"]
        bias = d["attention_bias"].to(torch.float32)
        graphs = {}
        with torch.no_grad():
            emb = vision(pixel)
            report["rewrites"].setdefault("vision", max_abs(emb, d["image_embeds"]))
            graphs["vision"] = (vision, (pixel,), ["pixel_values"], ["image_embeds"],
                                {"pixel_values": pixel}, {"image_embeds": d["image_embeds"]})
            per = LLM_LAYERS // SPLITS
            kv = d["kv"]
            for i in range(SPLITS):
                blocks = list(m.transformer.blocks[i * per:(i + 1) * per])
                rc, rs = cos, sin
                if args.mistake == "rope-offset":  # every position one too far
                    shifted = torch.arange(1, S + 1)[None]
                    rc, rs = m.transformer.rotary_emb(d[f"block{i * per}_in"], shifted)
                wrapper = LlmSplit(m, blocks, rc, rs, reverse=(args.mistake == "split-order")).eval()
                h_in = d[f"block{i * per}_in"]
                h_out, keys, values = wrapper(h_in, bias)
                want_k = torch.stack([kv[j][0] for j in range(i * per, (i + 1) * per)])  # [1, S, kv] each
                want_v = torch.stack([kv[j][1] for j in range(i * per, (i + 1) * per)])
                want_h = d[f"block{(i + 1) * per - 1}_out"]
                report["rewrites"][f"llm_split{i}"] = max(max_abs(h_out, want_h), max_abs(keys, want_k),
                                                          max_abs(values, want_v))
                graphs[f"llm_split{i}"] = (wrapper, (h_in, bias), ["hidden_states", "attention_bias"],
                                           ["hidden_out", "keys", "values"],
                                           {"hidden_states": h_in, "attention_bias": bias},
                                           {"hidden_out": want_h, "keys": want_k, "values": want_v})
            keys_all = torch.stack([k_ for k_, _ in kv])
            values_all = torch.stack([v_ for _, v_ in kv])
            actx = ActionContext(m.action_expert).eval()
            k_ctx, v_ctx = actx(keys_all, values_all)
            want_kc = torch.stack([a.reshape(a.shape[0], a.shape[1], -1) for a, _ in d["kv_contexts"]])
            want_vc = torch.stack([b.reshape(b.shape[0], b.shape[1], -1) for _, b in d["kv_contexts"]])
            report["rewrites"]["action_context"] = max(max_abs(k_ctx, want_kc), max_abs(v_ctx, want_vc))
            graphs["action_context"] = (actx, (keys_all, values_all), ["keys", "values"], ["k_ctx", "v_ctx"],
                                        {"keys": keys_all, "values": values_all},
                                        {"k_ctx": want_kc, "v_ctx": want_vc})
            step = ActionStep(hf, mdl, d["rope_cache"], step_output, 1.0 / steps).eval()
            enc = d["encoder_attention_mask"].to(torch.float32)
            pad = d["action_dim_is_pad"].to(torch.float32)
            # upstream's loop passes the cached modulation (its `timesteps` argument is then the
            # conditioning); the graph takes t = i / n and computes the modulation itself.
            x_in, _, v_out = cap.step_calls[steps // 2]
            t_in = torch.full((1,), (steps // 2) / steps, dtype=torch.float32)
            got = step(x_in, t_in, want_kc, want_vc, enc, pad)
            keep = (1.0 - pad)[:, None, :]
            want = v_out * keep if step_output == "velocity" else (x_in + (1.0 / steps) * (v_out * keep)) * keep
            report["rewrites"][f"action_step[{variant}]"] = max_abs(got, want)
            graphs["action_step"] = (step, (x_in, t_in, want_kc, want_vc, enc, pad),
                                     ["trajectory", "timestep", "k_ctx", "v_ctx", "encoder_attention_mask",
                                      "action_dim_is_pad"], ["next_trajectory"],
                                     {"trajectory": x_in, "timestep": t_in, "k_ctx": want_kc, "v_ctx": want_vc,
                                      "encoder_attention_mask": enc, "action_dim_is_pad": pad},
                                     {"next_trajectory": want})

        if variant == "sd":
            graphs = {}
        contract = contract_shapes(S, seq_len)
        trace = {"upstream": "lerobot 0.6.1 molmoact2_hf_model (tiny random weights)", "seq_len": S,
                 "components": {}}
        for comp, (module, ex, names_in, names_out, feeds, outs) in graphs.items():
            io = {**{k_: np32(v) for k_, v in feeds.items()}, **{k_: np32(v) for k_, v in outs.items()}}
            check_io(comp, io, contract[comp])
            export(module, ex, names_in, names_out, release / "onnx" / comp / f"{comp}.onnx")
            save_npz(release / "golden" / f"{comp}_io.npz", io)
            trace["components"][comp] = {
                "inputs": {n: list(io[n].shape) for n in names_in},
                "outputs": {n: list(io[n].shape) for n in names_out},
            }
            log(f"  {variant}/{comp}: rewrite max abs {report['rewrites'].get(comp, report['rewrites'].get(f'{comp}[{variant}]'))}")
        if graphs:
            (release / "golden" / "trace.json").write_text(json.dumps(trace, indent=2) + "\n")

        # The bundle end-to-end inputs of observation 0 (what vlad's parity checks stage by stage).
        e2e = dict(rec0)
        e2e.update({
            "pixel_values": np32(pixel),
            "hidden_states": np32(d["block0_in"]),
            "attention_bias": np32(bias),
            "k_ctx": np32(want_kc), "v_ctx": np32(want_vc),
            "noise": np32(cap.step_calls[0][0]) if steps > 0 else None,
        })
        upstream_dir = out / "upstream"
        upstream_dir.mkdir(exist_ok=True)
        arrays = {}
        for o, (rec, _) in enumerate(obs_records):
            for key_, val in rec.items():
                arrays[f"obs{o}_{key_}"] = val
        arrays["observations"] = np.array([len(obs_records)], np.int32)
        save_npz(upstream_dir / f"{variant}.npz", arrays)
        save_npz(upstream_dir / f"{variant}_end_to_end.npz", {k_: v for k_, v in e2e.items() if v is not None})
        report.setdefault("variants", {})[variant] = {"flow_steps": steps, "step_output": step_output,
                                                      "keystone": keystone}
    worst = max(report["rewrites"].values())
    if worst > REWRITE_BOUND and args.mistake == "none":
        bad = {k: v for k, v in report["rewrites"].items() if v > REWRITE_BOUND}
        raise SystemExit(f"export differs from the upstream forward beyond {REWRITE_BOUND}: {bad}")
    report["rewrite_bound"] = REWRITE_BOUND
    report["instructions"] = instructions
    report["tag"] = TAG
    report["frame_size"] = [FRAME_H, FRAME_W]
    (out / "export_report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"wrote {out}")


def contract_shapes(S: int, seq_len: int) -> dict:
    tokens = CAMERAS * ((CROP // PATCH) // 2) ** 2
    per = LLM_LAYERS // SPLITS
    c = {
        "vision": {"pixel_values": (1, CAMERAS, (CROP // PATCH) ** 2, PATCH * PATCH * 3), "image_embeds": (tokens, 64)},
        "action_context": {"keys": (LLM_LAYERS, 1, S, 32), "values": (LLM_LAYERS, 1, S, 32),
                           "k_ctx": (LLM_LAYERS, 1, S, 64), "v_ctx": (LLM_LAYERS, 1, S, 64)},
        "action_step": {"trajectory": (1, HORIZON, MAX_ACTION_DIM), "timestep": (1,),
                        "k_ctx": (LLM_LAYERS, 1, S, 64), "v_ctx": (LLM_LAYERS, 1, S, 64),
                        "encoder_attention_mask": (1, S), "action_dim_is_pad": (1, MAX_ACTION_DIM),
                        "next_trajectory": (1, HORIZON, MAX_ACTION_DIM)},
    }
    for i in range(SPLITS):
        c[f"llm_split{i}"] = {"hidden_states": (1, S, 64), "attention_bias": (1, 1, S, S),
                              "hidden_out": (1, S, 64), "keys": (per, 1, S, 32), "values": (per, 1, S, 32)}
    return c


if __name__ == "__main__":
    main()
