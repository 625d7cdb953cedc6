"""Solver: lr policies, Caffe's SGD update, loop semantics, snapshot/resume."""
import math
import os

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.solver import Solver, learning_rate

NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "target"
        dummy_data_param { shape { dim: 8 dim: 4 } shape { dim: 8 dim: 2 }
                           data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 6 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "target" top: "loss" }
"""


def solver_param(**kw):
    p = caffe_pb2.SolverParameter()
    p.net_param.CopyFrom(parse_text(NET, caffe_pb2.NetParameter))
    p.base_lr = 0.05
    p.momentum = 0.9
    p.weight_decay = 0.01
    p.lr_policy = "fixed"
    p.max_iter = 10
    p.display = 0
    p.random_seed = 7
    p.solver_mode = caffe_pb2.SolverParameter.CPU
    for k, v in kw.items():
        if isinstance(v, list):
            getattr(p, k).extend(v)
        else:
            setattr(p, k, v)
    return p


@pytest.mark.parametrize("policy, kw, it, expected", [
    ("fixed", {}, 50, 0.1),
    ("step", dict(gamma=0.5, stepsize=20), 45, 0.1 * 0.5 ** 2),
    ("exp", dict(gamma=0.99), 10, 0.1 * 0.99 ** 10),
    ("inv", dict(gamma=1e-4, power=0.75), 100, 0.1 * (1 + 1e-4 * 100) ** -0.75),
    ("poly", dict(power=2.0, max_iter=200), 50, 0.1 * (1 - 50 / 200) ** 2),
    ("sigmoid", dict(gamma=-0.1, stepsize=30), 40, 0.1 / (1 + math.exp(0.1 * 10))),
])
def test_lr_policies(policy, kw, it, expected):
    p = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy=policy, **kw)
    assert learning_rate(p, it) == pytest.approx(expected)



@pytest.mark.parametrize("policy, kw, it, expected", [
    ("poly", dict(power=0.5, max_iter=10), 12, math.nan),      # (-0.2) ** 0.5
    ("poly", dict(power=2.0, max_iter=10), 12, 0.1 * 0.2 ** 2),  # (-0.2) ** 2
    ("inv", dict(gamma=-0.5, power=0.75), 4, math.nan),        # (1 - 2) ** -0.75
    ("inv", dict(gamma=-0.5, power=0.75), 2, math.inf),        # 0 ** -0.75
])
def test_lr_policies_past_their_domain_give_cs_pow(policy, kw, it, expected):
    """sgd_solver.cpp GetLearningRate takes C's pow: a negative base to a fractional power is
    NaN (Caffe trains on with it), an integral power keeps its sign rule. Python's ** gave
    a complex rate there, and the update then failed to cast it; pycaffe's step() may well run
    a poly schedule (bvlc_googlenet's quick_solver.prototxt) past its max_iter."""
    p = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy=policy, **kw)
    rate = learning_rate(p, it)
    assert isinstance(rate, float)
    if math.isnan(expected):
        assert math.isnan(rate)
    elif math.isinf(expected):
        assert rate == expected
    else:
        assert rate == pytest.approx(expected)


def test_poly_solver_steps_past_max_iter():
    s = Solver(solver_param(lr_policy="poly", power=0.5, max_iter=2), verbose=False)
    s.step(4)  # iteration 3 has 1 - 3/2 < 0
    assert s.iter == 4 and np.isnan(s.net.params["ip1"][0].data).all()

def test_nets_merge_the_net_files_state_block():
    """Solver::InitTrainNet / InitTestNets: phase, then the net's own ``state { }``, then
    train_state / test_state, each merged over the one before."""
    p = solver_param(test_iter=[1, 1], test_interval=100)
    p.net_param.state.stage.append("file")
    for name, rule in (("train_file", 'include { phase: TRAIN stage: "file" }'),
                       ("train_both", 'include { phase: TRAIN stage: "file" stage: "extra" }'),
                       ("test_file", 'include { phase: TEST stage: "file" }'),
                       ("test_val", 'include { phase: TEST stage: "file" stage: "val" }')):
        p.net_param.layer.append(parse_text(
            f'name: "{name}" type: "ReLU" bottom: "ip2" top: "{name}" {rule}',
            caffe_pb2.LayerParameter))
    p.train_state.stage.append("extra")
    p.test_state.add()
    p.test_state.add().stage.append("val")
    s = Solver(p, verbose=False)
    assert {"train_file", "train_both"} <= set(s.net.layer_names)
    assert "test_file" not in s.net.layer_names
    assert list(s.net.state.stage) == ["file", "extra"]
    assert "test_file" in s.test_nets[0].layer_names
    assert "test_val" not in s.test_nets[0].layer_names
    assert "test_val" in s.test_nets[1].layer_names
    assert all(t.phase == caffe.TEST for t in s.test_nets) and s.net.phase == caffe.TRAIN


