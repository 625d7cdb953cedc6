"""pycaffe as real scripts drive it, a second sweep (the first is test_pycaffe_usage.py).
Each test runs, on tiny nets and random data in CPU mode, the pycaffe calls of public
scripts written for BVLC Caffe (named in its docstring; the code here is our own), and
asserts what pycaffe does there, read from BVLC/caffe python/caffe/pycaffe.py, io.py and
_caffe.cpp: types, shapes, float32 blobs, ``.data`` views that write through to the
net, and values computed here independently with NumPy.
"""
import os

import numpy as np
import pytest
from google.protobuf import text_format

import minicaffe as caffe
from minicaffe.proto import caffe_pb2


from test_pycaffe_usage import workdir, write  # noqa: F401  (workdir: a fixture)


def softmax(z, axis):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def conv2d(x, w, b, pad):
    """Caffe's convolution (cross-correlation), stride 1: x (C, H, W), w (K, C, kh, kw)."""
    c, h, wd = x.shape
    k, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    ho, wo = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((k, ho, wo))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("kc,chw->khw", w[:, :, i, j], xp[:, i:i + ho, j:j + wo])
    return out + b[:, None, None]


def conv2d_input_grad(g, w, pad, in_hw):
    """d(conv2d)/dx applied to the top diff g (K, Ho, Wo): the transposed convolution."""
    k, c, kh, kw = w.shape
    h, wd = in_hw
    gx = np.zeros((c, h + 2 * pad, wd + 2 * pad))
    ho, wo = g.shape[1:]
    for i in range(kh):
        for j in range(kw):
            gx[:, i:i + ho, j:j + wo] += np.einsum("kc,khw->chw", w[:, :, i, j], g)
    return gx[:, pad:pad + h, pad:pad + wd]


# ------------------------------------------------------- Jacobians by forward_backward_all
BILINEAR = """name: "predictor" force_backward: true
input: "x" input_shape { dim: 2 dim: 3 }
input: "u" input_shape { dim: 2 dim: 2 }
layer { name: "xu" type: "Concat" bottom: "x" bottom: "u" top: "xu" }
layer { name: "fc" type: "InnerProduct" bottom: "xu" top: "y_pred"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 }
                        bias_filler { type: "gaussian" std: 1 } } }
"""


class NetPredictor(caffe.Net):
    """visual_dynamics' NetPredictor, in our words: a caffe.Net subclass whose
    ``__init__`` calls ``caffe.Net.__init__`` with the legacy positional phase."""

    def __init__(self, model_file):
        caffe.Net.__init__(self, model_file, caffe.TEST)
        assert len(self.outputs) == 1

    def predict(self, *inputs):
        return self.forward_all(**dict(zip(self.inputs, inputs)))[self.outputs[0]]

    def jacobian(self, wrt, *inputs):
        name = self.outputs[0]
        n = len(inputs[0])
        jacs = []
        for e in np.eye(self.blobs[name].shape[1]):
            _, diffs = self.forward_backward_all(
                **dict(zip(self.inputs + [name], inputs + (np.tile(e, (n, 1)),))))
            jacs.append(diffs[wrt])
        return np.asarray(jacs).swapaxes(0, 1)


def test_jacobian_of_a_two_input_predictor_by_forward_backward_all(workdir):
    """alexlee-gk/visual_dynamics predictor.py (NetPredictor.predict and .jacobian): a
    ``caffe.Net`` subclass, 2-d inputs (pycaffe's master forward checks only the batch
    size), ``forward_all`` over three samples with a net of batch two (a padded last
    batch), and the Jacobian of the output with respect to one input from
    ``forward_backward_all`` given the inputs and the output's diff (one-hot rows)."""
    net = NetPredictor(write("deploy.prototxt", BILINEAR))
    assert isinstance(net, caffe.Net)
    assert net.inputs == ["x", "u"] and net.outputs == ["y_pred"]
    w = net.params["fc"][0].data.astype(np.float64)
    b = net.params["fc"][1].data.astype(np.float64)
    rng = np.random.default_rng(0)
    x, u = rng.standard_normal((3, 3)), rng.standard_normal((3, 2))

    y = net.predict(x, u)
    assert y.shape == (3, 4) and y.dtype == np.float32
    np.testing.assert_allclose(y, np.hstack([x, u]) @ w.T + b, rtol=1e-5, atol=1e-5)

    jac = net.jacobian("u", x, u)
    assert jac.shape == (3, 4, 2)
    for n in range(3):          # y is linear in u: dy_i/du_j = W[i, 3 + j] for every sample
        np.testing.assert_allclose(jac[n], w[:, 3:], rtol=1e-6)
    jac_x = net.jacobian("x", x, u)
    np.testing.assert_allclose(jac_x[2], w[:, :3], rtol=1e-6)


