#!/usr/bin/env python3
"""Upstream's image processor (lerobot 0.6.1's vendored `MolmoAct2ImageProcessor`, crop_mode
"resize", the real 378 crop, 14-pixel patches) on RGB8 frames of several sizes, every patch
checked: golden/upstream/resize378.npz, for tests/upstream.rs to compare vlad's preprocess at the
real crop without storing 3.4 MB per frame.

Each pixel value is upstream's uint8 level (its resize rounds to uint8 before `/255*2-1`, so
`level = (x + 1) / 2 * 255` is exact). Stored per frame: `patch_fnv` u64 [729], the FNV-1a 64 hash
of each patch's 588 levels (patch-major, (dy, dx, c) inside), and upstream's level at every value
whose exact interpolation lies within 1e-3 of a .5 tie (`tie_index` u32 into [729 * 588],
`tie_level` u8), the only values where summing the taps in another order can round the other way.
A value outside those positions that differs from upstream changes its patch's hash. The tie
positions are found here with the bilinear taps in f64 (a selection only: a missed tie shows as a
hash mismatch in the test, never as a pass). Frames: stored, except LIBERO's 256x256 pair, which is
images.npz's `frames_256x256`. Deterministic: seeded frames, det_npz.

    build/upstream-venv/bin/python -m vla_goldens.upstream_resize
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
from vla_host.det_npz import load_npz, save_npz
from vla_host.reference import _axis_taps
from vla_goldens.upstream_molmoact2 import load_hf_package

torch.set_num_threads(1)

# (height, width): small and odd sizes up to 378, a wide one, LIBERO's 256x256 (images.npz).
SIZES = [(37, 53), (97, 131), (150, 200), (61, 480)]
TIE = 1e-3


def fnv1a64(data: np.ndarray) -> int:
    h = 0xCBF29CE484222325
    for b in data.tobytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def exact_interpolation(frame: np.ndarray, size: int) -> np.ndarray:
    """The bilinear value before rounding, in f64 on the taps, for finding .5 ties only."""
    img = frame.astype(np.float64)
    y0, y1, fy = _axis_taps(img.shape[0], size)
    x0, x1, fx = _axis_taps(img.shape[1], size)
    fx, fy = fx.astype(np.float64)[None, :, None], fy.astype(np.float64)[:, None, None]
    top = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
    bottom = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
    return top * (1 - fy) + bottom * fy


def patchify(img: np.ndarray, patch: int = 14) -> np.ndarray:
    g = img.shape[0] // patch
    return img.reshape(g, patch, g, patch, 3).transpose(0, 2, 1, 3, 4).reshape(g * g, patch * patch * 3)


def main() -> None:
    _, img_mod, _, _ = load_hf_package()
    ip = img_mod.MolmoAct2ImageProcessor(
        size={"height": 378, "width": 378}, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        crop_mode="resize", max_crops=1, patch_size=14, pooling_size=[2, 2])
    rng = np.random.default_rng(1266)
    frames = {f"{h}x{w}": rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES}
    libero = load_npz(ROOT / "golden" / "upstream" / "images.npz")["frames_256x256"]
    frames.update({"256x256_cam0": libero[0], "256x256_cam1": libero[1]})
    arrays, total_ties = {}, 0
    for name, frame in frames.items():
        pv = np.asarray(ip([frame], return_tensors="np")["pixel_values"], np.float32)[0]
        assert pv.shape == (729, 588), pv.shape
        level = (pv.astype(np.float64) + 1.0) / 2.0 * 255.0
        assert np.abs(level - np.rint(level)).max() < 1e-3, "not uint8 levels"
        level = np.rint(level).astype(np.uint8)
        exact = patchify(exact_interpolation(frame, 378)).reshape(-1)
        ties = np.flatnonzero(np.abs(exact - np.floor(exact) - 0.5) < TIE)
        total_ties += len(ties)
        if not name.startswith("256x256"):
            arrays[f"frame_{name}"] = frame
        arrays[f"patch_fnv_{name}"] = np.array([fnv1a64(p) for p in level], np.uint64)
        arrays[f"tie_index_{name}"] = ties.astype(np.uint32)
        arrays[f"tie_level_{name}"] = level.reshape(-1)[ties]
    out = ROOT / "golden" / "upstream" / "resize378.npz"
    save_npz(out, arrays)
    print(f"wrote {out} ({out.stat().st_size} B, {total_ties} tie positions)")


if __name__ == "__main__":
    main()
