"""A test pass between training iterations needs its per-pass buffers after the plan's resident
regions (swap.runtime.arena_layout); the planner, k_max and the tuner leave room for them
(swap.plan.arena_need).  Before, a budget where Caffe's plan or the resident plan fit alone made
`--swap dynamic` pick it, and the executor then refused it at install (the digits solver at
--budget 4M: "plan 'resident' needs an arena of 4073472 bytes, its test nets 1547776 more")."""
import numpy as np
import pytest

from swap.gmap import build_gmap
from swap.plan import BudgetError, arena_need, make_plan, max_batch, plan_bytes_at, resident_extent
from swap.profiler import max_batch_scratch
from swap.runtime import arena_layout, budget_for_plan, install, test_dynamic_bytes
from swap.tuner import device_models, plan_at, train_dynamic
from test_swap_alloc import solver_with_test


def _setting(batch=16):
    """A LeNet solver with a test net, its GMAP, the test pass's bytes and a budget in which
    Caffe's plan fits alone but not with a test pass after it (the plan's share of it)."""
    s = solver_with_test("lenet", batch)
    g = build_gmap(s.net, solver_type=s.type)
    t = test_dynamic_bytes(s)
    plan_budget = make_plan(g, "none", None).arena_bytes
    persistent = (1 << 30) - budget_for_plan(s, 1 << 30, scratch=0, gmap=g)
    return s, g, t, plan_budget, plan_budget + persistent


def test_arena_need_is_the_executors_layout():
    s, g, t, _, _ = _setting()
    assert t > 0
    for strategy in ("none", "resident", "naive"):
        p = make_plan(g, strategy, None)
        lay = arena_layout(p, test_dynamic=t)
        assert arena_need(p, t) == lay.test_persistent_base
        assert resident_extent(p) == lay.resident
        assert arena_need(p, 0) == p.arena_bytes
    # Caffe's plan keeps every buffer resident: the test pass comes after all of it
    none = make_plan(g, "none", None)
    assert resident_extent(none) == none.arena_bytes
    assert arena_need(none, t) >= none.arena_bytes + t
    # the naive plan's per-iteration regions are free between iterations: room to spare
    naive = make_plan(g, "naive", None)
    assert resident_extent(naive) + t <= naive.arena_bytes == arena_need(naive, t)


def test_test_dynamic_bytes_is_what_the_executor_lays_out():
    s, g, t, _, _ = _setting()
    ex = install(s, "naive")
    try:
        assert t == max(m.dynamic_bytes for m in ex.tests) == ex.layout.test_dynamic
    finally:
        ex.close()
    assert test_dynamic_bytes(s, test_nets=[]) == 0


def test_k_max_leaves_room_for_a_test_pass():
    _, g, t, plan_budget, _ = _setting()
    for strategy in ("none", "naive"):
        alone = max_batch(g, strategy, plan_budget)
        with_test = max_batch(g, strategy, plan_budget, test_dynamic=t)
        assert with_test <= alone
        assert plan_bytes_at(g, strategy, with_test, test_dynamic=t)[0] <= plan_budget
        assert plan_bytes_at(g, strategy, with_test + 1, test_dynamic=t)[0] > plan_budget
        assert max_batch_scratch(g, plan_budget, lambda k: 0, strategy,
                                 test_dynamic=t) == with_test
    # Caffe's plan at this budget fits 16 alone, fewer with a test pass after it
    assert max_batch(g, "none", plan_budget) == 16 > max_batch(g, "none", plan_budget,
                                                                test_dynamic=t)


def test_the_plan_at_a_fixed_k_leaves_room_and_installs():
    s, g, t, plan_budget, budget = _setting()
    model, pcie = device_models()
    old = plan_at(g, 16, plan_budget, model, pcie)
    new = plan_at(g, 16, plan_budget, model, pcie, test_dynamic=t)
    # without the test pass the planner takes Caffe's plan, which the executor refuses
    assert old.plan.strategy in ("none", "resident") and arena_need(old.plan, t) > plan_budget
    assert new.test_dynamic == t and arena_need(new.plan, t) <= plan_budget
    from swap.runtime import Executor
    with pytest.raises(BudgetError, match="its test nets"):
        Executor(s.net, old.plan, budget=plan_budget, solver=s)
    ex = Executor(s.net, new.plan, budget=plan_budget, solver=s)
    s.net.executor = ex
    try:
        s.step(7)                           # test passes at iterations 0, 3 and 6
        assert ex.high_water <= plan_budget
        assert all(np.isfinite(p.data).all() for p in s.net.learnable_params)
    finally:
        ex.close()


def test_train_dynamic_at_a_budget_caffes_plan_fits_only_alone():
    """`--swap dynamic --batch 16` with a test net: trains, test passes included, where it
    stopped at install before."""
    s, g, t, plan_budget, budget = _setting()
    ex, td = train_dynamic(s, budget, auto_batch=False, batch=16)
    try:
        assert td.decision.k_star == 16 and td.decision.test_dynamic == t
        assert arena_need(td.decision.plan, t) <= td.plan_budget == plan_budget
        s.step(4)
        assert ex.high_water <= budget
    finally:
        ex.close()


def test_the_tuners_k_star_leaves_room_for_a_test_pass():
    """`--auto-batch`: k_max and the plan at k* count the test pass; the run trains on."""
    s, g, t, plan_budget, budget = _setting()
    ex, td = train_dynamic(s, budget, auto_batch=True)
    try:
        dec = td.decision
        assert dec.test_dynamic == t
        assert dec.k_max == max_batch_scratch(g, plan_budget, None, test_dynamic=t)
        # the naive plan's per-iteration regions hold this test pass: k_max is unchanged
        assert dec.k_max == max_batch_scratch(g, plan_budget, None)
        assert arena_need(dec.plan, t) <= plan_budget
        assert td.profile.meta["test_dynamic_bytes"] == t
        s.step(4)
        assert ex.high_water <= budget
    finally:
        ex.close()
