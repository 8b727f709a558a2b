#!/usr/bin/env bash
# Runs every test userdma has, on a fresh Debian machine as root, installing what is missing first.
#
#   scripts/test.sh            # everything (what CI runs)
#   FUZZ_SECONDS=2 scripts/test.sh   # shorter fuzz smoke runs while developing
#
# Steps: install prerequisites, fmt check, clippy -D warnings, docs -D warnings, the library's
# and the command-line tool's (cli/) unit + integration tests under AddressSanitizer (with
# LeakSanitizer) and under ThreadSanitizer (scripts/sanitize.sh), and in a plain debug build its doc tests and what the
# sanitizers cannot run, and the other crates' tests (the kernel ABI check against three uapi
# header sets: the system's, Debian 13's and Debian 13 backports'; tests on real hugepages
# reserve and restore them), the C API (scripts/capi-test.sh: the generated header and the
# exported symbols checked, C tests under sanitizers and Valgrind, the C example through
# pkg-config), the loom models, Miri over the unit tests of the pure and unsafe-heavy code
# (scripts/miri.sh, the one step on a nightly toolchain), the release soaks (the loopback device, the pipeline, faults
# injected at random), every benchmark once in criterion's test mode (that they run, not how
# fast: speed is read from `cargo bench`), the guest suite (real PCI device models behind an
# emulated IOMMU in QEMU guests, scripts/guest-test.sh), the main job, and a short run of every
# fuzz target. Any failing step fails the run; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS=${FUZZ_SECONDS:-4}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# Every build here is made once: incremental compilation would only add its bookkeeping.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
T0=$(date +%s)
passed=0
failed=0
failed_steps=()

# Each step's heading says how long the run has taken and how much disk is left, so a machine
# that runs out of either says so where it happens.
disk_free() { df -Pk . | awk 'NR == 2 { printf "%.1f GiB free", $4 / 1048576 }'; }
log() { printf '\n=== [%4ss, %s] %s\n' "$(($(date +%s) - T0))" "$(disk_free)" "$*"; }

# A whole run builds the workspace about ten ways (plain, two sanitizers, loom, Miri, release,
# the C API, the guests, the fuzzers): about 12 GiB if every build were kept. Under CI (or with
# PRUNE_BUILDS=1) each build directory is removed as soon as the last step that uses it is done,
# so the run needs about 4 GiB at its peak; a developer's run keeps them for the next one.
PRUNE_BUILDS=${PRUNE_BUILDS:-${CI:-false}}
case $PRUNE_BUILDS in 1 | true | yes) PRUNE_BUILDS=1 ;; *) PRUNE_BUILDS=0 ;; esac
prune() { # prune DIR... : removes build directories no later step uses (when pruning)
	[ "$PRUNE_BUILDS" = 1 ] || return 0
	rm -rf "$@"
}
# CI never runs a debugger: line tables keep file and line in backtraces and halve the plain
# build's size.
if [ "$PRUNE_BUILDS" = 1 ]; then
	export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}
fi

# step NAME CMD...: runs one step, records its result, keeps going so one run reports every failure.
step() {
	local name=$1
	shift
	log "$name"
	if "$@"; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
		failed_steps+=("$name")
		echo "--- step FAILED: $name"
	fi
}

# ---- prerequisites --------------------------------------------------------------------------
APT_UPDATED=0
apt_install() { # apt_install PKG... : installs the packages that are not installed yet
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	if [ "$(id -u)" != 0 ]; then
		echo "missing packages: ${missing[*]} — install them (apt-get install ${missing[*]}) or run as root" >&2
		return 1
	fi
	if [ $APT_UPDATED = 0 ]; then
		apt-get update -qq
		APT_UPDATED=1
	fi
	echo "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
		--no-install-recommends "${missing[@]}" >/dev/null
}

cargo_tool() { # cargo_tool BINARY CRATE : installs a cargo tool if it is not on PATH
	command -v "$1" >/dev/null 2>&1 && return 0
	echo "cargo install $2"
	cargo install --locked --quiet "$2"
}

