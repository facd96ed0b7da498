#!/usr/bin/env python3
"""Independent end-to-end reference: a bundle's contexts plus the host glue, in numpy.

The contexts run as ONNX graphs on ONNX Runtime's CPU provider in fp32 (or, for parity
checks, as any callable taking and returning {tensor name: ndarray}); everything between them
follows docs/bundle-format.md "Host glue" step by step. make_golden.py uses this to write
golden/end_to_end.npz; run directly it recomputes a bundle's end-to-end golden:

    .venv/bin/python -m vla_host.reference golden/bundles/molmoact2-original \
        --onnx-dir /tmp/vla-golden-build/molmoact2-original/onnx
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from vla_host.det_npz import load_npz

U64 = (1 << 64) - 1


# ---------------------------------------------------------------------------------------
# Noise: SplitMix64 + Box-Muller (step 6)
# ---------------------------------------------------------------------------------------


class SplitMix64:
    def __init__(self, seed: int):
        self.state = seed & U64

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & U64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
        return z ^ (z >> 31)


def gaussian_noise(seed: int, shape) -> np.ndarray:
    """Standard normals by Box-Muller in f64, filled row-major (z0 then z1), cast to f32."""
    count = int(np.prod(shape))
    gen = SplitMix64(seed)
    values = []
    while len(values) < count:
        r1, r2 = gen.next_u64(), gen.next_u64()
        u1 = ((r1 >> 11) + 1) * 2.0**-53
        u2 = (r2 >> 11) * 2.0**-53
        radius = np.sqrt(-2.0 * np.log(u1))
        values.append(radius * np.cos(2.0 * np.pi * u2))
        values.append(radius * np.sin(2.0 * np.pi * u2))
    return np.array(values[:count], dtype=np.float64).astype(np.float32).reshape(shape)


# ---------------------------------------------------------------------------------------
# Frames -> pixel_values (step 1)
# ---------------------------------------------------------------------------------------


def _axis_taps(n_in: int, n_out: int):
    """PyTorch's bilinear taps: src = scale * (dst + 0.5) - 0.5 rounded once (its CPU
    kernels fuse it into an FMA; exact in f64 here, then one rounding), floored at 0."""
    scale = np.float32(n_in) / np.float32(n_out)
    dst = np.arange(n_out, dtype=np.float32) + np.float32(0.5)
    src = (dst.astype(np.float64) * np.float64(scale) - 0.5).astype(np.float32)
    if n_in == n_out:
        src = np.arange(n_out, dtype=np.float32)
    src = np.maximum(src, np.float32(0.0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    frac = np.clip(src - i0.astype(np.float32), np.float32(0), np.float32(1)).astype(np.float32)
    return i0, i1, frac


def resize_bilinear(frame: np.ndarray, size: int) -> np.ndarray:
    """RGB8 [H, W, 3] -> [size, size, 3], half-pixel centres, clamped, no antialiasing,
    rounded back to uint8 (half to even) as torchvision's Resize does on a uint8 image;
    returned as f32 values 0..255."""
    img = frame.astype(np.float32)
    y0, y1, fy = _axis_taps(img.shape[0], size)
    x0, x1, fx = _axis_taps(img.shape[1], size)
    fx = fx[None, :, None]
    fy = fy[:, None, None]
    top = img[y0][:, x0] * (np.float32(1) - fx) + img[y0][:, x1] * fx
    bottom = img[y1][:, x0] * (np.float32(1) - fx) + img[y1][:, x1] * fx
    out = (top * (np.float32(1) - fy) + bottom * fy).astype(np.float32)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8).astype(np.float32)


def pixel_values_from_frames(frames: np.ndarray, crop: int, patch: int) -> np.ndarray:
    cams = frames.shape[0]
    grid = crop // patch
    out = np.empty((1, cams, grid * grid, patch * patch * 3), np.float32)
    for cam in range(cams):
        img = resize_bilinear(frames[cam], crop) / np.float32(255) * np.float32(2) - np.float32(1)
        # [py, dy, px, dx, c] -> [py, px, dy, dx, c]
        patches = img.reshape(grid, patch, grid, patch, 3).transpose(0, 2, 1, 3, 4)
        out[0, cam] = patches.reshape(grid * grid, patch * patch * 3)
    return out


# ---------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------


def _norm_arrays(norm: dict, n: int):
    get = lambda key: np.asarray(norm[key], np.float32) if key in norm else None  # noqa: E731
    passthrough = np.asarray(norm.get("passthrough", [False] * n), bool)
    return get("low"), get("high"), get("mean"), get("std"), passthrough


RANGE_FLOOR = np.float32(1e-6)  # upstream _FeatureNormalizer's eps


LEROBOT_EPS = np.float32(1e-8)  # lerobot NormalizerProcessorStep's default eps


def _lerobot(norm: dict) -> bool:
    """The bundle follows LeRobot's policy pipeline rather than the HF _FeatureNormalizer."""
    return norm.get("follows", "hf_feature_normalizer") == "lerobot_pipeline"


