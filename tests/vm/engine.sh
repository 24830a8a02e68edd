# shellcheck shell=sh
# The library's transfer engine against the real module and NVMe driver:
# AUTO picks P2P on the switch topology and the bounce pipeline (with the
# kernel's reason) on the no-switch one; forced paths, unaligned heads and
# tails, writes with read-modify-write, and P2P failures retried on the
# bounce path. The host checks every byte in the BAR's backing file and in
# the NVMe image. The same on files of an ext4 filesystem on the NVMe: P2P
# and NVMe commands (extents from FIEMAP) with the filesystem kept, dirty
# page cache written back before NVMe-command reads, the page cache
# invalidated after NVMe-command writes, warm data copied out of the page
# cache, holes and unwritten extents read as
# zeros, and NVMe-command writes that would need allocation redone on the
# bounce path; the host reads the files back out of the image with debugfs.
# Strided reads and writes on every path, every mode, checked run by run.
# shellcheck source=lib.sh
. /suite/lib.sh

check module-loads insmod /lib/modules/p2pdma.ko
# Background reads on the throttled namespace (1 MiB/s), then one on the
# rig's first: that one does not wait behind the throttled device's
# queue (each device has its own worker threads); every byte checked
# against a buffered read.
check engine-lanes p2pdma-vmtest engine-lanes --slow "$(ns_dev 6)" --fast "$NVME"
M=1048576
if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	check_held auto-read-p2p p2pdma-vmtest engine-read --nvme "$NVME" --offset $((16 * M)) --len $((4 * M)) --expect-path p2p --module-io yes --hold
	check_held auto-read-p2p-unaligned p2pdma-vmtest engine-read --nvme "$NVME" --offset $((20 * M + 12345)) --len $((M + 777)) --mem-offset 57 --expect-path p2p --module-io yes --hold
	check_held forced-bounce-read p2pdma-vmtest engine-read --nvme "$NVME" --path bounce --offset $((24 * M + 4096)) --len $((2 * M)) --expect-path bounce --hold
	check_held p2p-misaligned-retried p2pdma-vmtest engine-read --nvme "$NVME" --path p2p --offset $((26 * M)) --len $((M / 2)) --mem-offset 100 --expect-path bounce --expect-retry --hold
	check_held nvme-cmd-read p2pdma-vmtest engine-read --nvme "$NVME" --path nvme-cmd --offset $((28 * M)) --len $((3 * M)) --expect-path nvme-cmd --hold
	check_held nvme-cmd-read-unaligned p2pdma-vmtest engine-read --nvme "$NVME" --path nvme-cmd --offset $((32 * M + 999)) --len $((M + 5)) --mem-offset 999 --expect-path nvme-cmd --hold
	# The device's own page cache: cached before an NVMe-command write, a
	# buffered read after it must see the new bytes; dirty (written through
	# the node, not yet written back) before an NVMe-command read, the read
	# must see them. (The shell holds the device open meanwhile: its last
	# close would write its page cache back and drop it.)
	exec 3<"$NVME"
	dd if="$NVME" of=/dev/null bs=$M skip=52 count=2 2>/dev/null
	check nvme-cmd-write p2pdma-vmtest engine-write --nvme "$NVME" --path nvme-cmd --offset $((52 * M + 512)) --len $((M + 4096)) --mem-offset 512 --pattern-offset $((13 * M)) --expect-path nvme-cmd --verify-buffered
	dd if=/dev/urandom of="$NVME" bs=$M seek=60 count=1 conv=notrunc 2>/dev/null
	check_held nvme-cmd-read-dirty-device p2pdma-vmtest engine-read --nvme "$NVME" --path nvme-cmd --offset $((60 * M + 4096)) --len $((M - 8192)) --expect-path nvme-cmd --verify-buffered --hold
	# Warm data: what the device's page cache holds is copied from there
	# into the accelerator's memory, the rest moves by P2P, in one read.
	dd if="$NVME" of=/dev/null bs=$M skip=34 count=3 2>/dev/null
	check_held warm-read-page-cache p2pdma-vmtest engine-read --nvme "$NVME" --page-cache auto --offset $((34 * M + 100)) --len $((2 * M)) --mem-offset 100 \
		--expect-path p2p --expect-page-cache all --hold
	check_held half-warm-read p2pdma-vmtest engine-read --nvme "$NVME" --page-cache auto --offset $((36 * M)) --len $((4 * M)) \
		--expect-path p2p --expect-page-cache some --module-io yes --hold
	exec 3<&-
	# The multipath namespace: AUTO asks the kernel for both paths'
	# controllers and takes P2P, saying so; NVMe commands go through the
	# head's generic device. The host compares the bytes with mp.img.
	MP=$(ns_dev 3)
	MP_NG=/dev/ng${MP#/dev/nvme}
	mp1=$(mp_paths "$MP" | sed -n 1p) mp2=$(mp_paths "$MP" | sed -n 2p)
	every="P2P on every path of the multipath namespace, since I/O may take any of them; "
	check_held mp-auto-read-p2p p2pdma-vmtest engine-read --nvme "$MP" --image mp.img --offset $((5 * M + 100)) --len $((3 * M + 50)) --mem-offset 100 \
		--expect-path p2p --expect-reason "$every$mp1: P2P by PCI bus address" --expect-reason "; $mp2: P2P by PCI bus address" --hold
	check_held mp-nvme-cmd-read p2pdma-vmtest engine-read --nvme "$MP" --image mp.img --path nvme-cmd --offset $((9 * M + 4096)) --len $((2 * M + 7)) \
		--expect-path nvme-cmd --expect-reason "on $MP_NG (namespace 3); $every$mp1" --hold
	# The namespace with metadata: NVMe commands refused up front with the
	# reason; P2P (the block layer handles the protection information) lands
	# the bytes of md.img.
	MD=$(ns_dev 4)
	out=$(p2pdma-vmtest engine-read --nvme "$MD" --path nvme-cmd --offset 0 --len 4096 --expect-path bounce 2>&1)
	rc=$?
	echo "$out"
	want="the nvme-cmd path cannot be used: $MD: ${MD#/dev/} is formatted with 8 bytes of metadata per block: the library's NVMe commands carry no metadata buffer"
	case $rc:$out in
	0:*) fail md-nvme-cmd-refused "NVMe commands were not refused" ;;
	*"$want"*) pass md-nvme-cmd-refused ;;
	*) fail md-nvme-cmd-refused "$(echo "$out" | tail -n 1)" ;;
	esac
	check_held md-auto-read-p2p p2pdma-vmtest engine-read --nvme "$MD" --image md.img --offset $((3 * M + 100)) --len $((2 * M + 50)) --mem-offset 100 \
		--expect-path p2p --expect-reason "P2P by PCI bus address" --hold
	# A bad block: reads touching byte 8 MiB of NSID 5 fail with a medium
	# error. Every path fails the read with ENODATA, NVMe commands keep the
	# controller's status, and nothing is read again on the bounce path.
	BAD=$(ns_dev 5)
	check bad-block-p2p-fails p2pdma-vmtest engine-read --nvme "$BAD" --offset $((8 * M - 4096)) --len $((64 * 1024)) \
		--expect-path p2p --expect-errno ENODATA
	check bad-block-nvme-cmd-fails p2pdma-vmtest engine-read --nvme "$BAD" --path nvme-cmd --offset $((8 * M - 4096)) --len $((64 * 1024)) \
		--expect-path nvme-cmd --expect-errno ENODATA --expect-nvme-status 0x281
	check bad-block-bounce-fails p2pdma-vmtest engine-read --nvme "$BAD" --path bounce --offset $((8 * M - 4096)) --len $((64 * 1024)) \
		--expect-path bounce --expect-errno ENODATA
	check auto-write-p2p p2pdma-vmtest engine-write --nvme "$NVME" --offset $((40 * M + 300)) --len $((M + 1000)) --mem-offset 300 --pattern-offset $((5 * M + 8)) --expect-path p2p --module-io yes
	check forced-bounce-write p2pdma-vmtest engine-write --nvme "$NVME" --path bounce --offset $((48 * M)) --len $((2 * M)) --pattern-offset $((9 * M)) --expect-path bounce
	# Routes: the second accelerator sits on a root port of its own, where
	# P2P reaches neither the namespace nor the first accelerator. The
	# planner goes through host memory and says why; a route given by the
	# caller stages in the first accelerator's memory (P2P from the
	# namespace), then host memory. The host compares accel1.bin (and
	# accel.bin) with nvme.img, and the written range of nvme.img with the
	# rig pattern.
	check_held route-nvme-a1 p2pdma-vmtest route --nvme "$NVME" --kind nvme-a1 --offset $((2 * M + 555)) --len $((3 * M + 77)) --mem-offset 99 \
		--expect-hops read-direct,copy --expect-reason "through host memory: " --hold
	check_held route-nvme-a0-a1 p2pdma-vmtest route --nvme "$NVME" --kind nvme-a0-a1 --offset $((6 * M + 4096)) --len $((2 * M + 4096)) --chunk $((128 * 1024)) \
		--expect-hops read-p2p,copy,copy --expect-reason "P2P by PCI bus address" --hold
	check_held route-a0-a1 p2pdma-vmtest route --nvme "$NVME" --kind a0-a1 --offset $((9 * M + 1)) --len $((M + 3)) --mem-offset 5 \
		--expect-hops copy,copy --expect-reason "through host memory: no P2P between" --hold
	check route-a1-nvme p2pdma-vmtest route --nvme "$NVME" --kind a1-nvme --offset $((44 * M + 512)) --len $((M - 1024)) --mem-offset 7 \
		--pattern-offset $((17 * M + 3)) --expect-hops copy,write-direct
	# The same from the command line: the namespace into the second
	# accelerator through staging in the first, then host memory, compared
	# in the guest with a plain read of the namespace.
	check route-copy-cli p2pdma-ctl copy "$NVME" accel:1 --via accel:0,host --offset $((3 * M + 5)) --len $((5 * M)) --verify

	mount_rigfs
	# A copy from the bad namespace into a file fails and leaves neither the
	# destination nor its temporary behind.
	if p2pdma-ctl copy "$BAD" /mnt/copied.bin --through accel:0 --len $((12 * M)); then
		fail bad-block-copy-leaves-nothing "the copy over a bad block succeeded"
	else
		left=
		for f in /mnt/copied.bin /mnt/.copied.bin*; do
			[ -e "$f" ] && left="$left $f"
		done
		if [ -n "$left" ]; then
			fail bad-block-copy-leaves-nothing "left behind:$left"
		else
			pass bad-block-copy-leaves-nothing
		fi
	fi
	# shellcheck disable=SC2317 # run (and exec, in their subshell) by check and check_held
	data_read() { exec p2pdma-vmtest engine-read --nvme /mnt/data.bin --fs-name /data.bin --verify-buffered "$@"; }
	# shellcheck disable=SC2317 # run (and exec, in their subshell) by check and check_held
	rw_write() { exec p2pdma-vmtest engine-write --nvme /mnt/rw.bin --fs-name /rw.bin --verify-buffered "$@"; }
	check_held file-p2p-read data_read --offset $((3 * M + 100)) --len $((2 * M + 50)) --mem-offset 100 --expect-path p2p --hold
	check_held file-nvme-cmd-read data_read --path nvme-cmd --offset $((9 * M + 4096)) --len $((3 * M)) --expect-path nvme-cmd --hold
	check_held file-nvme-cmd-read-unaligned data_read --path nvme-cmd --offset $((14 * M + 777)) --len $((M + 3)) --mem-offset 777 --expect-path nvme-cmd --hold
	check file-p2p-write rw_write --offset $((M + 300)) --len $((M + 1000)) --mem-offset 300 --pattern-offset $((7 * M + 8)) --expect-path p2p --module-io no
	# The range is in the page cache before the write: the buffered read
	# after it must see the new bytes.
	cat /mnt/rw.bin >/dev/null
	# NVMe commands never write files (nothing holds the layout during a
	# write): refused before anything moves, redone on the bounce path.
	check file-nvme-cmd-write-retried rw_write --path nvme-cmd --offset $((4 * M + 4096)) --len $((2 * M)) --pattern-offset $((11 * M)) --expect-path bounce --expect-retry
	check file-nvme-cmd-write-unaligned-retried rw_write --path nvme-cmd --offset $((8 * M + 100)) --len $((M + 200)) --mem-offset 100 --pattern-offset $((12 * M + 16)) --expect-path bounce --expect-retry
	: >/mnt/new.bin
	check file-p2p-write-grows-file p2pdma-vmtest engine-write --nvme /mnt/new.bin --fs-name /new.bin --verify-buffered \
		--offset 0 --len $((3 * M + 123)) --pattern-offset $((2 * M)) --expect-path p2p
	: >/mnt/tail.bin
	check file-nvme-cmd-write-new-file-retried p2pdma-vmtest engine-write --nvme /mnt/tail.bin --fs-name /tail.bin --verify-buffered \
		--path nvme-cmd --offset 0 --len $((M + 5)) --pattern-offset $((3 * M)) --expect-path bounce --expect-retry
	# Buffered writes not yet written back: NVMe commands must see them.
	dd if=/dev/urandom of=/mnt/dirty.bin bs=65536 count=40 2>/dev/null
	check file-nvme-cmd-read-dirty p2pdma-vmtest engine-read --nvme /mnt/dirty.bin --verify-buffered \
		--path nvme-cmd --offset 4096 --len $((2 * M)) --expect-path nvme-cmd
	# A hole at [0, 2M), data at [2M, 3M), a hole, an unwritten extent at
	# [5M, 6M), a hole to 8M: reads give zeros in holes on both paths.
	truncate -s $((8 * M)) /mnt/sparse.bin
	dd if=/dev/urandom of=/mnt/sparse.bin bs=$M seek=2 count=1 conv=notrunc 2>/dev/null
	fallocate -o $((5 * M)) -l $M /mnt/sparse.bin
	sync
	# shellcheck disable=SC2317 # run (and exec, in their subshell) by check and check_held
	sparse_read() { exec p2pdma-vmtest engine-read --nvme /mnt/sparse.bin --verify-buffered --offset 0 --len $((8 * M)) "$@"; }
	check file-nvme-cmd-read-sparse sparse_read --path nvme-cmd --expect-path nvme-cmd
	check file-p2p-read-sparse sparse_read --expect-path p2p
	# shellcheck disable=SC2317 # run (and exec, in their subshell) by check and check_held
	sparse_write() { exec p2pdma-vmtest engine-write --nvme /mnt/sparse.bin --verify-buffered --pattern-offset 0 "$@"; }
	check file-nvme-cmd-write-hole-retried sparse_write --path nvme-cmd --offset $M --len $((2 * M)) --expect-path bounce --expect-retry
	check file-nvme-cmd-write-unwritten-retried sparse_write --path nvme-cmd --offset $((5 * M)) --len $M --expect-path bounce --expect-retry
	# The library's own tests that need ext4 on NVMe: FIEMAP's map checked
	# against the raw namespace, and NVMe commands on files into host
	# memory. Run from the filesystem, they must not skip anything.
	# lib_tests NAME PROGRAM [FILTER]
	lib_tests() {
		name=lib-$1
		shift
		if out=$(P2PDMA_TEST_NVME_DIR=/mnt/tests "$@" --test-threads 1 --nocapture 2>&1); then
			echo "$out"
			case $out in
			*skipped* | *"not checked"*) fail "$name" "a test skipped: $(echo "$out" | grep -m1 -e skipped -e 'not checked')" ;;
			*) pass "$name" ;;
			esac
		else
			echo "$out"
			fail "$name" "$(echo "$out" | grep -m1 -e FAILED -e panicked)"
		fi
	}
	mkdir -p /mnt/tests && cp /tests/* /mnt/tests/
	lib_tests unit /mnt/tests/libp2pdma-unit extents::
	lib_tests nvme-files /mnt/tests/libp2pdma-nvme-files
	# Random sequences of transfers (aligned and not, several handles,
	# appends and truncates by another descriptor, concurrent writes sharing
	# blocks) on files of this ext4, into the accelerator's BAR memory, on
	# every path: each step checked against a shadow file changed with plain
	# pwrite and truncate.
	# Shorter on the debug kernel (see debug_kernel).
	cases=32 kills=24
	debug_kernel && cases=10 kills=8
	lib_tests pwrite-model env P2PDMA_MODEL_DIR=/mnt P2PDMA_MODEL_MEM=module \
		P2PDMA_MODEL_PATHS=p2p,nvme-cmd,bounce PROPTEST_CASES=$cases /mnt/tests/libp2pdma-pwrite-model
	rm -rf /mnt/tests
	# The object store on a file of this ext4, its buffers and its page
	# cache in the accelerator's memory, on each path the engine has for
	# it: a seeded random sequence against a model, then reopened whole.
	for p in auto nvme-cmd bounce; do
		check "store-$p" p2pdma-vmtest store --path /mnt/store.bin --size $((24 * M)) --engine-path "$p" --seed 7
		rm -f /mnt/store.bin
	done
	check store-2m-pages-write-through p2pdma-vmtest store --path /mnt/store.bin --size $((24 * M)) \
		--frames 4 --page $((2 * M)) --write-through --seed 9
	rm -f /mnt/store.bin
	check store-no-cache p2pdma-vmtest store --path /mnt/store.bin --size $((24 * M)) --frames 0 --seed 11
	rm -f /mnt/store.bin
	# The cache shared by the rig's two accelerators (P2P reaches the
	# first, bounce the second; pages between them go through host memory):
	# the sequence with each operation on one accelerator in turn, then
	# eight threads writing and reading pages on both, every read what the
	# last write on either left, and storage as the last one left it.
	check store-2-accelerators p2pdma-vmtest store --path /mnt/store.bin --size $((24 * M)) \
		--accelerators 2 --frames 6 --seed 13
	rm -f /mnt/store.bin
	check store-coherence-2-accelerators p2pdma-vmtest store-coherence --path /mnt/store.bin
	rm -f /mnt/store.bin
	# Processes killed with SIGKILL mid-update (creates, writes through a
	# write-back cache in accelerator memory, resizes, deletes, flushes),
	# each store reopened and checked against what had returned.
	check store-crash-kill-9 p2pdma-vmtest store-crash --path /mnt/store.bin --runs "$kills"
	rm -f /mnt/store.bin
	umount_rigfs
else
	check_held auto-read-bounce p2pdma-vmtest engine-read --nvme "$NVME" --offset $((16 * M)) --len $((4 * M)) --expect-path bounce --hold
	check_held forced-p2p-refused-retried p2pdma-vmtest engine-read --nvme "$NVME" --path p2p --offset $((24 * M)) --len $M --expect-path bounce --expect-retry --hold
	check_held nvme-cmd-refused-retried p2pdma-vmtest engine-read --nvme "$NVME" --path nvme-cmd --offset $((28 * M)) --len $M --expect-path bounce --expect-retry --hold
	check auto-write-bounce p2pdma-vmtest engine-write --nvme "$NVME" --offset $((40 * M + 300)) --len $((M + 1000)) --mem-offset 300 --pattern-offset $((5 * M + 8)) --expect-path bounce
	mount_rigfs
	check_held file-auto-read-bounce p2pdma-vmtest engine-read --nvme /mnt/data.bin --fs-name /data.bin --verify-buffered \
		--offset $((3 * M + 100)) --len $((2 * M + 50)) --mem-offset 100 --expect-path bounce --hold
	check file-nvme-cmd-refused-retried p2pdma-vmtest engine-read --nvme /mnt/data.bin --verify-buffered \
		--path nvme-cmd --offset $((9 * M)) --len $M --expect-path bounce --expect-retry
	check file-auto-write-bounce p2pdma-vmtest engine-write --nvme /mnt/rw.bin --fs-name /rw.bin --verify-buffered \
		--offset $((M + 300)) --len $((M + 1000)) --mem-offset 300 --pattern-offset $((7 * M + 8)) --expect-path bounce
	check store-bounce p2pdma-vmtest store --path /mnt/store.bin --size $((24 * M)) --seed 7
	rm -f /mnt/store.bin
	umount_rigfs
	out=$(p2pdma-vmtest engine-read --nvme "$NVME" --offset 0 --len 4096 --expect-path bounce 2>&1)
	case $out in
	*"do not share an upstream bridge or whitelisted host bridge"*) pass auto-reason-is-the-kernels ;;
	*) fail auto-reason-is-the-kernels "$out" ;;
	esac
fi

# ---- Strided transfers (p2pdma-vmtest engine-strided) ----
# Reads of the namespace into accelerator memory: every mode in its own
# region of one allocation (SC, TaT, AUTO packed; RC, and SC and TaT where
# asked, in the strided layout), checked in the guest (the runs against a
# buffered read, every other byte still poisoned) and reported run by run
# (RC: its whole range) for the host to compare accel.bin with nvme.img.
# TaT goes through the bounce slots on every pair; SC and RC take the
# pair's path. Writes go to 54-58 MiB, which nothing else here touches:
# the host finds the runs holding the pattern and the gaps between them,
# and 4 KiB either side, holding the image's own bytes.
# shellcheck disable=SC2317 # run (and exec, in their subshell) by check and check_held
strided() { exec p2pdma-vmtest engine-strided --nvme "$NVME" "$@"; }
# shellcheck disable=SC2317
strided_aligned() { strided --base $((34 * M)) --run 4096 --dim 16384x16 --dim 1048576x2 "$@"; }
# shellcheck disable=SC2317
strided_write() { strided --base $((56 * M + 5)) --run 777 --dim 2000x10 --dim 100000x2 --write-pattern $((21 * M + 16)) "$@"; }
if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	check_held strided-read-p2p strided_aligned --expect-path p2p --hold
	check_held strided-read-nvme-cmd strided_aligned --path nvme-cmd --expect-path nvme-cmd --hold
	check_held strided-read-bounce strided_aligned --path bounce --expect-path bounce --hold
	# Runs on no block boundary, both layouts: where a run's memory and
	# file offsets disagree within a block the fast path may hand it to the
	# bounce path, which is allowed here; the bytes are checked either way.
	check_held strided-read-p2p-unaligned strided --base $((36 * M + 777)) --run 1000 --dim 3000x8 --dim 204800x2 \
		--modes sc,tat,auto,sc:strided,tat:strided,rc:strided,auto:strided --expect-path p2p --allow-retry --hold
	check_held strided-read-nvme-cmd-unaligned strided --path nvme-cmd --base $((36 * M + 777)) --run 1000 --dim 3000x8 \
		--modes sc,tat,rc:strided --expect-path nvme-cmd --allow-retry --hold
	# An engine that learns measures its constants at the first strided
	# read (scratch memory on the same accelerator, never the reader's) and
	# says so.
	check_held strided-read-p2p-learns strided --base $((37 * M)) --run 8192 --dim 65536x8 --modes auto,auto:strided \
		--expect-path p2p --learn /tmp/strided-cache --expect-reason "(measured now)" --hold
	check strided-write-p2p strided --base $((54 * M + 100)) --run 3000 --dim 8192x16 --modes sc \
		--expect-path p2p --allow-retry --write-pattern $((17 * M + 8))
	check strided-write-nvme-cmd strided --path nvme-cmd --base $((55 * M)) --run 4096 --dim 12288x16 --modes auto:strided \
		--expect-path nvme-cmd --write-pattern $((19 * M))
	check strided-write-bounce strided_write --path bounce --modes sc --expect-path bounce
else
	check_held strided-read-bounce strided_aligned --expect-path bounce --hold
	check strided-write-bounce strided_write --modes sc --expect-path bounce
fi
# A shape on the command line, checked by the tool against a plain read.
check ctl-copy-shape p2pdma-ctl copy "$NVME" accel --shape base=$((38 * M + 3)),run=5000,dims=12288x20,1Mx2 --verify
# ---- end of strided transfers ----

check ctl-copy-verify p2pdma-ctl copy "$NVME" accel --offset $((8 * M + 4096)) --len $((16 * M)) --verify

# ---- The queues path (p2pdma-vmtest queues) ----
# The spare controller (serial p2pdma-vfio, NSID 7, vfio.img) driven by
# this process through VFIO's no-IOMMU mode, its queues in accelerator
# memory. Taking it from the nvme driver without being asked to unbind is
# refused and leaves it bound; a process that dies with commands in flight
# leaves it to the next one, which resets it (its VFIO device released
# before the module's memory); a command that never completes is aborted,
# and the controller disabled when the abort does not end it; random
# command sequences on its 512-byte and 4 KiB-block namespaces leave every
# byte around their payloads unchanged; then reads and writes from
# many threads, aligned and not, into accelerator memory (DMA_MAP) and
# host memory (PIN_USER), and errors. The host compares a read left in
# accel.bin with vfio.img, and the written ranges of vfio.img with the
# pattern.
if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	check queues-refused-while-bound p2pdma-vmtest queues --step refuse
	p2pdma-vmtest queues --step die >/tmp/queues-die.log 2>&1
	rc=$?
	if [ $rc -ge 128 ] && grep -q "in flight; dying" /tmp/queues-die.log; then
		pass queues-owner-dies
	else
		fail queues-owner-dies "exit $rc: $(tail -n 1 /tmp/queues-die.log)"
	fi
	check queues-after-owner-died p2pdma-vmtest queues --step after-death
	check queues-abort-stuck p2pdma-vmtest queues --step abort
	# Random command sequences with canary bytes around every payload, on
	# the 512-byte namespace (its writes undone for the steps after) and
	# on the 4 KiB one (vfio4k.img, the rig content from 192 MiB on; its
	# writes stay, for the host to check); the controller's largest
	# command is 128 KiB.
	check queues-canary-512 p2pdma-vmtest queues --step canary
	check queues-canary-4k p2pdma-vmtest queues --step canary --nsid 8 \
		--image vfio4k.img --image-pattern-offset $((192 << 20)) --keep-writes
	# A namespace detached and attached again under the driver (the
	# controller in a subsystem of its own, serial p2pdma-events): the
	# controller's Namespace Attribute Changed events make the driver read
	# the namespaces again.
	check queues-namespace-events p2pdma-vmtest queues --step events \
		--serial p2pdma-events --nsid 9 --image-pattern-offset $((224 << 20))
	check queues-engine p2pdma-vmtest queues --step engine
	# The object store on a 12 MiB region of the namespace, on the queues
	# path with its cache in accelerator memory: the seeded sequence
	# against a model, reopened whole; the region's bytes put back after.
	check store-queues p2pdma-vmtest store --path nsid-7-at-48M --queues p2pdma-vfio --nsid 7 \
		--offset $((48 * M)) --size $((12 * M)) --seed 17
	check_held queues-data p2pdma-vmtest queues --step data --hold
fi
release_held
check module-unloads rmmod p2pdma
exit "$failures"
