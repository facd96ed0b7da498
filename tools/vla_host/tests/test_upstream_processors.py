"""build_prompt_tables.py against upstream's processor as a checkpoint configures it
(golden/upstream/processors/, made by tools/goldens/vla_goldens/upstream_processor_configs.py): saved
processor_config.json files loaded back by lerobot's own loader, and instructions holding
special-token text. Exact: token ids, image block, state rows, encoder masks."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from vla_host import build_prompt_tables as bpt

UP = Path(__file__).resolve().parents[3] / "golden" / "upstream"
PROC = UP / "processors"
MANIFEST = json.loads((PROC / "manifest.json").read_text())
STATE_BASE = 441  # golden/upstream/manifest.json state_token_base
# What vlad cannot compute, with the key its refusal names.
REFUSED = {"crop_mode_absent": "crop_mode", "crop_overlap_c2": "crop_mode", "crop_unknown": "crop_mode",
           "resample_bicubic": "resample"}


@pytest.fixture(scope="module")
def tok():
    # As the builder's --processor-config path and the importer load it (upstream's loader).
    config = json.loads((UP / "tokenizer" / "tokenizer_config.json").read_text())
    return bpt.load_tokenizer(UP / "tokenizer" / "tokenizer.json", config)


@pytest.fixture(scope="module")
def tokens():
    return bpt.tokenizer_tokens(json.loads((UP / "tokenizer" / "tokenizer_config.json").read_text()))


@pytest.fixture(scope="module")
def wte(tok):
    return np.random.default_rng(0).standard_normal((tok.get_vocab_size(), 4)).astype(np.float32)


def build(tok, wte, tokens, text, proc, seq_len, mode="both"):
    return bpt.build_tables(tok, wte, [text], 2, proc["grid"], len(MANIFEST["state_bins"]), seq_len, 0, mode,
                            col_tokens=proc["col_tokens"], setup=MANIFEST["setup_type"],
                            control=MANIFEST["control_mode"], **tokens)


def settings(name):
    return bpt.processor_settings(json.loads((PROC / f"{name}.json").read_text()), f"{name}.json")


def test_the_goldens_cover_what_the_issue_lists():
    configs = MANIFEST["configs"]
    rendered = [n for n, c in configs.items() if "input_ids" in c]
    cols = {settings(n)["col_tokens"] for n in rendered if n not in REFUSED}
    pools = {tuple(c["loaded"]["pooling_size"]) for c in configs.values()}
    assert cols == {True, False} and len(pools) >= 4 and len(rendered) >= 10
    assert {c["loaded"]["crop_mode"] for c in configs.values()} >= {"resize", "overlap-and-resize-c2"}


def test_tokenizer_config_gives_upstreams_bos_eos_pad(tok, tokens):
    loaded = MANIFEST["configs"]["col_default"]["loaded"]
    assert tokens["bos_token"] is None and loaded["bos_token_id"] is None
    assert tok.token_to_id(tokens["eos_token"]) == loaded["eos_token_id"]
    assert tok.token_to_id(tokens["pad_token"]) == loaded["pad_token_id"]
    assert bpt.tokenizer_tokens({}) == {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    assert bpt.tokenizer_tokens({"eos_token": {"content": "<|im_end|>", "special": True}})["eos_token"] == "<|im_end|>"


@pytest.mark.parametrize("name", sorted(n for n in MANIFEST["configs"] if n not in REFUSED))
def test_a_saved_processor_renders_as_upstreams_loader_renders_it(tok, wte, tokens, name):
    golden = MANIFEST["configs"][name]
    proc, loaded = settings(name), golden["loaded"]
    # the settings as lerobot's loader resolved them
    assert proc["crop_size"] == loaded["size"]["height"] == loaded["size"]["width"]
    assert (proc["patch_size"], proc["pooling_size"]) == (loaded["patch_size"], loaded["pooling_size"])
    single = loaded["use_single_crop_col_tokens"]
    assert proc["col_tokens"] == bool(loaded["image_use_col_tokens"] if single is None else single)
    assert [list(proc["grid"])] * 2 == [g[:2] for g in golden["image_grids"]]
    for i, text in enumerate(MANIFEST["instructions"]):
        want = np.array(golden["input_ids"][i])
        t = build(tok, wte, tokens, text, proc, len(want))
        states = t["state_positions"][0]
        np.testing.assert_array_equal(want[states], STATE_BASE + np.array(MANIFEST["state_bins"]), err_msg=name)
        keep = np.ones(len(want), bool)
        keep[states] = False
        np.testing.assert_array_equal(t["token_ids"][0][keep], want[keep], err_msg=f"{name} instruction {i}")
        np.testing.assert_array_equal(t["image_block"][0], golden["token_type_ids"][i], err_msg=name)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_vlad_cannot_compute_is_refused_naming_the_key(name):
    with pytest.raises(bpt.PromptError, match=rf"^{name}\.json image_processor\.{REFUSED[name]}: expected"):
        settings(name)


def test_crop_mode_absent_is_upstreams_multi_crop_not_resize():
    golden = MANIFEST["configs"]["crop_mode_absent"]
    assert golden["loaded"]["crop_mode"] == "overlap-and-resize-c2"
    assert all(g[2] > 0 for g in golden["image_grids"])  # a high-res crop grid besides the low-res one
    with pytest.raises(bpt.PromptError, match=r"found 'overlap-and-resize-c2' \(absent: the image processor's default\)"):
        settings("crop_mode_absent")


@pytest.mark.parametrize("text", sorted(MANIFEST["special"]))
def test_special_token_text_in_an_instruction_is_rendered_and_masked_as_upstream(tok, wte, tokens, text):
    golden = MANIFEST["special"][text]
    proc = settings("col_false")
    want = np.array(golden["input_ids"])
    if golden["upstream_error"]:
        assert "image patch embeddings" in golden["upstream_error"]
        with pytest.raises(bpt.PromptError, match=r"<im_patch> rows but the images give .* upstream refuses it"):
            build(tok, wte, tokens, text, proc, len(want))
        return
    for mode in ("both", "continuous"):
        t = build(tok, wte, tokens, text, proc, len(want), mode)
        np.testing.assert_array_equal(t["state_positions"][0], golden["state_positions"])
        keep = np.ones(len(want), bool)
        keep[golden["state_positions"]] = False
        np.testing.assert_array_equal(t["token_ids"][0][keep], want[keep])
        np.testing.assert_array_equal(t["image_block"][0], golden["token_type_ids"])
        np.testing.assert_array_equal(t["encoder_mask"][0], golden[f"encoder_mask_{mode}"], err_msg=mode)


def test_the_special_cases_exercise_each_rule():
    special = MANIFEST["special"]
    both = {t: np.array(c["encoder_mask_both"]) for t, c in special.items()}
    unmasked_tail = lambda t: both[t][-1] == 1  # noqa: E731
    assert not unmasked_tail("pick up the <action_start> bowl")  # no <action_end>: masked to the end
    assert unmasked_tail("pick up the <action_start> bowl <action_end> and stop")
    assert (both["pick up the <action_start> bowl <action_end> and stop"] == 0).sum() > 2 + 3
    assert sum(c["upstream_error"] is not None for c in special.values()) == 1


@pytest.mark.parametrize("name", ["normalizer_lowercase", "pretokenizer_whitespace", "add_prefix_space"])
def test_the_tokenizer_is_loaded_as_qwen2tokenizer_loads_it(tmp_path, wte, name):
    """Qwen2Tokenizer.from_pretrained keeps its own normalizer and pre-tokenizer whatever
    tokenizer.json says, and reads add_prefix_space from tokenizer_config.json."""
    data = json.loads((UP / "tokenizer" / "tokenizer.json").read_text())
    cfg = json.loads((UP / "tokenizer" / "tokenizer_config.json").read_text())
    {"normalizer_lowercase": lambda: data.update(normalizer={"type": "Lowercase"}),
     "pretokenizer_whitespace": lambda: data.update(pre_tokenizer={"type": "Whitespace"}),
     "add_prefix_space": lambda: cfg.update(add_prefix_space=True)}[name]()
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    want = np.array(MANIFEST["tokenizers"][name]["input_ids"])
    text = MANIFEST["tokenizers"]["text"]

    def ids(tok):
        t = bpt.build_tables(tok, wte, [text], 2, (2, 2), 8, len(want), 0, "both", col_tokens=False,
                             setup=MANIFEST["setup_type"], control=MANIFEST["control_mode"],
                             normalize_language=False, **bpt.tokenizer_tokens(cfg))
        keep = np.ones(len(want), bool)
        keep[t["state_positions"][0]] = False
        return t["token_ids"][0][keep], want[keep]

    got, expected = ids(bpt.load_tokenizer(path, cfg))
    np.testing.assert_array_equal(got, expected)
    with pytest.raises((AssertionError, bpt.PromptError)):  # the files as they say tokenize otherwise
        got, expected = ids(Tokenizer.from_file(str(path)))
        np.testing.assert_array_equal(got, expected)


PACKS = {v: json.loads((PROC / f"pack_{v}.json").read_text()) for v in bpt.UPSTREAMS}
PACK_STATE = [0.1, -0.5, 1.0, -1.0, 0.0, 0.25, 0.9, -0.2]  # tools/goldens/vla_goldens/upstream_processor_configs.py


@pytest.mark.parametrize("version", sorted(PACKS))
def test_each_upstream_versions_pack_step_is_followed(tok, wte, tokens, version):
    """The real pack step of each version (batch 1): its rows, padding and positions are the
    tables' when the builder follows that version and takes the padding from it."""
    golden = PACKS[version]
    proc = settings("col_false")
    bins = np.rint((np.clip(PACK_STATE, -1, 1) + 1) / 2 * 255).astype(int)
    pads_seen = set()
    for text, row in zip(golden["instructions"], golden["rows"]):
        want = np.array(row["input_ids"])
        t = bpt.build_tables(tok, wte, [text], 2, proc["grid"], 8, len(want), None, "continuous",
                             col_tokens=proc["col_tokens"], setup=MANIFEST["setup_type"],
                             control=MANIFEST["control_mode"], upstream=version, **tokens)
        states = t["state_positions"][0]
        np.testing.assert_array_equal(want[states], STATE_BASE + bins)
        keep = np.ones(len(want), bool)
        keep[states] = False
        np.testing.assert_array_equal(t["token_ids"][0][keep], want[keep], err_msg=f"{version} {text!r}")
        np.testing.assert_array_equal(t["valid"][0], row["attention_mask"])
        np.testing.assert_array_equal(t["image_block"][0], row["token_type_ids"])
        pads = int((t["valid"][0] == 0).sum())
        pads_seen.add(pads)
        # 0.6.1 emits no positions (the model's arange); main emits clamp(cumsum(mask) - 1, 0)
        positions = row.get("position_ids", np.arange(len(want)))
        np.testing.assert_array_equal(bpt.rope_positions(len(want), pads), positions)
        assert bytes(t["upstream"]).decode() == version
    assert pads_seen == ({0} if version == "lerobot-0.6.1" else {0, 1, 4, 7})


