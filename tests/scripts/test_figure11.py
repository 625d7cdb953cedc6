"""scripts/figure11.py: one command trains under a swap plan with a memory trace and draws the
paper's Figure 11 (CPU, CIFAR-10 quick); the figure's numbers come from the trace."""
import csv
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from scripts import figure11, plot_memory_trace as pmt  # noqa: E402


def test_quick_run_draws_one_iteration_within_the_budget(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "figure11.py"),
                           "--quick", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "figure11.csv", newline="") as f:
        trace = list(csv.DictReader(f))
    assert {int(r["iteration"]) for r in trace} >= {0, 1, 2}
    rows = pmt.pick_iteration(pmt.read_trace(tmp_path / "figure11.csv"))
    s = figure11.summary(rows, 48 << 20)
    # naive offloads every feature map: each one offloaded comes back before its backward
    assert s["offloaded"] > 0 and s["prefetched"] > 0
    # every buffer of the iteration is given back by its end (the steady state repeats)
    assert s["allocated"] == s["released"]
    assert 0 < s["peak_held"] <= s["high_water"] <= 48 << 20
    assert s["forward_ms"] > 0 and s["backward_ms"] > 0
    md = (tmp_path / "figure11.md").read_text()
    assert "cifar10_quick at minibatch 32" in md and "AlexNet, 256, 3 GB" in md
    assert "| held within the budget | yes | yes |" in md
    assert (tmp_path / "figure11.png").stat().st_size > 10000


def test_a_saved_trace_is_drawn_without_training(tmp_path):
    figure11.main(["--quick", "--out-dir", str(tmp_path / "a")])
    src = tmp_path / "a" / "figure11.csv"
    # a budget below what the trace held is reported, not drawn as fine
    rc = figure11.main(["--trace", str(src), "--budget", "1M", "--out-dir", str(tmp_path / "b")])
    assert rc == 1
    assert "| held within the budget | NO | yes |" in (tmp_path / "b" / "figure11.md").read_text()
