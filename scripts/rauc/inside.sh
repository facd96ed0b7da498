#!/bin/sh
# The RAUC check's scenario, run inside the VM (scripts/rauc/vm-init.sh) with the host's
# tools. Records what happened under $work/results; scripts/rauc/check.py judges it.
#   1. the device as flashed: bundle A installed and active, the daemon running it with a
#      simulated robot;
#   2. for each RAUC bundle (good, gate-fails, untrusted): rauc install, then the exit
#      status, RAUC's output, vlad's OTA status and the artifact repository's link.
set -u
work=$1
. "$work/env.sh"
results=$work/results
mkdir -p "$results" "$OTA_ROOT" "$RAUC_REPO" "$RAUC_DATA" "$RAUC_MOUNT"
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The VM's /tmp is the host's, read-only: temporary files go to the VM's own /run.
export TMPDIR=/run/vla-check/tmp
mkdir -p "$TMPDIR"
export HOME=/root VLA_QNN_LIB_DIR VLAD VLAD_CONFIG VLA_RAUC_WAIT
cd "$work"

ls -l /dev/mapper/control /dev/loop-control > "$results/devices.txt" 2>&1

"$VLAD" ota install "$work/bundle-a" --config "$VLAD_CONFIG" > "$results/a-install.out" 2>&1
a=$(grep -oE '[0-9a-f]{64}' "$results/a-install.out" | head -n 1)
"$VLAD" ota activate "$a" --config "$VLAD_CONFIG" >> "$results/a-install.out" 2>&1
echo "$a" > "$results/a.hash"

# The daemon and the robot run until the scenario stops them (SIGTERM at the end): their
# lifetime is the scenario's, however slowly this machine gates and infers.
"$VLAD" run --config "$VLAD_CONFIG" > "$results/daemon.out" 2> "$results/daemon.log" &
daemon=$!
# The pid file comes once the daemon has read its config and loaded QNN: wait for it
# while the daemon lives (the VM's time limit is the guard against a hang).
while [ ! -f "$OTA_ROOT/vlad.pid" ] && kill -0 "$daemon" 2>/dev/null; do sleep 0.2; done
"$VLAD" simulate --config "$VLAD_CONFIG" --duration 86400 > "$results/robot.out" 2> "$results/robot.log" &
robot=$!
# A's own trial (one healthy inference) before any update. `--wait` is keyed on the
# daemon's progress (vlad ota verdict --help): it waits while the daemon loads and gates A,
# then VLA_RAUC_WAIT plus twice the gate's measured inference time for the first one.
"$VLAD" ota verdict "$a" --wait "$VLA_RAUC_WAIT" --config "$VLAD_CONFIG" > "$results/a-verdict.out" 2>&1
echo $? > "$results/a-verdict.rc"

for name in good gate-fails untrusted; do
    start=$(date +%s.%N)
    "$RAUC" --conf="$work/system.conf" --mount="$RAUC_MOUNT" --override-boot-slot=A \
        install "$work/$name.raucb" > "$results/$name.out" 2>&1
    echo $? > "$results/$name.rc"
    end=$(date +%s.%N)
    echo "$start $end" > "$results/$name.time"
    "$VLAD" ota status --config "$VLAD_CONFIG" > "$results/$name.status" 2>&1
    readlink "$RAUC_REPO/policy" > "$results/$name.artifact" 2>/dev/null || echo "(none)" > "$results/$name.artifact"
    readlink "$OTA_ROOT/current" > "$results/$name.current" 2>/dev/null || echo "(none)" > "$results/$name.current"
    # Inodes of one context binary: in the artifact repository and in the bundle store.
    for f in "$RAUC_REPO/policy/$PROBE_FILE" "$OTA_ROOT/current/$PROBE_FILE"; do
        stat -L -c '%i %h %n' "$f" 2>&1
    done > "$results/$name.inodes"
    if kill -0 "$daemon" 2>/dev/null; then echo running; else echo gone; fi > "$results/$name.daemon"
done

# Background jobs of a non-interactive sh ignore SIGINT: stop the robot with SIGTERM.
kill -TERM "$robot" 2>/dev/null
kill -TERM "$daemon" 2>/dev/null
wait "$daemon"
echo $? > "$results/daemon.rc"
wait "$robot" 2>/dev/null
df -k "$OTA_ROOT" > "$results/df.txt" 2>&1
du -sk "$RAUC_REPO" "$OTA_ROOT/bundles" >> "$results/df.txt" 2>&1
echo done > "$results/finished"