def _clips(norm: dict) -> bool:
    return _lerobot(norm) or norm["mode"] in ("quantile", "min_max")


def _lerobot_range(low, high, norm):
    """LeRobot's divisor: the range itself, its eps where the range is exactly 0."""
    d = high - low
    return np.where(d == 0, np.float32(norm.get("eps", LEROBOT_EPS)), d).astype(np.float32)


def normalize(x: np.ndarray, norm: dict) -> np.ndarray:
    """The checkpoint's normalizer. HF _FeatureNormalizer.normalize: floored ranges, clipped for
    quantile/min_max, pass-through dims untouched, constant dims 0. LeRobot's masked normalizer
    and clamp step: the range (eps where 0) or std + eps, every mode clipped, a pass-through
    value outside [-1, 1] refused (ValueError, as lerobot raises)."""
    x = np.asarray(x, np.float32)
    low, high, mean, std, passthrough = _norm_arrays(norm, x.shape[-1])
    mode, lerobot = norm["mode"], _lerobot(norm)
    if lerobot and ((np.abs(x) > 1) & passthrough).any():
        raise ValueError("gripper (pass-through) values are not under [-1, 1], as lerobot refuses")
    if mode in ("quantile", "min_max"):
        d = _lerobot_range(low, high, norm) if lerobot else np.maximum(high - low, RANGE_FLOOR)
        y = np.float32(2) * (x - low) / d - np.float32(1)
    elif mode == "mean_std":
        d = (std + np.float32(norm.get("eps", LEROBOT_EPS))) if lerobot else np.maximum(std, RANGE_FLOOR)
        y = (x - mean) / d
    elif mode == "identity":
        y = x.copy()
    else:
        raise ValueError(f"normalization mode {mode!r}")
    if _clips(norm):
        y = np.clip(y, np.float32(-1), np.float32(1))
    y = np.where(passthrough, x, y)
    constant = np.asarray(norm.get("constant", [False] * x.shape[-1]), bool)
    if mode == "min_max" and not lerobot:
        constant = constant | (low == high)
    return np.where(constant, np.float32(0), y).astype(np.float32)


def denormalize(x: np.ndarray, norm: dict) -> np.ndarray:
    """HF _FeatureNormalizer.unnormalize: quantile/min_max clip every dim first (the
    pass-through gripper comes out clipped too); mean_std does not clip. LeRobot's clamp-action
    step clips every dim in every mode, then its masked unnormalizer in its own orders."""
    x = np.asarray(x, np.float32)
    low, high, mean, std, passthrough = _norm_arrays(norm, x.shape[-1])
    mode, lerobot = norm["mode"], _lerobot(norm)
    if _clips(norm):
        x = np.clip(x, np.float32(-1), np.float32(1))
    one, two = np.float32(1), np.float32(2)
    if mode == "quantile" and lerobot:
        y = (x + one) * _lerobot_range(low, high, norm) / two + low
    elif mode == "min_max" and lerobot:
        y = (x + one) / two * _lerobot_range(low, high, norm) + low
    elif mode in ("quantile", "min_max"):
        y = (x + one) * (high - low) / two + low
    elif mode == "mean_std":
        y = x * std + mean
    elif mode == "identity":
        y = x.copy()
    else:
        raise ValueError(f"normalization mode {mode!r}")
    return np.where(passthrough, x, y).astype(np.float32)


