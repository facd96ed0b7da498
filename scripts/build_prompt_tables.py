#!/usr/bin/env python3
"""Builds prompt/prompt_tables.npz for a MolmoAct2 bundle (the device has no tokenizer).

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

    .venv/bin/python scripts/build_prompt_tables.py --tokenizer tokenizer.json --wte wte.npy \
        --instructions instructions.json --grid 14x14 --state-dims 8 \
        --seq-len 488 --rope-left-pad 0 --action-mode both --out prompt/prompt_tables.npz
"""

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from det_npz import save_npz  # noqa: E402

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
    return text.replace(IMAGE_PROMPT, image_tokens(grid, col_tokens))


def _token_id(tokenizer, token: str) -> int:
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
                 seq_len: int, rope_left_pad: int, action_mode: str, col_tokens: bool = True,
                 bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                 setup: str = SETUP, control: str = CONTROL, **settings) -> dict:
    """`settings`: the checkpoint's `add_setup_tokens`, `add_control_tokens`,
    `normalize_language` (all true when absent, upstream's defaults)."""
    if wte.ndim != 2:
        raise PromptError(f"wte: expected [V, D], got shape {list(wte.shape)}")
    if not instructions:
        raise PromptError("instructions: empty list")
    if action_mode not in ACTION_MODES:
        raise PromptError(f"action mode {action_mode!r}: expected one of {', '.join(ACTION_MODES)}")
    if not 0 <= rope_left_pad < seq_len:
        raise PromptError(f"rope_left_pad {rope_left_pad} outside 0..{seq_len}")
    patch_id = _token_id(tokenizer, IM_PATCH)
    block_ids = [tokenizer.token_to_id(t) for t in IMAGE_TOKENS]
    block_ids = np.array([t for t in block_ids if t is not None], np.int64)
    state_ids = np.array([_token_id(tokenizer, f"<state_{k}>") for k in range(STATE_LEVELS)])
    eos_id = _token_id(tokenizer, eos_token)
    bos_id = _token_id(tokenizer, bos_token) if bos_token else eos_id
    pad_id = _token_id(tokenizer, pad_token)
    length = seq_len - rope_left_pad
    sequences = []
    for n, text in enumerate(instructions):
        ids = encode_prompt(tokenizer, render_prompt(text, cameras, grid, state_dims, col_tokens, setup,
                                                     control, **settings), bos_id)
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
        encoder_mask[n] = valid[n]
        if action_mode == "both":
            encoder_mask[n] &= (token_ids[n] != eos_id).astype(np.uint8)
        img = np.flatnonzero(token_ids[n] == patch_id)
        st = np.flatnonzero(token_ids[n] == state_ids[0])
        if len(img) != n_img:
            raise PromptError(f"instruction {n}: {len(img)} image patch tokens, expected {n_img}")
        if len(st) != state_dims:
            raise PromptError(f"instruction {n}: {len(st)} state tokens, expected {state_dims}")
        image_positions[n] = img
        state_positions[n] = st
    return {
        "scaffold": scaffold,
        "valid": valid,
        "image_positions": image_positions,
        "state_positions": state_positions,
        "state_token_rows": wte[state_ids].astype(np.float16),
        "image_block": image_block,
        "encoder_mask": encoder_mask,
        "token_ids": token_ids,
    }


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


def parse_grid(text: str) -> tuple:
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--grid {text!r}: expected ROWSxCOLS, e.g. 14x14") from None
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError(f"--grid {text!r}: rows and cols must be at least 1")
    return rows, cols


def main():
    from tokenizers import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True, help="HF tokenizer.json")
    ap.add_argument("--wte", type=Path, required=True, help="embedding table .npy [V, D]")
    ap.add_argument("--instructions", type=Path, required=True, help=".json list (or {instructions: [...]}) or one per line")
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--grid", type=parse_grid, required=True,
                    help="pooled image tokens per camera as ROWSxCOLS (original 14x14)")
    ap.add_argument("--no-col-tokens", action="store_true",
                    help="the processor's use_single_crop_col_tokens is false (default: true, upstream's default)")
    ap.add_argument("--state-dims", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True, help="S of the exported contexts")
    ap.add_argument("--rope-left-pad", type=int, default=0,
                    help="rows of left padding the export's baked RoPE positions assume (default 0)")
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
        tables = build_tables(Tokenizer.from_file(str(args.tokenizer)), np.load(args.wte),
                              load_instructions(args.instructions), args.cameras, args.grid,
                              args.state_dims, args.seq_len, args.rope_left_pad, args.action_mode,
                              not args.no_col_tokens, args.bos_token, args.eos_token, args.pad_token,
                              args.setup, args.control, add_setup_tokens=not args.no_setup_tokens,
                              add_control_tokens=not args.no_control_tokens,
                              normalize_language=not args.no_normalize_language)
    except PromptError as err:
        sys.exit(f"build_prompt_tables: {err}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_npz(args.out, tables)
    print(f"{args.out}: {tables['scaffold'].shape[0]} instructions, S={tables['scaffold'].shape[1]}")


if __name__ == "__main__":
    main()
