"""The LIBERO side: suites and tasks, the simulated env (robosuite through LIBERO's
OffScreenRenderEnv, rendered headless), and what the robot reads off it each step: the raw
camera frames (as robosuite renders them: upside down) and the raw robot state."""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

import numpy as np

# Cameras in the order the policies take them (upstream's `get_libero_image`: agent view,
# then the wrist).
CAMERAS = ("agentview_image", "robot0_eye_in_hand_image")


class TaskError(Exception):
    """A suite or task that does not exist; the message lists what does."""


def _benchmark():
    os.environ.setdefault("MUJOCO_GL", "egl")
    from libero.libero import benchmark
    return benchmark


def suites() -> list[str]:
    return sorted(_benchmark().get_benchmark_dict())


def suite(name: str):
    table = _benchmark().get_benchmark_dict()
    if name not in table:
        raise TaskError(f"LIBERO suite {name!r} does not exist; suites: {', '.join(sorted(table))}")
    return table[name]()


@dataclass(frozen=True)
class Task:
    suite: str
    index: int
    name: str
    language: str
    bddl_file: pathlib.Path


def task(suite_name: str, which: str | int) -> Task:
    """A task by index or by name (its bddl name or its language); an unknown one is refused
    with the suite's task list."""
    s = suite(suite_name)
    names = [s.get_task(i).name for i in range(s.n_tasks)]
    langs = [s.get_task(i).language for i in range(s.n_tasks)]
    index = None
    if isinstance(which, int) or (isinstance(which, str) and which.isdigit()):
        index = int(which) if 0 <= int(which) < s.n_tasks else None
    elif which in names:
        index = names.index(which)
    elif which in langs:
        index = langs.index(which)
    if index is None:
        listing = "; ".join(f"{i}: {n}" for i, n in enumerate(names))
        raise TaskError(f"LIBERO task {which!r} is not in suite {suite_name} ({s.n_tasks} tasks: {listing})")
    t = s.get_task(index)
    from libero.libero import get_libero_path
    bddl = pathlib.Path(get_libero_path("bddl_files")) / t.problem_folder / t.bddl_file
    return Task(suite_name, index, t.name, t.language, bddl)


def init_states(t: Task) -> np.ndarray:
    return suite(t.suite).get_task_init_states(t.index)


class Sim:
    """One LIBERO task's env at a render size (height x width, both cameras)."""

    def __init__(self, t: Task, height: int, width: int, seed: int = 0):
        from libero.libero.envs import OffScreenRenderEnv
        self.task = t
        self.env = OffScreenRenderEnv(bddl_file_name=str(t.bddl_file), camera_heights=height, camera_widths=width)
        # Upstream's get_libero_env seeds the env (object placement depends on it even with
        # a stored init state).
        self.env.seed(seed)
        self.obs: dict | None = None

    def reset(self, init_state: np.ndarray) -> dict:
        self.env.reset()
        self.obs = self.env.set_init_state(init_state)
        return self.obs

    def step(self, action) -> tuple[dict, bool]:
        """One env step; `done` is LIBERO's success."""
        self.obs, _reward, done, _info = self.env.step(np.asarray(action, dtype=np.float64).tolist())
        return self.obs, bool(done)

    def close(self) -> None:
        self.env.close()


def raw_frames(obs: dict) -> np.ndarray:
    """The cameras as robosuite renders them (upside down), [cameras, H, W, 3] uint8: what
    the robot writes on the ring (the bundle turns them, `rotate_180`)."""
    return np.stack([np.ascontiguousarray(obs[k]) for k in CAMERAS])


def raw_state(obs: dict) -> np.ndarray:
    """The robot's raw state, 9 values: eef position, eef quaternion (x, y, z, w), gripper
    qpos (the bundle's `state_input: eef_pos_quat_gripper`), in f64 as MuJoCo gives it."""
    return np.concatenate([obs["robot0_eef_pos"], obs["robot0_eef_quat"], obs["robot0_gripper_qpos"]])
