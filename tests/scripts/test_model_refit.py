"""scripts/model_refit.py on a tuner directory made here: a synthetic profile from per-type
curves (each fits its own profile exactly) with one step made twice as slow at every k, and a
run JSON with one measured point; no run 1 or Table 3 inputs (``''`` skips them)."""
import dataclasses
import json

import pytest

from scripts import model_refit
from scripts.swap_budgets import _solver
from swap.gmap import build_gmap
from swap.model import ComputeModel, PCIeModel, ThroughputCurve
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
    prof = synthetic_profile(g, (2, 4, 8, 16), truth, PCIeModel(1e9, 1e9))
    slow = next(st for st in prof.steps if st.type == "Convolution" and st.phase == "backward")
    prof = dataclasses.replace(prof, compute=tuple(
        dataclasses.replace(c, time=2 * c.time) if c.step == slow.step else c
        for c in prof.compute))
    prof.save(d / "cifar10_quick_profile.json")
    result = {"net": "cifar10_quick", "k_base": 4, "tuner": {"k_star": 8},
              "dynamic": [{"k": 8, "ms": 20.0, "pred_ms": 15.0, "pred_compute_ms": 14.0}]}
    (d / "cifar10_quick.json").write_text(json.dumps(result))
    return d, slow


def test_the_slow_step_is_the_largest_miss_and_the_misses_sum_to_the_type_error(tuner_dir):
    d, slow = tuner_dir
    res = model_refit.analyse(str(d), "", "", do_replan=False, log=lambda m: None)
    (net,) = res["nets"]
    assert res["missing"] == {} and net["other"] == []
    m = net["misses"]
    worst = m["worst"][0]
    assert (worst["name"], worst["phase"]) == (slow.name, "backward")
    assert worst["miss"] < 0 < m["above"] and m["below"] < 0
    # the per-type sums of section 1 are the profiled sums plus the misses of their steps
    tot = sum(r["type_fit"] - r["measured"] for r in net["types"])
    assert m["below"] + m["above"] == pytest.approx(tot, rel=1e-9)


def test_main_skips_the_other_runs_and_writes_the_step_table(tuner_dir, tmp_path):
    d, slow = tuner_dir
    out = tmp_path / "refit.md"
    assert model_refit.main(["--tuner-dir", str(d), "--run1", "", "--table3-dir", "",
                             "--no-replan", "--out", str(out)]) == 0
    text = out.read_text()
    assert "largest single-step misses" in text
    assert f"| {slow.name} | Convolution | backward |" in text
