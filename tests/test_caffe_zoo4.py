"""A fourth sweep of public prototxt files (tests/data/zoo4/README.md lists them).

As in tests/test_caffe_zoo3.py: each net is built in the phase its file is for, with small
stand-in data of the file's shape; every blob's and param's shape is checked against
Caffe's rules (``caffe_shapes`` in tests/zoo3_nets.py, written from Caffe's layer sources);
one forward (and on train nets one backward) runs; weights go through a ``.caffemodel``
into a fresh net with the same outputs.  Files from Caffe forks are refused with the
file's line and the foreign field named.
"""
import os
import shutil

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.proto import PrototxtError, caffe_pb2, read_net_param, write_binary, write_text

from test_caffe_zoo3 import check_shapes, deploy_check, randomize, round_trip

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo4")


def zoo(*parts):
    return os.path.join(ZOO, *parts)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def write_mean(path, shape, rng):
    mean = caffe_pb2.BlobProto(num=1, channels=shape[0], height=shape[1], width=shape[2])
    mean.data.extend((rng.random(int(np.prod(shape))) * 100).astype(np.float32))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_binary(mean, path)


def write_lmdb(path, n, shape, rng):
    from minicaffe.io import LMDBWriter, array_to_datum
    with LMDBWriter(path) as w:
        for i in range(n):
            img = rng.integers(0, 256, shape).astype(np.uint8)
            w.put(f"{i:08d}", array_to_datum(img, int(i % 10)).SerializeToString())


# ------------------------------------------------------- the 2013 V0 CaffeNet deploy
def test_v0_caffenet_deploy(tmp_path):
    """BVLC's models/imagenet.prototxt of 2013: V0 layers (``layers { layer { type: "conv"
    kernelsize ... } }``) and ``input_dim``.  Caffe upgrades it (UpgradeV0Net); no layer
    names a filler, so every param is Caffe's default constant 0 and prob is uniform."""
    path = zoo("caffe_models", "imagenet_v0.prototxt")
    net = caffe.Net(path, caffe.TEST)
    blobs, params = check_shapes(net, path, caffe.TEST)
    assert [net.layers[i].type for i in range(6)] == ["Input", "Convolution", "ReLU", "Pooling",
                                                      "LRN", "Convolution"]
    assert blobs["conv1"] == (10, 96, 55, 55) and blobs["pool5"] == (10, 256, 6, 6)
    assert params["conv2"] == [(256, 48, 5, 5), (256,)] and params["fc6"] == [(4096, 9216), (4096,)]
    assert all(not np.any(p.data) for ps in net.params.values() for p in ps)
    lrn = net.layer_dict["norm1"].param.lrn_param
    assert (lrn.local_size, lrn.alpha, lrn.beta) == (5, np.float32(1e-4), 0.75)
    assert net.layer_dict["drop6"].param.dropout_param.dropout_ratio == 0.5
    net.blobs["data"].reshape(1, 3, 227, 227)
    out = net.forward()
    np.testing.assert_allclose(out["prob"], 1e-3, rtol=1e-6)
    randomize(net)
    assert np.isfinite(net.forward()["prob"]).all()


# ------------------------------------------------- coco_caption's LRCN word-to-preds deploy
def lstm_step(x, s, W_x, b, W_s, H):
    """One LSTM step from a zero state (Caffe's LSTMUnit with c_{t-1} = 0): gates in the
    order i, f, o, g; c = i * g; h = o * tanh(c)."""
    gates = x @ W_x.T + b + s @ W_s.T
    i, o, g = sigmoid(gates[:, :H]), sigmoid(gates[:, 2 * H:3 * H]), np.tanh(gates[:, 3 * H:])
    return o * np.tanh(i * g)


