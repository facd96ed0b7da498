"""The reference pipeline's KeyStone (tools/vla_host/vla_host/reference.py, f32 as KeyStone's selection.py) on
upstream's own picks and distance matrices for the edge sets of golden/upstream/keystone_edges.npz
(tools/goldens/vla_goldens/upstream_keystone.py). The same exceptions as vlad's test (tests/upstream.rs): the guard at
its threshold in set 7 (torch's vectorized mean), and cosine near-ties (torch's norm and BLAS bmm)."""

from pathlib import Path

import numpy as np
import pytest

from vla_host import reference as ref

G = Path(__file__).resolve().parents[3] / "golden" / "upstream" / "keystone_edges.npz"
DIST, AGG = ["l2", "l1", "cosine"], ["guarded_medoid", "medoid", "cluster_medoid"]


@pytest.fixture(scope="module")
def g():
    with np.load(G) as z:
        return {k: z[k] for k in z.files}


def test_l1_l2_distance_matrices_are_upstreams_bit_for_bit(g):
    for i, k in enumerate(g["k"]):
        for e in (0, 4):
            pts = g["candidates"][i, :k, : (e or None), :7].reshape(k, -1)
            for m in ("l2", "l1"):
                np.testing.assert_array_equal(ref.distance_matrix(pts, m), g[f"dist_{m}_{e}"][i, :k, :k])


def test_picks_are_upstreams(g):
    cosine_apart = checked = 0
    for n, s in enumerate(g["case_set"]):
        k = g["k"][s]
        ks = {"selector": AGG[g["case_aggregation"][n]], "distance": DIST[g["case_distance"][n]],
              "executed_steps": int(g["case_executed_steps"][n]) or None,
              "spread_threshold": float(g["case_tau"][n]), "num_clusters": int(g["case_num_clusters"][n])}
        got = ref.keystone_select(g["candidates"][s, :k, :, :7], ks)
        if ks["distance"] == "cosine":
            cosine_apart += got != g["case_chosen"][n]
            continue
        if s == 7 and ks["selector"] == "guarded_medoid" and g["case_tau"][n] == np.float32(0.1) and ks["distance"] == "l2":
            continue
        checked += 1
        assert got == g["case_chosen"][n], (n, s, ks)
    assert checked >= 500 and cosine_apart <= 46
