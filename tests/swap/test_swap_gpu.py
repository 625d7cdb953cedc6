"""GPU mode of the memory manager: one cudaMalloc of the budget, pinned host memory, three
streams ordered by events, every CuPy allocation served from the budget.  Skipped where no
CUDA device answers.

Run on the GPU machine with ``python3 scripts/gpu_checks.py tests/swap``.  Every executor a
test leaves open is closed after it (``runtime.close_all``), which also gives CuPy its own
allocator back, so one failure cannot leak the scratch allocator into the next test.
"""
import os
import sys

import numpy as np
import pytest

from swap import runtime
from swap.arena import ALIGN, DeviceArena
from swap.gmap import build_gmap
from swap.plan import RELEASE, make_plan, min_budget
from swap.planner import read_trace
from swap.runtime import ScratchOverflow, install, measure_scratch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:            # scripts/ is imported as a package
    sys.path.insert(0, REPO)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _close_executors():
    yield
    runtime.close_all()


@pytest.fixture(autouse=True)
def _chunked_lowering(monkeypatch):
    """Every strategy, `none` included, lowers convolutions in chunks here, so that the
    strategies are compared with the same GEMMs; `none`'s default (Caffe's one-image
    lowering) has a test of its own."""
    monkeypatch.setenv("MINICAFFE_LOWERING", "chunked")


def params_of(s):
    from minicaffe.backend import to_numpy
    return [to_numpy(p.data) for p in s.net.learnable_params]


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in zip(a, b))


def gpu_train(make_solver, which, strategy, iters=10, **kw):
    s = make_solver(which, mode="GPU")
    ex = install(s, strategy, **kw) if strategy else None
    losses = []
    for _ in range(iters):
        s.step(1)
        losses.append(float(s._losses[-1]))
    params = params_of(s)
    if ex is not None:
        ex.close()
    return params, losses, ex


# ------------------------------------------------------------------ arena
def test_device_arena_is_one_allocation_of_the_budget(cp):
    pool = cp.get_default_memory_pool()
    before = pool.used_bytes()
    budget = 3 << 20
    d = DeviceArena(budget, cp)
    assert isinstance(d.buffer, cp.ndarray) and d.buffer.nbytes == budget
    assert d.ptr % 256 == 0                         # + offsets of ALIGN: cuDNN's alignment
    assert pool.used_bytes() == before              # cudaMalloc outside CuPy's pool
    off = d.allocate(4096)
    v = d.view(off, 4096, np.float32)
    v[...] = 2
    assert float(d.view(off, 4096, np.float32).sum()) == 2048
    assert v.data.ptr == d.ptr + off


def test_views_of_a_large_arena_keep_32bit_indexing(cp):
    """A slice of an arena over 2 GiB would inherit 64-bit indexing (slower kernels); the
    executor's views are arrays of their own."""
    d = DeviceArena((2 << 30) + (4 << 20), cp)
    assert getattr(d.buffer, "_index_32_bits", False) is False
    off = d.allocate(1 << 20, offset=(2 << 30))      # beyond 2 GiB from the base
    v = d.view(off, 1 << 20, np.float32).reshape(2, 8, 128, 128)
    assert getattr(v, "_index_32_bits", True) is True
    v[...] = 1.5
    s = cp.arange(8, dtype=cp.float32)[None, :, None, None]
    w = v * s                                        # a broadcasting elementwise kernel
    assert float(w[1, 3].sum()) == 1.5 * 3 * 128 * 128
    assert v.data.ptr == d.ptr + off


# ----------------------------------------------------- training equivalence
@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_gpu_swapping_trains_like_none(make_solver, which):
    plain, plain_losses, _ = gpu_train(make_solver, which, None)
    ref, ref_losses, ex = gpu_train(make_solver, which, "none")
    assert ex.device.backing_bytes == ex.budget
    assert ex.device.buffer is None                  # closed: the arena's memory went back
    assert same(ref, plain), max_diff(ref, plain)
    for strategy in ("naive", "vdnn", "recompute"):
        params, losses, ex = gpu_train(make_solver, which, strategy, poison=True)
        assert ex.host.pinned and ex.plan.offloaded
        assert same(params, ref), (strategy, max_diff(params, ref))
        assert losses == ref_losses
        assert ex.high_water == ex.plan.arena_bytes <= ex.budget
        assert ex.transients is not None and ex.transients.peak > 0     # the dry run