# ------------------------------------------------------------ FGSM on a segmentation net
SEG = """name: "seg_adv" force_backward: true
input: "data" input_shape { dim: 1 dim: 3 dim: 5 dim: 5 }
input: "label" input_shape { dim: 1 dim: 1 dim: 5 dim: 5 }
layer { name: "score" type: "Convolution" bottom: "data" top: "output"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
                      weight_filler { type: "gaussian" std: 0.5 }
                      bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "output" bottom: "label" top: "loss" }
"""


def test_fgsm_and_iterative_fgsm_on_a_segmentation_net(workdir):
    """Anurag Arnab's attacks.py for "On the Robustness of Semantic Segmentation Models to
    Adversarial Attacks" (fgsm, IterativeFGSM; the index names no repository): the image
    written with ``blobs['data'].data[0,:,:,:] = np.squeeze(x)``, the prediction
    ``output.data[0].argmax(axis=0).astype(np.uint32)`` (H, W) broadcast into the label
    blob (1, 1, H, W), ``net.backward(diffs=['data'])`` (a dict of the inputs' and the
    named diffs), and the signed data gradient; checked against SoftmaxWithLoss's
    gradient (VALID normalisation over H*W pixels) carried back through the convolution."""
    net = caffe.Net(write("seg.prototxt", SEG), caffe.TEST)
    w = net.params["score"][0].data.astype(np.float64)
    b = net.params["score"][1].data.astype(np.float64)
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (1, 3, 5, 5))
    eps = 0.1

    net.blobs["data"].data[0, :, :, :] = np.squeeze(x)
    net.blobs["label"].data[...] = np.zeros(net.blobs["label"].data.shape)
    net.forward()
    pred = net.blobs["output"].data[0].argmax(axis=0).astype(np.uint32)
    assert pred.shape == (5, 5)
    net.blobs["label"].data[...] = pred
    np.testing.assert_array_equal(net.blobs["label"].data[0, 0], pred)

    grads = net.backward(diffs=["data"])
    assert set(grads) == {"data", "label"}           # set(self.inputs + diffs)
    assert grads["data"].shape == (1, 3, 5, 5) and grads["data"].dtype == np.float32
    assert grads["data"] is net.blobs["data"].diff or np.shares_memory(
        grads["data"], net.blobs["data"].diff)       # the blob's own diff, not a copy

    out = conv2d(x[0].astype(np.float32).astype(np.float64), w, b, pad=1)
    np.testing.assert_allclose(net.blobs["output"].data[0], out, rtol=1e-4, atol=1e-5)
    p = softmax(out, axis=0)
    onehot = np.eye(4)[pred.astype(int)].transpose(2, 0, 1)
    g_out = (p - onehot) / 25.0
    expected = conv2d_input_grad(g_out, w, 1, (5, 5))
    np.testing.assert_allclose(grads["data"][0], expected, rtol=1e-4, atol=1e-6)
    adversarial = x + np.sign(grads["data"]) * eps
    assert np.abs(adversarial - x).max() == pytest.approx(eps)

    # IterativeFGSM: the label fixed at the first prediction, steps clipped to x +- eps
    clip_min, clip_max = x - eps, x + eps
    adv = x
    for i in range(3):
        net.blobs["data"].data[0, :, :, :] = np.squeeze(adv)
        net.forward()
        if i == 0:
            net.blobs["label"].data[...] = net.blobs["output"].data[0].argmax(axis=0)
        g = net.backward(diffs=["data"])["data"]
        adv = np.clip(adv + np.sign(g) * 0.05, clip_min, clip_max)
    assert adv.dtype == np.float64 and np.abs(adv - x).max() <= eps + 1e-12
    # the loss of the first prediction went up
    net.blobs["data"].data[...] = adv
    net.blobs["label"].data[...] = pred
    assert net.forward()["loss"] > -np.log(p[pred.astype(int), np.arange(5)[:, None],
                                             np.arange(5)]).mean()