# ---------------------------------------------------------------------------------------
# Prompt, state tokens and attention bias (steps 2, 3)
# ---------------------------------------------------------------------------------------


def state_token_ids(state: np.ndarray, state_norm: dict) -> np.ndarray:
    s = np.clip(normalize(state, state_norm), -1, 1)
    return np.rint((s + np.float32(1)) / np.float32(2) * np.float32(255)).astype(np.int64)


def embed_prompt(tables: dict, instruction_id: int, image_embeds: np.ndarray, state: np.ndarray, state_norm: dict):
    h = tables["scaffold"][instruction_id].astype(np.float32)
    h[tables["image_positions"][instruction_id]] += image_embeds
    ids = state_token_ids(state, state_norm)
    h[tables["state_positions"][instruction_id]] = tables["state_token_rows"][ids].astype(np.float32)
    return h[None]


def image_block(tables: dict, instruction_id: int) -> np.ndarray:
    """Rows of the bidirectional image block: every image special token (the processor's
    token_type_ids); tables without `image_block` mark the patch rows only."""
    if "image_block" in tables:
        return tables["image_block"][instruction_id].astype(bool)
    block = np.zeros(tables["valid"].shape[1], bool)
    block[tables["image_positions"][instruction_id]] = True
    return block


def encoder_mask(tables: dict, instruction_id: int) -> np.ndarray:
    """The action expert's encoder mask: carried per instruction, else `valid`."""
    key = "encoder_mask" if "encoder_mask" in tables else "valid"
    return tables[key][instruction_id][None].astype(np.float32)


def attention_bias(valid: np.ndarray, is_image: np.ndarray, blocked: float) -> np.ndarray:
    s = valid.shape[0]
    q = np.arange(s)[:, None]
    k = np.arange(s)[None, :]
    allowed = valid.astype(bool)[None, :] & ((k <= q) | (is_image[:, None] & is_image[None, :]))
    return np.where(allowed, np.float32(0), np.float32(blocked)).astype(np.float32)[None, None]


# ---------------------------------------------------------------------------------------
# KeyStone (step 7)
# ---------------------------------------------------------------------------------------


F32 = np.float32


def _seq_sum(values: np.ndarray) -> np.float32:
    """Left-to-right f32 sum (torch.cdist's CPU kernel accumulates so)."""
    acc = F32(0)
    for v in values:
        acc = F32(acc + v)
    return acc


def distance_matrix(pts: np.ndarray, kind: str) -> np.ndarray:
    """KeyStone's `_pairwise_distances` in f32: cdist p=1 / p=2 (per pair, |a - b| mapped and
    summed left to right, sqrt for l2), cosine `1 - (a / (|a| + 1e-8)) . (b / (|b| + 1e-8))`."""
    k = pts.shape[0]
    out = np.zeros((k, k), F32)
    if kind == "cosine":
        unit = np.stack([p / F32(np.sqrt(_seq_sum(p * p)) + F32(1e-8)) for p in pts]).astype(F32)
    for i in range(k):
        for j in range(k):
            if kind == "l1":
                out[i, j] = _seq_sum(np.abs(pts[i] - pts[j]))
            elif kind == "l2":
                d = np.abs(pts[i] - pts[j])
                out[i, j] = np.sqrt(_seq_sum(d * d))
            elif kind == "cosine":
                out[i, j] = F32(1) - _seq_sum(unit[i] * unit[j])
            else:
                raise ValueError(f"keystone distance {kind!r}")
    return out


def _medoid(dist: np.ndarray, members) -> int:
    sums = [_seq_sum(dist[i, members]) for i in members]
    return int(members[int(np.argmin(sums))])


