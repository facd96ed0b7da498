#!/usr/bin/env python3
"""Phase 2 of the tiny upstream MolmoAct2, in the project venv: compiles the
releases that tools/goldens/vla_goldens/export_upstream_molmoact2.py wrote to v73 / soc 77 contexts, checks each
context on the HTP emulator against upstream's fp32 golden, commits releases, checkpoint and
upstream goldens to golden/upstream-molmoact2/, and imports each variant into a bundle with the
release importer (scripts/vla-import), exactly as a user would.

    build/upstream-venv/bin/python -m vla_goldens.export_upstream_molmoact2 --keystone-src DIR
    .venv/bin/python -m vla_goldens.make_upstream_golden            # needs target/release/vlad

Before writing anything it also checks that the contract is upstream's in fp32: the release's
ONNX graphs through the project's numpy host glue (tools/vla_host/vla_host/reference.py) give upstream's own
predict_action actions on every upstream observation (cosine >= 0.99999).
"""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
from vla_host import qnn_ctx
from vla_host import reference as ref
from vla_host.det_npz import load_npz, save_npz

BUILD = Path("/tmp/vla-golden-build/upstream-molmoact2")
OUT = REPO / "golden" / "upstream-molmoact2"
CONTEXT_COSINE = 0.9999
# variant -> (release, importer flags)
VARIANTS = {
    "original": ("release-original", []),
    "sd": ("release-original", ["--flow-steps", "2", "--variant", "lp_vtp_sd"]),
    "drift-keystone": ("release-drift-keystone", ["--flow-steps", "1", "--keystone-k", "5",
                                                  "--keystone-selector", "guarded_medoid", "--variant",
                                                  "drift_keystone"]),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def compile_release(src: Path, dst: Path) -> list:
    """ctx/ from onnx/ (fixed build path: the QNN graph name is hashed from it)."""
    rows = []
    (dst / "ctx").mkdir(parents=True, exist_ok=True)
    for comp_dir in sorted((src / "onnx").iterdir()):
        c = comp_dir.name
        build = BUILD / src.name / c
        build.mkdir(parents=True, exist_ok=True)
        model = build / f"{c}.onnx"
        shutil.copyfile(comp_dir / f"{c}.onnx", model)
        binary = qnn_ctx.compile_context(model)
        shutil.copyfile(binary, dst / "ctx" / f"{c}_socid77_archv73.bin")
        golden = load_npz(src / "golden" / f"{c}_io.npz")
        session = qnn_ctx.HtpSession(qnn_ctx.wrapper_paths(model)[0])
        outs = session({i.name: golden[i.name] for i in session.session.get_inputs()})
        for name, value in outs.items():
            cos = ref.cosine(value, golden[name])
            diff = float(np.abs(value - golden[name]).max())
            rows.append((src.name, c, name, cos, diff))
            if cos < CONTEXT_COSINE:
                raise SystemExit(f"{src.name}/{c} {name}: HTP cosine {cos:.6f} below {CONTEXT_COSINE}")
    return rows


def fp32_contract_check(release: Path, bundle_dir: Path, upstream: dict) -> list:
    """ORT CPU on the release's graphs + the numpy glue vs upstream predict_action, per observation."""
    manifest = json.loads((bundle_dir / "bundle.json").read_text())
    runners = {c: ref.OrtCpuRunner(release / "onnx" / c / f"{c}.onnx") for c in manifest["components"]}
    rows = []
    for o in range(int(upstream["observations"][0])):
        obs = {k: upstream[f"obs{o}_{k}"] for k in ("frames", "state", "instruction_id", "seed")}
        result, _ = ref.run_bundle(bundle_dir, runners, obs)
        want = upstream[f"obs{o}_actions"]
        cos = ref.cosine(result["actions"], want)
        diff = float(np.abs(result["actions"] - want).max())
        same = True
        if "keystone_choice" in result:
            same = int(result["keystone_choice"][0]) == int(upstream[f"obs{o}_keystone_choice"][0])
        rows.append((o, cos, diff, same))
        if cos < 0.99999 or not same:
            raise SystemExit(f"{bundle_dir.name} observation {o}: numpy glue on the fp32 graphs vs upstream "
                             f"predict_action: cosine {cos:.7f}, max abs {diff:.2e}, keystone same {same}")
    return rows


MISTAKES = ("split-order", "rope-offset")


def compile_mistakes(src: Path) -> list:
    """The deliberately wrong exports (export_upstream_molmoact2.py --mistake M, written to
    <export>-mistake-M): only their LLM contexts differ; their binaries go to
    golden/upstream-molmoact2/mistakes/M/ for the test that the end-to-end check catches them."""
    done = []
    for mistake in MISTAKES:
        export = src.parent / f"{src.name}-mistake-{mistake}"
        if not export.is_dir():
            raise SystemExit(f"{export}: missing; run export_upstream_molmoact2.py --mistake {mistake} --out {export}")
        dst = OUT / "mistakes" / mistake / "ctx"
        dst.mkdir(parents=True)
        for onnx_dir in sorted((export / "release-original" / "onnx").glob("llm_split*")):
            c = onnx_dir.name
            # The original's build path, so the QNN graph name (hashed from it) is the one the
            # bundle names: the mistake is in the graph, not in its name.
            build = BUILD / "release-original" / c
            build.mkdir(parents=True, exist_ok=True)
            model = build / f"{c}.onnx"
            shutil.copyfile(onnx_dir / f"{c}.onnx", model)
            shutil.copyfile(qnn_ctx.compile_context(model), dst / f"{c}_socid77_archv73.bin")
            done.append(f"{mistake}/{c}")
    return done


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", type=Path, default=REPO / "build" / "upstream-molmoact2")
    args = ap.parse_args()
    src = args.export
    report = json.loads((src / "export_report.json").read_text())
    if report.get("mistake", "none") != "none":
        raise SystemExit(f"{src}: an export with a deliberate mistake ({report['mistake']}) is not a golden")
    shutil.rmtree(BUILD, ignore_errors=True)
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    shutil.copytree(src / "checkpoint", OUT / "checkpoint")
    table = []
    for rel in sorted({r for r, _ in VARIANTS.values()}):
        shutil.copytree(src / rel / "golden", OUT / rel / "golden")
        shutil.copytree(src / rel / "onnx", OUT / rel / "onnx")
        table += compile_release(src / rel, OUT / rel)
    (OUT / "upstream").mkdir()
    for row in table:
        log(f"  {row[0]}/{row[1]} {row[2]}: HTP cosine {row[3]:.7f}, max abs {row[4]:.2e}")
    summary = {"contexts": [list(r) for r in table], "variants": {}}
    for variant, (rel, flags) in VARIANTS.items():
        upstream = load_npz(src / "upstream" / f"{variant}.npz")
        save_npz(OUT / "upstream" / f"{variant}.npz", upstream)
        obs0 = OUT / "upstream" / f"{variant}_observation0.npz"
        save_npz(obs0, {k: upstream[f"obs0_{k}"] for k in ("frames", "state", "instruction_id", "seed")})
        bundle = REPO / "golden" / "bundles" / f"molmoact2-upstream-{variant}"
        rel_path = lambda p: str(p.relative_to(REPO))  # noqa: E731  (import.json records these)
        cmd = [str(REPO / ".venv" / "bin" / "vla-import"), "--release", rel_path(OUT / rel), "--checkpoint",
               rel_path(OUT / "checkpoint"), "--tag", report["tag"], "--observation", rel_path(obs0),
               "--out", rel_path(bundle), "--name", f"molmoact2-upstream-{variant}-tiny", *flags]
        for text in report["instructions"]:
            cmd += ["--instruction", text]
        run = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if run.returncode != 0:
            raise SystemExit(f"import of {variant} failed: {run.stderr.strip()}")
        log("  " + run.stdout.strip())
        rows = fp32_contract_check(OUT / rel, bundle, upstream)
        for o, cos, diff, same in rows:
            log(f"  {variant} observation {o}: fp32 graphs + numpy glue vs upstream predict_action: "
                f"cosine {cos:.8f}, max abs {diff:.2e}" + ("" if same else ", KEYSTONE PICK DIFFERS"))
        summary["variants"][variant] = {"fp32_vs_upstream": [list(r) for r in rows]}
    summary["mistakes"] = compile_mistakes(src)
    (OUT / "make_report.json").write_text(json.dumps({**report, **summary}, indent=2) + "\n")
    log(f"wrote {OUT} and golden/bundles/molmoact2-upstream-*")


if __name__ == "__main__":
    main()
