#!/usr/bin/env python3
"""Runs the real do_install of meta-vla's recipes that install files of this repository
(vlad, vla-ring-client, vla-rauc, the rauc-hawkbit-updater append) into a scratch ${D},
the way bitbake would, and checks what lands there. No bitbake checkout is needed (CI has
none):

- each recipe's assignments are read with bitbake's plain operators (=, ?=, ??=, :=, +=,
  line continuations, ${VAR} and the ${@...} expressions these recipes use), over the
  directory variables of oe-core's bitbake.conf;
- its file:// SRC_URI entries are unpacked into UNPACKDIR from FILESPATH (FILESEXTRAPATHS,
  the recipe's files/ directory), subdir= honoured, as do_unpack does;
- a recipe's own do_compile runs first (vla-ring-client's `oe_runmake`: make with
  EXTRA_OEMAKE), with Debian's aarch64 cross gcc as the target compiler when it is
  installed (else cc) and a stand-in of the target flags oe-core exports (optimisation,
  stack protector, _FORTIFY_SOURCE, format security, relro/now), so the strict -Werror
  build is checked under them and the binaries are built for the board's architecture;
- do_install (and do_install:append) runs in bash -e with those variables exported, and
  the recipe's python postfuncs run with a stand-in of the datastore; for a recipe that
  inherits cargo, the binaries of CARGO_BUILD_FLAGS --bin come from the project's release
  build (target/release), as cargo's do_install installs them;
- then every SYSTEMD_SERVICE unit must be installed, every path FILES names must exist,
  and the installed tree must equal the expected list below (a file added to or dropped
  from an install step shows here, not on a board);
- vlad's postfunc must refuse a published key in VLA_OTA_TRUSTED_KEYS (RFC 8032's test
  key) at build time, and write an ordinary one into vlad.json.

`bitbake -e <recipe>` on a real checkout (scripts/bitbake_parse.sh) gives the same
variables; this reader covers the syntax these recipes use and fails loudly on any other.
Usage: scripts/check_recipe_install.py [--vlad PATH_TO_BUILT_VLAD]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYER = REPO / "meta-vla"

# oe-core's bitbake.conf directory variables (wrynose), and the build's identity.
BASE = {
    "prefix": "/usr",
    "exec_prefix": "/usr",
    "bindir": "/usr/bin",
    "sbindir": "/usr/sbin",
    "base_sbindir": "/usr/sbin",
    "libexecdir": "/usr/libexec",
    "libdir": "/usr/lib",
    "nonarch_libdir": "/usr/lib",
    "datadir": "/usr/share",
    "sysconfdir": "/etc",
    "localstatedir": "/var",
    "systemd_unitdir": "/usr/lib/systemd",
    "systemd_system_unitdir": "/usr/lib/systemd/system",
    "includedir": "/usr/include",
    "DISTRO_FEATURES": "systemd usrmerge vla-rauc",
    "TARGET_ARCH": "aarch64",
    "COMMON_LICENSE_DIR": "/licenses",
}

# What each recipe's do_install must leave in ${D}, exactly (files and links).
EXPECTED = {
    "vlad": [
        "etc/default/vlad",
        "etc/vla/vlad.json",
        "usr/bin/vlad",
        "usr/lib/systemd/system/vla-ota-activate@.service",
        "usr/lib/systemd/system/vla-ota-commit.service",
        "usr/lib/systemd/system/vla-ota-install@.service",
        "usr/lib/systemd/system/vla-ota-rollback.service",
        "usr/lib/systemd/system/vlad.service",
        "usr/lib/tmpfiles.d/vla.conf",
    ],
    "vla-ring-client": [
        "usr/bin/vla-ring-bridge",
        "usr/include/vla_ring.h",
        "usr/include/vla_ring_client.h",
        "usr/lib/libvla_ring_client.a",
        "usr/lib/libvla_ring_client.so",
        "usr/lib/libvla_ring_client.so.1",
    ],
    "vla-rauc": [
        "etc/default/vla-rauc",
        "usr/lib/tmpfiles.d/vla-rauc.conf",
        "usr/libexec/vla/rauc-post-install",
        "usr/libexec/vla/rauc-pre-install",
        "usr/libexec/vla/vla-rauc-handler",
    ],
    "rauc-hawkbit-updater": [
        "etc/rauc-hawkbit-updater/config.conf",
        "etc/rauc-hawkbit-updater/fleet-ca/ca-certificates.crt",
        "usr/lib/systemd/system/rauc-hawkbit-updater.service.d/50-vla.conf",
        "usr/lib/tmpfiles.d/vla-hawkbit.conf",
        "usr/libexec/vla/vla-hawkbit-config",
    ],
}

RECIPES = {
    "vlad": (LAYER / "recipes-vla/vlad/vlad_0.1.0.bb", "0.1.0"),
    "vla-ring-client": (LAYER / "recipes-vla/vla-ring-client/vla-ring-client_0.1.0.bb", "0.1.0"),
    "vla-rauc": (LAYER / "dynamic-layers/rauc/recipes-vla/vla-rauc/vla-rauc.bb", "1.0"),
    "rauc-hawkbit-updater": (
        LAYER / "dynamic-layers/rauc/recipes-support/rauc-hawkbit-updater/rauc-hawkbit-updater_%.bbappend",
        "1.0",
    ),
}

# The target compiler and the flags bitbake exports to a recipe's tasks: a stand-in of
# oe-core's TARGET_CFLAGS / TARGET_LDFLAGS with its security flags (security_flags.inc).
TARGET_CC = "aarch64-linux-gnu-gcc" if shutil.which("aarch64-linux-gnu-gcc") else "cc"
TARGET_ENV = {
    "CC": TARGET_CC,
    "AR": TARGET_CC.replace("gcc", "ar") if TARGET_CC != "cc" else "ar",
    "CFLAGS": "-O2 -pipe -g -feliminate-unused-debug-types -fstack-protector-strong -D_FORTIFY_SOURCE=2 "
              "-Wformat -Wformat-security -Werror=format-security",
    "LDFLAGS": "-Wl,-O1 -Wl,--hash-style=gnu -Wl,--as-needed -fstack-protector-strong -Wl,-z,relro,-z,now",
}

RFC8032_TEST_1 = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"


class Fatal(Exception):
    """bb.fatal"""


class DataStore:
    """The little of bitbake's datastore these recipes use."""

    def __init__(self, values: dict[str, str]):
        self.values = values

    def getVar(self, name: str, expand: bool = True):  # noqa: N802 (bitbake's name)
        if name not in self.values:
            return None
        return self.expand(self.values[name]) if expand else self.values[name]

    def setVar(self, name: str, value: str) -> None:  # noqa: N802
        self.values[name] = value

    def expand(self, text: str, depth: int = 0) -> str:
        if depth > 20:
            raise SystemExit(f"check_recipe_install: recursive expansion of {text!r}")

        def python(m: re.Match) -> str:
            return str(eval(m.group(1), {"bb": Bb, "d": self, "os": os}))  # noqa: S307 (recipe code)

        out = re.sub(r"\$\{@(.+?)\}(?=[^}]*$|[\s\"'])", python, text)
        # Innermost first: ${SYSTEMD_SERVICE:${PN}} expands ${PN}, then the rest.
        out = re.sub(r"\$\{([^${}@]+)\}", lambda m: self.values.get(m.group(1), m.group(0)), out)
        return out if out == text else self.expand(out, depth + 1)


