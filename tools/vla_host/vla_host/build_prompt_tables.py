#!/usr/bin/env python3
"""Builds prompt/prompt_tables.npz for a MolmoAct2 bundle.

The importer renders instructions with `vlad prompt` (vla-text, the renderer the device uses for
run-time text) and passes them in (`build_tables(rendered=...)`); the Python rendering below is
kept as the oracle that Rust renderer is tested against (tools/vla_import/tests/test_vlad_prompt.py), and
for the stand-in fixtures' word-level tokenizers.

Each instruction is rendered exactly as the upstream processor does it (LeRobot's
`processor_molmoact2.py` `_build_robot_text` + the HF `MolmoAct2Processor`; the rules are
re-implemented here and checked against goldens made by running the upstream code,
golden/upstream/): the task text normalized, setup and control text wrapped in their marker
tokens, `Image k<|image|>` per camera with each `<|image|>` expanded to `<im_start>`, rows
of `<im_patch>` (each row closed by `<im_col>` when the processor uses column tokens) and
`<im_end>`, the state as `<state_start>` + one `<state_0>` placeholder per dim +
`<state_end>` (the runtime replaces those rows per tick), tokenized with the checkpoint's
tokenizer.json, BOS (the tokenizer's BOS, else its EOS) inserted before the first token,
and left-padded with PAD.

Positions: the exported LLM contexts bake their RoPE positions in (no position input).
Upstream computes `clamp(cumsum(attention_mask) - 1, 0)`, so the first real token is at
position 0 whatever the padding; an export traced with `P` rows of left padding baked
`max(row - P, 0)`. An instruction is therefore only correct on those contexts when it is
left-padded by exactly `P` rows, i.e. renders to exactly `seq_len - P` tokens. Any other
instruction is refused, with the lengths, rather than run with shifted positions.

The image tokens per camera and the column tokens come from the checkpoint's saved
`processor_config.json`, resolved as lerobot's `_load_local_molmoact2_processor` resolves it
(`processor_settings`: upstream's defaults for absent keys, settings vlad cannot compute
refused); BOS, EOS and PAD from its `tokenizer_config.json` as `Qwen2Tokenizer.from_pretrained`
reads them. Instructions may contain special-token text: it is tokenized as upstream tokenizes
it, only the template's own `<|image|>` placeholders are expanded, the state rows are the
template's state clause (not every `<state_0>`), an `<action_start>` span is masked from the
action expert as upstream masks it, and an instruction whose `<im_patch>` text would leave
upstream with more patch rows than image features is refused, as upstream refuses it.

    .venv/bin/python -m vla_host.build_prompt_tables --tokenizer CKPT/tokenizer.json \
        --processor-config CKPT/processor_config.json --wte wte.npy \
        --instructions instructions.json --state-dims 8 \
        --seq-len 488 --rope-left-pad 0 --action-mode both --out prompt/prompt_tables.npz

(`--grid ROWSxCOLS` instead of `--processor-config` is for the stand-in fixtures, which have no
processor and whose tokenizers are used as their files say.)
"""

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

from vla_host.det_npz import save_npz

# LIBERO's setup and control text (the checkpoint's norm-stats metadata `setup_type`,
# `control_mode`).
SETUP = "single franka robotic arm in libero"
CONTROL = "delta end-effector pose"

IMAGE_PROMPT = "<|image|>"
IM_PATCH, IM_COL, IM_START, IM_END = "<im_patch>", "<im_col>", "<im_start>", "<im_end>"
# Every token the processor marks in `token_type_ids` (the bidirectional image block).
IMAGE_TOKENS = [IM_PATCH, IM_COL, IM_START, "<low_res_im_start>", "<frame_start>", IM_END,
                "<frame_end>", "<im_low>"]
STATE_START, STATE_END = "<state_start>", "<state_end>"
SETUP_START, SETUP_END = "<setup_start>", "<setup_end>"
CONTROL_START, CONTROL_END = "<control_start>", "<control_end>"
ACTION_OUTPUT = "<action_output>"
ACTION_START, ACTION_END = "<action_start>", "<action_end>"
STATE_LEVELS = 256
ACTION_MODES = ("continuous", "both")

