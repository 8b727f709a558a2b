#!/usr/bin/env python3
"""Counts the unsafe code of the workspace: `unsafe` blocks, `unsafe impl`s, `unsafe fn`s and
`unsafe trait`s per crate, in library code and in test code (tests/, benches/, fuzz targets,
examples, `tests.rs`/`*_tests.rs` files and the `#[cfg(test)]` module at the end of a file).

    scripts/unsafe-count.py                 # the working tree
    scripts/unsafe-count.py --rev 4a91ac9   # a commit, read through git
    scripts/unsafe-count.py --json          # one JSON object

Comments and string literals are left out, so a `# Safety` section or a message that says
"unsafe" is not counted. A count of keywords, not a proof of anything: what each block does is
in its `// SAFETY:` comment.
"""
import argparse
import json
import os
import re
import subprocess
import sys

CRATES = [
    ("userdma-sys", "sys/"),
    ("userdma-plan", "plan/"),
    ("userdma-loopback", "loopback/"),
    ("userdma-infer", "infer/"),
    ("userdma-owner", "owner/"),
    ("userdma-capi", "capi/"),
    ("userdma-cli", "cli/"),
    ("bench-support", "bench-support/"),
    ("fuzz", "fuzz/"),
    ("userdma", ""),  # the root package: everything not claimed above
]
KINDS = {
    "blocks": re.compile(r"\bunsafe\s*\{"),
    "impls": re.compile(r"\bunsafe\s+impl\b"),
    "fns": re.compile(r"\bunsafe\s+(?:extern\s+\"[^\"]*\"\s+)?fn\b"),
    "traits": re.compile(r"\bunsafe\s+trait\b"),
}
TEST_DIRS = ("tests/", "benches/", "examples/", "fuzz_targets/")
STRIP = re.compile(r'//[^\n]*|/\*.*?\*/|b?r#*"(?:[^"\\]|\\.)*"#*|\'(?:[^\'\\\n]|\\.)\'', re.S)
TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+\w+\s*\{")


def crate_of(path):
    for name, prefix in CRATES:
        if prefix and path.startswith(prefix):
            return name
    return "userdma"


def is_test_file(path):
    name = os.path.basename(path)
    inner = path.split("/", 1)[1] if crate_of(path) != "userdma" else path
    return (
        any(inner.startswith(d) or f"/{d}" in inner for d in TEST_DIRS)
        or name == "tests.rs"
        or name.endswith("_tests.rs")
        or "/tests/" in path
    )


def files(rev):
    if rev:
        out = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", rev], check=True, capture_output=True, text=True
        ).stdout
        for path in out.splitlines():
            if path.endswith(".rs"):
                text = subprocess.run(
                    ["git", "show", f"{rev}:{path}"], check=True, capture_output=True, text=True
                ).stdout
                yield path, text
    else:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.rs"],
            check=True, capture_output=True, text=True,
        ).stdout
        for path in out.splitlines():
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    yield path, f.read()


def count(rev):
    table = {}
    for path, text in files(rev):
        code = STRIP.sub(lambda m: "" if m.group(0).startswith("/") else '""', text)
        parts = [("test", code)] if is_test_file(path) else None
        if parts is None:
            m = TEST_MODULE.search(code)
            parts = [("lib", code[: m.start()]), ("test", code[m.start():])] if m else [("lib", code)]
        row = table.setdefault(crate_of(path), {})
        for where, part in parts:
            for kind, rx in KINDS.items():
                key = f"{where}_{kind}"
                row[key] = row.get(key, 0) + len(rx.findall(part))
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="count a commit instead of the working tree")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    os.chdir(subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                            capture_output=True, text=True).stdout.strip())
    table = count(args.rev)
    total = {}
    for row in table.values():
        for k, v in row.items():
            total[k] = total.get(k, 0) + v
    if args.json:
        json.dump({"rev": args.rev or "working tree", "crates": table, "total": total}, sys.stdout, indent=1)
        print()
        return
    cols = [f"{w}_{k}" for w in ("lib", "test") for k in KINDS]
    print(f"unsafe code in {args.rev or 'the working tree'} (library code | test code)")
    print(f"{'crate':<18}" + "".join(f"{c:>13}" for c in cols))
    for name, _ in CRATES:
        row = table.get(name, {})
        print(f"{name:<18}" + "".join(f"{row.get(c, 0):>13}" for c in cols))
    print(f"{'total':<18}" + "".join(f"{total.get(c, 0):>13}" for c in cols))


if __name__ == "__main__":
    main()
