#!/usr/bin/env bash
# The rig scripts' logic, checked in seconds without building anything: a
# copy of tools/ runs against an empty temporary cache with the expensive
# steps replaced by stubs first on PATH (apt-get, dpkg-deb, tar, make, and
# the unpacked tree's scripts/kconfig/merge_config.sh). kernel.sh must build
# on an empty cache, reuse a built tree, seed a new configuration from the
# newest built tree of its variant, keep three trees, and stop loudly, naming
# the step and its log, when any step fails. Then setup-host.sh on a machine
# with everything installed (and with one package missing), and the errors of
# rig.sh and vm.sh for bad arguments.
#
# Prints one "PASS name" / "FAIL name: why" line per check and a closing
# "cold-logic: N passed, N failed" line; exits non-zero on any failure.
set -uo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/p2pdma-cold.XXXXXX")
trap 'rm -rf "$work"' EXIT

root=$work/root stubs=$work/stubs calls=$work/calls
mkdir -p "$root/tools" "$stubs" "$work/home"
cp -a "$src/tools/rig.sh" "$src/tools/rig" "$root/tools/"

pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() {
	echo "FAIL $1: $2"
	fail=$((fail + 1))
	if [ -s "$work/err" ]; then tail -n 8 "$work/err" | sed 's/^/    | /'; fi
}

# The stubs. Each records its call in $STUB_CALLS and fails (status 3) when
# $STUB_FAIL names its step.
stub() {
	{
		cat <<-'EOF'
			#!/usr/bin/env bash
			echo "${0##*/} $*" >>"$STUB_CALLS"
			fails() { if [ "${STUB_FAIL:-}" = "$1" ]; then echo "stub: $1 fails" >&2; exit 3; fi; }
		EOF
		cat
	} >"$stubs/$1"
	chmod +x "$stubs/$1"
}

stub apt-get <<'EOF'
case " $* " in
*" update "*) fails apt-update ;;
*" download "*)
	fails apt-download
	if [ "${STUB_FAIL:-}" != apt-download-nothing ]; then
		echo fake >"linux-source-7.3_7.3.4-1~bpo13+1_all.deb"
	fi
	;;
*" install "*) fails apt-install ;;
esac
EOF

# dpkg-deb -x DEB DIR, or dpkg-deb --fsys-tarfile DEB (to stdout).
stub dpkg-deb <<'EOF'
fails dpkg-deb
case $1 in
-x) mkdir -p "$3/usr/src" && echo fake >"$3/usr/src/linux-source-7.3.tar.xz" ;;
--fsys-tarfile) echo fake-tar ;;
esac
EOF

# tar -xf TARBALL -C DIR: a kernel source tree with a Makefile and
# merge_config.sh; tar -x -C DIR (from dpkg-deb's stream): the tarball.
stub tar <<'EOF'
dir= file=
while (($#)); do
	case $1 in
	-C) dir=$2; shift ;;
	-xf) file=$2; shift ;;
	esac
	shift
done
if [ -z "$file" ]; then
	cat >/dev/null
	mkdir -p "$dir/usr/src" && echo fake >"$dir/usr/src/linux-source-7.3.tar.xz"
	exit 0
fi
fails tar-source
[ -f "$file" ] || { echo "tar: $file: Cannot open" >&2; exit 2; }
mkdir -p "$dir/scripts/kconfig"
echo 'all:' >"$dir/Makefile"
cat >"$dir/scripts/kconfig/merge_config.sh" <<'MERGE'
#!/usr/bin/env bash
# merge_config.sh -m BASE FRAGMENT...: the fragments' lines appended.
echo "merge_config.sh $*" >>"$STUB_CALLS"
if [ "${STUB_FAIL:-}" = merge-config ]; then echo "stub: merge-config fails" >&2; exit 3; fi
[ "$1" = -m ] && shift
base=$1
shift
cat "$@" >>"$base"
MERGE
chmod +x "$dir/scripts/kconfig/merge_config.sh"
EOF

# make -C TREE [VAR=...] [-jN] TARGET...; with M=DIR, the module build.
stub make <<'EOF'
tree=. targets=() module=
while (($#)); do
	case $1 in
	-C) tree=$2; shift ;;
	M=*) module=${1#M=} ;;
	-j*| *=*) ;;
	*) targets+=("$1") ;;
	esac
	shift
