"""scripts/step_gaps.py: an eager iteration's steps against its whole time, and against the
model's t_j(k) from a saved profile; on the CPU with cifar10_quick (no timing thresholds: that
the parts add up, every step is matched, and a profile's own k predicts what it measured)."""
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:            # scripts/ is imported as a package
    sys.path.insert(0, REPO)


@pytest.fixture(scope="module")
def saved_profile(tmp_path_factory):
    """A cifar10_quick profile at k = 2 and 4 on the CPU, with the GMAP its run decides on."""
    from scripts.swap_budgets import _solver
    from swap.gmap import build_gmap
    from swap.profiler import profile_solver
    from swap.tuner import with_gmap
    s = _solver("cifar10_quick", 2, "CAFFE", "CPU")
    prof = profile_solver(s, 256 << 20, (2, 4), warmup=1, iterations=2)
    prof = with_gmap(prof, build_gmap(s.net), 8, "SGD", 0)
    path = str(tmp_path_factory.mktemp("prof") / "cifar10_quick_profile.json")
    prof.save(path)
    return path, prof


def test_quick_run_adds_up(tmp_path, capsys):
    from scripts.step_gaps import main
    out = tmp_path / "rows.json"
    assert main(["--quick", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["k"] for r in rows] == [2, 4]
    for r in rows:
        assert r["n_steps"] == 25                     # cifar10_quick's forward and backward
        assert 0 < r["steps_ms"] <= r["hooked_ms"]
        assert r["head_ms"] >= 0 and r["tail_ms"] >= 0
        parts = r["head_ms"] + r["tail_ms"] + r["steps_ms"] + r["between_steps_ms"]
        assert parts == pytest.approx(r["hooked_ms"])
        assert "pred_steps_ms" not in r               # no --profile: no model
    assert "k = 4: iteration" in capsys.readouterr().out


def test_a_profiles_model_matches_every_step(saved_profile, capsys):
    from scripts.step_gaps import main, measured_steps, predicted_steps
    path, prof = saved_profile
    pred, overhead, host = predicted_steps(prof, 4, "segment")
    meas = measured_steps(prof, 4)
    assert set(pred) == set(meas) and len(meas) == 25
    assert overhead >= 0 and host == 0.0              # the CPU has no separate host bound
    assert main(["--quick", "--ks", "4", "--profile", path]) == 0
    text = capsys.readouterr().out
    assert "model: steps" in text and "25 matched, 0 not" in text
    assert "by layer type and phase" in text


def test_the_model_of_a_synthetic_profile_gives_back_its_times():
    """A profile made from a known model at k = 2 and 4: the fitted t_j(k) at a profiled k is
    the known model's (granularity "segment" runs through the profiled points)."""
    from scripts.step_gaps import measured_steps, predicted_steps
    from scripts.swap_budgets import _solver
    from swap.gmap import build_gmap
    from swap.profiler import synthetic_profile
    from swap.tuner import device_models, with_gmap
    g = build_gmap(_solver("cifar10_quick", 2, "CAFFE", "CPU").net)
    model, pcie = device_models()
    prof = with_gmap(synthetic_profile(g, (2, 4), model, pcie), g, 8, "SGD", 0)
    pred, _, _ = predicted_steps(prof, 4, "segment")
    meas = measured_steps(prof, 4)
    known = {(s.name, s.phase): t for s, t in zip(g.at(4).steps, model.step_times(g.at(4)))}
    assert set(pred) == set(meas) == set(known)
    for key, (_, t) in meas.items():
        assert t == pytest.approx(known[key])
        assert pred[key] == pytest.approx(known[key], rel=1e-6), key


def test_a_profile_without_its_gmap_is_refused(saved_profile):
    import dataclasses
    from scripts.step_gaps import predicted_steps
    _, prof = saved_profile
    bare = dataclasses.replace(prof, meta={})
    with pytest.raises(ValueError, match="keeps no GMAP"):
        predicted_steps(bare, 4, "segment")


@pytest.mark.parametrize("flag, head_start", [([], True), (["--no-head-start"], False)])
def test_hooked_passes_start_behind_the_profilers_wait_unless_asked(monkeypatch, tmp_path,
                                                                    flag, head_start):
    """The hooked passes run under the profiler's instrument with its head start (on the
    GPU a device-side wait ahead of each timed pass; none on the CPU), or without it."""
    from scripts.step_gaps import main
    from swap import profiler
    seen = []
    real = profiler._Instrument

    def spy(ex, k, head_start=False):
        seen.append(head_start)
        return real(ex, k, head_start=head_start)
    monkeypatch.setattr(profiler, "_Instrument", spy)
    out = tmp_path / "rows.json"
    assert main(["--quick", "--json", str(out)] + flag) == 0      # k = 2 and 4
    assert seen == [head_start, head_start]
    for row in json.loads(out.read_text())["rows"]:
        assert row["head_start_ms"] == 0.0            # the CPU waits for nothing
