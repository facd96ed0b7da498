"""Fixtures for the scripts that exercise the daemon with updates (the soak, the RAUC
check, the power-cut run): the Fast-WAM control timing on the emulator, the daemon's
configuration over an OTA store, and signed policy bundles (a fixture bundle copied under
a new version, packed and signed with vlad, and optionally given an end-to-end golden its
contexts disagree with, so that the bundle is signed and intact and only the daemon's
parity gate can refuse it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from vla_host.det_npz import load_npz, save_npz


# Control timing for the Fast-WAM fixture on the emulator, where it infers in about 0.5 s:
# at 10 Hz its 32-step chunk spans 3.2 s.
FASTWAM_CONTROL = {
    "publish_hz": 10.0,
    "max_observation_age_ms": 1000,
    "max_chunk_age_ms": 4000,
    "hold_after_chunk_end_ms": 200,
    "action_valid_ms": 200,
    "writer_heartbeat_timeout_ms": 500,
}


def daemon_config(base: dict, ota_root: Path, public: str, rings: str, control: dict,
                  trial_inferences: int, max_trial_starts: int = 3) -> dict:
    """`base` (a parsed config/*.json) for a daemon running the OTA store at `ota_root`
    (`bundle.path` its `current` link) with the fleet key `public`, the rings
    /dev/shm/<rings>-obs and -act, the emulator's libraries (VLA_QNN_LIB_DIR), `control`,
    no systemd, log level info."""
    cfg = json.loads(json.dumps(base))
    cfg["qnn"]["lib_dir"] = os.environ["VLA_QNN_LIB_DIR"]
    cfg["bundle"]["path"] = str(ota_root / "current")
    cfg["rings"]["observation_path"] = f"/dev/shm/{rings}-obs"
    cfg["rings"]["action_path"] = f"/dev/shm/{rings}-act"
    cfg["control"] = dict(control)
    cfg["ota"].update(root=str(ota_root), trusted_keys=[public], trial_inferences=trial_inferences,
                      max_trial_starts=max_trial_starts)
    cfg["systemd"] = {"notify": False, "watchdog": False}
    cfg["log"]["level"] = "info"
    return cfg


class FixtureError(Exception):
    """A vlad command that makes a fixture failed (the message has its output)."""


def vlad_cmd(vlad: Path, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(vlad), *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise FixtureError(f"vlad {' '.join(map(str, args))} exited {p.returncode}: "
                           f"{p.stdout}{p.stderr}".strip())
    return p


def hex64(text: str) -> str:
    """The first 64-hex-digit word (a content hash or a public key) in vlad's output."""
    m = re.search(r"\b[0-9a-f]{64}\b", text)
    if not m:
        raise FixtureError(f"no 64-hex value in: {text}")
    return m.group(0)


def signed_policy_bundle(vlad: Path, fixture: Path, out: Path, name: str, version: str,
                         key: Path, tamper: bool = False, bundle_name: str | None = None,
                         expires: int | None = None) -> Path:
    """`fixture` copied to `out/name` as `version` (and `bundle_name` as its bundle.json
    name, if given), packed and signed with `key`. Bundles that a test switches between
    back and forth share a version and differ by name: a device refuses to go below the
    highest version it committed (its version floor). `expires`: the signed expiry (Unix
    seconds) instead of `vlad bundle pack`'s default."""
    d = out / name
    shutil.copytree(fixture, d)
    manifest = json.loads((d / "bundle.json").read_text())
    manifest["version"] = version
    if bundle_name is not None:
        manifest["name"] = bundle_name
    (d / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if tamper:
        p = d / manifest["end_to_end"]
        arrays = load_npz(p)
        arrays["actions"] = (-arrays["actions"] - 0.5).astype(arrays["actions"].dtype)
        save_npz(p, arrays)
    vlad_cmd(vlad, "bundle", "pack", d, *(["--expires", str(expires)] if expires is not None else []))
    vlad_cmd(vlad, "bundle", "sign", d, "--key", key)
    return d
