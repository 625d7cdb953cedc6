"""A fifth sweep of public prototxt files (tests/data/zoo5/README.md lists them): SqueezeNet,
MobileNet v1 and v2, FCN-8s and FCN-AlexNet, and HED.

As in tests/test_caffe_zoo3.py: each net is built in the phase its file is for, with small
stand-in data of the file's shape; every blob's and param's shape is checked against
Caffe's rules (``caffe_shapes`` in tests/zoo3_nets.py, written from Caffe's layer sources);
one forward (and on train nets one backward) runs.  The fully convolutional nets (FCN, HED)
take any input size, so they run on small images.  Each test also checks what Caffe's code
fixes exactly: fillers, param specs, Split naming, Crop offsets, loss normalisation, the
solver's first update.
"""
import os
import shutil
import sys

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.proto import caffe_pb2, parse_text, read_net_param

from test_caffe_zoo3 import check_shapes, randomize
from test_caffe_zoo4 import write_lmdb

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo5")


def zoo(*parts):
    return os.path.join(ZOO, *parts)


def fan_in(blob):
    """Caffe's fillers' fan_in: count / shape(0), i.e. (C_in / group) * kh * kw for a
    convolution weight (filler.hpp, XavierFiller and MSRAFiller)."""
    return blob.data.size // blob.data.shape[0]


def quick_randomize(net, seed, skip=(), only=None):
    """``randomize`` for nets with tens of millions of weights (FCN's fc6/fc7): float32
    draws, N(0, 1/fan_in) weights and N(0, 0.1) biases; layers in ``skip`` keep theirs,
    and with ``only`` only that layer is drawn."""
    rng = np.random.default_rng(seed)
    for name, blobs in net.params.items():
        if name in skip or only not in (None, name):
            continue
        w = blobs[0].data
        draws = rng.standard_normal(min(w.size, 1 << 20), dtype=np.float32)
        w[...] = np.resize(draws, w.shape) / np.float32(np.sqrt(fan_in(blobs[0])))  # repeats
        for b in blobs[1:]:
            b.data[...] = 0.1 * rng.standard_normal(b.data.shape, dtype=np.float32)


