#!/usr/bin/env bash
# The C API's checks, against the loopback device (scripts/test.sh runs this as its "C API"
# step; needs gcc, g++, cbindgen, valgrind, pkg-config):
#   1. the committed header is what cbindgen generates from capi/src now;
#   2. libuserdma.so has SONAME libuserdma.so.<major> and exports exactly capi/symbols.txt;
#   3. the header alone compiles as C11 and as C++17, included twice, with -Werror;
#   4. the C tests (capi/tests/capi_test.c, capi/tests/device_test.c, ...), -std=c11 -Wall
#      -Wextra -Wpedantic -Werror, under AddressSanitizer + UndefinedBehaviorSanitizer, then once
#      under Valgrind (owner_test.c starts the tool's `serve` as its device owner: a process of
#      its own, which neither checker runs);
#   5. examples/c/round_trip.c, built through an install (scripts/capi-install.sh) and
#      pkg-config, linked against the shared and the static library, and run; examples/c/
#      edu_dma.c and edu_engine.c built the same way and run on a missing PCI function (they
#      must fail cleanly; the guest suite runs them on QEMU's edu);
#   6. examples/c/two_streams.c (YOLOv5s-like frames on the NPU cost model, every result
#      checked), through an install of the release build, run for 1.5 s.
# Steps 1 to 5 use the debug build of the library: it shares its dependencies with `cargo
# test`. Step 6 needs the release build (the loopback device computes each layer on the host,
# which a debug build does a hundred times slower than the cost model's frame time).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
out=$target/capi
mkdir -p "$out"
CFLAGS=(-std=c11 -Wall -Wextra -Wpedantic -Werror -g)

echo "--- build"
cargo build --locked --quiet -p userdma-capi
# The device owner owner_test.c connects to: `userdma serve`.
cargo build --locked --quiet -p userdma-cli
export USERDMA_TOOL=$target/debug/userdma
lib=$target/debug/libuserdma.so
major=$(sed -n 's/^version = "\([0-9]*\)\..*/\1/p' Cargo.toml | head -n 1)
mkdir -p "$out/lib"
ln -sf "$(realpath "$lib")" "$out/lib/libuserdma.so.$major"
ln -sf "$(realpath "$lib")" "$out/lib/libuserdma.so"

echo "--- header is generated"
capi/gen-header.sh --verify

echo "--- SONAME and exported symbols"
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = "libuserdma.so.$major" ] || { echo "SONAME is '$soname', expected libuserdma.so.$major" >&2; exit 1; }
nm -D --defined-only "$lib" | awk '{print $3}' | sort >"$out/symbols.txt"
if ! diff -u <(grep -v '^#' capi/symbols.txt) "$out/symbols.txt"; then
	echo "libuserdma.so exports other symbols than capi/symbols.txt lists (+ added, - removed):" \
		"update the list for an addition; a removal breaks programs linked against it" >&2
	exit 1
fi
echo "SONAME $soname, $(wc -l <"$out/symbols.txt") symbols as listed"

echo "--- header alone: C11, C++17, included twice"
gcc "${CFLAGS[@]}" -Icapi/include -c capi/tests/header_twice.c -o "$out/header_c.o"
g++ -std=c++17 -Wall -Wextra -Wpedantic -Werror -Icapi/include -c capi/tests/header_twice.cpp -o "$out/header_cpp.o"
g++ "$out/header_cpp.o" -o "$out/header_cpp" -L"$out/lib" -luserdma
LD_LIBRARY_PATH=$out/lib "$out/header_cpp"