def keystone_select(candidates: np.ndarray, keystone: dict) -> int:
    """candidates [K, H, action_dims] (normalized space) -> chosen index, in f32 as KeyStone's
    `selection.py` computes on the policy's f32 candidates."""
    k = candidates.shape[0]
    rows = keystone.get("executed_steps") or candidates.shape[1]
    pts = candidates[:, :rows].reshape(k, -1).astype(F32)
    dist = distance_matrix(pts, keystone.get("distance", "l2"))
    everyone = np.arange(k)
    medoid = _medoid(dist, everyone)
    selector, clusters = keystone["selector"], keystone.get("num_clusters", 2)
    if selector == "medoid" or (selector == "guarded_medoid" and k == 1):
        return medoid
    if selector == "guarded_medoid":
        pairwise = np.sort(dist[np.triu_indices(k, 1)])
        median = pairwise[(len(pairwise) - 1) // 2]  # torch.median: the lower middle value
        mean = (np.sum(pts, axis=0, dtype=F32) / F32(k)).astype(F32)
        gap = np.sqrt(_seq_sum((mean - pts[medoid]) ** 2))
        spread = F32(gap / F32(median + F32(1e-8)))
        if not spread > F32(keystone.get("spread_threshold", 0.3)):
            return medoid
    assign = k_means(pts, clusters)
    counts = np.bincount(assign, minlength=min(clusters, k))
    return _medoid(dist, np.flatnonzero(assign == int(np.argmax(counts))))


def k_means(pts: np.ndarray, clusters: int, iterations: int = 10) -> np.ndarray:
    """KeyStone's `_kmeans_assignments`: centroids start at the first C points, at most 10 rounds
    of assign (nearest by l2, first on ties) and mean (an empty cluster keeps its centroid),
    stopping when the new centroids are allclose (atol 1e-6, rtol 1e-5) to the old; then one
    more assignment against the centroids kept."""
    k = pts.shape[0]
    clusters = min(clusters, k)
    if clusters <= 1:
        return np.zeros(k, np.int64)

    def nearest(centroids):
        return np.array([int(np.argmin(distance_matrix(np.concatenate([p[None], centroids]), "l2")[0, 1:]))
                         for p in pts])

    centroids = pts[:clusters].copy()
    for _ in range(iterations):
        assign = nearest(centroids)
        new = centroids.copy()
        for c in range(clusters):
            if (assign == c).any():
                new[c] = np.sum(pts[assign == c], axis=0, dtype=F32) / F32((assign == c).sum())
        if (np.abs(centroids - new) <= F32(1e-6) + F32(1e-5) * np.abs(new)).all():
            break
        centroids = new
    return nearest(centroids)


# ---------------------------------------------------------------------------------------
# Pipelines
# ---------------------------------------------------------------------------------------


class OrtCpuRunner:
    """One ONNX graph on ONNX Runtime's CPU provider, fp32, single-threaded."""

    def __init__(self, onnx_path):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(onnx_path), sess_options=so, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, feeds: dict) -> dict:
        return dict(zip(self.output_names, self.session.run(None, feeds)))


class Recorder:
    """Wraps the runners and keeps one (inputs, outputs) pair per component for the goldens."""

    def __init__(self, runners: dict, capture: dict):
        self.runners = runners
        self.capture = capture  # component -> call index to keep
        self.calls = {}
        self.io = {}

    def __call__(self, component: str, feeds: dict) -> dict:
        outs = self.runners[component](feeds)
        index = self.calls.get(component, 0)
        self.calls[component] = index + 1
        if index == self.capture.get(component, 0):
            self.io[component] = ({k: np.array(v) for k, v in feeds.items()}, {k: np.array(v) for k, v in outs.items()})
        return outs


def flow_loop(run, feeds_base: dict, noise: np.ndarray, n: int, step_output: str, keep: np.ndarray):
    x = noise * keep
    for i in range(n):
        t = np.array([i / n], np.float32)
        out = run("action_step", dict(feeds_base, trajectory=x, timestep=t))["next_trajectory"]
        if step_output == "velocity":
            x = (x + np.float32(1.0 / n) * out) * keep
        else:
            x = out * keep
    return x


