"""Resuming from a snapshot continues the very same trajectory, also with an
LMDB Data layer that prefetches ahead and draws random crops and mirrors, and
with Dropout layers (their key and draw counter are in the snapshot), on the
CPU, on the GPU, and from a CPU snapshot onto the GPU (the same masks)."""
import os
import sys

import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.layers.neuron import DropoutLayer
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.solver import Solver

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    pytest.importorskip("lmdb")
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


# ------------------------------------------------------------------ Dropout
# DummyData refills its gaussian data from the host generator every iteration (saved
# in the snapshot too); one Dropout in place, one not, with different ratios.
DROPOUT_NET = """
name: "dropout_resume"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 6 dim: 10 } shape { dim: 6 }
                           data_filler { type: "gaussian" std: 1 }
                           data_filler { type: "constant" value: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 16 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "drop1" type: "Dropout" bottom: "ip1" top: "ip1"
        dropout_param { dropout_ratio: 0.4 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "drop2" type: "Dropout" bottom: "ip2" top: "drop2" }
layer { name: "ip3" type: "InnerProduct" bottom: "drop2" top: "ip3"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip3" bottom: "label" top: "loss" }
"""


def dropout_solver(prefix, mode, seed):
    p = caffe_pb2.SolverParameter(base_lr=0.05, momentum=0.9, weight_decay=5e-4,
                                  lr_policy="fixed", max_iter=100, display=0,
                                  snapshot_prefix=prefix)
    if seed is not None:
        p.random_seed = seed
    p.net_param.CopyFrom(parse_text(DROPOUT_NET, caffe_pb2.NetParameter))
    return Solver(p, mode=mode, verbose=False)


def steps_with_masks(solver, n):
    """n iterations; each one's Dropout masks."""
    out = []
    for _ in range(n):
        solver.step(1)
        out.append({layer.name: to_numpy(layer.internal("mask").data).copy()
                    for layer in solver.net.layers if layer.type == "Dropout"})
    return out


def resume_case(tmp_path, part_mode, resumed_mode, seed):
    """(masks and params of the run continued after its snapshot, the same of a run
    resumed from that snapshot)."""
    part = dropout_solver(str(tmp_path / "drop"), part_mode, seed)
    steps_with_masks(part, 5)
    _, state = part.snapshot()
    want_masks = steps_with_masks(part, 5)
    want = [to_numpy(q.data).copy() for q in part.net.learnable_params]
    resumed = dropout_solver(str(tmp_path / "drop"), resumed_mode, seed)
    resumed.restore(state)
    got_masks = steps_with_masks(resumed, 5)
    got = [to_numpy(q.data).copy() for q in resumed.net.learnable_params]
    return want_masks, want, got_masks, got


def assert_same_masks(got_masks, want_masks):
    for it, (g, w) in enumerate(zip(got_masks, want_masks)):
        assert g.keys() == w.keys() == {"drop1", "drop2"}
        for name in w:
            np.testing.assert_array_equal(g[name], w[name], err_msg=f"iteration {it}: {name}")
    assert not np.array_equal(want_masks[0]["drop1"], want_masks[1]["drop1"])  # they do change


@pytest.mark.parametrize("seed", [3, None], ids=["seeded", "unseeded"])
def test_dropout_resume_reproduces_uninterrupted_run(tmp_path, seed):
    """Also without a seed: the keys come from entropy, the snapshot carries them."""
    want_masks, want, got_masks, got = resume_case(tmp_path, "CPU", "CPU", seed)
    assert_same_masks(got_masks, want_masks)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_dropout_resume_needs_the_dropout_state(tmp_path, monkeypatch):
    """The control: a resume that ignores the Dropout state draws other masks."""
    monkeypatch.setattr(DropoutLayer, "load_state_dict", lambda self, state: None)
    want_masks, want, got_masks, got = resume_case(tmp_path, "CPU", "CPU", 3)
    assert not np.array_equal(got_masks[0]["drop1"], want_masks[0]["drop1"])
    assert any(not np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.gpu
@pytest.mark.parametrize("part_mode", ["GPU", "CPU"])
def test_dropout_resume_on_the_gpu(tmp_path, part_mode):
    """A GPU run resumed from a GPU snapshot, or from a CPU one, draws the masks the
    snapshotted run draws next, bit for bit; the parameters follow within float32
    rounding (cuBLAS and the CPU's BLAS sum in different orders)."""
    want_masks, want, got_masks, got = resume_case(tmp_path, part_mode, "GPU", 3)
    assert_same_masks(got_masks, want_masks)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
