"""swap.planner: Algorithm 1 (t_ready, constraint 6), pinning, the op-level replay of a plan."""
import numpy as np
import pytest

from swap.gmap import BACKWARD, DATA, FORWARD, GMAP, SCRATCH, Buffer, Size, Step, build_gmap
from swap.model import ComputeModel, PCIeModel, ThroughputCurve
from swap.plan import ALLOCATE, OFFLOAD, RELEASE, SETUP, SWAP_OUT, make_plan, min_budget
from swap.planner import (Sketcher, algorithm1, choose_pins, hold_steps, make_dynamic_plan,
                          plot_timeline, read_trace, simulate, sketch)


def hand_gmap(steps, buffers, name="hand"):
    """A GMAP built by hand.  steps: [(layer, phase)], forward first; buffers:
    [(name, kind, bytes per image, uses)].  Every step has 0 FLOPs and type "X"."""
    n_fwd = sum(1 for _, ph in steps if ph == FORWARD)
    bufs = tuple(Buffer(id=i, name=n, kind=kind, dtype="float32", size=Size(item, True),
                        persistent=False, ref=(), uses=tuple(sorted(uses)), n_forward=n_fwd)
                 for i, (n, kind, item, uses) in enumerate(buffers))
    names = [layer for layer, ph in steps if ph == FORWARD]
    st = tuple(Step(index=j, layer=names.index(layer), name=layer, type="X", phase=ph,
                    reads=tuple(b.id for b in bufs if j in b.uses), writes=(), scratch=(),
                    flops=0.0) for j, (layer, ph) in enumerate(steps))
    return GMAP(net_name=name, k=1, k0=1, n_layers=n_fwd, n_forward=n_fwd, buffers=bufs,
                steps=st, layer_names=tuple(names))


def chain():
    """L0 -> L1 -> L2: x0 (L0's output) is read by L1's forward and backward (a gap of two
    steps), x1 by L2's forward and backward (no gap: offloading it can only stall)."""
    steps = [("L0", FORWARD), ("L1", FORWARD), ("L2", FORWARD), ("L2", BACKWARD),
             ("L1", BACKWARD)]
    return hand_gmap(steps, [("x0", DATA, 1024, (0, 1, 4)), ("x1", DATA, 1024, (1, 2, 3))])


BW = 1024 / 0.5          # a 1024-byte feature map takes 0.5 s each way
PCIE = PCIeModel(h2d=BW, d2h=BW, both=None)
T1 = np.ones(5)          # every step takes 1 s
AMPLE = 1 << 20          # a budget that never binds


def test_algorithm1_known_answer():
    """x0 offloaded after step 1 in [2, 2.5], prefetched back at once in [2.5, 3] (memory is
    ample), ready before step 4 at 4; x1 offloaded in [3, 3.5], prefetched in [3.5, 4]: step 3
    (needs x1) is ready at 4, one second after step 2 ends: the one violation of (6)."""
    g = chain()
    assert sketch(g, None).prefetch_at == {0: 4, 1: 3}      # no budget: just in time
    sk = sketch(g, AMPLE)
    x0, x1 = g.find("x0").id, g.find("x1").id
    assert sk.swapped == (x0, x1) and sk.prefetch_at == {x0: 2, x1: 3}
    r = algorithm1(sk, T1, PCIE)
    assert [(b, s, e) for b, s, e in r.offloads] == [(x0, 2.0, 2.5), (x1, 3.0, 3.5)]
    assert [(b, s, e) for b, s, e in r.prefetches] == [(x0, 2.5, 3.0), (x1, 3.5, 4.0)]
    assert r.t_ready.tolist() == [0, 0, 0, 4.0, 3.0]
    assert r.violations == (3,) and r.stall.tolist() == [0, 0, 0, 1.0, 0]
    assert r.prefix().tolist() == [0, 1, 2, 3, 4]            # (6)'s right side
    assert r.t_iter == r.t_model == 5.0                       # against the stall-free schedule
    # with the wait propagated, step 3 starts at 4 and the iteration ends at 6
    p = algorithm1(sk, T1, PCIE, propagate=True)
    assert p.start.tolist() == [0, 1, 2, 4, 5] and p.t_iter == 6.0 and p.violations == (3,)


