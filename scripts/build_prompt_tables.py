#!/usr/bin/env python3
"""Builds prompt/prompt_tables.npz for a MolmoAct2 bundle (the device has no tokenizer).

For each instruction the MolmoAct2 LIBERO prompt is rendered, tokenized with the checkpoint's
HF tokenizer.json (via `tokenizers`), BOS-prefixed, left-padded to the sequence length and
looked up in the embedding table (wte). Each `<|image|>` in the template stands for one
camera and expands to `--tokens-per-camera` image-patch tokens; the state is rendered as
`<state_0>` placeholders whose rows the runtime replaces per tick.

    .venv/bin/python scripts/build_prompt_tables.py --tokenizer tokenizer.json --wte wte.npy \
        --instructions instructions.json --tokens-per-camera 196 --state-dims 8 \
        --seq-len 488 --out prompt/prompt_tables.npz
"""

import argparse
import json
import string
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from det_npz import save_npz  # noqa: E402

SETUP = "single franka robotic arm in libero"
CONTROL = "delta end-effector pose"
IMAGE_TOKEN = "<|image|>"
STATE_START, STATE_END = "<state_start>", "<state_end>"
STATE_LEVELS = 256
TEMPLATE = (
    "{images}<|im_start|>user\nThe task is to {task}. The setup is {setup}. "
    "The current state of the robot is {state}. The expected control mode is {control}. "
    "Given these, what action should the robot take to complete the task?<|im_end|>\n"
    "<|im_start|>assistant\n<action_output>"
)


class PromptError(ValueError):
    pass


def normalize_task(text: str) -> str:
    """Whitespace-collapsed, lowercased, trailing punctuation removed."""
    task = " ".join(text.split()).lower()
    return task.rstrip(string.punctuation + " ")


def render_prompt(task: str, cameras: int, tokens_per_camera: int, state_dims: int) -> str:
    images = "".join(f"Image {i + 1}" + IMAGE_TOKEN * tokens_per_camera for i in range(cameras))
    state = STATE_START + "<state_0>" * state_dims + STATE_END
    return TEMPLATE.format(images=images, task=normalize_task(task), setup=SETUP, state=state, control=CONTROL)


def _token_id(tokenizer, token: str) -> int:
    tid = tokenizer.token_to_id(token)
    if tid is None:
        raise PromptError(f"tokenizer has no token {token!r}")
    return tid


def build_tables(tokenizer, wte: np.ndarray, instructions, cameras: int, tokens_per_camera: int,
                 state_dims: int, seq_len=None, bos_token="<bos>", pad_token="<pad>") -> dict:
    if wte.ndim != 2:
        raise PromptError(f"wte: expected [V, D], got shape {list(wte.shape)}")
    if not instructions:
        raise PromptError("instructions: empty list")
    image_id = _token_id(tokenizer, IMAGE_TOKEN)
    state_ids = np.array([_token_id(tokenizer, f"<state_{k}>") for k in range(STATE_LEVELS)])
    bos_id, pad_id = _token_id(tokenizer, bos_token), _token_id(tokenizer, pad_token)
    sequences = []
    for n, text in enumerate(instructions):
        prompt = render_prompt(text, cameras, tokens_per_camera, state_dims)
        ids = [bos_id] + tokenizer.encode(prompt, add_special_tokens=False).ids
        if max(ids) >= wte.shape[0]:
            raise PromptError(f"instruction {n}: token id {max(ids)} outside wte rows {wte.shape[0]}")
        sequences.append(np.array(ids, np.int64))
    longest = max(len(s) for s in sequences)
    if seq_len is None:
        seq_len = -(-longest // 8) * 8
    if longest > seq_len:
        raise PromptError(f"instruction {int(np.argmax([len(s) for s in sequences]))}: "
                          f"{longest} tokens exceed seq_len {seq_len}")
    n_img = cameras * tokens_per_camera
    scaffold = np.empty((len(sequences), seq_len, wte.shape[1]), np.float16)
    valid = np.zeros((len(sequences), seq_len), np.uint8)
    image_positions = np.empty((len(sequences), n_img), np.int32)
    state_positions = np.empty((len(sequences), state_dims), np.int32)
    for n, ids in enumerate(sequences):
        padded = np.concatenate([np.full(seq_len - len(ids), pad_id, np.int64), ids])
        valid[n, seq_len - len(ids):] = 1
        scaffold[n] = wte[padded].astype(np.float16)
        img = np.flatnonzero(padded == image_id)
        st = np.flatnonzero(padded == state_ids[0])
        if len(img) != n_img:
            raise PromptError(f"instruction {n}: {len(img)} image tokens, expected {n_img}")
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
    }


def load_instructions(path: Path):
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
        if isinstance(data, dict):
            data = data["instructions"]
        return [str(x) for x in data]
    return [line for line in text.splitlines() if line.strip()]


def main():
    from tokenizers import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True, help="HF tokenizer.json")
    ap.add_argument("--wte", type=Path, required=True, help="embedding table .npy [V, D]")
    ap.add_argument("--instructions", type=Path, required=True, help=".json list (or {instructions: [...]}) or one per line")
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--tokens-per-camera", type=int, required=True)
    ap.add_argument("--state-dims", type=int, required=True)
    ap.add_argument("--seq-len", type=int, help="fixed S of the contexts (default: longest prompt rounded up to 8)")
    ap.add_argument("--bos-token", default="<bos>")
    ap.add_argument("--pad-token", default="<pad>")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    try:
        tables = build_tables(Tokenizer.from_file(str(args.tokenizer)), np.load(args.wte),
                              load_instructions(args.instructions), args.cameras, args.tokens_per_camera,
                              args.state_dims, args.seq_len, args.bos_token, args.pad_token)
    except PromptError as err:
        sys.exit(f"build_prompt_tables: {err}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_npz(args.out, tables)
    print(f"{args.out}: {tables['scaffold'].shape[0]} instructions, S={tables['scaffold'].shape[1]}")


if __name__ == "__main__":
    main()
