#!/usr/bin/env python3
"""Pillow's own `Image.resize((w, h), Image.BILINEAR)` on seeded RGB8 frames, the goldens
for the Rust resize (tests/upstream_fastwam.rs): golden/upstream-fastwam/pillow_resize_<version>.npz.

Pillow 12.0.0 (upstream Fast-WAM's pin; tools/goldens/vla_goldens/upstream_fastwam.py writes that file in its
venv) always runs the horizontal pass first; Pillow 13.0.0 (this project's pin, .venv) runs
the vertical pass first when the height shrinks by more than twice as many pixels as the
width does. The cases cover both: LIBERO's 256x256 -> 224x224, mixed shrink/grow, upscale,
and three shrinks that Pillow 13 runs vertical first.

    .venv/bin/python -m vla_goldens.pillow_goldens
"""

from pathlib import Path

import numpy as np
import PIL
from PIL import Image

ROOT = Path(__file__).resolve().parents[3]
from vla_host.det_npz import save_npz

# (src h, w) -> (out h, w); the last three shrink the height by > 2x the width's pixels.
CASES = (((256, 256), (224, 224)), ((48, 40), (38, 32)), ((37, 53), (61, 29)), ((24, 20), (56, 70)),
         ((120, 64), (40, 60)), ((97, 33), (30, 31)), ((200, 90), (64, 100)))


def frame(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Gradients, hard edges and noise: smooth areas and every rounding case."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) * 127 / max(h + w - 2, 1)], -1)
    base[(x // 7 + y // 5) % 2 == 0] = 255 - base[(x // 7 + y // 5) % 2 == 0]
    noise = rng.integers(-40, 41, (h, w, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def resize_goldens() -> dict:
    rng = np.random.default_rng(20260516)
    out = {}
    for (h, w), (oh, ow) in CASES:
        src = frame(rng, h, w)
        out[f"src_{h}x{w}"] = src
        out[f"out_{h}x{w}_to_{oh}x{ow}"] = np.asarray(Image.fromarray(src).resize((ow, oh), resample=Image.BILINEAR))
    return out


def write(out_dir: Path) -> Path:
    path = out_dir / f"pillow_resize_{PIL.__version__}.npz"
    save_npz(path, resize_goldens())
    return path


if __name__ == "__main__":
    p = write(ROOT / "golden" / "upstream-fastwam")
    print(f"{p}: {p.stat().st_size} bytes")
