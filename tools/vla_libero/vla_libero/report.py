"""The episode report (success, steps, latency, hold share, the boundary checks), the
contact sheet of both cameras with the applied actions, and the per-suite success table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SUITE_ORDER = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")


def _q(values, q):
    return float(np.percentile(values, q)) if len(values) else float("nan")


def summarize(log: dict, rec, checks: list, meta: dict) -> dict:
    ok, hold, fault, ignored, cut, steps, success = (int(v) for v in log["counts"])
    applied = log["applied"]
    # Robot-side policy latency per chunk: its observation's capture to its first row read.
    capture = {int(s): int(t) for s, _, t in log["published"]}
    first_rows = {}
    for row in applied:
        first_rows.setdefault(int(row[1]), row)
    obs_to_action = [(int(r[5]) - capture[int(r[3])]) / 1e9 for r in first_rows.values() if int(r[3]) in capture]
    inference_ms = [inf.latency_ms for inf in rec.inferences if inf.ok] if rec else []
    ticks = ok + hold + fault
    return {
        **meta,
        "success": bool(success),
        "steps": steps,
        "noop_steps": int(len(log["env_actions"]) - len(applied)),
        "chunks": len(first_rows),
        "env_step_s": {"p50": _q(log["step_s"], 50), "p95": _q(log["step_s"], 95), "max": _q(log["step_s"], 100)},
        "inference_ms": {"p50": _q(inference_ms, 50), "p95": _q(inference_ms, 95), "n": len(inference_ms)},
        "observation_to_first_action_s": {"p50": _q(obs_to_action, 50), "p95": _q(obs_to_action, 95)},
        "ticks": {"ok": ok, "hold": hold, "fault": fault, "ok_of_an_earlier_state": ignored},
        "hold_share": hold / ticks if ticks else float("nan"),
        "cut_chunks": cut,
        "late_rows": int(sum(int(r[5]) > int(r[6]) for r in applied)),
        "recording": str(rec.path) if rec else None,
        "recordings": [str(p) for p in meta.pop("recordings", [])],
        "checks": [c.line() for c in checks],
        "checks_passed": all(c.ok for c in checks),
    }


def rtt(samples: dict) -> dict:
    """The bridge's round trips per request kind, in ms: what it adds, apart from the policy."""
    return {k: {"n": len(v), "p50": 1e3 * _q(v, 50), "p95": 1e3 * _q(v, 95), "max": 1e3 * _q(v, 100)}
            for k, v in samples.items() if v}


def text(s: dict) -> str:
    lines = [
        f"LIBERO episode {s['suite']} task {s['task_index']} ({s['task']}), init state {s['init_index']}",
        f"  success         {'yes' if s['success'] else 'no'} after {s['steps']} policy steps "
        f"(limit {s['max_steps']}, {s['noop_steps']} no-op steps first)",
        f"  chunks          {s['chunks']} (execute_steps {s['execute_steps']}), cut early {s['cut_chunks']}",
        f"  env step        p50 {s['env_step_s']['p50']:.3f} s  p95 {s['env_step_s']['p95']:.3f} s  "
        f"max {s['env_step_s']['max']:.3f} s",
        f"  inference       p50 {s['inference_ms']['p50']:.1f} ms  p95 {s['inference_ms']['p95']:.1f} ms "
        f"({s['inference_ms']['n']} recorded)",
        f"  obs -> action   p50 {s['observation_to_first_action_s']['p50']:.3f} s  "
        f"p95 {s['observation_to_first_action_s']['p95']:.3f} s (robot side, capture to first row read)",
        f"  ticks read      {s['ticks']['ok']} ok, {s['ticks']['hold']} hold, {s['ticks']['fault']} fault: "
        f"hold share {s['hold_share']:.0%} (the arm waits for each inference, by design)",
        f"  recording       {s['recording']}" + (f" (and {len(s['recordings']) - 1} earlier)"
                                                   if len(s["recordings"]) > 1 else ""),
        f"  contact sheet   {s.get('contact_sheet')}",
    ]
    for kind, r in s.get("bridge_rtt_ms", {}).items():
        lines.append(f"  bridge {kind:9s} round trip p50 {r['p50']:.3f} ms  p95 {r['p95']:.3f} ms  max "
                     f"{r['max']:.3f} ms ({r['n']})")
    lines += [
        "  boundary checks:",
    ]
    lines += [f"    {c}" for c in s["checks"]]
    return "\n".join(lines)


