#!/usr/bin/env python3
"""The stand-in for the LP-VTP-SD release's vision parity miss: two vision context binaries
that replace the one in golden/bundles/molmoact2-lp-vtp-sd (same weights, same golden).

    .venv/bin/python -m vla_goldens.make_gate_standin

The release's card reports its vision context at cosine 0.99843835 against the PyTorch golden
and blames the grid sampler: `F.grid_sample(align_corners=False, bilinear)` against QNN's
GridSample. The tiny fixture's vision golden already samples as torch does
(`fixture_graphs.grid_sample_matrix`, checked against ONNX GridSample in
tools/goldens/tests/test_gate_standin.py). Here the context is built with the same weights but a
coarser interpolation, its pixel coordinates rounded to 1/16 of a patch before the bilinear
weights (the kind of fixed-point coordinate an accelerator's sampler uses), which lands near
the card's figure:

  vision_gridsample_socid77_archv73.bin   the coarse sampler (cosine ~0.9985)
  vision_row_late_socid77_archv73.bin     torch's sampler, the output's image rows one late

`--onnx DIR` instead writes the bundle's seven reference graphs (torch's sampler) to DIR as
<component>.onnx, after checking each reproduces the base bundle's golden exactly: the
reference scripts/bringup/observation_goldens.py runs to make goldens for more observations.

Both go to golden/gate-standin/ (not a bundle: bench.sh walks golden/bundles) with `standin.json` (the cosines
measured on the HTP emulator). The tests copy the base bundle and swap the vision binary in.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np

from vla_goldens import fixture_graphs as fg
from vla_goldens import make_golden as mg
import onnx  # noqa: E402
from vla_host import qnn_ctx
from vla_host import reference as ref
from vla_host.det_npz import load_npz

REPO = Path(__file__).resolve().parents[3]
BASE = REPO / "golden" / "bundles" / "molmoact2-lp-vtp-sd"
OUT = REPO / "golden" / "gate-standin"
BUILD = mg.BUILD / "gate-standin"
COORD_STEP = 1 / 16  # the coarse sampler's pixel-coordinate step


def vision_graphs() -> dict:
    cfg = mg.MOLMO_VARIANTS["molmoact2-lp-vtp-sd"]
    dims = cfg["dims"]
    rng = lambda: mg.component_rng(cfg["seed"], "vision")  # noqa: E731
    coarse = fg.grid_sample_matrix(fg.SAMPLER_POINTS[: dims.tokens_per_camera], dims.grid, COORD_STEP)
    return {
        "torch": fg.build_vision(dims, rng()),
        "gridsample": fg.build_vision(dims, rng(), pool=coarse),
        "row_late": fg.build_vision(dims, rng(), rows_late=1),
    }


def reference_graphs(out: Path) -> int:
    """The base bundle's seven graphs, each checked against its committed golden."""
    cfg = mg.MOLMO_VARIANTS["molmoact2-lp-vtp-sd"]
    m = json.loads((BASE / "bundle.json").read_text())["molmoact2"]
    cfg = dict(cfg, dims=mg.replace(cfg["dims"], seq_len=m["seq_len"], rope_left_pad=m["rope_left_pad"]))
    out.mkdir(parents=True, exist_ok=True)
    for component, model in mg.build_molmo_graphs(cfg).items():
        path = out / f"{component}.onnx"
        onnx.save(model, str(path))
        golden = load_npz(BASE / "golden" / f"{component}_io.npz")
        runner = ref.OrtCpuRunner(path)
        feeds = {i.name: golden[i.name] for i in runner.session.get_inputs()}
        for name, value in runner(feeds).items():
            if not np.allclose(value, golden[name], rtol=1e-5, atol=1e-5):
                print(f"make_gate_standin: {component} {name} does not reproduce the base golden", file=sys.stderr)
                return 1
    print(out)
    return 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--onnx":
        return reference_graphs(Path(sys.argv[2]))
    if len(sys.argv) != 1:
        print("usage: make_gate_standin.py [--onnx DIR]", file=sys.stderr)
        return 2
    golden = load_npz(BASE / "golden" / "vision_io.npz")
    graphs = vision_graphs()
    BUILD.mkdir(parents=True, exist_ok=True)
    # The base bundle's golden must be exactly what the torch-sampling graph computes: the
    # stand-in differs from it in the sampler alone.
    torch_path = BUILD / "vision_torch.onnx"
    onnx.save(graphs["torch"], str(torch_path))
    torch_out = ref.OrtCpuRunner(torch_path)({"pixel_values": golden["pixel_values"]})["image_embeds"]
    if not np.array_equal(torch_out, golden["image_embeds"]):
        print("make_gate_standin: the torch-sampling graph does not reproduce the base golden", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    figures = {"coord_step": COORD_STEP, "base": str(BASE.relative_to(REPO)), "contexts": {}}
    for name in ("gridsample", "row_late"):
        path = BUILD / f"vision_{name}.onnx"
        onnx.save(graphs[name], str(path))
        cpu = ref.OrtCpuRunner(path)({"pixel_values": golden["pixel_values"]})["image_embeds"]
        binary = qnn_ctx.compile_context(path)
        htp = qnn_ctx.HtpSession(qnn_ctx.wrapper_paths(path)[0])({"pixel_values": golden["pixel_values"]})
        figures["contexts"][name] = {
            "binary": f"vision_{name}_socid77_archv73.bin",
            "cpu_cosine": ref.cosine(cpu, golden["image_embeds"]),
            "htp_emulator_cosine": ref.cosine(htp["image_embeds"], golden["image_embeds"]),
        }
        shutil.copyfile(binary, OUT / f"vision_{name}_socid77_archv73.bin")
        print(f"  vision_{name}: cosine against the torch golden {figures['contexts'][name]}")
    (OUT / "standin.json").write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
