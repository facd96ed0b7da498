"""Prompt tables on the fixture vocabulary (golden/tokenizer)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

import build_prompt_tables as bpt
from det_npz import load_npz

REPO = Path(__file__).resolve().parents[2]
TOK_DIR = REPO / "golden" / "tokenizer"


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(str(TOK_DIR / "tokenizer.json"))


@pytest.fixture(scope="module")
def wte():
    return np.load(TOK_DIR / "wte.npy")


@pytest.fixture(scope="module")
def instructions():
    return json.loads((TOK_DIR / "instructions.json").read_text())["instructions"]


def ids_of(tables, wte, n):
    """Recovers token ids from scaffold rows (wte rows are distinct in f16)."""
    rows = wte.astype(np.float16)
    return np.array([int(np.flatnonzero((rows == r).all(axis=1))[0]) for r in tables["scaffold"][n]])


def test_task_normalization():
    assert bpt.normalize_task("  Put the BOWL\t on \n the plate!.. ") == "put the bowl on the plate"
    assert bpt.normalize_task("open the drawer") == "open the drawer"
    assert bpt.normalize_task("stack it; then stop?!") == "stack it; then stop"


def test_normalized_variants_give_identical_rows(tok, wte):
    a = bpt.build_tables(tok, wte, ["Put the bowl on the plate."], 2, 4, 8, seq_len=88)
    b = bpt.build_tables(tok, wte, ["put   the BOWL on the plate"], 2, 4, 8, seq_len=88)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_image_positions(tok, wte, instructions):
    tables = bpt.build_tables(tok, wte, instructions, 2, 4, 8)
    image_id = tok.token_to_id("<|image|>")
    for n in range(len(instructions)):
        ids = ids_of(tables, wte, n)
        pos = tables["image_positions"][n]
        assert len(pos) == 8
        assert np.all(ids[pos] == image_id)
        assert np.count_nonzero(ids == image_id) == 8
        # camera-major order, each camera's block contiguous, each after "Image k"
        for cam in range(2):
            block = pos[cam * 4:(cam + 1) * 4]
            np.testing.assert_array_equal(block, np.arange(block[0], block[0] + 4))
            assert ids[block[0] - 2] == tok.token_to_id("Image")
            assert ids[block[0] - 1] == tok.token_to_id(str(cam + 1))


def test_state_positions(tok, wte, instructions):
    tables = bpt.build_tables(tok, wte, instructions, 2, 4, 8)
    for n in range(len(instructions)):
        ids = ids_of(tables, wte, n)
        pos = tables["state_positions"][n]
        np.testing.assert_array_equal(pos, np.arange(pos[0], pos[0] + 8))
        assert ids[pos[0] - 1] == tok.token_to_id("<state_start>")
        assert ids[pos[-1] + 1] == tok.token_to_id("<state_end>")
        assert np.all(ids[pos] == tok.token_to_id("<state_0>"))


def test_left_padding_and_bos(tok, wte, instructions):
    tables = bpt.build_tables(tok, wte, instructions, 2, 4, 8)
    s = tables["scaffold"].shape[1]
    assert s % 8 == 0
    pad, bos = tok.token_to_id("<pad>"), tok.token_to_id("<bos>")
    for n in range(len(instructions)):
        valid = tables["valid"][n]
        first = int(np.argmax(valid))
        assert np.all(valid[:first] == 0) and np.all(valid[first:] == 1)
        ids = ids_of(tables, wte, n)
        assert np.all(ids[:first] == pad)
        assert ids[first] == bos
        assert ids[-1] == tok.token_to_id("<action_output>")
    assert tables["valid"].sum(axis=1).max() > s - 8


def test_fixed_seq_len_adds_left_padding(tok, wte, instructions):
    auto = bpt.build_tables(tok, wte, instructions, 2, 4, 8)
    s = auto["scaffold"].shape[1]
    wide = bpt.build_tables(tok, wte, instructions, 2, 4, 8, seq_len=s + 16)
    np.testing.assert_array_equal(wide["scaffold"][:, 16:], auto["scaffold"])
    np.testing.assert_array_equal(wide["image_positions"], auto["image_positions"] + 16)
    np.testing.assert_array_equal(wide["state_positions"], auto["state_positions"] + 16)
    with pytest.raises(bpt.PromptError, match="exceed seq_len"):
        bpt.build_tables(tok, wte, instructions, 2, 4, 8, seq_len=s - 8)


def test_f16_rows_equal_wte_rows(tok, wte, instructions):
    tables = bpt.build_tables(tok, wte, instructions, 2, 4, 8)
    assert tables["scaffold"].dtype == np.float16 and tables["state_token_rows"].dtype == np.float16
    for n, text in enumerate(instructions):
        prompt = bpt.render_prompt(text, 2, 4, 8)
        ids = [tok.token_to_id("<bos>")] + tok.encode(prompt, add_special_tokens=False).ids
        s = tables["scaffold"].shape[1]
        padded = [tok.token_to_id("<pad>")] * (s - len(ids)) + ids
        np.testing.assert_array_equal(tables["scaffold"][n], wte[padded].astype(np.float16))
    for k in range(256):
        np.testing.assert_array_equal(tables["state_token_rows"][k], wte[tok.token_to_id(f"<state_{k}>")].astype(np.float16))


def test_missing_special_token_is_named(wte):
    from tokenizers import Tokenizer as T, models

    bare = T(models.WordLevel({"<unk>": 0, "hello": 1}, unk_token="<unk>"))
    with pytest.raises(bpt.PromptError, match=r"<\|image\|>"):
        bpt.build_tables(bare, wte, ["hello"], 2, 4, 8)


@pytest.mark.parametrize("bundle, per_camera", [("molmoact2-original", 4), ("molmoact2-lp-vtp-sd", 2)])
def test_cli_reproduces_bundle_tables(tmp_path, bundle, per_camera):
    out = tmp_path / "prompt_tables.npz"
    subprocess.run([sys.executable, str(REPO / "scripts" / "build_prompt_tables.py"),
                    "--tokenizer", str(TOK_DIR / "tokenizer.json"), "--wte", str(TOK_DIR / "wte.npy"),
                    "--instructions", str(TOK_DIR / "instructions.json"),
                    "--tokens-per-camera", str(per_camera), "--state-dims", "8", "--out", str(out)],
                   check=True, capture_output=True)
    golden = REPO / "golden" / "bundles" / bundle / "prompt" / "prompt_tables.npz"
    assert out.read_bytes() == golden.read_bytes()
    assert load_npz(out)["scaffold"].shape[0] == 3
