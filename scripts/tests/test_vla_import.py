"""The release importer (tools/vla_import) on the tiny upstream MolmoAct2 release and checkpoint
(golden/upstream-molmoact2, issue 23) and on broken copies of them: every refusal is one line
naming file and key, and leaves nothing behind."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
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
