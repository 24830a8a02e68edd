# shellcheck shell=sh
# The Python binding in the guest (switch topology): Debian's python3 and the
# binding's wheel in the initramfs; reads into accelerator memory by P2P,
# checked in the guest and, in the BAR's backing file, on the host.
# shellcheck source=lib.sh
. /suite/lib.sh

check module-loads insmod /lib/modules/p2pdma.ko
check python-runs /usr/bin/python3 -c 'import p2pdma, sys; print("p2pdma", p2pdma.__version__, "on Python", sys.version.split()[0])'
mount_rigfs
check_held python-p2p /usr/bin/python3 /suite/python_checks.py --nvme "$NVME" --fsdir /mnt
release_held
umount_rigfs
check module-unloads rmmod p2pdma
exit "$failures"
