#!/usr/bin/env python3
"""Draws a window of a userdma trace (the Chrome trace-event JSON that `--trace FILE` writes)
as an SVG: one lane per device unit and per stream, a bar per slice coloured by stream,
context switches as red ticks with their SRAM refill. For docs and reviews where Perfetto's UI
(ui.perfetto.dev, which opens the same file) is not at hand. Standard library only.

    scripts/trace-svg.py TRACE.json OUT.svg [--from MS] [--span MS]
"""

import argparse
import json
import sys

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--from", dest="start", type=float, default=None,
                   help="window start, ms from the trace's first slice (default: the middle)")
    p.add_argument("--span", type=float, default=200.0, help="window length in ms")
    args = p.parse_args()
    with open(args.trace) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"]
               for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    procs = {e["pid"]: e["args"]["name"]
             for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    slices = [e for e in events if e.get("ph") == "X"]
    if not slices:
        sys.exit("no slices in the trace")
    first = min(e["ts"] for e in slices)
    last = max(e["ts"] + e["dur"] for e in slices)
    start = first + (args.start * 1000 if args.start is not None
                     else max(0.0, (last - first) / 2 - args.span * 500))
    end = start + args.span * 1000

    # Lanes: the device units, then each stream's frames (async begin/end pairs).
    lanes = []
    units = [(k, n) for k, n in sorted(threads.items()) if n in ("copy unit", "compute unit")]
    several = len({pid for (pid, _), _ in units}) > 1
    for (pid, tid), name in units:
        lanes.append(((pid, tid), f"{procs.get(pid, pid).split(':')[0]}: {name}" if several else name))
    frames = {}
    opened = {}
    for e in events:
        if e.get("cat") != "frame" or e["name"] in ("queued", "on device"):
            continue
        if e["ph"] == "b":
            opened[e["id"]] = e
        elif e["ph"] == "e" and e["id"] in opened:
            b = opened.pop(e["id"])
            frames.setdefault(b["args"]["stream"], []).append((b["ts"], e["ts"], b["name"]))
    streams = sorted(frames)
    colour = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(streams)}
    for s in streams:
        lanes.append((("stream", s), f"frames of {s}"))

    width, left, lane_h, top = 1200, 150, 34, 40
    scale = (width - left - 20) / (end - start)
    height = top + lane_h * len(lanes) + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="14">{args.trace.split("/")[-1]}: '
           f'{args.span:.0f} ms from {(start - first) / 1000:.0f} ms (device units as the device '
           f'timed them; red: context switch, label: SRAM refill)</text>']

    def x(t):
        return left + (min(max(t, start), end) - start) * scale

    for i, (key, label) in enumerate(lanes):
        y = top + i * lane_h
        out.append(f'<text x="10" y="{y + lane_h / 2 + 4}">{label}</text>')
        out.append(f'<line x1="{left}" y1="{y + lane_h}" x2="{width - 20}" y2="{y + lane_h}" '
                   f'stroke="#ddd"/>')
        if key[0] == "stream":
            bars = [(b, e, n, key[1]) for b, e, n in frames[key[1]]]
        else:
            bars = [(s["ts"], s["ts"] + s["dur"], s["name"], s["args"].get("stream"))
                    for s in slices if (s["pid"], s["tid"]) == key]
        for b, e, name, stream in bars:
            if e < start or b > end:
                continue
            w = max(x(e) - x(b), 0.5)
            fill = colour.get(stream, "#999")
            out.append(f'<rect x="{x(b):.2f}" y="{y + 6}" width="{w:.2f}" height="{lane_h - 12}" '
                       f'fill="{fill}" stroke="white" stroke-width="0.3"><title>{name}</title></rect>')
        if key[0] != "stream":
            for s in events:
                if (s.get("ph") == "i" and (s["pid"], s["tid"]) == key
                        and s["name"].startswith("switch") and start <= s["ts"] <= end):
                    xs = x(s["ts"])
                    refill = s["args"].get("refill_bytes", 0) / 1e6
                    out.append(f'<line x1="{xs:.2f}" y1="{y + 2}" x2="{xs:.2f}" y2="{y + lane_h - 2}" '
                               f'stroke="red" stroke-width="2"/>')
                    out.append(f'<text x="{xs + 3:.2f}" y="{y + 12}" font-size="9" fill="red">'
                               f'{refill:.1f} MB</text>')
    # Time axis.
    y = top + lane_h * len(lanes) + 20
    for k in range(11):
        t = start + (end - start) * k / 10
        out.append(f'<line x1="{x(t):.2f}" y1="{y - 8}" x2="{x(t):.2f}" y2="{y - 2}" stroke="black"/>')
        out.append(f'<text x="{x(t) - 12:.2f}" y="{y + 10}">{(t - first) / 1000:.0f} ms</text>')
    for i, s in enumerate(streams):
        out.append(f'<rect x="{left + i * 140}" y="{y + 22}" width="12" height="12" fill="{colour[s]}"/>')
        out.append(f'<text x="{left + i * 140 + 16}" y="{y + 32}">{s}</text>')
    out.append("</svg>")
    with open(args.out, "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