# capi_test.c: devices, memory, queues, plans, pipelines, streams; device_test.c: BAR
# access, the loopback device's layer and compact ops, device-memory ranges; limits_test.c:
# a full ring's next push, a small pool shared by two threads, absurd sizes, a depth above
# the device's largest; engine_test.c: engines written in C (examples/c/memory_engine.h),
# pipelines and streams on them, bad tables and engines that break their contract;
# interop_test.c: fences, descriptors passed over a socket, frame fences, access modes,
# dma-buf export, import and lookup (or the error naming the missing kernel feature);
# owner_test.c: a client of a device owner (the tool's `serve`, which it starts and stops):
# frames, refusals, buffers in flight, two client processes at once, the owner going away.
tests=(capi_test device_test limits_test engine_test interop_test owner_test)
echo "--- C tests under AddressSanitizer + UndefinedBehaviorSanitizer"
for t in "${tests[@]}"; do
	echo "$t"
	gcc "${CFLAGS[@]}" -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
		-Icapi/include "capi/tests/$t.c" -o "$out/${t}_asan" -L"$out/lib" -luserdma -lpthread
	LD_LIBRARY_PATH=$out/lib ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
		"$out/${t}_asan"
done

echo "--- C tests under Valgrind"
for t in "${tests[@]}"; do
	echo "$t"
	gcc "${CFLAGS[@]}" -Icapi/include "capi/tests/$t.c" -o "$out/$t" -L"$out/lib" -luserdma -lpthread
	LD_LIBRARY_PATH=$out/lib UDMA_TEST_VALGRIND=1 valgrind -q --error-exitcode=1 --leak-check=full --show-possibly-lost=no \
		--errors-for-leak-kinds=definite "$out/$t"
done

echo "--- examples/c through an install and pkg-config"
prefix=$(realpath "$out")/prefix
rm -rf "$prefix"
PROFILE=debug scripts/capi-install.sh "$prefix" >/dev/null
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# shellcheck disable=SC2046 # pkg-config prints several words on purpose
gcc "${CFLAGS[@]}" examples/c/round_trip.c -o "$out/round_trip" $(pkg-config --cflags --libs userdma)
LD_LIBRARY_PATH=$prefix/lib "$out/round_trip"
# shellcheck disable=SC2046
gcc "${CFLAGS[@]}" $(pkg-config --cflags userdma) examples/c/round_trip.c -o "$out/round_trip_static" \
	"$prefix/lib/libuserdma.a" $(pkg-config --libs-only-l --static userdma | sed 's/-luserdma//')
"$out/round_trip_static"
# Builds examples/c/$1.c and runs it on a PCI function no machine has: it must fail cleanly,
# exit status 1 and the library's message.
missing_function_fails_cleanly() {
	local name=$1 rc=0
	# shellcheck disable=SC2046
	gcc "${CFLAGS[@]}" "examples/c/$name.c" -o "$out/$name" $(pkg-config --cflags --libs userdma)
	LD_LIBRARY_PATH=$prefix/lib "$out/$name" fffe:ff:1f.7 2>"$out/$name.err" || rc=$?
	if [ "$rc" != 1 ] || ! grep -q 'UDMA_ERR_NOT_FOUND: udma_device_open_pci: fffe:ff:1f.7' "$out/$name.err"; then
		echo "$name on a missing function exited $rc, expected 1 with the library's message:" >&2
		cat "$out/$name.err" >&2
		exit 1
	fi
}
# edu_dma.c drives QEMU's edu device through VFIO (the guest suite runs it: case c-edu-vfio);
# edu_engine.c is an engine in C over edu, with a pipeline on it (case c-engine-edu-vfio).
missing_function_fails_cleanly edu_dma
missing_function_fails_cleanly edu_engine

# memory_engine.c: an engine written in C (no compute, host memory), a pipeline on it.
# shellcheck disable=SC2046
gcc "${CFLAGS[@]}" examples/c/memory_engine.c -o "$out/memory_engine" $(pkg-config --cflags --libs userdma)
LD_LIBRARY_PATH=$prefix/lib "$out/memory_engine" 64

echo "--- examples/c/two_streams.c through a release install"
release=$(realpath "$out")/prefix-release
rm -rf "$release"
PROFILE=release scripts/capi-install.sh "$release" >/dev/null
# shellcheck disable=SC2046
gcc "${CFLAGS[@]}" examples/c/two_streams.c -o "$out/two_streams" \
	$(PKG_CONFIG_PATH=$release/lib/pkgconfig pkg-config --cflags --libs userdma)
LD_LIBRARY_PATH=$release/lib "$out/two_streams" 1500
echo "C API: every check passed"
