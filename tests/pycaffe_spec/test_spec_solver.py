"""pycaffe's own solver tests, as a spec: BVLC Caffe python/caffe/test/test_solver.py
(test_solve, test_apply_update, test_net_memory, test_snapshot), written for pytest and run
through ``import caffe``.
"""
import os

import numpy as np
import pytest

import minicaffe  # noqa: F401  (makes ``import caffe`` reach minicaffe)
import caffe
from test_spec_net import NUM_OUTPUT, simple_net_text

SOLVER_TEXT = """net: '%s'
test_iter: 10 test_interval: 10 base_lr: 0.01 momentum: 0.9
weight_decay: 0.0005 lr_policy: 'inv' gamma: 0.0001 power: 0.75
display: 100 max_iter: 100 snapshot_after_train: false
snapshot_prefix: "model" """


@pytest.fixture
def solver(tmp_path, monkeypatch):
    # snapshot_prefix "model" is relative: Caffe writes it under the working directory
    monkeypatch.chdir(tmp_path)
    net_f = tmp_path / "net.prototxt"
    net_f.write_text(simple_net_text(NUM_OUTPUT))
    solver_f = tmp_path / "solver.prototxt"
    solver_f.write_text(SOLVER_TEXT % net_f)
    s = caffe.SGDSolver(str(solver_f))
    # get_solver must also run on the same file
    assert isinstance(caffe.get_solver(str(solver_f)), caffe.SGDSolver)
    caffe.set_mode_cpu()
    for net in [s.net] + list(s.test_nets):
        net.blobs['label'].data[...] = np.random.randint(
            NUM_OUTPUT, size=net.blobs['label'].data.shape)
    return s


def test_solve(solver):
    assert solver.iter == 0
    solver.solve()
    assert solver.iter == 100


def test_apply_update(solver):
    net = solver.net
    data = net.layers[1].blobs[0].data[...]
    data[...] = 0
    net.layers[1].blobs[0].diff[...] = 1
    # the first update is -base_lr * diff (no momentum history yet; weight decay of 0 is 0)
    solver.apply_update()
    assert np.abs(data - -0.01 * np.ones(data.shape)).max() < 1e-7
    # ApplyUpdate does not advance the iteration: Caffe's Step() does ++iter_ after it
    assert solver.iter == 0


def test_net_memory(solver):
    """The nets outlive the solver."""
    nets = [solver.net] + list(solver.test_nets)
    assert len(nets) == 2
    del solver
    total = 0
    for net in nets:
        for ps in net.params.values():
            for p in ps:
                total += p.data.sum() + p.diff.sum()
        for bl in net.blobs.values():
            total += bl.data.sum() + bl.diff.sum()
    assert np.isfinite(total)


def test_snapshot(solver):
    solver.snapshot()
    for fn in ['model_iter_0.caffemodel', 'model_iter_0.solverstate']:
        assert os.path.isfile(fn)
