"""scripts/host_profile.py: per-k sums of device and host time over one iteration, and the steps
whose host time exceeds their device time most; the quick run on the CPU writes its files."""
import csv
import os
import subprocess
import sys
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:            # scripts/ is imported as a package
    sys.path.insert(0, REPO)


def test_summarize_averages_over_the_recorded_iterations():
    from scripts.host_profile import summarize
    step = SimpleNamespace
    c = SimpleNamespace
    prof = SimpleNamespace(
        steps=[step(step=0, layer="conv", phase="forward"),
               step(step=1, layer="relu", phase="forward")],
        iterations=[(8, 0.030), (8, 0.034)],
        compute=[c(k=8, step=0, time=0.010, host=0.025), c(k=8, step=1, time=0.002, host=0.001),
                 c(k=8, step=0, time=0.012, host=0.027), c(k=8, step=1, time=0.002, host=0.001)])
    (r,) = summarize(prof, top=1)
    assert r["k"] == 8 and abs(r["iteration_s"] - 0.032) < 1e-12
    assert abs(r["device_s"] - 0.013) < 1e-12 and abs(r["host_s"] - 0.027) < 1e-12
    assert r["worst"] == "conv forward +15.00 ms"
    old = SimpleNamespace(steps=prof.steps, iterations=[(8, 0.03)],
                          compute=[c(k=8, step=0, time=0.01, host=None)])
    assert summarize(old)[0]["host_s"] is None           # profiles from before the host field


def test_quick_run_writes_its_table(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "host_profile.py"),
                           "--quick", "--out-dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "host_profile.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["k"]) for r in rows] == [4, 8]
    for r in rows:
        assert r["strategy"] == "none" and float(r["host_s"]) > 0
        # on the CPU a step's host time is the step itself, and the steps fill the iteration
        assert 0.5 < float(r["device_s"]) / float(r["iteration_s"]) <= 1.05
    assert (tmp_path / "host_profile_cifar10_quick.json").exists()
    assert "| cifar10_quick | none | CAFFE | 8 |" in (tmp_path / "host_profile.md").read_text()
