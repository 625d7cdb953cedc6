"""A sixth sweep of public prototxt files (tests/data/zoo6/README.md lists them): BVLC's
2014 cifar10_quick train_test (V1) with its solver, BVLC GoogLeNet's train_val with its
quick_solver, and soeaver's Xception deploy.

As in tests/test_caffe_zoo5.py: each net is built in the phase its file is for, with small
stand-in data of the file's shape; every blob's and param's shape is checked against
Caffe's rules (``caffe_shapes`` in tests/zoo3_nets.py, written from Caffe's layer sources)
and, for the shapes that tell the rules apart (pooling's ceil, the grouped convolutions),
against numbers worked out by hand in the docstrings; one forward (and on train nets one
backward or one solver step) runs.
"""
import os
import shutil

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.proto import caffe_pb2, read_binary, read_net_param, write_text

from test_caffe_zoo3 import check_shapes, randomize
from test_caffe_zoo4 import write_lmdb, write_mean

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo6")


def zoo(*parts):
    return os.path.join(ZOO, *parts)


def softmax(x, axis=1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_files_are_the_stored_copies():
    """The lengths of the stored copies (``total_chars``, tests/data/zoo6/README.md)."""
    sizes = {("cifar10", "cifar10_quick_train_test_v1.prototxt"): 2877,
             ("cifar10", "cifar10_quick_solver.prototxt"): 859,
             ("googlenet", "train_val.prototxt"): 40014,
             ("googlenet", "quick_solver.prototxt"): 331,
             ("xception", "deploy_xception.prototxt"): 38139}
    for parts, n in sizes.items():
        with open(zoo(*parts), newline="") as f:
            assert len(f.read()) == n, parts


# --------------------------------------------------- cifar10_quick (V1) and its solver
def test_cifar10_quick_v1_train_test_and_solver(tmp_path, monkeypatch):
    """examples/cifar10/cifar10_quick_train_test.prototxt as of 2014: V1 ``layers`` with
    enum types (DATA, CONVOLUTION, POOLING, RELU, INNER_PRODUCT, ACCURACY, SOFTMAX_LOSS),
    ``blobs_lr: 1 / 2`` (lr_mult; decay_mult stays 1), ``include: { phase: ... }``, two DATA
    layers named alike, LevelDB (Caffe's default backend) and a mean_file.  The upgraded
    net reads LMDBs here (plyvel is not a dependency); that changes no shape.

    Shapes at a batch of 2, 32x32: conv1 pad 2, 5x5 keeps 32; pool1 MAX 3/2:
    ceil((32 - 3) / 2) + 1 = 16 (floor would give 15); conv2 16; pool2 AVE 3/2:
    ceil(13 / 2) + 1 = 8; conv3 8; pool3 ceil(5 / 2) + 1 = 4; ip1's weight (64, 64*4*4 =
    1024), where floor rounding would give 576.  The data is the image less the mean
    image (no crop, no scale).  The solver (fixed lr 0.001, momentum 0.9, weight_decay
    0.004) tests first (test_initialization's default) and then takes one step; with no
    history yet each diff holds 0.001 * lr_mult * (gradient + 0.004 * weight)."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    os.makedirs("examples/cifar10")
    write_lmdb("examples/cifar10/cifar10_train_lmdb", 2, (3, 32, 32), rng)
    write_lmdb("examples/cifar10/cifar10_test_lmdb", 2, (3, 32, 32), rng)
    write_mean("examples/cifar10/mean.binaryproto", (3, 32, 32), rng)

    src = zoo("cifar10", "cifar10_quick_train_test_v1.prototxt")
    param = read_net_param(src)                                    # upgraded from V1
    assert [l.type for l in param.layer] == ["Data", "Data", "Convolution", "Pooling", "ReLU",
                                            "Convolution", "ReLU", "Pooling", "Convolution",
                                            "ReLU", "Pooling", "InnerProduct", "InnerProduct",
                                            "Accuracy", "SoftmaxWithLoss"]
    for layer, split in zip(param.layer[:2], ("train", "test")):
        dp = layer.data_param
        assert (dp.source, dp.batch_size, dp.backend) == \
            (f"examples/cifar10/cifar10_{split}_leveldb", 100, caffe_pb2.DataParameter.LEVELDB)
        assert layer.transform_param.mean_file == "examples/cifar10/mean.binaryproto"
        dp.source = f"examples/cifar10/cifar10_{split}_lmdb"
        dp.backend = caffe_pb2.DataParameter.LMDB
        dp.batch_size = 2
    net_path = "examples/cifar10/cifar10_quick_train_test.prototxt"  # the solver's net
    write_text(param, net_path)
    shutil.copy(zoo("cifar10", "cifar10_quick_solver.prototxt"), "solver.prototxt")

    solver = caffe.get_solver("solver.prototxt")
    sp = solver.param
    assert (sp.base_lr, sp.momentum, sp.weight_decay, sp.lr_policy, list(sp.test_iter)) == \
        (np.float32(0.001), np.float32(0.9), np.float32(0.004), "fixed", [100])
    train, (test,) = solver.net, solver.test_nets
    given = {"cifar": [(2, 3, 32, 32), (2,)]}
    blobs, params = check_shapes(train, net_path, caffe.TRAIN, given=given)
    assert blobs["conv1"] == (2, 32, 32, 32) and blobs["pool1"] == (2, 32, 16, 16)
    assert blobs["pool2"] == (2, 32, 8, 8) and blobs["pool3"] == (2, 64, 4, 4)
    assert blobs["ip2"] == (2, 10) and blobs["loss"] == ()
    assert params["ip1"] == [(64, 1024), (64,)] and params["conv3"] == [(64, 32, 5, 5), (64,)]
    assert "accuracy" not in train.blobs and train.outputs == ["loss"]
    check_shapes(test, net_path, caffe.TEST, given=given)
    assert test.outputs == ["accuracy", "loss"]
    specs = dict(zip(train.layer_names, train.param_specs))
    for name in ("conv1", "conv2", "conv3", "ip1", "ip2"):
        assert [(p.lr_mult, p.decay_mult) for p in specs[name]] == [(1, 1), (2, 1)], name
    # fillers: gaussian std 1e-4 (conv1), 0.01 (conv2, conv3), 0.1 (ip); constant 0 biases
    for name, std in (("conv1", 1e-4), ("conv2", 0.01), ("conv3", 0.01), ("ip1", 0.1)):
        w, b = train.params[name]
        np.testing.assert_allclose(w.data.std(), std, rtol=0.1, err_msg=name)
        assert not np.any(b.data), name

    train.forward()
    mean = np.array(read_binary("examples/cifar10/mean.binaryproto",
                                caffe_pb2.BlobProto).data, np.float32).reshape(3, 32, 32)
    import lmdb
    from minicaffe.io import datum_to_array
    with lmdb.open("examples/cifar10/cifar10_train_lmdb", readonly=True, lock=False) as env:
        with env.begin() as txn:
            datum = caffe_pb2.Datum.FromString(txn.get(b"00000000"))
    np.testing.assert_allclose(train.blobs["data"].data[0], datum_to_array(datum) - mean,
                               rtol=1e-6, atol=1e-4)

    randomize(train, seed=2)
    train.params["conv1"][0].data[...] *= 0.01       # pixels less the mean are ~100
    before = {k: [p.data.copy() for p in ps] for k, ps in train.params.items()}
    grads, tops = {}, {}

    def on_gradients_ready():
        grads.update({k: [p.diff.copy() for p in ps] for k, ps in train.params.items()})
        tops.update({k: train.blobs[k].data.copy() for k in ("ip1", "ip2", "label", "loss")})
    solver.add_callback(lambda: None, on_gradients_ready)
    solver.step(1)
    assert solver.iter == 1
    p = softmax(tops["ip2"].astype(np.float64))
    label = tops["label"].astype(int)
    np.testing.assert_allclose(float(tops["loss"]), -np.log(p[[0, 1], label]).mean(), rtol=1e-5)
    g = p.copy()
    g[[0, 1], label] -= 1
    g /= 2
    # ip1 has no ReLU after it: ip2's gradients are g^T ip1 and the sum of g over the batch
    np.testing.assert_allclose(grads["ip2"][0], g.T @ tops["ip1"], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(grads["ip2"][1], g.sum(0), rtol=1e-4, atol=1e-7)
    for name in ("conv1", "ip1", "ip2"):
        for blob, old, grad, lr in zip(train.params[name], before[name], grads[name], (1, 2)):
            assert np.abs(grad).max() > 0, name
            np.testing.assert_allclose(blob.diff, 0.001 * lr * (grad + 0.004 * old), rtol=1e-4,
                                       atol=1e-12, err_msg=name)
            np.testing.assert_allclose(blob.data, old - blob.diff, rtol=1e-6, atol=1e-9)
    out = test.forward()
    assert np.isfinite(out["loss"]) and out["accuracy"] in (0, 0.5, 1)


# --------------------------------------------------- BVLC GoogLeNet train_val, quick_solver
def test_googlenet_train_val_and_quick_solver(tmp_path, monkeypatch):
    """models/bvlc_googlenet/train_val.prototxt and quick_solver.prototxt: LMDB data with
    crop 224, mirror and three mean_values; nine Inception modules (1x1, 3x3, 5x5 and a
    3x3/1 pad 1 MAX pool branch, concatenated); two auxiliary heads (AVE 5/3 pooling, 1x1
    conv, fc 1024, Dropout 0.7, classifier) whose SoftmaxWithLoss have loss_weight 0.3;
    Accuracy top-1/top-5 in TEST only.

    Shapes at a batch of 1: conv1 (224 + 6 - 7) // 2 + 1 = 112; pool1 MAX 3/2
    ceil(109 / 2) + 1 = 56 (floor: 55); pool2 ceil(53 / 2) + 1 = 28; inception_3a 64 + 128
    + 32 + 32 = 256, 3b 480; pool3 ceil(25 / 2) + 1 = 14; 4a 512; loss1/ave_pool
    ceil((14 - 5) / 3) + 1 = 4, so loss1/fc's weight is (1024, 128*4*4 = 2048); 4d 528, 4e
    832; pool4 ceil(11 / 2) + 1 = 7; 5b 1024; pool5 AVE 7 -> 1.

    The quick solver (poly, power 0.5, base_lr 0.01, momentum 0.9, weight_decay 2e-4,
    test_initialization false) takes one step: the loss blobs' diffs hold their weights
    (0.3, 0.3, 1), the classifiers' bias gradients are each weight times softmax - onehot,
    and each param's diff is lr * lr_mult * (gradient + 2e-4 * decay_mult * weight), lr
    at iteration 0 being 0.01 * (1 - 0)^0.5.  The TEST net is built at a batch of 1 and
    runs once."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    os.makedirs("examples/imagenet")
    os.makedirs("models/bvlc_googlenet")
    write_lmdb("examples/imagenet/ilsvrc12_train_lmdb", 1, (3, 230, 236), rng)
    write_lmdb("examples/imagenet/ilsvrc12_val_lmdb", 1, (3, 224, 224), rng)
    src = zoo("googlenet", "train_val.prototxt")
    param = read_net_param(src)
    assert [(l.data_param.batch_size, l.transform_param.crop_size) for l in param.layer[:2]] \
        == [(32, 224), (50, 224)]
    assert list(param.layer[0].transform_param.mean_value) == [104, 117, 123]
    for layer in param.layer[:2]:
        layer.data_param.batch_size = 1
    net_path = "models/bvlc_googlenet/train_val.prototxt"
    write_text(param, net_path)
    shutil.copy(zoo("googlenet", "quick_solver.prototxt"), "solver.prototxt")

    solver = caffe.get_solver("solver.prototxt")
    sp = solver.param
    assert (sp.lr_policy, sp.power, sp.max_iter, sp.test_initialization, sp.average_loss) == \
        ("poly", np.float32(0.5), 2400000, False, 40)
    train, (test,) = solver.net, solver.test_nets
    given = {"data": [(1, 3, 224, 224), (1,)]}
    blobs, params = check_shapes(train, net_path, caffe.TRAIN, given=given)
    assert blobs["conv1/7x7_s2"] == (1, 64, 112, 112) and blobs["pool1/3x3_s2"] == (1, 64, 56, 56)
    assert blobs["pool2/3x3_s2"] == (1, 192, 28, 28)
    assert blobs["inception_3a/output"] == (1, 256, 28, 28)
    assert blobs["inception_3b/output"] == (1, 480, 28, 28)
    assert blobs["pool3/3x3_s2"] == (1, 480, 14, 14)
    assert blobs["inception_4a/output"] == (1, 512, 14, 14)
    assert blobs["loss1/ave_pool"] == (1, 512, 4, 4) and blobs["loss2/ave_pool"] == (1, 528, 4, 4)
    assert blobs["inception_4e/output"] == (1, 832, 14, 14)
    assert blobs["pool4/3x3_s2"] == (1, 832, 7, 7)
    assert blobs["inception_5b/output"] == (1, 1024, 7, 7)
    assert blobs["pool5/7x7_s1"] == (1, 1024, 1, 1)
    assert params["loss1/fc"] == [(1024, 2048), (1024,)]
    assert params["loss3/classifier"] == [(1000, 1024), (1000,)]
    assert params["inception_3a/5x5"] == [(32, 16, 5, 5), (32,)]
    assert train.outputs == ["loss1/loss1", "loss2/loss2", "loss3/loss3"]
    check_shapes(test, net_path, caffe.TEST, given=given)
    assert test.outputs == ["loss1/loss1", "loss1/top-1", "loss1/top-5", "loss2/loss2",
                            "loss2/top-1", "loss2/top-5", "loss3/loss3", "loss3/top-1",
                            "loss3/top-5"]
    specs = dict(zip(train.layer_names, train.param_specs))
    assert [(p.lr_mult, p.decay_mult) for p in specs["inception_4c/3x3"]] == [(1, 1), (2, 0)]
    # fillers: xavier (uniform within sqrt(3 / fan_in)), biases 0.2 (classifiers 0)
    w = train.params["inception_4c/3x3"][0].data
    bound = np.sqrt(np.float32(3) / np.float32(128 * 9))
    assert 0.9 * bound < np.abs(w).max() <= bound * (1 + 1e-6)
    np.testing.assert_array_equal(train.params["inception_4c/3x3"][1].data, np.float32(0.2))
    assert not np.any(train.params["loss2/classifier"][1].data)

    weights = {"loss1": 0.3, "loss2": 0.3, "loss3": 1.0}
    before = {k: [p.data.copy() for p in train.params[k]]
              for k in ("conv1/7x7_s2", "loss1/classifier", "loss3/classifier")}
    grads, tops = {}, {}

    def on_gradients_ready():
        grads.update({k: [p.diff.copy() for p in train.params[k]] for k in before})
        for h in weights:
            tops[h] = train.blobs[f"{h}/classifier"].data.astype(np.float64).copy()
            tops[h + "'"] = train.blobs[f"{h}/{h}"].diff.copy()
            tops[h + "="] = float(train.blobs[f"{h}/{h}"].data)
        tops["label"] = int(train.blobs["label"].data[0])
    solver.add_callback(lambda: None, on_gradients_ready)
    solver.step(1)
    lab = tops["label"]
    for h, lw in weights.items():
        assert float(tops[h + "'"]) == np.float32(lw)
        p = softmax(tops[h])[0]
        np.testing.assert_allclose(tops[h + "="], -np.log(p[lab]), rtol=1e-4)
    for h in ("loss1", "loss3"):
        p = softmax(tops[h])[0]
        p[lab] -= 1
        np.testing.assert_allclose(grads[f"{h}/classifier"][1], weights[h] * p, rtol=1e-3,
                                   atol=1e-8)
    for name in before:
        for blob, old, g, (lr, decay) in zip(train.params[name], before[name], grads[name],
                                             ((1, 1), (2, 0))):
            assert np.abs(g).max() > 0, name
            np.testing.assert_allclose(blob.diff, 0.01 * lr * (g + 2e-4 * decay * old),
                                       rtol=1e-4, atol=1e-12, err_msg=name)
    out = test.forward()
    assert all(np.isfinite(v).all() for v in out.values())
    scores = test.blobs["loss3/classifier"].data[0]
    rank = (scores >= scores[int(test.blobs["label"].data[0])]).sum()
    assert (out["loss3/top-1"], out["loss3/top-5"]) == (rank <= 1, rank <= 5)


# ------------------------------------------------------------------- Xception (soeaver)
def test_xception_deploy():
    """soeaver/caffe-model cls/inception/deploy_xception.prototxt: ``input`` with
    ``input_shape``, depthwise separable convolutions as ``group`` = channels (weights
    (C, 1, 3, 3)) followed by 1x1 convolutions, no biases, BatchNorm ``use_global_stats``
    with eps 0.001 then Scale in place, residual Eltwise SUMs whose 1x1 stride-2 shortcut
    must match a 3x3/2 MAX pooling, and ``global_pooling : true`` (a space before the
    colon).

    Shapes at the file's 299: conv1 (299 - 3) // 2 + 1 = 149, conv2 147; block 1: the
    shortcut (147 - 1) // 2 + 1 = 74 and the pad 1 pooling ceil(146 / 2) + 1 = 74; block 2
    pools without pad: ceil((74 - 3) / 2) + 1 = 37 (floor would give 36 against the
    shortcut's 37, which Caffe's Eltwise refuses); block 3 -> 19 (728 channels), the middle
    flow keeps 19, block 12 -> 10 (1024), conv4_2 (1, 2048, 10, 10), global AVE -> 1,
    classifier (1000, 2048)."""
    path = zoo("xception", "deploy_xception.prototxt")
    net = caffe.Net(path, caffe.TEST)
    blobs, params = check_shapes(net, path, caffe.TEST)
    assert blobs["conv1"] == (1, 32, 149, 149) and blobs["conv2"] == (1, 64, 147, 147)
    assert blobs["xception1_match_conv"] == blobs["xception1_pool"] == (1, 128, 74, 74)
    assert blobs["xception2_match_conv"] == blobs["xception2_pool"] == (1, 256, 37, 37)
    assert blobs["xception3_elewise"] == (1, 728, 19, 19)
    assert blobs["xception11_elewise"] == (1, 728, 19, 19)
    assert blobs["xception12_match_conv"] == blobs["xception12_pool"] == (1, 1024, 10, 10)
    assert blobs["conv4_2"] == (1, 2048, 10, 10) and blobs["pool_ave"] == (1, 2048, 1, 1)
    assert blobs["prob"] == (1, 1000)
    assert params["xception1_conv1_1"] == [(64, 1, 3, 3)]
    assert params["xception5_conv2_1"] == [(728, 1, 3, 3)]
    assert params["conv4_1"] == [(1536, 1, 3, 3)] and params["conv4_2"] == [(2048, 1536, 1, 1)]
    assert params["conv4_bn"] == [(2048,), (2048,), (1,)]
    assert params["classifier"] == [(1000, 2048), (1000,)]
    learned = sum(int(np.prod(s)) for n, ps in params.items() for s in ps
                  if net.layer_dict[n].type != "BatchNorm")
    # Keras's Xception (the same layers): 22,910,480 params, of which 54,528 are the BN
    # layers' moving mean and variance (27,264 channels); the rest, gamma and beta (here
    # Scale's two blobs), the bias-free convolutions and the classifier, are trainable
    assert learned == 22_910_480 - 54_528 == 22_855_952
    assert net.layer_dict["pool_ave"].param.pooling_param.global_pooling
    assert net.layer_dict["conv1_bn"].param.batch_norm_param.eps == np.float32(1e-3)
    assert sum(l.type == "Eltwise" for l in net.layers) == 12

    # a forward at 75, a size at which every shortcut still matches its pooling
    randomize(net, seed=4)
    net.blobs["data"].reshape(1, 3, 75, 75)
    net.reshape()
    x = np.random.default_rng(5).standard_normal((1, 3, 75, 75)).astype(np.float32)
    prob = net.forward(data=x)["prob"]
    # 75 -> conv1 37, conv2 35, blocks 18, 9 (pad 0: ceil(6 / 2) + 1 = 9 too), 5, ..., 3
    blobs, _ = check_shapes(net, path, caffe.TEST, input_shapes={"data": (1, 3, 75, 75)})
    assert blobs["xception2_pool"] == (1, 256, 9, 9) and blobs["xception3_pool"] == (1, 728, 5, 5)
    assert blobs["conv4_2"] == (1, 2048, 3, 3)
    assert np.isfinite(prob).all()
    np.testing.assert_allclose(prob.sum(), 1, rtol=1e-5)
    b = net.blobs
    np.testing.assert_allclose(b["xception7_elewise"].data,
                               b["xception6_elewise"].data + b["xception7_conv3_2"].data,
                               rtol=1e-5, atol=1e-5)
    # a depthwise convolution by hand: channel c sees only input channel c
    a = b["xception5_relu"].data[0].astype(np.float64)
    w = net.params["xception5_conv1_1"][0].data[:, 0].astype(np.float64)
    h, wd = a.shape[1:]
    ap = np.pad(a, ((0, 0), (1, 1), (1, 1)))
    dw = sum(ap[:, i:i + h, j:j + wd] * w[:, i, j, None, None] for i in range(3)
             for j in range(3))
    np.testing.assert_allclose(b["xception5_conv1_1"].data[0], dw, rtol=1e-4, atol=1e-4)
    # conv4: a 1x1 convolution, then BatchNorm in TEST (the sums over the scale factor,
    # eps 0.001 inside the root), Scale and ReLU, all three in place on conv4_2
    m, v, sf = (blob.data.astype(np.float64) for blob in net.params["conv4_bn"])
    gamma, beta = (blob.data.astype(np.float64) for blob in net.params["conv4_scale"])
    w = net.params["conv4_2"][0].data[:, :, 0, 0].astype(np.float64)
    y = np.einsum("oc,chw->ohw", w, b["conv4_1"].data[0].astype(np.float64))
    y = (y - (m / sf)[:, None, None]) / np.sqrt(v / sf + 1e-3)[:, None, None]
    y = np.maximum(y * gamma[:, None, None] + beta[:, None, None], 0)
    np.testing.assert_allclose(b["conv4_2"].data[0], y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b["pool_ave"].data[0, :, 0, 0], y.mean(axis=(1, 2)), rtol=1e-4,
                               atol=1e-6)

    # 71 (conv2 33, block 1 17) gives block 2 a shortcut of 9 against a pooling of
    # ceil(14 / 2) + 1 = 8: Caffe's Eltwise refuses it
    net.blobs["data"].reshape(1, 3, 71, 71)
    with pytest.raises(ValueError, match=r"'xception2_elewise' of type Eltwise.*"
                       r"\(1, 256, 9, 9\).*\(1, 256, 8, 8\)"):
        net.reshape()
