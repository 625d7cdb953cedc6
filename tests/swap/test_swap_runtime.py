"""swap.runtime: the executor replays plans around the net, bit for bit, inside the budget."""
import csv
import dataclasses

import numpy as np
import pytest

from minicaffe.layer import BackwardReads
from minicaffe.testing import train_steps
from swap.plan import OFFLOAD, PREFETCH, BudgetError, min_budget
from swap.runtime import (FREED, OFFLOADING, ON_DEVICE, ON_HOST, PREFETCHING, Executor,
                          Residency, ResidencyError, install, set_lowering)


def train(make_solver, which, iters=20, strategy=None, budget=None, type="SGD", lowering=None,
          **kw):
    """Train ``iters`` iterations; return (params, history, losses, executor).  lowering: the
    convolutions' im2col ("caffe" or "chunked"; None: the strategy's default)."""
    return train_steps(make_solver(which, type=type), iters, strategy, budget, lowering, **kw)


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("lowering", ["chunked", "caffe"])
@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_swapping_trains_bit_identically(make_solver, which, lowering):
    """20 iterations under none, naive (just in time and with room to prefetch early) and vdnn
    give exactly the parameters, solver history and losses of the plain run with the same
    convolution lowering, with every fresh or released region poisoned with NaN."""
    base = train(make_solver, which, lowering=lowering)
    from swap.gmap import build_gmap
    need = min_budget(build_gmap(make_solver(which).net), "naive")
    for strategy, budget in [("none", None), ("naive", None), ("naive", 3 * need),
                             ("vdnn", None)]:
        params, history, losses, ex = train(make_solver, which, strategy=strategy, budget=budget,
                                            lowering=lowering)
        assert same(params, base[0]), (strategy, budget)
        assert same(history, base[1]), (strategy, budget)
        assert losses == base[2], (strategy, budget)
        assert ex.iterations == 20
        # the arena is exactly the budget; the layout's extent was reached, never passed
        assert ex.device.capacity == (budget or ex.plan.arena_bytes)
        assert ex.high_water == ex.plan.arena_bytes <= ex.device.capacity
        assert ex.peak_in_use == ex.plan.peak
        if strategy != "none":
            assert ex.plan.offloaded and ex.host.nbytes == ex.plan.host_bytes


def test_adam_history_lives_in_the_arena(make_solver):
    base = train(make_solver, "lenet", iters=8, type="Adam")
    params, history, losses, ex = train(make_solver, "lenet", iters=8, strategy="naive",
                                        type="Adam")
    assert same(params, base[0]) and same(history, base[1])
    second = ex.solver.rule.second[0]
    assert np.shares_memory(second, ex.device.buffer)


def test_the_net_sees_arena_memory_only_while_the_plan_holds_it(make_solver):
    s = make_solver("lenet")
    ex = install(s, "naive")
    assert s.net.executor is ex
    p = s.net.learnable_params[0]
    assert np.shares_memory(p.data, ex.device.buffer) and np.shares_memory(p.diff,
                                                                           ex.device.buffer)
    assert np.shares_memory(s.history[0], ex.device.buffer)
    s.step(2)
    with pytest.raises(RuntimeError, match="released"):
        s.net.blobs["conv1"].data                       # between iterations: not held
    assert float(s.net.blobs["loss"].data) > 0          # a net output: resident
    assert all(ex.residency[b.id] == FREED for b in ex.gmap.buffers
               if b.id not in ex._resident)


def test_forward_only_pass_and_partial_passes(make_solver):
    s = make_solver("resnet")
    ex = install(s, "naive", poison=True)
    out = s.net.forward()                               # pycaffe's full forward
    assert np.isfinite(out["loss"]).all()
    assert ex.device.in_use == ex.plan.setup_bytes      # everything per-iteration dropped
    s.step(1)                                           # and training goes on
    with pytest.raises(RuntimeError, match="whole passes"):
        s.net.forward_from_to(0, 3)
    with pytest.raises(RuntimeError, match="whole passes"):
        s.net.backward()


def test_close_gives_the_net_its_arrays_back(make_solver):
    base = train(make_solver, "resnet", iters=10)
    s = make_solver("resnet")
    ex = install(s, "vdnn", poison=True)
    s.step(5)
    ex.close()
    assert s.net.executor is None
    s.step(5)
    assert same([np.array(p.data) for p in s.net.learnable_params], base[0])
    assert not np.shares_memory(s.net.learnable_params[0].data, ex.device.buffer)