def test_multistep_advances_like_caffe():
    s = Solver(solver_param(lr_policy="multistep", gamma=0.1, stepvalue=[2, 4]), verbose=False)
    rates = []
    for _ in range(6):
        rates.append(s.get_learning_rate())
        s.iter += 1
    assert rates == pytest.approx([0.05, 0.05, 0.005, 0.005, 0.0005, 0.0005])


def test_sgd_update_matches_hand_computation():
    s = Solver(solver_param(), verbose=False, dtype=np.float64)
    net = s.net
    before = [p.data.copy() for p in net.learnable_params]
    net.clear_param_diffs()
    net.forward_backward()
    grads = [p.diff.copy() for p in net.learnable_params]
    s.apply_update()
    lr_mult = [1, 2, 1, 1]
    decay_mult = [1, 0, 1, 1]
    # the proto's float fields are float32, as in Caffe: compute with their exact values
    lr, wd, mom = (float(np.float32(v)) for v in (0.05, 0.01, 0.9))
    for i, p in enumerate(net.learnable_params):
        g = grads[i] + wd * decay_mult[i] * before[i]
        update = lr * lr_mult[i] * g           # history was zero
        np.testing.assert_allclose(p.diff, update, rtol=1e-12)  # diff holds the applied update
        np.testing.assert_allclose(p.data, before[i] - update, rtol=1e-12)
    # second step: momentum carries the history
    h = [p.diff.copy() for p in net.learnable_params]
    net.clear_param_diffs()
    net.forward_backward()
    grads = [p.diff.copy() for p in net.learnable_params]
    data = [p.data.copy() for p in net.learnable_params]
    s.apply_update()
    for i, p in enumerate(net.learnable_params):
        g = grads[i] + wd * decay_mult[i] * data[i]
        np.testing.assert_allclose(p.diff, mom * h[i] + lr * lr_mult[i] * g, rtol=1e-12)


def test_iter_size_averages_gradients():
    # iter_size 2 with an Input-free net: the gradient is the mean of two passes
    a = Solver(solver_param(iter_size=2, momentum=0.0, weight_decay=0.0), verbose=False,
               dtype=np.float64)
    net = a.net
    w0 = [p.data.copy() for p in net.learnable_params]
    caffe.set_random_seed(3)
    a.step(1)
    # replay by hand with the same seed
    b = Solver(solver_param(iter_size=1, momentum=0.0, weight_decay=0.0), verbose=False,
               dtype=np.float64)
    for p, w in zip(b.net.learnable_params, w0):
        p.data[...] = w
    caffe.set_random_seed(3)
    b.net.clear_param_diffs()
    b.net.forward_backward()
    b.net.forward_backward()  # diffs accumulate across passes
    for pa, pb, w, lm in zip(net.learnable_params, b.net.learnable_params, w0, [1, 2, 1, 1]):
        lr = float(np.float32(0.05))
        np.testing.assert_allclose(pa.data, w - lr * lm * pb.diff / 2, rtol=1e-10)


def test_same_seed_same_trajectory():
    a = Solver(solver_param(), verbose=False)
    a.step(5)
    b = Solver(solver_param(), verbose=False)
    b.step(5)
    for pa, pb in zip(a.net.learnable_params, b.net.learnable_params):
        np.testing.assert_array_equal(pa.data, pb.data)


