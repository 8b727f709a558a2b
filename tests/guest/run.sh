#!/usr/bin/env bash
# userdma's QEMU guest tests: boots small Linux guests with QEMU's emulated `edu` PCI device and
# an emulated NVMe controller, runs the statically linked test program (the `guest_suite`
# example, tests/guest/suite/) inside each, and reports every case.
#
#   tests/guest/run.sh                  # every boot (what scripts/guest-test.sh runs)
#   BOOTS=iommu-pt tests/guest/run.sh   # some boots only (space-separated names)
#   tests/guest/run.sh --self-test      # only the script's own checks (seconds; no QEMU, no root)
#
# The boots (their cases are listed by `guest_suite --list BOOT`):
#   iommu-pt      q35 + emulated Intel IOMMU, intel_iommu=on iommu=pt (VFIO type1, UIO physical DMA);
#                 two NUMA nodes, a second edu on node 1 behind a pxb-pcie expander bridge
#   iommu-strict  q35 + emulated Intel IOMMU, translated (isolation: unmapped DMA is refused)
#   noiommu       q35 without IOMMU, vfio rebuilt with CONFIG_VFIO_NOIOMMU (no-IOMMU VFIO, UIO)
#   iommufd       q35 + emulated Intel IOMMU, intel_iommu=on, on Debian 13's kernel (trixie's
#                 linux-image-amd64), iommufd and the VFIO device cdevs (rebuilt with
#                 CONFIG_IOMMUFD=m and CONFIG_VFIO_DEVICE_CDEV=y when the package has them off);
#                 a second edu on a hot-pluggable root port, removed through QMP (device_del);
#                 vivid, the V4L2 test driver (one capture node, /dev/video0), loaded by init
#
# Environment:
#   ACCEL=tcg|kvm|auto  how QEMU runs the guest (default tcg). auto boots a short probe guest
#                       with KVM and falls back to tcg if it does not come up (some hosts' KVM
#                       cannot boot a stock kernel); kvm fails if /dev/kvm is not usable.
#                       The guest is told which one ran it (userdma.accel=tcg|kvm on its
#                       command line), for the timings it reports (vfio-map-cost).
#   BOOTS               boots to run (default: all)
#   BOOT_TIMEOUT        seconds one boot may take before it fails (default 300)
#   GUEST_OUT           build and work directory (default target/guest)
#   USERDMA_CACHE       download cache root (default ~/.cache/userdma); packages go to guest/debs
#
# Installs what it needs from Debian (qemu-system-x86, busybox-static, ...; apt-get update at
# most once), downloads the distribution kernel named by linux-image-amd64 (not installed:
# unpacked), and for the iommufd boot the one Debian 13 (trixie) names, resolved through an apt
# state of its own under the cache (sources, lists; used only to resolve and download), and
# builds into target/guest. Prints PASS/FAIL per case as BOOT/CASE, and ends with
# "N passed, M failed"; exits non-zero when a case failed, a planned case did not report, a
# setup step failed, or a guest did not finish in time. Nothing is skipped.
#
# Boots run GUEST_JOBS at a time (default: one per CPU; each guest is mostly one busy vCPU
# under TCG), each with a disk image of its own; their results are read in order afterwards.
#
# The NVMe disk image: every boot starts from a zeroed $OUT/nvme-BOOT.img and a fresh random seed,
# passed to the guest as userdma.nvme=SEED,LBA,BLOCKS. In the boots that run the nvme-vfio case,
# the nvme example writes that pattern from the guest; after the guest powered off this script
# checks the image on the host (BOOT/nvme-image): the blocks hold the pattern, recomputed here
# independently of the guest (the formula is in examples/nvme/io.rs; keep the two in step), and
# every other byte of the image is still zero.
set -euo pipefail

cd "$(dirname "$0")/../.."
HERE=tests/guest
OUT=${GUEST_OUT:-target/guest}
CACHE=${USERDMA_CACHE:-${HOME:?set HOME or USERDMA_CACHE}/.cache/userdma}/guest
DEBS=$CACHE/debs
ACCEL=${ACCEL:-tcg}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-300}
# The guest programs are the host's own release build, in the target directory the other
# release steps use, so nothing is built twice; the initramfs carries the shared libraries
# they link (see copy_libraries).
BUILT=${CARGO_TARGET_DIR:-target}/release
SUITE=$BUILT/examples/guest_suite
NVME=$BUILT/examples/nvme
TOOL=$BUILT/userdma
# The block range the nvme example writes in the guest (the image is 1 MiB: 2048 blocks of 512
# bytes, or 256 of 4096).
NVME_LBA=16
NVME_BLOCKS=200
# Each boot's seed for the pattern (set when the boot is started).
declare -A SEED
T0=$(date +%s)

log() { printf '=== [%4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
PASSED=0
FAILED=0
die() {
	echo "guest-test: $*" >&2
	echo "guest: $PASSED passed, $((FAILED + 1)) failed"
	exit 1
}
# A command that fails outside a check of its own still ends the run with a result line.
trap 'die "a command failed at line $LINENO of $0"' ERR

# ---- the script's own parts, checked before anything else ------------------------------------------
# ldd_libraries: the shared libraries in the output of `ldd FILE...` (on stdin), once each, in
# C order: the target of each "NAME => /path (0x...)" line, and the dynamic loader, which ldd
# names by its path alone ("/lib64/ld-linux-x86-64.so.2 (0x...)"). Nothing else is a library:
# given several files, ldd heads each one's list with a line "FILE:", an absolute path when the
# file was named by one (as the programs are under an absolute CARGO_TARGET_DIR); and
# "linux-vdso.so.1 (0x...)" (in the kernel), "NAME => not found", "statically linked" are not
# files to copy either.
ldd_libraries() {
	awk '$2 == "=>" && $3 ~ /^\// { print $3; next }
		NF == 2 && $1 ~ /^\// && $2 ~ /^\(0x[0-9a-fA-F]+\)$/ { print $1 }' | LC_ALL=C sort -u
}

# check_ldd_libraries: ldd_libraries on a fixed ldd output (three programs: two named by
# absolute paths, one with a space, and a static one), then on the host's own ldd of two
# programs named by absolute paths: what it takes must be the libraries, each an existing file.
check_ldd_libraries() {
	local got want real lib
	got=$(ldd_libraries <<'EOF'
/work/target dir/release/examples/guest_suite:
	linux-vdso.so.1 (0x00007ffd4e9f2000)
	libgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f0c1f6a1000)
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0c1f4c0000)
	/lib64/ld-linux-x86-64.so.2 (0x00007f0c1f74e000)
/work/target/release/userdma:
	linux-vdso.so.1 (0x00007ffe0a3d1000)
	libm.so.6 => not found
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f5d2b1d7000)
	/lib64/ld-linux-x86-64.so.2 (0x00007f5d2b3c2000)
target/guest/edu_dma:
	statically linked
EOF
)
	want=$(printf '%s\n' /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/libgcc_s.so.1 \
		/lib64/ld-linux-x86-64.so.2)
	[ "$got" = "$want" ] ||
		die "self-test: from a fixed ldd output, ldd_libraries took '${got//$'\n'/ }', not '${want//$'\n'/ }'"
	command -v ldd >/dev/null || die "self-test: ldd is not on PATH (it comes with libc-bin)"
	real=$(ldd "$BASH" "$(command -v sort)" | ldd_libraries) || die "self-test: ldd $BASH $(command -v sort) failed"
	[ -n "$real" ] || die "self-test: ldd_libraries found no library in ldd's output for $BASH"
	for lib in $real; do
		[ -f "$lib" ] || die "self-test: ldd_libraries took '$lib' from ldd's output for $BASH, which is no file"
	done
}

