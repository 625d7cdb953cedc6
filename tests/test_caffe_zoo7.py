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

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.io import LMDBWriter, array_to_datum
from minicaffe.proto import PrototxtError, caffe_pb2, read_net_param, upgrade_net, write_text

from test_caffe_zoo3 import check_shapes, randomize
from zoo3_nets import caffe_shapes
from zoo7_nets import DENSENET121_CHARS, densenet121_deploy

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo7")


def zoo(*parts):
    return os.path.join(ZOO, *parts)


def test_files_are_the_stored_copies():
    """The lengths of the stored copies (``total_chars``, tests/data/zoo7/README.md)."""
    sizes = {("siamese", "mnist_siamese_train_test_v1.prototxt"): 4572,
             ("siamese", "mnist_siamese_solver.prototxt"): 810,
             ("siamese", "mnist_siamese.prototxt"): 1436,
             ("squeezenet", "deploy_v1.1.prototxt"): 9678,
             ("resnet18", "deploy_resnet18-1x64d.prototxt"): 13625}
    for parts, n in sizes.items():
        with open(zoo(*parts), newline="") as f:
            assert len(f.read()) == n, parts
    assert len(densenet121_deploy()) == DENSENET121_CHARS


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
    # the solver as stored, but for its first test (test_initialization's default): 2
    # batches of the stand-in data rather than 100 of MNIST's
    with open(zoo("siamese", "mnist_siamese_solver.prototxt"), newline="") as f:
        text = f.read()
    assert text.count("\ntest_iter: 100\n") == 1
    with open("solver.prototxt", "w", newline="") as f:
        f.write(text.replace("\ntest_iter: 100\n", "\ntest_iter: 2\n"))

    solver = caffe.get_solver("solver.prototxt")
    sp = solver.param
    assert (sp.lr_policy, sp.base_lr, sp.gamma, sp.power, sp.momentum, sp.weight_decay) == \
        ("inv", np.float32(0.01), np.float32(1e-4), np.float32(0.75), np.float32(0.9), 0)
    assert (list(sp.test_iter), sp.test_interval, sp.test_initialization) == ([2], 500, True)
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
    both = g.T @ (tops["ip2"] - tops["ip2_p"])
    np.testing.assert_allclose(feat_w, both, rtol=1e-4, atol=1e-9)
    assert not np.allclose(g.T @ tops["ip2"], both, rtol=1e-2)        # one tower's differs
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


