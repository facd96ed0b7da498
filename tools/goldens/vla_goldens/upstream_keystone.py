#!/usr/bin/env python3
"""Runs KeyStone's own selection (github dywsjtu/keystone, `src/keystone/selection.py`, passed with
--keystone-src, never copied here) on candidate sets made to put its choices on edge: K = 1 and 2,
exact and near duplicates (differences at f32's last bits), collinear candidates (equally spaced,
and scaled copies that are collinear through the origin, where the cosine distance is all
rounding), isosceles near-ties, unimodal and multimodal clouds, equal clusters. Every distance
(l2, l1, cosine) x every aggregation upstream has (cluster_medoid_guarded, medoid, cluster_medoid)
x executed_steps (all, 4) x thresholds (0.1, 0.3, 1.0) x cluster counts (2, 3), through
`aggregate_actions` with a `SelfConsistencyConfig`, as the policy calls it, on float32 candidates
as the policy hands them. Also upstream's own f32 distance matrices (`_pairwise_distances`).

    build/upstream-venv/bin/python -m vla_goldens.upstream_keystone --keystone-src DIR

Writes golden/upstream/keystone_edges.npz. Deterministic (seeded, one torch thread, det_npz).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
from vla_host.det_npz import save_npz
from vla_goldens.upstream_molmoact2 import load_keystone

torch.set_num_threads(1)

T, D, AD = 10, 8, 7  # horizon, width (one padded dim that must be ignored), real action dims
DISTANCES = ["l2", "l1", "cosine"]
AGGREGATIONS = ["cluster_medoid_guarded", "medoid", "cluster_medoid"]


def candidate_sets() -> list[np.ndarray]:
    rng = np.random.default_rng(1265)
    base = rng.uniform(-0.5, 0.5, (T, AD)).astype(np.float32)
    ulp = np.spacing(np.abs(base)).astype(np.float32)

    def pad(x):
        out = np.zeros((x.shape[0], T, D), np.float32)
        out[..., :AD] = x
        out[..., AD:] = rng.normal(0, 5.0, (x.shape[0], T, D - AD))
        return out

    def cloud(center, k, scale):
        return (center[None] + rng.normal(0, scale, (k, T, AD))).astype(np.float32)

    sets = [
        pad(cloud(base, 1, 0.05)),                                               # K = 1
        pad(cloud(base, 2, 0.05)),                                               # K = 2
        pad(np.repeat(base[None], 2, 0)),                                        # K = 2 identical
        pad(np.stack([base, base + ulp])),                                       # K = 2, one ulp apart
        pad(np.stack([base + s * 0.01 for s in range(3)]).astype(np.float32)),   # collinear, equal steps
        pad(np.stack([base, base, cloud(base, 1, 0.05)[0], cloud(base, 1, 0.05)[0]])),  # duplicates
        pad(np.stack([base + ulp * rng.integers(-2, 3, (T, AD)) for _ in range(5)]).astype(np.float32)),
        pad(np.stack([base * s for s in (0.5, 1.0, 1.5, 2.0, 3.0)]).astype(np.float32)),  # through 0
        pad(cloud(base, 5, 0.05)),                                               # unimodal
        pad(np.concatenate([cloud(base, 5, 0.05), cloud(base + 0.6, 3, 0.05)])),  # 5 + 3
        pad(np.concatenate([cloud(base, 3, 0.05), cloud(base - 0.5, 3, 0.05)])),  # 3 + 3 (equal)
        pad(np.concatenate([cloud(base, 9, 0.05), cloud(base + 0.4, 7, 0.05)])),  # K = 16
        pad(np.concatenate([cloud(base, 2, 0.02), cloud(base + 0.3, 2, 0.02), cloud(base - 0.3, 1, 0.02)])),
    ]
    # isosceles near-tie: c on the perpendicular bisector of a and b (in reals), so the row sums
    # of a and b agree up to rounding.
    a, b = base, (base + rng.normal(0, 0.05, (T, AD))).astype(np.float32)
    mid, n = (a + b) / 2, rng.normal(0, 1, (T, AD))
    n -= (n * (b - a)).sum() / ((b - a) ** 2).sum() * (b - a)
    c = (mid + 0.05 * n / np.linalg.norm(n)).astype(np.float32)
    sets.append(pad(np.stack([a, b, c])))
    sets.append(pad(np.stack([c, a, b, c + ulp])))
    return sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keystone-src", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "golden" / "upstream" / "keystone_edges.npz")
    args = ap.parse_args()
    selection, pkg_dir = load_keystone(args.keystone_src)
    from keystone.config import SelfConsistencyConfig

    sets = candidate_sets()
    kmax = max(s.shape[0] for s in sets)
    cands = np.zeros((len(sets), kmax, T, D), np.float32)
    ks = np.array([s.shape[0] for s in sets], np.int64)
    dist = {f"{m}_{e}": np.zeros((len(sets), kmax, kmax), np.float32) for m in DISTANCES for e in (0, 4)}
    rows: dict[str, list] = {k: [] for k in ("set", "distance", "aggregation", "executed_steps", "tau",
                                             "num_clusters", "chosen")}
    for i, s in enumerate(sets):
        k = s.shape[0]
        cands[i, :k] = s
        a = torch.as_tensor(s)[:, None]  # (K, B = 1, T, D), float32
        for e in (0, 4):
            trimmed = a if e == 0 else a[:, :, :e]
            for m in DISTANCES:
                dist[f"{m}_{e}"][i, :k, :k] = selection._pairwise_distances(trimmed, m, AD)[0].numpy()
        for m in DISTANCES:
            for agg in AGGREGATIONS:
                for e in (0, 4):
                    for tau in ((0.1, 0.3, 1.0) if agg == "cluster_medoid_guarded" else (0.3,)):
                        for c in ((2, 3) if agg != "medoid" else (2,)):
                            cfg = SelfConsistencyConfig(num_samples=k, aggregation=agg, distance=m,
                                                        action_dim=AD, unimodal_tau=tau,
                                                        cluster_medoid_num_clusters=c)
                            out = selection.aggregate_actions(a, cfg, e or None)[0]
                            ref = a[:, 0] if e == 0 else a[:, 0, :e]
                            idx = [j for j in range(k) if torch.equal(ref[j], out)]
                            # duplicates: upstream returns a chunk; the first equal index is the pick
                            rows["set"].append(i)
                            rows["distance"].append(DISTANCES.index(m))
                            rows["aggregation"].append(AGGREGATIONS.index(agg))
                            rows["executed_steps"].append(e)
                            rows["tau"].append(tau)
                            rows["num_clusters"].append(c)
                            rows["chosen"].append(idx[0])
                            rows.setdefault("equal_candidates", []).append(len(idx))
    arrays = {"candidates": cands, "k": ks, "action_dim": np.array(AD, np.int64),
              **{f"dist_{k}": v for k, v in dist.items()}}
    for key, v in rows.items():
        arrays[f"case_{key}"] = np.asarray(v, np.float32 if key == "tau" else np.int64)
    save_npz(args.out, arrays)
    print(f"wrote {args.out}: {len(sets)} sets, {len(rows['set'])} cases (keystone from {pkg_dir})")


if __name__ == "__main__":
    main()
