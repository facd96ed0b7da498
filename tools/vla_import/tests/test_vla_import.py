"""The release importer (tools/vla_import) on the tiny upstream MolmoAct2 release and checkpoint
(golden/upstream-molmoact2) and on broken copies of them: every refusal is one line
naming file and key, and leaves nothing behind."""

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
from vla_import.__main__ import main  # noqa: E402
from vla_import import checkpoint as ck  # noqa: E402

UP = REPO / "golden" / "upstream-molmoact2"
REPORT = json.loads((UP / "make_report.json").read_text())
INSTRUCTIONS = REPORT["instructions"]


def args(release, checkpoint, out, *extra, instructions=None, observation=True):
    a = ["--release", str(release), "--checkpoint", str(checkpoint), "--tag", REPORT["tag"], "--out", str(out),
         "--name", "molmoact2-upstream-original-tiny"]
    if observation:
        a += ["--observation", "golden/upstream-molmoact2/upstream/original_observation0.npz"]
    else:
        a += ["--frame-size", "48x64"]
    for text in instructions or INSTRUCTIONS:
        a += ["--instruction", text]
    return a + list(extra)


@pytest.fixture
def copies(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    release, checkpoint = tmp_path / "release", tmp_path / "checkpoint"
    shutil.copytree(UP / "release-original", release)
    shutil.copytree(UP / "checkpoint", checkpoint)
    return release, checkpoint, tmp_path / "bundle"


def refused(capsys, argv, out: Path, *needles):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    assert not out.exists(), "a refused import must leave nothing behind"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")], "temporary left behind"
    return err


def test_import_reproduces_the_committed_bundle(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    out = tmp_path / "bundle"
    argv = args("golden/upstream-molmoact2/release-original", "golden/upstream-molmoact2/checkpoint", out)
    assert main(argv) == 0, capsys.readouterr().err
    committed = REPO / "golden" / "bundles" / "molmoact2-upstream-original"
    made = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert made == sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    for rel in made:
        assert (out / rel).read_bytes() == (committed / rel).read_bytes(), rel


def test_missing_golden(copies, capsys):
    release, checkpoint, out = copies
    (release / "golden" / "vision_io.npz").unlink()
    refused(capsys, args(release, checkpoint, out), out, "vision_io.npz", "expected the golden of vision")


def _rewrite_npz(path: Path, edit):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    np.savez(path.with_suffix(""), **arrays)  # np.savez adds .npz


def test_renamed_npz_key(copies, capsys):
    release, checkpoint, out = copies
    _rewrite_npz(release / "golden" / "action_step_io.npz", lambda a: a.update(t=a.pop("timestep")))
    refused(capsys, args(release, checkpoint, out), out, "action_step_io.npz timestep", "found keys")


def test_shape_mismatch(copies, capsys):
    release, checkpoint, out = copies
    _rewrite_npz(release / "golden" / "llm_split1_io.npz",
                 lambda a: a.update(hidden_states=a["hidden_states"][:, :-3]))
    refused(capsys, args(release, checkpoint, out), out, "llm_split1_io.npz hidden_states", "expected [1, 131, 64]")


def test_wrong_soc(copies, capsys):
    release, checkpoint, out = copies
    ctx = release / "ctx"
    (ctx / "vision_socid77_archv73.bin").rename(ctx / "vision_socid78_archv73.bin")
    refused(capsys, args(release, checkpoint, out), out, "vision_socid78_archv73.bin", "expected 77, found 78")


def test_unknown_tag_lists_the_tags(copies, capsys):
    release, checkpoint, out = copies
    argv = args(release, checkpoint, out)
    argv[argv.index("--tag") + 1] = "libero_spatial"
    refused(capsys, argv, out, "norm_stats.json metadata_by_tag", "'libero_spatial' not found", "libero_tiny")


def test_sharded_f32_and_f16_checkpoint_gives_the_same_tables(copies, capsys):
    from safetensors.numpy import save_file

    release, checkpoint, out = copies
    single = checkpoint / "model.safetensors"
    base = ck.read_tensor(single, ck.WTE)
    new = ck.read_tensor(single, ck.NEW)
    single.unlink()
    save_file({ck.WTE: base}, str(checkpoint / "model-00001-of-00002.safetensors"))
    save_file({ck.NEW: new.astype(np.float16)}, str(checkpoint / "model-00002-of-00002.safetensors"))
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        ck.WTE: "model-00001-of-00002.safetensors", ck.NEW: "model-00002-of-00002.safetensors"}}))
    assert main(args(release, checkpoint, out)) == 0, capsys.readouterr().err
    committed = REPO / "golden" / "bundles" / "molmoact2-upstream-original"
    assert (out / "prompt/prompt_tables.npz").read_bytes() == (committed / "prompt/prompt_tables.npz").read_bytes()


def test_lerobot_key_prefix(copies, capsys):
    from safetensors.numpy import save_file

    release, checkpoint, out = copies
    single = checkpoint / "model.safetensors"
    tensors = {"model." + k: ck.read_tensor(single, k) for k in (ck.WTE, ck.NEW)}
    save_file(tensors, str(single))
    assert main(args(release, checkpoint, out)) == 0, capsys.readouterr().err
    assert json.loads((out / "import.json").read_text())["embedding_prefix"] == "model."


def test_encoder_mask_disagreeing_with_action_mode(copies, capsys):
    release, checkpoint, out = copies
    config = json.loads((checkpoint / "config.json").read_text())
    config["action_mode"] = "continuous"  # the release was traced with "both": EOS rows masked
    (checkpoint / "config.json").write_text(json.dumps(config))
    refused(capsys, args(release, checkpoint, out), out, "action_step_io.npz encoder_attention_mask",
            "config.json action_mode")


def test_instruction_of_the_wrong_length(copies, capsys):
    release, checkpoint, out = copies
    argv = args(release, checkpoint, out, instructions=INSTRUCTIONS + ["pick up the alphabet soup and place it in the basket"])
    refused(capsys, argv, out, "--instruction", "instruction 3", "renders to")


def test_traced_prompt_not_among_the_instructions(copies, capsys):
    release, checkpoint, out = copies
    argv = args(release, checkpoint, out, instructions=INSTRUCTIONS[1:])
    refused(capsys, argv, out, "llm_split0_io.npz hidden_states", "traced text")


def test_fused_overlay_golden_of_another_sequence_length(copies, capsys, tmp_path):
    release, checkpoint, out = copies
    overlay = tmp_path / "overlay"
    (overlay / "ctx").mkdir(parents=True)
    (overlay / "golden").mkdir()
    for c in ("vision", "action_step"):
        shutil.copy(release / "ctx" / f"{c}_socid77_archv73.bin", overlay / "ctx")
        shutil.copy(release / "golden" / f"{c}_io.npz", overlay / "golden")
    _rewrite_npz(overlay / "golden" / "action_step_io.npz",
                 lambda a: a.update(encoder_attention_mask=a["encoder_attention_mask"][:, :128]))
    argv = args(release, checkpoint, out, "--overlay", str(overlay))
    refused(capsys, argv, out, "overlay/golden/action_step_io.npz encoder_attention_mask", "expected [1, 131]")


def test_constant_state_dim_is_imported_as_constant(copies, capsys):
    release, checkpoint, out = copies
    path = checkpoint / "norm_stats.json"
    stats = json.loads(path.read_text())
    s = stats["metadata_by_tag"][REPORT["tag"]]["state_stats"]
    s["max"][2] = s["min"][2]
    path.write_text(json.dumps(stats))
    assert main(args(release, checkpoint, out)) == 0, capsys.readouterr().err
    norm = json.loads((out / "bundle.json").read_text())["molmoact2"]["state_norm"]
    assert norm["constant"] == [i == 2 for i in range(8)]