def run_molmoact2(manifest: dict, tables: dict, run, frames, state, instruction_id: int, seed: int) -> dict:
    m = manifest["molmoact2"]
    pixel_values = pixel_values_from_frames(frames, m["crop_size"], m["patch_size"])
    image_embeds = run("vision", {"pixel_values": pixel_values})["image_embeds"]
    hidden = embed_prompt(tables, instruction_id, image_embeds, state, m["state_norm"]).astype(np.float32)
    bias = attention_bias(tables["valid"][instruction_id], image_block(tables, instruction_id),
                          m["attention_blocked_value"])
    h, keys, values = hidden, [], []
    for i in range(m["llm_splits"]):
        out = run(f"llm_split{i}", {"hidden_states": h, "attention_bias": bias})
        h = out["hidden_out"]
        keys.append(out["keys"])
        values.append(out["values"])
    ctx = run("action_context", {"keys": np.concatenate(keys), "values": np.concatenate(values)})
    width, dims = m["action_width"], m["action_dims"]
    is_pad = np.zeros((1, width), np.float32)
    is_pad[0, dims:] = 1
    keep = np.float32(1) - is_pad
    base = {
        "k_ctx": ctx["k_ctx"],
        "v_ctx": ctx["v_ctx"],
        "encoder_attention_mask": encoder_mask(tables, instruction_id),
        "action_dim_is_pad": is_pad,
    }
    shape = (1, m["action_horizon"], width)
    keystone = m.get("keystone")
    count = keystone["k"] if keystone else 1
    noises, finals = [], []
    for c in range(count):
        noise = gaussian_noise((seed + c) & U64, shape)
        noise = noise * keep
        noises.append(noise)
        finals.append(flow_loop(run, base, noise, m["flow_steps"], m["step_output"], keep))
    result = {
        "pixel_values": pixel_values,
        "hidden_states": hidden,
        "attention_bias": bias,
        "k_ctx": ctx["k_ctx"],
        "v_ctx": ctx["v_ctx"],
        "noise": noises[0],
    }
    if keystone:
        candidates = np.stack([x[0, :, :dims] for x in finals]).astype(np.float32)
        choice = keystone_select(candidates, keystone)
        result["candidates"] = candidates
        result["keystone_choice"] = np.array([choice], np.int32)
        chosen = candidates[choice]
    else:
        chosen = finals[0][0, :, :dims]
    result["actions"] = denormalize(chosen, m["action_norm"])
    return result


def wan_sigmas(n: int, shift: float) -> np.ndarray:
    u = np.linspace(1.0, 0.0, n + 1)[:n]
    sigma = shift * u / (1.0 + (shift - 1.0) * u)
    return np.append(sigma, 0.0)


# ---------------------------------------------------------------------------------------
# Fast-WAM observation side (docs/bundle-format.md "Fast-WAM closed loop")
# ---------------------------------------------------------------------------------------

PIL_PRECISION_BITS = 32 - 8 - 2


def _pil_coeffs(n_in: int, n_out: int):
    """Pillow's bilinear resample taps for one axis (its `precompute_coeffs`, support 1
    widened by the scale when shrinking, so it is antialiased), as its 8-bit fixed point."""
    scale = n_in / n_out
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    ksize = int(np.ceil(support)) * 2 + 1
    bounds = np.zeros((n_out, 2), np.int64)
    kk = np.zeros((n_out, ksize), np.int64)
    for xx in range(n_out):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), n_in) - xmin
        ss = 1.0 / filterscale
        w = [max(0.0, 1.0 - abs((x + xmin - center + 0.5) * ss)) for x in range(xmax)]
        total = 0.0
        for v in w:  # summed in order, as Pillow does
            total += v
        w = np.array([v / total for v in w] if total != 0 else w)
        fixed = np.where(w < 0, np.trunc(-0.5 + w * (1 << PIL_PRECISION_BITS)),
                         np.trunc(0.5 + w * (1 << PIL_PRECISION_BITS))).astype(np.int64)
        kk[xx, :xmax] = fixed
        bounds[xx] = (xmin, xmax)
    return bounds, kk


def _pil_pass(img: np.ndarray, n_out: int, axis: int) -> np.ndarray:
    bounds, kk = _pil_coeffs(img.shape[axis], n_out)
    src = np.moveaxis(img.astype(np.int64), axis, 0)
    out = np.empty((n_out,) + src.shape[1:], np.int64)
    for o in range(n_out):
        xmin, count = bounds[o]
        acc = np.full(src.shape[1:], 1 << (PIL_PRECISION_BITS - 1), np.int64)
        for j in range(count):
            acc += src[xmin + j] * kk[o, j]
        out[o] = np.clip(acc >> PIL_PRECISION_BITS, 0, 255)
    return np.moveaxis(out, 0, axis).astype(np.uint8)