def test_lrcn_word_to_preds_deploy(tmp_path):
    """examples/coco_caption/lrcn_word_to_preds.deploy.prototxt (Donahue et al.'s LRCN
    captioner): three ``input``/``input_shape`` pairs, an Embed of word indices, two LSTMs
    (the second with the image features as its static input), an InnerProduct and a
    Softmax on axis 2.  One time step of 1000 streams, from a zero state."""
    path = zoo("caffe_examples", "lrcn_word_to_preds.deploy.prototxt")
    net = caffe.Net(path, caffe.TEST)
    blobs, params = check_shapes(net, path, caffe.TEST)
    assert net.inputs == ["cont_sentence", "input_sentence", "image_features"]
    assert blobs["embedded_input_sentence"] == (1, 1000, 1000)
    assert blobs["probs"] == (1, 1000, 8801)
    assert params["embedding"] == [(8801, 1000)]
    assert params["lstm2"] == [(4000, 1000), (4000,), (4000, 1000), (4000, 1000)]
    randomize(net)
    rng = np.random.default_rng(2)
    words = rng.integers(0, 8801, (1, 1000)).astype(np.float32)
    feats = rng.standard_normal((1000, 1000)).astype(np.float32)
    arrays = {"cont_sentence": np.zeros((1, 1000), np.float32), "input_sentence": words,
              "image_features": feats}
    for k, v in arrays.items():
        net.blobs[k].data[...] = v
    out = net.forward()
    np.testing.assert_allclose(out["probs"].sum(axis=2), 1, rtol=1e-5)
    (W_e,), (W1, b1, _), (W2, b2, W2s, _) = ([p.data.astype(np.float64) for p in net.params[k]]
                                           for k in ("embedding", "lstm1", "lstm2"))
    x = W_e[words[0].astype(int)]
    h1 = lstm_step(x, np.zeros((1000, 1)), W1, b1, np.zeros((4000, 1)), 1000)
    h2 = lstm_step(h1, feats.astype(np.float64), W2, b2, W2s, 1000)
    np.testing.assert_allclose(net.blobs["lstm2"].data[0], h2, rtol=1e-4, atol=1e-5)


# --------------------------------------------------- flickr_style fine-tuning (V1, ImageData)
def flickr_layout(root, rng, n=4):
    """The files the train_val reads, relative to the Caffe root: two image lists, images
    of any size (resized to 256x256), and the ImageNet mean (3, 256, 256)."""
    from PIL import Image
    os.makedirs(root / "data" / "flickr_style" / "images")
    for split in ("train", "test"):
        lines = []
        for i in range(n):
            name = f"data/flickr_style/images/{split}{i}.jpg"
            h, w = rng.integers(200, 320, 2)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / name)
            lines.append(f"{name} {(3 * i) % 20}\n")
        (root / "data" / "flickr_style" / f"{split}.txt").write_text("".join(lines))
    write_mean(str(root / "data" / "ilsvrc12" / "imagenet_mean.binaryproto"), (3, 256, 256), rng)