done
for t in "${targets[@]}"; do
	case $t in
	rustavailable) fails make-rustavailable; echo "Rust is available!" ;;
	tinyconfig) fails make-tinyconfig; echo "CONFIG_64BIT=y" >"$tree/.config" ;;
	olddefconfig)
		fails make-olddefconfig
		# Kconfig dropping an option whose dependencies are unmet.
		if [ "${STUB_FAIL:-}" = option-dropped ]; then sed -i '/^CONFIG_RUST=/d' "$tree/.config"; fi
		;;
	bzImage)
		echo "  CC      init/main.o"
		fails make-build
		mkdir -p "$tree/arch/x86/boot" && echo fake >"$tree/arch/x86/boot/bzImage"
		;;
	modules)
		if [ -n "$module" ]; then
			echo "  RUSTC [M] $module/kmod/p2pdma_main.o"
			fails make-module
		else
			echo fake >"$tree/Module.symvers"
		fi
		;;
	*) echo "make: no rule to make target $t" >&2; exit 2 ;;
	esac
done
EOF

# cargo build and cargo test --no-run --message-format=json (build.sh):
# artifacts in JSON for the test programs build.sh looks for.
stub cargo <<'EOF'
case " $* " in
*" build "*) fails cargo-build ;;
*" test "*)
	fails cargo-test
	[ "${STUB_FAIL:-}" = no-test-binaries ] && exit 0
	bins=$(dirname "$STUB_CALLS")/bins
	mkdir -p "$bins"
	grep -oE '\("(lib|test)", "[A-Za-z0-9_]+"\)' "$STUB_ROOT/tools/rig/build.sh" | tr -d '()" ' |
		while IFS=, read -r kind name; do
			echo fake >"$bins/$name"
			printf '{"reason":"compiler-artifact","target":{"kind":["%s"],"name":"%s"},"executable":"%s"}\n' \
				"$kind" "$name" "$bins/$name"
		done
	;;
esac
EOF

stub sudo <<'EOF'
exec "$@"
EOF

# setup-host.sh's view of the machine: every package installed except
# those in $STUB_MISSING; rustup with its components and the musl target.
stub dpkg-query <<'EOF'
pkg=${*: -1}
case " ${STUB_MISSING:-} " in
*" $pkg "*) exit 1 ;;
esac
printf 'install ok installed'
EOF
stub rustup <<'EOF'
case "$*" in
"component list --installed") printf 'rust-src\nrustfmt-x86_64-unknown-linux-gnu\nclippy-x86_64-unknown-linux-gnu\n' ;;
"target list --installed") printf 'x86_64-unknown-linux-gnu\nx86_64-unknown-linux-musl\n' ;;
esac
EOF
stub rustc <<'EOF'
echo "rustc 1.95.0 (stub)"
EOF
stub bindgen <<'EOF'
echo "bindgen 0.73.2"
EOF

# run SCRIPT ARGS...: runs a script of the copy in a clean environment with
# the stubs first on PATH; stdout in $work/out, stderr in $work/err, the
# stubs' calls in $calls. Sets rc.
cache=
run() {
	: >"$calls"
	env -i HOME="$work/home" PATH="$stubs:/usr/bin:/bin" TMPDIR="$work" \
		P2PDMA_CACHE="$cache" P2PDMA_DEBIAN_MIRROR=http://deb.invalid/debian \
		STUB_CALLS="$calls" STUB_ROOT="$root" STUB_FAIL="${STUB_FAIL:-}" STUB_MISSING="${STUB_MISSING:-}" \
		${KVARIANT:+P2PDMA_KVARIANT=$KVARIANT} ${KTREE:+P2PDMA_KERNEL_TREE=$KTREE} \
		bash "$root/$1" "${@:2}" </dev/null >"$work/out" 2>"$work/err"
	rc=$?
}
fresh_cache() {
	cache=$(mktemp -d "$work/cache.XXXXXX")
}
called() { grep -c "^$1 " "$calls"; }
built_trees() { find "$cache/kernel" -mindepth 2 -maxdepth 2 -name .p2pdma-built -printf '%h\n' 2>/dev/null | sort; }
errors() { grep -F '[p2pdma] error:' "$work/err" | sed 's/\x1b\[[0-9;]*m//g'; }
# The tree a successful kernel.sh run printed, if it is a built tree.
printed_tree() {
	local t
	t=$(cat "$work/out")
	if [ "$(wc -l <"$work/out")" = 1 ] && [ -f "$t/.p2pdma-built" ] && [ -f "$t/arch/x86/boot/bzImage" ]; then
		echo "$t"
	fi
}
# age TREE SECONDS: dates TREE's build SECONDS back (the cache orders
# trees by when they were built, to the second).
age() { if [ -n "$1" ]; then touch -d "@$(($(date +%s) - $2))" "$1/.p2pdma-built"; fi; }

