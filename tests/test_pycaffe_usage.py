"""pycaffe as real scripts drive it.  Each test runs, on tiny nets, the calls and data flows
of public scripts written for BVLC Caffe (named in its docstring), and asserts what pycaffe
does there, read from pycaffe's sources (python/caffe/pycaffe.py, _caffe.cpp, io.py,
net_spec.py, classifier.py): types, shapes, float32, ``.data``/``.diff`` views that write
through to the net, ``forward()``'s dict of the blobs' own arrays, ``forward_all``'s copies.
What pycaffe's own unit tests cover is in tests/pycaffe_spec/; the API surface, group by
group, in test_pycaffe_surface.py.
"""
import os
import sys
import tempfile

import numpy as np
import pytest
from google.protobuf import text_format

import minicaffe as caffe
from minicaffe import layers as L, params as P
from minicaffe.proto import caffe_pb2

# A GoogLeNet-like deploy net in miniature: legacy ``input:`` fields, an in-place ReLU, an
# "inception" Concat whose layer and top carry a slash, global pooling, a classifier.
DREAM = """name: "dream"
input: "data" input_shape { dim: 1 dim: 3 dim: 12 dim: 12 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
                      weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "inc/1x1" type: "Convolution" bottom: "conv1" top: "inc/1x1"
  convolution_param { num_output: 2 kernel_size: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "inc/3x3" type: "Convolution" bottom: "conv1" top: "inc/3x3"
  convolution_param { num_output: 2 kernel_size: 3 pad: 1
                      weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "inc/output" type: "Concat" bottom: "inc/1x1" bottom: "inc/3x3" top: "inc/output" }
layer { name: "pool" type: "Pooling" bottom: "inc/output" top: "pool"
  pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    caffe.set_mode_cpu()
    caffe.set_random_seed(1701)              # the fillers' draws: the same every run
    return tmp_path


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def saved_weights(model, path):
    """A .caffemodel of ``model``'s randomly filled weights (a model zoo download)."""
    caffe.Net(model, caffe.TEST).save(str(path))
    return str(path)


# ---------------------------------------------------------------- deep dream
def test_deepdream_gradient_ascent(workdir):
    """google/deepdream dream.ipynb and the scripts made from it (a deepdream CLI that
    adds guided dreams, kesara/deepdreamer): the deploy net patched through
    ``caffe.io.caffe_pb2`` and ``text_format`` to force_backward, a Classifier for its
    transformer, ``src.reshape`` of the data blob alone (forward's Layer::Reshape calls
    shape the rest), ``forward(end=)``, ``dst.diff[:] = dst.data``, ``backward(start=)``,
    and the image edited in place through ``src.data``."""
    write("deploy.prototxt", DREAM)
    weights = saved_weights("deploy.prototxt", workdir / "dream.caffemodel")
    model = caffe.io.caffe_pb2.NetParameter()
    text_format.Merge(open("deploy.prototxt").read(), model)
    model.force_backward = True
    open("tmp.prototxt", "w").write(str(model))
    net = caffe.Classifier("tmp.prototxt", weights, mean=np.float32([104.0, 116.0, 122.0]),
                           channel_swap=(2, 1, 0))
    # io.Transformer.set_mean: a per-channel mean becomes (C, 1, 1)
    assert net.transformer.mean["data"].shape == (3, 1, 1)

    def preprocess(img):
        return np.float32(np.rollaxis(img, 2)[::-1]) - net.transformer.mean["data"]

    def deprocess(img):
        return np.dstack((img + net.transformer.mean["data"])[::-1])

    img = np.random.default_rng(0).uniform(0, 255, (10, 14, 3)).astype(np.float32)
    end = "inc/output"
    src, dst = net.blobs["data"], net.blobs[end]
    h, w = img.shape[:2]
    src.reshape(1, 3, h, w)                     # no net.reshape(): forward reshapes
    src.data[0] = preprocess(img)
    np.testing.assert_allclose(deprocess(src.data[0]), img, atol=1e-4)
    before = src.data.copy()

    ox, oy = 2, -1                              # make_step: jitter, ascend, unshift, clip
    src.data[0] = np.roll(np.roll(src.data[0], ox, -1), oy, -2)
    out = net.forward(end=end)
    assert list(out) == [end] and out[end].shape == (1, 4, h, w)   # top_names[end]
    assert dst.data.shape == (1, 4, h, w) and net.blobs["conv1"].data.shape == (1, 4, h, w)
    dst.diff[:] = dst.data                      # objective_L2
    grads = net.backward(start=end)
    assert list(grads) == ["data"] and grads["data"].shape == (1, 3, h, w)
    g = src.diff[0]
    assert g.dtype == np.float32 and np.abs(g).mean() > 0
    np.testing.assert_array_equal(grads["data"][0], g)
    step = 1.5 / np.abs(g).mean() * g
    src.data[:] += step
    src.data[0] = np.roll(np.roll(src.data[0], -ox, -1), -oy, -2)
    bias = net.transformer.mean["data"]
    src.data[:] = np.clip(src.data, -bias, 255 - bias)
    moved = src.data - before
    assert src.data.dtype == np.float32 and np.abs(moved).max() > 0

    # src.diff is the gradient of the L2 objective 0.5 |dst|^2 with respect to the image:
    # checked along its own direction u by a central difference (the net is piecewise
    # linear; a step of 0.5 along a unit vector moves each pixel by about 0.02)
    x = src.data.copy()

    def energy(z):
        src.data[...] = z
        net.forward(end=end)
        return 0.5 * float(np.sum(dst.data.astype(np.float64) ** 2))

    energy(x)
    dst.diff[:] = dst.data
    net.backward(start=end)
    g = src.diff.astype(np.float64)
    u = g / np.linalg.norm(g)
    numeric = (energy(x + 0.5 * u) - energy(x - 0.5 * u)) / 1.0
    assert numeric == pytest.approx(np.linalg.norm(g), rel=1e-3)

    # guided dream: the guide's features, then the objective written through a reshaped
    # view of dst.diff[0]
    src.data[...] = x
    net.forward(end=end)
    guide_features = dst.data[0].copy()
    ch = guide_features.shape[0]
    feats = dst.data[0].copy().reshape(ch, -1)
    y = guide_features.reshape(ch, -1)
    dst.diff[0].reshape(ch, -1)[:] = y[:, feats.T.dot(y).argmax(1)]
    np.testing.assert_array_equal(dst.diff[0].reshape(ch, -1), y[:, feats.T.dot(y).argmax(1)])


# ----------------------------------------------------- 01-learning-lenet
def lenet(source, batch_size):
    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=batch_size, backend=P.Data.LMDB, source=source,
                             transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=4, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool1, num_output=12, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    return n.to_proto()


