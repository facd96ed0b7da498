"""The two normalizers a MolmoAct2 checkpoint is run with (golden/upstream/lerobot_norm/, made by
tools/goldens/vla_goldens/upstream_lerobot_norm.py from lerobot 0.6.1's own pipeline steps and the HF
`_FeatureNormalizer`): the importer reads the processor files LeRobot itself saved into the bundle
blocks, and the reference pipeline computes both conventions bit for bit. numpy only."""

import json
from pathlib import Path

import numpy as np
import pytest

from vla_host import reference as ref

REPO = Path(__file__).resolve().parents[3]
from vla_import import lerobot  # noqa: E402
from vla_import.checkpoint import normalization as hf_normalization  # noqa: E402
from vla_import.errors import ImportRefused  # noqa: E402

GOLD = REPO / "golden" / "upstream" / "lerobot_norm"
MODES = {"quantiles": "q01_q99", "min_max": "min_max", "mean_std": "mean_std"}


@pytest.fixture(scope="module")
def g():
    with np.load(GOLD / "norm.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def policy():
    return {"input_features": {"observation.state": {"type": "STATE", "shape": [8]}},
            "output_features": {"action": {"type": "ACTION", "shape": [7]}}}


def hf_blocks(g, hf_mode):
    def stats(part):
        return {**{k: g[f"{part}_{k}"].tolist() for k in ("q01", "q99", "min", "max", "mean", "std")},
                "mask": g[f"{part}_mask"].tolist()}
    return hf_normalization(stats("state"), hf_mode, "s"), hf_normalization(stats("action"), hf_mode, "a")


@pytest.mark.parametrize("mode", list(MODES))
def test_importer_reads_lerobots_own_processor_files(g, mode):
    got = lerobot.normalization(GOLD / f"processor_{mode}", policy())
    s, a = got["state_norm"], got["action_norm"]
    assert (got["state_dims"], got["action_dims"]) == (8, 7)
    assert s["follows"] == a["follows"] == "lerobot_pipeline" and s["eps"] == a["eps"] == 1e-8
    assert "constant" not in s and "constant" not in a, "lerobot's pipeline has no zero mask"
    assert s["passthrough"] == [False] * 7 + [True] and a["passthrough"] == [False] * 6 + [True]
    low = {"quantiles": "q01", "min_max": "min", "mean_std": "mean"}[mode]
    key = "mean" if mode == "mean_std" else "low"
    np.testing.assert_array_equal(np.float32(s[key]), g[f"state_{low}"])


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("tag", ["lerobot", "hf"])
def test_reference_computes_both_normalizers_bit_for_bit(g, mode, tag):
    if tag == "lerobot":
        got = lerobot.normalization(GOLD / f"processor_{mode}", policy())
        s, a = got["state_norm"], got["action_norm"]
    else:
        s, a = hf_blocks(g, MODES[mode])
        assert s["follows"] == "hf_feature_normalizer"
    np.testing.assert_array_equal(ref.normalize(g["states"], s), g[f"{tag}_{mode}_state_normalized"])
    np.testing.assert_array_equal(ref.state_token_ids(g["states"], s), g[f"{tag}_{mode}_state_bins"])
    np.testing.assert_array_equal(ref.denormalize(g["actions_normalized"], a), g[f"{tag}_{mode}_actions"])
    np.testing.assert_array_equal(ref.normalize(g["actions_raw"], a), g[f"{tag}_{mode}_actions_raw_normalized"])
    if tag == "lerobot":
        for value, refused in zip(g["gripper_probe"], g[f"lerobot_{mode}_gripper_refused"]):
            row = g["states"][4].copy()
            row[7] = value
            if refused:
                with pytest.raises(ValueError, match="not under"):
                    ref.normalize(row, s)
            else:
                ref.normalize(row, s)


def test_the_goldens_separate_the_two_normalizers(g):
    differ = sum(int((g[f"lerobot_{m}_state_bins"] != g[f"hf_{m}_state_bins"]).sum()) for m in MODES)
    assert differ >= 20
    assert g["lerobot_quantiles_gripper_refused"].any() and not g["lerobot_quantiles_gripper_refused"].all()
    manifest = json.loads((GOLD / "manifest.json").read_text())
    assert "normalize_gripper=True" in manifest["lerobot"]["refusal_message"]


def test_a_bad_eps_is_refused(tmp_path):
    import shutil

    d = tmp_path / "p"
    shutil.copytree(GOLD / "processor_quantiles", d)
    pre = json.loads((d / "policy_preprocessor.json").read_text())
    pre["steps"][0]["config"]["eps"] = 0
    (d / "policy_preprocessor.json").write_text(json.dumps(pre))
    with pytest.raises(ImportRefused, match=r"steps\[0\].config.eps"):
        lerobot.normalization(d, policy())


def test_inferred_sequence_cap_is_upstreams():
    manifest = json.loads((GOLD / "manifest.json").read_text())
    rows = manifest["inferred_max_sequence_length"]
    assert len(rows) == 16
    for images, state, cap in rows:
        assert lerobot.inferred_max_sequence_length(images, state) == cap, (images, state)