def test_flickr_style_v1_train_val_and_solver(tmp_path, monkeypatch):
    """models/finetune_flickr_style (2014): a V1 CaffeNet whose IMAGE_DATA layers resize
    to 256x256 and crop 227, ``blobs_lr``/``weight_decay`` (10 and 20 on the new
    fc8_flickr), and a SOFTMAX_LOSS without a top.  Its solver (SGD, step policy) makes
    one step: each param's diff is then base_lr * lr_mult * (gradient + weight_decay *
    decay_mult * weight), the momentum history being zero."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    flickr_layout(tmp_path, rng)
    os.makedirs("models/finetune_flickr_style")
    src = "models/finetune_flickr_style/train_val.prototxt"
    shutil.copy(zoo("caffe_models", "finetune_flickr_style_train_val_v1.prototxt"), src)
    shutil.copy(zoo("caffe_models", "finetune_flickr_style_solver.prototxt"), "solver.prototxt")
    param = read_net_param(src)
    assert [(l.name, l.type) for l in param.layer][:2] == [("data", "ImageData")] * 2
    param.layer[0].data_param.prefetch = 0        # no 4 batches of 50 loaded ahead
    net = caffe.Net(param, caffe.TRAIN)
    blobs, params = check_shapes(net, src, caffe.TRAIN, given={"data": [(50, 3, 227, 227),
                                                                        (50,)]})
    assert blobs["pool5"] == (50, 256, 6, 6) and blobs["fc8_flickr"] == (50, 20)
    assert params["fc8_flickr"] == [(20, 4096), (20,)] and "accuracy" not in blobs
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [(p.lr_mult, p.decay_mult) for p in specs["fc8_flickr"]] == [(10, 1), (20, 0)]
    assert [(p.lr_mult, p.decay_mult) for p in specs["conv1"]] == [(1, 1), (2, 0)]
    del net

    # the solver's nets at batch 2 (the images above), one SGD step
    param.layer[0].ClearField("data_param")
    for layer in param.layer[:2]:
        layer.image_data_param.batch_size = 2
    write_text(param, src)
    solver = caffe.get_solver("solver.prototxt")
    assert solver.param.solver_mode == caffe_pb2.SolverParameter.CPU
    (test,) = solver.test_nets
    blobs, _ = check_shapes(test, src, caffe.TEST, given={"data": [(2, 3, 227, 227), (2,)]})
    assert blobs["accuracy"] == ()
    solver.param.test_initialization = False        # test_iter 100 batches otherwise
    train = solver.net
    before = {k: [p.data.copy() for p in ps] for k, ps in train.params.items()}
    solver.step(1)
    assert np.isfinite(train.blobs["(automatic)"].data).all()
    for name in ("fc8_flickr", "conv1"):
        for p, old in zip(train.params[name], before[name]):
            np.testing.assert_allclose(p.data, old - p.diff, rtol=1e-6, atol=1e-9)
    # fc8_flickr's gradient from the data it saw: the softmax loss on fc7
    fc7 = train.blobs["fc7"].data
    label = train.blobs["label"].data.astype(int)
    w_old, b_old = before["fc8_flickr"]
    logits = fc7 @ w_old.T + b_old
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(2), label] -= 1
    g = p / 2
    np.testing.assert_allclose(train.params["fc8_flickr"][1].diff, 0.001 * 20 * g.sum(0),
                               rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(train.params["fc8_flickr"][0].diff,
                               0.001 * 10 * (g.T @ fc7 + 0.0005 * w_old), rtol=1e-4, atol=1e-9)


# --------------------------------------------------------- cifar10_full_sigmoid (train_test)
def cifar_layout(root, rng, n_train=111, n_test=30):
    os.makedirs(root / "examples" / "cifar10")
    write_lmdb(str(root / "examples/cifar10/cifar10_train_lmdb"), n_train, (3, 32, 32), rng)
    write_lmdb(str(root / "examples/cifar10/cifar10_test_lmdb"), n_test, (3, 32, 32), rng)
    write_mean(str(root / "examples/cifar10/mean.binaryproto"), (3, 32, 32), rng)


def test_cifar10_full_sigmoid_train_test_and_solver(tmp_path, monkeypatch):
    """examples/cifar10/cifar10_full_sigmoid_train_test.prototxt: cifar10_full with Sigmoid
    in place of ReLU and LRN, a TRAIN batch of 111, conv3's ``param`` after its
    convolution_param, ip1 without weight decay.  Its solver (SGD, momentum 0.9, no
    weight_decay) takes one step; the train LMDB holds exactly one batch, so every batch
    is the same and the step's update is base_lr * lr_mult times the gradient of a
    forward/backward run before it."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    cifar_layout(tmp_path, rng)
    src = "examples/cifar10/cifar10_full_sigmoid_train_test.prototxt"
    shutil.copy(zoo("caffe_examples", "cifar10_full_sigmoid_train_test.prototxt"), src)
    shutil.copy(zoo("caffe_examples", "cifar10_full_sigmoid_solver.prototxt"), "solver.prototxt")
    solver = caffe.get_solver("solver.prototxt")
    train, (test,) = solver.net, solver.test_nets
    blobs, params = check_shapes(train, src, caffe.TRAIN, given={"cifar": [(111, 3, 32, 32),
                                                                          (111,)]})
    assert blobs["pool1"] == (111, 32, 16, 16) and blobs["pool3"] == (111, 64, 4, 4)
    assert params["ip1"] == [(10, 1024), (10,)]
    check_shapes(test, src, caffe.TEST, given={"cifar": [(1000, 3, 32, 32), (1000,)]})
    specs = dict(zip(train.layer_names, train.param_specs))
    assert [(p.lr_mult, p.decay_mult) for p in specs["conv3"]] == [(1, 1), (1, 1)]
    assert [(p.lr_mult, p.decay_mult) for p in specs["ip1"]] == [(1, 0), (2, 0)]

    randomize(train, seed=5)
    train.clear_param_diffs()
    train.forward()
    train.backward()
    grads = {k: [p.diff.copy() for p in ps] for k, ps in train.params.items()}
    assert all(np.abs(g).max() > 0 for gs in grads.values() for g in gs)
    solver.param.test_initialization = False          # 10 test batches of 1000 otherwise
    solver.step(1)
    for name, lr_mults in (("conv1", (1, 2)), ("conv3", (1, 1)), ("ip1", (1, 2))):
        for p, g, lr in zip(train.params[name], grads[name], lr_mults):
            np.testing.assert_allclose(p.diff, 0.001 * lr * g, rtol=1e-5, atol=1e-12,
                                       err_msg=name)