@pytest.mark.parametrize("version", sorted(PACKS))
def test_the_sequence_cap_is_refused_as_each_version_refuses_it(tok, wte, tokens, version):
    proc = settings("col_false")
    for case in PACKS[version]["cap_refusals"]:
        row = PACKS[version]["rows"][PACKS[version]["instructions"].index(case["instruction"])]
        build = lambda: bpt.build_tables(tok, wte, [case["instruction"]], 2, proc["grid"], 8,  # noqa: E731
                                         len(row["input_ids"]), None, "continuous", col_tokens=False,
                                         setup=MANIFEST["setup_type"], control=MANIFEST["control_mode"],
                                         upstream=version, max_sequence_length=case["cap"], **tokens)
        if case["error"] is None:
            build()
        else:
            with pytest.raises(bpt.CapError, match="above max_sequence_length"):
                build()
    assert sorted(c["error"] is None for c in PACKS[version]["cap_refusals"]) == [False] * 5 + [True] * 5


def test_an_instruction_laid_out_otherwise_than_the_version_pads_it_is_refused(tok, wte, tokens):
    """main pads "go" (125 tokens) to 129 rows after 4 pads: a 125-row export is not that layout."""
    golden = PACKS["lerobot-main-c13d79e"]
    with pytest.raises(bpt.PromptError, match=r"lays out as 129 rows after 4 rows of left padding"):
        bpt.build_tables(tok, wte, ["go"], 2, (2, 2), 8, 125, None, "continuous", col_tokens=False,
                         setup=MANIFEST["setup_type"], control=MANIFEST["control_mode"],
                         upstream="lerobot-main-c13d79e", **tokens)
    assert len(golden["rows"][0]["input_ids"]) == 129
    with pytest.raises(bpt.PromptError, match=r"upstream 'lerobot-0.7': expected one of"):
        bpt.build_tables(tok, wte, ["go"], 2, (2, 2), 8, 125, None, "continuous", upstream="lerobot-0.7")


def test_the_versions_the_builder_knows_are_the_ones_vlad_accepts():
    # vlad refuses prompt tables naming a version outside vla_policy::UPSTREAMS: the two
    # lists must be the same, and each has its pack golden.
    rust = (Path(__file__).resolve().parents[3] / "runtime" / "crates" / "vla-policy" / "src" / "prompt.rs").read_text()
    line = next(ln for ln in rust.splitlines() if ln.startswith("pub const UPSTREAMS"))
    assert sorted(re.findall(r'"([^"]+)"', line)) == sorted(bpt.UPSTREAMS)
    for version in bpt.UPSTREAMS:
        assert (PROC / f"pack_{version}.json").exists(), version
