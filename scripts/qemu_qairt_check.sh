#!/usr/bin/env bash
# CI: the aarch64 vlad against Qualcomm's real aarch64 QNN libraries (QAIRT's device side
# from the pinned public wheel, scripts/fetch_qairt_aarch64.sh), under qemu-aarch64:
#   1. `vlad inspect` of every fixture context binary: output identical to the x86_64 vlad
#      on the x86_64 libraries, and the QNN build each binary records equal to what
#      meta-vla's build-time check reads from the same bytes;
#   2. the HTP backend's refusal off the board: one line on stderr saying what is missing
#      and what to check, exit status 1, nothing on stdout (nothing loaded);
#   3. `vlad bundle` keygen/pack/sign/verify and the OTA store (install, activate,
#      rollback, gc) run by the aarch64 binary;
#   4. `npu.shared_buffers` without libcdsprpc.so (none under qemu): `auto` says it falls
#      back to client buffers and goes on to load QNN; `on` is refused in one line first.
# Prints one PASS/FAIL line per check; exits 1 if any failed or could not run.
#
# Binaries: VLAD_AARCH64 (default: the release build check_release.sh makes) and VLAD_X86
# (default target/debug/vlad); both are (re)built by cargo when not given.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

fail_now() {
    echo "qemu_qairt_check: FAIL: $*" >&2
    exit 1
}
command -v qemu-aarch64 >/dev/null || fail_now "qemu-aarch64 is not installed (scripts/setup.sh installs qemu-user)"
sysroot=/usr/aarch64-linux-gnu
[[ -e $sysroot/lib/ld-linux-aarch64.so.1 && -e $sysroot/lib/libstdc++.so.6 ]] ||
    fail_now "$sysroot lacks the aarch64 loader or libstdc++.so.6 (the QNN libraries need both; scripts/setup.sh)"
x86_lib_dir="$(cat build/qnn-lib-dir 2>/dev/null)" || true
[[ -n $x86_lib_dir && -f $x86_lib_dir/libQnnHtp.so ]] ||
    fail_now "no x86_64 QNN library dir in build/qnn-lib-dir (run scripts/setup.sh)"
qairt="$(scripts/fetch_qairt_aarch64.sh)" || fail_now "could not fetch the aarch64 QAIRT libraries"
a64_lib_dir="$qairt/lib"

if [[ -z ${VLAD_AARCH64:-} ]]; then
    cargo build --release --locked -q -p vlad --target aarch64-unknown-linux-gnu ||
        fail_now "aarch64 build of vlad failed"
    VLAD_AARCH64=target/aarch64-unknown-linux-gnu/release/vlad
fi
if [[ -z ${VLAD_X86:-} ]]; then
    cargo build --locked -q -p vlad || fail_now "x86_64 build of vlad failed"
    VLAD_X86=target/debug/vlad
