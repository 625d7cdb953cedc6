"""swap.plan's ``recompute`` strategy (SuperNeurons: swap + recompute) and its replay.

The nets: LeNet and the ResNet of swap_nets.py (in-place BatchNorm/Scale/ReLU on every
convolution), and here an AlexNet-like net (in-place ReLU, LRN and pooling not in place,
Dropout in place and not), a net whose BatchNorm is not in place (so it is recomputed), and a
net where an in-place layer overwrites a pooling's input after the pooling read it.
"""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.net import TRAIN, Net
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.rng import set_random_seed
from minicaffe.testing import sgd_solver, train_steps
from swap.gmap import build_gmap
from swap.plan import (OFFLOAD, RECOMPUTE, BudgetError, make_plan, max_batch, min_budget,
                       plan_naive, plan_none, plan_recompute, recompute_policy)
from swap.runtime import Executor, install, measure_scratch

from swap_nets import net_text                       # tests/swap/swap_nets.py
from test_swap_plan import check_consistent         # tests/swap/test_swap_plan.py

DATA = """
layer {{ name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param {{ shape {{ dim: BATCH dim: {c} dim: {hw} dim: {hw} }} shape {{ dim: BATCH }}
    data_filler {{ type: "gaussian" std: 1 }}
    data_filler {{ type: "uniform" min: 0 max: 2.99 }} }} }}"""


def conv(name, bottom, c, k=3, pad=1, top=None):
    return f"""
layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top or name}"
  convolution_param {{ num_output: {c} kernel_size: {k} pad: {pad}
    weight_filler {{ type: "xavier" }} }} }}"""


def ip(name, bottom, n):
    return f"""
layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{name}"
  inner_product_param {{ num_output: {n} weight_filler {{ type: "xavier" }} }} }}"""


def layer(name, type_, bottom, top, extra=""):
    return f"""
layer {{ name: "{name}" type: "{type_}" bottom: "{bottom}" top: "{top}" {extra} }}"""


def pool(name, bottom, method="MAX", k=3, s=2):
    return layer(name, "Pooling", bottom, name,
                 f"pooling_param {{ pool: {method} kernel_size: {k} stride: {s} }}")


LOSS = """
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }"""

# conv -> ReLU (in place) -> LRN -> MAX pooling -> conv -> ReLU -> MAX pooling -> fc -> ReLU
# -> Dropout (in place) -> fc -> Dropout (not in place) -> fc: AlexNet's pattern in small
ALEXNET = ('name: "alexnet_like"' + DATA.format(c=3, hw=16) + conv("conv1", "data", 6)
           + layer("relu1", "ReLU", "conv1", "conv1")
           + layer("norm1", "LRN", "conv1", "norm1",
                   "lrn_param { local_size: 3 alpha: 0.1 beta: 0.75 }")
           + pool("pool1", "norm1") + conv("conv2", "pool1", 8)
           + layer("relu2", "ReLU", "conv2", "conv2") + pool("pool2", "conv2")
           + ip("fc6", "pool2", 16) + layer("relu6", "ReLU", "fc6", "fc6")
           + layer("drop6", "Dropout", "fc6", "fc6") + ip("fc7", "fc6", 12)
           + layer("relu7", "ReLU", "fc7", "fc7") + layer("drop7", "Dropout", "fc7", "drop7")
           + ip("fc", "drop7", 3) + LOSS)

# conv -> ReLU (in place) -> BatchNorm (not in place) -> Scale (in place on it) -> AVE pooling
# -> conv -> BatchNorm -> ReLU (in place on the convolution) -> fc
BNNET = ('name: "bn_not_in_place"' + DATA.format(c=2, hw=10) + conv("conv1", "data", 4)
         + layer("relu1", "ReLU", "conv1", "conv1") + layer("bn1", "BatchNorm", "conv1", "bn1")
         + layer("scale1", "Scale", "bn1", "bn1", "scale_param { bias_term: true }")
         + pool("pool1", "bn1", "AVE", 2, 2) + conv("conv2", "pool1", 5)
         + layer("bn2", "BatchNorm", "conv2", "conv2")
         + layer("relu2", "ReLU", "conv2", "conv2") + ip("fc", "conv2", 3) + LOSS)

