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
#
# Usage: scripts/test.sh            every step, in order (what CI runs)
#        scripts/test.sh STEP...    only the named steps, in the order given
#        scripts/test.sh --list     the step names and what each runs
# Set-up (scripts/setup.sh and the environment below) runs for any selection.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# The steps, in the order of a whole run: name and title. Each name has a step_<name>
# function below (a dash in the name is an underscore in the function).
step_names=(fmt clippy rust pytest libero aarch64 release qairt-aarch64 bringup layer rauc
    fleet powercut soak)
declare -A step_titles=(
    [fmt]="cargo fmt --check"
    [clippy]="cargo clippy -D warnings"
    [rust]="Rust tests (x86_64, real QNN HTP emulator), with SIGHUP ignored"
    [pytest]="Python fixture tests"
    [libero]="LIBERO as the robot, each policy on its upstream stack: short episodes through vlad, the live-path checks (tools/vla_libero)"
    [aarch64]="aarch64 build and QNN-free tests under qemu-aarch64"
    [release]="release binary: size and NEEDED"
    [qairt-aarch64]="aarch64 vlad on the real aarch64 QNN libraries under qemu-aarch64"
    [bringup]="board bring-up kit over a real SSH round trip (loopback sshd, emulator as the NPU)"
    [layer]="meta-vla layer and systemd units"
    [rauc]="fleet OTA through real RAUC: policy artifact, handlers, the daemon's verdict (qemu VM)"
    [fleet]="fleet rollout through a hawkBit-DDI server: goosebit, rauc-hawkbit agents, 4 devices, canary and threshold"
    [powercut]="power cuts under the OTA store at the block level: 3 cuts (qemu VM, docs/powercut.md)"
    [soak]="short soak: the daemon under injected faults (docs/soak.md)"
)

step_fmt() {
    cargo fmt --all -- --check
}

step_clippy() {
    cargo clippy --workspace --all-targets --locked -- -D warnings
}

step_rust() {
    # Run with SIGHUP ignored, as under `nohup` or a CI runner that ignores it: every child a
    # test starts inherits that, so a test that relies on the default disposition fails here.
    env --ignore-signal=HUP cargo test --workspace --locked
}

step_pytest() {
    # The packages' own tests (tools/<package>/tests; vla_libero's and vla_fleet's run in
    # their venvs below), the goldens command's, and the CI harnesses' (scripts/).
    .venv/bin/python -m pytest -q tools/vla_host/tests tools/vla_import/tests tools/goldens/tests \
        scripts/tests scripts/rauc
}

step_libero() {
    # One venv per stack, pinned with hashes, pip's wheel cache shared (Fast-WAM: official LIBERO
    # content on MuJoCo 3.3.2; MolmoAct2: LeRobot's hf-libero on MuJoCo 3.8.1), the ring shim
    # compiled from vla_ring.h; headless EGL rendering. 20-step episodes on the closed-loop
    # Fast-WAM fixture (2 cameras 40x48; one with faults injected on the live path), an eval on
    # two workers and its resume, through the ring bridge over a loopback sshd, and on the tiny
    # MolmoAct2 bundle, on the emulator: 4 min + 1.5-2 min here at load average 15 on 2 cores,
    # plus 2.5 min for both venvs on a fresh machine (1.5 min for the one venv before).
    scripts/setup_libero.sh fastwam
    MUJOCO_GL=egl build/libero-fastwam-venv/bin/python -m pytest -q -p no:cacheprovider \
        tools/vla_libero/tests/test_conventions.py tools/vla_libero/tests/test_libero.py
    scripts/setup_libero.sh molmoact2
    MUJOCO_GL=egl build/libero-molmoact2-venv/bin/python -m pytest -q -p no:cacheprovider \
        tools/vla_libero/tests/test_conventions.py tools/vla_libero/tests/test_molmoact2.py
}

step_aarch64() {
    # The QNN wheel is x86_64-only, so the aarch64 run covers the library crates' tests that
    # need no QNN library (the QNN tests report that they skipped). Tests that start another
    # process from an aarch64 binary need binfmt_misc, which this machine lacks: vlad's CLI
    # tests, vla-bench's, and vla-ota's crash-injection children run on x86_64 only.
    # The ring stress test starts its writer child through qemu itself; QEMU_LD_PREFIX lets
    # that child find the aarch64 loader. vla-ota's pack-signal test signals host children
    # the emulated process starts; under qemu-user they showed SIGUSR2 blocked: x86_64 only.
    env -u VLA_QNN_LIB_DIR -u VLA_REQUIRE_QNN QEMU_LD_PREFIX=/usr/aarch64-linux-gnu \
        VLA_RING_TEST_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
        cargo test --locked --target aarch64-unknown-linux-gnu \
        -p vla-tensor -p vla-npz -p vla-ring -p vla-config -p vla-control -p vla-parity \
        -p vla-qnn -p vla-policy -p vla-ota \
        -- --skip crash_during --skip full_disk_on_a_real_tmpfs \
        --skip a_pack_install_sends_sigusr2_only_to_a_daemon_that_catches_it_else_sighup
    # The C ring client library for the board (runtime/ring-c: Debian's cross gcc, the strict
    # flags, the bridge linked statically), and its bridge's requests under qemu-aarch64.
    make -s -C runtime/ring-c ARCH=aarch64
    ring_bridge_round_trip build/ring-c/aarch64/vla-ring-bridge
}

