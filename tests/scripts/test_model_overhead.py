"""scripts/model_overhead.py (the fitted time outside the layer steps and the host's issue floor
against measured iterations) on a tuner directory made here: a synthetic profile whose O(k) is
known, a tuner-table JSON with one dynamic point and two `none` points, and the same net
profiled again with host times (a known floor) with the points of that run."""
import dataclasses
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
    # profiled again on a "GPU" with host times: 1 ms per step at every k, 3 ms where the
    # launch queue was full (k = 4): the floor is 1 ms x steps
    hosted = dataclasses.replace(prof, mode="GPU", compute=tuple(
        dataclasses.replace(c, host=(3e-3 if c.k == 4 else 1e-3)) for c in prof.compute))
    hosted.save(d / "cifar10_quick_profile_host.json")
    # that run's points: its predictions held O(k) (the tuner's log says so)
    run = dict(result, tuner={"k_star": 6, "log": [
        "AccUDNN stage 2: time outside the layer steps 5.0 ms + 0 us x k per iteration"]},
        dynamic=[{"k": 6, "ms": 30.0, "pred_ms": 15.0 + 1e3 * o},
                 {"k": 16, "ms": 40.0, "pred_ms": 1e3 * (truth.t_iter(g, 16) + o)}])
    del run["none_chunked"]
    (d / "cifar10_quick_host.json").write_text(json.dumps(run))
    return d, g, truth, o


def test_old_and_new_predictions_of_each_measured_point(tuner_dir):
    d, g, truth, o = tuner_dir
    res = model_overhead.analyse(str(d), (), do_replan=True, log=lambda m: None)
    net, host_run = res["nets"]
    assert net["name"] == "cifar10_quick" and host_run["name"] == "cifar10_quick_host"
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


def test_the_host_floor_of_a_profile_with_host_times(tuner_dir):
    """The floor is 1 ms per step (the 3 ms samples lie above the line); the network without
    host times borrows it from <net>_profile_host.json; the run whose predictions held O(k)
    gets it taken off; at k = 6 the host sets the prediction, at 16 the device does; the
    host floor does not move k*; the `min` estimate is the same constant here."""
    d, g, truth, o = tuner_dir
    res = model_overhead.analyse(str(d), (), do_replan=True, log=lambda m: None)
    net, run = res["nets"]
    floor = g.n_steps * 1e-3
    assert run["host"]["own"] and run["host"]["intercept"] == pytest.approx(floor)
    assert run["host"]["slope"] == 0.0 and run["host"]["min"] == pytest.approx(floor)
    assert not net["host"]["own"] and net["host"]["source"].endswith(
        "cifar10_quick_profile_host.json")
    assert net["host"]["intercept"] == pytest.approx(floor)
    assert run["pred_had_overhead"] and not net["pred_had_overhead"]
    pts = {(p["plan"], p["k"]): p for p in run["points"]}
    six, sixteen = pts["dynamic", 6], pts["dynamic", 16]
    assert six["old"] == pytest.approx(15.0) and six["new"] == pytest.approx(15.0 + 1e3 * o)
    assert 15.0 < 1e3 * floor and six["bound"] == "host"
    assert six["floor"] == pytest.approx(1e3 * (floor + o))
    assert sixteen["old"] == pytest.approx(1e3 * truth.t_iter(g, 16))
    assert sixteen["bound"] == "device" and sixteen["floor"] == sixteen["new"]
    # the borrowed floor applies to the first run's points the same way
    (dyn,) = [p for p in net["points"] if p["plan"] == "dynamic"]
    assert dyn["host"] == pytest.approx(1e3 * floor)
    assert dyn["floor"] == pytest.approx(max(15.0, 1e3 * floor) + 1e3 * o)
    for rp in (net["replan"], run["replan"]):
        assert "error" not in rp
        assert rp["host"]["k_star"] == rp["new"]["k_star"]
        assert rp["host"]["host_ms"] == pytest.approx(1e3 * floor)
        c = rp["coupled"][6]
        assert c["host_ms"] == pytest.approx(1e3 * floor)
        assert c["coupled_ms"] >= max(c["device_ms"], c["host_ms"]) - 1e-9


def test_coupled_waits_for_the_host_per_step():
    """Host 1 per step, device 3 then 0.5 then 0.5: the device ends step 0 at 3, the host
    issues step 2 at 3, so 3 + 0.5 + 0.5 = 4; with the host at 2 per step the last step
    cannot end before 6."""
    assert model_overhead.coupled([3, 0.5, 0.5], [1, 1, 1]) == pytest.approx(4.0)
    assert model_overhead.coupled([3, 0.5, 0.5], [2, 2, 2]) == pytest.approx(6.0)
    assert model_overhead.coupled([], []) == 0.0


def test_the_report_is_written(tuner_dir, tmp_path):
    d, _, _, o = tuner_dir
    out = tmp_path / "model_overhead.md"
    assert model_overhead.main(["--tuner-dir", str(d), "--out", str(out), "--no-replan",
                                "--extra-profile", str(d / "cifar10_quick_profile.json")]) == 0
    text = out.read_text()
    assert "## The fit" in text and "## Predicted against measured" in text
    assert "## The host's issue time" in text and "on the CPU" in text
    floor = 1e3 * g_steps(d) * 1e-3
    assert (f"| cifar10_quick | 6 (k*) | dynamic | 20.0 | 15.0 | {15.0 + 1e3 * o:.1f} | "
            f"{floor:.1f} | {floor + 1e3 * o:.1f} | host |") in text
    assert "| cifar10_quick (host-timed run) | 6 (k*) | dynamic | 30.0 | 15.0 |" in text
    assert "Mean |error|" in text and "Borrowed: cifar10_quick" in text
    with pytest.raises(SystemExit, match="no such directory"):
        model_overhead.main(["--tuner-dir", str(tmp_path / "missing"), "--out", str(out)])


def g_steps(d) -> int:
    from swap.profiler import Profile
    return len(Profile.load(d / "cifar10_quick_profile.json").steps)


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
