"""The LIBERO side: suites and tasks (read from the installed LIBERO package), the simulated env (robosuite through LIBERO's
OffScreenRenderEnv, rendered headless), and what the robot reads off it each step: the raw
camera frames (as robosuite renders them: upside down) and the raw robot state."""

from __future__ import annotations

import io
import os
import pathlib
import pickle
import sys
from dataclasses import dataclass

import numpy as np

# Cameras in the order the policies take them (upstream's `get_libero_image`: agent view,
# then the wrist).
CAMERAS = ("agentview_image", "robot0_eye_in_hand_image")


class TaskError(Exception):
    """A suite or task that does not exist; the message lists what does."""


# LIBERO's suites as its benchmark module defines them (libero/libero/benchmark/__init__.py):
# each suite's tasks in the order of `libero_suite_task_map`, task order 0 (the identity,
# what both upstream evals use), the language from the bddl file name, the init states in
# `<name>.pruned_init`. Read here without importing that module, which imports torch for
# `torch.load` alone (the init files hold numpy arrays only; `_load_init_states`).
SUITE_NAMES = ("libero_spatial", "libero_object", "libero_goal", "libero_90", "libero_10")


def _libero():
    os.environ.setdefault("MUJOCO_GL", "egl")
    # The venv's LIBERO config (scripts/setup_libero.sh); without one, importing libero asks on stdin.
    os.environ.setdefault("LIBERO_CONFIG_PATH", str(pathlib.Path(sys.prefix) / "libero-config"))
    import libero.libero as lib
    return lib


def _task_map() -> dict:
    import importlib.util
    path = pathlib.Path(_libero().__file__).parent / "benchmark" / "libero_suite_task_map.py"
    spec = importlib.util.spec_from_file_location("libero_suite_task_map", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.libero_task_map


def language_of(name: str) -> str:
    """LIBERO's `grab_language_from_filename`: the words after the scene for LIBERO-100's
    capitalised names, else the whole name."""
    if name[0].isupper():
        name = name[name.find("SCENE") + (8 if "SCENE10" in name else 7):]
    return " ".join(name.split("_"))


def suites() -> list[str]:
    return sorted(SUITE_NAMES)


def task_names(suite_name: str) -> list[str]:
    if suite_name not in SUITE_NAMES:
        raise TaskError(f"LIBERO suite {suite_name!r} does not exist; suites: {', '.join(suites())}")
    return list(_task_map()[suite_name])


class _UnpickleNumpy(pickle.Unpickler):
    """The pickle of a LIBERO init file: numpy arrays and nothing else is let through."""
    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"),
               ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"init states: {module}.{name} is not a numpy array part")
        return super().find_class(module, name)


def _load_init_states(path: pathlib.Path) -> np.ndarray:
    """What `torch.load(path, weights_only=False)` returns for a LIBERO init file (a torch
    zip archive whose pickle holds one numpy array): that array."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return np.asarray(_UnpickleNumpy(io.BytesIO(z.read(name))).load())


@dataclass(frozen=True)
class Task:
    suite: str
    index: int
    name: str
    language: str
    bddl_file: pathlib.Path
    init_file: pathlib.Path


def task(suite_name: str, which: str | int) -> Task:
    """A task by index or by name (its bddl name or its language); an unknown one is refused
    with the suite's task list."""
    names = task_names(suite_name)
    langs = [language_of(n) for n in names]
    index = None
    if isinstance(which, int) or (isinstance(which, str) and which.isdigit()):
        index = int(which) if 0 <= int(which) < len(names) else None
    elif which in names:
        index = names.index(which)
    elif which in langs:
        index = langs.index(which)
    if index is None:
        listing = "; ".join(f"{i}: {n}" for i, n in enumerate(names))
        raise TaskError(f"LIBERO task {which!r} is not in suite {suite_name} ({len(names)} tasks: {listing})")
    lib = _libero()
    name = names[index]
    return Task(suite_name, index, name, langs[index],
                pathlib.Path(lib.get_libero_path("bddl_files")) / suite_name / f"{name}.bddl",
                pathlib.Path(lib.get_libero_path("init_states")) / suite_name / f"{name}.pruned_init")


def init_states(t: Task) -> np.ndarray:
    return _load_init_states(t.init_file)


class Sim:
    """One LIBERO task's env at a render size (height x width, both cameras). Every action
    it hands `env.step` is kept (`actions`): the checks count the no-op steps from what the
    env received, not from the robot's intent."""

    def __init__(self, t: Task, height: int, width: int, seed: int | None = None):
        from libero.libero.envs import OffScreenRenderEnv
        self.task = t
        self.env = OffScreenRenderEnv(bddl_file_name=str(t.bddl_file), camera_heights=height, camera_widths=width)
        if seed is not None:
            # Upstream Fast-WAM's get_libero_env seeds the env once per task (object
            # placement depends on it even with a stored init state).
            self.env.seed(seed)
        self.obs: dict | None = None
        self.actions: list = []

    def reset(self, init_state: np.ndarray, seed: int | None = None) -> dict:
        """`seed`: LeRobot's LiberoEnv.reset seeds the env before every reset."""
        if seed is not None:
            self.env.seed(seed)
        self.env.reset()
        self.obs = self.env.set_init_state(init_state)
        self.actions = []
        return self.obs

    def step(self, action) -> tuple[dict, bool]:
        """One env step; `done` is LIBERO's success."""
        a = np.asarray(action, dtype=np.float64)
        self.actions.append(a.copy())
        self.obs, _reward, done, _info = self.env.step(a.tolist())
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
