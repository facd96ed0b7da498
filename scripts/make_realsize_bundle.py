"""A MolmoAct2 bundle at the original checkpoint's real tensor sizes, with thin compute.

    .venv/bin/python scripts/make_realsize_bundle.py [--table-rows 52000]

Writes build/realsize/bundle/ (not in git; the ONNX models and compile scratch go to
build/realsize/onnx). The contexts have the seeds' real I/O shapes (MolmoAct2 original:
frames 2 x 256x256, pixel_values [1,2,729,588], image_embeds [392,2560], hidden
[1,488,2560], bias [1,1,488,488], keys/values [9,1,488,1024] per split and [36,1,488,1024]
into action_context, k_ctx/v_ctx [36,1,488,768], trajectory [1,10,32]) but next to no
arithmetic, so `vlad bench-bundle` measures the host side, the load and the memory at
those sizes rather than the emulator's speed. llm_split0 carries one large constant (an
embedding table of `--table-rows` x 2560 f32 read through a Gather whose indices depend
on the input, so nothing can fold it away): its context binary is the >= 256 MB one.

The prompt tables, goldens and end-to-end observation come from the same code as
golden/ (make_golden.py, build_prompt_tables.py, reference.py), at these sizes; the
prompt is padded on the left to the real sequence length of 488. Prints the time and
peak memory of each step. Not run in CI.
"""

import argparse
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vla_host import build_prompt_tables as bpt
from vla_goldens import fixture_graphs as fg
from vla_goldens import make_golden as mg
from vla_host import reference as ref
from vla_host.det_npz import save_npz

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "realsize"
NAME = "molmoact2-original-realsize"
SEQ_LEN = 488
CONTEXT_LAYERS, CONTEXT_WIDTH = 36, 768  # as vla-bench host assumes for k_ctx/v_ctx

DIMS = replace(fg.MolmoDims(), crop=378, patch=14, tokens_per_camera=196, hidden=2560,
               kv_width=1024, splits=4, layers_per_split=9, context_width=CONTEXT_WIDTH,
               horizon=10, action_width=32)


def log(msg):
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    children_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    print(f"[{time.time() - STARTED:7.1f}s, peak RSS {peak_gb:.2f} GB, children {children_gb:.2f} GB] {msg}",
          flush=True)


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def model(nodes, inputs, outputs, inits, name):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def build_vision(rng):
    """pixel_values -> the first 196 patches of each camera -> one projection to 2560."""
    d, per_cam = DIMS, DIMS.tokens_per_camera
    w = (rng.standard_normal((d.patch_values, d.hidden)) / np.sqrt(d.patch_values)).astype(np.float32)
    nodes = [
        helper.make_node("Slice", ["pixel_values", "s0", "s1", "sax"], ["kept"]),
        helper.make_node("Reshape", ["kept", "rows_shape"], ["rows"]),
        helper.make_node("MatMul", ["rows", "w"], ["image_embeds"]),
    ]
    inits = [const("s0", np.array([0], np.int64)), const("s1", np.array([per_cam], np.int64)),
             const("sax", np.array([2], np.int64)),
             const("rows_shape", np.array([d.image_tokens, d.patch_values], np.int64)), const("w", w)]
    return model(nodes, [f32("pixel_values", [1, d.cameras, d.patches, d.patch_values])],
                 [f32("image_embeds", [d.image_tokens, d.hidden])], inits, "vision")


