#!/usr/bin/env bash
# Builds vfio.ko for the guest kernel with CONFIG_VFIO_NOIOMMU, which Debian's kernels leave
# off, so that a guest without an IOMMU can use vfio-pci in no-IOMMU mode. Only vfio.ko depends
# on that option; its exported symbols (and their CRCs) are unchanged, so the distribution's
# vfio-pci-core, vfio-pci and vfio_iommu_type1 load on top of it. The module is unsigned: the
# kernel marks itself tainted and loads it (signatures are not enforced without lockdown).
#
#   tests/guest/noiommu-vfio.sh KVER SOURCE.deb HEADERS.deb HEADERS-COMMON.deb KBUILD.deb OUT.ko
#
# KVER is the kernel release (e.g. 6.1.0-57-amd64); the .deb files are that kernel's
# linux-source, linux-headers, linux-headers-*-common and linux-kbuild packages, all of the
# same version as the kernel image. Needs make and the gcc the kernel was built with.
set -euo pipefail

[ $# -eq 6 ] || {
	echo "usage: $0 KVER SOURCE.deb HEADERS.deb HEADERS-COMMON.deb KBUILD.deb OUT.ko" >&2
	exit 2
}
kver=$1 source_deb=$2 headers_deb=$3 common_deb=$4 kbuild_deb=$5 out=$6

# Absolute: kbuild runs in the headers' directory.
work=$(mktemp -d "$(cd "$(dirname "$out")" && pwd)/noiommu-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root" "$work/src" "$work/module"

for deb in "$headers_deb" "$common_deb" "$kbuild_deb"; do
	dpkg -x "$deb" "$work/root"
done
headers=$work/root/usr/src/linux-headers-$kver
[ -f "$headers/Makefile" ] || {
	echo "noiommu-vfio: $headers_deb has no usr/src/linux-headers-$kver/Makefile" >&2
	exit 1
}
# The headers package includes the common part by an absolute path.
sed -i "s#^include /usr/src/#include $work/root/usr/src/#" "$headers/Makefile"

# The compiler the kernel was built with (CONFIG_GCC_VERSION=120200 -> gcc-12).
gcc_version=$(sed -n 's/^CONFIG_GCC_VERSION=//p' "$headers/include/config/auto.conf")
cc=gcc-$((gcc_version / 10000))
command -v "$cc" >/dev/null || {
	echo "noiommu-vfio: the guest kernel was built with $cc, which is not installed (apt-get install $cc)" >&2
	exit 1
}

# drivers/vfio of the kernel source (the tarball inside linux-source).
tarball=$(dpkg --fsys-tarfile "$source_deb" | tar -t | grep -m1 -E '^\./usr/src/linux-source-[^/]*\.tar\.xz$') || {
	echo "noiommu-vfio: $source_deb holds no linux-source tarball" >&2
	exit 1
}
top=$(basename "$tarball" .tar.xz)
dpkg --fsys-tarfile "$source_deb" | tar -xO "$tarball" | tar -xJ -C "$work/src" "$top/drivers/vfio"
vfio_src=$work/src/$top/drivers/vfio
cp "$vfio_src"/*.c "$vfio_src"/*.h "$work/module/"

# vfio.ko's objects, as the source's own Makefile lists them (continuation lines joined), with
# the option turned on for the C code.
{
	echo "obj-m := vfio.o"
	sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$vfio_src/Makefile" | grep -E '^vfio-(y|\$\(CONFIG_[A-Z0-9_]+\))[[:space:]]*[:+]?='
	echo "ccflags-y += -DCONFIG_VFIO_NOIOMMU=1"
} >"$work/module/Kbuild"

make -s -C "$headers" M="$work/module" CC="$cc" modules 2>&1 | grep -v 'Skipping BTF generation' || true
[ -f "$work/module/vfio.ko" ] || {
	echo "noiommu-vfio: building vfio.ko failed (see the output above)" >&2
	exit 1
}
grep -aq enable_unsafe_noiommu_mode "$work/module/vfio.ko" || {
	echo "noiommu-vfio: the rebuilt vfio.ko has no enable_unsafe_noiommu_mode parameter" >&2
	exit 1
}
mv "$work/module/vfio.ko" "$out"
