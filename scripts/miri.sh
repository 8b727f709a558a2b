#!/usr/bin/env bash
# Runs the unit tests of the pure and unsafe-heavy code under Miri, the interpreter that checks
# every memory access, alignment, aliasing (Stacked Borrows), data race and uninitialised read
# against Rust's rules.
#
#   scripts/miri.sh                  # what CI runs
#   scripts/miri.sh -- ring::        # only tests matching a filter (passed to every crate)
#
# Miri needs a nightly toolchain; this is the only place the project uses one (everything else
# builds on stable). The component is installed when missing, and the step fails, loudly, when
# it cannot be: it never skips.
#
# What runs: every unit test of the driver (`userdma`: pools, block stacks, caches, rings,
# slices, the IOVA allocator, the software IOMMU, MMIO blocks, parsers of sysfs and kernel
# replies), the planner (`userdma-plan`), the kernel ABI (`userdma-sys`), the C API's handle
# slots and tables (`userdma-capi`), the device owner's protocol (`userdma-owner`), the loopback
# device's activity records and cost model (`userdma-loopback`) and the inference layer's trace
# ring (`userdma-infer`). Under Miri a region's pages come from the interpreter's allocator
# (src/memory/shim_miri.rs). What Miri cannot run (system calls it does not emulate: poll,
# ioctl, memfd, mmap of a file, sockets; device processes) is marked
# `#[cfg_attr(miri, ignore = "Miri: ...")]` with the reason, and counted below; long tests run a
# smaller number of rounds under `cfg(miri)` (each says so where it picks its count).
set -euo pipefail
cd "$(dirname "$0")/.."

toolchain=${MIRI_TOOLCHAIN:-nightly}
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
	echo "error: Miri needs the $toolchain toolchain, which is not installed:" >&2
	echo "       rustup toolchain install $toolchain --profile minimal --component miri,rust-src" >&2
	exit 1
fi
if ! rustup component list --toolchain "$toolchain" --installed 2>/dev/null | grep -q '^miri'; then
	echo "--- installing Miri for $toolchain"
	if ! rustup component add miri rust-src --toolchain "$toolchain"; then
		echo "error: could not install Miri for $toolchain (rustup component add miri --toolchain $toolchain failed above);" >&2
		echo "       pick a nightly that has it: MIRI_TOOLCHAIN=nightly-YYYY-MM-DD scripts/miri.sh" >&2
		exit 1
	fi
fi
rustup run "$toolchain" rustc --version
cargo "+$toolchain" miri --version
cargo "+$toolchain" miri setup

filter=()
if [ "${1:-}" = "--" ]; then
	shift
	filter=("$@")
fi

# -Zmiri-disable-isolation: the tests read the fake sysfs trees and files they write to
# temporary directories, and the clock; Miri passes those calls to the host.
export MIRIFLAGS="-Zmiri-disable-isolation ${MIRIFLAGS:-}"
# Miri's own target directory (target/miri) keeps its builds apart from the stable ones.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
for crate in userdma userdma-sys userdma-plan userdma-capi userdma-owner userdma-loopback; do
	echo "--- Miri: $crate"
	set +e
	cargo "+$toolchain" miri test --locked -p "$crate" --lib -- ${filter[@]+"${filter[@]}"} 2>&1 | tee -a "$log" |
		grep -E '^(test |test result|error|running|failures)|panicked|Undefined Behavior'
	rc=${PIPESTATUS[0]}
	set -e
	if [ "$rc" != 0 ]; then
		status=1
		echo "--- Miri: $crate FAILED (exit $rc)"
	fi
done

python3 - "$log" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
ran = sum(int(m) for m in re.findall(r"test result: \w+\. (\d+) passed", text))
failed = sum(int(m) for m in re.findall(r"(\d+) failed", " ".join(re.findall(r"test result: .*", text))))
ignored_miri = len(re.findall(r"\.\.\. ignored, Miri:", text))
ignored_other = len(re.findall(r"\.\.\. ignored(?!, Miri:)", text))
print(f"Miri: {ran} tests passed, {failed} failed; {ignored_miri} ignored because Miri cannot run them "
      f"(reasons in the list above), {ignored_other} ignored in every build")
PY
exit $status
