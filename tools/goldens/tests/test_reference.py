"""Host glue of the reference pipeline, and the committed goldens against the scripts."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from vla_host import reference as ref
from vla_host.det_npz import load_npz, save_npz

REPO = Path(__file__).resolve().parents[3]
BUNDLES = REPO / "golden" / "bundles"


def test_splitmix64_reference_values():
    gen = ref.SplitMix64(0)
    assert [gen.next_u64() for _ in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_gaussian_noise_is_seeded_and_standard():
    a = ref.gaussian_noise(7, (1, 10, 32))
    assert a.dtype == np.float32 and a.shape == (1, 10, 32)
    np.testing.assert_array_equal(a, ref.gaussian_noise(7, (1, 10, 32)))
    assert not np.array_equal(a, ref.gaussian_noise(8, (1, 10, 32)))
    big = ref.gaussian_noise(1, (20000,))
    assert abs(big.mean()) < 0.03 and abs(big.std() - 1) < 0.03
    # an odd count drops the last z1 of the final pair
    np.testing.assert_array_equal(ref.gaussian_noise(3, (5,)), ref.gaussian_noise(3, (6,))[:5])


def test_wrapping_seed_for_keystone_candidates():
    assert ref.SplitMix64((2**64 - 1 + 1) & ref.U64).state == 0


def test_resize_identity_and_constant():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (14, 14, 3), dtype=np.uint8)
    np.testing.assert_array_equal(ref.resize_bilinear(img, 14), img.astype(np.float32))
    const = np.full((48, 64, 3), 77, np.uint8)
    np.testing.assert_array_equal(ref.resize_bilinear(const, 56), np.full((56, 56, 3), 77, np.float32))


def test_resize_half_pixel_centres():
    # 2 -> 4 pixels: src = (dst + 0.5) * 0.5 - 0.5 = -0.25, 0.25, 0.75, 1.25 -> clamp
    img = np.zeros((1, 2, 3), np.uint8)
    img[0, 1] = 100
    out = ref.resize_bilinear(np.repeat(img, 2, axis=0), 4)
    np.testing.assert_allclose(out[0, :, 0], [0, 25, 75, 100])


def test_patchify_layout():
    frames = np.random.default_rng(1).integers(0, 256, (2, 28, 28, 3), dtype=np.uint8)
    pv = ref.pixel_values_from_frames(frames, 28, 14)
    assert pv.shape == (1, 2, 4, 588)
    img = frames[1].astype(np.float32) / 255 * 2 - 1
    py, px, dy, dx, c = 1, 0, 3, 9, 2
    assert pv[0, 1, py * 2 + px, (dy * 14 + dx) * 3 + c] == np.float32(img[py * 14 + dy, px * 14 + dx, c])


def test_attention_bias_rules():
    valid = np.array([0, 1, 1, 1, 1, 1], np.uint8)
    bias = ref.attention_bias(valid, np.array([0, 0, 1, 1, 0, 0], bool), -1e9)[0, 0]
    allowed = bias == 0
    assert not allowed[:, 0].any()  # pad key never
    assert allowed[2, 3] and allowed[3, 2]  # image <-> image both ways
    assert not allowed[1, 2] and allowed[2, 1]  # causal otherwise
    assert not allowed[4, 5] and allowed[5, 4]
    assert np.all(bias[~allowed] == np.float32(-1e9))


def test_state_tokens_round_half_even():
    norm = {"mode": "identity"}
    # (s + 1) / 2 * 255 = 127.5 exactly -> 128 (even); -1 -> 0; 1 -> 255; clip beyond
    ids = ref.state_token_ids(np.array([0.0, -1.0, 1.0, 3.0, -2.0], np.float32), norm)
    np.testing.assert_array_equal(ids, [128, 0, 255, 255, 0])


def test_normalize_denormalize():
    norm = {"mode": "min_max", "low": [0.0, -2.0], "high": [1.0, 2.0], "passthrough": [False, True]}
    x = np.array([0.25, 5.0], np.float32)
    y = ref.normalize(x, norm)
    np.testing.assert_allclose(y, [-0.5, 5.0])
    # min_max clips every dim before de-normalizing, the pass-through one too
    np.testing.assert_allclose(ref.denormalize(y, norm), [0.25, 1.0])
    q = {"mode": "quantile", "low": [0.0], "high": [2.0]}
    np.testing.assert_allclose(ref.denormalize(np.array([3.0], np.float32), q), [2.0])  # clipped
    ms = {"mode": "mean_std", "mean": [1.0], "std": [2.0]}
    np.testing.assert_allclose(ref.denormalize(np.array([0.5], np.float32), ms), [2.0])


def test_keystone_medoid_and_guard():
    base = np.zeros((5, 2, 1), np.float32)
    base[:, 0, 0] = [0.0, 0.1, 0.2, 0.3, 5.0]
    plain = {"k": 5, "selector": "medoid", "distance": "l2", "executed_steps": None, "spread_threshold": 0.3}
    assert ref.keystone_select(base, plain) == 2
    # two clusters: three points near 10, two near 0; the guard picks the larger cluster's medoid
    two = np.array([0.0, 0.2, 10.0, 10.1, 10.3], np.float32).reshape(5, 1, 1)
    guarded = dict(plain, selector="guarded_medoid")
    assert ref.keystone_select(two, guarded) == 3
    assert ref.keystone_select(two, plain) in (2, 3)
    # executed_steps limits the rows that count
    rows = np.zeros((3, 2, 1), np.float32)
    rows[:, 0, 0] = [0.0, 1.0, 3.0]
    rows[:, 1, 0] = [100.0, 0.0, 0.0]
    assert ref.keystone_select(rows, dict(plain, k=3, executed_steps=1)) == 1


def test_wan_schedule_matches_reference_timesteps():
    t = ref.wan_sigmas(10, 5.0)[:10] * 1000
    np.testing.assert_allclose(t, [1000, 978.261, 952.381, 921.053, 882.353, 833.333, 769.231, 681.818,
                                   555.556, 357.143], atol=1e-3)
    assert ref.wan_sigmas(10, 5.0)[-1] == 0


def test_det_npz_is_byte_stable(tmp_path):
    arrays = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.array([1], np.uint64)}
    save_npz(tmp_path / "x.npz", arrays)
    save_npz(tmp_path / "y.npz", arrays)
    assert (tmp_path / "x.npz").read_bytes() == (tmp_path / "y.npz").read_bytes()
    back = load_npz(tmp_path / "x.npz")
    assert list(back) == ["b", "a"]
    np.testing.assert_array_equal(back["b"], arrays["b"])


def _bundle_graphs(name):
    from vla_goldens import fixture_graphs as fg
    from vla_goldens import make_golden as mg

    manifest = json.loads((BUNDLES / name / "bundle.json").read_text())
    if manifest["policy"] == "fastwam" and "chain" in manifest["fastwam"]:
        return manifest, mg.fastwam_chain_graphs()
    if manifest["policy"] == "fastwam":
        rng = mg.component_rng(mg.FASTWAM["seed"], "action_step")
        return manifest, {"action_step": fg.build_fastwam_step(mg.FASTWAM["dims"], rng)}
    cfg = mg.MOLMO_VARIANTS[name]
    cfg = dict(cfg, dims=replace(cfg["dims"], seq_len=manifest["molmoact2"]["seq_len"]))
    return manifest, mg.build_molmo_graphs(cfg)


def _imported(name: str) -> bool:
    """Bundles made by the release importer from golden/upstream-molmoact2 (import.json)."""
    return (BUNDLES / name / "import.json").is_file()


@pytest.mark.parametrize("name", sorted(p.name for p in BUNDLES.iterdir() if _imported(p.name)))
def test_imported_goldens_match_reference(name):
    """An imported bundle's end-to-end golden is the release's ONNX graphs on the CPU
    through the reference; its per-context goldens are the release's own, byte for byte."""
    bundle = BUNDLES / name
    provenance = json.loads((bundle / "import.json").read_text())
    release = REPO / provenance["release"]
    manifest = json.loads((bundle / "bundle.json").read_text())
    runners = {c: ref.OrtCpuRunner(release / "onnx" / c / f"{c}.onnx") for c in manifest["components"]}
    golden = load_npz(bundle / manifest["end_to_end"])
    result, _ = ref.run_bundle(bundle, runners, golden)
    for key, value in result.items():
        np.testing.assert_array_equal(value, golden[key], err_msg=f"{name}: {key}")
    for component, entry in manifest["components"].items():
        assert (bundle / entry["binary"]).read_bytes() == (release / entry["binary"]).read_bytes()
        stored, published = load_npz(bundle / entry["golden"]), load_npz(release / entry["golden"])
        assert sorted(stored) == sorted(published)
        for key in stored:
            np.testing.assert_array_equal(stored[key], published[key], err_msg=f"{name}/{component}: {key}")


