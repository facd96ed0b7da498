# Target side of scripts/bringup/run.sh, fed to the target's `sh -s` over SSH (never
# installed there). POSIX sh only: the board image may have busybox ash rather than bash.
# Every step prints `key=value` lines for run.sh to read; free text goes to stderr.
#
#   probe BASE QNN_DIR DSP_DIRS HASH...   facts about the target, cache misses, QAIRT check
#   link BASE WS (HASH MODE PATH)...      move uploads into the cache, verify, link into WS
#   run WS QNN_DIR ADSP_PATH ITERATIONS [PROBE_RUNS]
#                                         the ring check (WS/vla-ring-bridge, when deployed),
#                                         parity, benchmark and (PROBE_RUNS > 0) the DSP
#                                         memory probe, results in WS/results
#   cleanup WS                            remove the workspace and prove it is gone
#
# BASE empty means $HOME/.cache/vla-bringup. The cache BASE/blobs/<sha256> holds every
# deployed file once; workspaces are BASE/run.* so that hard links into the cache work.
set -u

say() { printf '%s=%s\n' "$1" "$2"; }

resolve_base() {
    if [ -n "$1" ]; then printf '%s' "$1"; else printf '%s' "$HOME/.cache/vla-bringup"; fi
}

# ELF e_machine of a file as the uname -m spelling (empty when unknown or unreadable).
elf_arch() {
    magic=$(od -An -c -N4 "$1" 2>/dev/null | tr -d ' ')
    [ "$magic" = '177ELF' ] || return 0
    machine=$(od -An -tu2 -j18 -N2 "$1" 2>/dev/null | tr -d ' ')
    case "$machine" in
        62) printf x86_64 ;;
        183) printf aarch64 ;;
        *) printf 'elf-machine-%s' "$machine" ;;
    esac
}

probe() {
    base=$(resolve_base "$1")
    qnn_dir=$2
    dsp_dirs=$3
    shift 3
    say arch "$(uname -m)"
    say kernel "$(uname -r)"
    say hostname "$(uname -n)"
    if [ -r /etc/os-release ]; then
        say os "$(. /etc/os-release && printf '%s' "${PRETTY_NAME:-$NAME}")"
    fi
    [ -r /sys/devices/soc0/soc_id ] && say soc_id "$(cat /sys/devices/soc0/soc_id)"
    [ -r /sys/devices/soc0/machine ] && say soc_machine "$(cat /sys/devices/soc0/machine)"
    say mem_total_kib "$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null)"
    for tool in sha256sum tar df od; do
        command -v "$tool" >/dev/null 2>&1 || say missing_tool "$tool"
    done
    if ! mkdir -p "$base/blobs" 2>/dev/null; then
        say error "cannot create $base/blobs on the target"
        return 0
    fi
    say base "$(cd "$base" && pwd -P)"
    say free_kib "$(df -Pk "$base" | awk 'NR == 2 {print $4}')"
    for h in "$@"; do
        [ -f "$base/blobs/$h" ] || say missing "$h"
    done
    # An empty QNN_DIR means the libraries come from the upload and are checked locally.
    if [ -n "$qnn_dir" ]; then
        if [ ! -d "$qnn_dir" ]; then
            say qnn_dir_missing "$qnn_dir"
        else
            for lib in libQnnHtp.so libQnnSystem.so; do
                [ -f "$qnn_dir/$lib" ] || say qnn_lib_missing "$lib"
            done
            [ -f "$qnn_dir/libQnnHtp.so" ] && say qnn_arch "$(elf_arch "$qnn_dir/libQnnHtp.so")"
            if [ "$(uname -m)" = aarch64 ] && [ ! -f "$qnn_dir/libQnnHtpV73Stub.so" ]; then
                say qnn_lib_missing libQnnHtpV73Stub.so
            fi
        fi
    fi
    # The NPU side: the v73 skel must be in one of the ADSP_LIBRARY_PATH directories. The
    # x86_64 emulator has no DSP, so there is nothing to find there.
    if [ "$(uname -m)" = aarch64 ]; then
        found=
        old_ifs=$IFS
        IFS=';'
        for d in $dsp_dirs; do
            [ -n "$d" ] && [ -f "$d/libQnnHtpV73Skel.so" ] && { found=$d; break; }
        done
        IFS=$old_ifs
        if [ -n "$found" ]; then say skel_dir "$found"; else say skel_missing "$dsp_dirs"; fi
    fi
}