def test_budget_too_small_fails_before_the_first_iteration(make_solver):
    s = make_solver("resnet")
    from swap.gmap import build_gmap
    need = min_budget(build_gmap(s.net), "naive")
    with pytest.raises(BudgetError) as e:
        install(s, "naive", need - 4096)
    assert e.value.min_budget == need
    assert "smallest budget that works is" in str(e.value)
    assert "largest minibatch that fits" in str(e.value) and 0 < e.value.max_k < 4
    assert s.net.executor is None and s.iter == 0
    ex = install(s, "naive", need)                      # the smallest budget works
    s.step(2)
    assert ex.high_water <= need


def test_residency_transitions():
    r = Residency(["a"])
    assert r[0] == FREED
    for event, state in [("allocate", ON_DEVICE), ("offload", OFFLOADING), ("release", ON_HOST),
                         ("prefetch", PREFETCHING), ("ready", ON_DEVICE), ("release", FREED)]:
        assert r.apply(0, event) == state
    with pytest.raises(ResidencyError, match="cannot prefetch while FREED"):
        r.apply(0, "prefetch")
    with pytest.raises(ResidencyError, match="cannot offload while FREED"):
        r.apply(0, "offload")
    r.apply(0, "allocate")
    with pytest.raises(ResidencyError, match="cannot allocate while ON_DEVICE"):
        r.apply(0, "allocate")
    r.apply(0, "offload")
    with pytest.raises(ResidencyError, match="legal from OFFLOADING: release"):
        r.apply(0, "prefetch")


def _broken(plan, fn):
    return dataclasses.replace(plan, ops=tuple(fn(i, op) for i, op in enumerate(plan.ops)))


def test_a_plan_that_prefetches_too_late_is_caught(make_solver):
    s = make_solver("lenet")
    ex = install(s, "naive")
    plan = ex.plan
    ex.close()
    victim = next(i for i, op in enumerate(plan.ops) if op.kind == PREFETCH)
    late = _broken(plan, lambda i, op: dataclasses.replace(op, step=op.step + 1)
                   if i == victim else op)
    s.net.executor = Executor(s.net, late, solver=s)
    name = plan.gmap.buffers[plan.ops[victim].buffer].name
    with pytest.raises(ResidencyError, match=f"needs buffer '{name}', which is ON_HOST"):
        s.step(1)


def test_an_illegal_transition_in_a_plan_raises(make_solver):
    s = make_solver("lenet")
    ex = install(s, "naive")
    plan = ex.plan
    ex.close()
    first_off = next(i for i, op in enumerate(plan.ops) if op.kind == OFFLOAD)
    # offload the same buffer a second time, right after the first offload
    twice = dataclasses.replace(plan, ops=plan.ops[:first_off + 1] + plan.ops[first_off:])
    s.net.executor = Executor(s.net, twice, solver=s)
    with pytest.raises(ResidencyError, match="cannot offload while OFFLOADING"):
        s.step(1)


def test_an_undeclared_backward_read_is_caught(make_solver):
    """A layer whose backward reads a bottom it does not declare: the plan frees that bottom
    after forward, and the read raises instead of using stale memory."""
    s = make_solver("lenet")
    conv2 = s.net.layers[s.net.layer_index("conv2")]
    conv2.backward_reads = lambda: BackwardReads()        # a lie: it reads pool1 for dW
    install(s, "naive", poison=True)
    with pytest.raises(RuntimeError, match="pool1.*released"):
        s.step(1)


def test_memory_trace(make_solver, tmp_path):
    path = tmp_path / "trace.csv"
    s = make_solver("resnet")
    ex = install(s, "naive", trace=str(path))
    s.step(3)
    ex.close()
    rows = list(csv.DictReader(open(path)))
    g = ex.gmap
    assert len(rows) == 3 * g.n_steps
    assert list(rows[0]) == list(ex.trace.FIELDS)
    for it in range(3):
        mine = [r for r in rows if int(r["iteration"]) == it]
        assert [int(r["step"]) for r in mine] == list(range(g.n_steps))
        alloc = sum(int(r["allocated_compute"]) + int(r["allocated_swap_in"]) for r in mine)
        freed = sum(int(r["released_compute"]) + int(r["released_swap_out"]) for r in mine)
        assert alloc == freed > 0                        # every iteration gives it all back
        assert sum(int(r["offloaded"]) for r in mine) == \
            sum(int(r["prefetched"]) for r in mine) == ex.plan.host_bytes
        assert all(float(r["t_end_ms"]) >= float(r["t_ready_ms"]) >= float(r["t_start_ms"])
                   for r in mine)
    assert max(int(r["in_use"]) for r in rows) <= ex.budget
    assert int(rows[-1]["high_water"]) == ex.high_water


