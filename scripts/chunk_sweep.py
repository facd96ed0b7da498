#!/usr/bin/env python3
"""Chunk execution sweep: inference latency x publish rate x merge mode, each
cell one `vlad run` on a fixture bundle with `control.extra_latency_ms` reproducing the
latency on the HTP emulator, and `vlad simulate` as the moving robot. Prints a markdown
table (hold share, seam jump vs inside-chunk jump, action age) and writes JSON.

    scripts/chunk_sweep.py --vlad target/release/vlad --out build/bench/chunks
        [--bundle golden/bundles/fastwam] [--latencies 0.1,0.3,0.6,1.2] [--rates 5,10,20]
        [--modes skip,crossfade,prefix,inpaint] [--seconds 8] [--trigger back_to_back]
        [--timeline-cell 0.3,20,prefix --timeline-png FILE]

Emulator figures with injected latency: the emulator's own inference time is the floor
of every cell (the extra latency is the target minus the measured base latency).

Besides the simulator's jumps, each cell's flight recording (SIGUSR1 at its end) gives
the **seam offset**: at every seam, the applied action minus the one the old chunk would
have published at that tick (its next row), i.e. the discontinuity the switch itself
adds on top of the trajectory's own step. The tiny fixture's rows jump about as much
inside a chunk as between chunks, so the jump alone cannot tell the modes apart.
"""
import argparse, json, math, os, re, signal, subprocess, sys, time
from pathlib import Path

from mcap.reader import make_reader

repo = Path(__file__).resolve().parent.parent


def base_config(bundle, tag, hz, mode, extra_ms, trigger, chunk_rate_hz=None, max_chunk_age_ms=10000):
    period_ms = math.ceil(1000 / hz)
    cfg = json.loads((repo / "config/dev.json").read_text())
    cfg["bundle"]["path"] = str(Path(bundle).resolve())
    cfg["rings"]["observation_path"] = f"/dev/shm/vla-sweep-{os.getpid()}-{tag}-obs"
    cfg["rings"]["action_path"] = f"/dev/shm/vla-sweep-{os.getpid()}-{tag}-act"
    c = cfg["control"]
    c["publish_hz"] = hz
    # The device's limits (config/vlad.json), each at least what the rate needs; the
    # chunk age is generous so that holds come from the schedule, not from staleness.
    c["max_observation_age_ms"] = 200
    c["max_chunk_age_ms"] = max_chunk_age_ms
    if chunk_rate_hz:
        c["chunk_rate_hz"] = chunk_rate_hz
    c["hold_after_chunk_end_ms"] = 100
    c["action_valid_ms"] = max(100, period_ms + 50)
    c["writer_heartbeat_timeout_ms"] = max(500, 2 * period_ms)
    c["merge"] = mode
    c["trigger"] = trigger
    c["extra_latency_ms"] = int(extra_ms)
    cfg["recorder"] = {"directory": f"/tmp/vla-sweep-{os.getpid()}-{tag}-rec", "history_s": 600,
                       "max_chunks": 10000, "frames": "off", "on_fault": False}
    cfg["systemd"]["notify"] = False
    cfg["systemd"]["watchdog"] = False
    cfg["log"]["level"] = "info"
    return cfg


