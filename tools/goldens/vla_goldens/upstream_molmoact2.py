#!/usr/bin/env python3
"""Runs the real upstream MolmoAct2 host-side code and writes small goldens to golden/upstream/.

Upstream = the pinned PyPI wheel lerobot==0.6.1 (lerobot/policies/molmoact2/, incl. the vendored
Hugging Face remote code molmoact2_hf_model/) and KeyStone's selection.py (github dywsjtu/keystone,
passed with --keystone-src; not on PyPI, never copied here). Nothing in this file re-implements
the upstream math: every golden array is the output of an upstream function, called on inputs
made here from seeded generators. Where this script derives something from an upstream output
(e.g. the positions of <im_patch> in upstream input_ids) manifest.json says so.

Run it in the separate venv made by scripts/setup_upstream.sh (CPython 3.11, torch CPU use):

    scripts/setup_upstream.sh
    build/upstream-venv/bin/python -m vla_goldens.upstream_molmoact2 --keystone-src DIR

Deterministic: fixed seeds, single-threaded torch, npz written by tools/vla_host/vla_host/det_npz.py.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
from vla_host.det_npz import save_npz

torch.set_num_threads(1)

HF_PKG = "lerobot_molmoact2_hf"  # alias under which the vendored HF package is imported
LR_PROC = "lerobot_molmoact2_processor"

# ----------------------------------------------------------------------------------------------
# Loading the upstream modules
# ----------------------------------------------------------------------------------------------


def molmoact2_dir() -> Path:
    spec = importlib.util.find_spec("lerobot")  # does not execute lerobot/__init__.py
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("lerobot (0.6.1 wheel) is not installed in this interpreter")
    return Path(list(spec.submodule_search_locations)[0]) / "policies" / "molmoact2"


def load_hf_package():
    """Imports lerobot/policies/molmoact2/molmoact2_hf_model as a package of its own.

    lerobot/policies/__init__.py imports the whole lerobot stack (draccus, ... and
    lerobot/utils/io_utils.py, which uses PEP 695 `def f[T: ...]` syntax that CPython 3.11 cannot
    compile). The vendored HF modules only import transformers/torch/numpy and each other
    (relative imports), so they are loaded from their files unchanged under an alias.
    """
    pkg_dir = molmoact2_dir() / "molmoact2_hf_model"
    spec = importlib.util.spec_from_file_location(
        HF_PKG, pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)]
    )
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[HF_PKG] = pkg
    spec.loader.exec_module(pkg)
    proc = importlib.import_module(f"{HF_PKG}.processing_molmoact2")
    img = importlib.import_module(f"{HF_PKG}.image_processing_molmoact2")
    vid = importlib.import_module(f"{HF_PKG}.video_processing_molmoact2")
    mdl = importlib.import_module(f"{HF_PKG}.modeling_molmoact2")
    return proc, img, vid, mdl


class _Anything:
    """Placeholder for the lerobot names processor_molmoact2.py imports at module level.

    Only the module's pure functions (_normalize_question_text, _build_robot_text,
    _build_discrete_state_string) are called; they use none of these names. Decorators
    (ProcessorStepRegistry.register(...)) return the class unchanged; base classes are empty.
    """

    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        return _Anything()

    def __call__(self, *a, **k):
        if len(a) == 1 and isinstance(a[0], type) and not k:
            return a[0]
        return lambda cls: cls

    def __mro_entries__(self, bases):
        return (object,)


def load_lerobot_processor():
    """Loads lerobot/policies/molmoact2/processor_molmoact2.py unchanged, with stub modules for
    the lerobot package imports it does at top level (see _Anything), and its relative imports
    (.configuration_molmoact2, .modeling_molmoact2) stubbed the same way. Returns None if that
    fails; the HF copies of the same functions are then the only ones run."""
    path = molmoact2_dir() / "processor_molmoact2.py"
    stub_names = [
        "lerobot.configs",
        "lerobot.lerobot_types",
        "lerobot.processor",
        "lerobot.utils.constants",
        "lerobot.utils.import_utils",
        f"{LR_PROC}_pkg.configuration_molmoact2",
        f"{LR_PROC}_pkg.modeling_molmoact2",
    ]
    saved = {n: sys.modules.get(n) for n in ["lerobot", "lerobot.utils", *stub_names]}
    try:
        for name in ["lerobot", "lerobot.utils", *stub_names]:
            mod = types.ModuleType(name)
            mod.__getattr__ = lambda attr: _Anything()  # type: ignore[attr-defined]
            mod.__path__ = []  # type: ignore[attr-defined]
            sys.modules[name] = mod
        sys.modules["lerobot.utils.import_utils"]._transformers_available = True
        sys.modules["lerobot.utils.import_utils"]._scipy_available = False
        sys.modules["lerobot.utils.import_utils"].require_package = lambda *a, **k: None
        pkg = types.ModuleType(f"{LR_PROC}_pkg")
        pkg.__path__ = [str(path.parent)]
        sys.modules[f"{LR_PROC}_pkg"] = pkg
        # its `from .molmoact2_hf_model.x import ...` must resolve to the already-loaded HF package
        for sub in ("image_processing_molmoact2", "processing_molmoact2", "video_processing_molmoact2"):
            sys.modules[f"{LR_PROC}_pkg.molmoact2_hf_model.{sub}"] = sys.modules[f"{HF_PKG}.{sub}"]
        sys.modules[f"{LR_PROC}_pkg.molmoact2_hf_model"] = sys.modules[HF_PKG]
        spec = importlib.util.spec_from_file_location(f"{LR_PROC}_pkg.processor_molmoact2", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look the module up while the class is built
        spec.loader.exec_module(mod)
        return mod
    except Exception as exc:  # pragma: no cover - reported in the manifest
        print(f"note: lerobot processor_molmoact2.py not loadable here: {type(exc).__name__}: {exc}")
        return None
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def load_keystone(src: Path):
    """Imports keystone.selection from a checkout of github dywsjtu/keystone (src/keystone/)."""
    pkg_dir = src / "src" / "keystone" if (src / "src" / "keystone").is_dir() else src
    if not (pkg_dir / "selection.py").is_file():
        raise SystemExit(f"--keystone-src: no selection.py under {src}")
    pkg = types.ModuleType("keystone")
    pkg.__path__ = [str(pkg_dir)]  # skip keystone/__init__.py (wrapper imports); selection needs .config only
    sys.modules["keystone"] = pkg
    return importlib.import_module("keystone.selection"), pkg_dir


# ----------------------------------------------------------------------------------------------
# Synthetic tokenizer with the real special tokens
# ----------------------------------------------------------------------------------------------

SPECIAL_HEAD = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IMAGE_SPECIALS = [
    "<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<frame_start>", "<im_end>",
    "<frame_end>", "<im_low>", "<|image|>", "<|video|>",
]
ROBOT_SPECIALS = [
    "<setup_start>", "<setup_end>", "<control_start>", "<control_end>", "<state_start>",
    "<state_end>", "<action_output>", "<action_start>", "<action_end>", "<depth_start>",
    "<depth_end>", "<depth_output>",
]
STATE_TOKENS = [f"<state_{i}>" for i in range(256)]

CORPUS = [
    "The task is to", "The setup is", "The current state of the robot is",
    "The expected control mode is", "Given these, what action should the robot take to complete the task?",
    "Image 1", "Image 2", "user", "assistant", "put the bowl on the plate", "open the top drawer of the cabinet",
    "put the alphabet soup in the basket", "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "turn on the stove", "put both the cream cheese box and the butter in the basket",
    "single franka arm with a wrist camera", "end effector delta pose and gripper",
]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / Qwen2 byte-level alphabet (the published table, needed to spell a byte-level vocab)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def learn_merges(num_merges: int) -> list[tuple[str, str]]:
    """A tiny deterministic BPE learner over CORPUS (ties broken lexicographically), so the
    synthetic vocabulary has multi-byte words like a real one. Not upstream code: it only makes
    the tokenizer's data."""
    b2u = bytes_to_unicode()
    words: dict[tuple[str, ...], int] = {}
    for line in CORPUS:
        for i, w in enumerate(line.split(" ")):
            w = (" " if i else "") + w
            key = tuple(b2u[b] for b in w.encode("utf-8"))
            words[key] = words.get(key, 0) + 1
    merges = []
    for _ in range(num_merges):
        pairs: dict[tuple[str, str], int] = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        new_words = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    return merges


