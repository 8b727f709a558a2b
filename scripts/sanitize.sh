#!/usr/bin/env bash
# Runs the unit and integration tests of the driver (the userdma package), the loopback NPU
# (userdma-loopback, loopback/), the inference layer (userdma-infer, infer/) and the
# command-line tool (userdma-cli, cli/), under a sanitizer (scripts/test.sh runs both):
#
#   scripts/sanitize.sh address          # AddressSanitizer, with LeakSanitizer
#   scripts/sanitize.sh thread           # ThreadSanitizer
#   scripts/sanitize.sh thread --test sched   # extra arguments go to `cargo test`
#
# By default the unit tests of the five packages' libraries and binaries and all their
# integration tests run under AddressSanitizer; under ThreadSanitizer the same but the tool's
# (userdma-cli): a single-threaded front end whose tests run it as a child process, so a race
# detector adds nothing there that the address run does not check. Neither runs the examples'
# unit tests (the guest suite's parsers, the NVMe example's): single-threaded safe code that the
# plain run tests, whose instrumented build (the guest suite is a large example) was about a
# minute of each step. Target arguments among the extra ones (`--test sched`, `--lib`,
# `--bin userdma`, ...) run those targets instead.
#
# On stable Rust: RUSTC_BOOTSTRAP=1 unlocks `-Zsanitizer` and `-Zbuild-std`, and the standard
# library is rebuilt instrumented from the rust-src component (installed here if missing). An
# uninstrumented std would hide its own memory accesses and, for ThreadSanitizer, its
# synchronization (every Mutex, channel and thread join would look like none), and rustc refuses
# to link sanitized crates against it anyway. Each sanitizer builds into target/san-<name>, in
# the `sanitize` profile (Cargo.toml: the dev profile's checks at opt-level 1).
#
# `--cfg userdma_sanitize="<name>"` tells the code it is instrumented. The library uses it in one
# place: under ThreadSanitizer its fences on device-shared memory also tell the sanitizer what
# they order (src/sync.rs, `tsan_release`), because ThreadSanitizer does not model fences. Two
# tests of mlock's effect are ignored under it (tests/memory_region.rs) and the system-call
# witness of tests/pool_steady_state.rs is off: the sanitizer runtimes make mlock a no-op and
# system calls of their own, so what those check cannot hold there; the plain run checks them.
#
# Any report fails the run: ASan and LSan make the test process exit non-zero, TSan with
# halt_on_error. Deliberate leaks (memory a device may still write, kept forever) are not leaks
# to LSan: they stay reachable (src/memory/keep.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

san=${1:-}
case "$san" in
address | thread) shift ;;
*)
	echo "usage: scripts/sanitize.sh address|thread [cargo test arguments]" >&2
	exit 2
	;;
esac

rustup component list --installed 2>/dev/null | grep -q '^rust-src' || rustup component add rust-src
host=$(rustc -vV | sed -n 's/^host: //p')

flags="-Zsanitizer=$san --cfg userdma_sanitize=\"$san\""
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="$flags"
export RUSTDOCFLAGS="$flags"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/san-$san"
# The soaks run at full size in their own release steps of scripts/test.sh; here they take the
# same paths (every queue, batch size and fault kind) a few ten thousand times, which is what the
# sanitizers' slowdown leaves room for.
export USERDMA_SOAK_TRANSFERS=${USERDMA_SOAK_TRANSFERS:-20000}
export USERDMA_FAULT_SOAK_TRANSFERS=${USERDMA_FAULT_SOAK_TRANSFERS:-20000}
# The loopback device's process (tests that run it out of process) is the sanitized binary of
# this build: the test binary itself, re-executed (tests/common/device_process.rs).
case "$san" in
address)
	# detect_stack_use_after_return: also stack frames used after they returned.
	export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_string_checks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
	;;
thread)
	# halt_on_error: a race fails the test that raced, at once, with its report on stderr.
	export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
	;;
esac

# The packages, and the targets: the caller's, if it names any (before a `--`), else every unit
# and integration test (`--tests` would otherwise widen a `--test NAME` to all of them), not the
# examples' unit tests; under ThreadSanitizer not the tool's either (see the top of this file).
packages=(-p userdma -p userdma-loopback -p userdma-infer -p userdma-owner -p userdma-cli)
targets=(--lib --bins --test '*')
if [ "$san" = thread ]; then
	packages=(-p userdma -p userdma-loopback -p userdma-infer -p userdma-owner)
	targets=(--lib --test '*')
fi
for arg in "$@"; do
	case "$arg" in
	--) break ;;
	--lib | --bins | --bin | --bin=* | --tests | --test | --test=* | --examples | --example | --example=* | --all-targets)
		targets=()
		break
		;;
	esac
done

echo "--- $san sanitizer: unit and integration tests of ${packages[*]} ($host, $CARGO_TARGET_DIR)"
# tests/readme.rs is left to the plain run (scripts/test.sh): it builds and runs the README's
# example with a nested cargo, which here would build the library a second time (about 100 s).
# --no-fail-fast: one failing test binary does not hide what the others would report.
# --features userdma-infer/tracing,userdma-owner/tracing: the `tracing` feature of the four
# libraries (the tool's default turns it on anyway), so the tests of their spans and events
# (tests/tracing_events.rs, infer/tests/tracing_events.rs, owner/tests/owner_events.rs) run
# here; without it `--test '*'` refuses the owner's, which requires the feature.
exec cargo test -Zbuild-std --target "$host" --profile sanitize --locked --no-fail-fast "${packages[@]}" --features userdma-infer/tracing,userdma-owner/tracing ${targets[@]+"${targets[@]}"} \
	"$@" -- --skip readme_first_transfer_is_the_example_and_it_runs