def _from_upstream(name: str) -> bool:
    """Bundles made from upstream's own model and goldens (upstream.json), not from seeds."""
    return (BUNDLES / name / "upstream.json").is_file()


@pytest.mark.parametrize("name", sorted(p.name for p in BUNDLES.iterdir() if _from_upstream(p.name)))
def test_upstream_bundle_goldens_are_upstreams(name):
    """A bundle made from upstream's model (tools/goldens/vla_goldens/make_upstream_fastwam_golden.py): its
    goldens are upstream's own tensors, its binaries the release's, and the release's fp32
    graphs through the reference reproduce upstream's actions on every observation."""
    bundle = BUNDLES / name
    provenance = json.loads((bundle / "upstream.json").read_text())
    release, up = REPO / provenance["release"], load_npz(REPO / provenance["upstream"])
    manifest = json.loads((bundle / "bundle.json").read_text())
    o = provenance["end_to_end_observation"]
    golden = load_npz(bundle / manifest["end_to_end"])
    for key, value in golden.items():
        np.testing.assert_array_equal(value, up[f"obs{o}_{key}"], err_msg=f"{name}: {key}")
    for component, entry in manifest["components"].items():
        assert (bundle / entry["binary"]).read_bytes() == (release / entry["binary"]).read_bytes()
        assert (bundle / entry["golden"]).read_bytes() == (release / entry["golden"]).read_bytes()
    runners = {c: ref.OrtCpuRunner(release / "onnx" / c / f"{c}.onnx") for c in manifest["components"]}
    for i in range(int(up["observations"][0])):
        obs = {k: up[f"obs{i}_{k}"] for k in ("frames", "state", "instruction_id", "seed")}
        result, _ = ref.run_bundle(bundle, runners, obs)
        want = up[f"obs{i}_actions"]
        assert ref.cosine(result["actions"], want) >= 0.99999, (name, i)
        assert np.abs(result["actions"] - want).max() <= 1e-4, (name, i)  # measured <= 6.5e-6


