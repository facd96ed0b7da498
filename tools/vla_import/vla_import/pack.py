"""vla-import pack: Fast-WAM instruction packs, new instructions for a bundle already on the robots.

    scripts/vla-import pack --bundle BUNDLE --checkpoint DIR --instruction "wipe the table" [--instruction ...] \
        [--instructions FILE.json] [--first-id N] [--label NAME] --out PACK

A Fast-WAM bundle carries the UMT5 context rows of its fixed instructions (`fastwam.chain.tables`
`text_rows`); Wan's text encoder is far too large for the device, so a new instruction's rows are
computed here, exactly as the importer computes the bundle's (tools/vla_host/vla_host/build_umt5_rows.py's Wan path:
upstream's tokenizer cleaning and `encode_prompt`), and written with their texts into a pack:

    PACK/pack.json   the bundle it goes with (name, version, policy, target: the OTA manifest repeats
                     them), the rows' shape, and per instruction its id, the text given and the text
                     the encoder saw (upstream's cleaning)
    PACK/rows.npy    [instructions, text_tokens, context_width] in the dtype of the bundle's text_rows

Sign it as a bundle (`vlad bundle pack PACK`, `vlad bundle sign PACK --key K`) and install it beside
the bundle (`vlad ota install PACK`). Ids: bit 30 set (1 << 30 | n, n from --first-id on), so they
never collide with the bundle's fixed ids (0..) nor with instruction-segment text ids (bit 31); give
later packs of one bundle their own range with --first-id (vlad refuses a pack whose ids or texts an
attached pack already has).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from . import fastwam_chain
from .errors import ImportRefused, expect

PACK_FLAG = 1 << 30
TEXT_FLAG = 1 << 31
PACK_FILE = "pack.json"
ROWS_FILE = "rows.npy"


def arguments(argv):
    ap = argparse.ArgumentParser(prog="vla-import pack", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True, help="the Fast-WAM chain bundle the pack goes with")
    ap.add_argument("--checkpoint", type=Path, required=True,
                    help="the directory with Wan's text encoder (models_t5_umt5-xxl-enc-bf16.safetensors) and "
                    "tokenizer (google/umt5-xxl/), as for the bundle's import")
    ap.add_argument("--instruction", action="append", default=[], help="an instruction (repeatable)")
    ap.add_argument("--instructions", type=Path, help=".json list of instructions")
    ap.add_argument("--first-id", type=int, default=0, help="n of the first instruction's id 1<<30 | n (default 0)")
    ap.add_argument("--label", help="the pack's name in logs (default: the output directory's name)")
    ap.add_argument("--out", type=Path, required=True, help="the pack directory to write (must not exist)")
    return ap.parse_args(argv)


def read_bundle(bundle: Path) -> tuple:
    """The bundle's manifest and its text rows' dtype; a bundle that takes no text is refused."""
    path = bundle / "bundle.json"
    expect(path.is_file(), str(path), "expected a bundle's manifest, found none")
    manifest = json.loads(path.read_text())
    expect(manifest.get("policy") == "fastwam", f"{path} policy",
           f"expected fastwam (MolmoAct2 bundles render text on the device), found {manifest.get('policy')!r}")
    chain = (manifest.get("fastwam") or {}).get("chain")
    expect(chain is not None, f"{path} fastwam.chain",
           "expected the world-model chain (an open-loop bundle takes no instruction), found none")
    tables = bundle / chain["tables"]
    with np.load(tables) as z:
        expect("text_rows" in z.files, f"{tables}", "expected text_rows, found none")
        dtype = z["text_rows"].dtype
    expect(dtype in (np.float32, np.float16), f"{tables} text_rows", f"expected f32 or f16, found {dtype}")
    return manifest, chain, dtype


def pack_ids(first: int, n: int) -> list:
    expect(0 <= first and first + n <= PACK_FLAG, "--first-id",
           f"expected 0 <= n and n + {n} <= {PACK_FLAG} (ids 1<<30 | n), found {first}")
    return [PACK_FLAG | (first + i) for i in range(n)]


def write(a) -> dict:
    from vla_host import build_umt5_rows

    manifest, chain, dtype = read_bundle(a.bundle)
    tasks = list(a.instruction)
    if a.instructions:
        tasks += json.loads(a.instructions.read_text())
    expect(len(tasks) > 0, "--instruction", "expected at least one instruction, found none")
    cleaned = [build_umt5_rows.clean_prompt(t) for t in tasks]
    expect(all(cleaned), "--instruction", "expected text, found an instruction that cleans to nothing")
    expect(len(set(cleaned)) == len(cleaned), "--instruction", "expected distinct instructions, found a repeat "
           "(after upstream's cleaning)")
    expect(not a.out.exists(), str(a.out), "expected a new directory, found one: a pack is written whole")
    dims = {"context_width": chain["context_width"]}
    enc, tok = fastwam_chain.text_encoder(a.checkpoint, dims)
    rows, lengths = fastwam_chain.text_rows(tasks, enc, tok, chain["text_tokens"])
    rows = rows.astype(dtype)
    expect(bool(np.isfinite(rows).all()), "text rows", f"expected finite values in {dtype}, found others")
    ids = pack_ids(a.first_id, len(tasks))
    pack = {
        "format": 1,
        "kind": "instruction-pack",
        "label": a.label or a.out.name,
        "name": manifest["name"],
        "version": manifest["version"],
        "policy": manifest["policy"],
        "soc_model": manifest["soc_model"],
        "htp_arch": manifest["htp_arch"],
        "min_runtime_version": manifest["min_runtime_version"],
        "rows": ROWS_FILE,
        "text_tokens": chain["text_tokens"],
        "context_width": chain["context_width"],
        "instructions": [{"id": i, "text": t, "normalized": c, "length": int(n)}
                         for i, t, c, n in zip(ids, tasks, cleaned, lengths)],
    }
    a.out.mkdir(parents=True)
    np.save(a.out / ROWS_FILE, rows)
    (a.out / PACK_FILE).write_text(json.dumps(pack, indent=2, ensure_ascii=False) + "\n")
    return pack


def main(argv=None) -> int:
    a = arguments(argv)
    try:
        pack = write(a)
    except ImportRefused as exc:
        print(f"vla-import pack: {exc}", file=sys.stderr)
        return 1
    print(f"vla-import pack: wrote {a.out} ({len(pack['instructions'])} instructions for "
          f"{pack['name']} {pack['version']}, ids {pack['instructions'][0]['id']:#x}..; "
          "sign it with vlad bundle pack and vlad bundle sign)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