def test_cifar10_sigmoid_bn_with_fork_batchnorm_fields_is_refused():
    """The stored cifar10_full_sigmoid_train_test_bn.prototxt at ad248bd3 is a fork's: its
    BatchNorm layers carry ``batch_norm_param { scale_filler bias_filler }`` and one
    learned ``param``, fields BVLC's BatchNormParameter does not have."""
    path = zoo("caffe_examples", "cifar10_full_sigmoid_train_test_bn_fork2.prototxt")
    with pytest.raises(PrototxtError) as e:
        caffe.Net(path, caffe.TRAIN)
    msg = str(e.value)
    assert f"{path}:77:5:" in msg and '"scale_filler"' in msg and "BatchNormParameter" in msg


# ------------------------------------------------ DIGITS' all-in-one LeNet (stages)
def test_digits_lenet_all_in_one_by_stage(tmp_path):
    """NVIDIA DIGITS' standard-networks/caffe/lenet.prototxt: one file for train, val and
    deploy, chosen by NetState stages (``include { stage: "train" }``, ``exclude { stage:
    "deploy" }``).  DIGITS fills in the data sources and ip2's num_output (the class
    count) and, for deploy, declares the "data" input; without that input the deploy
    stage's Power layer reads a blob no layer makes, which Caffe refuses.  (DIGITS also
    sets the LMDB backend; Caffe's default is LevelDB.)"""
    src = zoo("digits", "lenet.prototxt")
    param = read_net_param(src)
    assert param.layer[9].inner_product_param.num_output == 0
    with pytest.raises(ValueError, match=r"layer 'scale': unknown bottom blob 'data'"):
        caffe.Net(param, caffe.TEST, stages=["deploy"])

    rng = np.random.default_rng(0)
    for layer, n in zip(param.layer[:2], (64, 30)):
        layer.data_param.source = str(tmp_path / layer.name)
        layer.data_param.backend = caffe_pb2.DataParameter.LMDB
        write_lmdb(layer.data_param.source, n, (1, 28, 28), rng)
    param.layer[9].inner_product_param.num_output = 10
    given = {"train-data": [(64, 1, 28, 28), (64,)], "val-data": [(100, 1, 28, 28), (100,)]}
    train = caffe.Net(param, caffe.TRAIN, stages=["train"])
    blobs, params = check_shapes(train, param, caffe.TRAIN, given=given, stages=["train"])
    assert train.layer_names[0] == "train-data" and "accuracy" not in blobs
    assert blobs["pool2"] == (64, 50, 4, 4) and params["ip2"] == [(10, 500), (10,)]
    train.forward()
    train.backward()
    assert 0 < train.blobs["scaled"].data.max() <= 255 * np.float32(0.0125)
    assert np.abs(train.params["conv1"][0].diff).max() > 0

    val = caffe.Net(param, caffe.TEST, stages=["val"])
    blobs, _ = check_shapes(val, param, caffe.TEST, given=given, stages=["val"])
    assert val.layer_names[0] == "val-data" and set(val.outputs) == {"accuracy", "loss"}
    out = val.forward()
    assert 0 <= out["accuracy"] <= 1
    # without a stage, only the layers without rules (and the loss's exclude) remain: no data
    with pytest.raises(ValueError, match=r"layer 'conv1': unknown bottom blob 'scaled'"):
        caffe.Net(param, caffe.TEST)

    param.input.append("data")
    param.input_shape.add().dim.extend([2, 1, 28, 28])
    path = str(tmp_path / "deploy.prototxt")
    write_text(param, path)
    deploy = caffe.Net(path, caffe.TEST, stages=["deploy"])
    blobs, _ = check_shapes(deploy, path, caffe.TEST, stages=["deploy"])
    assert deploy.outputs == ["softmax"] and blobs["softmax"] == (2, 10)
    assert [deploy.layers[i].type for i in range(2)] == ["Input", "Power"]
    deploy.blobs["data"].data[...] = 80
    deploy.forward()
    np.testing.assert_allclose(deploy.blobs["scaled"].data, 1.0, rtol=1e-6)   # 80 * 0.0125