def test_unsupported_crop_mode(copies, capsys):
    release, checkpoint, out = copies
    path = checkpoint / "processor_config.json"
    proc = json.loads(path.read_text())
    proc["image_processor"]["crop_mode"] = "overlap-and-resize-c2"
    path.write_text(json.dumps(proc))
    refused(capsys, args(release, checkpoint, out), out, "processor_config.json image_processor.crop_mode",
            "expected 'resize'")


def test_processor_config_is_read_as_lerobots_loader_reads_it(copies, capsys):
    """golden/upstream/processors/: a `size` int is upstream's square; an absent crop_mode is
    the image processor's default, overlap-and-resize-c2 (multi-crop), which vlad refuses."""
    release, checkpoint, out = copies
    path = checkpoint / "processor_config.json"
    _edit_json(path, lambda p: p["image_processor"].update(size=56))
    assert main(args(release, checkpoint, out)) == 0, capsys.readouterr().err
    shutil.rmtree(out)
    _edit_json(path, lambda p: p["image_processor"].pop("crop_mode"))
    refused(capsys, args(release, checkpoint, out), out, "processor_config.json image_processor.crop_mode",
            "found 'overlap-and-resize-c2' (absent: the image processor's default)")


def test_the_upstream_version_is_recorded_and_its_padding_applied(copies, capsys):
    """The tiny release was traced as lerobot 0.6.1 runs it (no padding at batch 1); lerobot main
    pads the same prompt to a multiple of 8 first, a layout these contexts were not traced with."""
    release, checkpoint, out = copies
    assert main(args(release, checkpoint, out)) == 0, capsys.readouterr().err
    assert json.loads((out / "import.json").read_text())["upstream"] == "lerobot-0.6.1"
    assert bytes(np.load(out / "prompt" / "prompt_tables.npz")["upstream"]).decode() == "lerobot-0.6.1"
    shutil.rmtree(out)
    refused(capsys, args(release, checkpoint, out, "--upstream", "lerobot-main-c13d79e"), out, "--instruction",
            "lerobot-main-c13d79e lays out as", "rows of left padding")


def test_refused_import_leaves_an_existing_bundle_untouched(copies, capsys):
    release, checkpoint, out = copies
    shutil.copytree(REPO / "golden" / "bundles" / "molmoact2-upstream-original", out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (release / "golden" / "trace.json").unlink()
    assert main(args(release, checkpoint, out)) == 1
    assert "trace.json" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_synthetic_observation_is_said_so(copies, capsys):
    release, checkpoint, out = copies
    assert main(args(release, checkpoint, out, observation=False)) == 0, capsys.readouterr().err
    assert "synthetic" in json.loads((out / "import.json").read_text())["end_to_end_observation"]


def test_release_that_is_neither_a_directory_nor_reachable(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network in tests: the Hub path must fail in one line
    out = tmp_path / "bundle"
    refused(capsys, args("nobody/no-such-release", UP / "checkpoint", out), out, "nobody/no-such-release",
            "not a local directory")


# --- a LeRobot-layout checkpoint (the retrained variants), laid out with the published names ---

NORM_MAP = {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
NORMALIZER_FILE = "policy_preprocessor_step_3_molmoact2_masked_normalizer.safetensors"
UNNORMALIZER_FILE = "policy_postprocessor_step_1_molmoact2_masked_unnormalizer.safetensors"


def _feature_stats(feature: str, stats: dict) -> dict:
    """lerobot's normalizer state_dict: flat `<feature>.<stat>` f32 tensors, the mask as 1/0."""
    return {f"{feature}.{k}": np.asarray(v, np.float32) for k, v in stats.items()}


def lerobot_checkpoint(root: Path, hf: Path, *, norm_map=None, policy_edit=None, new_embedding=None) -> Path:
    """The tiny Hugging Face checkpoint retrained in LeRobot: config.json naming it, the wte tensors
    under the `model.` prefix, the statistics in the pipelines' normalizer state files."""
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    meta = json.loads((hf / "norm_stats.json").read_text())["metadata_by_tag"][REPORT["tag"]]
    cams = [f"observation.images.{k}" for k in meta["camera_keys"]]
    h, w = REPORT["frame_size"]
    features = {**{c: {"type": "VISUAL", "shape": [3, h, w]} for c in cams},
                "observation.state": {"type": "STATE", "shape": [len(meta["state_stats"]["q01"])]}}
    out_features = {"action": {"type": "ACTION", "shape": [len(meta["action_stats"]["q01"])]}}
    policy = {"type": "molmoact2", "checkpoint_path": str(hf), "n_obs_steps": 1, "chunk_size": 10,
              "n_action_steps": 10, "action_mode": "both", "inference_action_mode": "continuous",
              "norm_tag": None, "setup_type": "", "control_mode": "", "image_keys": cams,
              "normalize_language": True, "add_setup_tokens": True, "add_control_tokens": True,
              "normalize_gripper": False, "num_state_tokens": 256, "num_inference_steps": None,
              "joint_signs": None, "joint_offsets": None, "normalization_mapping": NORM_MAP,
              "input_features": features, "output_features": out_features}
    if policy_edit:
        policy_edit(policy)
    (root / "config.json").write_text(json.dumps(policy, indent=2))
    single = hf / "model.safetensors"
    new = ck.read_tensor(single, ck.NEW) if new_embedding is None else new_embedding
    save_file({"model." + ck.WTE: ck.read_tensor(single, ck.WTE), "model." + ck.NEW: new},
              str(root / "model.safetensors"))
    stats = {**_feature_stats("observation.state", meta["state_stats"]),
             **_feature_stats("action", meta["action_stats"]),
             **{f"{c}.{k}": np.full((3, 1, 1), v, np.float32) for c in cams for k, v in (("mean", 0.5), ("std", 0.25))}}
    save_file(stats, str(root / NORMALIZER_FILE))
    save_file(stats, str(root / UNNORMALIZER_FILE))
    norm_config = {"eps": 1e-08, "features": {**features, **out_features}, "norm_map": norm_map or NORM_MAP}
    pre = {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
        {"registry_name": "molmoact2_masked_normalizer", "config": norm_config, "state_file": NORMALIZER_FILE},
        {"registry_name": "molmoact2_clamp_normalized", "config": {}},
        {"registry_name": "molmoact2_pack_inputs", "config": {
            "checkpoint_path": str(hf), "action_mode": policy["action_mode"], "image_keys": cams,
            "setup_type": meta["setup_type"], "control_mode": meta["control_mode"], "normalize_language": True,
            "add_setup_tokens": True, "add_control_tokens": True, "num_state_tokens": 256,
            "max_sequence_length": None, "chunk_size": 10, "max_action_dim": 8, "env_action_dim": None}}]}
    post = {"name": "policy_postprocessor", "steps": [
        {"registry_name": "molmoact2_clamp_action", "config": {}},
        {"registry_name": "molmoact2_masked_unnormalizer",
         "config": {"eps": 1e-08, "features": out_features, "norm_map": norm_map or NORM_MAP},
         "state_file": UNNORMALIZER_FILE},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}]}
    (root / "policy_preprocessor.json").write_text(json.dumps(pre, indent=2))
    (root / "policy_postprocessor.json").write_text(json.dumps(post, indent=2))
    return root


def lerobot_args(release, lr, out, *extra, observation=True):
    a = ["--release", str(release), "--checkpoint", str(lr), "--out", str(out),
         "--name", "molmoact2-upstream-original-tiny"]
    if observation:
        a += ["--observation", "golden/upstream-molmoact2/upstream/original_observation0.npz"]
    for text in INSTRUCTIONS:
        a += ["--instruction", text]
    return a + list(extra)


def _f32_norms(manifest: dict) -> dict:
    m = manifest["molmoact2"]
    for key in ("state_norm", "action_norm"):
        m[key] = {k: (np.float32(v).tolist() if k in ("low", "high", "mean", "std") else v) for k, v in m[key].items()}
    return manifest


def test_lerobot_checkpoint_gives_the_same_bundle(copies, capsys, tmp_path):
    """Same model, statistics carried by the LeRobot pipelines (f32) instead of norm_stats.json:
    the same bundle, no --tag, and the frame size from input_features."""
    release, hf, out = copies
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf)
    assert main(lerobot_args(release, lr, out, observation=False)) == 0, capsys.readouterr().err
    plain = tmp_path / "plain"
    assert main(args(release, hf, plain, observation=False)) == 0, capsys.readouterr().err
    made = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert made == sorted(p.relative_to(plain) for p in plain.rglob("*") if p.is_file())
    for rel in made:
        if rel.name == "embedding.npy":  # each in its checkpoint's dtype (this LeRobot one: f32)
            lr_rows, hf_rows = np.load(out / rel), np.load(plain / rel)
            assert (lr_rows.dtype, hf_rows.dtype) == (np.float32, np.uint16)  # bf16 bit patterns
            np.testing.assert_array_equal(lr_rows, (hf_rows.astype(np.uint32) << 16).view(np.float32))
        elif rel.name not in ("bundle.json", "import.json"):
            assert (out / rel).read_bytes() == (plain / rel).read_bytes(), rel
    got, want = (_f32_norms(json.loads((d / "bundle.json").read_text())) for d in (out, plain))
    assert want["molmoact2"]["text"].pop("embedding_dtype") == "bf16"
    # A LeRobot pack step caps the prompt (its inferred budget); a Hugging Face checkpoint does not.
    assert (got["molmoact2"]["text"].pop("max_sequence_length"), want["molmoact2"]["text"].pop("max_sequence_length")) \
        == (576, None)
    for key in ("state_norm", "action_norm"):
        # The blocks say whose normalizer runs them: LeRobot's pipeline (its eps, no zero mask)
        # for a LeRobot checkpoint, the HF one for an HF checkpoint; the statistics are the same.
        lr_block, hf_block = got["molmoact2"][key], want["molmoact2"][key]
        assert (lr_block.pop("follows"), lr_block.pop("eps")) == ("lerobot_pipeline", 1e-8)
        assert hf_block.pop("follows") == "hf_feature_normalizer"
        assert not any(hf_block.pop("constant", [])), "the tiny checkpoint has no min == max dim"
    assert got == want
    assert got["molmoact2"]["state_norm"]["passthrough"] == [False] * 8
    assert got["molmoact2"]["action_norm"]["passthrough"] == [False] * 6 + [True]  # the gripper mask
    prov = json.loads((out / "import.json").read_text())
    assert prov["layout"] == "lerobot" and prov["statistics"] == [str(lr / NORMALIZER_FILE), str(lr / UNNORMALIZER_FILE)]
    assert prov["embedding_prefix"] == "model."