# ---------------------------------------------------------------- SqueezeNet v1.1 (forresti)
def test_squeezenet_v1_1_deploy():
    """SqueezeNet_v1.1/deploy.prototxt: an ``Input`` layer with a one-line ``input_param``,
    3x3/2 conv1 with 64 outputs, eight fire modules (squeeze 1x1, expand 1x1 and 3x3 pad 1,
    concatenated), MAX 3/2 pooling after conv1, fire3 and fire5, Dropout in place, a 1x1
    conv10 and global AVE pooling into Softmax.

    Shapes at the file's batch of 10 and 227: conv1 (227 - 3) // 2 + 1 = 113; pool1
    ceil((113 - 3) / 2) + 1 = 56; fire2, fire3 128 channels; pool3 ceil((56 - 3) / 2) + 1 =
    28 (floor: 27); fire4, fire5 256; pool5 ceil(25 / 2) + 1 = 14 (floor: 13); fire9 512;
    conv10 (10, 1000, 14, 14); pool10 and prob (10, 1000, 1, 1).  Parameters: torchvision's
    squeezenet1_1 (the same layers) has 1,235,496."""
    path = zoo("squeezenet", "deploy_v1.1.prototxt")
    net = caffe.Net(path, caffe.TEST)
    blobs, params = check_shapes(net, path, caffe.TEST)
    assert blobs["conv1"] == (10, 64, 113, 113) and blobs["pool1"] == (10, 64, 56, 56)
    assert blobs["fire3/concat"] == (10, 128, 56, 56) and blobs["pool3"] == (10, 128, 28, 28)
    assert blobs["fire5/concat"] == (10, 256, 28, 28) and blobs["pool5"] == (10, 256, 14, 14)
    assert blobs["fire9/concat"] == (10, 512, 14, 14)
    assert blobs["conv10"] == (10, 1000, 14, 14) and blobs["prob"] == (10, 1000, 1, 1)
    assert params["fire6/expand3x3"] == [(192, 48, 3, 3), (192,)]
    assert params["conv10"] == [(1000, 512, 1, 1), (1000,)]
    assert sum(int(np.prod(s)) for ps in params.values() for s in ps) == 1_235_496
    assert net.layer_dict["drop9"].param.dropout_param.dropout_ratio == np.float32(0.5)

    randomize(net, seed=3)
    net.blobs["data"].reshape(1, 3, 227, 227)
    net.reshape()
    x = np.random.default_rng(4).standard_normal((1, 3, 227, 227)).astype(np.float32)
    prob = net.forward(data=x)["prob"]
    b = net.blobs
    np.testing.assert_allclose(prob.sum(axis=1), 1, rtol=1e-5)
    # fire3: the ReLUs run in place on both expand tops before they are concatenated
    np.testing.assert_array_equal(b["fire3/concat"].data[0, :64], b["fire3/expand1x1"].data[0])
    np.testing.assert_array_equal(b["fire3/concat"].data[0, 64:], b["fire3/expand3x3"].data[0])
    assert b["fire3/concat"].data.min() == 0
    # pool3's last window starts at 54 and is clipped to the input's columns 54 and 55
    np.testing.assert_array_equal(b["pool3"].data[0],
                                  max_pool(b["fire3/concat"].data[0], 3, 2, 0, 28))
    conv10 = b["conv10"].data[0].astype(np.float64)
    np.testing.assert_allclose(b["pool10"].data[0, :, 0, 0], conv10.mean(axis=(1, 2)),
                               rtol=1e-5, atol=1e-7)
    e = np.exp(conv10.mean(axis=(1, 2)) - conv10.mean(axis=(1, 2)).max())
    np.testing.assert_allclose(prob[0, :, 0, 0], e / e.sum(), rtol=1e-4, atol=1e-8)


