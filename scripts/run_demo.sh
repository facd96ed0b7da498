#!/usr/bin/env bash
# The main job on this machine: the vlad daemon runs the tiny golden MolmoAct2 policy on
# Qualcomm's HTP emulator while a simulated robot writes camera frames and state into the
# observation ring and reads actions from the action ring. Prints the loop's figures
# (rate, publish jitter p50/p99/max, inference latency, action freshness) and the robot's.
#
#   scripts/run_demo.sh [SECONDS] [CONFIG]
#
# The emulator runs each context about 100x slower than the NPU, so config/demo-emulator.json
# publishes at 2 Hz (a 10-step chunk then spans 5 s, longer than one emulated inference);
# on the board the same loop runs at the configured 20 Hz.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
seconds="${1:-40}"
config="${2:-config/demo-emulator.json}"
scripts/setup.sh
export VLA_QNN_LIB_DIR="$(cat build/qnn-lib-dir)"
cargo build --release --locked -p vlad 2>&1 | tail -1
vlad=target/release/vlad

log="build/demo-daemon.log"
echo "demo: starting the daemon (log: $log); loading and gating every context first"
"$vlad" run --config "$config" --duration $((seconds + 30)) --log-level info >build/demo-daemon.out 2>"$log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null || true' EXIT
# The simulator waits for nothing: the daemon keeps publishing `hold` until it is ready
# and the robot's first observation arrives.
"$vlad" simulate --config "$config" --duration "$seconds" --timeline build/demo-timeline.csv
kill -TERM "$daemon"
wait "$daemon" || true
trap - EXIT
cat build/demo-daemon.out
grep -m1 -o 'operating point: .*' "$log" || true
.venv/bin/python scripts/plot_timeline.py build/demo-timeline.csv build/demo-timeline.png \
    --title "demo ($config)"
echo "demo: timeline plot (actions per dim, seams, holds) in build/demo-timeline.png"