def test_snapshot_resume_identical_trajectory(tmp_path):
    prefix = str(tmp_path / "snap" / "tiny")
    full = Solver(solver_param(snapshot_prefix=prefix), verbose=False)
    full.step(10)
    part = Solver(solver_param(snapshot_prefix=prefix), verbose=False)
    part.step(5)
    model, state = part.snapshot()
    assert os.path.exists(model) and os.path.exists(state)
    resumed = Solver(solver_param(snapshot_prefix=prefix), verbose=False)
    resumed.restore(state)
    assert resumed.iter == 5
    resumed.step(5)
    for pa, pb in zip(full.net.learnable_params, resumed.net.learnable_params):
        np.testing.assert_array_equal(pa.data, pb.data)


def test_snapshot_is_atomic(tmp_path, monkeypatch):
    prefix = str(tmp_path / "tiny")
    s = Solver(solver_param(snapshot_prefix=prefix), verbose=False)
    s.step(2)
    model, _ = s.snapshot()
    good = open(model, "rb").read()
    import minicaffe.proto.text as text

    def crash(fd):
        raise OSError("disk full")
    # a crash after the bytes went out but before the rename leaves the old file intact
    monkeypatch.setattr(text.os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        s.snapshot()
    assert open(model, "rb").read() == good
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_snapshot_interval_and_solve(tmp_path):
    prefix = str(tmp_path / "tiny")
    s = Solver(solver_param(snapshot_prefix=prefix, snapshot=4, max_iter=10), verbose=False)
    s.solve()
    files = sorted(os.listdir(tmp_path))
    assert "tiny_iter_4.caffemodel" in files and "tiny_iter_8.solverstate" in files
    assert "tiny_iter_10.caffemodel" in files  # snapshot_after_train


def test_test_nets_share_weights_and_test_at_init(tmp_path):
    p = solver_param(test_interval=5, test_iter=[2], test_initialization=True, max_iter=5,
                     snapshot_prefix=str(tmp_path / "tiny"))
    s = Solver(p, verbose=False)
    assert len(s.test_nets) == 1
    assert np.shares_memory(s.test_nets[0].params["ip1"][0].data, s.net.params["ip1"][0].data)
    calls = []
    orig = s.test
    s.test = lambda i=0: calls.append(s.iter) or orig(i)
    s.solve()
    assert calls == [0, 5]



@pytest.mark.parametrize("compute_loss", [False, True])
def test_zero_test_iter_tests_nothing_and_trains_on(compute_loss):
    """HED's solver (s9xie/hed examples/hed/solver.prototxt) says ``test_iter: 0`` beside a
    ``test_interval``: Caffe's Solver::Test (src/caffe/solver.cpp) then runs no batch, its
    test_score stays empty and no output is logged ("Test loss" is 0/0 where asked for);
    training goes on."""
    p = solver_param(test_interval=2, test_iter=[0], test_initialization=True, max_iter=4,
                     test_compute_loss=compute_loss)
    s = Solver(p, verbose=True)
    assert s.test(0) == {}
    s.step(3)
    assert s.iter == 3


@pytest.mark.parametrize("prefix, made", [
    ("snaps", "snaps/quick_solver_iter_2"),    # a directory: the solver file's stem is added
    ("snaps/", "snaps/quick_solver_iter_2"),
    ("snap", "snap_iter_2"),                   # no such directory: a plain prefix
])
def test_snapshot_prefix_naming_a_directory_gets_the_solver_files_stem(tmp_path, monkeypatch,
                                                                        prefix, made):
    """Caffe's ReadSolverParamsFromTextFileOrDie ends with UpgradeSnapshotPrefixProperty
    (src/caffe/util/upgrade_proto.cpp): a snapshot_prefix that is an existing directory becomes
    <dir>/<solver file stem>, so that a solver saying ``snapshot_prefix: "snapshots/"`` writes
    snapshots/<stem>_iter_N.caffemodel rather than snapshots/_iter_N.caffemodel."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "snaps").mkdir()
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "quick_solver.prototxt").write_text(
        f'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 2\nsnapshot: 2\n'
        f'snapshot_prefix: "{prefix}"\nsolver_mode: CPU\nrandom_seed: 1\n')
    s = Solver("quick_solver.prototxt", verbose=False)
    s.step(2)
    assert (tmp_path / f"{made}.caffemodel").is_file()
    assert (tmp_path / f"{made}.solverstate").is_file()


def test_solver_file_without_lr_policy_is_refused_at_the_first_update(tmp_path, monkeypatch):
    """caffe.proto gives lr_policy no default and SGDSolver::GetLearningRate LOG(FATAL)s with
    "Unknown learning rate policy: " for the empty string; minicaffe took an absent policy for
    "fixed".  The stored copy of BVLC's examples/mnist/mnist_autoencoder_solver_adadelta.prototxt
    (commit 4c58741c) has neither base_lr nor lr_policy: Caffe stops at iteration 0.  The file
    still builds its nets and tests (as Caffe's does); a solver built in code keeps "fixed"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "adadelta.prototxt").write_text(
        'net: "net.prototxt"\ntest_iter: 1\ntest_interval: 500\ntest_compute_loss: true\n'
        'momentum: 0.95\ndelta: 1e-8\ndisplay: 100\nmax_iter: 65000\nweight_decay: 0.0005\n'
        'snapshot: 10000\nsnapshot_prefix: "adadelta_train"\nsolver_mode: CPU\n'
        'solver_type: ADADELTA\n')
    s = Solver("adadelta.prototxt", verbose=False)
    assert s.type == "AdaDelta"
    s.test_all()
    with pytest.raises(ValueError, match=r"adadelta.prototxt: Unknown learning rate policy: ''"):
        s.step(1)
    p = caffe_pb2.SolverParameter()
    p.CopyFrom(s.param)
    assert Solver(p, verbose=False).get_learning_rate() == 0.0     # in code: "fixed", base_lr 0


def test_inline_v1_net_is_upgraded_with_a_warning_that_caffe_would_not(monkeypatch):
    """Solver::InitTrainNet / InitTestNets copy train_net_param / test_net_param as they are,
    and Net::Init reads only ``layer`` blocks: Caffe upgrades nets it reads from files only,
    so the V1 nets inline in Caffe's 2014 examples/mnist/lenet_consolidated_solver.prototxt
    build there with no layers.  minicaffe upgrades them and says so, once per net."""
    import io
    from minicaffe import log as mlog
    stream = io.StringIO()
    monkeypatch.setattr(mlog, "_state", {"stream": stream, "quiet": False})
    v1 = ('name: "v1" layers { name: "data" type: DUMMY_DATA top: "data" top: "target" '
          'dummy_data_param { shape { dim: 8 dim: 4 } shape { dim: 8 dim: 2 } } } '
          'layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip" blobs_lr: 1 '
          'blobs_lr: 2 inner_product_param { num_output: 2 } } '
          'layers { name: "loss" type: EUCLIDEAN_LOSS bottom: "ip" bottom: "target" }')
    p = caffe_pb2.SolverParameter(base_lr=0.01, lr_policy="fixed", test_iter=[1],
                                  test_interval=10)
    p.train_net_param.CopyFrom(parse_text(v1, caffe_pb2.NetParameter))
    p.test_net_param.add().CopyFrom(parse_text(v1, caffe_pb2.NetParameter))
    s = Solver(p, verbose=False)
    assert s.net.layer_names == ["data", "ip", "loss"]
    assert [sp.lr_mult for sp in s.net.param_specs[1]] == [1, 2]
    lines = [l for l in stream.getvalue().splitlines() if l.startswith("W")]
    assert len(lines) == 2
    assert "train_net_param 'v1'" in lines[0] and "test_net_param 'v1'" in lines[1]
    assert all("BVLC Caffe does not upgrade nets given inline" in l for l in lines)
    stream.truncate(0)
    Solver(solver_param(), verbose=False)            # a current inline net: no warning
    assert not [l for l in stream.getvalue().splitlines() if l.startswith("W")]


def test_debug_info_logs_each_layers_blobs_on_displayed_iterations(monkeypatch):
    """HED's solver.prototxt carries a commented-out ``debug_info: true``. Caffe's Solver::Step
    sets net_->set_debug_info(display && debug_info); Net::ForwardDebugInfo, BackwardDebugInfo
    and Backward (src/caffe/net.cpp) then log the mean |data| of each top and param blob, the
    mean |diff| of each bottom that gets one and of each learnable param blob, and the L1/L2
    norms of all params. minicaffe read the field and logged nothing."""
    import io
    from minicaffe import log as mlog
    stream = io.StringIO()
    monkeypatch.setattr(mlog, "_state", {"stream": stream, "quiet": False})
    s = Solver(solver_param(debug_info=True, display=2), verbose=False)
    s.step(1)                                   # iteration 0 is displayed
    net = s.net
    lines = stream.getvalue().splitlines()
    # the in-place relu's line reports ip1 as the blob still holds it after the step
    ip1 = float(np.abs(net.blobs["ip1"].data).mean())
    fwd = [l for l in lines if "[Forward] Layer relu, top blob ip1 data: " in l]
    assert len(fwd) == 1 and float(fwd[0].rsplit(" ", 1)[1]) == pytest.approx(ip1, rel=1e-5)
    assert sum("[Forward] Layer ip1, top blob ip1 data: " in l for l in lines) == 1
    assert any("[Forward] Layer ip1, param blob 0 data: " in l for l in lines)
    assert any("[Backward] Layer ip2, bottom blob ip1 diff: " in l for l in lines)
    assert any("[Backward] Layer ip1, param blob 1 diff: " in l for l in lines)
    # the data layer's tops need no diff, and so get no backward line
    assert not any("bottom blob data diff" in l for l in lines)
    assert sum("[Backward] All net params (data, diff): L1 norm = (" in l for l in lines) == 1
    n = len(lines)
    s.step(1)                                   # iteration 1 is not displayed: no layer lines
    assert not any("[Forward]" in l or "[Backward]" in l for l in stream.getvalue().splitlines()[n:])
    # InitTestNets: test_nets_[i]->set_debug_info(param_.debug_info()), displayed or not
    t = Solver(solver_param(debug_info=True, test_iter=[1], test_interval=5), verbose=False)
    assert t.test_nets[0].debug_info and not Solver(
        solver_param(test_iter=[1], test_interval=5), verbose=False).test_nets[0].debug_info


def test_solver_weights_field_initialises_train_and_test_nets(tmp_path, monkeypatch):
    """SolverParameter.weights (field 42): Solver::InitTrainNet and InitTestNets copy each
    entry, a comma-separated list of models, into the train net and every test net
    (LoadNetWeights in src/caffe/solver.cpp); caffe.cpp's -weights replaces the entries and
    -snapshot clears them. minicaffe read the field and trained from the fillers."""
    monkeypatch.chdir(tmp_path)
    test_only = ('layer { name: "extra" type: "InnerProduct" bottom: "ip2" top: "extra" '
                 'include { phase: TEST } inner_product_param { num_output: 3 '
                 'weight_filler { type: "gaussian" std: 1 } } }\n')
    (tmp_path / "net.prototxt").write_text(NET + test_only)
    src = caffe.Net(str(tmp_path / "net.prototxt"), caffe.TEST)
    rng = np.random.default_rng(0)
    for blobs in src.params.values():
        for b in blobs:
            b.data[...] = rng.standard_normal(b.data.shape)
    src.save(str(tmp_path / "a.caffemodel"))
    # a second model that holds only ip2, listed after the first: it wins for ip2
    part = caffe_pb2.NetParameter()
    for layer in src.to_proto().layer:
        if layer.name == "ip2":
            part.layer.add().CopyFrom(layer)
    part.layer[0].blobs[1].data[:] = [7.0] * len(part.layer[0].blobs[1].data)
    (tmp_path / "b.caffemodel").write_bytes(part.SerializeToString())
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt"\ntest_iter: 1\ntest_interval: 100\nbase_lr: 0.01\n'
        'max_iter: 1\nsolver_mode: CPU\nrandom_seed: 1\nweights: "a.caffemodel, b.caffemodel"\n')
    s = Solver("solver.prototxt", verbose=False)
    np.testing.assert_array_equal(s.net.params["ip1"][0].data, src.params["ip1"][0].data)
    np.testing.assert_array_equal(s.net.params["ip2"][1].data, np.full(2, 7.0, np.float32))
    t = s.test_nets[0]
    np.testing.assert_array_equal(t.params["extra"][0].data, src.params["extra"][0].data)
    assert np.shares_memory(t.params["ip1"][0].data, s.net.params["ip1"][0].data)
    # caffe train -snapshot: the file's weights are cleared
    cleared = Solver("solver.prototxt", verbose=False, weights=[])
    assert not np.array_equal(cleared.net.params["ip1"][0].data, src.params["ip1"][0].data)


