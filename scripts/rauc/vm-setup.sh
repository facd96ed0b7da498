# Set-up shared by the scripts that boot the qemu VM (scripts/rauc/check.sh,
# scripts/rauc/powercut.sh); sourced, not run, from the repository root under
# `set -euo pipefail`. Runs scripts/setup.sh and exports VLA_QNN_LIB_DIR (the emulator's
# libraries, which the VM reads from this machine), then offers (idempotent, cached in
# build/):
#   vm_apt_packages PKG...   installs the Debian packages that are missing
#   vm_kernel DIR            Debian's current bookworm kernel package unpacked in DIR
#                            (DIR/vmlinuz, DIR/root/lib/modules/...)

scripts/setup.sh >/dev/null
VLA_QNN_LIB_DIR="$(cat build/qnn-lib-dir)"
export VLA_QNN_LIB_DIR

vm_sudo=()
[[ $(id -u) -eq 0 ]] || vm_sudo=(sudo)

vm_apt_packages() {
    local p missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        echo "vm-setup: installing Debian packages: ${missing[*]}"
        "${vm_sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        "${vm_sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

vm_kernel_package() {
    apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}

# Debian's current bookworm kernel (the archive keeps only the current ABI's package).
vm_kernel() {
    local kernel_dir=$1 package
    [[ -f $kernel_dir/vmlinuz ]] && return 0
    package=$(vm_kernel_package)
    if [[ -z $package ]]; then
        "${vm_sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        package=$(vm_kernel_package)
    fi
    [[ -n $package ]] || { echo "vm-setup: no linux-image package found by apt" >&2; return 1; }
    echo "vm-setup: fetching kernel package $package"
    rm -rf "$kernel_dir" && mkdir -p "$kernel_dir/deb"
    (cd "$kernel_dir/deb" && apt-get download -q "$package" >/dev/null 2>&1)
    dpkg-deb -x "$kernel_dir"/deb/*.deb "$kernel_dir/root"
    cp "$kernel_dir"/root/boot/vmlinuz-* "$kernel_dir/vmlinuz"
    rm -rf "$kernel_dir/deb"
}
