#!/usr/bin/env python3
"""Builds a tiny Fast-WAM from the real upstream model code, exports its world-model chain at the
bundle contract's boundaries and captures upstream's own LIBERO inference as goldens (phase 1 of
2: the torch side; phase 2 is tools/goldens/vla_goldens/make_upstream_fastwam_golden.py).

Upstream = github yuantianyuan01/FastWAM at the commit of the checkout passed with
--fastwam-src (recorded; never copied here). No model code is re-implemented: the model is
`FastWAM(WanVideoDiT, ActionDiT, MoT, WanVideoVAE38 / VideoVAE38_, WanTextEncoder,
HuggingfaceTokenizer)` in the `libero_uncond_2cam224` configuration (first_frame_causal,
seperated_timestep, fuse_vae_embedding_in_latents, proprio 8, action 7, horizon 32, both experts
with equal heads / head dim / layers) with tiny widths and seeded random weights, run in f32.

Writes under --out (default build/upstream-fastwam-tiny):
  checkpoint/   the upstream layout: libero_tiny.pt (`mot`, `proprio_encoder`, as
                `FastWAM.save_checkpoint` writes it), libero_tiny_dataset_stats.json
                (`save_dataset_stats_to_json`), the Wan-side files the loader reads:
                models_t5_umt5-xxl-enc-bf16.pth (WanTextEncoder state dict, bf16),
                google/umt5-xxl/ (the tokenizer directory), Wan2.2_VAE_encoder.pth (the tiny
                VAE's state dict without its unused decoder),
                model_config.json (the tiny sizes)
  release/      onnx/<c>/<c>.onnx, golden/<c>_io.npz (upstream fp32 at the boundaries, from
                observation 0), golden/trace.json (instructions, text rows)
  tables.npz    text_rows (upstream `encode_prompt` per instruction), proprio_weight/bias
  text_encoder.{json,npz}  upstream's tokenizer call and encode_prompt at 128 tokens on
                instructions with HTML entities, odd whitespace, unicode and > 128 tokens
  upstream.npz  `_predict_action_chunk` -> `FastWAM.infer_action` on every observation
                (obs{o}_frames, _state, _instruction_id, _seed, _actions, the gripper before
                `np.sign`, the stages)
  export_report.json  each rewrite's max abs against the unmodified upstream forward
  mistake-<m>/  with --mistake: the same export with one deliberate error (onnx/ only)

What the wrappers rewrite, each checked in torch against the unmodified module on observation 0
(bound EXPORT_BOUND, the script fails above it):
  - `rope_apply` (complex f64 `view_as_complex`/`polar`) as real cos/sin in f32 (video 3-D and
    action 1-D RoPE; the tables are upstream's own `freqs` at the traced positions);
  - `sinusoidal_embedding_1d` in f32 instead of f64 (the action step's timestep; the video
    t_mod at t = 0 and the RoPE tables are constants and are taken from upstream's own pre_dit);
  - boolean masks as additive f32 (the video self-attention mask and the action rows of the
    MoT mask are all-true constants at one latent frame; `context_mask` stays an input);
  - the Wan2.2 VAE encoder at one frame in 4-D: every causal Conv3d (zero cache at T = 1) as a
    Conv2d with the last temporal kernel slice, patchify and `AvgDown3D` as fixed stride-2
    Conv2d, `RMS_norm` as x / max(||x||, 1e-12) over channels, the attention block in 4-D.

    TORCH_VENV=build/upstream-venv scripts/setup_upstream_fastwam.sh
    build/fastwam-venv/bin/python -m vla_goldens.export_upstream_fastwam --fastwam-src DIR
    .venv/bin/python -m vla_goldens.make_upstream_fastwam_golden      # phase 2, project venv

Deterministic: fixed seeds, one torch thread, stored npz (tools/vla_host/vla_host/det_npz.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
from vla_goldens import upstream_fastwam as uf  # noqa: E402  (stubs + the eval config, already used for goldens)
from vla_host.det_npz import save_npz
from vla_goldens.pillow_goldens import frame
from vla_host.reference import gaussian_noise  # noqa: E402  (vlad's noise, numpy only)

torch.set_num_threads(1)

EXPORT_BOUND = 1e-4
MISTAKES = ("rope-frame1", "no-proprio-row")
# Tiny sizes of the real architecture (upstream: camera 224, E 4096, M 128, W 3072, 30 layers).
CAM = 64  # each camera after the centre-crop resize
FRAME_H, FRAME_W = 72, 80  # raw camera frames (non-square: the resize and the crop both act)
E = 32  # text_dim (context width)
M = 24  # tokenizer_max_len (text rows)
HEADS, HEAD_DIM = 2, 24  # 3-D RoPE split 8/8/8 of the head dim, as upstream's dim - 2*(dim//3)
VIDEO_W = HEADS * HEAD_DIM  # hidden_dim of the video expert (= heads * head_dim, as upstream)
ACTION_W = 32
LAYERS = 4
PREFILL_LAYERS = (2, 2)
VAE_DIM = 8
HORIZON, ACTION_DIM, STATE_DIM = 32, 7, 8
FLOW_STEPS, SHIFT = 10, 5.0  # train.yaml eval_num_inference_steps, sim_libero sigma_shift null -> 5
INSTRUCTIONS = ["put the black bowl on the plate", "open the top drawer of the cabinet"]
OBSERVATIONS = 4  # 0 makes the per-context goldens; 1.. are held out
SEED = 20260601


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# The tiny model from upstream's classes
# ---------------------------------------------------------------------------------------


def build_tokenizer(out: Path):
    """A tiny UMT5-style tokenizer (SentencePiece unigram, `▁` word boundaries, `</s>` appended,
    pad 0 / eos 1 / unk 2 as UMT5) saved as a Hugging Face directory, which upstream's
    `HuggingfaceTokenizer` loads with `AutoTokenizer.from_pretrained` exactly as it loads
    `google/umt5-xxl/`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for t in INSTRUCTIONS for w in DEFAULT_PROMPT.format(task=t).split()}
                   | {"the", "a", "on", "in", "of", "to", "and", "pick", "place", "up", "it"})
    chars = [chr(c) for c in range(33, 127)] + ["é", "ü", "ß", "中", "文", "—"]
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -3.0)]
    vocab += [("▁" + w, -5.0) for w in words]
    vocab += [(c, -10.0) for c in chars] + [("▁" + c, -9.0) for c in chars]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=512)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return len(vocab)


