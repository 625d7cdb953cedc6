"""Gradient communication overlapping backward (ps/overlap.py) on the CPU.

The net's backward hook fires once per backward layer and pass; a group of
parameters is handed over once per iteration, in the last of ``iter_size``
passes, right after the layer that finishes it, and at that moment its diffs
are the ones the update will read (shared parameters, frozen ones and a swap
executor's plan included).  Then real processes: W workers at batch k with
overlap give the parameters of one worker at batch W x k, bit for bit those of
the path without overlap, and the first shard leaves before backward ends.
"""

import time

import numpy as np
import pytest

from ps_helpers import INPUT_NET, hook_batch, logs, write_solver
from minicaffe.net import TRAIN, Net
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.solver import Solver
from ps.copyup import copy_up_mode
from ps.overlap import (GradientOverlap, backward_layers, backward_order, final_layers,
                        make_buckets, overlap_default, ready_after)
from ps.sharding import assign_buckets, bucket_cap

# frozen (ip0: lr_mult 0, nothing below needs backward: it never runs backward), a conv unit
# with BatchNorm and Scale in place, a split (ip1's top is read twice), and ip2/ip3 sharing
# their weight and bias (the diffs get two contributions; final after ip2, the lower one).
SHARED_NET = """
name: "overlap"
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 4 dim: 2 dim: 4 dim: 4 } shape { dim: 4 dim: 3 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip0" type: "Convolution" bottom: "data" top: "conv0"
  param { lr_mult: 0 } param { lr_mult: 0 }
  convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "conv1" type: "Convolution" bottom: "conv0" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false
    weight_filler { type: "msra" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "ip1" type: "InnerProduct" bottom: "conv1" top: "ip1"
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  param { name: "w" } param { name: "b" }
  inner_product_param { num_output: 5 weight_filler { type: "xavier" }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "ip3" type: "InnerProduct" bottom: "ip2" top: "ip3"
  param { name: "w" } param { name: "b" }
  inner_product_param { num_output: 5 } }
layer { name: "sum" type: "Eltwise" bottom: "ip1" bottom: "ip3" top: "sum" }
layer { name: "ip4" type: "InnerProduct" bottom: "sum" top: "ip4"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip4" bottom: "target" top: "loss" }
"""


def make_solver(iter_size=1, seed=5):
    p = caffe_pb2.SolverParameter()
    p.net_param.CopyFrom(parse_text(SHARED_NET, caffe_pb2.NetParameter))
    p.base_lr = 0.05
    p.momentum = 0.9
    p.weight_decay = 1e-3
    p.lr_policy = "fixed"
    p.max_iter = 10
    p.display = 0
    p.iter_size = iter_size
    p.random_seed = seed
    p.solver_mode = caffe_pb2.SolverParameter.CPU
    return Solver(p, mode="CPU", verbose=False)


def names_of(net):
    """learnable id -> 'layer.param' of its owner."""
    out = []
    for flat, (li, pi) in enumerate(net.param_layer_index):
        if net.param_owner[flat] < 0:
            out.append(f"{net.layer_names[li]}.{pi}")
    return out


# ------------------------------------------------------------ static analysis
def test_final_layers_count_sharing_and_frozen_layers():
    net = Net(parse_text(SHARED_NET, caffe_pb2.NetParameter), TRAIN, mode="CPU")
    names = names_of(net)
    final = dict(zip(names, final_layers(net)))
    li = net.layer_index
    assert not net.layer_need_backward[li("ip0")]
    assert final["ip0.0"] is None and final["ip0.1"] is None     # never written: as cleared
    assert final["ip2.0"] == final["ip2.1"] == li("ip2")          # shared with ip3, above it
    assert final["conv1.0"] == li("conv1") and final["scale1.1"] == li("scale1")
    assert final["bn1.0"] == li("bn1")
    order = [names[i] for i in backward_order(net)]
    assert order[:2] == ["ip0.1", "ip0.0"]                        # final before backward
    assert order[2:4] == ["ip4.1", "ip4.0"] and order[-1] == "conv1.0"
    assert backward_layers(net)[0] == li("loss") and backward_layers(net)[-1] == li("conv1")


def test_groups_are_ready_after_their_lowest_final_layer():
    net = Net(parse_text(SHARED_NET, caffe_pb2.NetParameter), TRAIN, mode="CPU")
    names = names_of(net)
    idx = {n: i for i, n in enumerate(names)}
    li = net.layer_index
    groups = [[idx["ip4.0"], idx["ip2.0"]], [], [idx["ip0.0"]], [idx["conv1.0"]]]
    got = ready_after(net, groups)
    first = backward_layers(net)[0]
    assert got == {li("ip2"): [0], first: [1, 2], li("conv1"): [3]}


