#!/usr/bin/env bash
# Builds iommufd.ko and the VFIO modules with CONFIG_IOMMUFD=m and CONFIG_VFIO_DEVICE_CDEV=y for
# a distribution kernel that leaves both off (Debian 13's 6.12 does), so that a guest can use
# /dev/iommu and the VFIO device cdevs (/dev/vfio/devices/vfioN). Everything the modules need
# from the kernel itself is built in and exported whatever the options (the IOMMU core, the
# Intel IOMMU driver, the I/O page fault queue), except two small library parts the options
# would have selected, which are linked into iommufd.ko: the IOVA bitmap
# (drivers/iommu/iommufd/iova_bitmap.c) and the interval tree's span iterator (from
# lib/interval_tree.c). The VFIO modules are all rebuilt (vfio, vfio_iommu_type1, vfio-pci-core,
# vfio-pci): the option changes struct vfio_device, so the distribution's must not be mixed in.
# The modules are unsigned: the kernel marks itself tainted and loads them (signatures are not
# enforced without lockdown).
#
#   tests/guest/iommufd-modules.sh KVER SOURCE.deb HEADERS.deb HEADERS-COMMON.deb KBUILD.deb OUTDIR [SYSROOT]
#
# KVER is the kernel release (e.g. 6.12.118+deb13-amd64); the .deb files are that kernel's
# linux-source, linux-headers, linux-headers-*-common and linux-kbuild packages, all of the same
# version as the kernel image. OUTDIR receives iommufd.ko, vfio.ko, vfio_iommu_type1.ko,
# vfio-pci-core.ko and vfio-pci.ko.
#
# The compiler: the one the kernel was built with (CONFIG_GCC_VERSION) when it is installed,
# else the newest gcc-N on PATH (a Debian 12 host has gcc-12, Debian 13's kernel is built with
# gcc-14); the one option of the newer compiler the build would pass (-fmin-function-alignment)
# is then replaced by the older spelling (-falign-functions). The C ABI is the same.
# The kbuild helpers (modpost, objtool) of a newer distribution may need a newer C library
# than the host's: SYSROOT, if given, is an unpacked libc6 (and libelf1t64, zlib1g, libzstd1)
# of the kernel's distribution, and the helpers that do not run natively are run through its
# dynamic loader.
set -euo pipefail

[ $# -eq 6 ] || [ $# -eq 7 ] || {
	echo "usage: $0 KVER SOURCE.deb HEADERS.deb HEADERS-COMMON.deb KBUILD.deb OUTDIR [SYSROOT]" >&2
	exit 2
}
kver=$1 source_deb=$2 headers_deb=$3 common_deb=$4 kbuild_deb=$5 outdir=$6 sysroot=${7:-}
say() { echo "iommufd-modules: $*" >&2; }

mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
# Absolute: kbuild runs in the headers' directory.
work=$(mktemp -d "$outdir/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root" "$work/src" "$work/m/iommufd" "$work/m/vfio/pci"

for deb in "$headers_deb" "$common_deb" "$kbuild_deb"; do
	dpkg -x "$deb" "$work/root"
done
headers=$work/root/usr/src/linux-headers-$kver
[ -f "$headers/Makefile" ] || {
	say "$headers_deb has no usr/src/linux-headers-$kver/Makefile"
	exit 1
}
# The headers package includes the common part by an absolute path.
sed -i "s#^include /usr/src/#include $work/root/usr/src/#" "$headers/Makefile"
config=$headers/include/config/auto.conf

# The compiler.
gcc_version=$(sed -n 's/^CONFIG_GCC_VERSION=//p' "$config")
[ -n "$gcc_version" ] || {
	say "$config has no CONFIG_GCC_VERSION (not built with gcc?)"
	exit 1
}
cc=gcc-$((gcc_version / 10000))
make_vars=()
if ! command -v "$cc" >/dev/null; then
	older=$(compgen -c gcc- | grep -E '^gcc-[0-9]+$' | sort -t- -k2 -n | tail -n 1 || true)
	[ -n "$older" ] || {
		say "the kernel was built with $cc and no gcc-N is installed"
		exit 1
	}
	say "the kernel was built with $cc, which is not installed: building with $older"
	cc=$older
	make_vars+=(CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=)
fi
# No BTF for these modules (it needs pahole, and nothing here reads it).
make_vars+=(CONFIG_DEBUG_INFO_BTF_MODULES=)

# The kbuild helpers that do not run here natively, through the sysroot's loader.
kbuild_dir=$(readlink -f "$headers/scripts/..")
for helper in scripts/mod/modpost.real-lsb-64 tools/objtool/objtool.real-x86 scripts/mod/modpost tools/objtool/objtool; do
	f=$kbuild_dir/$helper
	[ -f "$f" ] && file "$f" | grep -q ELF || continue
	if ! out=$("$f" --help 2>&1) && echo "$out" | grep -q 'GLIBC_'; then
		[ -n "$sysroot" ] || {
			say "$helper needs a newer C library than this host's ($out); give a SYSROOT"
			exit 1
		}
		lib=$sysroot/usr/lib/x86_64-linux-gnu
		[ -x "$lib/ld-linux-x86-64.so.2" ] || {
			say "$sysroot has no usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
			exit 1
		}
		mv "$f" "$f.native"
		printf '#!/bin/sh\nexec %q --library-path %q %q "$@"\n' "$lib/ld-linux-x86-64.so.2" "$lib" "$f.native" >"$f"
		chmod +x "$f"
	fi
done

# The sources: drivers/iommu (iommufd and the private header it includes), drivers/vfio, and
# lib/interval_tree.c, from the tarball inside linux-source.
tarball=$(dpkg --fsys-tarfile "$source_deb" | tar -t | grep -m1 -E '^\./usr/src/linux-source-[^/]*\.tar\.xz$') || {
	say "$source_deb holds no linux-source tarball"
	exit 1
}
top=$(basename "$tarball" .tar.xz)
dpkg --fsys-tarfile "$source_deb" | tar -xO "$tarball" |
	tar -xJ -C "$work/src" "$top/drivers/iommu/iommufd" "$top/drivers/iommu/iommu-priv.h" "$top/drivers/vfio" \
		"$top/lib/interval_tree.c"
src=$work/src/$top
m=$work/m
cp "$src"/drivers/iommu/iommufd/*.[ch] "$m/iommufd/"
cp "$src/drivers/iommu/iommu-priv.h" "$m/"
cp "$src"/drivers/vfio/*.[ch] "$m/vfio/"
cp "$src"/drivers/vfio/pci/vfio_pci*.[ch] "$m/vfio/pci/"
# The span iterator alone (the rest of lib/interval_tree.c is built in and exported), kept
# private to iommufd.ko.
{
	sed -n '1,/^#define LAST/p' "$src/lib/interval_tree.c"
	sed -n '/^#ifdef CONFIG_INTERVAL_TREE_SPAN_ITER/,$p' "$src/lib/interval_tree.c" | grep -v '^EXPORT_SYMBOL'
} >"$m/iommufd/span_iter.c"
grep -q 'interval_tree_span_iter_first' "$m/iommufd/span_iter.c" || {
	say "lib/interval_tree.c has no span iterator under CONFIG_INTERVAL_TREE_SPAN_ITER"
	exit 1
}

# The objects, as the source's Makefiles list them (continuation lines joined), with the
# options turned on for the C code.
objects() { # objects MAKEFILE MODULE: the MODULE-y and MODULE-$(CONFIG_...) lines
	sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$1" | grep -E "^$2-(y|\\\$\\(CONFIG_[A-Z0-9_]+\\))[[:space:]]*[:+]?=" |
		sed -E "s/^$2-\\\$\\((CONFIG_IOMMUFD|CONFIG_VFIO_DEVICE_CDEV|CONFIG_VFIO_GROUP|CONFIG_VFIO_CONTAINER|CONFIG_VFIO_VIRQFD|CONFIG_VFIO_PCI_IGD)\\)/$2-y/" |
		grep -E "^$2-y"
}
options="-DCONFIG_IOMMUFD_MODULE=1 -DCONFIG_VFIO_DEVICE_CDEV=1"
echo "obj-m += iommufd/ vfio/" >"$m/Kbuild"
{
	echo "obj-m := iommufd.o"
	objects "$src/drivers/iommu/iommufd/Makefile" iommufd
	echo "iommufd-y += iova_bitmap.o span_iter.o"
	echo "ccflags-y += $options -DCONFIG_IOMMUFD_DRIVER=1 -DCONFIG_INTERVAL_TREE_SPAN_ITER=1"
} >"$m/iommufd/Kbuild"
{
	echo "obj-m := vfio.o vfio_iommu_type1.o pci/"
	objects "$src/drivers/vfio/Makefile" vfio
	echo "ccflags-y += $options"
} >"$m/vfio/Kbuild"
{
	echo "obj-m := vfio-pci-core.o vfio-pci.o"
	objects "$src/drivers/vfio/pci/Makefile" vfio-pci-core
	objects "$src/drivers/vfio/pci/Makefile" vfio-pci
	echo "ccflags-y += $options"
} >"$m/vfio/pci/Kbuild"
for f in "$m/iommufd/Kbuild" "$m/vfio/Kbuild"; do
	grep -qE '^(iommufd|vfio)-y' "$f" || {
		say "no objects found for $f in the source's Makefile"
		exit 1
	}
done

jobs=$(nproc 2>/dev/null || echo 2)
make -s -C "$headers" M="$m" CC="$cc" "${make_vars[@]}" -j"$jobs" modules 2>&1 | grep -v 'Skipping BTF generation' >&2 || true
for ko in iommufd/iommufd vfio/vfio vfio/vfio_iommu_type1 vfio/pci/vfio-pci-core vfio/pci/vfio-pci; do
	[ -f "$m/$ko.ko" ] || {
		say "building $ko.ko failed (see the output above)"
		exit 1
	}
done
grep -aq VFIO_DEVICE_BIND_IOMMUFD "$m/vfio/vfio.ko" || grep -aq vfio_iommufd_physical_bind "$m/vfio/vfio.ko" || {
	say "the rebuilt vfio.ko has no iommufd binding"
	exit 1
}
for ko in iommufd/iommufd vfio/vfio vfio/vfio_iommu_type1 vfio/pci/vfio-pci-core vfio/pci/vfio-pci; do
	objcopy --strip-debug "$m/$ko.ko" "$outdir/$(basename "$ko").ko"
done
