#!/usr/bin/env python3
"""Plots a `vlad simulate --timeline` CSV as a PNG: every action dim over time (the
values the firmware received), chunk seams as vertical lines, hold/fault as shaded bands.

    scripts/plot_timeline.py TIMELINE.csv OUT.png [--title TEXT]
"""
import argparse, csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("png")
    ap.add_argument("--title", default="vlad simulate: received actions")
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    if not rows:
        raise SystemExit(f"{a.csv}: no actions")
    dims = [k for k in rows[0] if k.startswith("v")]
    t = [float(r["t_s"]) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=64)
    for k in dims:
        ax.plot(t, [float(r[k]) for r in rows], lw=1.0, label=k)
    last_chunk, hold_from = None, None
    seams = 0
    for ti, r in zip(t, rows):
        ok = r["status"] == "ok"
        if ok and last_chunk is not None and r["chunk_id"] != last_chunk:
            ax.axvline(ti, color="0.4", lw=0.6, ls=":")
            seams += 1
        if ok:
            last_chunk = r["chunk_id"]
        if not ok and hold_from is None:
            hold_from = ti
        if ok and hold_from is not None:
            ax.axvspan(hold_from, ti, color="red", alpha=0.15, lw=0)
            hold_from = None
    if hold_from is not None:
        ax.axvspan(hold_from, t[-1], color="red", alpha=0.15, lw=0)
    ax.set_xlabel("time since the simulator started (s)")
    ax.set_ylabel("action value")
    ax.set_title(f"{a.title}  ({seams} seams dotted, hold/fault shaded red)", fontsize=10)
    ax.legend(loc="upper right", ncol=len(dims), fontsize=7)
    fig.tight_layout()
    fig.savefig(a.png, pil_kwargs={"optimize": True})


if __name__ == "__main__":
    main()