def test_buckets_are_runs_of_the_backward_order_under_the_cap():
    nbytes = [40, 8, 100, 8, 30, 30]
    order = [5, 4, 3, 2, 1, 0]
    assert make_buckets(nbytes, order, 64) == [[4, 5], [3], [2], [0, 1]]
    # the tail: parameters among the last 40 bytes of the order start buckets of their own,
    # of at most 8 bytes each (a bigger one alone)
    assert make_buckets(nbytes, order, 64, 40, 8) == [[4, 5], [3], [2], [1], [0]]
    with pytest.raises(ValueError, match="tail of 40 bytes needs a positive bucket size"):
        make_buckets(nbytes, order, 64, 40, 0)
    assert make_buckets(nbytes, order, 1 << 20) == [[0, 1, 2, 3, 4, 5]]
    assert make_buckets(nbytes, order, 1) == [[5], [4], [3], [2], [1], [0]]
    with pytest.raises(ValueError, match="positive"):
        make_buckets(nbytes, order, 0)


def test_buckets_go_round_the_shards_by_load():
    # equal buckets: round robin; a big one makes its shard wait for the others to catch up
    assert assign_buckets([8, 8, 8, 8, 8], 3) == [0, 1, 2, 0, 1]
    assert assign_buckets([30, 8, 8, 8, 8, 8], 2) == [0, 1, 1, 1, 1, 0]
    assert assign_buckets([5], 3) == [0]                  # shards 1 and 2 stay empty
    with pytest.raises(ValueError, match="at least one shard"):
        assign_buckets([1], 0)


def test_the_bucket_cap_is_at_most_an_equal_share_of_the_bytes():
    assert bucket_cap([100] * 10, 4, 1 << 20) == 250      # small net: a share per shard
    assert bucket_cap([100] * 10, 1, 64) == 64
    assert bucket_cap([0, 0], 2, 64) == 1
    with pytest.raises(ValueError, match="positive"):
        bucket_cap([1], 1, 0)


def test_overlap_default_follows_the_environment():
    assert overlap_default({}) is True
    for off in ("0", "off", "False", " no "):
        assert overlap_default({"MINICAFFE_PS_OVERLAP": off}) is False
    assert overlap_default({"MINICAFFE_PS_OVERLAP": "1"}) is True


# ------------------------------------------------------------ the hook
def test_the_net_reports_each_backward_layer_once_per_pass():
    net = Net(parse_text(SHARED_NET, caffe_pb2.NetParameter), TRAIN, mode="CPU")
    calls = []
    net.backward_listener = calls.append
    net.forward_backward()
    assert calls == backward_layers(net)
    calls.clear()
    net.forward_backward()
    assert calls == backward_layers(net)


class Recorder:
    """Groups of one parameter each plus an empty one; snapshots every diff handed over,
    and the diffs the update reads, per iteration."""

    def __init__(self, solver):
        self.solver = solver
        net = solver.net
        self.params = net.learnable_params
        self.groups = [[i] for i in range(len(self.params))] + [[]]
        self.layers_seen = []
        self.handed = []            # per iteration: {group: [diff copies]}
        self.final = []             # per iteration: [diff copies at the update]
        self.overlap = GradientOverlap(net, self.groups, solver.param.iter_size, self.on_ready,
                                       between_layers=self.between)
        self.current = {}
        self.passes_at_hand = set()
        solver.apply_update = self.apply_update

    def on_ready(self, g, event):
        assert event is None                        # CPU: no events
        assert g not in self.current, f"group {g} handed over twice in one iteration"
        self.current[g] = [np.array(self.params[i].diff) for i in self.groups[g]]
        self.passes_at_hand.add(self.overlap.passes)

    def between(self):
        self.layers_seen.append(self.overlap.passes)

    def apply_update(self, display=False):
        # every group went during backward: the flush finds nothing left
        assert all(self.overlap.issued), self.overlap.issued
        self.overlap.flush()
        self.final.append([np.array(q.diff) for q in self.params])
        self.handed.append(self.current)
        self.current = {}
        self.overlap.reset()
        type(self.solver).apply_update(self.solver, display)


@pytest.mark.parametrize("strategy", [None, "naive", "recompute"])
@pytest.mark.parametrize("iter_size", [1, 3])
def test_each_group_goes_once_per_iteration_with_its_final_diffs(iter_size, strategy):
    solver = make_solver(iter_size)
    if strategy:
        from swap.runtime import install
        install(solver, strategy, poison=True)
    rec = Recorder(solver)
    solver.step(4)
    assert len(rec.handed) == 4
    n = len(rec.params)
    for handed, final in zip(rec.handed, rec.final):
        assert sorted(handed) == list(range(n + 1))
        for g in range(n):
            np.testing.assert_array_equal(handed[g][0], final[g])   # final when handed over
    assert rec.passes_at_hand == {iter_size - 1}                   # only in the last pass
    assert any(not np.allclose(d, 0) for d in rec.final[-1])
    # between_layers runs after every backward layer of the last pass only
    assert len(rec.layers_seen) == 4 * len(backward_layers(solver.net))


