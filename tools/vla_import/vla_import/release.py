"""A QNN release directory as published: `ctx/<c>_socid77_archv73.bin`, `golden/<c>_io.npz`,
`golden/trace.json` (MolmoAct2), `onnx/<c>/<c>.onnx`. Binaries are read through `vlad inspect --json` (the
runtime's own reader, so the importer sees what the device will see)."""

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import ImportRefused, expect

SOC_MODEL = 77
HTP_ARCH = "v73"
BINARY = re.compile(r"^(?P<c>[a-z0-9_]+)_socid(?P<soc>\d+)_arch(?P<arch>v\d+)\.bin$")


@dataclass
class Component:
    name: str
    binary: Path
    golden: Path
    onnx: Path | None
    graph: str
    inputs: dict = field(default_factory=dict)  # tensor -> (shape, dtype)
    outputs: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)  # the golden npz


def vlad_command(explicit: str | None) -> str:
    if explicit:
        return explicit
    # The newest build: a release binary left from an older checkout must not win over
    # the debug one `cargo test` just built (it may refuse fields the bundle now has).
    target = Path(__file__).resolve().parents[3] / "target"
    built = [b for b in (target / "release" / "vlad", target / "debug" / "vlad") if b.is_file()]
    if built:
        return str(max(built, key=lambda b: b.stat().st_mtime))
    found = shutil.which("vlad")
    if not found:
        raise ImportRefused("vlad", "not found: build it (cargo build --release -p vlad) or pass --vlad")
    return found


def qnn_env() -> dict:
    env = dict(os.environ)
    if not env.get("VLA_QNN_LIB_DIR"):
        try:
            import onnxruntime_qnn

            env["VLA_QNN_LIB_DIR"] = str(Path(onnxruntime_qnn.get_library_path()).resolve().parent)
        except ImportError:
            pass
    return env


def inspect(vlad: str, binary: Path) -> dict:
    run = subprocess.run([vlad, "inspect", "--json", str(binary)], env=qnn_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        raise ImportRefused(str(binary), f"vlad inspect failed: {run.stderr.strip().splitlines()[-1:]}")
    # Qualcomm's library may print its own lines; the report is the JSON line.
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise ImportRefused(str(binary), "vlad inspect printed no JSON report")


def load_npz(path: Path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as exc:
        raise ImportRefused(str(path), f"not a readable npz: {exc}") from exc


def load(root: Path, vlad: str, overlay: Path | None = None) -> dict:
    """component -> Component, checked: soc 77, one graph, the golden's arrays are exactly
    the binary's tensors with the binary's shapes and f32. `overlay` replaces the components
    it has (the operator-fused release ships only `vision` and `action_step`)."""
    comps = {}
    for base in [root] + ([overlay] if overlay else []):
        ctx_dir = base / "ctx"
        expect(ctx_dir.is_dir(), str(ctx_dir), "expected the release's context binaries, found no ctx/")
        for binary in sorted(ctx_dir.iterdir()):
            m = BINARY.match(binary.name)
            if not m:
                continue
            name = m["c"]
            expect(int(m["soc"]) == SOC_MODEL, str(binary), f"soc id: expected {SOC_MODEL}, found {m['soc']}")
            # `vlad inspect` reports no HTP arch: the release's file name is what states it.
            expect(m["arch"] == HTP_ARCH, str(binary), f"HTP arch: expected {HTP_ARCH}, found {m['arch']}")
            golden = base / "golden" / f"{name}_io.npz"
            expect(golden.is_file(), str(golden), f"expected the golden of {name}, found none")
            onnx = base / "onnx" / name / f"{name}.onnx"
            comps[name] = (binary, golden, onnx if onnx.is_file() else None)
    expect(bool(comps), str(root / "ctx"), "expected <component>_socid77_archv73.bin files, found none")
    out = {}
    for name, (binary, golden, onnx) in comps.items():
        info = inspect(vlad, binary)
        expect(info.get("soc_model") == SOC_MODEL, str(binary),
               f"soc model: expected {SOC_MODEL}, found {info.get('soc_model')}")
        expect(len(info["graphs"]) == 1, str(binary), f"graphs: expected 1, found {len(info['graphs'])}")
        g = info["graphs"][0]
        c = Component(name, binary, golden, onnx, g["name"])
        c.inputs = {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in g["inputs"]}
        c.outputs = {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in g["outputs"]}
        c.arrays = load_npz(golden)
        for tensor, (shape, dtype) in {**c.inputs, **c.outputs}.items():
            expect(tensor in c.arrays, f"{golden} {tensor}",
                   f"expected the binary's tensor {tensor} {list(shape)}, found keys {sorted(c.arrays)}")
            found = c.arrays[tensor]
            expect(tuple(found.shape) == shape, f"{golden} {tensor}",
                   f"shape: expected {list(shape)} (the binary's), found {list(found.shape)}")
            expect(dtype == "f32", f"{binary} {tensor}", f"dtype: expected f32, found {dtype}")
        out[name] = c
    return out


def require_trace(root: Path) -> None:
    """MolmoAct2 releases ship the trace of their export (the Fast-WAM one does not)."""
    trace = root / "golden" / "trace.json"
    expect(trace.is_file(), str(trace), "expected the release's trace.json, found none")
