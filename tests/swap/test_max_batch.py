"""`train --max-batch K`: the tuner's k* capped (swap.tuner.train_dynamic ``max_batch``), and
the warning for a k* far beyond the base minibatch (LARGE_BATCH_RATIO).  On a synthetic
profile, so that k* does not depend on this machine's timing."""
import pytest

from swap.gmap import build_gmap
from swap.plan import min_budget
from swap.profiler import synthetic_profile
from swap.tuner import LARGE_BATCH_RATIO, device_models, train_dynamic


def _run(make_solver, **kw):
    s = make_solver("resnet", batch=2)
    g = build_gmap(s.net)
    model, pcie = device_models(peak_flops=2e9, x_half=1e5, h2d=1e9)
    prof = synthetic_profile(g, (2, 4, 8, 16), model, pcie)
    budget = 2 * min_budget(g.at(40), "naive")
    lines = []
    ex, td = train_dynamic(s, budget, profile=prof, log=lines.append, scratch=None, **kw)
    ex.close()
    return td, lines


def test_k_star_beyond_the_ratio_is_warned_and_capped(make_solver):
    td, lines = _run(make_solver)
    k_star, k_max = td.decision.k_star, td.decision.k_max
    assert k_star > LARGE_BATCH_RATIO * 2, "the setting must give a large k*"
    assert any("WARNING: k* is" in x and "--max-batch caps k*" in x for x in lines)
    cap = 2 * LARGE_BATCH_RATIO
    td2, lines2 = _run(make_solver, max_batch=cap)
    assert td2.decision.k_star <= cap
    assert td2.decision.k_max == k_max          # the memory bound, not the cap
    assert any(f"k* searched up to --max-batch {cap} (k_max {k_max})" in x for x in lines2)
    assert not any("WARNING: k* is" in x for x in lines2)
    assert td2.lr < td.lr                       # eq. (9) at the smaller q


def test_a_cap_above_k_max_changes_nothing(make_solver):
    td, _ = _run(make_solver)
    td2, lines = _run(make_solver, max_batch=10 * td.decision.k_max)
    assert td2.decision.k_star == td.decision.k_star
    assert not any("--max-batch" in x and "searched up to" in x for x in lines)


def test_the_command_line_refuses_max_batch_without_auto_batch(tmp_path, capsys):
    from minicaffe.cli import main
    for extra in ([], ["--batch", "4"]):
        assert main(["train", "--solver", str(tmp_path / "s.prototxt"), "--swap", "dynamic",
                     "--budget", "4M", "--max-batch", "8", *extra]) == 2
        assert "--max-batch caps the k* of --auto-batch" in capsys.readouterr().err
    assert main(["train", "--solver", str(tmp_path / "s.prototxt"), "--swap", "naive",
                 "--budget", "4M", "--max-batch", "8"]) == 2
    assert "--max-batch needs --swap dynamic" in capsys.readouterr().err
    assert main(["train", "--solver", str(tmp_path / "s.prototxt"), "--swap", "dynamic",
                 "--budget", "4M", "--auto-batch", "--max-batch", "0"]) == 2
    assert "--max-batch must be positive" in capsys.readouterr().err