def softmax(x, axis=1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# --------------------------------------------------------------- SqueezeNet v1.0 train_val
def test_squeezenet_v10_train_val(tmp_path, monkeypatch):
    """DeepScale's SqueezeNet_v1.0/train_val.prototxt: Fire modules (squeeze 1x1, then
    expand 1x1 and 3x3 concatenated), conv10 with pad 1 on a 1x1 kernel (13 -> 15), global
    AVE pooling into SoftmaxWithLoss (TRAIN) and top-1/top-5 Accuracy (TEST).  Fresh
    weights follow the fillers (xavier: uniform within sqrt(3 / fan_in); conv10 gaussian
    std 0.01; biases 0).  One forward/backward at a batch of 2; conv10's bias gradient is
    the softmax gradient spread over the 15x15 average and masked by the in-place ReLU.
    The TEST net runs at a batch of 1."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    os.makedirs("examples/imagenet")
    write_lmdb("examples/imagenet/ilsvrc12_train_lmdb", 2, (3, 240, 236), rng)
    write_lmdb("examples/imagenet/ilsvrc12_val_lmdb", 2, (3, 227, 227), rng)
    src = zoo("squeezenet", "train_val_v1.0.prototxt")
    param = read_net_param(src)
    assert [(l.data_param.batch_size, l.data_param.backend) for l in param.layer[:2]] == \
        [(32, caffe_pb2.DataParameter.LMDB), (25, caffe_pb2.DataParameter.LMDB)]
    for layer in param.layer[:2]:
        layer.data_param.batch_size = 2
        layer.data_param.prefetch = 0

    net = caffe.Net(param, caffe.TRAIN)
    blobs, params = check_shapes(net, param, caffe.TRAIN, given={"data": [(2, 3, 227, 227),
                                                                        (2,)]})
    assert blobs["conv1"] == (2, 96, 111, 111) and blobs["pool1"] == (2, 96, 55, 55)
    assert blobs["pool4"] == (2, 256, 27, 27) and blobs["pool8"] == (2, 512, 13, 13)
    assert blobs["fire9/concat"] == (2, 512, 13, 13) and blobs["conv10"] == (2, 1000, 15, 15)
    assert blobs["pool10"] == (2, 1000, 1, 1) and blobs["loss"] == ()
    assert params["fire2/expand3x3"] == [(64, 16, 3, 3), (64,)]
    n_params = sum(int(np.prod(s)) for ps in params.values() for s in ps)
    assert n_params == 1_248_424                          # SqueezeNet v1.0's 1.25 M weights
    assert net.outputs == ["loss"]

    # fillers
    for name, ps in net.params.items():
        w, b = ps
        assert not np.any(b.data), name
        if name == "conv10":
            assert abs(w.data.std() - 0.01) < 2e-4 and abs(w.data.mean()) < 1e-4
        else:
            bound = np.sqrt(np.float32(3) / np.float32(fan_in(w)))
            assert np.abs(w.data).max() <= bound * (1 + 1e-6), name
            assert np.abs(w.data).max() > 0.9 * bound, name

    randomize(net, seed=1)
    net.clear_param_diffs()
    net.forward()
    net.backward()
    loss = float(net.blobs["loss"].data)
    logits = net.blobs["pool10"].data.reshape(2, 1000).astype(np.float64)
    label = net.blobs["label"].data.astype(int)
    p = softmax(logits)
    np.testing.assert_allclose(loss, -np.log(p[[0, 1], label]).mean(), rtol=1e-5)
    g = p.copy()
    g[[0, 1], label] -= 1
    g /= 2
    np.testing.assert_allclose(net.blobs["pool10"].diff.reshape(2, 1000), g, rtol=1e-4,
                               atol=1e-9)
    mask = net.blobs["conv10"].data > 0                  # in place: the ReLU's output
    expect = (mask * g[:, :, None, None] / 225).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(net.params["conv10"][1].diff, expect, rtol=1e-4, atol=1e-9)
    assert np.abs(net.params["conv1"][0].diff).max() > 0
    assert not np.any(net.blobs["data"].diff)            # nothing below the data needs one

    param.layer[1].data_param.batch_size = 1
    test = caffe.Net(param, caffe.TEST)
    blobs, _ = check_shapes(test, param, caffe.TEST, given={"data": [(1, 3, 227, 227), (1,)]})
    assert test.outputs == ["accuracy", "accuracy_top5"]
    assert test.layer_dict["accuracy_top5"].param.accuracy_param.top_k == 5
    randomize(test, seed=1)
    out = test.forward()
    scores = test.blobs["pool10"].data.reshape(1000)
    label = int(test.blobs["label"].data[0])
    # Caffe's Accuracy: a hit when fewer than top_k scores are >= the true class's
    ranks = (scores >= scores[label]).sum()
    assert (out["accuracy"], out["accuracy_top5"]) == (ranks <= 1, ranks <= 5)


# ----------------------------------------------------------------------- MobileNet v1, v2
def test_mobilenet_v1_deploy(tmp_path):
    """shicai/MobileNet-Caffe mobilenet_deploy.prototxt: depthwise convolutions as group =
    channels (weights (C, 1, 3, 3)), BatchNorm out of place then Scale and ReLU in place,
    three lr_mult 0 ParamSpecs on every BatchNorm, legacy ``input_dim``.  Fresh weights:
    msra (gaussian std sqrt(2 / fan_in), fan_in counting C_in / group), Scale's filler
    ``{ value: 1 }`` (type constant by default) and bias 0.  A forward at 224 and, since
    the net ends in global pooling, at 96; in TEST BatchNorm uses the stored statistics."""
    path = zoo("mobilenet", "mobilenet_deploy.prototxt")
    net = caffe.Net(path, caffe.TEST)
    blobs, params = check_shapes(net, path, caffe.TEST)
    assert blobs["conv1/bn"] == (1, 32, 112, 112) and blobs["conv6/sep/bn"] == (1, 1024, 7, 7)
    assert blobs["fc7"] == (1, 1000, 1, 1) and net.outputs == ["fc7"]
    assert params["conv2_1/dw"] == [(32, 1, 3, 3)] and params["conv6/dw"] == [(1024, 1, 3, 3)]
    assert params["conv1/bn"] == [(32,), (32,), (1,)] and params["fc7"] == [(1000, 1024, 1, 1),
                                                                           (1000,)]
    learned = sum(int(np.prod(s)) for n, ps in params.items() for s in ps
                  if net.layer_dict[n].type != "BatchNorm")
    assert learned == 4_231_976                 # 1.0 MobileNet-224's 4.2 M (BN's affine in Scale)
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [(p.lr_mult, p.decay_mult) for p in specs["conv5_1/dw/bn"]] == [(0, 0)] * 3
    bn, sc = net.layer_dict["conv5_1/dw/bn"], net.layer_dict["conv5_1/dw/scale"]
    assert net.bottom_names["conv5_1/dw/bn"] == ["conv5_1/dw"]
    assert net.top_names["conv5_1/dw/scale"] == net.bottom_names["conv5_1/dw/scale"]
    assert all(not np.any(b.data) for b in bn.blobs)
    np.testing.assert_array_equal(sc.blobs[0].data, 1)
    np.testing.assert_array_equal(sc.blobs[1].data, 0)
    for name, tol in (("conv6/sep", 2e-3), ("conv6/dw", 2e-2)):
        w = net.params[name][0]
        np.testing.assert_allclose(w.data.std(), np.sqrt(2 / fan_in(w)), rtol=tol)

    randomize(net)
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    out = net.forward(data=x)["fc7"].copy()
    assert np.isfinite(out).all()
    # conv2_1/dw by hand: channel c sees only input channel c
    a = net.blobs["conv1/bn"].data[0].astype(np.float64)
    w = net.params["conv2_1/dw"][0].data[:, 0].astype(np.float64)
    ap = np.pad(a, ((0, 0), (1, 1), (1, 1)))
    dw = sum(ap[:, i:i + 112, j:j + 112] * w[:, i, j, None, None] for i in range(3)
             for j in range(3))
    np.testing.assert_allclose(net.blobs["conv2_1/dw"].data[0], dw, rtol=1e-4, atol=1e-4)
    # BatchNorm in TEST: (x - mean / s) / sqrt(var / s + eps), s the third blob
    m, v, s = (b.data.astype(np.float64) for b in bn.blobs)
    xin = net.blobs["conv5_1/dw"].data.astype(np.float64)
    gamma, beta = (b.data.astype(np.float64) for b in sc.blobs)
    y = (xin - (m / s)[:, None, None]) / np.sqrt(v / s + 1e-5)[:, None, None]
    y = np.maximum(y * gamma[:, None, None] + beta[:, None, None], 0)
    np.testing.assert_allclose(net.blobs["conv5_1/dw/bn"].data, y, rtol=1e-4, atol=1e-5)

    net.blobs["data"].reshape(2, 3, 96, 96)
    net.reshape()
    assert net.blobs["conv6/sep/bn"].data.shape == (2, 1024, 3, 3)
    assert net.forward()["fc7"].shape == (2, 1000, 1, 1)


def test_mobilenet_v2_deploy():
    """shicai/MobileNet-Caffe mobilenet_v2_deploy.prototxt: inverted residuals (1x1 expand,
    3x3 depthwise, linear 1x1 projection without ReLU) with Eltwise SUM shortcuts (the
    default operation) where stride is 1 and the width is kept; ``batch_norm_param {
    use_global_stats: true eps: 1e-5 }``; Scale with two lr_mult 1 ParamSpecs and no
    filler (Caffe's defaults: scale 1, bias 0); the last line has no newline."""
    path = zoo("mobilenet", "mobilenet_v2_deploy.prototxt")
    with open(path) as f:
        assert f.read()[-2:] == "\n}"
    net = caffe.Net(path, caffe.TEST)
    blobs, params = check_shapes(net, path, caffe.TEST)
    assert blobs["conv2_1/linear/bn"] == (1, 16, 112, 112)
    assert blobs["block_3_1"] == (1, 24, 56, 56) and blobs["block_6_2"] == (1, 160, 7, 7)
    assert blobs["conv6_4/bn"] == (1, 1280, 7, 7) and blobs["prob"] == (1, 1000, 1, 1)
    eltwise = [n for n, l in zip(net.layer_names, net.layers) if l.type == "Eltwise"]
    assert len(eltwise) == 10
    n_params = sum(int(np.prod(s)) for n, ps in params.items() for s in ps
                   if net.layer_dict[n].type != "BatchNorm")
    # MobileNetV2 1.0-224's 3,504,872 learned weights, plus this file's 1x1 conv2_1/expand
    # (32 x 32 and its Scale) where the paper's first block (expansion 1) has none
    assert n_params == 3_504_872 + 32 * 32 + 2 * 32
    sc = net.layer_dict["block_3_1"]
    assert sc.param.eltwise_param.operation == caffe_pb2.EltwiseParameter.SUM
    np.testing.assert_array_equal(net.params["conv3_1/linear/scale"][0].data, 1)
    np.testing.assert_array_equal(net.params["conv3_1/linear/scale"][1].data, 0)
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [(p.lr_mult, p.decay_mult) for p in specs["conv3_1/linear/scale"]] == [(1, 0)] * 2
    assert net.layer_dict["conv1/bn"].param.batch_norm_param.eps == np.float32(1e-5)

    randomize(net)
    rng = np.random.default_rng(4)
    net.blobs["data"].reshape(1, 3, 64, 64)
    net.reshape()
    x = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)
    prob = net.forward(data=x)["prob"]
    np.testing.assert_allclose(prob.sum(axis=1), 1, rtol=1e-5)
    np.testing.assert_allclose(net.blobs["block_4_2"].data,
                               net.blobs["block_4_1"].data + net.blobs["conv4_2/linear/bn"].data,
                               rtol=1e-6, atol=1e-6)
    assert net.blobs["conv4_2/linear/bn"].data.min() < 0          # linear: no ReLU


# ------------------------------------------------------------------------------ FCN-8s
def bilinear(k):
    """FCN's surgery.upsample_filt: a k x k bilinear kernel."""
    factor = (k + 1) // 2
    center = factor - 1 if k % 2 == 1 else factor - 0.5
    og = np.ogrid[:k, :k]
    return (1 - abs(og[0] - center) / factor) * (1 - abs(og[1] - center) / factor)


def test_fcn8s_deploy_any_size():
    """shelhamer/fcn.berkeleyvision.org voc-fcn8s/deploy.prototxt: VGG-16 with pad 100 on
    conv1_1, fc6/fc7 as convolutions, three Deconvolution upsamplings (lr_mult 0, no bias,
    no filler: weights 0 until FCN's surgery sets bilinear kernels) and three Crop layers
    with fixed offsets (5, 9, 31) fused by Eltwise SUM (Caffe's Crop takes
    bottom[0][..., o:o+h, o:o+w] from axis 2 on).  Shapes at the file's 500x500; the FCN
    head runs from score_fr on random pool3/pool4/fc7 (below them is a plain VGG-16 trunk,
    which pad 100 makes too slow for this suite even on a tiny image)."""
    path = zoo("fcn", "voc-fcn8s_deploy.prototxt")
    net = caffe.Net(path, caffe.TEST)
    blobs, params = check_shapes(net, path, caffe.TEST)
    assert blobs["conv1_1"] == (1, 64, 698, 698) and blobs["pool5"] == (1, 512, 22, 22)
    assert blobs["fc6"] == (1, 4096, 16, 16) and blobs["upscore2"] == (1, 21, 34, 34)
    assert blobs["score_pool4c"] == (1, 21, 34, 34) and blobs["upscore_pool4"] == (1, 21, 70, 70)
    assert blobs["upscore8"] == (1, 21, 568, 568) and blobs["score"] == (1, 21, 500, 500)
    assert params["upscore2"] == [(21, 21, 4, 4)] and params["upscore8"] == [(21, 21, 16, 16)]

    assert not any(np.any(b.data) for n in ("upscore2", "upscore_pool4", "upscore8")
                   for b in net.params[n])
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [p.lr_mult for p in specs["upscore8"]] == [0]
    for name in ("score_fr", "score_pool4", "score_pool3"):
        quick_randomize(net, 5, only=name)
    for name in ("upscore2", "upscore_pool4", "upscore8"):
        w = net.params[name][0].data
        w[range(21), range(21)] = bilinear(w.shape[-1])                # surgery.interp
    rng = np.random.default_rng(5)
    b = net.blobs
    for name in {*net.bottom_names["score_fr"], *net.bottom_names["score_pool4"],
                 *net.bottom_names["score_pool3"], *net.bottom_names["score"]}:
        b[name].data[...] = rng.standard_normal(b[name].data.shape)
    score = net.forward(start="score_fr")["score"]
    assert score.shape == (1, 21, 500, 500) and np.isfinite(score).all()
    for crop, src, off in (("score_pool4c", "score_pool4", 5), ("score_pool3c", "score_pool3", 9),
                           ("score", "upscore8", 31)):
        h, w = b[crop].data.shape[2:]
        np.testing.assert_array_equal(b[crop].data, b[src].data[:, :, off:off + h, off:off + w])
    np.testing.assert_allclose(b["fuse_pool4"].data, b["upscore2"].data + b["score_pool4c"].data,
                               rtol=1e-6, atol=1e-6)
    # Deconvolution = col2im of W^T x: stride 2, kernel 4, per-class bilinear kernels
    s = b["score_fr"].data[0].astype(np.float64)
    up = np.zeros((21, 2 * (s.shape[1] - 1) + 4, 2 * (s.shape[2] - 1) + 4))
    f = bilinear(4)
    for i in range(s.shape[1]):
        for j in range(s.shape[2]):
            up[:, 2 * i:2 * i + 4, 2 * j:2 * j + 4] += s[:, i, j, None, None] * f
    np.testing.assert_allclose(b["upscore2"].data[0], up, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ FCN-AlexNet train/val
LAYERS_PY = '''
"""A stand-in for FCN's layers.py data layers: the same names, param_str and tops
(data (1, 3, H, W), label (1, 1, H, W) with VOC's 255 'void'), random images."""
import numpy as np
import caffe


class _SegData(caffe.Layer):
    keys = ()

    def setup(self, bottom, top):
        params = eval(self.param_str)          # as FCN's layers do
        assert set(params) == set(self.keys) | {"seed", "split", "mean"}, params
        self.mean = np.array(params["mean"])
        self.rng = np.random.RandomState(params["seed"])
        if len(top) != 2:
            raise Exception("Need to define two tops: data and label.")
        if len(bottom) != 0:
            raise Exception("Do not define a bottom.")

    def reshape(self, bottom, top):
        img = self.rng.randint(0, 256, (3, H, W)).astype(np.float32)
        self.data = img - self.mean[:, None, None]
        self.label = self.rng.randint(0, 21, (1, H, W)).astype(np.float32)
        self.label[0, :3] = 255
        top[0].reshape(1, *self.data.shape)
        top[1].reshape(1, *self.label.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.data
        top[1].data[...] = self.label

    def backward(self, top, propagate_down, bottom):
        pass


class SBDDSegDataLayer(_SegData):
    keys = ("sbdd_dir",)


class VOCSegDataLayer(_SegData):
    keys = ("voc_dir",)
'''


@pytest.fixture
def fcn_layers(tmp_path, monkeypatch):
    """FCN's ``layers`` module on sys.path (tests/ has a ``layers`` folder: put this first
    and forget any module of that name already imported)."""
    (tmp_path / "layers.py").write_text("H, W = 36, 44\n" + LAYERS_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "layers", raising=False)
    monkeypatch.chdir(tmp_path)
    for name in ("train", "val", "solver"):
        shutil.copy(zoo("fcn", f"voc-fcn-alexnet_{name}.prototxt"), f"{name}.prototxt")
    yield tmp_path
    sys.modules.pop("layers", None)


def test_fcn_alexnet_train_val_and_solver(fcn_layers):
    """voc-fcn-alexnet: train.prototxt, val.prototxt and solver.prototxt.  The nets: a Python
    data layer whose param_str uses ``\\'`` escapes, CaffeNet's group-2 convolutions, pad
    100, a 63x63 stride-32 Deconvolution and a Crop at offset 18, and SoftmaxWithLoss with
    ``ignore_label: 255`` and the legacy ``normalize: false``, which Caffe maps to
    BATCH_SIZE normalisation: the loss is the sum over non-ignored pixels divided by N = 1,
    not by their count.  The lr_mult 0 Deconvolution gets no weight gradient but passes
    one down.  The solver: net paths relative to the working directory,
    ``test_initialization: false``, lr_policy fixed, momentum 0.9, ``iter_size: 20``.  On
    the first step Caffe sums the passes' gradients (what on_gradients_ready sees),
    divides by iter_size, adds weight decay (decay_mult 0 on score_fr's bias) and, the
    history being zero, leaves base_lr * lr_mult * that in each diff (run with iter_size
    2: FCN-AlexNet's pad 100 makes each pass slow here)."""
    solver = caffe.get_solver("solver.prototxt")
    p = solver.param
    assert (p.iter_size, p.lr_policy, p.test_initialization) == (20, "fixed", False)
    (test,) = solver.test_nets
    assert test.phase == caffe.TEST and test.layer_dict["data"].param.python_param.layer == \
        "VOCSegDataLayer"
    given = {"data": [(1, 3, 36, 44), (1, 1, 36, 44)]}
    check_shapes(test, "val.prototxt", caffe.TEST, given=given)

    net = solver.net
    pp = net.layer_dict["data"].param.python_param
    assert pp.param_str.startswith("{'sbdd_dir': '../../data/sbdd/dataset', 'seed': 1337")
    blobs, params = check_shapes(net, "train.prototxt", caffe.TRAIN, given=given)
    # 36 + 200 -> conv1 (236 - 11) // 4 + 1 = 57 -> 28 -> 28 -> 14 -> 14 -> 7 -> fc6 2;
    # 44 -> 59 -> 29 -> 14 -> 7 -> 2; upscore 32 (2 - 1) + 63 = 95
    assert blobs["conv1"] == (1, 96, 57, 59) and blobs["pool5"] == (1, 256, 7, 7)
    assert blobs["fc6"] == (1, 4096, 2, 2) and blobs["upscore"] == (1, 21, 95, 95)
    assert blobs["score"] == (1, 21, 36, 44) and blobs["loss"] == ()
    assert params["conv2"] == [(256, 48, 5, 5), (256,)] and params["upscore"] == [(21, 21, 63, 63)]
    assert params["conv4"] == [(384, 192, 3, 3), (384,)]
    lp = net.layer_dict["loss"].param.loss_param
    assert (lp.ignore_label, lp.normalize, lp.HasField("normalization")) == (255, False, False)

    quick_randomize(net, 2, skip=("upscore",))
    net.params["upscore"][0].data[range(21), range(21)] = bilinear(63)
    p.iter_size = 2
    learned = ("score_fr", "conv3", "conv1", "upscore")
    before = {k: [b.data.copy() for b in net.params[k]] for k in learned}
    seen, passes = {}, []
    net.after_backward(lambda i: passes.append(i) if i == 0 else None)

    def on_gradients_ready():       # the last pass's blobs, the two passes' summed gradients
        seen.update({k: net.blobs[k].data.copy() for k in ("score", "label", "loss")})
        seen.update({k + "'": net.blobs[k].diff.copy() for k in ("score", "upscore",
                                                                  "score_fr", "label")})
        seen.update({k: [b.diff.copy() for b in net.params[k]] for k in learned})
    solver.add_callback(lambda: None, on_gradients_ready)
    solver.step(1)
    assert len(passes) == 2 and solver.iter == 1

    score, label = seen["score"][0].astype(np.float64), seen["label"][0, 0].astype(int)
    valid = label != 255
    assert (~valid).sum() == 3 * 44
    logp = np.log(softmax(score, axis=0))
    at = (label[valid], *np.nonzero(valid))
    np.testing.assert_allclose(float(seen["loss"]), -logp[at].sum(), rtol=1e-5)
    # d loss / d score: (p - onehot) on valid pixels, 0 on ignored ones, divided by N = 1
    g = np.exp(logp)
    g[at] -= 1
    g[:, ~valid] = 0
    np.testing.assert_allclose(seen["score'"][0], g, rtol=1e-4, atol=1e-6)
    up_diff = seen["upscore'"][0]
    np.testing.assert_array_equal(up_diff[:, 18:18 + 36, 18:18 + 44], seen["score'"][0])
    assert not np.any(up_diff[:, :18]) and not np.any(up_diff[:, 18 + 36:])
    assert np.abs(seen["score_fr'"]).max() > 0 and not np.any(seen["label'"])
    assert np.abs(seen["conv1"][0]).max() > 0
    assert not np.any(seen["upscore"][0])                          # lr_mult 0: no gradient
    for name, mults in (("score_fr", ((1, 1), (2, 0))), ("conv3", ((1, 1), (1, 1)))):
        for blob, old, g, (lr, decay) in zip(net.params[name], before[name], seen[name], mults):
            expect = 1e-4 * lr * (g / 2 + 0.0005 * decay * old)
            np.testing.assert_allclose(blob.diff, expect, rtol=1e-4, atol=1e-12, err_msg=name)
            np.testing.assert_allclose(blob.data, old - blob.diff, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(net.params["upscore"][0].data, before["upscore"][0])


# ------------------------------------------------------------------------------- HED
def test_hed_deploy(tmp_path):
    """s9xie/hed examples/hed/deploy.prototxt: single-quoted strings, ``top:"x"`` without a
    space, ``concat_param { concat_dim: 1 }``, five layers all named 'crop' (Caffe keeps
    duplicate layer names; pycaffe's layer_dict keeps the last), Crop layers without
    crop_param (BVLC's defaults: axis 2, offset 0, so each side output is cut from its
    top-left corner; HED's own fork aligned them), Deconvolutions with biases at lr_mult 0
    and no fillers, and a constant 0.2 filler on the fusing 1x1 convolution.  Shapes at
    the file's 500x500 (the next test runs it at 37x45)."""
    path = zoo("hed", "deploy.prototxt")
    net = caffe.Net(path, caffe.TEST)
    blobs, params = check_shapes(net, path, caffe.TEST)
    assert blobs["conv1_1"] == (1, 64, 568, 568) and blobs["score-dsn1-up"] == (1, 1, 568, 568)
    assert blobs["score-dsn5-up"] == (1, 1, 592, 592) and blobs["concat-upscore"] == (1, 5, 500,
                                                                                      500)
    assert params["upsample_16"] == [(1, 1, 32, 32), (1,)]
    assert net.outputs == ["sigmoid-dsn1", "sigmoid-dsn2", "sigmoid-dsn3", "sigmoid-dsn4",
                           "sigmoid-dsn5", "sigmoid-fuse"]
    crops = [i for i, n in enumerate(net.layer_names) if n == "crop"]
    assert len(crops) == 5 and len(net.layer_dict) == len(net.layer_names) - 4
    assert net.layer_dict["crop"] is net.layers[crops[-1]]
    assert net.bottom_names["crop"][0] == "score-dsn5-up"     # by name: the last one
    # Caffe's split names: blob, producing layer, top index (SplitLayerName)
    assert "data_input_0_split" in net.layer_names and "upscore-dsn3_crop_0_split" in \
        net.layer_names
    assert len(net.top_names["data_input_0_split"]) == 6
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [(p.lr_mult, p.decay_mult) for p in specs["upsample_8"]] == [(0, 1), (0, 0)]
    assert [p.lr_mult for p in specs["score-dsn3"]] == [np.float32(0.01), np.float32(0.02)]
    assert [p.lr_mult for p in specs["conv5_1"]] == [100, 200]
    np.testing.assert_array_equal(net.params["new-score-weighting"][0].data, np.float32(0.2))
    assert not any(np.any(b.data) for b in net.params["upsample_4"])


def test_hed_force_backward_trains_lr_mult_0_params():
    """HED's deploy with ``force_backward: true`` (a deploy net has no loss), in TRAIN:
    Caffe's Net::Init then sets param_propagate_down on every param blob, so the lr_mult 0
    Deconvolution weights and biases get gradients too (without force_backward they get
    none: test_fcn_alexnet_train_val_and_solver).  Crop's backward fills bottom[0]'s diff
    inside the cropped window (zeros elsewhere) and never writes bottom[1]'s: the five
    split copies of 'data' that feed the crops keep a zero diff, so data's diff is
    conv1_1's alone.  The forward: each side output cut from the top-left corner, the
    fusing 1x1 convolution a weighted sum of the five."""
    param = read_net_param(zoo("hed", "deploy.prototxt"))
    assert param.layer[0].type == "Input"                   # upgraded from input_dim
    param.layer[0].input_param.shape[0].dim[2:] = [37, 45]
    param.force_backward = True
    net = caffe.Net(param, caffe.TRAIN)
    randomize(net, seed=3)
    x = np.random.default_rng(0).standard_normal((1, 3, 37, 45)).astype(np.float32)
    out = net.forward(data=x)
    assert all(v.shape == (1, 1, 37, 45) for v in out.values())
    b = net.blobs
    for i in range(1, 6):
        np.testing.assert_array_equal(b[f"upscore-dsn{i}"].data,
                                      b[f"score-dsn{i}-up"].data[:, :, :37, :45])
    fuse = net.params["new-score-weighting"]
    expect = np.einsum("c,nchw->nhw", fuse[0].data.reshape(5), b["concat-upscore"].data)
    np.testing.assert_allclose(b["upscore-fuse"].data[:, 0], expect + fuse[1].data[0],
                               rtol=1e-5, atol=1e-6)
    net.clear_param_diffs()
    rng = np.random.default_rng(1)
    net.backward(**{k: rng.standard_normal(net.blobs[k].data.shape).astype(np.float32)
                    for k in net.outputs})
    for name in ("upsample_2", "upsample_16"):
        assert all(np.abs(b.diff).max() > 0 for b in net.params[name]), name
    d = net.blobs["score-dsn1-up"].diff
    np.testing.assert_array_equal(d[:, :, :37, :45], net.blobs["upscore-dsn1"].diff)
    assert not np.any(d[:, :, 37:]) and not np.any(d[:, :, :, 45:])
    tops = net.top_names["data_input_0_split"]
    assert net.bottom_names["conv1_1"] == [tops[0]]
    assert all(not np.any(net.blobs[t].diff) for t in tops[1:])
    assert np.abs(net.blobs[tops[0]].diff).max() > 0
    np.testing.assert_array_equal(net.blobs["data"].diff, net.blobs[tops[0]].diff)


def test_shape_rules_clip_pooling_on_an_unpadded_axis():
    """The shape rules of tests/zoo3_nets.py, used by every sweep, against Caffe's
    PoolingLayer::Reshape: the last window that would start in the padding is dropped on
    both axes when either axis is padded.  With pad_h 0, pad_w 1, kernel 1x3, stride 3 on
    5x7, ceil gives 3 rows, and (3 - 1) * 3 >= 5 + 0 drops one: (2, 3), as minicaffe gives
    (the rules used to clip only a padded axis and said (3, 3))."""
    param = parse_text('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 '
                       'dim: 1 dim: 5 dim: 7 } } } layer { name: "p" type: "Pooling" bottom: '
                       '"x" top: "y" pooling_param { pool: MAX kernel_h: 1 kernel_w: 3 '
                       'stride: 3 pad_h: 0 pad_w: 1 } }', caffe_pb2.NetParameter)
    blobs, _ = check_shapes(caffe.Net(param, caffe.TEST), param, caffe.TEST)
    assert blobs["y"] == (1, 1, 2, 3)