DEFAULT_PROMPT = None  # read from upstream's robot_video_dataset.py by import_upstream


def seeded_weights(module: nn.Module, gen: torch.Generator):
    """Every parameter random: upstream zero-inits some (the VAE attention's proj) and its
    norms start at one; random values make every path count."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            elif "gamma" in name or name.endswith("norm3.weight") or name.endswith("norm.weight") \
                    or "norm_q" in name or "norm_k" in name or "layer_norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def build_model(src: Path, ckpt: Path):
    from fastwam.models.wan22.action_dit import ActionDiT
    from fastwam.models.wan22.fastwam import FastWAM
    from fastwam.models.wan22.mot import MoT
    from fastwam.models.wan22.wan_video_dit import WanVideoDiT
    from fastwam.models.wan22.wan_video_text_encoder import HuggingfaceTokenizer, WanTextEncoder
    from fastwam.models.wan22.wan_video_vae import VideoVAE38_, WanVideoVAE38

    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    video_cfg = dict(has_image_input=False, patch_size=(1, 2, 2), in_dim=48, hidden_dim=VIDEO_W,
                     ffn_dim=2 * VIDEO_W, freq_dim=32, text_dim=E, out_dim=48, num_heads=HEADS,
                     attn_head_dim=HEAD_DIM, num_layers=LAYERS, eps=1e-6, seperated_timestep=True,
                     require_clip_embedding=False, require_vae_embedding=False,
                     fuse_vae_embedding_in_latents=True, video_attention_mask_mode="first_frame_causal",
                     action_conditioned=False, action_dim=ACTION_DIM, action_group_causal_mask_mode="group_diagonal")
    action_cfg = dict(action_dim=ACTION_DIM, hidden_dim=ACTION_W, ffn_dim=2 * ACTION_W, num_heads=HEADS,
                      attn_head_dim=HEAD_DIM, num_layers=LAYERS, text_dim=E, freq_dim=32, eps=1e-6)
    text_cfg = dict(dim=E, dim_attn=E, dim_ffn=2 * E, num_heads=2, num_layers=2, num_buckets=32, shared_pos=False)
    video = WanVideoDiT(**video_cfg)
    action = ActionDiT(**action_cfg)
    mot = MoT(mixtures={"video": video, "action": action}, mot_checkpoint_mixed_attn=False)
    # WanVideoVAE38 hard-codes the decoder width (256); the tiny model swaps in VideoVAE38_ with
    # the same class and a small decoder, keeping the wrapper's 48 mean/std.
    vae = WanVideoVAE38(z_dim=48, dim=VAE_DIM)
    vae.model = VideoVAE38_(dim=VAE_DIM, z_dim=48, dec_dim=VAE_DIM).eval().requires_grad_(False)
    tok_dir = ckpt / "google" / "umt5-xxl"
    vocab = build_tokenizer(tok_dir)
    text_encoder = WanTextEncoder(vocab=vocab, **text_cfg).eval()
    tokenizer = HuggingfaceTokenizer(name=str(tok_dir), seq_len=M, clean="whitespace")
    for part in (video, action, vae.model.encoder, vae.model.conv1, text_encoder):
        seeded_weights(part, gen)
    # Wan ships the text encoder in bf16: the tiny one is rounded the same way (and run in f32).
    with torch.no_grad():
        for p in text_encoder.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model = FastWAM(video_expert=video, action_expert=action, mot=mot, vae=vae, text_encoder=text_encoder,
                    tokenizer=tokenizer, text_dim=E, proprio_dim=STATE_DIM, device="cpu",
                    torch_dtype=torch.float32)
    with torch.no_grad():
        w = torch.randn(model.proprio_encoder.weight.shape, generator=gen)
        model.proprio_encoder.weight.copy_(w)  # the proprio row on the scale of the text rows
        model.proprio_encoder.bias.copy_(0.1 * torch.randn(model.proprio_encoder.bias.shape, generator=gen))
    model.eval()
    sizes = {"video_dit_config": video_cfg, "action_dit_config": action_cfg, "text_encoder": {"vocab": vocab, **text_cfg},
             "vae": {"dim": VAE_DIM, "z_dim": 48, "dec_dim": VAE_DIM}, "tokenizer_max_len": M, "proprio_dim": STATE_DIM}
    return model, sizes


# ---------------------------------------------------------------------------------------
# Rewrites (each checked against the unmodified module)
# ---------------------------------------------------------------------------------------


class RealFreqs:
    """RoPE table as real cos/sin [S, 1, D/2] f32 (upstream: complex128 from torch.polar)."""

    def __init__(self, freqs: torch.Tensor):
        self.cos = freqs.real.to(torch.float32).contiguous()
        self.sin = freqs.imag.to(torch.float32).contiguous()


def rope_apply_real(x, freqs, num_heads):
    """upstream `rope_apply` on real pairs: (a + ib)(c + is) in f32."""
    if not isinstance(freqs, RealFreqs):
        return _ORIG["rope_apply"](x, freqs, num_heads)
    b, s, _ = x.shape
    x = x.reshape(b, s, num_heads, -1, 2)
    a, bb = x[..., 0], x[..., 1]
    c, sn = freqs.cos.unsqueeze(0), freqs.sin.unsqueeze(0)  # [1, S, 1, D/2]
    out = torch.stack([a * c - bb * sn, a * sn + bb * c], dim=-1)
    return out.reshape(b, s, -1)


def sinusoidal_embedding_1d_f32(dim, position):
    """upstream `sinusoidal_embedding_1d` in f32 (upstream computes it in f64)."""
    half = dim // 2
    inv = torch.pow(torch.tensor(10000.0), -torch.arange(half, dtype=torch.float32) / half)
    sinusoid = position.to(torch.float32).unsqueeze(1) * inv.unsqueeze(0)
    return torch.cat([torch.cos(sinusoid), torch.sin(sinusoid)], dim=1).to(position.dtype)


_ORIG = {}


@contextlib.contextmanager
def export_rewrites():
    """RoPE as real cos/sin and the f32 sinusoid, where upstream's modules look them up."""
    import fastwam.models.wan22.action_dit as ad
    import fastwam.models.wan22.mot as mt
    import fastwam.models.wan22.wan_video_dit as wd

    _ORIG.setdefault("rope_apply", wd.rope_apply)
    saved = (mt.rope_apply, wd.rope_apply, ad.sinusoidal_embedding_1d)
    mt.rope_apply = wd.rope_apply = rope_apply_real
    ad.sinusoidal_embedding_1d = sinusoidal_embedding_1d_f32
    try:
        yield
    finally:
        mt.rope_apply, wd.rope_apply, ad.sinusoidal_embedding_1d = saved


