#!/usr/bin/env bash
# Runs every check and test of the project on this machine (what CI runs):
#   formatting, clippy, the Rust tests on x86_64 against the real QNN HTP emulator,
#   the Python fixture tests, one LIBERO episode through vlad (tools/vla_libero),
#   the aarch64 build with its QNN-free tests under qemu,
#   the aarch64 vlad on Qualcomm's aarch64 QNN libraries under qemu,
#   the release binary's dynamic dependencies, the layer/unit checks, fleet OTA through
#   real RAUC in a qemu VM, a fleet rollout through a hawkBit-DDI server (goosebit) to four
#   device stand-ins, power cuts under the OTA store in that VM, and a short
#   fault-injecting soak.
# Builds are cached in the repo's target/ directory.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
scripts/setup.sh
export VLA_QNN_LIB_DIR="$(cat build/qnn-lib-dir)"
export VLA_REQUIRE_QNN=1
# A test that cannot run here (no unshare, not root) fails instead of skipping.
export VLA_REQUIRE_ALL_TESTS=1
export CARGO_TERM_COLOR=never

step() { printf '\n=== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "Rust tests (x86_64, real QNN HTP emulator), with SIGHUP ignored"
# Run with SIGHUP ignored, as under `nohup` or a CI runner that ignores it: every child a
# test starts inherits that, so a test that relies on the default disposition fails here.
env --ignore-signal=HUP cargo test --workspace --locked

step "Python fixture tests"
.venv/bin/python -m pytest -q scripts/tests

step "LIBERO as the robot, each policy on its upstream stack: short episodes through vlad, the live-path checks (tools/vla_libero)"
# One venv per stack, pinned with hashes, pip's wheel cache shared (Fast-WAM: official LIBERO
# content on MuJoCo 3.3.2; MolmoAct2: LeRobot's hf-libero on MuJoCo 3.8.1), the ring shim
# compiled from vla_ring.h; headless EGL rendering. 20-step episodes on the closed-loop
# Fast-WAM fixture (2 cameras 40x48; one with faults injected on the live path), an eval on
# two workers and its resume, through the ring bridge over a loopback sshd, and on the tiny
# MolmoAct2 bundle, on the emulator: 4 min + 1.5-2 min here at load average 15 on 2 cores,
# plus 2.5 min for both venvs on a fresh machine (1.5 min for the one venv before).
scripts/setup_libero.sh fastwam
MUJOCO_GL=egl PYTHONPATH=tools build/libero-fastwam-venv/bin/python -m pytest -q -p no:cacheprovider \
    tools/vla_libero/tests/test_conventions.py tools/vla_libero/tests/test_libero.py
scripts/setup_libero.sh molmoact2
MUJOCO_GL=egl PYTHONPATH=tools build/libero-molmoact2-venv/bin/python -m pytest -q -p no:cacheprovider \
    tools/vla_libero/tests/test_conventions.py tools/vla_libero/tests/test_molmoact2.py

step "aarch64 build and QNN-free tests under qemu-aarch64"
# The QNN wheel is x86_64-only, so the aarch64 run covers the library crates' tests that
# need no QNN library (the QNN tests report that they skipped). Tests that start another
# process from an aarch64 binary need binfmt_misc, which this machine lacks: vlad's CLI
# tests, vla-bench's, and vla-ota's crash-injection children run on x86_64 only.
# The ring stress test starts its writer child through qemu itself; QEMU_LD_PREFIX lets
# that child find the aarch64 loader.
env -u VLA_QNN_LIB_DIR -u VLA_REQUIRE_QNN QEMU_LD_PREFIX=/usr/aarch64-linux-gnu \
    VLA_RING_TEST_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
    cargo test --locked --target aarch64-unknown-linux-gnu \
    -p vla-tensor -p vla-npz -p vla-ring -p vla-config -p vla-control -p vla-parity \
    -p vla-qnn -p vla-policy -p vla-ota \
    -- --skip crash_during --skip full_disk_on_a_real_tmpfs

step "release binary: size and NEEDED"
scripts/check_release.sh

# --- issue 16: the aarch64 vlad on Qualcomm's real aarch64 QNN libraries (qemu) --------
# QAIRT's device side from the pinned public wheel (scripts/fetch_qairt_aarch64.sh, into
# build/): inspect of every fixture identical to x86_64, the HTP backend's one-line
# refusal off the board, bundle verify and the OTA store. Reuses check_release.sh's
# aarch64 release build; about 30 s.
step "aarch64 vlad on the real aarch64 QNN libraries under qemu-aarch64"
scripts/qemu_qairt_check.sh
# --- end issue 16 ----------------------------------------------------------------------

step "board bring-up kit over a real SSH round trip (loopback sshd, emulator as the NPU)"
scripts/bringup/tests/loopback.sh

step "meta-vla layer and systemd units"
scripts/check_layer.sh

step "fleet OTA through real RAUC: policy artifact, handlers, the daemon's verdict (qemu VM)"
scripts/rauc/check.sh

step "fleet rollout through a hawkBit-DDI server: goosebit, rauc-hawkbit agents, 4 devices, canary and threshold"
# Its own venv (goosebit 0.2.12, rauc-hawkbit 0.2.0; pinned with hashes); RAUC 1.13 from the
# check above; target/release/vlad. Four device stand-ins on the emulator, each with its own
# store, daemon, robot and agent; three rollouts: about 75 s here (plus 2-3 min for the venv on a fresh
# machine, PyGObject is built from source).
scripts/setup_fleet.sh
.venv/bin/python -m pytest -q -p no:cacheprovider tools/vla_fleet/tests

step "power cuts under the OTA store at the block level: 3 cuts (qemu VM, docs/powercut.md)"
scripts/rauc/powercut.sh --cuts 3

step "short soak: the daemon under injected faults (docs/soak.md)"
scripts/soak.sh