prerequisites() {
	# gcc + linux-libc-dev: the kernel ABI check compiles a C program against the uapi headers;
	# pci.ids: vendor and device names in `userdma list`.
	# python3-pip: scripts/onnx-models.sh downloads the onnx wheel (its model-zoo graphs are the
	# ONNX reader's test data).
	# libdpdk-dev + pkg-config: the benchmarks' DPDK baseline (bench-support/, a dev-dependency
	# only: the library never links DPDK).
	apt_install gcc libc6-dev linux-libc-dev pci.ids dpkg-dev xz-utils python3-pip libdpdk-dev pkg-config
	# The C API step: its header generator, the C++17 header check, Valgrind, pkg-config for
	# the C example (binutils' nm and readelf come with dpkg-dev).
	apt_install g++ cbindgen valgrind pkg-config
	rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
	# The standard library's source: the sanitizer steps rebuild it instrumented (-Zbuild-std).
	rustup component list --installed 2>/dev/null | grep -q '^rust-src' || rustup component add rust-src
	cargo_tool cargo-fuzz cargo-fuzz
	# The newest uapi headers (with iommufd), fetched without installing them.
	USERDMA_UAPI_INCLUDE=$(scripts/uapi-headers.sh | tail -n 1)
	export USERDMA_UAPI_INCLUDE
	echo "extra uapi headers: $USERDMA_UAPI_INCLUDE"
	# The model-zoo graphs in the onnx wheel, fetched without installing it (plan/tests/plan_onnx.rs).
	USERDMA_ONNX_MODELS=$(scripts/onnx-models.sh | tail -n 1)
	export USERDMA_ONNX_MODELS
	echo "ONNX models: $USERDMA_ONNX_MODELS"
}
# hold_gigantic_page: two tests map a 1 GiB hugepage. The kernel can only build one from a free,
# contiguous, aligned GiB of memory, which a machine that has been compiling for a while rarely
# has (it then grants 0 pages). So one page is reserved here, before the installs and builds
# fragment memory (dropping clean caches and compacting first), held for the run, and given back
# at exit. The tests find it free and use it; they still reserve it themselves when run alone.
GIGANTIC=/sys/kernel/mm/hugepages/hugepages-1048576kB
GIGANTIC_BEFORE=
hold_gigantic_page() {
	[ "$(id -u)" = 0 ] && [ -d $GIGANTIC ] || return 0
	local total free
	total=$(cat $GIGANTIC/nr_hugepages)
	free=$(cat $GIGANTIC/free_hugepages)
	[ "$free" -ge 1 ] && return 0
	sync
	echo 3 >/proc/sys/vm/drop_caches
	echo 1 >/proc/sys/vm/compact_memory
	GIGANTIC_BEFORE=$total
	echo $((total + 1)) >$GIGANTIC/nr_hugepages
	trap 'echo "$GIGANTIC_BEFORE" >$GIGANTIC/nr_hugepages' EXIT
	if [ "$(cat $GIGANTIC/free_hugepages)" -ge 1 ]; then
		echo "holding one 1 GiB hugepage for the tests that map one (given back at exit)"
	else
		echo "the kernel granted no 1 GiB hugepage (memory too fragmented); the two tests that map one will fail" >&2
	fi
}

log "prerequisites"
hold_gigantic_page
prerequisites

# ---- checks ---------------------------------------------------------------------------------
step "cargo fmt --check" cargo fmt --all -- --check
step "cargo fmt --check (fuzz)" cargo fmt --manifest-path fuzz/Cargo.toml -- --check
# The workspace build has the `tracing` feature on (the tool turns it on); the driver alone is
# linted with its lean defaults, and the loopback device and the inference layer without it.
step "cargo clippy -D warnings" sh -c 'cargo clippy --workspace --all-targets --locked -- -D warnings &&
	cargo clippy -p userdma --all-targets --locked -- -D warnings &&
	cargo clippy -p userdma-loopback -p userdma-infer --all-targets --locked -- -D warnings'
step "cargo doc -D warnings" env RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --locked
# The library's and the tool's unit and integration tests run in the two sanitizer steps below, instrumented
# builds with the dev profile's checks; this plain debug run keeps what those cannot run (the
# doc tests; the two mlock tests and the system-call witness, which the sanitizer runtimes
# defeat; the README's example, run through a nested cargo) and the other crates (the kernel ABI check, the C API's and the benches' unit tests).
step "cargo test (doc tests, mlock and system-call witnesses; kernel ABI, C API, device owner and bench-support crates)" \
	sh -c 'cargo test --locked --workspace --exclude userdma --exclude userdma-loopback --exclude userdma-infer --exclude userdma-cli &&
		cargo test --locked -p userdma --doc && cargo test --locked -p userdma-loopback --doc && cargo test --locked -p userdma-infer --doc &&
		cargo test --locked -p userdma --features serde,io-uring --lib --test irq_waiter --test memory_sysfs &&
		cargo test --locked -p userdma --test memory_region --test pool_steady_state --test readme &&
		cargo test --locked -p userdma-owner --features server,tracing'
