"""Fleet OTA through real RAUC, end to end in a VM (see scripts/rauc/check.sh).

Builds, on this machine: three signed policy bundles (B good; C signed and intact but its
golden disagrees with the contexts; D signed by a key the device does not trust) and the
device's first bundle A; a test X.509 signer for RAUC; one RAUC bundle per policy with
the policy as the artifact [image.vla-policies/policy] (convert=tar-extract), exactly as
meta-vla's vla-policy-update recipe writes it; a RAUC system.conf ending with the
fragment meta-vla's rauc-conf.bbappend appends (artifact repository and handlers); an
initramfs. Then boots the VM, which runs
scripts/rauc/inside.sh, and checks what it recorded:

- good: RAUC exits 0 only after the daemon passed B's parity gate and ran it; B is
  current; its context binaries are the artifact's inodes (hard links, not copies).
- gate-fails: RAUC fails because the post-install handler reports the daemon's rollback;
  B is current again and the state names C and the gate.
- untrusted: RAUC fails in the pre-install handler (vlad bundle verify) before writing:
  the artifact repository still points at B's artifact; B is still current.
- the daemon ran throughout.
Exits 1 with the reasons if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
from vla_host.ota_fixtures import (FASTWAM_CONTROL, FixtureError, daemon_config, hex64,
                          signed_policy_bundle)

import vm  # noqa: E402

HANDLER = REPO / "meta-vla/dynamic-layers/rauc/recipes-vla/vla-rauc/files/vla-rauc-handler"
SYSTEM_CONF_FRAGMENT = REPO / "meta-vla/dynamic-layers/rauc/recipes-core/rauc/files/vla-rauc-system.conf"
FIXTURE = REPO / "golden/bundles/fastwam"
PROBE_FILE = "ctx/action_step_socid77_archv73.bin"
# Modules RAUC needs besides the 9p shares; dependencies are resolved from each module's
# own modinfo.
RAUC_MODULES = ["loop", "squashfs", "dm_verity"]
COMPATIBLE = "vla-check"


def log(msg: str) -> None:
    print(f"rauc-check: {msg}", flush=True)


def run(*args: str | Path, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise SystemExit(f"rauc-check: {' '.join(map(str, args))} exited {p.returncode}:\n"
                         f"{p.stdout}{p.stderr}")
    return p


# ------------------------------------------------------------------------- policy bundles

def rauc_bundle(rauc: Path, out: Path, name: str, policy: Path, version: str,
                cert: Path, key: Path) -> Path:
    """The RAUC bundle meta-vla's vla-policy-update recipe builds (bundle.bbclass with
    RAUC_SLOT_vla-policies/policy[type] = "file", [convert] = "tar-extract")."""
    content = out / f"{name}-content"
    content.mkdir()
    # The policy directory's contents, not the directory: the artifact tree is the bundle.
    run("tar", "--sort=name", "--owner=0", "--group=0", "--numeric-owner",
        "-C", policy, "-cf", content / "vla-policy.tar", ".")
    (content / "manifest.raucm").write_text(
        "[update]\n"
        f"compatible={COMPATIBLE}\n"
        f"version={version}\n"
        f"description=VLA policy {policy.name}\n\n"
        "[bundle]\nformat=verity\n\n"
        "[image.vla-policies/policy]\n"
        "filename=vla-policy.tar\n"
        "convert=tar-extract\n")
    bundle = out / f"{name}.raucb"
    run(rauc, "bundle", "--cert", cert, "--key", key, content, bundle)
    shutil.rmtree(content)
    return bundle


# ------------------------------------------------------------------------------ the VM

def boot(kernel_dir: Path, image: Path, work: Path, out: Path, timeout: float, cpus: int) -> float:
    cmd = vm.qemu_command(kernel_dir, image, work, cpus=cpus)
    log(f"booting the VM (qemu TCG, {cpus} vCPU)")
    start = time.monotonic()
    with open(out / "console.log", "w") as console:
        try:
            subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"rauc-check: the VM did not finish within {timeout:.0f} s; "
                             f"see {out / 'console.log'}")
    return time.monotonic() - start


# --------------------------------------------------------------------------- the checks

def judge(results: Path, hashes: dict[str, str]) -> list[str]:
    problems: list[str] = []

    def read(name: str) -> str:
        p = results / name
        return p.read_text() if p.exists() else ""

    def expect(cond: bool, what: str, evidence: str = "") -> None:
        if not cond:
            problems.append(what + (f"\n    {evidence.strip()[:2000]}" if evidence else ""))

    if not read("finished"):
        return ["the scenario did not finish; see console.log"]
    a, b, c, d = (hashes[k] for k in ("a", "good", "gate-fails", "untrusted"))
    expect(read("a-verdict.rc").strip() == "0", "bundle A never ran in the daemon", read("a-verdict.out"))

    out = read("good.out")
    expect(read("good.rc").strip() == "0", "RAUC failed to install the good bundle", out)
    expect(f"{b} passed" in out, "the handler did not report the daemon's verdict on B", out)
    expect(read("good.current").strip().endswith(b), "B is not current after its install",
           read("good.status"))
    inodes = read("good.inodes").split("\n")
    same = len(inodes) >= 2 and inodes[0].split()[:1] == inodes[1].split()[:1] and inodes[0][:1].isdigit()
    expect(same, "B's context binary is not a hard link of the RAUC artifact", read("good.inodes"))

    out = read("gate-fails.out")
    expect(read("gate-fails.rc").strip() not in ("", "0"), "RAUC reported the gate-failing bundle as installed", out)
    expect(f"rolled {c} back to {b}" in out and "parity" in out,
           "the handler did not report the daemon's rollback of C with the gate's reason", out)
    expect(read("gate-fails.current").strip().endswith(b), "B is not current after C's rollback",
           read("gate-fails.status"))
    expect(c[:12] in read("gate-fails.status") and "last rollback" in read("gate-fails.status"),
           "vlad ota status does not name C's rollback", read("gate-fails.status"))

    out = read("untrusted.out")
    expect(read("untrusted.rc").strip() not in ("", "0"), "RAUC installed a policy signed by an untrusted key", out)
    expect("pre-install" in out.lower() or "policy refused" in out, "the refusal did not come from the pre-install handler", out)
    expect("trusted" in out, "the refusal does not say the signer is not trusted", out)
    expect(read("untrusted.artifact") == read("gate-fails.artifact"),
           "the artifact repository changed although the pre-install handler refused",
           read("gate-fails.artifact") + " -> " + read("untrusted.artifact"))
    expect(read("untrusted.current").strip().endswith(b), "B is no longer current after the refused install",
           read("untrusted.status"))
    expect(d not in read("untrusted.status"), "the untrusted bundle reached the store", read("untrusted.status"))

    for name in ("good", "gate-fails", "untrusted"):
        expect(read(f"{name}.daemon").strip() == "running", f"the daemon was not running after `{name}`",
               read("daemon.log")[-2000:])
    expect(read("daemon.rc").strip() == "0", "the daemon did not stop cleanly", read("daemon.log")[-2000:])
    del a
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vlad", type=Path, required=True)
    ap.add_argument("--rauc", type=Path, required=True)
    ap.add_argument("--kernel-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    # The one guard against a hang: the scenario's waits are keyed on the daemon's
    # progress. About 2x the VM of the most loaded run measured (1727 s; the quiet one took
    # 408.6 s; emulator-only figures, docs/testing.md).
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds the VM may run")
    a = ap.parse_args()
    try:
        cpus = vm.cpus_from_env()
    except vm.VmError as e:
        raise SystemExit(f"rauc-check: {e}")
    vlad, rauc, kernel_dir = a.vlad.resolve(), a.rauc.resolve(), a.kernel_dir.resolve()
    out = a.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    work = out / "work"
    work.mkdir(parents=True)

    # Keys: the fleet's Ed25519 policy key (trusted by vlad), another one (not trusted),
    # and an X.509 signer for RAUC bundles (the RAUC keyring).
    fleet_key, other_key = work / "fleet.key", work / "other.key"
    public = hex64(run(vlad, "bundle", "keygen", fleet_key).stdout)
    run(vlad, "bundle", "keygen", other_key)
    cert, cert_key = work / "rauc-cert.pem", work / "rauc-key.pem"
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", cert_key, "-out", cert, "-days", "30", "-subj", "/CN=vla-check RAUC signer",
        "-addext", "basicConstraints=critical,CA:FALSE", "-addext", "keyUsage=digitalSignature")

    # Device paths inside the VM: one tmpfs (/run) holds the OTA root and the artifact
    # repository, so hard links between them are possible, as on the device's data partition.
    ota_root = Path("/run/vla-check/ota")
    rauc_repo = ota_root / "rauc"
    cfg = daemon_config(json.loads((REPO / "config/dev.json").read_text()), ota_root, public,
                        "vla-check", FASTWAM_CONTROL, trial_inferences=1, max_trial_starts=3)
    config = work / "vlad.json"
    config.write_text(json.dumps(cfg, indent=2) + "\n")

    log("building the policy bundles and the RAUC bundles")
    policies = work / "policies"
    policies.mkdir()
    try:
        bundles = {
            "a": signed_policy_bundle(vlad, FIXTURE, policies, "bundle-a", "1.0.0", fleet_key),
            "good": signed_policy_bundle(vlad, FIXTURE, policies, "good", "1.1.0", fleet_key),
            # Signed and intact, but its golden disagrees: only the daemon's gate refuses it.
            "gate-fails": signed_policy_bundle(vlad, FIXTURE, policies, "gate-fails", "1.2.0",
                                               fleet_key, tamper=True),
            "untrusted": signed_policy_bundle(vlad, FIXTURE, policies, "untrusted", "1.3.0", other_key),
        }
    except FixtureError as e:
        raise SystemExit(f"rauc-check: {e}")
    shutil.move(str(bundles["a"]), work / "bundle-a")
    hashes = {"a": run("sha256sum", work / "bundle-a/ota-manifest.json").stdout.split()[0]}
    for name in ("good", "gate-fails", "untrusted"):
        policy = bundles[name]
        hashes[name] = run("sha256sum", policy / "ota-manifest.json").stdout.split()[0]
        version = json.loads((policy / "bundle.json").read_text())["version"]
        rauc_bundle(rauc, work, name, policy, version, cert, cert_key)
    info = run(rauc, "info", "--keyring", cert, work / "good.raucb").stdout
    if "vla-policies" not in info or "policy" not in info:
        raise SystemExit(f"rauc-check: rauc info does not list the artifact:\n{info}")
    shutil.rmtree(policies)

    # The product's own part of system.conf, then meta-vla's fragment as the layer's
    # rauc-conf.bbappend appends it, with this check's paths.
    fragment = SYSTEM_CONF_FRAGMENT.read_text()
    for device_path, here in (("/var/lib/vla/rauc", str(rauc_repo)), ("/usr/libexec/vla", str(work))):
        if device_path not in fragment:
            raise SystemExit(f"rauc-check: {SYSTEM_CONF_FRAGMENT} no longer names {device_path}")
        fragment = fragment.replace(device_path, here)
    (work / "system.conf").write_text(
        "[system]\n"
        f"compatible={COMPATIBLE}\n"
        "bootloader=noop\n"
        "data-directory=/run/vla-check/rauc-data\n\n"
        f"[keyring]\npath={cert}\n\n"
        "[slot.rootfs.0]\ndevice=/dev/null\ntype=raw\nbootname=A\n"
        + fragment)
    shutil.copy(HANDLER, work / "vla-rauc-handler")
    for phase in ("pre-install", "post-install"):
        os.symlink("vla-rauc-handler", work / f"rauc-{phase}")
    shutil.copy(REPO / "scripts/rauc/inside.sh", work / "inside.sh")
    (work / "env.sh").write_text("\n".join([
        f"VLAD={vlad}",
        f"RAUC={rauc}",
        f"VLAD_CONFIG={config}",
        f"VLA_QNN_LIB_DIR={os.environ['VLA_QNN_LIB_DIR']}",
        # The verdict waits' slack (vlad ota verdict --wait): counted only while no daemon
        # runs and, after the gate, on top of twice the gate's measured inference time;
        # loading and gating, however slow, are progress. The VM's limit is the hang guard.
        "VLA_RAUC_WAIT=120",
        f"OTA_ROOT={ota_root}",
        f"RAUC_REPO={rauc_repo}",
        "RAUC_DATA=/run/vla-check/rauc-data",
        "RAUC_MOUNT=/run/vla-check/mnt",
        f"PROBE_FILE={PROBE_FILE}",
    ]) + "\n")

    try:
        image, modules = vm.initramfs(kernel_dir, work, out, RAUC_MODULES)
    except vm.VmError as e:
        raise SystemExit(f"rauc-check: {e}")
    log(f"initramfs: busybox and {len(modules)} modules ({', '.join(modules)})")
    seconds = boot(kernel_dir, image, work, out, a.timeout, cpus)
    results = work / "results"
    log(f"VM ran {seconds:.1f} s")
    summary = {"vm_seconds": round(seconds, 1), "vm_cpus": cpus, "hashes": hashes}
    for name in ("good", "gate-fails", "untrusted"):
        t = (results / f"{name}.time")
        if t.exists():
            start, end = map(float, t.read_text().split())
            summary[f"{name}_install_seconds"] = round(end - start, 2)
            summary[f"{name}_rauc_exit"] = int((results / f"{name}.rc").read_text())
    problems = judge(results, hashes)
    summary["problems"] = problems
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name in ("good", "gate-fails", "untrusted"):
        p = results / f"{name}.out"
        if p.exists():
            print(f"--- rauc install {name}.raucb (exit {summary.get(name + '_rauc_exit')}, "
                  f"{summary.get(name + '_install_seconds')} s)")
            for line in p.read_text().splitlines():
                if "vla-rauc" in line or "vlad" in line or "handler" in line.lower() or "Installing" in line:
                    print("    " + line[:220])
    if problems:
        for p in problems:
            log("FAILED: " + p)
        log(f"logs: {out}")
        return 1
    log(f"passed: good installed and gated, gate failure rolled back and reported, untrusted "
        f"refused before RAUC wrote anything (summary: {out / 'summary.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
