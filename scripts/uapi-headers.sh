#!/bin/sh
# Fetch newer Linux uapi headers for the kernel ABI test of userdma-sys
# (sys/tests/kernel_abi.rs) WITHOUT installing anything or touching the
# system's apt configuration: for each Debian suite, apt runs with a private
# one-line sources list, list directory and cache, downloads that suite's
# linux-libc-dev, and `dpkg -x` unpacks it into a cache directory.
#
# Usage:
#   export USERDMA_UAPI_INCLUDE="$(scripts/uapi-headers.sh | tail -n 1)"
#   cargo test -p userdma-sys
#
#   scripts/uapi-headers.sh [SUITE...]
#
# Default suites: trixie (Debian 13, uapi 6.12: the first stable release with
# <linux/iommufd.h> and the VFIO device-cdev ioctls) and trixie-backports (the
# newest uapi Debian ships for trixie, which covers the fields vfio-bindings
# and iommufd-bindings carry from 6.13 and later).
#
# The last line on stdout is the colon-separated list of include directories
# (each holds linux/iommufd.h), ready for USERDMA_UAPI_INCLUDE. Everything else
# goes to stderr. Running it again reuses previous extractions. Environment:
#   USERDMA_CACHE        cache root (default: $HOME/.cache/userdma)
#   USERDMA_UAPI_MIRROR  Debian mirror (default: http://deb.debian.org/debian)
set -eu

log() { printf 'uapi-headers: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

mirror="${USERDMA_UAPI_MIRROR:-http://deb.debian.org/debian}"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cache_root="${USERDMA_CACHE:-${HOME:?HOME is not set; set USERDMA_CACHE}/.cache/userdma}"

[ "$#" -gt 0 ] || set -- trixie trixie-backports

# As root, apt would drop to the _apt user, which cannot write the private
# directories; let it download as the calling user instead.
sandbox=""
[ "$(id -u)" -ne 0 ] || sandbox="-o APT::Sandbox::User=root"

# fetch SUITE: makes sure $cache_root/uapi/SUITE/root/usr/include holds that
# suite's linux-libc-dev, and prints that directory on stdout.
fetch() {
    suite="$1"
    base="$cache_root/uapi/$suite"
    root="$base/root"
    include="$root/usr/include"

    if [ -f "$include/linux/iommufd.h" ] && [ -f "$include/linux/version.h" ] && [ -d "$include/asm/" ]; then
        log "$suite: reusing $include"
        printf '%s\n' "$include"
        return 0
    fi

    command -v apt-get >/dev/null 2>&1 || die "apt-get not found (this script needs a Debian-based system)"
    command -v dpkg >/dev/null 2>&1 || die "dpkg not found (this script needs a Debian-based system)"
    [ -r "$keyring" ] || die "$keyring missing: apt-get install debian-archive-keyring"

    state="$base/apt"
    sources="$state/etc/sources.list"
    mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/etc" "$base/deb"
    printf 'deb [signed-by=%s] %s %s main\n' "$keyring" "$mirror" "$suite" >"$sources"

    log "$suite: updating a private package index from $mirror"
    # shellcheck disable=SC2086 # $sandbox is empty or one option pair
    apt-get -q $sandbox \
        -o Dir::Etc::SourceList="$sources" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$state/lists" \
        -o Dir::Cache="$state/cache" \
        update >&2 || die "$suite: apt-get update of the private index failed (network or mirror?)"

    log "$suite: downloading linux-libc-dev"
    # `apt-get download` writes into the current directory.
    # shellcheck disable=SC2086 # $sandbox is empty or one option pair
    (cd "$base/deb" && rm -f linux-libc-dev_*.deb && apt-get -q $sandbox \
        -o Dir::Etc::SourceList="$sources" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$state/lists" \
        -o Dir::Cache="$state/cache" \
        download linux-libc-dev >&2) || die "$suite: apt-get download linux-libc-dev failed"

    deb="$(ls "$base/deb"/linux-libc-dev_*.deb 2>/dev/null | head -n 1)"
    [ -n "$deb" ] || die "$suite: no linux-libc-dev .deb in $base/deb after download"

    log "$suite: extracting $(basename "$deb")"
    rm -rf "$root.tmp"
    mkdir -p "$root.tmp"
    dpkg -x "$deb" "$root.tmp" || die "dpkg -x $deb failed"
    [ -f "$root.tmp/usr/include/linux/iommufd.h" ] \
        || die "$(basename "$deb") from $suite has no linux/iommufd.h; pick a newer suite"

    # The architecture headers (asm/) live in one multiarch directory per
    # architecture; link the host's in so that one -I directory is enough.
    multiarch="$( (dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || "${CC:-cc}" -print-multiarch 2>/dev/null) | head -n 1 || true)"
    [ -n "$multiarch" ] || multiarch="$(uname -m)-linux-gnu"
    [ -d "$root.tmp/usr/include/$multiarch/asm" ] || die "$suite: no $multiarch/asm directory in $(basename "$deb")"
    ln -s "$multiarch/asm" "$root.tmp/usr/include/asm"

    rm -rf "$root"
    mv "$root.tmp" "$root"
    log "$suite: headers ready in $include"
    printf '%s\n' "$include"
}

dirs=""
for suite in "$@"; do
    dir="$(fetch "$suite")"
    dirs="${dirs:+$dirs:}$dir"
done
printf '%s\n' "$dirs"
