"""Solvers against BVLC Caffe's own unit tests.

Mirrors ``src/caffe/test/test_gradient_based_solver.cpp``: a least-squares
problem (HDF5Data -> InnerProduct(num_output 1) -> EuclideanLoss, N = 4 rows of
3x10x10) whose (K+1)-th update is computed analytically from the solver's
history after K iterations (``TestLeastSquaresUpdate``), the same problem split
into ``iter_size`` smaller batches (``CheckAccumulation``), a net whose two
InnerProducts share their parameters by name (the ``...Share`` variants), and
an interrupted run resumed from its snapshot (``TestSnapshot``).  The solvers
are seeded as Caffe's test seeds them: ``Caffe::set_random_seed`` before the
solver is made, with the solver's own ``random_seed`` left unset.

Also mirrors ``src/caffe/solvers/sgd_solver.cpp`` where Caffe has no unit test
for it: ``Regularize`` (L1), ``ClipGradients`` (before ``Normalize``), and
``GetLearningRate`` keeping ``current_step`` for the ``step`` policy.
"""
import math

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.proto import caffe_pb2, parse_text, read_binary
from minicaffe.solver import Solver

N, C, H, W = 4, 3, 10, 10
D = C * H * W
SEED = 1701


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The HDF5 list file of one file of N rows (Caffe's solver_data.h5 is random too)."""
    h5py = pytest.importorskip("h5py")
    d = tmp_path_factory.mktemp("lsq")
    rng = np.random.default_rng(0)
    with h5py.File(d / "data.h5", "w") as f:
        f["data"] = rng.standard_normal((N, C, H, W))
        f["targets"] = rng.standard_normal((N, 1))
    (d / "list.txt").write_text(str(d / "data.h5") + "\n")
    return str(d / "list.txt")


def net_text(source, batch, share):
    ip = ("param {{ name: 'weights' }} param {{ name: 'bias' }} "
          "inner_product_param {{ num_output: 1 weight_filler {{ type: 'gaussian' std: 1 }} "
          "bias_filler {{ type: 'gaussian' std: 1 }} }} bottom: '{}' top: '{}'")
    layers = [f"layer {{ name: 'data' type: 'HDF5Data' top: 'data' top: 'targets' "
              f"hdf5_data_param {{ source: '{source}' batch_size: {batch} }} }}"]
    if share:
        layers += ["layer { name: 'slice' type: 'Slice' bottom: 'data' top: 'data1' "
                   "top: 'data2' slice_param { axis: 0 } }",
                   "layer { name: 'innerprod' type: 'InnerProduct' "
                   + ip.format("data1", "innerprod1") + " }",
                   "layer { name: 'innerprod2' type: 'InnerProduct' "
                   + ip.format("data2", "innerprod2") + " }",
                   "layer { name: 'concat' type: 'Concat' bottom: 'innerprod1' "
                   "bottom: 'innerprod2' top: 'innerprod' concat_param { axis: 0 } }"]
    else:
        layers.append("layer { name: 'innerprod' type: 'InnerProduct' "
                      + ip.format("data", "innerprod") + " }")
    layers.append("layer { name: 'loss' type: 'EuclideanLoss' bottom: 'innerprod' "
                  "bottom: 'targets' }")
    return "name: 'TestNetwork' " + " ".join(layers)


# the extra settings each of Caffe's solver test fixtures imposes
FIXTURE = {"SGD": {}, "Nesterov": {}, "AdaGrad": {}, "AdaDelta": {},
           "Adam": dict(momentum=0.9, momentum2=0.999), "RMSProp": dict(rms_decay=0.95)}


def run(source, kind, lr, wd, mom, iters, iter_size=1, share=False, prefix=None,
        snapshot=False, resume=None, dtype=np.float64):
    """Caffe's RunLeastSquaresSolver: a fresh solver, seeded through the process RNG, solved
    for ``iters`` iterations (from ``resume`` when given)."""
    p = caffe_pb2.SolverParameter(
        type=kind, base_lr=lr, lr_policy="fixed", max_iter=iters, iter_size=iter_size,
        display=0, snapshot_after_train=snapshot, solver_mode=caffe_pb2.SolverParameter.CPU)
    p.net_param.CopyFrom(parse_text(net_text(source, N // iter_size, share),
                                    caffe_pb2.NetParameter))
    if wd:
        p.weight_decay = wd
    if mom:
        p.momentum = mom
    for k, v in FIXTURE[kind].items():
        setattr(p, k, v)
    if prefix:
        p.snapshot_prefix = prefix
    if snapshot:
        p.snapshot = iters
    caffe.set_random_seed(SEED)
    s = Solver(p, verbose=False, dtype=dtype)
    s.solve(resume)
    return s


def f32(v):
    """A float proto field's value (Caffe's solver reads float, as ours does)."""
    return float(np.float32(v))


def expected_update(s, kind, lr, wd, mom):
    """Caffe's ComputeLeastSquaresUpdate: the next update from the analytic gradient
    (1/N)(X^T X w - X^T y) + wd * w of the augmented problem, and the history the solver
    holds now.  Returns (new params, update) as (D + 1,) vectors, bias last."""
    net = s.net
    net.forward()
    x = np.concatenate([net.blobs["data"].data.reshape(N, D), np.ones((N, 1))], axis=1)
    y = net.blobs["targets"].data.reshape(N)
    w_blob, b_blob = net.params["innerprod"]
    w = np.concatenate([w_blob.data.ravel(), b_blob.data.ravel()])
    lr, wd, mom, delta = f32(lr), f32(wd), f32(mom), f32(s.param.delta)
    grad = (x.T @ (x @ w) - x.T @ y) / N + wd * w
    state = s.rule.state_blobs()          # Caffe's history_: gradient slots, then the second
    assert len(state) == (4 if kind in ("AdaDelta", "Adam") else 2)
    h = np.concatenate([state[0].ravel(), state[1].ravel()])
    if kind == "SGD":
        upd = lr * grad + mom * h
    elif kind == "Nesterov":
        upd = (1 + mom) * (lr * grad + mom * h) - mom * h
    elif kind == "AdaGrad":
        upd = lr * grad / (np.sqrt(h + grad ** 2) + delta)
    elif kind == "RMSProp":
        rd = f32(0.95)
        upd = lr * grad / (np.sqrt(rd * h + (1 - rd) * grad ** 2) + delta)
    elif kind == "AdaDelta":
        u = np.concatenate([state[2].ravel(), state[3].ravel()])
        upd = lr * grad * np.sqrt((u + delta) / (mom * h + (1 - mom) * grad ** 2 + delta))
    else:  # Adam: t = iter + 1
        b2, t = f32(0.999), s.iter + 1
        v = np.concatenate([state[2].ravel(), state[3].ravel()])
        m_new = (1 - mom) * grad + mom * h
        v_new = (1 - b2) * grad ** 2 + b2 * v
        upd = lr * math.sqrt(1 - b2 ** t) / (1 - mom ** t) * m_new / (np.sqrt(v_new) + delta)
    return w - upd, upd


# (solver, lr, weight_decay, momentum, K): the "WithEverything" settings of each fixture,
# checked at K = 0 and at a later iteration, plus the plain update at lr 1
LSQ_CASES = [
    ("SGD", 1.0, 0.0, 0.0, 0), ("SGD", 0.01, 0.5, 0.5, 0), ("SGD", 0.01, 0.5, 0.5, 4),
    ("Nesterov", 1.0, 0.0, 0.0, 0), ("Nesterov", 0.01, 0.5, 0.9, 0),
    ("Nesterov", 0.01, 0.5, 0.9, 4),
    ("AdaGrad", 1.0, 0.0, 0.0, 0), ("AdaGrad", 0.01, 0.5, 0.0, 4),
    ("RMSProp", 1.0, 0.5, 0.0, 0), ("RMSProp", 0.01, 0.5, 0.0, 4),
    ("AdaDelta", 0.1, 0.0, 0.0, 0), ("AdaDelta", 0.1, 0.1, 0.95, 4),
    ("Adam", 0.01, 0.0, 0.9, 0), ("Adam", 0.01, 0.5, 0.9, 4),
]


@pytest.mark.parametrize("share", [False, True], ids=["plain", "share"])
@pytest.mark.parametrize("kind, lr, wd, mom, k", LSQ_CASES)
def test_least_squares_update(source, kind, lr, wd, mom, k, share):
    """TestLeastSquaresUpdate*: K solver iterations, then the (K+1)-th computed by hand
    matches a fresh solver's K+1 iterations; SGD's history holds that update."""
    s = run(source, kind, lr, wd, mom, k, share=share)
    assert len(s.net.learnable_params) == 2     # shared parameters are learned once
    want, upd = expected_update(s, kind, lr, wd, mom)
    s = run(source, kind, lr, wd, mom, k + 1, share=share)
    w_blob, b_blob = s.net.params["innerprod"]
    got = np.concatenate([w_blob.data.ravel(), b_blob.data.ravel()])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    if kind == "SGD":
        hist = np.concatenate([h.ravel() for h in s.history])
        np.testing.assert_allclose(hist, upd, rtol=1e-9, atol=1e-12)


# CheckAccumulation's settings per fixture ("...WithEverythingAccum")
ACCUM_CASES = [("SGD", 0.01, 0.5, 0.9), ("Nesterov", 0.01, 0.5, 0.9),
               ("AdaGrad", 0.01, 0.5, 0.0), ("RMSProp", 0.01, 0.5, 0.0),
               ("AdaDelta", 0.1, 0.1, 0.95), ("Adam", 0.01, 0.5, 0.9)]


@pytest.mark.parametrize("share", [False, True], ids=["plain", "share"])
@pytest.mark.parametrize("kind, lr, wd, mom", ACCUM_CASES)
def test_iter_size_accumulation_matches_the_full_batch(source, kind, lr, wd, mom, share):
    """...WithEverythingAccum: 4 iterations of batch 4 equal 4 iterations of iter_size 2
    over batches of 2 (the gradient is normalised before weight decay is added)."""
    full = run(source, kind, lr, wd, mom, 4, share=share)
    accum = run(source, kind, lr, wd, mom, 4, iter_size=2, share=share)
    for a, b in zip(full.net.params["innerprod"], accum.net.params["innerprod"]):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("share", [False, True], ids=["plain", "share"])
@pytest.mark.parametrize("kind, lr, wd, mom", ACCUM_CASES)
def test_snapshot_resume_is_exact(source, tmp_path, kind, lr, wd, mom, share):
    """TestSnapshot: 2n iterations straight equal n, a snapshot, and n more after
    restoring it: every parameter's data and diff and every history blob, bit for bit."""
    n = 2
    straight = run(source, kind, lr, wd, mom, 2 * n, share=share)
    prefix = str(tmp_path / "snap") + "/"
    first = run(source, kind, lr, wd, mom, n, share=share, prefix=prefix, snapshot=True)
    state = first.last_snapshot[1]
    assert state == f"{prefix}_iter_{n}.solverstate"
    resumed = run(source, kind, lr, wd, mom, 2 * n, share=share, prefix=prefix, resume=state)
    assert resumed.iter == 2 * n
    for a, b in zip(straight.net.learnable_params, resumed.net.learnable_params):
        np.testing.assert_array_equal(b.data, a.data)
        np.testing.assert_array_equal(b.diff, a.diff)
    for a, b in zip(straight.rule.state_blobs(), resumed.rule.state_blobs()):
        np.testing.assert_array_equal(b, a)


def test_solver_without_random_seed_keeps_the_process_seed(source):
    """Caffe's Solver::Init reseeds only when random_seed >= 0 (its default is -1), so
    Caffe::set_random_seed (pycaffe's caffe.set_random_seed) before making the solver
    decides the fillers' draws."""
    a = run(source, "SGD", 0.01, 0.0, 0.0, 0)
    b = run(source, "SGD", 0.01, 0.0, 0.0, 0)
    for pa, pb in zip(a.net.learnable_params, b.net.learnable_params):
        np.testing.assert_array_equal(pa.data, pb.data)


# ------------------------------------------------------------- sgd_solver.cpp
def one_update(source, **kw):
    """Params before, their gradient (summed over iter_size passes) and after one SGD step."""
    iter_size = kw.pop("iter_size", 1)
    p = caffe_pb2.SolverParameter(type="SGD", base_lr=0.1, lr_policy="fixed", max_iter=1,
                                  display=0, iter_size=iter_size,
                                  solver_mode=caffe_pb2.SolverParameter.CPU, **kw)
    p.net_param.CopyFrom(parse_text(net_text(source, N // iter_size, False),
                                    caffe_pb2.NetParameter))
    caffe.set_random_seed(SEED)
    s = Solver(p, verbose=False, dtype=np.float64)
    params = s.net.learnable_params
    before = [q.data.copy() for q in params]
    s.net.clear_param_diffs()
    for _ in range(iter_size):
        s.net.forward_backward()
    grads = [q.diff.copy() for q in params]
    s.apply_update()
    return before, grads, [q.data.copy() for q in params]


@pytest.mark.parametrize("reg", ["L1", "L2"])
def test_regularization_types(source, reg):
    """Regularize: L2 adds decay * w to the gradient, L1 adds decay * sign(w)."""
    before, grads, after = one_update(source, weight_decay=0.25, regularization_type=reg)
    lr, wd = f32(0.1), f32(0.25)
    for w, g, a in zip(before, grads, after):
        reg_term = w if reg == "L2" else np.sign(w)
        np.testing.assert_allclose(a, w - lr * (g + wd * reg_term), rtol=1e-12)


@pytest.mark.parametrize("iter_size", [1, 2])
def test_clip_gradients(source, iter_size):
    """ClipGradients runs first in ApplyUpdate: when the L2 norm of all (accumulated,
    not yet iter_size-normalised) diffs exceeds clip_gradients they are scaled by
    clip_gradients / norm; weight decay is added after, unclipped."""
    before, grads, after = one_update(source, weight_decay=0.5, clip_gradients=0.5,
                                      iter_size=iter_size)
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
    clip = f32(0.5)
    assert norm > clip * iter_size   # the case is one that clips, also after normalising
    lr, wd = f32(0.1), f32(0.5)
    for w, g, a in zip(before, grads, after):
        g = g * (clip / norm) / iter_size + wd * w
        np.testing.assert_allclose(a, w - lr * g, rtol=1e-12)


def test_clip_gradients_leaves_a_small_gradient_alone(source):
    before, grads, after = one_update(source, clip_gradients=1e6)
    for w, g, a in zip(before, grads, after):
        np.testing.assert_allclose(a, w - f32(0.1) * g, rtol=1e-12)


def test_step_policy_keeps_current_step_in_the_solver_state(source, tmp_path):
    """GetLearningRate's step policy sets current_step_ = iter / stepsize, which
    SnapshotSolverState writes (sgd_solver.cpp)."""
    p = caffe_pb2.SolverParameter(type="SGD", base_lr=0.1, lr_policy="step", gamma=0.5,
                                  stepsize=2, max_iter=5, display=0,
                                  snapshot_prefix=str(tmp_path / "s"),
                                  solver_mode=caffe_pb2.SolverParameter.CPU)
    p.net_param.CopyFrom(parse_text(net_text(source, N, False), caffe_pb2.NetParameter))
    s = Solver(p, verbose=False, dtype=np.float64)
    s.step(5)                       # the last update ran at iter 4: current_step 2
    _, path = s.snapshot()
    assert read_binary(path, caffe_pb2.SolverState).current_step == 2


def test_loss_layer_without_top_gets_an_automatic_one(source):
    """Net::Init's AutoTopBlobs: the test net's EuclideanLoss names no top; Caffe appends one
    (named "(automatic)") that carries the loss, weight 1, and is no net output."""
    caffe.set_random_seed(SEED)
    net = caffe.Net(parse_text(net_text(source, N, False), caffe_pb2.NetParameter), caffe.TRAIN)
    assert net.outputs == []
    assert net.layer_top_names[-1] == ["(automatic)"]
    loss = float(net.forward_backward())
    diff = net.blobs["innerprod"].data - net.blobs["targets"].data
    assert loss == pytest.approx(float(np.sum(diff ** 2)) / (2 * N), rel=1e-6)
    assert float(net.blobs["(automatic)"].data) == pytest.approx(loss, rel=1e-6)
