"""swap.plan: strategies, eq. (4) at every step, layouts, dependencies, budget searches."""
import numpy as np
import pytest

from swap.arena import Arena, align
from swap.gmap import CAFFE, DATA, SCRATCH, build_gmap
from swap.memory import breakdown
from swap.plan import (AFTER, ALLOCATE, BEFORE, COMPUTE, DETERMINISTIC_TYPES, OFFLOAD, PREFETCH,
                       RECOMPUTE, RELEASE, SETUP, SWAP_IN, SWAP_OUT, BudgetError, make_plan,
                       max_batch, min_budget, plan_naive, plan_none, plan_resident, plan_vdnn)

STRATEGIES = ("none", "naive", "vdnn", "recompute", "resident")


@pytest.fixture(scope="module")
def gmaps():
    from minicaffe.net import TRAIN, Net
    from minicaffe.rng import set_random_seed
    from swap_nets import net_param  # tests/swap/swap_nets.py
    set_random_seed(1)
    return {w: build_gmap(Net(net_param(w, 4), TRAIN, mode="CPU")) for w in ("lenet", "resnet")}


def check_consistent(plan):
    """Every invariant a plan must keep, independent of the strategy."""
    g = plan.gmap
    ops = plan.ops
    # timeline order: setup, then per step the ops before it, then those after it
    keys = [(op.step, op.when) for op in ops]
    assert keys == sorted(keys)
    assert all(op.when == BEFORE for op in ops if op.step == SETUP)
    assert all(op.when == BEFORE for op in ops if op.kind in (ALLOCATE, PREFETCH, RECOMPUTE))
    assert all(op.when == AFTER for op in ops if op.kind in (OFFLOAD, RELEASE))
    # streams
    for op in ops:
        expected = {ALLOCATE: {COMPUTE}, PREFETCH: {SWAP_IN}, OFFLOAD: {SWAP_OUT},
                    RELEASE: {COMPUTE, SWAP_OUT}, RECOMPUTE: {COMPUTE}}[op.kind]
        assert op.stream in expected
    # a recomputation reruns a recomputable forward step (the dynamic plan: also one of the
    # layers the user named, DETERMINISTIC_TYPES) before a backward step, after that step's
    # allocations (nothing of the step is placed after it)
    recomputing = {}                # step -> forward steps run again before it
    for i, op in enumerate(ops):
        if op.kind != RECOMPUTE:
            continue
        src = g.steps[op.source]
        assert src.phase == "forward" and op.step >= g.n_forward
        assert src.recomputable or (plan.strategy == "dynamic"
                                    and src.type in DETERMINISTIC_TYPES)
        assert op.nbytes == 0 and op.buffer in src.writes
        assert all(o.kind == RECOMPUTE for o in ops[i:] if (o.step, o.when) == (op.step, BEFORE))
        recomputing.setdefault(op.step, []).append(op.source)
    # eq. (4) at every op, and usage[j] is what is held while step j computes
    peak = plan.check(plan.budget)
    assert peak == plan.peak
    # regions never overlap: replay through an arena with the planned offsets
    arena = Arena(plan.arena_bytes)
    state = {}
    host_end = {}
    for i, op in enumerate(ops):
        b = op.buffer
        if op.kind == RECOMPUTE:
            continue
        assert op.nbytes == align(g.nbytes(b))
        if op.kind == ALLOCATE:
            assert state.get(b) in (None, "freed")
            arena.allocate(op.nbytes, op.offset)
            state[b] = "dev"
        elif op.kind == PREFETCH:
            assert state.get(b) == "host"
            off_i = [d for d in op.after if ops[d].kind == OFFLOAD]
            assert len(off_i) == 1 and ops[off_i[0]].buffer == b        # waits on its offload
            assert op.host_offset == ops[off_i[0]].host_offset
            arena.allocate(op.nbytes, op.offset)
            state[b] = "dev"
        elif op.kind == OFFLOAD:
            assert state.get(b) == "dev" and op.wait_step == op.step
            assert 0 <= op.host_offset and op.host_offset + op.nbytes <= plan.host_bytes
            host_end[b] = op.host_offset + op.nbytes
            state[b] = "offloading"
        elif op.kind == RELEASE:
            arena.free(op.offset)
            if state[b] == "offloading":
                assert op.stream == SWAP_OUT and ops[op.after[0]].kind == OFFLOAD
                state[b] = "host"
            else:
                assert state[b] == "dev" and op.stream == COMPUTE
                state[b] = "freed"
        for d in op.after:                                  # dependencies point backwards
            assert d < i
    assert arena.high_water <= plan.arena_bytes
    # every step finds what it touches on the device; nothing is held after the iteration
    for s in g.steps:
        held = set(plan.resident_at(s.index))
        assert set(s.touches) <= held, s
        for f in recomputing.get(s.index, ()):        # and so does each recomputation
            assert set(g.steps[f].touches) <= held, (s, g.steps[f])
    resident = {op.buffer for op in ops if op.step == SETUP}
    assert all(st in ("freed", "host") or b in resident for b, st in state.items())
    assert all(st != "host" for b, st in state.items() if g.buffers[b].backward_uses)
    # the steps that wait on a prefetch are its buffer's next use
    for j, needs in enumerate(plan.needs):
        touched = set(g.steps[j].touches).union(*(g.steps[f].touches
                                                  for f in recomputing.get(j, ())))
        for i in needs:
            assert ops[i].kind == PREFETCH and ops[i].buffer in touched


