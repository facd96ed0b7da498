#!/usr/bin/env bash
# The benchmark command: one run, one table (build/bench/latest.md, printed) and its
# JSON (build/bench/latest.json, plus one file per part). Figures only, never a gate.
#
#   scripts/bench.sh                     # everything (~12 min on the 2-core dev VM)
#   BENCH_LOOP_SECONDS=10 scripts/bench.sh   # shorter loop-jitter window
#   BENCH_PARTS="4" scripts/bench.sh         # only some parts (1, 2 (with 3), 4, 5); the
#                                            # table then has only those sections
#   BENCH_UPDATE_DOC=1 scripts/bench.sh      # also refresh the table in docs/benchmarks.md
#
# Parts (numbered as in docs/benchmarks.md):
#   1  host glue per inference at the seeds' full dims: vla-bench host vs
#      tools/vla_host/vla_host/reference.py (bench_numpy.py host), memcpy floor of this run
#   2  every fixture bundle on the HTP emulator: vlad bench-bundle vs ONNX Runtime's
#      QNN EP on the same binaries with numpy glue (bench_numpy.py ort)
#   3  context load mmap vs read into memory, RSS/PSS (inside vlad bench-bundle)
#   4  publish jitter at 10/20/50 Hz of the real control loop (vla-bench loop) next to
#      cyclictest (rt-tests), per rate back to back on this machine
#   5  action ring vs pipe, write-to-visible across two processes (vla-bench ring)
#   6  release binary sizes; allocations per inference (host glue) and per tick (loop)
#   7  chunk execution sweep: latency {0.1,0.3,0.6,1.2 s} x publish rate
#      {5,10,20 Hz} x merge mode {skip,crossfade,prefix,inpaint} on the Fast-WAM
#      fixture, the latency injected with control.extra_latency_ms, seam offsets from
#      each cell's flight recording (scripts/chunk_sweep.py; ~10 min at
#      BENCH_CHUNK_SECONDS=8)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

out=build/bench
host_iterations=${BENCH_HOST_ITERATIONS:-10}
bundle_iterations=${BENCH_BUNDLE_ITERATIONS:-5}
ring_messages=${BENCH_RING_MESSAGES:-20000}
loop_seconds=${BENCH_LOOP_SECONDS:-60}
chunk_seconds=${BENCH_CHUNK_SECONDS:-8}
parts=" ${BENCH_PARTS:-1 2 4 5 7} "
part() { [[ $parts == *" $1 "* ]]; }
rt_tests_version=2.4-1
started=$(date +%s)
step() { printf '\n=== %s (%ds)\n' "$*" "$(($(date +%s) - started))" >&2; }
# onnxruntime's QNN provider (bench_numpy.py ort, the sweep's reference) lets the HTP
# emulator print its "# LIBNATIVE" load banner on stdout (vlad sends it to its qnn log).
quiet() { "$@" | grep -v '# LIBNATIVE' || true; }

step "set-up: venv, rt-tests $rt_tests_version"
[[ -x .venv/bin/python ]] || scripts/setup.sh >&2
if ! dpkg-query -W -f='${Version}' rt-tests 2>/dev/null | grep -qx "$rt_tests_version"; then
    sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "rt-tests=$rt_tests_version" >/dev/null
fi
export VLA_QNN_LIB_DIR="${VLA_QNN_LIB_DIR:-$(scripts/qnn_lib_dir.sh)}"
py=.venv/bin/python

step "release build (vlad, vla-bench)"
cargo build --release -p vlad -p vla-bench >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | "$py" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
vlad="$target_dir/release/vlad"
bench="$target_dir/release/vla-bench"
rm -rf "$out"
mkdir -p "$out"

settings=$(env | grep -E '^BENCH_[A-Z_]+=' | sort | tr '\n' ' ' || true)
"$py" - "$out/meta.json" "$vlad" "$bench" "$settings" <<'PY'
import json, os, platform, subprocess, sys, time
path, vlad, bench, settings = sys.argv[1:5]
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
json.dump({
    "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    "machine": f"{model}, {os.cpu_count()} CPUs, {platform.machine()}, Linux {platform.release()}",
    "command": (settings + "scripts/bench.sh").strip(),
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "binaries": {os.path.basename(p): os.path.getsize(p) for p in (vlad, bench)},
}, open(path, "w"), indent=2)
PY

if part 1; then
    step "1. host glue at full dims: ours"
    "$bench" host --iterations "$host_iterations" --json "$out/host-rust.json" >/dev/null
    step "1. host glue at full dims: numpy (tools/vla_host/vla_host/reference.py)"
    "$py" scripts/bench_numpy.py host --iterations "$host_iterations" --json "$out/host-numpy.json" >/dev/null
fi