def build_tokenizer(out_dir: Path):
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    b2u = bytes_to_unicode()
    vocab: dict[str, int] = {}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    merges = learn_merges(160)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    for tok in SPECIAL_HEAD + IMAGE_SPECIALS + ROBOT_SPECIALS + STATE_TOKENS:
        vocab[tok] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=list(merges),
        unk_token="<|endoftext|>",
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
    )
    tok.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_HEAD + IMAGE_SPECIALS + ROBOT_SPECIALS + STATE_TOKENS]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    for extra in ("chat_template.jinja", "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt"):
        p = out_dir / extra
        if p.exists() and extra in ("vocab.json", "merges.txt", "added_tokens.json"):
            p.unlink()  # tokenizer.json carries them; keep the committed set tiny
    # Qwen2Tokenizer.from_pretrained is how lerobot's _load_local_molmoact2_processor loads it.
    loaded = Qwen2Tokenizer.from_pretrained(str(out_dir))
    for t in SPECIAL_HEAD + IMAGE_SPECIALS + ROBOT_SPECIALS + STATE_TOKENS:
        ids = loaded.encode(t, add_special_tokens=False)
        assert ids == [vocab[t]], (t, ids, vocab[t])
    assert loaded.eos_token == "<|im_end|>" and loaded.pad_token == "<|endoftext|>" and loaded.bos_token is None
    return loaded


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------

