"""vla-import: a QNN release + its checkpoint -> a bundle `vlad parity --bundle` accepts.

    MolmoAct2 (checkpoint in the Hugging Face layout: --tag; LeRobot layout: statistics built in):
    scripts/vla-import --release DIR|owner/name --checkpoint DIR|owner/name [--tag TAG] \
        --instruction "put the bowl on the stove" [--instruction ...] [--frame-size 256x256] --out BUNDLE
    Fast-WAM (the public release's action_step on its golden world model: OPEN LOOP):
    scripts/vla-import --release DIR|owner/name --checkpoint DIR|owner/name --out BUNDLE
    Fast-WAM with the world-model contexts (CLOSED LOOP; --tag: the dataset statistics' key):
    scripts/vla-import --release DIR --checkpoint DIR [--tag default] --instruction "..." --out BUNDLE
    Fast-WAM instruction packs (new instructions for a chain bundle, signed and installed beside it):
    scripts/vla-import pack --bundle BUNDLE --checkpoint DIR --instruction "..." --out PACK
"""

import argparse
import json
import sys
from pathlib import Path

from vla_host import build_prompt_tables as bpt

from . import bundle, checkpoint, contract, fastwam, fastwam_chain, gates, lerobot, prompt, release, sources
from .errors import ImportRefused, expect

KEYSTONE_SELECTORS = ("medoid", "guarded_medoid", "cluster_medoid")
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
    ap.add_argument("--checkpoint", required=True,
                    help="the checkpoint it was converted from: Hugging Face or LeRobot layout")
    ap.add_argument("--base-checkpoint", help="a LeRobot checkpoint's Hugging Face checkpoint "
                    "(default: its config.json checkpoint_path)")
    ap.add_argument("--tag", help="normalization tag in norm_stats.json metadata_by_tag (Hugging Face layout; "
                    "a LeRobot checkpoint carries its statistics); Fast-WAM: the key in *_dataset_stats.json "
                    "action/state (upstream's shape_meta key, default 'default')")
    ap.add_argument("--upstream", choices=list(bpt.UPSTREAMS), default=bpt.DEFAULT_UPSTREAM,
                    help="MolmoAct2: the lerobot version whose host glue the bundle follows (padding, positions, "
                    "sequence cap, action_mode default; no checkpoint file records it). Default: the pin, "
                    f"{bpt.DEFAULT_UPSTREAM}")
    ap.add_argument("--instruction", action="append", default=[], help="an instruction (repeatable)")
    ap.add_argument("--instructions", type=Path, help=".json list of instructions")
    ap.add_argument("--frame-size", type=parse_size, help="raw camera frame HxW (an HF checkpoint does not state it)")
    ap.add_argument("--flow-steps", type=int, help="default: the LeRobot config's num_inference_steps, "
                    "else config.json flow_matching_num_steps")
    ap.add_argument("--step-output", choices=("velocity", "next_trajectory"),
                    help="what action_step returns; default: read from onnx/action_step")
    ap.add_argument("--shift", type=float, help="Fast-WAM: the Wan schedule's shift (default 5, upstream LIBERO)")
    ap.add_argument("--norm-mode", choices=("min/max", "q01/q99", "z-score"),
                    help="Fast-WAM: the dataset normalizer's mode (default min/max, upstream LIBERO)")
    ap.add_argument("--gripper-map", choices=("libero", "none"),
                    help="Fast-WAM: libero = upstream LIBERO eval's g*2-1 inverted (default)")
    ap.add_argument("--gripper-binarize", action=argparse.BooleanOptionalAction,
                    help="Fast-WAM: binarize the gripper (default on, upstream LIBERO)")
    ap.add_argument("--state-input", choices=fastwam_chain.STATE_INPUTS,
                    help="Fast-WAM closed loop: what the robot writes (default state: the 8-D state itself; "
                    "eef_pos_quat_gripper: LIBERO's raw eef position, quaternion, gripper qpos)")
    ap.add_argument("--text-encoder", help="Fast-WAM closed loop: directory with Wan's "
                    f"{fastwam_chain.TEXT_ENCODER} and {fastwam_chain.TOKENIZER}/ (default: the checkpoint)")
    ap.add_argument("--keystone-k", type=int, help="KeyStone's K (off when absent)")
    ap.add_argument("--keystone-selector", choices=KEYSTONE_SELECTORS, default="guarded_medoid")
    ap.add_argument("--keystone-distance", choices=DISTANCES, default="l2")
    ap.add_argument("--keystone-threshold", type=float, default=0.3)
    ap.add_argument("--keystone-clusters", type=int, default=2,
                    help="KeyStone's cluster_medoid_num_clusters (C of its k-means)")
    ap.add_argument("--keystone-executed-steps", type=int, default=None,
                    help="KeyStone's executed_steps (distances over the first n steps only)")
    ap.add_argument("--observation", type=Path, help="npz with frames, state, instruction_id, seed for the end-to-end golden")
    ap.add_argument("--seed", type=int, default=7, help="seed of the synthetic observation when none is given")
    ap.add_argument("--name", help="bundle name (default: from the output directory)")
    ap.add_argument("--variant", default="original")
    ap.add_argument("--vlad", help="the vlad binary (default: the newer of target/release/vlad and target/debug/vlad, else PATH)")
    ap.add_argument("--gate", action="append", default=[], metavar="CONTEXT[.OUTPUT]=COSINE",
                    help="a parity gate of its own for one output (or every output) of a context, below or above "
                    "the default 0.9999; repeatable; each needs --gate-reason")
    ap.add_argument("--gate-reason", action="append", default=[], metavar="TEXT",
                    help="why: one for every --gate, or one per --gate in order (recorded in bundle.json)")
    ap.add_argument("--allow-low-gate", action="store_true",
                    help=f"let a gate go below {gates.GATE_FLOOR} (recorded as parity.allow_low_gate)")
    ap.add_argument("--release-name", help="the published release this is, for its card's gates "
                    "(default: the Hub repo id, else the README card's base_model)")
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(argv)