def write_digits_lmdb(path, n, rng):
    """The usual Python LMDB writer (deepdish.io's "Creating an LMDB database in Python",
    Caffe's python-lmdb-creator notebook): array_to_datum records put under zero-padded
    keys, and the environment left open afterwards."""
    lmdb = pytest.importorskip("lmdb")
    images = rng.integers(0, 256, (n, 1, 12, 12), dtype=np.uint8)
    labels = rng.integers(0, 10, n)
    env = lmdb.open(path, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i in range(n):
            datum = caffe.io.array_to_datum(images[i], int(labels[i]))
            txn.put("{:08}".format(i).encode("ascii"), datum.SerializeToString())
    return env, images, labels


def test_learning_lenet_notebook(workdir):
    """BVLC/caffe examples/01-learning-lenet.ipynb: LeNet written with NetSpec to a file,
    a solver written from ``caffe_pb2.SolverParameter`` with ``str()``, ``SGDSolver``,
    the blob and param shape listings, ``forward()`` on the train and test nets,
    ``solver.step(1)`` with ``params['conv1'][0].diff``, and the training loop with
    ``test_nets[0].forward(start='conv1')`` (which does not read a new batch) and the
    argmax-against-label accuracy."""
    rng = np.random.default_rng(1)
    env, images, labels = write_digits_lmdb("digits_lmdb", 24, rng)
    datum = caffe.proto.caffe_pb2.Datum()
    with env.begin() as txn:                    # the script's own read-back
        datum.ParseFromString(txn.get(b"00000003"))
    assert datum.label == labels[3]
    np.testing.assert_array_equal(caffe.io.datum_to_array(datum), images[3])

    write("lenet_auto_train.prototxt", str(lenet("digits_lmdb", 8)))
    write("lenet_auto_test.prototxt", str(lenet("digits_lmdb", 12)))
    s = caffe_pb2.SolverParameter()
    s.train_net = "lenet_auto_train.prototxt"
    s.test_net.append("lenet_auto_test.prototxt")
    s.test_interval = 500
    s.test_iter.append(2)
    s.base_lr = 0.01
    s.momentum = 0.9
    s.weight_decay = 5e-4
    s.lr_policy = "inv"
    s.gamma = 1e-4
    s.power = 0.75
    s.display = 0
    s.max_iter = 10
    s.snapshot = 5000
    s.snapshot_prefix = "lenet"
    s.solver_mode = caffe_pb2.SolverParameter.CPU
    write("lenet_auto_solver.prototxt", str(s))

    # the LMDB environment of the writer is still open in this process (as in the
    # notebook-style scripts): Caffe's reader opens the database all the same
    solver = caffe.SGDSolver("lenet_auto_solver.prototxt")
    assert [(k, v.data.shape) for k, v in solver.net.blobs.items()] == [
        ("data", (8, 1, 12, 12)), ("label", (8,)), ("conv1", (8, 4, 8, 8)),
        ("pool1", (8, 4, 4, 4)), ("ip1", (8, 12)), ("ip2", (8, 10)), ("loss", ())]
    assert [(k, v[0].data.shape) for k, v in solver.net.params.items()] == [
        ("conv1", (4, 1, 5, 5)), ("ip1", (12, 64)), ("ip2", (10, 12))]

    out = solver.net.forward()
    assert list(out) == ["loss"] and out["loss"].shape == () and out["loss"].dtype == np.float32
    solver.test_nets[0].forward()
    data = solver.net.blobs["data"].data
    np.testing.assert_allclose(data[:8, 0], images[:8, 0] / 255., rtol=1e-6)   # scale
    np.testing.assert_array_equal(solver.net.blobs["label"].data[:8], labels[:8])
    assert solver.net.blobs["label"].data.dtype == np.float32

    w0 = solver.net.params["conv1"][0].data.copy()
    solver.step(1)
    tile = solver.net.params["conv1"][0].diff[:, 0].reshape(2, 2, 5, 5).transpose(0, 2, 1, 3)
    assert tile.reshape(2 * 5, 2 * 5).shape == (10, 10)
    assert np.abs(solver.net.params["conv1"][0].diff).max() > 0
    assert not np.array_equal(solver.net.params["conv1"][0].data, w0)
    assert solver.iter == 1

    niter = 3
    train_loss = np.zeros(niter)
    output = np.zeros((niter, 8, 10))
    test = solver.test_nets[0]
    for it in range(niter):
        solver.step(1)
        train_loss[it] = solver.net.blobs["loss"].data
        labels_before = test.blobs["label"].data.copy()
        test.forward(start="conv1")
        np.testing.assert_array_equal(test.blobs["label"].data, labels_before)
        output[it] = test.blobs["ip2"].data[:8]
        correct = 0
        for _ in range(2):
            test.forward()
            correct += sum(test.blobs["ip2"].data.argmax(1) == test.blobs["label"].data)
        assert 0 <= correct <= 24
    assert np.all(train_loss > 0) and solver.iter == 4
    # the test net shares the train net's weights (Solver::InitTestNets: ShareTrainedLayersWith)
    np.testing.assert_array_equal(test.params["ip2"][0].data, solver.net.params["ip2"][0].data)
    env.close()


# ------------------------------------------------------------- brewing-logreg
def test_brewing_logreg_hdf5(workdir):
    """BVLC/caffe examples/brewing-logreg.ipynb: float64 features written with h5py (one
    file plain, one gzip-compressed), HDF5Data through NetSpec, ``caffe.get_solver``,
    ``solve()`` (snapshots at ``snapshot`` and after training), then accuracy averaged
    over ``len(X) / test_nets[0].blobs['data'].num`` test forwards."""
    h5py = pytest.importorskip("h5py")
    rng = np.random.RandomState(0)
    X = rng.randn(60, 4)
    y = (X[:, 0] + 0.2 * X[:, 1] > 0).astype(int)
    os.makedirs("hdf5", exist_ok=True)
    with h5py.File("hdf5/train.h5", "w") as f:
        f["data"] = X
        f["label"] = y.astype(np.float32)
    write("hdf5/train.txt", "hdf5/train.h5\n")
    with h5py.File("hdf5/test.h5", "w") as f:
        f.create_dataset("data", data=X, compression="gzip", compression_opts=1)
        f.create_dataset("label", data=y.astype(np.float32), compression="gzip",
                         compression_opts=1)
    write("hdf5/test.txt", "hdf5/test.h5\n")

    def logreg(hdf5, batch_size):
        n = caffe.NetSpec()
        n.data, n.label = L.HDF5Data(batch_size=batch_size, source=hdf5, ntop=2)
        n.ip1 = L.InnerProduct(n.data, num_output=2, weight_filler=dict(type="xavier"))
        n.accuracy = L.Accuracy(n.ip1, n.label)
        n.loss = L.SoftmaxWithLoss(n.ip1, n.label)
        return n.to_proto()

    write("logreg_auto_train.prototxt", str(logreg("hdf5/train.txt", 10)))
    write("logreg_auto_test.prototxt", str(logreg("hdf5/test.txt", 10)))
    write("solver.prototxt", 'train_net: "logreg_auto_train.prototxt"\n'
          'test_net: "logreg_auto_test.prototxt"\ntest_iter: 6\ntest_interval: 20\n'
          'base_lr: 0.1\nlr_policy: "step"\ngamma: 0.1\nstepsize: 30\ndisplay: 0\n'
          'max_iter: 40\nmomentum: 0.9\nweight_decay: 0.0005\nsnapshot: 20\n'
          'snapshot_prefix: "logreg"\nsolver_mode: CPU\n')
    solver = caffe.get_solver("solver.prototxt")
    solver.solve()
    assert solver.iter == 40
    assert {"logreg_iter_20.caffemodel", "logreg_iter_40.caffemodel",
            "logreg_iter_40.solverstate"} <= set(os.listdir("."))
    test = solver.test_nets[0]
    assert test.blobs["data"].num == 10 and test.blobs["data"].data.dtype == np.float32
    accuracy = 0
    test_iters = int(len(X) / test.blobs["data"].num)
    for _ in range(test_iters):
        test.forward()
        accuracy += test.blobs["accuracy"].data
    accuracy /= test_iters
    assert 0.8 < float(accuracy) <= 1.0
    # HDF5Data casts the float64 file to the blob's float32, row by row in file order
    np.testing.assert_allclose(test.blobs["data"].data, X[50:60].astype(np.float32))


# -------------------------------------------------------------- net surgery
FC = """name: "fc"
input: "data" input_shape { dim: 2 dim: 3 dim: 6 dim: 6 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 }
                      bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "fc6" type: "InnerProduct" bottom: "conv1" top: "fc6"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 }
                        bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "prob" type: "Softmax" bottom: "fc6" top: "prob" }
"""
FULL_CONV = """name: "full_conv"
input: "data" input_shape { dim: 2 dim: 3 dim: 8 dim: 8 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "fc6-conv" type: "Convolution" bottom: "conv1" top: "fc6-conv"
  convolution_param { num_output: 5 kernel_size: 4 } }
layer { name: "prob" type: "Softmax" bottom: "fc6-conv" top: "prob" }
"""


def test_net_surgery_makes_a_classifier_fully_convolutional(workdir):
    """BVLC/caffe examples/net_surgery.ipynb: the params of two nets held as (weights,
    biases) tuples of ``.data`` arrays, the fully connected weights copied into the
    convolution's with ``.flat`` assignment (shapes (5, 64) and (5, 4, 4, 4)), biases
    with ``[...]``, ``save``, and ``forward_all`` on the bigger input: each output
    location is the classifier applied to one window."""
    write("fc.prototxt", FC)
    write("full_conv.prototxt", FULL_CONV)
    weights = saved_weights("fc.prototxt", workdir / "fc.caffemodel")
    net = caffe.Net("fc.prototxt", weights, caffe.TEST)
    params = ["fc6"]
    fc_params = {pr: (net.params[pr][0].data, net.params[pr][1].data) for pr in params}
    assert fc_params["fc6"][0].shape == (5, 64) and fc_params["fc6"][1].shape == (5,)
    net_full_conv = caffe.Net("full_conv.prototxt", weights, caffe.TEST)   # conv1 by name
    params_full_conv = ["fc6-conv"]
    conv_params = {pr: (net_full_conv.params[pr][0].data, net_full_conv.params[pr][1].data)
                   for pr in params_full_conv}
    assert conv_params["fc6-conv"][0].shape == (5, 4, 4, 4)
    for pr, pr_conv in zip(params, params_full_conv):
        conv_params[pr_conv][0].flat = fc_params[pr][0].flat   # flat unrolled arrays
        conv_params[pr_conv][1][...] = fc_params[pr][1]
    np.testing.assert_array_equal(net_full_conv.params["fc6-conv"][0].data.reshape(5, 64),
                                  net.params["fc6"][0].data)
    net_full_conv.save("full_conv.caffemodel")

    reloaded = caffe.Net("full_conv.prototxt", "full_conv.caffemodel", caffe.TEST)
    image = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    out = reloaded.forward_all(data=np.asarray([image[0]] * 2))
    assert out["prob"].shape == (2, 5, 3, 3) and out["prob"].dtype == np.float32
    # the location (i, j) of the fully convolutional output is the classifier on the
    # 6 x 6 window at (i, j)
    for i, j in [(0, 0), (2, 1)]:
        window = net.forward(data=np.repeat(image[:, :, i:i + 6, j:j + 6], 2, axis=0))
        np.testing.assert_allclose(out["prob"][0, :, i, j], window["prob"][0], rtol=1e-5,
                                   atol=1e-6)
    assert out["prob"][0].argmax(axis=0).shape == (3, 3)


SEG = """name: "seg"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 6 dim: 6 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 1 dim: 1 dim: 6 dim: 6 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 stride: 2
                      weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "score" type: "Convolution" bottom: "conv1" top: "score_fr"
  convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "upscore" type: "Deconvolution" bottom: "score_fr" top: "upscore"
  param { lr_mult: 0 }
  convolution_param { num_output: 3 kernel_size: 4 stride: 2 pad: 1 bias_term: false } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "upscore" bottom: "label" top: "loss"
  loss_param { normalize: false } }
"""


def test_fcn_surgery_transplant_and_bilinear_interp(workdir):
    """shelhamer/fcn.berkeleyvision.org surgery.py and solve.py: ``solver.net.copy_from``,
    ``interp`` (``params[l][0].data[range(m), range(k), :, :] = filt`` on the layers
    whose name holds 'up'), ``transplant`` (every param copied by ``.flat``, a missing
    layer dropped), ``params[layer][0].num``, and the test net shared with the train net
    before scoring (score.py: ``share_with``, ``blobs[layer].channels``,
    ``data[0].argmax(0)``, ``blobs['loss'].data.flat[0]``)."""
    write("train.prototxt", SEG)
    write("solver.prototxt", 'train_net: "train.prototxt"\ntest_net: "train.prototxt"\n'
          'test_iter: 1\ntest_interval: 1000\nbase_lr: 1e-3\nlr_policy: "fixed"\n'
          'momentum: 0.9\ndisplay: 0\nsnapshot_prefix: "fcn"\nsolver_mode: CPU\n')
    weights = saved_weights("train.prototxt", workdir / "base.caffemodel")
    base = caffe.Net("train.prototxt", weights, caffe.TEST)
    solver = caffe.SGDSolver("solver.prototxt")
    solver.net.copy_from(weights)
    np.testing.assert_array_equal(solver.net.params["conv1"][0].data, base.params["conv1"][0].data)

    def upsample_filt(size):
        factor = (size + 1) // 2
        center = factor - 1 if size % 2 == 1 else factor - 0.5
        og = np.ogrid[:size, :size]
        return (1 - abs(og[0] - center) / factor) * (1 - abs(og[1] - center) / factor)

    interp_layers = [k for k in solver.net.params.keys() if "up" in k]
    assert interp_layers == ["upscore"]
    for layer in interp_layers:
        m, k, h, w = solver.net.params[layer][0].data.shape
        assert (m, k, h, w) == (3, 3, 4, 4)
        solver.net.params[layer][0].data[range(m), range(k), :, :] = upsample_filt(h)
    up = solver.net.params["upscore"][0].data
    np.testing.assert_allclose(up[1, 1], upsample_filt(4))
    assert up[0, 1].sum() == 0 and up.dtype == np.float32

    # transplant into a net with one layer renamed: copied, coerced by .flat, dropped
    other = caffe.Net(caffe_pb2.NetParameter.FromString(
        text_format.Parse(SEG.replace('name: "score"', 'name: "score_new"'),
                          caffe_pb2.NetParameter()).SerializeToString()), caffe.TEST)
    dropped = []
    for p in solver.net.params:
        if p not in other.params:
            dropped.append(p)
            continue
        for i in range(len(solver.net.params[p])):
            other.params[p][i].data.flat = solver.net.params[p][i].data.flat
    assert dropped == ["score"]
    np.testing.assert_array_equal(other.params["upscore"][0].data, up)
    assert solver.net.params["score"][0].num == 3

    image = np.random.default_rng(3).standard_normal((1, 3, 6, 6)).astype(np.float32)
    label = np.random.default_rng(4).integers(0, 3, (1, 1, 6, 6)).astype(np.float32)
    solver.net.blobs["data"].data[...] = image
    solver.net.blobs["label"].data[...] = label
    solver.step(2)
    np.testing.assert_array_equal(solver.net.params["upscore"][0].data, up)   # lr_mult 0
    test = solver.test_nets[0]
    test.share_with(solver.net)
    test.blobs["data"].data[...] = image
    test.blobs["label"].data[...] = label
    test.forward()
    n_cl = test.blobs["upscore"].channels
    pred = test.blobs["upscore"].data[0].argmax(0)
    assert n_cl == 3 and pred.shape == (6, 6)
    hist = np.bincount(n_cl * test.blobs["label"].data[0, 0].flatten().astype(int)
                       + pred.flatten(), minlength=n_cl ** 2).reshape(n_cl, n_cl)
    assert hist.sum() == 36
    loss = test.blobs["loss"].data.flat[0]
    assert isinstance(loss, np.float32) and loss > 0


# ---------------------------------------------------------------- Python layers
# BVLC's examples/pycaffe/layers/pyloss.py as stored for the third zoo sweep, then the
# PASCAL multilabel data layer
PYLOSS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo3",
                      "caffe_examples", "pyloss.py")
