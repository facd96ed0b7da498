"""vlad on the other side of the rings: the lockstep eval config (the synchronous trigger),
starting the daemon, asking it for its flight recording, stopping it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


RECORD_EVERY_S = 240


class DaemonError(Exception):
    """vlad did not start or stopped; the message names its log."""


def eval_config(bundle: Path, out: Path, tag: str, publish_hz: float, execute_steps: int,
                record_every_s: float = RECORD_EVERY_S) -> dict:
    """The config a LIBERO eval runs vlad with. `trigger: synchronous`: each chunk starts at
    its first row, plays `execute_steps` rows, then holds until an observation captured
    after them has been inferred on (upstream's eval protocol). The real-time limits are
    set far above a simulated step (0.2-0.7 s on a 2-core CPU, 11 s for the first, when
    numba compiles): the robot steps the simulation once per published row in lockstep and
    the daemon must not take that for a silent robot. `publish_hz` only paces the rows."""
    period_ms = int(1000 / publish_hz) + 1
    return {
        "qnn": {"lib_dir": "/opt/qairt/lib/x86_64-linux-clang", "backend_lib": "libQnnHtp.so",
                "system_lib": "libQnnSystem.so", "log_level": "warn"},
        "bundle": {"path": str(bundle) if str(bundle).startswith("/") else str(Path(bundle).resolve())},
        "rings": {"observation_path": f"/dev/shm/vla-libero-{tag}-obs", "action_path": f"/dev/shm/vla-libero-{tag}-act",
                  "action_slots": 256},
        "control": {"publish_hz": publish_hz, "max_observation_age_ms": 30000, "max_chunk_age_ms": 60000,
                    "hold_after_chunk_end_ms": 0, "action_valid_ms": max(30000, period_ms),
                    "writer_heartbeat_timeout_ms": max(30000, 2 * period_ms), "merge": "skip",
                    "trigger": "synchronous", "execute_steps": execute_steps},
        "realtime": {"publisher_priority": 0, "inference_priority": 0, "mlockall": False},
        "systemd": {"notify": False, "watchdog": False},
        "ota": {"root": str(out / "ota"), "trusted_keys": [], "trial_inferences": 1000000, "max_trial_starts": 100},
        "log": {"level": "info"},
        # The tool asks for a recording every `record_every_s` and at the end of each
        # episode; each covers twice that, and the chunks kept bound the memory (128 x two
        # 256 x 256 frames: 50 MB).
        "recorder": {"directory": str(out / "recordings"), "history_s": min(600, max(60, 2 * record_every_s)),
                     "frames": "full",
                     "max_chunks": 128, "max_mb": 100000, "on_fault": True, "hold_limit_ms": 0},
    }


def vlad_binary(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    # The newer build: a stale one may not know the config's fields.
    found = [p for p in (REPO / "target" / prof / "vlad" for prof in ("release", "debug")) if p.exists()]
    if found:
        return max(found, key=lambda p: p.stat().st_mtime)
    raise DaemonError("no vlad binary: build it (cargo build --release -p vlad) or pass --vlad")


def vlad_env() -> dict:
    """The environment vlad runs in here: VLA_QNN_LIB_DIR from build/qnn-lib-dir when unset."""
    env = dict(os.environ)
    if not env.get("VLA_QNN_LIB_DIR"):
        qnn = REPO / "build" / "qnn-lib-dir"
        if qnn.exists():
            env["VLA_QNN_LIB_DIR"] = qnn.read_text().strip()
    return env


class Daemon:
    """One `vlad run` for the episodes; its log is out/vlad.log."""

    def __init__(self, vlad: Path, config: dict, out: Path):
        self.vlad = vlad
        self.config = config
        self.out = out
        self.config_path = out / "vlad-config.json"
        self.config_path.write_text(json.dumps(config, indent=1))
        self.log_path = out / "vlad.log"
        self._log = self.log_path.open("wb")
        env = vlad_env()
        # Default dispositions for the signals vlad relies on, whatever was inherited (nohup).
        reset = lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGHUP, signal.SIGUSR1)]  # noqa: E731
        self.proc = subprocess.Popen([str(vlad), "run", "--config", str(self.config_path)], env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=reset)

    @property
    def obs_path(self) -> str:
        return self.config["rings"]["observation_path"]

    @property
    def act_path(self) -> str:
        return self.config["rings"]["action_path"]

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(empty log)"]
            raise DaemonError(f"vlad exited with {code}: {tail[0]} (log {self.log_path})")

    def record(self, timeout_s: float = 120) -> Path:
        """SIGUSR1: the daemon writes its recording (the last history_s); returns the file."""
        rec = Path(self.config["recorder"]["directory"])
        before = set(rec.glob("*.mcap")) if rec.exists() else set()
        self.proc.send_signal(signal.SIGUSR1)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            new = set(rec.glob("*.mcap")) - before
            if new:
                return max(new, key=lambda p: p.stat().st_mtime)
            self.check_alive()
            time.sleep(0.2)
        raise DaemonError(f"vlad wrote no recording in {timeout_s} s after SIGUSR1 (log {self.log_path})")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        for p in (self.obs_path, self.act_path):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        return self.proc.returncode


class BoardDaemon(Daemon):
    """`vlad run` on another machine reached by `ssh` (a command prefix, e.g. `ssh root@board`):
    the config written there, vlad started there (its output in out/vlad.log), signalled
    there, its recordings copied back. `board_dir` holds the config and the recordings; the
    bundle path in the config is the board's."""

    def __init__(self, ssh: str, vlad: str, config: dict, out: Path, board_dir: str, qnn_lib_dir: str | None):
        import shlex
        self.ssh = shlex.split(ssh)
        self.board_dir = board_dir
        self.config = dict(config, recorder=dict(config["recorder"], directory=f"{board_dir}/recordings"),
                           ota=dict(config["ota"], root=f"{board_dir}/ota"))
        self.out = out
        self.config_path = out / "vlad-config.json"
        self.config_path.write_text(json.dumps(self.config, indent=1))
        self._run(f"mkdir -p {shlex.quote(board_dir)} && cat > {shlex.quote(board_dir)}/vlad-config.json",
                  stdin=self.config_path.read_bytes())
        self.log_path = out / "vlad.log"
        self._log = self.log_path.open("wb")
        env = f"VLA_QNN_LIB_DIR={shlex.quote(qnn_lib_dir)} " if qnn_lib_dir else ""
        # The remote shell prints its pid and becomes vlad: signals go to that pid (a
        # dropped ssh session would send SIGHUP, which vlad takes as "reload").
        self.proc = subprocess.Popen(self.ssh + [f"echo $$; exec env {env}{shlex.quote(vlad)} run --config "
                                                 f"{shlex.quote(board_dir)}/vlad-config.json 2>&1"],
                                     stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            raise DaemonError(f"vlad did not start on the board: {line.decode(errors='replace') or 'no output'} "
                              f"(log {self.log_path})")
        self.pid = int(line)
        import threading
        threading.Thread(target=self._copy_log, daemon=True).start()

    def _copy_log(self) -> None:
        for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
            self._log.write(chunk)
            self._log.flush()

    def _run(self, command: str, stdin: bytes | None = None) -> bytes:
        r = subprocess.run(self.ssh + [command], input=stdin, capture_output=True, timeout=120)
        if r.returncode != 0:
            raise DaemonError(f"on the board, `{command}` failed: {r.stderr.decode(errors='replace').strip()}")
        return r.stdout

    def record(self, timeout_s: float = 120) -> Path:
        d = f"{self.board_dir}/recordings"
        before = set(self._run(f"ls {d} 2>/dev/null || true").split())
        self._run(f"kill -USR1 {self.pid}")
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            new = sorted(n for n in set(self._run(f"ls {d} 2>/dev/null || true").split()) - before
                         if n.endswith(b".mcap") and not n.startswith(b"."))
            if new:
                name = new[-1].decode()
                local = self.out / "recordings" / name
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_bytes(self._run(f"cat {d}/{name}"))
                return local
            self.check_alive()
            time.sleep(0.5)
        raise DaemonError(f"vlad on the board wrote no recording in {timeout_s} s after SIGUSR1")

    def stop(self) -> int:
        if self.proc.poll() is None:
            try:
                self._run(f"kill -TERM {self.pid}")
                self.proc.wait(timeout=120)
            except (DaemonError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        try:
            self._run(f"rm -f {self.config['rings']['observation_path']} {self.config['rings']['action_path']}")
        except DaemonError:
            pass
        return self.proc.returncode
