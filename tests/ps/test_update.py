"""A shard's update is the Solver's update: same code, bit for bit."""
import numpy as np
import pytest

from ps_helpers import INPUT_NET, hook_batch
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.solver import Solver
from ps.update import ShardSolver, read_shard_state, update_fields


def solver_param(**kw):
    p = caffe_pb2.SolverParameter()
    p.net_param.CopyFrom(parse_text(INPUT_NET.format(k=6), caffe_pb2.NetParameter))
    p.base_lr = 0.05
    p.momentum = 0.9
    p.weight_decay = 0.01
    p.lr_policy = "multistep"
    p.gamma = 0.5
    p.stepvalue.extend([2, 4])
    p.max_iter = 6
    p.iter_size = 2
    p.random_seed = 11
    p.solver_mode = caffe_pb2.SolverParameter.CPU
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def gradients(solver):
    """Caffe's loop up to the update: clear, then iter_size forward/backward passes."""
    net = solver.net
    net.clear_param_diffs()
    for j in range(solver.param.iter_size):
        data, target = hook_batch(10 * solver.iter + j, net.blobs["data"].shape[0])
        net.blobs["data"].data[...] = data
        net.blobs["target"].data[...] = target
        net.forward_backward()


def shard_of(solver, ids):
    net = solver.net
    shard = ShardSolver(solver.param, [net.learnable_params[i].shape for i in ids],
                        [net.param_lr_mult[i] for i in ids],
                        [net.param_decay_mult[i] for i in ids], verbose=False)
    for b, i in zip(shard.blobs, ids):
        b.data[...] = net.learnable_params[i].data
    return shard


@pytest.mark.parametrize("kind, extra", [("SGD", {}), ("Nesterov", {}),
                                         ("Adam", {"momentum2": 0.99}),
                                         ("AdaGrad", {"momentum": 0.0}),
                                         ("RMSProp", {"momentum": 0.0, "rms_decay": 0.9}),
                                         ("AdaDelta", {"delta": 1e-6}),
                                         ("SGD", {"regularization_type": "L1"})])
def test_two_shards_update_exactly_like_the_solver(kind, extra):
    """Two shards updated whole, and one shard of every blob updated by buckets (in the
    order a server may complete them, not the blobs'), all follow the solver bit for bit
    (multistep lr, iter_size)."""
    solver = Solver(solver_param(type=kind, **extra), verbose=False)
    params = solver.net.learnable_params
    shards = [[0, 3], [1, 2]]
    servers = [shard_of(solver, ids) for ids in shards]
    bucketed = shard_of(solver, [0, 1, 2, 3])
    for _ in range(6):
        gradients(solver)
        for srv, ids in zip(servers, shards):
            for b, i in zip(srv.blobs, ids):
                b.diff[...] = params[i].diff
            srv.update()
        rate = bucketed.begin_round()
        for positions in ([3], [1, 2], [0]):     # one worker: its gradients as they are
            bucketed.reduce_bucket(positions, [[params[i].diff for i in positions]], rate)
        bucketed.end_round()
        solver.apply_update()
        solver.iter += 1
        for srv, ids in zip(servers + [bucketed], shards + [[0, 1, 2, 3]]):
            assert srv.iter == solver.iter and srv.current_step == solver.current_step
            for b, i in zip(srv.blobs, ids):
                np.testing.assert_array_equal(b.data, params[i].data)


def test_a_bucket_is_the_rank_order_sum_over_w_then_the_update():
    p = caffe_pb2.SolverParameter(base_lr=0.1, momentum=0.9, weight_decay=0.01,
                                  lr_policy="fixed")
    rng = np.random.default_rng(3)
    grads = [[rng.standard_normal(5).astype(np.float32), rng.standard_normal((2, 3))
              .astype(np.float32)] for _ in range(3)]
    shard = ShardSolver(p, [(2, 3), (5,)], [1.0, 2.0], [1.0, 0.0], verbose=False)
    ref = ShardSolver(p, [(2, 3), (5,)], [1.0, 2.0], [1.0, 0.0], verbose=False)
    for a, b in zip(shard.blobs, ref.blobs):
        a.data[...] = b.data[...] = rng.standard_normal(a.shape).astype(np.float32)
    shard.reduce_bucket([1, 0], grads, shard.begin_round())
    shard.end_round()
    for j, b in enumerate(ref.blobs):         # the old server loop: += in rank order, x 1/W
        k = 1 - j
        np.copyto(b.diff, grads[0][k])
        b.diff += grads[1][k]
        b.diff += grads[2][k]
        b.diff *= np.float32(1 / 3)
    ref.update()
    for a, b in zip(shard.blobs, ref.blobs):
        np.testing.assert_array_equal(a.data, b.data)
    assert shard.iter == ref.iter == 1


