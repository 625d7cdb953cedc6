"""Solvers against BVLC Caffe's sources, where the earlier audits (test_caffe_spec_solver.py,
test_solver.py, test_resume.py, test_hdf5_snapshot.py) left gaps.

Each expected value is written from Caffe's code: src/caffe/solver.cpp,
src/caffe/solvers/sgd_solver.cpp (GetLearningRate, ApplyUpdate, ClipGradients, the solver
state's binary and HDF5 forms) and the subclasses' extra history.
"""
import math
import os

import numpy as np
import pytest

from minicaffe.proto import caffe_pb2, parse_text, write_binary
from minicaffe.solver import Solver, learning_rate

# a deterministic net: constant data, so that a state without minicaffe's own extras (the RNG
# and data positions, which Caffe never writes) resumes exactly
NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "target"
        dummy_data_param { shape { dim: 8 dim: 4 } shape { dim: 8 dim: 2 }
                           data_filler { type: "constant" value: 0.5 }
                           data_filler { type: "constant" value: -1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 }
                              bias_filler { type: "constant" value: 0.1 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "target" top: "loss" }
"""


def solver_param(**kw):
    p = caffe_pb2.SolverParameter(base_lr=0.05, lr_policy="fixed", max_iter=10, display=0,
                                  random_seed=7, solver_mode=caffe_pb2.SolverParameter.CPU)
    p.net_param.CopyFrom(parse_text(NET, caffe_pb2.NetParameter))
    for k, v in kw.items():
        setattr(p, k, v)
    return p


# ------------------------------------------------------------------ lr policies
def test_sigmoid_rate_far_past_stepsize_is_zero_as_cs_exp_overflows():
    """sgd_solver.cpp: base_lr * (1 / (1 + exp(-gamma * (iter - stepsize)))); a decaying
    sigmoid (gamma < 0) far past stepsize overflows exp to inf, and the rate is 0 (Caffe
    trains on); Python's math.exp raised OverflowError instead."""
    p = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="sigmoid", gamma=-0.1, stepsize=10)
    assert learning_rate(p, 10010) == 0.0
    assert learning_rate(p, 10) == pytest.approx(0.05)


def test_exp_rate_overflowing_is_inf_as_cs_pow():
    """"exp": base_lr * pow(gamma, iter); C's pow overflows to inf where Python's ** raised."""
    p = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="exp", gamma=1.01)
    assert learning_rate(p, 100000) == math.inf
    p.gamma = 0.99
    assert learning_rate(p, 100) == pytest.approx(0.1 * 0.99 ** 100)


@pytest.mark.parametrize("policy", ["step", "multistep"])
def test_step_rates_overflowing_are_inf_as_cs_pow(policy):
    """"step": base_lr * pow(gamma, current_step_) (current_step_ = iter / stepsize), and so
    "multistep" at its current_step_: an overflowing pow is inf in C, not an exception."""
    p = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy=policy, gamma=10, stepsize=1)
    assert learning_rate(p, 400, current_step=400) == math.inf
    assert learning_rate(p, 3, current_step=3) == pytest.approx(100.0)


# ------------------------------------------------------------------ Solve
def test_solve_clears_an_earlier_stop_request():
    """solver.cpp Solve: ``requested_early_exit_ = false`` before anything else, so a stop
    asked for earlier (a SIGINT in a pycaffe step(), or an action function) does not cut
    this solve short: it runs its final display pass and TestAll."""
    p = solver_param(max_iter=4, test_interval=4, test_initialization=False,
                     snapshot_after_train=False)
    p.test_iter.append(1)
    s = Solver(p, verbose=False)
    tested = []
    s.test = lambda i=0: tested.append(s.iter) or {}
    s.requested_early_exit = True       # left over from an earlier stop
    s.solve()
    assert s.iter == 4
    assert tested == [4]                # Solve's final TestAll at max_iter
    assert not s.requested_early_exit