fi
[[ -x $VLAD_AARCH64 && -x $VLAD_X86 ]] || fail_now "vlad binaries $VLAD_AARCH64 / $VLAD_X86 missing"
a64() { qemu-aarch64 -L "$sysroot" "$VLAD_AARCH64" "$@"; }
x86() { env VLA_QNN_LIB_DIR="$x86_lib_dir" "$VLAD_X86" "$@"; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
declare -a results=()
failed=0
record() { # name status
    results+=("$2  $1")
    [[ $2 == PASS ]] || failed=1
}
say() { printf '\n== %s\n' "$*"; }
run_check() { # name function
    if "$2"; then record "$1" PASS; else record "$1" FAIL; fi
}

check_inspect() {
    say "vlad inspect: aarch64 (qemu, $a64_lib_dir) vs x86_64 ($x86_lib_dir)"
    local -a bins
    mapfile -t bins < <(find golden -name '*.bin' -type f | sort)
    ((${#bins[@]})) || { echo "no fixture context binaries under golden/" >&2; return 1; }
    local bin ok=0
    : >"$work/inspect.x86"
    : >"$work/inspect.a64"
    for bin in "${bins[@]}"; do
        # (The x86_64 emulator's " # LIBNATIVE: ..." load banner goes to vlad's qnn log.)
        x86 inspect "$bin" >>"$work/inspect.x86" 2>"$work/err.x86" ||
            { echo "x86_64 inspect $bin failed: $(cat "$work/err.x86")" >&2; return 1; }
        # --log-level debug: the load line proves which libQnnSystem read the binary.
        a64 inspect "$bin" --lib-dir "$a64_lib_dir" --log-level debug >>"$work/inspect.a64" \
            2>"$work/err.a64" ||
            { echo "aarch64 inspect $bin failed: $(cat "$work/err.a64")" >&2; return 1; }
        grep -q "loaded $a64_lib_dir/libQnnHtp.so" "$work/err.a64" ||
            { echo "aarch64 inspect $bin did not report loading $a64_lib_dir" >&2; return 1; }
        ok=$((ok + 1))
    done
    if ! diff -u "$work/inspect.x86" "$work/inspect.a64" >"$work/inspect.diff"; then
        head -n 40 "$work/inspect.diff"
        echo "inspect output differs between x86_64 and aarch64" >&2
        return 1
    fi
    echo "$ok context binaries: aarch64 output identical to x86_64 ($(wc -l <"$work/inspect.a64") lines)"
    grep -E '^(QNN build|QAIRT libs):' "$work/inspect.a64" | sort | uniq -c
    # meta-vla's do_check_qairt_version reads the QNN build from a binary's first MiB and
    # from the provider's libQnnHtp.so with one regular expression (taken from the recipe
    # here): it must find what libQnnSystem reports, for every fixture and for the wheel.
    python3 - "$work/inspect.a64" "$a64_lib_dir/libQnnHtp.so" \
        meta-vla/recipes-vla/vla-bundle/vla-bundle.bb <<'PY'
import re, sys
report, library, recipe = sys.argv[1:]
line = next(l for l in open(recipe) if "build_re = re.compile(" in l)
build_re = eval(line.split("=", 1)[1].strip(), {"re": re})
files, bad = {}, 0
path = None
for l in open(report):
    if l.startswith("file:"):
        path = l.split()[1]
    elif l.startswith("QNN build:"):
        files[path] = l.split(":", 1)[1].strip()
for path, want in sorted(files.items()):
    found = build_re.search(open(path, "rb").read(1 << 20))
    got = "v" + b".".join(found.groups()).decode() if found else None
    if got != want:
        print(f"{path}: the recipe's scan finds {got}, libQnnSystem reports {want}", file=sys.stderr)
        bad += 1
lib = build_re.search(open(library, "rb").read())
print(f"recipe scan == libQnnSystem for {len(files) - bad} of {len(files)} binaries; "
      f"wheel libQnnHtp.so: v{b'.'.join(lib.groups()).decode() if lib else None}")
sys.exit(1 if bad or not files or not lib else 0)
PY
}

check_refusal() {
    say "HTP backend refusal off the board (aarch64 libQnnHtp.so under qemu)"
    local -a cases=(
        "parity golden/contexts/qdq_mixed_socid77_archv73.bin golden/contexts/qdq_mixed_io.npz"
        "parity --bundle golden/bundles/fastwam"
        "bench-context golden/contexts/qdq_mixed_socid77_archv73.bin"
    )
    local c rc lines line
    for c in "${cases[@]}"; do
        rc=0
        # shellcheck disable=SC2086
        a64 $c --lib-dir "$a64_lib_dir" >"$work/refusal.out" 2>"$work/refusal.err" || rc=$?
        lines=$(wc -l <"$work/refusal.err")
        line="$(cat "$work/refusal.err")"
        echo "\$ vlad $c   -> exit $rc, $lines stderr line(s), $(wc -c <"$work/refusal.out") stdout bytes"
        if [[ $rc -ne 1 || $lines -ne 1 || -s $work/refusal.out ]]; then
            cat "$work/refusal.err" "$work/refusal.out" >&2
            echo "expected exit 1, exactly one stderr line, empty stdout" >&2
            return 1
        fi
        local want
        for want in "vlad: error: HTP backend unavailable, nothing loaded: no Snapdragon SoC / FastRPC session" \
            "No Snapdragon SOC detected" "Not running on an IQ-9075" "FastRPC devices or libcdsprpc.so" \
            "for user " "/dev/fastrpc-"; do
            if [[ $line != *"$want"* ]]; then
                echo "refusal line lacks \"$want\": $line" >&2
                return 1
            fi
        done
    done
    echo "$line"
}

check_ota() {
    say "vlad bundle and the OTA store, aarch64 under qemu"
    local b1="$work/b1" b2="$work/b2" root="$work/root" key pk other rc out h1 h2
    cp -r golden/bundles/fastwam "$b1"
    rm -f "$b1/ota-manifest.json" "$b1/ota-manifest.json.sig"
    pk="$(a64 bundle keygen "$work/key" | sed -n 's/^public key.*: \([0-9a-f]\{64\}\)$/\1/p')"
    other="$(a64 bundle keygen "$work/other" | sed -n 's/^public key.*: \([0-9a-f]\{64\}\)$/\1/p')"
    [[ ${#pk} -eq 64 && ${#other} -eq 64 ]] || { echo "bundle keygen printed no public key" >&2; return 1; }
    a64 bundle pack "$b1" >/dev/null && a64 bundle sign "$b1" --key "$work/key" >/dev/null ||
        { echo "bundle pack/sign failed" >&2; return 1; }
    out="$(a64 bundle verify "$b1" --trusted-key "$pk")" || { echo "verify of a good bundle failed" >&2; return 1; }
    echo "$out" | head -n 1
    h1="$(sed -n 's/^content hash //p' <<<"$out")"
    [[ ${#h1} -eq 64 ]] || { echo "verify printed no content hash" >&2; return 1; }
    rc=0; a64 bundle verify "$b1" --trusted-key "$other" >/dev/null 2>"$work/err" || rc=$?
    [[ $rc -eq 1 ]] || { echo "untrusted key: exit $rc, want 1" >&2; return 1; }
    echo "untrusted key refused: $(cat "$work/err")"
    cp -r "$b1" "$b2"
    printf 'x' >>"$b2/golden/$(ls "$b2/golden" | head -n 1)"
    rc=0; a64 bundle verify "$b2" --trusted-key "$pk" >/dev/null 2>"$work/err" || rc=$?
    [[ $rc -eq 1 ]] || { echo "tampered file: exit $rc, want 1" >&2; return 1; }
    echo "tampered file refused: $(cat "$work/err")"
    # A second, good version of the same policy.
    rm -rf "$b2" && cp -r "$b1" "$b2"
    python3 - "$b2/bundle.json" <<'PY'
import json, sys
p = sys.argv[1]
m = json.load(open(p))
m["version"] = "0.1.1"
open(p, "w").write(json.dumps(m, indent=2) + "\n")
PY
    a64 bundle pack "$b2" >/dev/null && a64 bundle sign "$b2" --key "$work/key" >/dev/null ||
        { echo "bundle pack/sign of the second version failed" >&2; return 1; }
    h2="$(a64 bundle verify "$b2" --trusted-key "$pk" | sed -n 's/^content hash //p')"
    mkdir -p "$root"
    local -a ota=(--root "$root" --trusted-key "$pk")
    a64 ota install "$b1" "${ota[@]}" >/dev/null && a64 ota activate "$h1" "${ota[@]}" >/dev/null &&
        a64 ota commit "${ota[@]}" >/dev/null && a64 ota install "$b2" --link "${ota[@]}" >/dev/null &&
        a64 ota activate "$h2" "${ota[@]}" >/dev/null ||
        { echo "install/activate/commit failed" >&2; return 1; }
    [[ "$(readlink "$root/current")" == "bundles/$h2" && "$(readlink "$root/previous")" == "bundles/$h1" ]] ||
        { echo "after activating $h2: current/previous links wrong" >&2; ls -l "$root" >&2; return 1; }
    a64 ota rollback --reason "CI rollback" "${ota[@]}" >/dev/null ||
        { echo "ota rollback failed" >&2; return 1; }
    [[ "$(readlink "$root/current")" == "bundles/$h1" ]] ||
        { echo "after rollback current is not $h1" >&2; return 1; }
    a64 ota gc "${ota[@]}" >"$work/gc" || { echo "ota gc failed" >&2; return 1; }
    a64 ota status "${ota[@]}" >"$work/status" || { echo "ota status failed" >&2; return 1; }
    grep -q "^current:  $h1" "$work/status" || { cat "$work/status" >&2; return 1; }
    echo "install, activate, commit, install --link, activate, rollback, gc: current $h1"
    sed -n '1,4p' "$work/gc"
}

check_npu_io() {
    say "npu.shared_buffers without libcdsprpc.so, aarch64 under qemu"
    local mode rc cfg
    for mode in auto on; do
        cfg="$work/npu-$mode.json"
        python3 - config/dev.json "$cfg" "$mode" "$repo_root/golden/bundles/fastwam" <<'PY'
import json, os, sys
src, dst, mode, bundle = sys.argv[1:]
c = json.load(open(src))
c["bundle"]["path"] = bundle
tag = f"{os.getpid()}-{mode}"
c["rings"]["observation_path"] = f"/dev/shm/vla-qemu-npu-{tag}-obs"
c["rings"]["action_path"] = f"/dev/shm/vla-qemu-npu-{tag}-act"
c["log"]["level"] = "info"
c["npu"] = {"shared_buffers": mode}
json.dump(c, open(dst, "w"))
PY
        rc=0
        a64 run --config "$cfg" --lib-dir "$a64_lib_dir" >"$work/npu.out" 2>"$work/npu.err" || rc=$?
        echo "\$ vlad run (npu.shared_buffers $mode)   -> exit $rc, $(wc -l <"$work/npu.err") stderr line(s)"
        if [[ $mode == auto ]]; then
            # Falls back, says so once, then fails only where every run fails off the board.
            [[ $rc -eq 1 ]] &&
                [[ $(grep -c "NPU I/O in client buffers (npu.shared_buffers is auto; no rpcmem: cannot load QNN library libcdsprpc.so" "$work/npu.err") -eq 1 ]] &&
                grep -q "HTP backend unavailable, nothing loaded" "$work/npu.err" ||
                { cat "$work/npu.err" >&2; echo "auto did not fall back to client buffers and go on" >&2; return 1; }
            grep "NPU I/O" "$work/npu.err"
        else
            [[ $rc -eq 1 && $(wc -l <"$work/npu.err") -eq 1 ]] &&
                grep -q "npu.shared_buffers is on, but shared buffers cannot be used here: no rpcmem" "$work/npu.err" &&
                ! grep -q "HTP backend" "$work/npu.err" ||
                { cat "$work/npu.err" >&2; echo "on was not refused in one line before QNN" >&2; return 1; }
            cat "$work/npu.err"
        fi
    done
}

run_check "aarch64 inspect == x86_64 inspect, every fixture context" check_inspect
run_check "HTP refusal off the board: one line, exit 1, nothing loaded" check_refusal
run_check "aarch64 bundle verify and OTA store paths" check_ota
run_check "npu.shared_buffers: auto falls back, on is refused, without libcdsprpc.so" check_npu_io

printf '\n== summary\n'
printf '%s\n' "${results[@]}"
if ((failed)); then
    echo "qemu_qairt_check: FAIL"
    exit 1
fi
echo "qemu_qairt_check: PASS"
