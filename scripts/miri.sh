#!/usr/bin/env bash
# Runs the unit tests of the pure and unsafe-heavy code under Miri, the interpreter that checks
# every memory access, alignment, aliasing (Stacked Borrows), data race and uninitialised read
# against Rust's rules.
#
#   scripts/miri.sh                  # what CI runs
#   scripts/miri.sh --all            # also the end-to-end pool tests CI leaves out (about half an hour)
#   scripts/miri.sh -- ring::        # only tests matching a filter (passed to every crate)
#
# Miri needs a nightly toolchain; this is the only place the project uses one (everything else
# builds on stable). The component is installed when missing, and the step fails, loudly, when
# it cannot be: it never skips.
#
# What runs: the unit tests of the driver (`userdma`: pool geometry, block stacks, the buddy
# allocator, owned buffers, rings, slices, the IOVA allocator, the software IOMMU, MMIO blocks,
# parsers of sysfs and kernel replies; of the end-to-end pool tests, the batch ones), the kernel
# ABI (`userdma-sys`), the planner (`userdma-plan`), the C API's handle slots and quiescence
# (`userdma-capi`), the device owner's protocol and channels (`userdma-owner`), and the loopback
# device's registers, descriptors, operations, reference models and activity records
# (`userdma-loopback`). Under Miri a region's pages come from the interpreter's allocator
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

all=0
if [ "${1:-}" = "--all" ]; then
	all=1
	shift
fi
filter=()
if [ "${1:-}" = "--" ]; then
	shift
	filter=("$@")
fi
# CI's run (no --all, no filter): the driver's tests split over the two lanes.
split=0
if [ "$all" = 0 ] && [ ${#filter[@]} -eq 0 ]; then
	split=1
fi

# -Zmiri-disable-isolation: the tests read the fake sysfs trees and files they write to
# temporary directories, and the clock; Miri passes those calls to the host.
# -Zmiri-strict-provenance: no pointer is made from an integer (an address a pointer was not
# derived from is an error, not a guess).
export MIRIFLAGS="-Zmiri-disable-isolation -Zmiri-strict-provenance ${MIRIFLAGS:-}"
# Two lanes, one per CPU (the interpreter is single-threaded): most of the driver in one; the
# other crates, then the rest of the driver, in the other, so that the two end close together.
# The other crates build in a target directory of their own, so neither lane waits on the
# other's build lock. Each lane's output goes to its own log, printed when both are done.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# One cargo invocation: LANE NAME PACKAGE [libtest arguments...].
run() {
	local lane=$1 name=$2 crate=$3 rc
	shift 3
	echo "--- Miri: $name" >>"$dir/$lane.log"
	set +e
	cargo "+$toolchain" miri test --locked -p "$crate" --lib -- -Zunstable-options --report-time \
		"$@" ${filter[@]+"${filter[@]}"} >>"$dir/$lane.log" 2>&1
	rc=$?
	set -e
	if [ "$rc" != 0 ]; then
		echo "$name (exit $rc)" >>"$dir/failed"
	fi
}

# The driver's end-to-end pool tests (src/pool/tests.rs: pools over 4 to 8 MiB regions, whole
# buffers written and read back) take from 10 s to over 3 minutes each interpreted; CI runs
# the batch tests among them (a batch allocated, freed on another thread, refused), `--all` the
# others too. Every other module's tests run in full.
# Five ring tests end with work in flight on a device they give no way to stop, so the queue's
# drop leaks its memory on purpose (a device may still write it): they run with Miri's leak
# check off, every other test with it on.
leaky=(
	ring::tests::a_failed_doorbell_leaves_the_descriptor_queued_for_the_next_flush
	ring::tests::a_misbehaving_device_is_an_error
	ring::tests::drop_leaks_when_the_device_cannot_be_stopped
	ring::tests::post_and_flush_rings_once_for_it_and_what_was_posted_before
	ring::tests::shutdown_hands_back_completed_and_aborted_work
)
driver() {
	local skip=() t
	for t in "${leaky[@]}"; do
		skip+=(--skip "$t")
	done
	if [ "$split" = 0 ]; then
		# Every test (or every one the filter names, pool tests included), once.
		run driver "userdma" userdma "${skip[@]}"
	else
		# The pool's geometry and batch tests and the PCI parsers run in the other lane, last.
		run driver "userdma (all but src/pool/tests.rs, the pool's geometry, PCI)" userdma \
			--skip pool::tests:: --skip pool::geometry:: --skip pci:: "${skip[@]}"
	fi
	MIRIFLAGS="$MIRIFLAGS -Zmiri-ignore-leaks" run driver \
		"userdma: queues that leak their memory on purpose (leak check off)" userdma --exact "${leaky[@]}"
}
others() {
	local crate
	for crate in userdma-sys userdma-plan userdma-capi userdma-owner userdma-loopback; do
		CARGO_TARGET_DIR=target/miri-others run others "$crate" "$crate"
	done
	# Some of the driver's tests, in the driver's target directory: built there long before
	# (cargo holds its lock while it builds, not while the tests run), so no second build.
	if [ "$split" = 1 ]; then
		run others "userdma: the pool's geometry and batch tests, PCI" userdma \
			pool::geometry:: pool::tests::a_batch_ pci:: --skip pool::tests::a_batch_of_a_coloured_pool
	fi
}
echo "--- Miri: the driver, and the other crates beside it (about 5 minutes)"
driver &
lane1=$!
others &
lane2=$!
wait "$lane1" "$lane2" || true
log="$dir/all.log"
for lane in driver others; do
	grep -E '^(--- Miri|test |test result|error|running|failures)|panicked|Undefined Behavior' "$dir/$lane.log" || true
	cat "$dir/$lane.log" >>"$log"
done
status=0
if [ -s "$dir/failed" ]; then
	status=1
	echo "--- Miri FAILED in: $(tr '\n' ';' <"$dir/failed")"
	echo "--- the end of each failing lane's log:"
	tail -n 80 "$dir/driver.log" "$dir/others.log"
fi

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