# ------------------------------------------------------------- solver states
KINDS = [("SGD", dict(momentum=0.9)), ("Nesterov", dict(momentum=0.9)),
         ("AdaGrad", dict(delta=1e-8)), ("RMSProp", dict(rms_decay=0.9, delta=1e-8)),
         ("AdaDelta", dict(momentum=0.9, delta=1e-6)),
         ("Adam", dict(momentum=0.9, momentum2=0.999, delta=1e-8))]
# history blobs per learnable param, as SGDSolver::PreSolve (one each) plus AdaDelta's and
# Adam's PreSolve (a second run of them appended to history_)
PER_PARAM = {"SGD": 1, "Nesterov": 1, "AdaGrad": 1, "RMSProp": 1, "AdaDelta": 2, "Adam": 2}


@pytest.mark.parametrize("kind, kw", KINDS)
def test_a_state_as_caffe_writes_it_resumes_the_same_update(tmp_path, kind, kw):
    """A SolverState with only Caffe's fields (iter, learned_net, history, current_step; no
    minicaffe_state), history blobs in Caffe's order (param after param, then AdaDelta's update
    history / Adam's v after them), some with BlobProto's legacy 4-D fields as older Caffe
    wrote them: restored, the next iterations are those of the run that never stopped
    (SGDSolver::RestoreSolverStateFromBinaryProto)."""
    full = Solver(solver_param(type=kind, **kw), verbose=False)
    full.step(6)
    part = Solver(solver_param(type=kind, **kw), verbose=False)
    part.step(3)
    model = str(tmp_path / "w.caffemodel")
    part.net.save(model)
    params = part.net.learnable_params
    slots = part.rule.history_slots()
    assert len(slots) == PER_PARAM[kind]
    state = caffe_pb2.SolverState(iter=3, learned_net=model, current_step=0)
    for slot in slots:
        for h in slot:
            b = state.history.add()
            if h.ndim == 2:
                b.num, b.channels, b.height, b.width = 1, 1, h.shape[0], h.shape[1]
            else:
                b.shape.dim.extend(h.shape)
            b.data.extend(np.asarray(h, np.float32).ravel().tolist())
    assert len(state.history) == PER_PARAM[kind] * len(params)
    path = str(tmp_path / "caffe.solverstate")
    write_binary(state, path)
    resumed = Solver(solver_param(type=kind, **kw), verbose=False)
    resumed.restore(path)
    assert resumed.iter == 3
    resumed.step(3)
    for a, b in zip(full.net.learnable_params, resumed.net.learnable_params):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind, kw", KINDS)
def test_minicaffes_state_has_caffes_fields_and_history_layout(tmp_path, kind, kw):
    """SGDSolver::SnapshotSolverStateToBinaryProto: iter, learned_net (the .caffemodel
    written just before), current_step, then history_[i]->ToProto for every history blob:
    ``shape`` set, float ``data`` of the param's count; AdaDelta's and Adam's second run
    after the first. File names: SnapshotFilename = prefix + "_iter_" + iter + extension."""
    from minicaffe.proto import read_binary
    s = Solver(solver_param(type=kind, snapshot_prefix=str(tmp_path / "p"), **kw),
               verbose=False)
    s.step(2)
    model, path = s.snapshot()
    assert model == str(tmp_path / "p_iter_2.caffemodel")
    assert path == str(tmp_path / "p_iter_2.solverstate")
    st = read_binary(path, caffe_pb2.SolverState)
    assert st.iter == 2 and st.learned_net == model and st.current_step == 0
    params = s.net.learnable_params
    assert len(st.history) == PER_PARAM[kind] * len(params)
    want = [h for slot in s.rule.history_slots() for h in slot]
    for i, b in enumerate(st.history):
        q = params[i % len(params)]
        assert list(b.shape.dim) == list(q.data.shape)
        assert not (b.HasField("num") or b.HasField("channels") or b.HasField("height")
                    or b.HasField("width"))
        assert len(b.data) == q.data.size and not len(b.double_data)
        np.testing.assert_array_equal(np.asarray(b.data, np.float32),
                                      np.asarray(want[i], np.float32).ravel())
    if kind == "Adam":    # m (momentum's running mean of diffs) first, then v (squares): v >= 0
        n = len(params)
        assert all((np.asarray(b.data) >= 0).all() for b in st.history[n:])
        assert any((np.asarray(b.data) < 0).any() for b in st.history[:n])


