#!/bin/sh
# The fleet VM run's device, inside the VM (scripts/rauc/fleet_vm.py): policy A flashed,
# the daemon and a simulated robot running, a private D-Bus system bus, and the
# rauc-hawkbit agent (tools/vla_fleet/vla_fleet/agent.py) polling the host's goosebit at
# 10.0.2.2:$PORT through qemu's user-mode networking; its install command is the real
# `rauc install` (dm-verity, meta-vla's handlers). Runs until the host writes
# $work/stop, then records the device's state under $work/results and stops everything.
set -u
work=$1
. "$work/env.sh"
results=$work/results
mkdir -p "$results" "$OTA_ROOT" "$RAUC_REPO" "$RAUC_DATA" "$RAUC_MOUNT"
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export TMPDIR=/run/vla-check/tmp
mkdir -p "$TMPDIR"
export HOME=/root VLA_QNN_LIB_DIR VLAD VLAD_CONFIG VLA_RAUC_WAIT PYTHONDONTWRITEBYTECODE=1
cd "$work"

"$VLAD" ota install "$work/bundle-a" --config "$VLAD_CONFIG" > "$results/a-install.out" 2>&1
a=$(grep -oE '[0-9a-f]{64}' "$results/a-install.out" | head -n 1)
"$VLAD" ota activate "$a" --config "$VLAD_CONFIG" >> "$results/a-install.out" 2>&1
"$VLAD" run --config "$VLAD_CONFIG" > "$results/daemon.out" 2> "$results/daemon.log" &
daemon=$!
while [ ! -f "$OTA_ROOT/vlad.pid" ] && kill -0 "$daemon" 2>/dev/null; do sleep 0.2; done
"$VLAD" simulate --config "$VLAD_CONFIG" --duration 86400 --json "$results/robot.json" > "$results/robot.out" 2> "$results/robot.log" &
robot=$!
"$VLAD" ota verdict "$a" --wait "$VLA_RAUC_WAIT" --config "$VLAD_CONFIG" > "$results/a-verdict.out" 2>&1
echo $? > "$results/a-verdict.rc"

mkdir -p /run/dbus
dbus-daemon --session --nofork --address=unix:path=/run/dbus/system_bus_socket > "$results/dbus.log" 2>&1 &
bus=$!
while [ ! -S /run/dbus/system_bus_socket ] && kill -0 "$bus" 2>/dev/null; do sleep 0.2; done
DBUS_SYSTEM_BUS_ADDRESS=unix:path=/run/dbus/system_bus_socket "$FLEET_PYTHON" -m vla_fleet.agent \
    --server "10.0.2.2:$PORT" --target "$TARGET" --token-file "$work/token" --compatible "$COMPATIBLE" \
    --sw-version 1.0.0 --download /run/vla-check/download.raucb --retry 2 -- \
    "$RAUC" --conf="$work/system.conf" --mount="$RAUC_MOUNT" --override-boot-slot=A install \
    > "$results/agent.out" 2> "$results/agent.log" &
agent=$!
echo ready > "$results/ready"

# The host drives the rollouts; it says when it is done. The VM's time limit is the guard.
while [ ! -f "$work/stop" ]; do
    kill -0 "$daemon" 2>/dev/null || break
    sleep 1
done
"$VLAD" ota status --config "$VLAD_CONFIG" > "$results/final.status" 2>&1
readlink "$OTA_ROOT/current" > "$results/final.current" 2>/dev/null
ls "$OTA_ROOT/bundles" > "$results/final.bundles" 2>/dev/null
if kill -0 "$daemon" 2>/dev/null; then echo running; else echo gone; fi > "$results/final.daemon"
kill -TERM "$agent" "$robot" 2>/dev/null
kill -TERM "$daemon" 2>/dev/null
wait "$daemon"
echo $? > "$results/daemon.rc"
kill -TERM "$bus" 2>/dev/null
echo done > "$results/finished"
