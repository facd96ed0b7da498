"""The robot's ring ends on another machine (a board): the same interface as `ring.py`'s,
through `vla-ring-bridge` (runtime/ring-c, built by scripts/setup_libero.sh) running next
to the rings and spoken to over its stdin/stdout, e.g. `ssh root@board
/tmp/vla-ring-bridge`. Every request's round trip is timed, so the latency the bridge adds
is reported apart from the policy's."""

from __future__ import annotations

import shlex
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .ring import ActionStep, Geometry, RingError, READ_OK

_STEP = struct.Struct("=6Q2I")


def local_bridge() -> Path:
    return Path(sys.prefix) / "lib" / "vla-ring-bridge"


class Bridge:
    """One `vla-ring-bridge` process: `command` runs it (its ring arguments are appended)."""

    def __init__(self, command: str, obs_path: str, act_path: str, g: Geometry):
        self.g = g
        args = shlex.split(command) + [obs_path, act_path] + [str(v) for v in (
            g.cameras, g.height, g.width, g.state_dims, g.action_dims, g.chunk_len)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     bufsize=0)
        self.rtt_s: dict[str, list] = {"publish": [], "read": [], "poll": [], "heartbeat": []}

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.proc.stdout.read(n - len(data))
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace").strip().splitlines()
                raise RingError(f"ring bridge {self.proc.args[0]} stopped: {err[-1] if err else 'no message'}")
            data += chunk
        return data

    def _msg(self) -> str:
        (n,) = struct.unpack("=I", self._read(4))
        return self._read(n).decode(errors="replace")

    def request(self, kind: str, payload: bytes, reply: int) -> bytes:
        t0 = time.monotonic()
        try:
            self.proc.stdin.write(payload)
        except BrokenPipeError:
            self._read(1 << 30)
        data = self._read(reply)
        rtt = time.monotonic() - t0
        self.rtt_s[kind].append(rtt)
        return data

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RemoteObservationWriter:
    def __init__(self, bridge: Bridge):
        self.bridge = bridge
        self.last_capture_ns = 0

    def publish(self, state: np.ndarray, frames: np.ndarray, instruction_id: int, seed: int = 0,
                capture_ns: int | None = None) -> int:
        """As ObservationWriter.publish; the capture time is stamped on the rings' machine."""
        state = np.ascontiguousarray(state, dtype=np.float32).reshape(-1)
        frames = np.ascontiguousarray(frames, dtype=np.uint8).reshape(-1)
        head = b"O" + struct.pack("=IQQQ", instruction_id, seed, state.size, frames.size)
        seq, capture = struct.unpack("=QQ", self.bridge.request("publish", head + state.tobytes() + frames.tobytes(),
                                                                16))
        if seq == 0:
            raise RingError(self.bridge._msg())
        self.last_capture_ns = capture
        return seq

    def heartbeat(self) -> None:
        self.bridge.request("heartbeat", b"H", 1)

    def close(self) -> None:
        self.bridge.close()


class RemoteActionReader:
    def __init__(self, bridge: Bridge):
        self.bridge = bridge
        self.last_read_ns = 0
        self._published = 0
        self._open = False

    def _poll(self) -> int:
        state, published = struct.unpack("=BQ", self.bridge.request("poll", b"P", 9))
        if state == 2:
            raise RingError(self.bridge._msg())
        self._open = state == 1
        return published

    def try_open(self) -> bool:
        self._poll()
        return self._open

    def published(self) -> int:
        return self._poll()

    def read(self, seq: int):
        data = self.bridge.request("read", b"R" + struct.pack("=Q", seq),
                                   12 + _STEP.size + 4 * self.bridge.g.action_dims)
        code, now = struct.unpack("=iQ", data[:12])
        self.last_read_ns = now
        if code != READ_OK:
            return code, None
        s, _epoch, source, made, valid, chunk, index, status = _STEP.unpack(data[12:12 + _STEP.size])
        values = np.frombuffer(data[12 + _STEP.size:], np.float32).copy()
        return code, ActionStep(s, source, made, valid, chunk, index, status, values)

    def close(self) -> None:
        self.bridge.close()