# module_load_order ROOT DEPENDS: ROOT and every module it needs, one name a line, each after
# the modules it depends on and once (depth first, in the order of each module's depends= list).
# DEPENDS is a command: `DEPENDS NAME` prints the modules NAME depends on (separated by commas
# or spaces; nothing for none) and fails, saying why on stderr, when there is no module NAME.
# Fails, saying why on stderr, on a missing module or a dependency cycle. '-' and '_' are the
# same in module names, as the kernel has it; a module keeps the spelling it was first named by.
module_load_order() {
	local -A _mstate=()
	local -a _morder=()
	module_visit "$1" "" "$2" || return 1
	printf '%s\n' "${_morder[@]}"
}

# module_visit NAME NEEDED_BY DEPENDS: module_load_order's depth-first step (it adds to the
# caller's _mstate and _morder).
module_visit() {
	local name=$1 by=$2 depends=$3 key=${1//-/_} deps d
	case "${_mstate[$key]:-}" in
	done) return 0 ;;
	visiting)
		echo "a dependency cycle: $name depends on itself (through $by)" >&2
		return 1
		;;
	esac
	_mstate[$key]=visiting
	if ! deps=$("$depends" "$name"); then
		[ -z "$by" ] || echo "($name is needed by $by)" >&2
		return 1
	fi
	for d in ${deps//,/ }; do
		module_visit "$d" "$name" "$depends" || return 1
	done
	_mstate[$key]="done"
	_morder+=("$name")
}

# check_module_load_order: module_load_order on vivid's dependencies as Debian 13's 6.12 has
# them (each module's depends=), which must give the order that loads there; then a missing
# module and a cycle must fail, naming the module.
check_module_load_order() {
	local got want err
	fixed_depends() {
		case "$1" in
		vivid) echo "videodev,videobuf2-v4l2,mc,v4l2-tpg,v4l2-dv-timings,videobuf2-common,cec,videobuf2-vmalloc,videobuf2-dma-contig" ;;
		videodev | videobuf2-common) echo mc ;;
		videobuf2-v4l2) echo "videobuf2-common,videodev,mc" ;;
		videobuf2-memops) echo videobuf2-common ;;
		videobuf2-vmalloc) echo "videobuf2-memops,videobuf2-common" ;;
		# Spelled with '_': the same modules as above, not loaded twice.
		videobuf2-dma-contig) echo "videobuf2_memops,videobuf2_common" ;;
		cec) echo rc-core ;;
		mc | v4l2-tpg | v4l2-dv-timings | rc-core) ;;
		loop-a) echo loop-b ;;
		loop-b) echo loop-a ;;
		needs-absent) echo absent ;;
		*)
			echo "no module $1" >&2
			return 1
			;;
		esac
	}
	got=$(module_load_order vivid fixed_depends | tr '\n' ' ') ||
		die "self-test: module_load_order failed on vivid's dependencies"
	want="mc videodev videobuf2-common videobuf2-v4l2 v4l2-tpg v4l2-dv-timings rc-core cec videobuf2-memops videobuf2-vmalloc videobuf2-dma-contig vivid "
	[ "$got" = "$want" ] || die "self-test: module_load_order gave '$got' for vivid, not '$want'"
	if err=$(module_load_order needs-absent fixed_depends 2>&1 >/dev/null); then
		die "self-test: module_load_order did not fail on a missing module"
	fi
	case "$err" in *"no module absent"*"needed by needs-absent"*) ;;
	*) die "self-test: module_load_order's error for a missing module does not name it: '$err'" ;; esac
	if err=$(module_load_order loop-a fixed_depends 2>&1 >/dev/null); then
		die "self-test: module_load_order did not fail on a dependency cycle"
	fi
	case "$err" in *"cycle: loop-a"*) ;;
	*) die "self-test: module_load_order's error for a cycle does not say so: '$err'" ;; esac
}

check_ldd_libraries
check_module_load_order
case "${1:-}" in
"") ;;
--self-test)
	echo "guest-test: self-test passed (ldd_libraries, module_load_order)"
	exit 0
	;;
*) die "unknown argument '$1' (the only one is --self-test; see the top of $0)" ;;
esac

# ---- host packages ----------------------------------------------------------------------------
APT_UPDATED=0
apt_update_once() {
	[ "$APT_UPDATED" = 1 ] && return 0
	[ "$(id -u)" = 0 ] || die "apt-get update needs root (run as root, or install the packages and the kernel by hand)"
	log "apt-get update"
	apt-get -o DPkg::Lock::Timeout=600 update -qq || die "apt-get update failed: is the Debian archive reachable?"
	APT_UPDATED=1
}

apt_install() { # apt_install PKG...: installs the packages that are missing
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	[ "$(id -u)" = 0 ] || die "missing packages: ${missing[*]} (apt-get install ${missing[*]}, as root)"
	apt_update_once
	log "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
		--no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
}

# ---- which boots --------------------------------------------------------------------------------
ALL_BOOTS="iommu-pt iommu-strict noiommu iommufd"
BOOTS=${BOOTS:-$ALL_BOOTS}
for b in $BOOTS; do
	case " $ALL_BOOTS " in *" $b "*) ;; *) die "unknown boot '$b' in BOOTS (known: $ALL_BOOTS)" ;; esac
done
NEED_NOIOMMU=0
case " $BOOTS " in *" noiommu "*) NEED_NOIOMMU=1 ;; esac

log "host packages"
apt_install qemu-system-x86 busybox-static xz-utils zstd cpio file binutils
command -v python3 >/dev/null || apt_install python3-minimal
command -v python3 >/dev/null || die "python3 is not on PATH after installing python3-minimal (needed to check the NVMe image)"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is not on PATH after installing qemu-system-x86"
# grep reads to the end (no -q): an early exit could kill QEMU with SIGPIPE and fail the pipeline.
qemu-system-x86_64 -device help 2>/dev/null | grep '"edu"' >/dev/null || die "this QEMU has no edu device"
file -L /bin/busybox | grep -qE 'static(-pie)? linked|statically linked' ||
	die "/bin/busybox is not statically linked (apt-get install busybox-static)"

# ---- the guest kernels ---------------------------------------------------------------------------
# The host's Debian for the boots on its kernel; Debian 13 (trixie) for the iommufd boot, through
# an apt state of its own (its sources and lists under the cache, the host's keyring), used only
# to resolve and download packages, never to install them.
NEED_HOST_KERNEL=0
NEED_TRIXIE=0
for b in $BOOTS; do
	case "$b" in
	iommufd) NEED_TRIXIE=1 ;;
	*) NEED_HOST_KERNEL=1 ;;
	esac
