"""A seventh sweep of public prototxt files (tests/data/zoo7/README.md lists them): BVLC's
2014 MNIST siamese train_test (V1, shared params by name, ContrastiveLoss) with its solver
and deploy net, forresti's SqueezeNet v1.1 deploy, shicai's DenseNet-121 deploy (rebuilt by
tests/zoo7_nets.py) and soeaver's ResNet-18 deploy, whose fork field ``ceil_mode`` is refused.

As in tests/test_caffe_zoo6.py: each net is built in the phase its file is for, with small
stand-in data of the file's shape; every blob's and param's shape is checked against
Caffe's rules (``caffe_shapes`` in tests/zoo3_nets.py, written from Caffe's layer sources)
and, for the shapes that tell the rules apart (pooling's ceil against floor, the dense
blocks' channel counts), against numbers worked out by hand in the docstrings; one forward
(and on the train net one solver step) runs and is checked against NumPy.
"""
import os
import shutil

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.io import LMDBWriter, array_to_datum
from minicaffe.proto import caffe_pb2, read_net_param, upgrade_net, write_text

from test_caffe_zoo3 import check_shapes
from zoo3_nets import caffe_shapes

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo7")


def zoo(*parts):
    return os.path.join(ZOO, *parts)


def test_files_are_the_stored_copies():
    """The lengths of the stored copies (``total_chars``, tests/data/zoo7/README.md)."""
    sizes = {("siamese", "mnist_siamese_train_test_v1.prototxt"): 4572,
             ("siamese", "mnist_siamese_solver.prototxt"): 810,
             ("siamese", "mnist_siamese.prototxt"): 1436}
    for parts, n in sizes.items():
        with open(zoo(*parts), newline="") as f:
            assert len(f.read()) == n, parts


def max_pool(x, k, s, pad, out):
    """Caffe's MAX pooling of (C, H, W) by hand: windows start at -pad + i*s, clipped to the
    input (padding never wins a max); ``out`` windows per axis."""
    c, h, w = x.shape
    y = np.empty((c, out, out), x.dtype)
    for i in range(out):
        for j in range(out):
            h0, w0 = max(i * s - pad, 0), max(j * s - pad, 0)
            h1, w1 = min(i * s - pad + k, h), min(j * s - pad + k, w)
            y[:, i, j] = x[:, h0:h1, w0:w1].max(axis=(1, 2))
    return y


# ---------------------------------------------------------------- MNIST siamese (BVLC)
def write_pairs(path, sims, rng):
    """An LMDB of MNIST-like pairs: two 28x28 channels, label = 1 for a similar pair."""
    with LMDBWriter(path) as w:
        for i, sim in enumerate(sims):
            img = rng.integers(0, 256, (2, 28, 28)).astype(np.uint8)
            w.put(f"{i:08d}", array_to_datum(img, int(sim)).SerializeToString())


