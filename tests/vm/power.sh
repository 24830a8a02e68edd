# shellcheck shell=sh
# The object store across power cuts. The host boots this suite once per
# cut with rigpower.phase=write and rigpower.cut=N on the kernel command
# line: a fresh store on a file of the rig's ext4 (store-N.bin), with its
# cache and buffers in accelerator memory, runs creates, writes, resizes,
# deletes and flushes, printing "@@OP N B op" as each begins and
# "@@OP N E" as it returns, until the host kills QEMU. Then the host boots
# it with rigpower.phase=check and the lines of every cut in
# /suite/power-N.log: each store, reopened after the filesystem's journal
# is replayed, must hold the map of the last returned operation (or of the
# one in flight, had it committed) and every byte that was durable.
# shellcheck source=lib.sh
. /suite/lib.sh

param() { sed -n "s/.*rigpower\.$1=\([a-z0-9]*\).*/\1/p" /proc/cmdline; }
phase=$(param phase)

check module-loads insmod /lib/modules/p2pdma.ko
mount_rigfs
case $phase in
write)
	cut=$(param cut)
	truncate -s $((24 * 1048576)) "/mnt/store-$cut.bin"
	sync
	p2pdma-vmtest store-crash --child --path "/mnt/store-$cut.bin" --seed "$cut" --prefix "@@OP $cut "
	fail "power-cut-$cut" "the store's run ended before the power was cut"
	;;
check)
	n=0
	for log in /suite/power-*.log; do
		[ -f "$log" ] || continue
		cut=${log#/suite/power-}
		cut=${cut%.log}
		check "power-cut-$cut" p2pdma-vmtest store-crash --path "/mnt/store-$cut.bin" \
			--check-log "$log" --prefix "@@OP $cut "
		rm -f "/mnt/store-$cut.bin"
		n=$((n + 1))
	done
	killed=$(cat /suite/power-cuts 2>/dev/null || echo 0)
	if [ "$n" -gt 0 ] && [ "$n" = "$killed" ]; then
		pass "power-cuts-checked-$n"
	else
		fail power-cuts-checked "$n stores to check, $killed cuts made"
	fi
	umount_rigfs
	;;
*) fail power-phase "no rigpower.phase on the command line: $(cat /proc/cmdline)" ;;
esac
