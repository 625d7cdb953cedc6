"""A swap executor's iteration as one CUDA graph (swap.graph) on the GPU: the same parameters
and losses as the eager compiled iteration, bit for bit, with the plan's offloads and
prefetches inside the graph, in the budget.  Skipped where no CUDA device answers; run with
``python3 scripts/gpu_checks.py tests/swap``."""
import numpy as np
import pytest

from swap import runtime
from swap.runtime import install, measure_scratch

from test_swap_gpu import _net_inputs, _net_solver, max_diff, params_of, same

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _close_executors():
    yield
    runtime.close_all()


def _run(name, strategy, iters, graph, budget, scratch):
    s = _net_solver(name, 8)
    ex = install(s, strategy, budget=budget, scratch=scratch, poison=True)
    if graph:
        ex.use_graph()
    _net_inputs(s)
    losses = []
    for _ in range(iters):
        s.step(1)
        losses.append(float(s.last_loss))
    out = params_of(s), losses, ex
    stats = (ex._graph.captures, ex._graph.launches, ex._graph.dropped) if graph and ex._graph \
        else None
    ex.close()
    return out + (stats,)


@pytest.mark.parametrize("name, strategy", [("resnet50", "naive"), ("resnet50", "vdnn"),
                                            ("googlenet", "naive")])
def test_graph_gives_the_parameters_and_losses_of_the_eager_iteration(name, strategy,
                                                                      monkeypatch):
    """Eight iterations: the first op by op, the second captured and launched, six launches
    more; every parameter and loss equals the eager run's, with poisoned releases, and the
    arena stays in the budget with nothing outside the reserve."""
    monkeypatch.setenv("MINICAFFE_DETERMINISTIC", "1")
    s = _net_solver(name, 8)
    _net_inputs(s)
    tp = measure_scratch(s, strategy)
    budget, scratch = tp.budget(margin=0.5), tp.reserve(margin=0.5)
    ref, ref_losses, _, _ = _run(name, strategy, 8, False, budget, scratch)
    got, losses, ex, stats = _run(name, strategy, 8, True, budget, scratch)
    assert ex.graph_refused is None
    assert stats[0] == 1 and stats[1] == 7, stats
    assert ex.plan.offloaded
    assert np.all(np.isfinite(ref_losses))
    assert losses == ref_losses
    assert same(got, ref), max_diff(got, ref)
    assert ex.high_water <= ex.budget == budget
    assert ex._allocator.fallbacks == 0


def test_a_net_the_graph_refuses_runs_eagerly_with_the_reason(make_solver):
    """A forward listener (Python per layer) refuses the graph with its reason, and
    training goes on eagerly."""
    s = make_solver("resnet", mode="GPU")
    ex = install(s, "naive")
    s.net.forward_listener = lambda li: None
    ex.use_graph()
    s.step(3)
    assert ex._graph is None and "forward listener" in ex.graph_refused
    assert np.isfinite(float(s.last_loss))


def test_calibrate_graph_times_graph_launches_and_scales_the_model():
    """On the GPU the calibration's iterations run as launches of a captured graph under the
    plan that keeps every map, and the gap it gives makes graph_model's steps and update the
    measured iteration."""
    from swap.gmap import build_gmap
    from swap.plan import min_budget
    from swap.tuner import calibrate_graph, device_models, graph_model
    s = _net_solver("resnet50", 8)
    _net_inputs(s)
    g = build_gmap(s.net, solver_type=s.type)
    model, pcie = device_models()
    reserve = measure_scratch(s, "naive").reserve(margin=0.5)
    budget = min_budget(g.at(8), "none") + reserve + (256 << 20)
    cal, runs = calibrate_graph(s, g, model, pcie, budget, budget, k_max=8, warmup=2,
                                iterations=3, scratch=lambda k: reserve)
    assert runs == ((8, 5), (2, 5)) and cal is not None and cal.k == 8
    assert [k for k, _ in cal.points] == [2, 8] and cal.gap == dict(cal.points)[8]
    assert cal.launches >= 3 and cal.measured > 0 and cal.gap >= 0
    scaled = graph_model(model, cal.gap, cal.tail, cal.points)
    if cal.gap > 0:    # the model's steps and update make the measured iteration
        assert float(np.sum(scaled.times_fn(g)(8))) + cal.tail == pytest.approx(cal.measured,
                                                                             rel=1e-6)
    assert np.isfinite(float(s.last_loss))


def test_a_ps_worker_s_graph_calibration_does_not_train():
    """A --ps worker joins its peers at the solver's iteration with the weights they start
    from: under train_dynamic's train_before=False the calibration's graph launches are put
    back (swap.tuner._Untrained), with its executor still installed over the arena."""
    from swap.gmap import build_gmap
    from swap.plan import min_budget
    from swap.tuner import _Untrained, calibrate_graph, device_models
    s = _net_solver("resnet50", 8)
    _net_inputs(s)
    s.step(1)
    g = build_gmap(s.net, solver_type=s.type)
    model, pcie = device_models()
    reserve = measure_scratch(s, "naive").reserve(margin=0.5)
    budget = min_budget(g.at(8), "none") + reserve + (256 << 20)
    before, it0 = params_of(s), s.iter
    with _Untrained(s):
        cal, runs = calibrate_graph(s, g, model, pcie, budget, budget, k_max=8, warmup=2,
                                    iterations=3, scratch=lambda k: reserve)
        assert s.iter == it0 + sum(n for _, n in runs) and cal is not None
        assert not same(params_of(s), before)
    assert s.iter == it0
    assert same(params_of(s), before), max_diff(params_of(s), before)