def build_split(rng, table_rows):
    """hidden_out = hidden + rowmax(bias) (+ a row of the big table for split 0); keys and
    values = one projection of hidden each, repeated over the split's 9 layers."""
    d = DIMS
    wk = (rng.standard_normal((d.hidden, d.kv_width)) / np.sqrt(d.hidden)).astype(np.float32)
    wv = (rng.standard_normal((d.hidden, d.kv_width)) / np.sqrt(d.hidden)).astype(np.float32)
    nodes = [
        # The bias is 0 or float32 min: its row maximum is 0 for a row with a key, float32
        # min for a padding row, clipped so that it stays finite in fp16 on the HTP.
        helper.make_node("ReduceMax", ["attention_bias"], ["row_max"], axes=[3], keepdims=0),
        helper.make_node("Clip", ["row_max", "lo", "hi"], ["row_clip"]),
        helper.make_node("Reshape", ["row_clip", "col_shape"], ["row_col"]),
        helper.make_node("Add", ["hidden_states", "row_col"], ["h0" if table_rows else "h1"]),
        helper.make_node("MatMul", ["hidden_states", "wk"], ["k1"]),
        helper.make_node("MatMul", ["hidden_states", "wv"], ["v1"]),
        helper.make_node("Reshape", ["k1", "kv1_shape"], ["k2"]),
        helper.make_node("Reshape", ["v1", "kv1_shape"], ["v2"]),
        helper.make_node("Concat", ["k2"] * d.layers_per_split, ["keys"], axis=0),
        helper.make_node("Concat", ["v2"] * d.layers_per_split, ["values"], axis=0),
    ]
    inits = [const("col_shape", np.array([1, SEQ_LEN, 1], np.int64)), const("wk", wk), const("wv", wv),
             const("lo", np.array(-1.0, np.float32)), const("hi", np.array(0.0, np.float32)),
             const("kv1_shape", np.array([1, 1, SEQ_LEN, d.kv_width], np.int64))]
    if table_rows:
        table = rng.standard_normal((table_rows, d.hidden), dtype=np.float32) * np.float32(0.01)
        nodes += [
            # Indices from the input (0 or 1 here): the table stays a weight of the graph.
            # Rows 0 (a row with a key) or 1 (a padding row).
            helper.make_node("Neg", ["row_clip"], ["row_pick"]),
            helper.make_node("Reshape", ["row_pick", "idx_shape"], ["row_flat"]),
            helper.make_node("Cast", ["row_flat"], ["idx"], to=TensorProto.INT32),
            helper.make_node("Gather", ["table", "idx"], ["picked"], axis=0),
            helper.make_node("Reshape", ["picked", "hidden_shape"], ["picked3"]),
            helper.make_node("Add", ["h0", "picked3"], ["h1"]),
        ]
        inits += [const("idx_shape", np.array([SEQ_LEN], np.int64)), const("table", table),
                  const("hidden_shape", np.array([1, SEQ_LEN, d.hidden], np.int64))]
    nodes.append(helper.make_node("Identity", ["h1"], ["hidden_out"]))
    kv = [d.layers_per_split, 1, SEQ_LEN, d.kv_width]
    return model(nodes, [f32("hidden_states", [1, SEQ_LEN, d.hidden]), f32("attention_bias", [1, 1, SEQ_LEN, SEQ_LEN])],
                 [f32("hidden_out", [1, SEQ_LEN, d.hidden]), f32("keys", kv), f32("values", kv)], inits, "split")


def build_action_context():
    """k_ctx/v_ctx: the first 768 of each key/value row (no arithmetic)."""
    d = DIMS
    nodes = [
        helper.make_node("Slice", ["keys", "c0", "c1", "cax"], ["k_ctx"]),
        helper.make_node("Slice", ["values", "c0", "c1", "cax"], ["v_ctx"]),
    ]
    inits = [const("c0", np.array([0], np.int64)), const("c1", np.array([CONTEXT_WIDTH], np.int64)),
             const("cax", np.array([3], np.int64))]
    kv = [d.llm_layers, 1, SEQ_LEN, d.kv_width]
    ctx = [CONTEXT_LAYERS, 1, SEQ_LEN, CONTEXT_WIDTH]
    return model(nodes, [f32("keys", kv), f32("values", kv)], [f32("k_ctx", ctx), f32("v_ctx", ctx)],
                 inits, "action_context")