# --------------------------------------------------- pruning through a net sharing weights
PRUNE = """name: "prune"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 2 dim: 5 dim: 5 } shape { dim: 4 }
                     data_filler { type: "constant" value: 0.5 }
                     data_filler { type: "constant" value: 1 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv1" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "top-1" type: "Accuracy" bottom: "ip" bottom: "label" top: "top-1"
  include { phase: TEST } }
"""


def test_weight_pruning_through_a_net_that_shares_the_solvers_weights(workdir):
    """A Caffe weight-pruning tool (prune.py: ``--solver --model --input --output``,
    "Caffe Weight Pruning Tool"; the index names no repository): a separate TEST
    ``caffe.Net`` and the solver's test net both ``share_with(solver.net)`` after
    ``copy_from``; convolutions found by ``'Convolution' in net.layer_dict[x].type``; a
    weight zeroed by ``layer.blobs[0].data[m][c][y][x] = 0``; accuracy averaged over
    ``test_nets[0].forward()`` dicts (``output[j].copy()`` then ``+=`` and ``/=``); the
    result saved by ``solver.net.save``."""
    write("net.prototxt", PRUNE)
    write("solver.prototxt", 'net: "net.prototxt" base_lr: 0.01 lr_policy: "fixed" '
          'test_iter: 1 test_interval: 1000 display: 0 snapshot_after_train: false')
    caffe.Net("net.prototxt", caffe.TEST).save("pretrained.caffemodel")
    pretrained = caffe.Net("net.prototxt", "pretrained.caffemodel", caffe.TEST)

    net = caffe.Net("net.prototxt", caffe.TEST)
    solver = caffe.SGDSolver("solver.prototxt")
    solver.net.copy_from("pretrained.caffemodel")
    solver.test_nets[0].share_with(solver.net)
    net.share_with(solver.net)

    convs = [x for x in net.layer_dict.keys() if "Convolution" in net.layer_dict[x].type]
    assert convs == ["conv1"]
    dims = {name: net.layer_dict[name].blobs[0].shape for name in convs}
    assert tuple(dims["conv1"]) == (3, 2, 3, 3) and np.prod(dims["conv1"]) == 54
    np.testing.assert_array_equal(net.params["conv1"][0].data,
                                  pretrained.params["conv1"][0].data)

    def test(itr):
        acc = {}
        for _ in range(itr):
            out = solver.test_nets[0].forward()
            for j in out:
                acc[j] = acc[j] + out[j] if j in acc else out[j].copy()
        for j in acc:
            acc[j] /= float(itr)
        return acc["top-1"] * 100.0, acc["loss"]

    acc0, loss0 = test(2)
    assert np.ndim(loss0) == 0 and 0.0 <= acc0 <= 100.0
    assert loss0 == pytest.approx(float(pretrained.forward()["loss"]), rel=1e-6)

    layer = net.layer_dict["conv1"]
    m, c, y, x = np.unravel_index(np.abs(layer.blobs[0].data).argmax(), dims["conv1"])
    layer.blobs[0].data[m][c][y][x] = 0
    for shared in (solver.net, solver.test_nets[0]):
        assert shared.params["conv1"][0].data[m, c, y, x] == 0
    acc1, loss1 = test(1)
    pretrained.params["conv1"][0].data[m, c, y, x] = 0
    assert loss1 == pytest.approx(float(pretrained.forward()["loss"]), rel=1e-6)
    assert loss1 != loss0

    solver.net.save("pruned.caffemodel")
    pruned = caffe.Net("net.prototxt", "pruned.caffemodel", caffe.TEST)
    assert pruned.params["conv1"][0].data[m, c, y, x] == 0
    assert np.count_nonzero(pruned.params["conv1"][0].data == 0) == 1


# ----------------------------------------------------------- a mean file as NumPy array
def write_compute_image_mean(path, mean):
    """What tools/compute_image_mean writes: a BlobProto with the legacy num, channels,
    height, width fields (1, C, H, W) and float data."""
    blob = caffe_pb2.BlobProto()
    blob.num, blob.channels, blob.height, blob.width = (1,) + mean.shape
    blob.data.extend(mean.astype(float).flat)
    with open(path, "wb") as f:
        f.write(blob.SerializeToString())