class Bb:
    class utils:  # noqa: N801 (bitbake's name)
        @staticmethod
        def contains(var, item, yes, no, d):
            return yes if item in (d.getVar(var) or "").split() else no

    @staticmethod
    def fatal(msg):
        raise Fatal(msg)

    @staticmethod
    def warn(msg):
        print(f"  WARNING: {msg}")

    @staticmethod
    def note(msg):
        print(f"  NOTE: {msg}")


def parse(path: Path, values: dict[str, str], functions: dict[str, str]) -> None:
    """Assignments and shell/python functions of a .bb/.bbappend/.inc, in order."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        func = re.match(r"^(python\s+)?([A-Za-z0-9_:\-${}]+)\s*\(\)\s*\{\s*$", line)
        if func:
            body = []
            while lines[i] != "}":
                body.append(lines[i])
                i += 1
            i += 1
            name = func.group(2)
            functions[("python " if func.group(1) else "") + name] = "\n".join(body)
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        line = re.sub(r"^export\s+", "", line)
        m = re.match(r'^([A-Za-z0-9_\-${}:]+)(\[[^\]]+\])?\s*(\?\?=|\?=|:=|\+=|=)\s*"(.*)"\s*$', line)
        if m:
            name, flag, op, value = m.groups()
            name = name.replace("${PN}", values["PN"])
            if flag:
                name += flag
            if op == ":=":
                value = DataStore(values).expand(value)
            if name.endswith(":append"):
                base = name[: -len(":append")]
                values[base] = values.get(base, "") + value
            elif name.endswith(":prepend"):
                base = name[: -len(":prepend")]
                values[base] = value + values.get(base, "")
            elif op == "??=" or op == "?=":
                values.setdefault(name, value)
            elif op == "+=":
                values[name] = (values.get(name, "") + " " + value).strip()
            else:
                values[name] = value
            continue
        if re.match(r"^(inherit|require|include|addtask|EXPORT_FUNCTIONS)\b", stripped):
            if stripped.startswith("require") or stripped.startswith("include"):
                rel = stripped.split(None, 1)[1]
                for base in (path.parent, LAYER):
                    if (base / rel).is_file():
                        parse(base / rel, values, functions)
                        break
                else:
                    raise SystemExit(f"check_recipe_install: {path}: cannot find {rel}")
            if stripped.startswith("inherit"):
                values["__inherits"] = values.get("__inherits", "") + " " + stripped.split(None, 1)[1]
            continue
        if stripped.startswith(("python __anonymous", "do_")):
            continue
        raise SystemExit(f"check_recipe_install: {path}:{i}: cannot read `{line}`")


def unpack(d: DataStore, unpackdir: Path, recipe_dir: Path) -> None:
    """file:// entries of SRC_URI copied from FILESPATH into UNPACKDIR (subdir= honoured)."""
    search = [Path(p) for p in (d.getVar("FILESEXTRAPATHS") or "").split(":") if p]
    search += [recipe_dir / "files", recipe_dir / d.getVar("BPN"), recipe_dir]
    for entry in (d.getVar("SRC_URI") or "").split():
        if not entry.startswith("file://"):
            continue
        rel, *params = entry[len("file://"):].split(";")
        subdir = next((p.split("=", 1)[1] for p in params if p.startswith("subdir=")), "")
        source = next((base / rel for base in search if (base / rel).exists()), None)
        if source is None:
            raise SystemExit(f"check_recipe_install: {d.getVar('PN')}: file://{rel} is not in FILESPATH")
        target = unpackdir / subdir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("target", "__pycache__"))
        else:
            shutil.copy2(source, target)


