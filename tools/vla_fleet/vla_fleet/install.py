"""RAUC's install of a policy artifact as vlad's handlers see it, for a host without
dm-verity and loop devices (the device stand-ins of the rollout test):

    python -m vla_fleet.install BUNDLE.raucb --rauc RAUC --conf SYSTEM.CONF --work DIR

Each step is what RAUC 1.13 does for a bundle with an artifact of type `trees`, with the
mount of the verity bundle replaced by unpacking its squashfs:
1. `rauc info` with the system.conf's keyring: the X.509 signature (a refusal ends here);
   the manifest's `compatible` must equal the system's;
2. the bundle's squashfs unpacked under DIR (RAUC mounts it read-only), its path given to
   the handlers as RAUC_BUNDLE_MOUNT_POINT;
3. the system.conf's `pre-install` handler (meta-vla's vla-rauc-handler: `vlad bundle
   verify` of the converted tree): non-zero fails the install before anything is written;
4. each `[image.<repository>/<artifact>]` of a `trees` repository copied to
   `<path>/.artifact-<artifact>-<sha256>` and the link `<path>/<artifact>` swapped to it;
5. the `post-install` handler (vlad ota install --link, activate, the daemon's verdict):
   its exit status is the install's.
Each line printed is one line of the install's log (the agent forwards them to the server).
In the RAUC VM check (scripts/rauc/check.sh) the real `rauc install` runs instead."""

from __future__ import annotations

import argparse
import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path


class InstallError(Exception):
    """A step of the install failed; the message names the step and the cause."""


def say(msg: str) -> None:
    print(f"rauc-standin: {msg}", flush=True)


def key_file(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        with open(path) as f:
            cp.read_file(f)
    except (OSError, configparser.Error) as e:
        raise InstallError(f"{path}: {e}") from e
    return cp


def bundle_info(rauc: Path, conf: Path, bundle: Path) -> dict[str, str]:
    p = subprocess.run([str(rauc), f"--conf={conf}", "info", "--output-format=shell", str(bundle)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        lines = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
        raise InstallError(f"{bundle.name} refused by rauc info: {lines[-1] if lines else p.returncode}")
    info = {}
    for line in p.stdout.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            info[k] = v.strip("'\"")
    return info


def run_handler(handler: str, env: dict[str, str], phase: str) -> tuple[int, str]:
    """The handler's exit status and its last line (on failure, its reason)."""
    say(f"running {phase} handler {handler}")
    p = subprocess.run([handler], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    for line in lines:
        print(line, flush=True)
    return p.returncode, (lines[-1] if lines else "")


def install(bundle: Path, rauc: Path, conf: Path, work: Path) -> int:
    system = key_file(conf)
    compatible = system.get("system", "compatible", fallback=None)
    info = bundle_info(rauc, conf, bundle)
    if info.get("RAUC_MF_COMPATIBLE") != compatible:
        raise InstallError(f"{bundle.name} is for `{info.get('RAUC_MF_COMPATIBLE')}`, this system is `{compatible}`")
    say(f"{bundle.name}: signature verified, {info.get('RAUC_MF_COMPATIBLE')} {info.get('RAUC_MF_VERSION')}")
    mount = work / "bundle"
    shutil.rmtree(mount, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["unsquashfs", "-no-xattrs", "-q", "-n", "-d", str(mount), str(bundle)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise InstallError(f"{bundle.name}: unsquashfs failed: {(p.stderr or p.stdout).strip()[-300:]}")
    try:
        env = {**os.environ, "RAUC_BUNDLE_MOUNT_POINT": str(mount), "RAUC_SYSTEM_CONFIG": str(conf),
               "RAUC_MF_COMPATIBLE": info.get("RAUC_MF_COMPATIBLE", ""),
               "RAUC_MF_VERSION": info.get("RAUC_MF_VERSION", "")}
        handlers = system["handlers"] if system.has_section("handlers") else {}
        if "pre-install" in handlers:
            rc, last = run_handler(handlers["pre-install"], env, "pre-install")
            if rc != 0:
                say(f"pre-install handler failed (exit {rc}), nothing installed: {last}")
                return rc
        manifest = key_file(mount / "manifest.raucm")
        for section in manifest.sections():
            if not section.startswith("image.") or "/" not in section:
                continue
            repo, artifact = section[len("image."):].split("/", 1)
            if system.get(f"artifacts.{repo}", "type", fallback=None) != "trees":
                continue
            path = Path(system.get(f"artifacts.{repo}", "path"))
            tree = mount / (manifest.get(section, "filename") + ".extracted")
            digest = manifest.get(section, "sha256")
            target = path / f".artifact-{artifact}-{digest}"
            if not target.exists():
                path.mkdir(parents=True, exist_ok=True)
                tmp = path / f".tmp-{artifact}-{digest}"
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(tree, tmp, symlinks=True)
                os.rename(tmp, target)
            link_tmp = path / f".{artifact}.new"
            if link_tmp.is_symlink():
                link_tmp.unlink()
            os.symlink(target.name, link_tmp)
            os.rename(link_tmp, path / artifact)
            say(f"artifact {repo}/{artifact} installed as {target.name}")
        if "post-install" in handlers:
            rc, last = run_handler(handlers["post-install"], env, "post-install")
            if rc != 0:
                say(f"post-install handler failed (exit {rc}): {last}")
                return rc
        say("installing: succeeded")
        return 0
    finally:
        shutil.rmtree(mount, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--rauc", type=Path, required=True)
    ap.add_argument("--conf", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    a = ap.parse_args()
    try:
        return install(a.bundle, a.rauc, a.conf, a.work)
    except InstallError as e:
        say(f"failed: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
