"""The small qemu VM the RAUC check and the power-cut run boot (scripts/rauc/check.py,
scripts/rauc/powercut.py): an initramfs with busybox, the kernel modules a scenario needs
and scripts/rauc/vm-init.sh as /init, and the qemu command line that boots Debian's stock
kernel on it with this machine's root file system shared read-only over 9p and a work
directory shared read-write. The VM runs `<work>/inside.sh` and powers off.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The 9p shares every scenario needs; a scenario adds its own (loop, dm_verity, ext4...).
BASE_MODULES = ["virtio_pci", "9pnet_virtio", "9p"]


# The VM's vCPU count: 2 unless the environment says otherwise. The stress runs in docs/testing.md
# give the VM one vCPU (one TCG thread) to see the slow steps pass at a machine's worst.
CPUS_VARIABLE = "VLA_VM_CPUS"
DEFAULT_CPUS = 2


class VmError(Exception):
    """The VM could not be prepared (a module missing from the kernel package) or is
    asked for something it cannot be (a vCPU count that is no positive number)."""


def cpus_from_env(environ: dict[str, str] | None = None) -> int:
    """The vCPU count `VLA_VM_CPUS` asks for (unset or empty: 2)."""
    value = (os.environ if environ is None else environ).get(CPUS_VARIABLE, "").strip()
    if not value:
        return DEFAULT_CPUS
    if not value.isdigit() or int(value) < 1:
        raise VmError(f"{CPUS_VARIABLE}={value!r} is not a positive whole number of vCPUs")
    return int(value)


def modinfo(path: Path) -> dict[str, str]:
    data = path.read_bytes()
    info = {}
    for key in (b"name", b"depends"):
        m = re.search(rb"(?:^|\x00)" + key + rb"=([^\x00]*)\x00", data)
        if m:
            info[key.decode()] = m.group(1).decode()
    return info


def module_order(modules_root: Path, wanted: list[str]) -> list[Path]:
    """The .ko files of `wanted` and of everything they depend on (each module's own
    modinfo), dependencies first. A wanted module built into the kernel is no error only
    if it has no .ko at all; one that is neither is."""
    by_name: dict[str, Path] = {}
    for ko in modules_root.rglob("*.ko"):
        by_name[ko.stem.replace("-", "_")] = ko
    order: list[Path] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        name = name.replace("-", "_")
        if name in seen:
            return
        seen.add(name)
        path = by_name.get(name)
        if path is None:
            return  # built into the kernel
        for dep in filter(None, modinfo(path).get("depends", "").split(",")):
            visit(dep)
        order.append(path)

    for m in wanted:
        if m.replace("-", "_") not in by_name:
            raise VmError(f"kernel module {m} not found under {modules_root}")
        visit(m)
    return order


def initramfs(kernel_dir: Path, work: Path, out: Path, modules: list[str]) -> tuple[Path, list[str]]:
    """Packs busybox, vm-init.sh as /init, the modules (with BASE_MODULES first) and the
    work directory's path into `out/initramfs.cpio.gz`. Returns it and the module names."""
    root = out / "initramfs"
    shutil.rmtree(root, ignore_errors=True)
    (root / "bin").mkdir(parents=True)
    (root / "modules").mkdir()
    shutil.copy("/bin/busybox", root / "bin/busybox")
    shutil.copy(REPO / "scripts/rauc/vm-init.sh", root / "init")
    os.chmod(root / "init", 0o755)
    modules_root = next((kernel_dir / "root/lib/modules").iterdir())
    names = []
    for ko in module_order(modules_root, BASE_MODULES + modules):
        shutil.copy(ko, root / "modules" / ko.name)
        names.append(ko.name)
    (root / "modules/order").write_text("\n".join(names) + "\n")
    (root / "work-path").write_text(str(work) + "\n")
    files = subprocess.run(["find", ".", "-print0"], cwd=root, capture_output=True, check=True).stdout
    cpio = subprocess.run(["cpio", "--null", "-o", "-H", "newc", "--quiet"], cwd=root,
                          input=files, capture_output=True, check=True).stdout
    image = out / "initramfs.cpio.gz"
    image.write_bytes(gzip.compress(cpio, 1))
    return image, [n[:-3] for n in names]


def qemu_command(kernel_dir: Path, image: Path, work: Path, memory_mib: int = 6144,
                 extra: list[str] | None = None, cpus: int | None = None) -> list[str]:
    """qemu-system-x86_64 booting the kernel on `image`, its serial console on stdout, with
    `cpus` vCPUs (default: `cpus_from_env()`)."""
    cpus = cpus_from_env() if cpus is None else cpus
    # Software emulation (TCG), always: nested KVM on these shared machines hangs before
    # the kernel prints a line. QEMU 7.2's TCG has AVX2, which the HTP emulator uses.
    return [
        "qemu-system-x86_64", "-machine", "q35", "-m", str(memory_mib), "-smp", str(cpus),
        "-accel", "tcg", "-cpu", "max",
        "-kernel", str(kernel_dir / "vmlinuz"), "-initrd", str(image),
        "-append", "console=ttyS0 panic=-1 loglevel=6",
        "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
        # The host's / spans several file systems (proc, sys, tmpfs...) whose inode numbers
        # collide: without remapping, the guest mistakes /proc for /sys.
        "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={work},mount_tag=work,security_model=none",
        *(extra or []),
    ]
