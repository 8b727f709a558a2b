# shellcheck shell=bash
# The package and feature set of every optimized (release) build CI makes: the planner, the
# soaks and the benchmarks (scripts/test.sh) and the guest suite's examples (tests/guest/run.sh).
# One set, so the driver and the layers above it are built once in release for all of them
# (each build with a `-p` set of its own rebuilds them for its feature set). Sourced from the
# repository's root.
release_set=(-p userdma -p userdma-loopback -p userdma-plan -p userdma-infer -p userdma-capi
	-p userdma-owner --features userdma-owner/server)
