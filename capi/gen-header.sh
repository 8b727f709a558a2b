#!/usr/bin/env bash
# Generates capi/include/userdma.h from capi/src with cbindgen (Debian's `cbindgen` package).
#
#   capi/gen-header.sh            # rewrite the header
#   capi/gen-header.sh --verify   # fail if the committed header differs from what cbindgen makes now
set -euo pipefail
cd "$(dirname "$0")"
command -v cbindgen >/dev/null || { echo "cbindgen is missing: apt-get install cbindgen" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cbindgen --quiet --config cbindgen.toml --crate userdma-capi --output "$out" .
if [ "${1:-}" = --verify ]; then
	if ! diff -u include/userdma.h "$out"; then
		echo "capi/include/userdma.h is not what cbindgen generates from capi/src: run capi/gen-header.sh and commit it" >&2
		exit 1
	fi
	echo "capi/include/userdma.h matches capi/src"
else
	cp "$out" include/userdma.h
	echo "wrote capi/include/userdma.h"
fi