def test_a_missing_weights_file_or_a_caffemodel_as_snapshot_is_named(tmp_path):
    """-weights that is not there names the field and where it looked, before any copy;
    -snapshot given the .caffemodel instead of the .solverstate says which goes where."""
    with pytest.raises(FileNotFoundError, match=r"^solver: weights: File not found: "
                                                r"nothere.caffemodel \(looked at "):
        Solver(solver_param(weights=["nothere.caffemodel"]))
    s = Solver(solver_param())
    with pytest.raises(FileNotFoundError, match=r"^snapshot: File not found: nothere"):
        s.restore("nothere.solverstate")
    model = str(tmp_path / "m_iter_1.caffemodel")
    s.net.save(model)
    with pytest.raises(ValueError, match=r"a \.caffemodel holds weights, not a solver state: "
                                         r"resume from its \.solverstate, or finetune from "
                                         r"it with -weights$"):
        s.restore(model)


def test_solve_ends_with_the_smoothed_loss(monkeypatch):
    """Solver::Solve (src/caffe/solver.cpp) ends with a forward pass whose loss goes through
    UpdateSmoothedLoss before 'Iteration N, loss = ...' is logged: with average_loss 3 the line
    gives the mean of the last two training losses and that pass's loss (Caffe's parse_log.py
    reads it as the train loss at N), not the raw loss of the last pass."""
    import io
    from minicaffe import log as mlog
    stream = io.StringIO()
    monkeypatch.setattr(mlog, "_state", {"stream": stream, "quiet": False})
    s = Solver(solver_param(display=1, average_loss=3, max_iter=4, snapshot_after_train=False),
               verbose=True)
    losses = []
    forward = s.net.forward_from_to
    monkeypatch.setattr(s.net, "forward_from_to",
                        lambda *a, **k: losses.append(float(forward(*a, **k))) or losses[-1])
    s.solve()
    final = [l for l in stream.getvalue().splitlines() if "] Iteration 4, loss = " in l]
    assert len(final) == 1 and len(losses) == 5    # 4 training iterations and the final pass
    assert float(final[0].rsplit(" ", 1)[1]) == pytest.approx(np.mean(losses[-3:]), rel=1e-5)

