#!/usr/bin/env bash
# Fetches the Linux source, configures it from the fragments in kconfig/ and
# builds it, caching the built tree by kernel version, variant and config hash.
# Prints the path of the built tree on stdout.
#
#   P2PDMA_KERNEL_TREE=/path   use an existing, already built tree instead
#   P2PDMA_KVARIANT=debug      add kconfig/debug.config (KASAN, lockdep, ...)
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

if [ -n "${P2PDMA_KERNEL_TREE:-}" ]; then
	if [ ! -f "$P2PDMA_KERNEL_TREE/.config" ] || [ ! -f "$P2PDMA_KERNEL_TREE/Module.symvers" ]; then
		die "P2PDMA_KERNEL_TREE=$P2PDMA_KERNEL_TREE is not a built kernel tree (no .config or Module.symvers)"
	fi
	log "using the kernel tree from P2PDMA_KERNEL_TREE"
	echo "$P2PDMA_KERNEL_TREE"
	exit 0
fi

variant=${P2PDMA_KVARIANT:-base}
frags=("$P2PDMA_ROOT/tools/rig/kconfig/base.config")
[ "$variant" = base ] || frags+=("$P2PDMA_ROOT/tools/rig/kconfig/$variant.config")
for f in "${frags[@]}"; do [ -f "$f" ] || die "no config fragment $f"; done

# Built trees whose path starts with PREFIX, newest first, one per line.
# Nothing (and success) when there are none, as on a fresh machine.
built_trees_newest_first() {
	local t
	for t in "$1"*/.p2pdma-built; do
		if [ -f "$t" ]; then
			printf '%s %s\n' "$(stat -c %Y "$t")" "${t%/.p2pdma-built}"
		fi
	done | sort -rn | cut -d' ' -f2-
}

newest_built_tree() {
	built_trees_newest_first "$1" | sed -n 1p
}

# The newest (by name) downloaded source package in DIR, or nothing.
downloaded_source() {
	local f
	for f in "$1"/linux-source-"$KERNEL_SERIES"_*.deb; do
		if [ -f "$f" ]; then deb=$f; fi
	done
}

# Sets deb to the linux-source-$KERNEL_SERIES package, downloading it from
# trixie-backports with a private apt configuration, leaving the system's
# sources untouched. apt checks the package against the signed index.
fetch_source() {
	local d="$P2PDMA_CACHE/apt"
	deb=
	downloaded_source "$d"
	[ -z "$deb" ] || return 0
	mkdir -p "$d/lists/partial" "$d/archives/partial"
	local mirror
	mirror=$(debian_mirror)
	echo "deb $mirror trixie-backports main" >"$d/sources.list"
	local o=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
		-o "Dir::State::Lists=$d/lists" -o "Dir::Cache::Archives=$d/archives")
	run_logged "apt-get update (trixie-backports)" "$d/update.log" apt-get "${o[@]}" update
	(cd "$d" && apt-get "${o[@]}" download "linux-source-$KERNEL_SERIES") >"$d/download.log" 2>&1 ||
		die "apt-get download found no linux-source-$KERNEL_SERIES in trixie-backports (log: $d/download.log); set P2PDMA_KERNEL_TREE to a built tree"
	downloaded_source "$d"
	[ -n "$deb" ] || die "apt-get download left no linux-source-${KERNEL_SERIES}_*.deb in $d (log: $d/download.log)"
}

fetch_source
pkgver=$(basename "$deb" | sed -E 's/^linux-source-[0-9.]+_([^_]+)_.*/\1/')
confhash=$(cat "${frags[@]}" | sha256sum | cut -c1-12)
tree="$P2PDMA_CACHE/kernel/linux-${pkgver//[^A-Za-z0-9.]/_}-$variant-$confhash"

if [ -f "$tree/.p2pdma-built" ]; then
	log "kernel $pkgver ($variant, config $confhash) already built"
	echo "$tree"
	exit 0
fi

rm -rf "$tree" "$tree.tmp" "$tree.deb"
# A built tree of the same source and variant under another configuration
# seeds this one: Kbuild tracks every object's CONFIG_ dependencies, so only
# what the configuration change touches is rebuilt. On a fresh machine there
# is none, and the tree is unpacked from the source package.
seed=$(newest_built_tree "$P2PDMA_CACHE/kernel/linux-${pkgver//[^A-Za-z0-9.]/_}-$variant-")
if [ -n "$seed" ]; then
	log "seeding from $(basename "$seed") (incremental build)"
	cp -a "$seed" "$tree.tmp"
	rm -f "$tree.tmp/.p2pdma-built"
else
	mkdir -p "$tree.tmp" "$tree.deb"
	log "unpacking linux-source $pkgver (log: $tree.tmp/unpack.log)"
	step "dpkg-deb -x $deb" "$tree.tmp/unpack.log" dpkg-deb -x "$deb" "$tree.deb"
	step "unpacking the kernel source tarball" "$tree.tmp/unpack.log" \
		tar -xf "$tree.deb"/usr/src/linux-source-*.tar.xz -C "$tree.tmp" --strip-components=1
	rm -rf "$tree.deb"
fi
mv "$tree.tmp" "$tree"

mk() { make -C "$tree" LLVM="$LLVM_SUFFIX" "$@"; }
if ! mk rustavailable >"$tree/rustavailable.log" 2>&1; then
	cat "$tree/rustavailable.log" >&2
	die "make rustavailable: the Rust toolchain is not usable for the kernel (log: $tree/rustavailable.log); run tools/rig/setup-host.sh"
fi
conflog="$tree/config.log"
log "configuring: tinyconfig, then the fragments (log: $conflog)"
: >"$conflog"
step "make tinyconfig" "$conflog" mk tinyconfig
step "merging the config fragments (scripts/kconfig/merge_config.sh)" "$conflog" \
	env -C "$tree" KCONFIG_CONFIG=.config scripts/kconfig/merge_config.sh -m .config "${frags[@]}"
step "make olddefconfig" "$conflog" mk olddefconfig

# Kconfig drops options whose dependencies are unmet without a word: check.
bad=()
while IFS= read -r line; do
	case "$line" in
	CONFIG_*=*)
		opt=${line%%=*} val=${line#*=}
		grep -qx "$opt=$val" "$tree/.config" || bad+=("$opt=$val (got: $(grep -E "^$opt=|# $opt is" "$tree/.config" || echo unset))")
		;;
	"# CONFIG_"*" is not set")
		opt=${line#"# "} opt=${opt%% *}
		! grep -q "^$opt=" "$tree/.config" || bad+=("$opt unset (got: $(grep "^$opt=" "$tree/.config"))")
		;;
	esac
done < <(cat "${frags[@]}")
if ((${#bad[@]})); then
	printf '  %s\n' "${bad[@]}" >&2
	die "kernel config: ${#bad[@]} required option(s) not set after olddefconfig (log: $conflog)"
fi

jobs=$(($(nproc) + 1))
run_logged "building Linux $pkgver ($variant), -j$jobs: about 18 min on 2 cores" "$tree/build.log" \
	make -C "$tree" LLVM="$LLVM_SUFFIX" -j"$jobs" bzImage modules
touch "$tree/.p2pdma-built"
# Keep only the newest few trees (of any version and variant).
keep=3
while IFS= read -r old; do
	log "removing the old kernel tree $(basename "$old") (the cache keeps the newest $keep)"
	rm -rf "$old"
done < <(built_trees_newest_first "$P2PDMA_CACHE/kernel/linux-" | tail -n +$((keep + 1)))
echo "$tree"
