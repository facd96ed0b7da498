#!/bin/sh
# The power-cut run's scenario, run inside the VM at every boot (scripts/rauc/vm-init.sh)
# with the host's tools; scripts/rauc/powercut.py boots it, cuts the power and judges.
#   1. check what the last cut left: the OTA store's file system (/dev/vda, ext4) after its
#      journal replay (e2fsck -fn), the store as the cut left it (read only), then the
#      daemon's start-up recovery, its parity gate and a simulated robot until it applies
#      `ok` actions; the store after recovery; every stored bundle verified. Recorded in
#      $work/boots/<boot>/, then `powercut: check done` on the console.
#   2. mode `loop`: install, activate, trial, commit, gc, forever, announcing each phase on
#      the serial console (`powercut: begin|end <iteration> <phase> <hash>`), until the host
#      kills the VM. Mode `check`: stop the daemon, unmount, power off.
# Nothing written here after `check done` is judged: the cut may lose it.
set -u
work=$1
. "$work/env.sh"
boot=$(cat "$work/boot")
mode=$(cat "$work/mode")
out=$work/boots/$boot
mkdir -p "$out/loop" "$out/verify"
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The VM's /tmp is the host's, read-only: temporary files go to the VM's own /run.
export TMPDIR=/run/vla-powercut/tmp HOME=/root VLA_QNN_LIB_DIR
mkdir -p "$TMPDIR" "$DISK_MNT"
cd "$work"

# Markers go to the serial console, which the host reads as they come (the 9p share could
# lose or delay what the cut interrupts).
mark() { echo "powercut: $*"; }
now() { cut -d' ' -f1 /proc/uptime; }
fail() { echo "$*" >> "$out/check-errors"; mark "check error: $*"; }

mark "boot $boot mode $mode"
# Only what the store flushes itself, or the journal commits, reaches the disk: a long
# commit interval and dirty-page expiry keep the rest in the page cache the cut loses.
echo 6000 > /proc/sys/vm/dirty_expire_centisecs
echo 6000 > /proc/sys/vm/dirty_writeback_centisecs

# ---- 1. the file system: journal replay, then a read-only check of it unmounted --------
echo "$(now)" > "$out/t-start"
mount -t ext4 "$DISK_DEV" "$DISK_MNT" > "$out/mount-replay.out" 2>&1
echo $? > "$out/mount-replay.rc"
umount "$DISK_MNT" 2>> "$out/mount-replay.out"
e2fsck -fn "$DISK_DEV" > "$out/fsck.out" 2>&1
echo $? > "$out/fsck.rc"
mount -t ext4 -o commit=60 "$DISK_DEV" "$DISK_MNT" > "$out/mount.out" 2>&1
echo $? > "$out/mount.rc"

# ---- the store as the cut left it, before anything recovers (no lock taken) ------------
snapshot() {
    "$VLAD" ota status --config "$VLAD_CONFIG" > "$out/$1.status" 2>&1
    echo $? > "$out/$1.status.rc"
    cat "$OTA_ROOT/ota-state.json" > "$out/$1.state" 2> /dev/null || : > "$out/$1.state"
    ls -A1 "$OTA_ROOT" > "$out/$1.root" 2>&1
    ls -A1 "$OTA_ROOT/bundles" > "$out/$1.bundles" 2>&1
    for link in current previous; do
        echo "$link $(readlink "$OTA_ROOT/$link" 2>/dev/null || echo '(none)')"
    done > "$out/$1.links"
}
snapshot before

# ---- 2. the daemon: start-up recovery, parity gate, a robot it serves ------------------
# The robot starts with the daemon and waits for its action ring, as firmware would.
"$VLAD" run --config "$VLAD_CONFIG" > "$out/daemon.out" 2> "$out/daemon.log" &
daemon=$!
"$VLAD" simulate --config "$VLAD_CONFIG" --duration 1000000 --camera-hz "$CAMERA_HZ" \
    --json "$out/robot.json" > "$out/robot.out" 2> "$out/robot.log" &
robot=$!
# The daemon writes its pid file after recovery, before it loads (a stale one names
# another pid; the file is `pid boot_id start_ticks`). Every wait of this check is for
# something the daemon reports, for as long as it lives: the boot's limit (powercut.py
# --boot-timeout) is the one guard against a hang, however slow this machine is.
until [ "$(cut -d' ' -f1 "$OTA_ROOT/vlad.pid" 2>/dev/null)" = "$daemon" ]; do
    kill -0 "$daemon" 2>/dev/null || break
    sleep 1
done
echo "$(now)" > "$out/t-recovered"

# ---- 3. every stored bundle verified, while the daemon gates current -------------------
for name in $(ls -A "$OTA_ROOT/bundles" 2>/dev/null); do
    "$VLAD" bundle verify "$OTA_ROOT/bundles/$name" --config "$VLAD_CONFIG" > "$out/verify/$name.out" 2>&1
    echo $? > "$out/verify/$name.rc"
done

until grep -q "running: publishing" "$out/daemon.log" 2>/dev/null; do
    kill -0 "$daemon" 2>/dev/null || break
    sleep 1