def run_cell(vlad, bundle, out, latency, hz, mode, base_ms, seconds, trigger, timeline=None,
             chunk_rate_hz=None, max_chunk_age_ms=10000):
    tag = f"{int(latency * 1000)}ms-{hz}hz-{mode}"
    extra = max(0, round(latency * 1000 - base_ms))
    cfg = base_config(bundle, tag, hz, mode, extra, trigger, chunk_rate_hz, max_chunk_age_ms)
    path = out / f"{tag}.json"
    path.write_text(json.dumps(cfg, indent=2))
    daemon = subprocess.Popen([vlad, "run", "--config", str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    # READY is logged as the operating point line; wait for "running:".
    err_lines = []
    deadline = time.time() + 120
    while time.time() < deadline:
        line = daemon.stderr.readline()
        if not line:
            break
        err_lines.append(line)
        if "operating point" in line:
            break
    if daemon.poll() is not None:
        raise SystemExit(f"cell {tag}: the daemon exited {daemon.returncode}:\n{''.join(err_lines)[-2000:]}")
    report = out / f"{tag}.sim.json"
    args = [vlad, "simulate", "--config", str(path), "--duration", str(seconds),
            "--camera-hz", "30", "--json", str(report)]
    if timeline:
        args += ["--timeline", str(timeline)]
    sim = subprocess.run(args, capture_output=True, text=True)
    rec_dir = Path(cfg["recorder"]["directory"])
    daemon.send_signal(signal.SIGUSR1)
    deadline = time.time() + 30
    while time.time() < deadline and not list(rec_dir.glob("*-signal.mcap")):
        time.sleep(0.2)
    offsets = seam_offsets(next(iter(rec_dir.glob("*-signal.mcap")), None))
    for f in rec_dir.glob("*"):
        f.unlink()
    rec_dir.rmdir()
    daemon.send_signal(signal.SIGTERM)
    dout, derr = daemon.communicate(timeout=60)
    err_lines.append(derr)
    for p in (cfg["rings"]["observation_path"], cfg["rings"]["action_path"]):
        try:
            os.remove(p)
        except FileNotFoundError:
            pass
    if sim.returncode != 0 or not report.exists():
        raise SystemExit(f"cell {tag}: simulate failed: {sim.stdout}{sim.stderr}")
    r = json.loads(report.read_text())
    m = re.search(r"inferences p5 .* p95 ([0-9.]+) ms", dout)
    point = next((l.strip() for l in err_lines if "operating point" in l), "")
    # The daemon's prediction at READY (the gate's latency) and at the end of the run (the
    # latency and observation period it measured), next to the simulator's measurement.
    run_point = next((l.strip() for l in dout.splitlines() if "operating point" in l), "")
    return {
        "latency_target_s": latency, "publish_hz": hz, "mode": mode, "extra_ms": extra,
        "latency_p95_ms": float(m.group(1)) if m else None,
        # From the first ok action on; a cell where none came is all hold.
        "hold_share": r["hold_share_since_first_ok"] if r["ok_applied"] else r["hold_share"],
        "hold_share_all": r["hold_share"], "seams": r["motion"]["seams"],
        "seam_jump_max": r["motion"]["seam_jump_max"],
        "seam_jump_mean": r["motion"]["seam_jump_mean"],
        "inside_jump_max": r["motion"]["inside_jump_max"],
        "age_p50_ms": r["capture_to_applied_ms"]["p50"],
        "seam_offset_max": max((o for o, _ in offsets), default=None), "seam_offset_mean":
            sum(o for o, _ in offsets) / len(offsets) if offsets else None,
        "seams_recorded": len(offsets), "first_seam_offset": offsets[0][0] if offsets else None,
        "seams_unconditioned": sum(1 for _, p in offsets if not p),
        "ok": r["ok_applied"], "received": r["actions_received"],
        "ready_line": point, "run_line": run_point,
        "latency_line": next((l.strip() for l in dout.splitlines() if "capture->chunk ready" in l), ""),
        "predicted_ready": expected_hold(point), "predicted_run": expected_hold(run_point),
        "chunk_rate_hz": chunk_rate_hz, "max_chunk_age_ms": max_chunk_age_ms,
    }


def expected_hold(line):
    m = re.search(r"expected hold (\d+)%", line)
    return int(m.group(1)) / 100 if m else None


def seam_offsets(path):
    """Per seam in a recording: |applied - what the old chunk would have published at that
    tick| (gripper excluded), and whether the new chunk was conditioned on a prefix. In
    crossfade mode the old chunk as published is itself blended with its predecessor:
    the blend (plan.rs/scheduler.rs: rows lined up by whole ticks, weight (k+1)/(n+1))
    is replayed from the recorded raw chunks, and every value it predicts for a seam
    must be the one published."""
    chunks, ticks = {}, []
    if path is None:
        raise SystemExit("the daemon wrote no flight recording on SIGUSR1")
    with open(path, "rb") as fh:
        for _, channel, message in make_reader(fh).iter_messages():
            d = json.loads(message.data)
            if channel.topic == "/vla/chunk" and d["ok"]:
                chunks[d["chunk_id"]] = (d["actions"], d["prefixed"])
            elif channel.topic == "/vla/action":
                ticks.append(d)
    crossfade = "crossfade" in str(path)
    played = {}  # chunk id -> rows as published (crossfade: blended on landing)
    out, prev = [], None
    for t in ticks:
        if t["status"] != "ok":
            prev = None
            continue
        cid = t["chunk_id"]
        if cid not in played and cid in chunks:
            rows = [list(r) for r in chunks[cid][0]]
            if crossfade and prev and prev["chunk_id"] in played:
                old = played[prev["chunk_id"]]
                first = t["step"]
                shift = prev["step"] + 1 + t["missed_ticks"] - first
                n = max(0, min(len(rows) - first, len(old) - shift - first))
                for k in range(n):
                    w = (k + 1) / (n + 1)
                    o = old[first + k + shift]
                    rows[first + k][:-1] = [a + (b - a) * w for a, b in zip(o[:-1], rows[first + k][:-1])]
            played[cid] = rows
        if prev and prev["chunk_id"] != cid and prev["chunk_id"] in played and cid in played:
            old = played[prev["chunk_id"]]
            expected = old[min(prev["step"] + 1 + t["missed_ticks"], len(old) - 1)]
            if crossfade and math.dist(played[cid][t["step"]][:-1], t["values"][:-1]) > 1e-4:
                raise SystemExit(f"{path}: the crossfade replay disagrees with what was published "
                                 f"at chunk {cid} step {t['step']}")
            out.append((math.dist(t["values"][:-1], expected[:-1]), chunks[cid][1]))
        prev = t
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vlad", required=True)
    ap.add_argument("--out", default="build/bench/chunks")
    ap.add_argument("--bundle", default=str(repo / "golden/bundles/fastwam"))
    ap.add_argument("--latencies", default="0.1,0.3,0.6,1.2")
    ap.add_argument("--rates", default="5,10,20")
    ap.add_argument("--modes", default="skip,crossfade,prefix,inpaint")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--trigger", default="back_to_back")
    ap.add_argument("--chunk-rate-hz", type=float, default=None,
                    help="control.chunk_rate_hz in every cell (the slower time base)")
    ap.add_argument("--max-chunk-age-ms", type=int, default=10000,
                    help="control.max_chunk_age_ms in every cell (default generous: holds "
                         "come from the schedule)")
    ap.add_argument("--base-ms", type=float, default=None,
                    help="the emulator's own latency; measured with bench-bundle when absent")
    ap.add_argument("--timeline-cell", action="append", default=[],
                    help="latency,hz,mode of a cell to plot (repeatable)")
    ap.add_argument("--timeline-dir", default=None, help="where the PNGs go")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.timeline_dir:
        Path(a.timeline_dir).mkdir(parents=True, exist_ok=True)
    base = a.base_ms
    if base is None:
        b = subprocess.run([a.vlad, "bench-bundle", "--bundle", a.bundle, "--iterations", "3"],
                           capture_output=True, text=True)
        m = re.search(r"end to end\s+p50\s+([0-9.]+) us", b.stdout)
        if not m:
            raise SystemExit(f"cannot measure the base latency: {b.stdout}{b.stderr}")
        base = float(m.group(1)) / 1000
    # capture -> ready also includes waiting for the next camera frame and the tick.
    print(f"base latency (emulator, end to end p50): {base:.0f} ms", file=sys.stderr)
    cells = []
    want = [tuple(c.split(",")) for c in a.timeline_cell]
    want = {(float(w[0]), float(w[1]), w[2]) for w in want}
    for lat in [float(x) for x in a.latencies.split(",")]:
        for hz in [float(x) for x in a.rates.split(",")]:
            for mode in a.modes.split(","):
                tl = None
                name = f"timeline-{int(lat * 1000)}ms-{hz:g}hz-{mode}"
                if (lat, hz, mode) in want:
                    tl = out / f"{name}.csv"
                c = run_cell(a.vlad, a.bundle, out, lat, hz, mode, base, a.seconds, a.trigger, tl,
                             a.chunk_rate_hz, a.max_chunk_age_ms)
                cells.append(c)
                print(f"  {lat:.1f} s {hz:g} Hz {mode:9s} hold {c['hold_share']*100:5.1f}% "
                      f"(predicted {pct(c['predicted_ready'])} at READY, {pct(c['predicted_run'])} "
                      f"from the run)  "
                      f"seam offset max {fmt(c['seam_offset_max'])}  seam max {c['seam_jump_max']:.3f}  "
                      f"inside max {c['inside_jump_max']:.3f}",
                      file=sys.stderr)
                if tl and a.timeline_dir:
                    png = Path(a.timeline_dir) / f"{name}.png"
                    subprocess.run([sys.executable, str(repo / "scripts/plot_timeline.py"), str(tl),
                                    str(png), "--title",
                                    f"{Path(a.bundle).name}: {lat:.1f} s latency, {hz:g} Hz, {mode}"],
                                   check=True)
    (out / "sweep.json").write_text(json.dumps({"base_ms": base, "cells": cells}, indent=2))
    print(table(cells, base, a))
    both = [c for c in cells if c["predicted_ready"] is not None]
    if both:
        worst = max(both, key=lambda c: abs(c["predicted_ready"] - c["hold_share"]))
        print(f"\nlargest disagreement, READY vs measured: {pct(worst['predicted_ready'])} vs "
              f"{worst['hold_share'] * 100:.1f}% ({worst['latency_target_s']:.1f} s, "
              f"{worst['publish_hz']:g} Hz, {worst['mode']})")
    run = [c for c in cells if c["predicted_run"] is not None]
    if run:
        worst = max(run, key=lambda c: abs(c["predicted_run"] - c["hold_share"]))
        print(f"largest disagreement, end of run vs measured: {pct(worst['predicted_run'])} vs "
              f"{worst['hold_share'] * 100:.1f}% ({worst['latency_target_s']:.1f} s, "
              f"{worst['publish_hz']:g} Hz, {worst['mode']})")


def fmt(v):
    return "-" if v is None else f"{v:.3f}"


def pct(v):
    return "-" if v is None else f"{v * 100:.0f}%"


def table(cells, base, a):
    limits = (f"`max_chunk_age_ms` {a.max_chunk_age_ms}"
              + (f", `chunk_rate_hz` {a.chunk_rate_hz:g}" if a.chunk_rate_hz else ""))
    lines = [f"Bundle `{Path(a.bundle).name}` on the HTP emulator, {a.seconds:g} s per cell, trigger "
             f"`{a.trigger}`, {limits}, emulator base latency {base:.0f} ms (cells below it run at the base). "
             "Hold: measured by the simulator from the first ok action on; predicted: the daemon's "
             "expected hold at READY (from the gate's latency) and at the end of the run (from the "
             "latency and observation period it measured). "
             "Seam / inside: largest jump between consecutive applied actions at a chunk seam / "
             "inside a chunk (Euclidean, gripper excluded). Seam offset: at a seam, the applied action "
             "minus the one the old chunk would have published at that tick (what the switch adds).", "",
             "| latency | Hz | d (H=%s) | mode | p95 ms | hold | predicted READY | predicted run | seam offset max | seam offset mean | seam max | seam mean | inside max | age p50 ms |" %
             (cells[0]["ready_line"].split("of H ")[1].split(" ")[0] if cells and "of H " in cells[0]["ready_line"] else "?"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in cells:
        lat_ms = c["latency_p95_ms"] or 0
        step_ms = 1000 / min(c["publish_hz"], c.get("chunk_rate_hz") or c["publish_hz"])
        d = math.ceil(lat_ms / step_ms) if lat_ms else "?"
        lines.append(
            f"| {c['latency_target_s']:.1f} s | {c['publish_hz']:g} | {d} | {c['mode']} | "
            f"{lat_ms:.0f} | {c['hold_share']*100:.1f}% | {pct(c['predicted_ready'])} | "
            f"{pct(c['predicted_run'])} | {fmt(c['seam_offset_max'])} | "
            f"{fmt(c['seam_offset_mean'])} | {c['seam_jump_max']:.3f} | "
            f"{c['seam_jump_mean']:.3f} | {c['inside_jump_max']:.3f} | {c['age_p50_ms']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