# ------------------------------------------- R-CNN fine-tuning on PASCAL (WindowData)
def test_pascal_finetune_window_data_train_and_test(tmp_path, monkeypatch):
    """examples/finetune_pascal_detection/pascal_finetune_trainval_test.prototxt: CaffeNet
    fed by WindowData (R-CNN's warped windows: context_pad 16, crop 227, fg_fraction 0.25,
    fg/bg thresholds 0.5) with a 21-way fc8_pascal.  At the file's batch of 128 a TRAIN
    batch holds 96 background windows (label 0) then 32 foreground ones; run at a stand-in
    batch of 4 (3 + 1), forward and backward."""
    from PIL import Image
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    src = "pascal_finetune_trainval_test.prototxt"
    shutil.copy(zoo("caffe_examples", src), src)
    os.makedirs("examples/finetune_pascal_detection")
    write_mean("data/ilsvrc12/imagenet_mean.binaryproto", (3, 256, 256), rng)
    for split in ("trainval", "test"):
        records = []
        for i in range(2):
            name = f"{split}{i}.jpg"
            Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)).save(name)
            # class overlap x1 y1 x2 y2: one foreground, one background, one in between
            records.append(f"# {i}\n{name}\n3\n240\n320\n3\n{7 + i} 0.8 40 30 200 180\n"
                           "5 0.1 100 60 300 220\n3 0.45 10 10 120 90\n")
        with open(f"examples/finetune_pascal_detection/window_file_2007_{split}.txt", "w") as f:
            f.write("".join(records))
    param = read_net_param(src)
    assert [l.type for l in param.layer[:2]] == ["WindowData"] * 2
    for layer in param.layer[:2]:
        layer.window_data_param.batch_size = 4
    given = {"data": [(4, 3, 227, 227), (4,)]}
    train = caffe.Net(param, caffe.TRAIN)
    blobs, params = check_shapes(train, param, caffe.TRAIN, given=given)
    assert blobs["pool5"] == (4, 256, 6, 6) and params["fc8_pascal"] == [(21, 4096), (21,)]
    specs = dict(zip(train.layer_names, train.param_specs))
    assert [(p.lr_mult, p.decay_mult) for p in specs["fc8_pascal"]] == [(10, 1), (20, 0)]
    train.forward()
    np.testing.assert_array_equal(train.blobs["label"].data[:3], 0)     # background first
    assert train.blobs["label"].data[3] in (7, 8)
    assert np.isfinite(train.blobs["(automatic)"].data).all()
    train.backward()
    assert np.abs(train.params["conv1"][0].diff).max() > 0
    test = caffe.Net(param, caffe.TEST)
    check_shapes(test, param, caffe.TEST, given=given)
    out = test.forward()
    assert 0 <= out["accuracy"] <= 1


# ------------------------------------------------ coco_caption's LRCN train net (stages)
def lrcn_layout(root, rng, streams, steps=20):
    """Per split: an image list (one image per stream) and an HDF5 chunk of sentences,
    (steps, streams) each, padded with -1 targets after each sentence's end."""
    import h5py
    from PIL import Image
    for split in ("train", "val"):
        d = root / "examples/coco_caption/h5_data/buffer_100" / f"{split}_aligned_20_batches"
        os.makedirs(d)
        lines = []
        for i in range(streams):
            Image.fromarray(rng.integers(0, 256, (260, 300, 3), dtype=np.uint8)).save(d / f"{i}.png")
            lines.append(f"{d / f'{i}.png'} 0\n")
        (d / "image_list.with_dummy_labels.txt").write_text("".join(lines))
        words = rng.integers(1, 8801, (steps, streams)).astype(np.float32)
        cont = np.ones((steps, streams), np.float32)
        cont[0] = 0                                         # every stream starts a sentence
        target = np.concatenate([words[1:], np.zeros((1, streams), np.float32)])
        target[steps - 5:, 0] = -1                          # stream 0's sentence ended
        with h5py.File(d / "chunk0.h5", "w") as f:
            f["cont_sentence"], f["input_sentence"], f["target_sentence"] = cont, words, target
        (d / "hdf5_chunk_list.txt").write_text(f"{d / 'chunk0.h5'}\n")