def test_training_with_the_listener_changes_nothing():
    """The hook and the hand-over leave the arithmetic alone: same parameters."""
    plain = make_solver(2)
    plain.step(3)
    solver = make_solver(2)
    Recorder(solver)
    solver.step(3)
    for a, b in zip(plain.net.learnable_params, solver.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)


def test_a_second_listener_is_refused_and_detach_frees_the_net():
    solver = make_solver()
    ov = GradientOverlap(solver.net, [[0]], 1, lambda g, e: None)
    with pytest.raises(RuntimeError, match="already has a backward listener"):
        GradientOverlap(solver.net, [[0]], 1, lambda g, e: None)
    ov.detach()
    assert solver.net.backward_listener is None


# ------------------------------------------------------------ processes
def _run(procs, tmp_path, name, k, world_size, shards, extra=(), iter_size=1, max_iter=8):
    solver = write_solver(tmp_path, name, INPUT_NET, k=k, max_iter=max_iter)
    if iter_size > 1:
        with open(solver, "a") as f:
            f.write(f"iter_size: {iter_size}\n")
    servers = [procs.server(s, world_size, name=f"{name}_shard{s}") for s in range(shards)]
    eps = [p.endpoint for p in servers]
    workers = [procs.worker_api(f"{name}_w{r}", solver, eps, r, world_size,
                                tmp_path / f"{name}_w{r}.npz", 10.0, extra=list(extra))
               for r in range(world_size)]
    codes = procs.wait_all(workers + servers, 60)
    assert codes == [0] * len(codes), logs(*workers, *servers)
    out = [np.load(tmp_path / f"{name}_w{r}.npz") for r in range(world_size)]
    return [[f[f"arr_{i}"] for i in range(len(f.files))] for f in out], workers


def _reference(tmp_path, k, iter_size=1, max_iter=8):
    path = write_solver(tmp_path, "ref", INPUT_NET, k=k, max_iter=max_iter)
    if iter_size > 1:
        with open(path, "a") as f:
            f.write(f"iter_size: {iter_size}\n")
    solver = Solver(path, verbose=False)

    class Feed:
        def on_start(self, s):
            data, target = hook_batch(s.iter, k)
            s.net.blobs["data"].data[...] = data
            s.net.blobs["target"].data[...] = target

    solver.callbacks.append(Feed())
    solver.solve()
    return [np.array(q.data) for q in solver.net.learnable_params]


# (2, 4, 1, 1, 1 byte): one shard, each blob a bucket: four PUSH/PARAMS per round, answered
# as each bucket is complete; (4, 2, 3, 2, ...): two buckets on one shard, with iter_size.
# Copy-up (ps.copyup): as answers come (the CPU's default), at the update, or during the
# next forward, there with a copy thread slowed down (20 ms per bucket) so that the forward
# layers, and the caller after solve, really wait for it.
@pytest.mark.parametrize("world_size, k, shards, iter_size, bucket_mb, copy_up",
                         [(2, 4, 2, 1, None, None), (4, 2, 3, 2, 1e-6, "update"),
                          (3, 2, 4, 1, None, "forward"), (2, 4, 1, 1, 1e-6, None),
                          (2, 4, 1, 1, 1e-6, "forward"), (2, 4, 1, 1, "tail", None)])
