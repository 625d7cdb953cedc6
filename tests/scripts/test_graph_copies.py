"""scripts/graph_copies.py: without a CUDA device it says so and exits; on the GPU its quick
run times the four ways (eager and graph, without and with copies) for both kernels and
writes one row per kernel with the copies' cost in each way."""
import csv
import os
import subprocess
import sys

import pytest

from minicaffe.backend import gpu_available

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "graph_copies.py")


@pytest.mark.skipif(gpu_available(), reason="a CUDA device answers here")
def test_without_a_device_it_says_what_it_needs():
    p = subprocess.run([sys.executable, SCRIPT, "--quick"], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert p.returncode != 0
    assert "needs a CUDA device with CuPy" in p.stderr


@pytest.mark.gpu
def test_quick_run_times_the_four_ways(tmp_path):
    if not gpu_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "g.csv"
    p = subprocess.run([sys.executable, SCRIPT, "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["kernel"] for r in rows] == ["spin", "stream"]
    for r in rows:
        for way in ("eager alone", "eager + copies", "graph alone", "graph + copies"):
            assert float(r[way]) > 0, (r["kernel"], way)
        assert float(r["graph_cost"]) == pytest.approx(
            float(r["graph + copies"]) / float(r["graph alone"]) - 1.0)
        assert float(r["copy_ms"]) > 0
    assert "eager cost" in p.stdout and "graph cost" in p.stdout