def test_gpu_naive_with_early_prefetch_and_trace(make_solver, tmp_path):
    import csv
    ref, _, _ = gpu_train(make_solver, "resnet", "naive")
    need = min_budget(build_gmap(make_solver("resnet", mode="GPU").net), "naive")
    path = tmp_path / "trace.csv"
    params, _, ex = gpu_train(make_solver, "resnet", "naive", budget=3 * need + (64 << 20),
                              scratch=64 << 20, trace=str(path))
    assert ex.scratch.capacity >= 64 << 20 and ex.high_water <= ex.budget
    assert same(params, ref), max_diff(params, ref)
    rows = list(csv.DictReader(open(path)))
    assert len(rows) == 10 * ex.gmap.n_steps
    assert all(float(r["t_end_ms"]) >= float(r["t_ready_ms"]) >= float(r["t_start_ms"]) >= 0
               for r in rows)
    trace = read_trace(path)            # the last iteration, its waits apart from its compute
    assert (trace["ready"] >= trace["start"]).all() and (trace["end"] >= trace["ready"]).all()


def test_gpu_poison_fills_released_regions(make_solver, cp):
    s = make_solver("lenet", mode="GPU")
    ex = install(s, "naive", poison=True)
    s.step(2)
    cp.cuda.Device().synchronize()
    released = [op for op in ex.plan.ops if op.kind == RELEASE]
    assert released
    host = ex.device.buffer.get()
    for op in released:          # between iterations every per-iteration region is free
        assert (host[op.offset:op.offset + op.nbytes] == 0xFF).all(), op


# ------------------------------------------------------- the scratch reserve
def test_cupy_allocations_come_from_the_reserve(make_solver, cp):
    tp = measure_scratch(make_solver("resnet", mode="GPU"), "naive")
    assert tp.peak > 0 and len(tp.per_step) > 0
    s = make_solver("resnet", mode="GPU")
    pool = cp.get_default_memory_pool()
    prev = cp.cuda.get_allocator()
    budget = tp.budget(margin=0.5)
    ex = install(s, "naive", budget, scratch=tp.reserve(margin=0.5))
    before = pool.total_bytes()
    assert cp.cuda.get_allocator() == ex._allocator.malloc
    x = cp.ones(1000, dtype=cp.float32)              # any CuPy allocation, while installed
    assert ex.device.ptr + ex.scratch.base <= x.data.ptr < ex.device.ptr + ex.budget
    del x
    s.step(4)
    assert pool.total_bytes() == before              # nothing new outside the budget
    assert ex._allocator.fallbacks == 0
    assert 0 < ex.scratch.high_water <= ex.scratch.capacity
    assert ex.high_water == max(ex.plan.arena_bytes, ex.scratch.base + ex.scratch.high_water)
    assert ex.high_water <= ex.budget
    assert "scratch reserve" in ex.report() and "transients measured" in ex.report()
    y0 = cp.ones(10)                                 # allocated in the reserve
    assert ex.device.ptr <= y0.data.ptr < ex.device.ptr + ex.budget
    ex.close()
    assert cp.cuda.get_allocator() == prev
    y = cp.ones(10)                  # CuPy's own pool again (the arena itself is given back)
    assert ex.device.buffer is None and y.data.mem is not y0.data.mem


def test_an_allocation_beyond_the_reserve_names_the_step(make_solver, cp):
    s = make_solver("resnet", mode="GPU")
    plan = make_plan(build_gmap(s.net), "none")
    prev = cp.cuda.get_allocator()
    ex = install(s, "none", plan.arena_bytes + ALIGN, measure=0)    # strict from the start
    assert ex.scratch.capacity == ALIGN
    with pytest.raises(ScratchOverflow) as e:
        s.step(2)
    msg = str(e.value)
    assert "scratch reserve exhausted" in msg and f"holds {ALIGN} B" in msg, msg
    assert ("at step " in msg and "layer" in msg) or "between steps" in msg, msg
    assert e.value.min_budget > plan.arena_bytes + ALIGN
    ex.close()
    assert cp.cuda.get_allocator() == prev