def test_algorithm1_memory_bound_prefetch_waits_for_the_release():
    """x1 pinned, a scratch buffer w at step 3: with room for x0 beside x1 and w (3 KiB) x0
    comes back at once; with 2.5 KiB it cannot come back before x1 and w are released after
    step 3: its prefetch is issued before step 4 and waits for step 3 to end (the paper's
    j_satisfied), so step 4 is late by the whole transfer."""
    g = hand_gmap([(s.name, s.phase) for s in chain().steps],
                  [("x0", DATA, 1024, (0, 1, 4)), ("x1", DATA, 1024, (1, 2, 3)),
                   ("w", SCRATCH, 1024, (3,))])
    x0, x1 = g.find("x0").id, g.find("x1").id
    roomy = sketch(g, 3072, pinned={x1})
    assert roomy.swapped == (x0,) and roomy.prefetch_at == {x0: 2}
    assert algorithm1(roomy, T1, PCIE).feasible
    tight = sketch(g, 2560, pinned={x1})
    assert tight.prefetch_at == {x0: 4} and tight.usage.max() <= 2560
    r = algorithm1(tight, T1, PCIE)
    assert dict((b, (s, e)) for b, s, e in r.prefetches) == {x0: (4.0, 4.5)}
    assert r.violations == (4,) and r.stall[4] == pytest.approx(0.5)
    assert r.t_ready[4] == 4.5


def test_eq4_in_time_makes_a_step_wait_for_an_offload():
    """A step whose allocation needs the bytes of an offload still in flight waits for it."""
    steps = [("L0", FORWARD), ("L1", FORWARD), ("L2", FORWARD), ("L1", BACKWARD)]
    g = hand_gmap(steps, [("x0", DATA, 1024, (0, 1, 3)), ("w", SCRATCH, 1024, (2,))])
    slow = PCIeModel(h2d=1024 / 1.5, d2h=1024 / 1.5)   # 1.5 s per copy
    r = algorithm1(sketch(g, 1024), np.ones(4), slow)
    # x0 offloaded after step 1 in [2, 3.5]; step 2 needs its 1024 bytes: ready at 3.5
    assert r.offloads[0][1:] == (2.0, 3.5)
    assert r.t_ready[2] == 3.5 and 2 in r.violations


def test_choose_pins_pins_the_feature_map_that_stalls():
    g = chain()
    x1 = g.find("x1").id
    res = choose_pins(g, AMPLE, T1, PCIE)
    assert res.feasible and res.pinned == {x1} and res.rounds == 1
    assert res.readiness.violations == ()
    # a link so slow that x0 cannot hide either: both pinned
    slow = PCIeModel(h2d=1024 / 2, d2h=1024 / 2)
    assert choose_pins(g, AMPLE, T1, slow).pinned == {g.find("x0").id, x1}
    # no room to pin x0 (budget = one feature map beside x1... x0 and x1 coexist at step 1
    # anyway, so pins are free here; a scratch at step 2 makes x0's pin cost memory)
    g2 = hand_gmap([(s.name, s.phase) for s in g.steps],
                   [("x0", DATA, 1024, (0, 1, 4)), ("x1", DATA, 1024, (1, 2, 3)),
                    ("w", SCRATCH, 1024, (2,))])
    res = choose_pins(g2, 2048, T1, slow)
    assert not res.feasible and "fits in the spare memory" in res.reason


def rules_case():
    """`b` (4 KiB) and `a` (1 KiB) are offloaded after step 2 and prefetched back to back
    (b first: it is needed first, at step 5).  b's 3.2 s copy hides behind steps 3 and 4, but
    a's 0.8 s copy then ends at 7.4 s, after step 5 (7.2 s): step 6 breaks (6) by 0.2 s."""
    steps = [("L0", FORWARD), ("L1", FORWARD), ("L2", FORWARD), ("L3", FORWARD),
             ("L3", BACKWARD), ("L2", BACKWARD), ("L1", BACKWARD)]
    g = hand_gmap(steps, [("b", DATA, 4096, (1, 2, 5)), ("a", DATA, 1024, (0, 2, 6))])
    times = np.array([1.0, 1.0, 1.0, 3.5, 0.2, 0.5, 1.0])
    return g, times, PCIeModel(h2d=1024 / 0.8, d2h=1024 / 0.1)