INSTRUCTIONS = [
    "Put the bowl on the plate.",
    "open the   top drawer of the cabinet",
    "Put the Alphabet Soup in the basket!",
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    '"Task: Turn on the stove."',
    "  instruction - PUT both the cream cheese box and the butter in the basket...  ",
    "Open the drawer. Put the bowl inside! Close it?",
    "'the task is to pick up the ketchup and place it in the basket'",
    "Goal: (put the mug on the plate)",
    "\tPut the wine bottle on top of the cabinet ;:",
]
# The real strings come from the checkpoint's norm_stats.json metadata_by_tag[tag]["setup_type"/
# "control_mode"]; these placeholders only exercise the wrapping.
SETUP_TYPE = "single franka arm with a wrist camera"
CONTROL_MODE = "end effector delta pose and gripper"


def state_cases(rng):
    """8-dim state stats with edge cases and states that hit them."""
    q01 = np.array([-0.25, -0.3, 0.8, 2.9, -0.6, 0.5, 0.0, -0.04], np.float32)
    q99 = np.array([0.2, 0.35, 1.3, 3.3, 0.5, 0.5, 1e-7, 0.0], np.float32)  # dim5 q01==q99, dim6 tiny
    smin = q01 - 0.05
    smax = q99 + 0.05
    smin[5] = smax[5] = 0.5  # dim 5 constant in the data: min == max
    mask = np.array([True] * 7 + [False])  # dim 7 = gripper passthrough (normalize_gripper False)
    mean = ((q01 + q99) / 2).astype(np.float32)
    std = np.array([0.1, 0.12, 0.1, 0.08, 0.2, 0.0, 1e-8, 0.01], np.float32)
    states = [rng.uniform(q01, q99).astype(np.float32) for _ in range(4)]
    s = rng.uniform(q01, q99).astype(np.float32)
    s[0], s[1], s[2] = q01[0] - 1.0, q99[1] + 1.0, q01[2]
    states.append(s)
    s = rng.uniform(q01, q99).astype(np.float32)
    s[3], s[4], s[7] = np.nan, np.inf, np.nan
    states.append(s)
    s = rng.uniform(q01, q99).astype(np.float32)
    s[5], s[6] = 0.7, 5e-8
    states.append(s)
    s = rng.uniform(q01, q99).astype(np.float32)
    s[7] = 0.9  # gripper in [-1, 1]: passes through raw
    s[6] = -np.inf
    states.append(s)
    return dict(q01=q01, q99=q99, min=smin, max=smax, mean=mean, std=std, mask=mask), np.stack(states)