def install(pn: str, recipe: Path, pv: str, work: Path, vlad_binary: Path, extra: dict[str, str]):
    """Runs `pn`'s do_install into work/image; returns (datastore, image dir)."""
    values = dict(BASE, PN=pn, BPN=pn, PV=pv, BP=f"{pn}-{pv}", THISDIR=str(recipe.parent))
    unpackdir = work / "sources"
    image = work / "image"
    values.update(UNPACKDIR=str(unpackdir), WORKDIR=str(work), D=str(image), B=str(work / "build"))
    values["S"] = "${UNPACKDIR}/${BP}"
    functions: dict[str, str] = {}
    parse(recipe, values, functions)
    values.update(extra)
    d = DataStore(values)
    unpackdir.mkdir(parents=True)
    image.mkdir()
    unpack(d, unpackdir, recipe.parent)
    # bitbake's shell logging: bbfatal prints an error and fails the task.
    script = ["set -e", 'bbfatal() { echo "ERROR: $*" >&2; exit 1; }']
    # bitbake's oe_runmake: make with the recipe's EXTRA_OEMAKE, failing the task on error.
    script.append(f'oe_runmake() {{ make {d.getVar("EXTRA_OEMAKE") or ""} "$@"; }}')
    if "do_compile" in functions:
        script.append(d.expand(functions["do_compile"]))
    if " cargo" in " " + values.get("__inherits", ""):
        # cargo.bbclass's do_install: the built binaries into ${bindir}.
        for binary in re.findall(r"--bin\s+(\S+)", d.getVar("CARGO_BUILD_FLAGS") or ""):
            built = vlad_binary if binary == "vlad" else REPO / "target/release" / binary
            if not built.is_file():
                raise SystemExit(f"check_recipe_install: {pn}: {built} is not built (cargo build --release -p vlad)")
            script.append(f'install -D -m 0755 "{built}" "{image}{d.getVar("bindir")}/{binary}"')
    for name in ("do_install", "do_install:append"):
        if name in functions:
            script.append(d.expand(functions[name]))
    subprocess.run(["bash", "-c", "\n".join(script)], check=True, cwd=work, env=dict(os.environ, **TARGET_ENV))
    for post in (d.getVar("do_install[postfuncs]") or "").split():
        body = functions["python " + post]
        code = "def _f(d, bb):\n" + "\n".join("    " + line[4:] if line.startswith("    ") else "    " + line
                                              for line in body.splitlines())
        scope: dict = {}
        exec(code, scope)  # noqa: S102 (the recipe's own postfunc)
        scope["_f"](d, Bb)
    return d, image


