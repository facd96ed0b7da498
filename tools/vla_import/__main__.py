"""vla-import: a MolmoAct2 QNN release + its checkpoint -> a bundle `vlad parity --bundle` accepts.

    scripts/vla-import --release DIR|owner/name --checkpoint DIR|owner/name --tag TAG \
        --instruction "put the bowl on the stove" [--instruction ...] --frame-size 256x256 --out BUNDLE
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "scripts"))

from . import bundle, checkpoint, contract, prompt, release, sources  # noqa: E402
from .errors import ImportRefused, expect  # noqa: E402

KEYSTONE_SELECTORS = ("medoid", "guarded_medoid")
DISTANCES = ("l2", "l1", "cosine")


def parse_size(text: str) -> tuple:
    try:
        h, w = (int(x) for x in text.lower().split("x"))
        return h, w
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW, found {text!r}") from None


def arguments(argv):
    ap = argparse.ArgumentParser(prog="vla-import", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", required=True, help="QNN release: a directory or a Hub repo id")
    ap.add_argument("--overlay", help="a release whose components replace the base's (operator-fused)")
    ap.add_argument("--checkpoint", required=True, help="the checkpoint it was converted from (HF layout)")
    ap.add_argument("--tag", required=True, help="normalization tag in norm_stats.json metadata_by_tag")
    ap.add_argument("--instruction", action="append", default=[], help="an instruction (repeatable)")
    ap.add_argument("--instructions", type=Path, help=".json list of instructions")
    ap.add_argument("--frame-size", type=parse_size, help="raw camera frame HxW (an HF checkpoint does not state it)")
    ap.add_argument("--flow-steps", type=int, help="default: config.json flow_matching_num_steps")
    ap.add_argument("--step-output", choices=("velocity", "next_trajectory"),
                    help="what action_step returns; default: read from onnx/action_step")
    ap.add_argument("--keystone-k", type=int, help="KeyStone's K (off when absent)")
    ap.add_argument("--keystone-selector", choices=KEYSTONE_SELECTORS, default="guarded_medoid")
    ap.add_argument("--keystone-distance", choices=DISTANCES, default="l2")
    ap.add_argument("--keystone-threshold", type=float, default=0.3)
    ap.add_argument("--observation", type=Path, help="npz with frames, state, instruction_id, seed for the end-to-end golden")
    ap.add_argument("--seed", type=int, default=7, help="seed of the synthetic observation when none is given")
    ap.add_argument("--name", help="bundle name (default: from the output directory)")
    ap.add_argument("--variant", default="original")
    ap.add_argument("--vlad", help="the vlad binary (default: target/release/vlad, else PATH)")
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(argv)


def step_output_of(onnx_path) -> str:
    """`next_trajectory` when the graph adds the `trajectory` input to something (x + dt*v),
    `velocity` otherwise."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    adds = [n for n in graph.node if n.op_type == "Add" and "trajectory" in n.input]
    return "next_trajectory" if adds else "velocity"


