"""A device stand-in on this machine (standard library only): its own OTA store and RAUC
artifact repository under one directory, its own `vlad run` on the HTP emulator, a
`vlad simulate` robot on its own rings, and its own DDI agent (vla_fleet.agent in the fleet
venv) installing through vla_fleet.install and meta-vla's RAUC handlers. Every process's
output goes to a file under the device's directory; `stop` ends only the processes it
started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
HANDLER = REPO / "meta-vla/dynamic-layers/rauc/recipes-vla/vla-rauc/files/vla-rauc-handler"
SYSTEM_CONF_FRAGMENT = REPO / "meta-vla/dynamic-layers/rauc/recipes-core/rauc/files/vla-rauc-system.conf"


class DeviceError(Exception):
    """A device stand-in could not be set up or a command on it failed."""


class Device:
    def __init__(self, name: str, root: Path, vlad: Path, config: dict, compatible: str,
                 keyring: Path, rauc: Path, fleet_python: Path, verdict_wait: int):
        self.name, self.root, self.vlad, self.rauc = name, root, vlad, rauc
        self.fleet_python, self.compatible = fleet_python, compatible
        self.procs: dict[str, subprocess.Popen] = {}
        root.mkdir(parents=True, exist_ok=True)
        self.ota_root = Path(config["ota"]["root"])
        self.rings = [Path(config["rings"]["observation_path"]), Path(config["rings"]["action_path"])]
        self.repo = self.ota_root / "rauc"
        self.config = root / "vlad.json"
        self.config.write_text(json.dumps(config, indent=2) + "\n")
        self.robot_json = root / "robot.json"
        handlers = root / "handlers"
        handlers.mkdir(exist_ok=True)
        for phase in ("pre-install", "post-install"):
            link = handlers / f"rauc-{phase}"
            if not link.is_symlink():
                os.symlink(HANDLER, link)
        fragment = SYSTEM_CONF_FRAGMENT.read_text()
        for device_path, here in (("/var/lib/vla/rauc", str(self.repo)), ("/usr/libexec/vla", str(handlers))):
            if device_path not in fragment:
                raise DeviceError(f"{SYSTEM_CONF_FRAGMENT} no longer names {device_path}")
            fragment = fragment.replace(device_path, here)
        self.system_conf = root / "system.conf"
        self.system_conf.write_text(
            f"[system]\ncompatible={compatible}\nbootloader=noop\n\n[keyring]\npath={keyring}\n\n" + fragment)
        # What the handlers read from /etc/default/vla-rauc on a device.
        self.env = {**os.environ, "VLAD": str(vlad), "VLAD_CONFIG": str(self.config),
                    "VLA_RAUC_WAIT": str(verdict_wait)}

    # ------------------------------------------------------------------ commands

    def vlad_cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([str(self.vlad), *args, "--config", str(self.config)], capture_output=True,
                           text=True, env=self.env)
        if check and p.returncode != 0:
            raise DeviceError(f"{self.name}: vlad {' '.join(args)} exited {p.returncode}: "
                              f"{(p.stdout + p.stderr).strip()}")
        return p

    def flash(self, bundle: Path) -> str:
        """The factory image's policy: installed and activated before the daemon starts."""
        out = self.vlad_cmd("ota", "install", str(bundle)).stdout
        h = next((w for w in out.split() if len(w) == 64 and all(c in "0123456789abcdef" for c in w)), None)
        if h is None:
            raise DeviceError(f"{self.name}: vlad ota install printed no hash: {out}")
        self.vlad_cmd("ota", "activate", h)
        return h

    def current(self) -> str:
        return os.readlink(self.ota_root / "current").rsplit("/", 1)[-1]

    def status(self) -> str:
        return self.vlad_cmd("ota", "status", check=False).stdout

    def bundles(self) -> set[str]:
        d = self.ota_root / "bundles"
        return {p.name for p in d.iterdir()} if d.is_dir() else set()

    # ----------------------------------------------------------------- processes

    def _start(self, key: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        out = open(self.root / f"{key}.out", "ab")
        err = open(self.root / f"{key}.log", "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env or self.env,
                             start_new_session=True)
        out.close()
        err.close()
        self.procs[key] = p
        return p

    def start_daemon(self) -> None:
        self._start("daemon", [str(self.vlad), "run", "--config", str(self.config)])

    def start_robot(self) -> None:
        self._start("robot", [str(self.vlad), "simulate", "--config", str(self.config), "--duration", "86400",
                              "--json", str(self.robot_json)])

    def start_agent(self, server: str, token: Path, sw_version: str, key: str = "agent",
                    retry: float = 2.0, tls: list[str] | None = None, download: Path | None = None,
                    max_download: int | None = None, wrap: list[str] | None = None,
                    env: dict[str, str] | None = None) -> subprocess.Popen:
        """`tls`: the agent's --ca/--cert/--key arguments; `wrap`: a command the agent runs
        under (one that ends by exec'ing its arguments)."""
        install = [str(self.fleet_python), "-m", "vla_fleet.install", "--rauc", str(self.rauc),
                   "--conf", str(self.system_conf), "--work", str(self.root / "rauc-work")]
        limit = [] if max_download is None else ["--max-download", str(max_download)]
        return self._start(key, [*(wrap or []), str(self.fleet_python), "-m", "vla_fleet.agent",
                                 "--server", server, *(tls or []), *limit,
                                 "--target", self.name, "--token-file", str(token),
                                 "--compatible", self.compatible, "--sw-version", sw_version,
                                 "--download", str(download or self.root / "download.raucb"),
                                 "--retry", str(retry), "--", *install], env=env)

    def alive(self, key: str) -> bool:
        p = self.procs.get(key)
        return p is not None and p.poll() is None

    def log(self, key: str) -> str:
        p = self.root / f"{key}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def robot(self) -> dict:
        try:
            return json.loads(self.robot_json.read_text())
        except (OSError, ValueError):
            return {}

    def stop(self, key: str, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        p = self.procs.pop(key, None)
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode

    def stop_all(self) -> None:
        # The agent first (it may be waiting on an install), the robot, then the daemon.
        for key in [k for k in self.procs if k.startswith("agent")] + ["robot", "daemon"]:
            self.stop(key)
        # The rings are this stand-in's own (named per test run): nothing else maps them.
        for ring in self.rings:
            ring.unlink(missing_ok=True)
