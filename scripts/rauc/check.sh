#!/usr/bin/env bash
# Fleet OTA through real RAUC: a policy bundle shipped as a RAUC artifact
# ([image.vla-policies/policy], repository type `trees`) is installed by RAUC 1.13 with
# meta-vla's handler (meta-vla/dynamic-layers/rauc/recipes-vla/vla-rauc/files/vla-rauc-handler), which hands
# it to vlad: verify before RAUC writes, hard-linked install, activation, the running
# daemon's parity gate, and the verdict reported back as RAUC's install result.
#
#   scripts/rauc/check.sh
#   VLA_VM_CPUS=1 scripts/rauc/check.sh     # the VM with one vCPU (default 2)
#
# RAUC installs artifacts only from verity bundles, which need the kernel's device mapper
# (dm-verity) and loop devices. So the install runs in a small VM: Debian's stock kernel
# under qemu (KVM when /dev/kvm is usable), with this machine's root file system shared
# read-only over 9p, so rauc, vlad and the QNN HTP emulator run there as they do here.
# Set-up (idempotent, cached in build/): Debian packages; RAUC 1.13 built from Debian's
# source tarball (SHA-256 pinned); the current Debian bookworm kernel package.
# Results and logs: build/rauc-check/.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
. scripts/rauc/vm-setup.sh
vm_apt_packages qemu-system-x86 busybox-static squashfs-tools cpio meson ninja-build pkgconf \
    libglib2.0-dev libssl-dev openssl xz-utils

# RAUC 1.13 (the first release with artifact repositories; Debian bookworm ships 1.8).
rauc_version=1.13
rauc_sha256=1ddb218a5d713c8dbd6e04d5501d96629f1c8e2521576fbd9e7751edb7da113e
tools=build/tools
rauc_bin="$tools/rauc-$rauc_version/build/rauc"
if [[ ! -x $rauc_bin ]]; then
    mkdir -p "$tools"
    tarball="$tools/rauc_$rauc_version.orig.tar.xz"
    if [[ ! -f $tarball ]]; then
        echo "rauc-check: fetching RAUC $rauc_version source from Debian"
        curl -fsSL -o "$tarball.part" \
            "http://deb.debian.org/debian/pool/main/r/rauc/rauc_$rauc_version.orig.tar.xz"
        mv "$tarball.part" "$tarball"
    fi
    echo "$rauc_sha256  $tarball" | sha256sum -c --quiet
    rm -rf "$tools/rauc-$rauc_version"
    tar -C "$tools" -xf "$tarball"
    echo "rauc-check: building RAUC $rauc_version (no D-Bus service: installs run in-process)"
    (cd "$tools/rauc-$rauc_version" &&
        meson setup build -Dservice=false -Dnetwork=false -Dstreaming=false \
            -Djson=disabled -Dgpt=disabled -Dtests=false -Dhtmldocs=false \
            -Dsystemdunitdir=/nonexistent -Ddbuspolicydir=/nonexistent \
            -Ddbussystemservicedir=/nonexistent -Ddbusinterfacesdir=/nonexistent \
            -Dsystemdcatalogdir=/nonexistent >/dev/null &&
        ninja -C build >/dev/null)
fi

kernel_dir=build/rauc-check/kernel
vm_kernel "$kernel_dir"

cargo build --release --locked -p vlad 2>&1 | tail -1
target_dir="${CARGO_TARGET_DIR:-target}"
exec .venv/bin/python scripts/rauc/check.py --vlad "$target_dir/release/vlad" \
    --rauc "$rauc_bin" --kernel-dir "$kernel_dir" --out build/rauc-check/run