done
TRIXIE_APT=$CACHE/trixie-apt
trixie_apt_opts() { # the options that point apt-get and apt-cache at the trixie state
	TAPT=(-o "Dir::Etc::SourceList=$TRIXIE_APT/sources.list" -o "Dir::Etc::SourceParts=$TRIXIE_APT/sources.list.d"
		-o "Dir::Etc::Preferences=$TRIXIE_APT/preferences" -o "Dir::Etc::PreferencesParts=$TRIXIE_APT/preferences.d"
		-o "Dir::State::Lists=$TRIXIE_APT/lists" -o "Dir::Cache=$TRIXIE_APT/cache" -o "Dir::State::Status=$TRIXIE_APT/status"
		-o "APT::Architecture=amd64" -o "APT::Architectures::=amd64")
}
trixie_apt_opts
TRIXIE_UPDATED=0
trixie_update() { # the trixie lists, fetched at most once a run
	[ "$TRIXIE_UPDATED" = 1 ] && return 0
	[ "$(id -u)" = 0 ] || die "apt-get update (of the trixie lists) needs root"
	mkdir -p "$TRIXIE_APT"/{lists/partial,cache/archives/partial,sources.list.d,preferences.d}
	: >"$TRIXIE_APT/status"
	: >"$TRIXIE_APT/preferences"
	keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	[ -f "$keyring" ] || apt_install debian-archive-keyring
	cat >"$TRIXIE_APT/sources.list" <<EOF
deb [signed-by=$keyring] http://deb.debian.org/debian trixie main
deb [signed-by=$keyring] http://deb.debian.org/debian-security trixie-security main
EOF
	log "apt-get update (Debian 13 lists, for the iommufd boot's kernel)"
	apt-get "${TAPT[@]}" -o DPkg::Lock::Timeout=600 update -qq ||
		die "apt-get update of the Debian 13 (trixie) lists failed: is deb.debian.org reachable?"
	TRIXIE_UPDATED=1
}

# resolve_kernel [trixie]: the kernel linux-image-amd64 depends on now (KPKG, KVER) and its
# package version (KVERSION; the source, headers and kbuild packages of a module rebuild must
# have the same one).
resolve_kernel() {
	local apt=()
	[ "${1:-}" = trixie ] && apt=("${TAPT[@]}")
	KPKG=$(apt-cache "${apt[@]}" depends linux-image-amd64 2>/dev/null |
		sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n 1 || true)
	KVER=${KPKG#linux-image-}
	KVERSION=
	if [ -n "$KPKG" ]; then
		KVERSION=$(apt-cache "${apt[@]}" show --no-all-versions "$KPKG" 2>/dev/null | sed -n 's/^Version: //p' | head -n 1 || true)
	fi
}

# fetch_deb PKG VERSION [trixie]: downloads PKG at VERSION (any version if VERSION is empty)
# into $DEBS (once); its path in FETCHED.
fetch_deb() {
	local pkg=$1 version=$2 apt=() f spec
	if [ "${3:-}" = trixie ]; then
		apt=("${TAPT[@]}")
	fi
	mkdir -p "$DEBS"
	# A colon in a version is %3a in the file name.
	f=$(find "$DEBS" -maxdepth 1 -name "${pkg}_${version//:/%3a}${version:+_}*.deb" | sort -V | tail -n 1)
	if [ -z "$f" ]; then
		if [ "${3:-}" = trixie ]; then trixie_update; else apt_update_once; fi
		spec=$pkg${version:+=$version}
		echo "apt-get download $spec" >&2
		# Older versions of the same package are of no further use.
		find "$DEBS" -maxdepth 1 -name "${pkg}_*.deb" -delete
		(cd "$DEBS" && apt-get "${apt[@]}" download -q "$spec" 2>&1 | grep -v 'unsandboxed' >&2) || true
		f=$(find "$DEBS" -maxdepth 1 -name "${pkg}_${version//:/%3a}${version:+_}*.deb" | head -n 1)
		[ -n "$f" ] || die "cannot download $spec from the Debian archive"
	fi
	FETCHED=$f
}

# The modules the guest loads, by the path under kernel/ in the image package. 6.1 has
# vfio_virqfd as a module of its own; 6.12 builds it into vfio. The kernel's NVMe driver and
# what nvme-core needs on 6.1 (t10-pi and its two CRCs) are for the stage-nvme-edu case, which
# loads them itself (init does not: the driver would claim the controller at boot).
MODULES_HOST="virt/lib/irqbypass drivers/vfio/vfio drivers/vfio/vfio_iommu_type1 drivers/vfio/vfio_virqfd
drivers/vfio/pci/vfio-pci-core drivers/vfio/pci/vfio-pci drivers/uio/uio drivers/uio/uio_pci_generic
crypto/crct10dif_common lib/crc-t10dif lib/crc64 lib/crc64-rocksoft block/t10-pi
drivers/nvme/host/nvme-core drivers/nvme/host/nvme"
# The directories (under kernel/) those extra modules are unpacked from.
MODULES_HOST_DIRS="crypto lib block drivers/nvme/host"
MODULES_IOMMUFD="virt/lib/irqbypass drivers/uio/uio drivers/uio/uio_pci_generic
drivers/nvme/common/nvme-auth drivers/nvme/host/nvme-core drivers/nvme/host/nvme"
# The directories (under kernel/) of the iommufd boot's NVMe modules (6.12's nvme-core needs
# nvme-auth only).
MODULES_IOMMUFD_DIRS="drivers/nvme/common drivers/nvme/host"
MODULES_REBUILT="iommufd vfio vfio_iommu_type1 vfio-pci-core vfio-pci"
# vivid, the V4L2 test driver, for the iommufd boot (init loads it there only): it and the
# modules it needs, found by following each module's .modinfo depends= (the package has no
# modules.dep: depmod runs when it is installed) among the modules under these directories
# (under kernel/; on 6.12 all twelve are under drivers/media, the last vivid). Their load order
# goes to KDIR/modules/vivid.order, which init reads.
VIVID_DIRS="drivers/media"

# decompress_module FILE KO: the module FILE (.ko, or .ko.xz, .ko.zst, .ko.gz) as a plain .ko
# at KO (busybox insmod reads plain .ko files only).
decompress_module() {
	case "$1" in
	*.ko.xz) xz -dc "$1" >"$2" ;;
	*.ko.zst) zstd -dcq "$1" >"$2" ;;
	*.ko.gz) gzip -dc "$1" >"$2" ;;
	*.ko) cp "$1" "$2" ;;
	*)
		echo "unknown module compression: $1" >&2
		return 1
		;;
	esac
}

# modinfo_depends KO: the modules the plain .ko KO depends on, comma-separated (its .modinfo
# section's depends= field, what `modinfo -F depends` prints; empty for none).
modinfo_depends() {
	local info
	info=$(mktemp) || return 1
	if ! objcopy -O binary --only-section=.modinfo "$1" "$info"; then
		rm -f "$info"
		echo "objcopy cannot read the .modinfo section of $1" >&2
		return 1
	fi
	tr '\0' '\n' <"$info" | sed -n 's/^depends=//p'
	rm -f "$info"
}