# ring_bridge_round_trip BRIDGE: a poll of an action ring that is not there yet, an
# observation published, one of the wrong state length refused by name (geometry: one
# 2x2 camera, 2 state values, 2 action values, chunks of 2; requests in vla_ring_bridge.c).
ring_bridge_round_trip() {
    local dir out poll published seq capture refused ok=1
    dir="$(mktemp -d)"
    out="$dir/replies"
    {
        printf 'P'
        printf 'O\0\0\0\0\0\0\0\0\0\0\0\0\2\0\0\0\0\0\0\0\14\0\0\0\0\0\0\0'
        head -c 20 /dev/zero
        printf 'O\0\0\0\0\0\0\0\0\0\0\0\0\1\0\0\0\0\0\0\0\14\0\0\0\0\0\0\0'
        head -c 16 /dev/zero
    } | qemu-aarch64 "$1" "$dir/obs" "$dir/act" 1 2 2 2 2 2 >"$out"
    u64() { od -An -tu8 -j"$1" -N8 "$out" | tr -d ' '; }
    poll="$(od -An -tu1 -N1 "$out" | tr -d ' ')" published="$(u64 1)" seq="$(u64 9)"
    capture="$(u64 17)" refused="$(u64 25)"
    echo "ring bridge: poll $poll (published $published), publish seq $seq at $capture ns, wrong state seq $refused"
    [[ $poll == 0 && $published == 0 && $seq == 1 && $capture -gt 0 && $refused == 0 ]] || ok=0
    grep -aq "observation refused: state has 1 values, the ring's state_dims is 2" "$out" || ok=0
    rm -rf "$dir"
    ((ok)) || echo "ring bridge: unexpected replies" >&2
    ((ok))
}

step_release() {
    scripts/check_release.sh
}

step_qairt_aarch64() {
    # QAIRT's device side from the pinned public wheel (scripts/fetch_qairt_aarch64.sh, into
    # build/): inspect of every fixture identical to x86_64, the HTP backend's one-line
    # refusal off the board, bundle verify and the OTA store. Reuses check_release.sh's
    # aarch64 release build (run alone, it makes that build itself); about 30 s.
    scripts/qemu_qairt_check.sh
}

step_bringup() {
    scripts/bringup/tests/loopback.sh
}

step_layer() {
    scripts/check_layer.sh
}

step_rauc() {
    scripts/rauc/check.sh
}

step_fleet() {
    # Its own venv (goosebit 0.2.12, rauc-hawkbit 0.2.0; pinned with hashes); RAUC 1.13 from the
    # check above; target/release/vlad. Four device stand-ins on the emulator, each with its own
    # store, daemon, robot and agent; three rollouts: about 75 s here (plus 2-3 min for the venv on a fresh
    # machine, PyGObject is built from source).
    scripts/setup_fleet.sh
    .venv/bin/python -m pytest -q -p no:cacheprovider tools/vla_fleet/tests
}

step_powercut() {
    scripts/rauc/powercut.sh --cuts 3
}

step_soak() {
    scripts/soak.sh
}

for name in "${step_names[@]}"; do
    declare -F "step_${name//-/_}" >/dev/null || { echo "scripts/test.sh: step '$name' has no function" >&2; exit 1; }
done
if [[ "${1:-}" == "--list" ]]; then
    for name in "${step_names[@]}"; do
        printf '%-14s %s\n' "$name" "${step_titles[$name]}"
    done
    exit 0
fi
selected=("$@")
if [[ ${#selected[@]} -eq 0 ]]; then
    selected=("${step_names[@]}")
fi
for name in "${selected[@]}"; do
    if [[ -z "${step_titles[$name]+set}" ]]; then
        echo "scripts/test.sh: unknown step '$name'; the steps are: ${step_names[*]}" >&2
        exit 2
    fi
done

scripts/setup.sh
export VLA_QNN_LIB_DIR="$(cat build/qnn-lib-dir)"
export VLA_REQUIRE_QNN=1
# A test that cannot run here (no unshare, not root) fails instead of skipping.
export VLA_REQUIRE_ALL_TESTS=1
export CARGO_TERM_COLOR=never

for name in "${selected[@]}"; do
    printf '\n=== %s\n' "${step_titles[$name]}"
    "step_${name//-/_}"
done