def test_binaryproto_mean_to_npy_and_into_a_transformer(workdir):
    """RodriguezAndres/Pascal-VOC-2012 convert_binaryproto2npy.py (and the many copies
    of it) and colingogo/caffe-pretrained-feature-extraction
    convert_to_imagenet_mean_npy.py: ``BlobProto.ParseFromString``,
    ``np.array(caffe.io.blobproto_to_array(blob))`` -- (1, C, H, W) float64 from the
    legacy fields -- ``arr[0]`` (or all of ``arr``) to ``np.save``; then, as DIGITS'
    inference and the feature extractors do, ``.mean(1).mean(1)`` as a Transformer's
    per-channel mean."""
    rng = np.random.default_rng(2)
    mean = rng.uniform(0, 255, (3, 6, 7)).astype(np.float32)
    write_compute_image_mean("mean.binaryproto", mean)

    blob = caffe.proto.caffe_pb2.BlobProto()
    blob.ParseFromString(open("mean.binaryproto", "rb").read())
    arr = np.array(caffe.io.blobproto_to_array(blob))
    assert arr.shape == (1, 3, 6, 7) and arr.dtype == np.float64
    np.testing.assert_array_equal(arr[0], mean)
    np.save("mean.npy", arr[0])
    np.save("imagenet_mean.npy", np.asarray(caffe.io.blobproto_to_array(blob)))
    assert np.load("imagenet_mean.npy").shape == (1, 3, 6, 7)

    pixel = np.load("mean.npy").mean(1).mean(1)
    assert pixel.shape == (3,)
    t = caffe.io.Transformer({"data": (1, 3, 6, 7)})
    t.set_transpose("data", (2, 0, 1))
    t.set_mean("data", pixel)
    t.set_raw_scale("data", 255)
    t.set_channel_swap("data", (2, 1, 0))
    image = rng.uniform(0, 1, (6, 7, 3)).astype(np.float32)
    got = t.preprocess("data", image)
    want = (image * 255)[:, :, ::-1].transpose(2, 0, 1) - mean.mean(axis=(1, 2))[:, None, None]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
    # the whole-image mean (the elementwise Transformer mean) as the feature extractors use it
    t.set_mean("data", np.load("mean.npy"))
    np.testing.assert_allclose(t.preprocess("data", image),
                               (image * 255)[:, :, ::-1].transpose(2, 0, 1) - mean,
                               rtol=1e-5, atol=1e-3)


# --------------------------------------------------- a fake dataset of float bytes in LMDB
def test_fake_imagenet_lmdb_of_float64_bytes(workdir):
    """Alexey-Kamenev/Benchmarks caffe/createFakeImageNet.py: Datum records whose
    ``data`` is ``features[i].tostring()`` of a float64 array (eight bytes an element,
    eight times C*H*W) and whose ``label`` is a NumPy int64; Caffe's DataTransformer
    reads the first C*H*W bytes of ``data`` as uint8, whatever its length."""
    lmdb = pytest.importorskip("lmdb")
    rng = np.random.default_rng(3)
    n, shape = 4, (2, 3, 3)
    features = rng.standard_normal((n,) + shape)
    labels = rng.integers(0, 10, size=(n,))
    db = lmdb.open("fake.lmdb", map_size=1 << 20)   # the script: features.nbytes * 10
    with db.begin(write=True) as txn:
        for i in range(n):
            d = caffe.proto.caffe_pb2.Datum()
            d.channels, d.height, d.width = features.shape[1:]
            d.data = features[i].tobytes()
            d.label = labels[i]
            txn.put("{:08}".format(i).encode("ascii"), d.SerializeToString())
    db.close()
    write("train.prototxt", """name: "fake"
layer { name: "data" type: "Data" top: "data" top: "label"
  data_param { source: "fake.lmdb" backend: LMDB batch_size: 2 } }
""")
    net = caffe.Net("train.prototxt", caffe.TRAIN)
    for start in (0, 2):
        net.forward()
        for k in range(2):
            raw = np.frombuffer(features[start + k].tobytes(), np.uint8)[:18]
            np.testing.assert_array_equal(net.blobs["data"].data[k],
                                          raw.reshape(shape).astype(np.float32))
        np.testing.assert_array_equal(net.blobs["label"].data, labels[start:start + 2])


