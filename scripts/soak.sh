#!/usr/bin/env bash
# Soak of the vlad daemon with the simulated robot and injected faults (docs/soak.md):
# SIGHUP reloads, firmware restarts (SIGKILL of the ring writer), robot silences, an OTA
# bundle that fails its parity gate (must roll back) and a good one, NPU faults through
# the fault-injecting QNN library, then a phase where
# inference is slower than a chunk lasts. Reports deadline misses, holds, action
# staleness and the daemon's RSS after warm-up; exits 1 if a check fails.
#
#   scripts/soak.sh [--duration SECONDS] [--bundle NAME]
#
# --duration  seconds of fault injection once the daemon is ready (default 150, the CI
#             soak; e.g. 1800 for a long one). Start-up and gating come on top.
# --bundle    fixture under golden/bundles (default fastwam, 0.5 s per inference on the
#             emulator; molmoact2-lp-vtp-sd runs at the demo's 2 Hz).
# Logs, configs, per-simulator JSON and summary.json land in build/soak/.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
duration=150
bundle=fastwam
while (($#)); do
    case "$1" in
        --duration) duration="${2:?--duration needs SECONDS}"; shift 2 ;;
        --bundle) bundle="${2:?--bundle needs NAME}"; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "soak.sh: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
    esac
done
scripts/setup.sh
export VLA_QNN_LIB_DIR="$(cat build/qnn-lib-dir)"
# vla-qnn-faults: the NPU phase's fault-injecting QNN library (test support, not in the image).
cargo build --release --locked -p vlad -p vla-qnn-faults 2>&1 | tail -1
target_dir="${CARGO_TARGET_DIR:-target}"
exec .venv/bin/python scripts/soak.py --vlad "$target_dir/release/vlad" \
    --faults-lib "$target_dir/release/libvla_qnn_faults.so" \
    --duration "$duration" --bundle "$bundle"