# An empty cache: download, unpack, configure, build; the path on stdout.
fresh_cache
run tools/rig/kernel.sh
t1=$(printed_tree)
if ((rc != 0)); then
	bad kernel:empty-cache-builds "exit status $rc, $(errors | wc -l) error line(s)"
elif [ -z "$t1" ]; then
	bad kernel:empty-cache-builds "stdout is not one built tree's path: $(head -c 200 "$work/out")"
elif grep -q 'seeding' "$work/err" || [ "$(called dpkg-deb)" = 0 ]; then
	bad kernel:empty-cache-builds "did not unpack the source package"
elif [ "$(called make)" = 0 ] || ! grep -q '^make .*bzImage' "$calls"; then
	bad kernel:empty-cache-builds "no kernel build"
else
	ok kernel:empty-cache-builds
fi
age "$t1" 5000
if [ -n "$(errors)" ]; then
	bad kernel:success-says-no-error "a successful build printed: $(errors | head -n 1)"
else
	ok kernel:success-says-no-error
fi

# The same configuration again: nothing to do.
run tools/rig/kernel.sh
if ((rc != 0)) || [ -z "$t1" ] || [ "$(cat "$work/out")" != "$t1" ]; then
	bad kernel:second-run-cached "exit status $rc, printed $(head -c 200 "$work/out")"
elif ! grep -q 'already built' "$work/err"; then
	bad kernel:second-run-cached "does not say the tree is already built"
elif [ "$(called make)" != 0 ] || [ "$(called apt-get)" != 0 ]; then
	bad kernel:second-run-cached "ran make $(called make) and apt-get $(called apt-get) times"
else
	ok kernel:second-run-cached
fi

# A configuration change: seeded from the built tree, not unpacked.
base=$root/tools/rig/kconfig/base.config debug=$root/tools/rig/kconfig/debug.config
echo "# change 1" >>"$base"
run tools/rig/kernel.sh
t2=$(printed_tree)
if ((rc != 0)) || [ -z "$t2" ] || [ "$t2" = "$t1" ]; then
	bad kernel:config-change-seeds "exit status $rc, printed $(head -c 200 "$work/out")"
elif [ -z "$t1" ] || ! grep -q "seeding from ${t1##*/}" "$work/err" || [ "$(called dpkg-deb)" != 0 ]; then
	bad kernel:config-change-seeds "not seeded from ${t1##*/}"
else
	ok kernel:config-change-seeds
fi

# Two built trees of the variant: the newest one (by when it was built)
# seeds, whatever the order of their names.
age "$t2" 9000
echo "# change 2" >>"$base"
run tools/rig/kernel.sh
t3=$(printed_tree)
if ((rc != 0)) || [ -z "$t3" ] || [ -z "$t1" ] || ! grep -q "seeding from ${t1##*/}" "$work/err"; then
	bad kernel:seeds-from-newest "not seeded from the newest built tree ${t1##*/} (exit status $rc): $(grep -m1 seeding "$work/err")"
else
	ok kernel:seeds-from-newest
fi
age "$t3" 4000