def step_output_of(onnx_path) -> str:
    """`next_trajectory` when the graph adds the `trajectory` input to something (x + dt*v),
    `velocity` otherwise."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    adds = [n for n in graph.node if n.op_type == "Add" and "trajectory" in n.input]
    return "next_trajectory" if adds else "velocity"


def normalization(ck, a, m: dict) -> dict:
    """state_norm, action_norm, dims, setup/control text and where they came from: a LeRobot
    checkpoint's processor statistics, else the Hugging Face checkpoint's norm_stats.json tag."""
    if ck.policy is not None:
        n = lerobot.normalization(ck.root, ck.policy)
        pack = lerobot.pack_settings(ck.root)
        n["setup_type"] = pack.get("setup_type") or ck.policy.get("setup_type") or ""
        n["control_mode"] = pack.get("control_mode") or ck.policy.get("control_mode") or ""
        n["camera_keys"] = list(pack.get("image_keys") or ck.policy.get("image_keys") or [])
        n["action_mode"] = pack.get("action_mode") or ck.policy.get("action_mode")
        expect(n["action_mode"] in (None, "both", "continuous"), f"{ck.root / lerobot.PREPROCESSOR} "
               f"{lerobot.PACK} action_mode", f"expected 'both' or 'continuous', found {n['action_mode']!r}")
        n["prompt_settings"] = contract.prompt_settings(pack, ck.policy)
        n["norm_mode"] = "lerobot processor"
        n["stats_where"] = n["from"][1]
        return n
    expect(bool(a.tag), "--tag", "expected the normalization tag of norm_stats.json metadata_by_tag; tags: "
           + ", ".join(sorted((ck.stats or {}).get("metadata_by_tag") or {})))
    meta = checkpoint.tag_metadata(ck, a.tag)
    mode = ck.stats.get("norm_mode", "min_max")
    where = f"{ck.root / 'norm_stats.json'} metadata_by_tag.{a.tag}"
    for key in ("action_stats", "state_stats"):
        expect(isinstance(meta.get(key), dict), f"{where}.{key}", "expected an object, found none")
    horizon = meta.get("action_horizon", m["action_horizon"])
    expect(horizon == m["action_horizon"], f"{where}.action_horizon",
           f"expected {m['action_horizon']} (the trajectory's), found {horizon}")
    dims = lambda s: len(s.get("mask") or s.get("q01") or s["min"])  # noqa: E731
    return {"action_norm": checkpoint.normalization(meta["action_stats"], mode, f"{where}.action_stats"),
            "state_norm": checkpoint.normalization(meta["state_stats"], mode, f"{where}.state_stats"),
            "action_dims": dims(meta["action_stats"]), "state_dims": dims(meta["state_stats"]),
            "setup_type": meta.get("setup_type", ""), "control_mode": meta.get("control_mode", ""),
            "camera_keys": list(meta.get("camera_keys") or []), "norm_mode": mode, "stats_where": where}


def run_fastwam(a, comps: dict, rel_dir, ck_dir) -> dict:
    """The open-loop Fast-WAM bundle: the release's action_step on its golden world model."""
    order = fastwam.check_names(comps)
    for flag, value in (("--instruction", a.instruction or a.instructions),
                        ("--frame-size", a.frame_size), ("--observation", a.observation),
                        ("--keystone-k", a.keystone_k), ("--step-output", a.step_output),
                        ("--base-checkpoint", a.base_checkpoint), ("--state-input", a.state_input),
                        ("--text-encoder", a.text_encoder)):
        expect(not value, flag, "a MolmoAct2 setting, found for a Fast-WAM release (open loop: no prompt, "
               "no observation but the seed)")
    s = fastwam.settings(a)
    _, horizon, dims = comps["action_step"].inputs["latents_action"][0]
    where = fastwam.stats_file(ck_dir)
    norm = fastwam.action_norm(checkpoint.read_json(where), s["norm_mode"], dims, str(where), a.tag or "default")
    man = fastwam.manifest(a.name or a.out.name, comps, s, norm, horizon, dims)
    world = fastwam.world_model(comps)
    provenance = {
        "release": a.release, "overlay": a.overlay, "checkpoint": a.checkpoint, "policy": "fastwam",
        "open_loop": "the world model is the release's golden action_step_io.npz video_keys/video_values/"
                     "context/context_mask: the actions depend on the noise seed only",
        "statistics": f"{where} action.{a.tag or 'default'} ({s['norm_mode']})",
        "settings": {k: s[k] for k in ("flow_steps", "shift", "gripper_map", "gripper_binarize")},
        "settings_from": "upstream LIBERO eval defaults unless given on the command line",
    }

    def e2e(stage):
        arrays = fastwam.end_to_end(stage, comps, man, world, a.seed)
        used = int(arrays["seed"][0])
        skipped = (f"; seeds {a.seed}..{used - 1} skipped: a gripper value within {fastwam.GRIPPER_MARGIN} of "
                   "the binarize threshold" if used != a.seed else "")
        provenance["end_to_end_observation"] = f"seed {used} (open loop: the noise seed is all{skipped})"
        return arrays

    gates.apply(a, rel_dir, comps, man, provenance)
    bundle.write(a.out, comps, order, man, {"inputs/world_model.npz": world}, e2e, provenance)
    return {"bundle": str(a.out), **provenance}