def tree(image: Path) -> list[str]:
    return sorted(str(p.relative_to(image)) for p in image.rglob("*") if p.is_file() or p.is_symlink())


def check(pn: str, vlad_binary: Path, extra: dict[str, str] | None = None) -> list[str]:
    recipe, pv = RECIPES[pn]
    problems = []
    with tempfile.TemporaryDirectory(prefix=f"vla-install-{pn}-") as tmp:
        d, image = install(pn, recipe, pv, Path(tmp), vlad_binary, extra or {})
        unitdir = d.getVar("systemd_system_unitdir")
        for unit in (d.getVar(f"SYSTEMD_SERVICE:{pn}") or "").split():
            if not (image / unitdir.lstrip("/") / unit).is_file():
                problems.append(f"SYSTEMD_SERVICE:{pn} names {unit}, which do_install did not install")
        for entry in (d.getVar(f"FILES:{pn}") or "").split():
            if any(c in entry for c in "*?[") or entry.endswith("/"):
                continue
            if not (image / entry.lstrip("/")).exists() and not (image / entry.lstrip("/")).is_symlink():
                problems.append(f"FILES:{pn} names {entry}, which do_install did not install")
        got = tree(image)
        if got != EXPECTED[pn]:
            problems.append(f"installed tree differs: extra {sorted(set(got) - set(EXPECTED[pn]))}, "
                            f"missing {sorted(set(EXPECTED[pn]) - set(got))}")
        if pn == "vla-ring-client":
            problems += check_ring_client(image)
        if pn == "vlad" and extra and "VLA_OTA_TRUSTED_KEYS" in extra:
            import json
            ota = json.loads((image / "etc/vla/vlad.json").read_text())["ota"]
            want = {"trusted_keys": extra["VLA_OTA_TRUSTED_KEYS"].split(),
                    "signature_threshold": int(extra.get("VLA_OTA_SIGNATURE_THRESHOLD", "1")),
                    "root_keys": extra.get("VLA_OTA_ROOT_KEYS", "").split()}
            got = {k: ota.get(k, []) for k in want}
            if got != want:
                problems.append(f"the installed vlad.json's ota section is {got}, want {want}")
    return problems


