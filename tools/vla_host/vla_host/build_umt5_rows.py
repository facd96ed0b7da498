#!/usr/bin/env python3
"""Builds Fast-WAM's per-instruction text rows (Wan's text encoder output) for a bundle.

Fast-WAM's context is `[1, text_tokens + 1, E]`: Wan's UMT5 encoding (`WanTextEncoder` on
`models_t5_umt5-xxl-enc-bf16`) of `DEFAULT_PROMPT.format(task=...)` padded to `text_tokens`
(rows past the real text zeroed, the mask all ones, as upstream `encode_prompt` does), then the
proprio row the device adds. The text part is constant per instruction, so it is computed here
offline, like MolmoAct2's prompt scaffolds, and the device only indexes a table.

    .venv/bin/python -m vla_host.build_umt5_rows \
        --encoder models_t5_umt5-xxl-enc-bf16.safetensors --tokenizer google/umt5-xxl \
        --tasks tasks.json --text-tokens 128 --out inputs/context_tables.npz

The Wan path (numpy, no torch) follows upstream: the tokenizer call of `HuggingfaceTokenizer`
with `clean="whitespace"` (HTML entities unescaped twice, whitespace runs collapsed), the cut at
`text_tokens` keeping `</s>`, the encoder in f32 on the bf16 weights (the safetensors form
upstream's loader downloads by default; Wan's state-dict names). Checked against upstream's
own tokenizer and `encode_prompt` on the tiny random encoder of golden/upstream-fastwam/tiny
(tools/vla_host/tests/test_wan_text_rows.py). The fixture bundles use `fixture_encoder` +
`byte_tokenize` through `build_text_rows`, tested in tools/vla_host/tests/test_fastwam_host.py.
"""

import argparse
import html
import json
import math
import re
from pathlib import Path

import numpy as np

from vla_host import safetensors_f32
from vla_host.det_npz import save_npz

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


# ---------------------------------------------------------------------------------------
# Wan's text encoder (upstream Fast-WAM: `WanTextEncoder` + `HuggingfaceTokenizer`)
# ---------------------------------------------------------------------------------------

# Unicode White_Space: what `\s` matches in the `regex` module upstream's tokenizer uses
# (Python's `re` would also match U+001C..U+001F).
WHITESPACE = re.compile("[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")


def clean_prompt(text: str) -> str:
    """Upstream's `clean="whitespace"`: `basic_clean` (HTML entities unescaped twice, stripped)
    then `whitespace_clean` (every whitespace run one space, stripped). Upstream's
    `basic_clean` also calls `ftfy.fix_text` when ftfy is installed; its pinned environment
    does not install it, so upstream runs without, and so does this."""
    text = html.unescape(html.unescape(text)).strip()
    return WHITESPACE.sub(" ", text).strip()


def wan_tokenizer(tokenizer_dir: Path, seq_len: int):
    """Upstream's `HuggingfaceTokenizer(seq_len, clean="whitespace")` call on the Wan tokenizer
    directory (`google/umt5-xxl/`): cleaned, `</s>` appended, cut to `seq_len` keeping the
    `</s>` (the cut makes room for it, as Hugging Face's truncation does), padded with the pad
    id. Returns text -> (ids [seq_len], mask [seq_len])."""
    from tokenizers import Tokenizer

    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    pad = config.get("pad_token", "<pad>")
    pad = pad["content"] if isinstance(pad, dict) else pad
    pad_id = tok.token_to_id(pad)
    if pad_id is None:
        raise ValueError(f"{tokenizer_dir}: pad token {pad!r} not in the vocabulary")
    tok.enable_truncation(max_length=seq_len)
    tok.enable_padding(length=seq_len, pad_id=pad_id, pad_token=pad)

    def tokenize(text: str):
        enc = tok.encode(clean_prompt(text), add_special_tokens=True)
        return np.array(enc.ids, np.int64), np.array(enc.attention_mask, np.int64)

    return tokenize


def read_safetensors(path: Path) -> dict:
    """Every tensor of a safetensors file as f32 (bf16 widened), by name."""
    return safetensors_f32.read_all(path)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + np.float32(0.044715) * x ** 3)))


def _rms(x, w, eps=np.float32(1e-6)):
    return w * (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps))