def test_mnist_siamese_train_test_v1_shares_params_and_steps_once(tmp_path, monkeypatch):
    """examples/siamese/mnist_siamese_train_test.prototxt as of 2014: V1 ``layers`` (DATA,
    SLICE, CONVOLUTION, POOLING, INNER_PRODUCT, RELU, CONTRASTIVE_LOSS), ``data_param
    { scale }`` (Caffe's upgrade moves it to transform_param), ``blobs_lr: 1 / 2`` and the V1
    spelling of shared params, ``param: "conv1_w"`` (a string; the upgrade makes it
    ParamSpec's name).  The two towers conv1..feat and conv1_p..feat_p name the same ten
    params, so Caffe keeps ten learnable blobs, not twenty: each sharer's data and diff are
    its owner's (Net::AppendParam, ShareWeights), both towers' backward add into that one
    diff, and the solver updates each blob once per step.

    Shapes at a batch of 4: pair_data (4, 2, 28, 28) sliced at channel 1 into data and
    data_p (4, 1, 28, 28); conv1 5x5: 24; pool1 MAX 2/2: 12; conv2: 8; pool2: 4; ip1's
    weight (500, 50*4*4 = 800); feat (4, 2).

    ContrastiveLoss (margin 1, not legacy): d = ||a - b||, loss = sum(y d^2 + (1 - y)
    max(1 - d, 0)^2) / 2N; Backward_cpu gives a the gradient (a - b) / N for a similar pair
    and -(1 - d) / (d + 1e-4) (a - b) / N for a dissimilar one within the margin, b the
    negative.  So feat_w's gradient, summed over both towers, is g^T (ip2 - ip2_p) and
    feat_b's is exactly 0 (the towers' parts cancel; one tower alone would not).  The solver
    (inv: 0.01 (1 + 1e-4 * 0)^-0.75 = 0.01, momentum 0.9, weight_decay 0) takes one step:
    with no history yet each shared diff is 0.01 * lr_mult * gradient and the data moves by
    it once."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    os.makedirs("examples/siamese")
    sims = [1, 0, 1, 0]
    write_pairs("examples/siamese/mnist_siamese_train_lmdb", sims, rng)
    write_pairs("examples/siamese/mnist_siamese_test_lmdb", sims, rng)

    param = read_net_param(zoo("siamese", "mnist_siamese_train_test_v1.prototxt"))
    assert [l.type for l in param.layer] == (
        ["Data", "Data", "Slice"] + ["Convolution", "Pooling", "Convolution", "Pooling",
                                     "InnerProduct", "ReLU", "InnerProduct", "InnerProduct"] * 2
        + ["ContrastiveLoss"])
    for layer, split in zip(param.layer[:2], ("train", "test")):
        assert layer.transform_param.scale == np.float32(0.00390625)
        assert not layer.data_param.HasField("scale")
        assert layer.data_param.source == f"examples/siamese/mnist_siamese_{split}_leveldb"
        layer.data_param.source = f"examples/siamese/mnist_siamese_{split}_lmdb"
        layer.data_param.backend = caffe_pb2.DataParameter.LMDB
        layer.data_param.batch_size = 4
    assert param.layer[-1].contrastive_loss_param.margin == 1
    net_path = "examples/siamese/mnist_siamese_train_test.prototxt"    # the solver's net
    write_text(param, net_path)
    shutil.copy(zoo("siamese", "mnist_siamese_solver.prototxt"), "solver.prototxt")

    solver = caffe.get_solver("solver.prototxt")
    sp = solver.param
    assert (sp.lr_policy, sp.base_lr, sp.gamma, sp.power, sp.momentum, sp.weight_decay) == \
        ("inv", np.float32(0.01), np.float32(1e-4), np.float32(0.75), np.float32(0.9), 0)
    train, (test,) = solver.net, solver.test_nets
    given = {"pair_data": [(4, 2, 28, 28), (4,)]}
    blobs, params = check_shapes(train, net_path, caffe.TRAIN, given=given)
    check_shapes(test, net_path, caffe.TEST, given=given)
    for tower in ("", "_p"):
        assert blobs["data" + tower] == (4, 1, 28, 28)
        assert blobs["conv1" + tower] == (4, 20, 24, 24)
        assert blobs["pool1" + tower] == (4, 20, 12, 12)
        assert blobs["conv2" + tower] == (4, 50, 8, 8)
        assert blobs["pool2" + tower] == (4, 50, 4, 4)
        assert params["ip1" + tower] == [(500, 800), (500,)]
        assert blobs["feat" + tower] == (4, 2)
    assert blobs["loss"] == () and train.outputs == ["loss"]

    # the V1 names became ParamSpec names; blobs_lr the lr_mults
    towers = ("conv1", "conv2", "ip1", "ip2", "feat")
    specs = dict(zip(train.layer_names, train.param_specs))
    for name in towers:
        for layer in (name, name + "_p"):
            assert [(p.name, p.lr_mult) for p in specs[layer]] == \
                [(name + "_w", 1), (name + "_b", 2)], layer
    # one blob per name: ten learnable params; the _p tower's data and diff are its owner's
    assert len(train.learnable_params) == 10
    for name in towers:
        for own, shared in zip(train.params[name], train.params[name + "_p"]):
            assert np.shares_memory(own.data, shared.data)
            assert np.shares_memory(own.diff, shared.diff)
    # fillers: xavier, uniform within sqrt(3 / fan_in), fan_in = count / num_output
    for name, fan_in in (("conv1", 25), ("conv2", 500), ("ip1", 800), ("feat", 10)):
        w, b = train.params[name]
        bound = np.sqrt(np.float32(3) / np.float32(fan_in))
        assert 0.8 * bound < np.abs(w.data).max() <= bound * (1 + 1e-6), name
        assert not np.any(b.data), name

    before = {k: [p.data.copy() for p in train.params[k]] for k in towers}
    grads, tops = {}, {}

    def on_gradients_ready():
        grads.update({k: [p.diff.copy() for p in ps] for k, ps in train.params.items()})
        tops.update({k: train.blobs[k].data.astype(np.float64).copy()
                     for k in ("pair_data", "sim", "ip2", "ip2_p", "feat", "feat_p", "loss")})
    solver.add_callback(lambda: None, on_gradients_ready)
    solver.step(1)
    assert solver.iter == 1

    # the data: pixels times 1/256, channel 0 of each pair in data, channel 1 in data_p
    assert 0 <= tops["pair_data"].min() and tops["pair_data"].max() <= 255 / 256
    np.testing.assert_array_equal(tops["sim"], sims)
    a, b, y = tops["feat"], tops["feat_p"], tops["sim"].astype(bool)
    d = np.sqrt(((a - b) ** 2).sum(1))
    assert np.any(~y & (d < 1))               # a dissimilar pair inside the margin counts
    loss = np.where(y, d ** 2, np.maximum(1 - d, 0) ** 2).sum() / (2 * 4)
    np.testing.assert_allclose(float(tops["loss"]), loss, rtol=1e-5)
    coeff = np.where(y, 1.0, np.where(d < 1, -(1 - d) / (d + 1e-4), 0.0))
    g = coeff[:, None] * (a - b) / 4                                     # d loss / d feat
    feat_w, feat_b = grads["feat"]
    np.testing.assert_allclose(feat_w, g.T @ (tops["ip2"] - tops["ip2_p"]), rtol=1e-4,
                               atol=1e-9)
    assert np.abs(g.T @ tops["ip2"]).max() > 100 * np.abs(feat_w - g.T @ (tops["ip2"] -
                                                                          tops["ip2_p"])).max()
    assert np.abs(feat_b).max() < 1e-6 * np.abs(g).sum(0).max()        # cancels, both towers
    for name in towers:
        np.testing.assert_array_equal(grads[name][0], grads[name + "_p"][0])   # one diff
        for blob, old, grad, lr_mult in zip(train.params[name], before[name], grads[name],
                                            (1, 2)):
            step = 0.01 * lr_mult * grad
            np.testing.assert_allclose(blob.diff, step, rtol=1e-5, atol=1e-12, err_msg=name)
            # once: moved by the step, not by twice the step
            np.testing.assert_allclose(blob.data, old - step, rtol=1e-6, atol=1e-9,
                                       err_msg=name)
    assert np.abs(grads["conv1"][0]).max() > 0

    # the test net shares the trained weights (by layer name) and runs
    out = test.forward()
    np.testing.assert_array_equal(test.params["feat_p"][0].data, train.params["feat"][0].data)
    assert np.isfinite(out["loss"])

    # the deploy net: one tower with the train net's layer names; at the file's 10,000
    # images Caffe's shapes are conv1 (10000, 20, 24, 24) ... feat (10000, 2); built here
    # at 4, it maps either channel of a pair to the train net's feat or feat_p
    deploy = read_net_param(zoo("siamese", "mnist_siamese.prototxt"))
    big, _ = caffe_shapes(upgrade_net(deploy), caffe.TEST)
    assert big["conv1"] == (10000, 20, 24, 24) and big["feat"] == (10000, 2)
    assert deploy.layer[0].type == "Input"
    deploy.layer[0].input_param.shape[0].dim[0] = 4
    write_text(deploy, "deploy.prototxt")
    train.save("siamese.caffemodel")
    net = caffe.Net("deploy.prototxt", caffe.TEST, weights="siamese.caffemodel")
    dblobs, dparams = check_shapes(net, "deploy.prototxt", caffe.TEST)
    assert dparams == {k: params[k] for k in towers}
    train.forward()
    pair = train.blobs["pair_data"].data
    for channel, feat in ((0, "feat"), (1, "feat_p")):
        got = net.forward(data=pair[:, channel:channel + 1])["feat"]
        np.testing.assert_allclose(got, train.blobs[feat].data, rtol=1e-5, atol=1e-7)