def test_lrcn_caffenet_to_lstm_by_stage(tmp_path, monkeypatch):
    """examples/coco_caption/lrcn.prototxt: CaffeNet into one or two LSTMs over 20 time
    steps of 100 streams, each layer chosen by NetState stages: "freeze-convnet" picks
    CaffeNet layers with lr_mult 0 and no fillers (Caffe's default constant 0),
    "factored"/"unfactored" where the image enters (the LSTM's static input), and
    "2-layer" (an include rule with two stages needs both: the unfactored lstm2 is out).
    The loss is SoftmaxWithLoss over axis 2 with ignore_label -1 and loss_weight 20.
    Run with 2 streams, factored, two layers, the CaffeNet frozen."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    lrcn_layout(tmp_path, rng, streams=2)
    param = read_net_param(zoo("caffe_examples", "lrcn.prototxt"))
    for layer in param.layer:
        if layer.type == "ImageData":
            layer.image_data_param.batch_size = 2          # the stand-in's 2 streams
    given = {("data", "ImageData"): [(2, 3, 227, 227), (2,)],
             ("data", "HDF5Data"): [(20, 2)] * 3}

    factored = ["freeze-convnet", "factored", "2-layer"]
    net = caffe.Net(param, caffe.TRAIN, stages=factored)
    blobs, params = check_shapes(net, param, caffe.TRAIN, given=given, stages=factored)
    assert blobs["fc8"] == (2, 1000) and blobs["lstm2"] == (20, 2, 1000)
    assert blobs["predict"] == (20, 2, 8801) and blobs["cross_entropy_loss"] == ()
    assert params["lstm1"] == [(4000, 1000), (4000,), (4000, 1000)]             # no static
    assert params["lstm2"] == [(4000, 1000), (4000,), (4000, 1000), (4000, 1000)]
    assert net.bottom_names["predict"] == ["lstm2"] and "silence" in net.layer_dict
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [p.lr_mult for p in specs["conv1"]] == [0, 0]
    assert not np.any(net.params["conv1"][0].data)       # the frozen copy names no filler
    frozen = [n for n, ps in zip(net.layer_names, net.param_specs) if ps and ps[0].lr_mult == 0]
    assert frozen == ["conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7"]
    for name in frozen:                                   # weights ~ N(0, 1/fan_in), float32
        w = net.params[name][0].data
        w[...] = rng.standard_normal(w.shape, dtype=np.float32) / np.sqrt(w[0].size)
    net.forward()
    net.backward()
    predict = net.blobs["predict"].data.astype(np.float64)
    target = net.blobs["target_sentence"].data
    assert (target == -1).sum() == 5
    logp = predict - predict.max(2, keepdims=True)
    logp -= np.log(np.exp(logp).sum(2, keepdims=True))
    keep = target != -1
    picked = np.take_along_axis(logp, np.where(keep, target, 0).astype(int)[..., None], 2)[..., 0]
    expected = -picked[keep].sum() / keep.sum()          # VALID normalization
    np.testing.assert_allclose(net.blobs["cross_entropy_loss"].data, expected, rtol=1e-5)
    assert not np.any(net.params["conv1"][0].diff)       # lr_mult 0: no gradient
    assert np.abs(net.params["lstm2"][2].diff).max() > 0  # the static input's weights

    test_stages = ["test-on-val", "freeze-convnet", "factored", "2-layer"]
    test = caffe.Net(param, caffe.TEST, stages=test_stages)
    check_shapes(test, param, caffe.TEST, given=given, stages=test_stages)
    out = test.forward()
    predicted = test.blobs["predict"].data.argmax(2)
    target = test.blobs["target_sentence"].data
    keep = target != -1
    np.testing.assert_allclose(out["accuracy"], (predicted == target)[keep].mean(), rtol=1e-6)


# --------------------------------------------- LeNet (V1) with the Adam and RMSProp solvers
def lenet_gradients(net):
    """Every param's gradient on the (only) training batch, at the current weights."""
    net.clear_param_diffs()
    net.forward()
    net.backward()
    return {k: [p.diff.astype(np.float64) for p in ps] for k, ps in net.params.items()}