def test_executor_refuses_a_plan_for_another_net(make_solver):
    s = make_solver("lenet")
    ex = install(s, "naive")
    other = make_solver("resnet")
    with pytest.raises(ValueError, match="was made for net 'lenet_like'"):
        Executor(other.net, ex.plan)
    with pytest.raises(BudgetError):
        Executor(s.net, ex.plan, budget=ex.plan.arena_bytes - 1)


def test_none_allocates_what_caffe_allocates(make_solver):
    """`none` lowers one image at a time by default, as Caffe does: its arena is the Caffe
    accounting of the net, and the plain net trained with Caffe's lowering is reproduced bit
    for bit.  The chunked lowering of the other strategies needs more for `none`."""
    from swap.gmap import build_gmap
    from swap.memory import caffe_breakdown
    from swap.plan import make_plan
    base = train(make_solver, "resnet", iters=4, lowering="caffe")
    params, history, losses, ex = train(make_solver, "resnet", iters=4, strategy="none")
    assert same(params, base[0]) and losses == base[2]
    assert all(layer.col_buffer_bytes == 0 for layer in ex.net.layers
               if layer.type == "Convolution")
    caffe = sum(caffe_breakdown(ex.gmap).values())
    assert ex.plan.arena_bytes == make_plan(ex.gmap, "none").arena_bytes
    chunked = build_gmap(make_solver("resnet").net)
    assert make_plan(chunked.caffe_lowering(), "none").arena_bytes == ex.plan.arena_bytes
    assert make_plan(chunked, "none").arena_bytes > ex.plan.arena_bytes
    from swap.gmap import CAFFE
    assert ex.gmap.total() + ex.gmap.total((CAFFE,)) == caffe
    from swap.arena import ALIGN
    # the plan aligns every buffer; nothing else separates it from Caffe's figure
    assert caffe <= ex.plan.peak <= caffe + ALIGN * len(ex.gmap.buffers)


@pytest.mark.parametrize("strategy", ["none", "naive"])
def test_a_closed_executor_leaves_nothing_holding_its_arena(make_solver, strategy):
    """The tuner builds a dozen executors in one process: once closed and released, nothing
    (a blob's cached view included) may keep an arena's memory alive, or the next cudaMalloc
    of a 12 GiB arena fails on a device that looks full."""
    import gc
    import weakref
    s = make_solver("resnet")
    ex = install(s, strategy)
    s.step(2)
    ref = weakref.ref(ex.device.buffer)
    ex.close()
    ex.device.release()
    del ex
    gc.collect()
    assert ref() is None
    s.step(1)                                # and the net trains on its own arrays


@pytest.mark.parametrize("poison", [False, True])
@pytest.mark.parametrize("strategy", ["naive", "vdnn"])
def test_compiled_iterations_train_like_op_by_op(make_solver, strategy, poison):
    """After the first iteration the executor runs from its compiled tables: the same
    parameters, history and losses as the op-by-op loop (and the plain run), at the smallest
    budget (regions reused as soon as the plan allows); the op-by-op issue methods are not
    called once compiled."""
    base = train(make_solver, "resnet", iters=6, lowering="chunked")
    slow = train(make_solver, "resnet", iters=6, strategy=strategy, lowering="chunked",
                 fast=False)
    s = make_solver("resnet")
    ex = install(s, strategy, poison=poison, lowering="chunked")
    assert ex.plan.offloaded
    losses = []
    for _ in range(2):
        s.step(1)
        losses.append(float(s._losses[-1]))
    assert ex._compiled is not None
    calls = []
    for kind, fn in list(ex._issue.items()):
        ex._own_issue[kind] = ex._issue[kind] = \
            (lambda fn: lambda i: (calls.append(i), fn(i)))(fn)
    ex._build_issue_tables()
    for _ in range(4):
        s.step(1)
        losses.append(float(s._losses[-1]))
    assert calls == []                      # the compiled tables ran, not the issue methods
    params = [np.array(p.data) for p in s.net.learnable_params]
    history = [np.array(h) for h in s.rule.state_blobs()]
    for ref in (base, slow):
        assert same(params, ref[0]) and same(history, ref[1]) and losses == ref[2]
    assert slow[3]._compiled is None        # fast=False never compiles