def check_ring_client(image: Path) -> list[str]:
    """The library's link and soname, and binaries built for the target's architecture."""
    problems = []
    link = image / "usr/lib/libvla_ring_client.so"
    if not link.is_symlink() or os.readlink(link) != "libvla_ring_client.so.1":
        problems.append("usr/lib/libvla_ring_client.so is not the link to libvla_ring_client.so.1")
    want = "aarch64" if TARGET_CC != "cc" else os.uname().machine
    for rel in ("usr/bin/vla-ring-bridge", "usr/lib/libvla_ring_client.so.1"):
        # ELF e_machine (offset 18, little-endian): 183 aarch64, 62 x86_64.
        machine = int.from_bytes((image / rel).read_bytes()[18:20], "little")
        got = {183: "aarch64", 62: "x86_64"}.get(machine, f"e_machine {machine}")
        if got != want:
            problems.append(f"{rel} is built for {got}, the target is {want}")
    soname = subprocess.run(["readelf", "-d", str(image / "usr/lib/libvla_ring_client.so.1")],
                            capture_output=True, text=True).stdout
    if "Library soname: [libvla_ring_client.so.1]" not in soname:
        problems.append("libvla_ring_client.so.1 does not carry the soname libvla_ring_client.so.1")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vlad", type=Path, default=REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "release/vlad")
    args = ap.parse_args()
    failed = False
    ordinary = "a74a3b7188acd4bb7b44c6f9e91907bb950546cb7aceb0657a6bf602dff1573d"
    root = "5e1c0f1b4f3a1d8f0e2b6c7a9d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e"
    scratch = Path(tempfile.mkdtemp(prefix="vla-install-ca-"))
    fleet_ca = scratch / "fleet-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", str(scratch / "ca.key"), "-out", str(fleet_ca), "-days", "1",
                    "-subj", "/CN=check_recipe_install fleet CA"], check=True, capture_output=True)
    for pn, extra in (("vlad", {"VLA_OTA_TRUSTED_KEYS": ordinary, "VLA_OTA_ROOT_KEYS": root,
                                "VLA_ADSP_LIBRARY_PATH": "/usr/lib/dsp"}),
                      ("vla-ring-client", None), ("vla-rauc", None), ("rauc-hawkbit-updater", {"VLA_HAWKBIT_CA": str(fleet_ca)})):
        try:
            problems = check(pn, args.vlad, extra)
        except subprocess.CalledProcessError as e:
            problems = [f"do_install failed (exit {e.returncode}); its output is above"]
        for p in problems:
            print(f"FAIL {pn}: {p}")
        print(f"{'FAIL' if problems else 'PASS'}  {pn}: do_install into a scratch ${{D}}")
        failed |= bool(problems)
    try:
        check("vlad", args.vlad, {"VLA_OTA_TRUSTED_KEYS": RFC8032_TEST_1, "VLA_ADSP_LIBRARY_PATH": "/usr/lib/dsp"})
        print("FAIL  vlad: VLA_OTA_TRUSTED_KEYS with RFC 8032's test key was accepted")
        failed = True
    except Fatal as e:
        ok = "published" in str(e)
        print(f"{'PASS' if ok else 'FAIL'}  vlad: a published key is refused at build time ({e})")
        failed |= not ok
    # The agent trusts the fleet's CA alone: an image without one is refused at build time.
    for value, what in (("", "no VLA_HAWKBIT_CA"), (str(scratch / "ca.key"), "a VLA_HAWKBIT_CA without a certificate")):
        try:
            check("rauc-hawkbit-updater", args.vlad, {"VLA_HAWKBIT_CA": value})
            print(f"FAIL  rauc-hawkbit-updater: {what} was accepted")
            failed = True
        except subprocess.CalledProcessError:
            print(f"PASS  rauc-hawkbit-updater: {what} is refused at build time")
    if not failed:
        installed = check_ca(args.vlad, fleet_ca)
        print(f"{'PASS' if installed else 'FAIL'}  rauc-hawkbit-updater: the fleet CA installed is VLA_HAWKBIT_CA's")
        failed |= not installed
    shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failed else 0


def check_ca(vlad_binary: Path, fleet_ca: Path) -> bool:
    """The file the drop-in binds over /etc/ssl/certs holds VLA_HAWKBIT_CA's bytes."""
    recipe, pv = RECIPES["rauc-hawkbit-updater"]
    with tempfile.TemporaryDirectory(prefix="vla-install-ca-") as tmp:
        d, image = install("rauc-hawkbit-updater", recipe, pv, Path(tmp), vlad_binary,
                           {"VLA_HAWKBIT_CA": str(fleet_ca)})
        installed = image / d.getVar("sysconfdir").lstrip("/") / "rauc-hawkbit-updater/fleet-ca/ca-certificates.crt"
        return installed.read_bytes() == fleet_ca.read_bytes()


if __name__ == "__main__":
    sys.exit(main())
