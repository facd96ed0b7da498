#!/usr/bin/env python3
"""Per-context goldens for more observations than the release's one, so that the bring-up
kit measures each context output over N observations before it proposes gates.

    observation_goldens.py --bundle DIR --onnx DIR --out OBS_DIR OBS.npz...

Each OBS.npz is an observation as `vlad run-once --obs` reads it (`frames`, `state`,
`instruction_id`, `seed`; a recorded one, or the release's end-to-end observation). The
bundle's reference (its release's `onnx/` graphs, `DIR/<c>.onnx` or `DIR/<c>/<c>.onnx`, on
ONNX Runtime's CPU in fp32) runs through tools/vla_host/vla_host/reference.py's host glue on it, and the
boundary tensors of that run are written as OBS_DIR/<stem>/<the bundle's golden paths>
(`golden/<c>_io.npz`, `golden/end_to_end.npz`), the layout the release's own goldens have.
`scripts/bringup/run.sh --observations OBS_DIR` runs `vlad parity` on the target once per
observation; report.py takes the minimum over all of them.
"""

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

from vla_host import reference as ref
from vla_host.det_npz import load_npz, save_npz

END_TO_END_ORDER = ["frames", "state", "instruction_id", "seed", "actions", "pixel_values", "hidden_states",
                    "attention_bias", "k_ctx", "v_ctx", "noise", "candidates", "keystone_choice", "image", "latents",
                    "context"]
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def graph_path(onnx_dir: Path, component: str) -> Path:
    for p in (onnx_dir / f"{component}.onnx", onnx_dir / component / f"{component}.onnx"):
        if p.is_file():
            return p
    raise SystemExit(f"observation_goldens: {onnx_dir}: no {component}.onnx or {component}/{component}.onnx")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--onnx", type=Path, required=True, help="the bundle's reference graphs")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("observations", type=Path, nargs="+")
    a = ap.parse_args(argv)
    manifest = json.loads((a.bundle / "bundle.json").read_text())
    runners = {c: ref.OrtCpuRunner(graph_path(a.onnx, c)) for c in manifest["components"]}
    for obs_path in a.observations:
        if not NAME.match(obs_path.stem):
            print(f"observation_goldens: {obs_path}: name it with letters, digits, _ . - only", file=sys.stderr)
            return 2
        obs = load_npz(obs_path)
        missing = [k for k in ("seed",) if k not in obs]
        if missing:
            print(f"observation_goldens: {obs_path}: no {missing[0]} array", file=sys.stderr)
            return 2
        result, io = ref.run_bundle(a.bundle, runners, obs)
        root = a.out / obs_path.stem
        for component, (feeds, outs) in io.items():
            path = root / manifest["components"][component]["golden"]
            path.parent.mkdir(parents=True, exist_ok=True)
            save_npz(path, {**feeds, **outs})
        arrays = {**obs, **result}
        save_npz(root / manifest["end_to_end"], {k: np.asarray(arrays[k]) for k in END_TO_END_ORDER if k in arrays})
        print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