# ------------------------------------------------------- a caffemodel made a prototxt again
DEPLOY = """name: "small"
input: "data" input_shape { dim: 2 dim: 3 dim: 6 dim: 6 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "fc" type: "InnerProduct" bottom: "conv1" top: "fc"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def test_caffemodel_stripped_of_blobs_is_a_loadable_prototxt(workdir):
    """afcarl/HelloUtils caffe/caffemodel_to_prototxt.py: a .caffemodel parsed as a
    ``caffe_pb2.NetParameter``, ``ClearField('blobs')`` on every ``layers`` (V1) and
    ``layer`` entry, ``str()`` of the rest written as a deploy prototxt; that prototxt
    then builds the same net, and with the weights gives the same outputs."""
    write("deploy.prototxt", DEPLOY)
    original = caffe.Net("deploy.prototxt", caffe.TEST)
    original.save("model.caffemodel")
    with open("model.caffemodel", "rb") as f:
        model = caffe_pb2.NetParameter()
        model.ParseFromString(f.read())
    assert [l.name for l in model.layer if len(l.blobs)] == ["conv1", "fc"]
    for item in model.layers:
        item.ClearField("blobs")
    for item in model.layer:
        item.ClearField("blobs")
    with open("recovered.prototxt", "w") as f:
        f.write(str(model))

    again = caffe.Net("recovered.prototxt", "model.caffemodel", caffe.TEST)
    assert list(again.blobs) == list(original.blobs)
    assert again._layer_names == original._layer_names
    assert [l.type for l in again.layers] == [l.type for l in original.layers]
    x = np.random.default_rng(4).standard_normal((2, 3, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(again.forward(data=x)["prob"],
                                  original.forward(data=x)["prob"])


# --------------------------------------------------------------- conv1 filters on a grid
def vis_square_in_place(data, padsize=1, padval=0):
    """The older notebooks' vis_square: normalises ``data`` in place (``-=``, ``/=``)."""
    data -= data.min()
    data /= data.max()
    n = int(np.ceil(np.sqrt(data.shape[0])))
    padding = ((0, n ** 2 - data.shape[0]), (0, padsize), (0, padsize)) + ((0, 0),) * (data.ndim - 3)
    data = np.pad(data, padding, mode="constant", constant_values=(padval, padval))
    data = data.reshape((n, n) + data.shape[1:]).transpose((0, 2, 1, 3) + tuple(range(4, data.ndim + 1)))
    return data.reshape((n * data.shape[1], n * data.shape[3]) + data.shape[4:])


def vis_square(data):
    """00-classification.ipynb's later vis_square: a normalised copy, padded with ones."""
    data = (data - data.min()) / (data.max() - data.min())
    n = int(np.ceil(np.sqrt(data.shape[0])))
    padding = (((0, n ** 2 - data.shape[0]), (0, 1), (0, 1)) + ((0, 0),) * (data.ndim - 3))
    data = np.pad(data, padding, mode="constant", constant_values=1)
    data = data.reshape((n, n) + data.shape[1:]).transpose((0, 2, 1, 3) + tuple(range(4, data.ndim + 1)))
    return data.reshape((n * data.shape[1], n * data.shape[3]) + data.shape[4:])


