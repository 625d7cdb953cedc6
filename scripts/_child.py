"""Run one benchmark configuration in a child process and read back its result.

Benchmarks time every configuration in a process of its own, so that one
framework's memory pool never hides another's; the child prints one line
``RESULT <json>``.
"""
from __future__ import annotations

import json
import subprocess


def run_child(cmd, spec: str, timeout: float, cwd=None, tail_lines: int = 3):
    """The child's parsed RESULT, or None after printing why there is none."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        print(f"{spec}: timed out after {timeout}s", flush=True)
        return None
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-tail_lines:]
        print(f"{spec}: failed: {' | '.join(tail)}", flush=True)
        return None
    return json.loads(line[0][len("RESULT "):])