done
echo "$(now)" > "$out/t-ready"
if grep -q "running: publishing" "$out/daemon.log"; then
    ok=0
    while [ "$ok" -lt "$OK_ACTIONS" ] && kill -0 "$daemon" 2>/dev/null && kill -0 "$robot" 2>/dev/null; do
        sleep 1
        ok=$(sed -n 's/.*"ok_applied": *\([0-9]*\).*/\1/p' "$out/robot.json" 2>/dev/null)
        ok=${ok:-0}
    done
    echo "$ok" > "$out/robot-ok"
    [ "$ok" -ge "$OK_ACTIONS" ] || fail "the robot applied $ok ok actions (wanted $OK_ACTIONS) before the daemon or the robot ended"
else
    fail "the daemon ended before 'running: publishing'"
fi
if kill -0 "$daemon" 2>/dev/null; then echo running; else echo gone; fi > "$out/daemon-state"
echo "$(now)" > "$out/t-ok"

# ---- 4. the store after recovery: state, links, leftovers, current ----------------------
snapshot after
"$VLAD" bundle verify "$OTA_ROOT/current" --config "$VLAD_CONFIG" > "$out/verify-current.out" 2>&1
echo $? > "$out/verify-current.rc"
df -k "$DISK_MNT" > "$out/df.txt" 2>&1
echo "$(now)" > "$out/t-checked"
echo done > "$out/check-finished"
mark "check done"

if [ "$mode" != loop ] || [ "$(cat "$out/daemon-state")" != running ]; then
    # The last boot (or a daemon that did not start): stop cleanly and power off.
    kill -TERM "$robot" 2>/dev/null
    kill -TERM "$daemon" 2>/dev/null
    wait "$daemon"
    echo $? > "$out/daemon.rc"
    wait "$robot" 2>/dev/null
    umount "$DISK_MNT"
    echo $? > "$out/umount.rc"
    mark "finished"
    exit 0
fi

# ---- 5. the loop, until the power goes -------------------------------------------------
link_hash() { basename "$(readlink "$OTA_ROOT/$1" 2>/dev/null || echo none)"; }
hash_of() { eval "echo \$HASH_$1"; }

# The first fixture after the current one that is neither current nor previous: each
# install then writes a bundle gc removed, or finds one a cut kept.
next_bundle() {
    cur=$(link_hash current)
    prev=$(link_hash previous)
    set -- $BUNDLES $BUNDLES
    for b in $BUNDLES; do
        if [ "$(hash_of "$b")" = "$cur" ]; then
            while [ "$1" != "$b" ]; do shift; done
            shift
        fi
    done
    for b in "$@"; do
        h=$(hash_of "$b")
        if [ "$h" != "$cur" ] && [ "$h" != "$prev" ]; then echo "$b"; return; fi
    done
}

# The rest of the trial: polled while the daemon and the robot live (a rollback ends it
# at once: the verdict's exit status).
wait_committed() {
    while kill -0 "$daemon" 2>/dev/null && kill -0 "$robot" 2>/dev/null; do
        "$VLAD" ota verdict "$1" --config "$VLAD_CONFIG" > "$TMPDIR/verdict" 2>&1 || { cat "$TMPDIR/verdict"; return 1; }
        grep -q committed "$TMPDIR/verdict" && { cat "$TMPDIR/verdict"; return 0; }
        sleep 1
    done
    cat "$TMPDIR/verdict"
    echo "not committed: the daemon or the robot ended"
    return 4
}

# step <phase> <hash> <command...>: one phase, announced before and after.
step() {
    phase=$1 h=$2
    shift 2
    if ! kill -0 "$daemon" 2>/dev/null; then
        mark "error $iter $phase $h the daemon is gone"
        return 1
    fi
    mark "begin $iter $phase $h"
    "$@" > "$out/loop/$iter-$phase.out" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        mark "error $iter $phase $h exit $rc: $(tail -n 3 "$out/loop/$iter-$phase.out" | tr '\n' ' ')"
        return 1
    fi
    mark "end $iter $phase $h"
}

mark "loop start"
iter=0
while :; do
    b=$(next_bundle)
    h=$(hash_of "$b")
    eval "src=\$SRC_$b placement=\$PLACEMENT_$b"
    if [ "$placement" = link ]; then link=--link; else link=; fi
    step install "$h" "$VLAD" ota install "$src" $link --config "$VLAD_CONFIG" || break
    step activate "$h" "$VLAD" ota activate "$h" --config "$VLAD_CONFIG" || break
    # Keyed on the daemon's progress (vlad ota verdict --help); WAIT_S is the slack.
    step trial "$h" "$VLAD" ota verdict "$h" --wait "$WAIT_S" --config "$VLAD_CONFIG" || break
    step commit "$h" wait_committed "$h" || break
    step gc "$h" "$VLAD" ota gc --config "$VLAD_CONFIG" || break
    iter=$((iter + 1))
done
# A failing step: the host records it and ends the VM.
sleep 100000