def test_the_two_pinning_rules_differ_as_documented():
    """The stall rule pins what the late step waits for (a); the ratio rule pins the most
    bytes per compute time of the step before the first backward use: b, whose use follows a
    0.2 s step (4096 / 0.2 against a's 1024 / 0.5).  Both remove the violation."""
    g, times, pcie = rules_case()
    a, b = g.find("a").id, g.find("b").id
    r = algorithm1(sketch(g, AMPLE), times, pcie)
    pre = {x: (s0, e) for x, s0, e in r.prefetches}
    assert pre[b] == pytest.approx((3.4, 6.6)) and pre[a] == pytest.approx((6.6, 7.4))
    assert r.violations == (6,) and r.stall[6] == pytest.approx(0.2)
    stall = choose_pins(g, AMPLE, times, pcie, rule="stall")
    ratio = choose_pins(g, AMPLE, times, pcie, rule="ratio")
    assert stall.feasible and stall.pinned == {a}
    assert ratio.feasible and ratio.pinned == {b}
    # the stall rule keeps more bytes off the device
    assert sum(stall.sketch.sizes[x] for x in stall.pinned) < \
        sum(ratio.sketch.sizes[x] for x in ratio.pinned)
    with pytest.raises(ValueError, match="unknown pinning rule"):
        choose_pins(g, AMPLE, times, pcie, rule="random")


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_sketcher_is_sketch(build_net, which):
    """The fast Sketcher places prefetches exactly as swap.plan does (via sketch)."""
    g = build_gmap(build_net(which, 4)).at(16)
    need = min_budget(g, "naive")
    fms = g.feature_maps()
    rng = np.random.default_rng(0)
    for budget in (None, need, int(need * 1.3), 4 * need):
        fast = Sketcher(g, budget)
        for _ in range(4):
            pinned = frozenset(int(b) for b in rng.choice(fms, rng.integers(0, len(fms)),
                                                          replace=False))
            hold = {int(b): int(rng.integers(0, g.n_steps)) for b in rng.choice(fms, 3)}
            a, b = sketch(g, budget, pinned, hold), fast.sketch(pinned, hold)
            assert a.swapped == b.swapped and a.prefetch_at == b.prefetch_at
            assert a.release_at == b.release_at and a.setup == b.setup
            assert (a.usage == b.usage).all() and (a.jit_usage == b.jit_usage).all()


def test_simulate_replays_the_runtime_dependencies():
    """The op-level replay of the executable plan of the chain: same times as Algorithm 1
    with the wait propagated, every op timed, eq. (4) and the regions checked in time."""
    g = chain()
    plan = make_plan(g, "naive", None)
    tl = simulate(plan, T1, PCIE)
    r = algorithm1(sketch(g, None), T1, PCIE, propagate=True)
    # jit (no budget): prefetches just before their step, so step 4 waits too
    assert tl.violations() == (3, 4)
    ops = plan.ops
    for i, op in enumerate(ops):
        if op.kind == OFFLOAD:
            assert tl.op_start[i] == tl.step_end[op.wait_step]
            assert tl.op_end[i] - tl.op_start[i] == pytest.approx(0.5)
        if op.kind == RELEASE and op.stream == SWAP_OUT:
            assert tl.op_end[i] == tl.op_end[op.after[0]]      # when its offload is done
    assert tl.t_iter > r.t_model
    tl.check_eq4(plan.arena_bytes)
    tl.check_regions()
    rows = tl.rows()
    assert {s for s, *_ in rows} == {"compute", "swap_out", "swap_in"}
    with pytest.raises(AssertionError, match="eq. \\(4\\) violated in time"):
        tl.check_eq4(plan.arena_bytes - 1)


