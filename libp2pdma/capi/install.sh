#!/bin/sh
# Builds the C API in release mode and installs it under PREFIX:
#   PREFIX/lib/libp2pdma.so.VERSION (soname libp2pdma.so.0) with its links,
#   PREFIX/lib/libp2pdma.a, PREFIX/include/p2pdma.h and
#   PREFIX/lib/pkgconfig/p2pdma.pc.
# Then, with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig:
#   cc app.c $(pkg-config --cflags --libs p2pdma)                  (shared)
#   cc app.c $(pkg-config --cflags p2pdma) PREFIX/lib/libp2pdma.a \
#       $(pkg-config --static --libs-only-l p2pdma | sed 's/-lp2pdma//')   (static)
set -eu

if [ $# -ne 1 ]; then
	echo "usage: $0 PREFIX" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mkdir -p "$1"
prefix=$(cd "$1" && pwd)

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[ -n "$version" ] || { echo "$0: no version in $root/Cargo.toml" >&2; exit 1; }

(cd "$root" && cargo build --release --locked -p p2pdma-capi --lib)
lib="${CARGO_TARGET_DIR:-$root/target}/release"
case $lib in /*) ;; *) lib="$root/$lib" ;; esac

install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$lib/libp2pdma.so" "$prefix/lib/libp2pdma.so.$version"
ln -sf "libp2pdma.so.$version" "$prefix/lib/libp2pdma.so.0"
ln -sf libp2pdma.so.0 "$prefix/lib/libp2pdma.so"
install -m 0644 "$lib/libp2pdma.a" "$prefix/lib/libp2pdma.a"
install -m 0644 "$here/include/p2pdma.h" "$prefix/include/p2pdma.h"
sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" "$here/p2pdma.pc.in" \
	>"$prefix/lib/pkgconfig/p2pdma.pc"
echo "installed libp2pdma $version under $prefix"