_TRAILING_PUNCT = ".,!?;:,\u2026"
_TRAILING_CLOSERS = "\"'\u201d\u2019)]}"
_SURROUNDING = "\"'`\u201c\u201d\u2018\u2019[](){}"
_PREFIXES = tuple(re.compile(p, flags=re.IGNORECASE) for p in (
    r"^(?:task|instruction|language[_ ]instruction|goal)\s*[:\-]\s*",
    r"^(?:the\s+task\s+is\s+to|your\s+task\s+is\s+to)\s+",
))


class PromptError(ValueError):
    pass


class CapError(PromptError):
    """A prompt above the checkpoint's max_sequence_length (the pack step raises)."""


# The upstream versions whose host glue the builder follows (docs/bundle-format.md).
# lerobot 0.6.1 is the pin and, as of this change, the newest release on PyPI. lerobot's main
# branch after it (huggingface/lerobot c13d79e, pyproject 0.6.2, unreleased) changed the pack
# step: the tokenizer pads to a multiple of 8 on the left before BOS is inserted (8k + 1 rows at
# batch 1), positions are clamp(cumsum(mask) - 1, 0) (the real tokens at 0..n-1, so the math is
# the unpadded run's), max_sequence_length bounds the real tokens (and the padded width by
# round_up(cap - 1, 8) + 1), and the pack step's and policy config's action_mode default became
# "continuous" (0.6.1: "both").
UPSTREAMS = {
    "lerobot-0.6.1": {"pad_multiple": None, "action_mode_default": "both"},
    "lerobot-main-c13d79e": {"pad_multiple": 8, "action_mode_default": "continuous"},
}
DEFAULT_UPSTREAM = "lerobot-0.6.1"


def check_upstream(name: str) -> dict:
    if name not in UPSTREAMS:
        raise PromptError(f"upstream {name!r}: expected one of {', '.join(UPSTREAMS)}")
    return UPSTREAMS[name]


