"""scripts/swap_anatomy.py: the copies' bytes beside each step, the fit of the compute they cost,
and the quick CPU run of the three configurations with their traces."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:            # scripts/ is imported as a package
    sys.path.insert(0, REPO)

from scripts.swap_anatomy import copy_overlap, fit_interference, step_medians  # noqa: E402


def test_copy_overlap_shares_a_copy_by_time():
    # steps [0,1), [1,2), [2,4); one copy of 300 bytes over [0.5, 2): 100 + 200 + 0;
    # one of 40 over [3, 5): half of it during the last step
    x = copy_overlap([0, 1, 2], [1, 2, 4], [(0.5, 2.0, 300), (3.0, 5.0, 40)])
    assert np.allclose(x, [100, 200, 20])
    assert np.allclose(copy_overlap([0], [1], [(0.5, 0.5, 8)]), [0])     # empty interval


def test_fit_recovers_known_slopes_and_keeps_them_nonnegative():
    rng = np.random.default_rng(0)
    x_out = rng.uniform(0, 1e9, 200) * (rng.uniform(size=200) < 0.6)
    x_in = rng.uniform(0, 1e9, 200) * (rng.uniform(size=200) < 0.5)
    a_out, a_in = 0.5e-3 / 2**30, 0.3e-3 / 2**30          # 0.5 and 0.3 ms per GiB
    delta = a_out * x_out + a_in * x_in
    f = fit_interference(delta, x_out, x_in)
    assert f["ms_per_gib_out"] == pytest.approx(0.5, rel=1e-9)
    assert f["ms_per_gib_in"] == pytest.approx(0.3, rel=1e-9)
    assert f["r2"] == pytest.approx(1.0)
    assert f["explained_s"] == pytest.approx(f["delta_s"])
    quiet = ~((x_out > 0) | (x_in > 0))
    assert f["quiet_steps"] == int(quiet.sum()) and f["delta_quiet_s"] == pytest.approx(0.0)
    # copies that speed compute up are noise, not a negative cost
    g = fit_interference(-delta, x_out, np.zeros(200))
    assert g["s_per_byte_out"] == 0.0 and g["s_per_byte_in"] == 0.0


def test_step_medians_split_waits_from_compute(tmp_path):
    p = tmp_path / "t.csv"
    head = "iteration,step,layer,phase,t_start_ms,t_end_ms,t_ready_ms\n"
    rows = []
    for it, extra in ((0, 9.0), (1, 0.0), (2, 2.0), (3, 0.0)):
        rows.append(f"{it},0,conv,forward,0,{2 + extra},0")
        rows.append(f"{it},1,conv,backward,{2 + extra},{5 + extra},{3 + extra}")
    p.write_text(head + "\n".join(rows) + "\n")
    m = step_medians(p, 3)                 # the last three iterations: 1, 2, 3
    assert m["iterations"] == [1, 2, 3]
    assert np.allclose(m["wait"], [0, 1e-3]) and np.allclose(m["compute"], [2e-3, 2e-3])
    assert m["wait_sum"] == pytest.approx(1e-3) and m["compute_sum"] == pytest.approx(4e-3)


def test_quick_run_writes_its_summary(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "swap_anatomy.py"),
                           "--quick", "--out-dir", str(tmp_path), "--iterations", "2"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads((tmp_path / "anatomy_cifar10_quick_8.json").read_text())
    assert set(s["configs"]) == {"none", "kept", "dynamic"}
    assert s["offloaded_bytes"] > 0                  # the quick budget makes the plan swap
    steps = s["steps"]
    assert steps["none"]["layer"] == steps["dynamic"]["layer"] == steps["kept"]["layer"]
    for c, r in s["configs"].items():
        assert r["ms"] > 0 and r["compute_ms"] > 0 and r["wait_ms"] >= 0
        assert min(steps[c]["wait_ms"]) >= 0
    assert s["interference"]["ms_per_gib_out"] >= 0
    # a CPU profile has no copy calibration: the model gives the copies no cost
    assert s["predicted_copy_ms"] == pytest.approx(0.0, abs=1e-9)
    assert s["slow_out"] == s["slow_in"] == 0.0
    assert "| dynamic |" in (tmp_path / "anatomy_cifar10_quick_8.md").read_text()
    # one trace per configuration and round
    assert len(list(tmp_path.glob("trace_cifar10_quick_8_*.csv"))) == 6
