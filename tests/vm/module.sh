# shellcheck shell=sh
# The module suite: `p2pdma-ctl sanity` against the real module (allocation,
# mapping, ownership, argument checking, exhaustion, threads, P2P queries,
# DMA mappings, privileges, a process killed mid-I/O, unbind while mapped),
# one check per sanity case; then an ioctl fuzzer (`p2pdma-vmtest
# ioctl-fuzz`); then the module must unload.
# shellcheck source=lib.sh
. /suite/lib.sh

check module-loads insmod /lib/modules/p2pdma.ko

# Cases that may skip here, because the rig's kernel lacks what they need:
# it has neither hugetlbfs nor transparent huge pages (the huge-page cases
# fall back to physically contiguous pages when a buffer happens to have
# them). Any other skip fails: a case that did not run did not pass.
may_skip="pin-user-huge-self dmabuf-import-hugetlb-self"
if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	expect=supported
	# The native-multipath namespace head (NSID 3, two controllers).
	set -- --nvme-multipath "$(ns_dev 3)"
else
	expect=unsupported
	# No multipath namespace in this topology.
	may_skip="$may_skip p2p-query-multipath dma-map-multipath"
	# P2P is refused here: there is no block I/O to race with the unbind,
	# nor a write to sync or a long read to wait for.
	may_skip="$may_skip unbind-during-block-io block-io-dsync-flush block-io-slow-no-hung-task"
	set --
fi
# NSID 5 may be swap for a while (its first page is put back); NSID 6 is
# slow (throttled by QEMU) and reads as zeros.
set -- "$@" --nvme-swap "$(ns_dev 5)" --nvme-slow "$(ns_dev 6)"

# On the debug kernel, have the DMA-API checks report every error, not only
# the first one: each case that breaks a DMA rule then shows in the log.
dma_api=/sys/kernel/debug/dma-api
[ -w $dma_api/all_errors ] && echo 1 >$dma_api/all_errors

# Bounded, so that a hung case still leaves the results before it.
# The debug kernel (KASAN, lockdep, kmemleak, DMA-API checks) runs the suite
# about twice as slowly, and the rig gives its VM 600 s instead of 300.
limit=240
debug_kernel && limit=480
run=
timeout 5 true 2>/dev/null && run="timeout $limit"
log=/tmp/sanity.log
# The kernel log goes to the console as the suite runs: a flood of warnings
# from one case must not push another case's out of the ring buffer before
# the dump at the end.
(while :; do
	dmesg -c
	sleep 1
done) &
drain=$!
$run p2pdma-ctl sanity --nvme "$NVME" --expect-p2p $expect "$@" >$log 2>&1
rc=$?
kill $drain
wait $drain 2>/dev/null
dmesg -c

oks=0
while IFS= read -r line; do
	case $line in
	"ok "*)
		pass "sanity:${line#ok }"
		oks=$((oks + 1))
		;;
	"FAIL "*)
		rest=${line#FAIL }
		fail "sanity:${rest%%: *}" "${rest#*: }"
		;;
	"skip "*)
		echo "$line"
		rest=${line#skip }
		case " $may_skip " in
		*" ${rest%%: *} "*) ;;
		*) fail "sanity:${rest%%: *}" "skipped, which this rig should not need: ${rest#*: }" ;;
		esac
		;;
	*) echo "$line" ;;
	esac
done <$log

if [ $rc -eq 0 ]; then
	pass sanity-exit
else
	fail sanity-exit "p2pdma-ctl sanity exited $rc: $(tail -n 1 $log)"
fi
# The summary must be there (the suite ran to its end) and agree with the
# lines above it.
summary=$(tail -n 1 $log)
case $summary in
"sanity: $oks passed, "*" failed, "*" skipped") pass sanity-summary ;;
*) fail sanity-summary "last line '$summary', with $oks ok lines" ;;
esac

# The ioctls at random from 4 processes (forked from one, each not the
# opener of the file it inherited) of 4 threads over 3 open files each, on
# memfd pages all of them share, pinned and imported through udmabufs made
# from the same memfds, and allocations mapped again and again: every
# refusal must be an errno the ioctl documents, every mapping made must be
# live and unmap cleanly, and the memory must all come back. The debug
# kernel's DMA-API checks watch every mapping (an overlap past the 7 they
# track is a warning, which fails the run); it runs longer there, being
# slower. A new seed each run, printed for replaying it.
fuzz_s=30
debug_kernel && fuzz_s=45
seed=$(date +%s)
check ioctl-fuzz timeout $((fuzz_s * 4)) p2pdma-vmtest ioctl-fuzz --nvme "$NVME" \
	--seconds $fuzz_s --procs 3 --threads 4 --files 3 --seed "$seed"
dmesg -c

check module-unloads rmmod p2pdma
check device-node-gone test ! -e /dev/p2pdma
check_kmemleak
exit "$failures"