# package_module_depends NAME: module_load_order's DEPENDS over an unpacked kernel package:
# decompresses module NAME (found in PKG_MODULE, module name with '_' for '-' -> file) to
# PKG_OUT/NAME.ko and prints its depends=. A module that is not there fails, saying where the
# package has it (PKG_CONTENTS, its `dpkg -c`) if it has it at all.
package_module_depends() {
	local f=${PKG_MODULE[${1//-/_}]:-} where
	if [ -z "$f" ]; then
		where=$(printf '%s\n' "$PKG_CONTENTS" | awk '{ print $NF }' | grep -E "/${1//[-_]/[-_]}\.ko(\.(xz|zst|gz))?\$" | head -n 1 || true)
		echo "no module $1 under ${PKG_DIRS// /, } in the package${where:+; it has ${where#./} (add its directory)}" >&2
		return 1
	fi
	decompress_module "$f" "$PKG_OUT/$1.ko" || return 1
	modinfo_depends "$PKG_OUT/$1.ko"
}

# unpack_kernel DEB KVER KDIR MODULES [DIRS [ROOT]]: the kernel image (as an ELF vmlinux where
# possible), its config and the modules named (decompressed: busybox insmod reads plain .ko
# files only) into KDIR/{vmlinux,config,modules/}; the modules are looked for in drivers/vfio,
# drivers/uio, virt/lib and the DIRS given (under kernel/). With ROOT, also the module ROOT
# and every module it needs (module_load_order over their depends=; all must be under the
# DIRS), and their load order in KDIR/modules/ROOT.order, one name a line.
unpack_kernel() {
	local deb=$1 kver=$2 kdir=$3 modules=$4 extra=${5:-} root=${6:-} tmp bz off m f name moddir contents wild=() order
	log "unpacking $(basename "$deb")"
	rm -rf "$kdir"
	tmp=$kdir/unpacked
	mkdir -p "$tmp" "$kdir/modules"
	# Debian 13 keeps the modules under usr/lib (merged /usr), Debian 12 under lib.
	contents=$(dpkg -c "$deb")
	moddir=
	for m in "./usr/lib/modules/$kver/kernel/" "./lib/modules/$kver/kernel/"; do
		case "$contents" in *" $m"*) moddir=$m && break ;; esac
	done
	[ -n "$moddir" ] || die "$deb has no lib/modules/$kver/kernel/"
	for m in drivers/vfio drivers/uio virt/lib $extra; do
		wild+=("${moddir}$m/*")
	done
	dpkg --fsys-tarfile "$deb" | tar -x -C "$tmp" --wildcards "./boot/vmlinuz-$kver" "./boot/config-$kver" \
		"${wild[@]}" || die "unpacking $deb failed"
	cp "$tmp/boot/config-$kver" "$kdir/config"
	for m in $modules; do
		f=$(find "$tmp/${moddir}$(dirname "$m")" -maxdepth 1 -name "$(basename "$m").ko*" | head -n 1)
		[ -n "$f" ] || die "$deb has no module $m"
		name=$kdir/modules/$(basename "$m").ko
		decompress_module "$f" "$name" || die "cannot decompress $f"
	done
	if [ -n "$root" ]; then
		# Every module file unpacked, by module name ('_' for '-').
		declare -gA PKG_MODULE=()
		while IFS= read -r f; do
			name=${f##*/}
			name=${name%%.ko*}
			PKG_MODULE[${name//-/_}]=$f
		done < <(find "$tmp/$moddir" -name '*.ko*')
		PKG_OUT=$kdir/modules PKG_CONTENTS=$contents PKG_DIRS=$extra
		order=$(module_load_order "$root" package_module_depends) ||
			die "cannot resolve the modules $root needs from $(basename "$deb") (the message above says why)"
		printf '%s\n' "$order" >"$kdir/modules/$root.order"
		echo "$root and the modules it needs (.modinfo depends=), in load order: ${order//$'\n'/ }"
		unset PKG_MODULE PKG_CONTENTS
	fi
	# Boot the uncompressed ELF image when it can be cut out of the bzImage: QEMU then enters it
	# through PVH and skips the real-mode setup and the decompression, which under software
	# emulation saves several seconds a boot. Debian 12 compresses it with xz, Debian 13 with
	# zstd. The stream is followed by other data, so the decompressor exits non-zero; the ELF
	# check says whether it worked.
	bz=$tmp/boot/vmlinuz-$kver
	off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$bz" | head -n 1 | cut -d: -f1 || true)
	if [ -n "$off" ]; then
		tail -c +$((off + 1)) "$bz" | xz -dcq >"$kdir/vmlinux" 2>/dev/null || true
	else
		off=$(LC_ALL=C grep -obUaP '\x28\xb5\x2f\xfd' "$bz" | head -n 1 | cut -d: -f1 || true)
		if [ -n "$off" ]; then
			tail -c +$((off + 1)) "$bz" | zstd -dcq >"$kdir/vmlinux" 2>/dev/null || true
		fi
	fi
	if [ -s "$kdir/vmlinux" ] && file "$kdir/vmlinux" | grep -q 'ELF 64-bit'; then
		echo "kernel image: uncompressed vmlinux (PVH entry)"
	else
		echo "kernel image: the bzImage (no xz or zstd payload found to unpack)"
		cp "$bz" "$kdir/vmlinux"
	fi
	rm -rf "$tmp"
}

# The host's kernel, for iommu-pt, iommu-strict and noiommu.
if [ "$NEED_HOST_KERNEL" = 1 ]; then
	resolve_kernel
	if [ -z "$KPKG" ] || [ -z "$KVERSION" ] || [ ! -f "$OUT/kernel/$KVER/complete" ] ||
		{ [ "$NEED_NOIOMMU" = 1 ] && [ ! -f "$OUT/kernel/$KVER/noiommu/vfio.ko" ]; }; then
		# Not built yet: make sure the package lists are current before choosing what to download.
		apt_update_once
		resolve_kernel
	fi
	if [ -z "$KPKG" ] || [ -z "$KVERSION" ]; then
		die "cannot resolve the kernel package: 'apt-cache depends linux-image-amd64' names no linux-image-* (is this Debian amd64 with its archive in sources.list?)"
	fi
	KDIR=$OUT/kernel/$KVER
	log "guest kernel $KPKG $KVERSION"
	# Unpacked again when a module was added to the list since.
	missing=
	for m in $MODULES_HOST; do
		[ -f "$KDIR/modules/$(basename "$m").ko" ] || missing=1
	done
	if [ ! -f "$KDIR/complete" ] || [ -n "$missing" ]; then
		fetch_deb "$KPKG" "$KVERSION"
		# A rebuilt no-IOMMU vfio.ko is kept across the unpacking (it takes minutes to build).
		rm -rf "$OUT/kernel/noiommu.kept"
		[ -d "$KDIR/noiommu" ] && mv "$KDIR/noiommu" "$OUT/kernel/noiommu.kept"
		unpack_kernel "$FETCHED" "$KVER" "$KDIR" "$MODULES_HOST" "$MODULES_HOST_DIRS"
		[ -d "$OUT/kernel/noiommu.kept" ] && mv "$OUT/kernel/noiommu.kept" "$KDIR/noiommu"
		touch "$KDIR/complete"
	fi

	if [ "$NEED_NOIOMMU" = 1 ] && [ ! -f "$KDIR/noiommu/vfio.ko" ]; then
		gcc_version=$(sed -n 's/^CONFIG_GCC_VERSION=//p' "$KDIR/config")
		[ -n "$gcc_version" ] || die "$KDIR/config has no CONFIG_GCC_VERSION"
		apt_install "gcc-$((gcc_version / 10000))" make bc libelf1 libc6-dev
		branch=$(echo "$KVERSION" | cut -d. -f1,2)
		kabi=${KVER%-amd64}
		fetch_deb "linux-source-$branch" "$KVERSION"
		src=$FETCHED
		fetch_deb "linux-headers-$KVER" "$KVERSION"
		hdr=$FETCHED
		fetch_deb "linux-headers-$kabi-common" "$KVERSION"
		common=$FETCHED
		fetch_deb "linux-kbuild-$branch" "$KVERSION"
		kbuild=$FETCHED
		log "rebuilding vfio.ko with CONFIG_VFIO_NOIOMMU"
		mkdir -p "$KDIR/noiommu"
		"$HERE/noiommu-vfio.sh" "$KVER" "$src" "$hdr" "$common" "$kbuild" "$KDIR/noiommu/vfio.ko" ||
			die "the no-IOMMU vfio.ko could not be built (needed by the noiommu boot)"
	fi
	HOST_KVER=$KVER
	HOST_KDIR=$KDIR
fi

# Debian 13's kernel, for the iommufd boot. Its lists are refreshed when the kernel is not built
# yet or they are more than a day old, so a new kernel package is picked up without pinning one.
if [ "$NEED_TRIXIE" = 1 ]; then
	if [ ! -d "$TRIXIE_APT/lists" ] || [ -n "$(find "$TRIXIE_APT/sources.list" -mmin +1440 2>/dev/null)" ]; then
		trixie_update
	fi
	resolve_kernel trixie
	if [ -z "$KPKG" ] || [ -z "$KVERSION" ] || [ ! -f "$OUT/kernel/$KVER/complete" ]; then
		trixie_update
		resolve_kernel trixie
	fi
	[ -n "$KPKG" ] && [ -n "$KVERSION" ] ||
		die "cannot resolve Debian 13's kernel package: linux-image-amd64 in the trixie lists ($TRIXIE_APT) names no linux-image-*"
	KDIR=$OUT/kernel/$KVER
	log "iommufd boot's kernel (Debian 13) $KPKG $KVERSION"
	# Unpacked again when a module was added to the list since.
	missing=
	for m in $MODULES_IOMMUFD; do
		[ -f "$KDIR/modules/$(basename "$m").ko" ] || missing=1
	done
	if [ -s "$KDIR/modules/vivid.order" ]; then
		while read -r m; do
			[ -f "$KDIR/modules/$m.ko" ] || missing=1
		done <"$KDIR/modules/vivid.order"
	else
		missing=1
	fi
	if [ ! -f "$KDIR/complete" ] || [ -n "$missing" ]; then
		fetch_deb "$KPKG" "$KVERSION" trixie
		unpack_kernel "$FETCHED" "$KVER" "$KDIR" "$MODULES_IOMMUFD" "$MODULES_IOMMUFD_DIRS $VIVID_DIRS" vivid
		config=$KDIR/config
		for option in CONFIG_IOMMU_API=y CONFIG_INTEL_IOMMU=y CONFIG_VFIO=m CONFIG_VFIO_PCI=m CONFIG_INTERVAL_TREE=y; do
			grep -qx "$option" "$config" ||
				die "Debian 13's $KPKG $KVERSION is not built with $option: the iommufd boot cannot run on it"
		done
		if grep -qxE 'CONFIG_IOMMUFD=[my]' "$config" && grep -qx 'CONFIG_VFIO_DEVICE_CDEV=y' "$config"; then
			echo "the kernel has CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV: its own modules"
			unpack_kernel "$FETCHED" "$KVER" "$KDIR.own" "drivers/iommu/iommufd/iommufd drivers/vfio/vfio
drivers/vfio/vfio_iommu_type1 drivers/vfio/pci/vfio-pci-core drivers/vfio/pci/vfio-pci" drivers/iommu
			mv "$KDIR.own"/modules/*.ko "$KDIR/modules/"
			rm -rf "$KDIR.own"
			echo package >"$KDIR/iommufd-modules"
		elif [ -f "$CACHE/built/$KVER-$KVERSION-iommufd/complete" ]; then
			cp "$CACHE/built/$KVER-$KVERSION-iommufd"/*.ko "$KDIR/modules/"
			echo "rebuilt (by an earlier run, from $CACHE/built)" >"$KDIR/iommufd-modules"
		else
			# Debian leaves iommufd off (bookworm's 6.1 predates the cdevs; trixie's 6.12 and
			# its backports have CONFIG_IOMMUFD unset): build the modules with it, once per
			# kernel version (kept in the cache beside the packages).
			echo "$KPKG $KVERSION has $(grep -E '^(# )?CONFIG_IOMMUFD[= ]' "$config" | head -n 1 || echo 'no CONFIG_IOMMUFD line'):" \
				"building iommufd.ko and the VFIO modules with CONFIG_IOMMUFD=m and CONFIG_VFIO_DEVICE_CDEV=y"
			apt_install make bc libelf1 libc6-dev gcc
			branch=$(echo "$KVERSION" | cut -d. -f1,2)
			flavourless=${KVER%-amd64}
			fetch_deb "linux-source-$branch" "$KVERSION" trixie
			src=$FETCHED
			fetch_deb "linux-headers-$KVER" "$KVERSION" trixie
			hdr=$FETCHED
			fetch_deb "linux-headers-$flavourless-common" "$KVERSION" trixie
			common=$FETCHED
			fetch_deb "linux-kbuild-$flavourless" "$KVERSION" trixie
			kbuild=$FETCHED
			# Debian 13's C library and the libraries its kbuild helpers use, for a host whose
			# own are older (the helpers then run through its loader).
			sysroot=$(realpath -m "$KDIR/sysroot")
			mkdir -p "$sysroot"
			for lib in libc6 libelf1t64 zlib1g libzstd1; do
				fetch_deb "$lib" "" trixie
				dpkg -x "$FETCHED" "$sysroot"
			done
			log "building iommufd.ko and the VFIO modules for $KVER"
			"$HERE/iommufd-modules.sh" "$KVER" "$src" "$hdr" "$common" "$kbuild" "$KDIR/modules" "$sysroot" ||
				die "iommufd.ko and the VFIO modules could not be built for $KVER (needed by the iommufd boot)"
			rm -rf "$sysroot"
			built=$CACHE/built/$KVER-$KVERSION-iommufd
			rm -rf "$CACHE/built/$KVER-"*-iommufd
			mkdir -p "$built"
			for m in $MODULES_REBUILT; do
				cp "$KDIR/modules/$m.ko" "$built/"
			done
			touch "$built/complete"
			echo "rebuilt with CONFIG_IOMMUFD=m, CONFIG_VFIO_DEVICE_CDEV=y" >"$KDIR/iommufd-modules"
		fi
		for m in irqbypass $MODULES_REBUILT uio uio_pci_generic $(cat "$KDIR/modules/vivid.order"); do
			[ -f "$KDIR/modules/$m.ko" ] || die "the iommufd boot's module $m.ko is missing from $KDIR/modules"
		done
		[ "$(tail -n 1 "$KDIR/modules/vivid.order")" = vivid ] ||
			die "$KDIR/modules/vivid.order does not end with vivid"
		touch "$KDIR/complete"
	fi
	TRIXIE_KVER=$KVER
	TRIXIE_KDIR=$KDIR
	echo "iommufd and VFIO modules: $(cat "$KDIR/iommufd-modules") ($KPKG $KVERSION)"
fi

# ---- the test program -----------------------------------------------------------------------------
log "building the guest test program (release)"
# The two examples with the package and feature set of CI's other release builds, so under CI
# the driver and the layers above it are not built again; the tool with its own (the README's
# main job builds the same).
source scripts/release-set.sh
cargo build --release --locked --quiet "${release_set[@]}" --example guest_suite --example nvme &&
	cargo build --release --locked --quiet -p userdma-cli --bin userdma ||
	die "building the guest_suite and nvme examples and the userdma tool failed"
suite_boots=$("$SUITE" --boots | tr '\n' ' ')
[ "$suite_boots" = "$ALL_BOOTS " ] ||
	die "run.sh knows the boots '$ALL_BOOTS' but guest_suite --boots says '$suite_boots': update both together"

# ---- the C examples (examples/c/edu_dma.c, edu_engine.c; cases c-edu-vfio, c-engine-edu-vfio) ------
# libuserdma.a of the same release build as the programs above (the C API step builds it too),
# then each example linked against it with `gcc -static` and the libraries `pkg-config --static
# --libs userdma` names (less -lgcc_s, which has no static archive: `gcc -static` links
# libgcc_eh in its place).
log "building libuserdma.a (release) and examples/c/edu_dma.c and edu_engine.c against it (static)"
apt_install gcc libc6-dev pkg-config
cargo build --release --locked --quiet -p userdma-capi ||
	die "building the C library (userdma-capi) failed"
CAPI=$OUT/capi
rm -rf "$CAPI"
mkdir -p "$CAPI/lib/pkgconfig" "$CAPI/include"
cp "$BUILT/libuserdma.a" "$CAPI/lib/libuserdma.a"
cp capi/include/userdma.h "$CAPI/include/userdma.h"
sed -e "s|@PREFIX@|$(realpath "$CAPI")|" -e "s|@VERSION@|$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)|" \
	capi/userdma.pc.in >"$CAPI/lib/pkgconfig/userdma.pc"
capi_cflags=$(PKG_CONFIG_PATH=$CAPI/lib/pkgconfig pkg-config --cflags userdma)
capi_libs=$(PKG_CONFIG_PATH=$CAPI/lib/pkgconfig pkg-config --static --libs userdma | sed 's/-lgcc_s\b//g')
EDU_DMA=$OUT/edu_dma
# shellcheck disable=SC2086 # pkg-config prints several words on purpose
gcc -std=c11 -O2 -g -Wall -Wextra -Wpedantic -Werror -static $capi_cflags examples/c/edu_dma.c \
	-o "$EDU_DMA" $capi_libs || die "linking examples/c/edu_dma.c statically against libuserdma.a failed"
file "$EDU_DMA" | grep -qE 'static(-pie)? linked|statically linked' || die "$EDU_DMA is not statically linked"
EDU_ENGINE=$OUT/edu_engine
# shellcheck disable=SC2086 # pkg-config prints several words on purpose
gcc -std=c11 -O2 -g -Wall -Wextra -Wpedantic -Werror -static $capi_cflags examples/c/edu_engine.c \
	-o "$EDU_ENGINE" $capi_libs || die "linking examples/c/edu_engine.c statically against libuserdma.a failed"
file "$EDU_ENGINE" | grep -qE 'static(-pie)? linked|statically linked' || die "$EDU_ENGINE is not statically linked"

# ---- the initramfs ---------------------------------------------------------------------------------
log "building the initramfs"
ROOTFS=$OUT/rootfs
rm -rf "$ROOTFS"
mkdir -p "$ROOTFS"/{bin,sbin,proc,sys,dev,tmp,lib/modules}
cp /bin/busybox "$ROOTFS/bin/busybox"
for applet in $(/bin/busybox --list); do
	[ "$applet" = busybox ] || ln -s busybox "$ROOTFS/bin/$applet"
done
# Each kernel's modules under its release (init loads from /lib/modules/$(uname -r)).
if [ "$NEED_HOST_KERNEL" = 1 ]; then
	mkdir -p "$ROOTFS/lib/modules/$HOST_KVER"
	cp "$HOST_KDIR"/modules/*.ko "$ROOTFS/lib/modules/$HOST_KVER/"
	if [ "$NEED_NOIOMMU" = 1 ]; then
		mkdir -p "$ROOTFS/lib/modules/$HOST_KVER/noiommu"
		cp "$HOST_KDIR/noiommu/vfio.ko" "$ROOTFS/lib/modules/$HOST_KVER/noiommu/vfio.ko"
	fi
fi
if [ "$NEED_TRIXIE" = 1 ]; then
	mkdir -p "$ROOTFS/lib/modules/$TRIXIE_KVER"
	cp "$TRIXIE_KDIR"/modules/*.ko "$TRIXIE_KDIR/modules/vivid.order" "$ROOTFS/lib/modules/$TRIXIE_KVER/"
fi
install -m 755 "$HERE/init" "$ROOTFS/init"
objcopy --strip-debug "$SUITE" "$ROOTFS/guest_suite"
objcopy --strip-debug "$NVME" "$ROOTFS/nvme"
objcopy --strip-debug "$TOOL" "$ROOTFS/userdma"
objcopy --strip-debug "$EDU_DMA" "$ROOTFS/edu_dma"
objcopy --strip-debug "$EDU_ENGINE" "$ROOTFS/edu_engine"
# copy_libraries PROGRAM...: the shared libraries the programs load (the host's glibc, libgcc_s;
# the dynamic loader), each at the path the program names, so they run in the guest as they
# do on the host. The guest kernels are newer than the host's glibc needs.
copy_libraries() {
	local lib
	for lib in $(ldd "$@" | ldd_libraries); do
		mkdir -p "$ROOTFS$(dirname "$lib")"
		cp -L "$lib" "$ROOTFS$lib"
	done
}
copy_libraries "$SUITE" "$NVME" "$TOOL"
# Uncompressed: the guest kernel unpacks it faster than it would decompress it.
(cd "$ROOTFS" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) >"$OUT/initramfs.cpio"

# fresh_image BOOT: a zeroed 1 MiB image for the boot's emulated NVMe controller.
fresh_image() {
	rm -f "$OUT/nvme-$1.img"
	truncate -s 1M "$OUT/nvme-$1.img"
}

# check_image SEED CONSOLE BOOT: checks $OUT/nvme-BOOT.img against what the nvme-vfio case wrote with SEED
# (the case's "INFO nvme-image" line gives the LBA size); prints why not and fails if it differs.
check_image() {
	local seed=$1 console=$2 image=$OUT/nvme-$3.img line
	line=$(grep -m 1 '^INFO nvme-image ' "$console" || true)
	[ -n "$line" ] || { echo "the guest printed no 'INFO nvme-image' line (did nvme-vfio pass?)"; return 1; }
	python3 - "$image" "$seed" "$NVME_LBA" "$NVME_BLOCKS" "$line" <<'PY'
import sys

# The pattern of examples/nvme/io.rs, written again from its description: word k (8 bytes,
# little-endian) of block lba is splitmix64((seed * 0x9e3779b97f4a7c15) ^ (lba << 16) ^ k).
M = (1 << 64) - 1
def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)

image, seed, lba, blocks, line = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
said = dict(f.split("=", 1) for f in line.split()[2:])
want = {"seed": str(seed), "lba": str(lba), "blocks": str(blocks)}
for key, value in want.items():
    if said.get(key) != value:
        sys.exit(f"the guest reports {key}={said.get(key)}, but this boot was given {value}")
size = int(said.get("lba-size", "0"))
if size not in (512, 4096):
    sys.exit(f"the guest reports an LBA size of {size}; expected 512 or 4096")
data = open(image, "rb").read()
start, end = lba * size, (lba + blocks) * size
if len(data) < end:
    sys.exit(f"{image} has {len(data)} bytes, fewer than the {end} the blocks need")
expected = bytearray()
for b in range(lba, lba + blocks):
    for k in range(size // 8):
        expected += splitmix64(((seed * 0x9E3779B97F4A7C15) & M) ^ ((b << 16) & M) ^ k).to_bytes(8, "little")
got = data[start:end]
if got != bytes(expected):
    first = next(i for i in range(len(got)) if got[i] != expected[i])
    bad = sum(1 for i in range(len(got)) if got[i] != expected[i])
    sys.exit(f"{bad} of {len(got)} bytes differ from the pattern, the first in LBA {lba + first // size} at byte {first % size}")
outside = data[:start] + data[end:]
if any(outside):
    first = next(i for i, v in enumerate(data) if v and not start <= i < end)
    sys.exit(f"the image has data outside LBAs {lba}..{lba + blocks}, the first at byte {first}")
print(f"{blocks} blocks of {size} bytes at LBA {lba} hold the pattern of seed {seed}; the rest is zero")
PY
}

# ---- booting ------------------------------------------------------------------------------------------
mkdir -p "$OUT/logs"
KVM_OK=0
[ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ] && KVM_OK=1

qemu_cmd() { # qemu_cmd ACCEL BOOT: sets QEMU_CMD to the QEMU command line
	local accel=$1 boot=$2
	local machine=q35 append="console=ttyS0 quiet panic=-1 userdma.boot=$2 userdma.accel=$1 userdma.nvme=${SEED[$2]:-1},$NVME_LBA,$NVME_BLOCKS"
	local iommu=() numa=() numa_devices=() hot_devices=() smp=2 kernel=${HOST_KDIR:-${TRIXIE_KDIR:-}}/vmlinux
	case "$boot" in
	iommu-pt)
		iommu=(-device "intel-iommu,intremap=on,caching-mode=on")
		append="$append intel_iommu=on iommu=pt"
		# Two NUMA nodes of 128 MiB and one CPU each (the same 256 MiB in all), and a second
		# edu on node 1: behind a pxb-pcie expander bridge (its own bus 0x80, whose ACPI
		# proximity gives the functions under it numa_node 1) and a root port on it.
		numa=(-object memory-backend-ram,id=m0,size=128M -object memory-backend-ram,id=m1,size=128M
			-numa node,nodeid=0,memdev=m0,cpus=0 -numa node,nodeid=1,memdev=m1,cpus=1)
		numa_devices=(-device pxb-pcie,id=pxb1,bus_nr=128,numa_node=1,bus=pcie.0
			-device pcie-root-port,id=rp1,bus=pxb1,chassis=1 -device edu,bus=rp1)
		# One socket per node: two cores of one socket on two nodes make the kernel warn
		# (topology_sane) at boot.
		smp=2,sockets=2,cores=1,threads=1
		;;
	iommu-strict)
		iommu=(-device "intel-iommu,intremap=on,caching-mode=on")
		append="$append intel_iommu=on"
		# A second edu on a root port of its own (a hot-pluggable slot), which the
		# vfio-hot-unplug case has removed through QMP (device_del, sent by wait_device_del).
		hot_devices=(-device pcie-root-port,id=hotport,bus=pcie.0,chassis=2,slot=2 -device edu,id=hotedu,bus=hotport)
		;;
	iommufd)
		iommu=(-device "intel-iommu,intremap=on,caching-mode=on")
		append="$append intel_iommu=on"
		kernel=$TRIXIE_KDIR/vmlinux
		;;
	noiommu | probe) ;;
	*) die "qemu_cmd: no QEMU arguments for boot '$boot'" ;;
	esac
	local cpu=(-accel "tcg,thread=multi" -cpu max)
	if [ "$accel" = kvm ]; then
		cpu=(-enable-kvm -cpu host)
		# Interrupt remapping needs the IOAPIC in QEMU, not in KVM.
		[ ${#iommu[@]} -gt 0 ] && machine=q35,kernel-irqchip=split
	fi
	# -m 256M keeps every guest-physical page under edu's 28-bit DMA mask (physical-address DMA).
	# The IOMMU must come before the devices it translates; the expander bridge after the devices
	# on pcie.0 (a device given no bus goes on the last bus made).
	QEMU_CMD=(qemu-system-x86_64 "${cpu[@]}" -machine "$machine" -smp "$smp" -m 256M "${numa[@]}" -nodefaults \
		"${iommu[@]}" -device edu \
		-drive "file=$OUT/nvme-$boot.img,if=none,id=nvm,format=raw" -device "nvme,serial=userdma0,drive=nvm" \
		"${numa_devices[@]}" "${hot_devices[@]}" \
		-kernel "$kernel" -initrd "$OUT/initramfs.cpio" -append "$append" \
		-qmp "unix:$OUT/logs/$boot.qmp,server=on,wait=off" \
		-display none -serial stdio -no-reboot)
}

# wait_device_del PID CONSOLE SOCKET LOG: while QEMU (PID) runs, answers each line
# "USERDMA-DEVICE-DEL <id>" the guest prints on CONSOLE by sending device_del of that device
# through QEMU's QMP SOCKET; the exchange goes to LOG. Returns when QEMU has exited.
wait_device_del() {
	local pid=$1 console=$2 socket=$3 qmplog=$4 done_ids=" " id
	while kill -0 "$pid" 2>/dev/null; do
		while read -r id; do
			case "$done_ids" in *" $id "*) continue ;; esac
			done_ids="$done_ids$id "
			qmp_device_del "$socket" "$id" >>"$qmplog" 2>&1 || echo "device_del $id failed" >>"$qmplog"
		done < <(tr -d '\r' <"$console" 2>/dev/null | sed -n 's/^USERDMA-DEVICE-DEL \([A-Za-z0-9_-]*\)$/\1/p')
		sleep 0.2
	done
}

# qmp_device_del SOCKET ID: QMP's greeting, qmp_capabilities, device_del ID; prints each reply.
qmp_device_del() {
	python3 - "$1" "$2" <<'PY'
import json, socket, sys, time

path, dev = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(path)
f = s.makefile("rw")
def reply():
    while True:
        line = f.readline()
        if not line:
            sys.exit("QMP closed the connection")
        msg = json.loads(line)
        print(f"{time.strftime('%H:%M:%S')} <- {line.strip()}")
        if "event" not in msg:
            return msg
def send(cmd):
    print(f"{time.strftime('%H:%M:%S')} -> {json.dumps(cmd)}")
    f.write(json.dumps(cmd) + "\n")
    f.flush()
    return reply()
reply()  # the greeting
send({"execute": "qmp_capabilities"})
answer = send({"execute": "device_del", "arguments": {"id": dev}})
if "error" in answer:
    sys.exit(f"device_del {dev}: {answer['error']}")
PY
}

boot() { # boot ACCEL BOOT TIMEOUT: runs one guest; console in $OUT/logs/BOOT.log, QEMU's status in BOOT_RC
	local accel=$1 name=$2 limit=$3
	qemu_cmd "$accel" "$name"
	printf '%q ' "${QEMU_CMD[@]}" >"$OUT/logs/$name.cmd"
	local start end
	start=$(date +%s.%N)
	BOOT_RC=0
	rm -f "$OUT/logs/$name.qmp" "$OUT/logs/$name.qmp.log"
	timeout --kill-after=10 "$limit" "${QEMU_CMD[@]}" </dev/null >"$OUT/logs/$name.raw" 2>&1 &
	local qemu=$!
	wait_device_del "$qemu" "$OUT/logs/$name.raw" "$OUT/logs/$name.qmp" "$OUT/logs/$name.qmp.log"
	wait "$qemu" || BOOT_RC=$?
	end=$(date +%s.%N)
	tr -d '\r' <"$OUT/logs/$name.raw" >"$OUT/logs/$name.log"
	rm -f "$OUT/logs/$name.raw"
	BOOT_SECONDS=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
}

if [ "$ACCEL" = auto ]; then
	ACCEL=tcg
	if [ "$KVM_OK" = 1 ]; then
		log "probing KVM with a short boot"
		fresh_image probe
		boot kvm probe 30
		if grep -q '^USERDMA-GUEST-PROBE-OK' "$OUT/logs/probe.log"; then
			ACCEL=kvm
		else
			echo "KVM did not boot the guest (QEMU status $BOOT_RC, log $OUT/logs/probe.log): using software emulation (tcg)"
		fi
	fi
fi
case "$ACCEL" in
tcg) ;;
kvm) [ "$KVM_OK" = 1 ] || die "ACCEL=kvm but /dev/kvm is missing or not usable by $(id -un)" ;;
*) die "ACCEL must be tcg, kvm or auto, not '$ACCEL'" ;;
esac

# Whether CASE is among the boot's planned cases. A loop, not `printf | grep -q`: under pipefail
# grep -q's early exit can kill printf (which writes one line at a time) with SIGPIPE, and the
# pipeline then fails although the case matched.
planned_has() { # planned_has CASE
	local c
	for c in "${planned[@]}"; do
		[ "$c" = "$1" ] && return 0
	done
	return 1
}

pass() { PASSED=$((PASSED + 1)); echo "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*"; }

# Every boot, GUEST_JOBS at a time, each in a subshell that leaves QEMU's status and the boot's
# time in $OUT/logs/BOOT.status.
GUEST_JOBS=${GUEST_JOBS:-$(nproc)}
case "$GUEST_JOBS" in '' | *[!0-9]* | 0) die "GUEST_JOBS must be a positive number, not '$GUEST_JOBS'" ;; esac
declare -A PLANNED
for name in $BOOTS; do
	list=$("$SUITE" --list "$name") || die "guest_suite --list $name failed"
	[ -n "$list" ] || die "guest_suite plans no case for boot $name"
	PLANNED[$name]=$list
	# A fresh seed and a zeroed image: what the host finds afterwards was written in this boot.
	SEED[$name]=$(((RANDOM << 15 | RANDOM) + 1))
	fresh_image "$name"
	rm -f "$OUT/logs/$name.status"
	while [ "$(jobs -rp | wc -l)" -ge "$GUEST_JOBS" ]; do
		wait -n || true
	done
	log "boot $name [$ACCEL]: $(wc -l <<<"$list") cases"
	(
		boot "$ACCEL" "$name" "$BOOT_TIMEOUT"
		again=
		# The guest's kernel died before /init began (its first line, `GUEST boot=`, never
		# came, nor anything after it, anywhere in the console), so nothing of this project
		# ran in it: under TCG a kernel can fault in early boot (seen: an int3 Oops in the idle
		# loop of the Debian 13 kernel). One more boot, reported below with the first one's
		# console; a second such death fails the boot. A boot whose /init began is never redone.
		if [ "$BOOT_RC" != 124 ] && [ "$BOOT_RC" != 137 ] &&
			! grep -qE 'GUEST boot=|USERDMA-GUEST|SETUP-ERROR|(PASS|FAIL|INFO|PLAN) ' \
				"$OUT/logs/$name.log"; then
			mv "$OUT/logs/$name.log" "$OUT/logs/$name.first.log"
			fresh_image "$name"
			boot "$ACCEL" "$name" "$BOOT_TIMEOUT"
			again=booted-twice
		fi
		echo "$BOOT_RC $BOOT_SECONDS $again" >"$OUT/logs/$name.status"
	) &
done
wait
log "every boot ended"

for name in $BOOTS; do
	mapfile -t planned <<<"${PLANNED[$name]}"
	BOOT_RC=255 BOOT_SECONDS=? AGAIN=
	[ -s "$OUT/logs/$name.status" ] && read -r BOOT_RC BOOT_SECONDS AGAIN <"$OUT/logs/$name.status"
	NVME_SEED=${SEED[$name]}
	console=$OUT/logs/$name.log
	boot_ok=1
	why=""
	if [ "$BOOT_RC" = 124 ] || [ "$BOOT_RC" = 137 ]; then
		why="the guest did not finish within ${BOOT_TIMEOUT}s (BOOT_TIMEOUT)"
	elif ! grep -q '^USERDMA-GUEST-DONE' "$console"; then
		why="the guest stopped before the tests finished (QEMU status $BOOT_RC: kernel panic, QEMU error or /init died)"
	elif [ "$BOOT_RC" != 0 ]; then
		why="QEMU exited with status $BOOT_RC"
	fi
	if [ -n "$why" ]; then
		boot_ok=0
		fail "$name/boot: $why"
	fi
	while IFS= read -r line; do
		boot_ok=0
		fail "$name/setup: ${line#SETUP-ERROR }"
	done < <(grep '^SETUP-ERROR' "$console" || true)
	for c in "${planned[@]}"; do
		line=$(grep -m 1 -E "^(PASS|FAIL) $c( |:|\$)" "$console" || true)
		case "$line" in
		PASS*) pass "$name/${line#PASS }" ;;
		FAIL*) boot_ok=0; fail "$name/${line#FAIL }" ;;
		*) boot_ok=0; fail "$name/$c: did not report${why:+ ($why)}" ;;
		esac
	done
	# The disk image, checked on the host, in the boots whose nvme-vfio case wrote it.
	if planned_has nvme-vfio; then
		if why_image=$(check_image "$NVME_SEED" "$console" "$name" 2>&1); then
			pass "$name/nvme-image (host): $why_image"
		else
			boot_ok=0
			fail "$name/nvme-image (host): $why_image"
		fi
	fi
	# Every reported case must have been planned.
	while IFS= read -r line; do
		c=$(echo "$line" | sed -E 's/^(PASS|FAIL) ([a-z0-9-]+).*/\2/')
		planned_has "$c" || { boot_ok=0; fail "$name/$c: reported but not planned"; }
	done < <(grep -E '^(PASS|FAIL) ' "$console" || true)
	if [ -s "$OUT/logs/$name.qmp.log" ]; then
		echo "    QMP ($OUT/logs/$name.qmp.log):"
		sed 's/^/    | /' "$OUT/logs/$name.qmp.log"
	fi
	echo "    boot $name: ${BOOT_SECONDS}s, console log $console"
	if [ -n "$AGAIN" ]; then
		echo "    boot $name was booted twice: the first guest's kernel died before /init began" \
			"(console $OUT/logs/$name.first.log); its last lines:"
		tail -n 25 "$OUT/logs/$name.first.log" | sed 's/^/    | /'
	fi
	if [ "$boot_ok" = 0 ]; then
		echo "    --- last lines of the console ---"
		tail -n 60 "$console" | sed 's/^/    | /'
	fi
done

log "done (accelerator: $ACCEL)"
echo "guest: $PASSED passed, $FAILED failed"
# Not a bare test: a failing command would fire the ERR trap and print a second result line.
[ "$FAILED" -eq 0 ] || exit 1