def test_a_round_by_buckets_refuses_gradient_clipping():
    shard = ShardSolver(solver_param(clip_gradients=1.0), [(2,)], [1.0], [1.0], verbose=False)
    with pytest.raises(ValueError, match="clip_gradients"):
        shard.begin_round()


def test_shard_state_roundtrip_resumes_exactly(tmp_path):
    solver = Solver(solver_param(type="Adam", momentum2=0.999), verbose=False)
    params = solver.net.learnable_params
    ids = list(range(len(params)))
    a = shard_of(solver, ids)

    def step(srv):
        gradients(solver)
        for b, i in zip(srv.blobs, ids):
            b.diff[...] = params[i].diff
        srv.update()
        solver.iter = srv.iter

    for _ in range(3):
        step(a)
    path = str(tmp_path / "s_iter_3.solverstate")
    a.save_state(path, {"shard": 0, "blob_ids": ids, "world_size": 1})
    state, meta = read_shard_state(path)
    assert meta["blob_ids"] == ids and meta["solver_type"] == "Adam"
    b = shard_of(solver, ids)
    b.load_state(state, path)
    assert (b.iter, b.current_step) == (a.iter, a.current_step)
    saved_iter = solver.iter
    for _ in range(3):
        step(a)
    solver.iter = saved_iter
    for _ in range(3):
        step(b)
    for x, y in zip(a.blobs, b.blobs):
        np.testing.assert_array_equal(x.data, y.data)


def test_a_worker_snapshot_is_not_a_shard_snapshot(tmp_path):
    solver = Solver(solver_param(snapshot_prefix=str(tmp_path / "plain")), verbose=False)
    _, state = solver.snapshot()
    with pytest.raises(ValueError, match="not a parameter-server shard snapshot"):
        read_shard_state(state)


def test_update_fields_name_what_workers_must_agree_on():
    f = update_fields(solver_param())
    assert f["base_lr"] == pytest.approx(0.05) and f["stepvalue"] == [2, 4] and f["iter_size"] == 2
    assert "random_seed" not in f and "display" not in f