with open(PYLOSS) as _f:
    PYLAYERS = _f.read() + '''

class MultilabelDataLayerSync(caffe.Layer):
    """pascal_multilabel_datalayers.py's PascalMultilabelDataLayerSync, images made up"""

    scale = 1.0

    def setup(self, bottom, top):
        self.top_names = ["data", "label"]
        params = eval(self.param_str)
        assert "split" in params.keys()
        self.batch_size = params["batch_size"]
        self.im_shape = params["im_shape"]
        self.seen_phase = self.phase
        self.rng = np.random.RandomState(0 if params["split"] == "train" else 1)
        top[0].reshape(self.batch_size, 3, self.im_shape[0], self.im_shape[1])
        top[1].reshape(self.batch_size, 4)

    def forward(self, bottom, top):
        for itt in range(self.batch_size):
            im = self.rng.rand(3, *self.im_shape)
            multilabel = (im.mean(axis=(1, 2))[[0, 1, 2, 0]] > 0.5).astype(np.float32)
            top[0].data[itt, ...] = im * self.scale
            top[1].data[itt, ...] = multilabel

    def reshape(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass
'''


@pytest.fixture
def pylayers(workdir, monkeypatch):
    name = "usage_pylayers_%d" % os.getpid()
    write(workdir / (name + ".py"), PYLAYERS)
    monkeypatch.syspath_prepend(str(workdir))
    yield name
    sys.modules.pop(name, None)


def test_pascal_multilabel_with_python_layers(pylayers):
    """BVLC/caffe examples/pascal-multilabel-with-datalayer.ipynb with its
    pascal_multilabel_datalayers.py, and examples/pycaffe/layers/pyloss.py: a Python
    data layer (``param_str=str(dict)``, ``eval(self.param_str)``, ``self.top_names``
    set on the instance), a Python loss layer with ``loss_weight``, NetSpec files from
    ``tempfile``, ``SGDSolver``, ``test_nets[0].share_with(solver.net)``, then the
    layer objects read back through ``net.layers``."""
    def net(split):
        n = caffe.NetSpec()
        n.data, n.label = L.Python(module=pylayers, layer="MultilabelDataLayerSync", ntop=2,
                                   param_str=str(dict(split=split, batch_size=4,
                                                      im_shape=[5, 5])))
        n.fc = L.InnerProduct(n.data, num_output=4, weight_filler=dict(type="gaussian", std=0.1))
        n.loss = L.SigmoidCrossEntropyLoss(n.fc, n.label)
        n.euclid = L.Python(n.fc, n.label, module=pylayers, layer="EuclideanLossLayer",
                            loss_weight=1)
        return str(n.to_proto())

    with tempfile.NamedTemporaryFile(mode="w", suffix=".prototxt", delete=False, dir=".") as f:
        f.write(net("train"))
        train_file = f.name
    write("valnet.prototxt", net("val"))
    write("solver.prototxt", 'train_net: "%s"\ntest_net: "valnet.prototxt"\ntest_iter: 1\n'
          'test_interval: 1000\nbase_lr: 0.01\nlr_policy: "fixed"\nmomentum: 0.9\n'
          'display: 0\nsnapshot_prefix: "ml"\nsolver_mode: CPU\n' % train_file)
    solver = caffe.SGDSolver("solver.prototxt")
    solver.test_nets[0].share_with(solver.net)
    data_layer = solver.net.layers[0]
    assert data_layer.top_names == ["data", "label"] and data_layer.batch_size == 4
    assert (data_layer.seen_phase, solver.test_nets[0].layers[0].seen_phase) == (0, 1)
    assert type(data_layer.seen_phase) is int                 # PythonLayer: static_cast<int>
    assert solver.net.blob_loss_weights["euclid"] == 1.0 and solver.net.outputs == ["euclid", "loss"]

    w0 = solver.net.params["fc"][0].data.copy()
    losses = []
    for _ in range(6):
        solver.step(1)
        losses.append(float(solver.net.blobs["euclid"].data[0]))
    assert solver.net.blobs["euclid"].data.shape == (1,)
    assert np.all(np.isfinite(losses)) and min(losses) > 0
    assert not np.array_equal(solver.net.params["fc"][0].data, w0)

    # the Python loss's value and gradient against the arithmetic of pyloss.py
    net = solver.net
    out = net.forward()
    fc, label = net.blobs["fc"].data, net.blobs["label"].data
    assert out["euclid"][0] == pytest.approx(np.sum((fc - label) ** 2) / 4 / 2., rel=1e-5)
    net.backward()
    np.testing.assert_allclose(net.blobs["fc"].diff,
                               (fc - label) / 4                  # euclid, weight 1
                               + (1 / (1 + np.exp(-fc)) - label) / 4,   # sigmoid CE / N
                               rtol=1e-4, atol=1e-6)
    # shared weights: the test net computes with the trained parameters
    np.testing.assert_array_equal(solver.test_nets[0].params["fc"][0].data,
                                  net.params["fc"][0].data)
    os.unlink(train_file)


def test_a_data_layer_reads_an_lmdb_that_the_script_holds_open(workdir):
    """Caffe's C++ reader opens a database that the script still holds open with the lmdb
    package (a writer never closed), where py-lmdb >= 2 refuses a second environment on
    the same files; the script's environment keeps working beside the net's reader."""
    rng = np.random.default_rng(5)
    env, images, labels = write_digits_lmdb("held_lmdb", 6, rng)
    text = ('name: "d" layer { name: "d" type: "Data" top: "data" top: "label" '
            'data_param { source: "held_lmdb" backend: LMDB batch_size: 4 } }')
    net = caffe.Net(write("d.prototxt", text), caffe.TEST)
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data, images[:4])
    np.testing.assert_array_equal(net.blobs["label"].data, labels[:4])
    net.forward()                               # records 4, 5, then wraps to 0, 1
    np.testing.assert_array_equal(net.blobs["data"].data, images[[4, 5, 0, 1]])
    with env.begin(write=True) as txn:          # the script goes on writing
        txn.put(b"extra", b"1")
    del net
    with env.begin() as txn:
        assert txn.get(b"extra") == b"1" and txn.stat()["entries"] == 7
    env.close()