def contact_sheet(log: dict, path: Path, rows: int = 8, scale: int = 0) -> Path:
    """Observation points (the frames each inference saw, as upstream's eval turns them:
    agent view | wrist) with the rows applied after each, one line per row."""
    from PIL import Image, ImageDraw
    images = log["point_upstream_images"]
    applied, values = log["applied"], log["applied_values"]
    k_all = len(images)
    picks = sorted(set(np.linspace(0, k_all - 1, min(rows, k_all)).round().astype(int).tolist()))
    _, h, w, _ = images[0].shape
    scale = scale or max(1, 128 // h)
    pw, ph = 2 * w * scale, h * scale
    steps = log["point_steps"]
    text_w = 420
    line_h = 12
    row_h = max(ph, 12 * line_h + 4)
    sheet = Image.new("RGB", (pw + text_w, row_h * len(picks)), "white")
    draw = ImageDraw.Draw(sheet)
    for i, k in enumerate(picks):
        pair = np.concatenate([images[k][0], images[k][1]], axis=1)
        sheet.paste(Image.fromarray(pair).resize((pw, ph), Image.NEAREST), (0, i * row_h))
        start = int(steps[k])
        draw.text((pw + 6, i * row_h + 2), f"observation {k}: after {start} steps", fill="black")
        for j in range(start, min(start + 10, len(values))):
            v = values[j]
            draw.text((pw + 6, i * row_h + 2 + (j - start + 1) * line_h),
                      f"{j:4d} c{int(applied[j][1])} r{int(applied[j][2])} " + " ".join(f"{x:+.2f}" for x in v),
                      fill="black")
    sheet.save(path)
    return path


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95 % interval of a success rate, in percent."""
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100 * max(0.0, centre - half), 100 * min(1.0, centre + half)


def suite_table(summaries: list[dict], policy: str) -> str:
    """Success rate per suite in the papers' LIBERO table form, with the Wilson 95 % interval
    and the published number (its source under the table). An episode that failed with an
    error counts as a failure."""
    from . import conventions as cv
    published = cv.PUBLISHED[policy]
    per: dict[str, list] = {}
    for s in summaries:
        per.setdefault(s["suite"], []).append(bool(s["success"]))
    cols = [x for x in SUITE_ORDER if x in per]
    lines = ["| suite | episodes | success | Wilson 95 % | published |", "|---|---|---|---|---|"]
    rates = []
    for c in cols:
        k, n = sum(per[c]), len(per[c])
        lo, hi = wilson(k, n)
        rates.append(100.0 * k / n)
        pub = published["rates"].get(c)
        lines.append(f"| {c} | {n} | {rates[-1]:.1f} % | {lo:.1f}-{hi:.1f} % | "
                     f"{'-' if pub is None else f'{pub:.1f} %'} |")
    pubs = [published["rates"][c] for c in cols if c in published["rates"]]
    lines.append(f"| average | {sum(len(per[c]) for c in cols)} | {np.mean(rates) if rates else float('nan'):.1f} % | "
                 f"| {f'{np.mean(pubs):.1f} %' if len(pubs) == len(cols) and pubs else '-'} |")
    lines.append(f"\npublished: {published['source']}")
    return "\n".join(lines)


def task_table(summaries: list[dict]) -> str:
    """Per task: episodes, success with its interval, policy steps to success (median), and
    what the failures were (step limit, an error, a failed boundary check)."""
    per: dict[tuple, list] = {}
    for s in summaries:
        per.setdefault((s["suite"], s["task_index"], s["task"]), []).append(s)
    lines = ["| suite | task | episodes | success | Wilson 95 % | steps to success (median) | failures |",
             "|---|---|---|---|---|---|---|"]
    for (suite, index, name), eps in sorted(per.items()):
        k, n = sum(bool(e["success"]) for e in eps), len(eps)
        lo, hi = wilson(k, n)
        steps = [e["steps"] for e in eps if e["success"]]
        fails = {"step limit": 0, "error": 0, "check failed": 0}
        for e in eps:
            if e.get("error"):
                fails["error"] += 1
            elif not e["success"]:
                fails["step limit"] += 1
            if e.get("checks") and not e["checks_passed"]:
                fails["check failed"] += 1
        lines.append(f"| {suite} | {index}: {name} | {n} | {100 * k / n:.1f} % | {lo:.1f}-{hi:.1f} % | "
                     f"{np.median(steps) if steps else '-'} | "
                     + (", ".join(f"{v} {k_}" for k_, v in fails.items() if v) or "-") + " |")
    return "\n".join(lines)


def bundle_hash(bundle: Path) -> str:
    """SHA-256 over the bundle's files (relative path and bytes, in path order)."""
    import hashlib
    h = hashlib.sha256()
    for p in sorted(x for x in Path(bundle).rglob("*") if x.is_file()):
        h.update(str(p.relative_to(bundle)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def run_header(conv, bundle: Path, out: Path, publish_hz: float, fault) -> dict:
    """What a run is: the stack installed, upstream's settings with their sources, what
    differs from upstream, the bundle's hash, the package versions."""
    from importlib.metadata import version
    from . import conventions as cv
    stack = {p: version(p) for p in ("hf-libero", "mujoco", "robosuite", "numpy", "pillow")}
    want = cv.setting(conv.policy, "stack")
    differences = list(conv.differences())
    if stack["mujoco"] != want["mujoco"]:
        differences.append(f"MuJoCo {stack['mujoco']}, upstream {want['mujoco']}")
    if conv.policy == "fastwam":
        differences.append("LIBERO code from hf-libero 0.1.4, not a checkout of official LIBERO: the same task "
                           "content (bddl files, init states, task order checked against 8f1084e); env code differs "
                           "only in the asset path lookup, gym -> gymnasium, torch.load(weights_only=False)")
    if conv.policy == "molmoact2":
        differences.append("policy noise: vlad's SplitMix64 normals from each observation's seed (point p of every "
                           "episode the same), not LeRobot's per-episode torch generator seeded eval_seed + the "
                           "episode's index within its task (docs/libero.md)")
    if fault:
        differences.append(f"fault injected on purpose: {', '.join(fault)}")
    return {"policy": conv.policy, "as_upstream": not differences, "differences": differences,
            "upstream_stack": want, "installed": stack,
            "settings": cv.UPSTREAM[conv.policy], "bundle": str(bundle),
            "bundle_sha256": bundle_hash(Path(bundle)) if Path(bundle).is_dir() else None,
            "publish_hz": publish_hz}


def header_text(run: dict) -> str:
    lines = [f"LIBERO evaluation of a {run['policy']} bundle: "
             + ("as upstream evaluates it" if run["as_upstream"] else "NOT as upstream, differences:")]
    lines += [f"  - {d}" for d in run["differences"]]
    lines.append("  installed: " + ", ".join(f"{k} {v}" for k, v in run["installed"].items()))
    lines.append(f"  bundle {run['bundle']} sha256 {run['bundle_sha256']}")
    for name, e in run["settings"].items():
        lines.append(f"  {name}: {json.dumps(e['value'])}  ({e['source']})")
    for w in run.get("vlad_warnings", []):
        lines.append(f"  vlad warned: {w}")
    return "\n".join(lines)


def vlad_warnings(log_path: Path) -> list[str]:
    """vlad's warnings about settings that are not upstream's (its log's `deviates` lines)."""
    try:
        text_ = Path(log_path).read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text_.splitlines() if "deviates from upstream" in line]


def progress_bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"


class Video:
    """The episode's MP4 at the control rate (LIBERO's 20 Hz): every env step's agent view |
    wrist, turned as upstream's eval turns them (`img[::-1, ::-1]`), as FastWAM saves one per
    trial."""

    FPS = 20

    def __init__(self, path: Path):
        import imageio.v2 as imageio
        self.path = path
        self.writer = imageio.get_writer(str(path), fps=self.FPS, codec="libx264", macro_block_size=1,
                                         ffmpeg_log_level="error")
        self.frames = 0

    def add(self, obs: dict) -> None:
        self.writer.append_data(np.concatenate([obs["agentview_image"][::-1, ::-1],
                                                obs["robot0_eye_in_hand_image"][::-1, ::-1]], axis=1))
        self.frames += 1

    def close(self) -> Path:
        self.writer.close()
        return self.path


def write_failed(summary: dict, out: Path) -> None:
    """An episode that ended in an error: the error is its report."""
    (out / "report.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "report.txt").write_text(f"LIBERO episode {summary['suite']} task {summary['task_index']} "
                                    f"init state {summary['init_index']}: failed: {summary['error']}\n")


def write(summary: dict, out: Path) -> None:
    (out / "report.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "report.txt").write_text(text(summary) + "\n")
