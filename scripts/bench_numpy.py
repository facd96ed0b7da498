#!/usr/bin/env python3
"""The numpy / ONNX Runtime side of `scripts/bench.sh`, and the one table it prints.

    bench_numpy.py host --iterations N --json FILE
        The host glue of one inference at the seeds' full dimensions, on synthetic tensors
        with no graph execution, through tools/vla_host/vla_host/reference.py itself (its functions, and
        its whole run_molmoact2 / run_fastwam with runners that return ready outputs).
    bench_numpy.py ort --bundle DIR [--bundle DIR ...] --vlad VLAD --iterations N --json FILE
        Each fixture bundle end to end through ONNX Runtime's QNN EP (EPContext wrappers of
        the bundle's own context binaries, made under build/bench/ort/) with the numpy
        glue of tools/vla_host/vla_host/reference.py: latency, pure session.run time, host overhead.
    bench_numpy.py render --dir build/bench
        Reads the JSON files of a run and writes latest.md (printed too) and latest.json.

Timings are figures only; nothing here asserts one.
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from vla_host import reference as ref
from vla_host.det_npz import load_npz

REPO = Path(__file__).resolve().parent.parent

# The seeds' full dimensions (the releases' model cards); k_ctx/v_ctx are
# not given by the cards: [36,1,S,768] (36 action-expert blocks of width 768) as in Rust.
MOLMO = {
    "molmoact2-original": dict(image_tokens=392, seq=488, flow_steps=10),
    "molmoact2-lp-vtp-sd": dict(image_tokens=32, seq=130, flow_steps=2),
}
COMMON = dict(cameras=2, frame=256, crop=378, patch=14, hidden=2560, splits=4, layers_per_split=9,
              kv_width=1024, ctx_layers=36, ctx_width=768, horizon=10, action_width=32, action_dims=7,
              state_dims=8)
EVICT = np.ones(64 << 18, np.float32)  # 64 MiB, twice the L3 here


def cold():
    """The NPU writes its outputs by DMA: start every timed step with cold caches."""
    np.add(EVICT, 1.0, out=EVICT)


def timed(fn):
    cold()
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1e3, out


def quantiles(samples):
    s = sorted(samples)
    if not s:
        return 0.0, 0.0, 0.0
    rank = lambda q: s[min(len(s), max(1, int(np.ceil(q * len(s))))) - 1]  # noqa: E731
    return rank(0.5), rank(0.99), s[-1]


def quantile_norm(dims, low, high):
    return {"mode": "quantile", "low": [low] * dims, "high": [high] * dims}


def molmo_case(name):
    d = dict(COMMON, **MOLMO[name])
    rng = np.random.default_rng(0)
    s, h = d["seq"], d["hidden"]
    image_positions = np.arange(4, 4 + d["image_tokens"], dtype=np.int64)
    state_positions = np.arange(s - 40, s - 40 + d["state_dims"], dtype=np.int64)
    tables = {
        "scaffold": rng.standard_normal((1, s, h), np.float32).astype(np.float16),
        "valid": np.ones((1, s), np.uint8),
        "image_positions": image_positions[None],
        "state_positions": state_positions[None],
        "state_token_rows": rng.standard_normal((256, h), np.float32).astype(np.float16),
    }
    m = {
        "cameras": d["cameras"], "crop_size": d["crop"], "patch_size": d["patch"],
        "llm_splits": d["splits"], "action_width": d["action_width"], "action_dims": d["action_dims"],
        "action_horizon": d["horizon"], "flow_steps": d["flow_steps"], "step_output": "velocity",
        "keystone": None, "attention_blocked_value": float(np.finfo(np.float32).min),
        "state_norm": quantile_norm(d["state_dims"], -2.0, 2.0),
        "action_norm": quantile_norm(d["action_dims"], -1.0, 1.0),
    }
    kv = (d["layers_per_split"], 1, s, d["kv_width"])
    ctx = (d["ctx_layers"], 1, s, d["ctx_width"])
    outputs = {
        "vision": {"image_embeds": rng.standard_normal((d["image_tokens"], h), np.float32)},
        "llm": {"hidden_out": rng.standard_normal((1, s, h), np.float32),
                "keys": rng.standard_normal(kv, np.float32), "values": rng.standard_normal(kv, np.float32)},
        "action_context": {"k_ctx": rng.standard_normal(ctx, np.float32),
                           "v_ctx": rng.standard_normal(ctx, np.float32)},
        "action_step": {"next_trajectory": rng.standard_normal((1, d["horizon"], d["action_width"]), np.float32)},
    }
    # Each split returns its own KV arrays, as a session would.
    splits = [{k: v.copy() for k, v in outputs["llm"].items()} for _ in range(d["splits"])]

    def run(component, feeds):
        if component.startswith("llm_split"):
            return splits[int(component[len("llm_split"):])]
        return outputs[component]

    frames = rng.integers(0, 256, (d["cameras"], d["frame"], d["frame"], 3), dtype=np.uint8)
    state = rng.uniform(-1, 1, d["state_dims"]).astype(np.float32)
    return d, m, tables, run, splits, outputs, frames, state


def bench_molmo(name, iterations):
    d, m, tables, run, splits, outputs, frames, state = molmo_case(name)
    manifest = {"molmoact2": m}
    steps = {k: [] for k in ("preprocess", "prompt rows", "attention bias", "KV assembly", "flow loop",
                             "de-normalize")}
    totals = []
    keep = np.ones((1, d["action_width"]), np.float32)
    keep[0, d["action_dims"]:] = 0
    for it in range(iterations + 1):
        row = {}
        row["preprocess"], _ = timed(lambda: ref.pixel_values_from_frames(frames, d["crop"], d["patch"]))
        row["prompt rows"], _ = timed(lambda: ref.embed_prompt(tables, 0, outputs["vision"]["image_embeds"], state,
                                                               m["state_norm"]))
        row["attention bias"], _ = timed(lambda: ref.attention_bias(tables["valid"][0], ref.image_block(tables, 0),
                                                                    m["attention_blocked_value"]))
        row["KV assembly"], _ = timed(lambda: (np.concatenate([s["keys"] for s in splits]),
                                               np.concatenate([s["values"] for s in splits])))
        base = {"k_ctx": outputs["action_context"]["k_ctx"], "v_ctx": outputs["action_context"]["v_ctx"],
                "encoder_attention_mask": tables["valid"][0][None].astype(np.float32),
                "action_dim_is_pad": 1 - keep}

        def flow():
            noise = ref.gaussian_noise(7, (1, d["horizon"], d["action_width"])) * keep
            return ref.flow_loop(run, base, noise, d["flow_steps"], "velocity", keep)

        row["flow loop"], x = timed(flow)
        row["de-normalize"], _ = timed(lambda: ref.denormalize(x[0, :, :d["action_dims"]], m["action_norm"]))
        total, _ = timed(lambda: ref.run_molmoact2(manifest, tables, run, frames, state, 0, 7))
        if it > 0:
            for k, v in row.items():
                steps[k].append(v)
            totals.append(total)
    kv_bytes = 2 * d["splits"] * d["layers_per_split"] * d["seq"] * d["kv_width"] * 4
    out_steps = []
    for k, v in steps.items():
        p50, p99, mx = quantiles(v)
        entry = {"step": k, "p50_ms": p50, "p99_ms": p99, "max_ms": mx}
        if k == "KV assembly":
            entry["bytes"] = 2 * kv_bytes  # every byte read once and written once
        out_steps.append(entry)
    p50, p99, _ = quantiles(totals)
    return {"variant": name, "iterations": iterations, "steps": out_steps, "total_p50_ms": p50,
            "total_p99_ms": p99, "kv_bytes_copied": kv_bytes,
            "note": "total = reference.run_molmoact2 end to end with runners returning ready outputs"}


def bench_fastwam(iterations):
    rng = np.random.default_rng(1)
    f = {"action_horizon": 32, "action_dims": 7, "flow_steps": 10, "shift": 5.0, "gripper_binarize": True,
         "action_norm": quantile_norm(7, -1.0, 1.0)}
    world = {"video_keys": rng.standard_normal((30, 1, 98, 3072), np.float32),
             "video_values": rng.standard_normal((30, 1, 98, 3072), np.float32),
             "context": rng.standard_normal((1, 129, 4096), np.float32),
             "context_mask": np.ones((1, 129), np.float32)}
    pred = {"pred_noise": rng.standard_normal((1, 32, 7), np.float32)}
    samples = []
    for it in range(iterations + 1):
        ms, _ = timed(lambda: ref.run_fastwam({"fastwam": f}, world, lambda c, feeds: pred, 7))
        if it > 0:
            samples.append(ms)
    p50, p99, mx = quantiles(samples)
    return {"variant": "fastwam", "iterations": iterations,
            "steps": [{"step": "flow loop + de-normalize", "p50_ms": p50, "p99_ms": p99, "max_ms": mx}],
            "total_p50_ms": p50, "total_p99_ms": p99,
            "note": "total = reference.run_fastwam with a runner returning a ready pred_noise"}


def bench_fastwam_chain(iterations):
    """The closed-loop chain's host work at the card's dimensions, as a user would write it:
    Pillow's own C resize (what upstream calls) and numpy for the rest."""
    from PIL import Image

    rng = np.random.default_rng(2)
    frames = rng.integers(0, 256, (2, 256, 256, 3), np.uint8)
    state = rng.uniform(-1, 1, 8).astype(np.float32)
    weight = rng.uniform(-1, 1, (4096, 8)).astype(np.float32)
    bias = rng.uniform(-1, 1, 4096).astype(np.float32)
    low, high = np.full(8, -1.0, np.float32), np.full(8, 1.0, np.float32)
    scale = (np.float32(2) / (high - low)).astype(np.float32)
    offset = (np.float32(-1) - low * scale).astype(np.float32)

    def image():
        cams = []
        for cam in frames:
            turned = np.ascontiguousarray(cam[::-1, ::-1])
            small = np.asarray(Image.fromarray(turned).resize((224, 224), Image.BILINEAR))
            cams.append(small.astype(np.float32) * np.float32(2 / 255) - np.float32(1))
        return np.concatenate(cams, axis=1).transpose(2, 0, 1)[None]

    def proprio():
        s = np.clip(state * scale + offset, -5, 5)
        return weight @ s + bias

    steps = {"camera frames -> image": [], "state -> proprio row": []}
    totals = []
    for it in range(iterations + 1):
        a, _ = timed(image)
        b, _ = timed(proprio)
        if it > 0:
            steps["camera frames -> image"].append(a)
            steps["state -> proprio row"].append(b)
            totals.append(a + b)
    out = []
    for k, v in steps.items():
        p50, p99, mx = quantiles(v)
        out.append({"step": k, "p50_ms": p50, "p99_ms": p99, "max_ms": mx})
    p50, p99, _ = quantiles(totals)
    return {"variant": "fastwam-closed-loop", "iterations": iterations, "steps": out,
            "total_p50_ms": p50, "total_p99_ms": p99,
            "note": "Pillow Image.resize (C) per camera + numpy; the same steps as ours"}