# a Split's tops share their bottom's data: the ReLU in place on one of them overwrites what
# pool1 read from the other, so pool1 cannot be recomputed; pool2 (after the ReLU) can
OVERWRITE = ('name: "overwritten_input"' + DATA.format(c=2, hw=8) + conv("conv1", "data", 4)
             + """
layer { name: "split" type: "Split" bottom: "conv1" top: "a" top: "b" }"""
             + pool("pool1", "a", k=2) + layer("relu1", "ReLU", "b", "b")
             + pool("pool2", "b", k=2) + """
layer { name: "sum" type: "Eltwise" bottom: "pool1" bottom: "pool2" top: "sum" }"""
             + ip("fc", "sum", 3) + LOSS)

TEXTS = {"alexnet": ALEXNET, "bn": BNNET, "overwrite": OVERWRITE}
NETS = ("lenet", "resnet", "alexnet", "bn", "overwrite")


def text_of(which, batch=4):
    if which in TEXTS:
        return TEXTS[which].replace("BATCH", str(batch))
    return net_text(which, batch)


def gmap_of(which, batch=4):
    set_random_seed(1)
    return build_gmap(Net(parse_text(text_of(which, batch), caffe_pb2.NetParameter), TRAIN,
                          mode="CPU"))


def make_solver(which, batch=4, mode="CPU"):
    return sgd_solver(parse_text(text_of(which, batch), caffe_pb2.NetParameter), mode=mode)


def train(which, strategy=None, budget=None, iters=20, lowering="chunked", mode="CPU"):
    """(params, history, losses, executor) after ``iters`` iterations; every fresh or released
    region poisoned with NaN.  params includes BatchNorm's statistics (Caffe's blobs)."""
    return train_steps(make_solver(which, mode=mode), iters, strategy, budget, lowering)


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def names(g, ids):
    return {g.buffers[b].name for b in ids}


def check_dataflow(plan):
    """Each step, and each recomputation, reads only buffers holding what they should: written
    earlier in the iteration and not released since, or brought back from the host.  (Holding
    a buffer is not enough: a region allocated for a recomputation holds garbage until the
    recomputation has run.)"""
    g = plan.gmap
    ops = plan.ops
    persistent = {b.id for b in g.buffers if b.persistent}
    valid, host = set(), set()

    def run(step, why):
        bad = set(step.reads) - valid - persistent
        assert not bad, f"{why} reads {names(g, bad)} before they hold their data"
        valid.update(step.writes)

    for j, st in enumerate(g.steps):
        for op in plan.ops_at(j):
            if op.kind == "allocate":
                valid.discard(op.buffer)
            elif op.kind == "prefetch":
                assert op.buffer in host
                valid.add(op.buffer)
            elif op.kind == RECOMPUTE:
                run(g.steps[op.source], f"the recomputation of {g.steps[op.source]} before {st}")
        run(st, str(st))
        for op in plan.ops_at(j, when=1):
            if op.kind == OFFLOAD:
                assert op.buffer in valid
                host.add(op.buffer)
            elif op.kind == "release":
                valid.discard(op.buffer)
    assert not any(op.kind == RECOMPUTE for op in ops if op.step < g.n_forward)


