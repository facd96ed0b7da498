"""MolmoAct2 on its upstream stack (LeRobot's hf-libero, MuJoCo 3.8.1; the molmoact2 venv):
a short episode of the tiny MolmoAct2 bundle through vlad on the emulator with every
live-path check (the faults that break the live path run on the Fast-WAM stack, whose checks
are the same code)."""

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))

from vla_libero import checks, conventions, recording  # noqa: E402


def tool(*args, timeout=900):
    env = dict(os.environ, PYTHONPATH=str(REPO / "tools"), MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    return subprocess.run([sys.executable, "-m", "vla_libero", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_molmoact2_episode_gets_lerobots_processed_frames_and_state(tmp_path):
    """MolmoAct2 is evaluated through LeRobot's LIBERO env: its bundle takes the frames
    flipped and the 8-value state as LeRobot's processor builds them, so the robot does
    that processing; 50 no-op steps (molmoact2.mdx); 10 rows of a chunk; the env seeded with
    1000 + episode at its reset."""
    assert version("mujoco") == "3.8.1" and version("hf-libero") == "0.1.4"
    r = tool("demo", "--policy", "molmoact2", "--out", str(tmp_path))
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    report = json.loads((tmp_path / "episode" / "report.json").read_text())
    assert report["checks_passed"], "\n".join(report["checks"])
    names = " ".join(report["checks"])
    assert "ring frames = LeRobot's flipped image, image2" in names and "quat2axisangle" in names
    assert "PASS vlad run-once on the recorded observation = the recorded chunk" in names
    assert "PASS vlad's vision input (its own Rust pipeline) = the numpy reference's pixel_values" in names
    assert report["steps"] == 20 and report["chunks"] == 2 and report["noop_steps"] == 50
    assert report["env_seed"] == {"at_creation": None, "at_reset": 1000}
    # Frames written as rendered (unflipped) would fail the orientation check.
    conv = conventions.from_bundle(conventions.MOLMOACT2_FIXTURE)
    rec = recording.read_all(sorted((tmp_path / "episode").glob("recording-*.mcap")))
    log = dict(np.load(tmp_path / "episode" / "robot.npz"))
    assert all(c.ok for c in checks.run(log, rec, conv, 0))
    unflipped = dict(log, point_rendered=log["point_frames"])
    assert [c.name for c in checks.run(unflipped, rec, conv, 0) if not c.ok] == \
        ["orientation: ring frames = LeRobot's flipped image, image2 (vlad does not turn them)"]



