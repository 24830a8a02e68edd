#!/usr/bin/env bash
# Puts the storage tools the arrays suite needs into a guest's initramfs:
# Debian bookworm's mdadm, downloaded once into the cache with a private apt
# configuration (the system's sources and packages untouched; apt checks the
# package against the signed index), and the host's mke2fs (e2fsprogs, which
# setup-host.sh installs), each with the loader and the libraries it links
# against. With "fio", the host's fio too (setup-host.sh installs it), for
# the bench suite's comparisons; with "nvme", the host's nvme-cli (Debian's,
# which setup-host.sh installs), for the fabrics suite's connections, and
# iproute2's rdma, which makes the soft RoCE device they take over RDMA.
#
#   guest-tools.sh INITRAMFS_DIR [fio] [nvme]
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

ir=${1:?usage: guest-tools.sh INITRAMFS_DIR [fio] [nvme]}
shift
with_fio='' with_nvme=''
for extra in "$@"; do
	case $extra in
	fio) with_fio=1 ;;
	nvme) with_nvme=1 ;;
	*) die "unknown guest tool $extra" ;;
	esac
done
d="$P2PDMA_CACHE/apt-bookworm"

# The newest (by name) downloaded mdadm package in $d, or nothing.
downloaded_mdadm() {
	deb=
	local f
	for f in "$d"/mdadm_*.deb; do
		if [ -f "$f" ]; then deb=$f; fi
	done
}

downloaded_mdadm
if [ -z "$deb" ]; then
	mkdir -p "$d/lists/partial" "$d/archives/partial"
	echo "deb $(debian_mirror) bookworm main" >"$d/sources.list"
	o=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
		-o "Dir::State::Lists=$d/lists" -o "Dir::Cache::Archives=$d/archives")
	run_logged "apt-get update (bookworm, for the guest's mdadm)" "$d/update.log" apt-get "${o[@]}" update
	(cd "$d" && apt-get "${o[@]}" download mdadm) >"$d/download.log" 2>&1 ||
		die "apt-get download mdadm failed (log: $d/download.log)"
	downloaded_mdadm
	[ -n "$deb" ] || die "apt-get download left no mdadm_*.deb in $d (log: $d/download.log)"
fi
x="$d/mdadm"
if [ ! -x "$x/sbin/mdadm" ]; then
	rm -rf "$x"
	step "dpkg-deb -x $deb" "$d/unpack.log" dpkg-deb -x "$deb" "$x"
	[ -x "$x/sbin/mdadm" ] || die "$deb has no sbin/mdadm"
fi

mke2fs=$(command -v mke2fs || echo /sbin/mke2fs)
[ -x "$mke2fs" ] || die "no mke2fs on the host (tools/rig/setup-host.sh installs e2fsprogs)"
mkdir -p "$ir/sbin" "$ir/etc/mdadm" "$ir/run/mdadm"
cp "$x/sbin/mdadm" "$ir/sbin/mdadm"
cp "$mke2fs" "$ir/sbin/mke2fs"
ln -sf mke2fs "$ir/sbin/mkfs.ext4"
cp /etc/mke2fs.conf "$ir/etc/" 2>/dev/null || true
# No udev in the guest: mdadm makes its device nodes itself, and finds
# arrays by scanning the devices the suite names.
printf 'CREATE owner=root group=root mode=0600\nDEVICE /dev/nvme*n*\n' >"$ir/etc/mdadm/mdadm.conf"

bins=("$ir/sbin/mdadm" "$ir/sbin/mke2fs")
if [ -n "$with_fio" ]; then
	fio=$(command -v fio) || die "no fio on the host (tools/rig/setup-host.sh installs it)"
	cp "$fio" "$ir/bin/fio"
	bins+=("$ir/bin/fio")
fi
nvme=
if [ -n "$with_nvme" ]; then
	nvme=$(command -v nvme) || die "no nvme-cli on the host (tools/rig/setup-host.sh installs it)"
	cp "$nvme" "$ir/sbin/nvme"
	rdma=$(command -v rdma) || die "no rdma on the host (tools/rig/setup-host.sh installs iproute2)"
	cp "$rdma" "$ir/sbin/rdma"
	bins+=("$ir/sbin/nvme" "$ir/sbin/rdma")
fi
with_libs "$ir" "${bins[@]}"
log "guest tools: $("$x/sbin/mdadm" --version 2>&1 | sed -n 1p), $("$mke2fs" -V 2>&1 | sed -n 1p)${fio:+, $("$fio" --version)}${nvme:+, $("$nvme" version | sed -n 1p)}"
