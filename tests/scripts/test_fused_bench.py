"""scripts/fused_bench.py: without a CUDA device it says so and exits; on the GPU a small run
times every kernel group with and without 16-byte lanes and writes one row per timing."""
import csv
import os
import subprocess
import sys

import pytest

from minicaffe.backend import gpu_available

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "fused_bench.py")


@pytest.mark.skipif(gpu_available(), reason="a CUDA device answers here")
def test_without_a_device_it_says_what_it_needs():
    p = subprocess.run([sys.executable, SCRIPT, "--batch", "2"], capture_output=True,
                       text=True, timeout=120, cwd=REPO)
    assert p.returncode != 0
    assert "needs a CUDA device with CuPy" in p.stderr


@pytest.mark.gpu
def test_small_run_times_every_group_both_ways(tmp_path):
    if not gpu_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "f.csv"
    p = subprocess.run([sys.executable, SCRIPT, "--batch", "2", "--repeats", "2", "--rounds",
                        "1", "--out", str(out)], capture_output=True, text=True, timeout=300,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    groups = {"pair fwd", "pair bwd", "eltwise fwd", "eltwise bwd", "split bwd"}
    for stage in {r["stage"] for r in rows}:
        sel = [r for r in rows if r["stage"] == stage]
        assert {(r["group"], r["mode"]) for r in sel} == (
            {(g, m) for g in groups for m in ("lanes", "single")} | {("copy", "lanes")})
        for r in sel:
            assert float(r["ms"]) > 0 and float(r["gb_per_s"]) > 0
    assert len({r["stage"] for r in rows}) == 4
