"""The prompt tables (rendered by `vlad prompt`, the device's own renderer, and embedded by
tools/vla_host/vla_host/build_prompt_tables.py), and the proof that they are the release's own: the traced prompt recovered from the llm_split0 golden must be
what the builder renders for one of the instructions, with the same attention bias and the
same encoder mask."""

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from .errors import ImportRefused, expect

REPO = Path(__file__).resolve().parents[3]

from vla_host import build_prompt_tables as bpt  # noqa: E402  (scripts/ is on the path: see __main__)
from vla_host import reference as ref


def vlad_binary() -> Path:
    """`$VLAD`, else the repository's release or debug build."""
    if os.environ.get("VLAD"):
        return Path(os.environ["VLAD"])
    for build in ("release", "debug"):
        path = REPO / "target" / build / "vlad"
        if path.is_file():
            return path
    raise ImportRefused("vlad", "the importer renders prompts with `vlad prompt`: build it (cargo build -p vlad) "
                                "or set VLAD to its path")


def render(paths, instructions, cfg, grid, col, action_mode, setup, control, settings, upstream, cap) -> list:
    """Each instruction as `vlad prompt` renders it (see its help for the fields)."""
    tokenizer_json, tokenizer_config = paths
    settings = settings or {}
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "instructions.json"
        listing.write_text(json.dumps(list(instructions)))
        cmd = [str(vlad_binary()), "prompt", "--tokenizer", str(tokenizer_json), "--cameras", str(cfg["cameras"]),
               "--grid", f"{grid[0]}x{grid[1]}", "--state-dims", str(cfg["state_dims"]), "--setup", setup,
               "--control", control, "--upstream", upstream, "--action-mode", action_mode,
               "--instructions", str(listing)]
        if tokenizer_config is not None:
            cmd += ["--tokenizer-config", str(tokenizer_config)]
        if not col:
            cmd.append("--no-col-tokens")
        for key, flag in (("add_setup_tokens", "--no-setup-tokens"), ("add_control_tokens", "--no-control-tokens"),
                          ("normalize_language", "--no-normalize-language")):
            if settings.get(key, True) is False:
                cmd.append(flag)
        if cap is not None:
            cmd += ["--max-sequence-length", str(cap)]
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines() or [f"exit {run.returncode}"]
        raise ImportRefused(str(tokenizer_json), lines[-1].removeprefix("vlad: error: "))
    return json.loads(run.stdout)["instructions"]


def tables(tokenizer, wte, instructions, cfg, grid, col, seq_len, action_mode, setup, control, where,
           settings=None, tokens=None, upstream=bpt.DEFAULT_UPSTREAM, cap=None, paths=None):
    """`settings`: the checkpoint's add_setup_tokens / add_control_tokens / normalize_language;
    `tokens`: its BOS, EOS and PAD (`bpt.tokenizer_tokens`); `upstream`: the version followed
    (its padding is the export's); `cap`: (max_sequence_length, where it came from) or None;
    `paths`: (tokenizer.json, tokenizer_config.json or None) that `vlad prompt` renders with."""
    rendered = render(paths, instructions, cfg, grid, col, action_mode, setup, control, settings, upstream,
                      cap[0] if cap else None) if paths is not None else None
    try:
        return bpt.build_tables(tokenizer, wte, instructions, cfg["cameras"], grid, cfg["state_dims"], seq_len, None,
                                action_mode, col_tokens=col, setup=setup, control=control, upstream=upstream,
                                max_sequence_length=cap[0] if cap else None, rendered=rendered,
                                **(tokens or {}), **(settings or {}))
    except bpt.CapError as exc:
        raise ImportRefused(cap[1], str(exc)) from exc
    except bpt.PromptError as exc:
        raise ImportRefused(where, str(exc)) from exc


def recover_ids(hidden: np.ndarray, wte: np.ndarray) -> np.ndarray:
    """Token id of each golden row that is exactly a wte row, else -1 (the image rows)."""
    rows = hidden.reshape(-1, hidden.shape[-1]).astype(np.float64)
    table = wte.astype(np.float64)
    d = (rows ** 2).sum(1)[:, None] - 2 * rows @ table.T + (table ** 2).sum(1)[None]
    best = d.argmin(1)
    exact = np.abs(rows - table[best]).max(1) <= 1e-6 * (1 + np.abs(rows).max(1))
    return np.where(exact, best, -1)


def prove(t: dict, golden_s0: dict, golden_step: dict, wte: np.ndarray, tokenizer, instructions, blocked,
          where: str, step_where: str) -> dict:
    """Which instruction the release was traced with, checked row by row."""
    ids = recover_ids(golden_s0["hidden_states"][0], wte)
    state_ids = {tokenizer.token_to_id(f"<state_{k}>") for k in range(bpt.STATE_LEVELS)}
    patch = tokenizer.token_to_id(bpt.IM_PATCH)
    bias = golden_s0["attention_bias"][0, 0]
    mask = golden_step["encoder_attention_mask"][0]
    tried = []
    for n, _ in enumerate(instructions):
        built = t["token_ids"][n].astype(np.int64)
        rows_ok = np.where(built == patch, ids == -1,
                           np.where(np.isin(built, list(state_ids)), np.isin(ids, list(state_ids)), ids == built))
        if not rows_ok.all():
            tried.append(f"{n}: first differing row {int(np.flatnonzero(~rows_ok)[0])}")
            continue
        want_bias = ref.attention_bias(t["valid"][n], t["image_block"][n], blocked)[0, 0]
        expect(np.array_equal(want_bias, bias), f"{where} attention_bias",
               f"instruction {n} matches the traced prompt but its attention bias differs at "
               f"{int((want_bias != bias).sum())} entries")
        expect(np.array_equal(t["encoder_mask"][n].astype(np.float32), mask.astype(np.float32)),
               f"{step_where} encoder_attention_mask",
               f"instruction {n} matches the traced prompt but the encoder mask differs at rows "
               f"{np.flatnonzero(t['encoder_mask'][n] != mask)[:8].tolist()} (check config.json action_mode)")
        return {"instruction": n, "text": instructions[n], "rows": int(len(ids)),
                "image_rows": int((ids == -1).sum())}
    known = ids[ids >= 0]
    text = tokenizer.decode([int(i) for i in known], skip_special_tokens=False)
    raise ImportRefused(f"{where} hidden_states",
                        f"the traced prompt is not any instruction's rendering ({'; '.join(tried)}); "
                        f"traced text: {text[:160]!r}")
