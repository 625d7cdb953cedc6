"""scripts/model_overhead.py (the fitted time outside the layer steps against measured
iterations) on a tuner directory made here: a synthetic profile whose O(k) is known, and a
tuner-table JSON with one dynamic point and two `none` points."""
import json

import pytest

from scripts import model_overhead
from scripts.swap_budgets import _solver
from swap.gmap import build_gmap
from swap.model import ComputeModel, PCIeModel, ThroughputCurve
from swap.plan import min_budget
from swap.profiler import synthetic_profile
from swap.runtime import set_lowering


@pytest.fixture(scope="module")
def tuner_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tuner")
    s = _solver("cifar10_quick", 4, "CAFFE", "CPU")
    set_lowering(s.net, "chunked")
    s.net.reshape()
    g = build_gmap(s.net, solver_type=s.type)
    truth = ComputeModel.uniform(ThroughputCurve(2e9, 1e5))
    prof = synthetic_profile(g, (2, 4, 8, 16), truth, PCIeModel(1e9, 1e9), gap=1e-4,
                             update=5e-3)
    prof.save(d / "cifar10_quick_profile.json")
    result = {"net": "cifar10_quick", "k_base": 4, "engine": "CAFFE", "search": "bisect",
              "budget": 3 * min_budget(g.at(16), "naive"), "host_budget": None,
              "date": "2026-11-21", "tuner": {"k_star": 6},
              "none_chunked": {"k": 4, "ms": 10.0},
              "dynamic": [{"k": 6, "ms": 20.0, "pred_ms": 15.0, "pred_compute_ms": 14.0,
                           "none_ms": 18.0},
                          {"k": 3, "error": "MemoryError: not measured"}]}
    (d / "cifar10_quick.json").write_text(json.dumps(result))
    o = (g.n_steps - 1) * 1e-4 + 5e-3
    return d, g, truth, o


def test_old_and_new_predictions_of_each_measured_point(tuner_dir):
    d, g, truth, o = tuner_dir
    res = model_overhead.analyse(str(d), (), do_replan=True, log=lambda m: None)
    (net,) = res["nets"]
    assert net["a"] == pytest.approx(o, rel=1e-9) and net["b"] == pytest.approx(0, abs=1e-12)
    pts = {(p["plan"], p["k"]): p for p in net["points"]}
    assert set(pts) == {("none", 4), ("dynamic", 6), ("none", 6)}
    dyn = pts["dynamic", 6]
    assert dyn["k_star"] and dyn["old"] == 15.0 and dyn["new"] == pytest.approx(15.0 + 1e3 * o)
    # none without swapping: the JSON's compute alone where it has one, else eq. (2)
    assert pts["none", 6]["old"] == 14.0
    assert pts["none", 4]["old"] == pytest.approx(1e3 * truth.t_iter(g, 4), rel=1e-6)
    assert pts["none", 4]["new"] == pytest.approx(pts["none", 4]["old"] + 1e3 * o)
    # Algorithm 2 again: the same k*, the predicted iteration longer by O(k*)
    rp = net["replan"]
    assert "error" not in rp
    assert rp["old"]["k_star"] == rp["new"]["k_star"]
    assert rp["new"]["ms"] - rp["old"]["ms"] == pytest.approx(1e3 * o, rel=1e-6)
    assert rp["old"]["overhead_ms"] == 0.0


def test_the_report_is_written(tuner_dir, tmp_path):
    d, _, _, o = tuner_dir
    out = tmp_path / "model_overhead.md"
    assert model_overhead.main(["--tuner-dir", str(d), "--out", str(out), "--no-replan",
                                "--extra-profile", str(d / "cifar10_quick_profile.json")]) == 0
    text = out.read_text()
    assert "## The fit" in text and "## Predicted against measured" in text
    assert f"| cifar10_quick | 6 (k*) | dynamic | 20.0 | 15.0 | {15.0 + 1e3 * o:.1f} |" in text
    assert "|error| smaller at" in text
    with pytest.raises(SystemExit, match="no such directory"):
        model_overhead.main(["--tuner-dir", str(tmp_path / "missing"), "--out", str(out)])


def test_memory_points_use_the_least_squares_transients():
    from types import SimpleNamespace
    prof = SimpleNamespace(meta={"transients": [[100, 1000], [200, 2400], [300, 2800],
                                                [400, 4400]]})
    result = {"dynamic": [{"k": 250, "pred_peak": 10_000, "pred_total": 13_500,
                           "peak_in_use": 10_000, "transients": 2_700},
                          {"k": 50, "error": "failed"}]}
    (m,) = model_overhead.memory_points(result, prof)
    assert m == {"k": 250, "measured": 12_700, "old": 13_500, "new": 10_000 + 2650}
    md = "\n".join(model_overhead.memory_report([{"name": "x", "memory": [m]}]))
    assert "| x | 250 |" in md and "+6.3 %" in md and "-0.4 %" in md
