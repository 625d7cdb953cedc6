"""HDF5 solver snapshots (``snapshot_format: HDF5``), as Caffe's Solver::SnapshotToHDF5
(Net::ToHDF5) and SGDSolver::SnapshotSolverStateToHDF5 / RestoreSolverStateFromHDF5 write
and read them: the layout, an exact resume for every update rule, the CLI and pycaffe
resume paths, atomic writes, and errors that name the file."""
import os
import shutil

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

import minicaffe as caffe  # noqa: E402
from minicaffe.backend import to_numpy  # noqa: E402
from minicaffe.cli import main  # noqa: E402
from minicaffe.net import Net  # noqa: E402
from minicaffe.proto import caffe_pb2, parse_text  # noqa: E402
from minicaffe.solver import Solver  # noqa: E402

HDF5 = caffe_pb2.SolverParameter.HDF5

# DummyData with gaussian fillers draws new data from the host generator every iteration,
# so an exact resume also needs minicaffe's extra state (group "minicaffe").
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

# each rule with the hyperparameters Caffe allows it; the multistep policy keeps a
# current_step that the iteration cannot rebuild (stepvalues 1 and 2 are both passed by the
# snapshot at iteration 3), so losing it changes the learning rate after the resume
RULES = {
    "SGD": dict(momentum=0.9),
    "Nesterov": dict(momentum=0.9),
    "AdaGrad": dict(momentum=0.0, delta=1e-6),
    "RMSProp": dict(momentum=0.0, rms_decay=0.98, delta=1e-6),
    "AdaDelta": dict(momentum=0.95, delta=1e-6, base_lr=1.0),
    "Adam": dict(momentum=0.9, momentum2=0.999, delta=1e-8, base_lr=0.01),
}
SECOND_HISTORY = {"AdaDelta", "Adam"}       # Caffe's PreSolve appends n more history blobs


def solver_param(prefix, kind="SGD", **kw):
    p = caffe_pb2.SolverParameter(base_lr=0.05, weight_decay=0.01, lr_policy="multistep",
                                  gamma=0.5, max_iter=100, display=0, random_seed=7,
                                  snapshot_prefix=str(prefix), snapshot_format=HDF5, type=kind,
                                  solver_mode=caffe_pb2.SolverParameter.CPU)
    p.stepvalue.extend([1, 2, 6])
    p.net_param.CopyFrom(parse_text(NET, caffe_pb2.NetParameter))
    for k, v in {**RULES[kind], **kw}.items():
        setattr(p, k, v)
    return p


def params_of(solver):
    return [to_numpy(q.data).copy() for q in solver.net.learnable_params]


def state_of(solver):
    return [to_numpy(h).copy() for h in solver.rule.state_blobs()]


def resume_case(tmp_path, kind, edit_state=None, **kw):
    """(params and histories of a run of 8 iterations, the same of a run snapshotted at
    iteration 3, resumed from that snapshot in a new solver and run to 8)."""
    prefix = tmp_path / "snap" / kind
    full = Solver(solver_param(prefix, kind, **kw), verbose=False)
    full.step(8)
    part = Solver(solver_param(prefix, kind, **kw), verbose=False)
    part.step(3)
    model, state = part.snapshot()
    part.step(2)                     # the snapshotted solver moves on; the files do not
    if edit_state:
        edit_state(state)
    resumed = Solver(solver_param(prefix, kind, **kw), verbose=False)
    resumed.restore(state)
    restored = (resumed.iter, resumed.current_step)
    resumed.step(5)
    return ((params_of(full), state_of(full)), (params_of(resumed), state_of(resumed)),
            restored)


@pytest.mark.parametrize("kind", sorted(RULES))
def test_hdf5_resume_reproduces_the_uninterrupted_run(tmp_path, kind):
    (want_p, want_h), (got_p, got_h), restored = resume_case(tmp_path, kind)
    assert restored == (3, 2)                # iter, current_step
    assert len(got_h) == len(got_p) * (2 if kind in SECOND_HISTORY else 1)
    for a, b in zip(got_p + got_h, want_p + want_h):
        np.testing.assert_array_equal(a, b)


