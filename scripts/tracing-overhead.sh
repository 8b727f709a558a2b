#!/usr/bin/env bash
# What the `tracing` feature costs when it is compiled in and nothing subscribes (the
# command-line tool's default: `--log` not given), against the same code without it:
#
#   scripts/tracing-overhead.sh                # the pipeline benchmark, 5 runs each way
#   scripts/tracing-overhead.sh --runs 9       # more runs (the medians settle)
#   scripts/tracing-overhead.sh --demo         # also `userdma demo` (the case study), 3 runs each
#   scripts/tracing-overhead.sh --runs 0 --demo   # the demo only
#   scripts/tracing-overhead.sh --json         # one JSON document on stdout
#
# The pipeline benchmark (infer/benches/pipeline.rs) is built twice, without and with
# `userdma-infer/tracing` (which turns on the driver's and the loopback device's), into
# separate target directories ($CARGO_TARGET_DIR/tracing-off and .../tracing-on, so neither
# build evicts the other or the default one). The two binaries then run alternately (off, on,
# off, on, ...: drift on a shared machine hits both), each pinned with taskset to the same CPUs
# ($CPUS, default all of them). From each run it takes the first table (frames/s and the
# driving thread's CPU µs per frame, per cost model and path) and criterion's estimates of one
# frame (pipeline/frame/depth2, pipeline/frame/naive), and prints per row the medians off and
# on, their ratio as time on ÷ off (frames/s off ÷ on; CPU and criterion time on ÷ off: above
# 1 is slower with the feature), the same ratio of each side's best run (the highest frames/s,
# the lowest time: the run least disturbed), and how far the runs of each side spread ((max -
# min) ÷ median): a ratio inside the spread is noise. The target is a ratio of at most 1.01.
# The zero-cost rows are three threads (the host's and the device's two units) polling each
# other on the CPUs given: on two CPUs a run now and then falls into a mode several times
# slower, in either build, which moves the medians by whole factors; the best-run ratio is the
# figure to read there.
#
# With --demo, the tool is built in release with and without its `tracing` feature
# (--no-default-features) into the same two directories and `userdma demo --json --seconds 1
# --no-owner` runs alternately: frames/s of the "before", "after" and "strict" runs and the
# process's CPU seconds per frame finished.
#
# Needs python3 (the medians and the JSON). Takes about two minutes per benchmark run on two
# cores, plus the two builds the first time.
set -euo pipefail
cd "$(dirname "$0")/.."

json=0
runs=5
demo=0
demo_runs=3
while [ $# -gt 0 ]; do
	case $1 in
	--json) json=1 ;;
	--runs)
		runs=$2
		shift
		;;
	--demo) demo=1 ;;
	--demo-runs)
		demo_runs=$2
		shift
		;;
	*)
		echo "usage: scripts/tracing-overhead.sh [--json] [--runs N] [--demo] [--demo-runs N]" >&2
		exit 2
		;;
	esac
	shift
done
cpus=${CPUS:-0-$(($(nproc) - 1))}
base=${CARGO_TARGET_DIR:-target}
work=$base/tracing-overhead
rm -rf "$work"
mkdir -p "$work"
say() { [ $json = 1 ] || echo "$@"; }
# Progress goes to stderr with --json, so stdout holds the document only.
note() { if [ $json = 1 ]; then echo "$@" >&2; else echo "$@"; fi; }

# bench_exe off|on: builds the pipeline benchmark, prints its executable.
bench_exe() {
	local features=()
	[ "$1" = on ] && features=(--features tracing)
	CARGO_TARGET_DIR=$base/tracing-$1 cargo bench --locked --quiet -p userdma-infer --bench pipeline \
		${features[@]+"${features[@]}"} --no-run --message-format=json |
		sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1
}

if [ "$runs" -gt 0 ]; then
	note "--- building the pipeline benchmark without and with the tracing feature"
	off_exe=$(bench_exe off)
	on_exe=$(bench_exe on)
	[ -x "$off_exe" ] && [ -x "$on_exe" ] || {
		echo "the benchmark did not build" >&2
		exit 1
	}
fi

for i in $(seq 1 "$runs"); do
	for side in off on; do
		exe=${side}_exe
		note "--- run $i/$runs, tracing $side (taskset -c $cpus)"
		CARGO_TARGET_DIR=$base/tracing-$side taskset -c "$cpus" "${!exe}" --bench \
			>"$work/bench-$side-$i.txt" 2>&1
	done
done