def _buckets(length: int, num_buckets: int, max_dist: int = 128) -> np.ndarray:
    """T5RelativeEmbedding._relative_position_bucket, bidirectional, in upstream's f32 steps."""
    rel = np.arange(length)[None, :] - np.arange(length)[:, None]
    half = num_buckets // 2
    out = (rel > 0).astype(np.int64) * half
    rel = np.abs(rel)
    exact = half // 2
    with np.errstate(divide="ignore"):
        large = np.log(rel.astype(np.float32) / np.float32(exact)) / np.float32(math.log(max_dist / exact)) \
            * np.float32(half - exact)
    large = exact + np.where(rel < exact, 0, large).astype(np.int64)
    large = np.minimum(large, half - 1)
    return out + np.where(rel < exact, rel, large)


def wan_text_encoder(weights: dict):
    """Upstream `WanTextEncoder` (UMT5 encoder: per-layer relative position bias, gated tanh-GELU
    FFN, no attention scaling) in f32 numpy on Wan's state-dict names. Returns
    (ids [L], mask [L]) -> [L, dim]."""
    layers = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("blocks."))
    shared = "pos_embedding.embedding.weight" in weights
    table = weights["token_embedding.weight"]

    def encode(ids, mask):
        n = len(ids)
        x = table[np.asarray(ids)].astype(np.float32)
        blocked = np.asarray(mask)[None, None, :] == 0
        for i in range(layers):
            w = lambda name: weights[f"blocks.{i}.{name}"]  # noqa: E731
            pos = weights["pos_embedding.embedding.weight"] if shared else w("pos_embedding.embedding.weight")
            heads = pos.shape[1]
            bias = pos[_buckets(n, pos.shape[0])].transpose(2, 0, 1)[None]  # [1, heads, n, n]
            bias = np.where(blocked, np.finfo(np.float32).min, bias)
            h = _rms(x, w("norm1.weight"))
            q, k, v = (h @ w(f"attn.{p}.weight").T for p in "qkv")
            q, k, v = (t.reshape(n, heads, -1) for t in (q, k, v))
            att = np.einsum("inc,jnc->nij", q, k)[None] + bias
            att = np.exp(att - att.max(axis=-1, keepdims=True))
            att = att / att.sum(axis=-1, keepdims=True)
            o = np.einsum("nij,jnc->inc", att[0], v).reshape(n, -1)
            x = x + o @ w("attn.o.weight").T
            h = _rms(x, w("norm2.weight"))
            ff = (h @ w("ffn.fc1.weight").T) * _gelu_tanh(h @ w("ffn.gate.0.weight").T)
            x = x + ff @ w("ffn.fc2.weight").T
        return _rms(x, weights["norm.weight"]).astype(np.float32)

    return encode


def wan_text_rows(tasks, encoder_file: Path, tokenizer_dir: Path, text_tokens: int):
    """Upstream `FastWAM.encode_prompt` per task: the rendered prompt through Wan's tokenizer
    and text encoder, rows at and past the real length zeroed. -> (rows [n, M, E] f32,
    lengths [n] i32)."""
    tokenize = wan_tokenizer(tokenizer_dir, text_tokens)
    encode = wan_text_encoder(read_safetensors(encoder_file))
    rows, lengths = [], []
    for task in tasks:
        ids, mask = tokenize(render_prompt(task))
        out = encode(ids, mask)
        length = int(mask.sum())
        out[length:] = 0.0
        rows.append(out)
        lengths.append(length)
    return np.stack(rows), np.array(lengths, np.int32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoder", type=Path, required=True,
                    help="Wan's text encoder weights (models_t5_umt5-xxl-enc-bf16.safetensors)")
    ap.add_argument("--tokenizer", type=Path, required=True, help="Wan's tokenizer directory (google/umt5-xxl/)")
    ap.add_argument("--tasks", type=Path, required=True, help='JSON {"instructions": [...]}')
    ap.add_argument("--text-tokens", type=int, default=128, help="fastwam.yaml tokenizer_max_len")
    ap.add_argument("--proprio", type=Path, help="npz with proprio_weight [E, S], proprio_bias [E]")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    tasks = json.loads(args.tasks.read_text())["instructions"]
    rows, lengths = wan_text_rows(tasks, args.encoder, args.tokenizer, args.text_tokens)
    tables = {"text_rows": rows, "text_lengths": lengths}
    if args.proprio:
        p = np.load(args.proprio)
        tables.update(proprio_weight=p["proprio_weight"].astype(np.float32),
                      proprio_bias=p["proprio_bias"].astype(np.float32))
    save_npz(args.out, tables)


if __name__ == "__main__":
    main()
