#!/usr/bin/env python3
"""Writes golden/robosuite/quat2axisangle.npz (+ .json): robosuite's own
`robosuite.utils.transform_utils.quat2axisangle` on the quaternions vlad's
`fastwam.chain.state_input: "eef_pos_quat_gripper"` must convert the same way.

Runs in build/robosuite-venv (scripts/setup_robosuite.sh: robosuite 1.4.0, LIBERO's pin,
installed with its dependencies and imported the ordinary way; nothing re-implemented here).
Upstream Fast-WAM's eval calls its copy of this function (`experiments/libero/libero_utils.py`,
"Copied from robosuite") in `_extract_sim_state` and casts the state to float32.

Every input quaternion is float32 (what the observation ring carries), passed to robosuite as
its exact float64 value (what MuJoCo would hand it) in a copy, since robosuite clips w in
place. Stored: `quat` [N,4] f32 (x, y, z, w), `axisangle_f64` [N,3] (robosuite's output),
`axisangle` [N,3] f32 (`.astype(np.float32)`, what upstream's state carries), and the case
names in the .json.

    scripts/setup_robosuite.sh
    build/robosuite-venv/bin/python -m vla_goldens.robosuite_quat_goldens
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
from vla_host.det_npz import save_npz

import robosuite  # noqa: E402
from robosuite.utils import transform_utils  # noqa: E402

OUT = ROOT / "golden" / "robosuite"


def axis_angle_quat(axis, angle: float) -> np.ndarray:
    axis = np.asarray(axis, np.float64)
    axis = axis / np.linalg.norm(axis)
    return np.concatenate([axis * math.sin(angle / 2), [math.cos(angle / 2)]])


def cases() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(20250)
    c = []
    q = axis_angle_quat([0.3, -0.5, 0.8], 1.2)
    c += [("generic", q), ("generic_negated", -q)]
    q = axis_angle_quat([-0.2, 0.9, 0.1], 2.7)
    c += [("large_angle", q), ("large_angle_negated", -q)]
    c += [("identity", np.array([0.0, 0.0, 0.0, 1.0])), ("identity_negated", np.array([0.0, 0.0, 0.0, -1.0]))]
    # Near 0: the largest float32 below 1 as w (den > 0, so no zero branch), and 1e-3 rad.
    w = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
    c += [("w_just_below_1", np.array([3e-4, -2e-4, 1e-4, w])),
          ("angle_1e-3", axis_angle_quat([0.6, 0.0, -0.8], 1e-3)),
          ("angle_1e-3_negated", -axis_angle_quat([0.6, 0.0, -0.8], 1e-3)),
          ("angle_1e-6", axis_angle_quat([0.0, 1.0, 0.0], 1e-6))]
    # Near pi: w = 0 exactly (angle pi), just inside and just past pi, and their negations.
    for name, angle in (("angle_pi", math.pi), ("angle_pi_minus_1e-3", math.pi - 1e-3),
                        ("angle_pi_plus_1e-3", math.pi + 1e-3)):
        q = axis_angle_quat([0.1, 0.7, -0.7], angle)
        c += [(name, q), (name + "_negated", -q)]
    c += [("w_zero", np.array([0.0, 0.6, 0.8, 0.0]))]
    # Unnormalized: robosuite does not normalize (the axis keeps the input's length).
    c += [("unnormalized_long", 2.5 * axis_angle_quat([1.0, 2.0, -0.5], 0.9)),
          ("unnormalized_short", 0.4 * axis_angle_quat([1.0, 2.0, -0.5], 0.9)),
          ("unnormalized_w_above_1", np.array([0.4, -0.3, 0.2, 1.3])),
          ("w_slightly_above_1", np.array([1e-4, 2e-4, -1e-4, float(np.nextafter(np.float32(1.0), np.float32(2.0)))])),
          ("w_slightly_below_minus_1", np.array([1e-4, 2e-4, -1e-4, float(np.nextafter(np.float32(-1.0), np.float32(-2.0)))])),
          ("zero_quaternion", np.zeros(4)),
          # Finite input, float64 output past float32's range: inf after the cast.
          ("overflows_float32", np.array([3e38, 0.0, 0.0, 0.5]))]
    for i in range(24):
        q = rng.normal(size=4)
        c.append((f"random_{i}", q / np.linalg.norm(q)))
    return [(name, np.asarray(q, np.float64).astype(np.float32)) for name, q in c]


def main():
    names, quats, out64 = [], [], []
    for name, q32 in cases():
        arg = q32.astype(np.float64)  # robosuite clips w in place: give it a copy
        with np.errstate(over="ignore"):
            r = np.asarray(transform_utils.quat2axisangle(arg), np.float64)
        names.append(name)
        quats.append(q32)
        out64.append(r)
    quat = np.stack(quats).astype(np.float32)
    axisangle_f64 = np.stack(out64)
    with np.errstate(over="ignore"):
        axisangle = axisangle_f64.astype(np.float32)
    OUT.mkdir(parents=True, exist_ok=True)
    save_npz(OUT / "quat2axisangle.npz", {"quat": quat, "axisangle_f64": axisangle_f64, "axisangle": axisangle})
    meta = {
        "function": "robosuite.utils.transform_utils.quat2axisangle",
        "robosuite": robosuite.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "script": "tools/goldens/vla_goldens/robosuite_quat_goldens.py",
        "cases": names,
    }
    (OUT / "quat2axisangle.json").write_text(json.dumps(meta, indent=1) + "\n")
    for name, q, r in zip(names, quat, axisangle):
        print(f"{name:28s} {np.array2string(q, precision=6):48s} -> {np.array2string(r, precision=6)}")


if __name__ == "__main__":
    main()
