"""Regenerates the numpy-written fixtures in this directory (committed; tests need no Python).

    python3 -m venv /tmp/npzvenv && /tmp/npzvenv/bin/pip install numpy==2.4.6
    /tmp/npzvenv/bin/python runtime/crates/vla-npz/tests/data/make_fixtures.py

The expected values are restated in tests/numpy_fixtures.rs; keep the two in sync.
"""

import io
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def arrays():
    return {
        "f16": (np.arange(6, dtype=np.float16) * np.float16(0.5) - 1).reshape(2, 3),
        "f32_3d": (np.arange(24, dtype=np.float32) / 4 - 3).reshape(2, 3, 4),
        "f32_special": np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45], dtype=np.float32),
        "f64": np.array([1.0 / 3.0, -2.5], dtype=np.float64),
        "u8": np.array([0, 1, 127, 128, 255], dtype=np.uint8),
        "i8": np.array([-128, -1, 0, 127], dtype=np.int8),
        "i16": np.array([-32768, 32767], dtype=np.int16),
        "u16": np.array([0, 65535], dtype=np.uint16),
        "i32": np.array([[-2147483648, -1], [0, 2147483647]], dtype=np.int32),
        "u32": np.array([4294967295], dtype=np.uint32),
        "i64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        "u64": np.array([0, 2**64 - 1, 12345678901234567890], dtype=np.uint64),
        "bool": np.array([True, False, False, True], dtype=np.bool_),
        "scalar": np.array(7.25, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


class NonSeekable(io.RawIOBase):
    """A write-only sink without seek: zipfile then writes data descriptors (flag bit 3)."""

    def __init__(self):
        self.buf = bytearray()

    def writable(self):
        return True

    def write(self, b):
        self.buf += b
        return len(b)


def main():
    a = arrays()
    np.savez(os.path.join(HERE, "savez.npz"), **a)
    np.savez_compressed(os.path.join(HERE, "savez_compressed.npz"), **a)
    sink = NonSeekable()
    np.savez(sink, f32_3d=a["f32_3d"], u8=a["u8"])
    with open(os.path.join(HERE, "savez_streamed.npz"), "wb") as f:
        f.write(bytes(sink.buf))
    np.save(os.path.join(HERE, "f32_3d_v1.npy"), a["f32_3d"])
    for version in ((2, 0), (3, 0)):
        path = os.path.join(HERE, "f32_3d_v%d.npy" % version[0])
        with open(path, "wb") as f:
            np.lib.format.write_array(f, a["f32_3d"], version=version)
    np.save(os.path.join(HERE, "fortran.npy"), np.asfortranarray(a["f32_3d"][0]))
    np.save(os.path.join(HERE, "big_endian.npy"), a["f32_3d"][0].astype(">f4"))
    np.save(os.path.join(HERE, "complex.npy"), np.array([1 + 2j], dtype=np.complex64))


if __name__ == "__main__":
    main()