def test_a_script_opens_an_lmdb_that_a_net_is_reading(workdir):
    """The other order: a net reads the database, then the script opens it with the lmdb
    package to read the labels back (an evaluation loop), as it can beside Caffe's C++
    reader; the net's reader must not hold the package's "already open" guard."""
    lmdb = pytest.importorskip("lmdb")
    env, images, labels = write_digits_lmdb("eval_lmdb", 8, np.random.default_rng(13))
    env.close()
    text = ('name: "d" layer { name: "d" type: "Data" top: "data" top: "label" '
            'data_param { source: "eval_lmdb" backend: LMDB batch_size: 4 } }')
    net = caffe.Net(write("d.prototxt", text), caffe.TEST)
    env = lmdb.open("eval_lmdb", readonly=True)
    truth = []
    with env.begin() as txn:
        for _, value in txn.cursor():
            datum = caffe.proto.caffe_pb2.Datum()
            datum.ParseFromString(value)
            truth.append(datum.label)
    for batch in range(2):
        net.forward()
        np.testing.assert_array_equal(net.blobs["label"].data, truth[4 * batch:4 * batch + 4])
    assert truth == labels.tolist()
    env.close()


# ------------------------------------------------------------------- NetSpec
def test_netspec_update_and_delitem_as_pycaffes(workdir):
    """pycaffe's net_spec.py: ``NetSpec.update(name, params)`` merges keyword params into
    the layer that made top ``name`` (``Top._update`` -> ``Function._update``: a dict
    update, a key given again replaces its value), and ``del n[name]`` forgets a top (a
    deploy net made from the train spec: the layers that only fed the deleted tops are
    not emitted)."""
    n = caffe.NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[2, 3, 5, 5]), dict(dim=[2])], ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=3, num_output=4)
    n.relu1 = L.ReLU(n.conv1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=3)
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    n.silence = L.Silence(n.label, ntop=0)
    n.update("conv1", dict(num_output=8, weight_filler=dict(type="xavier")))
    n.update("relu1", {"negative_slope": 0.1})          # through the in-place top
    n.update("silence", {"propagate_down": [False]})    # a Function (ntop=0) itself
    proto = n.to_proto()
    layers = {l.name: l for l in proto.layer}
    conv = layers["conv1"].convolution_param
    assert (conv.num_output, list(conv.kernel_size), conv.weight_filler.type) == (8, [3], "xavier")
    assert layers["relu1"].relu_param.negative_slope == pytest.approx(0.1)
    assert list(layers["silence"].propagate_down) == [False]
    with pytest.raises(KeyError):
        n.update("nope", dict(num_output=1))

    del n["loss"]
    del n["silence"]
    assert "loss" not in n.keys() and len(n.vals()) == 5
    names = [l.name for l in n.to_proto().layer]
    assert names == ["data", "conv1", "relu1", "score"]
    with pytest.raises(KeyError):
        del n["loss"]
    net = caffe.Net(write("deploy.prototxt", str(n.to_proto())), caffe.TEST)
    assert net.params["conv1"][0].data.shape == (8, 3, 3, 3)
    assert net.outputs == ["label", "score"]


# -------------------------------------------------------- 00-classification
def test_classification_notebook(workdir):
    """BVLC/caffe examples/00-classification.ipynb: ``Net(model_def, model_weights,
    caffe.TEST)``, a per-channel mean from ``np.load(...).mean(1).mean(1)``, the
    Transformer (transpose, mean, raw scale 255, RGB -> BGR), the data blob reshaped to a
    batch of 5 and written by broadcasting one image, ``forward()``'s output dict, the
    shape listings of ``net.blobs`` and ``net.params``, and feature views of filters and
    activations."""
    write("deploy.prototxt", DREAM)
    weights = saved_weights("deploy.prototxt", workdir / "w.caffemodel")
    net = caffe.Net("deploy.prototxt", weights, caffe.TEST)
    rng = np.random.default_rng(6)
    np.save("mean.npy", rng.uniform(90, 130, (3, 16, 16)))
    mu = np.load("mean.npy").mean(1).mean(1)
    transformer = caffe.io.Transformer({"data": net.blobs["data"].data.shape})
    transformer.set_transpose("data", (2, 0, 1))
    transformer.set_mean("data", mu)
    transformer.set_raw_scale("data", 255)
    transformer.set_channel_swap("data", (2, 1, 0))
    net.blobs["data"].reshape(5, 3, 12, 12)
    image = rng.uniform(0, 1, (12, 12, 3)).astype(np.float32)
    transformed_image = transformer.preprocess("data", image)
    assert transformed_image.shape == (3, 12, 12) and transformed_image.dtype == np.float32
    np.testing.assert_allclose(
        transformed_image, image.transpose(2, 0, 1)[[2, 1, 0]] * 255 - mu[:, None, None],
        rtol=1e-5, atol=1e-3)
    net.blobs["data"].data[...] = transformed_image
    output = net.forward()
    output_prob = output["prob"][0]
    assert output["prob"].shape == (5, 5) and output_prob.dtype == np.float32
    assert output_prob.sum() == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(output["prob"], np.tile(output_prob, (5, 1)), rtol=1e-6)
    top_inds = output_prob.argsort()[::-1][:5]
    assert sorted(top_inds) == list(range(5))
    # forward()'s arrays are the blobs' own (pycaffe: {out: self.blobs[out].data})
    assert np.shares_memory(output["prob"], net.blobs["prob"].data)

    shapes = [(name, blob.data.shape) for name, blob in net.blobs.items()]
    assert shapes[0] == ("data", (5, 3, 12, 12)) and shapes[-1] == ("prob", (5, 5))
    assert ("inc/output", (5, 4, 12, 12)) in shapes
    assert [(name, param[0].data.shape, param[1].data.shape)
            for name, param in net.params.items()] == [
        ("conv1", (4, 3, 3, 3), (4,)), ("inc/1x1", (2, 4, 1, 1), (2,)),
        ("inc/3x3", (2, 4, 3, 3), (2,)), ("fc", (5, 4), (5,))]
    filters = net.params["conv1"][0].data
    assert filters.transpose(0, 2, 3, 1).shape == (4, 3, 3, 3)
    feat = net.blobs["conv1"].data[0, :3]
    assert feat.shape == (3, 12, 12) and np.all(feat >= 0)       # after the in-place ReLU
    feat = net.blobs["fc"].data[0]
    assert feat.flat[feat.flat > 0].ndim == 1
    # a second image: net.reshape() back to one image, then forward(start=...)
    net.blobs["data"].reshape(1, 3, 12, 12)
    net.reshape()
    assert net.blobs["prob"].data.shape == (1, 5)
    net.blobs["data"].data[0, ...] = transformed_image
    probs = net.forward(start="conv1")["prob"][0]
    np.testing.assert_allclose(probs, output_prob, rtol=1e-5)


# ---------------------------------------------------------- 02-fine-tuning
def style_net(source, train=True, learn_all=False, num_classes=3):
    """02-fine-tuning.ipynb's caffenet()/style_net(), cut down: ImageData with a mean
    file, crop and mirror; frozen or learned params; the classifier under its own name."""
    weight_param = dict(lr_mult=1, decay_mult=1)
    bias_param = dict(lr_mult=2, decay_mult=0)
    learned_param = [weight_param, bias_param]
    frozen_param = [dict(lr_mult=0)] * 2
    param = learned_param if learn_all else frozen_param
    n = caffe.NetSpec()
    transform_param = dict(mirror=train, crop_size=6, mean_file="mean.binaryproto")
    n.data, n.label = L.ImageData(transform_param=transform_param, source=source,
                                  batch_size=4, new_height=8, new_width=8, ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=3, num_output=4, param=param,
                            weight_filler=dict(type="gaussian", std=0.1),
                            bias_filler=dict(type="constant", value=0.1))
    n.relu1 = L.ReLU(n.conv1, in_place=True)
    n.fc7 = L.InnerProduct(n.relu1, num_output=6, param=param,
                           weight_filler=dict(type="gaussian", std=0.1))
    n.relu7 = L.ReLU(n.fc7, in_place=True)
    n.drop7 = L.Dropout(n.relu7, in_place=True)
    fc8 = L.InnerProduct(n.drop7, num_output=num_classes, param=learned_param,
                         weight_filler=dict(type="gaussian", std=0.1))
    n.__setattr__("fc8_flickr", fc8)
    if not train:
        n.probs = L.Softmax(fc8)
    n.loss = L.SoftmaxWithLoss(fc8, n.label)
    n.acc = L.Accuracy(fc8, n.label)
    with tempfile.NamedTemporaryFile(mode="w", suffix=".prototxt", delete=False, dir=".") as f:
        f.write(str(n.to_proto()))
        return f.name


