#!/usr/bin/env bash
# Builds the C API and installs it under PREFIX: lib/libuserdma.so.X.Y.Z (with the
# libuserdma.so.X SONAME link and the libuserdma.so development link), lib/libuserdma.a,
# include/userdma.h and lib/pkgconfig/userdma.pc. No make, no cargo-c.
#
#   scripts/capi-install.sh /usr/local            # release build, then install
#   PROFILE=debug scripts/capi-install.sh /tmp/u  # the debug build (what the tests use)
#
# Then: cc app.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs userdma)
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:?usage: scripts/capi-install.sh PREFIX}
profile=${PROFILE:-release}
case $profile in
release) cargo build --locked --release -p userdma-capi ;;
debug) cargo build --locked -p userdma-capi ;;
*) echo "PROFILE is release or debug, not $profile" >&2; exit 1 ;;
esac
target=${CARGO_TARGET_DIR:-target}/$profile
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
major=${version%%.*}
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$target/libuserdma.so" "$prefix/lib/libuserdma.so.$version"
ln -sf "libuserdma.so.$version" "$prefix/lib/libuserdma.so.$major"
ln -sf "libuserdma.so.$major" "$prefix/lib/libuserdma.so"
install -m 0644 "$target/libuserdma.a" "$prefix/lib/libuserdma.a"
install -m 0644 capi/include/userdma.h "$prefix/include/userdma.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" capi/userdma.pc.in >"$prefix/lib/pkgconfig/userdma.pc"
echo "installed userdma $version ($profile) under $prefix"
