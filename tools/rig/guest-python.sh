#!/usr/bin/env bash
# Puts a Python interpreter and the p2pdma binding into a guest's initramfs:
# the host's Debian python3 (dynamically linked, so with its loader and
# libraries), its standard library without what a test never imports, the
# binding's release wheel unpacked into Debian's dist-packages, and numpy
# and tqdm from the rig's environment (for safetensors with numpy arrays;
# torch, at 5 GiB, stays out). With `libs`, the C API's libp2pdma.so and
# the cuFile library's libcufile.so.0 too, in /usr/lib/p2pdma, for checks
# that load them with ctypes.
#
#   guest-python.sh INITRAMFS_DIR [libs]
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

ir=${1:?usage: guest-python.sh INITRAMFS_DIR [libs]}
with=${2:-}
py=$(readlink -f /usr/bin/python3)
[ -x "$py" ] || die "no Debian python3 at /usr/bin/python3 (tools/rig/setup-host.sh installs it)"
stdlib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

wheels="$P2PDMA_ROOT/rig-out/wheels"
rm -rf "$wheels"
"$P2PDMA_ROOT/tools/rig/python.sh" wheel "$wheels" >/dev/null
wheel=("$wheels"/p2pdma-*.whl)
[ -f "${wheel[0]}" ] || die "no wheel in $wheels (see $wheels/build.log)"

mkdir -p "$ir/usr/bin" "$ir$stdlib" "$ir/usr/lib/python3/dist-packages"
cp "$py" "$ir/usr/bin/python$ver"
ln -sf "python$ver" "$ir/usr/bin/python3"
# The standard library, less tests, GUIs, installers and caches.
tar -C "$stdlib" -cf - \
	--exclude=test --exclude=idlelib --exclude=tkinter --exclude=turtledemo \
	--exclude=ensurepip --exclude=lib2to3 --exclude=pydoc_data --exclude=distutils \
	--exclude='config-*' --exclude=__pycache__ --exclude=site-packages --exclude=dist-packages \
	--exclude='_tkinter*' --exclude='_curses*' --exclude=curses --exclude='_sqlite3*' --exclude=sqlite3 \
	--exclude='_dbm*' --exclude='_gdbm*' --exclude=dbm --exclude=venv . | tar -C "$ir$stdlib" -xf -
python3 -m zipfile -e "${wheel[0]}" "$ir/usr/lib/python3/dist-packages/"
venv=$("$P2PDMA_ROOT/tools/rig/python.sh" env)
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
tar -C "$site" -cf - --exclude=tests --exclude=__pycache__ numpy numpy.libs tqdm |
	tar -C "$ir/usr/lib/python3/dist-packages" -xf -

if [ "$with" = libs ]; then
	mkdir -p "$ir/usr/lib/p2pdma"
	(cd "$P2PDMA_ROOT" && cargo build -q --locked -p p2pdma-capi -p p2pdma-cufile --lib) ||
		die "cargo build of the C API and the cuFile library failed; its errors are above"
	strip -o "$ir/usr/lib/p2pdma/libp2pdma.so" "$P2PDMA_ROOT/target/debug/libp2pdma.so"
	strip -o "$ir/usr/lib/p2pdma/libcufile.so.0" "$P2PDMA_ROOT/target/debug/libcufile.so"
fi

# The loader and every library the interpreter, its extension modules and
# the binding link against.
mapfile -t objs < <(find "$ir$stdlib/lib-dynload" "$ir/usr/lib/python3/dist-packages" -name '*.so')
if [ "$with" = libs ]; then objs+=("$ir"/usr/lib/p2pdma/*); fi
for lib in $(ldd "$py" "${objs[@]}" 2>/dev/null | awk '/=> \//{print $3} /^\t\/lib64/{print $1}' | sort -u); do
	mkdir -p "$ir$(dirname "$lib")"
	cp -L "$lib" "$ir$lib"
done
log "guest python: $("$py" --version) and $(basename "${wheel[0]}") ($(du -sh "$ir/usr" | cut -f1))"
