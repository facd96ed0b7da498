"""goldens: every golden set under golden/, the venv it is made in and the command that makes it.

    goldens list                      each set, its venv and the paths under golden/ it writes
    goldens make SET [options]        (re)makes the set's venv through its scripts/setup_*.sh,
                                      prints the upstream commit and package versions used,
                                      then runs the set's generators in order

A set's generators are this package's modules (`python -m vla_goldens.<module>`), run from the
repository root in the set's venvs; the upstream checkouts they read are options
(--keystone-src, --fastwam-src, --libero-src, and --commit when a checkout is not a git work
tree). Sets marked "by hand" have no generator: `goldens make` says where their content comes
from and exits 2."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "golden"


@dataclass(frozen=True)
class Venv:
    """A venv and the set-up script that makes it (idempotent; rerun before each make)."""

    path: str
    setup: tuple
    setup_env: tuple = ()

    @property
    def python(self) -> str:
        """The venv's python through the venv's real directory (a checkout's .venv may be a
        link to a shared one): the interpreter path is part of the compiling child's heap
        layout (vla_host.qnn_ctx), so every checkout sharing a venv compiles the same bytes."""
        return str((REPO / self.path).resolve() / "bin" / "python")


PROJECT = Venv(".venv", ("scripts/setup_python.sh",))
ROBOSUITE = Venv("build/robosuite-venv", ("scripts/setup_robosuite.sh",))
UPSTREAM = Venv("build/upstream-venv", ("scripts/setup_upstream.sh",))
# Fast-WAM's venv takes torch from the upstream venv (golden/upstream-fastwam/tiny/README.md).
FASTWAM = Venv("build/fastwam-venv", ("scripts/setup_upstream_fastwam.sh",),
               (("TORCH_VENV", "build/upstream-venv"),))
LIBERO_MOLMOACT2 = Venv("build/libero-molmoact2-venv", ("scripts/setup_libero.sh", "molmoact2"))

# The packages each venv's generators depend on, printed with their installed versions.
PACKAGES = {
    PROJECT: ("numpy", "onnx", "onnxruntime", "onnxruntime-qnn", "tokenizers", "pillow"),
    ROBOSUITE: ("robosuite", "mujoco", "numpy"),
    UPSTREAM: ("lerobot", "torch", "torchvision", "transformers", "tokenizers", "numpy"),
    FASTWAM: ("torch", "torchvision", "numpy", "pillow", "hydra-core", "omegaconf"),
    LIBERO_MOLMOACT2: ("hf-libero", "robosuite", "mujoco", "numpy"),
}


@dataclass(frozen=True)
class Step:
    """One command of a set. `module`: a vla_goldens module run with the venv's python;
    `command`: a program path relative to the repository (a venv's bin/ or cargo).
    `{name}` in args is the option of that name; `stdout`: a file under golden/ to write."""

    venv: Venv | None
    module: str = ""
    command: tuple = ()
    args: tuple = ()
    stdout: str = ""
    env: tuple = ()


@dataclass(frozen=True)
class GoldenSet:
    name: str
    paths: tuple  # under golden/
    steps: tuple = ()
    upstream: tuple = ()  # options naming upstream checkouts
    by_hand: str = ""  # where a set without a generator comes from
    notes: str = ""

    @property
    def options(self) -> set:
        return {a[1:-1] for s in self.steps for a in s.args if a.startswith("{") and a.endswith("}")}


SETS = (
    GoldenSet("fixtures", ("bundles/molmoact2-original", "bundles/molmoact2-lp-vtp-sd",
                           "bundles/molmoact2-drift-keystone", "bundles/molmoact2-operator-fused",
                           "bundles/fastwam", "bundles/fastwam-closed-loop", "tokenizer", "contexts"),
              (Step(PROJECT, "make_golden"),),
              notes="seeded tiny fixtures, contexts compiled on the HTP emulator"),
    GoldenSet("gate-standin", ("gate-standin",), (Step(PROJECT, "make_gate_standin"),),
              notes="reads bundles/molmoact2-lp-vtp-sd (fixtures)"),
    GoldenSet("pillow", ("upstream-fastwam/pillow_resize_13.0.0.npz",), (Step(PROJECT, "pillow_goldens"),),
              notes="Pillow 13.0.0 of the project venv; 12.0.0's file is upstream-fastwam's"),
    GoldenSet("robosuite", ("robosuite",), (Step(ROBOSUITE, "robosuite_quat_goldens"),)),
    GoldenSet("upstream", ("upstream",),
              (Step(UPSTREAM, "upstream_molmoact2", args=("--keystone-src", "{keystone_src}")),
               Step(UPSTREAM, "upstream_keystone", args=("--keystone-src", "{keystone_src}")),
               Step(UPSTREAM, "upstream_keystone_mm", args=("--keystone-src", "{keystone_src}")),
               Step(UPSTREAM, "upstream_resize"),
               Step(UPSTREAM, "upstream_lerobot_norm"),
               Step(UPSTREAM, "upstream_processor_configs")),
              upstream=("keystone_src",), notes="lerobot 0.6.1 and dywsjtu/keystone"),
    GoldenSet("tokenizer-qwen2", ("tokenizer-qwen2",), (Step(UPSTREAM, "upstream_tokenizer_goldens"),)),
    GoldenSet("upstream-fastwam", ("upstream-fastwam",),
              (Step(FASTWAM, "upstream_fastwam", args=("--fastwam-src", "{fastwam_src}", "--commit", "{commit}")),),
              upstream=("fastwam_src",), notes="all but tiny/ and pillow_resize_13.0.0.npz"),
    GoldenSet("upstream-fastwam-tiny", ("upstream-fastwam/tiny", "bundles/fastwam-upstream"),
              (Step(FASTWAM, "export_upstream_fastwam", args=("--fastwam-src", "{fastwam_src}", "--commit", "{commit}")),
               Step(PROJECT, "make_upstream_fastwam_golden")),
              upstream=("fastwam_src",)),
    GoldenSet("upstream-molmoact2", ("upstream-molmoact2", "bundles/molmoact2-upstream-original",
                                     "bundles/molmoact2-upstream-drift-keystone", "bundles/molmoact2-upstream-sd"),
              (Step(UPSTREAM, "export_upstream_molmoact2", args=("--keystone-src", "{keystone_src}")),
               Step(UPSTREAM, "export_upstream_molmoact2",
                    args=("--keystone-src", "{keystone_src}", "--mistake", "split-order",
                          "--out", "build/upstream-molmoact2-mistake-split-order")),
               Step(UPSTREAM, "export_upstream_molmoact2",
                    args=("--keystone-src", "{keystone_src}", "--mistake", "rope-offset",
                          "--out", "build/upstream-molmoact2-mistake-rope-offset")),
               Step(None, command=("cargo", "build", "--release", "-p", "vlad")),
               Step(PROJECT, "make_upstream_golden"),
               Step(UPSTREAM, "upstream_text_actions")),
              upstream=("keystone_src",), notes="the bundles are imported by vla-import"),
    GoldenSet("libero-tasks", ("libero/tasks.json",),
              (Step(PROJECT, "libero_task_golden", args=("{libero_src}", "{commit}"), stdout="libero/tasks.json"),),
              upstream=("libero_src",)),
    GoldenSet("libero-molmoact2", ("libero/molmoact2-first-observation.npz",),
              (Step(LIBERO_MOLMOACT2, command=("build/libero-molmoact2-venv/bin/vla-libero",),
                    args=("demo", "--policy", "molmoact2", "--out", "build/goldens-libero-molmoact2"),
                    env=(("MUJOCO_GL", "egl"),)),
               Step(UPSTREAM, "upstream_libero_molmoact2",
                    args=("--episode", "build/goldens-libero-molmoact2/episode"))),
              notes="LeRobot's observation processing on the demo's first observation"),
    GoldenSet("libero-settings", ("libero/upstream-settings.json",),
              by_hand="copied by hand from the upstream files with the quoted lines (docs/libero.md, "
                      "\"Each policy's conventions at the boundary\")"),
    GoldenSet("releases", ("releases",),
              by_hand="written from the published QNN releases' model cards (golden/README.md, \"Other files\")"),
)


def find(name: str) -> GoldenSet | None:
    return next((s for s in SETS if s.name == name), None)


def venvs(s: GoldenSet) -> list:
    out = []
    for step in s.steps:
        if step.venv is not None and step.venv not in out:
            out.append(step.venv)
    return out


def list_sets(out=sys.stdout) -> None:
    for s in SETS:
        how = "by hand" if s.by_hand else ", ".join(v.path for v in venvs(s))
        print(f"{s.name:<22} {how:<48} " + " ".join(f"golden/{p}" for p in s.paths), file=out)


def git_commit(src: str) -> str | None:
    run = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else None


def versions(venv: Venv) -> str:
    code = ("import importlib.metadata as m, sys\n"
            "for p in sys.argv[1:]:\n"
            "    try: print(p, m.version(p))\n"
            "    except m.PackageNotFoundError: print(p, 'absent')")
    run = subprocess.run([venv.python, "-c", code, *PACKAGES[venv]],
                         capture_output=True, text=True, check=True)
    return ", ".join(line for line in run.stdout.split("\n") if line)


def make(s: GoldenSet, opts: dict) -> int:
    if s.by_hand:
        print(f"goldens: {s.name} has no generator: {s.by_hand}", file=sys.stderr)
        return 2
    missing = sorted(o for o in s.options if not opts.get(o))
    if missing:
        print(f"goldens: {s.name} needs " + ", ".join("--" + m.replace("_", "-") for m in missing), file=sys.stderr)
        return 2
    for v in venvs(s):
        print(f"goldens: {s.name}: venv {v.path} ({' '.join(v.setup)})", flush=True)
        subprocess.run([str(REPO / v.setup[0]), *v.setup[1:]], cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, **{k: str(REPO / p) for k, p in v.setup_env}})
        print(f"goldens: {s.name}: {v.path}: {versions(v)}", flush=True)
    for u in s.upstream:
        print(f"goldens: {s.name}: upstream {u.replace('_', '-')} {opts[u]} at commit "
              f"{git_commit(opts[u]) or opts.get('commit') or 'unknown (not a git work tree, no --commit)'}",
              flush=True)
    for step in s.steps:
        args = [opts[a[1:-1]] if a.startswith("{") else a for a in step.args]
        if step.module:
            cmd = [step.venv.python, "-m", f"vla_goldens.{step.module}", *args]
        else:
            cmd = [*step.command, *args]
        print("goldens: " + " ".join(str(c) for c in cmd), flush=True)
        env = {**os.environ, **dict(step.env)}
        if step.stdout:
            with open(GOLDEN / step.stdout, "w") as f:
                run = subprocess.run(cmd, cwd=REPO, env=env, stdout=f)
        else:
            run = subprocess.run(cmd, cwd=REPO, env=env)
        if run.returncode != 0:
            print(f"goldens: {s.name}: {cmd[2] if step.module else cmd[0]} exited with {run.returncode}",
                  file=sys.stderr)
            return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="goldens", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the sets, their venvs and their paths under golden/")
    mk = sub.add_parser("make", help="regenerate one set")
    mk.add_argument("set")
    mk.add_argument("--keystone-src", help="checkout of github dywsjtu/keystone")
    mk.add_argument("--fastwam-src", help="checkout of github yuantianyuan01/FastWAM")
    mk.add_argument("--libero-src", help="checkout of github Lifelong-Robot-Learning/LIBERO")
    mk.add_argument("--commit", help="the upstream checkout's commit, when it is not a git work tree")
    a = ap.parse_args(argv)
    if a.cmd == "list":
        list_sets()
        return 0
    s = find(a.set)
    if s is None:
        print(f"goldens: unknown set {a.set!r}: expected one of {', '.join(s.name for s in SETS)}", file=sys.stderr)
        return 2
    opts = {k: v for k, v in vars(a).items() if k not in ("cmd", "set")}
    # A git work tree names its own commit; --commit is for an archive's copy.
    for u in s.upstream:
        if opts.get(u) and not opts.get("commit"):
            opts["commit"] = git_commit(opts[u])
    return make(s, opts)


if __name__ == "__main__":
    sys.exit(main())
