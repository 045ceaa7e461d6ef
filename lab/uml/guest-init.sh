#!/bin/sh
# PID 1 of the lab guest. The host writes everything run-specific into the run directory
# (passed as `labdir=` on the kernel command line, which the kernel hands us as $labdir):
# setup.sh loads modules and shims, env.sh holds the environment, command.sh the command. We print markers around
# the command's output on the console and write its exit status to the run directory, because
# linux.uml itself exits 0 whatever happened in here.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/lab /run/netns
mount --bind "$labdir" /run/lab
# Private, fast scratch space (TMPDIR points here). The host's /tmp stays visible: the
# repository or its venv may live under it.
mkdir -p /run/tmp
chmod 1777 /run/tmp
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts 2>/dev/null
mount -t tmpfs tmpfs /dev/shm
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
hostname lab-guest

rc=125
if sh /run/lab/setup.sh; then
    echo "@@LAB-BEGIN@@"
    sh /run/lab/command.sh </dev/null
    rc=$?
else
    echo "@@LAB-SETUP-FAILED@@"
fi
echo "$rc" > /run/lab/rc
sync
echo "@@LAB-END rc=$rc@@"
halt -f
