#!/usr/bin/env python3
"""Phase 2 of the tiny upstream Fast-WAM, in the project venv: compiles the release
that tools/goldens/vla_goldens/export_upstream_fastwam.py wrote to v73 / soc 77 contexts, checks each context on
the HTP emulator against upstream's fp32 golden, commits release, checkpoint and upstream
goldens to golden/upstream-fastwam/tiny/ and writes the bundle golden/bundles/fastwam-upstream.

    build/fastwam-venv/bin/python -m vla_goldens.export_upstream_fastwam --fastwam-src DIR
    .venv/bin/python -m vla_goldens.make_upstream_fastwam_golden

The bundle is written here with the importer's own manifest (tools/vla_import/vla_import/fastwam_chain.py),
not by running scripts/vla-import, so that its tables and end-to-end golden are upstream's own:
tables.npz (upstream's encode_prompt rows and the checkpoint's proprio Linear) and upstream's
run on observation 0. Every field comes from the export (trace.json, export_report.json's
statistics, the graphs' shapes). scripts/vla-import on the committed release and checkpoint
gives the same bundle but for its text rows (numpy, within 5e-7), its end-to-end golden (the
fp32 graphs on ONNX Runtime, within 5e-6) and the graph names it reads from the binaries
(tools/vla_import/tests/test_vla_import.py). Before writing anything it checks that the contract is
upstream's in fp32: the release's ONNX graphs through the project's numpy host glue
(tools/vla_host/vla_host/reference.py) give upstream's own `_predict_action_chunk` actions on every
observation (cosine >= 0.99999).
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
from vla_host import qnn_ctx
from vla_host import reference as ref
from vla_host.det_npz import load_npz, save_npz
from vla_import import fastwam, fastwam_chain  # noqa: E402

BUILD = Path("/tmp/vla-golden-build/upstream-fastwam")
OUT = REPO / "golden" / "upstream-fastwam" / "tiny"
BUNDLE = REPO / "golden" / "bundles" / "fastwam-upstream"
# The contexts' gate: 0.999, not the seeds' 0.9999 (action_step's fp16 timestep; the reason is
# at fastwam_chain.CONTEXT_COSINE).
CONTEXT_COSINE = fastwam_chain.CONTEXT_COSINE
COMPONENTS = ["wm_vae_enc", "wm_embed", "wm_prefill_split0", "wm_prefill_split1", "action_step"]
# The contexts each deliberate mistake changes (the others are byte-identical graphs).
MISTAKES = {"rope-frame1": ["wm_prefill_split0", "wm_prefill_split1"],
            "no-proprio-row": ["wm_prefill_split0", "wm_prefill_split1", "action_step"]}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def compile_one(onnx_path: Path, c: str) -> Path:
    """Fixed build path per component: the QNN graph name is hashed from it, so a mistake's
    binary carries the name the bundle expects."""
    build = BUILD / c
    build.mkdir(parents=True, exist_ok=True)
    model = build / f"{c}.onnx"
    shutil.copyfile(onnx_path, model)
    return qnn_ctx.compile_context(model)


def compile_release(src: Path, dst: Path) -> list:
    rows = []
    (dst / "ctx").mkdir(parents=True, exist_ok=True)
    for c in COMPONENTS:
        binary = compile_one(src / "onnx" / c / f"{c}.onnx", c)
        shutil.copyfile(binary, dst / "ctx" / f"{c}_socid77_archv73.bin")
        golden = load_npz(src / "golden" / f"{c}_io.npz")
        session = qnn_ctx.HtpSession(qnn_ctx.wrapper_paths(BUILD / c / f"{c}.onnx")[0])
        outs = session({i.name: golden[i.name] for i in session.session.get_inputs()})
        for name, value in outs.items():
            cos = ref.cosine(value, golden[name])
            diff = float(np.abs(value - golden[name]).max())
            rows.append((c, name, cos, diff))
            log(f"  {c} {name}: HTP cosine {cos:.7f}, max abs {diff:.2e}")
            if cos < CONTEXT_COSINE:
                raise SystemExit(f"{c} {name}: HTP cosine {cos:.6f} below {CONTEXT_COSINE}")
    return rows


def manifest(report: dict, trace: dict, goldens: dict) -> dict:
    """bundle.json through the importer's code (fastwam_chain.manifest): the dimensions from the
    goldens' shapes, the cameras from trace.json, the statistics' `default` in upstream LIBERO's
    min/max, the settings the export traced."""
    d = fastwam_chain.dims({c: {k: v.shape for k, v in g.items()} for c, g in goldens.items()},
                           {c: f"golden/{c}_io.npz" for c in goldens})
    cams = fastwam_chain.cameras(d, trace, "trace.json")
    stats, where = report["stats"], "export_report.json stats"
    settings = {"flow_steps": trace["flow_steps"], "shift": trace["shift"], "gripper_map": "libero",
                "gripper_binarize": trace["binarize_gripper"]}
    action_norm = fastwam.action_norm(stats, "min/max", d["action_dims"], where)
    state_dims = len(stats["state"]["default"]["global_min"])
    state_norm = fastwam.feature_norm(stats, "state", "default", "min/max", state_dims, where, "the state")
    return fastwam_chain.manifest("fastwam-upstream-tiny", {c: None for c in COMPONENTS}, d, cams, settings,
                                  action_norm, state_norm, "state", trace["instructions"])


STAGES = ["frames", "state", "instruction_id", "seed", "actions", "image", "latents", "context",
          "keys_split0", "values_split0", "keys_split1", "values_split1", "noise"]


def observation(up: dict, o: int) -> dict:
    return {k: up[f"obs{o}_{k}"] for k in ("frames", "state", "instruction_id", "seed")}


def fp32_contract_check(release: Path, bundle: Path, up: dict) -> list:
    runners = {c: ref.OrtCpuRunner(release / "onnx" / c / f"{c}.onnx") for c in COMPONENTS}
    rows = []
    for o in range(int(up["observations"][0])):
        result, _ = ref.run_bundle(bundle, runners, observation(up, o))
        want = up[f"obs{o}_actions"]
        cos = ref.cosine(result["actions"], want)
        diff = float(np.abs(result["actions"] - want).max())
        rows.append((o, cos, diff))
        log(f"  observation {o}: fp32 graphs + numpy glue vs upstream: cosine {cos:.8f}, max abs {diff:.2e}")
        if cos < 0.99999:
            raise SystemExit(f"observation {o}: numpy glue on the fp32 graphs vs upstream "
                             f"_predict_action_chunk: cosine {cos:.7f}, max abs {diff:.2e}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", type=Path, default=REPO / "build" / "upstream-fastwam-tiny")
    args = ap.parse_args()
    src = args.export
    report = json.loads((src / "export_report.json").read_text())
    trace = json.loads((src / "release" / "golden" / "trace.json").read_text())
    up = load_npz(src / "upstream.npz")
    shutil.rmtree(BUILD, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():  # everything but the hand-written README is generated
        if old.name != "README.md":
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    shutil.rmtree(BUNDLE, ignore_errors=True)
    shutil.copytree(src / "checkpoint", OUT / "checkpoint")
    shutil.copytree(src / "release" / "golden", OUT / "release" / "golden")
    shutil.copytree(src / "release" / "onnx", OUT / "release" / "onnx")
    for name in ("export_report.json", "text_encoder.json", "text_encoder.npz"):
        shutil.copyfile(src / name, OUT / name)
    save_npz(OUT / "upstream.npz", up)

    goldens = {c: load_npz(src / "release" / "golden" / f"{c}_io.npz") for c in COMPONENTS}
    m = manifest(report, trace, goldens)
    for d in ("ctx", "golden", "inputs"):
        (BUNDLE / d).mkdir(parents=True)
    (BUNDLE / "bundle.json").write_text(json.dumps(m, indent=2) + "\n")
    t = load_npz(src / "tables.npz")
    save_npz(BUNDLE / "inputs" / "context_tables.npz", {k: t[k] for k in ("text_rows", "text_lengths",
                                                                           "proprio_weight", "proprio_bias")})
    for c in COMPONENTS:
        shutil.copyfile(src / "release" / "golden" / f"{c}_io.npz", BUNDLE / "golden" / f"{c}_io.npz")
    # Where the bundle came from (not read by vlad; tools/goldens/tests/test_reference.py checks it).
    (BUNDLE / "upstream.json").write_text(json.dumps({
        "made_by": "tools/goldens/vla_goldens/make_upstream_fastwam_golden.py", "release": str((OUT / "release").relative_to(REPO)),
        "upstream": str((OUT / "upstream.npz").relative_to(REPO)), "end_to_end_observation": 0,
        "upstream_commit": report["commit"]}, indent=2) + "\n")
    # End-to-end golden: upstream's run on observation 0 (its stages are upstream's tensors).
    save_npz(BUNDLE / "golden" / "end_to_end.npz", {k: up[f"obs0_{k}"] for k in STAGES})
    fp32 = fp32_contract_check(src / "release", BUNDLE, up)

    table = compile_release(src / "release", OUT / "release")
    for c in COMPONENTS:
        shutil.copyfile(OUT / "release" / "ctx" / f"{c}_socid77_archv73.bin", BUNDLE / "ctx" / f"{c}_socid77_archv73.bin")
    done = []
    for mistake, comps in MISTAKES.items():
        dst = OUT / "mistakes" / mistake / "ctx"
        dst.mkdir(parents=True)
        for c in comps:
            binary = compile_one(src / f"mistake-{mistake}" / "onnx" / c / f"{c}.onnx", c)
            shutil.copyfile(binary, dst / f"{c}_socid77_archv73.bin")
            done.append(f"{mistake}/{c}")
    summary = {"contexts_htp_vs_upstream": [list(r) for r in table], "fp32_vs_upstream": [list(r) for r in fp32],
               "mistakes": done}
    (OUT / "make_report.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(f"wrote {OUT} and {BUNDLE}")


if __name__ == "__main__":
    main()
