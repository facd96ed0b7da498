"""`vla-import pack`: Fast-WAM instruction packs from the tiny upstream checkpoint's text encoder
(golden/upstream-fastwam/tiny) for the bundle made from it (golden/bundles/fastwam-upstream): the
rows are the encoder's, as the bundle's are; `vlad bundle pack|sign|verify` take the pack as they
take a bundle; refusals are one line and write nothing."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
from vla_import.__main__ import main
from vla_import import fastwam_chain, release

BUNDLE = REPO / "golden" / "bundles" / "fastwam-upstream"
CHECKPOINT = REPO / "golden" / "upstream-fastwam" / "tiny" / "checkpoint"
FIXED = json.loads((BUNDLE / "bundle.json").read_text())["fastwam"]["chain"]["instructions"]


def pack_args(out, *instructions, extra=()):
    a = ["pack", "--bundle", str(BUNDLE), "--checkpoint", str(CHECKPOINT), "--out", str(out), *extra]
    for t in instructions:
        a += ["--instruction", t]
    return a


def test_a_pack_holds_the_encoders_rows_of_each_instruction(tmp_path, capsys):
    out = tmp_path / "pack"
    given = ["  " + FIXED[1].replace(" ", "\t", 1) + " ", "wipe the table &amp; the plate"]
    assert main(pack_args(out, *given, extra=["--first-id", "5", "--label", "extra"])) == 0, capsys.readouterr().err
    pack = json.loads((out / "pack.json").read_text())
    manifest = json.loads((BUNDLE / "bundle.json").read_text())
    for key in ("name", "version", "policy", "soc_model", "htp_arch", "min_runtime_version"):
        assert pack[key] == manifest[key], key
    assert (pack["kind"], pack["label"], pack["rows"]) == ("instruction-pack", "extra", "rows.npy")
    assert [i["id"] for i in pack["instructions"]] == [(1 << 30) | 5, (1 << 30) | 6]
    assert [i["text"] for i in pack["instructions"]] == given
    # Upstream's cleaning: whitespace runs and HTML entities (unescaped twice).
    assert [i["normalized"] for i in pack["instructions"]] == [FIXED[1], "wipe the table & the plate"]

    rows = np.load(out / "rows.npy")
    with np.load(BUNDLE / "inputs" / "context_tables.npz") as z:
        fixed_rows, fixed_lengths = z["text_rows"], z["text_lengths"]
    assert rows.dtype == fixed_rows.dtype and rows.shape == (2,) + fixed_rows.shape[1:]
    # The same text as fixed instruction 1 gives its rows: the bundle holds upstream's torch run,
    # the importer numpy's encoder of the same weights (docs/bundle-format.md: within 4.8e-7).
    assert np.abs(rows[0] - fixed_rows[1]).max() < 1e-5
    assert pack["instructions"][0]["length"] == fixed_lengths[1]
    # Exactly the importer's rows for the bundle (the one encoder path).
    enc, tok = fastwam_chain.text_encoder(CHECKPOINT, {"context_width": rows.shape[2]})
    want, _ = fastwam_chain.text_rows(given, enc, tok, rows.shape[1])
    assert np.array_equal(rows, want.astype(rows.dtype))
    assert np.abs(rows[1] - rows[0]).max() > 1e-3
    assert not rows[1][pack["instructions"][1]["length"]:].any()


def test_vlad_signs_and_verifies_a_pack_as_a_bundle(tmp_path, capsys):
    out = tmp_path / "pack"
    assert main(pack_args(out, "wipe the table")) == 0, capsys.readouterr().err
    vlad = release.vlad_command(None)
    key = tmp_path / "fleet.key"
    keygen = subprocess.run([vlad, "bundle", "keygen", str(key)], capture_output=True, text=True, check=True)
    public = next(w for w in keygen.stdout.replace(":", " ").split() if len(w) == 64)
    for step in (["pack", str(out)], ["sign", str(out), "--key", str(key)],
                 ["verify", str(out), "--trusted-key", public]):
        run = subprocess.run([vlad, "bundle", *step], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
    manifest = json.loads((out / "ota-manifest.json").read_text())
    assert sorted(f["path"] for f in manifest["files"]) == ["pack.json", "rows.npy"]
    # A changed row is caught as in a bundle.
    rows = np.load(out / "rows.npy")
    rows[0, 0, 0] += 1
    np.save(out / "rows.npy", rows)
    run = subprocess.run([vlad, "bundle", "verify", str(out), "--trusted-key", public], capture_output=True, text=True)
    assert run.returncode != 0 and "rows.npy" in run.stderr, run.stdout + run.stderr


@pytest.mark.parametrize("case, needle", [
    ("molmoact2", "expected fastwam"),
    ("open-loop", "expected the world-model chain"),
    ("repeat", "expected distinct instructions"),
    ("exists", "expected a new directory"),
    ("first-id", "--first-id"),
])
def test_refusals_are_one_line_and_write_nothing(tmp_path, capsys, case, needle):
    out = tmp_path / "pack"
    bundle = BUNDLE
    extra = []
    instructions = ["wipe the table"]
    if case == "molmoact2":
        bundle = REPO / "golden" / "bundles" / "molmoact2-upstream-original"
    elif case == "open-loop":
        bundle = REPO / "golden" / "bundles" / "fastwam"
    elif case == "repeat":
        instructions = ["wipe the table", " wipe  the table"]
    elif case == "exists":
        out.mkdir()
    elif case == "first-id":
        extra = ["--first-id", str(1 << 30)]
    argv = pack_args(out, *instructions, extra=extra)
    argv[argv.index("--bundle") + 1] = str(bundle)
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err, err
    assert case == "exists" or not out.exists()
    if case == "exists":
        assert not any(out.iterdir())

