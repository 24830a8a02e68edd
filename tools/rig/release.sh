#!/usr/bin/env bash
# The shipped shared libraries and wheel, built to load on glibc 2.17 and
# newer (docs/decisions.md, "Shipped libraries link against glibc 2.17").
#
#   release.sh libs DIR   libcufile.so (soname libcufile.so.0) and the C API's
#                         libp2pdma.so and libp2pdma.a, release builds linked by
#                         zig against glibc 2.17 (cargo-zigbuild), into DIR
#   release.sh wheel DIR  the Python binding's wheel, manylinux_2_17
#                         (python.sh wheel)
#   release.sh test OUT   both, then the glibc symbol versions each shared
#                         object needs (objdump -T): at most GLIBC_$GLIBC_MAX,
#                         where NVIDIA's libcufile loads; one PASS/FAIL line
#                         each to OUT
#
# zig and cargo-zigbuild come from the Python environment (python.sh env),
# pinned in tools/rig/python-requirements.txt.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

GLIBC_FLOOR=2.17
GLIBC_MAX=2.27
TRIPLE=x86_64-unknown-linux-gnu

build_libs() {
	local out=$1 venv target
	venv=$("$P2PDMA_ROOT/tools/rig/python.sh" env)
	target=${CARGO_TARGET_DIR:-$P2PDMA_ROOT/target}
	cd "$P2PDMA_ROOT"
	PATH="$venv/bin:$PATH" cargo zigbuild --release --locked -p p2pdma-cufile -p p2pdma-capi \
		--lib --target "$TRIPLE.$GLIBC_FLOOR"
	mkdir -p "$out"
	install -m 0755 "$target/$TRIPLE/release/libcufile.so" "$out/libcufile.so"
	ln -sf libcufile.so "$out/libcufile.so.0"
	install -m 0755 "$target/$TRIPLE/release/libp2pdma.so" "$out/libp2pdma.so"
	install -m 0644 "$target/$TRIPLE/release/libp2pdma.a" "$out/libp2pdma.a"
}

# The newest GLIBC_x.y version FILE's dynamic symbols need ("none" if none).
glibc_needed() {
	objdump -T "$1" | grep -oE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sed 's/GLIBC_//' |
		sort -uV | tail -n 1 | grep . || echo none
}

# The symbols of FILE that need a glibc newer than VERSION.
newer_than() {
	objdump -T "$1" | awk -v max="$2" '
		match($0, /GLIBC_[0-9.]+/) {
			v = substr($0, RSTART + 6, RLENGTH - 6)
			split(v, a, "."); split(max, b, ".")
			if (a[1] > b[1] || (a[1] == b[1] && a[2] + 0 > b[2] + 0)) print $NF "@" v
		}' | sort -u | paste -sd' ' | cut -c1-300
}

# PASS or FAIL for FILE (shown as NAME) against GLIBC_MAX.
check_glibc() {
	local name=$1 file=$2 v
	if [ ! -f "$file" ]; then
		echo "FAIL release:$name: not built"
		return
	fi
	v=$(glibc_needed "$file")
	if [ "$v" = none ] || [ "$(printf '%s\n%s\n' "$v" "$GLIBC_MAX" | sort -V | tail -n 1)" = "$GLIBC_MAX" ]; then
		echo "PASS release:$name needs glibc $v (at most $GLIBC_MAX)"
	else
		echo "FAIL release:$name needs glibc $v, more than $GLIBC_MAX, for: $(newer_than "$file" "$GLIBC_MAX")"
	fi
}

case ${1:-} in
libs)
	out=${2:?usage: release.sh libs DIR}
	run_logged "release build of libcufile.so and libp2pdma.so for glibc $GLIBC_FLOOR (cargo zigbuild)" \
		"$P2PDMA_CACHE/release-libs.log" build_libs "$out"
	;;
wheel)
	"$P2PDMA_ROOT/tools/rig/python.sh" wheel "${2:?usage: release.sh wheel DIR}"
	;;
test)
	out=${2:?usage: release.sh test OUT}
	logs=$(dirname "$out")
	work=$logs/release
	rm -rf "$work"
	mkdir -p "$work/libs" "$work/wheel" "$work/whl"
	: >"$out"
	# A failed build is a FAIL below (not built), not the end of the run.
	(run_logged "release build of libcufile.so and libp2pdma.so for glibc $GLIBC_FLOOR (cargo zigbuild)" \
		"$logs/release-libs.log" build_libs "$work/libs") || true
	check_glibc libcufile.so "$work/libs/libcufile.so" >>"$out"
	check_glibc libp2pdma.so "$work/libs/libp2pdma.so" >>"$out"
	"$P2PDMA_ROOT/tools/rig/python.sh" wheel "$work/wheel" || true
	whl=$(find "$work/wheel" -name 'p2pdma-*.whl' | head -n 1)
	case $whl in
	*manylinux_2_17_*)
		echo "PASS release:the wheel is tagged manylinux_2_17 ($(basename "$whl"))" >>"$out"
		;;
	*) echo "FAIL release:the wheel is not tagged manylinux_2_17 (${whl:-none built})" >>"$out" ;;
	esac
	ext=
	if [ -n "$whl" ]; then
		python3 -m zipfile -e "$whl" "$work/whl"
		ext=$(find "$work/whl" -name '_p2pdma*.so' | head -n 1)
	fi
	check_glibc "the wheel's ${ext##*/}" "${ext:-$work/whl/none}" >>"$out"
	cat "$out"
	;;
*)
	die "usage: release.sh libs DIR | wheel DIR | test OUT"
	;;
esac