# Ours and ONNX Runtime back to back per bundle: the emulator's speed drifts with the
# machine's load, so each ratio compares neighbours in time.
part 2 && for b in golden/bundles/*/; do
    name=$(basename "$b")
    step "2-3. $name on the HTP emulator: vlad bench-bundle"
    quiet "$vlad" bench-bundle --bundle "$b" --iterations "$bundle_iterations" --warmup 1 \
        --json "$out/bundle-$name.json" >&2
    step "2. $name through ONNX Runtime's QNN EP + numpy glue"
    quiet "$py" scripts/bench_numpy.py ort --bundle "$b" --vlad "$vlad" --lib-dir "$VLA_QNN_LIB_DIR" \
        --iterations "$bundle_iterations" --build "$out/ort" --json "$out/ort-$name.json" >/dev/null
done

if part 5; then
    step "5. action ring vs pipe across two processes"
    VLA_BENCH_FIFO=50 "$bench" ring --messages "$ring_messages" --gap-us 50 --json "$out/ring.json" >/dev/null
fi

# Item 4 and allocations per tick: per rate, cyclictest alone (the floor) and then the
# real control loop alone (`vla-bench loop`), back to back so each ratio compares
# neighbours in time on this shared machine. Both ask for SCHED_FIFO 80, mlockall and
# /dev/cpu_dma_latency = 0; whether the kernel granted FIFO is recorded, not assumed.
if chrt -f 80 true 2>/dev/null; then fifo_permitted=true; else fifo_permitted=false; fi
part 4 && for hz in 10 20 50; do
    step "4. loop jitter at $hz Hz for ${loop_seconds}s: cyclictest"
    cyclictest -q -m -p 80 -t 1 -i $((1000000 / hz)) -D "${loop_seconds}s" -h 50000 \
        >"$out/cyclictest-$hz.txt" 2>&1 || true
    step "4. loop jitter at $hz Hz for ${loop_seconds}s: vla-bench loop (vla-control)"
    "$bench" loop --rates "$hz" --seconds "$loop_seconds" --priority 80 \
        --json "$out/loop-vla-$hz.json" >/dev/null || echo "vla-bench loop at $hz Hz failed" >&2
done
part 4 && "$py" - "$out" "$loop_seconds" "$fifo_permitted" <<'PY'
import json, re, sys
from pathlib import Path
out, seconds, fifo_permitted = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "true"
rows, ours = [], []
for hz in (10, 20, 50):
    text = (out / f"cyclictest-{hz}.txt").read_text()
    hist = [(int(a), int(b)) for a, b in re.findall(r"(?m)^(\d+)\s+(\d+)\s*$", text)]
    total = sum(c for _, c in hist)
    def q(p):
        acc = 0
        for us, c in hist:
            acc += c
            if acc >= p * total:
                return float(us)
        return None
    mx = re.search(r"# Max Latencies:\s*(\d+)", text)
    rows.append({"hz": hz, "source": "cyclictest", "samples": total, "p50_us": q(0.5) if total else None,
                 "p99_us": q(0.99) if total else None, "max_us": float(mx.group(1)) if mx else None,
                 "misses": "-"})
    theirs = out / f"loop-vla-{hz}.json"
    if theirs.is_file():
        doc = json.loads(theirs.read_text())
        ours += [dict(r, mlockall=doc.get("mlockall"), cpu_dma_latency_zero=doc.get("cpu_dma_latency_zero"),
                      inference_ms=doc.get("inference_ms"), camera_hz=doc.get("camera_hz"))
                 for r in doc.get("rows", [])]
        rows.append(ours[-1])
ct_sched = "SCHED_FIFO 80" if fifo_permitted else "SCHED_OTHER (SCHED_FIFO refused here)"
note = (f"Per rate, cyclictest (rt-tests; {ct_sched}, mlockall, /dev/cpu_dma_latency 0, 1 us histogram buckets) "
        f"for {seconds} s, then the real control loop (`vla-bench loop`: vla_control::ControlLoop over real "
        "observation and action rings in /dev/shm, a camera thread at 30 Hz, a synthetic engine sleeping "
        "the inference time) for 2 s warm-up + "
        f"{seconds} s, back to back.")
if ours:
    r0 = ours[0]
    scheds = sorted({r.get("publisher_sched", "?") for r in ours})
    note += (f" Loop: publisher thread ran {' / '.join(scheds)} (read from /proc), mlockall "
             f"{'on' if r0.get('mlockall') else 'refused'}, /dev/cpu_dma_latency 0 "
             f"{'held' if r0.get('cpu_dma_latency_zero') else 'refused'}; inference {r0.get('inference_ms'):g} ms. "
             "Loop jitter = the loop's own histogram (wake-up lateness vs the absolute deadline, upper edge of "
             "1 us buckets; cyclictest floors to the microsecond). Allocations per tick = allocations made on "
             "the publisher thread (found by name in /proc/self/task, counted by tid in a counting global "
             "allocator) after warm-up / ticks; the whole process, for information: "
             + ", ".join(f"{r['hz']} Hz {r['process_allocations']} allocations over {r['ticks_after_warmup']} "
                         "ticks" for r in ours) + ".")
else:
    note += " `vla-bench loop` wrote no result: publish jitter and allocations per tick are not measured in this run."
json.dump({"seconds": seconds, "rows": rows, "note": note}, open(out / "loop.json", "w"), indent=2)
PY

if part 7; then
    step "7. chunk execution sweep: latency x rate x merge mode, ${chunk_seconds}s per cell"
    quiet "$py" scripts/chunk_sweep.py --vlad "$vlad" --out "$out/chunks" --seconds "$chunk_seconds" \
        --timeline-cell 0.3,20,skip --timeline-cell 0.3,20,crossfade --timeline-cell 0.3,20,prefix \
        --timeline-cell 0.3,20,inpaint --timeline-dir "$out/chunks" >"$out/chunks.md"
fi

step "table"
"$py" scripts/bench_numpy.py render --dir "$out" ${BENCH_UPDATE_DOC:+--doc docs/benchmarks.md}
if [[ -s $out/chunks.md ]]; then
    printf '\n## 7. Chunk execution sweep\n\n' >>"$out/latest.md"
    cat "$out/chunks.md" >>"$out/latest.md"
    printf '\n## 7. Chunk execution sweep\n\n'
    cat "$out/chunks.md"
fi
echo "wrote $out/latest.md and $out/latest.json ($(($(date +%s) - started)) s)" >&2
