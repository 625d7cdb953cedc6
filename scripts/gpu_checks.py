#!/usr/bin/env python3
"""Run every GPU test (pytest -m gpu) and print a short summary.

Usage on the GPU machine, from the repository root:

    python3 scripts/gpu_checks.py [-k EXPR] [--junit out.xml] [--failures out.txt] [PATHS]

Prints one line per test file (passed / failed / skipped) and, for each
failure, the test name and the first and last lines of its message (``--failures``
writes the whole tracebacks to a file). Exits non-zero when a
test fails or when no GPU test ran (a GPU run that skips everything proves
nothing).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict


def _file_of(classname: str) -> str:
    """JUnit's classname is the module path, plus the class for tests in classes."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = os.path.join(*parts[:n]) + ".py"
        if os.path.exists(path):
            return path
    return classname


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", default=None, help="pytest -k expression")
    ap.add_argument("--junit", default=None, help="keep the JUnit XML here")
    ap.add_argument("--failures", default=None,
                    help="write each failure's whole traceback to this file")
    ap.add_argument("paths", nargs="*", default=["tests"])
    args = ap.parse_args()

    junit = args.junit or os.path.join(tempfile.mkdtemp(), "gpu.xml")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
           f"--junitxml={junit}", *args.paths]
    if args.k:
        cmd += ["-k", args.k]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if not os.path.exists(junit):
        print(proc.stdout[-4000:], proc.stderr[-4000:])
        return 2

    per_file = defaultdict(lambda: [0, 0, 0, 0.0])
    failures = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        f = _file_of(case.get("classname", "?"))
        row = per_file[f]
        row[3] += float(case.get("time", 0))
        if case.find("failure") is not None or case.find("error") is not None:
            row[1] += 1
            node = case.find("failure") if case.find("failure") is not None else case.find("error")
            msg = (node.get("message") or node.text or "").strip().splitlines()
            # the assertion's first line (what failed) and its last (pytest's "where")
            shown = " | ".join(dict.fromkeys(m[:200] for m in (msg[:1] + msg[-1:])))
            failures.append((f"{f}::{case.get('name')}", shown, node.text or ""))
        elif case.find("skipped") is not None:
            row[2] += 1
        else:
            row[0] += 1

    width = max((len(f) for f in per_file), default=10)
    print(f"{'file':<{width}}  passed  failed  skipped   seconds")
    tot = [0, 0, 0, 0.0]
    for f in sorted(per_file):
        p, fl, s, t = per_file[f]
        if p + fl == 0:
            continue
        print(f"{f:<{width}}  {p:6d}  {fl:6d}  {s:7d}  {t:8.1f}")
        tot = [a + b for a, b in zip(tot, per_file[f])]
    print(f"{'total':<{width}}  {tot[0]:6d}  {tot[1]:6d}  {tot[2]:7d}  {tot[3]:8.1f}")
    for name, msg, _ in failures:
        print(f"FAILED {name}: {msg}")
    if failures and args.failures:
        with open(args.failures, "w") as fh:
            for name, _, text in failures:
                fh.write(f"==== {name}\n{text}\n")
        print(f"failures in full: {args.failures}")
    if tot[0] + tot[1] == 0:
        print("no GPU test ran (is a CUDA device visible?)")
        print(proc.stdout[-3000:])
        return 3
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
