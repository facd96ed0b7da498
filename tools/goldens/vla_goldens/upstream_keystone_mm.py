#!/usr/bin/env python3
"""KeyStone with K > 25 candidates: torch.cdist p = 2 switches to its
matrix-product form there (pairwise and k-means), which is not 0 on the diagonal. Writes
golden/upstream/keystone_mm.npz from upstream's own `selection.py` (dywsjtu/keystone 29a15a6,
--keystone-src) in the venv of scripts/setup_upstream.sh:

    build/upstream-venv/bin/python -m vla_goldens.upstream_keystone_mm --keystone-src DIR

Arrays: `candidates` f32 [S, 48, 10, 8] (7 real dims, dim 7 noise; zero past `k`), `k` [S],
`dist_l2` f32 [S, 48, 48] (`_pairwise_distances(..., "l2", 7)`), `chosen_{medoid,guarded,cluster}`
[S]: the first candidate equal to `aggregate_actions`' output (l2, tau 0.3, C 2).
Deterministic: seeded numpy, one torch thread.
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
T, D, AD, KMAX = 10, 8, 7, 48
AGGREGATIONS = {"medoid": "medoid", "guarded": "cluster_medoid_guarded", "cluster": "cluster_medoid"}


def candidate_sets() -> list:
    """K = 25 (the direct form, a control), 26, 32, 48; unit-scale and large (offset 3) values,
    and two modes, as a policy's normalized chunks and a worse case for the cancellation."""
    rng = np.random.default_rng(2627)
    sets = []
    for k, scale, offset, modes in ((25, 0.3, 0.0, 1), (26, 0.3, 0.0, 1), (26, 0.5, 3.0, 1), (32, 0.3, 0.5, 2),
                                    (32, 0.05, 0.9, 1), (48, 0.4, 0.0, 2), (48, 0.2, 2.0, 1)):
        centers = rng.standard_normal((modes, T, D)) * 0.8 + offset
        which = np.arange(k) % modes
        sets.append((centers[which] + rng.standard_normal((k, T, D)) * scale).astype(np.float32))
    return sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keystone-src", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "golden" / "upstream" / "keystone_mm.npz")
    args = ap.parse_args()
    selection, _ = load_keystone(args.keystone_src)
    from keystone.config import SelfConsistencyConfig

    sets = candidate_sets()
    cands = np.zeros((len(sets), KMAX, T, D), np.float32)
    dist = np.zeros((len(sets), KMAX, KMAX), np.float32)
    chosen = {name: np.zeros(len(sets), np.int64) for name in AGGREGATIONS}
    for i, s in enumerate(sets):
        k = s.shape[0]
        cands[i, :k] = s
        a = torch.as_tensor(s)[:, None]
        dist[i, :k, :k] = selection._pairwise_distances(a, "l2", AD)[0].numpy()
        for name, agg in AGGREGATIONS.items():
            cfg = SelfConsistencyConfig(num_samples=k, aggregation=agg, distance="l2", action_dim=AD,
                                        unimodal_tau=0.3, cluster_medoid_num_clusters=2)
            out = selection.aggregate_actions(a, cfg, None)[0]
            chosen[name][i] = [j for j in range(k) if torch.equal(a[j, 0], out)][0]
        print(k, "diag max", float(np.diag(dist[i, :k, :k]).max()), {n: int(c[i]) for n, c in chosen.items()})
    save_npz(args.out, {"candidates": cands, "k": np.array([s.shape[0] for s in sets], np.int64),
                        "dist_l2": dist, **{f"chosen_{n}": c for n, c in chosen.items()}})


if __name__ == "__main__":
    main()
