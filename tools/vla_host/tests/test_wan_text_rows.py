"""Fast-WAM's text rows (tools/vla_host/vla_host/build_umt5_rows.py, the Wan path) against upstream's own
`HuggingfaceTokenizer(clean="whitespace")` and `FastWAM.encode_prompt` on the tiny random Wan
text encoder of golden/upstream-fastwam/tiny (text_encoder.{json,npz}, made by
tools/goldens/vla_goldens/export_upstream_fastwam.py): instructions with HTML entities, odd whitespace, unicode
and more than 128 tokens; and the fastwam-upstream bundle's rows."""

import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
from vla_host import build_umt5_rows as rows
from vla_host.det_npz import load_npz

TINY = REPO / "golden" / "upstream-fastwam" / "tiny"
CKPT = TINY / "checkpoint"
ENCODER = CKPT / "models_t5_umt5-xxl-enc-bf16.safetensors"
TOKENIZER = CKPT / "google" / "umt5-xxl"
META = json.loads((TINY / "text_encoder.json").read_text())
GOLDEN = load_npz(TINY / "text_encoder.npz")
CASES = list(enumerate(META["cases"]))


def test_goldens_cover_the_cases_the_issue_names():
    tasks = [c["task"] for _, c in CASES]
    assert any("&amp;" in t for t in tasks) and any("&amp;lt;" in t for t in tasks)  # entities, twice
    assert any("\t" in t and "\u00a0" in t and "\u2003" in t for t in tasks)  # odd whitespace
    assert any(any(ord(ch) > 0x2000 for ch in t) for t in tasks)  # unicode
    long = [i for i, c in CASES if c["length"] == META["seq_len"]]
    assert long, "no instruction reaches the 128-token cut"
    for i in long:
        assert GOLDEN[f"ids{i}"][-1] == 1, "upstream keeps </s> at the cut"
    # Upstream's pinned environment has no ftfy: fix_text is skipped (the mojibake case stays).
    assert META["ftfy_fix_text"] is False and META["whitespace_re"] == "regex"


@pytest.mark.parametrize("i,case", CASES, ids=[f"case{i}" for i, _ in CASES])
def test_cleaning_and_tokens_are_upstreams(i, case):
    assert rows.clean_prompt(case["prompt"]) == case["cleaned"]
    ids, mask = rows.wan_tokenizer(TOKENIZER, META["seq_len"])(case["prompt"])
    np.testing.assert_array_equal(ids, GOLDEN[f"ids{i}"])
    np.testing.assert_array_equal(mask, GOLDEN[f"mask{i}"])
    assert int(mask.sum()) == case["length"]


def test_rows_are_upstreams_encode_prompt():
    tasks = [c["task"] for _, c in CASES]
    got, lengths = rows.wan_text_rows(tasks, ENCODER, TOKENIZER, META["seq_len"])
    for i, case in CASES:
        assert lengths[i] == case["length"]
        want = GOLDEN[f"rows{i}"]
        assert np.all(got[i][case["length"]:] == 0)
        assert np.abs(got[i] - want).max() <= 1e-5, (i, np.abs(got[i] - want).max())  # measured 1.6e-6


def test_bundle_rows_come_out_of_the_wan_path():
    bundle = REPO / "golden" / "bundles" / "fastwam-upstream"
    chain = json.loads((bundle / "bundle.json").read_text())["fastwam"]["chain"]
    tables = load_npz(bundle / chain["tables"])
    got, lengths = rows.wan_text_rows(chain["instructions"], ENCODER, TOKENIZER, chain["text_tokens"])
    np.testing.assert_array_equal(lengths, tables["text_lengths"])
    assert np.abs(got - tables["text_rows"].astype(np.float32)).max() <= 1e-5


def test_whitespace_class_is_unicode_white_space():
    assert rows.clean_prompt(" a\u3000\u2028b\x1cc ") == "a b\x1cc"  # U+001C is not White_Space
    assert rows.clean_prompt("&amp;amp;") == "&"