# ------------------------------------------------------------------ display
RANDOM_NET = NET.replace('data_filler { type: "constant" value: 0.5 }',
                         'data_filler { type: "gaussian" std: 1 }').replace(
    'top: "loss" }', 'top: "loss" loss_weight: 2 }').replace(
    'bottom: "target" }', 'bottom: "target" top: "loss" loss_weight: 2 }')


def test_display_lines_with_iter_size_and_average_loss(monkeypatch):
    """Solver::Step: loss = sum of iter_size ForwardBackward losses / iter_size (each
    sub-iteration draws its own batch), smoothed over the last average_loss iterations
    (UpdateSmoothedLoss); on display iterations "Iteration N (X iter/s, Ys/D iters), loss = L",
    then each output blob's values from the last forward, "    Train net output #k: name = v
    (* w = w*v loss)" with w the blob's loss weight; then ApplyUpdate's "Iteration N, lr = r"."""
    import io
    import re
    from minicaffe import log as mlog
    stream = io.StringIO()
    monkeypatch.setattr(mlog, "_state", {"stream": stream, "quiet": False})
    p = solver_param(display=2, average_loss=2, iter_size=2, max_iter=4)
    p.net_param.CopyFrom(parse_text(RANDOM_NET, caffe_pb2.NetParameter))
    s = Solver(p, verbose=True)
    assert s._output_loss_weight(s.net, "loss") == 2
    sub, blob = [], []
    fb = s.net.forward_backward

    def record(*a, **k):
        v = fb(*a, **k)
        sub.append(float(v))
        blob.append(float(s.net.blobs["loss"].data))
        return v
    monkeypatch.setattr(s.net, "forward_backward", record)
    s.step(3)
    assert len(sub) == 6 and len(set(sub)) == 6       # every sub-iteration a new batch
    np.testing.assert_allclose(sub, [2 * b for b in blob], rtol=1e-6)   # loss_weight 2
    per_iter = [(sub[2 * i] + sub[2 * i + 1]) / 2 for i in range(3)]
    lines = stream.getvalue().splitlines()
    shown = {}
    for line in lines:
        m = re.search(r"\] Iteration (\d+) \([^ ]+ iter/s, [^ ]+s/2 iters\), loss = ([^ ]+)", line)
        if m:
            shown[int(m.group(1))] = float(m.group(2))
    assert sorted(shown) == [0, 2]
    assert shown[0] == pytest.approx(per_iter[0], rel=1e-5)
    assert shown[2] == pytest.approx((per_iter[1] + per_iter[2]) / 2, rel=1e-5)
    outs = [l.split("] ", 1)[1] for l in lines if "Train net output" in l]
    assert len(outs) == 2
    for line, v in zip(outs, (blob[1], blob[5])):
        m = re.fullmatch(r"    Train net output #0: loss = (\S+) \(\* 2 = (\S+) loss\)", line)
        assert m, line
        assert float(m.group(1)) == pytest.approx(v, rel=1e-5)
        assert float(m.group(2)) == pytest.approx(2 * v, rel=1e-5)
    lr = [l.split("] ", 1)[1] for l in lines if ", lr = " in l]
    assert lr == ["Iteration 0, lr = 0.05", "Iteration 2, lr = 0.05"]