link() {
    base=$1
    ws=$2
    shift 2
    mkdir -p "$ws/results" "$ws/incoming" || { say error "cannot create $ws"; return 0; }
    while [ $# -ge 3 ]; do
        h=$1
        mode=$2
        path=$3
        shift 3
        blob="$base/blobs/$h"
        if [ ! -f "$blob" ]; then
            if [ ! -f "$ws/incoming/$h" ]; then
                say error "$path: blob $h neither cached nor uploaded"
                return 0
            fi
            src="$ws/incoming/$h"
        else
            src=$blob
        fi
        # Every use re-checks the content: a cache entry damaged since the last run must
        # not produce a parity verdict.
        got=$(sha256sum "$src" | cut -d' ' -f1)
        if [ "$got" != "$h" ]; then
            rm -f "$src"
            say error "$path: content on the target has sha256 $got, expected $h (removed it; run again to upload it afresh)"
            return 0
        fi
        if [ "$src" != "$blob" ]; then
            chmod 0555 "$src" && mv -f "$src" "$blob" || {
                say error "cannot move $path into $base/blobs"
                return 0
            }
        fi
        mkdir -p "$ws/$(dirname "$path")"
        if ! ln "$blob" "$ws/$path" 2>/dev/null && ! ln -s "$blob" "$ws/$path"; then
            say error "cannot link $path into $ws"
            return 0
        fi
        [ "$mode" = x ] && [ ! -x "$ws/$path" ] && chmod 0555 "$blob"
    done
    rmdir "$ws/incoming" 2>/dev/null
    say linked ok
}

run() {
    ws=$1
    qnn_dir=$2
    adsp_path=$3
    iterations=$4
    probe_runs=${5:-20}
    shared_ab_mode=${6:-off}
    cd "$ws" || { say error "workspace $ws is gone"; return 0; }
    # An uploaded v73 stub from a QAIRT release that names the unversioned libcdsprpc.so
    # (the wheel's does) finds the board's FastRPC library, which ships as
    # libcdsprpc.so.1, through a link in the workspace's own library dir.
    cdsprpc=
    case "$qnn_dir" in
        "$ws"/*)
            if [ -f "$qnn_dir/libQnnHtpV73Stub.so" ] && [ ! -e "$qnn_dir/libcdsprpc.so" ]; then
                for d in /usr/lib /usr/lib64 /lib /usr/lib/aarch64-linux-gnu; do
                    if [ -e "$d/libcdsprpc.so" ]; then cdsprpc="$d/libcdsprpc.so"; break; fi
                    if [ -e "$d/libcdsprpc.so.1" ]; then
                        ln -s "$d/libcdsprpc.so.1" "$qnn_dir/libcdsprpc.so" && cdsprpc="$d/libcdsprpc.so.1"
                        break
                    fi
                done
                [ -n "$cdsprpc" ] || cdsprpc=missing
            fi
            ;;
    esac
    export VLA_QNN_LIB_DIR="$qnn_dir"
    export LD_LIBRARY_PATH="$qnn_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export ADSP_LIBRARY_PATH="$adsp_path"
    {
        say arch "$(uname -m)"
        say kernel "$(uname -r)"
        say hostname "$(uname -n)"
        [ -r /etc/os-release ] && say os "$(. /etc/os-release && printf '%s' "${PRETTY_NAME:-$NAME}")"
        [ -r /sys/devices/soc0/soc_id ] && say soc_id "$(cat /sys/devices/soc0/soc_id)"
        say mem_total_kib "$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null)"
        say vlad_version "$(./vlad --version 2>&1)"
        say qnn_lib_dir "$qnn_dir"
        say adsp_library_path "$adsp_path"
        [ -z "$cdsprpc" ] || say libcdsprpc "$cdsprpc"
        say started_utc "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    } > results/target.env

    ring_check=$(ring_check)
    say ring_check "$ring_check"

    ./vlad parity --bundle bundle --json results/parity.json > results/parity.log 2>&1
    parity_exit=$?
    say parity_exit "$parity_exit"
    # More observations (run.sh --observations): the same contexts on other goldens, for
    # the gates the report proposes. Their verdicts are measurements, not this run's gate.
    observations=0
    for d in observations/*/; do
        [ -d "$d" ] || continue
        name=$(basename "$d")
        ./vlad parity --bundle "$d" --json "results/parity-$name.json" > "results/parity-$name.log" 2>&1
        observations=$((observations + 1))
    done
    say observations "$observations"

    # An older vlad answers an unknown command with exit 2.
    if ./vlad bench-bundle --help >/dev/null 2>&1; then
        ./vlad bench-bundle --bundle bundle --iterations "$iterations" \
            --json results/bench.json > results/bench.log 2>&1
        bench_exit=$?
        say bench_exit "$bench_exit"
    else
        say bench_exit unavailable
        echo "this vlad has no bench-bundle command" > results/bench.log
    fi
    # Where the contexts fit: one by one into one process, then as the memory plan places
    # them (docs/dsp-memory.md). QNN's verbose log names the process domain it chose.
    if [ "$probe_runs" -gt 0 ] && ./vlad dsp-probe --help >/dev/null 2>&1; then
        ./vlad dsp-probe --bundle bundle --runs "$probe_runs" --log-level debug \
            > results/dsp-probe.jsonl 2> results/dsp-probe.log
        probe_exit=$?
    elif [ "$probe_runs" -gt 0 ]; then
        probe_exit=unavailable
    else
        probe_exit=skipped
    fi
    shared_ab
    { say ring_check "$ring_check"; say parity_exit "$parity_exit"; say observations "$observations"; \
      say bench_exit "${bench_exit:-unavailable}"; \
      say dsp_probe_exit "$probe_exit"; \
      say iterations "$iterations"; say finished_utc "$(date -u +%Y-%m-%dT%H:%M:%SZ)"; } \
        >> results/target.env
}

# The rings' shared memory on this target, where vlad keeps its rings (/dev/shm): through
# the C ring client library's bridge (requests as in runtime/ring-c/vla_ring_bridge.c,
# native byte order, little-endian on both targets), a poll of an action ring that is not
# there yet, one observation published (open, flock, ftruncate, mmap, writer start), one of
# the wrong state length refused by name. Geometry: one 2x2 camera, 2 state values, 2
# action values, chunks of 2. Prints ok, unavailable (no bridge deployed) or failed: why.
ring_check() {
    [ -x ./vla-ring-bridge ] || { printf unavailable; return 0; }
    if [ ! -d /dev/shm ] || [ ! -w /dev/shm ]; then
        printf 'failed: /dev/shm is missing or not writable'
        return 0
    fi
    rings=/dev/shm/vla-bringup-$$
    {
        printf 'P'
        printf 'O\0\0\0\0\0\0\0\0\0\0\0\0\2\0\0\0\0\0\0\0\14\0\0\0\0\0\0\0'
        dd if=/dev/zero bs=20 count=1 2>/dev/null
        printf 'O\0\0\0\0\0\0\0\0\0\0\0\0\1\0\0\0\0\0\0\0\14\0\0\0\0\0\0\0'
        dd if=/dev/zero bs=16 count=1 2>/dev/null
    } | ./vla-ring-bridge "$rings-obs" "$rings-act" 1 2 2 2 2 2 > results/ring-check.bin 2> results/ring-check.log
    bridge_exit=$?
    rm -f "$rings-obs" "$rings-act"
    poll=$(od -An -tu1 -N1 results/ring-check.bin 2>/dev/null | tr -d ' ')
    seq=$(od -An -tu8 -j9 -N8 results/ring-check.bin 2>/dev/null | tr -d ' ')
    refused=$(od -An -tu8 -j25 -N8 results/ring-check.bin 2>/dev/null | tr -d ' ')
    if [ "$bridge_exit" != 0 ]; then
        printf 'failed: vla-ring-bridge exit %s: %s' "$bridge_exit" "$(tail -n 1 results/ring-check.log)"
    elif [ "$poll" != 0 ] || [ "$seq" != 1 ] || [ "$refused" != 0 ]; then
        printf 'failed: unexpected replies (poll %s, publish seq %s, wrong-length seq %s)' "$poll" "$seq" "$refused"
    elif ! grep -q "observation refused: state has 1 values" results/ring-check.bin; then
        printf 'failed: a state of the wrong length was not refused by name'
    else
        printf ok
    fi
}

# Each context with client buffers and with HTP shared buffers (`vlad bench-context
# --shared-buffers`: rpcmem from libcdsprpc.so, outputs checked bit for bit against client
# buffers), into results/shared-ab/<context>.{client,shared}.log, and the whole bundle on
# shared buffers (results/shared-ab/bench-shared.json); report.py compares them.
shared_ab() {
    [ "$shared_ab_mode" = on ] || return 0
    ./vlad bench-context --help 2>&1 | grep -q -- --shared-buffers || return 0
    mkdir -p results/shared-ab
    for bin in bundle/ctx/*.bin; do
        [ -f "$bin" ] || continue
        c=$(basename "$bin" .bin)
        c=${c%%_socid*}
        io="bundle/golden/${c}_io.npz"
        if [ -f "$io" ]; then set -- "$bin" --iterations "$iterations" --inputs "$io"
        else set -- "$bin" --iterations "$iterations"; fi
        ./vlad bench-context "$@" > "results/shared-ab/$c.client.log" 2>&1
        ./vlad bench-context "$@" --shared-buffers > "results/shared-ab/$c.shared.log" 2>&1
    done
    # End to end on shared buffers: latency, RSS/PSS after load and the bytes copied, next
    # to results/bench.json (client buffers).
    if ./vlad bench-bundle --help 2>&1 | grep -q -- --shared-buffers; then
        ./vlad bench-bundle --bundle bundle --iterations "$iterations" --shared-buffers \
            --json results/shared-ab/bench-shared.json > results/shared-ab/bench-shared.log 2>&1
    fi
    return 0
}

cleanup() {
    ws=$1
    case "$ws" in
        */run.*) ;;
        *) say error "refusing to remove $ws: not a bring-up workspace"; return 0 ;;
    esac
    rm -rf "$ws"
    if [ -e "$ws" ]; then say error "$ws still exists after rm -rf"; else say removed "$ws"; fi
}

step=$1
shift
case "$step" in
    probe | link | run | cleanup) "$step" "$@" ;;
    *) say error "unknown step $step" ;;
esac