def test_hdf5_resume_needs_current_step_and_the_minicaffe_group(tmp_path):
    """The controls: a state file whose current_step is reset, or that lacks the
    ``minicaffe`` group (as a Caffe-written file does), resumes onto another trajectory."""
    def zero_step(path):
        with h5py.File(path, "r+") as f:
            f["current_step"][0] = 0

    def drop_group(path):
        with h5py.File(path, "r+") as f:
            del f["minicaffe"]

    for edit in (zero_step, drop_group):
        (want_p, _), (got_p, _), _ = resume_case(tmp_path / edit.__name__, "SGD", edit)
        assert any(not np.array_equal(a, b) for a, b in zip(got_p, want_p)), edit.__name__


def test_hdf5_files_have_caffes_layout(tmp_path):
    s = Solver(solver_param(tmp_path / "adam", "Adam"), verbose=False)
    s.step(3)
    model, state = s.snapshot()
    assert model == str(tmp_path / "adam_iter_3.caffemodel.h5")
    assert state == str(tmp_path / "adam_iter_3.solverstate.h5")
    shapes = [tuple(q.shape) for q in s.net.learnable_params]
    with h5py.File(state, "r") as f:
        assert sorted(f) == ["current_step", "history", "iter", "learned_net", "minicaffe"]
        for name, value in (("iter", 3), ("current_step", 2)):   # H5LTmake_dataset_int
            assert f[name].dtype == np.int32 and f[name].shape == (1,)
            assert f[name][0] == value
        net_name = f["learned_net"]                              # H5LTmake_dataset_string
        assert net_name.shape == () and net_name.dtype.kind == "S"
        tid = net_name.id.get_type()
        assert tid.get_strpad() == h5py.h5t.STR_NULLTERM and tid.get_size() == len(model) + 1
        assert net_name[()].decode() == model
        history = f["history"]          # Adam: m for every param, then v, indices continuing
        assert sorted(history, key=int) == [str(i) for i in range(2 * len(shapes))]
        assert len(history) == 8
        for i, h in enumerate(s.rule.state_blobs()):
            assert history[str(i)].shape == shapes[i % len(shapes)]
            assert history[str(i)].dtype == np.float32
            np.testing.assert_array_equal(history[str(i)][...], to_numpy(h))
        assert not np.array_equal(history["0"][...], history["4"][...])
    with h5py.File(model, "r") as f:
        assert sorted(f) == ["data"]                              # no snapshot_diff
        assert sorted(f["data"]) == ["data", "ip1", "ip2", "loss", "relu"]
        assert len(f["data/relu"]) == 0
        for name in ("ip1", "ip2"):
            for j, q in enumerate(s.net.params[name]):
                assert f[f"data/{name}/{j}"].dtype == np.float32
                np.testing.assert_array_equal(f[f"data/{name}/{j}"][...], to_numpy(q.data))


def test_hdf5_weights_load_with_copy_from(tmp_path):
    s = Solver(solver_param(tmp_path / "w"), verbose=False)
    s.step(2)
    model, _ = s.snapshot()
    net = Net(parse_text(NET, caffe_pb2.NetParameter), caffe.TEST)
    assert not np.array_equal(net.params["ip1"][0].data, s.net.params["ip1"][0].data)
    net.copy_from(model)
    for name in ("ip1", "ip2"):
        for a, b in zip(net.params[name], s.net.params[name]):
            np.testing.assert_array_equal(a.data, b.data)


def test_snapshot_diff_writes_the_diffs_in_the_nets_dtype(tmp_path):
    """snapshot_diff: group ``diff`` as Net::ToHDF5 writes it; a float64 solver (Caffe's
    Solver<double>) writes float64 weights and history and resumes exactly."""
    (want_p, want_h), (got_p, got_h), _ = resume_case(tmp_path, "Nesterov", snapshot_diff=True)
    for a, b in zip(got_p + got_h, want_p + want_h):
        np.testing.assert_array_equal(a, b)
    s = Solver(solver_param(tmp_path / "d64", snapshot_diff=True), verbose=False,
               dtype=np.float64)
    s.step(2)
    model, state = s.snapshot()
    with h5py.File(model, "r") as f:
        assert sorted(f) == ["data", "diff"]
        for j, q in enumerate(s.net.params["ip1"]):
            for which in ("data", "diff"):
                d = f[f"{which}/ip1/{j}"]
                assert d.dtype == np.float64
                np.testing.assert_array_equal(d[...], to_numpy(getattr(q, which)))
        assert np.any(f["diff/ip1/0"][...] != 0)
    with h5py.File(state, "r") as f:
        assert {f[f"history/{i}"].dtype for i in range(len(f["history"]))} == {np.dtype(np.float64)}
    want = Solver(solver_param(tmp_path / "d64"), verbose=False, dtype=np.float64)
    want.step(2)
    want.step(3)
    got = Solver(solver_param(tmp_path / "d64"), verbose=False, dtype=np.float64)
    got.restore(state)
    got.step(3)
    for a, b in zip(params_of(got) + state_of(got), params_of(want) + state_of(want)):
        assert a.dtype == np.float64
        np.testing.assert_array_equal(a, b)