def cmd_host(args):
    doc = {"numpy": np.__version__,
           "variants": [bench_molmo(n, args.iterations) for n in MOLMO] + [bench_fastwam(args.iterations),
                                                                    bench_fastwam_chain(args.iterations)]}
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


# ---------------------------------------------------------------------------------------
# ONNX Runtime QNN EP on the fixture bundles
# ---------------------------------------------------------------------------------------


def inspect_graph(vlad: Path, binary: Path, lib_dir: str):
    """Graph name and (inputs, outputs) as [(name, shape)] from `vlad inspect`."""
    out = subprocess.run([str(vlad), "inspect", str(binary), "--lib-dir", lib_dir], check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True).stdout
    name, io = None, {"input": [], "output": []}
    for line in out.splitlines():
        g = re.match(r"\s*graph\s+(\S+)\s+\(", line)
        if g:
            name = g.group(1)
            continue
        t = re.match(r"\s*(in|out)\s+(\S+)\s.*?\[([\d, ]*)\]\s+f32", line)
        if t:
            section = "input" if t.group(1) == "in" else "output"
            io[section].append((t.group(2), [int(x) for x in t.group(3).replace(" ", "").split(",") if x]))
    if not name or not io["input"] or not io["output"]:
        raise RuntimeError(f"{binary}: cannot read graph name and tensors from `vlad inspect`:\n{out}")
    return name, io["input"], io["output"]