def test_training_fits_a_fixed_batch():
    text = NET.replace('type: "DummyData"', 'type: "Input"').replace(
        "dummy_data_param { shape { dim: 8 dim: 4 } shape { dim: 8 dim: 2 }\n"
        "                           data_filler { type: \"gaussian\" std: 1 } data_filler { type: \"gaussian\" std: 1 } }",
        "input_param { shape { dim: 8 dim: 4 } shape { dim: 8 dim: 2 } }")
    p = solver_param(base_lr=0.05, weight_decay=0.0)
    p.net_param.CopyFrom(parse_text(text, caffe_pb2.NetParameter))
    s = Solver(p, verbose=False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 4))
    s.net.blobs["data"].data[...] = x
    s.net.blobs["target"].data[...] = np.tanh(x[:, :2] - x[:, 2:])
    first = float(s.net.forward_from_to())
    s.step(200)
    assert float(s.net.forward_from_to()) < 0.1 * first


def test_unknown_solver_type_is_clear():
    with pytest.raises(ValueError, match="unknown solver type 'Adamm'"):
        Solver(solver_param(type="Adamm"), verbose=False)


def test_adam_update_rule():
    s = Solver(solver_param(type="Adam", momentum=0.9, momentum2=0.999, delta=1e-8,
                            weight_decay=0.0), verbose=False, dtype=np.float64)
    net = s.net
    w = [p.data.copy() for p in net.learnable_params]
    net.clear_param_diffs()
    net.forward_backward()
    g = [p.diff.copy() for p in net.learnable_params]
    s.apply_update()
    b1, b2, eps, lr = (float(np.float32(v)) for v in (0.9, 0.999, 1e-8, 0.05))
    for i, (p, lm) in enumerate(zip(net.learnable_params, [1, 2, 1, 1])):
        m = (1 - b1) * g[i]
        v = (1 - b2) * g[i] ** 2
        corr = math.sqrt(1 - b2) / (1 - b1)
        np.testing.assert_allclose(p.data, w[i] - lr * lm * corr * m / (np.sqrt(v) + eps),
                                   rtol=1e-9)