# ---------------------------------------------------------------- snapshots
@pytest.mark.parametrize("diff", [False, True])
def test_binary_snapshot_diff_holds_the_last_update(tmp_path, diff):
    """Solver::SnapshotToBinaryProto: net_->ToProto(&net_param, snapshot_diff); Step snapshots
    after ApplyUpdate, whose Net::Update did data -= diff, so each blob's diff is the update
    just applied (old data - new data), written only with snapshot_diff."""
    from minicaffe.proto import read_binary
    s = Solver(solver_param(momentum=0.9, snapshot=3, snapshot_diff=diff,
                            snapshot_prefix=str(tmp_path / "d")), verbose=False)
    s.step(2)
    before = [np.array(q.data) for q in s.net.learnable_params]
    s.step(1)                                  # iteration 2, then ++iter = 3: snapshot
    assert os.path.exists(tmp_path / "d_iter_3.caffemodel")
    net = read_binary(str(tmp_path / "d_iter_3.caffemodel"), caffe_pb2.NetParameter)
    blobs = [b for layer in net.layer for b in layer.blobs]
    assert len(blobs) == len(before)
    for b, old, q in zip(blobs, before, s.net.learnable_params):
        np.testing.assert_array_equal(np.asarray(b.data, np.float32).reshape(q.data.shape),
                                      q.data)
        if diff:
            np.testing.assert_allclose(np.asarray(b.diff).reshape(q.data.shape),
                                       old - q.data, rtol=1e-5, atol=1e-7)
        else:
            assert len(b.diff) == 0