def pil_vertical_first(src_h: int, src_w: int, height: int, width: int, order: str) -> bool:
    """Pillow 12 (upstream Fast-WAM's pin, `order="pillow12"`) always runs the horizontal
    pass first; Pillow 13 (`"pillow13"`) runs the vertical one first when the height shrinks
    by more than twice as many pixels as the width does."""
    return order == "pillow13" and (src_h - height) > 0 and (src_h - height) > (src_w - width) * 2


def pil_resize_bilinear(img: np.ndarray, width: int, height: int, order: str = "pillow12") -> np.ndarray:
    """`Image.fromarray(img).resize((width, height), Image.BILINEAR)` for RGB8 [H, W, 3]:
    two separable passes, each rounded to uint8, in the Pillow release's order."""
    if pil_vertical_first(img.shape[0], img.shape[1], height, width, order):
        return _pil_pass(_pil_pass(img, height, 0), width, 1)
    return _pil_pass(_pil_pass(img, width, 1), height, 0)


def center_crop_resize(img: np.ndarray, width: int, height: int) -> np.ndarray:
    """Upstream LIBERO eval's `_center_crop_resize`: aspect-preserving scale (Python round),
    Pillow bilinear, centre crop."""
    src_h, src_w = img.shape[:2]
    scale = max(width / src_w, height / src_h)
    rw, rh = round(src_w * scale), round(src_h * scale)
    resized = pil_resize_bilinear(img, rw, rh)
    left, top = max((rw - width) // 2, 0), max((rh - height) // 2, 0)
    return resized[top:top + height, left:left + width]


def fastwam_image(frames: np.ndarray, chain: dict) -> np.ndarray:
    """[cams, H, W, 3] uint8 -> [1, 3, h, cams * w]: optional 180-degree turn per camera,
    centre-crop resize, side by side, `x * (2/255) - 1` in f32."""
    cams = []
    for cam, frame in enumerate(frames):
        if chain["rotate_180"][cam]:
            frame = frame[::-1, ::-1]
        cams.append(center_crop_resize(np.ascontiguousarray(frame), chain["camera_width"], chain["camera_height"]))
    rgb = np.concatenate(cams, axis=1).astype(np.float32)
    return (rgb * np.float32(2.0 / 255.0) - np.float32(1.0)).transpose(2, 0, 1)[None].copy()


FASTWAM_STD_EPS = np.float32(1e-8)
FASTWAM_MIN_RANGE = np.float32(1e-4)
FASTWAM_STATE_CLAMP = np.float32(5.0)


def fastwam_scale_offset(norm: dict, n: int):
    """Upstream `SingleFieldLinearNormalizer.__init__` in f32: z-score `1/(std+1e-8)`,
    `-mean/(std+1e-8)`; min/max and quantile `2/range`, `-1 - scale*low`, except ranges below
    1e-4: scale 1, offset `-low`. Identity: 1, 0."""
    low, high, mean, std, passthrough = _norm_arrays(norm, n)
    mode = norm["mode"]
    if mode == "mean_std":
        d = std + FASTWAM_STD_EPS
        scale, offset = np.float32(1) / d, -mean / d
    elif mode in ("quantile", "min_max"):
        rng = high - low
        ignore = rng < FASTWAM_MIN_RANGE
        scale = np.float32(2) / np.where(ignore, np.float32(2), rng)
        offset = np.where(ignore, np.float32(0) - low, np.float32(-1) - scale * low)
    else:
        scale, offset = np.ones(n, np.float32), np.zeros(n, np.float32)
    return scale.astype(np.float32), offset.astype(np.float32), passthrough


def fastwam_normalize(x: np.ndarray, norm: dict) -> np.ndarray:
    """Fast-WAM's dataset normalizer, forward (the state): `x*scale + offset` clamped to
    [-5, 5], as upstream."""
    x = np.asarray(x, np.float32)
    scale, offset, passthrough = fastwam_scale_offset(norm, x.shape[-1])
    y = np.clip(x * scale + offset, -FASTWAM_STATE_CLAMP, FASTWAM_STATE_CLAMP)
    return np.where(passthrough, x, y).astype(np.float32)


def fastwam_denormalize(x: np.ndarray, norm: dict) -> np.ndarray:
    """Fast-WAM's normalizer backward (the actions): `(x - offset) / scale`, never clamped."""
    x = np.asarray(x, np.float32)
    scale, offset, passthrough = fastwam_scale_offset(norm, x.shape[-1])
    return np.where(passthrough, x, (x - offset) / scale).astype(np.float32)


def fastwam_gripper(actions: np.ndarray, f: dict) -> np.ndarray:
    """The gripper dim as upstream LIBERO eval sends it: `g*2 - 1`, inverted, then sign only
    when the bundle binarizes. `gripper_map: none` (the constant-world-model bundles) keeps
    the old rule: binarize on `g >= 0` only."""
    a = actions.copy()
    g = a[:, -1]
    if f.get("gripper_map", "none") == "libero":
        g = -(g * np.float32(2) - np.float32(1))
        if f.get("gripper_binarize"):
            g = np.sign(g)
    elif f.get("gripper_binarize"):
        g = np.where(g >= 0, np.float32(1), np.float32(-1))
    a[:, -1] = g
    return a.astype(np.float32)


def quat2axisangle(q) -> np.ndarray:
    """robosuite's `transform_utils.quat2axisangle` on an (x, y, z, w) quaternion, in float64,
    then cast to float32 as upstream's `_extract_sim_state` does: w clipped to [-1, 1], zeros
    when `sqrt(1 - w*w)` is exactly 0 (robosuite's `math.isclose(den, 0.0)`), never
    normalized, so q and -q give different vectors."""
    q = np.asarray(q, np.float64)
    w = min(max(float(q[3]), -1.0), 1.0)
    den = math.sqrt(1.0 - w * w)
    if den == 0.0:
        return np.zeros(3, np.float32)
    with np.errstate(over="ignore"):
        return ((q[:3] * 2.0 * math.acos(w)) / den).astype(np.float32)


def fastwam_state(raw: np.ndarray, chain: dict) -> np.ndarray:
    """The state the policy normalizes, from what the robot writes (`chain.state_input`)."""
    raw = np.asarray(raw, np.float32)
    if chain.get("state_input", "state") == "eef_pos_quat_gripper":
        return np.concatenate([raw[:3], quat2axisangle(raw[3:7]), raw[7:9]]).astype(np.float32)
    return raw


def fastwam_context(tables: dict, instruction_id: int, state: np.ndarray, chain: dict) -> np.ndarray:
    """[1, text_tokens + 1, E]: the instruction's text rows, then proprio Linear(norm(state))."""
    text = tables["text_rows"][instruction_id].astype(np.float32)
    s = fastwam_normalize(fastwam_state(state, chain), chain["state_norm"])
    w, b = tables["proprio_weight"].astype(np.float32), tables["proprio_bias"].astype(np.float32)
    proprio = (w.astype(np.float64) @ s.astype(np.float64) + b).astype(np.float32)
    return np.concatenate([text, proprio[None]], axis=0)[None]


def run_world_model(chain: dict, tables: dict, run, frames, state, instruction_id: int) -> dict:
    """The closed-loop chain: image -> wm_vae_enc -> wm_embed (+ context) -> prefill splits."""
    image = fastwam_image(frames, chain)
    latents = run("wm_vae_enc", {"image": image})["latents"]
    context = fastwam_context(tables, instruction_id, state, chain)
    emb = run("wm_embed", {"latents": latents, "context": context})
    tokens, keys, values = emb["video_tokens"], [], []
    stages = {"image": image, "latents": latents, "context": context}
    splits = len(chain["prefill_layers"])
    for i in range(splits):
        out = run(f"wm_prefill_split{i}", {"video_tokens": tokens, "context_embedding": emb["context_embedding"]})
        keys.append(out["keys"])
        values.append(out["values"])
        stages[f"keys_split{i}"], stages[f"values_split{i}"] = out["keys"], out["values"]
        if i + 1 < splits:
            tokens = out["video_tokens_out"]
    world = {"video_keys": np.concatenate(keys), "video_values": np.concatenate(values), "context": context,
             "context_mask": np.ones((1, context.shape[1]), np.float32)}
    return world, stages


def run_fastwam(manifest: dict, world: dict, run, seed: int) -> dict:
    f = manifest["fastwam"]
    shape = (1, f["action_horizon"], f["action_dims"])
    noise = gaussian_noise(seed, shape)
    sigma = wan_sigmas(f["flow_steps"], f["shift"])
    x = noise.copy()
    for i in range(f["flow_steps"]):
        feeds = {
            "latents_action": x,
            "timestep": np.array([sigma[i] * 1000.0], np.float32),
            "video_keys": world["video_keys"],
            "video_values": world["video_values"],
            "context": world["context"],
            "context_mask": world["context_mask"],
        }
        pred = run("action_step", feeds)["pred_noise"]
        x = (x + pred * np.float32(sigma[i + 1] - sigma[i])).astype(np.float32)
    actions = fastwam_denormalize(x[0], f["action_norm"])
    return {"noise": noise, "actions": fastwam_gripper(actions, f)}


def capture_plan(manifest: dict) -> dict:
    """Which call of a looped context goes into its golden: the middle flow step."""
    if manifest["policy"] == "molmoact2":
        return {"action_step": manifest["molmoact2"]["flow_steps"] // 2}
    return {"action_step": manifest["fastwam"]["flow_steps"] // 2}


def run_bundle(bundle_dir: Path, runners: dict, inputs: dict, manifest: dict | None = None):
    """Runs a bundle end to end; returns (end_to_end arrays, {component: (inputs, outputs)}).
    `manifest` replaces the bundle's own `bundle.json` (a variant of its settings)."""
    bundle_dir = Path(bundle_dir)
    if manifest is None:
        manifest = json.loads((bundle_dir / "bundle.json").read_text())
    rec = Recorder(runners, capture_plan(manifest))
    seed = int(inputs["seed"][0])
    if manifest["policy"] == "molmoact2":
        tables = load_npz(bundle_dir / manifest["molmoact2"]["prompt"])
        result = run_molmoact2(manifest, tables, rec, inputs["frames"], inputs["state"],
                               int(inputs["instruction_id"][0]), seed)
    elif manifest["fastwam"].get("chain"):
        chain = manifest["fastwam"]["chain"]
        tables = load_npz(bundle_dir / chain["tables"])
        world, stages = run_world_model(chain, tables, rec, inputs["frames"], inputs["state"],
                                        int(inputs["instruction_id"][0]))
        result = {**stages, **run_fastwam(manifest, world, rec, seed)}
    else:
        world = load_npz(bundle_dir / manifest["fastwam"]["world_model"])
        result = run_fastwam(manifest, world, rec, seed)
    return result, rec.io


def cpu_runners(bundle_dir: Path, onnx_dir: Path) -> dict:
    manifest = json.loads((Path(bundle_dir) / "bundle.json").read_text())
    return {name: OrtCpuRunner(Path(onnx_dir) / f"{name}.onnx") for name in manifest["components"]}


def cosine(a, b) -> float:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    if denom == 0:
        return 1.0 if np.array_equal(a, b) else 0.0
    return float(a @ b / denom)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--onnx-dir", type=Path, required=True, help="directory with <component>.onnx graphs")
    args = ap.parse_args()
    manifest = json.loads((args.bundle / "bundle.json").read_text())
    golden = load_npz(args.bundle / manifest["end_to_end"])
    result, _ = run_bundle(args.bundle, cpu_runners(args.bundle, args.onnx_dir), golden)
    worst = 1.0
    for name, value in result.items():
        c = cosine(value, golden[name])
        worst = min(worst, c)
        print(f"{name:16s} cosine {c:.9f}  max|diff| {np.abs(value.astype(np.float64) - golden[name]).max():.3g}")
    sys.exit(0 if worst >= manifest["parity"]["end_to_end_cosine"] else 1)


if __name__ == "__main__":
    main()
