"""The per-output parity gates an imported bundle carries (`parity.contexts`, docs/bundle-format.md
"Parity gates"), and where each came from, in this order of precedence:

1. `--gate CONTEXT[.OUTPUT]=COSINE` with its `--gate-reason TEXT`;
2. the published release's card, by the release's name (PUBLISHED: the table of
   docs/bundle-format.md "Published releases and their gates");
3. figures the release states in a machine-readable file (`golden/trace.json`,
   `convert_report.json`), read only where they have a `parity` object or list in the shape
   `stated_figures` describes: this importer's own, not a published format.

A gate only below the bundle's default is written (a figure at or above the default keeps it).
Every gate must lie in (GATE_FLOOR, 1], or (0, 1] with `--allow-low-gate` (recorded in
bundle.json as `allow_low_gate`); anything else is refused in one line naming it."""

import json
import math
import re
from pathlib import Path

from .errors import ImportRefused, expect

GATE_FLOOR = 0.99  # vla-policy manifest.rs GATE_FLOOR
ANY_OUTPUT = "*"
CARD_MARGIN = 0.0005  # a card's figure less this, rounded down to 1e-4, is its gate

# Published releases by the names the importer knows them by (a Hub repo id given as
# --release, the card's `base_model`, or --release-name) -> the card's figures below the
# default. Releases whose every figure reaches 0.9999 keep the default and are listed with
# none, so that the import says it looked. Sources: each release's model card, "Validated
# parity" (QNN CPU backend against the PyTorch fp32 golden).
_LP_VTP_SD = {
    "variant": "lp_vtp_sd",
    "card": "xpuenabler/MolmoAct2-LIBERO-LP-VTP-SD QNN release card, \"Validated parity\" and \"Note on vision\"",
    "figures": {("vision", "image_embeds"): (0.99843835, "F.grid_sample(align_corners=False, bilinear) against "
                                                        "QNN's GridSample")},
}
_DRIFT_KEYSTONE = {
    "variant": "drift_keystone",
    "card": "xpuenabler/molmoact2-drift-keystone-libero-qnn card, \"Validated parity\" (lowest: vision 0.99999361)",
    "figures": {},
}
_FUSED = {
    "variant": "operator_fused",
    "card": "xpuenabler/molmoact2-libero_grid_sampler_qnn-visfused-actstepfused card, \"Verification\" "
            "(DLC against its fused ONNX: 1.00000000)",
    "figures": {},
}
_FASTWAM = {
    "variant": "fastwam",
    "card": "Fast-WAM action expert QNN release card, \"Validated parity\" (pred_noise 1.000000)",
    "figures": {},
}
PUBLISHED = {
    "xpuenabler/MolmoAct2-LIBERO-LP-VTP-SD": _LP_VTP_SD,
    "xpuenabler/molmoact2-drift-keystone-libero-qnn": _DRIFT_KEYSTONE,
    "xpuenabler/MolmoAct2-LIBERO-Drift-Keystone": _DRIFT_KEYSTONE,
    "xpuenabler/molmoact2-libero_grid_sampler_qnn-visfused-actstepfused": _FUSED,
    "ZibinDong/fastwam_libero_uncond_2cam224": _FASTWAM,
}

_GATE = re.compile(r"^(?P<context>[a-z0-9_]+)(\.(?P<output>[A-Za-z0-9_]+|\*))?=(?P<cosine>.*)$")


def card_gate(figure: float) -> float:
    return math.floor((figure - CARD_MARGIN) * 1e4) / 1e4


def parse(specs: list, reasons: list) -> list:
    """`--gate` values with their `--gate-reason`s -> [(context, output, cosine, reason)]:
    one reason for every gate, or one per gate in order."""
    if not specs:
        expect(not reasons, "--gate-reason", "given without a --gate")
        return []
    expect(len(reasons) in (1, len(specs)), "--gate-reason",
           f"expected one reason, or one per --gate ({len(specs)}), found {len(reasons)}")
    out = []
    for i, spec in enumerate(specs):
        m = _GATE.match(spec)
        expect(m is not None, f"--gate {spec}", "expected CONTEXT[.OUTPUT]=COSINE")
        try:
            cosine = float(m["cosine"])
        except ValueError:
            raise ImportRefused(f"--gate {spec}", f"{m['cosine']!r} is not a number") from None
        reason = reasons[0] if len(reasons) == 1 else reasons[i]
        expect(reason.strip() != "", "--gate-reason", "is empty: say why this output has its own gate")
        out.append((m["context"], m["output"] or ANY_OUTPUT, cosine, reason))
    return out


def front_matter(readme: Path) -> dict:
    """The `key: value` lines of a model card's YAML front matter (base_model is one line)."""
    if not readme.is_file():
        return {}
    text = readme.read_text(errors="replace")
    if not text.startswith("---"):
        return {}
    block = text[3:].split("\n---", 1)[0]
    return {k.strip(): v.strip() for k, sep, v in (ln.partition(":") for ln in block.splitlines()) if sep}


def release_names(release: str, rel_dir: Path, explicit: str | None) -> list:
    names = [explicit] if explicit else []
    if not Path(release).exists():
        names.append(release)  # a Hub repo id
    base = front_matter(rel_dir / "README.md").get("base_model")
    if base:
        names.append(base)
    return names