def test_overlap_gives_the_parameters_of_the_path_without_it(procs, tmp_path, world_size, k,
                                                             shards, iter_size, bucket_mb,
                                                             copy_up):
    # "tail": one shard, one bucket, but the last 100 bytes of backward (ip1's weight: 96)
    # go in a bucket of their own (--tail-mb; the tail cap is the bucket cap here)
    extra = (["--tail-mb", str(100 / 2**20)] if bucket_mb == "tail"
             else ["--bucket-mb", str(bucket_mb)] if bucket_mb else [])
    if copy_up:
        extra += ["--copy-up", copy_up] + (["--copy-delay", "0.02"] if copy_up == "forward"
                                           else [])
    on, w_on = _run(procs, tmp_path, "on", k, world_size, shards, extra, iter_size=iter_size)
    off, w_off = _run(procs, tmp_path, "off", k, world_size, shards, ["--no-overlap"],
                      iter_size=iter_size)
    want = 2 if bucket_mb == "tail" else 4 if bucket_mb else shards
    assert f"overlap: {want} bucket(s) of at most" in w_on[0].log()
    assert f"copied into the net: {copy_up_mode(False, copy_up)}" in w_on[0].log()
    assert "overlap off" in w_off[0].log()
    for r in range(world_size):                # every rank, bit for bit
        for a, b in zip(on[r], off[r]):
            np.testing.assert_array_equal(a, b)
    ref = _reference(tmp_path, world_size * k, iter_size)
    for a, b in zip(on[0], ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_the_first_shard_leaves_before_backward_ends(procs, tmp_path):
    """In one process: the top shard's PUSH is made (by the round thread) while lower layers
    still have to run backward, and the emulated link's pushes wait in a queue, not in
    backward."""
    from ps.worker import PSConfig, PSWorker
    solver_path = write_solver(tmp_path, "early", INPUT_NET, k=4, max_iter=3)
    # 3 shards: backward order ip2.b, ip2.w | ip1.b | ip1.w (8, 48 | 24 | 96 bytes)
    servers = [procs.server(s, 1, name=f"early_shard{s}") for s in range(3)]
    solver = Solver(solver_path, verbose=False)

    def feed(s, rank, world_size):
        data, target = hook_batch(s.iter, 4)
        s.net.blobs["data"].data[...] = data
        s.net.blobs["target"].data[...] = target

    cfg = PSConfig(endpoints=[p.endpoint for p in servers], timeout=10.0, overlap=True,
                   link_latency_ms=30.0)
    worker = PSWorker(solver, cfg, data_hook=feed)
    net = solver.net
    layers = []
    hook = net.backward_listener
    events = []
    armed = [False]

    def listener(li):
        layers.append(li)
        hook(li)
        if armed[0] and li == net.layer_index("ip2"):
            # the bucket is handed to the round thread: it pushes it within a tick, while
            # backward waits here (below ip2, ip1 and its bucket are still to run)
            wait_for(lambda: any(e[0] == "push" for e in events))
            armed[0] = False

    net.backward_listener = listener
    try:
        worker.step(1)            # joins
        push, send_one = worker.client.push, worker.client._send_one

        def spy_push(iteration, s, payloads):
            events.append(("push", s, list(layers)))
            return push(iteration, s, payloads)

        def spy_send(s, frames):
            events.append(("send", s, list(layers)))
            return send_one(s, frames)

        worker.client.push, worker.client._send_one = spy_push, spy_send
        armed[0] = True
        worker.step(2)
    finally:
        worker.close()
    bwd = backward_layers(net)
    assert worker.shards == [[2, 3], [1], [0]]
    pushes = [e for e in events if e[0] == "push"]
    assert [e[1] for e in pushes] == [0, 1, 2, 0, 1, 2]      # in the order backward ends them
    assert pushes[0][2][-1] == net.layer_index("ip2") != bwd[-1], events
    # 30 ms of emulated latency, far more than this backward: the pushes waited in the
    # queue (sent at the update), backward never slept on them
    sends = [e for e in events if e[0] == "send"]
    assert len(sends) == 6 and all(e[2][-1] == bwd[-1] for e in sends), events


def test_a_bucket_comes_back_while_backward_goes_on(procs, tmp_path):
    """One worker, one shard, each blob a bucket: the server answers ip2's buckets as soon
    as they are pushed, and the worker's round thread copies their new values in (copy-up
    "backward") before ip1's backward has run; the round ends with every blob set once."""
    from ps.worker import PSConfig, PSWorker
    solver_path = write_solver(tmp_path, "back", INPUT_NET, k=4, max_iter=3)
    server = procs.server(0, 1, name="back_shard0")
    solver = Solver(solver_path, verbose=False)

    def feed(s, rank, world_size):
        data, target = hook_batch(s.iter, 4)
        s.net.blobs["data"].data[...] = data
        s.net.blobs["target"].data[...] = target

    cfg = PSConfig(endpoints=[server.endpoint], timeout=10.0, overlap=True, bucket_mb=1e-6,
                   copy_up="backward")
    worker = PSWorker(solver, cfg, data_hook=feed)
    net = solver.net
    layers, sets = [], None
    hook = net.backward_listener
    relu = net.layer_index("relu")

    def listener(li):
        layers.append(li)
        if li == relu and sets is not None:
            # ip2's buckets were pushed after ip2's backward: the round thread takes the
            # server's first answer while backward waits here
            wait_for(lambda: sets)
        hook(li)

    net.backward_listener = listener
    try:
        worker.step(1)            # joins
        set_param = worker._set_param

        def spy_set(i, array):
            sets.append((i, list(layers)))
            return set_param(i, array)

        worker._set_param = spy_set
        layers.clear()
        sets = []
        worker.step(1)
    finally:
        worker.close()
    assert len(worker.buckets) == 4
    assert sorted(i for i, _ in sets) == [0, 1, 2, 3]          # each blob once per round
    early = {i for i, seen in sets if net.layer_index("ip1") not in seen}
    assert 3 in early and early <= {2, 3}, sets    # ip2's bias (its first bucket), weight
