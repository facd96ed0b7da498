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

from vla_libero import checks, conventions, recording  # noqa: E402


def tool(*args, timeout=900):
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
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
    assert "PASS vlad's vision input (its own Rust pipeline) = LeRobot's env + MolmoAct2 processor pixel_values" \
        in names
    assert "PASS state vlad took = LeRobot's LiberoProcessorStep observation.state" in names
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





def test_lerobots_own_processing_of_the_first_observation_fails_a_flipped_frame_a_wrong_resize_and_state(tmp_path):
    """The upstream golden (LeRobot's env and MolmoAct2 processor steps on the test episode's
    first observation, tools/goldens/vla_goldens/upstream_libero_molmoact2.py) against what vlad makes of a
    wrong input: vlad's own pipeline (run-once) on the taken frames with camera 0 upside
    down, a nearest-neighbour resize of the right frames, the state with the quaternion's
    first three values in place of the axis-angle. Each fails its check; the right ones pass."""
    g = np.load(checks.MOLMOACT2_GOLDEN)
    conv = conventions.from_bundle(conventions.MOLMOACT2_FIXTURE)
    chain = conv.chain
    frames = g["processor_images"]  # LeRobot's flipped frames: what the ring carries
    log = {"point_rendered": g["env_rendered"][None], "point_env_state": g["env_state"][None],
           "point_frames": frames[None]}
    vlads = [p for p in (REPO / "target" / prof / "vlad" for prof in ("release", "debug")) if p.exists()]
    assert vlads, "no vlad binary (cargo build -p vlad)"
    vlad = max(vlads, key=lambda p: p.stat().st_mtime)
    env = dict(os.environ)
    env.setdefault("VLA_QNN_LIB_DIR", (REPO / "build" / "qnn-lib-dir").read_text().strip())
    state = g["observation_state"]

    def inference(f):
        return recording.Inference(obs_seq=1, state=state, frames={0: f[0], 1: f[1]}, instruction_id=0, seed=7,
                                   ok=True)

    def pixel_check(pv, st=state):
        return checks.molmoact2_inputs(log, 0, st, pv, chain)

    right = checks._run_once(vlad, conventions.MOLMOACT2_FIXTURE, inference(frames), tmp_path, "right", env)
    assert [c.ok for c in pixel_check(right["pixel_values"])] == [True, True]
    flipped = frames.copy()
    flipped[0] = flipped[0][::-1]
    wrong = checks._run_once(vlad, conventions.MOLMOACT2_FIXTURE, inference(flipped), tmp_path, "flipped", env)
    assert [c.ok for c in pixel_check(wrong["pixel_values"])] == [False, True]
    # Nearest-neighbour instead of bilinear (the same patch layout and scaling).
    crop, patch = chain["crop_size"], chain["patch_size"]
    ys = (np.arange(crop) * frames.shape[1] / crop).astype(int)
    xs = (np.arange(crop) * frames.shape[2] / crop).astype(int)
    near = frames[:, ys][:, :, xs].astype(np.float32) / 255 * 2 - 1
    grid = crop // patch
    near = near.reshape(2, grid, patch, grid, patch, 3).transpose(0, 1, 3, 2, 4, 5).reshape(-1)
    assert [c.ok for c in pixel_check(near)] == [False, True]
    quat = np.concatenate([g["env_state"][:3], g["env_state"][3:6], g["env_state"][7:9]]).astype(np.float32)
    assert [c.ok for c in pixel_check(right["pixel_values"], quat)] == [True, False]