# ---------------------------------------------------------------- DenseNet-121 (shicai)
def test_densenet121_deploy(tmp_path):
    """shicai/DenseNet-Caffe DenseNet_121.prototxt (rebuilt by tests/zoo7_nets.py): 58 dense
    layers, 121 BatchNorm + Scale pairs (BN writes a new blob, Scale and ReLU act in place
    on it), Concat chains, ``round_mode: FLOOR`` on pool1 and BatchNorm without
    use_global_stats, which in TEST means the stored statistics.

    Shapes at the file's 224: conv1 (224 + 6 - 7) // 2 + 1 = 112; pool1 MAX 3/2 pad 1 with
    FLOOR: (112 + 2 - 3) // 2 + 1 = 56 (CEIL: 57); block 1 ends at 64 + 6*32 = 256
    channels, its transition halves them to 128 and pools AVE 2/2 to 28; block 2: 128 +
    12*32 = 512 -> 256, 14; block 3: 256 + 24*32 = 1024 -> 512, 7; block 4: 512 + 16*32 =
    1024; pool5 global -> 1; fc6 (1, 1000, 1, 1).  Parameters: convolutions, Scale's gamma
    and beta and fc6 are torchvision's densenet121's 7,978,856 (its BatchNorm affine pairs
    are Scale's here; its running statistics, BatchNorm's blobs here, are buffers)."""
    text = densenet121_deploy()
    path = tmp_path / "DenseNet_121.prototxt"
    path.write_text(text)
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    assert blobs["conv1"] == (1, 64, 112, 112) and blobs["pool1"] == (1, 64, 56, 56)
    assert blobs["concat_2_6"] == (1, 256, 56, 56) and blobs["pool2"] == (1, 128, 28, 28)
    assert blobs["concat_3_12"] == (1, 512, 28, 28) and blobs["pool3"] == (1, 256, 14, 14)
    assert blobs["concat_4_24"] == (1, 1024, 14, 14) and blobs["pool4"] == (1, 512, 7, 7)
    assert blobs["concat_5_16"] == (1, 1024, 7, 7) and blobs["pool5"] == (1, 1024, 1, 1)
    assert blobs["fc6"] == (1, 1000, 1, 1)
    assert params["conv5_16/x1"] == [(128, 992, 1, 1)] and params["conv4_blk"] == \
        [(512, 1024, 1, 1)]
    assert params["conv5_blk/bn"] == [(1024,), (1024,), (1,)]
    assert params["fc6"] == [(1000, 1024, 1, 1), (1000,)]
    types = [l.type for l in net.layers]
    assert types.count("BatchNorm") == types.count("Scale") == 121
    assert types.count("Concat") == 58
    learned = sum(int(np.prod(s)) for n, ps in params.items() for s in ps
                  if net.layer_dict[n].type != "BatchNorm")
    assert learned == 7_978_856
    assert not net.layer_dict["conv1/bn"].param.batch_norm_param.HasField("use_global_stats")

    # a forward at 64: conv1 32, pool1 (32 + 2 - 3) // 2 + 1 = 16 (CEIL: 17), 8, 4, 2
    randomize(net, seed=5)
    net.blobs["data"].reshape(1, 3, 64, 64)
    net.reshape()
    blobs, _ = check_shapes(net, str(path), caffe.TEST, input_shapes={"data": (1, 3, 64, 64)})
    assert blobs["pool1"] == (1, 64, 16, 16) and blobs["pool4"] == (1, 512, 2, 2)
    x = np.random.default_rng(6).standard_normal((1, 3, 64, 64)).astype(np.float32)
    out = net.forward(data=x)["fc6"]
    b, p = net.blobs, net.params
    # conv1/bn: BatchNorm with the stored statistics (sums over the scale factor, eps 1e-5
    # inside the root), then Scale and ReLU in place
    m, v, sf = (blob.data.astype(np.float64) for blob in p["conv1/bn"])
    gamma, beta = (blob.data.astype(np.float64)[:, None, None] for blob in p["conv1/scale"])
    c1 = b["conv1"].data[0].astype(np.float64)
    y = (c1 - (m / sf)[:, None, None]) / np.sqrt(v / sf + 1e-5)[:, None, None]
    y = np.maximum(y * gamma + beta, 0)
    np.testing.assert_allclose(b["conv1/bn"].data[0], y, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(b["pool1"].data[0], max_pool(b["conv1/bn"].data[0], 3, 2, 1,
                                                               16))
    np.testing.assert_array_equal(b["concat_2_1"].data[0, :64], b["pool1"].data[0])
    np.testing.assert_array_equal(b["concat_2_1"].data[0, 64:], b["conv2_1/x2"].data[0])
    np.testing.assert_array_equal(b["concat_5_16"].data[0, :992], b["concat_5_15"].data[0])
    blk = b["conv2_blk"].data[0].astype(np.float64)
    np.testing.assert_allclose(b["pool2"].data[0], blk.reshape(128, 8, 2, 8, 2).mean((2, 4)),
                               rtol=1e-5, atol=1e-6)
    pooled = b["conv5_blk/bn"].data[0].astype(np.float64).mean(axis=(1, 2))
    w, bias = (blob.data.astype(np.float64) for blob in p["fc6"])
    np.testing.assert_allclose(out[0, :, 0, 0], w[:, :, 0, 0] @ pooled + bias, rtol=1e-4,
                               atol=1e-5)


# ---------------------------------------------------------------- ResNet-18 (soeaver)
def resnet18_text(rounding):
    """soeaver's deploy_resnet18-1x64d.prototxt with its pool1 line ``ceil_mode: false``
    replaced by ``rounding`` (empty: the line removed)."""
    with open(zoo("resnet18", "deploy_resnet18-1x64d.prototxt"), newline="") as f:
        text = f.read()
    assert text.count("    ceil_mode: false\n") == 1
    return text.replace("    ceil_mode: false\n", rounding)


def test_resnet18_fork_pooling_field_is_refused_naming_file_line_and_layer():
    """The stored file's pool1 holds ``ceil_mode: false`` (line 129), a field of Caffe forks
    that BVLC's PoolingParameter lacks: Caffe stops at it; minicaffe names the file, the
    line and column, the layer block it is in (pool1, opened at line 119, a Pooling) and
    BVLC's spelling."""
    path = zoo("resnet18", "deploy_resnet18-1x64d.prototxt")
    with pytest.raises(PrototxtError) as e:
        caffe.Net(path, caffe.TEST)
    msg = str(e.value)
    assert msg.startswith(f"{path}:129:5: ")
    assert '"ceil_mode"' in msg and '''in layer 'pool1' (line 119) of type "Pooling"''' in msg
    assert "round_mode: FLOOR" in msg


def test_resnet18_with_round_mode_floor(tmp_path):
    """With BVLC's ``round_mode: FLOOR`` in its place: a stem of three 3x3 convolutions
    (32, 32, 64; the first stride 2), BatchNorm use_global_stats + Scale in place, eight
    basic blocks whose stride-2 shortcuts are 1x1 convolutions, global AVE pooling, a 1000-way
    InnerProduct.

    Shapes at 224: conv1 (224 + 2 - 3) // 2 + 1 = 112; pool1 (112 + 2 - 3) // 2 + 1 = 56
    (the default CEIL: ceil(111 / 2) + 1 = 57, whose last window starts at 112, inside
    112 + 1, so it stays); res1, res2 (1, 64, 56, 56); res3 28 (128); res5 14 (256); res7 7
    (512); pool_avg (1, 512, 1, 1).  Parameters: convolutions 28,512 (stem) + 147,456 +
    229,376 + 294,912 + 917,504 + 1,179,648 + 3,670,016 + 4,718,592 = 11,186,016; Scale
    2 x 4,864 channels = 9,728; classifier 513,000; 11,708,744 in all."""
    path = tmp_path / "floor.prototxt"
    path.write_text(resnet18_text("    round_mode: FLOOR\n"))
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    assert blobs["conv1"] == (1, 32, 112, 112) and blobs["pool1"] == (1, 64, 56, 56)
    assert blobs["res2"] == (1, 64, 56, 56) and blobs["res3_match"] == (1, 128, 28, 28)
    assert blobs["res5"] == (1, 256, 14, 14) and blobs["res8"] == (1, 512, 7, 7)
    assert blobs["pool_avg"] == (1, 512, 1, 1) and blobs["prob"] == (1, 1000)
    assert params["res7_match"] == [(512, 256, 1, 1)]
    assert params["classifier"] == [(1000, 512), (1000,)]
    learned = sum(int(np.prod(s)) for n, ps in params.items() for s in ps
                  if net.layer_dict[n].type != "BatchNorm")
    assert learned == 11_708_744

    ceil = tmp_path / "ceil.prototxt"
    ceil.write_text(resnet18_text(""))
    cblobs, _ = check_shapes(caffe.Net(str(ceil), caffe.TEST), str(ceil), caffe.TEST)
    assert cblobs["pool1"] == (1, 64, 57, 57) and cblobs["res3"] == (1, 128, 29, 29)

    # a forward at 64: conv1 32, pool1 (32 + 2 - 3) // 2 + 1 = 16, res3 8, res5 4, res7 2
    randomize(net, seed=7)
    net.blobs["data"].reshape(1, 3, 64, 64)
    net.reshape()
    x = np.random.default_rng(8).standard_normal((1, 3, 64, 64)).astype(np.float32)
    prob = net.forward(data=x)["prob"]
    b = net.blobs
    assert b["pool1"].data.shape == (1, 64, 16, 16) and b["res7"].data.shape == (1, 512, 2, 2)
    np.testing.assert_array_equal(b["pool1"].data[0], max_pool(b["conv3"].data[0], 3, 2, 1, 16))
    # res1 = ReLU(pool1 + res1_conv2), the ReLU in place on the sum
    np.testing.assert_allclose(b["res1"].data, np.maximum(b["pool1"].data + b["res1_conv2"].data,
                                                          0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(prob.sum(), 1, rtol=1e-5)