def test_iteration_line_is_caffes_six_digits_and_ends_at_the_loss(monkeypatch):
    """Solver::Step: LOG(INFO) << "Iteration " << iter_ << " (" << per_s << " iter/s, " << lapse
    << "s/" << display << " iters), loss = " << smoothed_loss_; with per_s = (iter_ -
    iterations_last_) / lapse, floats streamed at the default six significant digits, and
    nothing after the loss (minicaffe printed four digits and a progress/eta suffix)."""
    import io
    import types
    from minicaffe import log as mlog
    from minicaffe import solver as msolver
    stream = io.StringIO()
    monkeypatch.setattr(mlog, "_state", {"stream": stream, "quiet": False})
    clock = iter(1.2345678 * i for i in range(1000))   # every reading 1.2345678 s later
    monkeypatch.setattr(msolver, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    s = Solver(solver_param(display=2), verbose=True)
    s.step(5)
    lines = [l.split("] ", 1)[1] for l in stream.getvalue().splitlines()
             if "iter/s" in l]
    assert len(lines) == 3
    for line, per_s in zip(lines, ("0", "1.62", "1.62")):     # 2 / 1.2345678 = 1.62000001
        head, loss = line.rsplit(" ", 1)
        float(loss)
        assert head.endswith(f" ({per_s} iter/s, 1.23457s/2 iters), loss =")


# ------------------------------------------------------------ ClipGradients
def test_every_clipping_is_logged_not_only_on_display_iterations(monkeypatch):
    """sgd_solver.cpp ClipGradients: whenever the L2 norm of all learnable params' diffs
    exceeds clip_gradients, LOG(INFO) << "Gradient clipping: scaling down gradients (L2 norm "
    << l2norm_diff << " > " << clip_gradients << ") by scale factor " << scale_factor, on
    every iteration (ApplyUpdate calls it unconditionally; display only gates the lr line)."""
    import io
    import re
    from minicaffe import log as mlog
    stream = io.StringIO()
    monkeypatch.setattr(mlog, "_state", {"stream": stream, "quiet": False})
    s = Solver(solver_param(clip_gradients=0.01, display=0), verbose=True)
    norms = []
    s.add_callback(lambda: None, lambda: norms.append(math.sqrt(sum(
        float((np.asarray(q.diff, np.float64) ** 2).sum()) for q in s.net.learnable_params))))
    s.step(3)
    got = [re.search(r"Gradient clipping: scaling down gradients \(L2 norm (\S+) > 0\.01\) "
                     r"by scale factor (\S+)$", l) for l in stream.getvalue().splitlines()
           if "Gradient clipping" in l]
    assert len(got) == 3 and all(got) and all(n > 0.01 for n in norms)
    for m, n in zip(got, norms):
        assert float(m.group(1)) == pytest.approx(n, rel=1e-5)
        assert float(m.group(2)) == pytest.approx(0.01 / n, rel=1e-5)


# --------------------------------------------------------------------- Test
def test_test_phase_means_and_lines(monkeypatch):
    """Solver::Test: "Iteration N, Testing net (#k)"; test_iter forwards, each output's
    elements summed and divided by test_iter; with test_compute_loss "Test loss: " the mean
    of the forwards' losses; then "    Test net output #i: name = mean (* w = w*mean loss)"."""
    import io
    import re
    from minicaffe import log as mlog
    stream = io.StringIO()
    monkeypatch.setattr(mlog, "_state", {"stream": stream, "quiet": False})
    p = solver_param(test_interval=2, test_initialization=False, test_compute_loss=True)
    p.test_iter.append(3)
    p.net_param.CopyFrom(parse_text(RANDOM_NET, caffe_pb2.NetParameter))
    s = Solver(p, verbose=True)
    tnet = s.test_nets[0]
    losses, blob = [], []
    fwd = tnet.forward_from_to

    def record(*a, **k):
        v = fwd(*a, **k)
        losses.append(float(v))
        blob.append(float(tnet.blobs["loss"].data))
        return v
    monkeypatch.setattr(tnet, "forward_from_to", record)
    s.step(3)                       # tests at iteration 2 only (no test_initialization)
    assert len(losses) == 3 and len(set(blob)) == 3
    lines = [l.split("] ", 1)[1] for l in stream.getvalue().splitlines()]
    i = lines.index("Iteration 2, Testing net (#0)")
    m = re.fullmatch(r"Test loss: (\S+)", lines[i + 1])
    assert m and float(m.group(1)) == pytest.approx(np.mean(losses), rel=1e-5)
    np.testing.assert_allclose(losses, [2 * b for b in blob], rtol=1e-6)
    m = re.fullmatch(r"    Test net output #0: loss = (\S+) \(\* 2 = (\S+) loss\)", lines[i + 2])
    assert m, lines[i + 2]
    assert float(m.group(1)) == pytest.approx(np.mean(blob), rel=1e-5)
    assert float(m.group(2)) == pytest.approx(2 * np.mean(blob), rel=1e-5)


@pytest.mark.parametrize("policy, kw, it, expected", [
    # sgd_solver.cpp GetLearningRate at its boundaries, base_lr 0.1
    ("step", dict(gamma=0.1, stepsize=10), 9, 0.1),
    ("step", dict(gamma=0.1, stepsize=10), 10, 0.1 * 0.1),       # current_step = iter/stepsize
    ("exp", dict(gamma=0.5), 0, 0.1),
    ("inv", dict(gamma=0.5, power=2), 0, 0.1),
    ("inv", dict(gamma=0.5, power=2), 2, 0.1 / 4),
    ("poly", dict(power=2, max_iter=10), 10, 0.0),               # pow(1 - 10/10, 2)
    ("poly", dict(power=1, max_iter=10), 5, 0.05),
    ("sigmoid", dict(gamma=0.3, stepsize=7), 7, 0.05),           # 1 / (1 + exp(0))
    ("fixed", dict(gamma=0.5, stepsize=1), 1000, 0.1),
])
def test_lr_policy_boundaries(policy, kw, it, expected):
    p = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy=policy, **kw)
    assert learning_rate(p, it) == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_multistep_resumes_from_a_caffe_state_at_its_current_step(tmp_path, monkeypatch):
    """multistep: rate = base_lr * gamma^current_step_, and current_step_ advances by one when
    iter_ >= stepvalue(current_step_), logging "MultiStep Status: Iteration N, step = k"; the
    state's current_step (RestoreSolverStateFromBinaryProto) is where it continues."""
    import io
    from minicaffe import log as mlog
    kw = dict(lr_policy="multistep", gamma=0.5, base_lr=0.1)
    part = Solver(solver_param(**kw), verbose=False)
    part.step(1)
    model = str(tmp_path / "w.caffemodel")
    part.net.save(model)
    state = caffe_pb2.SolverState(iter=15, learned_net=model, current_step=1)
    for h in part.rule.state_blobs():
        b = state.history.add()
        b.shape.dim.extend(h.shape)
        b.data.extend(np.asarray(h, np.float32).ravel().tolist())
    path = str(tmp_path / "s.solverstate")
    write_binary(state, path)
    p = solver_param(display=1, **kw)
    p.stepvalue.extend([10, 20, 21])
    stream = io.StringIO()
    monkeypatch.setattr(mlog, "_state", {"stream": stream, "quiet": False})
    s = Solver(p, verbose=True)
    s.restore(path)
    assert (s.iter, s.current_step) == (15, 1)
    s.step(7)                       # iterations 15 .. 21
    lines = [l.split("] ", 1)[1] for l in stream.getvalue().splitlines()]
    rates = [l for l in lines if ", lr = " in l]
    assert rates == [f"Iteration {i}, lr = {r:g}" for i, r in
                     [(15, .05), (16, .05), (17, .05), (18, .05), (19, .05), (20, .025),
                      (21, .0125)]]
    assert [l for l in lines if l.startswith("MultiStep")] == [
        "MultiStep Status: Iteration 20, step = 2", "MultiStep Status: Iteration 21, step = 3"]
    assert s.current_step == 3


