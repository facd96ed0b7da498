#!/usr/bin/env bash
# Builds and runs every fuzz target of fuzz/ (cargo-fuzz, libFuzzer, AddressSanitizer) for
# the given time each, one target at a time, single job, under `nice`; prints executions/s
# and total executions per target and exits non-zero if any target found a crash (the
# input is then in fuzz/artifacts/<target>/). Not part of CI: too long. Found inputs
# become regression tests (see fuzz/README.md).
#
#   scripts/fuzz.sh [seconds-per-target] [target...]     (default: 60 s, every target)
#
# Toolchain: the machine's stable Rust with RUSTC_BOOTSTRAP=1, which cargo-fuzz accepts in
# place of nightly for -Zsanitizer=address (no nightly toolchain can be installed here).
# The working corpora (fuzz/corpus/<target>/) are kept between runs and seeded from the
# repository's real files each run.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

seconds="${1:-60}"
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: seconds must be a positive integer, got '$seconds'" >&2; exit 2; }
shift || true
all_targets=(config bundle_manifest npz ring qnn_binary ota_manifest)
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
    [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz: unknown target $t (have: ${all_targets[*]})" >&2; exit 2; }
done

cargo_fuzz_version=0.13.2
tools="$repo_root/build/tools"
if ! "$tools/bin/cargo-fuzz" --version 2>/dev/null | grep -qx "cargo-fuzz $cargo_fuzz_version"; then
    echo "fuzz: installing cargo-fuzz $cargo_fuzz_version into build/tools"
    nice cargo install --quiet --locked cargo-fuzz --version "=$cargo_fuzz_version" --root "$tools"
fi
export PATH="$tools/bin:$PATH"
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$repo_root/target/fuzz}"
export CARGO_TERM_COLOR=never

needs_qnn=0
for t in "${targets[@]}"; do [[ $t == qnn_binary ]] && needs_qnn=1; done
if ((needs_qnn)) && [[ -z "${VLA_QNN_LIB_DIR:-}" ]]; then
    [[ -x .venv/bin/python ]] || scripts/setup.sh
    VLA_QNN_LIB_DIR="$(scripts/qnn_lib_dir.sh)"
    export VLA_QNN_LIB_DIR
fi

logs="$CARGO_TARGET_DIR/logs"
mkdir -p "$logs"
echo "fuzz: building ${targets[*]}"
for t in "${targets[@]}"; do
    nice cargo fuzz build --fuzz-dir fuzz "$t" >"$logs/build.log" 2>&1 || {
        cat "$logs/build.log" >&2
        exit 1
    }
done

# Copies each seed file into the corpus under its content hash (as libFuzzer names its
# own finds), so reseeding every run adds nothing twice.
seed() {
    local corpus="fuzz/corpus/$1" f
    shift
    mkdir -p "$corpus"
    for f in "$@"; do
        [[ -f "$f" ]] && cp "$f" "$corpus/$(sha1sum "$f" | cut -c1-40)"
    done
    return 0
}