def test_threaded_shard_update_is_bit_identical(monkeypatch):
    """A shard large enough for its thread pool updates every parameter exactly as the
    sequential loop does (SGD with momentum and L2 decay, Nesterov, Adam), over several
    iterations; $MINICAFFE_PS_THREADS sets the threads and rejects nonsense."""
    import numpy as np
    import pytest
    from minicaffe.proto import caffe_pb2
    from ps.update import ENV_THREADS, PARALLEL_MIN_BYTES, ShardSolver, default_threads
    shapes = [(PARALLEL_MIN_BYTES // 4 // 6 + 7,)] * 6 + [(3, 5)]
    rng = np.random.default_rng(1)
    for kind in ("SGD", "Nesterov", "Adam"):
        p = caffe_pb2.SolverParameter(base_lr=0.01, momentum=0.9, weight_decay=5e-4,
                                      lr_policy="fixed", max_iter=10, type=kind)
        if kind == "Adam":
            p.momentum2, p.delta = 0.999, 1e-8
        one = ShardSolver(p, shapes, [1.0] * 7, [1.0, 0.0] * 3 + [2.0], verbose=False, threads=1)
        many = ShardSolver(p, shapes, [1.0] * 7, [1.0, 0.0] * 3 + [2.0], verbose=False,
                           threads=3)
        assert one._pool is None and many._pool is not None
        for a, b in zip(one.blobs, many.blobs):
            a.data[...] = b.data[...] = rng.standard_normal(a.shape, dtype=np.float32)
        for _ in range(3):
            for a, b in zip(one.blobs, many.blobs):
                a.diff[...] = b.diff[...] = rng.standard_normal(a.shape, dtype=np.float32)
            one.update()
            many.update()
        for a, b in zip(one.blobs, many.blobs):
            assert np.array_equal(a.data, b.data)
        for h, g in zip(one.rule.state_blobs(), many.rule.state_blobs()):
            assert np.array_equal(h, g)
        many.close()
        assert many._pool is None
    small = ShardSolver(caffe_pb2.SolverParameter(base_lr=0.1), [(4,), (4,)], [1.0] * 2,
                        [1.0] * 2, verbose=False, threads=4)
    assert small._pool is None                       # too small for a pool to pay
    monkeypatch.setenv(ENV_THREADS, "3")
    assert default_threads() == 3
    for bad in ("0", "many"):
        monkeypatch.setenv(ENV_THREADS, bad)
        with pytest.raises(ValueError, match=ENV_THREADS):
            default_threads()


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "Adam", "AdaGrad", "RMSProp", "AdaDelta"])
def test_blobs_updated_in_slices_match_whole_blobs_and_snapshot_whole(kind, tmp_path):
    """A shard that updates its blobs in 12-byte slices (three floats; the 5-float blob
    in two slices and a remainder) gives every bit of the whole-blob update, and its
    snapshot holds whole blobs: a shard with another slice size resumes from it."""
    momentum = 0.0 if kind in ("AdaGrad", "RMSProp") else 0.9   # Caffe refuses it there
    p = caffe_pb2.SolverParameter(base_lr=0.1, momentum=momentum, weight_decay=0.01,
                                  lr_policy="fixed", type=kind, momentum2=0.99, delta=1e-8)
    shapes, lr, decay = [(2, 3), (5,), (1,)], [1.0, 2.0, 1.0], [1.0, 0.0, 1.0]
    whole = ShardSolver(p, shapes, lr, decay, verbose=False, unit_bytes=1 << 20)
    sliced = ShardSolver(p, shapes, lr, decay, verbose=False, unit_bytes=12)
    assert len(whole.units) == 3 and len(sliced.units) == 2 + 2 + 1
    rng = np.random.default_rng(5)
    for a, b in zip(whole.blobs, sliced.blobs):
        a.data[...] = b.data[...] = rng.standard_normal(a.shape).astype(np.float32)
    for _ in range(3):
        grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(2)]
        for shard in (whole, sliced):
            shard.reduce_bucket([0, 1, 2], grads, shard.begin_round())
            shard.end_round()
    for a, b in zip(whole.blobs, sliced.blobs):
        np.testing.assert_array_equal(a.data, b.data)
    sliced.save_state(str(tmp_path / "s.solverstate"), {"shard": 0})
    state, _ = read_shard_state(str(tmp_path / "s.solverstate"))
    assert [tuple(bp.shape.dim) for bp in state.history][:3] == shapes
    resumed = ShardSolver(p, shapes, lr, decay, verbose=False, unit_bytes=1 << 20)
    resumed.load_state(state, "s")
    for shard in (whole, resumed):
        grads = [[np.full(shapes[k], 0.5, np.float32) for k in (2, 0, 1)]]
        shard.reduce_bucket([2, 0, 1], grads, shard.begin_round())
        shard.end_round()
    for a, b in zip(whole.blobs, resumed.blobs):
        np.testing.assert_array_equal(a.data, b.data)


@pytest.mark.parametrize("iter_size, decay", [(1, 0.01), (2, 0.01), (1, 0.0)])
def test_in_place_sgd_leaves_the_workers_gradient_alone_and_matches_update(iter_size, decay):
    """SGD with L2 decay runs in place on a thread's scratch (ShardSolver._sgd_in_place):
    with one worker it reads the worker's gradient array (a shared-memory segment with
    --ps-shm) and must not write it; the parameters and history are update()'s bit for bit,
    over several rounds, on blobs whole and in slices."""
    p = caffe_pb2.SolverParameter(base_lr=0.05, momentum=0.9, weight_decay=decay,
                                  lr_policy="fixed", iter_size=iter_size)
    rng = np.random.default_rng(5)
    shapes, lr, dm = [(3, 700), (40,)], [1.0, 2.0], [1.0, 0.5]
    fast = ShardSolver(p, shapes, lr, dm, verbose=False, unit_bytes=1024)   # 3 x 700: slices
    ref = ShardSolver(p, shapes, lr, dm, verbose=False, unit_bytes=1024)
    for a, b in zip(fast.blobs, ref.blobs):
        a.data[...] = b.data[...] = rng.standard_normal(a.shape).astype(np.float32)
    for _ in range(3):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        kept = [g.copy() for g in grads]
        fast.reduce_bucket([1, 0], [[grads[1], grads[0]]], fast.begin_round())
        fast.end_round()
        for g, k in zip(grads, kept):
            np.testing.assert_array_equal(g, k)            # read, never written
        for b, g in zip(ref.blobs, grads):
            np.copyto(b.diff, g)
        ref.update()
        for a, b in zip(fast.blobs, ref.blobs):
            np.testing.assert_array_equal(a.data, b.data)
        for ha, hb in zip(fast.history, ref.history):
            np.testing.assert_array_equal(ha, hb)