# ----------------------------------------------------------------------------------------------
# Goldens
# ----------------------------------------------------------------------------------------------


class StubModel:
    """`self` for MolmoAct2Model methods that only read self.config (no weights exist here)."""

    def __init__(self, mdl, cfg):
        self.config = types.SimpleNamespace(**cfg)
        self._mask_discrete_output_span = mdl.MolmoAct2Model._mask_discrete_output_span


def make_processor(proc_mod, img_mod, vid_mod, tokenizer, crop, col_tokens):
    image_processor = img_mod.MolmoAct2ImageProcessor(
        size={"height": crop, "width": crop},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        crop_mode="resize",
        max_crops=1,
        patch_size=14,
        pooling_size=[2, 2],
    )
    video_processor = vid_mod.MolmoAct2VideoProcessor()
    return proc_mod.MolmoAct2Processor(
        image_processor=image_processor,
        video_processor=video_processor,
        tokenizer=tokenizer,
        chat_template=None,
        image_use_col_tokens=col_tokens,
        use_single_crop_col_tokens=None,
        use_single_crop_start_token=True,
        video_use_col_tokens=False,
        use_frame_special_tokens=True,
    )


def pad_rows(rows, fill):
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), fill, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def render_prompts(mods, tokenizer, crop, col_tokens, frames, state_ids_by_instr, lr_proc, tag, manifest):
    proc_mod, img_mod, vid_mod, mdl = mods
    processor = make_processor(proc_mod, img_mod, vid_mod, tokenizer, crop, col_tokens)
    tasks, prompts = [], []
    for i, raw in enumerate(INSTRUCTIONS):
        task = mdl._normalize_question_text(raw)
        state_string = mdl._build_discrete_state_string(state_ids_by_instr[i], 256)
        prompt = mdl._build_robot_text(
            task=task, style="robot_action", discrete_state_string=state_string,
            setup_type=SETUP_TYPE, control_mode=CONTROL_MODE,
            add_setup_tokens=True, add_control_tokens=True, num_images=len(frames),
        )
        if lr_proc is not None:  # lerobot's own copies must agree with the HF ones
            assert lr_proc._normalize_question_text(raw) == task, raw
            assert lr_proc._build_discrete_state_string(state_ids_by_instr[i], 256) == state_string
            lr_prompt = lr_proc._build_robot_text(
                task=task, discrete_state_string=state_string, setup_type=SETUP_TYPE,
                control_mode=CONTROL_MODE, add_setup_tokens=True, add_control_tokens=True,
                num_images=len(frames),
            )
            assert lr_prompt == prompt
        tasks.append(task)
        prompts.append(prompt)

    # single instruction, as HF predict_action and lerobot select_action (batch 1) call it
    singles = [processor(text=p, images=list(frames), return_tensors="np") for p in prompts]
    ids = [s["input_ids"][0] for s in singles]
    out = {
        "input_ids": pad_rows(ids, -1),
        "lengths": np.array([len(r) for r in ids], np.int64),
        "attention_mask": pad_rows([s["attention_mask"][0] for s in singles], -1),
        "token_type_ids": pad_rows([s["token_type_ids"][0].astype(np.int64) for s in singles], -1),
    }
    patch_id = tokenizer.convert_tokens_to_ids("<im_patch>")
    out["im_patch_positions"] = pad_rows([np.nonzero(r == patch_id)[0] for r in ids], -1)
    # batched, padding=True, exactly as lerobot MolmoAct2PackInputsProcessorStep.__call__ calls it
    flat = [f for _ in prompts for f in frames]
    batch = processor(text=prompts, images=flat, return_tensors="np", padding=True)
    out["batch_input_ids"] = np.asarray(batch["input_ids"], np.int64)
    out["batch_attention_mask"] = np.asarray(batch["attention_mask"], np.int64)
    out["batch_token_type_ids"] = np.asarray(batch["token_type_ids"], np.int64)
    ids_t = torch.as_tensor(out["batch_input_ids"])
    am_t = torch.as_tensor(out["batch_attention_mask"])
    eos = tokenizer.eos_token_id
    for mode in ("continuous", "discrete", "both"):
        stub = StubModel(mdl, dict(
            action_mode=mode, eos_token_id=eos,
            action_start_token_id=tokenizer.convert_tokens_to_ids("<action_start>"),
            action_end_token_id=tokenizer.convert_tokens_to_ids("<action_end>"),
        ))
        enc = mdl.MolmoAct2Model._get_encoder_attention_mask(stub, ids_t, am_t)
        out[f"batch_encoder_mask_{mode}"] = enc.numpy().astype(np.uint8)
    if crop <= 56:
        bias = mdl.MolmoAct2Model._build_native_attention_bias(
            None,
            inputs_embeds=torch.zeros(ids_t.shape[0], ids_t.shape[1], 1, dtype=torch.float32),
            attention_mask=am_t,
            token_type_ids=torch.as_tensor(out["batch_token_type_ids"]),
            past_key_values=None,
        )
        out["batch_attention_allowed"] = (bias[:, 0] == 0).numpy().astype(np.uint8)
        out["batch_attention_blocked_value"] = np.array(bias.min().item(), np.float32)
    out["image_grids"] = np.asarray(singles[0]["image_grids"], np.int64)
    out["image_token_pooling"] = np.asarray(singles[0]["image_token_pooling"], np.int64)
    out["image_num_crops"] = np.asarray(singles[0]["image_num_crops"], np.int64)
    manifest["prompts"][tag] = {
        "crop": crop, "image_use_col_tokens": col_tokens,
        "tasks": tasks, "prompt_text": prompts,
        "rendered": [tokenizer.decode(r, skip_special_tokens=False) for r in ids],
        "frame_shapes": [list(f.shape) for f in frames],
    }
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keystone-src", type=Path, required=True, help="checkout of github dywsjtu/keystone")
    ap.add_argument("--out", type=Path, default=ROOT / "golden" / "upstream")
    args = ap.parse_args()

    import torchvision
    import transformers

    mods = load_hf_package()
    proc_mod, img_mod, vid_mod, mdl = mods
    lr_proc = load_lerobot_processor()
    selection, ks_dir = load_keystone(args.keystone_src)
    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir / "tokenizer")

    import lerobot  # noqa: F401  (only for the version; lerobot/__init__ is light)

    manifest = {
        "upstream": {
            "lerobot": "0.6.1 (PyPI wheel, lerobot/policies/molmoact2/)",
            "keystone": str(ks_dir.relative_to(args.keystone_src)) + "/selection.py",
            "lerobot_processor_molmoact2_loaded": lr_proc is not None,
        },
        "versions": {
            "python": sys.version.split()[0], "torch": torch.__version__,
            "torchvision": torchvision.__version__, "transformers": transformers.__version__,
            "numpy": np.__version__,
        },
        "setup_type": SETUP_TYPE, "control_mode": CONTROL_MODE,
        "instructions": INSTRUCTIONS,
        "token_ids": {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_HEAD + IMAGE_SPECIALS + ROBOT_SPECIALS},
        "state_token_base": tokenizer.convert_tokens_to_ids("<state_0>"),
        "bos_token_id_used": tokenizer.bos_token_id or tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "prompts": {},
    }

    # ---- state ----------------------------------------------------------------------------
    rng = np.random.default_rng(1201)
    stats, states = state_cases(rng)
    st = {"states": states}
    for k, v in stats.items():
        st[f"stats_{k}"] = v
    for mode in ("q01_q99", "min_max", "mean_std"):
        norm = mdl._FeatureNormalizer.from_stats(
            {"q01": stats["q01"], "q99": stats["q99"], "min": stats["min"], "max": stats["max"],
             "mean": stats["mean"], "std": stats["std"], "mask": stats["mask"]}, mode)
        normed = np.stack([np.asarray(norm.normalize(s), np.float32) for s in states])
        st[f"normalized_{mode}"] = normed
        st[f"state_bins_{mode}"] = np.stack([mdl._discretize_normalized_state(n, 256) for n in normed])
        st[f"state_token_ids_{mode}"] = np.stack([
            np.asarray(tokenizer.encode(mdl._build_discrete_state_string(n, 256), add_special_tokens=False))
            for n in normed
        ])
    save_npz(out_dir / "state.npz", st)

    # ---- images ---------------------------------------------------------------------------
    rng = np.random.default_rng(1202)
    frame_sets = {
        "48x64": [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(2)],
        "37x53": [rng.integers(0, 256, (37, 53, 3), dtype=np.uint8) for _ in range(2)],
        "96x128": [rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for _ in range(2)],
    }
    im = {}
    for name, frames in frame_sets.items():
        ip = img_mod.MolmoAct2ImageProcessor(
            size={"height": 56, "width": 56}, image_mean=[0.5] * 3, image_std=[0.5] * 3,
            crop_mode="resize", max_crops=1, patch_size=14, pooling_size=[2, 2])
        res = ip(frames, return_tensors="np")
        im[f"frames_{name}"] = np.stack(frames)
        im[f"pixel_values_{name}"] = np.asarray(res["pixel_values"], np.float32)
        im[f"image_token_pooling_{name}"] = np.asarray(res["image_token_pooling"], np.int64)
        im[f"image_grids_{name}"] = np.asarray(res["image_grids"], np.int64)
    # real crop (378) from LIBERO-sized 256x256 frames: store a few patches only (full is 3.4 MB)
    libero = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(2)]
    ip = img_mod.MolmoAct2ImageProcessor(
        size={"height": 378, "width": 378}, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        crop_mode="resize", max_crops=1, patch_size=14, pooling_size=[2, 2])
    res = ip(libero, return_tensors="np")
    sel = np.array([0, 1, 26, 27, 364, 700, 727, 728], np.int64)
    pv = np.asarray(res["pixel_values"], np.float32)
    im["frames_256x256"] = np.stack(libero)
    im["pixel_values_378_selected"] = pv[:, sel]
    im["pixel_values_378_selected_index"] = sel
    im["pixel_values_378_shape"] = np.array(pv.shape, np.int64)
    im["image_token_pooling_378"] = np.asarray(res["image_token_pooling"], np.int64)
    im["image_grids_378"] = np.asarray(res["image_grids"], np.int64)
    # the resize alone (upstream image_processing_molmoact2.resize_image), float [0,1] output
    im["resize_image_48x64_to_56"] = np.stack([
        img_mod.resize_image(f, [56, 56], img_mod.PILImageResampling.BILINEAR) for f in frame_sets["48x64"]
    ]).astype(np.float32)
    save_npz(out_dir / "images.npz", im)

    # ---- prompts --------------------------------------------------------------------------
    state_norm = st["normalized_q01_q99"]
    per_instr_state = [state_norm[i % len(state_norm)] for i in range(len(INSTRUCTIONS))]
    pf = render_prompts(mods, tokenizer, 56, False, frame_sets["48x64"], per_instr_state, lr_proc, "fixture_crop56_nocol", manifest)
    pf.update({f"col_{k}": v for k, v in render_prompts(
        mods, tokenizer, 56, True, frame_sets["48x64"], per_instr_state, lr_proc, "fixture_crop56_col", manifest).items()
        if k in ("input_ids", "lengths", "token_type_ids", "im_patch_positions")})
    save_npz(out_dir / "prompts_fixture.npz", pf)
    pr = {}
    for col in (False, True):
        r = render_prompts(mods, tokenizer, 378, col, libero, per_instr_state, lr_proc,
                           f"real_crop378_{'col' if col else 'nocol'}", manifest)
        pre = "col_" if col else ""
        for k in ("input_ids", "lengths", "token_type_ids", "im_patch_positions", "batch_attention_mask",
                  "batch_encoder_mask_both", "image_grids"):
            pr[pre + k] = r[k]
    save_npz(out_dir / "prompts_real.npz", pr)

    # ---- actions --------------------------------------------------------------------------
    rng = np.random.default_rng(1203)
    traj = rng.uniform(-1.3, 1.3, (4, 10, 7)).astype(np.float32)
    traj[0, 0, :] = [-1.0, 1.0, 0.0, 1.5, -1.5, 1.0000001, -2.0]
    traj[1, :, 6] = rng.choice([-1.2, -1.0, 1.0, 1.2], 10).astype(np.float32)  # gripper out of range
    a_low = np.array([-0.9, -0.85, -0.95, -0.1, -0.15, -0.2, -1.0], np.float32)
    a_high = np.array([0.93, 0.88, 0.94, 0.12, 0.16, 0.21, 1.0], np.float32)
    a_mask = np.array([True] * 6 + [False])
    a_mean = ((a_low + a_high) / 2).astype(np.float32)
    a_std = np.array([0.3, 0.3, 0.3, 0.05, 0.05, 0.07, 1.0], np.float32)
    ac = {"normalized": traj, "q01": a_low, "q99": a_high, "min": a_low - 0.1, "max": a_high + 0.1,
          "mean": a_mean, "std": a_std, "mask": a_mask}
    for mode in ("q01_q99", "min_max", "mean_std"):
        norm = mdl._FeatureNormalizer.from_stats(
            {"q01": a_low, "q99": a_high, "min": ac["min"], "max": ac["max"], "mean": a_mean,
             "std": a_std, "mask": a_mask}, mode)
        ac[f"denormalized_{mode}"] = np.asarray(norm.unnormalize(traj), np.float32)
        ac[f"denormalized_{mode}_torch"] = norm.unnormalize(torch.as_tensor(traj)).numpy()
    save_npz(out_dir / "actions.npz", ac)

    # ---- KeyStone -------------------------------------------------------------------------
    ks = keystone_cases(selection)
    save_npz(out_dir / "keystone.npz", ks)

    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    for p in sorted(out_dir.rglob("*")):
        if p.is_file():
            print(f"{p.relative_to(ROOT)}  {p.stat().st_size} B")


