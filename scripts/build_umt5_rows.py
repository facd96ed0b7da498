#!/usr/bin/env python3
"""Builds Fast-WAM's per-instruction text rows (the UMT5 encoder output) for a bundle.

Fast-WAM's context is `[1, text_tokens + 1, E]`: the UMT5-XXL encoding of
`DEFAULT_PROMPT.format(task=...)` padded to `text_tokens` (rows past the real text zeroed,
the mask all ones, as upstream `encode_prompt` does), then the proprio row the device adds.
The text part is constant per instruction, so it is computed here offline, like
MolmoAct2's prompt scaffolds, and the device only indexes a table.

    .venv/bin/python scripts/build_umt5_rows.py --model <dir with UMT5 + tokenizer> \
        --tasks tasks.json --text-tokens 128 --out inputs/context_tables.npz

(the real path needs `transformers` and the checkpoint; it is not run in CI). The
fixture bundles use `fixture_encoder` + `byte_tokenize` through `build_text_rows`, the
same function, tested in scripts/tests/test_fastwam_host.py.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from det_npz import save_npz  # noqa: E402

DEFAULT_PROMPT = "A video recorded from a robot's point of view executing the following instruction: {task}"


def render_prompt(task: str) -> str:
    return DEFAULT_PROMPT.format(task=task)


def build_text_rows(tasks, tokenize, encode, text_tokens: int):
    """tasks -> (text_rows [n, text_tokens, E] f16, lengths [n] i32). `tokenize(text)`
    gives ids; they are cut/padded to `text_tokens`; `encode(ids, mask)` gives
    [text_tokens, E]; rows at and past the real length are zeroed."""
    rows, lengths = [], []
    for task in tasks:
        ids = list(tokenize(render_prompt(task)))[:text_tokens]
        n = len(ids)
        mask = np.zeros(text_tokens, np.int64)
        mask[:n] = 1
        padded = np.zeros(text_tokens, np.int64)
        padded[:n] = ids
        enc = np.asarray(encode(padded, mask), np.float32).copy()
        enc[n:] = 0.0
        rows.append(enc)
        lengths.append(n)
    return np.stack(rows).astype(np.float16), np.array(lengths, np.int32)


def byte_tokenize(text: str):
    """Fixture tokenizer: UTF-8 bytes + 1 (0 is the pad id), then an EOS id 257."""
    return [b + 1 for b in text.encode()] + [257]


def fixture_encoder(width: int, seed: int):
    """Fixture stand-in for UMT5: a seeded embedding table and one tanh mixing layer
    (each row depends on its neighbours), deterministic."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((258, width)).astype(np.float32)
    mix = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)

    def encode(ids, mask):
        x = table[ids] * mask[:, None]
        ctx = np.cumsum(x, axis=0) / np.arange(1, len(ids) + 1)[:, None]
        return np.tanh((x + ctx) @ mix).astype(np.float32)

    return encode


def umt5_encoder(model_dir: str):  # pragma: no cover - needs transformers and the weights
    import torch
    from transformers import AutoTokenizer, UMT5EncoderModel

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = UMT5EncoderModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()

    def tokenize(text):
        return tok(text, add_special_tokens=True)["input_ids"]

    def encode(ids, mask):
        with torch.no_grad():
            out = model(input_ids=torch.tensor(ids)[None], attention_mask=torch.tensor(mask)[None])
        return out.last_hidden_state[0].float().numpy()

    return tokenize, encode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="directory with the UMT5 encoder and its tokenizer")
    ap.add_argument("--tasks", type=Path, required=True, help='JSON {"instructions": [...]}')
    ap.add_argument("--text-tokens", type=int, default=128)
    ap.add_argument("--proprio", type=Path, help="npz with proprio_weight [E, S], proprio_bias [E]")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    tasks = json.loads(args.tasks.read_text())["instructions"]
    tokenize, encode = umt5_encoder(args.model)
    rows, lengths = build_text_rows(tasks, tokenize, encode, args.text_tokens)
    tables = {"text_rows": rows, "text_lengths": lengths}
    if args.proprio:
        p = np.load(args.proprio)
        tables.update(proprio_weight=p["proprio_weight"].astype(np.float32),
                      proprio_bias=p["proprio_bias"].astype(np.float32))
    save_npz(args.out, tables)


if __name__ == "__main__":
    main()