def upstream_layout(tokens: int, upstream: str) -> tuple:
    """(rows, rows of left padding) the pack step gives one instruction of `tokens` tokens (BOS
    included) at batch 1: 0.6.1 pads nothing; main pads the text to a multiple of 8, then inserts
    BOS after the padding."""
    multiple = check_upstream(upstream)["pad_multiple"]
    if multiple is None:
        return tokens, 0
    text = tokens - 1
    width = -(-text // multiple) * multiple
    return width + 1, width - text


def over_cap(tokens: int, rows: int, cap: int, upstream: str):
    """Why the pack step refuses a prompt of `tokens` real tokens in `rows` rows, or None."""
    multiple = check_upstream(upstream)["pad_multiple"]
    if multiple is None:  # 0.6.1 compares the tensor's width
        return f"{rows} rows, above max_sequence_length {cap}" if rows > cap else None
    if tokens > cap:
        return f"{tokens} tokens, above max_sequence_length {cap}"
    bound = -(-(cap - 1) // multiple) * multiple + 1
    return f"{rows} padded rows, above the bounded width {bound}" if rows > bound else None


def normalize_task(text: str) -> str:
    """Upstream `_normalize_question_text`: whitespace collapsed; surrounding quotes and
    brackets, "task:"-style prefixes and trailing punctuation stripped until nothing
    changes; several sentences joined with "; "; lowercased."""
    t = re.sub(r"\s+", " ", str(text or "")).strip()
    previous = None
    while t and t != previous:
        previous = t
        t = t.strip().strip(_SURROUNDING).strip()
        for pattern in _PREFIXES:
            t = pattern.sub("", t, count=1).strip()
        t = t.rstrip(_TRAILING_PUNCT).rstrip()
        t = t.rstrip(_TRAILING_CLOSERS).rstrip()
        t = t.rstrip(_TRAILING_PUNCT).rstrip()
    chunks = [c.strip() for c in re.split(r"[.!?]+", t) if c.strip()]
    if len(chunks) > 1:
        t = "; ".join(chunks)
    return t.lower()


# MolmoAct2ImageProcessor's defaults for keys a processor_config.json lacks
# (image_processing_molmoact2.py `__init__`), and PIL's BILINEAR, the one resample vlad computes.
IMAGE_DEFAULTS = {"size": {"height": 378, "width": 378}, "patch_size": 14, "pooling_size": [2, 2],
                  "crop_mode": "overlap-and-resize-c2", "image_mean": [0.5, 0.5, 0.5],
                  "image_std": [0.5, 0.5, 0.5], "resample": 2}
BILINEAR = 2


def _positive_int(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PromptError(f"{where}: expected a positive integer, found {value!r}")
    return value


def processor_settings(cfg: dict, where: str = "processor_config.json") -> dict:
    """A saved processor_config.json as lerobot's `_load_local_molmoact2_processor` loads it:
    the `image_processor` block into `MolmoAct2ImageProcessor` (absent keys take its defaults:
    crop_mode "overlap-and-resize-c2", size 378, patch 14, pooling 2x2; `size` may be one int,
    `get_size_dict`'s square), the column tokens of a single crop `use_single_crop_col_tokens`
    unless null, else `image_use_col_tokens` (true when absent; null means none). Returns the
    crop, patch, pooling, the pooled grid per camera (`arange_for_pooling` pads the patch grid
    to a multiple of the pooling: ceil) and `col_tokens`. What vlad cannot compute (another crop
    mode, resample, mean/std, a non-square crop) is refused, naming the key."""
    if not isinstance(cfg, dict):
        raise PromptError(f"{where}: expected an object, found {type(cfg).__name__}")
    ip = cfg.get("image_processor") or {}
    if not isinstance(ip, dict):
        raise PromptError(f"{where} image_processor: expected an object, found {ip!r}")
    get = lambda key: IMAGE_DEFAULTS[key] if ip.get(key) is None else ip[key]  # noqa: E731
    key = lambda k: f"{where} image_processor.{k}"  # noqa: E731
    crop_mode = get("crop_mode")
    if crop_mode != "resize":
        absent = " (absent: the image processor's default)" if ip.get("crop_mode") is None else ""
        raise PromptError(f"{key('crop_mode')}: expected 'resize' (the only crop vlad computes), found "
                          f"{crop_mode!r}{absent}")
    size = get("size")
    if isinstance(size, int) and not isinstance(size, bool):
        size = {"height": size, "width": size}
    if not isinstance(size, dict) or "height" not in size or "width" not in size:
        raise PromptError(f"{key('size')}: expected an int or {{height, width}}, found {size!r}")
    h, w = _positive_int(size["height"], key("size.height")), _positive_int(size["width"], key("size.width"))
    if h != w:
        raise PromptError(f"{key('size')}: expected a square crop (vlad's preprocess), found {h}x{w}")
    patch = _positive_int(get("patch_size"), key("patch_size"))
    pool = get("pooling_size")
    if not isinstance(pool, (list, tuple)) or len(pool) != 2:
        raise PromptError(f"{key('pooling_size')}: expected [h, w], found {pool!r}")
    pool = [_positive_int(v, key("pooling_size")) for v in pool]
    if get("resample") != BILINEAR:
        raise PromptError(f"{key('resample')}: expected {BILINEAR} (bilinear, the resize vlad computes), "
                          f"found {get('resample')!r}")
    for stat in ("image_mean", "image_std"):
        # normalize_image's own test: np.allclose to 0.5 takes the x*2-1 path vlad computes
        if not np.allclose(np.asarray(get(stat), np.float64), [0.5, 0.5, 0.5]):
            raise PromptError(f"{key(stat)}: expected [0.5, 0.5, 0.5], found {get(stat)!r}")
    single = cfg.get("use_single_crop_col_tokens")
    col = cfg.get("image_use_col_tokens", True) if single is None else single
    patches = h // patch
    grid = (-(-patches // pool[0]), -(-patches // pool[1]))
    return {"crop_size": h, "patch_size": patch, "pooling_size": pool, "grid": grid, "col_tokens": bool(col)}


def _token_text(value):
    """A tokenizer_config.json special token: a string, an AddedToken object, or null."""
    return value.get("content") if isinstance(value, dict) else value


def tokenizer_tokens(cfg: dict) -> dict:
    """BOS, EOS and PAD as `Qwen2Tokenizer.from_pretrained` reads them from tokenizer_config.json
    (its defaults: no BOS, EOS and PAD `<|endoftext|>`); the processor inserts BOS, else EOS."""
    eos = _token_text(cfg.get("eos_token", "<|endoftext|>"))
    pad = _token_text(cfg.get("pad_token", "<|endoftext|>"))
    return {"bos_token": _token_text(cfg.get("bos_token")), "eos_token": eos, "pad_token": pad}


# Qwen2Tokenizer's own pre-tokenizer split (transformers tokenization_qwen2.py PRETOKENIZE_REGEX).
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def load_tokenizer(path: Path, config: dict | None = None):
    """tokenizer.json as `Qwen2Tokenizer.from_pretrained` (transformers 5, lerobot's loader)
    loads it: the file's vocabulary, merges, added tokens and post-processor, but the class's
    own BPE settings, NFC normalizer, split regex and byte-level pre-tokenizer and decoder,
    whatever the file says (`add_prefix_space` from tokenizer_config.json, default false)."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    try:
        data = json.loads(Path(path).read_text())
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001  (a damaged file: one line with the cause)
        raise PromptError(f"{path}: not a tokenizer: {exc}".splitlines()[0]) from None
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise PromptError(f"{path}: model.type: expected 'BPE' (Qwen2Tokenizer), found {model.get('type')!r}")
    vocab = model.get("vocab") or {}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model.get("merges") or []]
    tok.model = BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                    end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    tok.normalizer = normalizers.NFC()
    prefix = bool((config or {}).get("add_prefix_space") or False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def image_tokens(grid: tuple, col_tokens: bool) -> str:
    """One camera's tokens for crop mode "resize": `<im_start>`, `rows` rows of `cols`
    patches (+ `<im_col>`), `<im_end>` (upstream `get_image_tokens`, single crop)."""
    rows, cols = grid
    row = IM_PATCH * cols + (IM_COL if col_tokens else "")
    return IM_START + row * rows + IM_END


def _wrap(text: str, start: str, end: str, add: bool) -> str:
    """Upstream `_wrap_setup_text` / `_wrap_control_text`: an already-wrapped or empty text is
    kept, and so is any text when the checkpoint does not add the markers."""
    if (text.startswith(start) and text.endswith(end)) or not text or not add:
        return text
    return f"{start}{text}{end}"


def render_text(task: str, cameras: int, state_dims: int, setup: str = SETUP, control: str = CONTROL,
                add_setup_tokens: bool = True, add_control_tokens: bool = True,
                normalize_language: bool = True) -> str:
    """Upstream `_build_robot_text` as the pack step calls it (the task normalized when
    `normalize_language`), images as `<|image|>`, state as `<state_0>` placeholders; a state of
    zero dims still has its clause, `<state_start><state_end>`, as upstream renders it."""
    task = normalize_task(task) if normalize_language else task
    state = STATE_START + "<state_0>" * state_dims + STATE_END
    body = (f"The task is to {task}. The setup is {_wrap(setup, SETUP_START, SETUP_END, add_setup_tokens)}. "
            f"The current state of the robot is {state}. The expected control mode is "
            f"{_wrap(control, CONTROL_START, CONTROL_END, add_control_tokens)}. Given these, what action "
            f"should the robot take to complete the task?")
    if cameras <= 0:
        images = ""
    elif cameras == 1:
        images = IMAGE_PROMPT
    else:
        images = "".join(f"Image {i + 1}{IMAGE_PROMPT}" for i in range(cameras))
    return f"{images}<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n{ACTION_OUTPUT}"


def render_prompt(task: str, cameras: int, grid: tuple, state_dims: int, col_tokens: bool = True,
                  setup: str = SETUP, control: str = CONTROL, **settings) -> str:
    """The full text upstream tokenizes (images expanded, state as placeholders); `settings`:
    `add_setup_tokens`, `add_control_tokens`, `normalize_language` (see `render_text`)."""
    text = render_text(task, cameras, state_dims, setup, control, **settings)
    # The processor replaces one placeholder per image, first come first served: `<|image|>`
    # text inside the instruction stays the `<|image|>` token.
    return text.replace(IMAGE_PROMPT, image_tokens(grid, col_tokens), max(cameras, 0))


def mask_action_spans(ids: np.ndarray, mask: np.ndarray, start_id, end_id) -> None:
    """Upstream `_mask_discrete_output_span`: each `<action_start>` masks through the next
    `<action_end>`, or to the end of the row when none follows."""
    if start_id is None or end_id is None:
        return
    ends = np.flatnonzero(ids == end_id).tolist()
    e = 0
    for start in np.flatnonzero(ids == start_id).tolist():
        while e < len(ends) and ends[e] < start:
            e += 1
        if e >= len(ends):
            mask[start:] = 0
            return
        mask[start:ends[e] + 1] = 0
        e += 1


def _token_id(tokenizer, token: str | None) -> int:
    if token is None:
        raise PromptError("tokenizer_config.json sets a token this prompt needs (BOS/EOS/PAD) to null")
    tid = tokenizer.token_to_id(token)
    if tid is None:
        raise PromptError(f"tokenizer has no token {token!r}")
    return tid


def encode_prompt(tokenizer, prompt: str, bos_id: int) -> list:
    """Token ids of a rendered prompt with BOS first (upstream `insert_bos`: only when the
    tokenizer did not already put it there)."""
    ids = tokenizer.encode(prompt).ids
    return ids if ids and ids[0] == bos_id else [bos_id] + ids


def build_tables(tokenizer, wte: np.ndarray, instructions, cameras: int, grid: tuple, state_dims: int,
                 seq_len: int, rope_left_pad, action_mode: str, col_tokens: bool = True,
                 bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                 setup: str = SETUP, control: str = CONTROL, upstream: str | None = None,
                 max_sequence_length: int | None = None, rendered: list | None = None, **settings) -> dict:
    """`settings`: the checkpoint's `add_setup_tokens`, `add_control_tokens`,
    `normalize_language` (all true when absent, upstream's defaults). `upstream`: the version
    followed (`UPSTREAMS`), recorded in the tables as `upstream` (utf-8 bytes); None = the pin,
    unrecorded (the stand-in fixtures). `rope_left_pad` None: the padding that version gives the
    first instruction at batch 1 (`upstream_layout`), which every instruction must share.
    `max_sequence_length`: the pack step's cap, refused as that version refuses it. `rendered`:
    each instruction as `vlad prompt` renders it (vla-text, the device's renderer: what the
    importer uses); None renders here in Python (the test oracle the Rust renderer is checked
    against)."""
    version = upstream or DEFAULT_UPSTREAM
    check_upstream(version)
    if wte.ndim != 2:
        raise PromptError(f"wte: expected [V, D], got shape {list(wte.shape)}")
    if not instructions:
        raise PromptError("instructions: empty list")
    if action_mode not in ACTION_MODES:
        raise PromptError(f"action mode {action_mode!r}: expected one of {', '.join(ACTION_MODES)}")
    if rope_left_pad is not None and not 0 <= rope_left_pad < seq_len:
        raise PromptError(f"rope_left_pad {rope_left_pad} outside 0..{seq_len}")
    patch_id = _token_id(tokenizer, IM_PATCH)
    block_ids = [tokenizer.token_to_id(t) for t in IMAGE_TOKENS]
    block_ids = np.array([t for t in block_ids if t is not None], np.int64)
    state_ids = np.array([_token_id(tokenizer, f"<state_{k}>") for k in range(STATE_LEVELS)])
    eos_id = _token_id(tokenizer, eos_token)
    bos_id = _token_id(tokenizer, bos_token) if bos_token else eos_id
    pad_id = _token_id(tokenizer, pad_token)
    span_ids = tokenizer.token_to_id(ACTION_START), tokenizer.token_to_id(ACTION_END)
    sequences, state_rows = [], []
    for n, text in enumerate(instructions):
        if rendered is not None:
            r = rendered[n]
            if "error" in r:
                error = CapError if r["kind"] == "over_cap" else PromptError
                raise error(f"instruction {n} ({normalize_task(text)!r}): {r['error']}")
            ids = list(r["ids"])
        else:
            prompt = render_prompt(text, cameras, grid, state_dims, col_tokens, setup, control, **settings)
            ids = encode_prompt(tokenizer, prompt, bos_id)
        rows, pads = upstream_layout(len(ids), version)
        if rope_left_pad is None:
            if rows != seq_len:
                raise PromptError(
                    f"instruction {n} ({normalize_task(text)!r}) renders to {len(ids)} tokens, which {version} "
                    f"lays out as {rows} rows after {pads} rows of left padding, but the contexts have seq_len "
                    f"{seq_len}: it would run with shifted positions. Use instructions of that layout")
            rope_left_pad = pads
        if max_sequence_length is not None:
            why = over_cap(len(ids), rows, max_sequence_length, version)
            if why:
                raise CapError(f"instruction {n} ({normalize_task(text)!r}): {why}: lerobot's pack step "
                               f"({version}) refuses such a prompt")
        length = seq_len - rope_left_pad
        if rendered is not None:
            state_rows.append(np.array(rendered[n]["state_positions"], np.int64))
        else:
            # The state clause's rows: where the prompt with every state at bin 1 differs (a
            # `<state_0>` the instruction itself holds is text, as upstream renders it).
            head, clause, tail = prompt.rpartition(STATE_START + "<state_0>" * state_dims + STATE_END)
            probe = encode_prompt(tokenizer, head + STATE_START + "<state_1>" * state_dims + STATE_END + tail
                                  if clause else prompt, bos_id)
            if len(probe) == len(ids):
                state_rows.append(np.flatnonzero(np.array(ids) != np.array(probe)))
            else:
                state_rows.append(np.empty(0, np.int64))
        if max(ids) >= wte.shape[0]:
            raise PromptError(f"instruction {n}: token id {max(ids)} outside wte rows {wte.shape[0]}")
        if len(ids) != length:
            raise PromptError(
                f"instruction {n} ({normalize_task(text)!r}) renders to {len(ids)} tokens, but the "
                f"contexts bake RoPE positions for {length} tokens after {rope_left_pad} rows of left "
                f"padding (seq_len {seq_len}): it would run with shifted positions. Use instructions of "
                f"that length, or an export that takes positions as an input")
        sequences.append(np.array(ids, np.int64))
    n_img = cameras * grid[0] * grid[1]
    count = len(sequences)
    token_ids = np.full((count, seq_len), pad_id, np.int32)
    scaffold = np.empty((count, seq_len, wte.shape[1]), np.float16)
    valid = np.zeros((count, seq_len), np.uint8)
    image_block = np.zeros((count, seq_len), np.uint8)
    encoder_mask = np.zeros((count, seq_len), np.uint8)
    image_positions = np.empty((count, n_img), np.int32)
    state_positions = np.empty((count, state_dims), np.int32)
    for n, ids in enumerate(sequences):
        token_ids[n, rope_left_pad:] = ids
        valid[n, rope_left_pad:] = 1
        scaffold[n] = wte[token_ids[n]].astype(np.float16)
        image_block[n] = np.isin(token_ids[n], block_ids)
        # The action expert's encoder mask (modeling `_encoder_attention_mask_for_action_expert`):
        # the attention mask; with action_mode "both" every EOS position (BOS is EOS) as well.
        # With "both" also an <action_start>..<action_end> span (`_mask_discrete_output_span`).
        encoder_mask[n] = valid[n]
        if action_mode == "both":
            encoder_mask[n] &= (token_ids[n] != eos_id).astype(np.uint8)
            mask_action_spans(token_ids[n], encoder_mask[n], *span_ids)
        img = np.flatnonzero(token_ids[n] == patch_id)
        if rendered is not None:  # the renderer's own rows and masks, placed after the padding
            r = rendered[n]
            image_block[n, rope_left_pad:] = r["image_block"]
            encoder_mask[n] = 0
            encoder_mask[n, rope_left_pad:] = r["encoder_mask"]
            img = np.array(r["image_positions"], np.int64) + rope_left_pad
        st = state_rows[n] + rope_left_pad
        if len(img) != n_img:
            # upstream's build_input_embeddings: "Expected {patch rows} image patch embeddings, got {features}"
            raise PromptError(f"instruction {n}: {len(img)} <im_patch> rows but the images give {n_img} "
                              f"features (<im_patch> text in the instruction?): upstream refuses it")
        if len(st) != state_dims:
            raise PromptError(f"instruction {n}: {len(st)} state tokens, expected {state_dims}")
        image_positions[n] = img
        state_positions[n] = st
    tables = {
        "scaffold": scaffold,
        "valid": valid,
        "image_positions": image_positions,
        "state_positions": state_positions,
        "state_token_rows": wte[state_ids].astype(np.float16),
        "image_block": image_block,
        "encoder_mask": encoder_mask,
        "token_ids": token_ids,
    }
    if upstream is not None:
        tables["upstream"] = np.frombuffer(upstream.encode(), np.uint8)
    return tables


def rope_positions(seq_len: int, rope_left_pad: int) -> np.ndarray:
    """The positions an export with `rope_left_pad` rows of left padding bakes in: what
    upstream's `clamp(cumsum(mask) - 1, 0)` gives for that padding."""
    mask = (np.arange(seq_len) >= rope_left_pad).astype(np.int64)
    return np.clip(np.cumsum(mask) - 1, 0, None)


def load_instructions(path: Path):
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
        if isinstance(data, dict):
            data = data["instructions"]
        return [str(x) for x in data]
    return [line for line in text.splitlines() if line.strip()]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PromptError(f"{path}: {exc}") from None


def parse_grid(text: str) -> tuple:
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--grid {text!r}: expected ROWSxCOLS, e.g. 14x14") from None
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError(f"--grid {text!r}: rows and cols must be at least 1")
    return rows, cols


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True, help="HF tokenizer.json")
    ap.add_argument("--wte", type=Path, required=True, help="embedding table .npy [V, D]")
    ap.add_argument("--instructions", type=Path, required=True, help=".json list (or {instructions: [...]}) or one per line")
    ap.add_argument("--cameras", type=int, default=2)
    image = ap.add_mutually_exclusive_group(required=True)
    image.add_argument("--processor-config", type=Path,
                       help="the checkpoint's processor_config.json: image tokens per camera and column tokens")
    image.add_argument("--grid", type=parse_grid,
                       help="stand-in fixtures without a processor: pooled image tokens per camera as ROWSxCOLS")
    ap.add_argument("--no-col-tokens", action="store_true", help="with --grid: no <im_col> tokens")
    ap.add_argument("--tokenizer-config", type=Path,
                    help="the checkpoint's tokenizer_config.json: BOS, EOS and PAD (else the flags below)")
    ap.add_argument("--state-dims", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True, help="S of the exported contexts")
    ap.add_argument("--rope-left-pad", type=int, default=None,
                    help="rows of left padding the export's baked RoPE positions assume (default: with --upstream, "
                    "that version's padding of the first instruction; else 0)")
    ap.add_argument("--upstream", choices=list(UPSTREAMS),
                    help="the upstream version followed, recorded in the tables (default: the pin, unrecorded)")
    ap.add_argument("--max-sequence-length", type=int, help="the pack step's cap (LeRobot checkpoints)")
    ap.add_argument("--action-mode", choices=ACTION_MODES, required=True,
                    help="the checkpoint's action_mode: 'both' also masks EOS positions for the action expert")
    ap.add_argument("--bos-token", default=None, help="default: the EOS token, as upstream for Molmo2's tokenizer")
    ap.add_argument("--eos-token", default="<|im_end|>")
    ap.add_argument("--pad-token", default="<|endoftext|>")
    ap.add_argument("--no-setup-tokens", action="store_true", help="the checkpoint's add_setup_tokens is false")
    ap.add_argument("--no-control-tokens", action="store_true", help="the checkpoint's add_control_tokens is false")
    ap.add_argument("--no-normalize-language", action="store_true",
                    help="the instruction is used as given (lerobot's normalize_language false)")
    ap.add_argument("--setup", default=SETUP)
    ap.add_argument("--control", default=CONTROL)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    try:
        grid, col = args.grid, not args.no_col_tokens
        if args.processor_config is not None:
            if args.no_col_tokens:
                raise PromptError("--no-col-tokens: the processor config states the column tokens")
            proc = processor_settings(_read_json(args.processor_config), str(args.processor_config))
            grid, col = proc["grid"], proc["col_tokens"]
        tokens = {"bos_token": args.bos_token, "eos_token": args.eos_token, "pad_token": args.pad_token}
        tok_cfg = {}
        if args.tokenizer_config is not None:
            tok_cfg = _read_json(args.tokenizer_config)
            tokens = tokenizer_tokens(tok_cfg)
        if args.processor_config is not None:
            tokenizer = load_tokenizer(args.tokenizer, tok_cfg)
        else:  # the stand-ins' own tokenizers are not Qwen2's: used as the file says
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(args.tokenizer))
        tables = build_tables(tokenizer, np.load(args.wte),
                              load_instructions(args.instructions), args.cameras, grid,
                              args.state_dims, args.seq_len,
                              0 if args.rope_left_pad is None and args.upstream is None else args.rope_left_pad,
                              args.action_mode,
                              col, tokens["bos_token"], tokens["eos_token"], tokens["pad_token"],
                              args.setup, args.control, upstream=args.upstream,
                              max_sequence_length=args.max_sequence_length,
                              add_setup_tokens=not args.no_setup_tokens,
                              add_control_tokens=not args.no_control_tokens,
                              normalize_language=not args.no_normalize_language)
    except PromptError as err:
        sys.exit(f"build_prompt_tables: {err}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_npz(args.out, tables)
    print(f"{args.out}: {tables['scaffold'].shape[0]} instructions, S={tables['scaffold'].shape[1]}")


if __name__ == "__main__":
    main()