@pytest.mark.parametrize("kind, kw", [k for k in KINDS if k[0] in ("SGD", "AdaDelta", "Adam")])
def test_an_hdf5_state_as_caffe_writes_it_resumes_the_same_update(tmp_path, kind, kw):
    """SGDSolver::SnapshotSolverStateToHDF5's file, written here by hand with nothing of
    minicaffe's: int datasets "iter" and "current_step", string "learned_net", group "history"
    with datasets "0".."n-1" (2n for AdaDelta and Adam), each shaped as its blob.
    RestoreSolverStateFromHDF5 reads it; the run continues as the one that never stopped."""
    h5py = pytest.importorskip("h5py")
    full = Solver(solver_param(type=kind, **kw), verbose=False)
    full.step(5)
    part = Solver(solver_param(type=kind, **kw), verbose=False)
    part.step(2)
    model = str(tmp_path / "w.caffemodel.h5")
    part.net.save_hdf5(model)
    blobs = part.rule.state_blobs()
    assert len(blobs) == PER_PARAM[kind] * len(part.net.learnable_params)
    path = str(tmp_path / "caffe.solverstate.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("iter", data=np.array([2], np.int32))
        f.create_dataset("learned_net", data=np.bytes_(model))
        f.create_dataset("current_step", data=np.array([0], np.int32))
        g = f.create_group("history")
        for i, h in enumerate(blobs):
            g.create_dataset(str(i), data=np.asarray(h, np.float32))
    resumed = Solver(solver_param(type=kind, **kw), verbose=False)
    resumed.restore(path)
    assert resumed.iter == 2
    resumed.step(3)
    for a, b in zip(full.net.learnable_params, resumed.net.learnable_params):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("snapshot, max_iter, after, fmt, want", [
    # Step: after ++iter_, Snapshot() when iter_ % snapshot == 0; Solve: once more at the end
    # when snapshot_after_train and the last Step did not just write it
    (3, 7, True, "BINARYPROTO", [3, 6, 7]),
    (3, 6, True, "BINARYPROTO", [3, 6]),
    (3, 7, False, "BINARYPROTO", [3, 6]),
    (0, 4, True, "BINARYPROTO", [4]),
    (0, 4, False, "BINARYPROTO", []),
    (2, 5, True, "HDF5", [2, 4, 5]),
])
def test_snapshot_schedule_and_names(tmp_path, snapshot, max_iter, after, fmt, want):
    """SnapshotFilename: prefix + "_iter_" + iter + ".caffemodel" / ".solverstate" (HDF5:
    ".caffemodel.h5" / ".solverstate.h5")."""
    p = solver_param(snapshot=snapshot, max_iter=max_iter, snapshot_after_train=after,
                     snapshot_prefix=str(tmp_path / "net"),
                     snapshot_format=getattr(caffe_pb2.SolverParameter, fmt))
    Solver(p, verbose=False).solve()
    ext = ".h5" if fmt == "HDF5" else ""
    assert sorted(os.listdir(tmp_path)) == sorted(
        f"net_iter_{i}.{kind}{ext}" for i in want for kind in ("caffemodel", "solverstate"))


def test_resumed_solve_continues_the_test_and_snapshot_schedules(tmp_path):
    """caffe train --snapshot: Restore, then Solve -> Step(max_iter - iter_): the restored
    iter_ decides the tests (iter_ % test_interval == 0, iter_ > 0) and snapshots."""
    p = solver_param(snapshot=4, max_iter=10, test_interval=3, snapshot_prefix=str(tmp_path / "a"))
    p.test_iter.append(1)
    first = Solver(p, verbose=False)
    first.step(5)
    _, state = first.snapshot()
    os.remove(tmp_path / "a_iter_4.caffemodel")
    os.remove(tmp_path / "a_iter_4.solverstate")
    s = Solver(p, verbose=False)
    tested = []
    orig = s.test
    s.test = lambda i=0: tested.append(s.iter) or orig(i)
    s.solve(resume_file=state)
    assert tested == [6, 9]                       # not 0: training resumed at 5
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".solverstate"))
    assert names == ["a_iter_10.solverstate", "a_iter_5.solverstate", "a_iter_8.solverstate"]


