"""Tiny ONNX graphs with the MolmoAct2 / Fast-WAM context I/O contracts.

Each builder takes its dimensions and a seeded numpy Generator and returns an opset-20
ModelProto whose inputs and outputs carry the seed model cards' tensor names. Only ops seen
to compile for HTP v73 with onnxruntime-qnn 2.7.0 are used (MatMul incl. batched, Add, Mul,
Softmax, Sin, Exp, Gelu, Tanh, LayerNormalization, Reshape, Transpose, Concat, Split).

Why some shapes look odd:
- Tables added to activations (positions, layer scales) are pre-tiled to the activation's
  full shape: the HTP emulator drops a batch-broadcast addend feeding LayerNormalization.
- Self-attention multiplies the softmax by exp(bias). That is a no-op for every query row with
  at least one allowed key, and zeroes fully blocked rows (left padding). Without it the
  fp32 reference gives those rows a uniform average while HTP fp16 gives zeros, and the pad
  rows alone would break the per-tensor cosine gate.
- Weights are scaled so activations stay O(1): fp16 on HTP then keeps cosine >= 0.9999.
"""

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vla_host.build_prompt_tables import rope_positions

OPSET = 20
IR_VERSION = 10


class GraphBuilder:
    def __init__(self, name: str):
        self.name = name
        self.nodes = []
        self.inits = []
        self.inputs = []
        self.outputs = []
        self._count = 0

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def input(self, name, shape):
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def output(self, value, name, shape):
        self.nodes.append(helper.make_node("Identity", [value], [name], name=f"out_{name}"))
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))

    def const(self, array, hint="w"):
        name = self._fresh(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def shape(self, dims):
        return self.const(np.array(dims, dtype=np.int64), "shape")

    def op(self, op_type, inputs, n_out=1, hint=None, **attrs):
        outs = [self._fresh(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self._fresh("n_" + op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    # Composite helpers -------------------------------------------------------------
    def matmul(self, x, w):
        return self.op("MatMul", [x, w if isinstance(w, str) else self.const(w)])

    def add(self, a, b):
        return self.op("Add", [a, b if isinstance(b, str) else self.const(b)])

    def mul(self, a, b):
        return self.op("Mul", [a, b if isinstance(b, str) else self.const(b)])

    def reshape(self, x, dims):
        return self.op("Reshape", [x, self.shape(dims)])

    def transpose(self, x, perm):
        return self.op("Transpose", [x], perm=list(perm))

    def layer_norm(self, x, width, rng=None):
        scale = np.ones(width, np.float32)
        bias = np.zeros(width, np.float32)
        if rng is not None:
            scale = (1.0 + 0.1 * rng.standard_normal(width)).astype(np.float32)
            bias = (0.05 * rng.standard_normal(width)).astype(np.float32)
        return self.op("LayerNormalization", [x, self.const(scale, "ln_g"), self.const(bias, "ln_b")],
                       axis=-1, epsilon=1e-5)

    def split(self, x, sizes, axis=-1):
        return self.op("Split", [x, self.const(np.array(sizes, np.int64), "split")], n_out=len(sizes), axis=axis)

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="vla-golden", producer_version="1")
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model


def dense(rng, fan_in, fan_out, gain=1.0):
    return (gain * rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)


def projections(b: GraphBuilder, x, weights, fused: bool):
    """x @ W_i for each W_i; fused = one MatMul on concat(W_i) + Split (numerically identical)."""
    if not fused:
        return [b.matmul(x, w) for w in weights]
    return b.split(b.matmul(x, np.concatenate(weights, axis=1)), [w.shape[1] for w in weights])


# ---------------------------------------------------------------------------------------
# MolmoAct2
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MolmoDims:
    cameras: int = 2
    crop: int = 56
    patch: int = 14
    vision_width: int = 32
    vision_heads: int = 2
    tokens_per_camera: int = 4  # 2x2 pooling of the 4x4 patch grid, or the sampler's count
    sampler: bool = False  # grid-sampler-like pooling (LP-VTP) instead of 2x2 average pooling
    hidden: int = 64
    heads: int = 2
    kv_width: int = 32
    mlp: int = 128
    seq_len: int = 96
    # Rows of left padding the export's RoPE positions assume (bundle `rope_left_pad`).
    rope_left_pad: int = 3
    splits: int = 4
    layers_per_split: int = 2
    context_width: int = 32
    horizon: int = 10
    action_width: int = 32
    expert_width: int = 32
    expert_blocks: int = 2

    @property
    def grid(self):
        return self.crop // self.patch

    @property
    def patches(self):
        return self.grid * self.grid

    @property
    def patch_values(self):
        return self.patch * self.patch * 3

    @property
    def image_tokens(self):
        return self.cameras * self.tokens_per_camera

    @property
    def llm_layers(self):
        return self.splits * self.layers_per_split


SAMPLER_POINTS = [(-0.35, -0.2), (0.4, 0.3), (0.1, -0.6), (-0.5, 0.55)]


def grid_sample_matrix(points, g: int, coord_step: float = 0.0) -> np.ndarray:
    """[points, g*g] weights of bilinear sampling at normalized (x, y) points, as
    F.grid_sample(align_corners=False, padding_mode="zeros") reads a g x g grid: pixel
    coordinate ((n + 1) * g - 1) / 2, taps outside the grid weigh zero. `coord_step` > 0
    rounds each pixel coordinate to that step first (a coarser interpolation than torch's)."""
    pool = np.zeros((len(points), g * g), np.float32)
    for i, (nx, ny) in enumerate(points):
        fx = ((nx + 1) * g - 1) / 2
        fy = ((ny + 1) * g - 1) / 2
        if coord_step:
            fx, fy = round(fx / coord_step) * coord_step, round(fy / coord_step) * coord_step
        x0, y0 = int(np.floor(fx)), int(np.floor(fy))
        wx, wy = fx - x0, fy - y0
        for yy, wyy in ((y0, 1 - wy), (y0 + 1, wy)):
            for xx, wxx in ((x0, 1 - wx), (x0 + 1, wx)):
                if 0 <= yy < g and 0 <= xx < g:
                    pool[i, yy * g + xx] += wyy * wxx
    return pool


def pooling_matrix(dims: MolmoDims) -> np.ndarray:
    """[tokens_per_camera, patches] weights taking patch features to image tokens."""
    g = dims.grid
    if not dims.sampler:
        out = g // 2
        pool = np.zeros((out * out, g * g), np.float32)
        for oy in range(out):
            for ox in range(out):
                for dy in range(2):
                    for dx in range(2):
                        pool[oy * out + ox, (2 * oy + dy) * g + 2 * ox + dx] = 0.25
        assert pool.shape[0] == dims.tokens_per_camera
        return pool
    # Grid-sampler stand-in: bilinear sampling (align_corners=False) at fixed normalized
    # points, written as a weight matrix so it compiles as a MatMul.
    return grid_sample_matrix(SAMPLER_POINTS[: dims.tokens_per_camera], g)


def self_attention(b, x, rng, width, heads, tokens, batch, fused, bias=None):
    """Pre-LN self-attention on x [batch, tokens, width] with an optional additive bias."""
    hd = width // heads
    h = b.layer_norm(x, width, rng)
    wq, wk, wv = (dense(rng, width, width) for _ in range(3))
    q, k, v = projections(b, h, [wq, wk, wv], fused)
    q = b.transpose(b.reshape(q, [batch, tokens, heads, hd]), [0, 2, 1, 3])
    kt = b.transpose(b.reshape(k, [batch, tokens, heads, hd]), [0, 2, 3, 1])
    v = b.transpose(b.reshape(v, [batch, tokens, heads, hd]), [0, 2, 1, 3])
    scores = b.mul(b.matmul(q, kt), np.array(1.0 / np.sqrt(hd), np.float32))
    if bias is not None:
        scores = b.add(scores, bias)
    probs = b.op("Softmax", [scores], axis=-1)
    if bias is not None:
        probs = b.mul(probs, b.op("Exp", [bias]))
    attn = b.reshape(b.transpose(b.matmul(probs, v), [0, 2, 1, 3]), [batch, tokens, width])
    return b.add(x, b.matmul(attn, dense(rng, width, width, 0.7)))


def geglu_mlp(b, x, rng, width, inner, fused):
    h = b.layer_norm(x, width, rng)
    gate, up = projections(b, h, [dense(rng, width, inner), dense(rng, width, inner)], fused)
    m = b.mul(b.op("Gelu", [gate]), up)
    return b.add(x, b.matmul(m, dense(rng, inner, width, 0.7)))


def build_vision(dims: MolmoDims, rng, fused: bool = False, pool=None, rows_late: int = 0) -> onnx.ModelProto:
    """`pool`: another pooling matrix than `pooling_matrix(dims)` (the same weights otherwise);
    `rows_late`: the output's image rows shifted down by that many (the first repeated)."""
    b = GraphBuilder("vision")
    cams, n, pv, vw = dims.cameras, dims.patches, dims.patch_values, dims.vision_width
    px = b.input("pixel_values", [1, cams, n, pv])
    x = b.matmul(b.reshape(px, [cams, n, pv]), dense(rng, pv, vw, 2.0))
    pos = (0.5 * rng.standard_normal((n, vw))).astype(np.float32)
    x = b.add(x, np.broadcast_to(pos, (cams, n, vw)).copy())
    x = self_attention(b, x, rng, vw, dims.vision_heads, n, cams, fused)
    x = geglu_mlp(b, x, rng, vw, 2 * vw, fused)
    pool = pooling_matrix(dims) if pool is None else pool
    x = b.matmul(b.const(np.broadcast_to(pool, (cams,) + pool.shape).copy(), "pool"), x)
    x = b.layer_norm(x, vw, rng)
    gate, up = projections(b, x, [dense(rng, vw, dims.hidden), dense(rng, vw, dims.hidden)], fused)
    x = b.matmul(b.mul(b.op("Gelu", [gate]), up), dense(rng, dims.hidden, dims.hidden, 1.5))
    x = b.reshape(x, [dims.image_tokens, dims.hidden])
    if rows_late:
        n = dims.image_tokens
        shift = np.zeros((n, n), np.float32)
        for i in range(n):
            shift[i, max(i - rows_late, 0)] = 1.0
        x = b.matmul(b.const(shift, "late"), x)
    b.output(x, "image_embeds", [dims.image_tokens, dims.hidden])
    return b.model()


def rope_tables(positions, width, heads):
    """RoPE baked for `positions` (one per row), as the real split exports bake theirs."""
    hd = width // heads
    half = hd // 2
    inv = 1.0 / (100.0 ** (np.arange(half) / half))
    ang = np.asarray(positions)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=1)
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=1)
    cos = np.tile(cos, (1, heads))[None].astype(np.float32)
    sin = np.tile(sin, (1, heads))[None].astype(np.float32)
    rot = np.zeros((width, width), np.float32)  # x @ rot = rotate_half(x) per head
    for h in range(heads):
        o = h * hd
        for i in range(half):
            rot[o + half + i, o + i] = -1.0
            rot[o + i, o + half + i] = 1.0
    return cos, sin, rot


def build_llm_split(dims: MolmoDims, rng) -> onnx.ModelProto:
    b = GraphBuilder("llm_split")
    s, d, kvw, heads = dims.seq_len, dims.hidden, dims.kv_width, dims.heads
    hd = kvw // heads
    x = b.input("hidden_states", [1, s, d])
    bias = b.input("attention_bias", [1, 1, s, s])
    mask = b.op("Exp", [bias])
    cos, sin, rot = rope_tables(rope_positions(s, dims.rope_left_pad), kvw, heads)
    cos_c, sin_c, rot_c = b.const(cos, "cos"), b.const(sin, "sin"), b.const(rot, "rot")
    keys, values = [], []
    for _ in range(dims.layers_per_split):
        h = b.layer_norm(x, d, rng)
        q = b.matmul(h, dense(rng, d, kvw))
        k = b.matmul(h, dense(rng, d, kvw))
        v = b.matmul(h, dense(rng, d, kvw))
        q = b.add(b.mul(q, cos_c), b.mul(b.matmul(q, rot_c), sin_c))
        k = b.add(b.mul(k, cos_c), b.mul(b.matmul(k, rot_c), sin_c))
        keys.append(b.reshape(k, [1, 1, s, kvw]))
        values.append(b.reshape(v, [1, 1, s, kvw]))
        qh = b.transpose(b.reshape(q, [1, s, heads, hd]), [0, 2, 1, 3])
        kt = b.transpose(b.reshape(k, [1, s, heads, hd]), [0, 2, 3, 1])
        vh = b.transpose(b.reshape(v, [1, s, heads, hd]), [0, 2, 1, 3])
        scores = b.add(b.mul(b.matmul(qh, kt), np.array(1.0 / np.sqrt(hd), np.float32)), bias)
        probs = b.mul(b.op("Softmax", [scores], axis=-1), mask)
        attn = b.reshape(b.transpose(b.matmul(probs, vh), [0, 2, 1, 3]), [1, s, kvw])
        x = b.add(x, b.matmul(attn, dense(rng, kvw, d, 0.7)))
        h = b.layer_norm(x, d, rng)
        m = b.op("Gelu", [b.matmul(h, dense(rng, d, dims.mlp))])
        x = b.add(x, b.matmul(m, dense(rng, dims.mlp, d, 0.7)))
    n = dims.layers_per_split
    b.output(x, "hidden_out", [1, s, d])
    b.output(b.op("Concat", keys, axis=0), "keys", [n, 1, s, kvw])
    b.output(b.op("Concat", values, axis=0), "values", [n, 1, s, kvw])
    return b.model()


def build_action_context(dims: MolmoDims, rng) -> onnx.ModelProto:
    b = GraphBuilder("action_context")
    n, s, kvw, cw = dims.llm_layers, dims.seq_len, dims.kv_width, dims.context_width
    for src, dst in (("keys", "k_ctx"), ("values", "v_ctx")):
        x = b.input(src, [n, 1, s, kvw])
        h = b.layer_norm(x, kvw)
        gain = (1.0 + 0.1 * rng.standard_normal((n, 1, 1, kvw))).astype(np.float32)
        h = b.mul(h, np.broadcast_to(gain, (n, 1, s, kvw)).copy())
        w = np.stack([dense(rng, kvw, cw) for _ in range(n)])[:, None]
        b.output(b.matmul(h, w), dst, [n, 1, s, cw])
    return b.model()


def timestep_embedding(b, t, rng, width, scale, freq_max):
    """t [1] -> [1, 1, width] via sin(t*scale*f + phase) (phase pi/2 gives the cos half)."""
    half = width // 2
    freqs = np.exp(np.linspace(0.0, np.log(freq_max), half)).astype(np.float32) * scale
    freqs = np.concatenate([freqs, freqs]).astype(np.float32)
    phase = np.concatenate([np.zeros(half), np.full(half, np.pi / 2)]).astype(np.float32)
    e = b.op("Sin", [b.add(b.mul(t, freqs), phase)])
    e = b.reshape(e, [1, 1, width])
    e = b.op("Tanh", [b.matmul(e, dense(rng, width, width, 1.5))])
    return b.matmul(e, dense(rng, width, width))


def tile_rows(b, row, rows):
    """[1,1,W] -> [1,rows,W] as a MatMul with ones (no broadcast Add into LayerNorm)."""
    return b.matmul(b.const(np.ones((1, rows, 1), np.float32), "ones"), row)


def cross_attention_layers(b, x, rng, width, tokens, n_layers, ctx_width, k_ctx, v_ctx, key_bias, key_count):
    """x [1,T,width] attends to per-layer contexts [L,1,K,C], the layers acting as heads."""
    h = b.layer_norm(x, width, rng)
    q = b.matmul(h, dense(rng, width, n_layers * ctx_width))
    q = b.transpose(b.reshape(q, [1, tokens, n_layers, ctx_width]), [2, 0, 1, 3])
    scores = b.matmul(q, b.transpose(k_ctx, [0, 1, 3, 2]))
    scores = b.mul(scores, np.array(1.0 / np.sqrt(ctx_width), np.float32))
    if key_bias is not None:
        scores = b.add(scores, key_bias)
    probs = b.op("Softmax", [scores], axis=-1)
    attn = b.transpose(b.matmul(probs, v_ctx), [1, 2, 0, 3])
    attn = b.reshape(attn, [1, tokens, n_layers * ctx_width])
    return b.add(x, b.matmul(attn, dense(rng, n_layers * ctx_width, width, 0.7)))


def build_action_step(dims: MolmoDims, rng, step_output: str, fused: bool = False) -> onnx.ModelProto:
    assert step_output in ("velocity", "next_trajectory")
    b = GraphBuilder("action_step")
    hz, aw, ew = dims.horizon, dims.action_width, dims.expert_width
    n, s, cw = dims.llm_layers, dims.seq_len, dims.context_width
    traj = b.input("trajectory", [1, hz, aw])
    t = b.input("timestep", [1])
    k_ctx = b.input("k_ctx", [n, 1, s, cw])
    v_ctx = b.input("v_ctx", [n, 1, s, cw])
    enc_mask = b.input("encoder_attention_mask", [1, s])
    is_pad = b.input("action_dim_is_pad", [1, aw])
    keep = b.add(b.mul(is_pad, np.array(-1.0, np.float32)), np.array(1.0, np.float32))
    key_bias = b.reshape(b.add(b.mul(enc_mask, np.array(1e4, np.float32)), np.array(-1e4, np.float32)), [1, 1, 1, s])
    temb = timestep_embedding(b, t, rng, ew, 1.0, 40.0)
    x = b.matmul(traj, dense(rng, aw, ew, 1.5))
    x = b.add(x, tile_rows(b, temb, hz))
    x = b.add(x, (0.3 * rng.standard_normal((1, hz, ew))).astype(np.float32))
    for _ in range(dims.expert_blocks):
        x = cross_attention_layers(b, x, rng, ew, hz, n, cw, k_ctx, v_ctx, key_bias, s)
        x = geglu_mlp(b, x, rng, ew, 2 * ew, fused)
    v = b.matmul(b.layer_norm(x, ew, rng), dense(rng, ew, aw, 0.8))
    v = b.mul(v, b.reshape(keep, [1, 1, aw]))
    if step_output == "next_trajectory":
        v = b.add(traj, b.mul(v, np.array(1.0, np.float32)))  # dt = 1 baked (one-step Drift)
    b.output(v, "next_trajectory", [1, hz, aw])
    return b.model()


# ---------------------------------------------------------------------------------------
# Fast-WAM action expert
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FastWamDims:
    horizon: int = 32
    action_dims: int = 7
    video_layers: int = 2
    video_tokens: int = 16
    video_width: int = 32
    context_tokens: int = 8
    context_width: int = 24
    width: int = 32


def build_fastwam_step(dims: FastWamDims, rng) -> onnx.ModelProto:
    b = GraphBuilder("action_step")
    hz, a, w = dims.horizon, dims.action_dims, dims.width
    L, T, C, M, E = dims.video_layers, dims.video_tokens, dims.video_width, dims.context_tokens, dims.context_width
    lat = b.input("latents_action", [1, hz, a])
    t = b.input("timestep", [1])
    vk = b.input("video_keys", [L, 1, T, C])
    vv = b.input("video_values", [L, 1, T, C])
    ctx = b.input("context", [1, M, E])
    cmask = b.input("context_mask", [1, M])
    temb = timestep_embedding(b, t, rng, w, 1e-3, 20.0)
    x = b.matmul(lat, dense(rng, a, w, 1.5))
    x = b.add(x, tile_rows(b, temb, hz))
    x = b.add(x, (0.3 * rng.standard_normal((1, hz, w))).astype(np.float32))
    x = cross_attention_layers(b, x, rng, w, hz, L, C, vk, vv, None, T)
    # text / proprio context cross-attention with the context mask
    h = b.layer_norm(x, w, rng)
    q = b.matmul(h, dense(rng, w, w))
    kc = b.matmul(ctx, dense(rng, E, w))
    vc = b.matmul(ctx, dense(rng, E, w))
    scores = b.mul(b.matmul(q, b.transpose(kc, [0, 2, 1])), np.array(1.0 / np.sqrt(w), np.float32))
    cbias = b.reshape(b.add(b.mul(cmask, np.array(1e4, np.float32)), np.array(-1e4, np.float32)), [1, 1, M])
    probs = b.op("Softmax", [b.add(scores, cbias)], axis=-1)
    x = b.add(x, b.matmul(b.matmul(probs, vc), dense(rng, w, w, 0.7)))
    x = geglu_mlp(b, x, rng, w, 2 * w, False)
    out = b.matmul(b.layer_norm(x, w, rng), dense(rng, w, a, 0.8))
    b.output(out, "pred_noise", [1, hz, a])
    return b.model()


# ---------------------------------------------------------------------------------------
# Fast-WAM world-model chain (closed loop): wm_vae_enc -> wm_embed -> wm_prefill_split{i}
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FastWamChainDims:
    cameras: int = 2
    camera_h: int = 32  # per-camera crop; the image is [1, 3, camera_h, cameras * camera_w]
    camera_w: int = 32
    vae_width: int = 8
    latent_channels: int = 4  # the VAE downsamples by 4: latents [1, C, H/4, W/4]
    width: int = 32  # video DiT width
    heads: int = 2
    prefill_layers: tuple = (1, 2, 1)  # three splits of uneven size
    text_tokens: int = 8
    context_width: int = 24
    state_dims: int = 8
    horizon: int = 32
    action_dims: int = 7

    @property
    def image_w(self):
        return self.cameras * self.camera_w

    @property
    def latent_hw(self):
        return self.camera_h // 4, self.image_w // 4

    @property
    def grid(self):  # the (1, 2, 2) patch grid over the latents
        lh, lw = self.latent_hw
        return lh // 2, lw // 2

    @property
    def tokens(self):
        gh, gw = self.grid
        return gh * gw

    @property
    def layers(self):
        return sum(self.prefill_layers)

    @property
    def context_tokens(self):
        return self.text_tokens + 1  # + the proprio row

    def step_dims(self) -> FastWamDims:
        return FastWamDims(horizon=self.horizon, action_dims=self.action_dims, video_layers=self.layers,
                           video_tokens=self.tokens, video_width=self.width,
                           context_tokens=self.context_tokens, context_width=self.context_width, width=self.width)


def conv(b, x, rng, c_in, c_out, k, stride, pad, gain=1.0):
    w = (gain * rng.standard_normal((c_out, c_in, k, k)) / np.sqrt(c_in * k * k)).astype(np.float32)
    bias = (0.05 * rng.standard_normal(c_out)).astype(np.float32)
    return b.op("Conv", [x, b.const(w, "conv_w"), b.const(bias, "conv_b")], kernel_shape=[k, k],
                strides=[stride, stride], pads=[pad] * 4)


def silu(b, x):
    return b.mul(x, b.op("Sigmoid", [x]))


def build_wm_vae_enc(d: FastWamChainDims, rng) -> onnx.ModelProto:
    """A VAE-encoder stand-in in 4-D ops (Wan2.2's T=1 path is Conv2d-only): strided conv
    (patchify-like), 3x3 conv, 2x2 average pool, 1x1 conv to the mean, then (mu - mean)/std."""
    b = GraphBuilder("wm_vae_enc")
    lh, lw = d.latent_hw
    x = b.input("image", [1, 3, d.camera_h, d.image_w])
    x = silu(b, conv(b, x, rng, 3, d.vae_width, 2, 2, 0, 2.0))
    x = silu(b, conv(b, x, rng, d.vae_width, d.vae_width, 3, 1, 1, 1.5))
    x = b.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    mu = conv(b, x, rng, d.vae_width, d.latent_channels, 1, 1, 0, 2.0)
    mean = (0.1 * rng.standard_normal((1, d.latent_channels, 1, 1))).astype(np.float32)
    inv_std = (1.0 / rng.uniform(0.5, 1.5, (1, d.latent_channels, 1, 1))).astype(np.float32)
    b.output(b.mul(b.add(mu, -mean), inv_std), "latents", [1, d.latent_channels, lh, lw])
    return b.model()


def build_wm_embed(d: FastWamChainDims, rng) -> onnx.ModelProto:
    """Patch embedding (a (1,2,2) Conv3d is a stride-2 Conv2d at T=1) + positions, and the
    text/proprio context embedding (Wan's Linear-GELU-Linear)."""
    b = GraphBuilder("wm_embed")
    lh, lw = d.latent_hw
    lat = b.input("latents", [1, d.latent_channels, lh, lw])
    ctx = b.input("context", [1, d.context_tokens, d.context_width])
    x = conv(b, lat, rng, d.latent_channels, d.width, 2, 2, 0, 1.5)
    x = b.transpose(b.reshape(x, [1, d.width, d.tokens]), [0, 2, 1])
    x = b.add(x, (0.3 * rng.standard_normal((1, d.tokens, d.width))).astype(np.float32))
    b.output(x, "video_tokens", [1, d.tokens, d.width])
    c = b.op("Gelu", [b.matmul(ctx, dense(rng, d.context_width, d.width, 1.5))])
    b.output(b.matmul(c, dense(rng, d.width, d.width)), "context_embedding", [1, d.context_tokens, d.width])
    return b.model()


def rope_grid_tables(grid_h, grid_w, width, heads):
    """3-D RoPE over (frame, h, w) for one frame: each head's half-dims split between the
    frame, row and column axes, as Wan's rope does (frame position 0 here)."""
    hd = width // heads
    half = hd // 2
    f_dims = half - 2 * (half // 3)
    axes = [f_dims, half // 3, half // 3]
    pos = np.array([(0, r, c) for r in range(grid_h) for c in range(grid_w)], np.float64)
    ang = []
    for axis, n in enumerate(axes):
        inv = 1.0 / (100.0 ** (np.arange(n) / max(n, 1)))
        ang.append(pos[:, axis:axis + 1] * inv[None, :])
    ang = np.concatenate(ang, axis=1)
    cos = np.tile(np.concatenate([np.cos(ang), np.cos(ang)], axis=1), (1, heads))[None].astype(np.float32)
    sin = np.tile(np.concatenate([np.sin(ang), np.sin(ang)], axis=1), (1, heads))[None].astype(np.float32)
    _, _, rot = rope_tables(np.zeros(1), width, heads)
    return cos, sin, rot


def rms_norm(b, x, rng, width):
    ms = b.op("ReduceMean", [b.mul(x, x), b.const(np.array([-1], np.int64), "axes")], keepdims=1)
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.add(ms, np.array(1e-6, np.float32))])])
    gain = (1.0 + 0.1 * rng.standard_normal(width)).astype(np.float32)
    return b.mul(b.mul(x, inv), gain)