def test_fine_tuning_notebook(workdir):
    """BVLC/caffe examples/02-fine-tuning.ipynb: nets written to temporary files, a
    solver made from ``caffe_pb2.SolverParameter`` (``random_seed = 0xCAFFE``,
    ``test_iter.append``, ``solver_mode``), ``get_solver``, ``solver.net.copy_from``
    of pretrained weights, the side-by-side training loop keeping ``.data.copy()`` of
    loss and accuracy, frozen layers (``lr_mult: 0``) left as loaded, ``net.save``, and
    the test net built from the saved weights, scored with ``forward()['acc']``."""
    from PIL import Image
    rng = np.random.default_rng(7)
    os.makedirs("images", exist_ok=True)
    lines = []
    colors = rng.integers(0, 256, (8, 3))          # one RGB colour per image
    for i in range(8):
        name = "images/%d.png" % i
        Image.fromarray(np.tile(colors[i].astype(np.uint8), (10, 9, 1))).save(name)
        lines.append("%s %d" % (name, i % 3))
    write("train.txt", "\n".join(lines) + "\n")
    mean = caffe.io.array_to_blobproto(np.full((1, 3, 8, 8), 120, np.float32))
    with open("mean.binaryproto", "wb") as f:
        f.write(mean.SerializeToString())

    pretrained = saved_weights(style_net("train.txt", train=False), workdir / "pre.caffemodel")
    s = caffe_pb2.SolverParameter()
    s.train_net = style_net("train.txt", train=True)
    s.test_net.append(style_net("train.txt", train=False))
    s.test_interval = 1000
    s.test_iter.append(2)
    s.iter_size = 1
    s.max_iter = 100
    s.type = "SGD"
    s.base_lr = 0.001
    s.lr_policy = "step"
    s.gamma = 0.1
    s.stepsize = 20
    s.momentum = 0.9
    s.weight_decay = 5e-4
    s.display = 0
    s.snapshot = 1000
    s.snapshot_prefix = "finetune_flickr_style"
    s.solver_mode = caffe_pb2.SolverParameter.CPU
    s.random_seed = 0xCAFFE
    solver_file = write("solver.prototxt", str(s))
    solver = caffe.get_solver(solver_file)
    solver.net.copy_from(pretrained)
    scratch = caffe.get_solver(solver_file)
    frozen = solver.net.params["conv1"][0].data.copy()
    pre = caffe.Net(style_net("train.txt", train=False), pretrained, caffe.TEST)
    np.testing.assert_array_equal(frozen, pre.params["conv1"][0].data)

    blobs = ("loss", "acc")
    loss = {name: np.zeros(3) for name in ("pretrained", "scratch")}
    acc = {name: np.zeros(3) for name in ("pretrained", "scratch")}
    for it in range(3):
        for name, s_ in (("pretrained", solver), ("scratch", scratch)):
            s_.step(1)
            loss[name][it], acc[name][it] = (s_.net.blobs[b].data.copy() for b in blobs)
    assert np.all(loss["pretrained"] > 0) and np.all((acc["scratch"] >= 0) & (acc["scratch"] <= 1))
    np.testing.assert_array_equal(solver.net.params["conv1"][0].data, frozen)   # lr_mult 0
    assert not np.array_equal(solver.net.params["fc8_flickr"][0].data,
                              pre.params["fc8_flickr"][0].data)
    assert solver.net.blobs["data"].data.shape == (4, 3, 6, 6)
    assert solver.net.blobs["label"].data.tolist() == [0, 1, 2, 0]   # ImageData, no shuffle

    solver.net.save("weights.pretrained.caffemodel")
    test_net = caffe.Net(style_net("train.txt", train=False), "weights.pretrained.caffemodel",
                         caffe.TEST)
    np.testing.assert_array_equal(test_net.params["fc8_flickr"][0].data,
                                  solver.net.params["fc8_flickr"][0].data)
    accuracy = 0
    for _ in range(2):
        accuracy += test_net.forward()["acc"]
    assert 0 <= accuracy / 2 <= 1
    assert test_net.blobs["probs"].data.shape == (4, 3)
    # ImageData reads BGR (OpenCV), resizes, crops 6 x 6, subtracts the mean file's crop
    data = test_net.blobs["data"].data
    assert data.dtype == np.float32 and data.shape == (4, 3, 6, 6)
    np.testing.assert_allclose(data[:, :, 2, 3], colors[4:8, ::-1] - 120.0, atol=1e-4)


# ------------------------------------------- siamese, features, caffemodel files
SIAMESE = """name: "mnist_siamese"
input: "data"
input_dim: 4
input_dim: 1
input_dim: 6
input_dim: 6
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { name: "conv1_w" lr_mult: 1 } param { name: "conv1_b" lr_mult: 2 }
  convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" }
                      bias_filler { type: "constant" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "feat" type: "InnerProduct" bottom: "ip1" top: "feat"
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
"""


def test_siamese_features_with_forward_all(workdir):
    """BVLC/caffe examples/siamese/mnist_siamese.ipynb and the usual feature extraction
    loops: a deploy net with legacy ``input_dim`` fields, ``forward_all(data=...)`` over
    more images than the batch (float64 in, scaled by 0.00390625; the last batch padded),
    ``out['feat']``; ``forward(blobs=[...])`` for an inner layer; per-batch ``.copy()``
    of a blob, because forward's arrays are the blobs' own and the next pass overwrites
    them, while forward_all's are copies."""
    write("deploy.prototxt", SIAMESE)
    weights = saved_weights("deploy.prototxt", workdir / "siamese.caffemodel")
    net = caffe.Net("deploy.prototxt", weights, caffe.TEST)
    assert net.inputs == ["data"] and net._layer_names[0] == "input"   # UpgradeNetInput
    raw = np.random.default_rng(8).integers(0, 256, (10, 36)).astype(np.float64)
    caffe_in = raw.reshape(10, 1, 6, 6) * 0.00390625
    out = net.forward_all(data=caffe_in)
    feat = out["feat"]
    assert list(out) == ["feat"] and feat.shape == (10, 2) and feat.dtype == np.float32
    assert not np.shares_memory(feat, net.blobs["feat"].data)

    feats = []
    for start in range(0, 10, 4):               # the script's own batching, last one short
        batch = caffe_in[start:start + 4]
        net.blobs["data"].reshape(*batch.shape)
        net.blobs["data"].data[...] = batch
        outs = net.forward(blobs=["ip1"])
        assert sorted(outs) == ["feat", "ip1"]
        assert outs["ip1"].shape == (len(batch), 5)
        assert np.shares_memory(outs["feat"], net.blobs["feat"].data)
        feats.append(net.blobs["feat"].data.copy())
    np.testing.assert_allclose(np.concatenate(feats), feat, rtol=1e-5, atol=1e-6)


def test_caffemodel_read_with_caffe_pb2(workdir):
    """Weight converters and inspectors (caffemodel -> NumPy): the saved file parsed as
    ``caffe_pb2.NetParameter``, each layer's ``blobs`` through ``caffe.io.blobproto_to_array``;
    Caffe's Net::ToProto writes every layer (the upgraded Input layer and inserted Splits
    too) with its phase, and blobs with ``shape``, not the legacy 4-d fields."""
    write("deploy.prototxt", SIAMESE + 'layer { name: "ip1b" type: "InnerProduct" bottom: "ip1" '
          'top: "ip1b" inner_product_param { num_output: 2 bias_term: false } }\n')
    net = caffe.Net("deploy.prototxt", caffe.TEST)
    net.save("w.caffemodel")
    net_param = caffe.proto.caffe_pb2.NetParameter()
    with open("w.caffemodel", "rb") as f:
        net_param.ParseFromString(f.read())
    assert [l.name for l in net_param.layer] == net._layer_names
    assert "ip1_relu1_0_split" in net._layer_names
    assert all(l.phase == caffe.TEST for l in net_param.layer)
    params = {layer.name: [caffe.io.blobproto_to_array(b) for b in layer.blobs]
              for layer in net_param.layer if len(layer.blobs)}
    assert list(params) == list(net.params)
    for name, arrays in params.items():
        assert [a.shape for a in arrays] == [b.data.shape for b in net.params[name]]
        for a, b in zip(arrays, net.params[name]):
            np.testing.assert_array_equal(a, b.data)
    blob = net_param.layer[1].blobs[0]
    assert not blob.HasField("num") and list(blob.shape.dim) == [3, 1, 3, 3]


LEVELS = """name: "staged"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 } }
layer { name: "deploy_prob" type: "Softmax" bottom: "ip" top: "prob"
  include { stage: "deploy" } }
layer { name: "deep" type: "ReLU" bottom: "ip" top: "deep" include { min_level: 1 } }
layer { name: "train_only" type: "Sigmoid" bottom: "ip" top: "sig" include { phase: TRAIN } }
"""


def test_net_constructor_forms(workdir):
    """The forms scripts call: ``Net(model, weights, phase)`` (legacy, positional),
    ``Net(model, phase, weights=...)``, ``Net(network_file=..., phase=..., weights=...)``
    and ``Net(model, phase, level=, stages=)`` with NetStateRules (pycaffe's Net_Init:
    ``stages`` a list of strings)."""
    model = write("staged.prototxt", LEVELS)
    weights = saved_weights(model, workdir / "s.caffemodel")
    nets = [caffe.Net(model, weights, caffe.TEST),
            caffe.Net(model, caffe.TEST, weights=weights),
            caffe.Net(network_file=model, phase=caffe.TEST, weights=weights)]
    for n in nets:
        np.testing.assert_array_equal(n.params["ip"][0].data, nets[0].params["ip"][0].data)
        assert n.outputs == ["ip"]
    assert caffe.Net(model, caffe.TRAIN).outputs == ["sig"]
    assert caffe.Net(model, caffe.TEST, stages=["deploy"]).outputs == ["prob"]
    assert caffe.Net(model, caffe.TEST, level=1).outputs == ["deep"]
    assert caffe.Net(model, caffe.TEST, level=1, stages=["deploy"]).outputs == ["deep", "prob"]