def run_fastwam_chain(a, comps: dict, rel_dir, ck_dir) -> dict:
    """The closed-loop Fast-WAM bundle: the release's world-model chain and action_step, the
    text rows and proprio Linear from the checkpoint, proved against the release's goldens."""
    from .torch_zip import Checkpoint

    order = fastwam_chain.check_names(comps)
    for flag, value in (("--frame-size", a.frame_size), ("--keystone-k", a.keystone_k),
                        ("--step-output", a.step_output), ("--base-checkpoint", a.base_checkpoint)):
        expect(not value, flag, "a MolmoAct2 setting, found for a Fast-WAM release")
    instructions = list(a.instruction)
    if a.instructions:
        loaded = checkpoint.read_json(a.instructions)
        instructions += loaded["instructions"] if isinstance(loaded, dict) else loaded
    expect(bool(instructions), "--instruction", "expected at least one instruction, found none")
    trace, trace_where = fastwam_chain.read_trace(rel_dir)
    d = fastwam_chain.dims({c: {**{t: s for t, (s, _) in comps[c].inputs.items()},
                                **{t: s for t, (s, _) in comps[c].outputs.items()}} for c in order},
                           {c: comps[c].binary for c in order})
    cams = fastwam_chain.cameras(d, trace, trace_where)
    s = fastwam.settings(a)
    tag = a.tag or "default"
    where = fastwam.stats_file(ck_dir)
    stats = checkpoint.read_json(where)
    norm = fastwam.action_norm(stats, s["norm_mode"], d["action_dims"], str(where), tag)
    pt = fastwam_chain.one_file(ck_dir, "*.pt", "the checkpoint FastWAM.save_checkpoint wrote (mot, proprio_encoder)")
    weight, bias = fastwam_chain.proprio(Checkpoint(pt), d)
    state_norm = fastwam.feature_norm(stats, "state", tag, s["norm_mode"], weight.shape[1], str(where),
                                      f"{pt.name} proprio_encoder.weight's columns")
    enc, tok = fastwam_chain.text_encoder(Path(a.text_encoder) if a.text_encoder else ck_dir, d)
    make_rows = lambda tasks: fastwam_chain.text_rows(tasks, enc, tok, d["text_tokens"])  # noqa: E731
    golden_ctx = comps["wm_embed"].arrays["context"]
    traced = [t for t in trace.get("instructions") or [] if t not in instructions]
    proof = fastwam_chain.prove(golden_ctx, instructions + traced, make_rows, str(comps["wm_embed"].golden))
    proof["from"] = "--instruction" if proof["instruction"] in instructions else f"{trace_where} instructions"
    proof["proprio"] = fastwam_chain.prove_proprio(golden_ctx, weight, bias, str(comps["wm_embed"].golden))
    text_rows, lengths = make_rows(instructions)
    tables = {"text_rows": text_rows, "text_lengths": lengths, "proprio_weight": weight, "proprio_bias": bias}
    state_input = a.state_input or "state"
    expect(state_input != "eef_pos_quat_gripper" or weight.shape[1] == 8, "--state-input",
           f"eef_pos_quat_gripper builds 8 state values (position, axis-angle, gripper 2), but {pt.name} "
           f"proprio_encoder.weight takes {weight.shape[1]}")
    man = fastwam_chain.manifest(a.name or a.out.name, {c: comps[c].graph for c in order}, d, cams, s, norm,
                                 state_norm, state_input, instructions)
    chain = man["fastwam"]["chain"]
    if a.observation:
        obs = bundle.check_observation(release.load_npz(a.observation),
                                       dict(chain, state_dims=9 if state_input == "eef_pos_quat_gripper"
                                            else chain["state_dims"]), str(a.observation))
        seeds, observation = [int(obs["seed"][0])], str(a.observation)
    else:
        seeds, observation = range(a.seed, a.seed + fastwam.SEED_TRIES), "synthetic"
    provenance = {
        "release": a.release, "checkpoint": a.checkpoint, "policy": "fastwam", "closed_loop": True,
        "statistics": f"{where} action.{tag}, state.{tag} ({s['norm_mode']})",
        "proprio": f"{pt} proprio_encoder", "text_encoder": f"{enc} with the tokenizer {tok}",
        "text_lengths": [int(x) for x in lengths],
        # cut at text_tokens as upstream's tokenizer cuts (or exactly that long)
        "instructions_filling_text_tokens": [t for t, n in zip(instructions, lengths) if n == d["text_tokens"]],
        "settings": {k: s[k] for k in ("flow_steps", "shift", "gripper_map", "gripper_binarize")},
        "settings_from": "upstream LIBERO eval defaults unless given on the command line",
        "state_input": state_input, "traced": proof,
    }

    def e2e(stage):
        for seed in seeds:
            ob = obs if a.observation else fastwam_chain.synthetic_observation(chain, seed)
            arrays, closest = fastwam_chain.end_to_end(stage, comps, order, man, ob)
            if a.observation or closest is None or closest >= fastwam.GRIPPER_MARGIN:
                break
        else:
            raise ImportRefused("--seed", f"no seed in {a.seed}..{a.seed + fastwam.SEED_TRIES - 1} keeps every "
                                f"gripper value {fastwam.GRIPPER_MARGIN} away from the binarize threshold")
        skipped = (f"; seeds {a.seed}..{seed - 1} skipped: a gripper value within {fastwam.GRIPPER_MARGIN} of "
                   "the binarize threshold" if not a.observation and seed != a.seed else "")
        provenance["end_to_end_observation"] = (observation if a.observation else
                                                f"synthetic (seed {seed}{skipped}): no observation was given")
        if closest is not None:
            provenance["end_to_end_gripper_margin"] = closest
        return arrays

    gates.apply(a, rel_dir, comps, man, provenance)
    bundle.write(a.out, comps, order, man, {"inputs/context_tables.npz": tables}, e2e, provenance)
    return {"bundle": str(a.out), **provenance}


