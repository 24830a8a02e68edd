# shellcheck shell=sh
# The fabrics suite's storage machine: exports its emulated NVMe
# namespaces with the kernel's NVMe over Fabrics target (nvmet, through
# configfs) over TCP on two ports of one address and over RDMA (soft
# RoCE) on a third, to one host NQN only,
# which must authenticate with DH-HMAC-CHAP. Then it serves the
# accelerator machine's requests to take a port away or give it back (a
# lost path), one per connection on TCP port 5000, until the host stops it.
# The helpers of every guest suite: ns_dev finds a namespace by its NSID
# (namespaces are scanned in parallel, so their names need not follow
# their NSIDs).
# shellcheck source=lib.sh
. /suite/lib.sh
nqn=$(cat /suite/fabric/subnqn)
hostnqn=$(cat /suite/fabric/hostnqn)
key=$(cat /suite/fabric/dhchap.key)
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.2/24 dev eth0
mount -t configfs none /sys/kernel/config 2>/dev/null
n=/sys/kernel/config/nvmet
s=$n/subsystems/$nqn
mkdir "$s"
echo 0 >"$s/attr_allow_any_host"
# The identity the storage keeps across restarts, as a drive keeps it: the
# subsystem's serial and each namespace's UUID and NGUID (nvmet makes up
# new ones at every start otherwise, and the host then takes a restarted
# machine's namespaces for other namespaces).
echo p2pdma-remote >"$s/attr_serial"
# NSID 21: namespace 1 (remote.img, the rig content), read and written by
# the suite; NSID 22: namespace 2 (remote-store.img), the object store's.
# Both on nvmet's block back end: its file back end (buffered_io, which
# would put this machine's page cache in front of the drive as a volatile
# write cache) fails a read that finds only part of its pages cached (a
# short IOCB_NOWAIT read completes as an Internal Error in 7.3).
# Neither NSID is one the accelerator machine has of its own.
for ns in 1 2; do
	mkdir "$s/namespaces/2$ns"
	ns_dev "$ns" | tr -d '\n' >"$s/namespaces/2$ns/device_path"
	echo "6a3f0d5e-9c41-4b8e-8d2a-00000000002$ns" >"$s/namespaces/2$ns/device_uuid"
	echo "6a3f0d5e-9c41-4b8e-8d2a-00000000002$ns" >"$s/namespaces/2$ns/device_nguid"
	echo 1 >"$s/namespaces/2$ns/enable"
	echo "namespace 2$ns: $(cat "$s/namespaces/2$ns/device_path")"
done
mkdir "$n/hosts/$hostnqn"
echo "$key" >"$n/hosts/$hostnqn/dhchap_key"
echo "hmac(sha256)" >"$n/hosts/$hostnqn/dhchap_hash"
ln -s "$n/hosts/$hostnqn" "$s/allowed_hosts/$hostnqn"
for p in 1 2; do
	mkdir "$n/ports/$p"
	echo tcp >"$n/ports/$p/addr_trtype"
	echo ipv4 >"$n/ports/$p/addr_adrfam"
	echo 10.0.2.2 >"$n/ports/$p/addr_traddr"
	echo $((4419 + p)) >"$n/ports/$p/addr_trsvcid"
	ln -s "$s" "$n/ports/$p/subsystems/$nqn"
done
# Soft RoCE (rxe) over the same NIC, and the subsystem on a third port,
# over RDMA.
if /sbin/rdma link add rxe0 type rxe netdev eth0; then
	p=$n/ports/3
	mkdir "$p"
	echo rdma >"$p/addr_trtype"
	echo ipv4 >"$p/addr_adrfam"
	echo 10.0.2.2 >"$p/addr_traddr"
	echo 4422 >"$p/addr_trsvcid"
	ln -s "$s" "$p/subsystems/$nqn" || echo "@@TARGET the RDMA port did not start"
else
	echo "@@TARGET no soft RoCE device"
fi
echo "@@TARGET-READY"
nc -ll -p 5000 -e sh /suite/fabrics-ctl.sh