def make_wrapper(binary: Path, out_dir: Path, component: str, vlad: Path, lib_dir: str) -> Path:
    """An EPContext model that runs `binary` (copied beside it) through the QNN EP."""
    import onnx
    from onnx import TensorProto, helper

    out_dir.mkdir(parents=True, exist_ok=True)
    local_bin = out_dir / f"{component}_ctx_qnn.bin"
    shutil.copyfile(binary, local_bin)
    graph_name, inputs, outputs = inspect_graph(vlad, local_bin, lib_dir)
    node = helper.make_node(
        "EPContext", [n for n, _ in inputs], [n for n, _ in outputs], name=graph_name, domain="com.microsoft",
        main_context=1, ep_cache_context=local_bin.name, embed_mode=0, source="QNNExecutionProvider",
        partition_name=graph_name)
    graph = helper.make_graph(
        [node], component,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                     helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    path = out_dir / f"{component}_ctx.onnx"
    onnx.save(model, str(path))
    return path


class TimedSession:
    """A QNN EP session that adds the wall time of each session.run to a shared total."""

    def __init__(self, session, clock):
        self.session, self.clock = session, clock

    def __call__(self, feeds):
        t = time.perf_counter()
        out = self.session(feeds)
        self.clock.append((self.session.component, time.perf_counter() - t))
        return out


def bench_ort_bundle(bundle: Path, vlad: Path, lib_dir: str, iterations: int, build: Path):
    from vla_host import qnn_ctx

    manifest = json.loads((bundle / "bundle.json").read_text())
    name = bundle.name
    t = time.perf_counter()
    sessions = {}
    for component, entry in manifest["components"].items():
        wrapper = make_wrapper(bundle / entry["binary"], build / name, component, vlad, lib_dir)
        s = qnn_ctx.HtpSession(wrapper)
        s.component = component
        sessions[component] = s
    load_ms = (time.perf_counter() - t) * 1e3
    clock = []
    runners = {c: TimedSession(s, clock) for c, s in sessions.items()}
    golden = load_npz(bundle / manifest["end_to_end"])
    seed = int(golden["seed"][0])
    if manifest["policy"] == "molmoact2":
        tables = load_npz(bundle / manifest["molmoact2"]["prompt"])

        def infer():
            return ref.run_molmoact2(manifest, tables, lambda c, f: runners[c](f), golden["frames"],
                                     golden["state"], int(golden["instruction_id"][0]), seed)
    else:
        world = load_npz(bundle / manifest["fastwam"]["world_model"])

        def infer():
            return ref.run_fastwam(manifest, world, lambda c, f: runners[c](f), seed)

    infer()  # warm-up
    totals, executes, per_component = [], [], {}
    for _ in range(iterations):
        clock.clear()
        t = time.perf_counter()
        result = infer()
        totals.append((time.perf_counter() - t) * 1e6)
        executes.append(sum(d for _, d in clock) * 1e6)
        sums = {}
        for c, d in clock:
            sums[c] = sums.get(c, 0.0) + d * 1e6
        for c, v in sums.items():
            per_component.setdefault(c, []).append(v)
    cos = ref.cosine(result["actions"], golden["actions"])
    overhead = [t - e for t, e in zip(totals, executes)]
    p = quantiles
    return {
        "bundle": name, "iterations": iterations, "load_ms": load_ms,
        "total_p50_us": p(totals)[0], "total_p99_us": p(totals)[1],
        "execute_p50_us": p(executes)[0],
        "host_overhead_p50_us": p(overhead)[0],
        "host_overhead_pct": 100.0 * p(overhead)[0] / max(p(executes)[0], 1e-9),
        "components": {c: {"p50_us": p(v)[0], "p99_us": p(v)[1]} for c, v in per_component.items()},
        "actions_cosine_vs_golden": cos,
    }


def cmd_ort(args):
    lib_dir = args.lib_dir
    build = Path(args.build)
    doc = {"onnxruntime_qnn": True, "bundles": [bench_ort_bundle(Path(b), Path(args.vlad), lib_dir,
                                                                 args.iterations, build) for b in args.bundle]}
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


# ---------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def verdict(ok):
    return "met" if ok else "MISSED"


def render(d: Path):
    rust, numpy = read_json(d / "host-rust.json"), read_json(d / "host-numpy.json")
    ring, loop = read_json(d / "ring.json"), read_json(d / "loop.json")
    ort = {"bundles": [b for p in sorted(d.glob("ort-*.json")) for b in read_json(p)["bundles"]]}
    ours = [read_json(p) for p in sorted(d.glob("bundle-*.json"))]
    meta = read_json(d / "meta.json") or {}
    lines, targets = [], []
    add = lines.append
    add(f"# Benchmarks ({meta.get('date', '?')}, {meta.get('machine', '?')})\n")
    add(f"Command: `{meta.get('command', 'scripts/bench.sh')}`. Figures only; the machine is shared, so compare "
        "the ratios within this run.\n")
    if rust and numpy:
        bw = rust["memcpy_bytes_per_s"]
        add(f"## 1. Host work per inference at full dimensions (synthetic tensors, no graph execution)\n")
        add(f"memcpy in this run: best {bw / 1e9:.2f} GB/s, median {rust['memcpy_bytes_per_s_median'] / 1e9:.2f} GB/s "
            "(bytes read + written per second over a 64 MiB copy). Floor = bytes the step reads and writes / best "
            "memcpy rate. Every step starts with cold caches (the NPU writes by DMA).\n")
        npv = {v["variant"]: v for v in numpy["variants"]}
        for v in rust["variants"]:
            n = npv.get(v["variant"])
            nsteps = {s["step"]: s for s in (n or {}).get("steps", [])}
            add(f"### {v['variant']}  {json.dumps(v.get('dims', {}))}\n")
            add("| step | ours p50 ms | ours p99 ms | bytes (ours) | floor ms | numpy p50 ms | what we do |")
            add("|---|---:|---:|---:|---:|---:|---|")
            for s in v["steps"]:
                ns = nsteps.get(s["step"]) or nsteps.get({"vision guard": "", "chain guards": "",
                                                          "action_context guard": ""}.get(s["step"], s["step"]))
                add(f"| {s['step']} | {fmt(s['p50_ms'], 3)} | {fmt(s['p99_ms'], 3)} | {s['bytes']:,} | "
                    f"{fmt(s['floor_ms'], 3)} | {fmt(ns['p50_ms'], 3) if ns else '(none)'} | {s['what']} |")
            for s in (n or {}).get("steps", []):
                if s["step"] not in {x["step"] for x in v["steps"]}:
                    extra = f" ({s['bytes']:,} bytes)" if "bytes" in s else ""
                    add(f"| {s['step']} | 0 (once per instruction: "
                        f"{fmt(v.get('once_per_instruction_ms'), 3)} ms) | - | 0 | 0 | {fmt(s['p50_ms'], 3)}{extra} | "
                        "precomputed at load, not per inference |")
            guards = sum(s["p50_ms"] for s in v["steps"] if "guard" in s["step"])
            same_steps = v["total_p50_ms"] - guards
            ratio_floor = v["total_p50_ms"] / max(v["floor_ms"], 1e-9)
            add("")
            if v["total_p50_ms"] < 0.1:
                add("(Tens of microseconds of arithmetic on a few KB: seeded normals (log, sqrt, sin, cos per pair) "
                    "dominate, not memory; the bandwidth floor is not the bound at this size.)")
            add(f"Total ours p50 {fmt(v['total_p50_ms'], 3)} ms (p99 {fmt(v['total_p99_ms'], 3)}), "
                f"{v['bytes_per_inference']:,} bytes, floor {fmt(v['floor_ms'], 3)} ms -> **{ratio_floor:.2f}x the floor**; "
                f"allocations per inference {v['allocations_per_inference']:g}.")
            if n:
                speedup_all = n["total_p50_ms"] / max(v["total_p50_ms"], 1e-9)
                speedup_same = n["total_p50_ms"] / max(same_steps, 1e-9)
                add(f"numpy (reference.py end to end, no graph execution) p50 {fmt(n['total_p50_ms'], 3)} ms -> "
                    f"**ours {speedup_all:.1f}x faster** including our non-finite guards ({fmt(guards, 3)} ms, which "
                    f"numpy does not do), **{speedup_same:.1f}x** on the same steps.")
                if "critical_path_p50_ms" in v:
                    crit_steps = ("preprocess", "prompt rows", "flow loop", "de-normalize")
                    n_crit = sum(nsteps[k]["p50_ms"] for k in crit_steps if k in nsteps)
                    ratio_crit = v["critical_path_p50_ms"] / max(v["critical_path_floor_ms"], 1e-9)
                    off = ", ".join(s["step"] for s in v["steps"] if s.get("off_critical_path"))
                    add(f"Critical path (all of the above but {off}, which run on a helper thread "
                        f"while the next context executes): ours p50 {fmt(v['critical_path_p50_ms'], 3)} ms "
                        f"(p99 {fmt(v['critical_path_p99_ms'], 3)}) vs the floor of the bytes that must be written "
                        f"(pixel_values, the observation's prompt rows, the trajectory: "
                        f"{v['critical_path_written_bytes']:,} bytes) {fmt(v['critical_path_floor_ms'], 3)} ms "
                        f"-> **{ratio_crit:.2f}x**; numpy on the same steps ({', '.join(crit_steps)}) "
                        f"{fmt(n_crit, 3)} ms, end to end {fmt(n['total_p50_ms'], 3)} ms.")
                    one = v.get("one_thread_p50_ms")
                    bw2 = rust.get("memcpy_two_threads_bytes_per_s")
                    if one and bw2:
                        floor2 = v["critical_path_written_bytes"] / bw2 * 1e3
                        add(f"Preprocess and prompt rows run in halves on two threads (the inference thread "
                            f"and vla-fork); on one thread, in the same iterations: preprocess "
                            f"{fmt(one['preprocess'], 3)} ms, prompt rows {fmt(one['prompt rows'], 3)} ms. "
                            f"memcpy in halves on two threads: best {bw2 / 1e9:.2f} GB/s "
                            f"({bw2 / bw:.2f}x one thread); the critical path against the write floor at that "
                            f"rate ({fmt(floor2, 3)} ms): {v['critical_path_p50_ms'] / max(floor2, 1e-9):.2f}x.")
                    targets.append((f"critical-path host work {v['variant']} within 1.5x of the write floor",
                                    f"{ratio_crit:.2f}x", ratio_crit <= 1.5))
                if "kv_bytes_copied" in n:
                    add(f"KV assembly: numpy copies {n['kv_bytes_copied']:,} bytes per inference "
                        f"(np.concatenate); ours 0 (splits write in place).")
                targets.append((f"host work {v['variant']} within 2x of the floor", f"{ratio_floor:.2f}x",
                                ratio_floor <= 2.0))
                targets.append((f"host work {v['variant']} >= 20x faster than numpy",
                                f"{speedup_all:.1f}x (same steps {speedup_same:.1f}x)", speedup_all >= 20.0))
            targets.append((f"zero allocations per inference ({v['variant']} host glue)",
                            f"{v['allocations_per_inference']:g}", v["allocations_per_inference"] == 0))
            add("")
    if ours:
        add("## 2. Fixture bundles on the HTP emulator: ours vs ONNX Runtime QNN EP + numpy glue\n")
        add("The x86 HTP emulator's execute time dominates every figure here (it emulates the DSP); "
            "host overhead is what the runtime adds around it.\n")
        add("| bundle | ours p50 us | ours p99 us | execute sum p50 us | host overhead us | overhead % | "
            "ORT p50 us | ORT overhead us | ORT overhead % | ours/ORT |")
        add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        ortb = {b["bundle"]: b for b in (ort or {}).get("bundles", [])}
        for b in ours:
            o = ortb.get(b["bundle"])
            ratio = b["total_p50_us"] / o["total_p50_us"] if o else None
            add(f"| {b['bundle']} | {fmt(b['total_p50_us'], 0)} | {fmt(b['total_p99_us'], 0)} | "
                f"{fmt(b['execute_p50_us'], 0)} | {fmt(b['host_overhead_p50_us'], 1)} | "
                f"{fmt(b['host_overhead_pct'], 3)} | {fmt(o and o['total_p50_us'], 0)} | "
                f"{fmt(o and o['host_overhead_p50_us'], 1)} | {fmt(o and o['host_overhead_pct'], 2)} | {fmt(ratio, 3)} |")
            targets.append((f"host overhead < 1% of execute ({b['bundle']})", f"{b['host_overhead_pct']:.3f}%",
                            b["host_overhead_pct"] < 1.0))
        add("\nPer component, ours (p50 / p99 us of the component's execute time per inference):\n")
        for b in ours:
            comps = ", ".join(f"{c['component']} {fmt(c['p50_us'], 0)}/{fmt(c['p99_us'], 0)}" for c in b["components"])
            add(f"- {b['bundle']}: {comps}")
        add("\n## 3. Context load: mmap vs read into heap (fresh process each)\n")
        add("| bundle | binaries bytes | mode | load ms | RSS delta MiB | PSS delta MiB | anon delta MiB | "
            "file-backed delta MiB | RSS after MiB | PSS after MiB |")
        add("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for b in ours:
            for mode, l in b.get("load", {}).items():
                mib = lambda k: fmt(l.get(k, 0) / 1048576.0, 2)  # noqa: E731
                add(f"| {b['bundle']} | {b['binaries_bytes']:,} | {mode} | {fmt(l['load_ms'], 1)} | "
                    f"{mib('rss_delta')} | {mib('pss_delta')} | {mib('anon_delta')} | {mib('file_delta')} | "
                    f"{mib('rss_after')} | {mib('pss_after')} |")
        add("")
    if ring:
        add("## 5. Write-to-visible latency across two processes\n")
        fifo = "SCHED_FIFO 50" if ring["ring"].get("reader_sched_fifo") else "SCHED_OTHER (FIFO refused)"
        add(f"{ring['messages']} messages, one every {ring['gap_us']} us, writer and reader pinned to different CPUs, "
            f"{fifo}.\n")
        add("| channel | p50 us | p99 us | max us | received |")
        add("|---|---:|---:|---:|---:|")
        for k, label in (("ring", "action ring (seqlock, reader polls)"), ("pipe", "pipe (reader blocks in read)")):
            r = ring[k]
            add(f"| {label} | {fmt(r['p50_us'], 3)} | {fmt(r['p99_us'], 3)} | {fmt(r['max_us'], 1)} | "
                f"{r['received']}/{r['sent']} |")
        targets.append(("ring p99 <= 2 us", f"{ring['ring']['p99_us']:.3f} us", ring["ring"]["p99_us"] <= 2.0))
        add("")
    if loop:
        add("## 4. Control-loop jitter vs cyclictest\n")
        add("| rate | source | samples | p50 us | p99 us | max us | deadline misses |")
        add("|---|---|---:|---:|---:|---:|---:|")
        for r in loop.get("rows", []):
            add(f"| {r['hz']} Hz | {r['source']} | {r.get('samples', '-')} | {fmt(r.get('p50_us'), 1)} | "
                f"{fmt(r.get('p99_us'), 1)} | {fmt(r.get('max_us'), 1)} | {r.get('misses', '-')} |")
        if loop.get("note"):
            add(f"\n{loop['note']}")
        for r in loop.get("rows", []):
            if "allocations_per_tick" in r:
                targets.append((f"zero allocations per tick ({r['hz']} Hz loop)", f"{r['allocations_per_tick']:g}",
                                r["allocations_per_tick"] == 0))
        for hz in sorted({r["hz"] for r in loop.get("rows", [])}):
            ours_r = next((r for r in loop["rows"] if r["hz"] == hz and r["source"] != "cyclictest"), None)
            ct = next((r for r in loop["rows"] if r["hz"] == hz and r["source"] == "cyclictest"), None)
            if ours_r and ct and ct.get("p99_us"):
                ratio = ours_r["p99_us"] / ct["p99_us"]
                targets.append((f"loop jitter p99 within 2x of cyclictest ({hz} Hz)", f"{ratio:.2f}x", ratio <= 2.0))
        add("")
    add("## 6. Release binaries\n")
    for name, size in (meta.get("binaries") or {}).items():
        add(f"- `{name}`: {size:,} bytes (stripped, LTO)")
    add("")
    if meta.get("allocations_note"):
        add(meta["allocations_note"] + "\n")
    add("## Targets\n")
    add("| target | this run | verdict |")
    add("|---|---|---|")
    for what, value, ok in targets:
        add(f"| {what} | {value} | {verdict(ok)} |")
    add("")
    text = "\n".join(lines)
    (d / "latest.md").write_text(text)
    (d / "latest.json").write_text(json.dumps({
        "meta": meta, "host_rust": rust, "host_numpy": numpy, "bundles": ours, "ort": ort, "ring": ring,
        "loop": loop, "targets": [{"target": w, "value": v, "met": ok} for w, v, ok in targets]}, indent=2) + "\n")
    print(text)


def update_doc(doc: Path, table: Path):
    """Replaces everything after the doc's '## Latest table' line with the table, its
    headings pushed one level down."""
    marker = "## Latest table"
    text = doc.read_text()
    if marker not in text:
        sys.exit(f"{doc}: no '{marker}' section")
    body = re.sub(r"(?m)^# Benchmarks \((.*)\)$", r"Run of \1.", table.read_text())
    body = re.sub(r"(?m)^(##+) ", lambda m: "#" + m.group(1) + " ", body)
    doc.write_text(text[:text.index(marker) + len(marker)] + "\n\n" + body)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("host")
    h.add_argument("--iterations", type=int, default=10)
    h.add_argument("--json", required=True)
    o = sub.add_parser("ort")
    o.add_argument("--bundle", action="append", required=True)
    o.add_argument("--vlad", required=True)
    o.add_argument("--lib-dir", required=True)
    o.add_argument("--iterations", type=int, default=50)
    o.add_argument("--build", default=str(REPO / "build" / "bench" / "ort"))
    o.add_argument("--json", required=True)
    r = sub.add_parser("render")
    r.add_argument("--dir", required=True)
    r.add_argument("--doc", help="also put the table under '## Latest table' of this markdown file")
    args = ap.parse_args()
    if args.cmd == "host":
        cmd_host(args)
    elif args.cmd == "ort":
        cmd_ort(args)
    else:
        render(Path(args.dir))
        if args.doc:
            update_doc(Path(args.doc), Path(args.dir) / "latest.md")


if __name__ == "__main__":
    main()
