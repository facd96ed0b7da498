#!/usr/bin/env python3
"""The longest Rust functions per crate, measured by brace depth, to find the functions to split.

Dev script: for each crate under runtime/ (runtime/crates/* and runtime/vlad) it reads
src/ (and with --tests also tests/ and benches/), finds every `fn` with a body, and
reports its length in lines (from the `fn` line to the closing brace) and its deepest
nesting (braces inside the body: a `match`, an `if`, a closure or a struct literal each
count one level). Strings, chars and comments are skipped so their braces do not count.

    scripts/longest_functions.py                  # the longest function of each crate
    scripts/longest_functions.py --top 5          # the five longest of each crate
    scripts/longest_functions.py --over 150       # every function over 150 lines
    scripts/longest_functions.py --rooms 900      # also every file over 900 lines
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def is_ident(text, i):
    return i >= 0 and (text[i].isalnum() or text[i] == "_")


def code_only(text):
    """The text with strings, chars and comments blanked (newlines kept, so lines count)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i : i + 260])) and not is_ident(text, i - 1):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}'), or a lifetime ('a) which is code.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i : i + 12])
            if m:
                out.append(" " * m.end())
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(name, first line, lines, max nesting) for every fn with a body in `path`."""
    code = code_only(path.read_text(encoding="utf-8"))
    found = []
    for m in FN.finditer(code):
        # The body opens at the first `{` at parenthesis/bracket depth 0 after the
        # signature; a `;` first means a declaration without a body.
        i, paren = m.end(), 0
        while i < len(code):
            ch = code[i]
            if ch in "([":
                paren += 1
            elif ch in ")]":
                paren -= 1
            if paren == 0 and ch in "{;":
                break
            i += 1
        if i >= len(code) or code[i] == ";":
            continue
        depth, deepest, j = 0, 0, i
        while j < len(code):
            if code[j] == "{":
                depth += 1
                deepest = max(deepest, depth)
            elif code[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, j) + 1
        found.append((m.group(1), first, last - first + 1, deepest - 1))
    return found


def crates(tests):
    dirs = sorted(p for p in (ROOT / "runtime" / "crates").iterdir() if (p / "Cargo.toml").exists())
    dirs.append(ROOT / "runtime" / "vlad")
    subdirs = ["src"] + (["tests", "benches"] if tests else [])
    for d in dirs:
        files = [f for s in subdirs for f in sorted((d / s).rglob("*.rs"))]
        yield d.name, files


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=1, help="functions listed per crate")
    ap.add_argument("--over", type=int, help="list every function longer than this instead")
    ap.add_argument("--rooms", type=int, help="also list files longer than this many lines")
    ap.add_argument("--tests", action="store_true", help="include tests/ and benches/")
    args = ap.parse_args()
    over_rooms = []
    print(f"{'crate':<18} {'lines':>5} {'nest':>4}  function")
    for crate, files in crates(args.tests):
        rows = []
        for f in files:
            rel = f.relative_to(ROOT)
            for name, line, length, nest in functions(f):
                rows.append((length, nest, f"{rel}:{line} {name}"))
            if args.rooms and (n := f.read_text(encoding="utf-8").count("\n")) > args.rooms:
                over_rooms.append((n, str(rel)))
        rows.sort(key=lambda r: (-r[0], -r[1]))
        keep = [r for r in rows if r[0] > args.over] if args.over is not None else rows[: args.top]
        for length, nest, where in keep:
            print(f"{crate:<18} {length:>5} {nest:>4}  {where}")
    if args.rooms:
        print(f"files over {args.rooms} lines: {len(over_rooms)}")
        for n, rel in sorted(over_rooms, reverse=True):
            print(f"  {n:>5}  {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