# ------------------------------------------------------------ Fast R-CNN's im_detect
RCNN = """name: "rcnn"
input: "data" input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
input: "rois" input_shape { dim: 1 dim: 5 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "fc" type: "InnerProduct" bottom: "rois" top: "fc"
  inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "cls_score" type: "InnerProduct" bottom: "fc" top: "cls_score"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bbox_pred" type: "InnerProduct" bottom: "fc" top: "bbox_pred"
  inner_product_param { num_output: 12 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "cls_prob" type: "Softmax" bottom: "cls_score" top: "cls_prob" }
"""


def test_fast_rcnn_im_detect(workdir):
    """rbgirshick/py-faster-rcnn lib/fast_rcnn/test.py ``im_detect``: each input blob
    reshaped to its own batch (``reshape(*(blobs[k].shape))``; 1 image, R rois), then
    ``forward(**forward_kwargs)`` with float32 arrays, ``blobs_out['cls_prob']`` and
    ``['bbox_pred']``, ``net.blobs['cls_score'].data`` and ``'im_info' in net.blobs``;
    a second image with another roi count reshapes again."""
    net = caffe.Net(write("test.prototxt", RCNN), caffe.TEST)
    rng = np.random.default_rng(9)
    for n_rois, size in [(7, (9, 11)), (3, (8, 8))]:
        blobs = {"data": rng.standard_normal((1, 3) + size),
                 "rois": np.c_[np.zeros(n_rois), rng.uniform(0, 8, (n_rois, 4))]}
        net.blobs["data"].reshape(*(blobs["data"].shape))
        net.blobs["rois"].reshape(*(blobs["rois"].shape))
        assert "im_info" not in net.blobs
        forward_kwargs = {"data": blobs["data"].astype(np.float32, copy=False),
                          "rois": blobs["rois"].astype(np.float32, copy=False)}
        blobs_out = net.forward(**forward_kwargs)
        assert sorted(blobs_out) == ["bbox_pred", "cls_prob", "conv1"]
        scores = blobs_out["cls_prob"]
        assert scores.shape == (n_rois, 3) and blobs_out["bbox_pred"].shape == (n_rois, 12)
        np.testing.assert_allclose(scores.sum(1), 1, rtol=1e-5)
        raw = net.blobs["cls_score"].data
        np.testing.assert_allclose(scores, np.exp(raw) / np.exp(raw).sum(1, keepdims=True),
                                   rtol=1e-5)
        assert blobs_out["conv1"].shape == (1, 2, size[0] - 2, size[1] - 2)
        np.testing.assert_array_equal(net.blobs["rois"].data, forward_kwargs["rois"])
    with pytest.raises(Exception, match="Input is not batch sized"):
        net.forward(data=np.zeros((2, 3, 8, 8), np.float32),
                    rois=np.zeros((3, 5), np.float32))


COUNTING = '''
import caffe


class Counting(caffe.Layer):
    """A data layer that loads its next batch in reshape (the batch's shape decides the
    top's), and copies it out in forward."""

    def setup(self, bottom, top):
        self.calls = []
        self.batch = -1

    def reshape(self, bottom, top):
        self.calls.append("reshape")
        self.batch += 1
        top[0].reshape(1 + self.batch % 2, 3)

    def forward(self, bottom, top):
        self.calls.append("forward")
        top[0].data[...] = self.batch

    def backward(self, top, propagate_down, bottom):
        pass
'''


def test_a_python_layer_reshapes_at_every_forward_as_caffe(workdir, monkeypatch):
    """Caffe calls a layer's Reshape in Layer::SetUp, in Net::Reshape (pycaffe's
    ``net.reshape()``) and first thing in every Layer::Forward: a Python layer whose
    reshape has side effects (loads the next batch) sees each of those calls, also the
    forward right after a set-up or a ``net.reshape()``."""
    name = "usage_counting_%d" % os.getpid()
    write(workdir / (name + ".py"), COUNTING)
    monkeypatch.syspath_prepend(str(workdir))
    net = caffe.Net(write("c.prototxt", 'name: "c" layer { name: "c" type: "Python" top: "x" '
                          'python_param { module: "%s" layer: "Counting" } }' % name),
                    caffe.TRAIN)
    layer = net.layers[0]
    assert layer.calls == ["reshape"]                     # Layer::SetUp
    net.forward()
    assert layer.calls == ["reshape", "reshape", "forward"]
    assert net.blobs["x"].data.tolist() == [[1, 1, 1], [1, 1, 1]]   # batch 1, shape (2, 3)
    net.forward()
    assert net.blobs["x"].data.tolist() == [[2, 2, 2]]
    del layer.calls[:]
    net.reshape()                                         # Net::Reshape, then Forward
    net.forward()
    assert layer.calls == ["reshape", "reshape", "forward"]
    assert net.blobs["x"].data.tolist() == [[4, 4, 4]]
    sys.modules.pop(name, None)


def test_deprocess_of_a_one_channel_input_as_pycaffe():
    """An MNIST visualisation: ``imshow(transformer.deprocess('data', blob.data[0]))`` with a
    Transformer that only scales.  pycaffe's deprocess squeezes the data first
    (``data.copy().squeeze()``): (1, 28, 28) comes back (28, 28), what imshow takes."""
    t = caffe.io.Transformer({"data": (64, 1, 28, 28)})
    t.set_input_scale("data", 0.00390625)
    t.set_raw_scale("data", 255)
    data = np.random.default_rng(10).uniform(0, 1, (64, 1, 28, 28)).astype(np.float32)
    out = t.deprocess("data", data[0])
    assert out.shape == (28, 28) and out.dtype == np.float32
    np.testing.assert_allclose(out, data[0, 0] / 0.00390625 / 255, rtol=1e-6)
    assert t.deprocess("data", data[:1]).shape == (28, 28)
    assert t.deprocess("data", data[:2]).shape == (2, 28, 28)


CONV = """name: "convolution"
layer { name: "input" type: "Input" top: "data"
  input_param { shape: { dim: 1 dim: 1 dim: 100 dim: 100 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 3 kernel_size: 5 stride: 1
    weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" value: 0 } } }
"""


