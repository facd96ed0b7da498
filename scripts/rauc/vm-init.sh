#!/bin/busybox sh
# /init of the check VM (scripts/rauc/vm.py packs it with busybox and the kernel modules
# the scenario needs: the RAUC check, the power-cut run): load the modules, mount the
# host's root file system (read-only) and the check's work directory (read-write) over
# 9p, give them fresh proc, sys, dev, shm and run, run the scenario chrooted there
# (<work>/inside.sh), power off.
/bin/busybox mkdir -p /bin /proc /sys /dev /host
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do
    insmod "/modules/$m" || echo "vm-init: insmod $m failed"
done
# A scenario that boots the VM with a NIC (qemu user-mode networking: the fleet VM run)
# reaches the host's loopback as 10.0.2.2; the others have none.
ip link set lo up
if [ -e /sys/class/net/eth0 ]; then
    ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2
fi
work=$(cat /work-path)
opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts,ro,cache=loose" hostroot /host || { echo "vm-init: no host root"; poweroff -f; }
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/shm
mount -t tmpfs shm /host/dev/shm
mount -t tmpfs run /host/run
# /tmp stays the host's (read-only): the checkout, and so vlad and RAUC, may live there.
# The work share goes last, so that no mount above can hide it.
mkdir -p "/host$work"
mount -t 9p -o "$opts" work "/host$work" || { echo "vm-init: no work share"; poweroff -f; }
echo "vm-init: kernel $(uname -r), $(grep -c processor /proc/cpuinfo) cpu(s); running the scenario"
chroot /host /bin/sh "$work/inside.sh" "$work"
echo "vm-init: scenario exited $?"
sync
poweroff -f