def test_compiled_iteration_follows_a_wrapped_copy(make_solver):
    """A wrapper of the streams' copy installed after the tables were compiled is seen by
    the next iteration (timers in scripts/ and the GPU race test wrap it)."""
    s = make_solver("lenet")
    ex = install(s, "naive")
    s.step(3)
    seen = []
    copy = ex.streams.copy

    def counted(dst, src, stream):
        seen.append(stream)
        copy(dst, src, stream)
    ex.streams.copy = counted
    s.step(1)
    assert len(seen) == sum(op.kind in (OFFLOAD, PREFETCH) for op in ex.plan.ops)


def _arrays_in(obj, depth=3):
    if isinstance(obj, np.ndarray):
        yield obj
    elif depth and isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _arrays_in(x, depth - 1)
    elif depth and isinstance(obj, dict):
        for x in obj.values():
            yield from _arrays_in(x, depth - 1)


def test_a_closed_executor_holds_no_view_of_its_arenas(make_solver):
    """Once closed, nothing the executor keeps (region views, copy pairs, compiled tables)
    points into its arenas: a closed executor that stays referenced does not keep the device
    memory (on the GPU the cudaMalloc goes when its last view does)."""
    s = make_solver("resnet")
    ex = install(s, "naive", lowering="chunked")
    s.step(3)                                   # op by op, then compiled
    dev, host = ex.device.buffer, ex.host.buffer
    held = [a for a in _arrays_in(vars(ex)) if np.shares_memory(a, dev)]
    assert held                                 # the check sees the views while it runs
    ex.close()
    for a in _arrays_in(vars(ex)):
        assert not np.shares_memory(a, dev)
        assert host is None or not np.shares_memory(a, host)


def test_lowering_bounds_cudnn_workspaces_as_caffe_or_by_the_budget(monkeypatch, recording_net):
    """Caffe's scratch ("caffe") bounds a cuDNN convolution's workspace by Caffe's 8 MiB per
    algorithm; minicaffe's ("chunked") by 8 MiB per image up to a quarter of the budget (the
    engine's own 4 GiB without one); the user's $MINICAFFE_CUDNN_WORKSPACE_LIMIT wins over
    both."""
    monkeypatch.delenv("MINICAFFE_CUDNN_WORKSPACE_LIMIT", raising=False)
    monkeypatch.delenv("MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE", raising=False)
    Net = recording_net
    assert set_lowering(Net, "caffe") == 2
    assert set_lowering(Net, "chunked", 12 << 30) == 2
    assert set_lowering(Net, "chunked") == 2
    monkeypatch.setenv("MINICAFFE_CUDNN_WORKSPACE_LIMIT", "1M")
    set_lowering(Net, "caffe")
    for conv in (Net.layers[0], Net.layers[2]):
        assert conv.limits == [8 << 20, 3 << 30, 4 << 30, 1 << 20]
        assert conv.per_image == [0, 8 << 20, 0, 0]
    with pytest.raises(ValueError, match="lowering"):
        set_lowering(Net, "fast")


@pytest.mark.parametrize("strategy", ["none", "naive", "dynamic"])
def test_an_empty_workspace_is_no_residency_error(make_solver, strategy, monkeypatch):
    """A cuDNN convolution whose algorithms need no workspace at this k keeps an empty
    workspace buffer in the GMAP (it has bytes at other k); no plan places it, and a step
    that touches it runs (the GPU's ResidencyError: 'scratch:conv1/workspace ... FREED')."""
    from swap.gmap import build_gmap
    from swap.runtime import install
    s = make_solver("resnet", batch=4)
    conv = s.net.layers[s.net.layer_index("res2_a")]
    monkeypatch.setattr(type(conv), "workspace_model",
                        lambda self: (lambda num: 1 << 20) if self is conv else None)
    real_reshape = type(conv).reshape

    def reshape(self, bottom, top):
        real_reshape(self, bottom, top)
        if self is conv:
            self.add_internal("workspace", (0,), saved=False, batch_scaled=False,
                              dtype=np.uint8)
    monkeypatch.setattr(type(conv), "reshape", reshape)
    s.net.reshape()
    g = build_gmap(s.net)
    b = g.find("scratch:res2_a/workspace")
    assert b.nbytes(4) == 0 and b.nbytes(8) == 1 << 20
    ex = install(s, strategy, None)
    try:
        s.step(2)
    finally:
        ex.close()