def _stated_rows(parity) -> list | None:
    """[(context, output, cosine)] of a `parity` value in the shape this importer reads, else None."""
    if isinstance(parity, dict) and all(isinstance(outs, dict) for outs in parity.values()):
        rows = [(c, o, v) for c, outs in parity.items() for o, v in outs.items()]
    elif isinstance(parity, list) and all(isinstance(r, dict) for r in parity):
        rows = [(r.get("context", r.get("component")), r.get("output"), r.get("cosine")) for r in parity]
    else:
        return None
    ok = all(isinstance(c, str) and isinstance(o, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
             for c, o, v in rows)
    return rows if ok else None


def stated_figures(rel_dir: Path, comps: dict) -> tuple:
    """(figures, notes): the (context, output, cosine, file) a release states machine-readably
    in a `parity` object {context: {output: cosine}} or list [{context|component, output,
    cosine}] of golden/trace.json or convert_report.json (top level or golden/), and one note
    per file that has a `parity` key, used or not.

    That shape is this importer's own: the releases' files could not be read here and their
    cards do not state what trace.json holds (shared release notes). So a `parity` in any
    other shape, or naming a context or output the release lacks, is taken for something else
    and ignored with a note in import.json, never refused and never turned into a gate: an
    ignored figure leaves the output at the default, the tighter side."""
    found, notes = [], []
    for path in (rel_dir / "golden" / "trace.json", rel_dir / "convert_report.json",
                 rel_dir / "golden" / "convert_report.json"):
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ImportRefused(str(path), f"not readable JSON: {exc}") from exc
        if not isinstance(doc, dict) or "parity" not in doc:
            continue
        rows = _stated_rows(doc["parity"])
        unknown = [f"{c}.{o}" for c, o, _ in rows or []
                   if c not in comps or (o != ANY_OUTPUT and o not in comps[c].outputs)]
        if rows is None or unknown:
            why = (f"names what the release lacks ({', '.join(unknown)})" if unknown else
                   "is not {context: {output: cosine}} nor [{context, output, cosine}]")
            notes.append({"file": str(path), "used": 0,
                          "note": f"`parity` {why}: taken for something else, its figures not used"})
            continue
        found += [(c, o, float(v), str(path)) for c, o, v in rows]
        notes.append({"file": str(path), "used": len(rows), "note": "`parity` figures read"})
    return found, notes


def check(context: str, output: str, cosine: float, comps: dict, allow_low: bool, where: str) -> None:
    expect(context in comps, where, f"context {context!r} is not in the release (its contexts: {', '.join(comps)})")
    outs = list(comps[context].outputs)
    expect(output == ANY_OUTPUT or output in outs, where,
           f"output {output!r} is not an output of {context} (its outputs: {', '.join(outs)})")
    floor = 0.0 if allow_low else GATE_FLOOR
    if not (floor < cosine <= 1.0):
        raise ImportRefused(where, f"{cosine} is not in ({floor}, 1]" + (
            "" if allow_low else " (a lower gate needs --allow-low-gate)"))


def resolve(a, rel_dir: Path, comps: dict, default: float) -> tuple:
    """(parity.contexts entries, provenance list) for the import `a`."""
    allow_low = bool(a.allow_low_gate)
    chosen = {}  # (context, output) -> (cosine, reason, from)
    figures, stated = stated_figures(rel_dir, comps)
    for c, o, v, path in figures:
        if v < default:
            gate = card_gate(v)
            chosen[(c, o)] = (gate, f"release states cosine {v} in {Path(path).name}; gate = figure less "
                              f"{CARD_MARGIN}, rounded down to 1e-4", path)
    names = release_names(a.release, rel_dir, a.release_name)
    card = next((PUBLISHED[n] for n in names if n in PUBLISHED), None)
    card_name = next((n for n in names if n in PUBLISHED), None)
    if card is not None:
        for (c, o), (figure, why) in card["figures"].items():
            if c in comps:
                chosen[(c, o)] = (card_gate(figure), f"card {card_name}: {c} {o} cosine {figure} on the QNN CPU "
                                  f"backend ({why}); gate = figure less {CARD_MARGIN}, rounded down to 1e-4",
                                  f"card table ({card['card']})")
    for c, o, v, reason in parse(a.gate, a.gate_reason):
        chosen[(c, o)] = (v, reason, "--gate")
    entries, record = {}, []
    for (c, o), (v, reason, source) in sorted(chosen.items()):
        check(c, o, v, comps, allow_low, f"--gate {c}.{o}={v}" if source == "--gate" else source)
        entries.setdefault(c, {})[o] = {"cosine": v, "reason": reason}
        record.append({"context": c, "output": o, "cosine": v, "reason": reason, "from": source})
    # The flag also lowers the floor of every later hand edit of the bundle: only where needed.
    expect(not allow_low or any(e["cosine"] <= GATE_FLOOR for e in record), "--allow-low-gate",
           f"no gate is at or below {GATE_FLOOR}, so none needs it")
    provenance = {"default": default, "entries": record, "allow_low_gate": allow_low,
                  "release_names": names, "card": card["card"] if card else None}
    if stated:
        provenance["stated_figures"] = stated
    return entries, provenance


def apply(a, rel_dir: Path, comps: dict, man: dict, provenance: dict) -> None:
    """Writes the gates into the manifest `man` and their sources into import.json's record."""
    entries, record = resolve(a, rel_dir, comps, man["parity"]["context_cosine"])
    if entries:
        man["parity"]["contexts"] = entries
    if a.allow_low_gate:
        man["parity"]["allow_low_gate"] = True
    # Only when there is something to say: a release without a card, figures or --gate
    # imports as before.
    if record["entries"] or record["card"] or record["allow_low_gate"] or record.get("stated_figures"):
        provenance["gates"] = record