def test_lerobot_fine_tuned_new_embedding_wins(copies, capsys, tmp_path):
    release, hf, out = copies
    single = hf / "model.safetensors"
    new = ck.read_tensor(single, ck.NEW)
    wte = np.concatenate([ck.read_tensor(single, ck.WTE), new])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
    with np.load(release / "golden" / "llm_split0_io.npz") as z:
        from vla_import.prompt import recover_ids

        traced = set(recover_ids(z["hidden_states"][0], wte).tolist())
    level = next(k for k in range(256) if tok.token_to_id(f"<state_{k}>") not in traced)
    row = tok.token_to_id(f"<state_{level}>") - len(wte) + len(new)
    assert row >= 0, "state tokens live in new_embedding"
    tuned = new.copy()
    tuned[row] = np.linspace(-1, 1, new.shape[1], dtype=np.float32)
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf, new_embedding=tuned)
    assert main(lerobot_args(release, lr, out)) == 0, capsys.readouterr().err
    with np.load(out / "prompt" / "prompt_tables.npz") as z:
        assert np.array_equal(z["state_token_rows"][level], tuned[row].astype(np.float16))
    assert json.loads((out / "import.json").read_text())["embedding_from"][1] == f"{lr / 'model.safetensors'} model.{ck.NEW}"


def test_lerobot_quantile10_reads_q10_q90(copies, capsys, tmp_path):
    """QUANTILE10 is lerobot's quantile formula on q10/q90: the import reads those bounds."""
    release, hf, out = copies
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf, norm_map={**NORM_MAP, "STATE": "QUANTILE10"})
    refused(capsys, lerobot_args(release, lr, out), out, f"{NORMALIZER_FILE} observation.state.q10",
            "expected for quantile")


@pytest.mark.parametrize("where", ["pack", "policy"])
def test_lerobot_prompt_above_the_sequence_cap_is_refused(copies, capsys, tmp_path, where):
    """lerobot's pack step raises on a prompt longer than max_sequence_length: so does the import."""
    release, hf, out = copies
    edit = (lambda p: p.update(max_sequence_length=64)) if where == "policy" else None
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf, policy_edit=edit)
    if where == "pack":
        pre = json.loads((lr / "policy_preprocessor.json").read_text())
        pre["steps"][5]["config"]["max_sequence_length"] = 64
        (lr / "policy_preprocessor.json").write_text(json.dumps(pre))
    needle = "policy_preprocessor.json molmoact2_pack_inputs" if where == "pack" else "config.json max_sequence_length"
    refused(capsys, lerobot_args(release, lr, out), out, needle, "above max_sequence_length 64",
            "refuses such a prompt")


@pytest.mark.parametrize("key", ["add_setup_tokens", "add_control_tokens"])
def test_lerobot_template_settings_reach_the_builder(copies, capsys, tmp_path, key):
    """add_setup_tokens / add_control_tokens false are no longer refused: the builder renders
    without the two markers, as upstream (129 tokens), so a release traced with them (131) no longer
    matches."""
    release, hf, out = copies
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf)
    pre = json.loads((lr / "policy_preprocessor.json").read_text())
    pre["steps"][5]["config"][key] = False
    (lr / "policy_preprocessor.json").write_text(json.dumps(pre))
    refused(capsys, lerobot_args(release, lr, out), out, "--instruction", "renders to 129 tokens", "seq_len 131")


def test_hf_template_setting_reaches_the_builder(copies, capsys):
    release, checkpoint, out = copies
    _edit_json(checkpoint / "config.json", lambda c: c.update(add_setup_tokens=False))
    refused(capsys, args(release, checkpoint, out), out, "--instruction", "renders to 129 tokens", "seq_len 131")


def test_lerobot_joint_signs_are_refused(copies, capsys, tmp_path):
    release, hf, out = copies
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf,
                            policy_edit=lambda p: p.update(joint_signs=[1.0] * 8, joint_offsets=[0.0] * 8))
    refused(capsys, lerobot_args(release, lr, out), out, "config.json joint_signs", "expected null")