def test_dynamic_plan_of_the_chain_is_stall_free():
    g = chain()
    dyn = make_dynamic_plan(g, AMPLE, T1, PCIE, fill=False)     # the paper's pins only
    assert dyn.feasible and dyn.plan.strategy == "dynamic"
    assert dyn.plan.pinned == {g.find("x1").id}
    assert dyn.timeline.total_stall == 0 and dyn.timeline.t_iter == pytest.approx(5.0)
    # with the spare memory filled, the ample budget keeps every feature map
    full = make_dynamic_plan(g, AMPLE, T1, PCIE)
    assert full.feasible and full.plan.pinned == set(g.feature_maps())
    assert not full.plan.offloaded and full.timeline.total_stall == 0


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_fill_pins_what_the_spare_memory_holds(build_net, which):
    """The filled plan keeps the paper's pins, adds the smallest offloaded feature maps that
    fit, never breaks eq. (4) or the budget, and stalls no more than the unfilled plan."""
    from swap.planner import spare_pins
    g = build_gmap(build_net(which, 4))
    times = ComputeModel.uniform(ThroughputCurve(1e9, 1e5)).step_times(g)
    pcie = PCIeModel(h2d=5e8, d2h=5e8)
    lo, hi = min_budget(g, "naive"), min_budget(g, "none")
    grew = 0
    for f in (1.0, 1.2, 1.5, 2.0):
        budget = int(lo * f)
        paper = make_dynamic_plan(g, budget, times, pcie, fill=False)
        filled = make_dynamic_plan(g, budget, times, pcie)
        assert paper.plan.pinned <= filled.plan.pinned
        assert filled.plan.arena_bytes <= budget
        filled.timeline.check_eq4(budget)
        filled.timeline.check_regions()
        tol = 1e-3 * paper.timeline.t_model
        assert filled.timeline.total_stall <= paper.timeline.total_stall + tol
        grew += len(filled.plan.pinned) > len(paper.plan.pinned)
        extra = spare_pins(paper.pins.sketch, budget)
        sizes = paper.pins.sketch.sizes
        assert extra == sorted(extra, key=lambda b: (sizes[b], b))      # smallest first
        assert set(extra) <= set(paper.plan.offloaded)
    assert grew                     # somewhere between naive and none there was room
    assert not make_dynamic_plan(g, hi + (1 << 20), times, pcie).plan.offloaded


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_a_plan_that_offloads_nothing_runs_resident_where_caffes_plan_fits(build_net, which):
    """With the fill, nothing offloaded and room for Caffe's plan: the plan is "none" (no
    operation between the steps), every feature map pinned, its replay the same compute; with
    a budget between the all-pinned dynamic plan and Caffe's, the dynamic plan stays; without
    the fill, the paper's plan stays whatever the budget."""
    from swap.planner import resident
    g = build_gmap(build_net(which, 4))
    times = ComputeModel.uniform(ThroughputCurve(1e9, 1e5)).step_times(g)
    pcie = PCIeModel(h2d=5e8, d2h=5e8)
    hi = min_budget(g, "none")
    ample = make_dynamic_plan(g, hi, times, pcie)
    assert ample.plan.strategy == "none" and ample.plan.arena_bytes <= hi
    assert ample.plan.pinned == frozenset(g.feature_maps()) and not ample.plan.offloaded
    assert {op.step for op in ample.plan.ops} <= {SETUP}
    assert ample.timeline.t_model == pytest.approx(float(np.sum(times)))
    assert ample.feasible
    paper = make_dynamic_plan(g, hi, times, pcie, fill=False)
    assert paper.plan.strategy == "dynamic"
    all_pinned = make_plan(g, "dynamic", None, frozenset(g.feature_maps()))
    between = all_pinned.arena_bytes
    assert between < hi
    tight = make_dynamic_plan(g, between, times, pcie)
    assert tight.plan.strategy == "dynamic"
    assert resident(g, between, times, pcie, tight) is tight
    assert resident(g, None, times, pcie, tight) is tight


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_where_caffes_plan_does_not_fit_the_scratch_alone_moves(build_net, which):
    """Nothing offloaded, Caffe's plan too large (it holds every scratch buffer at once), the
    plan that holds everything but the scratch fits: the dynamic plan becomes that one
    ("resident"), whose only ops between the steps are the scratch's; one byte less and the
    dynamic plan stays; room for Caffe's plan and it is "none"."""
    g = build_gmap(build_net(which, 4))
    times = ComputeModel.uniform(ThroughputCurve(1e9, 1e5)).step_times(g)
    pcie = PCIeModel(h2d=5e8, d2h=5e8)
    need = min_budget(g, "resident")
    assert make_plan(g, "dynamic", None, frozenset(g.feature_maps())).arena_bytes < need \
        < min_budget(g, "none")
    dyn = make_dynamic_plan(g, need, times, pcie)
    assert dyn.plan.strategy == "resident" and not dyn.plan.offloaded
    assert dyn.plan.pinned == frozenset(g.feature_maps())
    assert {g.buffers[op.buffer].kind for op in dyn.plan.ops if op.step != SETUP} == {"scratch"}
    assert dyn.timeline.t_model == pytest.approx(float(np.sum(times))) and dyn.feasible
    assert make_dynamic_plan(g, need - 1, times, pcie).plan.strategy == "dynamic"
    assert make_dynamic_plan(g, min_budget(g, "none"), times, pcie).plan.strategy == "none"


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_chosen_plans_never_violate_eq4_in_simulation(build_net, which):
    """Property: for random budgets, minibatches and links, the dynamic plan's replay keeps
    allocated minus released bytes within the budget at every instant, and no two buffers
    share arena bytes at the same time."""
    g0 = build_gmap(build_net(which, 4))
    rng = np.random.default_rng(7)
    model = ComputeModel.uniform(ThroughputCurve(2e9, 1e5))
    for _ in range(6):
        k = int(rng.integers(2, 64))
        g = g0.at(k)
        need = min_budget(g, "naive")
        budget = int(need * rng.uniform(1.0, 3.0))
        pcie = PCIeModel(h2d=float(rng.uniform(1e8, 1e10)), d2h=float(rng.uniform(1e8, 1e10)),
                         both=None)
        dyn = make_dynamic_plan(g, budget, model.step_times(g), pcie)
        assert dyn.plan.arena_bytes <= budget
        assert dyn.timeline.check_eq4(budget) <= budget
        dyn.timeline.check_regions()
        assert (np.diff(dyn.timeline.step_start) >= 0).all()
        # and the naive plan's replay too
        naive = make_plan(g, "naive", budget)
        tl = simulate(naive, model.step_times(g), pcie)
        tl.check_eq4(budget)
        tl.check_regions()


