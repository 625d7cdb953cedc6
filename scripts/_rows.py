"""Rows of dicts to a CSV file, the columns those of the first row (the benchmarks' raw output)."""
from __future__ import annotations

import csv


def write_rows(path: str, rows: list) -> None:
    """Write ``rows`` (dicts with the same keys) to ``path`` as CSV; nothing to write leaves an
    empty file."""
    with open(path, "w", newline="") as f:
        if not rows:
            return
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