def additive(mask_bool: torch.Tensor) -> torch.Tensor:
    """A boolean attention mask as an additive f32 one (0 allowed, -30000 blocked: finite in fp16)."""
    return torch.where(mask_bool, torch.tensor(0.0), torch.tensor(-30000.0)).to(torch.float32)


# -- the VAE encoder at T = 1 in 4-D ------------------------------------------------------


def causal_conv_t1(conv, x):
    """CausalConv3d with no cache on one frame: the front time padding is zeros, so only the
    kernel's last temporal slice sees data."""
    assert conv.stride[0] == 1 or conv.kernel_size[0] == 1
    return F.conv2d(x, conv.weight[:, :, -1], conv.bias, stride=conv.stride[1:],
                    padding=(conv._padding[2], conv._padding[0]))


def rms_norm_4d(norm, x):
    """RMS_norm (F.normalize over channels * sqrt(C) * gamma + bias) on [B, C, H, W]."""
    n = torch.sqrt((x * x).sum(dim=1, keepdim=True)).clamp_min(1e-12)
    gamma = norm.gamma.reshape(1, -1, 1, 1)
    bias = norm.bias.reshape(1, -1, 1, 1) if isinstance(norm.bias, torch.Tensor) else norm.bias
    return x / n * norm.scale * gamma + bias


def patchify_weight(channels=3, p=2):
    """upstream `patchify` ('b c (h q) (w r) -> b (c r q) h w') as a one-hot stride-2 conv."""
    w = torch.zeros(channels * p * p, channels, p, p)
    for c in range(channels):
        for r in range(p):
            for q in range(p):
                w[c * p * p + r * p + q, c, q, r] = 1.0
    return w