def test_hold_keeps_offloaded_regions_until_the_copy_is_done(build_net):
    """hold_steps: the step during which each offload completes; the plan made with it
    releases those regions after that step, so no allocation waits for an offload."""
    g = build_gmap(build_net("resnet", 4)).at(64)
    times = ComputeModel.uniform(ThroughputCurve(1e9, 1e5)).step_times(g)
    pcie = PCIeModel(h2d=5e8, d2h=5e8)
    budget = 2 * min_budget(g, "naive")
    pins = choose_pins(g, budget, times, pcie)
    hold = hold_steps(pins.sketch, pins.readiness)
    assert hold and all(h > pins.sketch.last_fwd[b] for b, h in hold.items())
    plain = make_plan(g, "dynamic", budget, pins.pinned)
    held = make_plan(g, "dynamic", budget, pins.pinned, hold=hold)
    assert held.arena_bytes <= budget
    rel = {op.buffer: op.step for op in held.ops if op.kind == RELEASE and op.stream == SWAP_OUT}
    off = {op.buffer: op.step for op in held.ops if op.kind == OFFLOAD}
    for b, h in hold.items():
        assert off[b] == pins.sketch.last_fwd[b] and rel[b] == h
    t_plain, t_held = simulate(plain, times, pcie), simulate(held, times, pcie)
    # without the hold, allocations reuse regions still being copied out and wait
    assert t_plain.total_stall > 0 and t_held.total_stall == 0
    # no allocation in the held plan waits for a swap-out release
    for i, op in enumerate(held.ops):
        if op.kind == ALLOCATE:
            assert t_held.op_start[i] <= t_held.step_start[op.step] + 1e-12