def keystone_cases(selection):
    """Candidate sets [K, T=10, D=32] (7 real dims) for the guarded medoid (tau 0.3, C=2, l2)."""
    rng = np.random.default_rng(1204)
    T, D, AD = 10, 32, 7
    sets = []

    def cand(center, k, scale):
        x = np.zeros((k, T, D), np.float32)
        x[:, :, :AD] = center[None] + rng.normal(0, scale, (k, T, AD))
        x[:, :, AD:] = rng.normal(0, 5.0, (k, T, D - AD))  # padded dims: must be ignored
        return x.astype(np.float32)

    base = rng.uniform(-0.5, 0.5, (T, AD))
    sets.append(cand(base, 5, 0.05))                                            # unimodal K=5
    sets.append(np.concatenate([cand(base, 3, 0.05), cand(base + 0.6, 2, 0.05)]))  # 3+2 modes K=5
    sets.append(np.concatenate([cand(base + 0.6, 2, 0.05), cand(base, 3, 0.05)]))  # 2+3, first two same mode
    sets.append(np.concatenate([cand(base, 2, 0.05), cand(base + 0.6, 2, 0.05)]))  # K=4 tie 2+2
    sets.append(cand(base, 6, 0.1))                                             # K=6 unimodal
    sets.append(np.concatenate([cand(base, 4, 0.05), cand(base - 0.5, 4, 0.05)]))  # K=8
    sets.append(np.concatenate([cand(base, 10, 0.05), cand(base + 0.4, 6, 0.05)]))  # K=16
    sets.append(np.concatenate([cand(base, 2, 0.02), cand(base + 0.3, 2, 0.02), cand(base - 0.3, 1, 0.02)]))
    # random K=5 sets until a few have spread between the lower-median and the mean-of-middle
    # median versions of the guard (so the median convention decides the pick); spread is recomputed
    # here with torch only to choose such sets — the recorded pick is upstream's.
    found = 0
    for _ in range(4000):
        if found >= 2:
            break
        x = np.zeros((5, T, D), np.float32)
        k_modes = rng.normal(0, 1, (5, 1, 1)) * rng.uniform(0.1, 1.0)
        x[:, :, :AD] = base[None] + k_modes * rng.normal(0, 0.3, (1, T, AD)) + rng.normal(0, 0.1, (5, T, AD))
        x[:, :, AD:] = rng.normal(0, 5.0, (5, T, D - AD))
        flat = torch.as_tensor(x[:, :, :AD].reshape(5, -1))
        d = torch.cdist(flat, flat)
        med = d.sum(-1).argmin()
        gap = (flat.mean(0) - flat[med]).norm()
        iu, ju = torch.triu_indices(5, 5, 1)
        v = d[iu, ju].sort().values
        lo, avg = gap / (v[4] + 1e-8), gap / ((v[4] + v[5]) / 2 + 1e-8)
        if (lo > 0.3) != (avg > 0.3):
            plain = selection._medoid_aggregation(torch.as_tensor(x)[:, None], "l2", AD)
            clus = selection._cluster_medoid_aggregation(torch.as_tensor(x)[:, None], "l2", AD, 2)
            if not torch.equal(plain, clus):
                sets.append(x)
                found += 1
    kmax = max(s.shape[0] for s in sets)
    cands = np.zeros((len(sets), kmax, T, D), np.float32)
    ks = np.zeros(len(sets), np.int64)
    picks = {"guarded": [], "medoid": [], "cluster": []}
    for i, s in enumerate(sets):
        cands[i, : s.shape[0]] = s
        ks[i] = s.shape[0]
        a = torch.as_tensor(s)[:, None]  # (K, B=1, T, D)
        outs = {
            "guarded": selection._cluster_medoid_guarded_aggregation(a, "l2", AD, 2, 0.3),
            "medoid": selection._medoid_aggregation(a, "l2", AD),
            "cluster": selection._cluster_medoid_aggregation(a, "l2", AD, 2),
        }
        for name, o in outs.items():
            idx = [j for j in range(s.shape[0]) if torch.equal(a[j], o)]
            assert len(idx) == 1, (i, name, idx)
            picks[name].append(idx[0])
    return {
        "candidates": cands, "k": ks, "action_dim": np.array(AD, np.int64),
        "tau": np.array(0.3, np.float32), "num_clusters": np.array(2, np.int64),
        "chosen_guarded": np.array(picks["guarded"], np.int64),
        "chosen_medoid": np.array(picks["medoid"], np.int64),
        "chosen_cluster_medoid": np.array(picks["cluster"], np.int64),
    }


if __name__ == "__main__":
    main()