def test_net_surgery_designer_filters(workdir):
    """BVLC/caffe examples/net_surgery.ipynb, "designer filters" (its net_surgery/conv.prototxt):
    a grey image from ``load_image(color=False)``, the data blob reshaped to it, a view
    ``conv0 = net.blobs['conv'].data[0, 0]`` held across forwards (it sees the new output),
    a bias and hand-made Gaussian and Sobel filters written through ``net.params``, and
    ``net.save``."""
    from PIL import Image
    rng = np.random.default_rng(11)
    Image.fromarray(rng.integers(0, 256, (24, 30), dtype=np.uint8)).save("cat_gray.png")
    net = caffe.Net(write("conv.prototxt", CONV), caffe.TEST)
    assert list(net.blobs.keys()) == ["data", "conv"] and list(net.params.keys()) == ["conv"]
    im = np.array(caffe.io.load_image("cat_gray.png", color=False)).squeeze()
    assert im.shape == (24, 30) and im.dtype == np.float32
    im_input = im[np.newaxis, np.newaxis, :, :]
    net.blobs["data"].reshape(*im_input.shape)
    net.blobs["data"].data[...] = im_input
    net.forward()
    conv0 = net.blobs["conv"].data[0, 0]
    pre = float(conv0.mean())
    net.params["conv"][1].data[0] = 1.
    net.forward()
    assert float(conv0.mean()) == pytest.approx(pre + 1, abs=1e-5)   # the held view

    ksize = net.params["conv"][0].data.shape[2:]
    sigma = 1.
    y, x = np.mgrid[-ksize[0] // 2 + 1:ksize[0] // 2 + 1, -ksize[1] // 2 + 1:ksize[1] // 2 + 1]
    g = np.exp(-((x ** 2 + y ** 2) / (2.0 * sigma ** 2)))
    gaussian = (g / g.sum()).astype(np.float32)
    net.params["conv"][0].data[0] = gaussian
    net.params["conv"][0].data[1:] = 0.
    sobel = np.array((-1, -2, -1, 0, 0, 0, 1, 2, 1), dtype=np.float32).reshape((3, 3))
    net.params["conv"][0].data[1, 0, 1:-1, 1:-1] = sobel
    net.params["conv"][0].data[2, 0, 1:-1, 1:-1] = sobel.T
    net.params["conv"][1].data[...] = 0
    net.forward()
    out = net.blobs["conv"].data
    assert out.shape == (1, 3, 20, 26)
    window = im[3:8, 4:9]                                  # output (3, 4): rows 3..7, cols 4..8
    assert out[0, 0, 3, 4] == pytest.approx(float((window * gaussian).sum()), rel=1e-5)
    assert out[0, 1, 3, 4] == pytest.approx(float((window[1:-1, 1:-1] * sobel).sum()),
                                            rel=1e-4, abs=1e-5)
    net.save("conv.caffemodel")
    again = caffe.Net("conv.prototxt", "conv.caffemodel", caffe.TEST)
    np.testing.assert_array_equal(again.params["conv"][0].data[1, 0, 1:-1, 1:-1], sobel)


CHAIN = """name: "chain" force_backward: true
input: "data" input_shape { dim: 1 dim: 4 }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 }
                        bias_filler { type: "gaussian" std: 1 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "relu2" type: "ReLU" bottom: "ip2" top: "ip2" }
"""


def test_style_transfer_layer_by_layer_backward(workdir):
    """fzliu/style-transfer style.py: ``forward(end=net.params.keys()[-1])``, then for the
    param layers from the top down: ``grad = net.blobs[layer].diff[0]`` (a view),
    ``grad += ...`` (the layer's content or style gradient), and
    ``net.backward(start=layer, end=next_layer)``, which runs both ends (Net::BackwardFromTo
    is inclusive); the last chunk goes to the input (``end=None``).  Checked against the
    arithmetic of InnerProduct and the in-place ReLU."""
    net = caffe.Net(write("chain.prototxt", CHAIN), caffe.TEST)
    rng = np.random.default_rng(12)
    x = rng.standard_normal(4).astype(np.float32)
    net.blobs["data"].data[0] = x
    layers = list(net.params.keys())
    assert layers == ["ip1", "ip2"]
    net.forward(end=layers[-1])
    h1 = net.blobs["ip1"].data[0].copy()                   # after relu1 (in place)
    injected = {"ip2": rng.standard_normal(2).astype(np.float32),
                "ip1": rng.standard_normal(3).astype(np.float32)}
    net.blobs[layers[-1]].diff[:] = 0
    layers.reverse()
    for i, layer in enumerate(layers):
        next_layer = None if i == len(layers) - 1 else layers[i + 1]
        grad = net.blobs[layer].diff[0]
        grad += injected[layer]
        out = net.backward(start=layer, end=next_layer)
        if next_layer is None:
            grad = net.blobs["data"].diff[0]
            assert list(out) == ["data"]
        else:
            grad = net.blobs[next_layer].diff[0]
            assert list(out) == ["data"]                    # the bottoms of layer 'ip1'
    w1, w2 = net.params["ip1"][0].data, net.params["ip2"][0].data
    d_ip1 = (w2.T @ injected["ip2"]) * (h1 > 0) + injected["ip1"]
    np.testing.assert_allclose(grad, w1.T @ d_ip1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.blobs["ip1"].diff[0], d_ip1, rtol=1e-5, atol=1e-6)
    # ip1 ran in both chunks: its weight diff holds two accumulated gradients
    # (Layer::Backward accumulates param diffs; the first chunk's top diff lacked injected)
    first = np.outer((w2.T @ injected["ip2"]) * (h1 > 0), x)
    np.testing.assert_allclose(net.params["ip1"][0].diff, first + np.outer(d_ip1, x),
                               rtol=1e-5, atol=1e-5)


def test_a_python_layers_attributes_set_through_net_layers(pylayers):
    """pycaffe's ``net.layers[i]`` of a Python layer is the user's instance itself, so a
    script that sets one of the layer's attributes through the net (here the batch
    size and the random state of the PASCAL data layer) changes what the layer then
    does; its methods and values read back the same way."""
    n = caffe.NetSpec()
    n.data, n.label = L.Python(module=pylayers, layer="MultilabelDataLayerSync", ntop=2,
                               param_str=str(dict(split="train", batch_size=4, im_shape=[3, 3])))
    net = caffe.Net(write("ml.prototxt", str(n.to_proto())), caffe.TRAIN)
    layer = net.layers[0]
    assert layer.batch_size == 4 and layer.top_names == ["data", "label"]
    layer.batch_size = 2                     # only the first two rows are written now
    layer.rng = np.random.RandomState(5)
    layer.scale = 2.0                        # the class's attribute, now the instance's
    net.blobs["data"].data[...] = -1
    net.forward()
    data = net.blobs["data"].data
    assert layer.batch_size == 2 and np.all(data[2:] == -1) and np.all(data[:2] >= 0)
    np.testing.assert_allclose(data[0], 2 * np.random.RandomState(5).rand(3, 3, 3), rtol=1e-6)
    assert sys.modules[pylayers].MultilabelDataLayerSync.scale == 1.0
    layer.extra_flag = True                  # a new attribute reads back
    assert layer.extra_flag is True
    assert layer.name == "data" and layer.type == "Python"


ROIDATA = '''
import numpy as np
import caffe


class RoIDataLayer(caffe.Layer):
    """py-faster-rcnn lib/roi_data_layer/layer.py, its minibatches made up: the roidb
    comes from set_roidb, each forward reshapes every top to its blob."""

    def set_roidb(self, roidb):
        self._roidb = roidb
        self._cur = 0

    def setup(self, bottom, top):
        self._num_classes = eval(self.param_str)["num_classes"]
        self._name_to_top_map = {"data": 0, "rois": 1, "labels": 2}
        top[0].reshape(1, 3, 100, 100)
        top[1].reshape(1, 5)
        top[2].reshape(1)

    def forward(self, bottom, top):
        entry = self._roidb[self._cur % len(self._roidb)]
        self._cur += 1
        blobs = {"data": entry["image"][np.newaxis], "rois": entry["rois"],
                 "labels": entry["labels"]}
        for blob_name, blob in blobs.items():
            top_ind = self._name_to_top_map[blob_name]
            top[top_ind].reshape(*(blob.shape))
            top[top_ind].data[...] = blob.astype(np.float32, copy=False)

    def backward(self, top, propagate_down, bottom):
        pass

    def reshape(self, bottom, top):
        pass
'''

FRCNN = """name: "frcnn"
layer { name: "data" type: "Python" top: "data" top: "rois" top: "labels"
  python_param { module: "%s" layer: "RoIDataLayer" param_str: "{'num_classes': 3}" } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "pool" type: "Pooling" bottom: "conv1" top: "pool"
  pooling_param { pool: AVE global_pooling: true } }
layer { name: "silence" type: "Silence" bottom: "pool" }
layer { name: "fc" type: "InnerProduct" bottom: "rois" top: "fc"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "cls_score" type: "InnerProduct" bottom: "fc" top: "cls_score"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss_cls" type: "SoftmaxWithLoss" bottom: "cls_score" bottom: "labels"
  top: "loss_cls" }
"""


def test_fast_rcnn_training_with_a_roidb_data_layer(workdir, monkeypatch):
    """rbgirshick/py-faster-rcnn lib/fast_rcnn/train.py with lib/roi_data_layer/layer.py:
    ``caffe.SGDSolver``, ``solver.net.copy_from``, ``solver.net.layers[0].set_roidb``, then
    ``solver.step(1)`` while every minibatch has its own image size and roi count (the
    Python layer reshapes its tops in forward; the layers after it follow), and the
    snapshot of ``net.params[...][i].data`` edited around ``net.save``."""
    name = "usage_roidata_%d" % os.getpid()
    write(workdir / (name + ".py"), ROIDATA)
    monkeypatch.syspath_prepend(str(workdir))
    write("train.prototxt", FRCNN % name)
    write("solver.prototxt", 'train_net: "train.prototxt"\nbase_lr: 0.01\nlr_policy: "step"\n'
          'gamma: 0.1\nstepsize: 100\ndisplay: 0\nmomentum: 0.9\nweight_decay: 0.0005\n'
          'snapshot: 0\nsnapshot_prefix: "frcnn"\nsolver_mode: CPU\n')
    weights = saved_weights("train.prototxt", workdir / "imagenet.caffemodel")
    rng = np.random.default_rng(14)
    roidb = [{"image": rng.standard_normal((3, h, w)),
              "rois": np.c_[np.zeros(r), rng.uniform(0, 10, (r, 4))],
              "labels": rng.integers(0, 3, r).astype(np.float64)}
             for h, w, r in [(6, 9, 5), (8, 7, 2), (7, 7, 9)]]
    solver = caffe.SGDSolver("solver.prototxt")
    solver.net.copy_from(weights)
    solver.net.layers[0].set_roidb(roidb)
    for it in range(6):
        solver.step(1)
        entry = roidb[it % 3]
        r = len(entry["rois"])
        assert solver.net.blobs["data"].data.shape == (1,) + entry["image"].shape
        assert solver.net.blobs["cls_score"].data.shape == (r, 3)
        assert solver.net.blobs["conv1"].data.shape[2:] == tuple(
            d - 2 for d in entry["image"].shape[1:])
        assert np.isfinite(solver.net.blobs["loss_cls"].data)
    assert solver.iter == 6 and solver.net.layers[0]._cur == 6

    net = solver.net                    # SolverWrapper.snapshot: unnormalize, save, restore
    orig_0 = net.params["cls_score"][0].data.copy()
    net.params["cls_score"][0].data[...] = net.params["cls_score"][0].data * 2
    net.save("frcnn_iter_6.caffemodel")
    net.params["cls_score"][0].data[...] = orig_0
    saved = caffe.Net("train.prototxt", "frcnn_iter_6.caffemodel", caffe.TEST)
    np.testing.assert_allclose(saved.params["cls_score"][0].data, 2 * orig_0, rtol=1e-6)
    sys.modules.pop(name, None)


def test_fine_tuning_dummy_data_net_and_disp_preds(workdir):
    """02-fine-tuning.ipynb's ``imagenet_net``: ``caffenet(data=L.DummyData(shape=...))``
    (a Top made outside the NetSpec, named by ``n.data = data``), weights by layer name,
    then ``disp_preds``: ``net.blobs['data'].data[0, ...] = image`` and
    ``net.forward(start='conv1')['probs'][0]``; a full ``forward()`` keeps the image too
    (DummyDataLayer refills only non-constant fillers)."""
    def caffenet(data, num_classes=3):
        n = caffe.NetSpec()
        n.data = data
        n.conv1 = L.Convolution(n.data, kernel_size=3, num_output=2,
                                weight_filler=dict(type="gaussian", std=0.3))
        n.relu1 = L.ReLU(n.conv1, in_place=True)
        fc8 = L.InnerProduct(n.relu1, num_output=num_classes,
                             weight_filler=dict(type="gaussian", std=0.3))
        n.__setattr__("fc8", fc8)
        n.probs = L.Softmax(fc8)
        return write("imagenet_net.prototxt", str(n.to_proto()))

    dummy_data = L.DummyData(shape=dict(dim=[1, 3, 5, 5]))
    filename = caffenet(data=dummy_data)
    weights = saved_weights(filename, workdir / "caffenet.caffemodel")
    net = caffe.Net(filename, weights, caffe.TEST)
    assert net._layer_names == ["data", "conv1", "relu1", "fc8", "probs"]
    image = np.random.default_rng(15).standard_normal((3, 5, 5)).astype(np.float32)
    net.blobs["data"].data[0, ...] = image
    probs = net.forward(start="conv1")["probs"][0]
    top_k = (-probs).argsort()[:2]
    assert probs.shape == (3,) and probs[top_k[0]] >= probs[top_k[1]]
    again = net.forward()["probs"][0]
    np.testing.assert_array_equal(net.blobs["data"].data[0], image)
    np.testing.assert_allclose(again, probs, rtol=1e-6)


def test_glog_minloglevel_set_before_import_silences_the_log(workdir):
    """Scripts and notebooks set ``os.environ['GLOG_minloglevel'] = '2'`` before
    ``import caffe`` to hide Caffe's INFO and WARNING lines (glog reads it when the
    library loads); ``caffe.init_log()`` without a level keeps that threshold."""
    import subprocess
    write("net.prototxt", TINY_LOSS)
    write("solver.prototxt", 'net: "net.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\n'
          'display: 1\nmax_iter: 2\nsnapshot_prefix: "s"\nsnapshot_after_train: false\n')
    code = ("import os\n"
            "os.environ['GLOG_minloglevel'] = '%s'\n"
            "import minicaffe, caffe\n"
            "caffe.init_log()\n"
            "caffe.set_mode_cpu()\n"
            "s = caffe.SGDSolver('solver.prototxt')\n"
            "s.solve()\n"
            "caffe.log('from the script')\n")
    runs = {}
    # the script imports this checkout's minicaffe and caffe, installed or not
    root = os.path.dirname(os.path.dirname(os.path.abspath(caffe.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for level in ("0", "2"):
        r = subprocess.run([sys.executable, "-c", code % level], capture_output=True,
                           text=True, timeout=120, cwd=str(workdir), env=env)
        assert r.returncode == 0, r.stderr
        runs[level] = r.stderr.splitlines()
    assert any(line.startswith("I") and "Iteration 1" in line for line in runs["0"])
    assert any(line.endswith("] from the script") for line in runs["0"])
    assert not [line for line in runs["2"] if line[:1] in ("I", "W")]


TINY_LOSS = """name: "tiny"
layer { name: "data" type: "Input" top: "data" top: "t"
        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "t" top: "loss" }
"""


# ------------------------------------------------- layer-by-layer and manual training
MAGIC = """name: "magic"
input: "data" input_shape { dim: 4 dim: 2 dim: 6 dim: 6 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 3 kernel_size: 3 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool1" top: "fc"
  inner_product_param { num_output: 2 } }
"""


def test_magic_init_layer_by_layer(workdir):
    """philkr/magic_init magic_init.py (data-dependent initialisation): nets made from a
    string through ``NamedTemporaryFile('w')``; zero-filled params found through
    ``zip(net._layer_names, net.layers)``; each layer run alone with ``net._forward(i, i)``
    after its bottoms were written (``1*net.blobs[t].data`` keeps copies), its weights set
    through ``l.blobs[0].data[...]``, shapes read from ``Blob.shape``; then random top diffs
    and ``net._backward(last_layer, 0)`` for the per-layer gradient ratios."""
    def net_from_string(s, t=None):
        if t is None:
            t = caffe.TEST
        f = tempfile.NamedTemporaryFile("w", dir=".", suffix=".prototxt")
        f.write(s)
        f.flush()
        r = caffe.Net(f.name, t)
        f.close()
        return r

    net = net_from_string(MAGIC.replace('name: "magic"', 'name: "magic" force_backward: true'))
    rng = np.random.RandomState(16)
    NIT = 3
    inputs = [rng.standard_normal((4, 2, 6, 6)).astype(np.float32) for _ in range(NIT)]

    def forward(i, data, output_names):
        output = {t: [None] * NIT for t in output_names}
        for it in range(NIT):
            for b in data:
                net.blobs[b].data[...] = data[b][it]
            net._forward(i, i)
            for t in output_names:
                output[t][it] = 1 * net.blobs[t].data
        return output

    active = {"data": inputs}
    for i, (n, l) in enumerate(zip(net._layer_names, net.layers)):
        if len(l.blobs) > 0:
            assert np.sum(np.abs(l.blobs[0].data)) <= 1e-10      # constant 0 filler
            d = l.blobs[0].data
            d[...] = rng.normal(0, 1, d.shape)
            assert tuple(l.blobs[0].shape) == d.shape
            top = forward(i, {b: active[b] for b in net.bottom_names[n]}, net.top_names[n])
            flat = np.concatenate([t.swapaxes(0, 1).reshape(t.shape[1], -1) for t in
                                   top[net.top_names[n][0]]], axis=1).T
            mu, std = flat.mean(axis=0), flat.std(axis=0)
            l.blobs[0].data[...] /= std.reshape((-1,) + (1,) * (d.ndim - 1))
            l.blobs[1].data[...] = -mu / std
        if n != "input":
            active.update(forward(i, {b: active[b] for b in net.bottom_names[n]},
                                  net.top_names[n]))
    # the first layer's outputs are standardised per channel over the NIT batches
    outs = []
    for x in inputs:
        net.blobs["data"].data[...] = x
        net._forward(1, 1)
        outs.append(1 * net.blobs["conv1"].data)
    flat = np.concatenate([o.swapaxes(0, 1).reshape(3, -1) for o in outs], axis=1)
    np.testing.assert_allclose(flat.mean(axis=1), 0, atol=1e-4)
    np.testing.assert_allclose(flat.std(axis=1), 1, rtol=1e-3)
    # layer-by-layer forwards agree with one whole forward
    net.blobs["data"].data[...] = inputs[0]
    whole = net.forward()["fc"].copy()
    net.blobs["data"].data[...] = inputs[0]
    for i in range(len(net.layers)):
        net._forward(i, i)
    np.testing.assert_allclose(net.blobs["fc"].data, whole, rtol=1e-5, atol=1e-6)

    # calibrateGradientRatio: reset the diffs, random top diffs, _backward(last_layer, 0)
    for l in net.layers:
        for b in l.blobs:
            b.diff[...] = 0
    last_layer = len(net.layers) - 1
    net.blobs["fc"].diff[...] = rng.normal(0, 1, net.blobs["fc"].shape)
    net._backward(last_layer, 0)
    fc_w = net.layers[last_layer].blobs[0]
    np.testing.assert_allclose(fc_w.diff, net.blobs["fc"].diff.T @ net.blobs["pool1"].data
                               .reshape(4, -1), rtol=1e-4, atol=1e-5)
    ratio = {n: np.sqrt(np.mean(l.blobs[0].diff ** 2) / np.mean(l.blobs[0].data ** 2))
             for n, l in zip(net._layer_names, net.layers) if len(l.blobs) > 0}
    assert sorted(ratio) == ["conv1", "fc"] and all(np.isfinite(list(ratio.values())))


def test_manual_sgd_loop_matches_the_solver(workdir):
    """A training loop written against pycaffe alone: ``net.blobs['data'].data[...] = batch``,
    ``net.forward()``, every param diff zeroed by hand (pycaffe's ``backward`` adds the
    param gradients to what the diffs hold), ``net.backward()``, then
    ``b.data[...] -= lr * b.diff`` for ``b`` in each layer's ``blobs``; the weights follow
    the SGD solver's (momentum 0, no weight decay, fixed rate) step for step."""
    text = TINY_LOSS.replace("inner_product_param { num_output: 2 }",
                             'inner_product_param { num_output: 2 weight_filler { type: '
                             '"gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 } }')
    write("net.prototxt", text)
    write("solver.prototxt", 'net: "net.prototxt"\nbase_lr: 0.05\nlr_policy: "fixed"\n'
          'display: 0\nmax_iter: 10\nsnapshot_prefix: "s"\nsolver_mode: CPU\n')
    solver = caffe.SGDSolver("solver.prototxt")
    net = caffe.Net("net.prototxt", caffe.TRAIN)
    for name in net.params:
        for a, b in zip(net.params[name], solver.net.params[name]):
            a.data[...] = b.data
    rng = np.random.default_rng(17)
    for _ in range(4):
        batch = rng.standard_normal((2, 3)).astype(np.float32)
        target = rng.standard_normal((2, 2)).astype(np.float32)
        for n_ in (net, solver.net):
            n_.blobs["data"].data[...] = batch
            n_.blobs["t"].data[...] = target
        net.forward()
        for l in net.layers:
            for b in l.blobs:
                b.diff[...] = 0
        net.backward()
        for l in net.layers:
            for b in l.blobs:
                b.data[...] -= 0.05 * b.diff
        solver.step(1)
        for name in net.params:
            for a, b in zip(net.params[name], solver.net.params[name]):
                np.testing.assert_allclose(a.data, b.data, rtol=1e-6, atol=1e-7)
    # without the zeroing, a second backward adds to the diffs
    net.forward()
    for b in net.params["ip"]:
        b.diff[...] = 0
    net.backward()
    once = net.params["ip"][0].diff.copy()
    net.backward()
    np.testing.assert_allclose(net.params["ip"][0].diff, 2 * once, rtol=1e-6)