def test_lerobot_missing_statistic_names_file_and_key(copies, capsys, tmp_path):
    from safetensors.numpy import load_file, save_file

    release, hf, out = copies
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf)
    stats = load_file(str(lr / NORMALIZER_FILE))
    del stats["observation.state.q99"]
    save_file(stats, str(lr / NORMALIZER_FILE))
    refused(capsys, lerobot_args(release, lr, out), out, f"{NORMALIZER_FILE} observation.state.q99",
            "expected for quantile")


def test_lerobot_missing_state_file(copies, capsys, tmp_path):
    release, hf, out = copies
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf)
    (lr / UNNORMALIZER_FILE).unlink()
    refused(capsys, lerobot_args(release, lr, out), out, UNNORMALIZER_FILE,
            "named by policy_postprocessor.json steps[1]")


def test_lerobot_action_mode_decides_the_encoder_mask(copies, capsys, tmp_path):
    release, hf, out = copies

    def continuous(p):
        p["action_mode"] = "continuous"

    lr = lerobot_checkpoint(tmp_path / "lerobot", hf, policy_edit=continuous)
    pre = json.loads((lr / "policy_preprocessor.json").read_text())
    pre["steps"][5]["config"]["action_mode"] = "continuous"
    (lr / "policy_preprocessor.json").write_text(json.dumps(pre))
    refused(capsys, lerobot_args(release, lr, out), out, "action_step_io.npz encoder_attention_mask", "action_mode")


# --- settings vlad cannot express, and the checkpoint encodings ---


