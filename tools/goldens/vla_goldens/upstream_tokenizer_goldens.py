#!/usr/bin/env python3
"""Token ids from upstream's tokenizer for the Rust tokenizer's goldens (golden/tokenizer-qwen2/).

Upstream = `transformers.Qwen2Tokenizer.from_pretrained` (transformers 5.5.4, tokenizers 0.22.2,
the class lerobot's `_load_local_molmoact2_processor` loads) in the venv made by
scripts/setup_upstream.sh. The tokenizer's data is synthetic but shaped like Molmo2's: the 256
byte symbols, merges learned by `tokenizers`' own BPE trainer on a fixed corpus (so words,
digits, code and multi-byte scripts merge), then MolmoAct2's special tokens with their real
names and roles (as tools/goldens/vla_goldens/upstream_molmoact2.py makes them). Every id in `cases.json` is
upstream's output: `tokenizer(text)["input_ids"]`, as the processor calls it; `normalized` is
lerobot's `_normalize_question_text(text)` (loaded as tools/goldens/vla_goldens/upstream_molmoact2.py loads it).

The script also checks the rule vla-text follows: transformers 5 builds Qwen2Tokenizer's
normalizer, split and byte-level steps itself, whatever tokenizer.json says. A copy of the file
with a lowercasing normalizer and a whitespace pre-tokenizer must give the same ids.

    build/upstream-venv/bin/python -m vla_goldens.upstream_tokenizer_goldens

Deterministic: seeded generator, sorted JSON.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "golden" / "tokenizer-qwen2"

# MolmoAct2's special tokens (names and roles as in tools/goldens/vla_goldens/upstream_molmoact2.py).
SPECIAL_HEAD = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IMAGE_SPECIALS = ["<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<frame_start>", "<im_end>",
                  "<frame_end>", "<im_low>", "<|image|>", "<|video|>"]
ROBOT_SPECIALS = ["<setup_start>", "<setup_end>", "<control_start>", "<control_end>", "<state_start>",
                  "<state_end>", "<action_output>", "<action_start>", "<action_end>", "<depth_start>",
                  "<depth_end>", "<depth_output>"]
STATE_TOKENS = [f"<state_{i}>" for i in range(256)]
SPECIALS = SPECIAL_HEAD + IMAGE_SPECIALS + ROBOT_SPECIALS + STATE_TOKENS

WORDS = ("put pick place open close turn the a on in of to and bowl plate drawer cabinet basket stove mug "
         "ketchup butter cream cheese box wine bottle top black between ramekin alphabet soup inside "
         "robot arm gripper camera franka libero setup control mode state action task given what should "
         "take complete end effector delta pose left right front back red green blue yellow").split()
CODE = [
    "def f(x):\n    return x * 2  # doubled\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "fn main() { println!(\"{:?}\", vec![1, 2, 3]); }",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "if [ -f \"$x\" ]; then echo ok; fi",
    "SELECT * FROM t WHERE id = 42;",
    "x = {k: v for k, v in zip(a, b) if v is not None}",
    "#include <stdio.h>\nint main(void) { return 0; }\n",
    "let s: &str = r#\"raw\"#; // comment",
    "<div class=\"x\">&amp;&lt;b&gt;</div>",
]


def corpus() -> list[str]:
    rng = random.Random(20261206)
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 14)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        line = " ".join(words)
        if rng.random() < 0.3:
            line += rng.choice([".", "!", "?", ";", ":", "..."])
        if rng.random() < 0.2:
            line += f" {rng.randint(0, 100000)}"
        lines.append(line)
    lines += CODE * 20
    lines += ["Größe über Straße café naïve résumé", "Привет мир робот", "你好世界机器人抓取碗",
              "こんにちは世界", "안녕하세요 로봇", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
              "Ελληνικά γράμματα", "emoji 🤖🦾👍🏽"] * 30
    return lines


def build(out_dir: Path):
    from tokenizers import AddedToken, Tokenizer, Regex, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers import Qwen2Tokenizer

    split = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
             r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
    trainer_tok = Tokenizer(BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer_tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1800, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trainer_tok.train_from_iterator(corpus(), trainer)
    model = json.loads(trainer_tok.to_str())["model"]
    vocab = dict(sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    for t in SPECIALS:
        vocab[t] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token="<|endoftext|>", bos_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left")
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    for extra in ("chat_template.jinja", "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt"):
        (out_dir / extra).unlink(missing_ok=True)  # tokenizer.json carries them
    return Qwen2Tokenizer.from_pretrained(str(out_dir)), len(merges)


def cases() -> list[tuple[str, str]]:
    """(category, text). The seeded random strings at the end are named by no unit test."""
    c = []
    add = lambda cat, *texts: c.extend((cat, t) for t in texts)  # noqa: E731
    add("plain", "", "a", "Put the bowl on the plate.", "pick up the black bowl between the plate and the ramekin",
        "PUT BOTH THE CREAM CHEESE BOX IN THE BASKET", "open the   top drawer of the cabinet", "Hello, world!",
        "the task is to pick up the ketchup", "robot", " robot", "  robot", "robot ", "robot  ")
    add("contraction", "don't", "I'M here", "they'RE", "we'Ve", "it's", "'s", "''s", "'ll'd", "x'LL", "o'Neil",
        "'ſ", "'ſt", "'S'T'RE", "rock'n'roll", "’s curly", "'\u212a", "'\u0130")
    add("whitespace", " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n\n", " \n", "\n ", " \n a", "a\tb", "a \tb",
        "a\u00a0b", "a\u2003b", "a\u3000b", "a\u2028b", "a\u0085b", "\u000b\u000c", "a  \n\n  b", "x \r\n\r\n y",
        "trailing   ", "   leading", "mid    dle", "\t\tPut the wine bottle on top of the cabinet ;:",
        "line1\nline2\n", " \t \n \t ", "a\n\n b", "word\u200bjoiner", "\ufeffbom", "tab\t\t\tend\t")
    add("unicode", "Größe über Straße", "café naïve résumé", "cafe\u0301", "A\u030a", "\u1100\u1161\u11a8",
        "Привет мир", "你好世界", "机器人抓取碗", "こんにちは", "안녕하세요", "مرحبا بالعالم", "שלום עולם",
        "नमस्ते दुनिया", "Ελληνικά", "🤖🦾", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "ｆｕｌｌｗｉｄｔｈ", "𝐛𝐨𝐥𝐝",
        "ﬁﬂ", "Ⅻ chapter", "x² + y³", "½ cup", "٣ apples", "١٢٣", "ıi İI", "ǅungla", "\u0301start",
        "e\u0301\u0301", "\U0001f600" * 5, "ä" * 40, "mixed日本語and English", "ß" * 10, "Ω\u2126",
        "\u00c5\u212b", "ḍ̇", "\u0928\u093f", "tab\u00adhyphen", "a\u0000b", "\u00ff\u0100", "\U00010348 gothic")
    add("html", "&amp;", "&lt;div&gt;", "&#39;quoted&#39;", "&nbsp;&nbsp;", "<b>bold</b>",
        "<a href=\"https://x.y/?a=1&b=2\">link</a>", "&quot;Task: Turn on the stove.&quot;", "&#x1F916;",
        "Tom &amp; Jerry", "<br/>\n<br />", "<!-- comment -->", "&copy; 2026")
    add("special", "<|im_end|>", "<|im_start|>user\nhi<|im_end|>", "<im_patch>", "<im_patch><im_patch>",
        "a<im_patch>b", " <im_patch> ", "<im_patc", "<im_patch", "<<im_patch>>", "<state_12>", "<state_255><state_0>",
        "<state_256>", "<state_-1>", "<|image|>", "Image 1<|image|>Image 2<|image|>", "<im_start><im_end>",
        "<setup_start>single franka<setup_end>", "<action_start>x<action_end>", "<|endoftext|>tail",
        "<|IM_END|>", "< |im_end| >", "<|im_end|><|im_end|>", "text<|im_end|>\n<|im_start|>assistant\n<action_output>",
        "<depth_output>", "<|video|>?", "<state_start><state_0><state_0><state_end>")
    add("digits", "0", "12345", "3.14159", "1,000,000", "-42", "1e-9", "2026-12-06", "v1.2.3", "0x1F",
        "9" * 100, "12 34  56", "a1b2c3", "1st 2nd 3rd", "+33 1 23 45 67 89", "100%", "$4.99")
    add("code", *CODE, "a==b!=c<=d>=e", "x->y=>z", "::std::vec", "__init__", "#!/bin/sh", "`backticks`",
        "/* block */", "'single' \"double\"", "([{}])", "...", "?!?!", "----", "____", "~~~", "@decorator",
        "path/to/file.rs:12:5", "C:\\Windows\\path", "user@example.com", "https://example.com/a?b=c#d")
    add("punct", "Put the bowl on the plate...", "What?!", "\"quoted\"", "'single'", "(parens)", "[brackets]",
        "Goal: (put the mug on the plate)", "a;b;c", "“smart” ‘quotes’", "—dash–", "…", "¿Qué?", "¡Hola!")
    rng = random.Random(37)
    add("long", "word " * 800, "x" * 5000, "Put the bowl on the plate. " * 150, "🤖" * 600,
        "".join(rng.choice("ab ") for _ in range(4000)), "1234567890" * 300, "\n" * 500, " " * 700 + "end",
        "<im_patch>" * 400)
    pool = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n\r.,;:!?'\"()[]{}<>-_/\\&#@$%*+="
            "äöüßéèçñåøæœ日本語中文한국어Русскийعربيעבריתहिन्दीΕλληνικά🤖👍🏽½²Ⅻ٣\u00a0\u2003\u3000\u0301\u200d'ſ")
    specials = ["<|im_end|>", "<im_patch>", "<state_7>", "<|image|>", "<im_col>"]
    for _ in range(160):
        n = rng.randint(1, 60)
        parts = [rng.choice(pool) for _ in range(n)]
        if rng.random() < 0.25:
            parts.insert(rng.randint(0, len(parts)), rng.choice(specials))
        if rng.random() < 0.4:
            parts.insert(rng.randint(0, len(parts)), " " + rng.choice(WORDS))
        c.append(("random", "".join(parts)))
    return c


def main():
    from vla_goldens.upstream_molmoact2 import load_hf_package, load_lerobot_processor

    load_hf_package()  # the processor module imports the vendored HF package
    normalize = load_lerobot_processor()._normalize_question_text
    tok, n_merges = build(OUT)
    rows = [{"category": cat, "text": text, "ids": tok(text)["input_ids"], "normalized": normalize(text)}
            for cat, text in cases()]
    # The rule the Rust tokenizer follows: the file's normalizer and pre-tokenizer are not used.
    data = json.loads((OUT / "tokenizer.json").read_text())
    data["normalizer"] = {"type": "Lowercase"}
    data["pre_tokenizer"] = {"type": "Whitespace"}
    from transformers import Qwen2Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tokenizer.json").write_text(json.dumps(data))
        (Path(tmp) / "tokenizer_config.json").write_text((OUT / "tokenizer_config.json").read_text())
        tampered = Qwen2Tokenizer.from_pretrained(tmp)
        differ = [r["text"] for r in rows if tampered(r["text"])["input_ids"] != r["ids"]]
    if differ:
        raise SystemExit(f"transformers used the file's normalizer/pre-tokenizer for {len(differ)} strings")
    import tokenizers
    import transformers

    manifest = {
        "producer": "ids: transformers.Qwen2Tokenizer.from_pretrained(dir)(text)['input_ids']; normalized: "
                    "lerobot 0.6.1 processor_molmoact2._normalize_question_text(text)",
        "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "python": sys.version.split()[0]},
        "merges": n_merges,
        "file_pipeline_ignored": "a copy with normalizer Lowercase and pre_tokenizer Whitespace gave the same "
                                 f"ids for all {len(rows)} strings",
        "effective_pipeline": {"normalizer": str(tok.backend_tokenizer.normalizer),
                               "pre_tokenizer": str(tok.backend_tokenizer.pre_tokenizer),
                               "post_processor": str(tok.backend_tokenizer.post_processor)},
        "cases": rows,
    }
    (OUT / "cases.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=0, sort_keys=True) + "\n")
    print(f"{OUT}: {len(rows)} strings, {n_merges} merges")


if __name__ == "__main__":
    main()
