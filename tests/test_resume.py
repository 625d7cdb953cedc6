"""Resuming from a snapshot continues the very same trajectory, also with an
LMDB Data layer that prefetches ahead and draws random crops and mirrors."""
import os
import sys

import numpy as np
import pytest

from minicaffe.proto import caffe_pb2
from minicaffe.solver import Solver

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

pytest.importorskip("lmdb")


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    from minicaffe.tools.make_digits import make_digits
    out = tmp_path_factory.mktemp("digits")
    make_digits(str(out))
    return str(out)


def solver_param(digits_dir, prefix):
    from scripts.gen_prototxt import digits
    net = digits(batch=50, data="lmdb", data_dir=digits_dir)  # 1437 records: wraps mid-run
    for layer in net.layer:
        if layer.type == "Data" and layer.include[0].phase == caffe_pb2.TRAIN:
            layer.transform_param.mirror = True
            layer.transform_param.crop_size = 6
            layer.data_param.rand_skip = 100
        if layer.type == "Data" and layer.include[0].phase == caffe_pb2.TEST:
            layer.transform_param.crop_size = 6
    p = caffe_pb2.SolverParameter(base_lr=0.01, momentum=0.9, weight_decay=5e-4, lr_policy="inv",
                                  gamma=1e-4, power=0.75, max_iter=40, display=0, random_seed=5,
                                  snapshot_prefix=prefix, solver_mode=caffe_pb2.SolverParameter.CPU)
    p.net_param.CopyFrom(net)
    return p


def close(solver):
    for net in [solver.net] + solver.test_nets:
        for layer in net.layers:
            if hasattr(layer, "close"):
                layer.close()


def test_resume_reproduces_uninterrupted_run(digits_dir, tmp_path):
    prefix = str(tmp_path / "lenet")
    full = Solver(solver_param(digits_dir, prefix), verbose=False)
    full.step(36)
    ref = [p.data.copy() for p in full.net.learnable_params]
    close(full)

    part = Solver(solver_param(digits_dir, prefix), verbose=False)
    part.step(20)
    _, state = part.snapshot()
    part.step(3)  # the prefetch thread has run ahead of what was consumed
    close(part)

    resumed = Solver(solver_param(digits_dir, prefix), verbose=False)
    resumed.restore(state)
    resumed.step(16)
    for a, b in zip(ref, resumed.net.learnable_params):
        np.testing.assert_array_equal(a, b.data)
    close(resumed)


def test_data_state_cannot_move_after_prefetch_started(digits_dir, tmp_path):
    s = Solver(solver_param(digits_dir, str(tmp_path / "x")), verbose=False)
    s.step(1)
    layer = s.net.layers[0]
    with pytest.raises(RuntimeError, match="prefetching has started"):
        layer.load_state_dict(layer.state_dict())
    close(s)