def run(a) -> dict:
    vlad = release.vlad_command(a.vlad)
    rel_dir = sources.resolve(a.release, sources.RELEASE_FILES, "release")
    overlay = sources.resolve(a.overlay, sources.RELEASE_FILES, "overlay") if a.overlay else None
    ck_dir = sources.resolve(a.checkpoint, sources.CHECKPOINT_FILES, "checkpoint")
    comps = release.load(rel_dir, vlad, overlay)
    order = contract.check_names(comps)
    ck = checkpoint.load(ck_dir)
    contract.refuse_unsupported(ck.config, ck.processor)
    m = contract.settings(comps, order, ck.config, ck.processor)
    meta = checkpoint.tag_metadata(ck, a.tag)
    mode = ck.stats.get("norm_mode", "min_max")
    stats_where = f"{ck_dir / 'norm_stats.json'} metadata_by_tag.{a.tag}"
    for key in ("action_stats", "state_stats"):
        expect(isinstance(meta.get(key), dict), f"{stats_where}.{key}", "expected an object, found none")
    action_norm = checkpoint.normalization(meta["action_stats"], mode, f"{stats_where}.action_stats")
    state_norm = checkpoint.normalization(meta["state_stats"], mode, f"{stats_where}.state_stats")
    action_dims = len(meta["action_stats"].get("mask") or meta["action_stats"].get("q01") or meta["action_stats"]["min"])
    state_dims = len(meta["state_stats"].get("mask") or meta["state_stats"].get("q01") or meta["state_stats"]["min"])
    expect(action_dims <= m["action_width"], f"{stats_where}.action_stats",
           f"expected at most {m['action_width']} dims (the trajectory's width), found {action_dims}")
    horizon = meta.get("action_horizon", m["action_horizon"])
    expect(horizon == m["action_horizon"], f"{stats_where}.action_horizon",
           f"expected {m['action_horizon']} (the trajectory's), found {horizon}")

    instructions = list(a.instruction)
    if a.instructions:
        loaded = checkpoint.read_json(a.instructions)
        instructions += loaded["instructions"] if isinstance(loaded, dict) else loaded
    expect(bool(instructions), "--instruction", "expected at least one instruction, found none")
    obs_arrays = release.load_npz(a.observation) if a.observation else None
    if a.frame_size:
        frame_h, frame_w = a.frame_size
    elif obs_arrays is not None and "frames" in obs_arrays:
        frame_h, frame_w = obs_arrays["frames"].shape[1:3]
    else:
        raise ImportRefused("--frame-size", "expected the raw camera frame size (an HF checkpoint does not state it)")

    blocked = float(comps["llm_split0"].arrays["attention_bias"].min())
    flow_steps = a.flow_steps or ck.config.get("flow_matching_num_steps")
    expect(isinstance(flow_steps, int) and flow_steps >= 1, "config.json flow_matching_num_steps",
           f"expected a step count >= 1, found {flow_steps}")
    step_out = a.step_output
    if step_out is None:
        expect(comps["action_step"].onnx is not None, "onnx/action_step/action_step.onnx",
               "expected the graph to read its step output from (or pass --step-output)")
        step_out = step_output_of(comps["action_step"].onnx)
    keystone = None
    if a.keystone_k:
        keystone = {"k": a.keystone_k, "selector": a.keystone_selector, "distance": a.keystone_distance,
                    "executed_steps": None, "spread_threshold": a.keystone_threshold}
    m.update({
        "frame_height": int(frame_h), "frame_width": int(frame_w), "rope_left_pad": 0,
        "action_dims": action_dims, "flow_steps": flow_steps, "step_output": step_out, "keystone": keystone,
        "state_dims": state_dims, "state_norm": state_norm, "action_norm": action_norm,
        "attention_blocked_value": blocked, "prompt": "prompt/prompt_tables.npz", "instructions": instructions,
    })
    m = {k: m[k] for k in ("cameras", "frame_height", "frame_width", "crop_size", "patch_size", "image_tokens",
                           "seq_len", "rope_left_pad", "hidden", "llm_splits", "layers_per_split", "kv_width",
                           "action_context_width", "action_horizon", "action_width", "action_dims", "flow_steps",
                           "step_output", "keystone", "state_dims", "state_norm", "action_norm",
                           "attention_blocked_value", "prompt", "instructions")}

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(ck_dir / "tokenizer.json"))
    wte, prefix = checkpoint.embedding_table(ck_dir)
    expect(wte.shape[1] == m["hidden"], "model.safetensors wte", f"width: expected {m['hidden']}, found {wte.shape[1]}")
    grid = contract.pooled_grid(ck.processor, m["crop_size"], m["patch_size"], m["image_tokens"] // m["cameras"])
    action_mode = ck.config.get("action_mode", "both")
    tables = prompt.tables(tokenizer, wte, instructions, m, grid, contract.col_tokens(ck.processor), m["seq_len"],
                           action_mode, meta.get("setup_type", ""), meta.get("control_mode", ""), "--instruction")
    proof = prompt.prove(tables, comps["llm_split0"].arrays, comps["action_step"].arrays, wte, tokenizer,
                         instructions, blocked, str(comps["llm_split0"].golden),
                         str(comps["action_step"].golden))
    if obs_arrays is not None:
        obs = bundle.check_observation(obs_arrays, m, str(a.observation))
        observation = str(a.observation)
    else:
        obs = bundle.synthetic_observation(m, a.seed)
        observation = f"synthetic (seed {a.seed}): no observation was given"
    name = a.name or a.out.name
    man = bundle.manifest(name, a.variant, order, comps, m)
    provenance = {
        "release": a.release, "overlay": a.overlay, "checkpoint": a.checkpoint, "tag": a.tag,
        "embedding_prefix": prefix, "norm_mode": mode, "action_mode": action_mode,
        "step_output": step_out, "step_output_from": "--step-output" if a.step_output else "onnx/action_step",
        "prompt_matched": proof, "end_to_end_observation": observation,
    }
    bundle.write(a.out, comps, order, man, tables, obs, provenance)
    return {"bundle": str(a.out), **provenance}


def main(argv=None) -> int:
    a = arguments(argv)
    try:
        report = run(a)
    except ImportRefused as exc:
        print(f"vla-import: {exc}", file=sys.stderr)
        return 1
    print(f"vla-import: wrote {report['bundle']} (prompt traced with instruction "
          f"{report['prompt_matched']['instruction']}: {report['prompt_matched']['text']!r}; "
          f"end-to-end observation {report['end_to_end_observation']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