@pytest.mark.parametrize("name", sorted(p.name for p in BUNDLES.iterdir()
                                        if not _imported(p.name) and not _from_upstream(p.name)))
def test_committed_goldens_match_reference(tmp_path, name):
    """Rebuilds the graphs from their seeds and reruns the CPU reference: the committed
    end-to-end and per-context goldens must come out bit-identical."""
    manifest, graphs = _bundle_graphs(name)
    for component, model in graphs.items():
        onnx.save(model, str(tmp_path / f"{component}.onnx"))
    bundle = BUNDLES / name
    golden = load_npz(bundle / manifest["end_to_end"])
    result, io = ref.run_bundle(bundle, ref.cpu_runners(bundle, tmp_path), golden)
    for key, value in result.items():
        np.testing.assert_array_equal(value, golden[key], err_msg=f"{name}: {key}")
    quat = bundle / "golden" / "end_to_end_quat.npz"
    if quat.is_file():
        # The same observation as `state_input: eef_pos_quat_gripper` writes it (9 values).
        golden_quat = load_npz(quat)
        variant = json.loads(json.dumps(manifest))
        variant["fastwam"]["chain"]["state_input"] = "eef_pos_quat_gripper"
        assert golden_quat["state"].shape == (9,)
        r, _ = ref.run_bundle(bundle, ref.cpu_runners(bundle, tmp_path), golden_quat, manifest=variant)
        assert sorted(r) == sorted(k for k in golden_quat if k not in ("frames", "state", "instruction_id", "seed"))
        for key, value in r.items():
            np.testing.assert_array_equal(value, golden_quat[key], err_msg=f"{name} (quaternion state): {key}")
    for component, entry in manifest["components"].items():
        stored = load_npz(bundle / entry["golden"])
        feeds, outs = io[component]
        assert list(stored) == list(feeds) + list(outs)
        for key in stored:
            np.testing.assert_array_equal(stored[key], {**feeds, **outs}[key], err_msg=f"{name}/{component}: {key}")


def test_bundle_layout_is_complete():
    for bundle in BUNDLES.iterdir():
        manifest = json.loads((bundle / "bundle.json").read_text())
        assert manifest["format"] == 1 and manifest["soc_model"] == 77 and manifest["htp_arch"] == 73
        for component, entry in manifest["components"].items():
            assert entry["binary"] == f"ctx/{component}_socid77_archv73.bin"
            assert (bundle / entry["binary"]).stat().st_size > 0
            assert (bundle / entry["golden"]).is_file()
        e2e = load_npz(bundle / manifest["end_to_end"])
        assert e2e["seed"].dtype == np.uint64 and e2e["actions"].dtype == np.float32
        if manifest["policy"] == "molmoact2":
            m = manifest["molmoact2"]
            assert e2e["frames"].shape == (m["cameras"], m["frame_height"], m["frame_width"], 3)
            assert e2e["actions"].shape == (m["action_horizon"], m["action_dims"])
            assert (bundle / m["prompt"]).is_file()
        elif "chain" in manifest["fastwam"]:
            # Closed loop: the chain's per-instruction context tables; frames and state in.
            c = manifest["fastwam"]["chain"]
            assert (bundle / c["tables"]).is_file()
            assert e2e["frames"].shape == (c["cameras"], c["frame_height"], c["frame_width"], 3)
            assert e2e["state"].shape == (c["state_dims"],)
        else:
            assert (bundle / manifest["fastwam"]["world_model"]).is_file()


def test_quantized_context_fixture_is_consistent():
    ctx = REPO / "golden" / "contexts"
    meta = json.loads((ctx / "qdq_mixed.json").read_text())
    assert (ctx / meta["binary"]).stat().st_size > 0
    io = load_npz(ctx / meta["golden"])
    assert set(io) == set(meta["tensors"])
    for name, q in meta["tensors"].items():
        assert io[name].dtype == np.dtype(q["dtype"])
        assert q["scale"] > 0 and -q["offset"] in (128, 32768)
    # outputs are the fixed-point image of a real computation, not saturated constants
    for name in ("y_u8", "y_u16"):
        info = np.iinfo(io[name].dtype)
        assert np.mean((io[name] == info.min) | (io[name] == info.max)) < 0.05
        assert len(np.unique(io[name])) > 20
