"""build_prompt_tables.py against the upstream processor's own output (golden/upstream/,
made by tools/goldens/vla_goldens/upstream_molmoact2.py running LeRobot's MolmoAct2 code): token ids, the
image block (token_type_ids), patch positions, padding and the encoder mask, exact."""

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from vla_host import build_prompt_tables as bpt

UP = Path(__file__).resolve().parents[3] / "golden" / "upstream"
MANIFEST = json.loads((UP / "manifest.json").read_text())
STATE_DIMS = 8
# config name -> (golden file, array prefix, pooled grid per camera, <im_col> tokens)
CONFIGS = {
    "fixture_crop56_nocol": ("prompts_fixture.npz", "", (2, 2), False),
    "fixture_crop56_col": ("prompts_fixture.npz", "col_", (2, 2), True),
    "real_crop378_nocol": ("prompts_real.npz", "", (14, 14), False),
    "real_crop378_col": ("prompts_real.npz", "col_", (14, 14), True),
}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(str(UP / "tokenizer" / "tokenizer.json"))


@pytest.fixture(scope="module")
def wte(tok):
    return np.random.default_rng(0).standard_normal((tok.get_vocab_size(), 4)).astype(np.float32)


def build(tok, wte, text, grid, col, seq_len, pad, mode="both"):
    return bpt.build_tables(tok, wte, [text], 2, grid, STATE_DIMS, seq_len, pad, mode, col_tokens=col,
                            setup=MANIFEST["setup_type"], control=MANIFEST["control_mode"])


def test_task_normalization_matches_upstream():
    for config in MANIFEST["prompts"].values():
        assert [bpt.normalize_task(t) for t in MANIFEST["instructions"]] == config["tasks"]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_each_instruction_renders_as_upstream_does(tok, wte, config):
    """Batch of one (how a robot runs it): no padding, BOS first."""
    name, prefix, grid, col = CONFIGS[config]
    up = np.load(UP / name)
    lengths = up[f"{prefix}lengths"]
    state_base = MANIFEST["state_token_base"]
    for i, text in enumerate(MANIFEST["instructions"]):
        n = int(lengths[i])
        tables = build(tok, wte, text, grid, col, n, 0)
        ids = tables["token_ids"][0]
        want = up[f"{prefix}input_ids"][i, :n]
        # The scaffold holds <state_0> placeholders where upstream rendered the state.
        states = tables["state_positions"][0]
        assert np.all((want[states] >= state_base) & (want[states] < state_base + 256)), (config, i)
        keep = np.ones(n, bool)
        keep[states] = False
        np.testing.assert_array_equal(ids[keep], want[keep], err_msg=f"{config} instruction {i}")
        np.testing.assert_array_equal(tables["image_block"][0], up[f"{prefix}token_type_ids"][i, :n],
                                      err_msg=f"{config} instruction {i}: image block")
        np.testing.assert_array_equal(tables["image_positions"][0], up[f"{prefix}im_patch_positions"][i],
                                      err_msg=f"{config} instruction {i}: patch rows")
        assert ids[0] == MANIFEST["bos_token_id_used"]


def test_left_padding_and_encoder_masks_match_a_padded_upstream_batch(tok, wte):
    up = np.load(UP / "prompts_fixture.npz")
    s = up["batch_input_ids"].shape[1]
    for i, text in enumerate(MANIFEST["instructions"]):
        pad = s - int(up["lengths"][i])
        for mode in ("continuous", "both"):
            t = build(tok, wte, text, (2, 2), False, s, pad, mode)
            np.testing.assert_array_equal(t["valid"][0], up["batch_attention_mask"][i])
            np.testing.assert_array_equal(t["encoder_mask"][0], up[f"batch_encoder_mask_{mode}"][i],
                                          err_msg=f"instruction {i}, action_mode {mode}")
            np.testing.assert_array_equal(t["image_block"][0], up["batch_token_type_ids"][i])
        keep = np.ones(s, bool)
        keep[t["state_positions"][0]] = False
        np.testing.assert_array_equal(t["token_ids"][0][keep], up["batch_input_ids"][i][keep])


def test_an_instruction_of_another_length_is_refused(tok, wte):
    text = MANIFEST["instructions"][0]
    n = int(np.load(UP / "prompts_fixture.npz")["lengths"][0])
    with pytest.raises(bpt.PromptError, match=r"renders to \d+ tokens, but the contexts bake RoPE positions"):
        build(tok, wte, text, (2, 2), False, n + 4, 0)
    build(tok, wte, text, (2, 2), False, n + 4, 4)  # the same length after 4 rows of padding is fine
