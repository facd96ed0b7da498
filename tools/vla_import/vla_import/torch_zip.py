"""Reading tensors out of a `torch.save` checkpoint (the zip form torch has written since 1.6)
without torch: the pickle is read by an unpickler that knows only the few globals a state dict
needs (anything else is refused, so a checkpoint from the Hub cannot run code here), and a
tensor's bytes are read from its storage entry only when asked for (a Fast-WAM checkpoint is
many GB; the importer needs its proprio Linear)."""

import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ImportRefused, expect

# torch's typed storage classes as pickled -> numpy dtype (bf16 widened on read)
STORAGES = {"FloatStorage": np.float32, "HalfStorage": np.float16, "DoubleStorage": np.float64,
            "BFloat16Storage": "bf16", "LongStorage": np.int64, "IntStorage": np.int32,
            "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_}


@dataclass
class Storage:
    key: str
    dtype: object
    numel: int


@dataclass
class TensorRef:
    """A tensor of the checkpoint, not yet read."""
    storage: Storage
    offset: int
    shape: tuple
    stride: tuple


def _rebuild_tensor_v2(storage, offset, shape, stride, *_rest):
    return TensorRef(storage, int(offset), tuple(int(s) for s in shape), tuple(int(s) for s in stride))


class _Unpickler(pickle.Unpickler):
    def __init__(self, fh, where: str):
        super().__init__(fh)
        self.where = where

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) in (("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor")):
            return _rebuild_tensor_v2
        if module == "torch" and name in STORAGES:
            return name
        raise ImportRefused(self.where, f"expected a state-dict checkpoint, found the global {module}.{name} "
                            "(not read: unpickling it could run code)")

    def persistent_load(self, pid):
        expect(isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage", self.where,
               f"expected torch storage references, found {pid!r}"[:200])
        _, kind, key, _location, numel = pid
        return Storage(str(key), STORAGES[kind], int(numel))


class Checkpoint:
    """`torch.save`'s zip: `<archive>/data.pkl` and one `<archive>/data/<key>` entry per storage."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise ImportRefused(str(path), f"expected a torch.save checkpoint (a zip), found: {exc}") from exc
        pkl = [n for n in self.zip.namelist() if n.endswith("/data.pkl")]
        expect(len(pkl) == 1, str(path), f"expected one <archive>/data.pkl, found {pkl}")
        self.prefix = pkl[0][: -len("data.pkl")]
        with self.zip.open(pkl[0]) as fh:
            self.payload = _Unpickler(fh, str(path)).load()

    def read(self, t: TensorRef) -> np.ndarray:
        """The tensor as numpy (bf16 widened to f32), little-endian as torch writes it."""
        raw = self.zip.read(f"{self.prefix}data/{t.storage.key}")
        bf16 = t.storage.dtype == "bf16"
        dtype = np.dtype(np.uint16 if bf16 else t.storage.dtype).newbyteorder("<")
        flat = np.frombuffer(raw, dtype)
        expect(flat.size >= t.storage.numel, f"{self.path} data/{t.storage.key}",
               f"expected {t.storage.numel} elements, found {flat.size}")
        view = np.lib.stride_tricks.as_strided(flat[t.offset:], t.shape, [s * dtype.itemsize for s in t.stride])
        out = np.array(view)
        if bf16:
            out = (out.astype(np.uint32) << 16).view(np.float32)
        return out.astype(out.dtype.newbyteorder("="))