def test_bad_hdf5_states_name_the_file(tmp_path):
    s = Solver(solver_param(tmp_path / "good"), verbose=False)
    s.step(1)
    _, state = s.snapshot()
    data = open(state, "rb").read()
    cases = {}
    cases["garbage"] = b"this is not an HDF5 file at all" * 8
    cases["truncated"] = data[:len(data) // 2]
    for label, payload in cases.items():
        path = tmp_path / f"{label}.solverstate.h5"
        path.write_bytes(payload)
        with pytest.raises(ValueError, match=f"{path}: not a readable HDF5 solver state"):
            s.restore(str(path))

    def edited(label, edit):
        path = tmp_path / f"{label}.solverstate.h5"
        shutil.copy(state, path)
        with h5py.File(path, "r+") as f:
            edit(f)
        return str(path)

    no_history = edited("nohistory", lambda f: f.__delitem__("history"))
    with pytest.raises(ValueError, match=f"{no_history}: bad HDF5 solver state: no 'history'"):
        s.restore(no_history)
    no_iter = edited("noiter", lambda f: f.__delitem__("iter"))
    with pytest.raises(ValueError, match=f"{no_iter}: bad HDF5 solver state"):
        s.restore(no_iter)
    adam = Solver(solver_param(tmp_path / "adam", "Adam"), verbose=False)
    with pytest.raises(ValueError, match=f"{state}: .*has 4 history blobs, this solver needs 8"):
        adam.restore(state)

    def reshape(f):
        del f["history/0"]
        f["history/0"] = np.zeros((4, 6), np.float32)
    wrong_shape = edited("shape", reshape)
    with pytest.raises(ValueError, match=r"history blob 0 has shape \(4, 6\), this solver's is "
                                         r"\(6, 4\)"):
        s.restore(wrong_shape)
    assert s.iter == 1                   # a state that fails changes nothing
    with pytest.raises(FileNotFoundError, match="nowhere.solverstate.h5"):
        s.restore(str(tmp_path / "nowhere.solverstate.h5"))
    # Caffe's Restore chooses by the name: an HDF5 state not named .h5 is read as binary
    binary_named = tmp_path / "renamed.solverstate"
    shutil.copy(state, binary_named)
    with pytest.raises(ValueError, match=f"{binary_named}: not a valid binary"):
        s.restore(str(binary_named))


def test_hdf5_snapshot_is_atomic(tmp_path, monkeypatch):
    """A crash while the state is written (after its bytes went out, before the rename)
    leaves the previous files of that name intact and no temporary file behind."""
    s = Solver(solver_param(tmp_path / "at"), verbose=False)
    s.step(2)
    model, state = s.snapshot()
    good_model, good_state = open(model, "rb").read(), open(state, "rb").read()
    s.step(1)
    s.iter = 2                           # the same names again, other contents
    import minicaffe.proto.text as text
    real_fsync, calls = text.os.fsync, []

    def crash_on_second(fd):             # the weights go out, the state write fails
        calls.append(fd)
        if len(calls) == 2:
            raise OSError("disk full")
        real_fsync(fd)
    monkeypatch.setattr(text.os, "fsync", crash_on_second)
    with pytest.raises(OSError, match="disk full"):
        s.snapshot()
    assert len(calls) == 2
    assert open(state, "rb").read() == good_state
    assert open(model, "rb").read() != good_model          # the weights were replaced whole
    with h5py.File(model, "r") as f:
        np.testing.assert_array_equal(f["data/ip1/0"][...], to_numpy(s.net.params["ip1"][0].data))
    assert sorted(os.listdir(tmp_path)) == ["at_iter_2.caffemodel.h5", "at_iter_2.solverstate.h5"]


def test_cli_and_pycaffe_resume_from_hdf5_snapshots(tmp_path, capsys):
    """``minicaffe train --snapshot X.solverstate.h5`` and pycaffe's
    ``solver.restore('X.solverstate.h5')`` continue the run exactly."""
    net_file = tmp_path / "tiny.prototxt"
    net_file.write_text(NET)
    solver_file = tmp_path / "solver.prototxt"
    solver_file.write_text(
        f'net: "{net_file}"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: 4\n'
        f'display: 1\nsnapshot: 2\nsnapshot_prefix: "{tmp_path}/s"\nsnapshot_format: HDF5\n'
        'solver_mode: CPU\nrandom_seed: 1\n')
    assert main(["train", "--solver", str(solver_file)]) == 0
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("s_")) == [
        "s_iter_2.caffemodel.h5", "s_iter_2.solverstate.h5",
        "s_iter_4.caffemodel.h5", "s_iter_4.solverstate.h5"]
    capsys.readouterr()

    def weights(path):
        with h5py.File(path, "r") as f:
            return {k: f[f"data/{k}"][...] for k in ("ip1/0", "ip1/1", "ip2/0", "ip2/1")}
    want = weights(tmp_path / "s_iter_4.caffemodel.h5")
    os.rename(tmp_path / "s_iter_4.caffemodel.h5", tmp_path / "full.h5")
    assert main(["train", "--solver", str(solver_file), "--snapshot",
                 str(tmp_path / "s_iter_2.solverstate.h5")]) == 0
    err = capsys.readouterr().err
    assert f"Restoring previous solver status from {tmp_path}/s_iter_2.solverstate.h5" in err
    assert "Iteration 2" in err and "Iteration 0," not in err
    got = weights(tmp_path / "s_iter_4.caffemodel.h5")
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)

    solver = caffe.get_solver(str(solver_file))
    solver.restore(str(tmp_path / "s_iter_2.solverstate.h5"))
    assert solver.iter == 2
    solver.step(2)
    for k, v in want.items():
        layer, j = k.split("/")
        np.testing.assert_array_equal(solver.net.params[layer][int(j)].data, v, err_msg=k)