# ------------------------------------------------------------------ the policy
def test_which_layers_may_be_recomputed():
    g = gmap_of("alexnet")
    flag = {s.name: s.recomputable for s in g.steps[:g.n_forward]}
    assert flag == {"data": False, "conv1": False, "relu1": True, "norm1": True, "pool1": True,
                    "conv2": False, "relu2": True, "pool2": True, "fc6": False, "relu6": True,
                    "drop6": False, "fc7": False, "relu7": True, "drop7": False, "fc": False,
                    "loss": False}
    assert not any(s.recomputable for s in g.steps[g.n_forward:])      # backward steps
    fwd = gmap_of("bn").steps
    assert {s.name: s.recomputable for s in fwd[:len(fwd) // 2]}["bn1"]
    # STOCHASTIC pooling draws its positions in forward: never run twice
    stochastic = text_of("alexnet").replace(
        'name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX',
        'name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param '
        '{ pool: STOCHASTIC')
    assert stochastic != text_of("alexnet")
    g2 = build_gmap(Net(parse_text(stochastic, caffe_pb2.NetParameter), TRAIN, mode="CPU"))
    assert not {s.name: s.recomputable for s in g2.steps[:g2.n_forward]}["pool2"]
    assert not names(g2, recompute_policy(g2).recomputed) & {"data:pool2", "saved:pool2/rand_idx"}


def test_alexnet_like_recomputes_lrn_and_pooling_and_offloads_convolution_outputs():
    g = gmap_of("alexnet")
    pol = recompute_policy(g)
    assert names(g, pol.recomputed) == {"data:norm1", "saved:norm1/scale", "data:pool1",
                                        "saved:pool1/mask", "data:pool2", "saved:pool2/mask"}
    assert names(g, pol.offloaded) == {"data:conv1", "data:conv2"}
    # the segment LRN -> pooling is rebuilt in one go from conv1's output, before the first
    # backward step that reads pool1 (conv2's weight gradient); pool2 before fc6's
    step = {s.name: s.index for s in g.steps[g.n_forward:]}
    fwd = {s.name: s.index for s in g.steps[:g.n_forward]}
    assert pol.schedule() == {step["conv2"]: (fwd["norm1"], fwd["pool1"]),
                              step["fc6"]: (fwd["pool2"],)}
    # Dropout masks, the inner products' outputs and the Dropout top are kept, not recomputed
    plan = plan_recompute(g)
    kept = set(g.feature_maps()) - plan.offloaded - plan.recomputed
    assert names(g, kept) == {"data:fc6", "saved:drop6/mask", "data:fc7", "saved:drop7/mask",
                              "data:drop7", "data:data", "saved:loss/prob", "data:label"}
    # each recomputed buffer lives twice: forward, then from its recomputation on
    for b in plan.recomputed:
        allocs = [op for op in plan.ops if op.kind == "allocate" and op.buffer == b]
        assert len(allocs) == 2 and allocs[0].step < g.n_forward <= allocs[1].step
    # conv1's output comes back one step ahead of the recomputation that reads it
    pre = [op.step for op in plan.ops if op.kind == "prefetch" and op.buffer == g.find(
        "data:conv1").id]
    assert pre == [step["conv2"] - 1]


def test_in_place_chains_are_offloaded_never_recomputed():
    """A convolution and the BatchNorm, Scale and ReLU in place on its top share one buffer:
    they cannot be rerun from their overwritten input, so the chain's feature maps (the top,
    x_norm, the Scale's copy) are offloaded.  The ResNet's global pooling is recomputed; its
    Eltwise sums are kept (their residual branch is read by nothing in backward: recomputing
    them would bring it back for that alone)."""
    g = gmap_of("resnet")
    pol = recompute_policy(g)
    assert names(g, pol.recomputed) == {"data:pool"}
    off = names(g, pol.offloaded)
    assert {"data:conv1", "saved:bn_conv1/x_norm", "saved:scale_conv1/bottom_copy",
            "data:res2_a", "saved:bn_res3_p/x_norm"} <= off
    conv_group = {b for s in g.steps if s.type == "Convolution" and s.phase == "forward"
                  for b in s.writes}
    assert not conv_group & pol.recomputed
    assert {"data:res2", "data:res3"} <= names(g, set(g.feature_maps()) - pol.offloaded)
    # an input overwritten after it was read is never recomputed from
    g = gmap_of("overwrite")
    pol = recompute_policy(g)
    assert names(g, pol.recomputed) == {"data:pool2", "saved:pool2/mask"}
    # the BatchNorm that is not in place is recomputed with the Scale in place on it, and the
    # pooling after them in the same segment
    g = gmap_of("bn")
    pol = recompute_policy(g)
    assert names(g, pol.recomputed) == {"data:bn1", "saved:bn1/x_norm", "saved:bn1/std",
                                        "saved:scale1/bottom_copy", "data:pool1"}
    assert [tuple(g.steps[f].name for f in fs) for _, fs in pol.segments] == [
        ("bn1", "scale1"), ("pool1",)]
    assert "saved:bn2/x_norm" in names(g, pol.offloaded)


@pytest.mark.parametrize("which", NETS)
@pytest.mark.parametrize("k", [1, 4, 13])
def test_plan_invariants(which, k):
    """Ops in order, eq. (4) at every op, every step and every recomputation finds what it
    touches on the device and reads what was written there, regions never overlap; the same
    under its smallest budget."""
    g = gmap_of(which).at(k)
    plan = make_plan(g, "recompute")
    check_consistent(plan)
    check_dataflow(plan)
    for other in ("none", "naive", "vdnn"):             # the check holds for every strategy
        check_dataflow(make_plan(g, other))
    assert plan.check() == plan.peak == max(plan.usage)
    need = min_budget(g, "recompute")
    tight = make_plan(g, "recompute", need)
    check_consistent(tight)
    assert tight.peak <= tight.arena_bytes == need
    # the aliases and the policy do not depend on k
    assert make_plan(g, "superneurons").ops == plan.ops
    assert recompute_policy(g).segments == recompute_policy(gmap_of(which)).segments


def test_recompute_holds_less_than_none_and_offloads_less_than_naive():
    for which, k in (("alexnet", 4), ("alexnet", 64), ("bn", 32)):
        g = gmap_of(which).at(k)
        rec, naive, none = plan_recompute(g), plan_naive(g), plan_none(g, caffe=False)
        assert rec.recomputed
        assert rec.peak < none.peak and rec.arena_bytes < none.arena_bytes
        assert 0 < rec.transfer_bytes()[0] < naive.transfer_bytes()[0]
        assert rec.host_bytes == sum(op.nbytes for op in rec.ops if op.kind == OFFLOAD)
    # at the end of forward, where Caffe's footprint peaks, recomputation holds less than
    # keeping the LRN and pooling outputs would
    g = gmap_of("alexnet").at(64)
    rec = plan_recompute(g)
    keep = make_plan(g, "recompute", pinned=rec.recomputed)
    assert not keep.recomputed and keep.offloaded == rec.offloaded
    last = g.n_forward - 1
    assert rec.usage[last] < keep.usage[last]


def test_pinned_buffers_are_neither_offloaded_nor_recomputed():
    g = gmap_of("alexnet")
    pinned = frozenset({g.find("data:pool1").id, g.find("data:conv2").id})
    plan = make_plan(g, "recompute", None, pinned)
    check_consistent(plan)
    assert not (plan.offloaded | plan.recomputed) & pinned
    assert names(g, plan.recomputed) == {"data:norm1", "saved:norm1/scale", "data:pool2",
                                         "saved:pool2/mask"}


def test_budget_too_small_fails_early_with_the_smallest_budget():
    g = gmap_of("alexnet")
    need = min_budget(g, "recompute")
    with pytest.raises(BudgetError) as e:
        make_plan(g, "recompute", need - 1)
    msg = str(e.value)
    assert "'recompute'" in msg and f"({need} bytes)" in msg
    assert e.value.min_budget == need and e.value.max_k == max_batch(g, "recompute", need - 1)
    assert 0 < e.value.max_k < g.k
    with pytest.raises(BudgetError, match="not even minibatch 1"):
        make_plan(g, "recompute", 1000)
    k = max_batch(g, "recompute", 3 * need)
    assert min_budget(g.at(k), "recompute") <= 3 * need < min_budget(g.at(k + 1), "recompute")
    # the executor: before the first iteration; at the smallest budget it trains
    s = make_solver("alexnet")
    with pytest.raises(BudgetError) as e:
        install(s, "recompute", need - 4096)
    assert e.value.min_budget == need and s.net.executor is None and s.iter == 0
    ex = install(s, "recompute", need, poison=True)
    s.step(2)
    assert ex.high_water <= need == ex.device.capacity


# ------------------------------------------------------------------ the replay
@pytest.mark.parametrize("which", NETS)
def test_recompute_trains_bit_identically_to_none(which):
    """20 iterations under recompute, with every fresh or released region poisoned with NaN,
    give exactly the parameters (BatchNorm statistics included), history and losses of the
    plain run and of ``none`` with the same convolution lowering."""
    base = train(which)
    none = train(which, "none")
    assert same(none[0], base[0]) and same(none[1], base[1]) and none[2] == base[2]
    g = gmap_of(which)
    for budget in (None, 2 * min_budget(g, "recompute")):
        params, history, losses, ex = train(which, "recompute", budget)
        assert same(params, base[0]), budget
        assert same(history, base[1]), budget
        assert losses == base[2], budget
        assert ex.high_water == ex.plan.arena_bytes <= ex.device.capacity
        assert ex.peak_in_use == ex.plan.peak
    if which != "lenet":          # LeNet's pooling reads a map backward does not: kept
        assert ex.plan.recomputations()


@pytest.mark.parametrize("which", NETS)
def test_resident_trains_bit_identically_to_none(which):
    """The plan that holds every buffer but the layers' scratch for the iteration
    (swap.plan.plan_resident, what the dynamic plan becomes where nothing is offloaded and
    Caffe's plan does not fit): 20 iterations, every fresh or released region poisoned, give
    exactly the parameters, history and losses of ``none``, in an arena of its own size."""
    base = train(which, "none")
    g = gmap_of(which)
    for budget in (None, min_budget(g, "resident")):
        params, history, losses, ex = train(which, "resident", budget)
        assert same(params, base[0]) and same(history, base[1]) and losses == base[2], budget
        assert ex.high_water == ex.plan.arena_bytes <= ex.device.capacity
        assert ex.peak_in_use == ex.plan.peak


def test_recompute_with_caffes_lowering_matches_none():
    base = train("alexnet", "none", lowering="caffe")
    params, history, losses, ex = train("alexnet", "recompute", lowering="caffe")
    assert same(params, base[0]) and same(history, base[1]) and losses == base[2]


def test_the_executor_runs_each_recomputation_once_per_iteration(monkeypatch):
    s = make_solver("alexnet")
    ex = install(s, "recompute", poison=True)
    calls = []
    orig = Executor._recompute

    conv1 = ex.gmap.find("data:conv1").id

    def spy(self, f, j):
        calls.append((j, f))
        orig(self, f, j)
        if self.gmap.steps[f].name == "norm1":    # it read conv1: the prefetch was awaited
            assert self.residency[conv1] == "ON_DEVICE"

    monkeypatch.setattr(Executor, "_recompute", spy)
    s.step(3)
    assert calls == list(ex.plan.recomputations()) * 3
    # between iterations nothing per-iteration is held, the recomputed buffers included
    assert all(ex.residency[b] == "FREED" for b in ex.plan.recomputed)


def test_without_its_recomputations_the_run_reads_poison(monkeypatch):
    """The check above can fail: skip the forward of every RECOMPUTE op and the rebuilt
    buffers keep the NaN the executor poisoned them with."""
    monkeypatch.setattr(Executor, "_recompute", lambda self, f, j: None)
    params, _, losses, _ = train("alexnet", "recompute", iters=2)
    assert np.isnan(losses[-1]) or not all(np.isfinite(p).all() for p in params)


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["alexnet", "bn"])
def test_gpu_recompute_with_long_kernels_trains_like_none(which, cp):
    """GPU: RECOMPUTE ops on the compute stream, after the prefetches of their checkpoints and
    before the releases whose regions are handed out again, with long kernels queued on every
    stream (an unawaited event would meet poisoned or overwritten data) and every CuPy
    allocation served from the budget (BatchNorm's fused kernels write their statistics into
    copies there): the parameters, BatchNorm statistics included, and losses of `none`."""
    from swap import runtime
    from test_swap_gpu import Spinner, _with_spins        # tests/swap/test_swap_gpu.py
    try:
        ref = train(which, "none", iters=4, mode="GPU")
        tp = measure_scratch(make_solver(which, mode="GPU"), "recompute", lowering="chunked")
        s = make_solver(which, mode="GPU")
        ex = install(s, "recompute", tp.budget(margin=0.5), scratch=tp.reserve(margin=0.5),
                     poison=True, lowering="chunked")
        assert ex.plan.recomputations()
        _with_spins(s, ex, Spinner(cp))
        losses = []
        for _ in range(4):
            s.step(1)
            losses.append(float(s._losses[-1]))
        assert same([to_numpy(p.data) for p in s.net.learnable_params], ref[0])
        assert losses == ref[2]
        assert ex.high_water <= ex.budget and ex._allocator.fallbacks == 0
    finally:
        runtime.close_all()


# ------------------------------------------------------------------ BatchNorm
def _bn_stats(params, net_text_):
    """BatchNorm's three blobs (mean sum, variance sum, factor) among the learnable params."""
    net = Net(parse_text(net_text_, caffe_pb2.NetParameter), TRAIN, mode="CPU")
    ids = {id(b) for layer in net.layers if layer.type == "BatchNorm" for b in layer.blobs}
    return [p for p, q in zip(params, net.learnable_params) if id(q) in ids]


def test_batchnorm_statistics_see_each_minibatch_once(monkeypatch):
    """bn1 is recomputed every iteration; its running mean, variance and factor after 20
    iterations are those of ``none`` (Caffe: s <- maf s + 1 once per minibatch).  A BatchNorm
    that ignored its ``recompute`` flag would update them twice: the test sees it."""
    base = train("bn", "none")
    rec = train("bn", "recompute")
    g = gmap_of("bn")
    assert g.find("saved:bn1/x_norm").id in rec[3].plan.recomputed
    stats = _bn_stats(base[0], text_of("bn"))
    assert len(stats) == 6
    assert same(_bn_stats(rec[0], text_of("bn")), stats)
    assert same(rec[0], base[0]) and rec[2] == base[2]
    from minicaffe.layers.batchnorm import BatchNormLayer
    monkeypatch.setattr(BatchNormLayer, "_statistics",
                        lambda self: [b.data for b in self.blobs])    # flag ignored
    broken = train("bn", "recompute")
    assert not same(_bn_stats(broken[0], text_of("bn")), stats)


def test_batchnorm_forward_with_the_recompute_flag_changes_no_statistics():
    net = Net(parse_text(text_of("bn"), caffe_pb2.NetParameter), TRAIN, mode="CPU")
    net.forward_from_to()
    li = net.layer_names.index("bn1")
    bn = net.layers[li]
    before = [np.array(b.data) for b in bn.blobs]
    outputs = [np.array(net.top_vecs[li][0].data), np.array(bn.internal("x_norm").data),
               np.array(bn.internal("std").data)]
    for a in (net.top_vecs[li][0].data, bn.internal("x_norm").data, bn.internal("std").data):
        a[...] = np.nan
    bn.recompute = True
    net.forward_layer(li)
    bn.recompute = False
    assert same([np.array(b.data) for b in bn.blobs], before)
    assert same([np.array(net.top_vecs[li][0].data), np.array(bn.internal("x_norm").data),
                 np.array(bn.internal("std").data)], outputs)
    net.forward_layer(li)                       # without the flag: updated, as Caffe does
    assert bn.blobs[2].data[0] == before[2][0] * bn.moving_average_fraction + 1


# ------------------------------------------------------------------ the command line
def test_train_and_mem_take_the_strategy(tmp_path, capsys):
    from minicaffe.cli import main
    f = tmp_path / "alexnet_like.prototxt"
    f.write_text(text_of("alexnet"))
    assert main(["train", str(f), "--cpu", "--max-iter", "3", "--display", "1",
                 "--random-seed", "3", "--swap", "superneurons", "--budget", "1M"]) == 0
    assert "Memory plan 'superneurons'" in capsys.readouterr().err
    assert main(["mem", "--model", str(f), "--strategies", "naive,recompute"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("recompute"))
    from swap.memory import fmt_bytes
    assert fmt_bytes(min_budget(gmap_of("alexnet"), "recompute")) in row