@pytest.mark.parametrize("which", ["lenet", "resnet"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_plans_are_consistent_without_budget(gmaps, which, strategy):
    check_consistent(make_plan(gmaps[which], strategy))


@pytest.mark.parametrize("which", ["lenet", "resnet"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_eq4_holds_for_random_budgets(gmaps, which, strategy):
    """Property: for any budget a plan either keeps allocated - released <= budget at every
    step (and fits an arena of the budget), or fails with the smallest budget that works."""
    g = gmaps[which]
    need = min_budget(g, strategy)
    rng = np.random.default_rng(hash((which, strategy)) % 2**32)
    for budget in list(rng.integers(need // 2, 3 * need, size=12)) + [need, need - 1]:
        budget = int(budget)
        if budget >= need:
            plan = make_plan(g, strategy, budget)
            assert plan.peak <= plan.arena_bytes <= budget
            check_consistent(plan)
        else:
            with pytest.raises(BudgetError) as e:
                make_plan(g, strategy, budget)
            assert e.value.min_budget == need
            assert e.value.max_k == max_batch(g, strategy, budget)


def test_none_keeps_everything_resident(gmaps):
    g = gmaps["resnet"]
    plan = plan_none(g)
    assert all(op.step == SETUP and op.kind == ALLOCATE for op in plan.ops)
    assert len(plan.ops) == sum(1 for b in g.buffers if g.nbytes(b.id))
    assert set(plan.usage) == {plan.setup_bytes}
    assert plan.peak == sum(align(s) for s in g.sizes())
    assert breakdown(plan)["caffe extra"] == sum(align(g.nbytes(b.id)) for b in g.buffers
                                                 if b.kind == CAFFE)
    assert plan_none(g, caffe=False).peak == plan.peak - breakdown(plan)["caffe extra"]


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_resident_holds_everything_but_the_scratch_for_the_iteration(gmaps, which):
    """plan_resident: every buffer but the layers' scratch (and Caffe's own reservations)
    allocated at setup; each scratch buffer allocated before and released after each step
    that uses it; so its peak is the setup bytes plus the most scratch one step needs, never
    more than Caffe's plan without its reservations, and nothing is offloaded."""
    g = gmaps[which]
    plan = plan_resident(g)
    scratch = {b.id for b in g.buffers if b.kind == SCRATCH and g.nbytes(b.id)}
    held = {b.id for b in g.buffers if b.kind not in (SCRATCH, CAFFE) and g.nbytes(b.id)}
    assert scratch and not plan.offloaded
    assert {op.buffer for op in plan.ops if op.step == SETUP} == held
    per_step = [op for op in plan.ops if op.step != SETUP]
    assert {op.buffer for op in per_step} == scratch
    for b in scratch:
        uses = sorted(g.buffers[b].uses)
        assert sorted(op.step for op in per_step if op.buffer == b and op.kind == ALLOCATE) \
            == uses
        assert sorted(op.step for op in per_step if op.buffer == b and op.kind == RELEASE) \
            == uses
    setup = sum(align(g.nbytes(b)) for b in held)
    most = max(sum(align(g.nbytes(b)) for b in scratch if j in g.buffers[b].uses)
               for j in range(g.n_steps))
    assert plan.setup_bytes == setup and plan.peak == setup + most
    assert plan.peak <= plan_none(g, caffe=False).peak
    check_consistent(plan)


def test_naive_offloads_every_feature_map_and_vdnn_conv_inputs(gmaps):
    g = gmaps["resnet"]
    naive, vdnn = plan_naive(g), plan_vdnn(g)
    fm = set(g.feature_maps())
    assert naive.offloaded == fm
    conv_inputs = {bid for s in g.steps if s.phase == "forward" and s.type == "Convolution"
                   for bid in s.reads if g.buffers[bid].kind == DATA}
    assert vdnn.offloaded == fm & conv_inputs
    assert g.find("data:data").id in vdnn.offloaded          # conv1's input
    assert g.find("saved:bn_conv1/x_norm").id not in vdnn.offloaded
    for plan in (naive, vdnn):
        off = [op.buffer for op in plan.ops if op.kind == OFFLOAD]
        pre = [op.buffer for op in plan.ops if op.kind == PREFETCH]
        assert sorted(off) == sorted(pre) == sorted(plan.offloaded)
        assert plan.host_bytes == sum(align(g.nbytes(b)) for b in plan.offloaded)
    assert naive.peak < plan_none(g, caffe=False).peak
    assert naive.peak <= vdnn.peak


def test_offload_after_last_forward_use_prefetch_before_first_backward_use(gmaps):
    g = gmaps["resnet"]
    for plan in (plan_naive(g), plan_vdnn(g), plan_naive(g, 10 * min_budget(g, "naive"))):
        for op in plan.ops:
            b = g.buffers[op.buffer]
            if op.kind == OFFLOAD:
                assert op.step == b.forward_uses[-1]
            elif op.kind == PREFETCH:
                assert b.forward_uses[-1] < op.step <= b.backward_uses[0]
            elif op.kind == RELEASE and op.stream == COMPUTE and b.id in plan.offloaded:
                assert op.step == b.uses[-1]


def test_vdnn_prefetches_one_layer_ahead(gmaps):
    g = gmaps["resnet"]
    plan = plan_vdnn(g)
    for op in plan.ops:
        if op.kind == PREFETCH:
            b = g.buffers[op.buffer]
            assert op.step == max(b.forward_uses[-1] + 1, b.backward_uses[0] - 1)


def test_naive_prefetches_as_early_as_memory_allows(gmaps):
    """A larger budget moves prefetches earlier, never later; with no budget they are just in
    time (the layer-wise minimum)."""
    g = gmaps["resnet"]
    need = min_budget(g, "naive")

    def when(plan):
        return {op.buffer: op.step for op in plan.ops if op.kind == PREFETCH}

    jit = when(plan_naive(g))
    assert all(s == g.buffers[b].backward_uses[0] for b, s in jit.items())
    last = jit
    for factor in (1.0, 1.1, 1.3, 2.0, 4.0):
        now = when(plan_naive(g, int(need * factor)))
        assert all(now[b] <= last[b] for b in now)
        last = now
    # with room for everything, each prefetch follows its offload at once
    assert all(s == g.buffers[b].forward_uses[-1] + 1 for b, s in last.items())


def test_pinned_buffers_are_never_offloaded(gmaps):
    g = gmaps["resnet"]
    pinned = frozenset(g.feature_maps()[::2])
    for strategy in STRATEGIES:
        plan = make_plan(g, strategy, None, pinned)
        assert not plan.offloaded & pinned
        check_consistent(plan)
    assert plan_naive(g, None, pinned).peak >= plan_naive(g).peak


def test_region_reuse_waits_on_the_previous_occupant(gmaps):
    """An allocation over a region freed after an offload waits on that release (whose own
    dependency is the offload): the event chain the GPU runtime follows."""
    plan = plan_naive(gmaps["resnet"])
    ops = plan.ops
    freed = []          # (start, end, release op): bytes released and not handed out since
    for i, op in enumerate(ops):
        if op.kind in (ALLOCATE, PREFETCH) and op.step != SETUP:
            lo, hi = op.offset, op.offset + op.nbytes
            expect = {r for a, b, r in freed if a < hi and lo < b}
            got = {d for d in op.after if ops[d].kind == RELEASE}
            assert got == expect
            freed = [piece for a, b, r in freed
                     for piece in ([(a, b, r)] if b <= lo or hi <= a else
                                   [p for p in ((a, lo, r), (hi, b, r)) if p[0] < p[1]])]
        elif op.kind == RELEASE:
            freed.append((op.offset, op.offset + op.nbytes, i))
    assert any(ops[d].stream == SWAP_OUT for op in ops for d in op.after
               if ops[d].kind == RELEASE)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_max_batch_is_the_largest_that_fits(gmaps, strategy):
    g = gmaps["resnet"]
    budget = 3 * min_budget(g.at(4), strategy)
    k = max_batch(g, strategy, budget)
    assert k >= 4
    assert min_budget(g.at(k), strategy) <= budget < min_budget(g.at(k + 1), strategy)
    assert max_batch(g, strategy, 100) == 0


def test_plan_bytes_at_remembers_each_k_on_the_gmap(gmaps, monkeypatch):
    """The searches over k ask each k's plan once per GMAP (the profiler searches k_max again
    each time its scratch model moves); the answers are the plans' own, and the GMAP's value
    (equality, hash) does not change."""
    import dataclasses
    import swap.plan as plan_mod
    g = dataclasses.replace(gmaps["resnet"])        # a copy: nothing remembered on it yet
    h = hash(g)
    made = []
    real = plan_mod.make_plan

    def counting(gmap, strategy, budget=None, pinned=frozenset(), **kw):
        made.append((gmap.k, strategy))
        return real(gmap, strategy, budget, pinned, **kw)

    monkeypatch.setattr(plan_mod, "make_plan", counting)
    for k in (1, 3, 7):
        p = real(g.at(k), "naive", None)
        assert plan_mod.plan_bytes_at(g, "naive", k) == (p.arena_bytes, p.host_bytes)
    assert made == [(1, "naive"), (3, "naive"), (7, "naive")]
    budget = 3 * min_budget(g.at(4), "naive")
    k1 = max_batch(g, "naive", budget)
    n = len(made)
    assert max_batch(g, "naive", budget) == k1 and len(made) == n      # all remembered
    assert max_batch(g, "naive", budget // 2) <= k1
    assert plan_mod.plan_bytes_at(g, "naive", 3, frozenset(g.feature_maps())) == (
        min_budget(g.at(3), "naive", frozenset(g.feature_maps())),
        real(g.at(3), "naive", None, frozenset(g.feature_maps())).host_bytes)
    assert hash(g) == h and g == gmaps["resnet"].at(g.k)


def test_budget_error_names_the_smallest_budget_and_largest_batch(gmaps):
    g = gmaps["lenet"]
    need = min_budget(g, "naive")
    with pytest.raises(BudgetError) as e:
        make_plan(g, "naive", need - 1)
    msg = str(e.value)
    assert "too small" in msg and "'naive'" in msg and "lenet_like" in msg
    assert "smallest budget that works is" in msg and f"({need} bytes)" in msg
    assert "largest minibatch that fits" in msg and f"is {e.value.max_k}" in msg
    assert e.value.max_k == max_batch(g, "naive", need - 1) < g.k
    with pytest.raises(BudgetError, match="not even minibatch 1"):
        make_plan(g, "none", 1000)
    with pytest.raises(ValueError, match="unknown swap strategy"):
        make_plan(g, "checkpoint")


def test_budget_error_works_out_its_figures_when_read(gmaps, monkeypatch):
    """A plan's budget error searches for the smallest budget and the largest minibatch only
    when they (or the message) are read: a search over k catches most of them unread.  Read,
    they are those of an eager search; pickled, it is a plain BudgetError with the same
    message and figures; its type reads as BudgetError."""
    import pickle

    import swap.plan as plan_mod
    g = gmaps["lenet"]
    need = min_budget(g, "naive")
    searched = []
    real = plan_mod.max_batch
    monkeypatch.setattr(plan_mod, "max_batch", lambda *a, **k: searched.append(a) or real(*a, **k))
    with pytest.raises(BudgetError) as e:
        make_plan(g, "naive", need - 1)
    assert searched == []                                   # nothing worked out yet
    err = e.value
    assert err.max_k == real(g, "naive", need - 1) and len(searched) == 1
    assert err.min_budget == need and err.budget == need - 1 and err.k == g.k
    msg = str(err)
    assert f"({need} bytes)" in msg and f"is {err.max_k}" in msg and len(searched) == 1
    assert err.args == (msg,) and type(err).__name__ == "BudgetError" and msg in repr(err)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is BudgetError and str(back) == msg
    assert (back.max_k, back.min_budget, back.budget) == (err.max_k, need, need - 1)


def test_plan_describe_and_breakdown(gmaps):
    g = gmaps["lenet"]
    plan = plan_naive(g)
    text = plan.describe()
    assert text.splitlines()[0].startswith("plan 'naive' for 'lenet_like' at k=4")
    assert len(text.splitlines()) == len(plan.ops) + 1
    br = breakdown(plan)
    assert sum(br.values()) == plan.peak
    assert br["params"] == br["param diffs"] == br["history"] > 0
    assert br["caffe extra"] == 0