# The largest input each target mutates up to: every seed fits, small enough to stay fast.
declare -A max_len=(
    [config]=17000 [bundle_manifest]=16384 [npz]=65536 [ring]=8192 [qnn_binary]=131072
    [ota_manifest]=16384
)
mapfile -t small_npz < <(find golden runtime/crates/vla-npz/tests/data \( -name '*.npz' -o -name '*.npy' \) -size -64k | sort)
for t in "${targets[@]}"; do
    case "$t" in
        config) seed config config/*.json ;;
        bundle_manifest) seed bundle_manifest golden/bundles/*/bundle.json ;;
        npz) seed npz "${small_npz[@]}" ;;
        ring)
            seeds_dir="$(mktemp -d /dev/shm/vla-fuzz-seeds.XXXXXX)"
            nice cargo run --quiet --release --manifest-path fuzz/Cargo.toml --example ring_seeds -- "$seeds_dir"
            seed ring "$seeds_dir"/*
            rm -rf "$seeds_dir"
            ;;
        qnn_binary) seed qnn_binary golden/contexts/*.bin golden/bundles/*/ctx/*.bin ;;
        # The target's own fixture bundle: a manifest input and a signature input.
        ota_manifest) seed ota_manifest fuzz/seeds/ota_manifest/* ;;
    esac
done

dict_for() {
    case "$1" in
        config | bundle_manifest | ota_manifest) echo "-dict=fuzz/dicts/json.dict" ;;
    esac
}

# libQnnSystem itself crashes on some corrupt binaries (fuzz/vendor-crashes/): nothing in
# this repository can fix that, so qnn_binary runs in libFuzzer's fork mode (one job),
# which goes on after a crash, and each crash is then classified by the first stack
# frame outside the sanitizer runtime and libc: inside libQnnSystem is the vendor's,
# anything else (a panic, our code) is ours and fails the run. It also leaks on some
# inputs, so leak detection is off for it.
vendor_or_ours() {
    local report first
    report="$("$1" -detect_leaks=0 "$2" 2>&1 || true)"
    if grep -q "panicked at" <<<"$report"; then
        echo ours
        return
    fi
    # Fork mode sometimes saves an input that does not crash when replayed alone.
    if ! grep -q "ERROR: " <<<"$report"; then
        echo unreproducible
        return
    fi
    first="$(grep -E '^ +#[0-9]+ ' <<<"$report" | grep -vE 'compiler-rt|sysdeps|/string/|libc\.so' | head -1)"
    if [[ "$first" == *libQnnSystem.so* ]]; then echo vendor; else echo ours; fi
}

failed=()
printf '\n%-16s %10s %14s %8s %8s  %s\n' target "exec/s" executions seconds corpus result
for t in "${targets[@]}"; do
    log="$logs/$t.log"
    status=0
    mode=()
    [[ $t == qnn_binary ]] && mode=(-fork=1 -ignore_crashes=1 -detect_leaks=0)
    mkdir -p "fuzz/artifacts/$t"
    touch "$logs/$t.start"
    # shellcheck disable=SC2046
    nice -n 10 cargo fuzz run --fuzz-dir fuzz --jobs 1 "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$seconds" -max_len="${max_len[$t]}" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -close_fd_mask=1 "${mode[@]}" $(dict_for "$t") >"$log" 2>&1 || status=$?
    if ((${#mode[@]})); then
        # Fork mode reports `#<executions>: ... time: <s>s` lines instead of final stats.
        last="$(grep -E '^#[0-9]+: cov:' "$log" | tail -1)"
        execs="$(sed -n 's/^#\([0-9]*\):.*/\1/p' <<<"$last")"
        ran="$(sed -n 's/.* time: \([0-9]*\)s.*/\1/p' <<<"$last")"
        rate=$((${ran:-0} > 0 ? ${execs:-0} / ran : 0))
    else
        execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
        rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
        ran="$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)"
    fi
    corpus="$(find "fuzz/corpus/$t" -type f | wc -l)"
    result=ok
    if ((${#mode[@]})); then
        bin="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/$t"
        ours=0 vendor=0
        while IFS= read -r artifact; do
            case "$(vendor_or_ours "$bin" "$artifact")" in
                vendor) vendor=$((vendor + 1)) ;;
                unreproducible) rm -f "$artifact" ;;
                *)
                    ours=$((ours + 1))
                    echo "fuzz: $t: crash outside libQnnSystem: $artifact" >&2
                    ;;
            esac
        done < <(find "fuzz/artifacts/$t" -type f -newer "$logs/$t.start")
        ((vendor)) && result="ok ($vendor crashes inside libQnnSystem, see fuzz/README.md)"
        ((ours)) && status=1 && result="CRASH ($ours outside libQnnSystem; log $log)"
        ((ours)) || status=0
    elif ((status != 0)); then
        result="CRASH (exit $status; log $log; input in fuzz/artifacts/$t/)"
    fi
    ((status == 0)) || failed+=("$t")
    printf '%-16s %10s %14s %8s %8s  %s\n' "$t" "${rate:--}" "${execs:--}" "${ran:--}" "$corpus" "$result"
done

# The ring and ota_manifest targets keep their scratch files in /dev/shm/vla-fuzz-*-<pid>
# for speed; remove those whose process has ended.
for scratch in /dev/shm/vla-fuzz-ring-* /dev/shm/vla-fuzz-ota-* /tmp/vla-fuzz-ring-* /tmp/vla-fuzz-ota-*; do
    [[ -d "$scratch" ]] || continue
    kill -0 "${scratch##*-}" 2>/dev/null || rm -rf "$scratch"
done

if ((${#failed[@]})); then
    echo "fuzz: crashes in: ${failed[*]}" >&2
    exit 1
fi