if [ $demo = 1 ]; then
	note "--- building the tool (release) without and with the tracing feature"
	CARGO_TARGET_DIR=$base/tracing-off cargo build --locked --quiet --release -p userdma-cli --no-default-features
	CARGO_TARGET_DIR=$base/tracing-on cargo build --locked --quiet --release -p userdma-cli
	for i in $(seq 1 "$demo_runs"); do
		for side in off on; do
			note "--- demo run $i/$demo_runs, tracing $side"
			TIMEFORMAT='%U %S'
			{ time taskset -c "$cpus" "$base/tracing-$side/release/userdma" demo --json --seconds 1 --no-owner \
				>"$work/demo-$side-$i.json" 2>/dev/null; } 2>"$work/demo-$side-$i.cpu"
		done
	done
fi

python3 - "$work" "$runs" "$demo" "$demo_runs" "$json" "$cpus" <<'EOF'
import json, re, statistics, sys
from pathlib import Path

work, runs, demo, demo_runs, as_json, cpus = (Path(sys.argv[1]), int(sys.argv[2]),
    sys.argv[3] == "1", int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6])
UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}

def bench_rows(text):
    """{row: value} of one benchmark run: the first table's frames/s and CPU µs per frame,
    criterion's point estimate of one frame in ns."""
    rows, section, name = {}, None, None
    for line in text.splitlines():
        if line.startswith("pipeline vs naive"):
            section = "table"
            continue
        if section == "table":
            m = re.match(r"^(zero|npu)\s+(depth \d|naive)\s+([\d.]+)\s+([\d.]+)", line)
            if m:
                rows[f"{m[1]} {m[2]} frames/s"] = float(m[3])
                rows[f"{m[1]} {m[2]} cpu us/frame"] = float(m[4])
            elif not line.strip():
                section = None
        m = re.match(r"^(pipeline/frame/\S+)", line)
        if m:
            name = m[1]
        m = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
        if m and name:
            rows[f"{name} ns"] = float(m[1]) * UNITS[m[2]]
            name = None
    return rows

def demo_rows(doc, cpu):
    rows = {f"demo {run} frames/s": doc[run]["total_fps"] for run in ("before", "after", "strict")}
    frames = sum(s["frames"] for run in ("before", "after", "strict") for s in doc[run]["streams"])
    user, system = (float(x) for x in cpu.split())
    rows["demo cpu ms/frame"] = (user + system) * 1e3 / max(frames, 1)
    return rows

def collect(kind, n, read):
    sides = {"off": [], "on": []}
    for i in range(1, n + 1):
        for side in sides:
            sides[side].append(read(side, i))
    return sides

def summarize(sides):
    out = []
    for row in sides["off"][0]:
        off = [r[row] for r in sides["off"] if row in r]
        on = [r[row] for r in sides["on"] if row in r]
        if not off or not on:
            continue
        mo, mn = statistics.median(off), statistics.median(on)
        higher_is_better = row.endswith("frames/s")
        ratio = mo / mn if higher_is_better else mn / mo
        best = max(off) / max(on) if higher_is_better else min(on) / min(off)
        spread = lambda v, m: (max(v) - min(v)) / m if m else 0.0
        out.append({"row": row, "off": mo, "on": mn, "ratio": ratio, "best_ratio": best,
                    "spread_off": spread(off, mo), "spread_on": spread(on, mn), "runs": len(off)})
    return out

bench = summarize(collect("bench", runs, lambda side, i: bench_rows(
    (work / f"bench-{side}-{i}.txt").read_text()))) if runs else []
result = {"cpus": cpus, "runs": runs, "target": 1.01, "bench": bench}
if demo:
    result["demo_runs"] = demo_runs
    result["demo"] = summarize(collect("demo", demo_runs, lambda side, i: demo_rows(
        json.loads((work / f"demo-{side}-{i}.json").read_text()),
        (work / f"demo-{side}-{i}.cpu").read_text())))
if as_json:
    print(json.dumps(result, indent=2))
    sys.exit(0)
print(f"\ntracing compiled in, no subscriber (on) vs compiled out (off): medians of {runs} benchmark runs"
      f" and {demo_runs if demo else 0} demo runs each, taskset -c {cpus}")
print("ratio: time on ÷ off (frames/s off ÷ on), of the medians and of the best runs; spread: (max - min) ÷ median"
      " of each side's runs; target: ratio ≤ 1.01")
print(f"{'row':<30} {'off':>11} {'on':>11} {'ratio':>7} {'best':>7} {'spread off':>11} {'spread on':>10}")
for r in result["bench"] + result.get("demo", []):
    print(f"{r['row']:<30} {r['off']:>11.1f} {r['on']:>11.1f} {r['ratio']:>7.3f} {r['best_ratio']:>7.3f}"
          f" {r['spread_off']:>10.1%} {r['spread_on']:>10.1%}")
EOF