def test_vis_square_of_conv1_filters_and_its_in_place_side_effect(workdir):
    """liquidmetal/caffe-tests Sec_5/visualize.py and hubertsgithub/caffe
    ownmodels/testnet/plotweights.py: ``filters = net.params['conv1'][0].data`` and
    ``vis_square(filters.transpose(0, 2, 3, 1))``.  The param's ``data`` is a view of the
    blob (pycaffe's _caffe.cpp hands out the blob's memory), so the older vis_square's
    in-place ``data -= data.min(); data /= data.max()`` on the transposed view rescales
    the net's own weights to [0, 1], which the next forward uses; the later one copies."""
    write("deploy.prototxt", DEPLOY)
    net = caffe.Net("deploy.prototxt", caffe.TEST)
    x = np.random.default_rng(5).standard_normal((2, 3, 6, 6)).astype(np.float32)
    before = net.forward(data=x)["prob"].copy()
    w0 = net.params["conv1"][0].data.copy()
    assert [(k, v.data.shape) for k, v in net.blobs.items()] == [
        ("data", (2, 3, 6, 6)), ("conv1", (2, 4, 4, 4)), ("fc", (2, 5)), ("prob", (2, 5))]

    filters = net.params["conv1"][0].data
    grid = vis_square(filters.transpose(0, 2, 3, 1))
    assert grid.shape == (2 * 4, 2 * 4, 3)          # 4 filters on a 2 x 2 grid, 3x3 + 1 pad
    np.testing.assert_array_equal(net.params["conv1"][0].data, w0)   # a copy: untouched

    grid = vis_square_in_place(filters.transpose(0, 2, 3, 1))
    assert grid.shape == (8, 8, 3) and grid.min() == 0 and grid.max() == 1
    w1 = net.params["conv1"][0].data
    np.testing.assert_allclose(w1, (w0 - w0.min()) / (w0 - w0.min()).max(), rtol=1e-6)
    after = net.forward(data=x)["prob"]
    assert not np.allclose(after, before)
    conv = np.stack([conv2d(x[i].astype(np.float64), w1.astype(np.float64),
                            net.params["conv1"][1].data.astype(np.float64), 0) for i in range(2)])
    fc = np.maximum(conv, 0).reshape(2, -1) @ net.params["fc"][0].data.T.astype(np.float64) \
        + net.params["fc"][1].data
    np.testing.assert_allclose(after, softmax(fc, axis=1), rtol=1e-4, atol=1e-6)


# ----------------------------------------------- forward/backward and the accumulating diffs
CIFAR = """name: "cifar_small"
input: "data" input_shape { dim: 1 dim: 3 dim: 4 dim: 4 }
input: "label" input_shape { dim: 1 dim: 1 dim: 1 dim: 1 }
layer { name: "fc5" type: "InnerProduct" bottom: "data" top: "fc5"
  inner_product_param { num_output: 7 weight_filler { type: "gaussian" std: 0.2 }
                        bias_filler { type: "gaussian" std: 0.2 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc5" bottom: "label" top: "loss" }
"""