def test_the_dry_run_measures_then_enforces(make_solver):
    s = make_solver("resnet", mode="GPU")
    plan = make_plan(build_gmap(s.net), "none")
    budget = plan.arena_bytes + 4096
    ex = install(s, "none", budget)                  # measure=1: the first iteration counts
    s.step(1)                                        # overflowing allocations fall back
    assert ex._allocator.fallbacks > 0
    with pytest.raises(ScratchOverflow, match="the dry run measured") as e:
        s.step(1)
    assert e.value.min_budget == ex.transients.budget() > budget
    ex.close()
    # not strict: the same budget trains, every overflow falls back with a warning
    ref, _, _ = gpu_train(make_solver, "resnet", "none", iters=3)
    params, _, ex = gpu_train(make_solver, "resnet", "none", iters=3, budget=budget,
                              strict=False)
    assert ex._allocator.fallbacks > 0 and same(params, ref)


# -------------------------------------------------------------- the race test
SPIN = r"""
extern "C" __global__ void minicaffe_spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


class Spinner:
    """A one-thread kernel that keeps a stream busy for about ``ms`` milliseconds."""

    def __init__(self, cp):
        self.cp = cp
        self.kernel = cp.RawKernel(SPIN, "minicaffe_spin")
        self.kernel((1,), (1,), (np.int64(1000),))                 # compile, load
        cp.cuda.Device().synchronize()
        n = 2_000_000
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        self.kernel((1,), (1,), (np.int64(n),))
        e1.record()
        e1.synchronize()
        self.cycles_per_ms = n / max(cp.cuda.get_elapsed_time(e0, e1), 1e-3)

    def __call__(self, stream, ms):
        with stream:
            self.kernel((1,), (1,), (np.int64(int(ms * self.cycles_per_ms)),))


def spun_steps(s, ex, cp, iters: int = 4):
    """``iters`` steps of solver ``s`` under executor ``ex`` with long kernels queued on every
    stream (:func:`_with_spins`): host copies of the learnable parameters, and the losses."""
    _with_spins(s, ex, Spinner(cp))
    losses = []
    for _ in range(iters):
        s.step(1)
        losses.append(float(s._losses[-1]))
    return [np.asarray(cp.asnumpy(p.data)) for p in s.net.learnable_params], losses


def _with_spins(s, ex, spin, compute_ms=0.5, copy_ms=3.0, start_ms=20.0):
    """Delay every step (compute), every copy (its own stream) and every iteration's start,
    so that an early reuse, release or read of a region meets the wrong data."""
    net = s.net
    compute = ex.streams.streams["compute"]
    fwd, bwd, copy = net.forward_layer, net.backward_layer, ex.streams.copy

    def forward_layer(li):
        spin(compute, compute_ms)
        return fwd(li)

    def backward_layer(li):
        spin(compute, compute_ms)
        return bwd(li)

    def slow_copy(dst, src, stream):
        spin(ex.streams.streams[stream], copy_ms)
        return copy(dst, src, stream)

    class Start:
        def on_start(self, solver):
            spin(compute, start_ms)

    net.forward_layer = forward_layer
    net.backward_layer = backward_layer
    ex.streams.copy = slow_copy
    s.callbacks.append(Start())


@pytest.mark.parametrize("strategy", ["naive", "vdnn", "recompute"])
def test_race_long_kernels_do_not_break_swapping(make_solver, cp, strategy):
    """Long kernels queued on every stream: an operation that did not wait for its event would
    read or overwrite a region too early (poisoned with NaN on release); the results must
    still be those of `none`, bit for bit."""
    spin = Spinner(cp)
    ref, ref_losses, _ = gpu_train(make_solver, "resnet", "none", iters=4)
    tp = measure_scratch(make_solver("resnet", mode="GPU"), strategy)
    s = make_solver("resnet", mode="GPU")
    ex = install(s, strategy, tp.budget(margin=0.5), scratch=tp.reserve(margin=0.5),
                 poison=True)
    _with_spins(s, ex, spin)
    losses = []
    for _ in range(4):
        s.step(1)
        losses.append(float(s._losses[-1]))
    assert same(params_of(s), ref), max_diff(params_of(s), ref)
    assert losses == ref_losses
    assert ex.high_water <= ex.budget and ex._allocator.fallbacks == 0


def test_race_test_has_teeth(make_solver, cp):
    """The negative control: the same run with every event wait dropped gives other
    parameters (or NaN), so the test above would see a missing wait."""
    spin = Spinner(cp)
    ref, _, _ = gpu_train(make_solver, "resnet", "none", iters=4)
    s = make_solver("resnet", mode="GPU")
    ex = install(s, "naive", poison=True)
    _with_spins(s, ex, spin)
    ex.streams.wait = lambda stream, events: None
    with np.errstate(all="ignore"):
        s.step(4)
    cp.cuda.Device().synchronize()
    got = params_of(s)
    assert not same(got, ref), "dropping every wait changed nothing: the spins are too short"


# ----------------------------------------------- real networks, bit for bit
def _net_solver(name, batch):
    from scripts.bench_throughput import minicaffe_net_param
    from minicaffe.proto import caffe_pb2
    from minicaffe.solver import Solver
    p = caffe_pb2.SolverParameter(base_lr=1e-3, momentum=0.9, weight_decay=5e-4,
                                  lr_policy="fixed", max_iter=10**6, display=0, random_seed=1)
    p.net_param.CopyFrom(minicaffe_net_param(name, batch, "CAFFE"))
    return Solver(p, mode="GPU", verbose=False)


def _net_inputs(s):
    rng = np.random.default_rng(0)
    xp = s.net.xp
    d, lab = s.net.blobs["data"], s.net.blobs["label"]
    d.data[...] = xp.asarray(rng.standard_normal(d.shape, dtype=np.float32))
    lab.data[...] = xp.asarray(rng.integers(0, 1000, lab.shape).astype(np.float32))


def _run_net(name, batch, strategy, iters, **kw):
    s = _net_solver(name, batch)
    ex = install(s, strategy, **kw) if strategy else None
    _net_inputs(s)
    losses = []
    for _ in range(iters):
        s.step(1)
        losses.append(float(s.last_loss))
    params = params_of(s)
    if ex is not None:
        ex.close()
    return params, losses, ex


@pytest.mark.parametrize("name", ["resnet50", "googlenet"])
def test_real_nets_naive_is_bit_identical_to_none(name, monkeypatch):
    """ResNet-50 (BatchNorm, Eltwise, Split) and GoogLeNet (Concat, LRN, three losses) at batch
    8: 20 iterations under `naive`, in a budget that holds the plan and the measured transients,
    with poisoned releases, give exactly the parameters and losses of `none`."""
    monkeypatch.setenv("MINICAFFE_DETERMINISTIC", "1")
    iters = 20
    ref, ref_losses, ex_none = _run_net(name, 8, "none", iters)
    assert np.all(np.isfinite(ref_losses))
    s = _net_solver(name, 8)
    _net_inputs(s)
    tp = measure_scratch(s, "naive")
    budget = tp.budget(margin=0.25)
    params, losses, ex = _run_net(name, 8, "naive", iters, budget=budget,
                                  scratch=tp.reserve(margin=0.25), poison=True)
    assert same(params, ref), max_diff(params, ref)
    assert losses == ref_losses
    assert ex.high_water <= ex.budget == budget
    assert ex._allocator.fallbacks == 0 and ex.scratch.high_water > 0
    assert ex.plan.arena_bytes < ex_none.plan.arena_bytes


def test_gpu_none_lowers_like_caffe(make_solver, monkeypatch):
    """`none` by default: one image of im2col per convolution, Caffe's allocation; it trains
    exactly like the plain net with the same lowering, and `naive` with that lowering
    reproduces it."""
    monkeypatch.delenv("MINICAFFE_LOWERING")
    s = make_solver("resnet", mode="GPU")
    runtime.set_lowering(s.net, "caffe")
    s.net.reshape()
    plain = []
    for _ in range(5):
        s.step(1)
        plain.append(float(s._losses[-1]))
    ref, losses, ex = gpu_train(make_solver, "resnet", "none", iters=5)
    assert losses == plain and same(ref, params_of(s))
    assert all(layer.col_buffer_bytes == 0 for layer in ex.net.layers
               if layer.type == "Convolution")
    chunked = build_gmap(make_solver("resnet", mode="GPU").net)
    want = make_plan(chunked.caffe_lowering(), "none").arena_bytes
    assert ex.plan.arena_bytes == want, (ex.plan.arena_bytes, want)
    params, losses2, _ = gpu_train(make_solver, "resnet", "naive", iters=5, lowering="caffe")
    assert same(params, ref) and losses2 == losses


def test_executor_after_executor_gives_the_memory_back(make_solver, cp):
    """The tuner builds executors one after another in one process, changing the minibatch
    between them (profiling, then the measurements): after each close the device's free memory
    returns to where it was, so nothing made during a run (a blob's cached view, a layer's
    cache sized to the minibatch) keeps a closed arena alive."""
    import gc
    from swap.profiler import set_batch_size
    s = make_solver("resnet", mode="GPU")
    s.step(1)
    budget = 256 << 20
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    free0 = cp.cuda.runtime.memGetInfo()[0]
    for i, k in enumerate((4, 6, 3, 8, 5)):
        set_batch_size(s.net, k)
        ex = install(s, ("naive", "none", "recompute")[i % 3], budget,
                     scratch=measure_scratch(s, "naive").reserve(margin=0.5))
        s.step(2)
        ex.close()
        ex.device.release()
        assert ex.scratch_bytes_at_close == 0
        del ex
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
        free = cp.cuda.runtime.memGetInfo()[0]
        assert free >= free0 - budget // 2, (k, (free0 - free) / 2**20)


def test_gpu_backlog_probes_the_compiled_iteration(make_solver):
    """swap.runtime.Backlog on the compute stream of the compiled iteration: one point per
    probe, the device's times since the first probe non-decreasing, the last probe after
    every step, and the parameters those of the run without probes."""
    from swap.runtime import Backlog, backlog_summary
    ref, _, _ = gpu_train(make_solver, "resnet", "naive")
    s = make_solver("resnet", mode="GPU")
    ex = install(s, "naive")
    s.step(2)                                    # the first iteration is not compiled
    ex.backlog = Backlog(ex.streams, ex.gmap.n_steps, every=4)
    for _ in range(8):
        s.step(1)
        ex.streams.synchronize()
        pts = ex.backlog.read()
        assert len(pts) == len(ex.backlog.steps) >= 3
        dev = [d for _, d in pts]
        assert dev[0] == 0.0 and all(b >= a for a, b in zip(dev, dev[1:]))
        assert set(backlog_summary(pts)) == {"gpu_backlog_s", "gpu_backlog_max_s"}
    assert same(params_of(s), ref), max_diff(params_of(s), ref)
    ex.close()


def test_gpu_device_wait_holds_the_stream_not_the_host(cp):
    """swap.profiler.device_wait: the current stream is busy at least the asked time, the
    host returns at once (what is issued after it queues behind it)."""
    import time
    from swap.profiler import device_wait
    device_wait(cp, 1e-4)                        # compile outside the timing
    cp.cuda.get_current_stream().synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    t = time.perf_counter()
    device_wait(cp, 0.05)
    host = time.perf_counter() - t
    b.record()
    b.synchronize()
    assert cp.cuda.get_elapsed_time(a, b) >= 50.0 * 0.999
    assert host < 0.025


def test_gpu_copy_calibration_starts_its_passes_behind_a_wait(make_solver):
    """The copy calibration's kept run on the GPU: every recorded pass behind a device wait
    of head_start_seconds of the host's least time to issue a pass so far, and each step
    timed by its own events (the wait is outside them)."""
    from swap.profiler import calibrate_copy_cost, head_start_seconds, set_batch_size
    s = make_solver("resnet", mode="GPU")
    set_batch_size(s.net, 4)
    g = build_gmap(s.net)
    budget = min_budget(g, "dynamic", frozenset(g.feature_maps())) + (64 << 20)
    cal, n = calibrate_copy_cost(s, budget, 4, warmup=1, iterations=1)
    assert cal is not None and n == 1 + cal["iterations"]
    waits, hosts = cal["head_start"], cal["host_pass"]
    assert len(waits) == len(hosts) == cal["iterations"] and all(w > 0 for w in waits)
    for i, w in enumerate(waits[1:]):    # from the least host time so far (warm-up's too)
        assert w <= head_start_seconds(min(hosts[:i + 1])) * (1 + 1e-9)
    assert sum(cal["kept"]) < min(waits)            # the wait is not in the steps' times


def test_gpu_plan_replays_the_tuners_decision_from_its_profile(tmp_path, capsys, monkeypatch):
    """The profile train_dynamic takes on the GPU keeps the GMAP it decided on, the cuDNN
    workspaces sampled (with_gmap); `minicaffe plan` on that profile (--layout device, the
    default) takes the k* the device took."""
    from minicaffe.cli import main
    from minicaffe.proto import caffe_pb2
    from google.protobuf import text_format
    from minicaffe.solver import Solver
    from swap.tuner import train_dynamic
    from swap_nets import net_param
    # the cuDNN engine: its workspaces are the sizes that are neither constant nor linear in k
    npar = net_param("resnet", 4)
    for layer in npar.layer:
        if layer.type == "Convolution":
            layer.convolution_param.engine = caffe_pb2.ConvolutionParameter.CUDNN
    sp = caffe_pb2.SolverParameter(base_lr=0.05, momentum=0.9, lr_policy="fixed", max_iter=20,
                                   display=0, random_seed=3)
    sp.net_param.CopyFrom(npar)
    s = Solver(sp, mode="GPU", verbose=False)
    g = build_gmap(s.net)
    budget = 2 * min_budget(g.at(16), "naive") + (64 << 20)
    # the model prices by the search only where the search predicts held-out points better,
    # which on a net this small is the device's noise; the probe runs only where it does
    from swap import model as model_mod
    monkeypatch.setattr(model_mod, "_searched_wins", lambda measured, searched: True)
    ex, td = train_dynamic(s, budget, auto_batch=True, method="bisect")
    ex.close()
    # cuDNN's search times of every convolution at every profiled k, and at the ks the
    # decision asked about (the model's probe), positive; the model prices them so
    from swap.model import ComputeModel
    from swap.profiler import search_times_now
    rec = td.profile.meta["searched"]
    convs = {layer.name for layer in s.net.layers if layer.type == "Convolution"}
    assert set(rec) == convs
    for name in convs:
        assert set(td.profile.ks) <= {r[0] for r in rec[name]}
        assert all(r[1] > 0 for r in rec[name] if r[1] is not None)
    assert len({r[0] for r in rec[next(iter(convs))]}) > len(td.profile.ks)
    m = ComputeModel.from_profile(td.profile, granularity="segment")
    assert {e[0] for e in m.searched} == convs
    k = td.profile.ks[0]
    now = search_times_now(s.net, k)          # cached: the very values the profile holds
    assert all([k, *now[n]] in rec[n] for n in convs)
    saved = td.profile.meta["gmap"]
    sampled = [b for b in saved["buffers"] if b[3] is not None and len(b[3]) > 3]
    assert sampled and all(b[0].endswith("workspace") for b in sampled)
    pj = tmp_path / "p.json"
    td.profile.save(pj)
    model = tmp_path / "resnet_cudnn.prototxt"          # the net trained above
    model.write_text(text_format.MessageToString(npar))
    assert main(["plan", "--model", str(model), "--budget", str(budget), "--profile", str(pj),
                 "--search", "bisect"]) == 0
    out = capsys.readouterr().out
    assert "(device layout" in out and f"k* = {td.decision.k_star} " in out, out
