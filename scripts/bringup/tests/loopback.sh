#!/usr/bin/env bash
# End-to-end test of scripts/bringup/run.sh through a real SSH round trip: starts Debian's
# sshd on a free loopback port (127.0.0.1 only, its own host key and config in a temp
# dir), and plays the board with the x86_64 vlad and the HTP emulator's QNN libraries
# standing in for QAIRT. Checks deploy, parity, collect, report with plots and clean-up,
# the content-hash cache, password login, and the clear errors (unreachable host, wrong
# architecture, missing QAIRT libraries, full disk, wrong password).
#
# usage: scripts/bringup/tests/loopback.sh [--keep REPORT_DIR]
#   --keep DIR   copy the main run's report (report.md, PNGs, raw/) to DIR
# Needs root (sshd, a throwaway login user, a small tmpfs for the full-disk case).
# Installs openssh-server and sshpass from Debian if missing. Ends with "N passed, N failed".
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$repo_root"
keep=""
if [[ ${1:-} == --keep ]]; then
    keep=${2:?--keep needs a directory}
fi
[[ $(id -u) -eq 0 ]] || { echo "loopback: needs root (sshd, useradd, mount)" >&2; exit 1; }

# --- tools ------------------------------------------------------------------------------
# Debian bookworm's versions; a point release that replaced one falls back to the archive's
# current build of the same package (said on stderr) rather than failing on a vanished pin.
pinned=(openssh-server=1:9.2p1-2+deb12u10 openssh-client=1:9.2p1-2+deb12u10 sshpass=1.09-1+b1)
need_install=()
command -v sshd >/dev/null || [[ -x /usr/sbin/sshd ]] || need_install+=(openssh-server openssh-client)
command -v sshpass >/dev/null || need_install+=(sshpass)
if ((${#need_install[@]})); then
    echo "loopback: installing ${need_install[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    specs=()
    for spec in "${pinned[@]}"; do
        pkg=${spec%%=*}
        [[ " ${need_install[*]} " == *" $pkg "* ]] || continue
        if apt-cache madison "$pkg" | awk '{print $3}' | grep -qxF "${spec#*=}"; then
            specs+=("$spec")
        else
            echo "loopback: ${spec} is no longer in the archive; installing Debian's current $pkg" >&2
            specs+=("$pkg")
        fi
    done
    apt-get install -y -qq --no-install-recommends "${specs[@]}" >/dev/null
fi
sshd_bin="$(command -v sshd || echo /usr/sbin/sshd)"

# --- binaries and libraries -------------------------------------------------------------
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
for t in x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu; do
    cargo build --release --locked -q -p vlad --target "$t"
done
vlad_x86="$target_dir/x86_64-unknown-linux-gnu/release/vlad"
vlad_arm="$target_dir/aarch64-unknown-linux-gnu/release/vlad"
qnn_dir="$(scripts/qnn_lib_dir.sh)"
python="$repo_root/.venv/bin/python"
"$python" -c 'import matplotlib, vla_host, vla_goldens' 2>/dev/null || scripts/setup_python.sh >/dev/null

# --- sshd on loopback ---------------------------------------------------------------------
tmp="$(mktemp -d /tmp/vla-bringup-test.XXXXXX)"
chmod 755 "$tmp"
sshd_pid=""
# Dedicated to this test: removed at the end even if an interrupted run left it behind.
test_user=vla-bringup-test
small_disk=""
cleanup() {
    local rc=$?
    if [[ -n $sshd_pid ]]; then
        kill "$sshd_pid" 2>/dev/null || true
        wait "$sshd_pid" 2>/dev/null || true
    fi
    [[ -z $small_disk ]] || umount "$small_disk" 2>/dev/null || true
    userdel -r "$test_user" >/dev/null 2>&1 || true
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT

free_port() {
    "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port="$(free_port)"
ssh-keygen -q -t ed25519 -N '' -C loopback-host -f "$tmp/host_key"
ssh-keygen -q -t ed25519 -N '' -C loopback-user -f "$tmp/user_key"
cp "$tmp/user_key.pub" "$tmp/authorized_keys"
cat >"$tmp/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $tmp/host_key
PidFile $tmp/sshd.pid
AuthorizedKeysFile $tmp/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication yes
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
AcceptEnv none
LogLevel VERBOSE
EOF
# A login user with a password for the sshpass path; its home is deleted at the end.
userdel -r "$test_user" >/dev/null 2>&1 || true
useradd -m -s /bin/sh "$test_user"
password="$("$python" -c 'import secrets; print(secrets.token_hex(16))')"
echo "$test_user:$password" | chpasswd
printf '%s\n' "$password" >"$tmp/password"
printf 'not-the-password\n' >"$tmp/wrong_password"
chmod 600 "$tmp/password" "$tmp/wrong_password"

mkdir -p /run/sshd
"$sshd_bin" -D -e -f "$tmp/sshd_config" 2>"$tmp/sshd.log" &
sshd_pid=$!
# Until sshd listens, for as long as it lives (its -D -e log says why it would not); the
# 900 s bound only turns a hang into a failure.
listening=0
for _ in $(seq 9000); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then listening=1; break; fi
    kill -0 "$sshd_pid" 2>/dev/null || { cat "$tmp/sshd.log" >&2; echo "loopback: sshd died" >&2; exit 1; }
    sleep 0.1
done
((listening)) || { cat "$tmp/sshd.log" >&2; echo "loopback: sshd alive but not listening on $port after 900 s" >&2; exit 1; }
echo "loopback: sshd (pid $sshd_pid) on 127.0.0.1:$port"

# --- checks -------------------------------------------------------------------------------
passed=0 failed=0
ok() { echo "ok   $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
check() { # check NAME COMMAND...
    local name=$1
    shift
    if "$@"; then ok "$name"; else bad "$name"; fi
}
# Runs run.sh, keeping its exit code and stderr for the checks.
bringup() {
    local log=$1
    shift
    rc=0
    scripts/bringup/run.sh --port "$port" --known-hosts "$tmp/known_hosts" "$@" >"$log.out" 2>"$log.err" || rc=$?
}
expect_error() { # expect_error NAME TEXT  (after bringup): exit 1 and TEXT on stderr
    local name=$1 text=$2
    if [[ $rc -eq 1 ]] && grep -qF -- "$text" "$tmp/$name.err"; then
        ok "$name: $(grep -F -- "$text" "$tmp/$name.err" | head -n 1)"
    else
        bad "$name: exit $rc, wanted exit 1 with '$text'; stderr:"
        sed 's/^/     /' "$tmp/$name.err"
    fi
}
no_workspace_left() { # no run.* directory under the remote base
    ! compgen -G "$1/run.*" >/dev/null
}
json_true() { "$python" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d[sys.argv[2]] is True else 1)' "$@"; }

root_base="$tmp/remote-root"
key_args=(--target root@127.0.0.1 --identity "$tmp/user_key" --remote-dir "$root_base")

# 1. The main path: key login, QAIRT dir already on the "board", a 7-context bundle.
report="$tmp/report-keystone"
bringup "$tmp/main" "${key_args[@]}" --vlad "$vlad_x86" \
    --bundle golden/bundles/molmoact2-drift-keystone --qnn-lib-dir "$qnn_dir" --iterations 5 \
    --dsp-probe-runs 1 --shared-ab off --out "$report"
if ((rc == 0)); then ok "main run exits 0"; else bad "main run exit $rc"; sed 's/^/     /' "$tmp/main.err"; fi
check "report.md written" test -s "$report/report.md"
check "report says parity passed" grep -q '^\*\*Parity: PASS\*\*' "$report/report.md"
check "parity.json came back and passed" json_true "$report/raw/parity.json" passed
for png in actions.png parity.png; do
    check "$png is a PNG linked from report.md" \
        bash -c '[[ $(head -c 8 "$1" | od -An -tx1 | tr -d " ") == 89504e470d0a1a0a ]] && grep -q "($2)" "$3"' \
        _ "$report/$png" "$png" "$report/report.md"
done
if "$vlad_x86" bench-bundle --help >/dev/null 2>&1; then
    check "bench.json came back" test -s "$report/raw/bench.json"
    check "latency table and plot are in the report" \
        bash -c 'grep -q "^| \*\*end to end\*\* | [0-9]" "$1" && grep -q "(latency.png)" "$1"' _ "$report/report.md"
    check "load times and memory are in the report" \
        bash -c 'grep -q "^| mapped (mmap) | 7 |" "$1" && grep -q "^| RSS after the policy is loaded |" "$1"' _ "$report/report.md"
else
    # A vlad built before bench-bundle existed: the report must say what is missing.
    check "missing bench-bundle is explained in the report" grep -q 'No benchmark' "$report/report.md"
fi
check "logs came back" test -s "$report/raw/parity.log"
check "the ring check passed on the target (vla-ring-bridge in /dev/shm) and is in the report" \
    bash -c 'grep -qx "ring_check=ok" "$1/raw/target.env" && grep -q "^| rings in /dev/shm .* | \`ok\` |" "$1/report.md"' _ "$report"
check "the ring check left no ring in /dev/shm" bash -c '! compgen -G "/dev/shm/vla-bringup-*" >/dev/null'
check "the DSP memory probe came back and is in the report" \
    bash -c 'grep -q "\"probe\":\"outcome\"" "$1/raw/dsp-probe.jsonl" && grep -q "^## DSP memory" "$1/report.md" && grep -q "^\*\*Placement to use:" "$1/report.md"' _ "$report"
check "remote workspace removed" no_workspace_left "$root_base"
check "large files kept in the target's cache" test "$(find "$root_base/blobs" -type f | wc -l)" -ge 8
if [[ -n $keep ]]; then
    mkdir -p "$keep"
    rm -rf "$keep/raw" "$keep/report.md" "$keep"/*.png
    cp -r "$report"/. "$keep"/
fi

# 2. Same bundle again: everything comes from the cache, nothing is uploaded.
bringup "$tmp/again" "${key_args[@]}" --vlad "$vlad_x86" \
    --bundle golden/bundles/molmoact2-drift-keystone --qnn-lib-dir "$qnn_dir" --iterations 1 \
    --dsp-probe-runs 0 --shared-ab off --out "$tmp/report-again"
check "second run exits 0" test "$rc" -eq 0
check "second run uploads nothing (content-hash cache)" grep -q 'deploying: 0 files to upload' "$tmp/again.err"

# 3. A bundle whose end-to-end golden is wrong: the gate fails (exit 3), the report is
#    still written and says FAIL, and the workspace still goes.
bad_bundle="$tmp/fastwam-bad-golden"
cp -r golden/bundles/fastwam "$bad_bundle"
"$python" - "$bad_bundle/golden/end_to_end.npz" <<'PY'
import sys
import numpy as np
z = dict(np.load(sys.argv[1]))
z["actions"] = -z["actions"]
np.savez(sys.argv[1], **z)
PY
bringup "$tmp/gate" "${key_args[@]}" --vlad "$vlad_x86" --bundle "$bad_bundle" \
    --qnn-lib-dir "$qnn_dir" --iterations 1 --dsp-probe-runs 0 --shared-ab off --out "$tmp/report-gate"
check "failed parity gate exits 3" test "$rc" -eq 3
check "failed parity gate is named on stderr" grep -q 'parity gate FAILED on root@127.0.0.1' "$tmp/gate.err"
check "failed report says FAIL" grep -q '^\*\*Parity: FAIL\*\*' "$tmp/report-gate/report.md"
check "failed report still has its plots" test -s "$tmp/report-gate/actions.png"
check "workspace removed after a failed gate" no_workspace_left "$root_base"

# 3b. Calibration: the LP-VTP-SD stand-in (its vision context samples more coarsely than
#     torch, ~0.9985) fails the default gate on the "board". Measured there on 3
#     observations (the golden one and two "recorded" ones whose goldens the reference
#     graphs make), the kit's gates.json proposes that output's gate, `vlad bundle calibrate`
#     writes it with the report's hash, and the bundle then passes here, while its other
#     contexts stay at the default.
standin="$tmp/lp-vtp-sd-gridsample"
cp -r golden/bundles/molmoact2-lp-vtp-sd "$standin"
cp golden/gate-standin/vision_gridsample_socid77_archv73.bin \
    "$standin/ctx/vision_socid77_archv73.bin"
"$python" -m vla_goldens.make_gate_standin --onnx "$tmp/standin-onnx" >/dev/null
mkdir -p "$tmp/recorded"
"$python" - "$tmp/recorded" <<'PY'
import sys
import numpy as np
from vla_host.det_npz import load_npz, save_npz
base = load_npz("golden/bundles/molmoact2-lp-vtp-sd/golden/end_to_end.npz")
rng = np.random.default_rng(3)
for k in (1, 2):
    save_npz(f"{sys.argv[1]}/rec{k}.npz", {
        "frames": rng.integers(0, 256, base["frames"].shape, dtype=np.uint8),
        "state": (base["state"] + rng.normal(0, 0.02, base["state"].shape)).astype(np.float32),
        "instruction_id": np.array([k % 3], np.int32), "seed": np.array([100 + k], np.uint64)})
PY
"$python" scripts/bringup/observation_goldens.py --bundle golden/bundles/molmoact2-lp-vtp-sd \
    --onnx "$tmp/standin-onnx" --out "$tmp/observations" "$tmp"/recorded/rec*.npz >/dev/null
bringup "$tmp/calibrate" "${key_args[@]}" --vlad "$vlad_x86" --bundle "$standin" \
    --qnn-lib-dir "$qnn_dir" --iterations 1 --observations "$tmp/observations" --out "$tmp/report-calibrate"
check "the stand-in misses the default gate (exit 3)" test "$rc" -eq 3
check "the report proposes gates from 3 observations (gates.json)" \
    "$python" -c 'import json, sys; g = json.load(open(sys.argv[1]))
sys.exit(0 if {o["observations"] for o in g["outputs"]} == {3} else 1)' "$tmp/report-calibrate/gates.json"
"$vlad_x86" bundle calibrate "$standin" --from "$tmp/report-calibrate/gates.json" >"$tmp/calibrate.out" 2>&1 \
    || sed 's/^/     /' "$tmp/calibrate.out"
report_hash="$(sha256sum "$tmp/report-calibrate/gates.json" | cut -d' ' -f1)"
check "calibrate wrote the vision gate with the report's hash" \
    "$python" -c 'import json, sys; g = json.load(open(sys.argv[1]))["parity"]["contexts"]
sys.exit(0 if list(g) == ["vision"] and sys.argv[2] in g["vision"]["image_embeds"]["reason"] else 1)' \
    "$standin/bundle.json" "$report_hash"
check "the calibrated stand-in passes its gates" \
    bash -c 'VLA_QNN_LIB_DIR="$1" "$2" parity --bundle "$3" >"$4" 2>&1' _ "$qnn_dir" "$vlad_x86" "$standin" \
    "$tmp/calibrated.log"
# Under those calibrated gates, the mistakes a tight gate is there for still fail: the
# calibrated bundle with llm_split1 and llm_split2 swapped, and with a vision context whose
# output has its image rows one late.
cp -r "$standin" "$tmp/swapped"
"$python" - "$tmp/swapped/bundle.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
c = m["components"]
c["llm_split1"]["binary"], c["llm_split2"]["binary"] = c["llm_split2"]["binary"], c["llm_split1"]["binary"]
json.dump(m, open(sys.argv[1], "w"), indent=2)
PY
cp -r "$standin" "$tmp/row-late"
cp golden/gate-standin/vision_row_late_socid77_archv73.bin "$tmp/row-late/ctx/vision_socid77_archv73.bin"
for mistake in swapped row-late; do
    rc=0
    VLA_QNN_LIB_DIR="$qnn_dir" "$vlad_x86" parity --bundle "$tmp/$mistake" >"$tmp/$mistake.log" 2>&1 || rc=$?
    check "calibrated gates still fail the $mistake bundle (exit 3)" test "$rc" -eq 3
done

# 4. Password login (sshpass) as a plain user, QAIRT libraries uploaded from this machine,
#    default cache dir in the user's home.
qnn_local="$tmp/qnn-local"
mkdir -p "$qnn_local"
for f in "$qnn_dir"/libQnnHtp.so "$qnn_dir"/libQnnSystem.so "$qnn_dir"/libHtpPrepare.so \
    "$qnn_dir"/../onnxruntime_qnn.libs/*.so*; do
    ln -s "$(realpath "$f")" "$qnn_local/$(basename "$f")"
done
user_home="$(getent passwd "$test_user" | cut -d: -f6)"
bringup "$tmp/password" --target "$test_user@127.0.0.1" --password-file "$tmp/password" \
    --vlad "$vlad_x86" --bundle golden/bundles/fastwam --qnn-local-dir "$qnn_local" \
    --iterations 2 --dsp-probe-runs 0 --out "$tmp/report-fastwam"
if ((rc == 0)); then ok "password login with uploaded QAIRT libraries exits 0"; else
    bad "password run exit $rc"; sed 's/^/     /' "$tmp/password.err"; fi
check "fastwam report passed" grep -q '^\*\*Parity: PASS\*\*' "$tmp/report-fastwam/report.md"
# The shared-buffer A/B ran (default on); no libcdsprpc.so off the board: client buffers.
check "shared-buffer A/B says client buffers, naming libcdsprpc" grep -q \
    '^\*\*Use client buffers\*\* .*failed for 1 of 1 contexts; first, action_step: vlad: error: cannot load QNN library libcdsprpc.so' \
    "$tmp/report-fastwam/report.md"
check "end-to-end shared run names libcdsprpc" grep -q \
    '^`vlad bench-bundle --shared-buffers` wrote no figures: vlad: error: cannot load QNN library libcdsprpc.so' \
    "$tmp/report-fastwam/report.md"
check "default cache is ~/.cache/vla-bringup of the login user" test -d "$user_home/.cache/vla-bringup/blobs"
check "plain user's workspace removed" no_workspace_left "$user_home/.cache/vla-bringup"

# 5. The clear errors. Each must leave no workspace behind.
unused_port="$(free_port)"
rc=0
scripts/bringup/run.sh --target root@127.0.0.1 --port "$unused_port" --identity "$tmp/user_key" \
    --known-hosts "$tmp/known_hosts" --vlad "$vlad_x86" --bundle golden/bundles/fastwam \
    --out "$tmp/r" >"$tmp/unreachable.out" 2>"$tmp/unreachable.err" || rc=$?
expect_error unreachable "cannot reach root@127.0.0.1 on port $unused_port"

bringup "$tmp/wrong-arch" "${key_args[@]}" --vlad "$vlad_arm" --bundle golden/bundles/fastwam \
    --qnn-lib-dir "$qnn_dir" --out "$tmp/r"
expect_error wrong-arch "wrong architecture: --vlad $vlad_arm is a aarch64 binary but root@127.0.0.1 is x86_64"

# --qairt-wheel: the pinned wheel's aarch64 QAIRT and v73 skel (fetched into build/) go
# with an aarch64 vlad; this x86_64 "board" stops both combinations with a clear line.
bringup "$tmp/wheel-arm" "${key_args[@]}" --vlad "$vlad_arm" --bundle golden/bundles/fastwam \
    --qairt-wheel --out "$tmp/r"
expect_error wheel-arm "wrong architecture: --vlad $vlad_arm is a aarch64 binary but root@127.0.0.1 is x86_64"
check "--qairt-wheel names the QAIRT release it uploads" \
    grep -q 'QAIRT 2.51.0.260929181845 from the wheel' "$tmp/wheel-arm.err"
bringup "$tmp/wheel-x86" "${key_args[@]}" --vlad "$vlad_x86" --bundle golden/bundles/fastwam \
    --qairt-wheel --out "$tmp/r"
expect_error wheel-x86 "/lib are aarch64 but --vlad $vlad_x86 is x86_64"

bringup "$tmp/no-qairt" "${key_args[@]}" --vlad "$vlad_x86" --bundle golden/bundles/fastwam \
    --qnn-lib-dir "$tmp/no-such-qairt" --out "$tmp/r"
expect_error no-qairt "QAIRT libraries missing: $tmp/no-such-qairt does not exist"

mkdir -p "$tmp/empty-qairt"
bringup "$tmp/empty-qairt" "${key_args[@]}" --vlad "$vlad_x86" --bundle golden/bundles/fastwam \
    --qnn-lib-dir "$tmp/empty-qairt" --out "$tmp/r"
expect_error empty-qairt "has no libQnnHtp.so libQnnSystem.so"

# Full disk: a 1 MiB tmpfs as the target's cache dir when mount works here, else the
# --remote-min-free threshold raised past the free space (the same check, told apart below).
mkdir -p "$tmp/small-disk"
if mount -t tmpfs -o size=1m tmpfs "$tmp/small-disk" 2>/dev/null; then
    small_disk="$tmp/small-disk"
    echo "loopback: full disk simulated with a 1 MiB tmpfs"
    bringup "$tmp/full-disk" --target root@127.0.0.1 --identity "$tmp/user_key" \
        --remote-dir "$small_disk" --vlad "$vlad_x86" --bundle golden/bundles/fastwam \
        --qnn-lib-dir "$qnn_dir" --out "$tmp/r"
else
    echo "loopback: mount is not permitted here; full disk simulated with --remote-min-free"
    bringup "$tmp/full-disk" "${key_args[@]}" --remote-min-free 1000000000 \
        --vlad "$vlad_x86" --bundle golden/bundles/fastwam --qnn-lib-dir "$qnn_dir" --out "$tmp/r"
fi
expect_error full-disk "the target's disk is too full"
if [[ -n $small_disk ]]; then
    check "nothing written to the full disk" test -z "$(find "$small_disk" -type f)"
fi

bringup "$tmp/wrong-password" --target "$test_user@127.0.0.1" --password-file "$tmp/wrong_password" \
    --vlad "$vlad_x86" --bundle golden/bundles/fastwam --qnn-lib-dir "$qnn_dir" --out "$tmp/r"
expect_error wrong-password "authentication failed for $test_user@127.0.0.1: the password in $tmp/wrong_password was refused"

check "no workspace left after the failures" no_workspace_left "$root_base"
check "no report written by the failures" test ! -e "$tmp/r/report.md"

# 6. Stop sshd and make sure it is gone.
kill "$sshd_pid"
wait "$sshd_pid" 2>/dev/null || true
check "sshd stopped" bash -c "! kill -0 $sshd_pid 2>/dev/null"
sshd_pid=""

echo "bringup loopback: $passed passed, $failed failed"
((failed == 0))
