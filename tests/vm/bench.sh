# shellcheck shell=sh
# Benchmarks in the VM (not tests): guest CPU time per GiB moved from the
# NVMe into accelerator memory on each path. Emulated device DMA runs in
# QEMU, outside the guest, so guest CPU time measures CPU involvement. Then
# small-copy latency into the accelerator's write-combined BAR mapping, and
# small random reads through the engine against pread (TCG emulates the CPU,
# so these are the emulator's, not hardware, timings). Then routes through
# host memory into the second accelerator, pipelined against
# store-and-forward. Then the object store's page cache and prefetch.
# shellcheck source=lib.sh
. /suite/lib.sh

check module-loads insmod /lib/modules/p2pdma.ko
check bench-cpu p2pdma-ctl bench cpu --nvme "$NVME" --size 48M --reps 36
check bench-copy p2pdma-ctl bench copy
# 4 KiB random reads of the NVMe namespace into BAR memory: the engine (AUTO
# picks P2P here) against pread with O_DIRECT plus a copy.
check bench-small p2pdma-ctl bench small --file "$NVME" --size 48M --reps 2
# Routes of 2 to 4 hops into the second accelerator (on its own root port),
# store-and-forward against pipelined, n = 1 to 64 chunks.
if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	# 4 KiB random reads of the spare controller's namespace, depth 1 to
	# 128, 4 threads: O_DIRECT P2P and passthrough while the nvme driver has
	# it, then the queues path with the controller taken (and given back);
	# 1 MiB sequential reads' CPU per GiB on bounce, P2P and queues.
	check bench-queues p2pdma-ctl bench queues --serial p2pdma-vfio --nsid 7 --size 48M --secs 1 --reps 5
	check bench-route p2pdma-ctl bench route --accel --nvme "$NVME" --size 24M --reps 3
fi
# Many SSDs as one (switch): a lone member, an md RAID0 over 2 members and
# one over 4 (512 KiB chunks; one at a time, md claims its members), each
# read by P2P into accelerator memory against fio's best on it; guest CPU
# per GiB on the array of 4, P2P against bounce; then the members read in
# parallel by fio against the library's striped volume over them.
if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	M0=$(ns_dev 10) M1=$(ns_dev 11) M2=$(ns_dev 12) M3=$(ns_dev 13)
	check bench-arrays-1 p2pdma-ctl bench arrays --targets "1=$M0" --size 32M --reps 5
	for n in 2 4; do
		set -- "$M0" "$M1"
		if [ $n = 4 ]; then set -- "$M0" "$M1" "$M2" "$M3"; fi
		check "bench-mdadm-$n" mdadm --create /dev/md10 --run --assume-clean --metadata=1.2 \
			--level=0 --chunk=512 --raid-devices=$n "$@"
		check "bench-arrays-$n" p2pdma-ctl bench arrays --targets "$n=/dev/md10" --size 32M --reps 5
		if [ $n = 4 ]; then
			check bench-cpu-array p2pdma-ctl bench cpu --nvme /dev/md10 --size 32M --reps 12
		fi
		check "bench-mdadm-stop-$n" mdadm --stop /dev/md10
	done
	check bench-volume p2pdma-ctl bench volume --members "$M0,$M1,$M2,$M3" --size 24M --bs 512K --reps 3
fi
# The object store on a file of the NVMe-backed ext4, its page cache and
# buffers in accelerator memory: Zipf reads with the cache against without,
# and prefetch against plain reads on a scan with a compute step per block.
mount_rigfs
check bench-store p2pdma-ctl bench store --accel --file /mnt/store.bin --size 24M --reps 3
rm -f /mnt/store.bin
umount_rigfs
rmmod p2pdma
exit "$failures"