@pytest.mark.parametrize("solver_file", ["lenet_solver_adam.prototxt",
                                         "lenet_solver_rmsprop.prototxt"])
def test_lenet_v1_with_adam_and_rmsprop_solvers(solver_file, tmp_path, monkeypatch):
    """examples/mnist: the 2014 V1 lenet_train_test.prototxt (``blobs_lr`` 1 and 2, no
    ``weight_decay``: decay_mult 1) under lenet_solver_adam.prototxt (``solver_type: ADAM``,
    momentum2 0.999, lr_policy fixed) and lenet_solver_rmsprop.prototxt (``type:
    "RMSProp"``, rms_decay 0.98, lr_policy inv, weight_decay 5e-4).  The train LMDB holds
    one batch of 64, so each step's gradient can be taken first; two steps must move every
    param as AdamSolver / RMSPropSolver::ComputeUpdateValue do, after L2 regularization."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    os.makedirs("examples/mnist")
    write_lmdb("examples/mnist/mnist_train_lmdb", 64, (1, 28, 28), rng)
    write_lmdb("examples/mnist/mnist_test_lmdb", 10, (1, 28, 28), rng)
    shutil.copy(zoo("mnist", "lenet_train_test_v1.prototxt"),
                "examples/mnist/lenet_train_test.prototxt")
    shutil.copy(zoo("mnist", solver_file), "solver.prototxt")
    solver = caffe.get_solver("solver.prototxt")
    p = solver.param
    train = solver.net
    check_shapes(train, "examples/mnist/lenet_train_test.prototxt", caffe.TRAIN,
                 given={"mnist": [(64, 1, 28, 28), (64,)]})
    specs = dict(zip(train.layer_names, train.param_specs))
    assert [(s.lr_mult, s.decay_mult) for s in specs["ip1"]] == [(1, 1), (2, 1)]
    adam = solver_file == "lenet_solver_adam.prototxt"
    assert p.type == ("Adam" if adam else "RMSProp")
    p.test_initialization = False                      # 100 test batches otherwise

    state = {k: [np.zeros(b.data.shape) for b in ps] for k, ps in train.params.items()}
    second = {k: [np.zeros(b.data.shape) for b in ps] for k, ps in train.params.items()}
    for it in range(2):
        grads = lenet_gradients(train)
        old = {k: [b.data.astype(np.float64) for b in ps] for k, ps in train.params.items()}
        solver.step(1)
        if adam:                                       # fixed rate, no weight decay
            rate = p.base_lr
            correction = np.sqrt(1 - np.float32(p.momentum2) ** (it + 1)) / (
                1 - np.float32(p.momentum) ** (it + 1))
        else:                                          # inv: base (1 + gamma it)^-power
            rate = p.base_lr * (1 + p.gamma * it) ** -p.power
        for name, blobs in train.params.items():
            for i, b in enumerate(blobs):
                lr = (1, 2)[i]
                g = grads[name][i] + p.weight_decay * old[name][i]       # decay_mult 1
                if adam:
                    m, v = state[name][i], second[name][i]
                    m[...] = p.momentum * m + (1 - p.momentum) * g
                    v[...] = p.momentum2 * v + (1 - p.momentum2) * g * g
                    update = rate * lr * correction * m / (np.sqrt(v) + p.delta)
                else:
                    h = state[name][i]
                    h[...] = p.rms_decay * h + (1 - p.rms_decay) * g * g
                    update = rate * lr * g / (np.sqrt(h) + p.delta)
                # atol: where g is near 0, float32's g + decay * w differs from this float64
                np.testing.assert_allclose(b.diff, update, rtol=2e-4, atol=1e-4 * rate,
                                           err_msg=f"{name}[{i}] step {it}")
                np.testing.assert_allclose(b.data, old[name][i] - b.diff, rtol=1e-6, atol=1e-9)
    assert solver.iter == 2


# ------------------------------- the MNIST autoencoder with the Nesterov and AdaGrad solvers
@pytest.mark.parametrize("solver_file", ["mnist_autoencoder_solver_nesterov.prototxt",
                                         "mnist_autoencoder_solver_adagrad.prototxt"])
def test_mnist_autoencoder_with_nesterov_and_adagrad_solvers(solver_file, tmp_path, monkeypatch):
    """examples/mnist/mnist_autoencoder.prototxt (sparse gaussian fillers, Sigmoid, a
    SigmoidCrossEntropyLoss and an EuclideanLoss of loss_weight 0 sharing the layer name
    "loss") under its Nesterov (``solver_type: NESTEROV``, step policy) and AdaGrad solver
    files, whose two ``test_state`` stages choose the data layer of each test net.  Two
    steps must move every param as NesterovSolver / AdaGradSolver::ComputeUpdateValue do;
    the loss is Caffe's (SigmoidCrossEntropyLoss normalizes by the batch by default)."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    os.makedirs("examples/mnist")
    write_lmdb("examples/mnist/mnist_train_lmdb", 100, (1, 28, 28), rng)
    write_lmdb("examples/mnist/mnist_test_lmdb", 10, (1, 28, 28), rng)
    src = "examples/mnist/mnist_autoencoder.prototxt"
    shutil.copy(zoo("mnist", "mnist_autoencoder.prototxt"), src)
    shutil.copy(zoo("mnist", solver_file), "solver.prototxt")
    solver = caffe.get_solver("solver.prototxt")
    p, train = solver.param, solver.net
    nesterov = "nesterov" in solver_file
    assert p.type == ("Nesterov" if nesterov else "AdaGrad")
    assert list(p.test_iter) == [500, 100] and len(solver.test_nets) == 2
    for tn, stage, lmdb in zip(solver.test_nets, ("test-on-train", "test-on-test"),
                               ("mnist_train_lmdb", "mnist_test_lmdb")):
        assert tn.layers[0].param.data_param.source.endswith(lmdb)
        check_shapes(tn, src, caffe.TEST, given={"data": [(100, 1, 28, 28)]}, stages=[stage])
    blobs, params = check_shapes(train, src, caffe.TRAIN, given={"data": [(100, 1, 28, 28)]})
    assert blobs["flatdata"] == (100, 784) and params["decode1"] == [(784, 1000), (784,)]
    # GaussianFiller with sparse 15: each weight kept with probability 15 / num_output,
    # about 15 per input column: encode1 (1000, 784) about 784 * 15 = 11760 of 784000
    w = train.params["encode1"][0].data
    assert abs(np.count_nonzero(w) - 11760) < 600 and 0.9 < w[w != 0].std() < 1.1
    p.test_initialization = False                      # 500 + 100 test batches otherwise

    hist = {k: [np.zeros(b.data.shape) for b in ps] for k, ps in train.params.items()}
    for it in range(2):
        grads = lenet_gradients(train)
        x = train.blobs["decode1"].data.astype(np.float64)
        t = train.blobs["flatdata"].data.astype(np.float64)
        ce = -(x * (t - (x >= 0)) - np.log1p(np.exp(x - 2 * x * (x >= 0)))).sum() / 100
        np.testing.assert_allclose(train.blobs["cross_entropy_loss"].data, ce, rtol=1e-5)
        old = {k: [b.data.astype(np.float64) for b in ps] for k, ps in train.params.items()}
        solver.step(1)
        rate = p.base_lr                               # step policy, stepsize 10000: base_lr
        for name, blobs in train.params.items():
            for i, b in enumerate(blobs):
                g = grads[name][i] + p.weight_decay * (1, 0)[i] * old[name][i]  # decay_mult
                h = hist[name][i]
                if nesterov:
                    h_old = h.copy()
                    h[...] = p.momentum * h + rate * g
                    update = (1 + p.momentum) * h - p.momentum * h_old
                else:
                    h += g * g
                    update = rate * g / (np.sqrt(h) + p.delta)
                np.testing.assert_allclose(b.diff, update, rtol=2e-4, atol=1e-4 * rate,
                                           err_msg=f"{name}[{i}] step {it}")
                np.testing.assert_allclose(b.data, old[name][i] - b.diff, rtol=1e-6, atol=1e-9)
    out = solver.test_nets[1].forward()
    assert set(out) == {"cross_entropy_loss", "l2_error"}
