#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh machine for building, testing and running the
# runtime here: Debian packages (aarch64 cross toolchain, qemu-user, C compiler), the
# aarch64 Rust target, and the project venv with the pinned QNN wheel (whose
# libQnnHtp.so runs real v73 context binaries on an HTP emulator).
# Prints nothing but progress lines; the QNN library dir is in build/qnn-lib-dir.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=setup_lib.sh
source "$repo_root/scripts/setup_lib.sh"
cd "$repo_root"
mkdir -p build

# make: the C ring client library (runtime/ring-c/Makefile), for the tests and the board.
apt_packages=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user binutils make)
apt_ensure setup "${apt_packages[@]}"

if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    echo "setup: adding Rust target aarch64-unknown-linux-gnu"
    rustup target add aarch64-unknown-linux-gnu >/dev/null
fi

echo "setup: Python venv (.venv) with the pinned QNN wheel"
scripts/setup_python.sh > build/qnn-lib-dir
echo "setup: QNN libraries in $(cat build/qnn-lib-dir)"
