"""Tensors of a safetensors file as f32: the header read directly, BF16 widened from the
file's own bytes (safetensors' numpy backend has no bfloat16), F32/F16 through the
safetensors library. Shared by the importer (checkpoints) and the Wan text rows (Wan's
bf16 text encoder)."""

import json
import struct
from pathlib import Path

import numpy as np


class DtypeRefused(ValueError):
    """A tensor stored in a dtype other than BF16, F16 or F32."""


def header(path: Path) -> tuple[dict, int]:
    """The file's JSON header and the offset its data starts at."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def read_tensor(path: Path, key: str) -> np.ndarray:
    """One tensor as f32; BF16 is the upper half of an f32."""
    meta, start = header(path)
    meta = meta[key]
    dtype, shape, (lo, hi) = meta["dtype"], meta["shape"], meta["data_offsets"]
    if dtype == "BF16":
        with open(path, "rb") as f:
            f.seek(start + lo)
            raw = np.frombuffer(f.read(hi - lo), dtype="<u2")
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype not in ("F32", "F16"):
        raise DtypeRefused(f"dtype: expected BF16, F16 or F32, found {dtype}")
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return f.get_tensor(key).astype(np.float32)


def read_all(path: Path) -> dict:
    """Every tensor of the file as f32, by name."""
    return {k: read_tensor(path, k) for k in header(path)[0] if k != "__metadata__"}
