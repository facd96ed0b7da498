"""meta-vla's do_check_qairt_version (vla-bundle.bb), run outside bitbake: the QAIRT
version coupling derived from the context binaries and the provider's release."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "meta-vla" / "recipes-vla" / "vla-bundle" / "vla-bundle.bb"
FIXTURE = REPO / "golden" / "bundles" / "fastwam"


class Fatal(Exception):
    pass


class FakeBB:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def fatal(self, message: str) -> None:
        raise Fatal(message)

    def note(self, message: str) -> None:
        self.notes.append(message)

    def warn(self, message: str) -> None:
        self.notes.append("WARN " + message)


class FakeD(dict):
    def getVar(self, key: str) -> str:  # noqa: N802 (bitbake's name)
        return self[key]


def recipe_check():
    """The body of the recipe's python task, as a function of (d, bb)."""
    text = RECIPE.read_text()
    body = text.split("python do_check_qairt_version() {\n", 1)[1].split("\n}\n", 1)[0]
    namespace: dict = {"os": os}
    exec("def check(d, bb):\n" + body + "\n", namespace)  # noqa: S102 (our own recipe)
    return namespace["check"]


def provider(tmp_path: Path, build_id: str, header: bool) -> tuple[str, str]:
    inc, lib = tmp_path / "include", tmp_path / "lib"
    (inc / "QNN").mkdir(parents=True)
    lib.mkdir()
    if header:
        (inc / "QNN" / "QnnSdkBuildId.h").write_text(f'#define QNN_SDK_BUILD_ID "{build_id}"\n')
    else:  # the wheel: no headers, the build id inside libQnnHtp.so
        (lib / "libQnnHtp.so").write_bytes(b"\x7fELF" + b"\0" * 64 + build_id.encode() + b"\0")
    return str(inc), str(lib)


def run(tmp_path: Path, build_id: str, header: bool = True, stated: str = "") -> FakeBB:
    inc, lib = provider(tmp_path, build_id, header)
    bb = FakeBB()
    d = FakeD(VLA_QAIRT_PROVIDER="qairt-test", STAGING_INCDIR=inc, STAGING_LIBDIR=lib,
              VLA_BUNDLE_SRC=str(FIXTURE), VLA_POLICY="fastwam", VLA_BUNDLE_QAIRT_VERSION=stated)
    recipe_check()(d, bb)
    return bb


def test_same_release_from_the_wheel_library_passes(tmp_path):
    bb = run(tmp_path, "v2.51.0.260929181845", header=False)
    assert any("1 context binaries (QNN 2.51.0.260929181845)" in n for n in bb.notes)


def test_older_binaries_pass_and_name_the_parity_gate(tmp_path):
    bb = run(tmp_path, "v2.52.0.261101")
    assert any("expected to load; the parity gate on the board decides" in n for n in bb.notes)


@pytest.mark.parametrize("libraries", ["v2.47.0.250627", "v2.50.0.260828", "v3.0.0.260101"])
def test_binaries_newer_than_the_libraries_stop_the_build(tmp_path, libraries):
    with pytest.raises(Fatal, match="compiled by QNN 2.51.0.260929181845, newer than"):
        run(tmp_path, libraries)


def test_a_stale_stated_version_stops_the_build(tmp_path):
    with pytest.raises(Fatal, match="VLA_BUNDLE_QAIRT_VERSION .* says 2.47.0.250627"):
        run(tmp_path, "v2.51.0.260929181845", stated="2.47.0.250627")


def test_a_provider_without_a_build_id_stops_the_build(tmp_path):
    inc, lib = tmp_path / "i", tmp_path / "l"
    inc.mkdir()
    lib.mkdir()
    d = FakeD(VLA_QAIRT_PROVIDER="qairt-test", STAGING_INCDIR=str(inc), STAGING_LIBDIR=str(lib),
              VLA_BUNDLE_SRC=str(FIXTURE), VLA_POLICY="fastwam", VLA_BUNDLE_QAIRT_VERSION="")
    with pytest.raises(Fatal, match="staged neither"):
        recipe_check()(d, FakeBB())