def _edit_json(path: Path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("edit, needles", [
    (lambda p: p["image_processor"].update(image_mean=[0.485, 0.456, 0.406]),
     ["processor_config.json image_processor.image_mean", "expected [0.5, 0.5, 0.5]"]),
    (lambda p: p["image_processor"].update(image_std=[0.229, 0.224, 0.225]),
     ["processor_config.json image_processor.image_std", "expected [0.5, 0.5, 0.5]"]),
])
def test_image_normalization_other_than_half_is_refused(copies, capsys, edit, needles):
    release, checkpoint, out = copies
    _edit_json(checkpoint / "processor_config.json", edit)
    refused(capsys, args(release, checkpoint, out), out, *needles)


@pytest.mark.parametrize("edit, needles", [
    (lambda c: c.update(num_state_tokens=128), ["config.json num_state_tokens", "expected 256", "found 128"]),
    (lambda c: c.update(joint_signs=[-1.0] * 8), ["config.json joint_signs", "expected null"]),
])
def test_config_settings_vlad_cannot_express_are_refused(copies, capsys, edit, needles):
    release, checkpoint, out = copies
    _edit_json(checkpoint / "config.json", edit)
    refused(capsys, args(release, checkpoint, out), out, *needles)


def test_q10_q90_reads_those_bounds_and_other_modes_are_refused(copies, capsys):
    release, checkpoint, out = copies
    _edit_json(checkpoint / "norm_stats.json", lambda s: s.update(norm_mode="q10_q90"))
    refused(capsys, args(release, checkpoint, out), out, "norm_stats.json", "q10", "expected for norm_mode 'q10_q90'")
    _edit_json(checkpoint / "norm_stats.json", lambda s: s.update(norm_mode="q05_q95"))
    refused(capsys, args(release, checkpoint, out), out, "norm_stats.json", "norm_mode", "'q05_q95'")


def test_bf16_checkpoint_is_read_exactly(tmp_path):
    """The committed tiny checkpoint is bf16 (as the published ones): each value is the upper
    half of an f32, so widening is exact: the f32 re-encoding gives the same table."""
    from safetensors.numpy import save_file

    single = UP / "checkpoint" / "model.safetensors"
    header, _ = ck._header(single)
    assert header[ck.WTE]["dtype"] == header[ck.NEW]["dtype"] == "BF16"
    table, _, _ = ck.embedding_table([single.parent])
    assert table.dtype == np.float32 and not (table.view(np.uint32) & 0xFFFF).any()
    f32 = tmp_path / "f32"
    f32.mkdir()
    save_file({ck.WTE: ck.read_tensor(single, ck.WTE), ck.NEW: ck.read_tensor(single, ck.NEW)},
              str(f32 / "model.safetensors"))
    again, _, _ = ck.embedding_table([f32])
    assert np.array_equal(table, again)


def test_lora_key_prefix(copies, capsys):
    from safetensors.numpy import save_file

    release, checkpoint, out = copies
    single = checkpoint / "model.safetensors"
    save_file({"model.base_model.model." + k: ck.read_tensor(single, k) for k in (ck.WTE, ck.NEW)}, str(single))
    assert main(args(release, checkpoint, out)) == 0, capsys.readouterr().err
    assert json.loads((out / "import.json").read_text())["embedding_prefix"] == "model.base_model.model."


# --- Fast-WAM: the public release's layout (action_step only), open loop ---

FASTWAM = REPO / "golden" / "bundles" / "fastwam"
FASTWAM_STATS = "libero_uncond_2cam224_dataset_stats.json"


def fastwam_release(root: Path) -> Path:
    """A release as the public Fast-WAM one is laid out: the action_step context, its golden, the
    video prefill's golden and the converter's report beside it, the ONNX graph (rebuilt from the
    fixture's seed: it is the graph the committed binary was compiled from)."""
    from vla_goldens import make_golden as mg
    from vla_goldens import fixture_graphs as fg
    import onnx

    (root / "ctx").mkdir(parents=True)
    (root / "golden").mkdir()
    (root / "onnx" / "action_step").mkdir(parents=True)
    shutil.copy(FASTWAM / "ctx" / "action_step_socid77_archv73.bin", root / "ctx")
    shutil.copy(FASTWAM / "golden" / "action_step_io.npz", root / "golden")
    with np.load(FASTWAM / "golden" / "action_step_io.npz") as z:
        np.savez(root / "golden" / "video_prefill_io.npz", video_keys=z["video_keys"], video_values=z["video_values"])
    (root / "golden" / "convert_report.json").write_text(json.dumps({"components": ["action_step"]}))
    cfg = mg.FASTWAM
    model = fg.build_fastwam_step(cfg["dims"], mg.component_rng(cfg["seed"], "action_step"))
    onnx.save(model, str(root / "onnx" / "action_step" / "action_step.onnx"))
    return root


def fastwam_checkpoint(root: Path) -> Path:
    rng = np.random.default_rng(3)
    lo = rng.uniform(-1.0, 0.0, 7)
    hi = lo + rng.uniform(0.5, 2.0, 7)
    lo[-1], hi[-1] = 0.0, 1.0  # the gripper in [0, 1]: upstream LIBERO maps it by g*2-1, inverted
    stats = {k: {"default": {"global_min": lo.tolist(), "global_max": hi.tolist(),
                             "global_q01": (lo + 0.01).tolist(), "global_q99": (hi - 0.01).tolist(),
                             "global_mean": ((lo + hi) / 2).tolist(), "global_std": (hi - lo).tolist()}}
             for k in ("action", "state")}
    root.mkdir(parents=True)
    (root / FASTWAM_STATS).write_text(json.dumps(stats))
    return root


@pytest.fixture
def fastwam_copies(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    return fastwam_release(tmp_path / "release"), fastwam_checkpoint(tmp_path / "checkpoint"), tmp_path / "bundle"


def test_fastwam_open_loop_import_passes_parity(fastwam_copies, capsys):
    import subprocess
    from vla_import import release as rel

    release, checkpoint, out = fastwam_copies
    assert main(["--release", str(release), "--checkpoint", str(checkpoint), "--out", str(out)]) == 0, \
        capsys.readouterr().err
    man = json.loads((out / "bundle.json").read_text())
    f = man["fastwam"]
    stats = json.loads((checkpoint / FASTWAM_STATS).read_text())["action"]["default"]
    assert (f["flow_steps"], f["shift"], f["gripper_map"], f["gripper_binarize"]) == (10, 5.0, "libero", True)
    assert f["action_norm"] == {"mode": "min_max", "low": stats["global_min"], "high": stats["global_max"]}
    assert (f["action_horizon"], f["action_dims"]) == (32, 7)
    with np.load(out / "inputs" / "world_model.npz") as w, np.load(release / "golden" / "action_step_io.npz") as g:
        assert sorted(w.files) == ["context", "context_mask", "video_keys", "video_values"]
        for k in w.files:
            assert np.array_equal(w[k], g[k]), k
    with np.load(out / "golden" / "end_to_end.npz") as e:
        assert set(np.unique(e["actions"][:, -1])) <= {-1.0, 1.0}  # binarized, clear of 0
    assert "open loop" in json.loads((out / "import.json").read_text())["end_to_end_observation"]
    run = subprocess.run([rel.vlad_command(None), "parity", "--bundle", str(out)], env=rel.qnn_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.returncode == 0, run.stdout
    assert "OPEN LOOP" in run.stdout and "end to end" in run.stdout


def test_fastwam_overrides_are_written(fastwam_copies, capsys):
    release, checkpoint, out = fastwam_copies
    argv = ["--release", str(release), "--checkpoint", str(checkpoint), "--out", str(out), "--flow-steps", "4",
            "--shift", "3", "--norm-mode", "z-score", "--gripper-map", "none", "--no-gripper-binarize"]
    assert main(argv) == 0, capsys.readouterr().err
    f = json.loads((out / "bundle.json").read_text())["fastwam"]
    assert (f["flow_steps"], f["shift"], f["gripper_map"], f["gripper_binarize"]) == (4, 3.0, "none", False)
    assert f["action_norm"]["mode"] == "mean_std"


def test_fastwam_stats_of_the_wrong_width(fastwam_copies, capsys):
    release, checkpoint, out = fastwam_copies
    _edit_json(checkpoint / FASTWAM_STATS, lambda s: s["action"]["default"]["global_max"].append(1.0))
    refused(capsys, ["--release", str(release), "--checkpoint", str(checkpoint), "--out", str(out)], out,
            f"{FASTWAM_STATS} action.default.global_max", "expected 7 (latents_action's last dim), found 8")


def test_fastwam_release_with_part_of_the_chain_is_refused(fastwam_copies, capsys):
    release, checkpoint, out = fastwam_copies
    for c in ("wm_vae_enc",):
        shutil.copy(REPO / "golden" / "bundles" / "fastwam-closed-loop" / "ctx" / f"{c}_socid77_archv73.bin",
                    release / "ctx")
        shutil.copy(REPO / "golden" / "bundles" / "fastwam-closed-loop" / "golden" / f"{c}_io.npz", release / "golden")
    refused(capsys, ["--release", str(release), "--checkpoint", str(checkpoint), "--out", str(out)], out,
            "release ctx/", "expected wm_prefill_split0.. binaries (the closed-loop chain), found none")


def test_wrong_htp_arch(copies, capsys):
    release, checkpoint, out = copies
    ctx = release / "ctx"
    (ctx / "vision_socid77_archv73.bin").rename(ctx / "vision_socid77_archv75.bin")
    refused(capsys, args(release, checkpoint, out), out, "vision_socid77_archv75.bin", "expected v73, found v75")


def test_overlay_replaces_the_base_components(copies, capsys, tmp_path):
    """An operator-fused style overlay (vision and action_step only) whose goldens fit: the
    overlay's binaries go into the bundle, the rest is the base's."""
    release, checkpoint, out = copies
    overlay = tmp_path / "overlay"
    (overlay / "ctx").mkdir(parents=True)
    (overlay / "golden").mkdir()
    for c in ("vision", "action_step"):
        shutil.copy(release / "ctx" / f"{c}_socid77_archv73.bin", overlay / "ctx")
        shutil.copy(release / "golden" / f"{c}_io.npz", overlay / "golden")
        (overlay / "onnx" / c).mkdir(parents=True)
        shutil.copy(release / "onnx" / c / f"{c}.onnx", overlay / "onnx" / c)
    # Mark the base's copies so the bundle shows whose were taken: they must not be.
    for c in ("vision", "action_step"):
        (release / "ctx" / f"{c}_socid77_archv73.bin").write_bytes(b"not a context")
    assert main(args(release, checkpoint, out, "--overlay", str(overlay))) == 0, capsys.readouterr().err
    committed = REPO / "golden" / "bundles" / "molmoact2-upstream-original"
    for rel in ("ctx/vision_socid77_archv73.bin", "ctx/action_step_socid77_archv73.bin", "golden/end_to_end.npz"):
        assert (out / rel).read_bytes() == (committed / rel).read_bytes(), rel


def _flatten_state_dim(lr: Path, stats: tuple, dim: int = 2):
    from safetensors.numpy import load_file, save_file

    for name in (NORMALIZER_FILE, UNNORMALIZER_FILE):
        t = load_file(str(lr / name))
        for lo, hi in (stats,):
            t[f"observation.state.{hi}"][dim] = t[f"observation.state.{lo}"][dim]
        save_file(t, str(lr / name))


def test_lerobot_zero_range_quantile_dim_is_not_constant(copies, capsys, tmp_path):
    """lerobot's QUANTILES divides a zero range by its eps, it has no zero mask: the dim is
    imported as an ordinary one and the bundle says it follows lerobot's pipeline (vlad then
    divides by that eps, golden/upstream/lerobot_norm)."""
    release, hf, out = copies
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf)
    _flatten_state_dim(lr, ("q01", "q99"))
    assert main(lerobot_args(release, lr, out)) == 0, capsys.readouterr().err
    norm = json.loads((out / "bundle.json").read_text())["molmoact2"]["state_norm"]
    assert norm["low"][2] == norm["high"][2] and "constant" not in norm
    assert (norm["follows"], norm["eps"]) == ("lerobot_pipeline", 1e-8)


def test_lerobot_zero_range_min_max_state_dim_is_imported(copies, capsys, tmp_path):
    """lerobot's MIN_MAX maps a zero range through its eps (not to 0 as the HF zero mask does):
    with `follows: lerobot_pipeline` vlad computes that, so the dim is no longer refused."""
    release, hf, out = copies
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf, norm_map={**NORM_MAP, "STATE": "MIN_MAX"})
    _flatten_state_dim(lr, ("min", "max"))
    assert main(lerobot_args(release, lr, out)) == 0, capsys.readouterr().err
    norm = json.loads((out / "bundle.json").read_text())["molmoact2"]["state_norm"]
    assert norm["mode"] == "min_max" and norm["low"][2] == norm["high"][2] and "constant" not in norm
    assert norm["follows"] == "lerobot_pipeline"


def test_fastwam_refuses_molmoact2_settings(fastwam_copies, capsys):
    release, checkpoint, out = fastwam_copies
    argv = ["--release", str(release), "--checkpoint", str(checkpoint), "--out", str(out), "--keystone-k", "5"]
    refused(capsys, argv, out, "--keystone-k", "a MolmoAct2 setting")


def test_fastwam_tag_picks_the_statistics(fastwam_copies, capsys):
    release, checkpoint, out = fastwam_copies
    argv = ["--release", str(release), "--checkpoint", str(checkpoint), "--out", str(out), "--tag", "libero_tiny"]
    refused(capsys, argv, out, f"{FASTWAM_STATS} action", "tag 'libero_tiny' not found; tags: default")


def test_hub_repo_ids_fetch_only_the_files_the_import_reads(copies, capsys, tmp_path, monkeypatch):
    """The Hub path with huggingface_hub's own pattern filter and a local stand-in for the
    download (no network here): release, LeRobot checkpoint and the Hugging Face checkpoint its
    config names, each by repo id; files the import does not read stay on the Hub."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    release, hf, out = copies
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf,
                            policy_edit=lambda p: p.update(checkpoint_path="allenai/tiny-molmoact2"))
    for d in (release, hf, lr):
        (d / "README.md").write_text("model card")
    (hf / "training_args.bin").write_bytes(b"not needed")
    hub = {"xpuenabler/tiny-release": release, "allenai/tiny-molmoact2": hf, "xpuenabler/tiny-lerobot": lr}
    fetched = {}

    def snapshot_download(repo_id, allow_patterns=None, **_):
        src = hub[repo_id]
        files = [str(p.relative_to(src)) for p in src.rglob("*") if p.is_file()]
        keep = list(filter_repo_objects(files, allow_patterns=allow_patterns))
        dst = tmp_path / "hub" / repo_id.replace("/", "--")
        for rel in keep:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / rel, dst / rel)
        fetched[repo_id] = sorted(keep)
        return str(dst)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    argv = lerobot_args("xpuenabler/tiny-release", "xpuenabler/tiny-lerobot", out)
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(fetched) == sorted(hub)
    for repo, files in fetched.items():
        # The release's card names the release (its gates); a checkpoint's card is not read.
        assert ("README.md" in files) == (repo == "xpuenabler/tiny-release"), (repo, files)
        assert "training_args.bin" not in files, (repo, files)
    assert "golden/trace.json" in fetched["xpuenabler/tiny-release"]
    assert "onnx/vision/vision.onnx" in fetched["xpuenabler/tiny-release"]
    assert NORMALIZER_FILE in fetched["xpuenabler/tiny-lerobot"]
    assert "tokenizer.json" in fetched["allenai/tiny-molmoact2"]
    assert "model.safetensors" not in fetched["allenai/tiny-molmoact2"], "the LeRobot checkpoint has the wte"
    committed = REPO / "golden" / "bundles" / "molmoact2-upstream-original"
    for rel in ("ctx/llm_split0_socid77_archv73.bin", "prompt/prompt_tables.npz", "golden/end_to_end.npz"):
        assert (out / rel).read_bytes() == (committed / rel).read_bytes(), rel


def test_lerobot_checkpoint_without_the_base_embedding_takes_it_from_the_base(copies, capsys, tmp_path):
    from safetensors.numpy import save_file

    release, hf, out = copies
    lr = lerobot_checkpoint(tmp_path / "lerobot", hf)
    new = ck.read_tensor(hf / "model.safetensors", ck.NEW)
    save_file({"model." + ck.NEW: new}, str(lr / "model.safetensors"))  # only what was fine-tuned
    assert main(lerobot_args(release, lr, out)) == 0, capsys.readouterr().err
    prov = json.loads((out / "import.json").read_text())
    assert prov["embedding_from"] == [f"{hf / 'model.safetensors'} {ck.WTE}", f"{lr / 'model.safetensors'} model.{ck.NEW}"]
    committed = REPO / "golden" / "bundles" / "molmoact2-upstream-original"
    assert (out / "prompt/prompt_tables.npz").read_bytes() == (committed / "prompt/prompt_tables.npz").read_bytes()


# --- Fast-WAM with the world-model contexts: the tiny upstream release, closed loop ---

UPFW = REPO / "golden" / "upstream-fastwam" / "tiny"
UPFW_BUNDLE = REPO / "golden" / "bundles" / "fastwam-upstream"
UPFW_STATS = "libero_tiny_dataset_stats.json"
UPFW_INSTRUCTIONS = ["put the black bowl on the plate", "open the top drawer of the cabinet"]


def chain_args(release, checkpoint, out, *extra, observation=None):
    a = ["--release", str(release), "--checkpoint", str(checkpoint), "--tag", "default", "--out", str(out),
         "--name", "fastwam-upstream-tiny"]
    for text in UPFW_INSTRUCTIONS:
        a += ["--instruction", text]
    if observation:
        a += ["--observation", str(observation)]
    return a + list(extra)


def upstream_observation0(path: Path) -> Path:
    """Observation 0 of upstream's run (the one the hand-built bundle's end-to-end golden is)."""
    with np.load(UPFW / "upstream.npz") as z:
        np.savez(path, **{k: z[f"obs0_{k}"] for k in ("frames", "state", "instruction_id", "seed")})
    return path


@pytest.fixture
def chain_copies(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    release, checkpoint = tmp_path / "release", tmp_path / "checkpoint"
    shutil.copytree(UPFW / "release", release)
    shutil.copytree(UPFW / "checkpoint", checkpoint)
    return release, checkpoint, tmp_path / "bundle"


def test_fastwam_closed_loop_import_is_the_hand_built_bundle_and_passes_parity(tmp_path, monkeypatch, capsys):
    """The committed release + checkpoint -> the bundle make_upstream_fastwam_golden.py built by
    hand: the same bundle.json but the graph names (read from the binaries), the same proprio
    Linear and text lengths, text rows within 1e-6 (numpy's Wan encoder vs upstream's torch
    run), the end-to-end golden within 1e-4 (the fp32 graphs on ONNX Runtime vs upstream), and
    `vlad parity --bundle` passes on the emulator."""
    import subprocess
    from vla_import import release as rel

    monkeypatch.chdir(REPO)
    out = tmp_path / "bundle"
    obs = upstream_observation0(tmp_path / "obs0.npz")
    argv = chain_args("golden/upstream-fastwam/tiny/release", "golden/upstream-fastwam/tiny/checkpoint", out,
                      observation=obs)
    assert main(argv) == 0, capsys.readouterr().err
    made, hand = (json.loads((d / "bundle.json").read_text()) for d in (out, UPFW_BUNDLE))
    graphs = {c: v.pop("graph") for c, v in made["components"].items()}
    assert all(v.pop("graph") is None for v in hand["components"].values())
    assert made == hand
    for c, g in graphs.items():
        assert g == rel.inspect(rel.vlad_command(None), UPFW / "release" / "ctx" / f"{c}_socid77_archv73.bin")[
            "graphs"][0]["name"]
    with np.load(out / "inputs/context_tables.npz") as m, np.load(UPFW_BUNDLE / "inputs/context_tables.npz") as h:
        assert m.files == h.files
        for k in ("text_lengths", "proprio_weight", "proprio_bias"):
            assert np.array_equal(m[k], h[k]) and m[k].dtype == h[k].dtype, k
        assert m["text_rows"].dtype == h["text_rows"].dtype
        assert np.abs(m["text_rows"] - h["text_rows"]).max() <= 1e-6  # measured 4.8e-7
    for c in made["components"]:
        assert (out / "golden" / f"{c}_io.npz").read_bytes() == (UPFW_BUNDLE / "golden" / f"{c}_io.npz").read_bytes()
        assert (out / "ctx" / f"{c}_socid77_archv73.bin").read_bytes() == \
            (UPFW_BUNDLE / "ctx" / f"{c}_socid77_archv73.bin").read_bytes()
    with np.load(out / "golden/end_to_end.npz") as m, np.load(UPFW_BUNDLE / "golden/end_to_end.npz") as h:
        assert m.files == h.files
        for k in ("frames", "state", "instruction_id", "seed", "noise", "image"):
            assert np.array_equal(m[k], h[k]), k
        for k in m.files:
            assert np.abs(m[k].astype(np.float64) - h[k]).max() <= 1e-4, k  # measured: actions 4.5e-6
    prov = json.loads((out / "import.json").read_text())
    assert prov["traced"]["instruction"] == UPFW_INSTRUCTIONS[0] and prov["traced"]["proprio"]["residual"] < 1e-6
    run = subprocess.run([rel.vlad_command(None), "parity", "--bundle", str(out)], env=rel.qnn_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.returncode == 0, run.stdout
    assert "OPEN LOOP" not in run.stdout and "keys_split1" in run.stdout and "end to end" in run.stdout


def test_make_upstream_fastwam_golden_writes_the_committed_manifest(monkeypatch):
    """The hand-built bundle's bundle.json is what the importer's manifest gives for the export."""
    from vla_goldens import make_upstream_fastwam_golden as mk

    report = json.loads((UPFW / "export_report.json").read_text())
    trace = json.loads((UPFW / "release" / "golden" / "trace.json").read_text())
    goldens = {c: ck_npz(UPFW / "release" / "golden" / f"{c}_io.npz") for c in mk.COMPONENTS}
    assert json.dumps(mk.manifest(report, trace, goldens), indent=2) + "\n" == (UPFW_BUNDLE / "bundle.json").read_text()


def ck_npz(path: Path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_fastwam_chain_missing_world_model_context(chain_copies, capsys):
    release, checkpoint, out = chain_copies
    (release / "ctx" / "wm_embed_socid77_archv73.bin").unlink()
    refused(capsys, chain_args(release, checkpoint, out), out, "release ctx/",
            "expected wm_embed_socid77_archv73.bin (the closed-loop chain), found none")


def test_fastwam_chain_text_encoder_of_another_width(chain_copies, capsys):
    """Wan's encoder for a context width other than the release's (the header says [466, 16]
    where the release's context is 32 wide; same bytes, so only the shape check can catch it)."""
    release, checkpoint, out = chain_copies
    path = checkpoint / "models_t5_umt5-xxl-enc-bf16.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    assert header["token_embedding.weight"]["shape"] == [233, 32]
    text = raw[8:8 + n].replace(b'"shape":[233,32]', b'"shape":[466,16]')
    assert text != raw[8:8 + n] and len(text) == n
    path.write_bytes(raw[:8] + text + raw[8 + n:])
    refused(capsys, chain_args(release, checkpoint, out), out,
            "models_t5_umt5-xxl-enc-bf16.safetensors token_embedding.weight",
            "width: expected 32 (the release's context), found 16")


def test_fastwam_chain_stats_without_the_tag(chain_copies, capsys):
    release, checkpoint, out = chain_copies
    argv = chain_args(release, checkpoint, out)
    argv[argv.index("--tag") + 1] = "libero_spatial"
    refused(capsys, argv, out, f"{UPFW_STATS} action", "tag 'libero_spatial' not found; tags: default")


def test_fastwam_chain_proprio_of_another_checkpoint(chain_copies, capsys):
    """A checkpoint whose proprio Linear is not the one the release was traced with: the golden
    context's proprio row proves it."""
    from vla_import.torch_zip import Checkpoint

    release, checkpoint, out = chain_copies
    pt = checkpoint / "libero_tiny.pt"
    ckpt = Checkpoint(pt)
    ref = ckpt.payload["proprio_encoder"]["weight"]
    name = f"{ckpt.prefix}data/{ref.storage.key}"
    with zipfile.ZipFile(pt) as src, zipfile.ZipFile(tmp := pt.with_suffix(".tmp"), "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == name:
                w = np.frombuffer(data, np.float32).copy()
                w[::3] *= -1.0
                data = w.tobytes()
            dst.writestr(info, data)
    tmp.replace(pt)
    refused(capsys, chain_args(release, checkpoint, out), out, "wm_embed_io.npz context",
            "expected the last row to be the checkpoint's proprio_encoder of a normalized state")


def test_fastwam_chain_raw_robot_state_on_a_synthetic_observation(chain_copies, capsys):
    """`--state-input eef_pos_quat_gripper` without an observation: the synthetic one's state is
    9 values as the robot writes them, the gripper clear of the binarize threshold, and vlad
    gates the bundle (converting the quaternion as upstream's _extract_sim_state)."""
    import subprocess
    from vla_import import release as rel

    release, checkpoint, out = chain_copies
    assert main(chain_args(release, checkpoint, out, "--state-input", "eef_pos_quat_gripper")) == 0, \
        capsys.readouterr().err
    assert json.loads((out / "bundle.json").read_text())["fastwam"]["chain"]["state_input"] == "eef_pos_quat_gripper"
    prov = json.loads((out / "import.json").read_text())
    # seed 7 (the default) brings a gripper value within 0.05 of 0: skipped, and said so
    assert prov["end_to_end_observation"].startswith("synthetic (seed 8; seeds 7..7 skipped")
    assert prov["end_to_end_gripper_margin"] >= 0.05
    with np.load(out / "golden/end_to_end.npz") as e:
        assert e["state"].shape == (9,)
        assert abs(np.linalg.norm(e["state"][3:7]) - 1.0) < 1e-6
    run = subprocess.run([rel.vlad_command(None), "parity", "--bundle", str(out)], env=rel.qnn_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.returncode == 0, run.stdout


def test_fastwam_chain_from_hub_repo_ids_fetches_only_what_it_reads(chain_copies, capsys, tmp_path, monkeypatch):
    """The closed-loop import by repo ids over a local stand-in for the download: the .pt, the
    statistics and Wan's text encoder and tokenizer are fetched; the VAE and the encoder's .pth
    form are not."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    release, checkpoint, out = chain_copies
    hub = {"someone/tiny-fastwam-qnn": release, "someone/tiny-fastwam": checkpoint}
    fetched = {}

    def snapshot_download(repo_id, allow_patterns=None, **_):
        src = hub[repo_id]
        files = [str(p.relative_to(src)) for p in src.rglob("*") if p.is_file()]
        keep = list(filter_repo_objects(files, allow_patterns=allow_patterns))
        dst = tmp_path / "hub" / repo_id.replace("/", "--")
        for rel in keep:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / rel, dst / rel)
        fetched[repo_id] = sorted(keep)
        return str(dst)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert main(chain_args("someone/tiny-fastwam-qnn", "someone/tiny-fastwam", out)) == 0, capsys.readouterr().err
    assert fetched["someone/tiny-fastwam"] == sorted([
        "google/umt5-xxl/tokenizer.json", "google/umt5-xxl/tokenizer_config.json", "libero_tiny.pt",
        UPFW_STATS, "models_t5_umt5-xxl-enc-bf16.safetensors"])
    assert "golden/trace.json" in fetched["someone/tiny-fastwam-qnn"]
    assert "onnx/wm_prefill_split1/wm_prefill_split1.onnx" in fetched["someone/tiny-fastwam-qnn"]


def test_fastwam_chain_without_rotate_180_in_the_trace(chain_copies, capsys):
    release, checkpoint, out = chain_copies
    _edit_json(release / "golden" / "trace.json", lambda t: t.pop("rotate_180"))
    refused(capsys, chain_args(release, checkpoint, out), out, "trace.json rotate_180",
            "expected a bool or 2 bools, found None")


# --- parity gates (docs/bundle-format.md "Parity gates") ----------------------------------------

def _gates(out: Path) -> tuple:
    man = json.loads((out / "bundle.json").read_text())
    record = json.loads((out / "import.json").read_text()).get("gates")
    return man["parity"], record


def test_gate_flags_are_written_with_their_reason(copies, capsys):
    release, checkpoint, out = copies
    argv = args(release, checkpoint, out, "--gate", "vision.image_embeds=0.998", "--gate", "llm_split1=0.9995",
                "--gate-reason", "measured on board 7", "--gate-reason", "fp16 KV")
    assert main(argv) == 0, capsys.readouterr().err
    parity, record = _gates(out)
    assert parity["context_cosine"] == 0.9999 and parity["end_to_end_cosine"] == 0.999
    assert parity["contexts"] == {"vision": {"image_embeds": {"cosine": 0.998, "reason": "measured on board 7"}},
                                  "llm_split1": {"*": {"cosine": 0.9995, "reason": "fp16 KV"}}}
    assert "allow_low_gate" not in parity
    assert {(e["context"], e["output"], e["from"]) for e in record["entries"]} == {
        ("vision", "image_embeds", "--gate"), ("llm_split1", "*", "--gate")}


@pytest.mark.parametrize("gate, needles", [
    ("visio.image_embeds=0.998", ["--gate visio.image_embeds=0.998", "context 'visio' is not in the release"]),
    ("vision.image_embed=0.998", ["output 'image_embed' is not an output of vision (its outputs: image_embeds)"]),
    ("vision.image_embeds=high", ["--gate vision.image_embeds=high", "'high' is not a number"]),
    ("vision.image_embeds=1.01", ["1.01 is not in (0.99, 1]"]),
    ("vision.image_embeds=0.97", ["0.97 is not in (0.99, 1] (a lower gate needs --allow-low-gate)"]),
    ("vision:0.998", ["expected CONTEXT[.OUTPUT]=COSINE"]),
])
def test_bad_gates_are_refused_in_one_line(copies, capsys, gate, needles):
    release, checkpoint, out = copies
    refused(capsys, args(release, checkpoint, out, "--gate", gate, "--gate-reason", "r"), out, *needles)


def test_a_gate_needs_its_reason(copies, capsys):
    release, checkpoint, out = copies
    refused(capsys, args(release, checkpoint, out, "--gate", "vision=0.998"), out,
            "--gate-reason: expected one reason, or one per --gate (1), found 0")


def test_a_low_gate_is_taken_with_allow_low_gate_and_recorded(copies, capsys):
    release, checkpoint, out = copies
    argv = args(release, checkpoint, out, "--gate", "vision=0.97", "--gate-reason", "known resampler gap",
                "--allow-low-gate")
    assert main(argv) == 0, capsys.readouterr().err
    parity, record = _gates(out)
    assert parity["allow_low_gate"] is True and parity["contexts"]["vision"]["*"]["cosine"] == 0.97
    assert record["allow_low_gate"] is True
    out = out.parent / "unneeded"
    refused(capsys, args(release, checkpoint, out, "--gate", "vision=0.995", "--gate-reason", "r", "--allow-low-gate"),
            out, "--allow-low-gate: no gate is at or below 0.99, so none needs it")


def test_the_lp_vtp_sd_card_gives_its_vision_gate_by_the_cards_base_model(copies, capsys):
    release, checkpoint, out = copies
    (release / "README.md").write_text("---\nlicense: apache-2.0\nbase_model: xpuenabler/MolmoAct2-LIBERO-LP-VTP-SD\n"
                                       "---\n# MolmoAct2-LIBERO LP-VTP-SD\n")
    assert main(args(release, checkpoint, out)) == 0, capsys.readouterr().err
    parity, record = _gates(out)
    gate = parity["contexts"]["vision"]["image_embeds"]
    assert gate["cosine"] == 0.9979
    assert "0.99843835" in gate["reason"] and "xpuenabler/MolmoAct2-LIBERO-LP-VTP-SD" in gate["reason"]
    assert list(parity["contexts"]) == ["vision"], "the other contexts keep the default"
    assert record["card"].startswith("xpuenabler/MolmoAct2-LIBERO-LP-VTP-SD")
    import subprocess
    from vla_import import release as rel

    run = subprocess.run([rel.vlad_command(None), "parity", "--bundle", str(out)], env=rel.qnn_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.returncode == 0, run.stdout
    line = next(ln for ln in run.stdout.splitlines() if "image_embeds" in ln)
    assert "0.9979" in line and "parity.contexts.vision.image_embeds: card xpuenabler/MolmoAct2-LIBERO-LP-VTP-SD" in line
    # --gate wins over the card.
    argv = args(release, checkpoint, out, "--gate", "vision.image_embeds=0.9985", "--gate-reason", "board")
    assert main(argv) == 0, capsys.readouterr().err
    assert _gates(out)[0]["contexts"]["vision"]["image_embeds"] == {"cosine": 0.9985, "reason": "board"}


def test_a_release_known_to_meet_the_default_is_recorded_without_entries(copies, capsys):
    release, checkpoint, out = copies
    argv = args(release, checkpoint, out, "--release-name", "xpuenabler/molmoact2-drift-keystone-libero-qnn")
    assert main(argv) == 0, capsys.readouterr().err
    parity, record = _gates(out)
    assert "contexts" not in parity
    assert record["entries"] == [] and "0.99999361" in record["card"]


def test_figures_the_release_states_in_trace_json_become_gates(copies, capsys):
    release, checkpoint, out = copies
    _edit_json(release / "golden" / "trace.json",
               lambda t: t.update(parity={"vision": {"image_embeds": 0.9991}, "llm_split0": {"keys": 0.99999}}))
    assert main(args(release, checkpoint, out)) == 0, capsys.readouterr().err
    parity, record = _gates(out)
    assert parity["contexts"] == {"vision": {"image_embeds": {
        "cosine": 0.9986, "reason": "release states cosine 0.9991 in trace.json; gate = figure less 0.0005, "
                                    "rounded down to 1e-4"}}}
    assert record["stated_figures"] == [{"file": str(release / "golden" / "trace.json"), "used": 2,
                                         "note": "`parity` figures read"}]


@pytest.mark.parametrize("stated, why", [
    ({"vision": {"pixel": 0.9991}}, "names what the release lacks (vision.pixel)"),
    ({"vision": {"image_embeds": {"cosine": 0.9991, "max_abs": 0.1}}}, "is not {context: {output: cosine}}"),
    ("passed", "is not {context: {output: cosine}}"),
])
def test_stated_figures_in_another_shape_are_ignored_and_said_so(copies, capsys, stated, why):
    # The releases' own trace.json format is unpublished: a `parity` this importer does not
    # recognise is something else, so it neither gates nor stops the import.
    release, checkpoint, out = copies
    _edit_json(release / "golden" / "trace.json", lambda t: t.update(parity=stated))
    assert main(args(release, checkpoint, out)) == 0, capsys.readouterr().err
    parity, record = _gates(out)
    assert "contexts" not in parity
    [note] = record["stated_figures"]
    assert note["used"] == 0 and why in note["note"] and "its figures not used" in note["note"], note


def test_the_docs_table_has_every_published_releases_figures_and_gates():
    from vla_import import gates

    docs = (REPO / "docs" / "bundle-format.md").read_text()
    for name, release in gates.PUBLISHED.items():
        assert name in docs, name
        for (context, output), (figure, _) in release["figures"].items():
            assert f"| `{context}.{output}` | {figure} | {gates.card_gate(figure)} |" in docs, (name, context)