@pytest.mark.parametrize("n", [0, -3])
def test_average_loss_below_one_is_refused_as_solver_init_does(n):
    """solver.cpp Init: CHECK_GE(param_.average_loss(), 1) << "average_loss should be
    non-negative." (minicaffe took such a window as 1 and trained on)."""
    with pytest.raises(ValueError, match="average_loss should be non-negative"):
        Solver(solver_param(average_loss=n), verbose=False)
    assert Solver(solver_param(average_loss=1), verbose=False).param.average_loss == 1


def test_test_iter_without_test_interval_is_refused_as_init_test_nets_does(tmp_path):
    """solver.cpp InitTestNets: ``if (num_test_net_instances) CHECK_GT(param_.test_interval(),
    0);`` a solver file asking for a test net (test_iter with net/net_param) and giving no
    test_interval stops (caffe train -solver S, caffe.SGDSolver(S)); minicaffe built the test
    net and never tested.  A SolverParameter built in code keeps minicaffe's leniency."""
    from google.protobuf import text_format
    p = solver_param()
    p.test_iter.append(2)
    path = tmp_path / "solver.prototxt"
    path.write_text(text_format.MessageToString(p))
    with pytest.raises(ValueError, match=r"test_interval\(\) > 0 \(0 vs. 0\)"):
        Solver(str(path), verbose=False)
    assert len(Solver(p, verbose=False).test_nets) == 1          # in code: as before
    p.test_interval = 5
    path.write_text(text_format.MessageToString(p))
    assert len(Solver(str(path), verbose=False).test_nets) == 1
    del p.test_iter[:]
    p.test_interval = 0
    path.write_text(text_format.MessageToString(p))
    assert Solver(str(path), verbose=False).test_nets == []      # no test net: no check