def avgdown_weight(mod):
    """AvgDown3D at T = 1 (one zero frame in front when factor_t is 2) as a conv: output channel
    o averages the group of `group_size` (c, t, h-sub, w-sub) entries; the padded frame's are 0."""
    ft, fs, g = mod.factor_t, mod.factor_s, mod.group_size
    w = torch.zeros(mod.out_channels, mod.in_channels, fs, fs)
    for c in range(mod.in_channels):
        for t in range(ft):
            for hs in range(fs):
                for ws in range(fs):
                    j = ((c * ft + t) * fs + hs) * fs + ws
                    if t == ft - 1:  # the real frame is the last (padding goes in front)
                        w[j // g, c, hs, ws] += 1.0 / g
    return w


def residual_4d(block, x):
    from fastwam.models.wan22.wan_video_vae import CausalConv3d, RMS_norm

    h = causal_conv_t1(block.shortcut, x) if isinstance(block.shortcut, CausalConv3d) else x
    for layer in block.residual:
        if isinstance(layer, CausalConv3d):
            x = causal_conv_t1(layer, x)
        elif isinstance(layer, RMS_norm):
            x = rms_norm_4d(layer, x)
        else:
            x = layer(x)  # SiLU, Dropout (eval)
    return x + h


def attention_4d(block, x):
    identity = x
    b, c, h, w = x.shape
    x = rms_norm_4d(block.norm, x)
    q, k, v = block.to_qkv(x).reshape(b, 1, c * 3, -1).permute(0, 1, 3, 2).contiguous().chunk(3, dim=-1)
    x = F.scaled_dot_product_attention(q, k, v)
    x = x.squeeze(1).permute(0, 2, 1).reshape(b, c, h, w)
    return block.proj(x) + identity


class VaeEncode4d(nn.Module):
    """wm_vae_enc: image [1,3,h,C*w] -> latents [1,48,h/16,C*w/16], upstream's
    `WanVideoVAE38.encode` at one frame (mean only, then (mu - mean) / std)."""

    def __init__(self, vae):
        super().__init__()
        from fastwam.models.wan22.wan_video_vae import AttentionBlock, Resample, ResidualBlock

        self.vae = vae
        self.ResidualBlock, self.AttentionBlock, self.Resample = ResidualBlock, AttentionBlock, Resample
        self.register_buffer("patch_w", patchify_weight())
        enc = vae.model.encoder
        self.avg_w = nn.ParameterList([nn.Parameter(avgdown_weight(d.avg_shortcut), requires_grad=False)
                                       for d in enc.downsamples])
        z = vae.model.z_dim
        self.register_buffer("mean", vae.mean.reshape(1, z, 1, 1).clone())
        self.register_buffer("inv_std", (1.0 / vae.std).reshape(1, z, 1, 1).clone())

    def forward(self, image):
        from fastwam.models.wan22.wan_video_vae import RMS_norm

        enc = self.vae.model.encoder
        x = F.conv2d(image, self.patch_w, stride=2)
        x = causal_conv_t1(enc.conv1, x)
        for i, down in enumerate(enc.downsamples):
            x_copy = x
            for m in down.downsamples:
                if isinstance(m, self.ResidualBlock):
                    x = residual_4d(m, x)
                else:  # Resample38 down2d/down3d: the 2-D conv; the time conv needs a cache
                    x = m.resample(x)
            fs = down.avg_shortcut.factor_s
            x = x + F.conv2d(x_copy, self.avg_w[i], stride=fs)
        for m in enc.middle:
            x = residual_4d(m, x) if isinstance(m, self.ResidualBlock) else attention_4d(m, x)
        for m in enc.head:
            if isinstance(m, RMS_norm):
                x = rms_norm_4d(m, x)
            elif hasattr(m, "_padding"):  # CausalConv3d
                x = causal_conv_t1(m, x)
            else:
                x = m(x)
        out = causal_conv_t1(self.vae.model.conv1, x)
        mu = out[:, : self.vae.model.z_dim]
        return (mu - self.mean) * self.inv_std


# -- wm_embed, the prefill splits, action_step -------------------------------------------


class Embed(nn.Module):
    """wm_embed: upstream `pre_dit`'s input-dependent part (patch embedding + token layout,
    text embedding); its constants (t_mod at t = 0, RoPE, masks) go into the splits."""

    def __init__(self, video):
        super().__init__()
        self.video = video

    def forward(self, latents, context):
        # patch_embedding is a Conv3d with kernel (1, 2, 2) over one frame: the same conv in 2-D,
        # tokens in upstream's (f h w) order.
        pe = self.video.patch_embedding
        x = F.conv2d(latents, pe.weight[:, :, 0], pe.bias, stride=pe.stride[1:])
        tokens = x.flatten(2).transpose(1, 2)
        return tokens, self.video.text_embedding(context)


class PrefillSplit(nn.Module):
    """wm_prefill_split: upstream `MoT.prefill_video_cache`'s per-layer body over layers
    [first, first + n), with the t_mod, RoPE and masks of the traced resolution as constants."""

    def __init__(self, mot, first, n, t_mod, freqs: RealFreqs, self_mask, ctx_mask, last, drop_row=None):
        super().__init__()
        self.mot, self.first, self.n, self.last, self.drop_row = mot, first, n, last, drop_row
        self.register_buffer("t_mod", t_mod.clone())
        self.register_buffer("cos", freqs.cos)
        self.register_buffer("sin", freqs.sin)
        self.register_buffer("self_mask", self_mask.clone())
        self.register_buffer("ctx_mask", ctx_mask.clone())

    def forward(self, video_tokens, context_embedding):
        freqs = RealFreqs.__new__(RealFreqs)
        freqs.cos, freqs.sin = self.cos, self.sin
        ctx, ctx_mask = context_embedding, self.ctx_mask
        if self.drop_row is not None:  # deliberate mistake: the proprio row left out
            ctx, ctx_mask = ctx[:, : self.drop_row], ctx_mask[..., : self.drop_row]
        expert = self.mot.mixtures["video"]
        x, keys, values = video_tokens, [], []
        for layer in range(self.first, self.first + self.n):
            block = expert.blocks[layer]
            q, k, v, res, gate_msa, shift_mlp, scale_mlp, gate_mlp, ckpt = self.mot._build_expert_attention_io(
                expert=expert, block=block, x=x, freqs=freqs, t_mod=self.t_mod)
            mixed = self.mot._mixed_attention(q_cat=q, k_cat=k, v_cat=v, attention_mask=self.self_mask)
            x = self.mot._apply_post_with_optional_checkpoint(
                block=block, residual_x=res, gate_msa=gate_msa, shift_mlp=shift_mlp, scale_mlp=scale_mlp,
                gate_mlp=gate_mlp, use_gradient_checkpointing=ckpt, mixed_slice=mixed,
                context_payload={"context": ctx, "mask": ctx_mask})
            keys.append(k)
            values.append(v)
        keys, values = torch.stack(keys), torch.stack(values)
        return (keys, values) if self.last else (x, keys, values)


class ActionStep(nn.Module):
    """action_step: upstream `_predict_action_noise_with_cache` (ActionDiT.pre_dit's input part,
    `MoT.forward_action_with_video_cache`, `post_dit`); the joint mask's action rows and the
    action RoPE table are constants, `context_mask` an f32 input (all ones from the runtime)."""

    def __init__(self, model, video_seq_len, freqs: RealFreqs, joint_mask, drop_row=None):
        super().__init__()
        self.model, self.video_seq_len, self.drop_row = model, video_seq_len, drop_row
        self.register_buffer("cos", freqs.cos)
        self.register_buffer("sin", freqs.sin)
        self.register_buffer("joint_mask", joint_mask.clone())

    def forward(self, latents_action, timestep, video_keys, video_values, context, context_mask):
        from fastwam.models.wan22 import action_dit as ad

        expert = self.model.action_expert
        if self.drop_row is not None:  # deliberate mistake: the proprio row left out
            context, context_mask = context[:, : self.drop_row], context_mask[:, : self.drop_row]
        t = expert.time_embedding(ad.sinusoidal_embedding_1d(expert.freq_dim, timestep))
        t_mod = expert.time_projection(t).unflatten(1, (6, expert.hidden_dim))
        tokens = expert.action_encoder(latents_action)
        ctx = expert.text_embedding(context)
        seq = latents_action.shape[1]
        ctx_mask = additive(context_mask > 0.5).unsqueeze(1).expand(-1, seq, -1)
        freqs = RealFreqs.__new__(RealFreqs)
        freqs.cos, freqs.sin = self.cos, self.sin
        cache = [{"k": video_keys[i], "v": video_values[i]} for i in range(video_keys.shape[0])]
        x = self.model.mot.forward_action_with_video_cache(
            action_tokens=tokens, action_freqs=freqs, action_t_mod=t_mod,
            action_context_payload={"context": ctx, "mask": ctx_mask}, video_kv_cache=cache,
            attention_mask=self.joint_mask, video_seq_len=self.video_seq_len)
        return expert.post_dit(x, {"t": t})


# ---------------------------------------------------------------------------------------
# Upstream runs: LIBERO's `_predict_action_chunk` with vlad's noise, captured at the boundaries
# ---------------------------------------------------------------------------------------


class Capture:
    """Records what upstream's own methods take and return during one `infer_action`, without
    changing them; and replaces only the initial action noise by vlad's noise for the seed."""

    def __init__(self, model, noise: np.ndarray):
        self.model, self.noise, self.calls = model, torch.from_numpy(noise), {}
        self.layer_out = []

    def _wrap(self, obj, name):
        orig = getattr(obj, name)

        def rec(*a, **k):
            out = orig(*a, **k)
            self.calls.setdefault(name, []).append((a, k, out))
            return out

        setattr(obj, name, rec)
        return lambda: delattr(obj, name) if name in obj.__dict__ else None

    @contextlib.contextmanager
    def active(self):
        m = self.model
        undo = [self._wrap(m, n) for n in ("_encode_input_image_latents_tensor", "_append_proprio_to_context",
                                           "_predict_action_noise_with_cache")]
        undo += [self._wrap(m.video_expert, "pre_dit"), self._wrap(m.mot, "prefill_video_cache")]
        hooks = []
        for i, block in enumerate(m.video_expert.blocks):
            hooks.append(block.gate.register_forward_hook(lambda mod, a, out, i=i: self.layer_out.append((i, out))))
        real_randn = torch.randn
        expected = (1, HORIZON, ACTION_DIM)

        def randn(*shape, **kw):
            size = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
            if tuple(size) == expected and kw.get("generator") is not None:
                return self.noise.clone().to(kw.get("dtype") or torch.float32)
            return real_randn(*shape, **kw)

        torch.randn = randn
        try:
            yield self
        finally:
            torch.randn = real_randn
            for h in hooks:
                h.remove()
            for u in undo:
                u()


def make_observation(rng):
    return {
        "agentview_image": frame(rng, FRAME_H, FRAME_W),
        "robot0_eye_in_hand_image": frame(rng, FRAME_H, FRAME_W),
        "robot0_eef_pos": rng.uniform(-0.3, 0.3, 3) + np.array([0.0, 0.0, 1.0]),
        "robot0_eef_quat": (lambda q: q / np.linalg.norm(q))(rng.normal(size=4)),
        "robot0_gripper_qpos": rng.uniform(-0.04, 0.04, 2),
    }


def eval_cfg(src, stats_mode="min/max"):
    cfg = uf.make_cfg(src, stats_mode, True)  # data/libero_2cam.yaml + sim_libero.yaml EVALUATION
    for cam in cfg.data.train.shape_meta.images:
        cam.shape = [3, CAM, CAM]
    cfg.data.train.video_size = [CAM, 2 * CAM]
    cfg.seed = 42  # upstream's eval seed; the noise it draws is replaced by vlad's
    return cfg


def run_upstream(ev, model, processor, cfg, obs, task, seed):
    """The eval's chunk (binarized gripper) and, from a second identical run without
    binarization, the gripper value before `np.sign`: how far each binarized entry is from
    its threshold."""
    noise = gaussian_noise(seed, (1, HORIZON, ACTION_DIM))
    cap = Capture(model, noise)
    with cap.active(), torch.no_grad():
        action, imgs, _ = ev._predict_action_chunk(
            obs=dict(obs), task_description=task, model=model, processor=processor, cfg=cfg,
            action_horizon=HORIZON, input_w=2 * CAM, input_h=CAM, model_device="cpu")
    cfg.EVALUATION.binarize_gripper = False
    try:
        with Capture(model, noise).active(), torch.no_grad():
            raw, _, _ = ev._predict_action_chunk(
                obs=dict(obs), task_description=task, model=model, processor=processor, cfg=cfg,
                action_horizon=HORIZON, input_w=2 * CAM, input_h=CAM, model_device="cpu")
    finally:
        cfg.EVALUATION.binarize_gripper = True
    raw = np.asarray(raw, np.float32)
    assert np.array_equal(raw[:, :-1], np.asarray(action)[:, :-1])
    return np.asarray(action, np.float32), raw[:, -1].copy(), noise, cap


def stages_of(cap):
    """The boundary tensors of one upstream run (per-context goldens and end-to-end stages)."""
    c = cap.calls
    (a, k, latents5), = c["_encode_input_image_latents_tensor"]
    image = k["input_image"]
    (_, _, (context, context_mask)), = c["_append_proprio_to_context"]
    (_, _, pre), = c["pre_dit"]
    (_, _, cache), = c["prefill_video_cache"]
    # GateModule runs twice per layer (attention, MLP); the second is the layer's output.
    prefill = [out for i, out in cap.layer_out[: 2 * LAYERS]][1::2]
    steps = c["_predict_action_noise_with_cache"]
    return {"image": image, "latents": latents5[:, :, 0], "context": context, "context_mask": context_mask,
            "tokens": pre["tokens"], "context_embedding": pre["context"], "t_mod": pre["t_mod"],
            "freqs": pre["freqs"], "cache": cache, "layer_out": prefill, "steps": steps}


def n(t):
    return t.detach().cpu().numpy().astype(np.float32) if isinstance(t, torch.Tensor) else np.asarray(t, np.float32)


def context_goldens(st):
    out = {"wm_vae_enc": {"image": n(st["image"]), "latents": n(st["latents"])},
           "wm_embed": {"latents": n(st["latents"]), "context": n(st["context"]),
                        "video_tokens": n(st["tokens"]), "context_embedding": n(st["context_embedding"])}}
    first, tokens = 0, st["tokens"]
    for i, layers in enumerate(PREFILL_LAYERS):
        g = {"video_tokens": n(tokens), "context_embedding": n(st["context_embedding"])}
        last = i + 1 == len(PREFILL_LAYERS)
        if not last:
            tokens = st["layer_out"][first + layers - 1]
            g["video_tokens_out"] = n(tokens)
        g["keys"] = n(torch.stack([st["cache"][j]["k"] for j in range(first, first + layers)]))
        g["values"] = n(torch.stack([st["cache"][j]["v"] for j in range(first, first + layers)]))
        out[f"wm_prefill_split{i}"] = g
        first += layers
    a, k, pred = st["steps"][FLOW_STEPS // 2]
    out["action_step"] = {"latents_action": n(k["latents_action"]), "timestep": n(k["timestep_action"]),
                          "video_keys": n(torch.stack([st["cache"][i]["k"] for i in range(LAYERS)])),
                          "video_values": n(torch.stack([st["cache"][i]["v"] for i in range(LAYERS)])),
                          "context": n(k["context"]), "context_mask": n(k["context_mask"].float()),
                          "pred_noise": n(pred)}
    return out


# ---------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------


def wrappers(model, st, mistake="none"):
    """The five kinds of graph, with the constants of the traced resolution from upstream's own
    pre_dit at observation 0."""
    vs = st["tokens"].shape[1]
    freqs = st["freqs"]
    if mistake == "rope-frame1":  # deliberate mistake: every video token at frame index 1
        f0 = model.video_expert.freqs[0]
        fdim = f0.shape[1]
        freqs = freqs.clone()
        freqs[:, :, :fdim] = f0[1]
    t_mod = st["t_mod"]  # [1, T, 6, W]: per-token modulation at t = 0 (a constant)
    vmask = model.video_expert.build_video_to_video_mask(vs, vs, torch.device("cpu"))
    joint = model._build_mot_attention_mask(vs, HORIZON, vs, torch.device("cpu"))
    ctx_rows = st["context"].shape[1]
    ctx_mask = additive(st["context_mask"].bool()).unsqueeze(1).expand(-1, vs, -1).unsqueeze(1)  # [1,1,T,L]
    drop = ctx_rows - 1 if mistake == "no-proprio-row" else None
    mods = {"wm_vae_enc": VaeEncode4d(model.vae), "wm_embed": Embed(model.video_expert)}
    first = 0
    for i, layers in enumerate(PREFILL_LAYERS):
        mods[f"wm_prefill_split{i}"] = PrefillSplit(model.mot, first, layers, t_mod, RealFreqs(freqs), additive(vmask),
                                                    ctx_mask, i + 1 == len(PREFILL_LAYERS), drop)
        first += layers
    afreqs = model.action_expert.freqs[:HORIZON].view(HORIZON, 1, -1)
    mods["action_step"] = ActionStep(model, vs, RealFreqs(afreqs), additive(joint), drop)
    return mods


IO = {
    "wm_vae_enc": (["image"], ["latents"]),
    "wm_embed": (["latents", "context"], ["video_tokens", "context_embedding"]),
    "action_step": (["latents_action", "timestep", "video_keys", "video_values", "context", "context_mask"],
                    ["pred_noise"]),
}


def io_names(c):
    if c in IO:
        return IO[c]
    last = c == f"wm_prefill_split{len(PREFILL_LAYERS) - 1}"
    return ["video_tokens", "context_embedding"], (["keys", "values"] if last else ["video_tokens_out", "keys", "values"])


def check_rewrites(mods, goldens):
    """Each wrapper (rewrites active) on the golden inputs vs upstream's unmodified outputs."""
    report = {}
    with export_rewrites(), torch.no_grad():
        for c, mod in mods.items():
            ins, outs = io_names(c)
            g = goldens[c]
            res = mod(*[torch.from_numpy(g[x]) for x in ins])
            res = res if isinstance(res, tuple) else (res,)
            diffs = {o: float(np.abs(n(r) - g[o]).max()) for o, r in zip(outs, res)}
            report[c] = diffs
            log(f"  rewrite check {c}: " + ", ".join(f"{o} max abs {d:.2e}" for o, d in diffs.items()))
    return report


def export_onnx(mods, goldens, out: Path):
    with export_rewrites(), torch.no_grad():
        for c, mod in mods.items():
            ins, outs = io_names(c)
            d = out / "onnx" / c
            d.mkdir(parents=True, exist_ok=True)
            args = tuple(torch.from_numpy(goldens[c][x]) for x in ins)
            torch.onnx.export(mod, args, str(d / f"{c}.onnx"), input_names=ins, output_names=outs,
                              opset_version=17, dynamo=False, do_constant_folding=True)


# ---------------------------------------------------------------------------------------
# Checkpoint in the upstream layout
# ---------------------------------------------------------------------------------------


def write_checkpoint(model, sizes, stats, nz, ckpt: Path):
    from safetensors.torch import save_file

    model.save_checkpoint(str(ckpt / "libero_tiny.pt"))
    nz.save_dataset_stats_to_json(stats, str(ckpt / "libero_tiny_dataset_stats.json"))
    # Wan's text encoder weights in both forms upstream's loader takes: Wan's .pth and the
    # converted .safetensors it downloads instead by default (redirect_common_files); the
    # WanTextEncoder state-dict names, bf16.
    encoder = {k: v.to(torch.bfloat16).contiguous() for k, v in model.text_encoder.state_dict().items()}
    torch.save(encoder, ckpt / "models_t5_umt5-xxl-enc-bf16.pth")
    save_file(encoder, str(ckpt / "models_t5_umt5-xxl-enc-bf16.safetensors"))
    # The VAE (stock Wan2.2 weights upstream, not part of a Fast-WAM checkpoint): the tiny random
    # one's encoder side, what infer_action runs; its decoder is never used and not kept.
    torch.save({k: v for k, v in model.vae.model.state_dict().items() if not k.startswith("decoder.")},
               ckpt / "Wan2.2_VAE_encoder.pth")
    (ckpt / "model_config.json").write_text(json.dumps(sizes, indent=1, default=list) + "\n")


def check_checkpoint(model, ckpt: Path):
    """The checkpoint loads back through upstream's own `FastWAM.load_checkpoint` (and the
    encoder files through `load_state_dict`) into a model whose weights were wiped, exactly."""
    import copy

    from safetensors.torch import load_file

    fresh = copy.deepcopy(model)
    with torch.no_grad():
        for p in list(fresh.mot.parameters()) + list(fresh.proprio_encoder.parameters()) \
                + list(fresh.text_encoder.parameters()):
            p.zero_()
    fresh.load_checkpoint(str(ckpt / "libero_tiny.pt"))
    want = {**model.mot.state_dict(), **{f"proprio.{k}": v for k, v in model.proprio_encoder.state_dict().items()}}
    got = {**fresh.mot.state_dict(), **{f"proprio.{k}": v for k, v in fresh.proprio_encoder.state_dict().items()}}
    for name in ("models_t5_umt5-xxl-enc-bf16.pth", "models_t5_umt5-xxl-enc-bf16.safetensors"):
        path = ckpt / name
        sd = load_file(str(path)) if name.endswith(".safetensors") else torch.load(path)
        fresh.text_encoder.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
        want.update({f"{name}.{k}": v for k, v in model.text_encoder.state_dict().items()})
        got.update({f"{name}.{k}": v for k, v in fresh.text_encoder.state_dict().items()})
    bad = [k for k in want if not torch.equal(want[k], got[k])]
    if bad:
        raise SystemExit(f"checkpoint {ckpt}: {len(bad)} tensors do not load back, e.g. {bad[0]}")


def synthetic_stats(rng):
    """Dataset statistics in upstream's layout, wide enough that the normalized state stays
    inside the [-5, 5] clamp."""
    def one(lo, hi):
        lo, hi = np.asarray(lo, float), np.asarray(hi, float)
        mean, std = (lo + hi) / 2, (hi - lo) / 4
        return {"global_min": lo.tolist(), "global_max": hi.tolist(), "global_mean": mean.tolist(),
                "global_std": std.tolist(), "global_q01": (lo + 0.01 * (hi - lo)).tolist(),
                "global_q99": (hi - 0.01 * (hi - lo)).tolist()}
    s_lo = np.array([-0.4, -0.4, 0.6, -3.2, -3.2, -3.2, -0.05, -0.05]) + rng.uniform(-0.02, 0.0, 8)
    s_hi = np.array([0.4, 0.4, 1.4, 3.2, 3.2, 3.2, 0.05, 0.05]) + rng.uniform(0.0, 0.02, 8)
    a_lo = np.array([-0.9, -0.9, -0.9, -0.2, -0.2, -0.2, 0.0])
    a_hi = np.array([0.9, 0.9, 0.9, 0.2, 0.2, 0.2, 1.0])
    return {"state": {"default": one(s_lo, s_hi)}, "action": {"default": one(a_lo, a_hi)}}


# ---------------------------------------------------------------------------------------
# Text rows as upstream makes them (the host's goldens): Wan's tokenizer call and encode_prompt
# ---------------------------------------------------------------------------------------

# Instructions that exercise upstream's cleaning (ftfy, html.unescape twice, whitespace) and its
# truncation at 128 tokens (the EOS kept).
TEXT_CASES = [
    "put the black bowl on the plate",
    "put the bowl &amp; the plate in the basket",
    "pick &amp;lt;the&amp;gt; bowl &quot;now&quot;",
    "  \tpick up\n\n the\u00a0bowl   and\u2003place it\r\n",
    "caf\u00c3\u00a9 \u2014 stra\u00dfe \u00fcber \u4e2d\u6587 \u00e9t\u00e9",
    "the " * 150 + "plate",
]
TEXT_SEQ_LEN = 128  # fastwam.yaml tokenizer_max_len


def text_goldens(model, tok_dir: Path):
    """Upstream's own tokenizer call (HuggingfaceTokenizer, clean="whitespace", seq_len 128) and
    encode_prompt (WanTextEncoder, the rows past the text zeroed) on TEXT_CASES."""
    import fastwam.models.wan22.wan_video_text_encoder as wte
    from fastwam.models.wan22.wan_video_text_encoder import HuggingfaceTokenizer

    env = {"ftfy_fix_text": hasattr(wte.ftfy, "__version__"), "whitespace_re": wte.re.__name__}
    tok = HuggingfaceTokenizer(name=str(tok_dir), seq_len=TEXT_SEQ_LEN, clean="whitespace")
    saved, model.tokenizer = model.tokenizer, tok
    meta, arrays = [], {}
    try:
        for i, task in enumerate(TEXT_CASES):
            prompt = DEFAULT_PROMPT.format(task=task)
            ids, mask = tok(prompt, return_mask=True, add_special_tokens=True)
            emb, _ = model.encode_prompt(prompt)
            meta.append({"task": task, "prompt": prompt, "cleaned": tok._clean(prompt), "length": int(mask.sum())})
            arrays[f"ids{i}"] = ids[0].numpy().astype(np.int32)
            arrays[f"mask{i}"] = mask[0].numpy().astype(np.int32)
            arrays[f"rows{i}"] = n(emb[0])
    finally:
        model.tokenizer = saved
    return meta, arrays, env


# ---------------------------------------------------------------------------------------


def main():
    global DEFAULT_PROMPT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fastwam-src", type=Path, required=True, help="checkout of github yuantianyuan01/FastWAM")
    ap.add_argument("--commit", help="the checkout's commit, when DIR is not a git work tree (git archive)")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "upstream-fastwam-tiny")
    args = ap.parse_args()
    src = args.fastwam_src.resolve()
    commit = args.commit or subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=True,
                                           capture_output=True, text=True).stdout.strip()
    ev, lu, nz, stubbed = uf.import_upstream(src)
    DEFAULT_PROMPT = ev.DEFAULT_PROMPT
    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    ckpt, release = out / "checkpoint", out / "release"
    ckpt.mkdir(parents=True)
    (release / "golden").mkdir(parents=True)

    model, sizes = build_model(src, ckpt)
    rng = np.random.default_rng(SEED)
    stats = synthetic_stats(rng)
    write_checkpoint(model, sizes, stats, nz, ckpt)
    check_checkpoint(model, ckpt)
    cfg = eval_cfg(src)
    processor = uf.make_processor(ev, cfg, ckpt / "libero_tiny_dataset_stats.json")

    # Upstream on every observation (0 makes the per-context goldens).
    up, st0 = {"observations": np.array([OBSERVATIONS], np.int32)}, None
    for o in range(OBSERVATIONS):
        obs = make_observation(rng)
        instr, seed = o % len(INSTRUCTIONS), 1000 + 17 * o
        actions, gripper_raw, noise, cap = run_upstream(ev, model, processor, cfg, obs, INSTRUCTIONS[instr], seed)
        st = stages_of(cap)
        st0 = st0 or st
        frames = np.stack([obs["agentview_image"], obs["robot0_eye_in_hand_image"]])
        up.update({f"obs{o}_frames": frames, f"obs{o}_state": ev._extract_sim_state(dict(obs)),
                   f"obs{o}_instruction_id": np.array([instr], np.int32),
                   f"obs{o}_seed": np.array([seed], np.uint64), f"obs{o}_actions": actions,
                   f"obs{o}_gripper_unbinarized": gripper_raw,
                   f"obs{o}_noise": noise, f"obs{o}_image": n(st["image"]), f"obs{o}_latents": n(st["latents"]),
                   f"obs{o}_context": n(st["context"])})
        first = 0
        for i, layers in enumerate(PREFILL_LAYERS):
            up[f"obs{o}_keys_split{i}"] = n(torch.stack([st["cache"][j]["k"] for j in range(first, first + layers)]))
            up[f"obs{o}_values_split{i}"] = n(torch.stack([st["cache"][j]["v"] for j in range(first, first + layers)]))
            first += layers
        log(f"observation {o}: upstream actions {actions.shape}, largest |a| {np.abs(actions).max():.3f}")

    # The text rows the device tables hold: upstream's own encode_prompt per instruction.
    text_rows, lengths = [], []
    for task in INSTRUCTIONS:
        emb, _ = model.encode_prompt(DEFAULT_PROMPT.format(task=task))
        ids, mask = model.tokenizer(DEFAULT_PROMPT.format(task=task), return_mask=True, add_special_tokens=True)
        text_rows.append(n(emb[0]))
        lengths.append(int(mask.sum()))
    text_meta, text_arrays, text_env = text_goldens(model, ckpt / "google" / "umt5-xxl")
    save_npz(out / "text_encoder.npz", text_arrays)
    (out / "text_encoder.json").write_text(json.dumps({"seq_len": TEXT_SEQ_LEN, **text_env, "cases": text_meta},
                                                      indent=1, ensure_ascii=True) + "\n")
    goldens = context_goldens(st0)
    mods = wrappers(model, st0)
    report = {"upstream": "github.com/yuantianyuan01/FastWAM", "commit": commit, "bound": EXPORT_BOUND,
              "versions": {"torch": torch.__version__, "numpy": np.__version__},
              "stubbed_imports": stubbed, "rewrites": check_rewrites(mods, goldens)}
    worst = max(d for c in report["rewrites"].values() for d in c.values())
    if worst > EXPORT_BOUND:
        raise SystemExit(f"a rewritten module differs from upstream by {worst:.3g} (bound {EXPORT_BOUND})")
    export_onnx(mods, goldens, release)
    for c, g in goldens.items():
        save_npz(release / "golden" / f"{c}_io.npz", g)
    save_npz(out / "upstream.npz", up)
    # What a bundle's tables hold, read here so that phase 2 needs no torch: the text rows from
    # upstream's own encode_prompt, the proprio Linear from the checkpoint.
    save_npz(out / "tables.npz", {"text_rows": np.stack(text_rows), "text_lengths": np.array(lengths, np.int32),
                                  "proprio_weight": n(model.proprio_encoder.weight),
                                  "proprio_bias": n(model.proprio_encoder.bias)})
    trace = {"instructions": INSTRUCTIONS, "prompt": DEFAULT_PROMPT, "text_tokens": M, "prefill_layers": PREFILL_LAYERS,
             "camera": [CAM, CAM], "frame": [FRAME_H, FRAME_W], "flow_steps": FLOW_STEPS, "shift": SHIFT,
             "binarize_gripper": bool(cfg.EVALUATION.binarize_gripper), "rotate_180": True,
             "mixed_precision": "no (f32; the LIBERO eval's default is bf16)"}
    (release / "golden" / "trace.json").write_text(json.dumps(trace, indent=1) + "\n")
    for mistake in MISTAKES:
        mdir = out / f"mistake-{mistake}"
        export_onnx(wrappers(model, st0, mistake), goldens, mdir)
        log(f"  mistake {mistake}: exported to {mdir}")
    report.update({"sizes": sizes, "instructions": INSTRUCTIONS, "text_lengths": lengths,
                   "stats": stats, "observations": OBSERVATIONS})
    (out / "export_report.json").write_text(json.dumps(report, indent=1, default=list) + "\n")
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
