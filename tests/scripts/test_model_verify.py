"""scripts/model_verify.py --quick: the profile, FLOPS vs FLOPs against the fitted curves, and the
estimated against the observed timeline, on the CPU with cifar10_quick."""
import csv
import os
import re
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:            # scripts/ is imported as a package
    sys.path.insert(0, REPO)

KS = (2, 4, 8, 16)
TIMELINE_KS = (8, 16)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("model_verify")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "model_verify.py"),
                           "--quick", "--out-dir", str(out)],
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _csv(path):
    return list(csv.DictReader(open(path)))


def test_profile_json(quick):
    from swap.profiler import Profile
    prof = Profile.load(quick / "model_verify_quick_profile.json")
    assert prof.ks == KS and prof.mode == "CPU" and prof.net == "CIFAR10_quick"
    n = len(prof.steps)
    assert len(prof.compute) == n * len(KS)            # every step of one iteration per k
    assert {c.k for c in prof.compute} == set(KS) and all(c.time > 0 for c in prof.compute)
    assert {t.kind for t in prof.transfers} == {"offload", "prefetch"}
    assert prof.meta["strategy"] == "naive" and prof.meta["failed"] == []
    assert [k for k, _ in prof.iterations] == list(KS)


def test_flops_rows_and_fitted_curves(quick):
    from swap.model import ComputeModel
    from swap.profiler import Profile
    prof = Profile.load(quick / "model_verify_quick_profile.json")
    model = ComputeModel.from_profile(prof)
    rows = _csv(quick / "model_verify_quick_flops.csv")
    # cifar10_quick: 3 convolutions and 2 inner products, forward and backward, at every k
    count = {}
    for r in rows:
        count[(r["type"], r["phase"], int(r["k"]))] = count.get((r["type"], r["phase"],
                                                                  int(r["k"])), 0) + 1
    assert count == {(t, ph, k): n for t, n in (("Convolution", 3), ("InnerProduct", 2))
                     for ph in ("forward", "backward") for k in KS}
    steps = {s.step: s for s in prof.steps}
    flops = {}
    for r in rows:
        f, t = float(r["flops"]), float(r["time_s"])
        assert float(r["flops_per_s"]) == pytest.approx(f / t, rel=1e-6)
        fit = model.curve(steps[int(r["step"])]).time(f)
        assert float(r["fitted_time_s"]) == pytest.approx(fit, rel=1e-6)
        assert float(r["time_rel_err"]) == pytest.approx((fit - t) / t, rel=1e-5, abs=1e-9)
        flops[(int(r["step"]), int(r["k"]))] = f
    for (j, k), f in flops.items():                     # eq. (1): linear in k
        assert f == pytest.approx(flops[(j, 2)] * k / 2, rel=1e-9) and f > 0


def test_timeline_rows(quick):
    from swap.profiler import Profile
    prof = Profile.load(quick / "model_verify_quick_profile.json")
    rows = _csv(quick / "model_verify_quick_timeline.csv")
    n = len(prof.steps)
    assert [int(r["k"]) for r in rows] == [k for k in TIMELINE_KS for _ in range(n)]
    for k in TIMELINE_KS:
        rs = [r for r in rows if int(r["k"]) == k]
        assert [int(r["step"]) for r in rs] == list(range(n))
        assert [r["layer"] for r in rs] == [s.layer for s in prof.steps]
        ps, pe = (np.array([float(r[c]) for r in rs]) for c in ("pred_start_s", "pred_end_s"))
        os_, oe = (np.array([float(r[c]) for r in rs]) for c in ("obs_start_s", "obs_end_s"))
        t = np.array([float(r["model_time_s"]) for r in rs])
        assert np.allclose(pe - ps, t, rtol=1e-6, atol=1e-10) and (t > 0).all()
        assert (np.diff(pe) >= -1e-12).all() and (ps[1:] >= pe[:-1] - 1e-12).all()
        assert os_[0] == 0 and (oe >= os_).all() and (np.diff(oe) >= 0).all()


def test_markdown_tables(quick):
    md = (quick / "model_verify_quick.md").read_text()
    assert "`python3 scripts/model_verify.py --quick --out-dir " in md
    assert "CIFAR10_quick on CPU" in md and "CPU mode" in md
    assert "| Convolution | forward |" in md and "| InnerProduct | backward |" in md
    for k in KS:
        assert re.search(rf"^\| {k} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$",
                         md, re.M), k
    rows = _csv(quick / "model_verify_quick_timeline.csv")
    for k in TIMELINE_KS:
        last = [r for r in rows if int(r["k"]) == k][-1]
        obs, pred = float(last["obs_end_s"]), float(last["pred_end_s"])
        m = re.search(rf"^\| {k} \| ([0-9.]+) \| ([0-9.]+) \| ([-+0-9.]+) % \|", md, re.M)
        assert m, k
        assert float(m.group(1)) == pytest.approx(1e3 * obs, abs=0.006)
        assert float(m.group(2)) == pytest.approx(1e3 * pred, abs=0.006)
        assert float(m.group(3)) == pytest.approx(100 * (pred - obs) / obs, abs=0.06)


def test_plots(quick):
    names = ["flops", "timeline"] + [f"timeline_k{k}" for k in TIMELINE_KS]
    for name in names:
        png = (quick / f"model_verify_quick_{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000, name
    assert not list(quick.glob("*_trace_k*.csv"))     # the traces are read, then removed
