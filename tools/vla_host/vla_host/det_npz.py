"""Deterministic .npz writer: the same arrays always give the same bytes.

numpy's savez stamps the current time into every zip entry, so regenerated golden files
would differ run to run. Here entries are stored (not deflated) with a fixed date, fixed
permissions and in the caller's order, and each .npy uses format version 1.0.
"""

import io
import zipfile

import numpy as np

FIXED_DATE = (1980, 1, 1, 0, 0, 0)


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


def save_npz(path, arrays: dict) -> None:
    """Writes `arrays` (name -> ndarray, kept in insertion order) as a stored zip."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            array = np.asarray(array)
            if array.dtype == object:
                raise ValueError(f"{path}: array {name!r} has dtype object")
            info = zipfile.ZipInfo(f"{name}.npy", date_time=FIXED_DATE)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3
            info.external_attr = 0o100644 << 16
            zf.writestr(info, npy_bytes(array))


def load_npz(path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}
