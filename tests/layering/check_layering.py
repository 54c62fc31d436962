#!/usr/bin/env python3
"""endpointd's layering test: every #include "dir/..." in a top-level folder must name that folder
or one that ARCHITECTURE.md's "may depend on" column allows for it.

Usage: check_layering.py [ROOT]   (ROOT: the source tree, default: two levels up from here)
Exit 0 when every include is allowed; 1 with one line per forbidden include otherwise.
"""
import os
import re
import sys

# Generated protobuf code and the protobuf runtime count as proto/.
PROTO_ROOTS = {"endpointd", "envoy", "google", "xds", "udpa", "validate"}
SOURCE_SUFFIXES = (".h", ".cc", ".hpp", ".cpp")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/')


def read_table(root):
    """The folder table of ARCHITECTURE.md: {folder: set of allowed folders, or None for all}."""
    path = os.path.join(root, "ARCHITECTURE.md")
    rules = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 3:
                continue
            m = re.fullmatch(r"`([^`/]+)/`", cells[0])
            if not m:
                continue
            deps = cells[2]
            if deps == "everything":
                rules[m.group(1)] = None
            elif deps in ("—", "-", ""):
                rules[m.group(1)] = set()
            else:
                rules[m.group(1)] = {d.strip() for d in deps.split(",")}
    if not rules:
        sys.exit(f"check_layering: no folder table found in {path}")
    return rules


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    root = os.path.abspath(root)
    rules = read_table(root)
    problems = []
    # Every top-level folder with sources must have a row.
    for entry in sorted(os.listdir(root)):
        full = os.path.join(root, entry)
        if entry.startswith(".") or entry.startswith("build") or not os.path.isdir(full):
            continue
        has_sources = any(
            name.endswith(SOURCE_SUFFIXES) for _, _, files in os.walk(full) for name in files)
        if has_sources and entry not in rules:
            problems.append(f"{entry}/: has sources but no row in ARCHITECTURE.md's folder table")
    for folder, allowed in sorted(rules.items()):
        if allowed is None:
            continue
        base = os.path.join(root, folder)
        for dirpath, _, files in os.walk(base):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if target in PROTO_ROOTS:
                            target = "proto"
                        if target == folder or target in allowed:
                            continue
                        if target not in rules:
                            continue  # a system or library header written with quotes
                        rel = os.path.relpath(path, root)
                        problems.append(
                            f"{rel}:{n}: {folder}/ may not include {target}/ "
                            f"(ARCHITECTURE.md allows: {', '.join(sorted(allowed)) or 'nothing'})")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layering: {len(problems)} forbidden include(s)")
        return 1
    print(f"check_layering: {len(rules)} folders, every include allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