step "C API (header, symbols, C tests under ASan+UBSan and Valgrind, examples/c)" scripts/capi-test.sh
# The plain debug build (clippy's, the tests', the C API's) has no later user.
prune target/debug target/capi
step "AddressSanitizer + LeakSanitizer: the library's and the tool's unit and integration tests" scripts/sanitize.sh address
prune target/san-address
step "ThreadSanitizer: the libraries' unit and integration tests (the tool's run under AddressSanitizer)" scripts/sanitize.sh thread
prune target/san-thread
# One cargo invocation for the four packages' models, so the driver is built once for them; the
# filters select the same 47 tests the separate runs did (the ring's index arithmetic among them).
step "loom models (pool, ring, C API handle slots and quiescence, the loopback device's and the device owner's wake-up handshakes)" \
	env RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
	cargo test --release --locked -p userdma -p userdma-loopback -p userdma-owner -p userdma-capi --lib -- \
	pool:: ring:: wake:: chan:: slots:: quiesce::
prune target/loom
# The one use of a nightly toolchain: Miri (scripts/miri.sh installs its component when missing
# and fails when it cannot).
step "Miri: unit tests of the pure and unsafe-heavy code (pools, rings, slices, IOVAs, the planner, C API slots, the owner protocol)" scripts/miri.sh
prune target/miri target/miri-others
# The optimized steps name one package and feature set, and the release profile (the benchmarks
# too, with `--profile release`), so they and the guest suite's build share one build.
source scripts/release-set.sh
step "planner on the MiniMalloc instances, optimized" cargo test --release --locked "${release_set[@]}" --test plan
step "loopback soak, optimized (10^6 transfers)" cargo test --release --locked "${release_set[@]}" --test loopback_soak
step "pipeline soak, optimized (10^5 frames)" cargo test --release --locked "${release_set[@]}" --test pipeline_soak
step "fault soak, optimized (10^7 round trips, every fault kind at about 1 in 10^4)" \
	cargo test --release --locked "${release_set[@]}" --test fault_soak -- --nocapture
step "benchmarks, test mode (each once; ratio tables in one short round)" \
	cargo bench --profile release --locked "${release_set[@]}" --bench pool --bench ring --bench loopback --bench plan \
	--bench pipeline --bench sched --bench stage --bench capi --bench owner -- --test
step "guest suite: real PCI devices (edu, NVMe) in QEMU guests" scripts/guest-test.sh
step "main job (README)" cargo run --release --locked --quiet -- demo
step "PCI listing (docs/cli.md)" cargo run --release --locked --quiet -- list
# The fuzzers build into fuzz/target; the release build has no later user.
prune target/release target/guest

# One fuzz target for FUZZ_SECONDS: the working corpus (ignored by git) first, where new inputs
# go; then the committed seeds, inputs that once found a defect, so every run replays them.
fuzz_one() {
	local t=$1 logf=target/fuzz-logs/$1.log
	local dirs=("corpus/$t")
	[ -d "fuzz/seeds/$t" ] && dirs+=("seeds/$t")
	mkdir -p "fuzz/corpus/$t"
	(cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run --release "$t" "${dirs[@]}" -- \
		-max_total_time="$FUZZ_SECONDS" -print_final_stats=1) >"$logf" 2>&1
}

# Every target, FUZZ_JOBS at a time (default: one per CPU, each fuzzer is single-threaded), so
# each gets its whole budget on a core of its own and the step takes the sum over the CPUs.
fuzz_smoke() {
	local targets t logf jobs
	targets=$(cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz list)
	[ -n "$targets" ] || { echo "no fuzz targets found in fuzz/"; return 1; }
	(cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz build --release) || return 1
	mkdir -p target/fuzz-logs
	jobs=${FUZZ_JOBS:-$(nproc)}
	[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
	local pids=() names=() bad=()
	# Waits for the oldest running target and reports it.
	reap() {
		local name=${names[0]}
		if wait "${pids[0]}"; then
			echo "fuzz $name: $(grep -E '^stat::number_of_executed_units|^Done' \
				"target/fuzz-logs/$name.log" | tr '\n' ' ')"
		else
			bad+=("$name")
			echo "fuzz $name: FAILED"
		fi
		pids=("${pids[@]:1}")
		names=("${names[@]:1}")
	}
	for t in $targets; do
		echo "fuzz $t for ${FUZZ_SECONDS}s (log: target/fuzz-logs/$t.log)"
		fuzz_one "$t" &
		pids+=($!)
		names+=("$t")
		[ "${#pids[@]}" -lt "$jobs" ] || reap
	done
	while [ "${#pids[@]}" -gt 0 ]; do reap; done
	for t in "${bad[@]}"; do
		logf=target/fuzz-logs/$t.log
		grep -v '^#[0-9]' "$logf" | tail -n 60
		echo "fuzz target $t FAILED; the crashing input is under fuzz/artifacts/$t/"
	done
	[ "${#bad[@]}" -eq 0 ]
}
step "fuzz smoke (${FUZZ_SECONDS}s per target, ${FUZZ_JOBS:-$(nproc)} at a time)" fuzz_smoke

log "summary"
[ ${#failed_steps[@]} -eq 0 ] || printf 'failed step: %s\n' "${failed_steps[@]}"
echo "steps: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
