#!/usr/bin/env python3
"""Issue 6's slow ranks, iteration by iteration: is a slow iteration's rank host-bound?

Reads the workers' ``--ps-stats`` records (``rank*.jsonl``) that ``scripts/ps_scaling.py``
leaves in its work directory, or ``.tgz`` archives of them (``docs/results/ps_s21/*_raw.tgz``),
drops each run's warm-up iterations, and splits the timed (rank, iteration) records by the
main thread's CPU time during compute (``host_cpu_s``): above ``--slow-ms`` (a thread running
slow) and at or below ``--normal-ms``.  For each group it prints how many there are, their
median compute time and, where the records have it, their median device backlog
(``gpu_backlog_s``, ``swap.runtime.Backlog``): near zero, the device waited for the host.

    python3 scripts/ps_slow_ranks.py docs/results/ps_s21/d_raw.tgz
    python3 scripts/ps_slow_ranks.py /tmp/w --world-size 4 --warmup 3
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tarfile

# .../<net>_<mode>_<comm>_<link>_W<w>/rank<r>.jsonl; the whole directory names the run
RANK_FILE = re.compile(r"^(?P<run>(?:.*/)?[^/]*_W(?P<w>\d+))/rank(?P<rank>\d+)\.jsonl$")


def read_records(paths) -> dict:
    """``{(source, run directory, W): {rank: [records]}}`` from work directories and .tgz
    archives; a record is one JSON line of ``--ps-stats``."""
    runs: dict = {}

    def add(source, name, text):
        m = RANK_FILE.search(name)
        if m is None:
            return
        key = (source, m["run"], int(m["w"]))
        recs = [json.loads(line) for line in text.splitlines() if line.strip()]
        runs.setdefault(key, {})[int(m["rank"])] = recs

    for path in paths:
        if os.path.isdir(path):
            for root, _, files in os.walk(path):
                for f in files:
                    full = os.path.join(root, f)
                    with open(full) as fh:
                        add(path, os.path.relpath(full, path), fh.read())
        elif tarfile.is_tarfile(path):
            with tarfile.open(path) as tar:
                for m in tar.getmembers():
                    if m.isfile():
                        add(path, m.name, tar.extractfile(m).read().decode())
        else:
            raise SystemExit(f"{path}: neither a directory nor a .tgz of --ps-stats records")
    return runs


def split(runs, warmup: int, slow_ms: float, normal_ms: float, world=None) -> dict:
    """The timed records of every rank of every run (``world``: only runs of that W), in
    two groups by the main thread's CPU time: ``slow`` (> slow_ms) and ``normal``
    (<= normal_ms), as (cpu_s, compute_s, backlog_s or None) triples; ``all`` counts the
    records, ``runs`` the runs."""
    out = {"slow": [], "normal": [], "all": 0, "runs": 0}
    for (_, _, w), ranks in sorted(runs.items()):
        if world is not None and w != world:
            continue
        out["runs"] += 1
        for recs in ranks.values():
            for x in sorted(recs, key=lambda r: r["iteration"])[warmup:]:
                cpu = x.get("parts", {}).get("host_cpu_s")
                if cpu is None:
                    continue
                out["all"] += 1
                row = (cpu, x["compute_s"], x["parts"].get("gpu_backlog_s"))
                if cpu * 1e3 > slow_ms:
                    out["slow"].append(row)
                elif cpu * 1e3 <= normal_ms:
                    out["normal"].append(row)
    return out


def describe(group) -> str:
    if not group:
        return "none"
    backlog = [b for _, _, b in group if b is not None]
    text = (f"{len(group)} records, CPU {1e3 * statistics.median(c for c, _, _ in group):.0f} ms, "
            f"compute {1e3 * statistics.median(t for _, t, _ in group):.0f} ms")
    if backlog:
        text += (f", device backlog {1e3 * statistics.median(backlog):.1f} ms "
                 f"({1e3 * min(backlog):.1f}-{1e3 * max(backlog):.1f}; {len(backlog)} records "
                 "have it)")
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="ps_scaling.py work directories or .tgz archives")
    ap.add_argument("--warmup", type=int, default=3, help="untimed iterations per run")
    ap.add_argument("--world-size", type=int, default=None, help="only runs of this W")
    ap.add_argument("--slow-ms", type=float, default=175.0)
    ap.add_argument("--normal-ms", type=float, default=150.0)
    args = ap.parse_args(argv)
    runs = read_records(args.paths)
    if not runs:
        print("no rank*.jsonl records under " + ", ".join(args.paths), file=sys.stderr)
        return 1
    got = split(runs, args.warmup, args.slow_ms, args.normal_ms, args.world_size)
    print(f"{got['runs']} run(s), {got['all']} timed (rank, iteration) records with host_cpu_s")
    print(f"main thread CPU > {args.slow_ms:g} ms: {describe(got['slow'])}")
    print(f"main thread CPU <= {args.normal_ms:g} ms: {describe(got['normal'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
