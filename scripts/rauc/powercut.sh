#!/usr/bin/env bash
# Power cuts at the block level under the OTA store: the qemu VM of scripts/rauc/check.sh,
# with the store on an ext4 disk image (virtio-blk, cache=none), runs install, activate,
# trial, commit and gc in a loop while qemu is killed (SIGKILL) at random moments; each
# next boot checks that nothing was lost (scripts/rauc/powercut.py says what exactly).
#
#   scripts/rauc/powercut.sh [--cuts N] [--seed S]     # default 30 cuts, a random seed
#   VLA_VM_CPUS=1 scripts/rauc/powercut.sh ...           # the VM with one vCPU (default 2)
#
# Set-up as scripts/rauc/check.sh (Debian packages, Debian's kernel, cached in build/).
# Results and logs: build/powercut/. Exit status 0 nothing lost, 1 a check failed or the
# run could not be made, 2 usage.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
. scripts/rauc/vm-setup.sh
vm_apt_packages qemu-system-x86 busybox-static cpio e2fsprogs
kernel_dir=build/rauc-check/kernel
vm_kernel "$kernel_dir"

cargo build --release --locked -p vlad 2>&1 | tail -1
target_dir="${CARGO_TARGET_DIR:-target}"
exec .venv/bin/python scripts/rauc/powercut.py --vlad "$target_dir/release/vlad" \
    --kernel-dir "$kernel_dir" --out build/powercut "$@"
