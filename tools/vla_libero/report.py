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
        "noop_steps": int(len(log["noop_actions"])),
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


def suite_table(summaries: list[dict]) -> str:
    """Success rate per suite in the papers' LIBERO table form (one column per suite, then the
    average over the suites run)."""
    per: dict[str, list] = {}
    for s in summaries:
        per.setdefault(s["suite"], []).append(bool(s["success"]))
    cols = [x for x in SUITE_ORDER if x in per]
    rates = [100.0 * sum(per[c]) / len(per[c]) for c in cols]
    head = "| policy | " + " | ".join(f"{c} (n={len(per[c])})" for c in cols) + " | average |"
    sep = "|---" * (len(cols) + 2) + "|"
    bundle = summaries[0]["bundle"] if summaries else ""
    row = f"| {Path(bundle).name} | " + " | ".join(f"{r:.1f}" for r in rates) + \
        f" | {np.mean(rates) if rates else float('nan'):.1f} |"
    return "\n".join([head, sep, row])


def write(summary: dict, out: Path) -> None:
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    (out / "report.txt").write_text(text(summary) + "\n")