def build_action_step():
    """A velocity from the trajectory, the timestep, one row of k_ctx/v_ctx, the mask and
    the pad flags: every input is read, the big ones barely."""
    d = DIMS
    nodes = [
        helper.make_node("Slice", ["k_ctx", "r0", "r1", "rax"], ["k_row"]),
        helper.make_node("Slice", ["v_ctx", "r0", "r1", "rax"], ["v_row"]),
        helper.make_node("ReduceMean", ["k_row"], ["k_mean"], keepdims=0),
        helper.make_node("ReduceMean", ["v_row"], ["v_mean"], keepdims=0),
        helper.make_node("ReduceMean", ["encoder_attention_mask"], ["m_mean"], keepdims=0),
        helper.make_node("Add", ["k_mean", "v_mean"], ["kv_mean"]),
        helper.make_node("Add", ["kv_mean", "m_mean"], ["ctx_term"]),
        helper.make_node("Add", ["ctx_term", "timestep"], ["offset"]),
        helper.make_node("Mul", ["trajectory", "gain"], ["scaled"]),
        helper.make_node("Add", ["scaled", "offset"], ["raw"]),
        helper.make_node("Sub", ["one", "action_dim_is_pad"], ["keep"]),
        helper.make_node("Mul", ["raw", "keep"], ["next_trajectory"]),
    ]
    inits = [const("r0", np.array([0, 0], np.int64)), const("r1", np.array([1, 1], np.int64)),
             const("rax", np.array([0, 2], np.int64)), const("gain", np.array(-0.5, np.float32)),
             const("one", np.array(1.0, np.float32))]
    ctx = [CONTEXT_LAYERS, 1, SEQ_LEN, CONTEXT_WIDTH]
    traj = [1, d.horizon, d.action_width]
    ins = [f32("trajectory", traj), f32("timestep", [1]), f32("k_ctx", ctx), f32("v_ctx", ctx),
           f32("encoder_attention_mask", [1, SEQ_LEN]), f32("action_dim_is_pad", [1, d.action_width])]
    return model(nodes, ins, [f32("next_trajectory", traj)], inits, "action_step")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table-rows", type=int, default=52000,
                    help="rows of split 0's 2560-wide f32 table (52000: 532 MB of weights)")
    args = ap.parse_args()
    bundle_dir = OUT / "bundle"
    mg.BUILD = OUT / "build"
    mg.FRAME_H = mg.FRAME_W = 256
    for d in (bundle_dir, mg.BUILD):
        if d.exists():
            import shutil
            shutil.rmtree(d)
    (bundle_dir / "prompt").mkdir(parents=True)

    tok, wte = mg.fixture_tokenizer(DIMS)
    # One row of 196 tokens per camera (one column marker each) rather than 14 x 14: the
    # fixture tokenizer's prompt then fits the real 488 (a 14 x 14 grid needs 504).
    grid = (1, DIMS.tokens_per_camera)
    length = len(bpt.encode_prompt(tok, bpt.render_prompt(mg.INSTRUCTIONS[0], DIMS.cameras, grid, mg.STATE_DIMS),
                                   tok.token_to_id("<|im_end|>")))
    longest = max(len(bpt.encode_prompt(tok, bpt.render_prompt(t, DIMS.cameras, grid, mg.STATE_DIMS),
                                        tok.token_to_id("<|im_end|>"))) for t in mg.INSTRUCTIONS)
    dims = replace(DIMS, seq_len=SEQ_LEN, rope_left_pad=SEQ_LEN - length)
    if longest > SEQ_LEN:
        sys.exit(f"prompt of {longest} tokens does not fit {SEQ_LEN}")
    tables = bpt.build_tables(tok, wte, mg.INSTRUCTIONS, dims.cameras, grid, mg.STATE_DIMS, dims.seq_len,
                              dims.rope_left_pad, mg.ACTION_MODE)
    save_npz(bundle_dir / "prompt" / "prompt_tables.npz", tables)
    cfg = dict(mg.MOLMO_VARIANTS["molmoact2-original"], dims=dims)
    manifest = mg.molmo_manifest(NAME, cfg, dims)
    manifest["name"] = NAME
    mg.write_json(bundle_dir / "bundle.json", manifest)
    log(f"prompt tables and manifest: S={dims.seq_len} (prompt {length} + {dims.rope_left_pad} left pad)")

    rng = np.random.default_rng(2026)
    graphs = {"vision": build_vision(rng)}
    for i in range(dims.splits):
        graphs[f"llm_split{i}"] = build_split(rng, args.table_rows if i == 0 else 0)
    graphs["action_context"] = build_action_context()
    graphs["action_step"] = build_action_step()
    log("graphs built")
    mg.log = log
    mg.compile_graphs(NAME, graphs, {}, bundle_dir)
    log("compiled")

    runners = ref.cpu_runners(bundle_dir, mg.BUILD / NAME / "onnx")
    inputs = {
        "frames": mg.synthetic_frames(31, dims.cameras),
        "state": mg.robot_state(32),
        "instruction_id": np.array([cfg["instruction"]], np.int32),
        "seed": np.array([cfg["noise_seed"]], np.uint64),
    }
    result, io = ref.run_bundle(bundle_dir, runners, inputs)
    order = ["frames", "state", "instruction_id", "seed", "actions", "pixel_values", "hidden_states",
             "attention_bias", "k_ctx", "v_ctx", "noise", "candidates", "keystone_choice"]
    mg.write_goldens(bundle_dir, {**inputs, **result}, io, order)
    log("CPU reference run and goldens written")
    sizes = {p.name: p.stat().st_size for p in sorted((bundle_dir / "ctx").iterdir())}
    for name, size in sizes.items():
        log(f"  {name}: {size / 2**20:.1f} MiB")
    total = sum(p.stat().st_size for p in bundle_dir.rglob("*") if p.is_file())
    log(f"bundle {bundle_dir}: {total / 2**20:.1f} MiB in all")


STARTED = time.time()

if __name__ == "__main__":
    main()
