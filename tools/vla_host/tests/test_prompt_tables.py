"""Prompt tables on the fixture vocabulary (golden/tokenizer)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from vla_host import build_prompt_tables as bpt
from vla_host.det_npz import load_npz

REPO = Path(__file__).resolve().parents[3]
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


# The fixture bundles' rendering: 2 cameras of 2x2 pooled tokens, 8 state dims, S = 99
# after 3 rows of left padding (the fixture contexts' baked RoPE positions).
GRID, S, PAD = (2, 2), 99, 3


def build(tok, wte, instructions, seq_len=S, pad=PAD, mode="both", grid=GRID):
    return bpt.build_tables(tok, wte, instructions, 2, grid, 8, seq_len, pad, mode)


def test_task_normalization():
    assert bpt.normalize_task("  Put the BOWL\t on \n the plate!.. ") == "put the bowl on the plate"
    assert bpt.normalize_task("open the drawer") == "open the drawer"
    assert bpt.normalize_task('Task: "Stack it. Then stop?!"') == "stack it; then stop"


def test_normalized_variants_give_identical_rows(tok, wte):
    a = build(tok, wte, ['Task: "Put the black bowl on the plate."'])
    b = build(tok, wte, ["put   the BLACK bowl on the plate"])
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_image_rows_and_block(tok, wte, instructions):
    tables = build(tok, wte, instructions)
    patch, start, end, col = (tok.token_to_id(t) for t in ("<im_patch>", "<im_start>", "<im_end>", "<im_col>"))
    for n in range(len(instructions)):
        ids = tables["token_ids"][n]
        pos = tables["image_positions"][n]
        assert len(pos) == 8 and np.all(ids[pos] == patch)
        assert np.count_nonzero(ids == patch) == 8
        # camera-major; each camera <im_start> (patch patch <im_col>) x 2 <im_end>, after "Image k"
        for cam in range(2):
            first = pos[cam * 4]
            assert ids[first - 1] == start and ids[first - 3] == tok.token_to_id("Image")
            assert ids[first - 2] == tok.token_to_id(str(cam + 1))
            assert list(ids[first:first + 7]) == [patch, patch, col, patch, patch, col, end]
        block = tables["image_block"][n].astype(bool)
        assert np.array_equal(block, np.isin(ids, [patch, start, end, col]))


def test_state_positions(tok, wte, instructions):
    tables = build(tok, wte, instructions)
    for n in range(len(instructions)):
        ids = tables["token_ids"][n]
        pos = tables["state_positions"][n]
        np.testing.assert_array_equal(pos, np.arange(pos[0], pos[0] + 8))
        assert ids[pos[0] - 1] == tok.token_to_id("<state_start>")
        assert ids[pos[-1] + 1] == tok.token_to_id("<state_end>")
        assert np.all(ids[pos] == tok.token_to_id("<state_0>"))


def test_left_padding_bos_and_encoder_mask(tok, wte, instructions):
    tables = build(tok, wte, instructions)
    pad, eos = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    for n in range(len(instructions)):
        valid, ids = tables["valid"][n], tables["token_ids"][n]
        assert np.all(valid[:PAD] == 0) and np.all(valid[PAD:] == 1)
        assert np.all(ids[:PAD] == pad)
        assert ids[PAD] == eos, "BOS is the EOS token"
        assert ids[-1] == tok.token_to_id("<action_output>")
        both = tables["encoder_mask"][n]
        assert both[PAD] == 0 and np.count_nonzero(valid.astype(bool) & (both == 0)) == 2, \
            "action_mode both masks BOS and the <|im_end|> closing the user turn"
    cont = build(tok, wte, instructions, mode="continuous")
    np.testing.assert_array_equal(cont["encoder_mask"], cont["valid"])


def test_other_lengths_are_refused_with_the_reason(tok, wte, instructions):
    with pytest.raises(bpt.PromptError, match=r"instruction 0 .* renders to 96 tokens, but the contexts bake RoPE "
                                              r"positions for 97 tokens after 2 rows of left padding"):
        build(tok, wte, instructions, pad=2)
    with pytest.raises(bpt.PromptError, match="renders to 95 tokens"):
        build(tok, wte, ["put the bowl on the plate"])


def test_rope_positions_follow_the_export_padding():
    np.testing.assert_array_equal(bpt.rope_positions(6, 2), [0, 0, 0, 1, 2, 3])
    np.testing.assert_array_equal(bpt.rope_positions(4, 0), [0, 1, 2, 3])


def test_f16_rows_equal_wte_rows(tok, wte, instructions):
    tables = build(tok, wte, instructions)
    assert tables["scaffold"].dtype == np.float16 and tables["state_token_rows"].dtype == np.float16
    for n in range(len(instructions)):
        np.testing.assert_array_equal(tables["scaffold"][n], wte[tables["token_ids"][n]].astype(np.float16))
    for k in range(256):
        np.testing.assert_array_equal(tables["state_token_rows"][k], wte[tok.token_to_id(f"<state_{k}>")].astype(np.float16))


def test_missing_special_token_is_named(wte):
    from tokenizers import Tokenizer as T, models

    bare = T(models.WordLevel({"<unk>": 0, "hello": 1}, unk_token="<unk>"))
    with pytest.raises(bpt.PromptError, match=r"<im_patch>"):
        build(bare, wte, ["hello"])


@pytest.mark.parametrize("bundle, grid", [("molmoact2-original", "2x2"), ("molmoact2-lp-vtp-sd", "1x2")])
def test_cli_reproduces_bundle_tables(tmp_path, bundle, grid):
    manifest = json.loads((REPO / "golden" / "bundles" / bundle / "bundle.json").read_text())["molmoact2"]
    out = tmp_path / "prompt_tables.npz"
    subprocess.run([sys.executable, "-m", "vla_host.build_prompt_tables",
                    "--tokenizer", str(TOK_DIR / "tokenizer.json"), "--wte", str(TOK_DIR / "wte.npy"),
                    "--instructions", str(TOK_DIR / "instructions.json"), "--grid", grid,
                    "--state-dims", "8", "--seq-len", str(manifest["seq_len"]),
                    "--rope-left-pad", str(manifest["rope_left_pad"]), "--action-mode", "both",
                    "--out", str(out)], check=True, capture_output=True)
    golden = REPO / "golden" / "bundles" / bundle / "prompt" / "prompt_tables.npz"
    assert out.read_bytes() == golden.read_bytes()
    assert load_npz(out)["scaffold"].shape[0] == 3


def test_template_is_the_pack_steps_for_every_checkpoint_setting():
    """golden/upstream/prompt_text.json: lerobot's pack step (`_normalize_question_text`,
    `_build_discrete_state_string`, `_build_robot_text`) for add_setup_tokens, add_control_tokens,
    normalize_language true and false, plain / already-wrapped / empty setup and control, 8 and 0
    state dims, 1 and 2 images."""
    import json
    from pathlib import Path

    from vla_host import build_prompt_tables as bpt

    cases = json.loads((Path(__file__).resolve().parents[3] / "golden" / "upstream" / "prompt_text.json")
                       .read_text())["cases"]
    assert len(cases) == 288
    for c in cases:
        got = bpt.render_text(c["task"], c["images"], c["state_dims"], c["setup"], c["control"],
                              add_setup_tokens=c["add_setup_tokens"], add_control_tokens=c["add_control_tokens"],
                              normalize_language=c["normalize_language"])
        assert got == c["text"], c