def test_teaism_reference_gradients_from_pycaffe(workdir):
    """yrlu/Teaism models/cifar10/predict.py (reference values for a CUDA framework):
    a BGR image minus 128 transposed to (3, H, W) and written into the (1, 3, H, W) data
    blob, the label set from a float64 ``np.empty([1,1,1,1])``, ``net.forward();
    net.backward()``, then ``blobs['fc5'].diff`` (softmax minus one-hot) and
    ``params['fc5'][0].diff`` (its outer product with the input).  pycaffe's backward
    does not clear param diffs, so a second pass doubles them (Net::Backward
    accumulates), while the blob diff is overwritten."""
    net = caffe.Net(write("test.prototxt", CIFAR), caffe.TEST)
    rng = np.random.default_rng(6)
    img = rng.integers(0, 256, (4, 4, 3)).astype(np.float32)
    img -= [128, 128, 128]
    img = img[:, :, ::-1].transpose([2, 0, 1])
    label = np.empty([1, 1, 1, 1])
    label[0] = 6

    net.blobs["data"].data[...] = img
    net.blobs["label"].data[...] = label
    net.forward()
    net.backward()
    w = net.params["fc5"][0].data.astype(np.float64)
    b = net.params["fc5"][1].data.astype(np.float64)
    z = w @ img.ravel().astype(np.float64) + b
    g = softmax(z, axis=0) - np.eye(7)[6]
    assert net.blobs["fc5"].diff.shape == (1, 7)
    assert net.blobs["fc5"].diff[...].tolist()[0] == pytest.approx(g.tolist(), abs=1e-6)
    assert net.params["fc5"][0].diff.shape == (7, 48)
    np.testing.assert_allclose(net.params["fc5"][0].diff, np.outer(g, img.ravel()),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(net.params["fc5"][1].diff, g, rtol=1e-5, atol=1e-7)

    net.forward()
    net.backward()
    np.testing.assert_allclose(net.params["fc5"][0].diff, 2 * np.outer(g, img.ravel()),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(net.blobs["fc5"].diff[0], g, atol=1e-6)


# --------------------------------------------------------- parameter and blob size tables
SIZES = """name: "sizes"
layer { name: "data" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } shape { dim: 2 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "ip" type: "InnerProduct" bottom: "conv1" top: "ip"
  inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" }
"""


def test_parameter_count_and_blob_size_tables(workdir):
    """anik-jha/CS-VQA compute_caffe_parameters.py (a gist: gistable/gistable
    all-gists/a6a32bd8.../snippet.py) and Jallet/residual_network src/net.py:
    ``[(k, v[0].data.shape) for k, v in net.params.items()]`` summed with ``prod``, and
    every blob's ``v.data.shape`` and size in a TRAIN net -- which lists the Split
    layers' blobs Caffe inserts where a blob feeds two layers (insert_splits.cpp's
    ``<blob>_<layer>_<top index>_split_<i>``)."""
    net = caffe.Net(write("train_val.prototxt", SIZES), caffe.TRAIN)
    table = [(k, v[0].data.shape) for k, v in net.params.items()]
    assert table == [("conv1", (4, 3, 3, 3)), ("bn1", (4,)), ("scale1", (4,)),
                     ("ip", (3, 36))]
    total = sum(np.prod(v[0].data.shape) for k, v in net.params.items())
    assert total == 108 + 4 + 4 + 108
    every = sum(b.data.size for v in net.params.values() for b in v)
    assert every == (108 + 4) + (4 + 4 + 1) + (4 + 4) + (108 + 3)

    sizes = {k: int(np.prod(v.data.shape)) for k, v in net.blobs.items()}
    assert list(sizes) == ["data", "label", "label_data_1_split_0", "label_data_1_split_1",
                           "conv1", "ip", "ip_ip_0_split_0", "ip_ip_0_split_1", "loss", "acc"]
    assert sizes["conv1"] == 2 * 4 * 3 * 3 and sizes["ip_ip_0_split_1"] == 6
    assert net.blobs["loss"].data.shape == () and sizes["loss"] == 1


# ------------------------------------------------------- a solver written by caffe_pb2
def test_solver_written_with_caffe_pb2_and_two_test_nets(workdir):
    """qq249356520/caffe_comment_chinese examples/myfile/pythonInuse/create_solver.py
    (the CSDN "learning Caffe with Python: generating the solver file" recipe): a
    ``caffe_pb2.SolverParameter`` filled field by field -- ``train_net``, two
    ``test_net.append``, ``test_iter.append``, ``type = "SGD"``, ``solver_mode =
    caffe_pb2.SolverParameter.GPU`` -- and ``str(s)`` written to the file the solver
    reads.  pycaffe's solver ignores solver_mode (the mode is ``caffe.set_mode_*``'s);
    each test net runs at every test_interval and shares the trained weights."""
    write("train.prototxt", PRUNE)
    write("val.prototxt", PRUNE)
    write("val22.prototxt", PRUNE.replace('value: 0.5', 'value: -0.5'))
    s = caffe_pb2.SolverParameter()
    s.train_net = "train.prototxt"
    s.test_net.append("val.prototxt")
    s.test_net.append("val22.prototxt")
    s.test_interval = 2
    s.test_iter.append(1)
    s.test_iter.append(1)
    s.max_iter = 4
    s.base_lr = 0.01
    s.momentum = 0.9
    s.weight_decay = 5e-4
    s.lr_policy = "step"
    s.stepsize = 3
    s.gamma = 0.1
    s.display = 0
    s.snapshot = 0
    s.snapshot_prefix = "snapshot"
    s.type = "SGD"
    s.solver_mode = caffe_pb2.SolverParameter.GPU
    with open("solver1.prototxt", "w") as f:
        f.write(str(s))

    solver = caffe.SGDSolver("solver1.prototxt")
    assert len(solver.test_nets) == 2
    assert all(t.phase == caffe.TEST for t in solver.test_nets)
    assert "top-1" in solver.test_nets[1].blobs and "top-1" not in solver.net.blobs
    solver.step(2)
    assert solver.iter == 2
    for t in solver.test_nets:
        np.testing.assert_array_equal(t.params["conv1"][0].data,
                                      solver.net.params["conv1"][0].data)
    assert solver.test_nets[1].blobs["data"].data.flat[0] == -0.5