# --------------------------------------------- AdaGrad, RMSProp, AdaDelta (Caffe's solvers)
def caffe_reference(kind, g_steps, lr, delta, momentum=0.0, rms_decay=0.99):
    """Caffe's ComputeUpdateValue, op by op (adagrad_solver.cpp, rmsprop_solver.cpp,
    adadelta_solver.cpp), over a sequence of gradients; returns the applied steps."""
    h = np.zeros_like(g_steps[0])
    u = np.zeros_like(g_steps[0])
    out = []
    for g in g_steps:
        if kind == "AdaGrad":
            h = h + g ** 2
            out.append(lr * (g / (np.sqrt(h) + delta)))
        elif kind == "RMSProp":
            h = (1 - rms_decay) * g ** 2 + rms_decay * h
            out.append(lr * (g / (np.sqrt(h) + delta)))
        else:
            h = (1 - momentum) * g ** 2 + momentum * h
            step = g * np.sqrt((u + delta) / (h + delta))
            u = (1 - momentum) * step ** 2 + momentum * u
            out.append(lr * step)
    return out


@pytest.mark.parametrize("kind, kw", [
    ("AdaGrad", dict(momentum=0.0, delta=1e-6)),
    ("RMSProp", dict(momentum=0.0, delta=1e-6, rms_decay=0.9)),
    ("AdaDelta", dict(momentum=0.95, delta=1e-6)),
])
def test_adaptive_rules_follow_caffe_op_by_op(kind, kw):
    s = Solver(solver_param(type=kind, weight_decay=0.0, **kw), verbose=False, dtype=np.float64)
    net = s.net
    grads, steps = [], []
    for _ in range(4):
        w = [p.data.copy() for p in net.learnable_params]
        net.clear_param_diffs()
        net.forward_backward()
        grads.append([p.diff.copy() for p in net.learnable_params])
        s.apply_update()
        s.iter += 1
        steps.append([a - p.data for a, p in zip(w, net.learnable_params)])
    f32 = {k: float(np.float32(v)) for k, v in kw.items()}   # the proto holds floats
    for i, lm in enumerate([1, 2, 1, 1]):
        ref = caffe_reference(kind, [g[i] for g in grads], 0.05 * lm, f32["delta"],
                              f32.get("momentum", 0.0), f32.get("rms_decay", 0.99))
        for t in range(4):
            np.testing.assert_allclose(steps[t][i], ref[t], rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("kind", ["AdaGrad", "RMSProp", "AdaDelta"])
def test_adaptive_rules_match_torch_optimizers(kind):
    """Without weight decay Caffe's rules are PyTorch's Adagrad (lr decay 0), RMSprop
    (alpha = rms_decay, no momentum) and Adadelta (rho = momentum, eps = delta)."""
    torch = pytest.importorskip("torch")
    kw = {"AdaGrad": dict(momentum=0.0, delta=1e-7),
          "RMSProp": dict(momentum=0.0, delta=1e-7, rms_decay=0.95),
          "AdaDelta": dict(momentum=0.9, delta=1e-6, base_lr=1.0)}[kind]
    s = Solver(solver_param(type=kind, weight_decay=0.0, **kw), verbose=False, dtype=np.float64)
    lr = float(np.float32(s.param.base_lr))
    params = [torch.tensor(p.data.copy(), requires_grad=True) for p in s.net.learnable_params]
    groups = [{"params": [q], "lr": lr * m} for q, m in zip(params, [1, 2, 1, 1])]
    eps = float(np.float32(kw["delta"]))
    opt = {"AdaGrad": lambda: torch.optim.Adagrad(groups, lr=lr, eps=eps),
           "RMSProp": lambda: torch.optim.RMSprop(groups, lr=lr, eps=eps,
                                                  alpha=float(np.float32(0.95))),
           "AdaDelta": lambda: torch.optim.Adadelta(groups, lr=lr, eps=eps,
                                                    rho=float(np.float32(0.9)))}[kind]()
    for _ in range(5):
        s.net.clear_param_diffs()
        s.net.forward_backward()
        for q, p in zip(params, s.net.learnable_params):
            q.grad = torch.tensor(p.diff.copy())
        s.apply_update()
        s.iter += 1
        opt.step()
        for q, p in zip(params, s.net.learnable_params):
            np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_adaptive_rules_refuse_what_caffe_refuses():
    for kind in ("AdaGrad", "RMSProp"):
        with pytest.raises(ValueError, match=f"momentum cannot be used with {kind}"):
            Solver(solver_param(type=kind, momentum=0.9), verbose=False)
    with pytest.raises(ValueError, match="rms_decay should lie between 0 and 1"):
        Solver(solver_param(type="RMSProp", momentum=0.0, rms_decay=1.0), verbose=False)


def test_adadelta_state_resumes_with_both_histories(tmp_path):
    kw = dict(type="AdaDelta", momentum=0.95, delta=1e-6, base_lr=1.0,
              snapshot_prefix=str(tmp_path / "ada"))
    full = Solver(solver_param(**kw), verbose=False)
    full.step(8)
    part = Solver(solver_param(**kw), verbose=False)
    part.step(4)
    assert len(part.rule.state_blobs()) == 2 * len(part.net.learnable_params)
    _, state = part.snapshot()
    resumed = Solver(solver_param(**kw), verbose=False)
    resumed.restore(state)
    resumed.step(4)
    for pa, pb in zip(full.net.learnable_params, resumed.net.learnable_params):
        np.testing.assert_array_equal(pa.data, pb.data)


@pytest.mark.parametrize("enum, name", [("ADAGRAD", "AdaGrad"), ("RMSPROP", "RMSProp"),
                                        ("ADADELTA", "AdaDelta")])
def test_legacy_solver_type_enum_selects_the_rule(enum, name):
    p = solver_param(momentum=0.0 if name != "AdaDelta" else 0.9)
    p.solver_type = getattr(caffe_pb2.SolverParameter, enum)
    s = Solver(p, verbose=False)
    assert s.type == name and type(s.rule).__name__ == f"{name}Rule"


@pytest.mark.parametrize("kind", ["RMSProp", "AdaDelta"])
def test_adaptive_rules_train_under_a_swap_plan_as_plainly(kind):
    """The swap planner holds every history slot (AdaDelta's second one too)."""
    from minicaffe.testing import train_steps
    kw = dict(type=kind, momentum=0.0 if kind == "RMSProp" else 0.9, delta=1e-6)
    base = train_steps(Solver(solver_param(**kw), verbose=False), 5)
    for strategy in ("none", "naive"):
        got = train_steps(Solver(solver_param(**kw), verbose=False), 5, strategy)
        assert got[2] == base[2], strategy
        for a, b in zip(got[0] + got[1], base[0] + base[1]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["AdaGrad", "RMSProp", "AdaDelta"])
def test_adaptive_rules_on_the_gpu_match_the_cpu(cp, kind, tmp_path):
    """GPU mode: the rules run on CuPy histories (float32 kept) and train as the CPU does;
    an AdaDelta state snapshotted on the GPU resumes there with both histories."""
    from minicaffe.testing import train_steps
    kw = dict(type=kind, momentum=0.0 if kind != "AdaDelta" else 0.9, delta=1e-6,
              snapshot_prefix=str(tmp_path / kind))
    cpu = train_steps(Solver(solver_param(**kw), verbose=False), 5)
    solver = Solver(solver_param(**kw), mode="GPU", verbose=False)
    gpu = train_steps(solver, 5)
    assert all(h.dtype == cp.float32 for h in solver.rule.state_blobs())
    np.testing.assert_allclose(gpu[2], cpu[2], rtol=1e-4)
    for g, c in zip(gpu[0] + gpu[1], cpu[0] + cpu[1]):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-5)
    _, state = solver.snapshot()
    solver.step(3)
    resumed = Solver(solver_param(**kw), mode="GPU", verbose=False)
    resumed.restore(state)
    resumed.step(3)
    for a, b in zip(solver.net.learnable_params, resumed.net.learnable_params):
        np.testing.assert_array_equal(cp.asnumpy(a.data), cp.asnumpy(b.data))