def run(a) -> dict:
    vlad = release.vlad_command(a.vlad)
    rel_dir = sources.resolve(a.release, sources.RELEASE_FILES, "release")
    overlay = sources.resolve(a.overlay, sources.RELEASE_FILES, "overlay") if a.overlay else None
    comps = release.load(rel_dir, vlad, overlay)
    gates.resolve(a, rel_dir, comps, bundle.CONTEXT_COSINE)  # a bad --gate is refused before the work
    if fastwam_chain.is_chain(comps):
        ck_dir = sources.resolve(a.checkpoint, sources.FASTWAM_CHAIN_FILES, "checkpoint")
        return run_fastwam_chain(a, comps, rel_dir, ck_dir)
    if fastwam.is_fastwam(comps):
        ck_dir = sources.resolve(a.checkpoint, sources.FASTWAM_FILES, "checkpoint")
        return run_fastwam(a, comps, rel_dir, ck_dir)
    ck_dir = sources.resolve(a.checkpoint, sources.CHECKPOINT_FILES, "checkpoint")
    for flag, value in (("--state-input", a.state_input), ("--text-encoder", a.text_encoder)):
        expect(not value, flag, "a Fast-WAM setting, found for a MolmoAct2 release")
    release.require_trace(rel_dir)
    order = contract.check_names(comps)
    policy = checkpoint.read_json(ck_dir / "config.json")
    base_dir = None
    if lerobot.is_lerobot(policy):
        contract.refuse_policy(policy, str(ck_dir / "config.json"))
        base = a.base_checkpoint or policy.get("checkpoint_path")
        expect(isinstance(base, str) and base != "", f"{ck_dir / 'config.json'} checkpoint_path",
               "expected the Hugging Face checkpoint the policy was trained from (or pass --base-checkpoint)")
        base_dir = sources.resolve(base, sources.BASE_FILES, "base checkpoint")
    ck = checkpoint.load(ck_dir, base_dir)
    contract.refuse_unsupported(ck.config)
    proc = contract.processor(ck.processor)
    m = contract.settings(comps, order, ck.config, proc)
    norm = normalization(ck, a, m)
    action_dims, state_dims = norm["action_dims"], norm["state_dims"]
    expect(action_dims <= m["action_width"], norm["stats_where"],
           f"action: expected at most {m['action_width']} dims (the trajectory's width), found {action_dims}")
    cams = norm["camera_keys"]
    expect(not cams or len(cams) == m["cameras"], f"{norm['stats_where']} camera keys",
           f"expected {m['cameras']} cameras (vision's pixel_values), found {cams}")

    instructions = list(a.instruction)
    if a.instructions:
        loaded = checkpoint.read_json(a.instructions)
        instructions += loaded["instructions"] if isinstance(loaded, dict) else loaded
    expect(bool(instructions), "--instruction", "expected at least one instruction, found none")
    obs_arrays = release.load_npz(a.observation) if a.observation else None
    stated = lerobot.frame_size(ck.policy, cams, str(ck_dir / "config.json")) if ck.policy else None
    if a.frame_size:
        frame_h, frame_w = a.frame_size
    elif stated:
        frame_h, frame_w = stated
    elif obs_arrays is not None and "frames" in obs_arrays:
        frame_h, frame_w = obs_arrays["frames"].shape[1:3]
    else:
        raise ImportRefused("--frame-size", "expected the raw camera frame size (an HF checkpoint does not state it)")

    blocked = float(comps["llm_split0"].arrays["attention_bias"].min())
    flow_from = "config.json flow_matching_num_steps"
    flow_steps = ck.config.get("flow_matching_num_steps")
    if ck.policy is not None and ck.policy.get("num_inference_steps") is not None:
        flow_from, flow_steps = f"{ck_dir / 'config.json'} num_inference_steps", ck.policy["num_inference_steps"]
    if a.flow_steps:
        flow_from, flow_steps = "--flow-steps", a.flow_steps
    expect(isinstance(flow_steps, int) and flow_steps >= 1, flow_from, f"expected a step count >= 1, found {flow_steps}")
    step_out = a.step_output
    if step_out is None:
        expect(comps["action_step"].onnx is not None, "onnx/action_step/action_step.onnx",
               "expected the graph to read its step output from (or pass --step-output)")
        step_out = step_output_of(comps["action_step"].onnx)
    keystone = None
    if a.keystone_k:
        keystone = {"k": a.keystone_k, "selector": a.keystone_selector, "distance": a.keystone_distance,
                    "executed_steps": a.keystone_executed_steps, "spread_threshold": a.keystone_threshold}
        e = a.keystone_executed_steps
        expect(e is None or 1 <= e <= m["action_horizon"], "--keystone-executed-steps",
               f"expected 1..={m['action_horizon']} (the action horizon), found {e}")
        expect(1 <= a.keystone_clusters <= 64, "--keystone-clusters", f"expected 1..=64, found {a.keystone_clusters}")
        if a.keystone_clusters != 2:
            keystone["num_clusters"] = a.keystone_clusters
    m.update({
        "frame_height": int(frame_h), "frame_width": int(frame_w), "rope_left_pad": 0,
        "action_dims": action_dims, "flow_steps": flow_steps, "step_output": step_out, "keystone": keystone,
        "state_dims": state_dims, "state_norm": norm["state_norm"], "action_norm": norm["action_norm"],
        "attention_blocked_value": blocked, "prompt": "prompt/prompt_tables.npz", "instructions": instructions,
    })
    m = {k: m[k] for k in ("cameras", "frame_height", "frame_width", "crop_size", "patch_size", "image_tokens",
                           "seq_len", "rope_left_pad", "hidden", "llm_splits", "layers_per_split", "kv_width",
                           "action_context_width", "action_horizon", "action_width", "action_dims", "flow_steps",
                           "step_output", "keystone", "state_dims", "state_norm", "action_norm",
                           "attention_blocked_value", "prompt", "instructions")}

    cap = lerobot.sequence_cap(ck.root, ck.policy, m["cameras"], m["state_dims"]) if ck.policy is not None else None

    # Qwen2Tokenizer.from_pretrained: tokenizer_config.json's tokens, else the class defaults
    tok_cfg_path = ck.base / "tokenizer_config.json"
    tok_cfg = checkpoint.read_json(tok_cfg_path) if tok_cfg_path.is_file() else {}
    try:
        tokenizer = bpt.load_tokenizer(ck.base / "tokenizer.json", tok_cfg)
    except bpt.PromptError as exc:
        # The builder's message starts with the file's path; the refusal names the file itself.
        path = str(ck.base / "tokenizer.json")
        message = str(exc).removeprefix(f"{path}: ")
        raise ImportRefused(path, message) from exc
    roots = [ck.root]
    if ck.policy is not None and not checkpoint.has_embedding(ck.root):
        roots.append(sources.resolve(base, sources.CHECKPOINT_FILES, "base checkpoint"))  # now with its weights
    wte, prefix, wte_from = checkpoint.embedding_table(roots)
    expect(wte.shape[1] == m["hidden"], "model.safetensors wte", f"width: expected {m['hidden']}, found {wte.shape[1]}")
    grid = contract.pooled_grid(proc, m["image_tokens"] // m["cameras"])
    # A LeRobot policy's action_mode (its pack step's) decides the expert's encoder mask.
    # (Absent from a LeRobot checkpoint's pack step and policy config: that version's default.)
    action_mode = norm.get("action_mode") or (bpt.UPSTREAMS[a.upstream]["action_mode_default"]
                                              if ck.policy is not None else ck.config.get("action_mode", "both"))
    settings = norm.get("prompt_settings") or contract.prompt_settings(
        {k: v for k, v in ck.config.items() if k != "normalize_language"})
    tokens = bpt.tokenizer_tokens(tok_cfg)
    tables = prompt.tables(tokenizer, wte, instructions, m, grid, proc["col_tokens"], m["seq_len"],
                           action_mode, norm["setup_type"], norm["control_mode"], "--instruction", settings, tokens,
                           a.upstream, cap,
                           paths=(ck.base / "tokenizer.json", tok_cfg_path if tok_cfg_path.is_file() else None))
    m["rope_left_pad"] = int((tables["valid"][0] == 0).sum())  # the version's padding (upstream_layout)
    # What vlad renders run-time instruction text with: the tokenizer, the exact embedding
    # table (its own dtype) and the template settings used for the tables above.
    table, marker = checkpoint.exact_table(wte, checkpoint.embedding_dtype(roots))
    text_files = {"prompt/tokenizer.json": (ck.base / "tokenizer.json").read_bytes(), "prompt/embedding.npy": table}
    m["text"] = {"tokenizer": "prompt/tokenizer.json", "embedding": "prompt/embedding.npy",
                 "grid": [int(grid[0]), int(grid[1])], "col_tokens": bool(proc["col_tokens"]),
                 "setup": norm["setup_type"], "control": norm["control_mode"], **settings,
                 "upstream": a.upstream, "max_sequence_length": cap[0] if cap else None,
                 "action_mode": action_mode}
    if marker:
        m["text"]["embedding_dtype"] = marker
    if tok_cfg_path.is_file():
        text_files["prompt/tokenizer_config.json"] = tok_cfg_path.read_bytes()
        m["text"]["tokenizer_config"] = "prompt/tokenizer_config.json"
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
        "embedding_prefix": prefix, "norm_mode": norm["norm_mode"], "action_mode": action_mode, "upstream": a.upstream,
        "step_output": step_out, "step_output_from": "--step-output" if a.step_output else "onnx/action_step",
        "prompt_matched": proof, "end_to_end_observation": observation,
    }
    if ck.policy is not None:
        provenance.update({"layout": "lerobot", "base_checkpoint": str(ck.base), "statistics": norm["from"],
                           "embedding_from": wte_from, "flow_steps_from": flow_from})
    gates.apply(a, rel_dir, comps, man, provenance)
    bundle.write(a.out, comps, order, man, {"prompt/prompt_tables.npz": tables, **text_files},
                 lambda stage: bundle.end_to_end(stage, comps, order, obs), provenance)
    return {"bundle": str(a.out), **provenance}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pack"]:
        from . import pack  # Fast-WAM instruction packs for a bundle already built

        return pack.main(argv[1:])
    a = arguments(argv)
    try:
        report = run(a)
    except ImportRefused as exc:
        print(f"vla-import: {exc}", file=sys.stderr)
        return 1
    if "prompt_matched" in report:
        print(f"vla-import: wrote {report['bundle']} (prompt traced with instruction "
              f"{report['prompt_matched']['instruction']}: {report['prompt_matched']['text']!r}; "
              f"end-to-end observation {report['end_to_end_observation']})")
    elif report.get("closed_loop"):
        print(f"vla-import: wrote {report['bundle']} (Fast-WAM closed loop; text rows traced with instruction "
              f"{report['traced']['instruction']!r}; end-to-end observation {report['end_to_end_observation']})")
    else:
        print(f"vla-import: wrote {report['bundle']} (Fast-WAM OPEN LOOP: {report['open_loop']}; "
              f"end-to-end observation {report['end_to_end_observation']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