def test_dynamic_plans_with_hold_train_bit_identically(make_solver):
    """The executor runs a dynamic plan (pins and holds) exactly like the plain run."""
    from swap.runtime import Executor
    base = make_solver("resnet")
    for _ in range(6):
        base.step(1)
    s = make_solver("resnet")
    g = build_gmap(s.net)
    times = ComputeModel.uniform(ThroughputCurve(1e9, 1e5)).step_times(g)
    pcie = PCIeModel(h2d=5e8, d2h=5e8)
    budget = 2 * min_budget(g, "naive")
    dyn = make_dynamic_plan(g, budget, times, pcie, fill=False)
    assert dyn.plan.pinned and dyn.plan.offloaded
    off = {op.buffer: op.step for op in dyn.plan.ops if op.kind == OFFLOAD}
    held = [op.buffer for op in dyn.plan.ops
            if op.kind == RELEASE and op.stream == SWAP_OUT and op.step > off[op.buffer]]
    assert held                       # some regions are held past their offload
    ex = Executor(s.net, dyn.plan, budget=budget, solver=s, poison=True)
    s.net.executor = ex
    for _ in range(6):
        s.step(1)
    for p, q in zip(base.net.learnable_params, s.net.learnable_params):
        assert np.array_equal(np.asarray(p.data), np.asarray(q.data))
    assert ex.high_water <= budget
    ex.close()


def test_plot_timeline_with_an_observed_trace(make_solver, tmp_path):
    pytest.importorskip("matplotlib")
    from swap.runtime import install
    s = make_solver("lenet")
    trace = tmp_path / "trace.csv"
    ex = install(s, "naive", None, trace=str(trace))
    for _ in range(3):
        s.step(1)
    ex.close()
    obs = read_trace(trace)
    g = ex.gmap
    assert obs["iteration"] == 2 and obs["step"] == list(range(g.n_steps))
    assert (obs["end"] >= obs["start"]).all() and obs["start"][0] == 0
    times = ComputeModel.uniform(ThroughputCurve(1e9, 1e5)).step_times(g)
    tl = simulate(make_plan(g, "naive", None), times, PCIeModel(1e9, 1e9))
    out = plot_timeline(tl, tmp_path / "t.png", trace=trace)
    assert (tmp_path / "t.png").stat().st_size > 1000 and out == tmp_path / "t.png"
    plot_timeline(tl, tmp_path / "u.png")
    assert (tmp_path / "u.png").exists()
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a --memory-trace CSV"):
        read_trace(bad)


def test_copies_beside_a_step_stretch_it_in_both_replays():
    """The chain with copies that slow compute by half (out) and a quarter (in).  Step 2
    starts at 2 beside x0's offload (until 2.5), then its prefetch (2.5 to 3): 1/3 s of work
    in the first half second, 0.4 s in the second, and the rest alone, 1.267 s in all.  The
    iteration ends later by the interference; with no slowdown both replays are as before."""
    g = chain()
    slow = PCIeModel(h2d=BW, d2h=BW, both=None, slow_out=0.5, slow_in=0.25)
    sk = sketch(g, AMPLE)
    plain = algorithm1(sk, T1, PCIE)
    r = algorithm1(sk, T1, slow)
    assert r.interference > 0 and plain.interference == 0
    assert (r.end - r.start >= T1 - 1e-12).all()
    assert r.t_iter == pytest.approx(plain.t_iter + r.interference)
    assert r.end[2] - r.start[2] == pytest.approx(1.0 + (1 - 0.5 / 1.5 - 0.5 / 1.25))
    assert r.end[0] - r.start[0] == 1.0 and r.end[1] - r.start[1] == 1.0   # nothing beside
    p = make_plan(g, "dynamic", AMPLE)
    tl, tl0 = simulate(p, T1, slow), simulate(p, T1, PCIE)
    assert tl.interference > 0 and tl0.interference == 0
    assert tl.t_iter >= tl0.t_iter
    assert (tl.step_end - tl.step_start >= T1 - 1e-12).all()