# The debug variant never starts from a base tree.
KVARIANT=debug run tools/rig/kernel.sh
d1=$(printed_tree)
if ((rc != 0)) || [ -z "$d1" ] || [[ ${d1##*/} != *-debug-* ]]; then
	bad kernel:debug-not-seeded-from-base "exit status $rc, printed $(head -c 200 "$work/out")"
elif grep -q 'seeding' "$work/err" || [ "$(called dpkg-deb)" = 0 ]; then
	bad kernel:debug-not-seeded-from-base "$(grep -m1 seeding "$work/err")"
else
	ok kernel:debug-not-seeded-from-base
fi
age "$d1" 3000
echo "# change 1" >>"$debug"
KVARIANT=debug run tools/rig/kernel.sh
d2=$(printed_tree)
if ((rc != 0)) || [ -z "$d2" ] || [ -z "$d1" ] || ! grep -q "seeding from ${d1##*/}" "$work/err"; then
	bad kernel:debug-seeds-from-debug "exit status $rc: $(grep -m1 -e seeding -e unpacking "$work/err")"
else
	ok kernel:debug-seeds-from-debug
fi

# Five trees built: the cache keeps the newest three (of any variant), the
# one just built among them.
want=$(printf '%s\n' "$t3" "$d1" "$d2" | sort)
if [ "$(built_trees)" = "$want" ] && grep -q 'removing the old kernel tree' "$work/err"; then
	ok kernel:evicts-to-three
else
	bad kernel:evicts-to-three "built trees left: $(built_trees | sed 's|.*/||' | tr '\n' ' ')"
fi

# Every step failing in turn, on an empty cache: a non-zero exit and an
# error line that names the step (and the log, where there is one).
while read -r step expect; do
	fresh_cache
	STUB_FAIL=$step run tools/rig/kernel.sh
	expect=${expect//@CACHE@/$cache}
	if ((rc == 0)); then
		bad "kernel:fails-loudly:$step" "exit status 0"
	elif [ -z "$(errors)" ]; then
		bad "kernel:fails-loudly:$step" "exit status $rc and no error line"
	elif ! errors | grep -qE -- "$expect"; then
		bad "kernel:fails-loudly:$step" "exit status $rc, but no error line matches /$expect/: $(errors | head -n 1)"
	else
		ok "kernel:fails-loudly:$step"
	fi
done <<'EOF'
apt-update apt-get update.*@CACHE@/apt/update\.log
apt-download apt-get download.*@CACHE@/apt/download\.log
apt-download-nothing linux-source-7\.3_\*\.deb.*download\.log
dpkg-deb dpkg-deb.*unpack\.log
tar-source tarball.*unpack\.log
make-rustavailable rustavailable.*rustavailable\.log
make-tinyconfig tinyconfig.*config\.log
merge-config merge_config.*config\.log
make-olddefconfig olddefconfig.*config\.log
option-dropped required option.*config\.log
make-build building Linux.*build\.log
EOF

# The last of those, a broken build, left no marker: the next run builds
# the tree again rather than taking it for built.
broken=$(find "$cache/kernel" -mindepth 1 -maxdepth 1 -type d -name 'linux-*-base-*' ! -name '*.tmp' 2>/dev/null | head -n 1)
if [ -z "$broken" ] || [ -e "$broken/.p2pdma-built" ]; then
	bad kernel:broken-build-not-marked "tree after a failed build: '${broken##*/}' $([ -e "$broken/.p2pdma-built" ] && echo "has the marker")"
else
	ok kernel:broken-build-not-marked
fi
run tools/rig/kernel.sh
if ((rc == 0)) && [ -n "$(printed_tree)" ] && grep -q '^make .*bzImage' "$calls"; then
	ok kernel:rebuilds-after-broken-build
else
	bad kernel:rebuilds-after-broken-build "exit status $rc, $(called make) make calls"
fi

# A tree given by the user must be built.
fresh_cache
mkdir -p "$work/notbuilt"
env -i HOME="$work/home" PATH="$stubs:/usr/bin:/bin" P2PDMA_CACHE="$cache" STUB_CALLS="$calls" \
	P2PDMA_KERNEL_TREE="$work/notbuilt" bash "$root/tools/rig/kernel.sh" </dev/null >"$work/out" 2>"$work/err"
rc=$?
if ((rc != 0)) && errors | grep -q 'not a built kernel tree'; then
	ok kernel:override-must-be-built
else
	bad kernel:override-must-be-built "exit status $rc: $(errors | head -n 1)"
fi

# build.sh on a built tree: the module, the programs, the guest's test
# binaries; then each of those failing.
fresh_cache
ktree=$work/tree
mkdir -p "$ktree"
echo fake >"$ktree/.config"
echo fake >"$ktree/Module.symvers"
KTREE=$ktree run tools/rig/build.sh
wanted=$(grep -oE ': "libp2pdma-[a-z-]+"' "$root/tools/rig/build.sh" | tr -d ': "' | sort)
got=$(find "$root/target/guest-tests" -type f -printf '%f\n' 2>/dev/null | sort)
if ((rc != 0)) || [ "$(cat "$work/out")" != "$ktree" ]; then
	bad build:builds "exit status $rc, printed $(head -c 200 "$work/out")"
elif ! grep -q "^make .*M=$root modules" "$calls"; then
	bad build:builds "no module build"
elif [ -z "$wanted" ] || [ "$got" != "$wanted" ]; then
	bad build:builds "guest test binaries: $(echo "$got" | tr '\n' ' '), wanted $(echo "$wanted" | tr '\n' ' ')"
else
	ok build:builds
fi
while read -r step expect; do
	STUB_FAIL=$step KTREE=$ktree run tools/rig/build.sh
	expect=${expect//@CACHE@/$cache}
	if ((rc != 0)) && errors | grep -qE -- "$expect"; then
		ok "build:fails-loudly:$step"
	else
		bad "build:fails-loudly:$step" "exit status $rc: $(errors | head -n 1)"
	fi
done <<'EOF'
make-module module build failed.*@CACHE@/module-build\.log
cargo-build cargo build of p2pdma-ctl
cargo-test cargo test --no-run.*guest-tests\.json
no-test-binaries guest test binaries.*guest-tests\.json
EOF

# setup-host.sh with everything in place: checks only, installs nothing.
fresh_cache
run tools/rig/setup-host.sh
if ((rc != 0)); then
	bad setup:all-installed "exit status $rc: $(errors | head -n 1)"
elif [ "$(called apt-get)" != 0 ] || grep -qE '^rustup (component add|target add)' "$calls"; then
	bad setup:all-installed "installed something: $(grep -E '^(apt-get|rustup .* add)' "$calls" | head -n 1)"
elif ! grep -q 'host toolchain ready' "$work/err"; then
	bad setup:all-installed "no closing 'host toolchain ready' line"
else
	ok setup:all-installed
fi
STUB_MISSING="shellcheck fio" run tools/rig/setup-host.sh
if ((rc == 0)) && grep -q '^apt-get .*install -y --no-install-recommends fio shellcheck$' "$calls" &&
	grep -q '^apt-get update$' "$calls"; then
	ok setup:installs-missing
else
	bad setup:installs-missing "exit status $rc; apt-get calls: $(grep '^apt-get' "$calls" | tr '\n' ';')"
fi
STUB_MISSING=shellcheck STUB_FAIL=apt-install run tools/rig/setup-host.sh
if ((rc != 0)) && errors | grep -qE "installing shellcheck.*$cache/apt-install\.log"; then
	ok setup:install-failure-named
else
	bad setup:install-failure-named "exit status $rc: $(errors | head -n 1)"
fi

# Bad arguments stop with a message, before anything is built.
run tools/rig.sh frobnicate
if ((rc != 0)) && errors | grep -q 'unknown command frobnicate'; then
	ok rig:unknown-command
else
	bad rig:unknown-command "exit status $rc: $(errors | head -n 1)"
fi
run tools/rig/vm.sh --topology sideways
if ((rc != 0)) && errors | grep -q 'unknown topology sideways' && [ "$(called make)" = 0 ]; then
	ok vm:unknown-topology
else
	bad vm:unknown-topology "exit status $rc: $(errors | head -n 1)"
fi

# A failing command in any rig script names itself and where it is.
cat >"$root/tools/rig/fails.sh" <<'EOF'
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
false
echo "not reached"
EOF
run tools/rig/fails.sh
if ((rc != 0)) && errors | grep -qE '"false" failed with status 1 \(.*fails\.sh line 3\)' && [ ! -s "$work/out" ]; then
	ok common:failing-command-named
else
	bad common:failing-command-named "exit status $rc: $(errors | head -n 1)"
fi

echo "cold-logic: $pass passed, $fail failed"
((fail == 0))
