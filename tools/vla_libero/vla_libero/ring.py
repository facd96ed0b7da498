"""The robot's ring ends: the observation writer and the action reader, through the ring's
C ABI (runtime/include/vla_ring.h) and the C ring client library (runtime/ring-c), whose
shared object scripts/setup_libero.sh installs into the venv, loaded with ctypes. No layout
lives here."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

STATUS_OK, STATUS_HOLD, STATUS_FAULT = 0, 1, 2
READ_OK, READ_EMPTY, READ_NOT_YET, READ_OVERWRITTEN = 0, -1, -2, -3
READ_RESTARTING, READ_INCOMPATIBLE = -8, -9
STATUS_NAMES = {STATUS_OK: "ok", STATUS_HOLD: "hold", STATUS_FAULT: "fault"}


class RingError(Exception):
    """A ring refused an operation; the message names the ring and the field."""


class _Geometry(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("cameras", "height", "width", "channels", "state_dims", "action_dims", "chunk_len", "reserved")]


class _Step(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_uint64), ("writer_epoch", ctypes.c_uint64), ("source_obs_seq", ctypes.c_uint64),
                ("made_time_ns", ctypes.c_uint64), ("valid_until_ns", ctypes.c_uint64), ("chunk_id", ctypes.c_uint64),
                ("step_index", ctypes.c_uint32), ("status", ctypes.c_uint32)]


@dataclass(frozen=True)
class Geometry:
    """The robot link's shape, as both sides configure it (vla_ring_geometry)."""
    cameras: int
    height: int
    width: int
    state_dims: int
    action_dims: int
    chunk_len: int
    channels: int = 3

    def c(self) -> _Geometry:
        return _Geometry(self.cameras, self.height, self.width, self.channels, self.state_dims, self.action_dims,
                         self.chunk_len, 0)


@dataclass(frozen=True)
class ActionStep:
    seq: int
    source_obs_seq: int
    made_time_ns: int
    valid_until_ns: int
    chunk_id: int
    step_index: int
    status: int
    values: np.ndarray


def shim_path() -> Path:
    """Where scripts/setup_libero.sh put the shared object (VLA_RING_SHIM overrides)."""
    env = os.environ.get("VLA_RING_SHIM")
    if env:
        return Path(env)
    import sys
    return Path(sys.prefix) / "lib" / "libvla_ring_client.so"


_LIB = None


def _lib():
    global _LIB
    if _LIB is None:
        path = shim_path()
        if not path.exists():
            raise RingError(f"ring shim {path} is missing: run scripts/setup_libero.sh")
        lib = ctypes.CDLL(str(path))
        vp, u64, u32, cp, sz = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t
        lib.vlr_now_ns.restype = u64
        lib.vlr_writer_open.restype = vp
        lib.vlr_writer_open.argtypes = [cp, ctypes.POINTER(_Geometry), u32, cp, sz]
        lib.vlr_writer_publish.restype = u64
        lib.vlr_writer_publish.argtypes = [vp, u32, u64, u64, ctypes.POINTER(ctypes.c_float), u64,
                                           ctypes.POINTER(ctypes.c_uint8), u64, cp, sz]
        lib.vlr_writer_heartbeat.argtypes = [vp]
        lib.vlr_writer_close.argtypes = [vp]
        lib.vlr_reader_open.restype = vp
        lib.vlr_reader_open.argtypes = [cp, ctypes.POINTER(_Geometry), ctypes.POINTER(ctypes.c_int), cp, sz]
        lib.vlr_reader_published.restype = u64
        lib.vlr_reader_published.argtypes = [vp]
        lib.vlr_reader_read_seq.restype = ctypes.c_int
        lib.vlr_reader_read_seq.argtypes = [vp, u64, ctypes.POINTER(_Step), ctypes.POINTER(ctypes.c_float)]
        lib.vlr_reader_close.argtypes = [vp]
        _LIB = lib
    return _LIB


def now_ns() -> int:
    """CLOCK_MONOTONIC, the clock the rings' times are on."""
    return _lib().vlr_now_ns()


class ObservationWriter:
    """The observation ring's one writer (the robot)."""

    def __init__(self, path: str | Path, geometry: Geometry, slots: int = 8):
        self.geometry = geometry
        err = ctypes.create_string_buffer(512)
        self._w = _lib().vlr_writer_open(str(path).encode(), ctypes.byref(geometry.c()), slots, err, len(err))
        if not self._w:
            raise RingError(err.value.decode())

    def publish(self, state: np.ndarray, frames: np.ndarray, instruction_id: int, seed: int = 0,
                capture_ns: int | None = None) -> int:
        """Writes one observation (state f32, frames uint8 camera-major HWC); returns its seq.
        A state or frame size other than the ring's geometry is refused by the ring end."""
        state = np.ascontiguousarray(state, dtype=np.float32).reshape(-1)
        frames = np.ascontiguousarray(frames, dtype=np.uint8).reshape(-1)
        err = ctypes.create_string_buffer(512)
        self.last_capture_ns = now_ns() if capture_ns is None else capture_ns
        seq = _lib().vlr_writer_publish(
            self._w, instruction_id, seed, self.last_capture_ns,
            state.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), state.size,
            frames.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), frames.size, err, len(err))
        if seq == 0:
            raise RingError(err.value.decode())
        return seq

    def heartbeat(self) -> None:
        _lib().vlr_writer_heartbeat(self._w)

    def close(self) -> None:
        if self._w:
            _lib().vlr_writer_close(self._w)
            self._w = None


class ActionReader:
    """A reader of the action ring (the robot's side), reading every step by seq."""

    def __init__(self, path: str | Path, geometry: Geometry):
        self.geometry = geometry
        self.path = str(path)
        self._r = None
        self._values = (ctypes.c_float * geometry.action_dims)()

    def try_open(self) -> bool:
        """Opens the ring if it is there; False while it is not (yet). A ring of another
        geometry is refused with the field at fault."""
        if self._r:
            return True
        err = ctypes.create_string_buffer(512)
        retry = ctypes.c_int(0)
        self._r = _lib().vlr_reader_open(self.path.encode(), ctypes.byref(self.geometry.c()), ctypes.byref(retry),
                                         err, len(err))
        if self._r:
            return True
        if retry.value:
            return False
        raise RingError(err.value.decode())

    def published(self) -> int:
        return _lib().vlr_reader_published(self._r) if self._r else 0

    def read(self, seq: int) -> tuple[int, ActionStep | None]:
        """Step `seq`: (READ_OK, step) or (a READ_* code, None)."""
        step = _Step()
        code = _lib().vlr_reader_read_seq(self._r, seq, ctypes.byref(step), self._values)
        self.last_read_ns = now_ns()
        if code != READ_OK:
            if code == READ_INCOMPATIBLE:
                raise RingError(f"action ring {self.path}: a writer restarted it with another layout")
            return code, None
        return code, ActionStep(step.seq, step.source_obs_seq, step.made_time_ns, step.valid_until_ns,
                                step.chunk_id, step.step_index, step.status,
                                np.array(self._values, dtype=np.float32))

    def close(self) -> None:
        if self._r:
            _lib().vlr_reader_close(self._r)
            self._r = None
