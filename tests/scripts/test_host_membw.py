"""scripts/host_membw.py: the per-process copy rates it sums."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_two_processes_copy_and_report_their_sum():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "host_membw.py"), "--procs", "1,2",
                        "--mib", "8", "--seconds", "0.2"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^\s*(\d+) processes:\s+([\d.]+) GB/s copied in all \(([\d.]+)-([\d.]+) "
                      r"each", r.stdout, re.M)
    assert [int(n) for n, *_ in rows] == [1, 2]
    for n, total, lo, hi in rows:
        total, lo, hi = float(total), float(lo), float(hi)
        assert 0 < lo <= hi and total > 0
        # the total is the sum of the processes' rates (printed to 0.1 GB/s)
        assert int(n) * lo - 0.15 <= total <= int(n) * hi + 0.15


def test_bad_arguments_are_refused():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "host_membw.py"), "--procs", "0"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0 and "--procs" in r.stderr