SHARED_NET = NET.replace(
    'layer { name: "loss"',
    'layer { name: "ip3" type: "InnerProduct" bottom: "ip2" top: "ip3" param { name: "w" } '
    'inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }\n'
    'layer { name: "ip4" type: "InnerProduct" bottom: "ip3" top: "ip4" param { name: "w" } '
    'inner_product_param { num_output: 2 } }\n'
    'layer { name: "loss"').replace('bottom: "ip2" bottom: "target"', 'bottom: "ip4" bottom: "target"')


def test_shared_params_snapshot_and_resume(tmp_path):
    """A param shared by name: Net::ToHDF5 writes its data under the owner only and its
    diff under both layers; the resume fills the sharer from the owner, exactly."""
    def param():
        p = solver_param(tmp_path / "sh", "Adam", snapshot_diff=True)
        p.net_param.CopyFrom(parse_text(SHARED_NET, caffe_pb2.NetParameter))
        return p
    full = Solver(param(), verbose=False)
    full.step(6)
    part = Solver(param(), verbose=False)
    part.step(3)
    model, state = part.snapshot()
    with h5py.File(model, "r") as f:
        assert sorted(f["data/ip3"]) == ["0", "1"] and sorted(f["data/ip4"]) == ["1"]
        assert sorted(f["diff/ip4"]) == ["0", "1"]
        np.testing.assert_array_equal(f["diff/ip4/0"][...], f["diff/ip3/0"][...])
    with h5py.File(state, "r") as f:
        assert len(f["history"]) == 2 * len(part.net.learnable_params)
    resumed = Solver(param(), verbose=False)
    resumed.restore(state)
    resumed.step(3)
    np.testing.assert_array_equal(resumed.net.params["ip4"][0].data,
                                  resumed.net.params["ip3"][0].data)
    for a, b in zip(params_of(resumed) + state_of(resumed), params_of(full) + state_of(full)):
        np.testing.assert_array_equal(a, b)