def build_wm_prefill_split(d: FastWamChainDims, rng, layers: int, last: bool) -> onnx.ModelProto:
    """`layers` video-DiT layers at timestep 0 (the modulation folds into the LN affine):
    self-attention with K = RoPE(RMSNorm(W_k h)) and V raw (the cache the action expert
    reads), cross-attention to the context embedding, GELU MLP. The last split outputs only
    its keys/values."""
    b = GraphBuilder("wm_prefill_split")
    t, w, heads = d.tokens, d.width, d.heads
    hd = w // heads
    x = b.input("video_tokens", [1, t, w])
    ctx = b.input("context_embedding", [1, d.context_tokens, w])
    cos, sin, rot = rope_grid_tables(*d.grid, w, heads)
    cos_c, sin_c, rot_c = b.const(cos, "cos"), b.const(sin, "sin"), b.const(rot, "rot")
    keys, values = [], []
    for _ in range(layers):
        h = b.layer_norm(x, w, rng)
        q, k, v = (b.matmul(h, dense(rng, w, w)) for _ in range(3))
        q, k = rms_norm(b, q, rng, w), rms_norm(b, k, rng, w)
        q = b.add(b.mul(q, cos_c), b.mul(b.matmul(q, rot_c), sin_c))
        k = b.add(b.mul(k, cos_c), b.mul(b.matmul(k, rot_c), sin_c))
        keys.append(b.reshape(k, [1, 1, t, w]))
        values.append(b.reshape(v, [1, 1, t, w]))
        qh = b.transpose(b.reshape(q, [1, t, heads, hd]), [0, 2, 1, 3])
        kt = b.transpose(b.reshape(k, [1, t, heads, hd]), [0, 2, 3, 1])
        vh = b.transpose(b.reshape(v, [1, t, heads, hd]), [0, 2, 1, 3])
        scores = b.mul(b.matmul(qh, kt), np.array(1.0 / np.sqrt(hd), np.float32))
        probs = b.op("Softmax", [scores], axis=-1)
        attn = b.reshape(b.transpose(b.matmul(probs, vh), [0, 2, 1, 3]), [1, t, w])
        x = b.add(x, b.matmul(attn, dense(rng, w, w, 0.7)))
        # cross-attention to the (text + proprio) context
        h = b.layer_norm(x, w, rng)
        cq = b.matmul(h, dense(rng, w, w))
        ck = b.matmul(ctx, dense(rng, w, w))
        cv = b.matmul(ctx, dense(rng, w, w))
        cs = b.mul(b.matmul(cq, b.transpose(ck, [0, 2, 1])), np.array(1.0 / np.sqrt(w), np.float32))
        x = b.add(x, b.matmul(b.matmul(b.op("Softmax", [cs], axis=-1), cv), dense(rng, w, w, 0.7)))
        h = b.layer_norm(x, w, rng)
        x = b.add(x, b.matmul(b.op("Gelu", [b.matmul(h, dense(rng, w, 2 * w))]), dense(rng, 2 * w, w, 0.7)))
    if not last:
        b.output(x, "video_tokens_out", [1, t, w])
    b.output(b.op("Concat", keys, axis=0) if layers > 1 else keys[0], "keys", [layers, 1, t, w])
    b.output(b.op("Concat", values, axis=0) if layers > 1 else values[0], "values", [layers, 1, t, w])
    return b.model()
